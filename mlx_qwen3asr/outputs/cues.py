"""Readable subtitle cues from timed transcript segments.

A segment (up to ~30 s of audio, cut at a quiet point) carries one block of text. Without word timing
("estimated" segments) its text is split into cues of at most `max_lines` lines of `max_width` display
cells (fullwidth characters count two), preferring sentence ends, then clause punctuation, then word
boundaries; text without spaces (Chinese, Japanese, Thai) may break between characters. Cue times are
set in proportion to text length across the segment's speech, then each boundary between two cues of
a segment is moved to the quietest nearby point of the audio, so cues start and end in pauses.

Segments whose words were timed by the forced aligner ("aligned") are cut between words instead: a
cue starts when its first word is spoken and ends shortly after its last one, breaks at sentence and
clause punctuation and always at pauses, and is kept within limits of duration, reading speed and
gap to the next cue (see CueOptions). Such cues keep their words, so players can highlight them.

The text layout is outputs.wrapping, the cut between words outputs.word_cues; the cue types come from
outputs.cue_types and are exported here with build_cues.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from mlx_qwen3asr.audio.features import SAMPLE_RATE
from mlx_qwen3asr.diarize import split_at_speakers
from mlx_qwen3asr.outputs.cue_types import (
    ROUNDING_SLACK,
    Cue,
    CueOptions,
    CueWord,
    RawCue,
    TimedText,
    to_milliseconds,
)
from mlx_qwen3asr.outputs.word_cues import (
    is_aligned,
    layout_word_cue,
    split_tokens,
    word_cue_end,
    word_tokens,
)
from mlx_qwen3asr.outputs.wrapping import clean_text, split_units, text_units, unit_weights, wrap_units
from mlx_qwen3asr.pipeline.result import Segment

__all__ = [
    "Cue",
    "CueOptions",
    "CueWord",
    "FrameEnergy",
    "build_cues",
    "frame_energy_db",
    "snap_to_quiet",
]

# dB of frame energy that one second of distance from the proportional time is worth when snapping.
_SNAP_DB_PER_SECOND = 6.0
# Frame energy for snapping and speech bounds: 20 ms frames smoothed over 100 ms, so a stop
# consonant's short closure does not look like a pause.
_FRAME_SECONDS = 0.02
_SMOOTH_FRAMES = 5
_ENERGY_BLOCK_FRAMES = 8192
# A frame counts as speech when within this many dB of the segment's loudest frame (and above the
# floor); the cues of a segment span its speech plus a margin.
_SPEECH_RANGE_DB = 35.0
_SPEECH_FLOOR_DB = -60.0
_SPEECH_MARGIN_SECONDS = 0.2


# --- audio --------------------------------------------------------------------------------------


class FrameEnergy:
    """The frame energy of a signal (frame_energy_db), computed by range as it is asked for.

    `energy[a:b]` is frame_energy_db(audio)[a:b], to the bit, read from the audio of frames a to b
    (and the few beside them that the smoothing takes): building the cues of a few segments of hours of
    audio reads those segments' audio, not all of it. `len()` is the number of frames. The last range
    computed is kept, so the ranges asked for within one segment read its audio once.
    """

    def __init__(
        self,
        audio,
        sample_rate: int = SAMPLE_RATE,
        frame_seconds: float = _FRAME_SECONDS,
        smooth_frames: int = _SMOOTH_FRAMES,
    ) -> None:
        if hasattr(audio, "read"):
            self._read, self._total = audio.read, len(audio)
        else:
            x = np.asarray(audio).reshape(-1)
            self._read, self._total = (lambda a, b: x[a:b]), x.shape[0]
        self.hop = max(1, int(round(frame_seconds * sample_rate)))
        self.frames = -(-self._total // self.hop)
        self.smooth = smooth_frames
        self._kept: tuple[int, int, np.ndarray] = (0, 0, np.zeros(0))

    def __len__(self) -> int:
        return self.frames

    def __getitem__(self, frames: slice) -> np.ndarray:
        if not isinstance(frames, slice) or frames.step not in (None, 1):
            raise TypeError("frame energy is read by contiguous range")
        first, last, _ = frames.indices(self.frames)
        last = max(first, last)
        a, b, kept = self._kept
        if not (a <= first and last <= b):
            kept = self._window(first, last)
            self._kept = (first, last, kept)
            a = first
        return kept[first - a : last - a]

    def _power(self, first: int, last: int) -> np.ndarray:
        """Mean power of frames [first, last); the last frame of the audio may be partial."""
        hop, full = self.hop, self._total // self.hop
        power = np.empty(last - first)
        # Blocks keep the float64 temporaries small for hours of audio.
        for s in range(first, min(last, full), _ENERGY_BLOCK_FRAMES):
            count = min(_ENERGY_BLOCK_FRAMES, min(last, full) - s)
            block = self._read(s * hop, (s + count) * hop).reshape(count, hop).astype(np.float64)
            power[s - first : s - first + count] = np.mean(block * block, axis=1)
        if last > full:
            tail = self._read(full * hop, self._total).astype(np.float64)
            power[-1] = np.mean(tail * tail)
        return power

    def _window(self, first: int, last: int) -> np.ndarray:
        n, k = self.frames, self.smooth
        if last <= first:
            return np.zeros(0)
        if k <= 1 or n <= 1:
            return 10.0 * np.log10(self._power(first, last) + 1e-10)
        # The frames the smoothing takes beside the range; past the audio's ends, its end frames
        # repeated (as np.pad's "edge" mode pads the whole).
        lo, hi = first - k // 2, last + k - 1 - k // 2
        inside = self._power(max(lo, 0), min(hi, n))
        padded = np.pad(inside, (max(0, -lo), max(0, hi - n)), mode="edge")
        kernel = np.ones(k) / k
        power = np.convolve(padded, kernel, mode="valid")[: last - first]
        return 10.0 * np.log10(power + 1e-10)


def frame_energy_db(
    audio,
    sample_rate: int = SAMPLE_RATE,
    frame_seconds: float = _FRAME_SECONDS,
    smooth_frames: int = _SMOOTH_FRAMES,
) -> np.ndarray:
    """Mean power per frame in dB (full scale = 0 dB), smoothed over smooth_frames frames.

    Frame f covers samples [f * hop, (f + 1) * hop); the last, partial frame is included. `audio` is
    an array, or a decoded signal (audio.signal.Signal) read block by block. FrameEnergy gives ranges
    of it without computing the rest.
    """
    energy = FrameEnergy(audio, sample_rate, frame_seconds, smooth_frames)
    return energy._window(0, len(energy))


def snap_to_quiet(
    energy_db: np.ndarray | FrameEnergy, frame_seconds: float, target: float, lo: float, hi: float
) -> float:
    """The time in [lo, hi] with the quietest frame, favouring frames close to target."""
    if hi <= lo:
        return lo
    first = max(0, int(math.ceil(lo / frame_seconds - 0.5)))
    last = min(len(energy_db) - 1, int(math.floor(hi / frame_seconds - 0.5)))
    if last < first:
        return min(max(target, lo), hi)
    centers = (np.arange(first, last + 1) + 0.5) * frame_seconds
    cost = energy_db[first : last + 1] + _SNAP_DB_PER_SECOND * np.abs(centers - target)
    return float(centers[int(np.argmin(cost))])


def _speech_bounds(
    energy_db: np.ndarray | FrameEnergy, frame_seconds: float, start: float, end: float
) -> tuple[float, float]:
    """Start and end of the speech inside [start, end], with a margin; the whole span if none is found."""
    first = max(0, int(start / frame_seconds))
    last = min(len(energy_db), int(math.ceil(end / frame_seconds)))
    if last <= first:
        return start, end
    seg = energy_db[first:last]
    threshold = max(float(seg.max()) - _SPEECH_RANGE_DB, _SPEECH_FLOOR_DB)
    loud = np.flatnonzero(seg > threshold)
    if loud.size == 0:
        return start, end
    s = max(start, (first + loud[0]) * frame_seconds - _SPEECH_MARGIN_SECONDS)
    e = min(end, (first + loud[-1] + 1) * frame_seconds + _SPEECH_MARGIN_SECONDS)
    return (s, e) if e > s else (start, end)


# --- cues ---------------------------------------------------------------------------------------


def _segment_cues(
    text: str,
    start: float,
    end: float,
    options: CueOptions,
    energy_db: FrameEnergy | None,
    frame_seconds: float,
) -> list[tuple[float, float, str]]:
    units = text_units(clean_text(text), options.max_width)
    if not units:
        return []
    if energy_db is not None:
        start, end = _speech_bounds(energy_db, frame_seconds, start, end)
    duration = max(end - start, 0.0)
    weights = unit_weights(units)
    total = float(sum(weights))
    limit = max(options.max_duration - ROUNDING_SLACK, 1e-3)
    per_weight = duration / total if total else 0.0
    max_weight = limit / per_weight if per_weight > 0 else math.inf
    min_weight = options.min_duration / per_weight if per_weight > 0 else 0.0
    ranges = split_units(units, options.max_width, options.max_lines, max_weight, min_weight)

    cum = np.concatenate(([0.0], np.cumsum(weights)))
    shares = [(cum[j] - cum[i]) * per_weight for i, j in ranges]
    # Per-cue bounds that some placement always meets: a short cue takes time from its neighbours
    # up to min_duration (or an equal share), and only a cue that cannot be split may exceed the limit.
    dmin = [min(options.min_duration, duration / len(ranges))] * len(ranges)
    dmax = [max(limit, s) for s in shares]
    times = [start]
    for k in range(1, len(ranges)):
        target = start + cum[ranges[k][0]] * per_weight
        rest_min, rest_max = sum(dmin[k:]), sum(dmax[k:])
        lo = max(times[-1] + dmin[k - 1], end - rest_max)
        hi = min(times[-1] + dmax[k - 1], end - rest_min)
        lo, hi = min(lo, hi), max(lo, hi)
        t = min(max(target, lo), hi)
        if energy_db is not None and options.snap_radius > 0:
            w_lo, w_hi = max(lo, target - options.snap_radius), min(hi, target + options.snap_radius)
            if w_lo <= w_hi:
                t = snap_to_quiet(energy_db, frame_seconds, target, w_lo, w_hi)
        times.append(t)
    times.append(end)
    return [
        (times[k], times[k + 1], "\n".join(wrap_units(units[i:j], options.max_width)))
        for k, (i, j) in enumerate(ranges)
    ]


def _speaker_pieces(seg: TimedText) -> Sequence[TimedText]:
    """The segment cut where the speaker of its words changes (a Segment with aligned words of two or
    more speakers); other segments as they are."""
    if isinstance(seg, Segment) and is_aligned(seg) and len({w.speaker for w in seg.words}) > 1:
        return split_at_speakers(seg)
    return [seg]


def build_cues(
    segments: Sequence[TimedText],
    audio: np.ndarray | None = None,
    *,
    sample_rate: int = SAMPLE_RATE,
    options: CueOptions | None = None,
    duration: float | None = None,
    after: float = 0.0,
) -> list[Cue]:
    """Subtitle cues for transcript segments (objects with start, end and text).

    Segments with timing "aligned" and words (result.Word: text, start, end, char_start, char_end) are
    cut between their words and timed by them: each cue starts when its first word does and keeps its
    words (Cue.words). Other segments are split by text and timed in proportion: with the audio (mono
    samples at sample_rate), each segment's cues span its speech and the boundaries between them sit
    at quiet points. Cues are ordered, do not overlap, last at least 1 ms (min_duration, or
    word_min_duration, where the gap to the next cue allows) and are timed in whole milliseconds.
    No cue ends after `duration` seconds (default: the audio's length, when it is given).
    With speaker diarization (segments with a `speaker`), each cue carries its segment's speaker and no
    cue spans two: a segment whose words have different speakers is cut where the speaker changes.
    after: no cue starts before this time (seconds), the end of cues shown before these segments'.
    """
    options = options or CueOptions()
    # The audio may be an array or a decoded signal read by range (long files are not held whole).
    # Its energy is computed by range, for the segments that need it (those without timed words).
    energy = FrameEnergy(audio, sample_rate) if audio is not None and len(audio) else None
    if duration is None and audio is not None:
        duration = len(audio) / sample_rate
    end_ms = None if duration is None else max(1, math.ceil(duration * 1000 - 1e-6))
    end_s = math.inf if end_ms is None else end_ms / 1000
    # The frame length frame_energy_db really used, after rounding to whole samples.
    frame_seconds = max(1, int(round(_FRAME_SECONDS * sample_rate))) / sample_rate
    # A segment whose words have different speakers is cut where the speaker changes: no cue spans two.
    pieces = [piece for seg in segments for piece in _speaker_pieces(seg)]
    ordered = [seg for seg in sorted(pieces, key=lambda s: s.start) if seg.text and seg.text.strip()]
    raw: list[RawCue] = []
    for k, seg in enumerate(ordered):
        tokens = word_tokens(seg.text, seg.words, options, end_ms) if is_aligned(seg) else None
        speaker = getattr(seg, "speaker", None)
        if tokens:
            # The last cue may read on until the next segment (or the end of the audio).
            room = math.inf if end_ms is None else end_ms
            if k + 1 < len(ordered):
                room = min(room, to_milliseconds(ordered[k + 1].start) - round(options.min_gap * 1000))
            room = max(room, tokens[-1].end)
            for i, j in split_tokens(tokens, options, room):
                cue = layout_word_cue(tokens[i:j], options)
                cue.speaker = speaker
                raw.append(cue)
        else:
            start, stop = min(seg.start, end_s), min(seg.end, end_s)
            raw.extend(
                RawCue(*cue, speaker=speaker)
                for cue in _segment_cues(seg.text, start, stop, options, energy, frame_seconds)
            )

    # Short cues borrow time from the gap after them (the last one up to the end of the audio).
    for k, cue in enumerate(raw):
        if cue.words is None and cue.end - cue.start < options.min_duration:
            room = raw[k + 1].start if k + 1 < len(raw) else end_s
            cue.end = max(cue.end, min(cue.start + options.min_duration, room))
    # Word cues end after their last word, within the room before the next cue.
    for k, cue in enumerate(raw):
        if cue.words is not None:
            next_start = to_milliseconds(raw[k + 1].start) if k + 1 < len(raw) else None
            cue.end = word_cue_end(cue, next_start, end_ms, options)

    if end_ms is not None:
        # Every cue needs a millisecond of its own before the end: where the audio has fewer than the
        # cues (a clip of a few milliseconds), the last ones are joined.
        while len(raw) > end_ms:
            a, b = raw[-2], raw.pop()
            words = None
            if a.words is not None and b.words is not None:
                shift = len(a.text) + 1
                words = a.words + [(t, s, e, cs + shift, ce + shift) for t, s, e, cs, ce in b.words]
            raw[-1] = RawCue(a.start, b.end, f"{a.text}\n{b.text}", words, speaker=a.speaker)
    cues: list[Cue] = []
    prev_end = to_milliseconds(after)
    n = len(raw)
    for k, cue in enumerate(raw):
        start_ms = max(to_milliseconds(cue.start), prev_end)
        stop_ms = max(to_milliseconds(cue.end), start_ms + 1)
        if end_ms is not None:
            # Leave a millisecond for each cue still to come.
            start_ms = min(start_ms, end_ms - (n - k))
            stop_ms = min(stop_ms, end_ms - (n - 1 - k))
        words: tuple[CueWord, ...] = ()
        if cue.words is not None:
            timed = []
            for text, s, e, cs, ce in cue.words:
                s = min(max(s, start_ms), stop_ms)
                timed.append(CueWord(text, s / 1000, min(max(e, s), stop_ms) / 1000, cs, ce))
            words = tuple(timed)
        cues.append(Cue(start_ms / 1000, stop_ms / 1000, cue.text, words, cue.speaker))
        prev_end = stop_ms
    return cues
