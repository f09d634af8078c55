"""Loading the diarizer: speakrs imported, the execution mode chosen for the platform, the model folder
(or the hub's copy) checked and loaded."""

from __future__ import annotations

import logging
import os
import platform
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mlx_qwen3asr.diarize.diarizer import _WINDOW, Diarizer, _reason
from mlx_qwen3asr.diarize.turns import (
    INSTALL_COMMAND,
    SAMPLE_RATE,
    DiarizerLoadError,
    DiarizerUnavailable,
)

log = logging.getLogger("mlx_qwen3asr.diarize")

# The shortest embedding input the real models take is a few hundred samples; beyond a window
# (10 s) no window would ever get an embedding.
_MIN_SAMPLES_RANGE = (1, int(_WINDOW * SAMPLE_RATE))
_MIN_SAMPLES_FILE = "wespeaker-voxceleb-resnet34.min_num_samples.txt"


def _speakrs():
    """The speakrs module, imported now; DiarizerUnavailable (one line, with the fix) without it."""
    try:
        import speakrs
    except ImportError as e:
        if tuple(sys.version_info[:2]) < (3, 11):
            version = ".".join(str(v) for v in sys.version_info[:2])
            raise DiarizerUnavailable(
                f"speaker diarization needs Python 3.11 or newer (speakrs), this is Python {version}; "
                f"on 3.11+: {INSTALL_COMMAND}"
            ) from e
        raise DiarizerUnavailable(f"speaker diarization needs speakrs: {INSTALL_COMMAND}") from e
    return speakrs


def _nvidia_driver() -> bool:
    """Whether an NVIDIA driver is loaded on this machine (Linux)."""
    return os.path.exists("/proc/driver/nvidia/version")


def _available(speakrs: Any) -> list[str]:
    try:
        return [str(m) for m in speakrs.available_modes()]
    except Exception:  # an older build without it: the CPU mode only
        return ["CPU"]


def _auto_mode(speakrs: Any) -> str:
    """The mode the platform runs fastest that this speakrs build has: CoreML on macOS arm64, CUDA on
    Linux beside an NVIDIA driver, else the CPU."""
    modes = {m.lower(): m for m in _available(speakrs)}
    if sys.platform == "darwin" and platform.machine() == "arm64" and "coreml" in modes:
        return modes["coreml"]
    if sys.platform.startswith("linux") and "cuda" in modes and _nvidia_driver():
        return modes["cuda"]
    return "CPU"


def _is_cpu(mode: str) -> bool:
    return str(mode).lower() == "cpu"


def _check_folder(speakrs: Any, folder: Path, mode: str) -> None:
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise DiarizerLoadError(f"diarizer folder {folder} {what}")
    required = list(speakrs.required_model_files(mode))
    missing = [name for name in required if not (folder / name).exists()]
    if missing:
        more = (
            f" (and {len(missing) - 1} more of its {len(required)} model files)" if len(missing) > 1 else ""
        )
        which = "" if _is_cpu(mode) else f" for speakrs's {mode} mode"
        raise DiarizerLoadError(f"diarizer folder {folder} lacks {missing[0]}{more}{which}")


def _check_values(folder: Path, names: Sequence[str]) -> None:
    """Refuse, in one line naming the file, weights that are not finite numbers and a shortest embedding
    input out of range: speakrs loads both silently (and then finds speakers everywhere, or none)."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    for name in names:
        path = folder / name
        if not path.is_file():
            continue
        try:
            if name.endswith(".safetensors"):
                arrays = list(load_file(str(path)).values())
            elif name.endswith(".npy"):
                arrays = [np.load(path, allow_pickle=False)]
            elif name == _MIN_SAMPLES_FILE:
                _check_min_samples(path)
                continue
            else:
                continue
        except (OSError, ValueError, SafetensorError):
            continue  # unreadable: speakrs says why, naming it
        for array in arrays:
            if array.dtype.kind in "fc" and not np.isfinite(array).all():
                raise DiarizerLoadError(
                    f"diarizer folder {folder}: {name} holds weights that are not finite numbers"
                )


def _check_min_samples(path: Path) -> None:
    low, high = _MIN_SAMPLES_RANGE
    text = path.read_text(errors="replace").strip()
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        shown = text if len(text) <= 20 else text[:20] + "..."
        raise DiarizerLoadError(
            f"diarizer folder {path.parent}: {path.name} holds {shown!r}, not a sample count from {low} "
            f"to {high} (the shortest input of the speaker embedding)"
        )


def _load_from_folder(speakrs: Any, folder: Path, mode: str) -> Any:
    _check_folder(speakrs, folder, mode)
    _check_values(folder, list(speakrs.required_model_files(mode)))
    try:
        return speakrs.Pipeline.from_prepared(speakrs.prepare(mode, model_dir=folder))
    except speakrs.SpeakrsError as e:
        raise DiarizerLoadError(f"cannot load the diarization models in {folder}: {_reason(e)}") from e


def _prepare_from_hub(speakrs: Any, mode: str) -> Any:
    """The library's own download into its cache; offline, a complete cached copy of its pinned revision."""
    try:
        return speakrs.prepare(mode)
    except speakrs.SpeakrsError as e:
        required = list(speakrs.required_model_files(mode))
        try:
            cached = list(speakrs.list_cache())
        except speakrs.SpeakrsError:
            cached = []
        for entry in cached:
            if entry.revision == speakrs.DEFAULT_MODEL_REVISION and all(
                (Path(entry.path) / name).exists() for name in required
            ):
                return speakrs.prepare(mode, model_dir=entry.path)
        raise DiarizerLoadError(
            f"cannot get the diarization models ({speakrs.DEFAULT_MODEL_REPOSITORY}) from the Hugging Face "
            f"hub: {_reason(e)}; give a folder holding its model files instead (--diarizer DIR, "
            "MLXASR_DIARIZER or load_diarizer(PATH))"
        ) from e


def _load_from_hub(speakrs: Any, mode: str) -> tuple[Any, str, Path]:
    prepared = _prepare_from_hub(speakrs, mode)
    folder = Path(prepared.model_dir)
    _check_values(folder, list(speakrs.required_model_files(mode)))
    try:
        pipeline = speakrs.Pipeline.from_prepared(prepared)
    except speakrs.SpeakrsError as e:
        raise DiarizerLoadError(f"cannot load the diarization models in {folder}: {_reason(e)}") from e
    revision = prepared.revision or speakrs.DEFAULT_MODEL_REVISION
    return pipeline, f"{speakrs.DEFAULT_MODEL_REPOSITORY}@{revision}", folder


def load_diarizer(
    path: str | Path | None = None, *, mode: str | None = None, isolated: bool = False
) -> Diarizer:
    """The diarizer, its models loaded.

    path: a folder holding the model files of its mode (for the CPU mode: segmentation-3.0.safetensors,
    wespeaker-multimask-tail.safetensors, wespeaker-voxceleb-resnet34.min_num_samples.txt and six
    plda_*.npy; `tools/make_checkpoint.py --preset diarizer` writes them with random weights). None:
    speakrs downloads them from the hub (avencera/speakrs-models) into its cache (SPEAKRS_CACHE_DIR,
    else the Hugging Face cache) on first use.
    mode: speakrs's execution mode ("CPU"; "CoreML" on macOS, "CUDA" on Linux, where this build has
    them: speakrs.available_modes()). None: the platform's accelerated mode where this build has it
    (CoreML on macOS arm64; CUDA on Linux with an NVIDIA driver), else the CPU; an accelerated mode that
    does not load (its model files missing, the library refusing) falls back to the CPU, saying so in
    one log line. The diarizer's `mode` says which runs.
    isolated: the library's runs are made by a worker process (a Python of its own that imports only
    numpy and speakrs, started on the first call and kept for the next), so that cancel() stops a call
    at once by killing it, where speakrs itself stops only between its stages (minutes apart on long
    audio on the CPU); a call after a cancel starts another process, which loads the models again
    (about a second). The models are loaded and checked here first all the same. What a server uses,
    whose clients may leave; POSIX only (elsewhere a log line says so and the runs stay in this process).

    Raises DiarizerUnavailable without speakrs, DiarizerLoadError for a bad folder, unreadable or
    non-finite models or the hub out of reach (each one line).
    """
    speakrs = _speakrs()
    if isolated and os.name != "posix":
        log.warning(
            "diarizer: no worker process on this platform; a cancel waits for the library's next stage"
        )
        isolated = False
    folder = None if path is None else Path(path).expanduser()
    if mode is None:
        chosen = _auto_mode(speakrs)
    else:  # speakrs's own spelling of it, when it has the mode
        chosen = {m.lower(): m for m in _available(speakrs)}.get(str(mode).lower(), str(mode))
    if mode is None and not _is_cpu(chosen):
        try:
            return _load(speakrs, folder, chosen, isolated)
        except DiarizerLoadError as e:
            if folder is not None and not folder.is_dir():
                raise
            log.warning("diarizer: speakrs's %s mode did not load (%s); running on the CPU", chosen, e)
            chosen = "CPU"
    return _load(speakrs, folder, chosen, isolated)


def _load(speakrs: Any, folder: Path | None, mode: str, isolated: bool) -> Diarizer:
    if folder is not None:
        pipeline = _load_from_folder(speakrs, folder, mode)
        source = str(folder)
    else:
        pipeline, source, folder = _load_from_hub(speakrs, mode)
    return Diarizer(pipeline, speakrs, source, mode=mode, model_dir=str(folder), isolated=isolated)
