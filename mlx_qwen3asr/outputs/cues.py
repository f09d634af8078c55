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

from mlx_qwen3asr.audio.features import SAMPLE_RATE

__all__ = [
    "Cue",
    "CueOptions",
    "CueWord",
    "build_cues",
    "char_width",
    "clean_text",
    "format_timestamp",
    "frame_energy_db",
    "reading_length",
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
    """Readability limits for subtitle cues.

    The first five apply to every cue; the rest only to cues cut from aligned words (segments with
    timing "aligned"), whose cues are timed by their words rather than spread over the segment.
    """

    max_width: int = 42  # display cells per line
    max_lines: int = 2
    max_duration: float = 7.0  # seconds on screen, where the text can be split
    min_duration: float = 0.5  # seconds, where the audio allows (estimated segments)
    snap_radius: float = 1.0  # seconds a boundary may move towards a quiet point (estimated segments)
    # Word cues:
    pause: float = 0.6  # seconds of silence between two words that always end a cue
    word_min_duration: float = 0.8  # seconds on screen, where the gap to the next cue allows
    min_gap: float = 0.08  # seconds between a cue's end and the next cue's start
    max_cps: float = 20.0  # reading speed: display cells per second (a CJK character counts two)
    tail: float = 0.3  # seconds a cue stays after its last word ends, where there is room
    max_words_per_line: int | None = None  # None: no limit

    def __post_init__(self) -> None:
        if self.max_width < 1 or self.max_lines < 1:
            raise ValueError("max_width and max_lines must be at least 1")
        if not (self.max_duration > 0 and self.min_duration >= 0 and self.snap_radius >= 0):
            raise ValueError("max_duration must be positive; min_duration and snap_radius non-negative")
        if self.min_duration > self.max_duration:
            raise ValueError("min_duration must not exceed max_duration")
        for name in ("pause", "word_min_duration", "min_gap", "tail"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number of seconds, at least 0, got {value!r}")
        if self.pause <= 0:
            raise ValueError("pause must be positive")
        if not (isinstance(self.max_cps, (int, float)) and self.max_cps > 0):  # inf: no limit
            raise ValueError(f"max_cps must be positive, got {self.max_cps!r}")
        words = self.max_words_per_line
        if words is not None and (isinstance(words, bool) or not isinstance(words, int) or words < 1):
            raise ValueError(
                f"max_words_per_line must be None or a whole number of at least 1, got {words!r}"
            )


@dataclass(frozen=True)
class CueWord:
    """A word as a cue shows it: its text, its time, and its span [char_start, char_end) in the cue's text.

    The text is cue.text[char_start:char_end]: the word with the punctuation written next to it, and a
    line break where a word longer than a line was cut.
    """

    text: str
    start: float  # seconds, whole milliseconds, within the cue's interval
    end: float
    char_start: int
    char_end: int


@dataclass(frozen=True)
class Cue:
    start: float  # seconds, a whole number of milliseconds
    end: float
    text: str  # lines separated by "\n"
    words: tuple[CueWord, ...] = ()  # in order; empty for cues of estimated segments

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


def reading_length(text: str) -> int:
    """What a reader takes in, for reading speed: display cells, a line break counting as a space.

    A CJK character counts two, as in line widths, so max_cps=20 reads as 10 Chinese characters/s.
    """
    return text_width(text.replace("\n", " "))


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


def _line_count(
    units: Sequence[_Unit],
    max_width: int,
    word_ids: Sequence[int] | None = None,
    max_words: int | None = None,
) -> int:
    """Lines that greedy filling needs; greedy filling needs the fewest lines possible.

    With word_ids (one per unit, consecutive units of a word sharing one), a line holds at most
    max_words words.
    """
    lines, width, words = 0, 0, 0
    for k, unit in enumerate(units):
        add = unit.width + (1 if unit.space else 0)
        new_word = word_ids is not None and (k == 0 or word_ids[k] != word_ids[k - 1])
        if (
            lines
            and width + add <= max_width
            and not (new_word and max_words is not None and words >= max_words)
        ):
            width += add
            words += new_word
        else:
            lines += 1
            width = unit.width
            words = 1
    return lines


def _join(units: Sequence[_Unit]) -> str:
    return "".join((" " if u.space and k else "") + u.text for k, u in enumerate(units))


def _wrap_ranges(
    units: Sequence[_Unit],
    max_width: int,
    word_ids: Sequence[int] | None = None,
    max_words: int | None = None,
) -> list[tuple[int, int]]:
    """Unit ranges of the lines: the fewest lines, balanced in width, preferring breaks after
    punctuation; with word_ids (consecutive numbers), at most max_words words a line."""
    n = len(units)
    if n == 0:
        return []
    count = _line_count(units, max_width, word_ids, max_words)
    if count == 1:
        return [(0, n)]
    word_limit = word_ids is not None and max_words is not None
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
                if word_limit and word_ids[j - 1] - word_ids[i] >= max_words and j - i > 1:
                    break
                if cost[k - 1][i] == inf:
                    continue
                brk = 0.0 if j == n else (3 - units[j - 1].after) * penalty_unit
                c = cost[k - 1][i] + w * w + brk
                if c < cost[k][j]:
                    cost[k][j], back[k][j] = c, i
    ranges: list[tuple[int, int]] = []
    j = n
    for k in range(count, 0, -1):
        i = back[k][j]
        ranges.append((i, j))
        j = i
    return ranges[::-1]


def _wrap_units(units: Sequence[_Unit], max_width: int) -> list[str]:
    """Lines of the fewest count, balanced in width, preferring breaks after punctuation."""
    return [_join(units[i:j]) for i, j in _wrap_ranges(units, max_width)]


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
    return _backtrack(back, n)


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


# --- word cues ------------------------------------------------------------------------------------

# Cue-split penalties for cues cut from aligned words, beside those of the text split: reading faster
# than max_cps (per unit of relative excess), and how much of a break's cost a pause takes away.
_CPS_COST = 2.0
_PAUSE_BREAK_BONUS = 0.5
# A cue whose last word runs into the next cue stays at least this long after that word starts.
_MIN_WORD_VISIBLE = 0.1


@dataclass
class _Token:
    """One aligned word as cues show it, with the text around it that goes with it."""

    text: str  # cleaned
    space: bool  # a space separates it from the word before
    start: int  # milliseconds
    end: int
    parts: list[_Unit]  # line-sized pieces (one, unless the word is wider than a line)


@dataclass
class _Raw:
    """A cue before its final timing. Word cues carry their words and times in milliseconds."""

    start: float
    end: float
    text: str
    words: list[tuple[str, int, int, int, int]] | None = None  # (text, start, end, char_start, char_end)
    last_start: int = 0  # milliseconds: when the cue's last word starts
    natural_end: int = 0  # milliseconds: when the cue's last word ends


def _is_space(ch: str) -> bool:
    return ch.isspace() or unicodedata.category(ch) in ("Cc", "Zl", "Zp")


def _aligned(seg: object) -> bool:
    return getattr(seg, "timing", "estimated") == "aligned" and bool(getattr(seg, "words", None))


def _word_spans(text: str, words: Sequence[object]) -> list[tuple[int, int, float, float]] | None:
    """Each word's span in text and its time, in order; a word without a usable span is looked up by its
    text. None when a word cannot be found or has no finite time."""
    spans: list[tuple[int, int, float, float]] = []
    pos = 0
    for word in words:
        cs, ce = getattr(word, "char_start", 0), getattr(word, "char_end", 0)
        if not (isinstance(cs, int) and isinstance(ce, int) and pos <= cs < ce <= len(text)):
            needle = (getattr(word, "text", "") or "").strip()
            if not needle:
                continue
            found = text.find(needle, pos)
            if found < 0:
                return None
            cs, ce = found, found + len(needle)
        try:
            start, end = float(word.start), float(word.end)
        except (TypeError, ValueError):
            return None
        if not (math.isfinite(start) and math.isfinite(end)):
            return None
        spans.append((cs, ce, start, end))
        pos = ce
    return spans or None


def _word_parts(text: str, space: bool, max_width: int) -> list[_Unit]:
    """A word as one unit, or as line-sized pieces when it is wider than a line (cut as in estimated cues)."""
    width = text_width(text)
    if width <= max_width:
        return [_Unit(text, space, width, _quality(text))]
    parts = _units(text, max_width)
    return [_Unit(parts[0].text, space, parts[0].width, parts[0].after), *parts[1:]]


def _chunk_parts(parts: list[_Unit], max_width: int, max_lines: int) -> list[list[_Unit]]:
    """Pieces of one word grouped so that each group fits in one cue's max_lines lines."""
    chunks: list[list[_Unit]] = [[]]
    for part in parts:
        if chunks[-1] and _line_count([*chunks[-1], part], max_width) > max_lines:
            chunks.append([])
        chunks[-1].append(part)
    return chunks


def _tokens(
    text: str, words: Sequence[object], options: CueOptions, end_ms: int | None
) -> list[_Token] | None:
    """The segment's text cut at its words: each word takes the text up to the next word, except spaces
    and opening brackets or quotes just before that word, which go with it. None if the words cannot be
    placed in the text."""
    spans = _word_spans(text, words)
    if spans is None:
        return None
    cuts = [0]
    for (_, prev_end, _, _), (next_start, _, _, _) in zip(spans, spans[1:]):
        k = next_start
        while k > prev_end and (_is_space(text[k - 1]) or text[k - 1] in _NO_LINE_END):
            k -= 1
        cuts.append(k)
    cuts.append(len(text))
    limit = math.inf if end_ms is None else end_ms
    tokens: list[_Token] = []
    last_start = 0
    for k, (_, _, start, end) in enumerate(spans):
        shown = clean_text(text[cuts[k] : cuts[k + 1]])
        if not shown:
            continue
        cut = cuts[k]
        space = 0 < cut < len(text) and (_is_space(text[cut - 1]) or _is_space(text[cut]))
        start_ms = int(min(max(to_milliseconds(start), last_start), limit))
        end_ms_ = int(min(max(to_milliseconds(end), start_ms), limit))
        last_start = start_ms
        if tokens and not space:
            prev = tokens[-1]
            if shown[0] in _NO_LINE_START:
                # Closing punctuation the aligner gave a word of its own stays with the word before.
                merged = prev.text + shown
                tokens[-1] = _Token(merged, prev.space, prev.start, max(prev.end, end_ms_), [])
                continue
            if _ARROW.search(prev.text[-2:] + shown[:2]):
                space = True  # never "-->" across two words: it separates times in SRT and WebVTT
        tokens.append(_Token(shown, space, start_ms, end_ms_, []))
    # Line pieces; a word too long for one cue becomes several, its time shared by their widths.
    out: list[_Token] = []
    for tok in tokens:
        parts = _word_parts(tok.text, tok.space, options.max_width)
        chunks = _chunk_parts(parts, options.max_width, options.max_lines)
        if len(chunks) == 1:
            out.append(_Token(tok.text, tok.space, tok.start, tok.end, parts))
            continue
        weights = [sum(_weight(p) for p in chunk) for chunk in chunks]
        total, done = sum(weights), 0
        for chunk, weight in zip(chunks, weights):
            a = tok.start + round((tok.end - tok.start) * done / total)
            done += weight
            b = tok.start + round((tok.end - tok.start) * done / total)
            out.append(_Token(_join(chunk), chunk[0].space, a, b, chunk))
    return out


def _split_tokens(tokens: Sequence[_Token], options: CueOptions, room_end: float) -> list[tuple[int, int]]:
    """Token ranges of the cues of one segment.

    Every cue fits max_lines lines of max_width cells (and max_words_per_line), never spans a pause
    and, unless it is a single word, lasts at most max_duration. Cost: one per cue, weak breaks (a
    silence before the next word makes a break cheaper), slack against the cue's capacity, cues shorter
    than word_min_duration and reading faster than max_cps with the time the cue can have, up to the
    next word's start less min_gap (room_end for the last cue).
    """
    n = len(tokens)
    limit = _limit_ms(options)
    pause = max(1, round(options.pause * 1000))
    gap = round(options.min_gap * 1000)
    shortest = min(round(options.word_min_duration * 1000), limit)
    capacity = options.max_width * options.max_lines
    max_words = options.max_words_per_line
    best = [math.inf] * (n + 1)
    back = [0] * (n + 1)
    best[0] = 0.0
    for i in range(n):
        if best[i] == math.inf:
            continue
        start = tokens[i].start
        lines, width, words, cells, reading = 0, 0, 0, 0, 0
        for j in range(i, n):
            tok = tokens[j]
            if j > i and (tok.start - tokens[j - 1].end >= pause or tok.end - start > limit):
                break
            for p, part in enumerate(tok.parts):
                spaced = part.space and (j > i or p > 0)
                add = part.width + (1 if part.space else 0)
                if (
                    lines
                    and width + add <= options.max_width
                    and not (p == 0 and max_words and words >= max_words)
                ):
                    width += add
                    words += p == 0
                else:
                    lines += 1
                    width, words = part.width, 1
                cells += part.width
                reading += part.width + (1 if spaced else 0)
            if j > i and lines > options.max_lines:
                break
            natural = tok.end
            room = tokens[j + 1].start - gap if j + 1 < n else room_end
            cap = start + limit if natural - start <= limit else natural
            avail = max(min(room, cap) - start, 1)
            c = best[i] + 1.0
            if j + 1 < n:
                silence = max(0, tokens[j + 1].start - natural)
                bonus = _PAUSE_BREAK_BONUS * min(1.0, silence / pause)
                c += _BREAK_COST[tok.parts[-1].after] * (1 - bonus)
            fill = max(cells / capacity, (natural - start) / limit)
            c += max(0.0, 1 - fill) ** 2
            if avail < shortest:
                c += _SHORT_CUE_COST * (1 - avail / shortest)
            c += _CPS_COST * max(0.0, reading * 1000 / avail / options.max_cps - 1)
            if c < best[j + 1]:
                best[j + 1], back[j + 1] = c, i
    return _backtrack(back, n)


def _layout(tokens: Sequence[_Token], options: CueOptions) -> _Raw:
    """One word cue: its lines, and each word's span in its text."""
    units = [part for tok in tokens for part in tok.parts]
    ids = [k for k, tok in enumerate(tokens) for _ in tok.parts]
    pieces: list[str] = []
    places: list[tuple[int, int]] = []
    pos = 0
    for line, (i, j) in enumerate(_wrap_ranges(units, options.max_width, ids, options.max_words_per_line)):
        if line:
            pieces.append("\n")
            pos += 1
        for k in range(i, j):
            if units[k].space and k > i:
                pieces.append(" ")
                pos += 1
            places.append((pos, pos + len(units[k].text)))
            pieces.append(units[k].text)
            pos += len(units[k].text)
    text = "".join(pieces)
    words = []
    first = 0
    for tok in tokens:
        last = first + len(tok.parts) - 1
        cs, ce = places[first][0], places[last][1]
        words.append((text[cs:ce], tok.start, tok.end, cs, ce))
        first = last + 1
    return _Raw(
        tokens[0].start / 1000,
        tokens[-1].end / 1000,
        text,
        words,
        last_start=tokens[-1].start,
        natural_end=tokens[-1].end,
    )


def _limit_ms(options: CueOptions) -> int:
    # Keeps cue lengths strictly under max_duration after rounding to milliseconds.
    return max(1, math.floor(round((options.max_duration - _ROUNDING_SLACK) * 1000, 6)))


def _time_word_cue(raw: _Raw, next_start: int | None, end_ms: int | None, options: CueOptions) -> float:
    """The end of a word cue, in seconds: its last word's end plus the tail, longer for word_min_duration
    and max_cps, at most max_duration (unless one word takes longer), and min_gap before the next cue;
    where the words run into the next cue, min_gap before it but not before the last word has been
    shown for a moment. Never after the next cue's start or the end of the audio."""
    start = to_milliseconds(raw.start)
    natural = raw.natural_end
    hard = math.inf if end_ms is None else end_ms
    if next_start is not None:
        hard = min(hard, next_start)
    room = min(hard, math.inf if next_start is None else next_start - round(options.min_gap * 1000))
    if room >= natural:
        limit = _limit_ms(options)
        want = max(natural + round(options.tail * 1000), start + round(options.word_min_duration * 1000))
        if math.isfinite(options.max_cps):
            want = max(want, start + math.ceil(reading_length(raw.text) * 1000 / options.max_cps))
        end = min(want, max(natural, start + limit), room)
    else:
        end = min(max(room, raw.last_start + round(_MIN_WORD_VISIBLE * 1000)), hard)
    return end / 1000


def build_cues(
    segments: Sequence[TimedText],
    audio: np.ndarray | None = None,
    *,
    sample_rate: int = SAMPLE_RATE,
    options: CueOptions | None = None,
    duration: float | None = None,
) -> list[Cue]:
    """Subtitle cues for transcript segments (objects with start, end and text).

    Segments with timing "aligned" and words (result.Word: text, start, end, char_start, char_end) are
    cut between their words and timed by them: each cue starts when its first word does and keeps its
    words (Cue.words). Other segments are split by text and timed in proportion: with the audio (mono
    samples at sample_rate), each segment's cues span its speech and the boundaries between them sit
    at quiet points. Cues are ordered, do not overlap, last at least 1 ms (min_duration, or
    word_min_duration, where the gap to the next cue allows) and are timed in whole milliseconds.
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
    ordered = [seg for seg in sorted(segments, key=lambda s: s.start) if seg.text and seg.text.strip()]
    raw: list[_Raw] = []
    for k, seg in enumerate(ordered):
        tokens = _tokens(seg.text, seg.words, options, end_ms) if _aligned(seg) else None
        if tokens:
            # The last cue may read on until the next segment (or the end of the audio).
            room = math.inf if end_ms is None else end_ms
            if k + 1 < len(ordered):
                room = min(room, to_milliseconds(ordered[k + 1].start) - round(options.min_gap * 1000))
            room = max(room, tokens[-1].end)
            raw.extend(_layout(tokens[i:j], options) for i, j in _split_tokens(tokens, options, room))
        else:
            start, stop = min(seg.start, end_s), min(seg.end, end_s)
            raw.extend(
                _Raw(*cue) for cue in _segment_cues(seg.text, start, stop, options, energy, frame_seconds)
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
            cue.end = _time_word_cue(cue, next_start, end_ms, options)

    if end_ms is not None:
        # Every cue needs a millisecond of its own before the end: where the audio has fewer than the
        # cues (a clip of a few milliseconds), the last ones are joined.
        while len(raw) > end_ms:
            a, b = raw[-2], raw.pop()
            words = None
            if a.words is not None and b.words is not None:
                shift = len(a.text) + 1
                words = a.words + [(t, s, e, cs + shift, ce + shift) for t, s, e, cs, ce in b.words]
            raw[-1] = _Raw(a.start, b.end, f"{a.text}\n{b.text}", words)
    cues: list[Cue] = []
    prev_end = 0
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
        cues.append(Cue(start_ms / 1000, stop_ms / 1000, cue.text, words))
        prev_end = stop_ms
    return cues


def _backtrack(back: list[int], n: int) -> list[tuple[int, int]]:
    """The ranges [i, j) of the best split of n units, from each end's best start back[j]."""
    ranges: list[tuple[int, int]] = []
    j = n
    while j > 0:
        ranges.append((back[j], j))
        j = back[j]
    return ranges[::-1]
