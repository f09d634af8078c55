"""The two code paths, and the settings tuned for each.

On a GPU (Apple silicon's Metal, or CUDA) the model runs on MLX's fused kernels: scaled dot-product
attention, RMSNorm, RoPE, MLX's own GELU, SiLU and softmax, products as `x @ w.T` (quantized layers
as nn.QuantizedLinear). On MLX's CPU backend in float32 it runs kernels written for that backend
(model/ops.py: rational GELU/SiLU, a polynomial softmax, weight-major products for few rows, attention over
a shared prompt start without copying it per row).

The path follows the default device. `use_path("gpu")`, or MLX_QWEN3ASR_PATH=gpu in the environment,
makes the package take on the CPU exactly the branches it takes on a GPU, so that the tests and
tools/bench.py run the code a Mac runs; "cpu" forces the CPU kernels (where the device allows them).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import mlx.core as mx

PATHS = ("cpu", "gpu")
ENV = "MLX_QWEN3ASR_PATH"


def _from_environment() -> str | None:
    value = os.environ.get(ENV, "").strip().lower()
    if value in ("", "auto"):
        return None
    if value not in PATHS:
        raise ValueError(f"{ENV}={value!r}: must be cpu, gpu or auto")
    return value


_chosen: str | None = _from_environment()


def path() -> str:
    """The path in use: "gpu" (MLX's fused kernels) or "cpu" (the CPU backend's own kernels)."""
    if _chosen == "gpu" or mx.default_device() != mx.cpu:
        return "gpu"
    return "cpu"


def cpu_path() -> bool:
    """Whether the CPU backend's kernels run (MLX on its CPU, not forced onto the GPU path)."""
    return path() == "cpu"


@contextlib.contextmanager
def use_path(name: str | None) -> Iterator[None]:
    """Take this path inside the block ("gpu", "cpu", or None for the device's own)."""
    global _chosen
    if name is not None and name not in PATHS:
        raise ValueError(f"unknown path {name!r}: expected one of {PATHS}")
    previous, _chosen = _chosen, name
    try:
        yield
    finally:
        _chosen = previous


@dataclass(frozen=True)
class Tuning:
    """Sizes that trade speed against memory, per path."""

    # Mel chunks through the audio encoder's conv stem at once (its activations are the encoder's
    # largest; a few at a time stay in cache).
    stem_chunks: int
    # Rows decoded together at most when the batch is sized automatically.
    max_batch: int
    # Rows per prefill call.
    prefill_rows: int
    # The dtype a model loads in unless told otherwise.
    dtype: str
    # A shared prompt start (system prompt and context) up to this many tokens is recomputed in every
    # row, so that attention runs as one fused kernel; longer ones are computed once and attended to
    # without copies, by the product in ops.attention_with_prefix.
    inline_prefix_tokens: int


# Measured on a 2-core x86-64 CPU with OpenBLAS (tools/bench.py): the stem is ~20% faster in chunks of
# 8 than of 80; decode tokens per second still grow up to 32 rows (0.6b: 36 at 16, 48 at 32); prefill
# costs the same per token up to 16 rows, then more. float32: bfloat16 products are slow on MLX's CPU.
# The shared prompt start is never recomputed: attention_with_prefix is the CPU's fastest attention.
CPU = Tuning(stem_chunks=8, max_batch=32, prefill_rows=8, dtype="float32", inline_prefix_tokens=0)
# The GPU path: bfloat16, as the checkpoints are published; the batch sizes are the CPU's (not
# measured on a GPU here); a system prompt without context (about 10 tokens) or a short context is
# recomputed per row, a few percent of the prefill of a segment's ~375 audio tokens.
GPU = Tuning(stem_chunks=8, max_batch=32, prefill_rows=8, dtype="bfloat16", inline_prefix_tokens=128)


def tuning() -> Tuning:
    """The settings of the path in use."""
    return CPU if cpu_path() else GPU


__all__ = ["CPU", "ENV", "GPU", "PATHS", "Tuning", "cpu_path", "path", "tuning", "use_path"]
