"""Find a checkpoint, read its config and weights, and build the model strictly.

Layouts read (see checkpoints/layouts.py): the original release (`thinker.*` names, bf16, one file or shards with
an index), the transformers-native `-hf` repositories (top-level config, `model.language_model.*`,
`model.audio_tower.*`, `model.multi_modal_projector.*`, `score.*`), and MLX conversions (prefix
stripped, OHWI convolutions, optional `quantization` block), of Qwen3-ASR and Qwen3-ForcedAligner.
A repo id resolves through huggingface_hub's cache.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from mlx_qwen3asr.checkpoints import hub
from mlx_qwen3asr.checkpoints.layouts import LayoutError, check_model_type, normalize
from mlx_qwen3asr.checkpoints.tokenizer import Tokenizer
from mlx_qwen3asr.model.config import ConfigError, ModelConfig
from mlx_qwen3asr.model.qwen3asr import Qwen3ASR
from mlx_qwen3asr.runtime.device import default_dtype_name

DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}


class ModelLoadError(Exception):
    """The checkpoint could not be found, read or matched to the model."""


class WrongModelError(ModelLoadError):
    """The checkpoint is a model of the other kind (a forced aligner given for transcription, or the reverse)."""


KIND_NAMES = {
    "asr": "a Qwen3-ASR speech recognition model",
    "aligner": "a Qwen3-ForcedAligner word-timing model",
}
KIND_USES = {
    "asr": "transcription needs a Qwen3-ASR checkpoint (e.g. Qwen/Qwen3-ASR-0.6B)",
    "aligner": "word timing needs a Qwen3-ForcedAligner checkpoint (e.g. Qwen/Qwen3-ForcedAligner-0.6B)",
}


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

    @property
    def kind(self) -> str:
        """ "asr" or "aligner"."""
        return self.config.kind


def require_kind(model: ASRModel, kind: str) -> None:
    """Raise WrongModelError unless `model` is of `kind` ("asr" or "aligner")."""
    if model.kind != kind:
        raise WrongModelError(f"{model.path}: this is {KIND_NAMES[model.kind]}; {KIND_USES[kind]}")


def default_dtype() -> mx.Dtype:
    """float32 on MLX's CPU backend, whose bfloat16 products are slow; bfloat16, as the checkpoints are
    published, on a GPU (runtime/device.py)."""
    return getattr(mx, default_dtype_name())


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
    """A local checkpoint directory, or a Hugging Face repo id found complete in the hub cache or downloaded."""
    path = Path(path_or_repo).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelLoadError(f"{path}: not a directory; give a checkpoint directory or a repo id")
        return path
    repo = str(path_or_repo)
    if repo.count("/") != 1 or repo.startswith((".", "/", "~")):
        raise ModelLoadError(f"{repo}: no such directory, and not a Hugging Face repo id (org/name)")
    try:
        return hub.snapshot(repo)
    except hub.HubError as e:
        raise ModelLoadError(str(e)) from e


def read_config_json(path: Path) -> dict[str, Any]:
    file = path / "config.json"
    if not file.is_file():
        raise ModelLoadError(f"{path}: no config.json; not a model checkpoint")
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{file}: unreadable ({e})") from e
    if not isinstance(raw, dict):
        raise ModelLoadError(f"{file}: not a JSON object")
    return raw


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


# Names listed in a mismatch message before the rest are counted.
MAX_LISTED = 6


def _listed(items: list[str]) -> str:
    shown = ", ".join(items[:MAX_LISTED])
    return shown + (f" and {len(items) - MAX_LISTED} more" if len(items) > MAX_LISTED else "")


def check_weights(net: Qwen3ASR, weights: dict[str, mx.array], where: Path) -> None:
    """Raise ModelLoadError naming what is missing, unexpected or mis-shaped (a few names, then a count)."""
    expected = dict(tree_flatten(net.parameters()))
    missing = sorted(set(expected) - set(weights))
    extra = sorted(set(weights) - set(expected))
    misshaped = [
        f"{key} {tuple(weights[key].shape)} (expected {tuple(expected[key].shape)})"
        for key in sorted(set(expected) & set(weights))
        if tuple(expected[key].shape) != tuple(weights[key].shape)
    ]
    problems = []
    if missing:
        problems.append(f"missing weight(s): {_listed(missing)}")
    if extra:
        problems.append(f"unexpected weight(s): {_listed(extra)}")
    if misshaped:
        problems.append(f"weight shape(s) differ: {_listed(misshaped)}")
        if len(misshaped) > MAX_LISTED:
            problems.append(
                "config.json's sizes do not match these weights (a config of another model size?)"
            )
    if problems:
        raise ModelLoadError(f"{where}: checkpoint does not match the model: " + "; ".join(problems))


def _layer_count(weights: dict[str, mx.array], prefix: str) -> int:
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.")
    indices = {int(m.group(1)) for key in weights if (m := pattern.match(key))}
    return max(indices) + 1 if indices else 0


def check_sizes(config: ModelConfig, weights: dict[str, mx.array]) -> None:
    """Compare config.json's layer counts and widths with the stored shapes, before any module is built.

    Only names and shapes are read (from the safetensors headers). A size the weights do not settle
    is left to check_weights, which runs on the module tree that config.json's bounded sizes build.
    """
    audio, text = config.audio_config, config.text_config
    layers = (
        ("text_config.num_hidden_layers", text.num_hidden_layers, "model.layers.", "decoder"),
        ("audio_config.encoder_layers", audio.encoder_layers, "audio_tower.layers.", "encoder"),
    )
    for name, value, prefix, stack in layers:
        held = _layer_count(weights, prefix)
        if held != value:
            raise ConfigError(f"config.json: {name} is {value} but the weights hold {held} {stack} layers")
    # (field, its value, the rows it gives, a tensor with those rows): rows survive quantization and
    # norms are never packed, so every layout can be compared.
    hd = text.head_dim
    rows = [
        ("text_config.hidden_size", text.hidden_size, text.hidden_size, "model.norm.weight"),
        ("text_config.vocab_size", text.vocab_size, text.vocab_size, "model.embed_tokens.weight"),
        ("text_config.head_dim", hd, hd, "model.layers.0.self_attn.q_norm.weight"),
        (
            "text_config.num_attention_heads",
            text.num_attention_heads,
            text.num_attention_heads * hd,
            "model.layers.0.self_attn.q_proj.weight",
        ),
        (
            "text_config.num_key_value_heads",
            text.num_key_value_heads,
            text.num_key_value_heads * hd,
            "model.layers.0.self_attn.k_proj.weight",
        ),
        ("audio_config.d_model", audio.d_model, audio.d_model, "audio_tower.ln_post.weight"),
        ("audio_config.output_dim", audio.output_dim, audio.output_dim, "audio_tower.proj2.weight"),
        (
            "audio_config.downsample_hidden_size",
            audio.downsample_hidden_size,
            audio.downsample_hidden_size,
            "audio_tower.conv2d1.weight",
        ),
    ]
    if config.is_forced_aligner:
        rows.append(("classify_num", config.classify_num, config.classify_num, "lm_head.weight"))
    for name, value, expected, key in rows:
        shape = tuple(weights[key].shape) if key in weights else ()
        if shape and shape[0] != expected:
            per_head = f" ({expected} rows of head_dim {hd})" if expected != value else ""
            raise ConfigError(f"config.json: {name} is {value}{per_head} but the weights hold {key} {shape}")


@dataclass
class Checkpoint:
    """A checkpoint as read from disk, in any layout, mapped onto the module tree (weights still lazy)."""

    path: Path
    layout: str  # "release", "hf" or "mlx"
    config: dict[str, Any]  # in the release's layout (an -hf config rewritten), quantization block kept
    model_config: ModelConfig
    weights: dict[str, mx.array]


def read_checkpoint(path: Path) -> Checkpoint:
    raw = read_config_json(path)
    try:
        check_model_type(raw)  # another model's checkpoint is named as such before its weights are read
    except LayoutError as e:
        raise ModelLoadError(f"{path}: {e}") from e
    return checkpoint_from(path, raw, read_weights(path))


def checkpoint_from(path: Path, raw: dict[str, Any], weights: dict[str, mx.array]) -> Checkpoint:
    """Map a config.json and its (lazy) weights, in any layout, onto the module tree."""
    try:
        layout, config, weights = normalize(raw, weights)
        model_config = ModelConfig.from_dict(config)
        weights = Qwen3ASR.sanitize(weights, model_config)
        check_sizes(model_config, weights)
    except (LayoutError, ValueError, KeyError, TypeError) as e:
        raise ModelLoadError(f"{path}: {e}") from e
    return Checkpoint(path, layout, config, model_config, weights)


def build_checked(path: Path) -> tuple[Qwen3ASR, Checkpoint]:
    """The module tree a checkpoint describes (quantized like it) and the checkpoint, checked strictly.

    The weights stay lazy: only their names and shapes have been read.
    """
    checkpoint = read_checkpoint(path)
    net = Qwen3ASR(checkpoint.model_config)
    if checkpoint.model_config.quantization:
        quantize_like_checkpoint(net, checkpoint.weights, checkpoint.model_config.quantization)
    check_weights(net, checkpoint.weights, path)
    return net, checkpoint


def load(path_or_repo: str | Path, dtype: str | mx.Dtype | None = None) -> ASRModel:
    """Load a Qwen3-ASR or Qwen3-ForcedAligner checkpoint (local directory or Hugging Face repo id).

    Any published layout loads (see checkpoints/layouts.py); `model.kind` says which model it is, and the
    functions that use a model check it (`require_kind`).

    dtype: compute dtype of the floating-point weights; float32 on CPU and bfloat16 on a GPU by default.
    """
    path = resolve_model_path(path_or_repo)
    compute_dtype = parse_dtype(dtype)
    net, checkpoint = build_checked(path)
    config = checkpoint.model_config
    weights = {
        k: v.astype(compute_dtype) if mx.issubdtype(v.dtype, mx.floating) else v
        for k, v in checkpoint.weights.items()
    }
    net.load_weights(list(weights.items()), strict=True)
    net.set_dtype(compute_dtype, predicate=lambda d: mx.issubdtype(d, mx.floating))
    mx.eval(net.parameters())
    try:
        tokenizer = Tokenizer.from_dir(path)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: cannot build the tokenizer ({e})") from e
    return ASRModel(net=net, config=config, tokenizer=tokenizer, path=path, dtype=compute_dtype)
