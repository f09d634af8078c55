"""Convert any Qwen3-ASR checkpoint into an MLX checkpoint, optionally 4-bit or 8-bit quantized.

Sources (a local directory or a Hugging Face repo id):
  * the original release: nested `thinker_config`, weights named `thinker.*`, OIHW convolutions;
  * the transformers-native `-hf` layout: top-level `audio_config`/`text_config`, weights named
    `model.audio_tower.*`, `model.multi_modal_projector.linear_{1,2}.*` (the encoder's proj1/proj2),
    `model.language_model.*`, and `lm_head.*` (ASR) or `score.*` (forced aligner); a top-level config
    over `thinker.*` weights is read too;
  * MLX conversions (weights already in the module tree's names, OHWI convolutions). An already
    quantized checkpoint is refused: quantizing its dequantized weights again would stack a second
    rounding error on the first, so convert from the original release instead.

Output, as mlx-community publishes it so that other MLX tools read it: weights in the module tree's
names (`audio_tower.*`, `model.*`, `lm_head.*` only for an untied head or the aligner), OHWI
convolutions, safetensors shards of about 5 GB with `model.safetensors.index.json`; config.json is
the source's release-layout config (an `-hf` config is rewritten into that layout) plus a
`quantization` block, duplicated as `quantization_config` as mlx-lm does:

    {"group_size": 64, "bits": 4, "mode": "affine",
     "audio_tower.layers.0.fc1": {"group_size": 64, "bits": 8},   # a layer at other bits
     "audio_tower.conv_out": false}                               # a layer left unquantized

Recipe: decoder linears, the token embedding (which is also the tied head) and the aligner's
timestamp classifier at `bits`; encoder linears (including conv_out and the proj1/proj2 projector)
at `encoder_bits` (16 keeps them in `dtype`); convolutions and norms are never quantized. A layer
whose input width is not a multiple of the group size stays in `dtype` and gets a `false` entry.
With the encoder left unquantized the block is exactly mlx-community's: no per-layer entries.

The aligner's classifier (classify_num x hidden, about 1% of the model) is quantized like the rest
of the decoder, as mlx-audio's conversions do, so both tools agree on which tensors are packed.

The result is written into a temporary directory next to the destination and renamed into place
once complete and verified with the engine's own strict loader checks, so a failed run leaves
nothing behind and `force` replaces an existing destination only after the new one is whole.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx

from .config import ModelConfig
from .loading import (
    DTYPES,
    ModelLoadError,
    build_checked,
    check_weights,
    read_weights,
    resolve_model_path,
)
from .model import Qwen3ASR

QUANT_BITS = (4, 8)
ENCODER_BITS = (4, 8, 16)
GROUP_SIZES = (32, 64, 128)
MAX_SHARD_BYTES = 5 * 10**9
QUANT_MODE = "affine"
# Tokenizer, preprocessor and chat-template files travel with the weights.
COPY_PATTERNS = ("*.json", "*.txt", "*.jinja", "tokenizer.*")
NOT_COPIED = frozenset({"config.json", "model.safetensors.index.json"})
# transformers' Qwen3ASR port -> the release's module tree (order matters: most specific first).
HF_RENAMES = (
    ("model.language_model.", "model."),
    ("model.audio_tower.", "audio_tower."),
    ("model.multi_modal_projector.linear_1.", "audio_tower.proj1."),
    ("model.multi_modal_projector.linear_2.", "audio_tower.proj2."),
    ("score.", "lm_head."),
)
HF_PREFIXES = ("model.language_model.", "model.audio_tower.", "model.multi_modal_projector.")
# transformers' encoder config accepts these aliases for the release's field names.
AUDIO_ALIASES = {
    "num_attention_heads": "encoder_attention_heads",
    "num_hidden_layers": "encoder_layers",
    "hidden_size": "d_model",
    "intermediate_size": "encoder_ffn_dim",
}
# Fields of the release's thinker_config that the -hf layout keeps at the top level.
THINKER_FIELDS = ("audio_token_id", "audio_start_token_id", "audio_end_token_id", "user_token_id")
DEFAULT_TIMESTAMP_SEGMENT_MS = 80.0


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


@dataclass
class ConversionResult:
    path: Path
    source: Path
    source_layout: str  # "release", "hf" or "mlx"
    forced_aligner: bool
    recipe: Recipe
    quantized: dict[str, int] = field(default_factory=dict)  # module path -> bits
    unquantized: list[str] = field(default_factory=list)  # width not a multiple of the group size
    files: dict[str, int] = field(default_factory=dict)  # weight file -> bytes

    @property
    def weight_bytes(self) -> int:
        return sum(self.files.values())


def make_recipe(
    bits: int | None = None, group_size: int = 64, encoder_bits: int | None = None, dtype: str = "bfloat16"
) -> Recipe:
    """Validate the options and fill in the encoder's default (8 bits under a 4-bit decoder)."""
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
        encoder_bits = 8 if bits == 4 else bits
    if encoder_bits not in ENCODER_BITS:
        raise ConvertError(
            f"encoder bits must be one of {', '.join(map(str, ENCODER_BITS))}, got {encoder_bits}"
        )
    return Recipe(bits, group_size, encoder_bits, dtype)


# --------------------------------------------------------------------------------------------------
# Source layouts
# --------------------------------------------------------------------------------------------------


def weight_layout(keys) -> str:
    keys = list(keys)
    if any(k.startswith("thinker.") for k in keys):
        return "release"
    if any(k.startswith(HF_PREFIXES) for k in keys):
        return "hf"
    return "mlx"


def hf_to_release_names(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """Rename transformers-native weights onto the module tree (values untouched, convs still OIHW)."""
    out = {}
    for key, value in weights.items():
        for old, new in HF_RENAMES:
            if key.startswith(old):
                key = new + key[len(old) :]
                break
        out[key] = value
    return out


def is_qwen3_asr_config(raw: dict[str, Any]) -> bool:
    thinker = raw.get("thinker_config")
    types = [raw.get("model_type"), thinker.get("model_type") if isinstance(thinker, dict) else None]
    types = [t for t in types if isinstance(t, str)]
    # A config without any model_type is judged by its audio/text sections alone.
    return not types or any("qwen3_asr" in t or "qwen3_forced_aligner" in t for t in types)


def release_layout_config(raw: dict[str, Any], head_rows: int | None) -> dict[str, Any]:
    """Rewrite a top-level (-hf) config into the release's nested `thinker_config` layout.

    head_rows: rows of the source's classifier (`score`) when it has one: the aligner's class count.
    """
    config = copy.deepcopy(raw)
    audio = dict(config.pop("audio_config"))
    text = dict(config.pop("text_config"))
    for alias, name in AUDIO_ALIASES.items():
        if alias in audio and name not in audio:
            audio[name] = audio.pop(alias)
    rope = text.get("rope_parameters") or {}
    if "rope_theta" not in text and "rope_theta" in rope:
        text["rope_theta"] = rope["rope_theta"]
    if "tie_word_embeddings" not in text and "tie_word_embeddings" in config:
        text["tie_word_embeddings"] = config["tie_word_embeddings"]

    model_type = str(config.get("model_type", "qwen3_asr"))
    architectures = config.get("architectures") or []
    aligner = (
        "forced_aligner" in model_type
        or head_rows is not None
        or any("TokenClassification" in str(a) for a in architectures)
        or "classify_num" in config
    )
    thinker: dict[str, Any] = {"audio_config": audio, "text_config": text}
    for key in THINKER_FIELDS:
        if key in config:
            thinker[key] = config.pop(key)
    if aligner:
        classes = config.pop("classify_num", None) or head_rows or config.get("num_labels")
        if classes is None and isinstance(config.get("id2label"), dict):
            classes = len(config["id2label"])
        if not classes:
            raise ConvertError("forced-aligner config without a class count (classify_num / num_labels)")
        thinker["classify_num"] = int(classes)
        thinker["model_type"] = "qwen3_forced_aligner"
        config["model_type"] = "qwen3_forced_aligner"
        config.setdefault("timestamp_segment_time", DEFAULT_TIMESTAMP_SEGMENT_MS)
    else:
        thinker["model_type"] = "qwen3_asr_thinker"
        config["model_type"] = "qwen3_asr"
    config["thinker_config"] = thinker
    return config


@dataclass
class Source:
    path: Path
    layout: str
    config: dict[str, Any]  # release-layout config.json to write (no quantization keys)
    model_config: ModelConfig
    weights: dict[str, mx.array]  # lazily loaded, in the module tree's names and layouts


def read_source(path: Path) -> Source:
    file = path / "config.json"
    if not file.is_file():
        raise ConvertError(f"{path}: no config.json; not a model checkpoint")
    try:
        raw = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise ConvertError(f"{file}: unreadable ({e})") from e
    if not isinstance(raw, dict):
        raise ConvertError(f"{file}: not a JSON object")
    if not is_qwen3_asr_config(raw):
        raise ConvertError(f"{path}: not a Qwen3-ASR checkpoint (model_type {raw.get('model_type')!r})")
    if "thinker_config" not in raw and ("audio_config" not in raw or "text_config" not in raw):
        raise ConvertError(f"{path}: config.json has no audio_config/text_config: not a Qwen3-ASR checkpoint")
    weights = read_weights(path)
    quant = raw.get("quantization") or raw.get("quantization_config")
    if quant or any(k.endswith(".scales") for k in weights):
        bits = quant.get("bits", "?") if isinstance(quant, dict) else "?"
        raise ConvertError(
            f"{path}: already quantized ({bits}-bit); re-quantizing would compound the rounding error, "
            "so convert from the original release (or an unquantized checkpoint) instead"
        )
    layout = weight_layout(weights)
    # transformers names the aligner's classifier `score`; its rows are the class count.
    head_rows = int(weights["score.weight"].shape[0]) if "score.weight" in weights else None
    if layout == "hf":
        weights = hf_to_release_names(weights)
    if "thinker_config" in raw:
        config = copy.deepcopy(raw)
    else:
        config = release_layout_config(raw, head_rows)
        if layout == "release":
            layout = "hf"  # a top-level config over release-named weights
    for key in ("quantization", "quantization_config"):
        config.pop(key, None)
    try:
        model_config = ModelConfig.from_dict(config)
    except (ValueError, KeyError, TypeError) as e:
        raise ConvertError(f"{path / 'config.json'}: {e}") from e
    weights = Qwen3ASR.sanitize(weights, model_config)
    return Source(path, layout, config, model_config, weights)


# --------------------------------------------------------------------------------------------------
# Quantization
# --------------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------------


def shard_names(tensors: dict[str, mx.array], max_bytes: int) -> list[list[str]]:
    shards: list[list[str]] = [[]]
    size = 0
    for key, value in tensors.items():
        if shards[-1] and size + value.nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(key)
        size += value.nbytes
    return shards


def write_weights(tensors: dict[str, mx.array], out: Path, max_bytes: int) -> dict[str, int]:
    """Save the tensors shard by shard (each evaluated only when written) and the index."""
    shards = shard_names(tensors, max_bytes)
    weight_map: dict[str, str] = {}
    files: dict[str, int] = {}
    total = 0
    for i, keys in enumerate(shards, 1):
        name = "model.safetensors" if len(shards) == 1 else f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        # Popping drops each shard's arrays once written, so memory holds about one shard.
        shard = {k: tensors.pop(k) for k in keys}
        mx.eval(shard)
        mx.save_safetensors(str(out / name), shard, metadata={"format": "mlx"})
        total += sum(v.nbytes for v in shard.values())
        weight_map.update(dict.fromkeys(keys, name))
        files[name] = (out / name).stat().st_size
        del shard
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return files


def copy_side_files(src: Path, out: Path) -> list[str]:
    copied = []
    for pattern in COPY_PATTERNS:
        for file in sorted(src.glob(pattern)):
            if file.name in NOT_COPIED or file.name in copied or not file.is_file():
                continue
            shutil.copyfile(file, out / file.name)  # follows hub-cache symlinks to the blobs
            copied.append(file.name)
    return copied


def verify_output(out: Path) -> None:
    """Run the engine loader's strict checks on what was written (headers only, no tensor data)."""
    build_checked(out)


def _make_parents(directory: Path, created: list[Path]) -> None:
    """Create missing ancestors, recording each (outermost first) so a failure can remove them."""
    missing = []
    while not directory.exists():
        missing.append(directory)
        directory = directory.parent
    for d in reversed(missing):
        d.mkdir()
        created.append(d)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _exists(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def _install(tmp: Path, dst: Path, force: bool) -> None:
    """Move the finished checkpoint into place; an existing destination goes only once it is replaced."""
    if not _exists(dst):
        os.rename(tmp, dst)
        return
    if not force:
        raise ConvertError(f"{dst} exists (appeared during the conversion); use --force to replace it")
    old = dst.with_name(f".{dst.name}.old-{uuid.uuid4().hex[:8]}")
    os.rename(dst, old)
    try:
        os.rename(tmp, dst)
    except BaseException:
        os.rename(old, dst)
        raise
    _remove(old)


# --------------------------------------------------------------------------------------------------
# API
# --------------------------------------------------------------------------------------------------


def convert_checkpoint(
    src: str | Path,
    dst: str | Path,
    bits: int | None = None,
    group_size: int = 64,
    encoder_bits: int | None = None,
    dtype: str = "bfloat16",
    force: bool = False,
    *,
    max_shard_bytes: int = MAX_SHARD_BYTES,
    log: Callable[[str], None] | None = None,
) -> ConversionResult:
    """Convert `src` into an MLX checkpoint at `dst`; see the module docstring for the format."""
    say = log or (lambda _msg: None)
    recipe = make_recipe(bits, group_size, encoder_bits, dtype)
    dst = Path(dst).expanduser()
    if _exists(dst) and not force:
        raise ConvertError(f"{dst} exists; use --force to replace it")
    if _exists(dst) and not dst.is_dir():
        raise ConvertError(f"{dst} exists and is not a directory; remove it first")
    try:
        src_path = resolve_model_path(src)
    except ModelLoadError as e:
        raise ConvertError(str(e)) from e
    src_real, dst_real = src_path.resolve(), dst.resolve()
    if src_real == dst_real or dst_real in src_real.parents:
        raise ConvertError(f"{dst} is (or contains) the source checkpoint; choose another destination")

    try:
        source = read_source(src_path)
        net = Qwen3ASR(source.model_config)  # lazily initialised: only the module tree and shapes matter
        check_weights(net, source.weights, src_path)
    except ModelLoadError as e:
        raise ConvertError(str(e)) from e
    kind = "forced aligner" if source.model_config.is_forced_aligner else "ASR"
    say(f"source: {src_path} ({source.layout} layout, {kind})")

    quantized, too_narrow = plan_layers(net, recipe)
    config = dict(source.config)
    block = quantization_block(recipe, quantized, too_narrow)
    if block is not None:
        config["quantization"] = block
        config["quantization_config"] = copy.deepcopy(block)

    created: list[Path] = []
    tmp: Path | None = None
    try:
        _make_parents(dst.parent, created)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", suffix=".partial", dir=dst.parent))
        # mkdtemp's private 0700 would outlive the rename; give the directory the usual permissions.
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)
        say(f"writing {recipe.describe()} into {tmp.name}")
        files = write_weights(output_tensors(source.weights, quantized, recipe), tmp, max_shard_bytes)
        (tmp / "config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
        copy_side_files(src_path, tmp)
        verify_output(tmp)
        _install(tmp, dst, force)
    except BaseException as e:
        if tmp is not None:
            _remove(tmp)
        for d in reversed(created):
            try:
                d.rmdir()
            except OSError:
                pass
        if isinstance(e, (ConvertError, KeyboardInterrupt, SystemExit)):
            raise
        if isinstance(e, ModelLoadError):
            raise ConvertError(f"the written checkpoint does not load: {e}") from e
        if isinstance(e, Exception):
            # Unreadable tensor data (a truncated shard), an unwritable destination or a full disk.
            raise ConvertError(f"conversion of {src_path} failed: {e.__class__.__name__}: {e}") from e
        raise
    return ConversionResult(
        path=dst,
        source=src_path,
        source_layout=source.layout,
        forced_aligner=source.model_config.is_forced_aligner,
        recipe=recipe,
        quantized=quantized,
        unquantized=too_narrow,
        files=files,
    )


__all__ = ["ConversionResult", "ConvertError", "Recipe", "convert_checkpoint", "make_recipe"]
