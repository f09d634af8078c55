"""The transcript library's store: one folder holding an SQLite database and the audio of its transcripts.

    <folder>/library.sqlite3   transcripts, their revisions, their segments (and the search index), jobs
    <folder>/audio/            each transcript's audio, named <transcript id><suffix>
    <folder>/jobs/             the audio of transcription jobs not finished yet, <job id><suffix>

The database runs in WAL mode with one connection per Library, shared by its threads under a lock; every
change is one transaction, so a process killed at any moment leaves each transcript whole or absent.
Audio files are placed before the rows that name them are committed and removed after the rows that
named them are gone: a file no row names is an orphan, removed when the library is opened (once it is a
minute old, so that another process's file about to be committed is left alone).

The schema is built by numbered migrations (MIGRATIONS), applied in order, each in one transaction, and
counted by PRAGMA user_version: a library written by an older version is brought up to date when opened,
one written by a newer version is refused.

A transcript's content is the dict Transcription.to_dict() returns, each segment with an integer "id"
that stays with it through every edit. Every change makes a new revision holding the whole content, so
any earlier state can be read back or restored (as a new revision: nothing is ever lost).

Library is built in layers, each in its own module: database.Database (the folder, the connection, the
transactions, orphan cleanup; the schema in schema.py, the audio files in files.py), then
transcripts.Transcripts (transcripts and revisions), then jobs_table.JobsTable (jobs). This module puts
them together and gives every name of the library's store.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

from mlx_qwen3asr.library.database import DATABASE_NAME
from mlx_qwen3asr.library.errors import Conflict, LibraryError, NotFound, UnknownSegment
from mlx_qwen3asr.library.files import AUDIO_FOLDER, JOBS_FOLDER, ORPHAN_SECONDS
from mlx_qwen3asr.library.jobs_table import JOB_STATUSES, UNFINISHED_JOB_STATUSES, JobsTable
from mlx_qwen3asr.library.schema import APPLICATION_ID, BUSY_TIMEOUT_SECONDS, MIGRATIONS
from mlx_qwen3asr.library.values import (
    ERROR_CHARS,
    PREVIEW_CHARS,
    SEGMENT_TEXT_CHARS,
    SPEAKER_CHARS,
    SUMMARY_CHARS,
    TITLE_CHARS,
    clean_title,
)

__all__ = [
    "APPLICATION_ID",
    "AUDIO_FOLDER",
    "BUSY_TIMEOUT_SECONDS",
    "DATABASE_NAME",
    "DEFAULT_FOLDER_ENV",
    "ERROR_CHARS",
    "JOBS_FOLDER",
    "JOB_STATUSES",
    "MIGRATIONS",
    "ORPHAN_SECONDS",
    "PREVIEW_CHARS",
    "SEGMENT_TEXT_CHARS",
    "SPEAKER_CHARS",
    "SUMMARY_CHARS",
    "TITLE_CHARS",
    "UNFINISHED_JOB_STATUSES",
    "Conflict",
    "Library",
    "LibraryError",
    "NotFound",
    "UnknownSegment",
    "clean_title",
    "default_folder",
]

DEFAULT_FOLDER_ENV = "MLXASR_LIBRARY"


def default_folder() -> Path:
    """The library folder when none is given: $MLXASR_LIBRARY, else the user's data folder for
    mlx-qwen3asr (platformdirs: ~/Library/Application Support/mlx-qwen3asr on macOS,
    ~/.local/share/mlx-qwen3asr on Linux)."""
    configured = os.environ.get(DEFAULT_FOLDER_ENV, "").strip()
    if configured:
        return Path(configured).expanduser()
    return Path(platformdirs.user_data_dir("mlx-qwen3asr", appauthor=False))


class Library(JobsTable):
    """A transcript library in `folder` (created if missing), opened and brought up to the current
    schema (this module's MIGRATIONS, read when the library is opened). Thread-safe; close() it (or use
    it as a context manager) when done.

    Raises LibraryError when the folder cannot be a library: a file in the way, a database that cannot
    be read or is another program's, one written by a newer schema than this version knows.
    """

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        super().__init__(folder, MIGRATIONS)

    def __enter__(self) -> Library:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Library({str(self.folder)!r})"
