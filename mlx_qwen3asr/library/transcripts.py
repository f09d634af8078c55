"""A library's transcripts: adding one with its audio, reading it, listing them, changing one in a new
revision, reading and restoring its earlier revisions, deleting it.

A transcript's content is the dict Transcription.to_dict() returns, each segment with an integer "id"
that stays with it through every edit. Every change makes a new revision holding the whole content, so
any earlier state can be read back or restored (as a new revision: nothing is ever lost). The segments
table (and so the search index) follows the current revision.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mlx_qwen3asr.library.database import Database
from mlx_qwen3asr.library.edits import retext
from mlx_qwen3asr.library.errors import Conflict, LibraryError, NotFound, UnknownSegment
from mlx_qwen3asr.library.files import kept_file, place_audio, remove
from mlx_qwen3asr.library.values import (
    CONTROL_CHARS,
    PREVIEW_CHARS,
    SEGMENT_TEXT_CHARS,
    checked_content,
    checked_options,
    checked_words,
    clean_speaker_label,
    clean_title,
    dumps,
    edits_by_id,
    finite,
    new_id,
    revision_summary,
    segment_row,
    speakers_in_order,
)
from mlx_qwen3asr.text.output import join_texts

__all__ = ["Transcripts"]


class Transcripts(Database):
    """The transcript and revision methods of a library (see store.Library)."""

    def _insert(
        self,
        conn: sqlite3.Connection,
        tid: str,
        doc: dict[str, Any],
        *,
        title: str,
        audio: str | None,
        model: str | None,
        options: str,
        created: float,
    ) -> None:
        """Insert a transcript, its revision 1 and its segments (inside the caller's transaction)."""
        now = time.time()
        source = doc.get("source") if isinstance(doc.get("source"), str) else None
        duration = doc.get("duration")
        duration = (
            float(duration) if isinstance(duration, (int, float)) and not isinstance(duration, bool) else None
        )
        conn.execute(
            "INSERT INTO transcripts (id, title, created, updated, revision, audio, source, duration, language,"
            " model, options, segment_count, preview) VALUES (?, ?, ?, ?, 1, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                tid,
                title,
                created,
                now,
                audio,
                source,
                duration,
                doc["language"],
                model,
                options,
                len(doc["segments"]),
                doc["text"][:PREVIEW_CHARS],
            ),
        )
        conn.execute(
            "INSERT INTO revisions (transcript_id, revision, created, title, summary, content)"
            " VALUES (?, 1, ?, ?, 'added', ?)",
            (tid, now, title, dumps(doc)),
        )
        conn.executemany(
            'INSERT INTO segments (transcript_id, segment_id, start, "end", speaker, text) VALUES (?, ?, ?, ?, ?, ?)',
            [(tid, seg["id"], *segment_row(seg)) for seg in doc["segments"]],
        )

    def _title(self, title: str, *fallbacks: str | None) -> str:
        """The cleaned title, else the first fallback that cleans to something, else "Untitled"."""
        cleaned = clean_title(title)
        for candidate in fallbacks:
            if cleaned:
                break
            cleaned = clean_title(candidate) if isinstance(candidate, str) else ""
        return cleaned or "Untitled"

    def add(
        self,
        content: Mapping[str, Any],
        *,
        title: str,
        audio: str | os.PathLike[str] | None = None,
        move_audio: bool = False,
        model: str | None = None,
        options: Mapping[str, Any] | None = None,
        created: float | None = None,
    ) -> str:
        """Add a transcript (content: Transcription.to_dict()) with its audio; returns its new id.

        The audio is copied (moved, with move_audio) into audio/<id><suffix> before the transcript, its
        first revision and its segments are inserted in one transaction; if that fails, the copy is
        removed and a moved file stays where it was. An empty title becomes the audio file's (or the
        transcript's source's) name without its suffix, or "Untitled".
        """
        doc = checked_content(content)
        source_stem = Path(doc["source"]).stem if isinstance(doc.get("source"), str) else None
        audio_path = Path(audio) if audio is not None else None
        title = self._title(title, audio_path.stem if audio_path else None, source_stem)
        options_json = checked_options(options)
        if model is not None and not isinstance(model, str):
            raise LibraryError(f"model must be a string, not {type(model).__name__}")
        created = time.time() if created is None else finite(created, "created")
        tid = new_id()
        placed = place_audio(audio_path, self.audio_folder, tid, move=move_audio) if audio_path else None
        try:
            with self.transaction() as conn:
                self._insert(
                    conn,
                    tid,
                    doc,
                    title=title,
                    audio=placed.name if placed else None,
                    model=model,
                    options=options_json,
                    created=created,
                )
        except BaseException:
            remove(placed)
            raise
        if move_audio and audio_path is not None and placed is not None:
            remove(audio_path)
        return tid

    def _current(self, conn: sqlite3.Connection, tid: str) -> sqlite3.Row | tuple[Any, ...] | None:
        """The transcript's row with its current revision's content (what _stored() reads), or None."""
        return conn.execute(
            "SELECT t.title, t.created, t.updated, t.revision, t.audio, t.model, t.options, r.content"
            " FROM transcripts t JOIN revisions r ON r.transcript_id = t.id AND r.revision = t.revision"
            " WHERE t.id = ?",
            (tid,),
        ).fetchone()

    def _stored(
        self,
        tid: str,
        row: Sequence[Any],
        *,
        revision: int | None = None,
        title: str | None = None,
        updated: float | None = None,
        content: str | dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A transcript as get() gives it, from a _current() row; the keywords replace the row's values
        (content: JSON text, or an already parsed dict that is handed out as it is)."""
        t_title, created, t_updated, t_revision, audio, model, options, t_content = row
        return {
            "id": tid,
            "title": t_title if title is None else title,
            "created": created,
            "updated": t_updated if updated is None else updated,
            "revision": t_revision if revision is None else revision,
            "audio": kept_file(self.audio_folder, audio) is not None,
            "model": model,
            "options": json.loads(options or "{}"),
            **(
                content
                if isinstance(content, dict)
                else json.loads(t_content if content is None else content)
            ),
        }

    def get(self, tid: str) -> dict[str, Any] | None:
        """The transcript: {"id", "title", "created", "updated", "revision", "audio" (whether its audio
        is kept), "model", "options", **content}; None when there is none of that id."""
        if not isinstance(tid, str):
            return None
        with self.reading() as conn:
            row = self._current(conn, tid)
        return None if row is None else self._stored(tid, row)

    def list(self, limit: int = 50, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
        """A page of transcripts, newest first, as summaries (id, title, created, updated, revision,
        duration, language, segments: their number, preview: the first 200 characters of the text),
        and the number of transcripts in all."""
        limit, offset = max(0, int(limit)), max(0, int(offset))
        with self.reading() as conn:
            rows = conn.execute(
                "SELECT id, title, created, updated, revision, duration, language, segment_count, preview"
                " FROM transcripts ORDER BY created DESC, id LIMIT ? OFFSET ?",
                (limit, offset),
            ).fetchall()
            total = conn.execute("SELECT count(*) FROM transcripts").fetchone()[0]
        keys = (
            "id",
            "title",
            "created",
            "updated",
            "revision",
            "duration",
            "language",
            "segments",
            "preview",
        )
        return [dict(zip(keys, row)) for row in rows], int(total)

    def audio_path(self, tid: str) -> Path | None:
        """The transcript's audio file, or None (no such transcript, or no audio kept)."""
        return self.kept_audio("transcripts", tid)

    def _save(
        self,
        conn: sqlite3.Connection,
        tid: str,
        revision: int,
        title: str,
        old: Mapping[str, Any],
        new: dict[str, Any],
        summary: str,
    ) -> float:
        """Store `new` as the transcript's revision `revision` and bring its segment rows (and so the
        search index) in line with it (inside the caller's transaction); returns the revision's time."""
        now = time.time()
        conn.execute(
            "INSERT INTO revisions (transcript_id, revision, created, title, summary, content) VALUES (?, ?, ?, ?, ?, ?)",
            (tid, revision, now, title, summary, dumps(new)),
        )
        duration = new.get("duration")
        conn.execute(
            "UPDATE transcripts SET title = ?, updated = ?, revision = ?, duration = ?, language = ?,"
            " segment_count = ?, preview = ? WHERE id = ?",
            (
                title,
                now,
                revision,
                float(duration)
                if isinstance(duration, (int, float)) and not isinstance(duration, bool)
                else None,
                new.get("language") if isinstance(new.get("language"), str) else "",
                len(new.get("segments", [])),
                str(new.get("text", ""))[:PREVIEW_CHARS],
                tid,
            ),
        )
        before = {s["id"]: segment_row(s) for s in old.get("segments", [])}
        after = {s["id"]: segment_row(s) for s in new.get("segments", [])}
        gone = [(tid, sid) for sid in before if sid not in after]
        conn.executemany("DELETE FROM segments WHERE transcript_id = ? AND segment_id = ?", gone)
        for sid, row in after.items():
            if sid not in before:
                conn.execute(
                    'INSERT INTO segments (transcript_id, segment_id, start, "end", speaker, text) VALUES (?, ?, ?, ?, ?, ?)',
                    (tid, sid, *row),
                )
            elif before[sid] != row:
                start, end, speaker, text = row
                if before[sid][3] == text:  # leave the search index alone
                    conn.execute(
                        'UPDATE segments SET start = ?, "end" = ?, speaker = ? WHERE transcript_id = ? AND segment_id = ?',
                        (start, end, speaker, tid, sid),
                    )
                else:
                    conn.execute(
                        'UPDATE segments SET start = ?, "end" = ?, speaker = ?, text = ?'
                        " WHERE transcript_id = ? AND segment_id = ?",
                        (start, end, speaker, text, tid, sid),
                    )
        return now

    def _locked_row(self, conn: sqlite3.Connection, tid: str, expected_revision: int | None) -> Sequence[Any]:
        """The transcript's _current() row inside a write transaction; NotFound when there is none,
        Conflict when expected_revision is given and is not its revision."""
        row = self._current(conn, tid) if isinstance(tid, str) else None
        if row is None:
            raise NotFound(f"no transcript {tid!r}")
        if expected_revision is not None and expected_revision != row[3]:
            raise Conflict(
                f"transcript {tid} is at revision {row[3]}, not {expected_revision}: it changed meanwhile"
            )
        return row

    def update(
        self,
        tid: str,
        *,
        title: str | None = None,
        segments: Mapping[int, Mapping[str, Any]] | None = None,
        speaker_names: Mapping[str, str] | None = None,
        words: Mapping[int, Sequence[Mapping[str, Any]]] | None = None,
        expected_revision: int | None = None,
    ) -> dict[str, Any]:
        """Change a transcript in one new revision; returns it as get() does.

        title: the new title (cleaned; empty becomes "Untitled").
        segments: segment id -> {"text": ..., "speaker": ...} (either key). A new text is stripped and
            its words re-cut with edits.retext (unchanged words keep their times; a segment whose words
            got interpolated times goes from "aligned" to "estimated" timing), and the transcript's text
            is joined again from its segments (text.output.join_texts: no separator for Chinese,
            Japanese, Cantonese and Thai, a space otherwise). A new speaker applies to the segment's words.
        speaker_names: old label -> new name, everywhere (segments, words, the speakers list).
        words: segment id -> its new words (from re-timing); the segment's timing becomes "aligned".
        expected_revision: the revision the change was made against; another one raises Conflict.

        Raises NotFound (no such transcript), UnknownSegment (a KeyError: no such segment), Conflict,
        LibraryError (a bad value). A change that changes nothing makes no revision.
        """
        with self.transaction() as conn:
            row = self._locked_row(conn, tid, expected_revision)
            old_title, revision = row[0], row[3]
            old, new = json.loads(row[7]), json.loads(row[7])  # parsing twice is faster than deepcopy
            new_title = old_title
            parts: list[str] = []
            by_id = {s["id"]: s for s in new.get("segments", [])}

            def segment(sid: Any) -> dict[str, Any]:
                if sid not in by_id:
                    raise UnknownSegment(f"no segment {sid!r} in transcript {tid}")
                return by_id[sid]

            if title is not None:
                new_title = self._title(title)
                if new_title != old_title:
                    parts.append("title")
            texts_changed = speakers_changed = False
            for sid, edit in edits_by_id(segments):
                seg = segment(sid)
                if not isinstance(edit, Mapping) or not edit or set(edit) - {"text", "speaker"}:
                    raise LibraryError(f"the edit of segment {sid} changes its text and/or speaker")
                if "text" in edit:
                    text = edit["text"]
                    if not isinstance(text, str):
                        raise LibraryError(f"the text of segment {sid} is not a string")
                    text = CONTROL_CHARS.sub(" ", text).strip()
                    if len(text) > SEGMENT_TEXT_CHARS:
                        raise LibraryError(
                            f"the text of segment {sid} is longer than {SEGMENT_TEXT_CHARS} characters"
                        )
                    if text != seg["text"]:
                        timed = retext(seg["text"], seg.get("words") or [], text)
                        seg["text"], seg["words"] = text, timed.words
                        if timed.estimated and seg.get("timing") == "aligned":
                            seg["timing"] = "estimated"
                        parts.append(f"segment {sid} text")
                        texts_changed = True
                if "speaker" in edit:
                    speaker = clean_speaker_label(edit["speaker"], f"the speaker of segment {sid}")
                    if speaker != seg.get("speaker") or any(
                        w.get("speaker") != speaker for w in seg.get("words") or []
                    ):
                        seg["speaker"] = speaker
                        for w in seg.get("words") or []:
                            w["speaker"] = speaker
                        parts.append(f"segment {sid} speaker")
                        speakers_changed = True
            if speaker_names:
                renames: dict[str, str] = {}
                for label, name in speaker_names.items():
                    cleaned = clean_speaker_label(name, f"the new name of {label!r}")
                    if not isinstance(label, str) or cleaned is None:
                        raise LibraryError(
                            f"speaker_names maps a speaker to a new name, got {label!r}: {name!r}"
                        )
                    if cleaned != label:
                        renames[label] = cleaned
                present = set(speakers_in_order(new.get("segments", []))) | set(new.get("speakers") or [])
                for seg in new.get("segments", []):
                    if seg.get("speaker") in renames:
                        seg["speaker"] = renames[seg["speaker"]]
                    for w in seg.get("words") or []:
                        if w.get("speaker") in renames:
                            w["speaker"] = renames[w["speaker"]]
                if new.get("speakers"):
                    new["speakers"] = list(dict.fromkeys(renames.get(s, s) for s in new["speakers"]))
                parts.extend(
                    f"speaker {label} -> {name}" for label, name in renames.items() if label in present
                )
            for sid, given in edits_by_id(words):
                seg = segment(sid)
                seg["words"] = checked_words(given, seg, f"the words of segment {sid}")
                seg["timing"] = "aligned"
                parts.append(f"segment {sid} words")
            if speakers_changed:
                new["speakers"] = speakers_in_order(new.get("segments", []))
            if texts_changed:
                new["text"] = join_texts([s["text"] for s in new.get("segments", [])], new.get("language"))
            if new == old and new_title == old_title:
                return self._stored(tid, row)
            now = self._save(conn, tid, revision + 1, new_title, old, new, revision_summary(parts))
        return self._stored(tid, row, revision=revision + 1, title=new_title, updated=now, content=new)

    def revisions(self, tid: str) -> list[dict[str, Any]]:
        """The transcript's revisions, oldest first: {"revision", "created", "title", "summary"}.
        Raises NotFound when there is no such transcript."""
        with self.reading() as conn:
            if conn.execute("SELECT 1 FROM transcripts WHERE id = ?", (tid,)).fetchone() is None:
                raise NotFound(f"no transcript {tid!r}")
            rows = conn.execute(
                "SELECT revision, created, title, summary FROM revisions WHERE transcript_id = ? ORDER BY revision",
                (tid,),
            ).fetchall()
        return [dict(zip(("revision", "created", "title", "summary"), row)) for row in rows]

    def revision(self, tid: str, n: int) -> dict[str, Any] | None:
        """Revision n of the transcript, shaped as get() shapes the current one ("revision": n,
        "updated": when n was made, its title and content); None when there is no such revision."""
        with self.reading() as conn:
            row = self._current(conn, tid) if isinstance(tid, str) else None
            if row is None:
                return None
            old = conn.execute(
                "SELECT title, created, content FROM revisions WHERE transcript_id = ? AND revision = ?",
                (tid, int(n)),
            ).fetchone()
        if old is None:
            return None
        return self._stored(tid, row, revision=int(n), title=old[0], updated=old[1], content=old[2])

    def restore(self, tid: str, n: int, *, expected_revision: int | None = None) -> dict[str, Any]:
        """Make the content and title of revision n current again, as a new revision (so the restore
        can itself be undone); returns the transcript as get() does. Raises NotFound (no such transcript
        or revision) or Conflict (expected_revision is not the current one)."""
        with self.transaction() as conn:
            row = self._locked_row(conn, tid, expected_revision)
            old = conn.execute(
                "SELECT title, content FROM revisions WHERE transcript_id = ? AND revision = ?", (tid, int(n))
            ).fetchone()
            if old is None:
                raise NotFound(f"no revision {n} of transcript {tid}")
            content = json.loads(old[1])
            now = self._save(
                conn, tid, row[3] + 1, old[0], json.loads(row[7]), content, f"restored revision {n}"
            )
        return self._stored(tid, row, revision=row[3] + 1, title=old[0], updated=now, content=content)

    def delete(self, tid: str) -> bool:
        """Remove the transcript, its revisions, its segments and its audio file; False when there is
        no such transcript."""
        with self.transaction() as conn:
            row = conn.execute("SELECT audio FROM transcripts WHERE id = ?", (tid,)).fetchone()
            if row is None:
                return False
            conn.execute("DELETE FROM segments WHERE transcript_id = ?", (tid,))
            conn.execute("DELETE FROM revisions WHERE transcript_id = ?", (tid,))
            conn.execute("UPDATE jobs SET transcript_id = NULL WHERE transcript_id = ?", (tid,))
            conn.execute("DELETE FROM transcripts WHERE id = ?", (tid,))
        if row[0]:
            remove(self.audio_folder / row[0])
        return True
