"""What the model's output becomes: the language and text of a segment, runaway repetitions collapsed,
and the transcripts of several segments joined."""

from __future__ import annotations

from mlx_qwen3asr.text.languages import CJK_NO_SPACE_LANGUAGES, normalize_language_case, resolve_language

__all__ = [
    "fix_repetitions",
    "fix_repetitions_flag",
    "join_texts",
    "parse_output",
]


def _collapse_char_runs(text: str, threshold: int) -> str:
    pieces: list[str] = []
    i, n = 0, len(text)
    while i < n:
        j = i + 1
        while j < n and text[j] == text[i]:
            j += 1
        pieces.append(text[i] if j - i > threshold else text[i:j])
        i = j
    return "".join(pieces)


def _collapse_patterns(text: str, threshold: int, max_period: int = 20) -> str:
    # A run may only start where 2 * threshold characters remain (the reference scans that far).
    n = len(text)
    last_start = n - 2 * threshold
    pieces: list[str] = []
    i = 0
    while i <= last_start:
        end = -1
        # Longest period whose threshold copies still fit in the text.
        longest = min(max_period, (n - i) // threshold)
        for period in range(1, longest + 1):
            pattern = text[i : i + period]
            if all(text[i + r * period : i + (r + 1) * period] == pattern for r in range(1, threshold)):
                end = i + threshold * period
                while end + period <= n and text[end : end + period] == pattern:
                    end += period
                break
        if end < 0:
            pieces.append(text[i])
            i += 1
        else:
            pieces.append(text[i : i + period])
            i = end
    pieces.append(text[i:])
    return "".join(pieces)


def fix_repetitions_flag(text: str, threshold: int = 20) -> tuple[str, bool]:
    """Collapse runaway repetitions; return the text and whether anything was collapsed.

    A character repeated more than ``threshold`` times in a row becomes one character; then a
    pattern of 1..20 characters repeated at least ``threshold`` times becomes one copy.
    """
    if threshold < 1:
        raise ValueError(f"threshold must be >= 1, got {threshold}")
    fixed = _collapse_patterns(_collapse_char_runs(text, threshold), threshold)
    # Collapsing only ever removes characters, so a change shows as a shorter string.
    return fixed, len(fixed) != len(text)


def fix_repetitions(text: str, threshold: int = 20) -> str:
    return fix_repetitions_flag(text, threshold)[0]


_ASR_TEXT_TAG = "<asr_text>"
_LANGUAGE_PREFIX = "language "


def parse_output(raw: str | None, forced_language: str | None = None) -> tuple[str, str]:
    """Split decoded model output into ``(language, text)``.

    ``"language Chinese<asr_text>..."`` -> ``("Chinese", "...")``; ``"language None<asr_text>"``
    -> ``("", "")``; without the tag the whole output is text. A forced language is returned as
    is, with the whole output as text.
    """
    if raw is None:
        return "", ""
    s = str(raw).strip()
    if not s:
        return "", ""
    s = fix_repetitions(s)
    if forced_language:
        return forced_language, s
    if _ASR_TEXT_TAG not in s:
        return "", s.strip()
    meta, text = s.split(_ASR_TEXT_TAG, 1)
    text = text.strip()
    if "language none" in meta.lower():
        return "", text
    language = ""
    for line in meta.splitlines():
        line = line.strip()
        if line.lower().startswith(_LANGUAGE_PREFIX):
            value = line[len(_LANGUAGE_PREFIX) :].strip()
            if value:
                language = normalize_language_case(value)
            break
    return language, text


def _is_unspaced_script(ch: str) -> bool:
    """Han, kana, Thai and CJK punctuation: scripts written without spaces between words."""
    cp = ord(ch)
    return (
        0x0E00 <= cp <= 0x0E7F  # Thai
        or 0x2E80 <= cp <= 0x2FDF  # CJK radicals, Kangxi radicals
        or 0x3000 <= cp <= 0x30FF  # CJK symbols and punctuation, hiragana, katakana
        or 0x3100 <= cp <= 0x312F  # bopomofo
        or 0x31A0 <= cp <= 0x31FF  # bopomofo extended, CJK strokes, katakana extensions
        or 0x3200 <= cp <= 0x9FFF  # enclosed CJK, compatibility, ext A, unified ideographs
        or 0xF900 <= cp <= 0xFAFF  # compatibility ideographs
        or 0xFE30 <= cp <= 0xFE4F  # CJK compatibility forms
        or 0xFF00 <= cp <= 0xFF9F  # fullwidth forms, halfwidth katakana
        or 0xFFE0 <= cp <= 0xFFEF  # fullwidth signs
        or 0x1B000 <= cp <= 0x1B16F  # kana supplement/extended
        or 0x20000 <= cp <= 0x323AF  # ideograph extensions B..H
    )


def join_texts(texts: list[str], language: str | None = "") -> str:
    """Join per-segment transcripts: no separator for Chinese, Cantonese, Japanese and Thai, a
    space otherwise; for an unknown language decide at each boundary from the characters there."""
    pieces = [t.strip() for t in texts if t and t.strip()]
    try:
        name = resolve_language(language)
    except ValueError:
        name = None
    if name is not None:
        return ("" if name in CJK_NO_SPACE_LANGUAGES else " ").join(pieces)
    if not pieces:
        return ""
    out = [pieces[0]]
    for left, right in zip(pieces, pieces[1:], strict=False):
        if not (_is_unspaced_script(left[-1]) or _is_unspaced_script(right[0])):
            out.append(" ")
        out.append(right)
    return "".join(out)
