"""The committed segments' texts joined as they grow: join_texts of a list that only grows, kept per
joining rule, so that each step joins only the new segments' texts rather than all of them again."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlx_qwen3asr.text.languages import CJK_NO_SPACE_LANGUAGES, resolve_language
from mlx_qwen3asr.text.output import join_texts


class JoinedTexts:
    """join_texts of the texts of a growing list of segments, extended rather than rebuilt.

    The joining rule depends on the language (no space for Chinese, Japanese, ...; a space for others;
    decided at each boundary for an unknown one): one running text is kept per rule, each extended
    with the texts added since it was last asked for. Asking for fewer texts than a rule's running
    text holds builds that one again.
    """

    def __init__(self) -> None:
        self._joined: dict[str, tuple[int, str]] = {}  # rule -> (texts joined, their text)

    def text(self, segments: Sequence[Any], language: str | None, count: int | None = None) -> str:
        """join_texts of the texts of segments[:count] (all of them when None) for `language`; the
        segments (anything with a `text`) are only ever appended to."""
        count = len(segments) if count is None else count
        rule = _rule(language)
        done, joined = self._joined.get(rule, (0, ""))
        if done > count:
            done, joined = 0, ""
        if done < count:
            joined = join_texts([joined, *(s.text for s in segments[done:count])], language)
            self._joined[rule] = (count, joined)
        return joined


def _rule(language: str | None) -> str:
    """Which joining rule join_texts takes for a language: its separator ("" or " "), or "?" when it
    decides at each boundary (an unknown language)."""
    try:
        name = resolve_language(language)
    except ValueError:
        name = None
    if name is None:
        return "?"
    return "" if name in CJK_NO_SPACE_LANGUAGES else " "


__all__ = ["JoinedTexts"]
