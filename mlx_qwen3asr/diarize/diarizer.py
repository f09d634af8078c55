"""The Diarizer: one pipeline of speakrs run on the speech of 16 kHz samples, the speaker-count search
through the clustering threshold, and its progress estimated from the time."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from mlx_qwen3asr.diarize.process import Worker
from mlx_qwen3asr.diarize.turns import (
    SAMPLE_RATE,
    DiarizeCancelled,
    DiarizeOptions,
    DiarizeProgress,
    DiarizerError,
    Turn,
    Turns,
    _wanted,
)
from mlx_qwen3asr.diarize.worker import one_line, segment_spans, threshold_config

# The AHC threshold's range (centroid linkage on unit-length embeddings: distances up to 2), and how
# many more runs a speaker count may take (each is a full run: speakrs cannot cluster again alone).
_THRESHOLD_MAX = 2.0
_MAX_RETRIES = 2
# No speaker count asked for (the default options).
_ANY_COUNT = DiarizeOptions()
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


# A library error in one line, without its category tag.
_reason = one_line


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


class _Stop:
    """The cancel token of an isolated diarizer's call: cancel() sets it and kills the worker process."""

    def __init__(self, worker: Worker) -> None:
        self.event = threading.Event()
        self._worker = worker

    def cancel(self) -> None:
        self.event.set()
        self._worker.kill()


class Diarizer:
    """A loaded diarization pipeline. Call it on 16 kHz mono float32 samples for their turns.

    One call runs at a time (others wait); the library releases the GIL while it works, so other
    threads (transcription) go on. cancel() stops the call in progress (it raises DiarizeCancelled): at
    the library's next stage boundary (minutes apart on long audio on the CPU), or at once for an
    isolated diarizer, whose library runs are made by a worker process that cancel() kills (the next
    call starts another, which loads the models again). Ctrl-C in the calling thread stops the call too.
    progress() tells how far the call in progress is, estimate() what a call would cost, both from the
    speed of the runs timed so far. close() ends an isolated diarizer's process (so do garbage collection
    and the interpreter's exit); a later call starts another.
    """

    def __init__(
        self,
        pipeline: Any,
        speakrs: Any,
        source: str,
        *,
        mode: str = "CPU",
        model_dir: str | None = None,
        isolated: bool = False,
    ) -> None:
        self._pipeline = pipeline
        self._speakrs = speakrs
        self.source = source  # the model folder, or the hub repository and revision
        self.mode = mode  # speakrs's execution mode: "CPU", "CoreML", "CUDA"
        self._worker: Worker | None = None
        if isolated:
            if model_dir is None:
                raise ValueError("an isolated diarizer needs the folder of its model files (model_dir)")
            self._worker = Worker(mode, str(model_dir))
        self._lock = threading.Lock()
        self._token: Any = None
        self._token_lock = threading.Lock()
        # Timed runs: seconds and windows, the older ones weighing less.
        self._spent = 0.0
        self._worked = 0.0
        # The call in progress: (started, audio seconds, windows, attempt, attempts, run started).
        self._call: tuple[float, float, float, int, int, float] | None = None

    def __repr__(self) -> str:
        isolated = ", isolated=True" if self.isolated else ""
        return f"Diarizer({self.source!r}, mode={self.mode!r}{isolated})"

    @property
    def isolated(self) -> bool:
        """Whether the library runs in a worker process (which cancel() kills) rather than in this one."""
        return self._worker is not None

    @property
    def worker_pid(self) -> int | None:
        """The worker process's id while it runs (an isolated diarizer), else None."""
        return None if self._worker is None else self._worker.pid

    def cancel(self) -> None:
        """Stop the call in progress, if any (it raises DiarizeCancelled); later calls run as usual."""
        with self._token_lock:
            if self._token is not None:
                self._token.cancel()

    def close(self) -> None:
        """Stop the call in progress, if any, and end the worker process of an isolated diarizer."""
        self.cancel()
        if self._worker is not None:
            self._worker.close()

    def __enter__(self) -> Diarizer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
        return threshold_config(self._speakrs, self._pipeline, threshold)

    def _run(self, samples: np.ndarray, threshold: float | None, token: Any, attempt: int) -> list[tuple]:
        with self._token_lock:
            if self._call is not None:
                self._call = (*self._call[:3], attempt, self._call[4], time.monotonic())
        if self._worker is not None:
            spans, took = self._worker.run(samples, threshold, token.event)
            self._timed(took, samples)
            return spans
        began = time.perf_counter()
        try:
            result = self._pipeline.diarize_samples(
                samples, pipeline_config=self._config(threshold), cancel_token=token
            )
        except self._speakrs.SpeakrsError as e:
            if getattr(e, "category", None) == "cancelled":
                raise DiarizeCancelled("diarization was cancelled") from e
            raise DiarizerError(f"diarization failed: {_reason(e)}") from e
        self._timed(time.perf_counter() - began, samples)
        return segment_spans(result.segments, samples.size / SAMPLE_RATE)

    def _timed(self, took: float, samples: np.ndarray) -> None:
        with self._token_lock:
            self._spent = _SPEED_DECAY * self._spent + took
            self._worked = _SPEED_DECAY * self._worked + _windows(samples.size / SAMPLE_RATE)

    def __call__(
        self,
        samples: np.ndarray,
        options: DiarizeOptions = _ANY_COUNT,
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
            token = self._speakrs.CancelToken() if self._worker is None else _Stop(self._worker)
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
