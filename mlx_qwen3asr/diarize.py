"""Who spoke when: speaker diarization with speakrs, and the speakers given to a transcript's words.

    diarizer = load_diarizer("models/diarizer")       # a folder with the model files; None: the hub
    turns = diarizer(samples, DiarizeOptions(max_speakers=4), speech=[(0.4, 9.8), (12.0, 30.5)])
    result = assign_speakers(result, turns, names=["Alice", "Bob"])

The diarizer is speakrs (Apache-2.0), which runs pyannote's community-1 pipeline (segmentation-3.0,
WeSpeaker ResNet34 embeddings, PLDA and VBx clustering) with its own kernels on safetensors and .npy
files: no torch, no ONNX Runtime. It is an optional dependency (`pip install "mlx-qwen3asr[diarize]"`,
Python 3.11 or newer), imported only when a diarizer is loaded. speakrs releases the GIL while it
works, so a diarizer runs on a thread beside transcription. It runs in the platform's accelerated mode
where the installed speakrs has one (CoreML on Apple silicon, CUDA beside an NVIDIA driver), else on
the CPU.

speakrs has no setting for the number of speakers. DiarizeOptions' counts are reached by clustering
again with another AHC threshold (a speaker of VBx can only come from an AHC cluster, so a higher
threshold gives no more speakers): each try is a full run, and at most _MAX_RETRIES more are made.
When no threshold tried gives a count in the range, the closest result is kept and its `warnings` say
so. One speaker (num_speakers or max_speakers 1) needs no run at all.
"""

from __future__ import annotations

import bisect
import logging
import math
import os
import platform
import re
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from mlx_qwen3asr.pipeline.result import Segment, Transcription, Word

__all__ = [
    "INSTALL_COMMAND",
    "SPEAKRS_VERSION",
    "DiarizeCancelled",
    "DiarizeOptions",
    "DiarizeProgress",
    "Diarizer",
    "DiarizerError",
    "DiarizerLoadError",
    "DiarizerUnavailable",
    "Turn",
    "Turns",
    "assign_speakers",
    "load_diarizer",
    "rttm_lines",
    "speaker_label",
    "split_at_speakers",
]

log = logging.getLogger(__name__)

# The speakrs release this is built and tested against (pyproject.toml's `diarize` extra pins it).
SPEAKRS_VERSION = "0.7.0"
INSTALL_COMMAND = 'pip install "mlx-qwen3asr[diarize]"'
SAMPLE_RATE = 16000
# A word or segment is marked `overlap` when two or more speakers talk together over at least this
# share of its span (for a word without duration: at its instant).
OVERLAP_SHARE = 0.5
# The AHC threshold's range (centroid linkage on unit-length embeddings: distances up to 2), and how
# many more runs a speaker count may take (each is a full run: speakrs cannot cluster again alone).
_THRESHOLD_MAX = 2.0
_MAX_RETRIES = 2
# Speech stretches are diarized joined, this much silence between two (closer ones are one stretch).
_JOIN_GAP = 0.5
# speakrs's segmentation looks at 10 s windows, one every second: a run's work is its window count.
_WINDOW, _STEP = 10.0, 1.0
# Seconds of compute per window (per audio second, beyond the first window) before a run has been
# timed, by mode. CPU: speakrs on the random `diarizer` preset, which marks speech everywhere (its most
# work), on a 2-core x86_64 machine: 0.83 with both cores free, 0.9 to 1.3 while they are shared (0.47
# on 16 cores). CUDA: 0.001 on an H200 (60 s in 0.05 s). CoreML: speakrs's own figure, a 17-minute
# meeting in under 5 s on an M4 Pro.
_PRIOR_SPEED = 1.0
_PRIOR_SPEEDS = {"cpu": _PRIOR_SPEED, "cuda": 0.001, "cudafast": 0.001, "coreml": 0.005, "coremlfast": 0.005}
# The weight a timed run keeps when the next is timed (the speed follows the latest runs).
_SPEED_DECAY = 0.5
# The shortest embedding input the real models take is a few hundred samples; beyond a window
# (10 s) no window would ever get an embedding.
_MIN_SAMPLES_RANGE = (1, int(_WINDOW * SAMPLE_RATE))
_MIN_SAMPLES_FILE = "wespeaker-voxceleb-resnet34.min_num_samples.txt"


class DiarizerError(Exception):
    """Diarization cannot be done: the library is missing, the models cannot be loaded, or the run stopped."""


class DiarizerUnavailable(DiarizerError):
    """The diarization library (speakrs) is not installed, or cannot be on this Python."""


class DiarizerLoadError(DiarizerError):
    """The diarization models cannot be found or loaded (a bad folder, or the hub out of reach)."""


class DiarizeCancelled(DiarizerError):
    """Diarizer.cancel() stopped the run."""


@dataclass(frozen=True)
class Turn:
    """A stretch of one speaker's speech, in seconds; speakers are numbered 0, 1, ... in order of first
    appearance. Turns of different speakers overlap where they talk at once."""

    start: float
    end: float
    speaker: int


class Turns(list):
    """The turns of one run (a list of Turn, in time order), with what the run has to say about them."""

    def __init__(self, turns: Sequence[Turn] = (), warnings: Sequence[str] = ()) -> None:
        super().__init__(turns)
        self.warnings: list[str] = list(warnings)

    @property
    def speaker_count(self) -> int:
        return len({t.speaker for t in self})


@dataclass(frozen=True)
class DiarizeProgress:
    """Where a diarizer call stands (Diarizer.progress()).

    audio_seconds: the speech this call diarizes; elapsed: seconds since it started; fraction (0..1,
    below 1 until the call returns) and seconds_left: estimated from the elapsed time and the speed of
    the diarizer's timed runs, counting every run the speaker-count search may still make; attempt: the
    run in progress (1-based); attempts: the most runs this call may take (1 without a count search).
    """

    audio_seconds: float
    elapsed: float
    fraction: float
    seconds_left: float
    attempt: int
    attempts: int


def _count(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a whole number of at least 1, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class DiarizeOptions:
    """How many speakers to look for: exactly num_speakers, or between min_speakers and max_speakers
    (None: as many as the clustering finds)."""

    num_speakers: int | None = None
    min_speakers: int | None = None
    max_speakers: int | None = None

    def __post_init__(self) -> None:
        num = _count(self.num_speakers, "num_speakers")
        low = _count(self.min_speakers, "min_speakers")
        high = _count(self.max_speakers, "max_speakers")
        if num is not None and (low is not None or high is not None):
            raise ValueError("give num_speakers alone, or min_speakers and/or max_speakers")
        if low is not None and high is not None and low > high:
            raise ValueError(f"min_speakers ({low}) must not exceed max_speakers ({high})")

    @property
    def bounds(self) -> tuple[int, float]:
        """The counts allowed: (lowest, highest), highest inf without a limit."""
        if self.num_speakers is not None:
            return self.num_speakers, self.num_speakers
        return self.min_speakers or 1, math.inf if self.max_speakers is None else self.max_speakers


def _wanted(low: int, high: float) -> str:
    """A count range in words: "2 speakers", "at most 1 speaker", "at least 3 speakers", "2 to 4 speakers"."""

    def speakers(n: float) -> str:
        return f"{int(n)} speaker" + ("" if n == 1 else "s")

    if low == high:
        return speakers(low)
    if high == math.inf:
        return f"at least {speakers(low)}"
    if low <= 1:
        return f"at most {speakers(high)}"
    return f"{low} to {speakers(high)}"


# --------------------------------------------------------------------------------------------------
# The library and its execution mode
# --------------------------------------------------------------------------------------------------


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


def _reason(error: BaseException) -> str:
    """A library error in one line, without its category tag."""
    message = getattr(error, "message", None) or str(error) or type(error).__name__
    return " ".join(str(message).split())


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


def _load_from_hub(speakrs: Any, mode: str) -> tuple[Any, str]:
    prepared = _prepare_from_hub(speakrs, mode)
    folder = Path(prepared.model_dir)
    _check_values(folder, list(speakrs.required_model_files(mode)))
    try:
        pipeline = speakrs.Pipeline.from_prepared(prepared)
    except speakrs.SpeakrsError as e:
        raise DiarizerLoadError(f"cannot load the diarization models in {folder}: {_reason(e)}") from e
    revision = prepared.revision or speakrs.DEFAULT_MODEL_REVISION
    return pipeline, f"{speakrs.DEFAULT_MODEL_REPOSITORY}@{revision}"


def load_diarizer(path: str | Path | None = None, *, mode: str | None = None) -> Diarizer:
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

    Raises DiarizerUnavailable without speakrs, DiarizerLoadError for a bad folder, unreadable or
    non-finite models or the hub out of reach (each one line).
    """
    speakrs = _speakrs()
    folder = None if path is None else Path(path).expanduser()
    if mode is None:
        chosen = _auto_mode(speakrs)
    else:  # speakrs's own spelling of it, when it has the mode
        chosen = {m.lower(): m for m in _available(speakrs)}.get(str(mode).lower(), str(mode))
    if mode is None and not _is_cpu(chosen):
        try:
            return _load(speakrs, folder, chosen)
        except DiarizerLoadError as e:
            if folder is not None and not folder.is_dir():
                raise
            log.warning("diarizer: speakrs's %s mode did not load (%s); running on the CPU", chosen, e)
            chosen = "CPU"
    return _load(speakrs, folder, chosen)


def _load(speakrs: Any, folder: Path | None, mode: str) -> Diarizer:
    if folder is not None:
        return Diarizer(_load_from_folder(speakrs, folder, mode), speakrs, str(folder), mode=mode)
    pipeline, source = _load_from_hub(speakrs, mode)
    return Diarizer(pipeline, speakrs, source, mode=mode)


def _windows(seconds: float) -> float:
    """A run's work, in segmentation windows, for this much audio (0 for none)."""
    if seconds <= 0:
        return 0.0
    return 1.0 + max(0.0, seconds - _WINDOW) / _STEP


def _joined(
    samples: np.ndarray, speech: Sequence[Sequence[float]]
) -> tuple[np.ndarray, list[tuple[int, int, int]]]:
    """The speech stretches of samples, joined with _JOIN_GAP of silence between them, and the pieces:
    (start, end in samples, start in the joined samples). Stretches are clipped to the audio, sorted,
    and merged where less than the gap apart."""
    size = samples.size
    spans = []
    for item in speech:
        start, end = (float(v) for v in item)
        if not (math.isfinite(start) and math.isfinite(end)):
            raise ValueError(f"speech holds a stretch that is not finite: {tuple(item)!r}")
        a = min(max(int(round(start * SAMPLE_RATE)), 0), size)
        b = min(max(int(round(end * SAMPLE_RATE)), 0), size)
        if b > a:
            spans.append((a, b))
    gap = int(_JOIN_GAP * SAMPLE_RATE)
    merged: list[list[int]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1] + gap:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    pieces, parts, at = [], [], 0
    silence = np.zeros(gap, np.float32)
    for k, (a, b) in enumerate(merged):
        if k:
            parts.append(silence)
            at += gap
        pieces.append((a, b, at))
        parts.append(samples[a:b])
        at += b - a
    joined = np.concatenate(parts) if parts else samples[:0]
    return np.ascontiguousarray(joined), pieces


class Diarizer:
    """A loaded diarization pipeline. Call it on 16 kHz mono float32 samples for their turns.

    One call runs at a time (others wait); the library releases the GIL while it works, so other
    threads (transcription) go on. cancel() stops the call in progress at the library's next stage
    boundary (it raises DiarizeCancelled); Ctrl-C in the calling thread does the same. progress() tells
    how far the call in progress is, estimate() what a call would cost, both from the speed of the runs
    timed so far.
    """

    def __init__(self, pipeline: Any, speakrs: Any, source: str, *, mode: str = "CPU") -> None:
        self._pipeline = pipeline
        self._speakrs = speakrs
        self.source = source  # the model folder, or the hub repository and revision
        self.mode = mode  # speakrs's execution mode: "CPU", "CoreML", "CUDA"
        self._lock = threading.Lock()
        self._token: Any = None
        self._token_lock = threading.Lock()
        # Timed runs: seconds and windows, the older ones weighing less.
        self._spent = 0.0
        self._worked = 0.0
        # The call in progress: (started, audio seconds, windows, attempt, attempts, run started).
        self._call: tuple[float, float, float, int, int, float] | None = None

    def __repr__(self) -> str:
        return f"Diarizer({self.source!r}, mode={self.mode!r})"

    def cancel(self) -> None:
        """Stop the call in progress, if any (it raises DiarizeCancelled); later calls run as usual."""
        with self._token_lock:
            if self._token is not None:
                self._token.cancel()

    @property
    def speed(self) -> float:
        """Seconds of compute per segmentation window (about one per audio second): the timed runs',
        else a prior for its mode."""
        with self._token_lock:
            if self._worked > 0:
                return self._spent / self._worked
        return _PRIOR_SPEEDS.get(self.mode.lower(), _PRIOR_SPEED)

    def estimate(self, audio_seconds: float) -> float:
        """Expected seconds of compute to diarize this much audio (one run), at the measured speed."""
        return self.speed * _windows(float(audio_seconds))

    def progress(self) -> DiarizeProgress | None:
        """Where the call in progress stands, None when none runs. Cheap, from any thread."""
        with self._token_lock:
            call = self._call
        if call is None:
            return None
        started, audio, windows, attempt, attempts, run_started = call
        now = time.monotonic()
        expected = max(self.speed * windows, 1e-3)
        spent = now - run_started
        # This run's time left: as estimated, then (past 90% of the estimate) less and less, never 0.
        left = expected - spent if spent <= 0.9 * expected else 0.01 * expected**2 / (spent - 0.8 * expected)
        left += (attempts - attempt) * expected
        elapsed = now - started
        fraction = elapsed / (elapsed + left) if elapsed + left > 0 else 0.0
        return DiarizeProgress(audio, elapsed, min(fraction, 0.999), left, attempt, attempts)

    def _config(self, threshold: float | None) -> Any:
        if threshold is None:
            return None
        sp = self._speakrs
        base = self._pipeline.pipeline_config
        clustering = sp.ClusteringConfig(
            ahc=sp.AhcConfig(threshold),
            vbx=base.clustering.vbx,
            speaker_keep_threshold=base.clustering.speaker_keep_threshold,
        )
        return sp.PipelineConfig(
            activity=base.activity,
            clustering=clustering,
            merge_gap=base.merge_gap,
            reconstruct_method=base.reconstruct_method,
            smoothing_epsilon=base.smoothing_epsilon,
        )

    def _run(self, samples: np.ndarray, threshold: float | None, token: Any, attempt: int) -> list[tuple]:
        with self._token_lock:
            if self._call is not None:
                self._call = (*self._call[:3], attempt, self._call[4], time.monotonic())
        began = time.perf_counter()
        try:
            result = self._pipeline.diarize_samples(
                samples, pipeline_config=self._config(threshold), cancel_token=token
            )
        except self._speakrs.SpeakrsError as e:
            if getattr(e, "category", None) == "cancelled":
                raise DiarizeCancelled("diarization was cancelled") from e
            raise DiarizerError(f"diarization failed: {_reason(e)}") from e
        took = time.perf_counter() - began
        with self._token_lock:
            self._spent = _SPEED_DECAY * self._spent + took
            self._worked = _SPEED_DECAY * self._worked + _windows(samples.size / SAMPLE_RATE)
        return _spans(result.segments, samples.size / SAMPLE_RATE)

    def __call__(
        self,
        samples: np.ndarray,
        options: DiarizeOptions = DiarizeOptions(),
        *,
        speech: Sequence[Sequence[float]] | None = None,
    ) -> Turns:
        """The speaker turns of 16 kHz mono audio, in time order, numbered by first appearance.

        speech: the (start, end) stretches, in seconds, that hold speech (speech detection's); only
        those are diarized, and no turn reaches outside them. Empty: no turns, at no cost. None: all
        the audio. One speaker asked for (num_speakers or max_speakers 1): speaker 0 over the speech
        (or the whole audio), without running the library.
        """
        samples = np.ascontiguousarray(samples, dtype=np.float32)
        if samples.ndim != 1:
            raise ValueError(f"samples must be mono (1-D), got shape {samples.shape}")
        if not np.isfinite(samples).all():
            raise ValueError("samples hold values that are not finite numbers")
        if speech is None:
            audio, pieces = samples, [(0, samples.size, 0)]
        else:
            audio, pieces = _joined(samples, speech)
        if audio.size == 0:
            return Turns()
        low, high = options.bounds
        if high == 1:
            return Turns(
                _turns([(at / SAMPLE_RATE, (at + b - a) / SAMPLE_RATE, "one") for a, b, at in pieces], pieces)
            )
        speech_seconds = sum(b - a for a, b, _ in pieces) / SAMPLE_RATE
        attempts = 1 if (low, high) == (1, math.inf) else 1 + _MAX_RETRIES
        with self._lock:
            token = self._speakrs.CancelToken()
            now = time.monotonic()
            with self._token_lock:
                self._token = token
                self._call = (now, speech_seconds, _windows(audio.size / SAMPLE_RATE), 1, attempts, now)
            try:
                spans, warnings = self._search(audio, options, token)
            finally:
                with self._token_lock:
                    self._token = None
                    self._call = None
        return Turns(_turns(spans, pieces), warnings)

    def _search(
        self, samples: np.ndarray, options: DiarizeOptions, token: Any
    ) -> tuple[list[tuple], list[str]]:
        low, high = options.bounds
        spans = self._run(samples, None, token, 1)
        found = _speaker_count(spans)
        if low <= found <= high or not spans:
            return spans, []
        # Another AHC threshold: higher for fewer speakers, lower for more; the count falls as the
        # threshold rises. The far end of the range goes first: if it gives no count nearer the range,
        # no threshold does. Else the threshold between it and the default is bisected for, the aim
        # being the count in range nearest the one found.
        default = float(self._pipeline.pipeline_config.clustering.ahc.threshold)
        fewer = found > high
        target = int(high) if fewer else low
        best, best_score = spans, (_miss(found, low, high), abs(found - target))
        lo, hi = (default, _THRESHOLD_MAX) if fewer else (0.0, default)
        threshold = hi if fewer else lo
        for attempt in range(2, 2 + _MAX_RETRIES):
            spans = self._run(samples, threshold, token, attempt)
            count = _speaker_count(spans)
            score = (_miss(count, low, high), abs(count - target))
            if score < best_score:
                best, best_score = spans, score
            if count == target:
                break
            if count > target:
                lo = threshold  # too many: higher
            else:
                hi = threshold  # too few: lower
            if hi - lo < 1e-3:
                break
            threshold = (lo + hi) / 2
        warnings = []
        if best_score[0]:
            warnings.append(
                f"asked for {_wanted(low, high)}, the clustering found {_speaker_count(best)} at every "
                "threshold tried"
            )
        return best, warnings


def _speaker_count(spans: Sequence[tuple[float, float, str]]) -> int:
    return len({label for _, _, label in spans})


def _miss(count: int, low: int, high: float) -> float:
    return low - count if count < low else count - high if count > high else 0


def _spans(segments: Sequence[Any], duration: float) -> list[tuple[float, float, str]]:
    """The library's segments as (start, end, label), within the audio (it pads the last window)."""
    spans = []
    for seg in segments:
        start = min(max(float(seg.start), 0.0), duration)
        end = min(max(float(seg.end), 0.0), duration)
        if end > start:
            spans.append((start, end, str(seg.speaker)))
    return spans


def _turns(spans: Sequence[tuple[float, float, str]], pieces: Sequence[tuple[int, int, int]]) -> list[Turn]:
    """Spans of the joined audio as Turns of the original: cut at the joins (a span over a gap gives a
    turn on each side, none in the gap), moved to their place, in milliseconds (none of zero length),
    in time order, speakers renumbered by first appearance."""
    out = []
    for start, end, label in spans:
        for a, b, at in pieces:
            lo, hi = at / SAMPLE_RATE, (at + b - a) / SAMPLE_RATE
            s, e = max(start, lo), min(end, hi)
            if e > s:
                shift = (a - at) / SAMPLE_RATE
                s, e = round(s + shift, 3), round(e + shift, 3)
                if e > s:
                    out.append((s, e, label))
    out.sort(key=lambda s: (s[0], s[1], s[2]))
    numbers: dict[str, int] = {}
    for _, _, label in out:
        numbers.setdefault(label, len(numbers))
    return [Turn(start, end, numbers[label]) for start, end, label in out]


# --------------------------------------------------------------------------------------------------
# Speakers for a transcript
# --------------------------------------------------------------------------------------------------


class _Activity:
    """Who speaks when: each speaker's merged intervals, and where two or more talk at once, queried
    by bisection (a transcript of hours has thousands of turns and tens of thousands of words)."""

    def __init__(self, turns: Sequence[Turn]) -> None:
        by_speaker: dict[int, list[tuple[float, float]]] = {}
        for t in turns:
            if t.end > t.start:
                by_speaker.setdefault(t.speaker, []).append((float(t.start), float(t.end)))
        self.order = {s: k for k, s in enumerate(by_speaker)}  # first appearance
        self.intervals = {s: _Spans(_merged(spans)) for s, spans in by_speaker.items()}
        # Where two or more speakers talk: a sweep over every speaker's interval ends.
        events = sorted(
            [(a, 1) for spans in self.intervals.values() for a, _ in spans.spans]
            + [(b, -1) for spans in self.intervals.values() for _, b in spans.spans],
            key=lambda e: (e[0], e[1]),
        )
        both, talking, opened = [], 0, 0.0
        for at, step in events:
            if talking >= 2 and at > opened:
                both.append((opened, at))
            talking += step
            opened = at
        self.crosstalk = _Spans(_merged(both))

    def who(self, start: float, end: float) -> tuple[int, bool]:
        """The speaker of [start, end] (the one talking longest in it; for a span without duration, at
        its instant; else the nearest) and whether it is overlapped speech."""
        if end > start:
            shares = {s: spans.within(start, end) for s, spans in self.intervals.items()}
            shares = {s: t for s, t in shares.items() if t > 0}
            if shares:
                speaker = max(shares, key=lambda s: (shares[s], -self.order[s]))
                return speaker, self.crosstalk.within(start, end) >= OVERLAP_SHARE * (end - start)
        here = [s for s, spans in self.intervals.items() if spans.gap(start, start) == 0.0]
        if here:
            return min(here, key=self.order.__getitem__), len(here) >= 2
        return min(self.intervals, key=lambda s: (self.intervals[s].gap(start, end), self.order[s])), False


class _Spans:
    """Sorted, disjoint intervals."""

    def __init__(self, spans: list[tuple[float, float]]) -> None:
        self.spans = spans
        self.ends = [b for _, b in spans]

    def within(self, start: float, end: float) -> float:
        """Seconds of the intervals inside [start, end]."""
        time = 0.0
        for a, b in self.spans[bisect.bisect_right(self.ends, start) :]:
            if a >= end:
                break
            time += max(0.0, min(b, end) - max(a, start))
        return time

    def gap(self, start: float, end: float) -> float:
        """How far [start, end] is from the nearest interval (0 where they touch or overlap)."""
        k = bisect.bisect_left(self.ends, start)  # the first interval ending at or after start
        best = math.inf
        if k < len(self.spans):
            best = max(self.spans[k][0] - end, 0.0)
        if k > 0:
            best = min(best, start - self.ends[k - 1])
        return best


def _merged(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def _aligned(segment: Segment) -> bool:
    return segment.timing == "aligned" and bool(segment.words)


def _word_spans(text: str, words: Sequence[Word]) -> list[tuple[int, int]] | None:
    """Each word's span in text (its char_start/char_end, or found by its text where those are
    unusable); None when a word cannot be placed."""
    spans = []
    pos = 0
    for w in words:
        cs, ce = w.char_start, w.char_end
        if not (isinstance(cs, int) and isinstance(ce, int) and pos <= cs < ce <= len(text)):
            needle = (w.text or "").strip()
            found = text.find(needle, pos) if needle else -1
            if found < 0:
                return None
            cs, ce = found, found + len(needle)
        spans.append((cs, ce))
        pos = ce
    return spans


def split_at_speakers(segment: Segment) -> list[Segment]:
    """The segment cut where the speaker of its words changes: each piece holds one speaker's run of
    words, its text from that run's first word up to the next run's, its words' spans re-based. The
    cuts are timed by the words (a piece ends with its last word and the next starts with its first);
    the first piece keeps the segment's start and the last its end. A segment whose words share one
    speaker (or that has no aligned words) comes back as it is."""
    words = segment.words
    if not _aligned(segment) or len({w.speaker for w in words}) < 2:
        return [segment]
    spans = _word_spans(segment.text, words)
    if spans is None:
        return [segment]
    runs: list[list[int]] = []
    for k, w in enumerate(words):
        if runs and words[runs[-1][-1]].speaker == w.speaker:
            runs[-1].append(k)
        else:
            runs.append([k])
    pieces = []
    for r, run in enumerate(runs):
        cut_from = 0 if r == 0 else spans[run[0]][0]
        cut_to = len(segment.text) if r + 1 == len(runs) else spans[runs[r + 1][0]][0]
        raw = segment.text[cut_from:cut_to]
        lead = len(raw) - len(raw.lstrip())
        text = raw.strip()
        offset = cut_from + lead
        run_words = [
            replace(
                words[k],
                char_start=max(0, min(spans[k][0] - offset, len(text))),
                char_end=max(0, min(spans[k][1] - offset, len(text))),
            )
            for k in run
        ]
        first, last = words[run[0]], words[run[-1]]
        start = segment.start if r == 0 else first.start
        end = segment.end if r + 1 == len(runs) else last.end
        pieces.append(
            replace(
                segment,
                start=start,
                end=max(end, start),
                text=text,
                words=run_words,
                speaker=first.speaker,
                overlap=any(w.overlap for w in run_words),
            )
        )
    return pieces


def speaker_label(number: int, names: Sequence[str] | None = None) -> str:
    """The label of the speaker that appears number-th (0-based): names[number], else "Speaker N"."""
    if names is not None and number < len(names):
        return names[number]
    return f"Speaker {number + 1}"


def _check_names(names: Sequence[str] | None) -> list[str] | None:
    if names is None:
        return None
    if isinstance(names, str):
        raise ValueError("names must be a list of names, not one string")
    out = [str(n).strip() for n in names]
    if any(not n for n in out):
        raise ValueError("speaker names must not be empty")
    duplicates = sorted({n for n in out if out.count(n) > 1})
    if duplicates:
        raise ValueError(f"speaker names must differ: {', '.join(duplicates)} given twice")
    return out


def assign_speakers(
    transcription: Transcription, turns: Sequence[Turn], names: Sequence[str] | None = None
) -> Transcription:
    """The transcription with a speaker on every segment and aligned word, and its speakers listed.

    An aligned word takes the speaker who talks over most of its span (a word without duration: the
    one talking at its instant; a word between turns: the nearest); a segment is cut where the speaker
    changes between its words (split_at_speakers), so that none spans two speakers. A segment without
    word timing takes the speaker of most of its time. Where turns overlap the dominant speaker is kept,
    and a word or segment with two or more speakers over at least half its span is marked `overlap`.
    Speakers are labelled "Speaker 1", "Speaker 2", ... (or names, in that order) in order of first
    appearance in the transcript; a speaker who says nothing transcribed gets no label. Without turns
    the transcription comes back unchanged. The input is not modified.
    """
    names = _check_names(names)
    if not turns:
        return transcription
    activity = _Activity(turns)
    if not activity.intervals:
        return transcription
    labels: dict[int, str] = {}

    def label(speaker: int) -> str:
        if speaker not in labels:
            labels[speaker] = speaker_label(len(labels), names)
        return labels[speaker]

    segments: list[Segment] = []
    for seg in transcription.segments:
        if _aligned(seg) and all(_finite(w.start) and _finite(w.end) for w in seg.words):
            words = []
            for w in seg.words:
                speaker, overlap = activity.who(float(w.start), max(float(w.start), float(w.end)))
                words.append(replace(w, speaker=label(speaker), overlap=overlap))
            pieces = split_at_speakers(replace(seg, words=words))
            if len(pieces) == 1 and len({w.speaker for w in words}) > 1:
                # Words that cannot be placed in the text: the segment goes to its main speaker.
                time: dict[str, float] = {}
                for w in words:
                    time[w.speaker] = time.get(w.speaker, 0.0) + max(float(w.end) - float(w.start), 1e-3)
                main = max(time, key=lambda s: time[s])
                pieces = [replace(seg, words=words, speaker=main, overlap=any(w.overlap for w in words))]
            else:
                pieces = [
                    replace(p, speaker=p.words[0].speaker, overlap=any(w.overlap for w in p.words))
                    for p in pieces
                ]
            segments.extend(pieces)
        elif _finite(seg.start) and _finite(seg.end):
            speaker, overlap = activity.who(float(seg.start), max(float(seg.start), float(seg.end)))
            segments.append(replace(seg, speaker=label(speaker), overlap=overlap))
        else:
            segments.append(seg)
    return replace(transcription, segments=segments, speakers=list(labels.values()))


# --------------------------------------------------------------------------------------------------
# RTTM
# --------------------------------------------------------------------------------------------------


def _rttm_token(text: str) -> str:
    """A field of an RTTM line: one token, whitespace replaced by underscores."""
    return re.sub(r"\s+", "_", str(text).strip()) or "<NA>"


def rttm_lines(file_id: str, source: Sequence[Turn] | Transcription) -> str:
    """RTTM, one `SPEAKER <file> 1 <start> <duration> <NA> <NA> <speaker> <NA> <NA>` line per turn, or
    per segment with a speaker of a transcription (after assign_speakers), in time order, times in
    seconds to the millisecond. Turns' speakers are written Speaker_1, Speaker_2, ...; a transcription's
    are its labels, with underscores for spaces (an RTTM field is one token)."""
    file_id = _rttm_token(file_id)
    if isinstance(source, Transcription):
        spans = [
            (float(s.start), float(s.end), _rttm_token(s.speaker))
            for s in source.segments
            if s.speaker is not None and _finite(s.start) and _finite(s.end)
        ]
    else:
        spans = [(float(t.start), float(t.end), f"Speaker_{int(t.speaker) + 1}") for t in source]
    spans.sort(key=lambda s: (s[0], s[1]))
    lines = []
    for start, end, speaker in spans:
        duration = max(0.0, end - start)
        lines.append(f"SPEAKER {file_id} 1 {start:.3f} {duration:.3f} <NA> <NA> {speaker} <NA> <NA>\n")
    return "".join(lines)
