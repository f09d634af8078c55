"""An opened library folder: its folders, its database connection, its transactions.

One connection per library, in WAL mode, shared by the library's threads under a lock; every change is
one transaction, so a process killed at any moment leaves each change whole or absent. The files in the
folder that no row names are removed when it is opened (files.remove_orphans).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from mlx_qwen3asr.library.errors import LibraryError
from mlx_qwen3asr.library.files import AUDIO_FOLDER, JOBS_FOLDER, ORPHAN_SECONDS, kept_file, remove_orphans
from mlx_qwen3asr.library.schema import Migration, open_database
from mlx_qwen3asr.runtime.messages import one_line

__all__ = ["DATABASE_NAME", "Database"]

DATABASE_NAME = "library.sqlite3"


class Database:
    """A library folder (created if missing) with its database opened and brought up to `migrations`;
    the files no row names are cleaned up. Thread-safe; close() it when done.

    Raises LibraryError when the folder cannot be a library: a file in the way, a database that cannot
    be read or is another program's, one written by a newer schema than `migrations` reaches.
    """

    def __init__(self, folder: str | os.PathLike[str], migrations: Sequence[Migration]) -> None:
        self.folder = Path(folder).expanduser()
        self.path = self.folder / DATABASE_NAME
        self.audio_folder = self.folder / AUDIO_FOLDER
        self.jobs_folder = self.folder / JOBS_FOLDER
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        for path in (self.folder, self.audio_folder, self.jobs_folder):
            if path.exists() and not path.is_dir():
                raise LibraryError(f"{path}: not a library folder (a file is in the way)")
            try:
                path.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise LibraryError(
                    f"{path}: cannot create the library folder: {one_line(e.strerror or e)}"
                ) from None
        if self.path.exists() and not self.path.is_file():
            raise LibraryError(f"{self.path}: not a library database (not a file)")
        self._conn = open_database(self.path, migrations)
        self.cleanup()

    def close(self) -> None:
        """Close the database (the library cannot be used afterwards)."""
        with self._lock:
            if self._conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.close()
                self._conn = None

    @property
    def schema_version(self) -> int:
        """The schema version of the open database (len(MIGRATIONS) once opened)."""
        with self.reading() as conn:
            return int(conn.execute("PRAGMA user_version").fetchone()[0])

    def _connection(self) -> sqlite3.Connection:
        """The open connection; LibraryError once the library is closed."""
        if self._conn is None:
            raise LibraryError(f"{self.folder}: the library is closed")
        return self._conn

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """The connection inside one write transaction (BEGIN IMMEDIATE: waits up to the busy timeout
        for another writer), under the library's lock: committed when the block ends, rolled back if it
        raises. An SQLite error becomes a LibraryError."""
        with self._lock:
            conn = self._connection()
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as e:
                raise LibraryError(f"{self.path}: cannot write: {one_line(e)}") from None
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException as e:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                if isinstance(e, sqlite3.Error):
                    raise LibraryError(f"{self.path}: the change was not saved: {one_line(e)}") from None
                raise

    @contextlib.contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        """The connection inside one read transaction (a consistent snapshot), under the library's lock.
        An SQLite error that leaves the block becomes a LibraryError."""
        with self._lock:
            conn = self._connection()
            conn.execute("BEGIN")
            try:
                yield conn
            except sqlite3.Error as e:
                raise LibraryError(f"{self.path}: cannot read: {one_line(e)}") from None
            finally:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("COMMIT")

    def kept_audio(self, table: str, key: str) -> Path | None:
        """The audio file a row of `table` ("transcripts" or "jobs") names, or None (no such row, or its
        audio is gone)."""
        folder = {"transcripts": self.audio_folder, "jobs": self.jobs_folder}[table]
        with self.reading() as conn:
            row = conn.execute(f"SELECT audio FROM {table} WHERE id = ?", (key,)).fetchone()
        return None if row is None else kept_file(folder, row[0])

    def cleanup(self, *, min_age: float = ORPHAN_SECONDS, now: float | None = None) -> list[Path]:
        """Remove the files in audio/ and jobs/ that no transcript or job names and that nothing touched
        for min_age seconds (left by a process killed between placing a file and committing its row,
        or between committing a deletion and removing the file); returns those removed. Runs when the
        library is opened."""
        now = time.time() if now is None else now
        with self.reading() as conn:
            named = {
                self.audio_folder: {
                    r[0] for r in conn.execute("SELECT audio FROM transcripts WHERE audio IS NOT NULL")
                },
                self.jobs_folder: {
                    r[0] for r in conn.execute("SELECT audio FROM jobs WHERE audio IS NOT NULL")
                },
            }
        return remove_orphans(named, min_age, now)
