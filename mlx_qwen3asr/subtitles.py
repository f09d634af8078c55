"""Readable subtitle cues from timed transcript segments.

A segment (up to ~30 s of audio, cut at a quiet point) carries one block of text and no word timing.
Its text is split into cues of at most `max_lines` lines of `max_width` display cells (fullwidth
characters count two), preferring sentence ends, then clause punctuation, then word boundaries;
text without spaces (Chinese, Japanese, Thai) may break between characters. Cue times are set in
proportion to text length across the segment's speech, then each boundary between two cues of a
segment is moved to the quietest nearby point of the audio, so cues start and end in pauses.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Protocol

import numpy as np

from .audio import SAMPLE_RATE

__all__ = [
    "Cue",
    "CueOptions",
    "build_cues",
    "char_width",
    "clean_text",
    "format_timestamp",
    "frame_energy_db",
    "snap_to_quiet",
    "split_text",
    "text_width",
    "to_milliseconds",
    "wrap_lines",
]

# Break quality after a unit: higher is a better place to end a cue or a line.
_SENTENCE, _CLAUSE, _WORD, _INSIDE = 3, 2, 1, 0
_SENTENCE_END = frozenset(".!?…‼⁇⁈⁉。！？｡؟।॥")
_CLAUSE_END = frozenset(",;:—–，、；：､،؛")
# Closing quotes and brackets may follow the punctuation that ends a sentence or clause.
_CLOSERS = frozenset("\"'”’»)]}」』）】〕〉》〗〙〛｣")
# Characters that must not start a line (closing punctuation, small kana, prolonged sound mark).
_NO_LINE_START = (
    _CLOSERS
    | _SENTENCE_END
    | _CLAUSE_END
    | frozenset(
        "ー々ゝゞヽヾぁぃぅぇぉっゃゅょゎゕゖァィゥェォッャュョヮヵヶㇰㇱㇲㇳㇴㇵㇶㇷㇸㇹㇺㇻㇼㇽㇾㇿ・％%"
    )
)
# Characters that must not end a line (opening quotes and brackets).
_NO_LINE_END = frozenset("“‘«([{「『（【〔〈《〖〘〚｢")
# Cue penalties in the text split: a chunk, a weak break, and slack against the cue's capacity.
_BREAK_COST = {_SENTENCE: 0.0, _CLAUSE: 0.35, _WORD: 0.8, _INSIDE: 2.5}
_SHORT_CUE_COST = 3.0
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
# Keeps cue lengths strictly under max_duration after rounding to milliseconds.
_ROUNDING_SLACK = 0.002
_ARROW = re.compile(r"-{2,}>")


@dataclass(frozen=True)
class CueOptions:
    """Readability limits for subtitle cues."""

    max_width: int = 42  # display cells per line
    max_lines: int = 2
    max_duration: float = 7.0  # seconds on screen, where the text can be split
    min_duration: float = 0.5  # seconds, where the audio allows
    snap_radius: float = 1.0  # seconds a boundary may move towards a quiet point

    def __post_init__(self) -> None:
        if self.max_width < 1 or self.max_lines < 1:
            raise ValueError("max_width and max_lines must be at least 1")
        if not (self.max_duration > 0 and self.min_duration >= 0 and self.snap_radius >= 0):
            raise ValueError("max_duration must be positive; min_duration and snap_radius non-negative")
        if self.min_duration > self.max_duration:
            raise ValueError("min_duration must not exceed max_duration")


@dataclass(frozen=True)
class Cue:
    start: float  # seconds, a whole number of milliseconds
    end: float
    text: str  # lines separated by "\n"

    @property
    def lines(self) -> list[str]:
        return self.text.split("\n")

    def to_dict(self) -> dict[str, object]:
        return {"start": self.start, "end": self.end, "text": self.text}


class TimedText(Protocol):
    start: float
    end: float
    text: str


def char_width(ch: str) -> int:
    """Display cells of one character: 2 for wide and fullwidth, 0 for combining marks."""
    if unicodedata.combining(ch) or unicodedata.category(ch) in ("Mn", "Me", "Cf"):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def text_width(text: str) -> int:
    """Display cells of a string, counting wide and fullwidth characters (CJK) as two."""
    return sum(char_width(ch) for ch in text)


def clean_text(text: str) -> str:
    """One line of text safe for subtitle files: no control characters, line breaks or arrows."""
    text = "".join(" " if unicodedata.category(ch) in ("Cc", "Zl", "Zp") else ch for ch in text)
    # "-->" separates cue times in SRT and WebVTT; inside cue text it would break parsers.
    text = _ARROW.sub("->", text)
    return " ".join(text.split())


def to_milliseconds(seconds: float) -> int:
    """Whole milliseconds, rounding half up as the number reads in decimal (59.9996 -> 60000)."""
    if not math.isfinite(seconds):
        raise ValueError(f"time must be finite, got {seconds!r}")
    ms = (Decimal(repr(float(seconds))) * 1000).quantize(Decimal(1), rounding=ROUND_HALF_UP)
    return max(0, int(ms))


def format_timestamp(seconds: float, decimal_marker: str = ",") -> str:
    """HH:MM:SS,mmm (SRT); pass decimal_marker="." for WebVTT. Hours grow past two digits."""
    ms = to_milliseconds(seconds)
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal_marker}{ms:03d}"


# --- text units -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Unit:
    text: str
    space: bool  # a space separates it from the unit before
    width: int
    after: int  # break quality after this unit


def _unspaced(ch: str) -> bool:
    """Scripts written without spaces between words, where a line may break between characters."""
    cp = ord(ch)
    if 0xAC00 <= cp <= 0xD7AF or 0x1100 <= cp <= 0x11FF or 0x3130 <= cp <= 0x318F:
        return False  # Hangul: Korean puts spaces between words
    if 0x0E00 <= cp <= 0x0EFF or 0x1000 <= cp <= 0x109F or 0x1780 <= cp <= 0x17FF:
        return True  # Thai, Lao, Myanmar, Khmer
    return unicodedata.east_asian_width(ch) in ("W", "F")


def _quality(piece: str) -> int:
    core = piece.rstrip("".join(_CLOSERS))
    if not core:
        return _WORD
    if core[-1] in _SENTENCE_END:
        return _SENTENCE
    if core[-1] in _CLAUSE_END:
        return _CLAUSE
    return _WORD


def _clusters(word: str) -> list[str]:
    """A word cut where a line may break: between characters of unspaced scripts, not elsewhere."""
    out: list[str] = []
    for ch in word:
        glued = char_width(ch) == 0 or ch in _NO_LINE_START
        if out and (glued or not (_unspaced(ch) or _unspaced(out[-1][-1]))):
            out[-1] += ch
        else:
            out.append(ch)
    # An opening bracket stays with what it opens.
    merged: list[str] = []
    for piece in out:
        if merged and merged[-1][-1] in _NO_LINE_END:
            merged[-1] += piece
        else:
            merged.append(piece)
    return merged


def _hard_break(piece: str, max_width: int) -> list[str]:
    """Cut a piece wider than a line into line-sized parts, keeping combining marks attached."""
    parts: list[str] = []
    current, width = "", 0
    for ch in piece:
        w = char_width(ch)
        if current and w and width + w > max_width:
            parts.append(current)
            current, width = "", 0
        current += ch
        width += w
    if current:
        parts.append(current)
    return parts


def _units(text: str, max_width: int) -> list[_Unit]:
    units: list[_Unit] = []
    for word in text.split():
        for i, cluster in enumerate(_clusters(word)):
            parts = _hard_break(cluster, max_width)
            for j, part in enumerate(parts):
                after = _quality(part) if j == len(parts) - 1 else _INSIDE
                units.append(
                    _Unit(part, space=bool(units) and i == 0 and j == 0, width=text_width(part), after=after)
                )
    return units


def _weight(unit: _Unit) -> int:
    # Proportional timing: every unit takes some time even if it has no visible width.
    return max(1, unit.width) + (1 if unit.space else 0)


def _line_count(units: Sequence[_Unit], max_width: int) -> int:
    """Lines that greedy filling needs; greedy filling needs the fewest lines possible."""
    lines, width = 0, 0
    for unit in units:
        add = unit.width + (1 if unit.space else 0)
        if lines and width + add <= max_width:
            width += add
        else:
            lines += 1
            width = unit.width
    return lines


def _join(units: Sequence[_Unit]) -> str:
    return "".join((" " if u.space and k else "") + u.text for k, u in enumerate(units))


def _wrap_units(units: Sequence[_Unit], max_width: int) -> list[str]:
    """Lines of the fewest count, balanced in width, preferring breaks after punctuation."""
    n = len(units)
    if n == 0:
        return []
    count = _line_count(units, max_width)
    if count == 1:
        return [_join(units)]
    widths = [[0] * (n + 1) for _ in range(n)]
    for i in range(n):
        w = 0
        for j in range(i, n):
            w += units[j].width + (1 if units[j].space and j > i else 0)
            widths[i][j + 1] = w
    inf = float("inf")
    penalty_unit = 0.04 * max_width * max_width
    # cost[k][j]: best cost of the first j units in k lines.
    cost = [[inf] * (n + 1) for _ in range(count + 1)]
    back = [[0] * (n + 1) for _ in range(count + 1)]
    cost[0][0] = 0.0
    for k in range(1, count + 1):
        for j in range(1, n + 1):
            for i in range(j - 1, -1, -1):
                w = widths[i][j]
                if w > max_width and j - i > 1:
                    break
                if cost[k - 1][i] == inf:
                    continue
                brk = 0.0 if j == n else (3 - units[j - 1].after) * penalty_unit
                c = cost[k - 1][i] + w * w + brk
                if c < cost[k][j]:
                    cost[k][j], back[k][j] = c, i
    lines: list[str] = []
    j = n
    for k in range(count, 0, -1):
        i = back[k][j]
        lines.append(_join(units[i:j]))
        j = i
    return lines[::-1]


def wrap_lines(text: str, max_width: int = 42) -> list[str]:
    """Wrap one cue's text into the fewest lines of at most max_width cells, balanced."""
    return _wrap_units(_units(clean_text(text), max_width), max_width)


def _weights(units: Sequence[_Unit]) -> list[int]:
    weights = [_weight(u) for u in units]
    if weights and units[0].space:
        weights[0] -= 1
    return weights


def _split_units(
    units: Sequence[_Unit],
    max_width: int,
    max_lines: int,
    max_weight: float = math.inf,
    min_weight: float = 0.0,
) -> list[tuple[int, int]]:
    """Unit ranges of the cues: each fits in max_lines lines and, unless it is one unit, weighs at most
    max_weight (its share of time). Cost: one per cue, weak breaks, slack and cues under min_weight."""
    n = len(units)
    weights = _weights(units)
    capacity = min(max_width * max_lines, max_weight)
    best = [math.inf] * (n + 1)
    back = [0] * (n + 1)
    best[0] = 0.0
    for i in range(n):
        if best[i] == math.inf:
            continue
        lines, width, weight = 0, 0, 0
        for j in range(i, n):
            unit = units[j]
            add = unit.width + (1 if unit.space else 0)
            if lines and j > i and width + add <= max_width:
                width += add
            else:
                lines += 1
                width = unit.width
            weight += weights[j]
            if j > i and (lines > max_lines or weight > max_weight):
                break
            brk = 0.0 if j + 1 == n else _BREAK_COST[unit.after]
            slack = max(0.0, capacity - weight) / capacity if capacity > 0 else 0.0
            short = _SHORT_CUE_COST * (1 - weight / min_weight) if weight < min_weight else 0.0
            c = best[i] + 1.0 + brk + slack * slack + short
            if c < best[j + 1]:
                best[j + 1], back[j + 1] = c, i
    ranges: list[tuple[int, int]] = []
    j = n
    while j > 0:
        ranges.append((back[j], j))
        j = back[j]
    return ranges[::-1]


def split_text(text: str, max_width: int = 42, max_lines: int = 2) -> list[str]:
    """Cue texts (lines joined by "\\n") for one block of text, each fitting max_lines x max_width."""
    units = _units(clean_text(text), max_width)
    return [
        "\n".join(_wrap_units(units[i:j], max_width)) for i, j in _split_units(units, max_width, max_lines)
    ]


# --- audio --------------------------------------------------------------------------------------


def frame_energy_db(
    audio,
    sample_rate: int = SAMPLE_RATE,
    frame_seconds: float = _FRAME_SECONDS,
    smooth_frames: int = _SMOOTH_FRAMES,
) -> np.ndarray:
    """Mean power per frame in dB (full scale = 0 dB), smoothed over smooth_frames frames.

    Frame f covers samples [f * hop, (f + 1) * hop); the last, partial frame is included. `audio` is
    an array, or a decoded signal (decode.Signal) read block by block.
    """
    if hasattr(audio, "read"):
        read, total = audio.read, len(audio)
    else:
        x = np.asarray(audio).reshape(-1)
        read, total = (lambda a, b: x[a:b]), x.shape[0]
    hop = max(1, int(round(frame_seconds * sample_rate)))
    n = -(-total // hop)
    if n == 0:
        return np.zeros(0)
    full = total // hop
    power = np.empty(n)
    # Blocks keep the float64 temporaries small for hours of audio.
    for s in range(0, full, _ENERGY_BLOCK_FRAMES):
        count = min(_ENERGY_BLOCK_FRAMES, full - s)
        block = read(s * hop, (s + count) * hop).reshape(count, hop).astype(np.float64)
        power[s : s + count] = np.mean(block * block, axis=1)
    if n > full:
        tail = read(full * hop, total).astype(np.float64)
        power[-1] = np.mean(tail * tail)
    if smooth_frames > 1 and n > 1:
        kernel = np.ones(smooth_frames) / smooth_frames
        power = np.convolve(np.pad(power, smooth_frames // 2, mode="edge"), kernel, mode="valid")[:n]
    return 10.0 * np.log10(power + 1e-10)


def snap_to_quiet(energy_db: np.ndarray, frame_seconds: float, target: float, lo: float, hi: float) -> float:
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
    energy_db: np.ndarray, frame_seconds: float, start: float, end: float
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
    energy_db: np.ndarray | None,
    frame_seconds: float,
) -> list[tuple[float, float, str]]:
    units = _units(clean_text(text), options.max_width)
    if not units:
        return []
    if energy_db is not None:
        start, end = _speech_bounds(energy_db, frame_seconds, start, end)
    duration = max(end - start, 0.0)
    weights = _weights(units)
    total = float(sum(weights))
    limit = max(options.max_duration - _ROUNDING_SLACK, 1e-3)
    per_weight = duration / total if total else 0.0
    max_weight = limit / per_weight if per_weight > 0 else math.inf
    min_weight = options.min_duration / per_weight if per_weight > 0 else 0.0
    ranges = _split_units(units, options.max_width, options.max_lines, max_weight, min_weight)

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
        (times[k], times[k + 1], "\n".join(_wrap_units(units[i:j], options.max_width)))
        for k, (i, j) in enumerate(ranges)
    ]


def build_cues(
    segments: Sequence[TimedText],
    audio: np.ndarray | None = None,
    *,
    sample_rate: int = SAMPLE_RATE,
    options: CueOptions | None = None,
    duration: float | None = None,
) -> list[Cue]:
    """Subtitle cues for transcript segments (objects with start, end and text).

    With the audio (mono samples at sample_rate), each segment's cues span its speech and the
    boundaries between them sit at quiet points. Cues are ordered, do not overlap, last at least
    1 ms (min_duration where the gap to the next cue allows) and are timed in whole milliseconds.
    No cue ends after `duration` seconds (default: the audio's length, when it is given).
    """
    options = options or CueOptions()
    # The audio may be an array or a decoded signal read by range (long files are not held whole).
    energy = frame_energy_db(audio, sample_rate) if audio is not None and len(audio) else None
    if duration is None and audio is not None:
        duration = len(audio) / sample_rate
    end_ms = None if duration is None else max(1, math.ceil(duration * 1000 - 1e-6))
    end_s = math.inf if end_ms is None else end_ms / 1000
    # The frame length frame_energy_db really used, after rounding to whole samples.
    frame_seconds = max(1, int(round(_FRAME_SECONDS * sample_rate))) / sample_rate
    raw: list[tuple[float, float, str]] = []
    for seg in sorted(segments, key=lambda s: s.start):
        if seg.text and seg.text.strip():
            start, stop = min(seg.start, end_s), min(seg.end, end_s)
            raw.extend(_segment_cues(seg.text, start, stop, options, energy, frame_seconds))

    # Short cues borrow time from the gap after them (the last one up to the end of the audio).
    for k, (s, e, text) in enumerate(raw):
        if e - s < options.min_duration:
            room = raw[k + 1][0] if k + 1 < len(raw) else end_s
            raw[k] = (s, max(e, min(s + options.min_duration, room)), text)

    if end_ms is not None:
        # Every cue needs a millisecond of its own before the end: where the audio has fewer than the
        # cues (a clip of a few milliseconds), the last ones are joined.
        while len(raw) > end_ms:
            (s, _, a), (_, e, b) = raw[-2], raw.pop()
            raw[-1] = (s, e, f"{a}\n{b}")
    cues: list[Cue] = []
    prev_end = 0
    n = len(raw)
    for k, (s, e, text) in enumerate(raw):
        start_ms = max(to_milliseconds(s), prev_end)
        stop_ms = max(to_milliseconds(e), start_ms + 1)
        if end_ms is not None:
            # Leave a millisecond for each cue still to come.
            start_ms = min(start_ms, end_ms - (n - k))
            stop_ms = min(stop_ms, end_ms - (n - 1 - k))
        cues.append(Cue(start_ms / 1000, stop_ms / 1000, text))
        prev_end = stop_ms
    return cues
