"""An OpenAI-compatible transcription server: one loaded model, one Engine shared by every request.

    POST /v1/audio/transcriptions   multipart form: file, model, language, prompt, response_format
                                    (json, text, srt, vtt, verbose_json), timestamp_granularities[],
                                    temperature, stream
    GET  /v1/models                 the loaded model as an OpenAI model list
    GET  /health                    status, the model, whether words can be timed, audio queued

Requests share the Engine's running batch (continuous batching), so concurrent clients cost little
more than one. Uploads stream to a file in a private folder, counted against the size limit as they
arrive, and that file is removed whatever happens to the request. A client that goes away has its
job cancelled, which takes its rows out of the batch. An upload counts against the limits by the
duration it decodes to, not its size or header. The Host header must name this server and a
browser's request come from an allowed origin (DNS rebinding, cross-site forms); connections have
deadlines for their headers and body and a bound on their number (uvicorn_config). Errors are
OpenAI-style bodies (`{"error": {"message", "type", "param", "code"}}`) that never carry a path, a
traceback or the key; the details go to the server's log.

`create_app(engine, ...)` builds the ASGI application; `mlxasr serve` (mlx_qwen3asr.cli.serve) loads
the model and runs it with uvicorn.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hmac
import http
import ipaddress
import json
import logging
import math
import os
import secrets
import shutil
import socket
import tempfile
import time
import zlib
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from python_multipart import MultipartParser
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartState, parse_options_header
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from mlx_qwen3asr.audio.features import AUDIO_EXTENSIONS, AudioError
from mlx_qwen3asr.audio.files import ArraySignal, AudioTooLong, read_audio
from mlx_qwen3asr.outputs.cues import build_cues
from mlx_qwen3asr.outputs.render import render
from mlx_qwen3asr.pipeline.engine import Engine, Job, JobCancelled
from mlx_qwen3asr.pipeline.result import Segment, Transcription
from mlx_qwen3asr.text.prompt import join_texts, resolve_language

__all__ = [
    "APIError",
    "ConnectionLimits",
    "RESPONSE_FORMATS",
    "create_app",
    "http_protocol",
    "uvicorn_config",
]

log = logging.getLogger("mlx_qwen3asr.serve.app")

RESPONSE_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
GRANULARITIES = ("segment", "word")
DEFAULT_MAX_UPLOAD_BYTES = 25 * 1024 * 1024  # OpenAI's own limit for this endpoint
DEFAULT_MAX_QUEUE_SECONDS = 3600.0
# The longest audio one request may hold, counted as decoded (a small file can decode to hours).
DEFAULT_MAX_AUDIO_SECONDS = 3600.0
# Connections: the request line and headers must arrive within HEADER_TIMEOUT seconds of the
# connection opening (or of the previous answer); a body may pause at most BODY_TIMEOUT seconds and
# must average BODY_MIN_RATE bytes a second after its first BODY_TIMEOUT seconds; past
# MAX_CONNECTIONS open connections, new ones are answered 503.
DEFAULT_HEADER_TIMEOUT = 20.0
DEFAULT_BODY_TIMEOUT = 20.0
DEFAULT_BODY_MIN_RATE = 4096.0
DEFAULT_MAX_CONNECTIONS = 256
# Host names always accepted in the Host header (besides the address the server is bound to).
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
# Addresses that bind every interface: clients then name the machine by any of its addresses.
WILDCARD_ADDRESSES = ("", "0.0.0.0", "::")
# A refused request's body is dropped by the connection as it arrives, up to this many times the upload
# limit; past that the connection is closed instead (see _close_after).
DISCARD_FACTOR = 4
# Form fields other than the file (model, language, prompt, ...): a prompt of the longest context the
# model takes (8192 tokens) is well under this.
MAX_FIELD_BYTES = 1024 * 1024
MAX_PARTS = 64
# File bytes are gathered up to this much before a write (done off the event loop).
WRITE_CHUNK = 1024 * 1024
# How often a request waiting for its job looks whether its client is still there.
DISCONNECT_POLL_SECONDS = 0.1
# Retry-After when the server has not finished anything yet to measure its speed by.
DEFAULT_RETRY_AFTER = 5
MAX_RETRY_AFTER = 600
# Completed jobs within this many seconds give the speed that Retry-After is computed from.
SPEED_WINDOW_SECONDS = 120.0
# What decoding does whatever `temperature` asks: greedy (argmax) tokens.
DECODING_TEMPERATURE = 0.0


# --- errors ---------------------------------------------------------------------------------------


class APIError(Exception):
    """A request that cannot be served: its status and the OpenAI-style error body.

    close=True asks the client to close the connection: the request body was not read to its end.
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
        close: bool = False,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, " ".join(message.split()), code, param
        self.headers = dict(headers or {})
        if close:
            self.headers["Connection"] = "close"

    @property
    def type(self) -> str:
        return "server_error" if self.status >= 500 else "invalid_request_error"

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)

    def raw(self) -> bytes:
        """The whole HTTP/1.1 response as bytes, for the connection itself to write before it closes."""
        body = json.dumps(self.body()).encode()
        try:
            phrase = http.HTTPStatus(self.status).phrase
        except ValueError:
            phrase = ""
        headers = {"content-type": "application/json", "content-length": str(len(body))}
        headers.update({k.lower(): v for k, v in self.headers.items()})
        headers["connection"] = "close"
        head = f"HTTP/1.1 {self.status} {phrase}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        return (head + "\r\n").encode("latin-1") + body


class _ClientGone(Exception):
    """The client closed the connection before its answer was ready."""


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


# --- authentication and early limits --------------------------------------------------------------


def _authorized(header: str | None, key: str) -> bool:
    """Whether an Authorization header carries `Bearer <key>`, compared in constant time."""
    scheme, _, token = (header or "").strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    # Headers arrive decoded as latin-1: encoding back gives the bytes the client sent.
    return hmac.compare_digest(token.strip().encode("latin-1"), key.encode("utf-8"))


def _close_after(headers: Headers, limit: int) -> bool:
    """Whether to close the connection after refusing a request without reading its body.

    Left open, the connection drops the rest of the body as it arrives (nothing stores it), so that a
    client still sending it gets the answer (closing with unread data resets the connection, which
    clients report as a network error, and the OpenAI client then retries). A declared body of more
    than DISCARD_FACTOR times the limit is not worth taking in just to drop: the connection closes.
    """
    try:
        return int(headers.get("content-length", "0")) > DISCARD_FACTOR * limit
    except ValueError:
        return True


def _host_name(value: str) -> str:
    """The name in a Host header (or an origin's host), without port or IPv6 brackets, lowercased."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:].partition("]")[0]
    if value.count(":") == 1:
        value = value.partition(":")[0]
    return value.rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class _Access:
    """Which Host headers and which browser origins are served.

    A page on another site can send a form to the server (a multipart POST needs no CORS preflight),
    and through DNS rebinding (its own name made to point at 127.0.0.1) read the answer: so the Host
    header must name this server, and a request carrying an Origin must come from the server's own
    origin or one allowed with --cors-origin.
    """

    hosts: frozenset[str]  # names accepted in Host; "*": any
    any_ip: bool  # bound to every interface: any IP address is accepted in Host (no rebinding names one)
    origins: frozenset[str]  # origins allowed to make cross-origin requests; "*": any

    @classmethod
    def build(cls, host: str, allowed_hosts: Iterable[str], cors_origins: Iterable[str]) -> _Access:
        bound = _host_name(host) if host.strip() not in WILDCARD_ADDRESSES else ""
        names = {*LOCAL_HOSTS, *(_host_name(h) if h.strip() != "*" else "*" for h in allowed_hosts)}
        any_ip = not bound
        if bound:
            names.add(bound)
        else:
            with contextlib.suppress(OSError):
                names.add(_host_name(socket.gethostname()))
        origins = {o.strip().rstrip("/").lower() for o in cors_origins if o.strip()}
        return cls(frozenset(names), any_ip, frozenset(origins))

    def host_allowed(self, header: str | None) -> bool:
        if header is None:  # HTTP/1.0 without Host: no browser sends that
            return True
        name = _host_name(header)
        return "*" in self.hosts or name in self.hosts or (self.any_ip and _is_ip(name))

    def cross_origin_allowed(self, origin: str) -> bool:
        return "*" in self.origins or origin in self.origins


def _origin(headers: Headers) -> str | None:
    value = headers.get("origin")
    return value.strip().rstrip("/").lower() if value is not None else None


class _Guard:
    """Checks every request before anything else reads it: the Host header, the Origin of a browser's
    request (answering CORS preflights for the allowed ones), the API key, then a declared body size."""

    def __init__(self, app: ASGIApp, server: _Server) -> None:
        self.app, self.server = app, server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        limit = self.server.max_upload_bytes
        access = self.server.access
        refuse = lambda error: error.response()(scope, receive, send)  # noqa: E731
        host = headers.get("host")
        if not access.host_allowed(host):
            shown = _one_line(host or "")[:100]
            await refuse(
                APIError(
                    421,
                    f"this server does not answer to the host name {shown!r} "
                    "(start it with --allowed-host NAME to allow a name)",
                    code="host_not_allowed",
                    close=_close_after(headers, limit),
                )
            )
            return
        origin = _origin(headers)
        cross = origin is not None and origin != f"{scope.get('scheme', 'http')}://{(host or '').lower()}"
        if cross and not access.cross_origin_allowed(origin):
            await refuse(
                APIError(
                    403,
                    f"cross-origin requests from {_one_line(origin)[:100]!r} are refused "
                    "(start the server with --cors-origin ORIGIN to allow an origin)",
                    code="origin_not_allowed",
                    close=_close_after(headers, limit),
                )
            )
            return
        if cross:
            if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
                await self._preflight(origin, headers)(scope, receive, send)
                return
            send = self._with_cors(send, origin)
        key = self.server.api_key
        if key is not None and not _authorized(headers.get("authorization"), key):
            error = APIError(
                401,
                "missing or incorrect API key: send the header 'Authorization: Bearer <key>'",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
                close=_close_after(headers, limit),
            )
            await error.response()(scope, receive, send)
            return
        declared = headers.get("content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                await APIError(400, "invalid Content-Length header", close=True).response()(
                    scope, receive, send
                )
                return
            if size > limit:
                await _too_large(limit, close=_close_after(headers, limit)).response()(scope, receive, send)
                return
        await self.app(scope, receive, send)

    @staticmethod
    def _preflight(origin: str, headers: Headers) -> Response:
        """The answer to a browser's CORS preflight from an allowed origin."""
        asked = headers.get("access-control-request-headers", "")
        allowed = ", ".join(h.strip() for h in asked.split(",") if h.strip()) or "authorization, content-type"
        return Response(
            status_code=204,
            headers={
                "Access-Control-Allow-Origin": origin,
                "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
                "Access-Control-Allow-Headers": allowed,
                "Access-Control-Max-Age": "600",
                "Vary": "Origin",
            },
        )

    @staticmethod
    def _with_cors(send: Send, origin: str) -> Send:
        """send, with the CORS headers that let the allowed origin read the answer."""
        extra = [
            (b"access-control-allow-origin", origin.encode("latin-1", "replace")),
            (b"access-control-expose-headers", b"Retry-After"),
            (b"vary", b"Origin"),
        ]

        async def cors_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        return cors_send


# --- uploads --------------------------------------------------------------------------------------


@dataclass
class _Upload:
    """A multipart/form-data body: the file part in a file of our own, the other fields as text."""

    folder: Path
    fields: dict[str, list[str]] = field(default_factory=dict)
    path: Path | None = None  # where the file part goes; None when the form had none
    filename: str | None = None  # as the client named it
    size: int = 0  # bytes of the file part

    def remove(self) -> None:
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

    def value(self, name: str) -> str | None:
        values = self.fields.get(name)
        return values[0] if values else None

    def scrub(self, text: str) -> str:
        """text without our file's path or name, or the server's folders (decoder messages may quote them)."""
        shown = f"'{self.filename}'" if self.filename else "the upload"
        if self.path is not None:
            for secret in (str(self.path), self.path.name):
                text = text.replace(secret, shown)
        for folder in (str(self.folder), tempfile.gettempdir()):
            text = text.replace(folder, "the server's temporary folder")
        return text


class _FormReader:
    """Parses a multipart body as it arrives; file bytes are collected for writing, fields kept."""

    def __init__(self, boundary: bytes, upload: _Upload) -> None:
        self.upload = upload
        self.pending = bytearray()  # file bytes not written yet
        self._headers: dict[bytes, bytes] = {}
        self._header_field = bytearray()
        self._header_value = bytearray()
        self._name: str | None = None
        self._is_file = False
        self._value = bytearray()
        self._field_bytes = 0
        self._parts = 0
        self.parser = MultipartParser(
            boundary,
            callbacks={
                "on_part_begin": self._part_begin,
                "on_header_field": lambda data, start, end: self._header_field.extend(data[start:end]),
                "on_header_value": lambda data, start, end: self._header_value.extend(data[start:end]),
                "on_header_end": self._header_end,
                "on_headers_finished": self._headers_finished,
                "on_part_data": self._part_data,
                "on_part_end": self._part_end,
            },
        )

    def _part_begin(self) -> None:
        self._parts += 1
        if self._parts > MAX_PARTS:
            raise APIError(400, f"too many form fields (at most {MAX_PARTS})")
        self._headers, self._name, self._is_file, self._value = {}, None, False, bytearray()

    def _header_end(self) -> None:
        self._headers[bytes(self._header_field).lower()] = bytes(self._header_value)
        self._header_field.clear()
        self._header_value.clear()

    def _headers_finished(self) -> None:
        _, options = parse_options_header(self._headers.get(b"content-disposition", b""))
        self._name = options.get(b"name", b"").decode("utf-8", "replace")
        if self._name != "file":
            return
        upload = self.upload
        if upload.path is not None:
            raise APIError(400, "only one file can be transcribed per request", param="file")
        filename = options.get(b"filename")
        upload.filename = _one_line(filename.decode("utf-8", "replace"))[:200] if filename else None
        # The decoder picks its way by the extension (m4a, mp4, webm, ... need ffmpeg); anything else is
        # left without one, and probed.
        ext = Path(upload.filename or "").suffix.lower()
        ext = ext if ext[1:] in AUDIO_EXTENSIONS else ""
        upload.path = upload.folder / f"upload-{secrets.token_hex(8)}{ext}"
        self._is_file = True

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._is_file:
            self.upload.size += end - start
            self.pending += data[start:end]
            return
        self._field_bytes += end - start
        if self._field_bytes > MAX_FIELD_BYTES:
            raise APIError(413, f"form fields too large (at most {MAX_FIELD_BYTES} bytes)")
        self._value += data[start:end]

    def _part_end(self) -> None:
        if self._is_file or self._name is None:
            return
        try:
            text = self._value.decode("utf-8")
        except UnicodeDecodeError:
            raise APIError(400, f"form field {self._name!r} is not UTF-8 text", param=self._name) from None
        self.upload.fields.setdefault(self._name, []).append(text)


def _write(path: Path, data: bytes, created: bool) -> None:
    flags = os.O_WRONLY | (os.O_APPEND if created else os.O_CREAT | os.O_EXCL) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _storage_error(e: OSError) -> APIError:
    """The answer when an upload cannot be written: 507 for a full disk, else 500; never the path."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        log.error("no room to store an upload: %s", e)
        return APIError(
            507,
            "the server has no room to store the upload (its disk is full); retry later",
            code="insufficient_storage",
        )
    log.error("an upload could not be stored: %s", e)
    reason = (e.strerror or "I/O error").lower()
    return APIError(500, f"the upload could not be stored on the server ({reason})", code="storage_error")


async def _store(path: Path, data: bytes, created: bool) -> None:
    try:
        await anyio.to_thread.run_sync(_write, path, data, created)
    except OSError as e:
        raise _storage_error(e) from None


async def read_upload(request: Request, folder: Path, limit: int) -> _Upload:
    """The request's multipart body, the file part streamed into `folder`; bytes are counted as they
    come and the request is refused (413) as soon as they pass `limit`, without reading the rest (the
    connection drops it as it arrives, see _close_after).

    A form that ends before its closing boundary (a body cut short, whatever its Content-Length said)
    is refused (400): part of a file is not the file. Raises APIError, or _ClientGone; the file is
    removed on any failure.
    """
    ctype, options = parse_options_header(request.headers.get("content-type"))
    boundary = options.get(b"boundary")
    if ctype != b"multipart/form-data" or not boundary:
        raise APIError(
            400,
            "the request must be a multipart/form-data form with the audio in 'file'",
            close=_close_after(request.headers, limit),
        )
    upload = _Upload(folder)
    reader = _FormReader(boundary, upload)
    received, created = 0, False
    try:
        async for chunk in request.stream():
            received += len(chunk)
            if received > limit:
                raise _too_large(limit)
            try:
                reader.parser.write(chunk)
            except MultipartParseError as e:
                raise APIError(400, f"malformed multipart form ({_one_line(e)})") from None
            if len(reader.pending) >= WRITE_CHUNK:
                data, reader.pending = bytes(reader.pending), bytearray()
                await _store(upload.path, data, created)
                created = True
        try:
            reader.parser.finalize()
        except MultipartParseError as e:
            raise APIError(400, f"malformed multipart form ({_one_line(e)})") from None
        if reader.parser.state != MultipartState.END:
            raise APIError(
                400,
                "the upload is incomplete: the multipart form ends before its closing boundary "
                "(the request body was cut short)",
                code="incomplete_upload",
            )
        if reader.pending or (upload.path is not None and not created):
            await _store(upload.path, bytes(reader.pending), created)
    except ClientDisconnect:
        upload.remove()
        raise _ClientGone() from None
    except BaseException:
        upload.remove()
        raise
    return upload


def _too_large(limit: int, close: bool = False) -> APIError:
    mb = limit / (1024 * 1024)
    return APIError(
        413,
        f"the request is larger than this server's limit of {mb:g} MB",
        code="file_too_large",
        param="file",
        close=close,
    )


# --- the request ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TranscriptionRequest:
    response_format: str
    language: str | None  # canonical name (resolve_language), or None to detect
    context: str
    granularities: frozenset[str]
    stream: bool

    @property
    def word_timestamps(self) -> bool:
        """Words are timed when a format that shows them asks for them (a stream shows text only)."""
        shown = self.response_format in ("verbose_json", "srt", "vtt") and not self.stream
        return shown and "word" in self.granularities


def _flag(value: str | None, name: str) -> bool:
    if value is None:
        return False
    text = value.strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off", ""):
        return False
    raise APIError(400, f"{name} must be true or false, got {value!r}", param=name)


def parse_request(upload: _Upload) -> TranscriptionRequest:
    """The form's options, checked; raises APIError (400) naming the field at fault."""
    if upload.path is None:
        raise APIError(400, "missing required field 'file' (the audio to transcribe)", param="file")
    if not (upload.value("model") or "").strip():
        raise APIError(400, "missing required field 'model'", param="model")
    fmt = (upload.value("response_format") or "json").strip().lower()
    if fmt not in RESPONSE_FORMATS:
        raise APIError(
            400,
            f"unsupported response_format {fmt!r}: use one of {', '.join(RESPONSE_FORMATS)}",
            param="response_format",
        )
    try:
        language = resolve_language(upload.value("language"))
    except ValueError as e:
        raise APIError(400, str(e), param="language", code="unsupported_language") from None
    granularities = upload.fields.get("timestamp_granularities[]", []) + upload.fields.get(
        "timestamp_granularities", []
    )
    chosen = {g.strip().lower() for g in granularities if g.strip()}
    unknown = sorted(chosen - set(GRANULARITIES))
    if unknown:
        raise APIError(
            400,
            f"unsupported timestamp granularity {unknown[0]!r}: use segment or word",
            param="timestamp_granularities[]",
        )
    temperature = upload.value("temperature")
    if temperature is not None and temperature.strip():
        try:
            value = float(temperature)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise APIError(400, f"temperature must be a number, got {temperature!r}", param="temperature")
        # Accepted for compatibility; decoding is greedy whatever it says.
    return TranscriptionRequest(
        response_format=fmt,
        language=language,
        context=upload.value("prompt") or "",
        granularities=frozenset(chosen or {"segment"}),
        stream=_flag(upload.value("stream"), "stream"),
    )


# --- responses ------------------------------------------------------------------------------------


def _seconds(x: float) -> float | None:
    """Seconds to the millisecond; None for a time that is not a finite number."""
    return round(float(x), 3) if isinstance(x, (int, float)) and math.isfinite(x) else None


def _compression_ratio(text: str) -> float:
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


def _segment_json(k: int, seg: Segment, encode: Callable[[str], list[int]]) -> dict[str, Any]:
    """One segment in OpenAI's verbose_json shape. Decoding is greedy and computes no probabilities:
    avg_logprob and no_speech_prob are 0.0, temperature is 0.0. truncated and repetitive are ours."""
    return {
        "id": k,
        "seek": int(round(seg.start * 100)),  # 10 ms mel frames, as Whisper counts them
        "start": _seconds(seg.start),
        "end": _seconds(seg.end),
        "text": seg.text,
        "tokens": encode(seg.text) if seg.text else [],
        "temperature": DECODING_TEMPERATURE,
        "avg_logprob": 0.0,
        "compression_ratio": _compression_ratio(seg.text),
        "no_speech_prob": 0.0,
        "truncated": seg.truncated,
        "repetitive": seg.repetitive,
    }


def _words_json(segments: list[Segment]) -> list[dict[str, Any]]:
    words = []
    for seg in segments:
        for w in seg.words:
            start, end = _seconds(w.start), _seconds(w.end)
            if start is not None and end is not None:
                words.append({"word": w.text, "start": start, "end": end})
    return words


def _usage(result: Transcription) -> dict[str, Any]:
    return {"type": "duration", "seconds": _seconds(result.duration) or 0.0}


def render_response(
    req: TranscriptionRequest,
    result: Transcription,
    wav: Any,
    encode: Callable[[str], list[int]],
) -> Response:
    """The answer in the requested format (CPU work: cues read the audio; run it off the event loop)."""
    fmt = req.response_format
    if fmt == "json":
        return JSONResponse({"text": result.text, "usage": _usage(result)})
    if fmt == "text":
        return PlainTextResponse(result.text + "\n")
    if fmt in ("srt", "vtt"):
        # Segments with aligned words (asked for with timestamp_granularities[]=word) give word cues.
        cues = build_cues(result.segments, wav, duration=result.duration)
        media = "text/vtt" if fmt == "vtt" else "text/plain"
        return Response(render(fmt, result, cues), media_type=f"{media}; charset=utf-8")
    language = (result.language or req.language or "").lower()
    body: dict[str, Any] = {
        "task": "transcribe",
        "language": language,
        "duration": _seconds(result.duration) or 0.0,
        "text": result.text,
    }
    if "segment" in req.granularities:
        body["segments"] = [_segment_json(k, s, encode) for k, s in enumerate(result.segments)]
    if "word" in req.granularities:
        body["words"] = _words_json(result.segments)
    body["usage"] = _usage(result)
    return JSONResponse(body)


def _event(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n".encode()


class _EventStream:
    """Server-sent events for one job: a `transcript.text.delta` per segment's text as it is decoded,
    then `transcript.text.done` with the whole text. A client that leaves cancels the job."""

    def __init__(self, server: _Server, job: Job, upload: _Upload, req: TranscriptionRequest, first: Segment):
        self.server, self.job, self.upload, self.req, self.first = server, job, upload, req, first

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as tasks:

                async def watch() -> None:
                    # The body has been read: what comes now is the client leaving (or, once the last
                    # event is sent, the end of the response). Leaving stops the events; finish() then
                    # cancels the job.
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    tasks.cancel_scope.cancel()

                tasks.start_soon(watch)
                await self._send_events(send)
                tasks.cancel_scope.cancel()
        finally:
            self.server.finish(self.job, self.upload)

    async def _send_events(self, send: Send) -> None:
        headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        texts: list[str] = []
        shown = ""
        segments = self.server.segments(self.job)
        seg: Segment | None = self.first
        while seg is not None:
            if seg.text.strip():
                texts.append(seg.text)
                joined = join_texts(texts, self.req.language)
                delta = joined[len(shown) :] if joined.startswith(shown) else seg.text
                shown = joined
                body = _event({"type": "transcript.text.delta", "delta": delta})
                await send({"type": "http.response.body", "body": body, "more_body": True})
            seg = await self.server.next_segment(segments)
        try:
            result = self.job.result(timeout=0)
            payload = {"type": "transcript.text.done", "text": result.text}
        except Exception as e:
            error = self.server.job_error(e, self.upload)
            payload = {
                "error": {"message": error.message, "type": error.type, "param": None, "code": error.code}
            }
        await send({"type": "http.response.body", "body": _event(payload), "more_body": False})


# --- the server -----------------------------------------------------------------------------------


def _wait_for(job: Job) -> None:
    with contextlib.suppress(Exception):  # the outcome is read from the job afterwards
        job.result()


class _Server:
    """What the routes share: the engine, the limits, the upload folder and the speed measured."""

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
        access: _Access,
    ) -> None:
        self.engine, self.model_id, self.api_key = engine, model_id, api_key
        self.max_upload_bytes, self.max_queue_seconds = max_upload_bytes, max_queue_seconds
        self.max_audio_seconds, self.access = max_audio_seconds, access
        self.upload_dir, self.words_unavailable = upload_dir, words_unavailable
        self.created = int(time.time())
        self.started = time.monotonic()
        self.finished: deque[tuple[float, float]] = deque()  # (when, audio seconds) of recent jobs
        # Threads that wait on jobs (one per waiting request; they block, the event loop does not).
        self.waiters = ThreadPoolExecutor(max_workers=512, thread_name_prefix="mlxasr-wait")

    # -- limits --

    def busy(self) -> APIError | None:
        """The 503 to answer with when the engine already holds more audio than allowed, else None."""
        queued = self.engine.queued_seconds()
        if queued <= self.max_queue_seconds:
            return None
        retry = self.retry_after(queued - self.max_queue_seconds)
        return APIError(
            503,
            f"the server is busy: {queued:.0f} s of audio are waiting (limit {self.max_queue_seconds:g} s); "
            f"retry in {retry} s",
            code="server_busy",
            headers={"Retry-After": str(retry)},
        )

    def retry_after(self, excess: float) -> int:
        """Seconds until `excess` seconds of audio are done, at the speed of the recent jobs."""
        now = time.monotonic()
        while self.finished and self.finished[0][0] < now - SPEED_WINDOW_SECONDS:
            self.finished.popleft()
        window = min(SPEED_WINDOW_SECONDS, now - self.started)
        done = sum(s for _, s in self.finished)
        if not done or window <= 0:
            return DEFAULT_RETRY_AFTER
        return max(1, min(MAX_RETRY_AFTER, math.ceil(excess * window / done)))

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
                raise _ClientGone()
        return future.result()

    def job_left(self, future: asyncio.Future) -> None:
        future.add_done_callback(lambda f: f.exception())  # read, so that nothing is reported

    def segments(self, job: Job) -> Iterator[Segment]:
        return job.segments()

    async def next_segment(self, segments: Iterator[Segment]) -> Segment | None:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.waiters, next, segments, None)

    def job_error(self, e: BaseException, upload: _Upload) -> APIError:
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
                f"the file could not be read as audio: {upload.scrub(_one_line(e.reason))}",
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

    def finish(self, job: Job | None, upload: _Upload) -> None:
        """A request is over: its job stops if it still runs, its file goes, its samples are closed."""
        if job is not None:
            if not job.done:
                job.cancel()
                log.info("job %s cancelled: its client went away", job.key)
            else:
                res = job.input_result
                if res is not None and res.transcription is not None:
                    self.finished.append((time.monotonic(), job.seconds))
                if res is not None and res.wav is not None:
                    with contextlib.suppress(Exception):
                        res.wav.close()
        upload.remove()

    async def decode(self, upload: _Upload) -> tuple[str | Any, float]:
        """The upload decoded, for the engine, and its decoded duration in seconds, which is what counts
        against the limits (not its size or what its header states: a small file can hold hours).

        Audio short enough to be held in memory is handed over decoded; a longer one is decoded again by
        the engine, from its file (its samples stay on disk). Raises APIError."""
        try:
            # Decoding stops as soon as the limit is passed: a small file holding days of audio costs
            # no more than the limit's worth of decoding.
            decoded = await anyio.to_thread.run_sync(read_audio, str(upload.path), self.max_audio_seconds)
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
        error = self.busy()  # before the upload is read
        if error is not None:
            raise error
        upload = await read_upload(request, self.upload_dir, self.max_upload_bytes)
        job: Job | None = None
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
            audio, seconds = await self.decode(upload)
            error = self.busy()  # others may have come in meanwhile
            if error is not None:
                raise error
            try:
                job = self.engine.submit(
                    audio,
                    language=req.language,
                    context=req.context,
                    word_timestamps=req.word_timestamps,
                    seconds=seconds,
                )
            except ValueError as e:  # the context is too long (the language was checked already)
                raise APIError(400, upload.scrub(str(e)), param="prompt") from None
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
                return _EventStream(self, job, upload, req, first)  # type: ignore[return-value]
            await self.wait(request, job)
            try:
                result = job.result(timeout=0)
            except Exception as e:
                raise self.job_error(e, upload) from None
            wav = job.input_result.wav if job.input_result is not None else None
            return await anyio.to_thread.run_sync(
                render_response, req, result, wav, self.engine.model.tokenizer.encode
            )
        finally:
            if not streaming:
                self.finish(job, upload)

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
                "queued_seconds": round(self.engine.queued_seconds(), 3),
            }
        )


def _route(handler: Callable[[Request], Any]) -> Callable[[Request], Any]:
    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except APIError as e:
            if e.status >= 500:
                log.warning("%s %s: %d %s", request.method, request.url.path, e.status, e.message)
            return e.response()
        except _ClientGone:
            log.info("%s %s: the client went away", request.method, request.url.path)
            return Response(status_code=400)  # nobody reads it

    return endpoint


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    messages = {404: f"no route {request.url.path!r}", 405: f"method {request.method} not allowed here"}
    message = messages.get(exc.status_code, _one_line(exc.detail))
    return APIError(exc.status_code, message, headers=exc.headers).response()


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.error("%s %s failed", request.method, request.url.path, exc_info=(type(exc), exc, exc.__traceback__))
    return APIError(500, "internal error; see the server log", code="internal_error").response()


# --- connections ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConnectionLimits:
    """Deadlines for what a client sends, and a bound on open connections (see uvicorn_config).

    header_timeout: seconds from the connection opening (or the previous answer) to the end of the
    request's headers; a connection that sent part of them then gets 408, one that sent nothing is
    closed. body_timeout: the longest pause in a request body; and after its first body_timeout seconds
    the body must average body_min_rate bytes a second. A body that stalls gets 408 (if nothing was
    answered yet) and the connection closes; its request sees its client gone (its upload is removed).
    max_connections: connections past this many get 503 and are closed.
    """

    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    body_min_rate: float = DEFAULT_BODY_MIN_RATE
    max_connections: int = DEFAULT_MAX_CONNECTIONS


def _too_many_connections(limit: int) -> ASGIApp:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        error = APIError(
            503,
            f"the server has too many open connections (at most {limit}); retry shortly",
            code="too_many_connections",
            headers={"Retry-After": "1"},
            close=True,
        )
        await error.response()(scope, receive, send)

    return app


def http_protocol(limits: ConnectionLimits) -> type[asyncio.Protocol]:
    """uvicorn's HTTP/1.1 protocol (h11) with the deadlines and the bound of `limits`."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Protocol(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._timer: asyncio.TimerHandle | None = None
            self._phase: str | None = None  # "head", "body" or None (the request is in; no deadline)
            self._head_bytes = 0
            self._body_start = self._body_last = 0.0
            self._body_bytes = 0
            if len(self.connections) > limits.max_connections:
                log.warning("refused a connection: %d are open", len(self.connections))
                self.app = _too_many_connections(limits.max_connections)
            self._track()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel()
            self._phase = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            now = self.loop.time()
            if self._phase == "head":
                self._head_bytes += len(data)
            elif self._phase == "body":
                self._body_bytes += len(data)
                self._body_last = now
            super().data_received(data)
            self._track(rearm=self._phase == "body")

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._track()

        # -- deadlines --

        def _cancel(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _track(self, rearm: bool = False) -> None:
            """Sets the deadline that fits where the request stands."""
            if self.transport is None or self.transport.is_closing():
                self._cancel()
                return
            state = self.conn.their_state
            if state is h11.IDLE:
                if self._phase != "head":
                    self._phase, self._head_bytes = "head", 0
                    self._cancel()
                    self._timer = self.loop.call_later(limits.header_timeout, self._head_expired)
            elif state is h11.SEND_BODY:
                if self._phase != "body":
                    self._phase, self._body_bytes = "body", 0
                    self._body_start = self._body_last = self.loop.time()
                    rearm = True
                if rearm:
                    self._cancel()
                    delay = max(0.0, self._body_deadline() - self.loop.time())
                    self._timer = self.loop.call_later(delay, self._body_expired)
            else:
                self._phase = None
                self._cancel()

        def _body_deadline(self) -> float:
            idle = self._body_last + limits.body_timeout
            slow = self._body_start + limits.body_timeout + self._body_bytes / limits.body_min_rate
            return min(idle, slow)

        def _head_expired(self) -> None:
            self._timer = None
            if self.transport.is_closing() or self._phase != "head":
                return
            if self._head_bytes:
                log.info("closed a connection: its request headers took over %g s", limits.header_timeout)
                self._close_with(
                    APIError(
                        408,
                        f"the request headers did not arrive within {limits.header_timeout:g} s",
                        code="request_timeout",
                    )
                )
            else:  # an idle connection: closed as a keep-alive one is
                self.transport.close()

        def _body_expired(self) -> None:
            self._timer = None
            if self.transport.is_closing() or self._phase != "body":
                return
            now = self.loop.time()
            if self.flow.read_paused:  # we are not reading (the request is busy): not the client's fault
                self._body_start = self._body_last = now
                self._body_bytes = 0
                self._track(rearm=True)
                return
            if now < self._body_deadline():
                self._track(rearm=True)
                return
            log.info("closed a connection: its request body stalled (%d bytes received)", self._body_bytes)
            cycle = self.cycle
            if cycle is not None and not cycle.response_started:
                self._close_with(
                    APIError(
                        408,
                        f"the request body stopped arriving (no data for {limits.body_timeout:g} s, or "
                        f"less than {limits.body_min_rate:g} bytes a second)",
                        code="request_timeout",
                    )
                )
            else:
                self.transport.close()

        def _close_with(self, error: APIError) -> None:
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete:
                # The request in progress sees its client gone: its sends are dropped, its upload removed.
                cycle.disconnected = True
                cycle.message_event.set()
            self.transport.write(error.raw())
            self.transport.close()

    return Protocol


def uvicorn_config(app: ASGIApp, limits: ConnectionLimits | None = None, **kwargs: Any) -> Any:
    """A uvicorn.Config serving `app` whose connections follow `limits` (default ConnectionLimits());
    kwargs go to uvicorn.Config."""
    import uvicorn

    kwargs.setdefault("ws", "none")  # no WebSocket endpoints: an upgrade stays an HTTP request
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
) -> Starlette:
    """The ASGI application serving `engine` (which the caller closes when the server has stopped).

    model_id: the name /v1/models gives (never a local path: pass the folder's name). api_key: every
    request must then send `Authorization: Bearer <api_key>` (an empty key is a ValueError, not "no
    key"). max_audio_seconds: the longest audio a request may hold, as decoded. upload_dir: where
    uploads are written while they are transcribed (default: a private temporary folder, removed at
    shutdown). words_unavailable: why word timestamps are refused, when the engine has no aligner.
    host: the address the server is bound to; the Host header must name it, localhost, 127.0.0.1,
    ::1 or one of allowed_hosts ("*": any); bound to every interface (0.0.0.0, ::), any IP address
    and the machine's name are accepted too. cors_origins: the browser origins (e.g.
    "https://app.example", "*" for any) allowed to make cross-origin requests; others are refused
    (403), as are those of every other origin when it is empty.

    Run it with `uvicorn_config`, whose connections have deadlines and a bound on their number.
    """
    if api_key is not None and not api_key.strip():
        raise ValueError("api_key is empty: give a key, or None for an open server")
    owned = upload_dir is None
    folder = Path(tempfile.mkdtemp(prefix="mlxasr-uploads-") if owned else upload_dir)
    server = _Server(
        engine,
        model_id=model_id,
        api_key=api_key,
        max_upload_bytes=int(max_upload_bytes),
        max_queue_seconds=float(max_queue_seconds),
        max_audio_seconds=float(max_audio_seconds),
        upload_dir=folder,
        words_unavailable=words_unavailable or "it was started without a forced aligner",
        access=_Access.build(host, allowed_hosts, cors_origins),
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            server.waiters.shutdown(wait=False, cancel_futures=True)
            if owned:
                shutil.rmtree(folder, ignore_errors=True)

    app = Starlette(
        routes=[
            Route("/v1/audio/transcriptions", _route(server.transcriptions), methods=["POST"]),
            Route("/v1/models", _route(server.models), methods=["GET"]),
            Route("/v1/models/{model:path}", _route(server.model), methods=["GET"]),
            Route("/health", _route(server.health), methods=["GET"]),
        ],
        middleware=[Middleware(_Guard, server=server)],
        exception_handlers={HTTPException: _http_error, Exception: _internal_error},
        lifespan=lifespan,
    )
    app.state.server = server
    return app
