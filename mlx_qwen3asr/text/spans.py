"""The span of a transcript each aligner item stands for in a subtitle: its own characters widened
over the punctuation around it (`display_spans`), so that timed words show as written."""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from typing import Protocol


class Item(Protocol):
    """What display_spans reads of an item (text.words.Item): its text and the span it comes from."""

    text: str
    start: int
    end: int


def whitespace_words(text: str) -> list[tuple[int, int]]:
    """The [start, end) spans of the runs of non-space characters of `text`."""
    words: list[tuple[int, int]] = []
    start = -1
    for position, ch in enumerate(text):
        if ch.isspace():
            if start >= 0:
                words.append((start, position))
                start = -1
        elif start < 0:
            start = position
    if start >= 0:
        words.append((start, len(text)))
    return words


def _is_opening(ch: str) -> bool:
    """Punctuation that belongs to the word after it: opening brackets and quotes, ¿ and ¡."""
    return ch in "¿¡" or unicodedata.category(ch) in ("Ps", "Pi")


def _split_gap(text: str, start: int, end: int) -> tuple[int, int]:
    """Share text[start:end], the characters between two items, out between them.

    Returns (end of the first item's span, start of the second's). Punctuation glued to the first
    item and chunks standing alone between spaces go to the first; punctuation glued to the second
    and the opening punctuation right before it go to the second.
    """
    chunks = [(start + a, start + b) for a, b in whitespace_words(text[start:end])]
    if not chunks:
        return start, end
    if len(chunks) == 1 and chunks[0] == (start, end):  # no whitespace: cut before the opening run
        cut = end
        while cut > start and _is_opening(text[cut - 1]):
            cut -= 1
        return cut, cut
    first = 1 if chunks[0][0] == start else 0  # glued to the first item
    last = len(chunks) - 1 if chunks[-1][1] == end else len(chunks)  # glued to the second item
    to_next = last
    while to_next > first and all(
        _is_opening(ch) for ch in text[chunks[to_next - 1][0] : chunks[to_next - 1][1]]
    ):
        to_next -= 1
    first_end = chunks[to_next - 1][1] if to_next > 0 else start
    second_start = chunks[to_next][0] if to_next < len(chunks) else end
    return first_end, second_start


def display_spans(text: str, items: Sequence[Item]) -> list[tuple[int, int]]:
    """For each item, the span of `text` it stands for in a subtitle: its own span widened over the
    punctuation around it.

    Punctuation after an item (up to the next whitespace or item: "Hello," "world!", "好。") joins
    it; opening quotes and brackets, "¿" and "¡" join the item after them, as does whatever comes
    before the first item; a chunk of punctuation standing alone between spaces joins the item
    before it (the one after it if it is opening punctuation). The spans are in order and do not
    overlap; with the whitespace between them they cover every non-space character of the text
    (when there is at least one item). Items that come from one and the same character (a Japanese
    compatibility character that normalises to several) share it: the first gets it, the others an
    empty span where it ends. Raises ValueError for items outside the text or out of order.
    """
    count = len(items)
    if count == 0:
        return []
    starts: list[int] = []
    ends: list[int] = []
    for index, item in enumerate(items):
        if not 0 <= item.start <= item.end <= len(text):
            raise ValueError(
                f"item {index} ({item.text!r}) spans [{item.start}, {item.end}) outside the text"
            )
        if index and item.start < items[index - 1].start:
            raise ValueError(f"item {index} ({item.text!r}) starts before the item before it")
        start = max(item.start, ends[-1]) if ends else item.start
        starts.append(start)
        ends.append(max(item.end, start))
    leading = whitespace_words(text[: starts[0]])
    if leading:
        starts[0] = leading[0][0]
    trailing = whitespace_words(text[ends[-1] :])
    if trailing:
        ends[-1] = ends[-1] + trailing[-1][1]
    for index in range(count - 1):
        ends[index], starts[index + 1] = _split_gap(text, ends[index], starts[index + 1])
    return list(zip(starts, ends))


__all__ = ["display_spans", "whitespace_words"]
