"""Uploads: a multipart/form-data request body read as it arrives, its file part streamed into a file of
our own (counted against the size limit byte by byte), its other fields kept as text."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from python_multipart import MultipartParser
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartState, parse_options_header
from starlette.requests import ClientDisconnect, Request

from mlx_qwen3asr.audio.features import AUDIO_EXTENSIONS
from mlx_qwen3asr.runtime.atomic import STALE_SECONDS, folder_left_by_killed_run, host_tag
from mlx_qwen3asr.runtime.messages import one_line
from mlx_qwen3asr.serve.access import close_after
from mlx_qwen3asr.serve.errors import APIError, ClientGone, too_large

__all__ = ["Upload", "read_upload", "remove_stale_upload_folders", "upload_folder", "write_chunk"]

log = logging.getLogger(__name__)

# Form fields other than the file (model, language, prompt, ...): a prompt of the longest context the
# model takes (8192 tokens) is well under this.
MAX_FIELD_BYTES = 1024 * 1024
# Fields of different names a form may hold, and how often one name may come (a list field may come
# as often as `repeats` says: read_upload).
MAX_NAMES = 64
MAX_REPEATS = 16
# File bytes are gathered up to this much before a write (done off the event loop).
WRITE_CHUNK = 1024 * 1024
# A server's own uploads folder, "mlxasr-uploads-<pid>-<host>-<random>" in the temporary folder: it names
# the process and the machine (atomic.host_tag: a temporary folder may be shared), so that the folder of a
# server that was killed (and could not remove it) is known as such.
UPLOAD_FOLDER = re.compile(r"mlxasr-uploads-(?P<pid>[0-9]+)-(?P<host>[0-9a-f]{8})-[0-9A-Za-z_]+")


def upload_folder(parent: str | os.PathLike[str] | None = None) -> Path:
    """A new folder for this server's uploads, in parent (default: the temporary folder); the folders
    that killed servers left there are removed first (remove_stale_upload_folders)."""
    parent = Path(tempfile.gettempdir() if parent is None else parent)
    for gone in remove_stale_upload_folders(parent):
        log.info("removed %s, the uploads folder of a server that was killed", gone)
    return Path(tempfile.mkdtemp(prefix=f"mlxasr-uploads-{os.getpid()}-{host_tag()}-", dir=parent))


def remove_stale_upload_folders(
    parent: str | os.PathLike[str], *, min_age: float = STALE_SECONDS, now: float | None = None
) -> list[Path]:
    """Remove, with what they hold, the uploads folders in parent of servers that were killed: this user's,
    on this machine, whose process is gone and in which nothing was written for min_age seconds
    (atomic.folder_left_by_killed_run); returns them."""
    removed: list[Path] = []
    try:
        with os.scandir(parent) as it:
            entries = [(Path(e.path), m) for e in it if (m := UPLOAD_FOLDER.fullmatch(e.name))]
    except OSError:
        return removed
    for path, match in entries:
        try:
            st = path.lstat()
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
                continue
            if not folder_left_by_killed_run(path, match, min_age=min_age, now=now):
                continue
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            removed.append(path)
    return removed


# Stores a piece of an upload's file: (path, data, created: whether earlier pieces made the file).
Writer = Callable[[Path, bytes, bool], None]


@dataclass
class Upload:
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

    def __init__(self, boundary: bytes, upload: Upload, repeats: Mapping[str, int]) -> None:
        self.upload, self.repeats = upload, repeats
        self.counts: dict[str, int] = {}
        self.pending = bytearray()  # file bytes not written yet
        self._headers: dict[bytes, bytes] = {}
        self._header_field = bytearray()
        self._header_value = bytearray()
        self._name: str | None = None
        self._is_file = False
        self._value = bytearray()
        self._field_bytes = 0
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
        self._headers, self._name, self._is_file, self._value = {}, None, False, bytearray()

    def _header_end(self) -> None:
        self._headers[bytes(self._header_field).lower()] = bytes(self._header_value)
        self._header_field.clear()
        self._header_value.clear()

    def _headers_finished(self) -> None:
        _, options = parse_options_header(self._headers.get(b"content-disposition", b""))
        self._name = name = options.get(b"name", b"").decode("utf-8", "replace")
        count = self.counts.get(name, 0) + 1
        shown = one_line(name)[:200]
        if count == 1 and len(self.counts) >= MAX_NAMES:
            raise APIError(400, f"too many form fields (at most {MAX_NAMES} different names)", param=shown)
        most = self.repeats.get(name, MAX_REPEATS)
        if count > most:
            raise APIError(400, f"too many {shown} form fields (at most {most})", param=shown)
        self.counts[name] = count
        if name != "file":
            return
        upload = self.upload
        if upload.path is not None:
            raise APIError(400, "only one file can be transcribed per request", param="file")
        filename = options.get(b"filename")
        upload.filename = one_line(filename.decode("utf-8", "replace"))[:200] if filename else None
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


def write_chunk(path: Path, data: bytes, created: bool) -> None:
    """Write data to a new private file at path (created=False) or append it to the one made before."""
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


async def _store(write: Writer, path: Path, data: bytes, created: bool) -> None:
    try:
        await anyio.to_thread.run_sync(write, path, data, created)
    except OSError as e:
        raise _storage_error(e) from None


async def read_upload(
    request: Request,
    folder: Path,
    limit: int,
    write: Writer = write_chunk,
    repeats: Mapping[str, int] | None = None,
) -> Upload:
    """The request's multipart body, the file part streamed into `folder`; bytes are counted as they
    come and the request is refused (413) as soon as they pass `limit`, without reading the rest (the
    connection drops it as it arrives, see close_after).

    A form that ends before its closing boundary (a body cut short, whatever its Content-Length said)
    is refused (400): part of a file is not the file. Raises APIError, or ClientGone; the file is
    removed on any failure. write stores each gathered piece of the file (write_chunk; run off the event
    loop); an OSError from it is answered 507 for a full disk, else 500.

    A form holds fields of at most MAX_NAMES different names, each at most MAX_REPEATS times, or as
    often as repeats gives for its name (a list field); one more is refused (400) naming that field.
    """
    ctype, options = parse_options_header(request.headers.get("content-type"))
    boundary = options.get(b"boundary")
    if ctype != b"multipart/form-data" or not boundary:
        raise APIError(
            400,
            "the request must be a multipart/form-data form with the audio in 'file'",
            close=close_after(request.headers, limit),
        )
    upload = Upload(folder)
    reader = _FormReader(boundary, upload, repeats or {})
    received, created = 0, False
    try:
        async for chunk in request.stream():
            received += len(chunk)
            if received > limit:
                raise too_large(limit)
            try:
                reader.parser.write(chunk)
            except MultipartParseError as e:
                raise APIError(400, f"malformed multipart form ({one_line(e)})") from None
            if len(reader.pending) >= WRITE_CHUNK:
                data, reader.pending = bytes(reader.pending), bytearray()
                await _store(write, upload.path, data, created)
                created = True
        try:
            reader.parser.finalize()
        except MultipartParseError as e:
            raise APIError(400, f"malformed multipart form ({one_line(e)})") from None
        if reader.parser.state != MultipartState.END:
            raise APIError(
                400,
                "the upload is incomplete: the multipart form ends before its closing boundary "
                "(the request body was cut short)",
                code="incomplete_upload",
            )
        if reader.pending or (upload.path is not None and not created):
            await _store(write, upload.path, bytes(reader.pending), created)
    except ClientDisconnect:
        upload.remove()
        raise ClientGone() from None
    except BaseException:
        upload.remove()
        raise
    return upload
