"""What differs by device: the sizes that trade speed against memory, and the dtype a model loads in.

The model has one code path, MLX's own operations and fused kernels, on every device. What differs
by device is the default dtype: the checkpoints are published in bfloat16, which a GPU computes
natively, while MLX's CPU backend computes bfloat16 products far slower than float32 ones (float32
holds every bfloat16 value exactly, so the results are the checkpoint's); and the batch sizes, which a
GPU's compute makes larger.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx


@dataclass(frozen=True)
class Tuning:
    """Sizes that trade speed against memory."""

    # Mel chunks through the audio encoder's conv stem at once (its activations are the encoder's
    # largest; a few at a time stay bounded).
    stem_chunks: int = 8
    # Rows decoded together at most when the batch is sized automatically.
    max_batch: int = 32
    # Rows per prefill call.
    prefill_rows: int = 8


# Measured with tools/bench.py and tools/decode_bench.py (docs/performance.md). On a 2-core x86-64 CPU
# the stem is ~20% faster in chunks of 8 than of 80, decode tokens per second still grow up to 32 rows
# (a step of many rows is compute-bound there), and prefill costs the same per token up to 16 rows,
# then more. On a GPU (MLX's CUDA backend, an H200) a decode step of 64 rows costs 1.0-1.7x one of 16
# rows and 2.5-2.6x one of 1 row (0.6b and 1.7b, bfloat16): up to 64 rows decode together there. 128
# rows cost about as much as 64 on that GPU; an Apple GPU has several times less compute, so the
# default stops at 64 (the memory budget bounds the batch too).
CPU = Tuning(max_batch=32)
GPU = Tuning(max_batch=64)


def tuning() -> Tuning:
    """The settings for the default device: sizes, not code paths (the model's code is the same)."""
    return CPU if mx.default_device() == mx.cpu else GPU


def default_dtype_name() -> str:
    """bfloat16 (as published) on a GPU; float32 on MLX's CPU backend, whose bfloat16 products are slow."""
    return "float32" if mx.default_device() == mx.cpu else "bfloat16"


__all__ = ["CPU", "GPU", "Tuning", "default_dtype_name", "tuning"]
