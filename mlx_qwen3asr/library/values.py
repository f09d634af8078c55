"""The values a library stores, checked and made ready: titles, speaker labels, options, a transcript's
content (each segment with its integer id), new words from re-timing, and a revision's one-line summary.
Each check raises LibraryError with what is wrong."""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from mlx_qwen3asr.library.errors import LibraryError
from mlx_qwen3asr.runtime.messages import one_line
from mlx_qwen3asr.text.output import join_texts

__all__ = [
    "CONTROL_CHARS",
    "ERROR_CHARS",
    "PREVIEW_CHARS",
    "SEGMENT_TEXT_CHARS",
    "SPEAKER_CHARS",
    "SUMMARY_CHARS",
    "TITLE_CHARS",
    "checked_content",
    "checked_words",
    "clean_title",
    "dumps",
    "edits_by_id",
    "finite",
    "new_id",
    "checked_options",
    "revision_summary",
    "segment_row",
    "clean_speaker_label",
    "speakers_in_order",
]

TITLE_CHARS = 500
PREVIEW_CHARS = 200
SPEAKER_CHARS = 100
SEGMENT_TEXT_CHARS = 20_000
ERROR_CHARS = 2_000
SUMMARY_CHARS = 200
# Keys a stored transcript's dict carries beside its content; content never holds them.
_META_KEYS = frozenset({"id", "title", "created", "updated", "revision", "audio", "model", "options"})
# Control characters, line separators and bidirectional overrides: never kept in a title, label or text.
CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]+")


def clean_title(title: str, limit: int = TITLE_CHARS) -> str:
    """A title fit to show and store: control characters, line separators and bidirectional overrides
    become spaces, runs of whitespace one space, the ends trimmed, and at most `limit` characters kept
    (a longer title is cut, not refused). May be empty."""
    if not isinstance(title, str):
        raise LibraryError(f"a title is a string, not {type(title).__name__}")
    # Enough of a huge title to fill `limit` characters after cleaning, without scanning all of it.
    head = title[: limit * 8 + 64]
    return " ".join(CONTROL_CHARS.sub(" ", head).split())[:limit]


def clean_speaker_label(value: Any, what: str) -> str | None:
    """A speaker label the user gave, cleaned as titles are (None stays None). (A speaker's label from its
    number is diarize.speaker_label.)"""
    if value is None:
        return None
    if not isinstance(value, str):
        raise LibraryError(f"{what} is a string or null, not {type(value).__name__}")
    label = clean_title(value, SPEAKER_CHARS)
    return label or None


def new_id() -> str:
    """A fresh id for a transcript or job: 12 hex digits, never taken from user input."""
    return uuid.uuid4().hex[:12]


def dumps(value: Any) -> str:
    """Compact JSON text, non-ASCII characters kept as they are."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def finite(value: Any, what: str) -> float:
    """The value as a float when it is a finite int or float (not a bool); else LibraryError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise LibraryError(f"{what} must be a finite number, got {value!r}")
    return float(value)


def checked_options(options: Mapping[str, Any] | None) -> str:
    """A transcript's or job's options as JSON text ("{}" for None)."""
    if options is None:
        return "{}"
    if not isinstance(options, Mapping):
        raise LibraryError(f"options must be a mapping, not {type(options).__name__}")
    try:
        return dumps(dict(options))
    except (TypeError, ValueError) as e:
        raise LibraryError(f"options are not JSON: {one_line(e)}") from None


def checked_content(content: Mapping[str, Any]) -> dict[str, Any]:
    """A transcript's content made ready to store: a deep copy through JSON (tuples become lists), the
    library's own keys dropped, each segment checked and given an integer "id" where it has none
    (0..n-1 for a transcript without ids; after the largest id where some have one), and "text" made
    from the segments where it is missing."""
    if not isinstance(content, Mapping):
        raise LibraryError(f"a transcript's content is a mapping, not {type(content).__name__}")
    try:
        doc = json.loads(dumps(dict(content)))
    except (TypeError, ValueError) as e:
        raise LibraryError(f"the transcript is not JSON: {one_line(e)}") from None
    for key in _META_KEYS:
        doc.pop(key, None)
    segments = doc.get("segments", [])
    if not isinstance(segments, list):
        raise LibraryError("the transcript's segments are not a list")
    doc["segments"] = segments
    seen: set[int] = set()
    for k, seg in enumerate(segments):
        if not isinstance(seg, dict):
            raise LibraryError(f"segments[{k}] is not an object")
        if not isinstance(seg.get("text"), str):
            raise LibraryError(f"segments[{k}].text is not a string")
        finite(seg.get("start"), f"segments[{k}].start")
        finite(seg.get("end"), f"segments[{k}].end")
        if seg.get("speaker") is not None and not isinstance(seg["speaker"], str):
            raise LibraryError(f"segments[{k}].speaker is not a string")
        words = seg.get("words", [])
        if not isinstance(words, list) or not all(isinstance(w, dict) for w in words):
            raise LibraryError(f"segments[{k}].words is not a list of objects")
        sid = seg.get("id")
        if sid is None:
            continue
        if isinstance(sid, bool) or not isinstance(sid, int) or sid < 0 or sid in seen:
            raise LibraryError(f"segments[{k}].id {sid!r} is not a new whole number")
        seen.add(sid)
    following = max(seen) + 1 if seen else 0
    for seg in segments:
        if seg.get("id") is None:
            seg["id"] = following
            following += 1
    if not isinstance(doc.get("language"), str):
        doc["language"] = ""
    if not isinstance(doc.get("text"), str):
        doc["text"] = join_texts([s["text"] for s in segments], doc["language"])
    return doc


def segment_row(seg: Mapping[str, Any]) -> tuple[float, float, str | None, str]:
    """A segment's columns in the segments table: start, end, speaker, text."""
    return float(seg["start"]), float(seg["end"]), seg.get("speaker"), seg["text"]


def revision_summary(parts: Sequence[str]) -> str:
    """One line saying what a revision changed."""
    if len(parts) > 4:
        parts = [*parts[:3], f"{len(parts) - 3} more changes"]
    return one_line(", ".join(parts), SUMMARY_CHARS) or "no change"


def speakers_in_order(segments: Sequence[Mapping[str, Any]]) -> list[str]:
    """The speaker labels of the segments and their words, in order of first appearance."""
    labels: dict[str, None] = {}
    for seg in segments:
        for label in [seg.get("speaker"), *(w.get("speaker") for w in seg.get("words") or [])]:
            if isinstance(label, str) and label:
                labels.setdefault(label, None)
    return list(labels)


def checked_words(given: Any, seg: Mapping[str, Any], where: str) -> list[dict[str, Any]]:
    """A segment's new words (from re-timing) checked: each has its text and a finite start and end;
    a missing char_start/char_end is found in the segment's text, a missing speaker is the segment's."""
    if not isinstance(given, list):
        raise LibraryError(f"{where} is not a list of words")
    text = seg["text"]
    words: list[dict[str, Any]] = []
    at = 0
    for k, w in enumerate(given):
        if not isinstance(w, Mapping) or not isinstance(w.get("text"), str):
            raise LibraryError(f"{where}[{k}] is not a word with a text")
        word = json.loads(dumps(dict(w)))
        word["start"] = finite(w.get("start"), f"{where}[{k}].start")
        word["end"] = finite(w.get("end"), f"{where}[{k}].end")
        if not (isinstance(w.get("char_start"), int) and isinstance(w.get("char_end"), int)):
            found = text.find(word["text"], at)
            word["char_start"], word["char_end"] = (
                (found, found + len(word["text"])) if found >= 0 else (0, 0)
            )
        at = max(at, word["char_end"])
        word.setdefault("speaker", seg.get("speaker"))
        word.setdefault("overlap", False)
        words.append(word)
    return words


def edits_by_id(edits: Mapping[Any, Any] | None) -> list[tuple[Any, Any]]:
    """The (segment id, edit) pairs of a mapping, whole-number ids in order first, any others after."""
    items = list((edits or {}).items())
    return sorted(items, key=lambda item: (0, item[0], "") if type(item[0]) is int else (1, 0, repr(item[0])))
