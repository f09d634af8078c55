"""A library's transcription jobs: each job's row (status, progress, error, the transcript it made) and
its audio, kept in jobs/ until the job is finished. Finishing a job adds its transcript and ends the job in
one transaction. The JobRunner that runs them is in jobs.py.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mlx_qwen3asr.library.errors import Conflict, LibraryError, NotFound
from mlx_qwen3asr.library.files import kept_file, place_audio, remove
from mlx_qwen3asr.library.transcripts import Transcripts
from mlx_qwen3asr.library.values import ERROR_CHARS, checked_content, checked_options, dumps, finite, new_id
from mlx_qwen3asr.runtime.messages import one_line

__all__ = ["JOB_STATUSES", "UNFINISHED_JOB_STATUSES", "JobsTable"]

JOB_STATUSES = ("queued", "running", "done", "failed", "cancelled")
UNFINISHED_JOB_STATUSES = ("queued", "running")
_JOB_FIELDS = frozenset({"status", "progress", "error", "transcript_id"})


class JobsTable(Transcripts):
    """The job methods of a library (see store.Library); a finished job's transcript is added as
    Transcripts.add adds one."""

    _JOB_COLUMNS = "id, status, created, updated, title, options, audio, progress, error, transcript_id"

    def _job(self, row: Sequence[Any]) -> dict[str, Any]:
        """A job as job() gives it, from a row of _JOB_COLUMNS."""
        jid, status, created, updated, title, options, audio, progress, error, transcript_id = row
        return {
            "id": jid,
            "status": status,
            "created": created,
            "updated": updated,
            "title": title,
            "options": json.loads(options or "{}"),
            "audio": kept_file(self.jobs_folder, audio) is not None,
            "progress": progress,
            "error": error,
            "transcript_id": transcript_id,
        }

    def add_job(
        self,
        *,
        title: str,
        options: Mapping[str, Any],
        audio: str | os.PathLike[str],
        move_audio: bool = True,
    ) -> str:
        """Queue a transcription job: its audio is moved (copied, without move_audio) into
        jobs/<id><suffix> and the job inserted with status "queued"; returns its id."""
        audio_path = Path(audio)
        title = self._title(title, audio_path.stem)
        options_json = checked_options(options)
        jid = new_id()
        placed = place_audio(audio_path, self.jobs_folder, jid, move=move_audio)
        now = time.time()
        try:
            with self.transaction() as conn:
                conn.execute(
                    f"INSERT INTO jobs ({self._JOB_COLUMNS}) VALUES (?, 'queued', ?, ?, ?, ?, ?, 0, NULL, NULL)",
                    (jid, now, now, title, options_json, placed.name),
                )
        except BaseException:
            remove(placed)
            raise
        if move_audio:
            remove(audio_path)
        return jid

    def job(self, jid: str) -> dict[str, Any] | None:
        """The job: {"id", "status", "created", "updated", "title", "options", "audio" (whether its
        audio is there), "progress", "error", "transcript_id"}; None when there is none of that id."""
        with self.reading() as conn:
            row = conn.execute(f"SELECT {self._JOB_COLUMNS} FROM jobs WHERE id = ?", (jid,)).fetchone()
        return None if row is None else self._job(row)

    def jobs(self, limit: int = 100, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
        """A page of jobs, newest first, and the number of jobs in all."""
        limit, offset = max(0, int(limit)), max(0, int(offset))
        with self.reading() as conn:
            rows = conn.execute(
                f"SELECT {self._JOB_COLUMNS} FROM jobs ORDER BY created DESC, id LIMIT ? OFFSET ?",
                (limit, offset),
            ).fetchall()
            total = conn.execute("SELECT count(*) FROM jobs").fetchone()[0]
        return [self._job(row) for row in rows], int(total)

    def unfinished_jobs(self) -> list[dict[str, Any]]:
        """The jobs queued or running (those a restarted server takes up again), oldest first."""
        with self.reading() as conn:
            rows = conn.execute(
                f"SELECT {self._JOB_COLUMNS} FROM jobs WHERE status IN ('queued', 'running') ORDER BY created, id"
            ).fetchall()
        return [self._job(row) for row in rows]

    def set_job(self, jid: str, **fields: Any) -> dict[str, Any]:
        """Change a job's status, progress, error and/or transcript_id; returns the job. Raises NotFound
        (no such job), TypeError (another field), LibraryError (a bad value)."""
        unknown = sorted(set(fields) - _JOB_FIELDS)
        if unknown:
            raise TypeError(f"set_job() cannot set {unknown[0]!r} (only {', '.join(sorted(_JOB_FIELDS))})")
        values: dict[str, Any] = {}
        if "status" in fields:
            if fields["status"] not in JOB_STATUSES:
                raise LibraryError(
                    f"a job's status is one of {', '.join(JOB_STATUSES)}, not {fields['status']!r}"
                )
            values["status"] = fields["status"]
        if "progress" in fields:
            values["progress"] = finite(fields["progress"], "progress")
        if "error" in fields:
            error = fields["error"]
            values["error"] = None if error is None else one_line(error, ERROR_CHARS)
        if "transcript_id" in fields:
            if fields["transcript_id"] is not None and not isinstance(fields["transcript_id"], str):
                raise LibraryError("transcript_id is a string or None")
            values["transcript_id"] = fields["transcript_id"]
        with self.transaction() as conn:
            assignments = ", ".join(f"{key} = ?" for key in [*values, "updated"])
            changed = conn.execute(
                f"UPDATE jobs SET {assignments} WHERE id = ?", (*values.values(), time.time(), jid)
            ).rowcount
            if not changed:
                raise NotFound(f"no job {jid!r}")
            row = conn.execute(f"SELECT {self._JOB_COLUMNS} FROM jobs WHERE id = ?", (jid,)).fetchone()
        return self._job(row)

    def job_audio(self, jid: str) -> Path | None:
        """The job's audio file, or None (no such job, or its audio is gone)."""
        return self.kept_audio("jobs", jid)

    def finish_job(
        self,
        jid: str,
        content: Mapping[str, Any],
        *,
        title: str,
        model: str | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> str:
        """Add the job's transcript and mark the job done, in one transaction; returns the transcript's id.

        The job's audio is first linked (or copied) into audio/; the transcript, its revision, its
        segments and the job's new state (done, progress 1, its transcript_id, no audio of its own) are
        committed together; only then is the job's file removed. A process killed at any point leaves
        the job unfinished with its audio, or the transcript with its audio (a leftover copy is an
        orphan that cleanup() removes). options: the transcript's (default: the job's). Raises NotFound
        (no such job) or Conflict (the job is not queued or running).
        """
        doc = checked_content(content)
        if model is not None and not isinstance(model, str):
            raise LibraryError(f"model must be a string, not {type(model).__name__}")
        job = self.job(jid)
        if job is None:
            raise NotFound(f"no job {jid!r}")
        if job["status"] not in UNFINISHED_JOB_STATUSES:
            raise Conflict(f"job {jid} is {job['status']}")
        title = self._title(title, job["title"])
        options_json = checked_options(options) if options is not None else dumps(job["options"])
        source = self.job_audio(jid)
        tid = new_id()
        placed = place_audio(source, self.audio_folder, tid, move=True) if source is not None else None
        try:
            with self.transaction() as conn:
                status = conn.execute("SELECT status FROM jobs WHERE id = ?", (jid,)).fetchone()
                if status is None:
                    raise NotFound(f"no job {jid!r}")
                if status[0] not in UNFINISHED_JOB_STATUSES:
                    raise Conflict(f"job {jid} is {status[0]}")
                self._insert(
                    conn,
                    tid,
                    doc,
                    title=title,
                    audio=placed.name if placed else None,
                    model=model,
                    options=options_json,
                    created=time.time(),
                )
                conn.execute(
                    "UPDATE jobs SET status = 'done', progress = 1, error = NULL, transcript_id = ?, audio = NULL,"
                    " updated = ? WHERE id = ?",
                    (tid, time.time(), jid),
                )
        except BaseException:
            remove(placed)
            raise
        remove(source)
        return tid

    def delete_job(self, jid: str) -> bool:
        """Remove a finished, failed or cancelled job and its audio; False when there is no such job.
        Raises Conflict for a job still queued or running (cancel it first)."""
        with self.transaction() as conn:
            row = conn.execute("SELECT status, audio FROM jobs WHERE id = ?", (jid,)).fetchone()
            if row is None:
                return False
            if row[0] in UNFINISHED_JOB_STATUSES:
                raise Conflict(f"job {jid} is {row[0]}: cancel it first")
            conn.execute("DELETE FROM jobs WHERE id = ?", (jid,))
        if row[1]:
            remove(self.jobs_folder / row[1])
        return True
