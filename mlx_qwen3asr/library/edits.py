"""An edited segment's words: the words of the new text, where every word that is still there keeps the
time the aligner gave it.

A segment's words (result.Word as dicts: text, start, end, char_start, char_end, speaker, overlap) are
cut from its text in one of two ways, and an edited text is cut the same way:

- spaced text (English, French, Korean, ...): one word per run of non-space characters, punctuation
  attached ("Hello,"). The old and new words are aligned as strings (difflib.SequenceMatcher); an
  unchanged word keeps its time, speaker and overlap.
- text written without spaces (Chinese, Japanese, Thai): the old and new texts are aligned character by
  character; an old word whose characters are all still there, in one piece, keeps its time (so a
  multi-character Japanese word survives an edit elsewhere in the segment). The new characters are cut
  into words: one per Han, kana or Thai character, one per run of other letters and digits
  ("Python"), punctuation attached to the word before it.

Between two kept words, the old words that went away and the new words that came in are matched one for
one when their numbers are equal (a corrected word takes the time of the word it replaces). Otherwise the
new words are given times by interpolation: the time between the kept word before them and the kept word
after them is shared among them in proportion to their lengths; at the start or end of the segment the
span of the removed words is used, or a zero-length time at the nearest kept word. So every word has a
time (never None); `Retext.estimated` counts the interpolated ones.
"""

from __future__ import annotations

import difflib
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Retext", "is_unspaced_char", "retext", "retext_words", "spaced_words"]

_NON_SPACE = re.compile(r"\S+")


@dataclass
class Retext:
    """The words of an edited segment text: `words` in text order; `kept` of them kept their time (an
    unchanged word, or a word replaced one for one); `estimated` were given an interpolated time."""

    words: list[dict[str, Any]]
    kept: int
    estimated: int


def is_unspaced_char(ch: str) -> bool:
    """Whether ch belongs to a script written without spaces between words (Han, kana, Thai, CJK
    punctuation and full-width forms): each such letter is a word of its own."""
    cp = ord(ch)
    return (
        0x0E00 <= cp <= 0x0E7F  # Thai
        or 0x2E80 <= cp <= 0x2FDF  # CJK and Kangxi radicals
        or 0x3000 <= cp <= 0x30FF  # CJK symbols and punctuation, hiragana, katakana
        or 0x3100 <= cp <= 0x312F  # bopomofo
        or 0x31A0 <= cp <= 0x31FF  # bopomofo extended, CJK strokes, katakana extensions
        or 0x3200 <= cp <= 0x9FFF  # enclosed CJK, compatibility, extension A, unified ideographs
        or 0xF900 <= cp <= 0xFAFF  # compatibility ideographs
        or 0xFE30 <= cp <= 0xFE4F  # CJK compatibility forms
        or 0xFF00 <= cp <= 0xFF9F  # full-width forms, half-width katakana
        or 0x1B000 <= cp <= 0x1B16F  # kana supplement and extended
        or 0x20000 <= cp <= 0x323AF  # ideograph extensions B to H
    )


def _is_wordy(ch: str) -> bool:
    """Letters, digits and the apostrophe: what makes a run of characters a word."""
    return ch == "'" or unicodedata.category(ch)[0] in "LN"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _old_spans(old_text: str, old_words: Sequence[Mapping[str, Any]]) -> list[tuple[int, int] | None]:
    """Each old word's span in old_text: its char_start/char_end where they hold the word's text, else
    found by its text after the word before it; None for a word that is not in the text."""
    spans: list[tuple[int, int] | None] = []
    at = 0
    for w in old_words:
        text = str(w.get("text", ""))
        cs, ce = w.get("char_start"), w.get("char_end")
        if (
            isinstance(cs, int)
            and isinstance(ce, int)
            and 0 <= cs < ce <= len(old_text)
            and (not text or old_text[cs:ce].strip() == text.strip())
        ):
            spans.append((cs, ce))
            at = ce
            continue
        found = old_text.find(text, at) if text else -1
        if found < 0:
            spans.append(None)
        else:
            spans.append((found, found + len(text)))
            at = found + len(text)
    return spans


def spaced_words(old_text: str, old_words: Sequence[Mapping[str, Any]], new_text: str) -> bool:
    """Whether the segment's words are cut at spaces: true when most gaps between the old words hold
    whitespace; with fewer than two old words, when neither text has characters of a script written
    without spaces."""
    spans = [s for s in _old_spans(old_text, old_words) if s is not None]
    if len(spans) >= 2:
        gaps = [old_text[a[1] : b[0]] for a, b in zip(spans, spans[1:])]
        spaced = sum(1 for g in gaps if any(ch.isspace() for ch in g))
        return 2 * spaced >= len(gaps)
    return not any(is_unspaced_char(ch) for ch in old_text + new_text)


def _spaced_cut(
    old_text: str, old_words: Sequence[Mapping[str, Any]], new_text: str
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Spaced text: the new words' spans (runs of non-space characters with a letter or digit) and the
    (old index, new index) pairs of unchanged words."""
    spans = [(m.start(), m.end()) for m in _NON_SPACE.finditer(new_text) if any(map(_is_wordy, m.group()))]
    old_strings = [str(w.get("text", "")).strip() for w in old_words]
    new_strings = [new_text[a:b] for a, b in spans]
    matcher = difflib.SequenceMatcher(None, old_strings, new_strings, autojunk=False)
    pairs = [(i + k, j + k) for i, j, n in matcher.get_matching_blocks() for k in range(n)]
    return spans, pairs


def _unspaced_cut(
    old_text: str, old_words: Sequence[Mapping[str, Any]], new_text: str
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Text without spaces: the new words' spans and the (old index, new index) pairs of old words whose
    characters all survived in one piece (aligned character by character)."""
    where = [-1] * len(old_text)
    matcher = difflib.SequenceMatcher(None, old_text, new_text, autojunk=False)
    for i, j, n in matcher.get_matching_blocks():
        for k in range(n):
            where[i + k] = j + k
    kept: dict[int, tuple[int, int]] = {}  # new start -> (old index, new end)
    last_end = 0
    for index, span in enumerate(_old_spans(old_text, old_words)):
        if span is None:
            continue
        cs, ce = span
        mapped = where[cs:ce]
        if -1 in mapped or mapped[-1] - mapped[0] != ce - cs - 1 or mapped[0] < last_end:
            continue
        kept[mapped[0]] = (index, mapped[-1] + 1)
        last_end = mapped[-1] + 1

    spans: list[tuple[int, int]] = []
    pairs: list[tuple[int, int]] = []
    pos = 0
    open_word = False  # the last span ends right here and may take trailing punctuation
    while pos < len(new_text):
        if pos in kept:
            index, end = kept[pos]
            pairs.append((index, len(spans)))
            spans.append((pos, end))
            pos, open_word = end, True
            continue
        ch = new_text[pos]
        if ch.isspace():
            pos, open_word = pos + 1, False
        elif not _is_wordy(ch):
            if open_word and spans:
                spans[-1] = (spans[-1][0], pos + 1)
            pos += 1
        elif is_unspaced_char(ch):
            spans.append((pos, pos + 1))
            pos, open_word = pos + 1, True
        else:
            end = pos + 1
            while (
                end < len(new_text)
                and end not in kept
                and _is_wordy(new_text[end])
                and not is_unspaced_char(new_text[end])
            ):
                end += 1
            spans.append((pos, end))
            pos, open_word = end, True
    return spans, pairs


def _interpolate(
    lengths: Sequence[int], lo: float | None, hi: float | None
) -> list[tuple[float | None, float | None]]:
    """Times for consecutive words of these lengths sharing [lo, hi] in proportion to their lengths."""
    if lo is None:
        lo = hi
    if hi is None:
        hi = lo
    if lo is None or hi is None:
        return [(None, None)] * len(lengths)
    hi = max(hi, lo)
    total = sum(max(n, 1) for n in lengths)
    out, at = [], 0
    for n in lengths:
        start = lo + (hi - lo) * at / total
        at += max(n, 1)
        out.append((round(start, 3), round(lo + (hi - lo) * at / total, 3)))
    return out


def retext(old_text: str, old_words: Sequence[Mapping[str, Any]], new_text: str) -> Retext:
    """The words of a segment whose text old_text (cut into old_words) became new_text; see the module's
    docstring for how they are cut and timed. A segment without words gets none."""
    if not old_words or not new_text.strip():
        return Retext([], 0, 0)
    if spaced_words(old_text, old_words, new_text):
        spans, pairs = _spaced_cut(old_text, old_words, new_text)
    else:
        spans, pairs = _unspaced_cut(old_text, old_words, new_text)

    times: list[tuple[float | None, float | None]] = [(None, None)] * len(spans)
    source: list[Mapping[str, Any] | None] = [None] * len(spans)  # whose speaker and overlap a word takes
    timed = [False] * len(spans)  # the word keeps an old word's time (and its other keys)
    kept = estimated = 0
    anchors = [(-1, -1), *pairs, (len(old_words), len(spans))]
    for (oi, ni), (oj, nj) in zip(anchors, anchors[1:]):
        if 0 <= ni < len(spans):
            w = old_words[oi]
            times[ni] = (_number(w.get("start")), _number(w.get("end")))
            source[ni], timed[ni] = w, True
            kept += 1
        removed = list(old_words[oi + 1 : oj])
        added = list(range(ni + 1, nj))
        if not added:
            continue
        if len(removed) == len(added):
            for k, w in zip(added, removed):
                times[k] = (_number(w.get("start")), _number(w.get("end")))
                source[k], timed[k] = w, True
            kept += len(added)
            continue
        before = old_words[oi] if oi >= 0 else None
        after = old_words[oj] if oj < len(old_words) else None
        lo = _number(before.get("end")) if before is not None else None
        hi = _number(after.get("start")) if after is not None else None
        if before is None and removed:
            lo = _number(removed[0].get("start"))
        if after is None and removed:
            hi = _number(removed[-1].get("end"))
        shared = _interpolate([spans[k][1] - spans[k][0] for k in added], lo, hi)
        like = removed[0] if removed else before if before is not None else after
        for k, t in zip(added, shared):
            times[k] = t
            source[k] = like
        estimated += len(added)

    words: list[dict[str, Any]] = []
    for (cs, ce), (start, end), w, keep in zip(spans, times, source, timed):
        word: dict[str, Any] = dict(w) if keep and w is not None else {}
        word.update(
            text=new_text[cs:ce],
            start=start,
            end=end,
            char_start=cs,
            char_end=ce,
            speaker=w.get("speaker") if w is not None else None,
            overlap=bool(w.get("overlap", False)) if w is not None else False,
        )
        words.append(word)
    return Retext(words, kept, estimated)


def retext_words(
    old_text: str, old_words: Sequence[Mapping[str, Any]], new_text: str
) -> list[dict[str, Any]]:
    """The words of new_text, the edited text of a segment that read old_text with these words: unchanged
    words keep their start, end, speaker and overlap; new or changed words get times interpolated between
    their kept neighbours (see the module's docstring); char_start/char_end are those of new_text."""
    return retext(old_text, old_words, new_text).words
