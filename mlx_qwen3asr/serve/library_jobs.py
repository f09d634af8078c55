"""The library's job routes: uploads queued as jobs (library.jobs.JobRunner), their state, cancelling
them, and their progress as Server-Sent Events."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from mlx_qwen3asr.library.jobs import FINISHED, JobOptions, JobRunner
from mlx_qwen3asr.library.store import Library
from mlx_qwen3asr.runtime.messages import one_line
from mlx_qwen3asr.serve.errors import APIError
from mlx_qwen3asr.serve.library_common import (
    MAX_LIMIT,
    as_list,
    clean_title,
    int_param,
    library_call,
    path_id,
)
from mlx_qwen3asr.serve.openai import FORM_REPEATS, _flag, _speaker_names, form_granularities, form_language
from mlx_qwen3asr.serve.uploads import read_upload
from mlx_qwen3asr.text.prompt import prompt_prefix_ids

__all__ = ["DEFAULT_MAX_JOB_UPLOAD_BYTES", "JobRoutes"]

# Recordings of interviews and lectures are long: a job's upload may be far larger than a request's.
DEFAULT_MAX_JOB_UPLOAD_BYTES = 2 * 1024 * 1024 * 1024
EVENT_POLL_SECONDS = 0.25
EVENT_KEEPALIVE_SECONDS = 15.0
SPEAKER_NAME_CHARS = 100


def job_json(job: dict[str, Any]) -> dict[str, Any]:
    keys = ("id", "status", "progress", "error", "transcript_id", "title", "created", "updated", "options")
    return {"object": "job", **{k: job.get(k) for k in keys}}


class JobRoutes:
    """The job routes of a server (`server`: app._Server, for its engine, speakers and uploads)."""

    def __init__(self, server: Any, library: Library, runner: JobRunner, max_job_upload_bytes: int) -> None:
        self.server, self.library, self.runner = server, library, runner
        self.max_job_upload_bytes = int(max_job_upload_bytes)

    def _job_options(self, upload: Any) -> JobOptions:
        language = form_language(upload)
        chosen = form_granularities(upload)
        diarize = (
            _flag(upload.value("diarize"), "diarize") or upload.value("response_format") == "diarized_json"
        )
        num = upload.value("num_speakers")
        num_speakers = None
        if num is not None and num.strip():
            try:
                num_speakers = int(num)
            except ValueError:
                num_speakers = -1
            if not 1 <= num_speakers <= 64:
                raise APIError(400, f"num_speakers must be 1 to 64, got {num[:20]!r}", param="num_speakers")
        names = list(_speaker_names(upload))
        for raw in upload.fields.get("speaker_names", []):
            names += [n.strip() for n in raw.split(",") if n.strip()]
        if any(len(n) > SPEAKER_NAME_CHARS or not n.isprintable() for n in names) or len(names) > 100:
            raise APIError(
                400, "speaker_names: at most 100 printable names of 100 characters", param="speaker_names"
            )
        words = "word" in chosen
        if words and self.server.engine.aligner is None:
            raise APIError(
                400,
                f"word timestamps are not available on this server: {self.server.words_unavailable}",
                param="timestamp_granularities[]",
                code="word_timestamps_unavailable",
            )
        if diarize and self.server.speakers is None:
            raise APIError(
                400,
                "diarization is not available on this server: it was started without --diarize",
                param="diarize",
            )
        options = JobOptions(
            language, upload.value("prompt") or "", words, diarize, num_speakers, tuple(names)
        )
        try:  # an over-long context is refused now, not when the job runs
            prompt_prefix_ids(self.server.engine.model.tokenizer, options.context)
        except ValueError as e:
            raise APIError(400, one_line(e), param="prompt") from None
        return options

    async def create_job(self, request: Request) -> Response:
        upload = await read_upload(
            request, self.server.upload_dir, self.max_job_upload_bytes, self.server.write_upload, FORM_REPEATS
        )
        try:
            if upload.path is None:
                raise APIError(400, "missing required field 'file' (the audio to transcribe)", param="file")
            if upload.size == 0:
                raise APIError(400, "the uploaded file is empty", param="file", code="empty_file")
            options = self._job_options(upload)
            title = clean_title(upload.value("title")) or clean_title(Path(upload.filename or "").stem)
            try:
                job_id = await anyio.to_thread.run_sync(
                    lambda: self.runner.submit(upload.path, title=title or "Untitled", options=options)
                )
            except OSError as e:
                raise APIError(
                    507, f"the job's audio could not be kept ({(e.strerror or 'I/O error').lower()})"
                ) from None
            except RuntimeError as e:
                raise APIError(503, one_line(e), code="shutting_down") from None
            return JSONResponse({"id": job_id, "object": "job", "status": "queued"}, status_code=202)
        finally:
            upload.remove()

    async def list_jobs(self, request: Request) -> Response:
        limit = int_param(request, "limit", 100, 1, MAX_LIMIT)
        offset = int_param(request, "offset", 0, 0, 10**9)
        jobs, total = await library_call(self.library.jobs, limit=limit, offset=offset)
        states = [self.runner.state(j["id"]) or j for j in jobs]
        return as_list([job_json(j) for j in states], total)

    async def _job(self, request: Request) -> dict[str, Any]:
        job_id = path_id(request, "job")
        job = await library_call(self.runner.state, job_id)
        if job is None:
            raise APIError(404, f"no job {job_id!r}", code="job_not_found")
        return job

    async def get_job(self, request: Request) -> Response:
        return JSONResponse(job_json(await self._job(request)))

    async def cancel_job(self, request: Request) -> Response:
        job = await self._job(request)
        job = await library_call(self.runner.cancel, job["id"]) or job
        return JSONResponse(job_json(job))

    async def job_events(self, request: Request) -> Response:
        job = await self._job(request)
        job_id = job["id"]

        async def events() -> AsyncIterator[bytes]:
            last, quiet = None, time.monotonic()
            while True:
                state = await anyio.to_thread.run_sync(self.runner.state, job_id)
                if state is None:
                    yield b'event: error\ndata: {"error": "the job was deleted"}\n\n'
                    return
                doc = job_json(state)
                if doc != last:
                    last, quiet = doc, time.monotonic()
                    yield f"event: job\ndata: {json.dumps(doc, ensure_ascii=False)}\n\n".encode()
                    if doc["status"] in FINISHED:
                        return
                elif time.monotonic() - quiet > EVENT_KEEPALIVE_SECONDS:
                    quiet = time.monotonic()
                    yield b": still working\n\n"
                if await request.is_disconnected():
                    return
                await asyncio.sleep(EVENT_POLL_SECONDS)

        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)
