"""The library database's schema and its opening: numbered migrations, applied in order, each in one
transaction, and counted by PRAGMA user_version.

A database written by an older version is brought up to date when opened; one written by a newer version
is refused, and so is another program's (its application id, or tables in a database without a version).
An opened database runs in WAL mode (synchronous NORMAL, foreign keys on) with a busy timeout.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path

from mlx_qwen3asr.library.errors import LibraryError
from mlx_qwen3asr.runtime.messages import one_line

__all__ = ["APPLICATION_ID", "BUSY_TIMEOUT_SECONDS", "MIGRATIONS", "Migration", "open_database", "statements"]

# "MQ3A" in the database header: tells a library's database from another program's SQLite file.
APPLICATION_ID = 0x4D513341
BUSY_TIMEOUT_SECONDS = 10.0

# One step of the schema: SQL statements, or a function given the connection inside the step's transaction.
Migration = str | Callable[[sqlite3.Connection], None]

_SCHEMA_1 = f"""
PRAGMA application_id = {APPLICATION_ID};
CREATE TABLE transcripts (
    id TEXT PRIMARY KEY,
    title TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    revision INTEGER NOT NULL,
    audio TEXT,
    source TEXT,
    duration REAL,
    language TEXT,
    model TEXT,
    options TEXT NOT NULL DEFAULT '{{}}',
    segment_count INTEGER NOT NULL DEFAULT 0,
    preview TEXT NOT NULL DEFAULT ''
);
CREATE INDEX transcripts_by_created ON transcripts (created DESC, id);
CREATE TABLE revisions (
    transcript_id TEXT NOT NULL REFERENCES transcripts (id) ON DELETE CASCADE,
    revision INTEGER NOT NULL,
    created REAL NOT NULL,
    title TEXT NOT NULL,
    summary TEXT NOT NULL,
    content TEXT NOT NULL,
    PRIMARY KEY (transcript_id, revision)
);
CREATE TABLE segments (
    key INTEGER PRIMARY KEY,
    transcript_id TEXT NOT NULL REFERENCES transcripts (id) ON DELETE CASCADE,
    segment_id INTEGER NOT NULL,
    start REAL NOT NULL,
    "end" REAL NOT NULL,
    speaker TEXT,
    text TEXT NOT NULL,
    UNIQUE (transcript_id, segment_id)
);
"""

_SCHEMA_2_SEARCH = """
CREATE VIRTUAL TABLE segments_fts USING fts5 (
    text, content = 'segments', content_rowid = 'key', tokenize = 'trigram case_sensitive 0'
);
INSERT INTO segments_fts (segments_fts) VALUES ('rebuild');
CREATE TRIGGER segments_fts_insert AFTER INSERT ON segments BEGIN
    INSERT INTO segments_fts (rowid, text) VALUES (new.key, new.text);
END;
CREATE TRIGGER segments_fts_delete AFTER DELETE ON segments BEGIN
    INSERT INTO segments_fts (segments_fts, rowid, text) VALUES ('delete', old.key, old.text);
END;
CREATE TRIGGER segments_fts_update AFTER UPDATE OF text ON segments BEGIN
    INSERT INTO segments_fts (segments_fts, rowid, text) VALUES ('delete', old.key, old.text);
    INSERT INTO segments_fts (rowid, text) VALUES (new.key, new.text);
END;
"""

_SCHEMA_3_JOBS = """
CREATE TABLE jobs (
    id TEXT PRIMARY KEY,
    status TEXT NOT NULL CHECK (status IN ('queued', 'running', 'done', 'failed', 'cancelled')),
    created REAL NOT NULL,
    updated REAL NOT NULL,
    title TEXT NOT NULL,
    options TEXT NOT NULL DEFAULT '{}',
    audio TEXT,
    progress REAL NOT NULL DEFAULT 0,
    error TEXT,
    transcript_id TEXT REFERENCES transcripts (id) ON DELETE SET NULL
);
CREATE INDEX jobs_by_created ON jobs (created, id);
CREATE INDEX jobs_by_status ON jobs (status, created);
"""

# Migration n (1-based) brings a database from user_version n - 1 to n: SQL statements, or a function
# given the connection inside the migration's transaction. Never change a step once released; add one.
MIGRATIONS: list[Migration] = [
    _SCHEMA_1,  # 1: transcripts, their revisions, their segments
    _SCHEMA_2_SEARCH,  # 2: full-text search over the segments (FTS5, trigram), filled from those there
    _SCHEMA_3_JOBS,  # 3: transcription jobs that outlive the server
]


def statements(script: str) -> list[str]:
    """The SQL statements of a script, each complete (a trigger's body stays in one piece)."""
    out: list[str] = []
    buffer = ""
    for piece in script.split(";"):
        buffer += piece + ";"
        if sqlite3.complete_statement(buffer):
            if buffer.strip(" \t\r\n;"):
                out.append(buffer.strip())
            buffer = ""
    rest = buffer[:-1].strip()
    if rest:
        out.append(rest)
    return out


def open_database(path: Path, migrations: Sequence[Migration]) -> sqlite3.Connection:
    """A connection to the library database at `path` (created if missing), checked to be a library's,
    set up, and brought up to len(migrations). Shared by threads (check_same_thread off) and in autocommit
    mode: the caller opens each transaction. Raises LibraryError when the file is not a usable library
    database; the connection is closed whenever it is not returned."""
    conn: sqlite3.Connection | None = None
    try:
        conn = sqlite3.connect(
            str(path), timeout=BUSY_TIMEOUT_SECONDS, check_same_thread=False, isolation_level=None
        )
        _set_up(conn, path, migrations)
    except BaseException as e:
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                conn.close()
        if isinstance(e, sqlite3.Error):
            raise LibraryError(f"{path}: not a usable library database: {one_line(e)}") from None
        raise
    return conn


def _set_up(conn: sqlite3.Connection, path: Path, migrations: Sequence[Migration]) -> None:
    """Check the database is a library's, set it up, and apply the migrations it lacks."""
    conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_SECONDS * 1000)}")
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    app = conn.execute("PRAGMA application_id").fetchone()[0]
    if app not in (0, APPLICATION_ID):
        raise LibraryError(f"{path}: not a library database (another program's: application id {app})")
    if version == 0 and conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
        raise LibraryError(f"{path}: not a library database (it holds other tables)")
    _check_version(path, version, migrations)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("PRAGMA foreign_keys = ON")
    if version < len(migrations):
        _migrate(conn, path, migrations)


def _check_version(path: Path, version: int, migrations: Sequence[Migration]) -> None:
    """Refuse a database whose schema is newer than the last of the migrations."""
    if version > len(migrations):
        raise LibraryError(
            f"{path}: written by a newer version of mlx-qwen3asr (schema {version}; this version "
            f"knows schema {len(migrations)}): upgrade to open it"
        )


def _migrate(conn: sqlite3.Connection, path: Path, migrations: Sequence[Migration]) -> None:
    """Apply the migrations the database lacks, each in its own transaction (another process
    opening the library at the same time waits, then finds the work done)."""
    while True:
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            _check_version(path, version, migrations)
            if version == len(migrations):
                conn.execute("COMMIT")
                return
            step = migrations[version]
            try:
                if callable(step):
                    step(conn)
                else:
                    for statement in statements(step):
                        conn.execute(statement)
            except sqlite3.Error as e:
                raise LibraryError(
                    f"{path}: migration {version + 1} of the library schema failed: {one_line(e)}"
                ) from None
            conn.execute(f"PRAGMA user_version = {version + 1}")
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
