"""Cutting long audio into model-sized pieces at quiet points.

Follows the official low-energy rule (`split_audio_into_chunks`): sum |x| over 100 ms sliding
windows around the target cut, pick the quietest window and cut at its quietest sample. Unlike the
official rule, which searches up to 5 s past the target and can exceed it, the search here ends at
the limit, so every segment is at most `max_seconds` long.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mlx_qwen3asr.audio.features import SAMPLE_RATE

# Official MIN_ASR_INPUT_SECONDS: shorter inputs are zero-padded to this length.
MIN_SEGMENT_SECONDS = 0.5


@dataclass(frozen=True)
class Span:
    """A half-open span [start, end) of sample indices into the original 16 kHz audio."""

    start: int
    end: int

    @property
    def num_samples(self) -> int:
        return self.end - self.start

    @property
    def start_seconds(self) -> float:
        return self.start / SAMPLE_RATE

    @property
    def end_seconds(self) -> float:
        return self.end / SAMPLE_RATE

    @property
    def duration(self) -> float:
        """Length in seconds."""
        return (self.end - self.start) / SAMPLE_RATE


def _check_positive(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")


def quietest_sample(region: np.ndarray, win: int) -> int:
    """Index in region of the quietest sample inside the lowest-energy window of win samples."""
    mag = np.abs(region, dtype=np.float64)
    csum = np.concatenate(([0.0], np.cumsum(mag)))
    # Sum over every full window: O(len) with a cumulative sum, instead of a convolution's O(len * win).
    energy = csum[win:] - csum[:-win]
    pos = int(np.argmin(energy))
    return pos + int(np.argmin(mag[pos : pos + win]))


def _read(audio, start: int, stop: int) -> np.ndarray:
    """Samples [start, stop) of an array, or of a decoded signal (audio.signal.Signal) read by range."""
    return audio.read(start, stop) if hasattr(audio, "read") else audio[start:stop]


def split_on_silence(
    audio,
    max_seconds: float = 30.0,
    search_seconds: float = 5.0,
    window_ms: float = 100.0,
    sample_rate: int = SAMPLE_RATE,
) -> list[Span]:
    """Split mono audio into contiguous segments of at most max_seconds, cutting at quiet points.

    Each cut is searched in [start + max - 2 * search, start + max], with search clipped to max / 3.
    The segments tile the audio exactly; audio no longer than max_seconds gives one segment.
    `audio` is a 1-D array, or a decoded signal that only the search windows are read from.
    """
    if not hasattr(audio, "read"):
        audio = np.asarray(audio)
        if audio.ndim != 1:
            raise ValueError(f"audio must be 1-D mono, got shape {audio.shape}")
    _check_positive("max_seconds", max_seconds)
    _check_positive("window_ms", window_ms)
    _check_positive("sample_rate", sample_rate)
    if isinstance(search_seconds, bool) or not math.isfinite(search_seconds) or search_seconds < 0:
        raise ValueError(f"search_seconds must be a finite number >= 0, got {search_seconds!r}")

    total = len(audio)
    max_len = int(max_seconds * sample_rate)
    if max_len < 1:
        raise ValueError(f"max_seconds={max_seconds} is shorter than one sample at {sample_rate} Hz")
    if total <= max_len:
        return [Span(0, total)]

    # Keeps the search window inside the current segment and every segment but the last >= max / 3.
    search_len = min(int(search_seconds * sample_rate), max_len // 3)
    win = max(4, int(window_ms / 1000.0 * sample_rate))

    segments: list[Span] = []
    start = 0
    while total - start > max_len:
        right = start + max_len
        left = right - 2 * search_len
        if right - left <= win:
            cut = right
        else:
            cut = left + quietest_sample(_read(audio, left, right), win)
        cut = max(cut, start + 1)
        segments.append(Span(start, cut))
        start = cut
    segments.append(Span(start, total))
    return segments


class _Range:
    """Samples [start, stop) of an array or a decoded signal, read by range like a signal."""

    def __init__(self, audio, start: int, stop: int) -> None:
        self.audio, self.start, self.stop = audio, start, stop

    def __len__(self) -> int:
        return self.stop - self.start

    def read(self, start: int, stop: int) -> np.ndarray:
        return _read(self.audio, self.start + start, self.start + stop)


# Audio kept around each speech region in the pieces the model hears: onsets and trailing sounds that
# the detector scores low are not cut off.
SPEECH_PAD_SECONDS = 0.2
# Speech regions this close share a piece: a pause, not a stretch of something else.
JOIN_GAP_SECONDS = 1.0


def split_speech(
    audio,
    regions: list[Span],
    max_seconds: float = 30.0,
    pad_seconds: float = SPEECH_PAD_SECONDS,
    join_seconds: float = JOIN_GAP_SECONDS,
    sample_rate: int = SAMPLE_RATE,
) -> list[Span]:
    """Pieces of at most max_seconds that cover the speech regions and little else.

    Each region is widened by pad_seconds; a region longer than max_seconds is cut at quiet points
    (split_on_silence); then neighbours closer than join_seconds are joined while the piece stays within
    max_seconds. Audio between pieces (noise, music, silence) is in none of them.
    """
    _check_positive("max_seconds", max_seconds)
    total = len(audio)
    max_len = int(max_seconds * sample_rate)
    pad, join = int(pad_seconds * sample_rate), int(join_seconds * sample_rate)
    widened: list[Span] = []
    for region in sorted(regions, key=lambda r: r.start):
        start, end = max(0, region.start - pad), min(total, region.end + pad)
        if end <= start:
            continue
        if widened and start <= widened[-1].end:
            widened[-1] = Span(widened[-1].start, max(end, widened[-1].end))
        else:
            widened.append(Span(start, end))
    parts: list[Span] = []
    for region in widened:
        if region.num_samples <= max_len:
            parts.append(region)
            continue
        inner = split_on_silence(
            _Range(audio, region.start, region.end), max_seconds, sample_rate=sample_rate
        )
        parts.extend(Span(region.start + s.start, region.start + s.end) for s in inner)
    pieces: list[Span] = []
    for part in parts:
        last = pieces[-1] if pieces else None
        if last is not None and part.start - last.end <= join and part.end - last.start <= max_len:
            pieces[-1] = Span(last.start, part.end)
        else:
            pieces.append(part)
    return pieces


def padded_length(seg: Span, min_seconds: float = MIN_SEGMENT_SECONDS, sample_rate: int = SAMPLE_RATE) -> int:
    """Samples segment_audio returns for seg."""
    return max(seg.num_samples, int(min_seconds * sample_rate))


def segment_audio(
    audio,
    seg: Span,
    min_seconds: float = MIN_SEGMENT_SECONDS,
    sample_rate: int = SAMPLE_RATE,
) -> np.ndarray:
    """Samples of seg (of an array or a decoded signal), zero-padded at the tail to min_seconds when
    shorter (official behaviour)."""
    if seg.start < 0 or seg.end < seg.start or seg.end > len(audio):
        raise ValueError(f"segment [{seg.start}, {seg.end}) outside audio of {len(audio)} samples")
    piece = _read(audio, seg.start, seg.end)
    min_len = int(min_seconds * sample_rate)
    if piece.shape[0] < min_len:
        piece = np.pad(piece, (0, min_len - piece.shape[0]))
    return piece
