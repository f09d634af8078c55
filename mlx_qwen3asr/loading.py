"""Find a checkpoint, read its config and weights, and build the model strictly.

Layouts read: the original release (`thinker.*` names, bf16, one file or shards with an index), the
transformers-native `-hf` layout (same names under `thinker_config`-less config), and MLX conversions
(prefix stripped, OHWI convolutions, optional `quantization` block). A repo id resolves through
huggingface_hub's cache.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from .config import ModelConfig
from .model import Qwen3ASR
from .tokenizer import Tokenizer

DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}
# What a snapshot download needs: weights, configs, tokenizer and templates.
HUB_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.jinja"]


class ModelLoadError(Exception):
    """The checkpoint could not be found, read or matched to the model."""


@dataclass
class ASRModel:
    """A loaded checkpoint: the MLX module, its config and tokenizer."""

    net: Qwen3ASR
    config: ModelConfig
    tokenizer: Tokenizer
    path: Path
    dtype: mx.Dtype

    @property
    def name(self) -> str:
        return self.path.name


def default_dtype() -> mx.Dtype:
    # MLX's CPU bfloat16 matmul is slow; on a GPU the checkpoint's bfloat16 is the fast choice.
    return mx.bfloat16 if mx.default_device() == mx.gpu else mx.float32


def parse_dtype(dtype: str | mx.Dtype | None) -> mx.Dtype:
    if dtype is None:
        return default_dtype()
    if isinstance(dtype, mx.Dtype):
        return dtype
    try:
        return DTYPES[str(dtype).lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPES)}") from None


def resolve_model_path(path_or_repo: str | Path) -> Path:
    """A local checkpoint directory, or a Hugging Face repo id downloaded into (or found in) the hub cache."""
    path = Path(path_or_repo).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelLoadError(f"{path}: not a directory; give a checkpoint directory or a repo id")
        return path
    repo = str(path_or_repo)
    if repo.count("/") != 1 or repo.startswith((".", "/", "~")):
        raise ModelLoadError(f"{repo}: no such directory, and not a Hugging Face repo id (org/name)")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo, allow_patterns=HUB_PATTERNS))
    except Exception as e:  # network, auth, missing repo: all end the same way for the user
        raise ModelLoadError(
            f"{repo}: cannot fetch from the Hugging Face hub ({e.__class__.__name__}: {e})"
        ) from e


def read_config(path: Path) -> tuple[dict[str, Any], ModelConfig]:
    file = path / "config.json"
    if not file.is_file():
        raise ModelLoadError(f"{path}: no config.json; not a model checkpoint")
    try:
        raw = json.loads(file.read_text())
        return raw, ModelConfig.from_dict(raw)
    except (ValueError, KeyError, TypeError) as e:
        raise ModelLoadError(f"{file}: {e}") from e


def weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError) as e:
            raise ModelLoadError(f"{index}: unreadable index ({e})") from e
        files = [path / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ModelLoadError(f"{path}: shard(s) named in the index are missing: {', '.join(missing)}")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{path}: no *.safetensors weights")
    return files


def read_weights(path: Path) -> dict[str, mx.array]:
    """All tensors of the checkpoint, loaded lazily (mx.load maps them; nothing is read until used)."""
    weights: dict[str, mx.array] = {}
    for file in weight_files(path):
        try:
            part = mx.load(str(file))
        except Exception as e:
            raise ModelLoadError(f"{file}: cannot read safetensors ({e})") from e
        weights.update(part)
    return weights


def quantize_like_checkpoint(
    net: Qwen3ASR, weights: dict[str, mx.array], quantization: dict[str, Any]
) -> None:
    """Turn the layers the checkpoint stores quantized into quantized layers of the same recipe."""
    defaults = {k: quantization[k] for k in ("group_size", "bits", "mode") if k in quantization}

    def predicate(path: str, module: nn.Module):
        if not hasattr(module, "to_quantized") or f"{path}.scales" not in weights:
            return False
        override = quantization.get(path)
        return {**defaults, **override} if isinstance(override, dict) else True

    nn.quantize(
        net,
        group_size=defaults.get("group_size", 64),
        bits=defaults.get("bits", 4),
        mode=defaults.get("mode", "affine"),
        class_predicate=predicate,
    )


def check_weights(net: Qwen3ASR, weights: dict[str, mx.array], where: Path) -> None:
    expected = dict(tree_flatten(net.parameters()))
    missing = sorted(set(expected) - set(weights))
    extra = sorted(set(weights) - set(expected))
    problems = []
    if missing:
        problems.append(f"missing weight(s): {', '.join(missing[:8])}" + (" ..." if len(missing) > 8 else ""))
    if extra:
        problems.append(f"unexpected weight(s): {', '.join(extra[:8])}" + (" ..." if len(extra) > 8 else ""))
    for key in sorted(set(expected) & set(weights)):
        if tuple(expected[key].shape) != tuple(weights[key].shape):
            problems.append(
                f"weight {key} has shape {tuple(weights[key].shape)}, expected {tuple(expected[key].shape)}"
            )
    if problems:
        raise ModelLoadError(f"{where}: checkpoint does not match the model: " + "; ".join(problems))


def build_checked(path: Path) -> tuple[Qwen3ASR, ModelConfig, dict[str, mx.array]]:
    """The module tree a checkpoint describes (quantized like it) and its weights, checked strictly.

    The weights stay lazy: only their names and shapes have been read.
    """
    _, config = read_config(path)
    net = Qwen3ASR(config)
    weights = Qwen3ASR.sanitize(read_weights(path), config)
    if config.quantization:
        quantize_like_checkpoint(net, weights, config.quantization)
    check_weights(net, weights, path)
    return net, config, weights


def load(path_or_repo: str | Path, dtype: str | mx.Dtype | None = None) -> ASRModel:
    """Load a Qwen3-ASR checkpoint (local directory or Hugging Face repo id).

    dtype: compute dtype of the floating-point weights; float32 on CPU and bfloat16 on a GPU by default.
    """
    path = resolve_model_path(path_or_repo)
    compute_dtype = parse_dtype(dtype)
    net, config, weights = build_checked(path)
    weights = {
        k: v.astype(compute_dtype) if mx.issubdtype(v.dtype, mx.floating) else v for k, v in weights.items()
    }
    net.load_weights(list(weights.items()), strict=True)
    net.set_dtype(compute_dtype, predicate=lambda d: mx.issubdtype(d, mx.floating))
    mx.eval(net.parameters())
    try:
        tokenizer = Tokenizer.from_dir(path)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: cannot build the tokenizer ({e})") from e
    return ASRModel(net=net, config=config, tokenizer=tokenizer, path=path, dtype=compute_dtype)
