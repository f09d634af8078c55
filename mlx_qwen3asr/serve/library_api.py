"""The library's HTTP API: jobs that transcribe uploads into the library, and its transcripts.

    POST   /v1/jobs                          multipart: file, the fields of /v1/audio/transcriptions,
                                             title, diarize, num_speakers, speaker_names -> 202 {id, status}
    GET    /v1/jobs                          the jobs, newest first
    GET    /v1/jobs/{id}                     status (queued, running, done, failed, cancelled), progress
                                             0-1, error, transcript_id when done
    DELETE /v1/jobs/{id}                     cancel it
    GET    /v1/jobs/{id}/events              its state as Server-Sent Events, until it ends
    GET    /v1/transcripts?q=&limit=&offset= the transcripts newest first, or the segments q finds
    GET    /v1/transcripts/{id}              the JSON `mlxasr --json` writes, with id, title, created,
                                             revision and an id on each segment
    PATCH  /v1/transcripts/{id}              title, segments' text or speaker, speaker names: a revision
    DELETE /v1/transcripts/{id}
    GET    /v1/transcripts/{id}/revisions    its revisions; .../revisions/{n} one; POST .../{n}/restore
    POST   /v1/transcripts/{id}/retime       {"segments": [ids]}: the forced aligner times them again
    GET    /v1/transcripts/{id}/audio        the kept audio (HTTP Range)
    GET    /v1/transcripts/{id}/export?format=txt|srt|vtt|json|rttm|csv|md|docx

Lists are `{"object": "list", "data": [...]}`, errors OpenAI's shape (errors.APIError). Ids are the
library's own (hexadecimal): anything else is a 404, and no field of a request ever names a file.
The models run only on the Engine's thread: re-timing goes through Engine.call.
"""

from __future__ import annotations

import asyncio
import json
import mimetypes
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

from mlx_qwen3asr.library.export import EXPORT_FORMATS, ExportError, export
from mlx_qwen3asr.library.jobs import JobRunner
from mlx_qwen3asr.library.retime import retime_segments
from mlx_qwen3asr.library.search import search
from mlx_qwen3asr.library.store import Library
from mlx_qwen3asr.pipeline.result import Transcription
from mlx_qwen3asr.runtime.messages import one_line
from mlx_qwen3asr.serve.errors import APIError
from mlx_qwen3asr.serve.library_common import (
    MAX_LIMIT,
    as_list,
    clean_title,
    int_param,
    json_body,
    library_call,
    path_id,
)
from mlx_qwen3asr.serve.library_jobs import DEFAULT_MAX_JOB_UPLOAD_BYTES, SPEAKER_NAME_CHARS, JobRoutes

__all__ = ["DEFAULT_MAX_JOB_UPLOAD_BYTES", "LibraryAPI", "library_api"]


class LibraryAPI:
    """The routes of the library on a server (`server`: app._Server, for its engine, limits, uploads)."""

    def __init__(
        self,
        server: Any,
        library: Library,
        runner: JobRunner,
        *,
        max_job_upload_bytes: int = DEFAULT_MAX_JOB_UPLOAD_BYTES,
    ) -> None:
        self.server, self.library, self.runner = server, library, runner
        self.jobs = JobRoutes(server, library, runner, max_job_upload_bytes)

    def routes(self, wrap: Any) -> list[Route]:
        """The routes, each handler wrapped by `wrap` (errors.route: APIError -> its response)."""
        t = "/v1/transcripts/{id}"
        return [
            Route("/v1/jobs", wrap(self.jobs.create_job), methods=["POST"]),
            Route("/v1/jobs", wrap(self.jobs.list_jobs), methods=["GET"]),
            Route("/v1/jobs/{id}", wrap(self.jobs.get_job), methods=["GET"]),
            Route("/v1/jobs/{id}", wrap(self.jobs.cancel_job), methods=["DELETE"]),
            Route("/v1/jobs/{id}/events", wrap(self.jobs.job_events), methods=["GET"]),
            Route("/v1/transcripts", wrap(self.list_transcripts), methods=["GET"]),
            Route(t, wrap(self.get_transcript), methods=["GET"]),
            Route(t, wrap(self.patch_transcript), methods=["PATCH"]),
            Route(t, wrap(self.delete_transcript), methods=["DELETE"]),
            Route(t + "/revisions", wrap(self.list_revisions), methods=["GET"]),
            Route(t + "/revisions/{n}", wrap(self.get_revision), methods=["GET"]),
            Route(t + "/revisions/{n}/restore", wrap(self.restore_revision), methods=["POST"]),
            Route(t + "/retime", wrap(self.retime), methods=["POST"]),
            Route(t + "/audio", wrap(self.audio), methods=["GET", "HEAD"]),
            Route(t + "/export", wrap(self.export), methods=["GET"]),
        ]

    # -- transcripts --

    async def list_transcripts(self, request: Request) -> Response:
        limit = int_param(request, "limit", 50, 1, MAX_LIMIT)
        offset = int_param(request, "offset", 0, 0, 10**9)
        q = request.query_params.get("q")
        if q is not None and q.strip():
            if len(q) > 1000:
                raise APIError(400, "q is longer than 1000 characters", param="q", code="invalid_search")
            hits = await library_call(search, self.library, q, limit=limit, offset=offset)
            return as_list([{"object": "search.hit", **h} for h in hits])
        items, total = await library_call(self.library.list, limit=limit, offset=offset)
        return as_list([{"object": "transcript", **t} for t in items], total)

    async def _stored(self, request: Request) -> dict[str, Any]:
        tid = path_id(request, "transcript")
        doc = await library_call(self.library.get, tid)
        if doc is None:
            raise APIError(404, f"no transcript {tid!r}", code="transcript_not_found")
        return doc

    def _document(self, stored: dict[str, Any]) -> dict[str, Any]:
        """The JSON `mlxasr --json` writes for a stored transcript, with the library's fields."""
        result = Transcription.from_dict(stored)
        doc = json.loads(
            export(result, "json", model=stored.get("model"), options=stored.get("options") or {}).data
        )
        for seg, kept in zip(doc["segments"], stored.get("segments", [])):
            seg["id"] = kept.get("id")
        meta = {k: stored.get(k) for k in ("id", "title", "created", "updated", "revision")}
        return {"object": "transcript", **meta, "audio": bool(stored.get("audio")), **doc}

    async def get_transcript(self, request: Request) -> Response:
        stored = await self._stored(request)
        return JSONResponse(await anyio.to_thread.run_sync(self._document, stored))

    async def patch_transcript(self, request: Request) -> Response:
        tid = path_id(request, "transcript")
        body = await json_body(request)
        unknown = sorted(set(body) - {"title", "segments", "speaker_names", "revision"})
        if unknown:
            raise APIError(400, f"unknown field {unknown[0][:40]!r}", param=unknown[0][:40])
        changes: dict[str, Any] = {}
        if "title" in body:
            if not isinstance(body["title"], str):
                raise APIError(400, "title must be a string", param="title")
            changes["title"] = clean_title(body["title"]) or "Untitled"
        if "segments" in body:
            segs = body["segments"]
            if not isinstance(segs, list) or not all(isinstance(s, dict) for s in segs):
                raise APIError(400, "segments must be a list of objects with an id", param="segments")
            edits: dict[int, dict[str, Any]] = {}
            for s in segs:
                if not isinstance(s.get("id"), int) or isinstance(s.get("id"), bool):
                    raise APIError(400, "each segment needs its integer id", param="segments")
                edit = {k: s[k] for k in ("text", "speaker") if k in s}
                if not edit or set(s) - {"id", "text", "speaker"}:
                    raise APIError(400, "a segment edit changes text and/or speaker", param="segments")
                if "text" in edit and not isinstance(edit["text"], str):
                    raise APIError(400, "a segment's text must be a string", param="segments")
                if "speaker" in edit and not (edit["speaker"] is None or isinstance(edit["speaker"], str)):
                    raise APIError(400, "a segment's speaker must be a string or null", param="segments")
                edits[s["id"]] = edit
            changes["segments"] = edits
        if "speaker_names" in body:
            names = body["speaker_names"]
            if not isinstance(names, dict) or not all(
                isinstance(k, str) and isinstance(v, str) and v.strip() and len(v) <= SPEAKER_NAME_CHARS
                for k, v in names.items()
            ):
                raise APIError(
                    400,
                    "speaker_names maps a speaker to a new name (non-empty strings)",
                    param="speaker_names",
                )
            changes["speaker_names"] = {k: v.strip() for k, v in names.items()}
        if "revision" in body:
            if not isinstance(body["revision"], int):
                raise APIError(400, "revision must be an integer", param="revision")
            changes["expected_revision"] = body["revision"]
        if not set(changes) - {"expected_revision"}:
            raise APIError(400, "nothing to change: give title, segments or speaker_names")
        try:
            stored = await library_call(self.library.update, tid, **changes)
        except KeyError as e:
            raise APIError(400, one_line(e), param="segments") from None
        return JSONResponse(await anyio.to_thread.run_sync(self._document, stored))

    async def delete_transcript(self, request: Request) -> Response:
        tid = path_id(request, "transcript")
        if not await library_call(self.library.delete, tid):
            raise APIError(404, f"no transcript {tid!r}", code="transcript_not_found")
        return JSONResponse({"id": tid, "object": "transcript", "deleted": True})

    async def list_revisions(self, request: Request) -> Response:
        stored = await self._stored(request)
        return as_list(await library_call(self.library.revisions, stored["id"]))

    def _n(self, request: Request) -> int:
        raw = request.path_params["n"]
        if not raw.isdigit() or len(raw) > 9:
            raise APIError(404, f"no revision {raw[:20]!r}", code="revision_not_found")
        return int(raw)

    async def get_revision(self, request: Request) -> Response:
        stored = await self._stored(request)
        content = await library_call(self.library.revision, stored["id"], self._n(request))
        if content is None:
            raise APIError(404, f"no revision {self._n(request)}", code="revision_not_found")
        return JSONResponse(content)

    async def restore_revision(self, request: Request) -> Response:
        stored = await self._stored(request)
        restored = await library_call(self.library.restore, stored["id"], self._n(request))
        return JSONResponse(await anyio.to_thread.run_sync(self._document, restored))

    async def retime(self, request: Request) -> Response:
        stored = await self._stored(request)
        body = await json_body(request)
        ids = body.get("segments")
        if (
            not isinstance(ids, list)
            or not ids
            or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
        ):
            raise APIError(400, "segments must be a non-empty list of segment ids", param="segments")
        known = {s.get("id") for s in stored.get("segments", [])}
        missing = [i for i in ids if i not in known]
        if missing:
            raise APIError(400, f"no segment {missing[0]} in this transcript", param="segments")
        aligner = self.server.engine.aligner
        if aligner is None:
            raise APIError(
                400,
                f"re-timing needs the forced aligner: {self.server.words_unavailable}",
                code="word_timestamps_unavailable",
            )
        audio = await library_call(self.library.audio_path, stored["id"])
        if audio is None:
            raise APIError(
                409, "this transcript has no audio kept to time its words against", code="no_audio"
            )
        try:
            future = self.server.engine.call(retime_segments, aligner, audio, stored, ids)
        except RuntimeError as e:
            raise APIError(503, one_line(e), code="shutting_down") from None
        try:
            timed, skipped = await asyncio.wrap_future(future)
        except Exception as e:
            raise self.server.job_error(e, _NoUpload()) from None
        if timed:
            stored = await library_call(
                self.library.update, stored["id"], words=timed, expected_revision=stored["revision"]
            )
        doc = await anyio.to_thread.run_sync(self._document, stored)
        doc["retimed"] = sorted(timed)
        doc["not_retimed"] = {str(k): v for k, v in sorted(skipped.items())}
        return JSONResponse(doc)

    async def audio(self, request: Request) -> Response:
        stored = await self._stored(request)
        path = await library_call(self.library.audio_path, stored["id"])
        if path is None or not path.is_file():
            raise APIError(404, "this transcript has no audio kept", code="no_audio")
        media = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        return FileResponse(path, media_type=media, headers={"Cache-Control": "private, max-age=3600"})

    async def export(self, request: Request) -> Response:
        stored = await self._stored(request)
        fmt = (request.query_params.get("format") or "").strip().lower()
        if fmt not in EXPORT_FORMATS:
            raise APIError(400, f"format must be one of {', '.join(EXPORT_FORMATS)}", param="format")

        def render() -> Any:
            return export(
                Transcription.from_dict(stored),
                fmt,
                title=stored.get("title"),
                model=stored.get("model"),
                options=stored.get("options") or {},
            )

        try:
            out = await anyio.to_thread.run_sync(render)
        except ExportError as e:
            raise APIError(400, one_line(e), param="format") from None
        return Response(
            out.data,
            media_type=out.media_type,
            headers={"Content-Disposition": _disposition(stored, out.extension)},
        )


def library_api(server: Any, library: Library, *, model_id: str, max_job_upload_bytes: int) -> LibraryAPI:
    """The library's routes on `server`, with a JobRunner on its engine (started by the app's lifespan)."""
    speakers = server.speakers

    def diarize(audio: Any, seconds: float, result: Transcription, num_speakers: int | None) -> Transcription:
        turns = speakers.submit(audio, seconds, num_speakers)
        # A deadline however long the recording: the diarizer runs at many times real time.
        outcome = turns.future.result(timeout=max(600.0, 2.0 * seconds))
        if outcome.error is not None:
            raise RuntimeError("speaker diarization failed (see the server log)") from outcome.error
        return speakers.assign(result, outcome.turns)

    runner = JobRunner(
        library,
        server.engine,
        read_audio=lambda path, limit: server.read_audio(path, limit),
        model_id=model_id,
        max_audio_seconds=max(server.max_audio_seconds, 4 * 3600.0),
        diarize=diarize if speakers is not None else None,
    )
    return LibraryAPI(server, library, runner, max_job_upload_bytes=max_job_upload_bytes)


class _NoUpload:
    """Stands in for an upload in the server's job_error (nothing to scrub)."""

    filename = None
    path = None
    folder = Path("/nonexistent")

    def scrub(self, text: str) -> str:
        return text


def _disposition(stored: dict[str, Any], extension: str) -> str:
    """An attachment named after the transcript's title (ASCII fallback, and the UTF-8 name)."""
    title = clean_title(stored.get("title")) or "transcript"
    title = re.sub(r'[\\/:*?"<>|]+', "_", title).strip(". ")[:120] or "transcript"
    ascii_name = title.encode("ascii", "ignore").decode().strip() or "transcript"
    name = f"{title}.{extension}"
    return f"attachment; filename=\"{ascii_name}.{extension}\"; filename*=UTF-8''{quote(name)}"
