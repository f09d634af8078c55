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

`fix_timestamps` and `word_times` (timestamps.py) turn the predicted classes into times exactly as the
official implementation does; `display_spans` is in spans.py. Both are importable from here too.
"""

from __future__ import annotations

import importlib
import threading
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mlx_qwen3asr.text.korean_dictionary import KoreanDictionaryError, korean_dictionary_bytes
from mlx_qwen3asr.text.spans import display_spans, whitespace_words
from mlx_qwen3asr.text.timestamps import fix_timestamps, word_times

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


def _optional(name: str, loader: Callable[[], object], fallback: str) -> tuple[object | None, str | None]:
    """The optional tokenizer, or None with the reason it is missing and what is done instead."""
    found, reason = _load_once(name, loader)
    return found, None if reason is None else f"{reason}; {fallback}"


def _nagisa() -> tuple[object | None, str | None]:
    return _optional(
        "nagisa", _load_nagisa, "Japanese is split into runs of one script (kanji, hiragana, katakana, other)"
    )


def _korean_tokenizer() -> tuple[object | None, str | None]:
    return _optional("soynlp", _load_korean_tokenizer, "Korean is split at whitespace only")


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
    for word in whitespace_words(text):
        start, end = word
        kept = [position for position in range(start, end) if is_kept(text[position])]
        if kept:
            items.append(Item("".join(text[p] for p in kept), kept[0], kept[-1] + 1))
    return items


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


__all__ = [
    "Item",
    "display_spans",
    "fix_timestamps",
    "is_cjk",
    "is_kept",
    "official_split_available",
    "read_korean_scores",
    "split_fallback_reason",
    "split_items",
    "word_times",
]
