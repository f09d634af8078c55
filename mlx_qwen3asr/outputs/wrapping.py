"""Display widths, line wrapping, and the split of text into readable cue texts.

Text is cut into units: words, or in scripts written without spaces (Chinese, Japanese, Thai) single
characters, with closing punctuation kept on the unit before it and opening brackets on the unit after
it; a unit wider than a line is cut into line-sized parts. Each unit records how good a break after it
is (sentence end, clause punctuation, word boundary, inside a word). Lines are filled to the fewest
count and balanced in width, preferring breaks after punctuation; a block of text becomes the cue
texts that fit `max_lines` lines of `max_width` display cells (fullwidth characters count two).
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "ARROW",
    "BREAK_COST",
    "NO_LINE_END",
    "NO_LINE_START",
    "SHORT_CUE_COST",
    "Unit",
    "backtrack",
    "break_quality",
    "char_width",
    "clean_text",
    "join_units",
    "line_count",
    "reading_length",
    "split_text",
    "split_units",
    "text_units",
    "text_width",
    "unit_weight",
    "unit_weights",
    "wrap_lines",
    "wrap_ranges",
    "wrap_units",
]

# Break quality after a unit: higher is a better place to end a cue or a line.
_SENTENCE, _CLAUSE, _WORD, _INSIDE = 3, 2, 1, 0
_SENTENCE_END = frozenset(".!?…‼⁇⁈⁉。！？｡؟।॥")
_CLAUSE_END = frozenset(",;:—–，、；：､،؛")
# Closing quotes and brackets may follow the punctuation that ends a sentence or clause.
_CLOSERS = frozenset("\"'”’»)]}」』）】〕〉》〗〙〛｣")
# Characters that must not start a line (closing punctuation, small kana, prolonged sound mark).
NO_LINE_START = (
    _CLOSERS
    | _SENTENCE_END
    | _CLAUSE_END
    | frozenset(
        "ー々ゝゞヽヾぁぃぅぇぉっゃゅょゎゕゖァィゥェォッャュョヮヵヶㇰㇱㇲㇳㇴㇵㇶㇷㇸㇹㇺㇻㇼㇽㇾㇿ・％%"
    )
)
# Characters that must not end a line (opening quotes and brackets).
NO_LINE_END = frozenset("“‘«([{「『（【〔〈《〖〘〚｢")
# Cue penalties in the text split: a chunk, a weak break, and slack against the cue's capacity.
BREAK_COST = {_SENTENCE: 0.0, _CLAUSE: 0.35, _WORD: 0.8, _INSIDE: 2.5}
SHORT_CUE_COST = 3.0
# "-->" and longer arrows: they separate cue times in SRT and WebVTT.
ARROW = re.compile(r"-{2,}>")


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
    text = ARROW.sub("->", text)
    return " ".join(text.split())


@dataclass(frozen=True)
class Unit:
    """A piece of text a line or a cue may break after: a word, a character of an unspaced script, or
    a line-sized part of a word wider than a line."""

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


def break_quality(piece: str) -> int:
    """How good a place to break the end of piece is: a sentence end, clause punctuation, or a word end."""
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
        glued = char_width(ch) == 0 or ch in NO_LINE_START
        if out and (glued or not (_unspaced(ch) or _unspaced(out[-1][-1]))):
            out[-1] += ch
        else:
            out.append(ch)
    # An opening bracket stays with what it opens.
    merged: list[str] = []
    for piece in out:
        if merged and merged[-1][-1] in NO_LINE_END:
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


def text_units(text: str, max_width: int) -> list[Unit]:
    units: list[Unit] = []
    for word in text.split():
        for i, cluster in enumerate(_clusters(word)):
            parts = _hard_break(cluster, max_width)
            for j, part in enumerate(parts):
                after = break_quality(part) if j == len(parts) - 1 else _INSIDE
                units.append(
                    Unit(part, space=bool(units) and i == 0 and j == 0, width=text_width(part), after=after)
                )
    return units


def unit_weight(unit: Unit) -> int:
    """A unit's share of time when cues are timed in proportion: at least one, even without width."""
    return max(1, unit.width) + (1 if unit.space else 0)


def line_count(
    units: Sequence[Unit],
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


def join_units(units: Sequence[Unit]) -> str:
    """The units as one line of text, spaced where the text had spaces."""
    return "".join((" " if u.space and k else "") + u.text for k, u in enumerate(units))


def wrap_ranges(
    units: Sequence[Unit],
    max_width: int,
    word_ids: Sequence[int] | None = None,
    max_words: int | None = None,
) -> list[tuple[int, int]]:
    """Unit ranges of the lines: the fewest lines, balanced in width, preferring breaks after
    punctuation; with word_ids (consecutive numbers), at most max_words words a line."""
    n = len(units)
    if n == 0:
        return []
    count = line_count(units, max_width, word_ids, max_words)
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


def wrap_units(units: Sequence[Unit], max_width: int) -> list[str]:
    """Lines of the fewest count, balanced in width, preferring breaks after punctuation."""
    return [join_units(units[i:j]) for i, j in wrap_ranges(units, max_width)]


def wrap_lines(text: str, max_width: int = 42) -> list[str]:
    """Wrap one cue's text into the fewest lines of at most max_width cells, balanced."""
    return wrap_units(text_units(clean_text(text), max_width), max_width)


def unit_weights(units: Sequence[Unit]) -> list[int]:
    """The weight of each unit (see unit_weight); the space before the first one does not count."""
    weights = [unit_weight(u) for u in units]
    if weights and units[0].space:
        weights[0] -= 1
    return weights


def split_units(
    units: Sequence[Unit],
    max_width: int,
    max_lines: int,
    max_weight: float = math.inf,
    min_weight: float = 0.0,
) -> list[tuple[int, int]]:
    """Unit ranges of the cues: each fits in max_lines lines and, unless it is one unit, weighs at most
    max_weight (its share of time). Cost: one per cue, weak breaks, slack and cues under min_weight."""
    n = len(units)
    weights = unit_weights(units)
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
            brk = 0.0 if j + 1 == n else BREAK_COST[unit.after]
            slack = max(0.0, capacity - weight) / capacity if capacity > 0 else 0.0
            short = SHORT_CUE_COST * (1 - weight / min_weight) if weight < min_weight else 0.0
            c = best[i] + 1.0 + brk + slack * slack + short
            if c < best[j + 1]:
                best[j + 1], back[j + 1] = c, i
    return backtrack(back, n)


def split_text(text: str, max_width: int = 42, max_lines: int = 2) -> list[str]:
    """Cue texts (lines joined by "\\n") for one block of text, each fitting max_lines x max_width."""
    units = text_units(clean_text(text), max_width)
    return ["\n".join(wrap_units(units[i:j], max_width)) for i, j in split_units(units, max_width, max_lines)]


def backtrack(back: list[int], n: int) -> list[tuple[int, int]]:
    """The ranges [i, j) of the best split of n units, from each end's best start back[j]."""
    ranges: list[tuple[int, int]] = []
    j = n
    while j > 0:
        ranges.append((back[j], j))
        j = back[j]
    return ranges[::-1]
