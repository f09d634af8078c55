"""An OpenAI-compatible transcription server: one loaded model, one Engine shared by every request.

    POST /v1/audio/transcriptions   multipart form: file, model, language, prompt, response_format
                                    (json, text, srt, vtt, verbose_json, diarized_json),
                                    timestamp_granularities[], temperature, stream,
                                    known_speaker_names[], chunking_strategy
    GET  /v1/models                 the loaded model as an OpenAI model list
    GET  /health                    status, the model, whether words can be timed, audio queued
                                    for transcription and for diarization
    GET  /v1/realtime/transcription WebSocket: live audio in, partial and committed text out (live.py)
    GET  /                          the web page (page.py): the library, read-along, live captions

Requests share the Engine's running batch (continuous batching), so concurrent clients cost little
more than one. Uploads stream to a file in a private folder, counted against the size limit as they
arrive, and that file is removed whatever happens to the request. A client that goes away has its
job cancelled, which takes its rows out of the batch, and its diarization cancelled (dropped from the
queue, or stopped while it runs). An upload counts against the limits by the
duration it decodes to, not its size or header. The Host header must name this server and a
browser's request come from an allowed origin (DNS rebinding, cross-site forms); connections have
deadlines for their headers and body and a bound on their number (uvicorn_config). Errors are
OpenAI-style bodies (`{"error": {"message", "type", "param", "code"}}`) that never carry a path, a
traceback or the key; the details go to the server's log.

`create_app(engine, ...)` builds the ASGI application; `mlxasr serve` (mlx_qwen3asr.cli.serve) loads
the model and runs it with uvicorn. Here are the routes and what they share; access.py checks who is
served, connections.py bounds connections, uploads.py reads the form, openai.py parses the request and
renders the answer, speakers.py diarizes beside transcription, load.py refuses work past the queue's
limit (with a Retry-After), errors.py shapes what is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.types import ASGIApp

from mlx_qwen3asr.audio.features import AudioError
from mlx_qwen3asr.audio.files import AudioTooLong, read_audio
from mlx_qwen3asr.audio.signal import ArraySignal
from mlx_qwen3asr.library.store import Library
from mlx_qwen3asr.pipeline.engine import Engine, Job, JobCancelled
from mlx_qwen3asr.pipeline.result import Segment, Transcription
from mlx_qwen3asr.runtime.messages import one_line
from mlx_qwen3asr.serve.access import Access, Guard
from mlx_qwen3asr.serve.connections import ConnectionLimits, http_protocol
from mlx_qwen3asr.serve.errors import APIError, ClientGone, http_error, internal_error, route
from mlx_qwen3asr.serve.library_api import DEFAULT_MAX_JOB_UPLOAD_BYTES, library_api
from mlx_qwen3asr.serve.live import LIVE_PATH, LiveLimits, LiveSessions
from mlx_qwen3asr.serve.load import Load
from mlx_qwen3asr.serve.openai import (
    FORM_REPEATS,
    RESPONSE_FORMATS,
    EventStream,
    parse_request,
    render_response,
)
from mlx_qwen3asr.serve.page import Page
from mlx_qwen3asr.serve.speakers import DiarizeJob, Speakers
from mlx_qwen3asr.serve.uploads import Upload, read_upload, upload_folder, write_chunk
from mlx_qwen3asr.text.languages import SUPPORTED_LANGUAGES

__all__ = [
    "APIError",
    "ConnectionLimits",
    "LiveLimits",
    "RESPONSE_FORMATS",
    "Speakers",
    "create_app",
    "http_protocol",
    "uvicorn_config",
]

log = logging.getLogger(__name__)

DEFAULT_MAX_UPLOAD_BYTES = 25 * 1024 * 1024  # OpenAI's own limit for this endpoint
DEFAULT_MAX_QUEUE_SECONDS = 3600.0
# The longest audio one request may hold, counted as decoded (a small file can decode to hours).
DEFAULT_MAX_AUDIO_SECONDS = 3600.0
# How often a request waiting for its job looks whether its client is still there.
DISCONNECT_POLL_SECONDS = 0.1


def _wait_for(job: Job) -> None:
    with contextlib.suppress(Exception):  # the outcome is read from the job afterwards
        job.result()


class _Server:
    """What the routes share: the engine, the limits and the load (load.py), the upload folder.

    read_audio decodes an upload (mlx_qwen3asr.audio.files.read_audio) and write_upload stores the
    pieces of one as they arrive (uploads.write_chunk): attributes, so that another can stand in.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        model_id: str,
        api_key: str | None,
        max_upload_bytes: int,
        max_queue_seconds: float,
        max_audio_seconds: float,
        upload_dir: Path,
        words_unavailable: str | None,
        access: Access,
        speakers: Speakers | None = None,
    ) -> None:
        self.engine, self.model_id, self.api_key = engine, model_id, api_key
        self.max_upload_bytes = max_upload_bytes
        self.max_audio_seconds, self.access = max_audio_seconds, access
        self.upload_dir, self.words_unavailable = upload_dir, words_unavailable
        self.speakers = speakers
        self.library = False  # whether the transcript library's routes are served
        self.max_job_upload_bytes = 0  # the largest recording a library job may upload
        self.load = Load(engine, speakers, max_queue_seconds)
        self.created = int(time.time())
        # Threads that wait on jobs (one per waiting request; they block, the event loop does not).
        self.waiters = ThreadPoolExecutor(max_workers=512, thread_name_prefix="mlxasr-wait")
        self.read_audio = read_audio
        self.write_upload = write_chunk

    # -- jobs --

    async def wait(self, request: Request, job: Job) -> None:
        """Until the job is done, off the event loop; a client that leaves meanwhile cancels it."""
        loop = asyncio.get_running_loop()
        done = loop.run_in_executor(self.waiters, _wait_for, job)
        await self._watch(request, done)

    async def _watch(self, request: Request, future: asyncio.Future) -> Any:
        while not future.done():
            await asyncio.wait({future}, timeout=DISCONNECT_POLL_SECONDS)
            if not future.done() and await request.is_disconnected():
                self.job_left(future)
                raise ClientGone()
        return future.result()

    def job_left(self, future: asyncio.Future) -> None:
        # Its outcome is read when it comes, so that nothing is reported as never retrieved; a future
        # cancelled meanwhile (the request's diarization, dropped) has no outcome to read.
        future.add_done_callback(lambda f: f.cancelled() or f.exception())

    def segments(self, job: Job) -> Iterator[Segment]:
        return job.segments()

    async def next_segment(self, segments: Iterator[Segment]) -> Segment | None:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.waiters, next, segments, None)

    def job_error(self, e: BaseException, upload: Upload) -> APIError:
        if isinstance(e, AudioError) and e.reason.startswith("no room"):
            log.error("no room to decode an upload: %s", e.reason)
            return APIError(
                507,
                "the server has no room to decode the audio (its disk is full); retry later",
                code="insufficient_storage",
            )
        if isinstance(e, AudioError):
            return APIError(
                400,
                f"the file could not be read as audio: {upload.scrub(one_line(e.reason))}",
                param="file",
                code="invalid_audio",
            )
        if isinstance(e, JobCancelled):
            return APIError(
                503, "the server is shutting down; the request was not finished", code="shutting_down"
            )
        log.error("transcription failed", exc_info=(type(e), e, e.__traceback__))
        return APIError(
            500, "transcription failed (internal error; see the server log)", code="internal_error"
        )

    async def with_speakers(
        self, request: Request | None, turns: DiarizeJob, result: Transcription
    ) -> Transcription:
        """result with the speakers of its diarization (turns, from Speakers.submit); a client that
        leaves meanwhile (request given; else the task is cancelled) cancels it. Raises APIError (500)
        when diarization failed."""
        assert self.speakers is not None
        watch = None if request is None else lambda future: self._watch(request, future)
        return await self.speakers.speakers(turns, result, watch)

    def finish(self, job: Job | None, upload: Upload, turns: DiarizeJob | None = None) -> None:
        """A request is over: its job stops if it still runs, its diarization is cancelled if it waits
        or runs, its file goes, its samples are closed."""
        if turns is not None:
            turns.cancel()
        if job is not None:
            if not job.done:
                job.cancel()
                log.info("job %s cancelled: its client went away", job.key)
            else:
                res = job.input_result
                if res is not None and res.transcription is not None:
                    self.load.finished(job.seconds)
                if res is not None and res.wav is not None:
                    with contextlib.suppress(Exception):
                        res.wav.close()
        upload.remove()

    async def decode(self, upload: Upload) -> tuple[str | Any, float]:
        """The upload decoded, for the engine, and its decoded duration in seconds, which is what counts
        against the limits (not its size or what its header states: a small file can hold hours).

        Audio short enough to be held in memory is handed over decoded; a longer one is decoded again by
        the engine, from its file (its samples stay on disk). Raises APIError."""
        try:
            # Decoding stops as soon as the limit is passed: a small file holding days of audio costs
            # no more than the limit's worth of decoding.
            decoded = await anyio.to_thread.run_sync(
                self.read_audio, str(upload.path), self.max_audio_seconds
            )
        except AudioTooLong:
            raise APIError(
                413,
                f"the audio is longer than {self.max_audio_seconds:g} s; this server transcribes at most "
                f"{self.max_audio_seconds:g} s per request",
                param="file",
                code="audio_too_long",
            ) from None
        except AudioError as e:
            raise self.job_error(e, upload) from None
        signal, seconds = decoded.signal, decoded.seconds
        in_memory = isinstance(signal, ArraySignal)
        if not in_memory:
            signal.close()
        return (signal.samples() if in_memory else str(upload.path)), seconds

    # -- routes --

    async def transcriptions(self, request: Request) -> Response:
        error = self.load.busy()  # before the upload is read
        if error is not None:
            raise error
        upload = await read_upload(
            request, self.upload_dir, self.max_upload_bytes, self.write_upload, FORM_REPEATS
        )
        job: Job | None = None
        turns: DiarizeJob | None = None  # the speaker turns of a diarized answer
        streaming = False
        try:
            req = parse_request(upload)
            if upload.size == 0:
                raise APIError(400, "the uploaded file is empty", param="file", code="empty_file")
            if req.word_timestamps and self.engine.aligner is None:
                raise APIError(
                    400,
                    f"word timestamps are not available on this server: {self.words_unavailable}",
                    param="timestamp_granularities[]",
                    code="word_timestamps_unavailable",
                )
            if req.diarize and self.speakers is None:
                raise APIError(
                    400,
                    "diarized_json is not available on this server: it was started without --diarize",
                    param="response_format",
                    code="diarization_unavailable",
                )
            audio, seconds = await self.decode(upload)
            error = self.load.busy(req.diarize)  # others may have come in meanwhile
            if error is not None:
                raise error
            try:
                job = self.engine.submit(
                    audio,
                    language=req.language,
                    context=req.context,
                    # Speakers change between words: their times cut the segments where they do.
                    word_timestamps=req.word_timestamps or (req.diarize and self.engine.aligner is not None),
                    seconds=seconds,
                )
            except ValueError as e:  # the context is too long (the language was checked already)
                raise APIError(400, upload.scrub(str(e)), param="prompt") from None
            if req.diarize:  # beside the transcription
                assert self.speakers is not None
                turns = self.speakers.submit(audio, seconds)
            if req.stream:
                segments = self.segments(job)
                first = await self._watch(
                    request, asyncio.get_running_loop().run_in_executor(self.waiters, next, segments, None)
                )
                if first is None:  # done without a segment: an error, or audio with no speech
                    await self.wait(request, job)
                    try:
                        job.result(timeout=0)
                    except Exception as e:
                        raise self.job_error(e, upload) from None
                    first = Segment(0.0, 0.0, "", "")
                streaming = True
                return EventStream(self, job, upload, req, first, turns)  # type: ignore[return-value]
            await self.wait(request, job)
            try:
                result = job.result(timeout=0)
            except Exception as e:
                raise self.job_error(e, upload) from None
            if turns is not None:
                result = await self.with_speakers(request, turns, result)
            wav = job.input_result.wav if job.input_result is not None else None
            return await anyio.to_thread.run_sync(
                render_response, req, result, wav, self.engine.model.tokenizer.encode
            )
        finally:
            if not streaming:
                self.finish(job, upload, turns)

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self.model_card()]})

    async def model(self, request: Request) -> Response:
        if request.path_params["model"] != self.model_id:
            raise APIError(
                404, f"no model {request.path_params['model']!r} here", param="model", code="model_not_found"
            )
        return JSONResponse(self.model_card())

    def model_card(self) -> dict[str, Any]:
        return {"id": self.model_id, "object": "model", "created": self.created, "owned_by": "mlx-qwen3asr"}

    async def health(self, request: Request) -> Response:
        return JSONResponse(
            {
                "status": "ok",
                "model": self.model_id,
                "word_timestamps": self.engine.aligner is not None,
                "diarization": self.speakers is not None,
                "library": self.library,
                "max_job_upload_bytes": self.max_job_upload_bytes if self.library else None,
                "languages": list(SUPPORTED_LANGUAGES),
                "queued_seconds": round(self.load.queued(), 3),
                "diarization_queued_seconds": round(self.load.diarization_queued(), 3),
            }
        )


def uvicorn_config(app: ASGIApp, limits: ConnectionLimits | None = None, **kwargs: Any) -> Any:
    """A uvicorn.Config serving `app` whose connections follow `limits` (default ConnectionLimits());
    kwargs go to uvicorn.Config."""
    import uvicorn
    from uvicorn.config import WS_PROTOCOLS

    live = getattr(getattr(app, "state", None), "live", None)
    kwargs.setdefault("ws", "websockets-sansio" if "websockets-sansio" in WS_PROTOCOLS else "websockets")
    if isinstance(live, LiveSessions):
        # Frames a little over the limit reach the session, which answers them with an error event;
        # the connection itself closes (1009) on larger ones.
        kwargs.setdefault("ws_max_size", 2 * live.limits.max_frame_bytes + 1024)
    return uvicorn.Config(app, http=http_protocol(limits or ConnectionLimits()), **kwargs)


def create_app(
    engine: Engine,
    *,
    model_id: str,
    api_key: str | None = None,
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES,
    max_queue_seconds: float = DEFAULT_MAX_QUEUE_SECONDS,
    max_audio_seconds: float = DEFAULT_MAX_AUDIO_SECONDS,
    upload_dir: str | os.PathLike[str] | None = None,
    words_unavailable: str | None = None,
    host: str = "127.0.0.1",
    allowed_hosts: Iterable[str] = (),
    cors_origins: Iterable[str] = (),
    live: LiveLimits | None = None,
    speakers: Speakers | None = None,
    library: Library | None = None,
    max_job_upload_bytes: int = DEFAULT_MAX_JOB_UPLOAD_BYTES,
) -> Starlette:
    """The ASGI application serving `engine` (which the caller closes when the server has stopped).

    model_id: the name /v1/models gives (never a local path: pass the folder's name). api_key: every
    request must then send `Authorization: Bearer <api_key>` (an empty key is a ValueError, not "no
    key"). max_audio_seconds: the longest audio a request may hold, as decoded. upload_dir: where
    uploads are written while they are transcribed (default: a private temporary folder, removed at
    shutdown; the next server removes one that a killed server left: uploads.upload_folder).
    words_unavailable: why word timestamps are refused, when the engine has no aligner.
    host: the address the server is bound to; the Host header must name it, localhost, 127.0.0.1,
    ::1 or one of allowed_hosts ("*": any); bound to every interface (0.0.0.0, ::), any IP address
    and the machine's name are accepted too. cors_origins: the browser origins (e.g.
    "https://app.example", "*" for any) allowed to make cross-origin requests; others are refused
    (403), as are those of every other origin when it is empty. live: the bounds of the live sessions
    (WebSocket at /v1/realtime/transcription; default LiveLimits()), checked for Host, Origin and key
    as the HTTP API. speakers: the server's diarizer, for response_format diarized_json (None: such
    requests are refused with a 400), which diarizes only where the engine's speech detection
    (engine.vad) finds speech; the caller closes it when the server has stopped. library: the transcript
    library (mlx_qwen3asr.library) whose jobs and transcripts the server serves (library_api.py; None:
    those routes are absent); its jobs left unfinished run again when the app starts; the caller closes
    it. max_job_upload_bytes: the largest upload a job may send.

    Run it with `uvicorn_config`, whose connections have deadlines and a bound on their number.
    """
    if api_key is not None and not api_key.strip():
        raise ValueError("api_key is empty: give a key, or None for an open server")
    if speakers is not None:
        speakers.vad = engine.vad  # the speech the engine transcribes is what is diarized
    owned = upload_dir is None
    folder = upload_folder() if owned else Path(upload_dir)
    server = _Server(
        engine,
        model_id=model_id,
        api_key=api_key,
        max_upload_bytes=int(max_upload_bytes),
        max_queue_seconds=float(max_queue_seconds),
        max_audio_seconds=float(max_audio_seconds),
        upload_dir=folder,
        words_unavailable=words_unavailable or "it was started without a forced aligner",
        access=Access.build(host, allowed_hosts, cors_origins),
        speakers=speakers,
    )

    sessions = LiveSessions(
        engine,
        model_id=model_id,
        access=server.access,
        api_key=api_key,
        limits=live or LiveLimits(),
        library=library,
    )

    kept = None
    if library is not None:
        kept = library_api(server, library, model_id=model_id, max_job_upload_bytes=max_job_upload_bytes)
        server.library, server.max_job_upload_bytes = True, int(max_job_upload_bytes)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if kept is not None:
            await anyio.to_thread.run_sync(kept.runner.start)
        try:
            yield
        finally:
            if kept is not None:
                await anyio.to_thread.run_sync(kept.runner.close)
            server.waiters.shutdown(wait=False, cancel_futures=True)
            if owned:
                shutil.rmtree(folder, ignore_errors=True)

    app = Starlette(
        routes=[
            Route("/v1/audio/transcriptions", route(server.transcriptions), methods=["POST"]),
            Route("/v1/models", route(server.models), methods=["GET"]),
            Route("/v1/models/{model:path}", route(server.model), methods=["GET"]),
            Route("/health", route(server.health), methods=["GET"]),
            WebSocketRoute(LIVE_PATH, sessions.endpoint),
            *(kept.routes(route) if kept is not None else []),
            *Page().routes(),
        ],
        middleware=[
            Middleware(
                Guard,
                access=server.access,
                api_key=api_key,
                max_upload_bytes=server.max_upload_bytes,
                path_limits={"/v1/jobs": int(max_job_upload_bytes)} if kept is not None else {},
            )
        ],
        exception_handlers={HTTPException: http_error, Exception: internal_error},
        lifespan=lifespan,
    )
    app.state.server = server
    app.state.live = sessions
    app.state.library = kept
    return app
