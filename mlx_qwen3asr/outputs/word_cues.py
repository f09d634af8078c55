"""Cues cut from the words the forced aligner timed.

A segment's text is cut at its words, each word taking the punctuation written next to it. The cues
break between words: at sentence and clause punctuation, always at pauses, within the limits of line
width, duration, reading speed and gap to the next cue (CueOptions). A cue starts when its first word
is spoken and ends shortly after its last one, and keeps its words so that players can highlight them.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from mlx_qwen3asr.outputs.cue_types import CueOptions, RawCue, duration_limit_ms, to_milliseconds
from mlx_qwen3asr.outputs.wrapping import (
    ARROW,
    BREAK_COST,
    NO_LINE_END,
    NO_LINE_START,
    SHORT_CUE_COST,
    Unit,
    backtrack,
    break_quality,
    clean_text,
    join_units,
    line_count,
    reading_length,
    text_units,
    text_width,
    unit_weight,
    wrap_ranges,
)

__all__ = [
    "Token",
    "is_aligned",
    "layout_word_cue",
    "split_tokens",
    "word_cue_end",
    "word_tokens",
]

# Cue-split penalties for cues cut from aligned words, beside those of the text split: reading faster
# than max_cps (per unit of relative excess), and how much of a break's cost a pause takes away.
_CPS_COST = 2.0
_PAUSE_BREAK_BONUS = 0.5
# A cue whose last word runs into the next cue stays at least this long after that word starts.
_MIN_WORD_VISIBLE = 0.1


@dataclass
class Token:
    """One aligned word as cues show it, with the text around it that goes with it."""

    text: str  # cleaned
    space: bool  # a space separates it from the word before
    start: int  # milliseconds
    end: int
    parts: list[Unit]  # line-sized pieces (one, unless the word is wider than a line)


def _is_space(ch: str) -> bool:
    return ch.isspace() or unicodedata.category(ch) in ("Cc", "Zl", "Zp")


def is_aligned(seg: object) -> bool:
    """Whether a segment's words were timed by the aligner, so that its cues are cut between them."""
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


def _word_parts(text: str, space: bool, max_width: int) -> list[Unit]:
    """A word as one unit, or as line-sized pieces when it is wider than a line (cut as in estimated cues)."""
    width = text_width(text)
    if width <= max_width:
        return [Unit(text, space, width, break_quality(text))]
    parts = text_units(text, max_width)
    return [Unit(parts[0].text, space, parts[0].width, parts[0].after), *parts[1:]]


def _chunk_parts(parts: list[Unit], max_width: int, max_lines: int) -> list[list[Unit]]:
    """Pieces of one word grouped so that each group fits in one cue's max_lines lines."""
    chunks: list[list[Unit]] = [[]]
    for part in parts:
        if chunks[-1] and line_count([*chunks[-1], part], max_width) > max_lines:
            chunks.append([])
        chunks[-1].append(part)
    return chunks


def word_tokens(
    text: str, words: Sequence[object], options: CueOptions, end_ms: int | None
) -> list[Token] | None:
    """The segment's text cut at its words: each word takes the text up to the next word, except spaces
    and opening brackets or quotes just before that word, which go with it. None if the words cannot be
    placed in the text."""
    spans = _word_spans(text, words)
    if spans is None:
        return None
    cuts = [0]
    for (_, prev_end, _, _), (next_start, _, _, _) in zip(spans, spans[1:]):
        k = next_start
        while k > prev_end and (_is_space(text[k - 1]) or text[k - 1] in NO_LINE_END):
            k -= 1
        cuts.append(k)
    cuts.append(len(text))
    limit = math.inf if end_ms is None else end_ms
    tokens: list[Token] = []
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
            if shown[0] in NO_LINE_START:
                # Closing punctuation the aligner gave a word of its own stays with the word before.
                merged = prev.text + shown
                tokens[-1] = Token(merged, prev.space, prev.start, max(prev.end, end_ms_), [])
                continue
            if ARROW.search(prev.text[-2:] + shown[:2]):
                space = True  # never "-->" across two words: it separates times in SRT and WebVTT
        tokens.append(Token(shown, space, start_ms, end_ms_, []))
    # Line pieces; a word too long for one cue becomes several, its time shared by their widths.
    out: list[Token] = []
    for tok in tokens:
        parts = _word_parts(tok.text, tok.space, options.max_width)
        chunks = _chunk_parts(parts, options.max_width, options.max_lines)
        if len(chunks) == 1:
            out.append(Token(tok.text, tok.space, tok.start, tok.end, parts))
            continue
        weights = [sum(unit_weight(p) for p in chunk) for chunk in chunks]
        total, done = sum(weights), 0
        for chunk, weight in zip(chunks, weights):
            a = tok.start + round((tok.end - tok.start) * done / total)
            done += weight
            b = tok.start + round((tok.end - tok.start) * done / total)
            out.append(Token(join_units(chunk), chunk[0].space, a, b, chunk))
    return out


def split_tokens(tokens: Sequence[Token], options: CueOptions, room_end: float) -> list[tuple[int, int]]:
    """Token ranges of the cues of one segment.

    Every cue fits max_lines lines of max_width cells (and max_words_per_line), never spans a pause
    and, unless it is a single word, lasts at most max_duration. Cost: one per cue, weak breaks (a
    silence before the next word makes a break cheaper), slack against the cue's capacity, cues shorter
    than word_min_duration and reading faster than max_cps with the time the cue can have, up to the
    next word's start less min_gap (room_end for the last cue).
    """
    n = len(tokens)
    limit = duration_limit_ms(options)
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
                c += BREAK_COST[tok.parts[-1].after] * (1 - bonus)
            fill = max(cells / capacity, (natural - start) / limit)
            c += max(0.0, 1 - fill) ** 2
            if avail < shortest:
                c += SHORT_CUE_COST * (1 - avail / shortest)
            c += _CPS_COST * max(0.0, reading * 1000 / avail / options.max_cps - 1)
            if c < best[j + 1]:
                best[j + 1], back[j + 1] = c, i
    return backtrack(back, n)


def layout_word_cue(tokens: Sequence[Token], options: CueOptions) -> RawCue:
    """One word cue: its lines, and each word's span in its text."""
    units = [part for tok in tokens for part in tok.parts]
    ids = [k for k, tok in enumerate(tokens) for _ in tok.parts]
    pieces: list[str] = []
    places: list[tuple[int, int]] = []
    pos = 0
    for line, (i, j) in enumerate(wrap_ranges(units, options.max_width, ids, options.max_words_per_line)):
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
    return RawCue(
        tokens[0].start / 1000,
        tokens[-1].end / 1000,
        text,
        words,
        last_start=tokens[-1].start,
        natural_end=tokens[-1].end,
    )


def word_cue_end(raw: RawCue, next_start: int | None, end_ms: int | None, options: CueOptions) -> float:
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
        limit = duration_limit_ms(options)
        want = max(natural + round(options.tail * 1000), start + round(options.word_min_duration * 1000))
        if math.isfinite(options.max_cps):
            want = max(want, start + math.ceil(reading_length(raw.text) * 1000 / options.max_cps))
        end = min(want, max(natural, start + limit), room)
    else:
        end = min(max(room, raw.last_start + round(_MIN_WORD_VISIBLE * 1000)), hard)
    return end / 1000
