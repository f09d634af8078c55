"""What a conversion writes: the recipe (bits, group size, encoder bits, dtype), the layers it quantizes,
the config's `quantization` block and the tensors, packed or cast (see convert.py for the format)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from mlx_qwen3asr.checkpoints.loading import DTYPES
from mlx_qwen3asr.model.qwen3asr import Qwen3ASR

QUANT_BITS = (4, 8)
ENCODER_BITS = (4, 8, 16)
GROUP_SIZES = (32, 64, 128)
MAX_SHARD_BYTES = 5 * 10**9
QUANT_MODE = "affine"
READERS_ALL = "mlx_qwen3asr, mlx-audio and mlx-qwen3-asr"
READERS_QUANTIZED_ENCODER = "mlx_qwen3asr and mlx-qwen3-asr; not mlx-audio, which never quantizes the encoder"


class ConvertError(Exception):
    """The conversion was refused or failed; nothing was written at the destination."""


@dataclass(frozen=True)
class Recipe:
    bits: int | None  # None: no quantization
    group_size: int = 64
    encoder_bits: int = 16  # 16: the encoder stays in `dtype`
    dtype: str = "bfloat16"

    def bits_for(self, path: str) -> int | None:
        """Bits for the quantizable layer at `path`, None to keep it in floating point."""
        if self.bits is None:
            return None
        bits = self.encoder_bits if path.startswith("audio_tower.") else self.bits
        return None if bits == 16 else bits

    def describe(self) -> str:
        if self.bits is None:
            return f"unquantized {self.dtype}"
        encoder = "unquantized" if self.encoder_bits == 16 else f"{self.encoder_bits}-bit"
        return (
            f"decoder {self.bits}-bit, encoder {encoder}, group size {self.group_size}, "
            f"other weights {self.dtype}"
        )

    @property
    def readers(self) -> str:
        """Which MLX tools read a checkpoint of this recipe."""
        if self.bits is not None and self.encoder_bits != 16:
            return READERS_QUANTIZED_ENCODER
        return READERS_ALL


def make_recipe(
    bits: int | None = None, group_size: int = 64, encoder_bits: int | None = None, dtype: str = "bfloat16"
) -> Recipe:
    """Validate the options; the encoder stays unquantized unless `encoder_bits` says otherwise."""
    if dtype not in DTYPES:
        raise ConvertError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    if bits is None:
        if encoder_bits not in (None, 16):
            raise ConvertError("--encoder-bits needs --bits (the decoder's precision)")
        return Recipe(None, group_size, 16, dtype)
    if bits not in QUANT_BITS:
        raise ConvertError(f"bits must be one of {', '.join(map(str, QUANT_BITS))}, got {bits}")
    if group_size not in GROUP_SIZES:
        raise ConvertError(f"group size must be one of {', '.join(map(str, GROUP_SIZES))}, got {group_size}")
    if encoder_bits is None:
        encoder_bits = 16
    if encoder_bits not in ENCODER_BITS:
        raise ConvertError(
            f"encoder bits must be one of {', '.join(map(str, ENCODER_BITS))}, got {encoder_bits}"
        )
    return Recipe(bits, group_size, encoder_bits, dtype)


def plan_layers(net: Qwen3ASR, recipe: Recipe) -> tuple[dict[str, int], list[str]]:
    """Bits of every layer to quantize, and the layers left in float because of their width."""
    quantized: dict[str, int] = {}
    too_narrow: list[str] = []
    for path, module in net.named_modules():
        if not hasattr(module, "to_quantized"):
            continue
        bits = recipe.bits_for(path)
        if bits is None:
            continue
        if module.weight.shape[-1] % recipe.group_size:
            too_narrow.append(path)
        else:
            quantized[path] = bits
    return dict(sorted(quantized.items())), sorted(too_narrow)


def quantization_block(recipe: Recipe, quantized: dict[str, int], too_narrow: list[str]) -> dict | None:
    if recipe.bits is None:
        return None
    block: dict[str, Any] = {"group_size": recipe.group_size, "bits": recipe.bits, "mode": QUANT_MODE}
    for path, bits in quantized.items():
        if bits != recipe.bits:
            block[path] = {"group_size": recipe.group_size, "bits": bits}
    for path in too_narrow:
        block[path] = False
    return block


def output_tensors(
    weights: dict[str, mx.array], quantized: dict[str, int], recipe: Recipe
) -> dict[str, mx.array]:
    """The checkpoint's tensors (lazy): packed weights with scales and biases, the rest cast to dtype."""
    dtype = DTYPES[recipe.dtype]
    out: dict[str, mx.array] = {}
    for key in sorted(weights):
        value = weights[key]
        path, _, leaf = key.rpartition(".")
        if mx.issubdtype(value.dtype, mx.floating):
            value = value.astype(dtype)
        if leaf == "weight" and path in quantized:
            packed, scales, biases = mx.quantize(value, recipe.group_size, quantized[path], mode=QUANT_MODE)
            out[key], out[f"{path}.scales"], out[f"{path}.biases"] = packed, scales, biases
        else:
            out[key] = value
    return dict(sorted(out.items()))


__all__ = [
    "ENCODER_BITS",
    "GROUP_SIZES",
    "QUANT_BITS",
    "QUANT_MODE",
    "ConvertError",
    "Recipe",
    "make_recipe",
    "output_tensors",
    "plan_layers",
    "quantization_block",
]
