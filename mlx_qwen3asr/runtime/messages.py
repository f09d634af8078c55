"""Messages for people: an error's or a decoder's text made into one line."""

from __future__ import annotations

__all__ = ["one_line"]


def one_line(text: object, limit: int | None = None) -> str:
    """str(text) on one line: every run of whitespace (newlines, tabs, ...) becomes one space and the
    ends are trimmed, so that a multi-line exception or decoder message fits one line of a log.

    limit: the longest line wanted; a longer one is cut to limit - 3 characters followed by "...".
    """
    line = " ".join(str(text).split())
    if limit is None or len(line) <= limit:
        return line
    return line[: limit - 3] + "..."
