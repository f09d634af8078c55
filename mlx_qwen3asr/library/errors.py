"""The transcript library's errors: each is a LibraryError (a ValueError), so one except clause catches
every refusal of the store, the search and the jobs."""

from __future__ import annotations

__all__ = ["Conflict", "LibraryError", "NotFound", "UnknownSegment"]


class LibraryError(ValueError):
    """The library cannot do what was asked: not a library, a bad argument, a failed write."""


class NotFound(LibraryError):
    """No transcript (or job, or revision) has that id."""


class Conflict(LibraryError):
    """The transcript or job changed meanwhile (another revision, a finished job)."""


class UnknownSegment(LibraryError, KeyError):
    """An edit names a segment id the transcript does not have."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""
