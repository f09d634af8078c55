"""How a transcript is cut into the items the forced aligner times, and how its timestamp classes become
word times.

Qwen3-ForcedAligner times a transcript item by item: the prompt holds every item followed by two
timestamp tokens, and the model answers each timestamp token with a class (a multiple of the model's
`timestamp_segment_time`, in milliseconds). Which items there are is fixed by the official text
processing, and the model was trained on exactly that cut, so `split_items` reproduces it character
for character:

- every character that is neither a letter (L*), a digit (N*) nor the apostrophe is dropped;
- Japanese is cut into words by nagisa (which first NFKC-normalises the text), Korean by soynlp's
  LTokenizer scored with the official dictionary (each whitespace word becomes its best-scored
  left part and the rest);
- every other language (and language None) is cut at whitespace, and each CJK ideograph of a word
  becomes an item of its own ("我用iPhone拍了3张照片" gives 我 用 iPhone 拍 了 3 张 照 片).

Each item also carries the span [start, end) of the original text its characters come from, so
callers can show the words as written (`display_spans` adds the punctuation around them).

Where nagisa or soynlp is missing (or the Korean dictionary shipped in text/data, see
text.korean_dictionary, is damaged), the split falls back to a documented approximation;
`official_split_available` and `split_fallback_reason` tell callers so they can record that the items
differ from the official cut.

`fix_timestamps` and `word_times` turn the predicted classes into times exactly as the official
implementation does (the same repair of non-monotonic predictions, the same integer truncation and
rounding), in O(n log n) instead of O(n^2).
"""

from __future__ import annotations

import bisect
import importlib
import threading
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mlx_qwen3asr.text.korean_dictionary import KoreanDictionaryError, korean_dictionary_bytes

# --- the Korean dictionary's scores -----------------------------------------------------------------


def read_korean_scores(text: str) -> dict[str, float]:
    """The LTokenizer scores the official processor builds from the dictionary's text: 1.0 for the
    first field of each line."""
    scores: dict[str, float] = {}
    for line in text.split("\n"):  # lines as a file yields them, not str.splitlines'
        fields = line.split()
        if fields:
            scores[fields[0]] = 1.0
    return scores


# --- the optional tokenizers, loaded once per process -----------------------------------------------

_LOCK = threading.RLock()
# name -> (loaded object or None, reason it is missing or None)
_LOADED: dict[str, tuple[object | None, str | None]] = {}


def _load_once(name: str, loader: Callable[[], object]) -> tuple[object | None, str | None]:
    with _LOCK:
        if name not in _LOADED:
            try:
                _LOADED[name] = (loader(), None)
            except KoreanDictionaryError as error:
                _LOADED[name] = (None, f"the Korean dictionary is unavailable: {error}")
            except Exception as error:  # an optional dependency that does not import or load
                _LOADED[name] = (None, f"{name} is unavailable ({type(error).__name__}: {error})")
        return _LOADED[name]


def _clear_caches() -> None:
    """Forget the loaded tokenizers and dictionary (the next use looks for them again)."""
    with _LOCK:
        _LOADED.clear()


def _load_nagisa() -> object:
    return importlib.import_module("nagisa")


def _load_korean_tokenizer() -> object:
    tokenizer_module = importlib.import_module("soynlp.tokenizer")
    scores = read_korean_scores(korean_dictionary_bytes().decode("utf-8"))
    return tokenizer_module.LTokenizer(scores=scores)


def _nagisa() -> tuple[object | None, str | None]:
    found, reason = _load_once("nagisa", _load_nagisa)
    if reason is not None:
        reason += "; Japanese is split into runs of one script (kanji, hiragana, katakana, other)"
    return found, reason


def _korean_tokenizer() -> tuple[object | None, str | None]:
    found, reason = _load_once("soynlp", _load_korean_tokenizer)
    if reason is not None:
        reason += "; Korean is split at whitespace only"
    return found, reason


def _language_key(language: str | None) -> str:
    return language.lower() if language is not None else ""


def split_fallback_reason(language: str | None) -> str | None:
    """None when `split_items(text, language)` cuts exactly as the official processor does, else why not."""
    key = _language_key(language)
    if key == "japanese":
        return _nagisa()[1]
    if key == "korean":
        return _korean_tokenizer()[1]
    return None


def official_split_available(language: str | None) -> bool:
    """Whether `split_items` reproduces the official cut for this language (see split_fallback_reason)."""
    return split_fallback_reason(language) is None


# --- characters -------------------------------------------------------------------------------------


def is_kept(ch: str) -> bool:
    """Whether the aligner's text keeps this character: letters, digits and the apostrophe."""
    return ch == "'" or unicodedata.category(ch)[0] in "LN"


_CJK_RANGES = (
    (0x4E00, 0x9FFF),  # CJK Unified Ideographs
    (0x3400, 0x4DBF),  # Extension A
    (0x20000, 0x2A6DF),  # Extension B
    (0x2A700, 0x2B73F),  # Extension C
    (0x2B740, 0x2B81F),  # Extension D
    (0x2B820, 0x2CEAF),  # Extension E
    (0xF900, 0xFAFF),  # Compatibility Ideographs
)


def is_cjk(ch: str) -> bool:
    """Whether the character is a CJK ideograph of the ranges the official processor splits on."""
    code = ord(ch)
    return any(low <= code <= high for low, high in _CJK_RANGES)


# --- items ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Item:
    """One unit the aligner times: its text as the aligner sees it, and where it comes from.

    `text` is the kept characters (letters, digits, apostrophes) of the item; [start, end) is the span
    of the original text they come from: start is the index of the first, end one past the last. The
    characters of `text` are a subsequence of text[start:end], except in Japanese, where they are a
    subsequence of that span's NFKC normal form (nagisa's input: full-width "ＡＢ" becomes "AB"), and
    where several items can come from one character ("⅒" normalises to "1⁄10": items "1" and "10"
    or "1", "1", "0" share its span). A piece a tokenizer returned that is not in the text at all
    would get the empty span where the item before it ends.
    """

    text: str
    start: int
    end: int


def _split_space_language(text: str) -> list[Item]:
    """Whitespace words; their kept characters; each CJK ideograph on its own."""
    items: list[Item] = []
    run: list[str] = []
    run_start = run_end = 0

    def flush() -> None:
        if run:
            items.append(Item("".join(run), run_start, run_end))
            run.clear()

    for position, ch in enumerate(text):
        if ch.isspace():
            flush()
        elif not is_kept(ch):
            continue
        elif is_cjk(ch):
            flush()
            items.append(Item(ch, position, position + 1))
        else:
            if not run:
                run_start = position
            run.append(ch)
            run_end = position + 1
    flush()
    return items


def _items_from_pieces(
    source: str, pieces: Sequence[str], origin: Callable[[int], tuple[int, int]]
) -> list[Item]:
    """Items from consecutive pieces of `source` (a tokenizer's output), with spans via `origin`.

    Each piece is expected where the previous one ended (after any whitespace); a piece found there
    gives its kept characters' positions directly. A tokenizer that changed the text is located by
    the first occurrence of its kept characters from there on.
    """
    items: list[Item] = []
    cursor = 0
    for piece in pieces:
        kept = [index for index, ch in enumerate(piece) if is_kept(ch)]
        at = cursor
        while at < len(source) and source[at].isspace() and not source.startswith(piece, at):
            at += 1
        if source.startswith(piece, at):
            positions = [at + index for index in kept]
            cursor = at + len(piece)
        else:
            positions = []
            scan = cursor
            for index in kept:
                found = source.find(piece[index], scan)
                if found < 0:
                    break
                positions.append(found)
                scan = found + 1
            if len(positions) < len(kept):  # not in the text at all: an empty span where we are
                here = items[-1].end if items else 0
                items.append(Item("".join(piece[index] for index in kept), here, here))
                continue
            if positions:
                cursor = positions[-1] + 1
        if not kept:
            continue
        start = origin(positions[0])[0]
        end = origin(positions[-1])[1]
        items.append(Item("".join(piece[index] for index in kept), start, end))
    return items


def _identity_origin(position: int) -> tuple[int, int]:
    return position, position + 1


# Japanese: nagisa normalises its input before cutting it, and reports words of the normalised text.


def _nagisa_preprocess(text: str) -> str:
    return unicodedata.normalize("NFKC", text).replace("İ", "I").replace(" ", "\u3000")


def _starts_cluster(ch: str) -> bool:
    """Whether normalisation can never join this character with the one before it."""
    if unicodedata.combining(ch):
        return False
    decomposed = unicodedata.normalize("NFKD", ch)
    if decomposed and unicodedata.combining(decomposed[0]):
        return False  # e.g. half-width voiced marks, which compose with the kana before them
    code = ord(ch)
    return not (0x1160 <= code <= 0x11FF or 0xD7B0 <= code <= 0xD7FF)  # conjoining jamo


def _normalised_with_origin(text: str) -> tuple[str, list[tuple[int, int]]]:
    """nagisa's normalised text and, for each of its characters, the span of `text` it comes from."""
    full = _nagisa_preprocess(text)
    bounds = [position for position in range(len(text)) if position == 0 or _starts_cluster(text[position])]
    pieces = _normalise_pieces(text, bounds)
    if "".join(piece for _, _, piece in pieces) != full:
        # Normalisation joined characters across a presumed boundary: keep only exact boundaries.
        bounds = [
            position
            for position in range(len(text))
            if position == 0
            or _nagisa_preprocess(text[:position]) + _nagisa_preprocess(text[position:]) == full
        ]
        pieces = _normalise_pieces(text, bounds)
        if "".join(piece for _, _, piece in pieces) != full:
            pieces = [(0, len(text), full)] if text else []
    origin: list[tuple[int, int]] = []
    for start, end, piece in pieces:
        origin.extend([(start, end)] * len(piece))
    return full, origin


def _normalise_pieces(text: str, bounds: list[int]) -> list[tuple[int, int, str]]:
    pieces: list[tuple[int, int, str]] = []
    for start, end in zip(bounds, bounds[1:] + [len(text)]):
        whole = _nagisa_preprocess(text[start:end])
        # A mark that did not combine with the character before it (a half-width voiced mark after a
        # kanji) is a piece of its own: split where normalising the parts apart changes nothing.
        cuts = [start] + [
            cut
            for cut in range(start + 1, end)
            if _nagisa_preprocess(text[start:cut]) + _nagisa_preprocess(text[cut:end]) == whole
        ]
        parts = [(a, b, _nagisa_preprocess(text[a:b])) for a, b in zip(cuts, cuts[1:] + [end])]
        if len(parts) > 1 and "".join(part for _, _, part in parts) == whole:
            pieces.extend(parts)
        else:
            pieces.append((start, end, whole))
    return pieces


def _split_japanese(text: str, nagisa: object) -> list[Item]:
    words = nagisa.tagging(text).words
    source, origin = _normalised_with_origin(text.rstrip())
    return _items_from_pieces(source, words, origin.__getitem__)


_HIRAGANA = "hiragana"
_KATAKANA = "katakana"
_KANJI = "kanji"
_OTHER = "other"


def _japanese_script(ch: str) -> str:
    code = ord(ch)
    if is_cjk(ch) or ch in "々〆":
        return _KANJI
    if 0x3041 <= code <= 0x309F:
        return _HIRAGANA
    if 0x30A0 <= code <= 0x30FF or 0x31F0 <= code <= 0x31FF or 0xFF66 <= code <= 0xFF9F:
        return _KATAKANA
    return _OTHER


def _split_japanese_fallback(text: str) -> list[Item]:
    """Without nagisa: maximal runs of kept characters of one script (kanji, hiragana, katakana, other)."""
    items: list[Item] = []
    run_start = -1
    run_script = ""
    for position, ch in enumerate(text + " "):
        script = _japanese_script(ch) if position < len(text) and is_kept(ch) else ""
        if run_start >= 0 and script != run_script:
            items.append(Item(text[run_start:position], run_start, position))
            run_start = -1
        if script and run_start < 0:
            run_start, run_script = position, script
    return items


def _split_korean(text: str, tokenizer: object) -> list[Item]:
    return _items_from_pieces(text, tokenizer.tokenize(text), _identity_origin)


def _split_korean_fallback(text: str) -> list[Item]:
    """Without soynlp or the dictionary: the kept characters of each whitespace word."""
    items: list[Item] = []
    for word in _whitespace_words(text):
        start, end = word
        kept = [position for position in range(start, end) if is_kept(text[position])]
        if kept:
            items.append(Item("".join(text[p] for p in kept), kept[0], kept[-1] + 1))
    return items


def _whitespace_words(text: str) -> list[tuple[int, int]]:
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


def split_items(text: str, language: str | None) -> list[Item]:
    """The items Qwen3-ForcedAligner times for `text`, with the spans of `text` they come from.

    `language` is a canonical language name ("English", "Japanese", "Korean", ...; compared without
    regard to case, as the official processor does) or None for the whitespace split. The item texts
    are the official processor's word list, unless its tokenizer for the language is missing (see
    split_fallback_reason).
    """
    key = _language_key(language)
    if key == "japanese":
        nagisa, _ = _nagisa()
        return _split_japanese(text, nagisa) if nagisa is not None else _split_japanese_fallback(text)
    if key == "korean":
        tokenizer, _ = _korean_tokenizer()
        return _split_korean(text, tokenizer) if tokenizer is not None else _split_korean_fallback(text)
    return _split_space_language(text)


# --- display spans ----------------------------------------------------------------------------------


def _is_opening(ch: str) -> bool:
    """Punctuation that belongs to the word after it: opening brackets and quotes, ¿ and ¡."""
    return ch in "¿¡" or unicodedata.category(ch) in ("Ps", "Pi")


def _split_gap(text: str, start: int, end: int) -> tuple[int, int]:
    """Share text[start:end], the characters between two items, out between them.

    Returns (end of the first item's span, start of the second's). Punctuation glued to the first
    item and chunks standing alone between spaces go to the first; punctuation glued to the second
    and the opening punctuation right before it go to the second.
    """
    chunks = [(start + a, start + b) for a, b in _whitespace_words(text[start:end])]
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
    leading = _whitespace_words(text[: starts[0]])
    if leading:
        starts[0] = leading[0][0]
    trailing = _whitespace_words(text[ends[-1] :])
    if trailing:
        ends[-1] = ends[-1] + trailing[-1][1]
    for index in range(count - 1):
        ends[index], starts[index + 1] = _split_gap(text, ends[index], starts[index + 1])
    return list(zip(starts, ends))


# --- timestamps -------------------------------------------------------------------------------------


def fix_timestamps(values: Sequence[float]) -> list[int]:
    """Repair predicted timestamps (ms) that go backwards, exactly as the official `fix_timestamp`.

    The longest non-decreasing subsequence is kept as it is; the official choice among equally long
    ones is reproduced (it ends at the first index reaching the maximal length, and each element's
    predecessor is the earliest one giving it its length). A run of at most two other values takes the
    nearer kept neighbour (the left one on a tie), a longer run is spaced evenly between its kept
    neighbours (or copies the one neighbour at an end). Every value is then truncated with int().
    O(n log n). An empty input gives [] (the official function raises ValueError there); NaN is
    refused with ValueError.
    """
    data = values.tolist() if hasattr(values, "tolist") else list(values)
    count = len(data)
    if count == 0:
        return []
    if any(value != value for value in data):
        raise ValueError("fix_timestamps: NaN among the timestamps")

    # For each length L, the indices whose longest non-decreasing run ending there has length L, in
    # index order; their values strictly decrease (an equal or larger later one would be longer), so
    # the earliest index with a value <= v is found by bisection on the negated values.
    by_length_index: list[list[int]] = []
    by_length_negated: list[list[float]] = []
    tails: list[float] = []  # the smallest (= latest) value of each length, non-decreasing in length
    parent = [-1] * count
    best_length = 0
    best_end = 0
    for index, value in enumerate(data):
        length = bisect.bisect_right(tails, value) + 1
        if length > 1:
            candidates = by_length_negated[length - 2]
            parent[index] = by_length_index[length - 2][bisect.bisect_left(candidates, -value)]
        if length > len(tails):
            tails.append(value)
            by_length_index.append([index])
            by_length_negated.append([-value])
        else:
            tails[length - 1] = value
            by_length_index[length - 1].append(index)
            by_length_negated[length - 1].append(-value)
        if length > best_length:
            best_length, best_end = length, index

    normal = [False] * count
    index = best_end
    while index != -1:
        normal[index] = True
        index = parent[index]

    result = list(data)
    start = 0
    while start < count:
        if normal[start]:
            start += 1
            continue
        stop = start
        while stop < count and not normal[stop]:
            stop += 1
        left = result[start - 1] if start > 0 else None
        right = result[stop] if stop < count else None
        run = stop - start
        for k in range(start, stop):
            if left is None:
                result[k] = right
            elif right is None:
                result[k] = left
            elif run <= 2:
                result[k] = left if (k - (start - 1)) <= (stop - k) else right
            else:
                step = (right - left) / (run + 1)
                result[k] = left + step * (k - start + 1)
        start = stop
    return [int(value) for value in result]


def word_times(classes: Sequence[int], segment_time_ms: float, n_items: int) -> list[tuple[float, float]]:
    """(start, end) in seconds for each of `n_items` items from the aligner's timestamp classes.

    As the official aligner: each class times `segment_time_ms` in float32 is a time in ms; the
    times are repaired with fix_timestamps; item i gets the (2i)th and (2i+1)th, in seconds rounded to
    3 decimals. `classes` holds the predictions at the prompt's timestamp tokens, 2 per item (the
    prompt of a text without items still has 2; those, or none, are accepted for n_items == 0).
    Raises ValueError when the count is not that.
    """
    import numpy as np

    if n_items < 0:
        raise ValueError(f"word_times: n_items must be >= 0, got {n_items}")
    count = len(classes)
    if n_items == 0:
        if count not in (0, 2):
            raise ValueError(f"word_times: a text without items has 2 timestamp classes, got {count}")
        return []
    if count != 2 * n_items:
        raise ValueError(
            f"word_times: {n_items} items need 2 * {n_items} = {2 * n_items} timestamp classes, got {count}"
        )
    milliseconds = np.asarray(classes, dtype=np.float32) * np.float32(segment_time_ms)
    fixed = fix_timestamps(milliseconds.tolist())
    return [
        (round(fixed[2 * index] / 1000.0, 3), round(fixed[2 * index + 1] / 1000.0, 3))
        for index in range(n_items)
    ]
