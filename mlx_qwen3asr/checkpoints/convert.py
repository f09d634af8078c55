"""Convert any Qwen3-ASR checkpoint into an MLX checkpoint, optionally 4-bit or 8-bit quantized.

Sources (a local directory or a Hugging Face repo id):
  * the original release: nested `thinker_config`, weights named `thinker.*`, OIHW convolutions;
  * the transformers-native `-hf` layout: top-level `audio_config`/`text_config`, weights named
    `model.audio_tower.*`, `model.multi_modal_projector.linear_{1,2}.*` (the encoder's proj1/proj2),
    `model.language_model.*`, and `lm_head.*` (ASR) or `score.*` (forced aligner);
  * MLX conversions (weights already in the module tree's names, OHWI convolutions). An already
    quantized checkpoint is refused: quantizing its dequantized weights again would stack a second
    rounding error on the first, so convert from the original release instead.

Output, as mlx-community publishes it (mlx-audio's own converter writes the same bytes), so that other
MLX tools read it: weights in the module tree's names (`audio_tower.*`, `model.*`, `lm_head.*` only
for an untied head or the aligner), OHWI convolutions, safetensors shards of about 5 GB with
`model.safetensors.index.json`; config.json is the source's release-layout config (an `-hf` config is
rewritten into that layout) plus a `quantization` block, duplicated as `quantization_config` as mlx-lm
does. With a quantized encoder (an option) the block also names the layers at other bits:

    {"group_size": 64, "bits": 4, "mode": "affine",
     "audio_tower.layers.0.fc1": {"group_size": 64, "bits": 8},   # a layer at other bits
     "audio_tower.conv_out": false}                               # a layer left unquantized

Recipe: decoder linears, the token embedding (which is also the tied head) and the aligner's
timestamp classifier at `bits`; encoder linears (including conv_out and the proj1/proj2 projector)
at `encoder_bits`, by default 16: left in `dtype`, as mlx-community publishes them, because mlx-audio
never quantizes the encoder and fails on a checkpoint whose encoder is packed. Convolutions and norms
are never quantized. A layer whose input width is not a multiple of the group size stays in `dtype`
and gets a `false` entry. With the encoder left unquantized the block is exactly mlx-community's.

The aligner's classifier (classify_num x hidden, about 1% of the model) is quantized like the rest
of the decoder, as mlx-audio's conversions do, so both tools agree on which tensors are packed.

The result is written into a temporary directory next to the destination (the crash-safe folders of
runtime/atomic.py) and renamed into place once complete and verified with the engine's own strict
loader checks, so a failed run leaves nothing behind and `force` replaces an existing destination
only after the new one is whole, and only when it is a checkpoint folder (nothing in it but checkpoint files). The temporary directory,
`.<name>.mlxasr-<pid>-<host>-<random>.partial`, names the process and the machine that write it: one
left by a run that was killed (kill -9, a power cut) is removed by the next conversion into the
same folder once that process is gone and nothing has been written in it for a minute; a live
run's, on this machine or another sharing the folder, is never touched.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx

from mlx_qwen3asr.checkpoints.layouts import PREPROCESSOR_CONFIG
from mlx_qwen3asr.checkpoints.loading import (
    Checkpoint,
    ModelLoadError,
    build_checked,
    check_weights,
    read_checkpoint,
    resolve_model_path,
)
from mlx_qwen3asr.checkpoints.quantize import (
    ENCODER_BITS,
    GROUP_SIZES,
    QUANT_BITS,
    ConvertError,
    Recipe,
    make_recipe,
    output_tensors,
    plan_layers,
    quantization_block,
)
from mlx_qwen3asr.model.config import ModelConfig
from mlx_qwen3asr.model.qwen3asr import Qwen3ASR
from mlx_qwen3asr.runtime.atomic import (
    make_temp_folder,
    remove_stale_folders,
    replace_folder,
    temp_folder,
)

MAX_SHARD_BYTES = 5 * 10**9
# Tokenizer, preprocessor and chat-template files travel with the weights.
COPY_PATTERNS = ("*.json", "*.txt", "*.jinja", "tokenizer.*")
NOT_COPIED = frozenset({"config.json", "model.safetensors.index.json"})
# What a checkpoint folder holds, and so what --force may replace: weights, configs, tokenizer and
# template files, and what hubs put beside them (README, licence, .gitattributes; the `.cache` folder
# of `huggingface-cli download --local-dir`). Anything else means the folder is not a checkpoint.
CHECKPOINT_FILE = re.compile(
    r"[^/]+\.(json|safetensors|jinja|tiktoken|model)|merges\.txt|vocab\.txt|tokenizer\.[^/]+"
    r"|readme(\.md)?|license(\.[a-z]+)?|notice(\.[a-z]+)?|\.gitattributes",
    re.IGNORECASE,
)
CHECKPOINT_FOLDERS = frozenset({".cache"})


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


# --------------------------------------------------------------------------------------------------
# Source layouts
# --------------------------------------------------------------------------------------------------


@dataclass
class Source:
    path: Path
    layout: str
    config: dict[str, Any]  # release-layout config.json to write (no quantization keys)
    model_config: ModelConfig
    weights: dict[str, mx.array]  # lazily loaded, in the module tree's names and layouts


def read_source(path: Path) -> Source:
    return source_of(read_checkpoint(path))


def source_of(checkpoint: Checkpoint) -> Source:
    """The checkpoint as a conversion source; an already quantized one is refused."""
    path = checkpoint.path
    quant = checkpoint.model_config.quantization
    if quant or any(k.endswith(".scales") for k in checkpoint.weights):
        bits = quant.get("bits", "?") if isinstance(quant, dict) else "?"
        raise ConvertError(
            f"{path}: already quantized ({bits}-bit); re-quantizing would compound the rounding error, "
            "so convert from the original release (or an unquantized checkpoint) instead"
        )
    config = checkpoint.config
    for key in ("quantization", "quantization_config"):
        config.pop(key, None)
    return Source(path, checkpoint.layout, config, checkpoint.model_config, checkpoint.weights)


@dataclass
class Plan:
    config: dict[str, Any]  # config.json to write
    tensors: dict[str, mx.array]  # lazy: nothing is computed until written
    quantized: dict[str, int]  # module path -> bits
    unquantized: list[str]  # left in float: input width not a multiple of the group size


def plan_conversion(source: Source, recipe: Recipe) -> Plan:
    """What the conversion writes: config and tensors, as lazy arrays (shapes known, nothing computed)."""
    net = Qwen3ASR(source.model_config)  # lazily initialised: only the module tree and shapes matter
    check_weights(net, source.weights, source.path)
    quantized, too_narrow = plan_layers(net, recipe)
    config = dict(source.config)
    block = quantization_block(recipe, quantized, too_narrow)
    if block is not None:
        config["quantization"] = block
        config["quantization_config"] = copy.deepcopy(block)
    return Plan(config, output_tensors(source.weights, quantized, recipe), quantized, too_narrow)


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
    if "preprocessor_config.json" not in copied:
        # -hf repositories ship none; MLX tools build their feature extractor from it.
        text = json.dumps(PREPROCESSOR_CONFIG, indent=2) + "\n"
        (out / "preprocessor_config.json").write_text(text, encoding="utf-8")
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


def _reason(e: OSError) -> str:
    return e.strerror or str(e)


def foreign_entries(folder: Path) -> list[str]:
    """The names in folder that no checkpoint holds (sorted); --force replaces only a folder without any."""
    foreign = []
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                ok = entry.name in CHECKPOINT_FOLDERS
            else:
                ok = CHECKPOINT_FILE.fullmatch(entry.name) is not None
            if not ok:
                foreign.append(entry.name + ("/" if entry.is_dir(follow_symlinks=False) else ""))
    return sorted(foreign)


def _check_replaceable(dst: Path) -> None:
    """--force replaces dst only when it is a checkpoint folder (or a link, or empty)."""
    if dst.is_symlink() or not dst.is_dir():
        return
    try:
        foreign = foreign_entries(dst)
    except OSError as e:
        raise ConvertError(
            f"cannot read {dst} ({_reason(e)}); --overwrite replaces only a checkpoint folder"
        ) from None
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise ConvertError(
            f"{dst} is not a checkpoint folder (it holds {shown}); --overwrite replaces only a checkpoint "
            "folder (config.json, safetensors, tokenizer files): choose another destination"
        )


def check_destination(dst: Path, force: bool) -> None:
    """Refuse, before anything is read or written, a destination that cannot be made or replaced."""
    if dst.name in ("", ".", ".."):
        raise ConvertError(
            f"destination {str(dst)!r} names no folder of its own; give the folder to create, "
            "such as ./qwen3-asr-4bit"
        )
    if _exists(dst) and not force:
        raise ConvertError(f"{dst} exists; use --overwrite to replace it")
    if _exists(dst) and not dst.is_dir():
        raise ConvertError(f"{dst} exists and is not a directory; remove it first")
    if _exists(dst):
        _check_replaceable(dst)
    # The nearest folder that exists must take new folders: missing ones are made in it, or the
    # temporary folder beside the destination.
    folder = dst.parent
    while not _exists(folder) and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise ConvertError(f"cannot create {dst}: {folder} is not a folder")
    probe = temp_folder(folder, dst.name, "partial")
    try:
        probe.mkdir()
    except OSError as e:
        raise ConvertError(f"cannot write {dst}: {folder} does not take new folders ({_reason(e)})") from None
    with contextlib.suppress(OSError):
        probe.rmdir()


def _install(tmp: Path, dst: Path, force: bool) -> None:
    """Move the finished checkpoint into place; an existing destination goes only once it is replaced."""
    if not _exists(dst):
        os.rename(tmp, dst)
        return
    if not force:
        raise ConvertError(f"{dst} exists (appeared during the conversion); use --overwrite to replace it")
    _check_replaceable(dst)  # what it holds may have changed during the conversion
    replace_folder(tmp, dst)


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
    check_destination(dst, force)
    try:
        src_path = resolve_model_path(src)
    except ModelLoadError as e:
        raise ConvertError(str(e)) from e
    src_real, dst_real = src_path.resolve(), dst.resolve()
    if src_real == dst_real or dst_real in src_real.parents:
        raise ConvertError(f"{dst} is (or contains) the source checkpoint; choose another destination")

    try:
        source = read_source(src_path)
        plan = plan_conversion(source, recipe)
    except ModelLoadError as e:
        raise ConvertError(str(e)) from e
    kind = "forced aligner" if source.model_config.is_forced_aligner else "ASR"
    say(f"source: {src_path} ({source.layout} layout, {kind})")

    created: list[Path] = []
    tmp: Path | None = None
    try:
        _make_parents(dst.parent, created)
        removed, restored = remove_stale_folders(dst.parent)
        if removed:
            say(f"removed {len(removed)} folder(s) left by killed conversions: {_names(removed)}")
        for path in restored:
            say(f"put back {path}, which a killed conversion was replacing")
        if _exists(dst) and not force:  # one put back, or made meanwhile
            raise ConvertError(f"{dst} exists; use --overwrite to replace it")
        tmp = make_temp_folder(dst.parent, dst.name)
        say(f"writing {recipe.describe()} into {tmp.name}")
        files = write_weights(plan.tensors, tmp, max_shard_bytes)
        (tmp / "config.json").write_text(json.dumps(plan.config, indent=2, ensure_ascii=False) + "\n")
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
        if isinstance(e, OSError) and e.errno is not None:
            # A file of the source that cannot be read, or (any other) an unwritable destination or a
            # full disk: one line with the system's reason.
            if e.filename and _inside(Path(os.fsdecode(e.filename)), src_path):
                raise ConvertError(f"cannot read {os.fsdecode(e.filename)} ({_reason(e)})") from e
            raise ConvertError(f"cannot write {dst} ({_reason(e)})") from e
        if isinstance(e, Exception):
            # Unreadable tensor data (a truncated shard).
            raise ConvertError(f"conversion of {src_path} failed: {e.__class__.__name__}: {e}") from e
        raise
    return ConversionResult(
        path=dst,
        source=src_path,
        source_layout=source.layout,
        forced_aligner=source.model_config.is_forced_aligner,
        recipe=recipe,
        quantized=plan.quantized,
        unquantized=plan.unquantized,
        files=files,
    )


def _inside(path: Path, folder: Path) -> bool:
    path, folder = Path(os.path.abspath(path)), Path(os.path.abspath(folder))
    return path == folder or folder in path.parents


def _names(paths: list[Path]) -> str:
    shown = ", ".join(p.name for p in paths[:3])
    return shown + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")


__all__ = [
    "ENCODER_BITS",
    "GROUP_SIZES",
    "QUANT_BITS",
    "ConversionResult",
    "ConvertError",
    "Recipe",
    "check_destination",
    "convert_checkpoint",
    "foreign_entries",
    "make_recipe",
    "remove_stale_folders",
]
