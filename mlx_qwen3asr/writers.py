"""Transcript documents (TXT, SRT, WebVTT, JSON) and crash-safe writing of them."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

from .subtitles import Cue, clean_text, format_timestamp
from .transcribe import Transcription

__all__ = [
    "FORMATS",
    "atomic_write_files",
    "atomic_write_text",
    "render",
    "render_json",
    "render_srt",
    "render_txt",
    "render_vtt",
]

FORMATS: tuple[str, ...] = ("txt", "srt", "vtt", "json")
# Temporary files start with a dot so folder walks and file browsers pass over them.
TEMP_SUFFIX = ".tmp"


def render_txt(result: Transcription) -> str:
    """The transcript as plain text, one paragraph per segment (pieces of up to ~30 s of audio)."""
    paragraphs = [clean_text(s.text) for s in result.segments]
    paragraphs = [p for p in paragraphs if p]
    if not paragraphs and result.text.strip():
        paragraphs = [clean_text(result.text)]
    return "\n\n".join(paragraphs) + "\n" if paragraphs else ""


def render_srt(cues: Sequence[Cue]) -> str:
    """SubRip: numbered blocks, HH:MM:SS,mmm times, a blank line after each block."""
    return "".join(
        f"{i}\n{format_timestamp(c.start)} --> {format_timestamp(c.end)}\n{c.text}\n\n"
        for i, c in enumerate(cues, 1)
    )


def _vtt_escape(text: str) -> str:
    # '&' and '<' start character references and tags in cue text.
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def render_vtt(cues: Sequence[Cue]) -> str:
    """WebVTT: the WEBVTT header, then one block per cue with HH:MM:SS.mmm times."""
    blocks = [
        f"{format_timestamp(c.start, '.')} --> {format_timestamp(c.end, '.')}\n{_vtt_escape(c.text)}\n"
        for c in cues
    ]
    return "WEBVTT\n\n" + "\n".join(blocks)


def _displayable(text: str) -> str:
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _as_dict(obj: Any) -> dict[str, Any]:
    return asdict(obj) if is_dataclass(obj) else dict(vars(obj))


def render_json(
    result: Transcription,
    cues: Sequence[Cue],
    *,
    model: str | None = None,
    options: Mapping[str, Any] | None = None,
) -> str:
    """Everything in one document: text, language, segments with their flags, cues, model and options."""
    doc = {
        "text": result.text,
        "language": result.language,
        "duration": result.duration,
        "truncated": any(s.truncated for s in result.segments),
        "repetitive": any(s.repetitive for s in result.segments),
        "segments": [
            {k: d[k] for k in ("start", "end", "text", "language", "truncated", "repetitive")}
            for d in (_as_dict(s) for s in result.segments)
        ],
        "cues": [c.to_dict() for c in cues],
        "model": model,
        "options": dict(options or {}),
        # A file name that is not valid UTF-8 carries surrogate escapes, which JSON text cannot hold.
        "source": None if result.source is None else _displayable(result.source),
    }
    return json.dumps(doc, ensure_ascii=False, indent=2) + "\n"


def render(
    fmt: str,
    result: Transcription,
    cues: Sequence[Cue],
    *,
    model: str | None = None,
    options: Mapping[str, Any] | None = None,
) -> str:
    """The document for one of FORMATS."""
    if fmt == "txt":
        return render_txt(result)
    if fmt == "srt":
        return render_srt(cues)
    if fmt == "vtt":
        return render_vtt(cues)
    if fmt == "json":
        return render_json(result, cues, model=model, options=options)
    raise ValueError(f"unknown output format {fmt!r}: use one of {', '.join(FORMATS)}")


def _new_file_mode(path: Path) -> int:
    try:
        return os.stat(path).st_mode & 0o7777
    except OSError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask


def _write_temp(path: Path, text: str) -> str:
    """A fully written and synced temporary file beside path; returns its name."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent)
    try:
        # mkstemp creates the file 0600; give it the mode a plain open() would.
        os.fchmod(fd, _new_file_mode(path))
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp


def _sync_dir(folder: Path) -> None:
    # Makes the renames durable; some platforms cannot open a directory, which is fine to skip.
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM until the block ends, then act on them as the previous handlers would."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    sigs = [signal.SIGINT, signal.SIGTERM]
    previous = {sig: signal.signal(sig, lambda signum, frame: received.append(signum)) for sig in sigs}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for signum in dict.fromkeys(received):
            handler = previous[signum]
            if callable(handler):
                handler(signum, None)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(signum)


def atomic_write_files(files: Mapping[str | os.PathLike[str], str]) -> None:
    """Write several UTF-8 text files so that each is either complete or untouched.

    Every file is first written to a temporary file in its own folder and synced; only then are they
    renamed over their targets, with Ctrl-C held back so that the set is renamed together. On any
    error or interrupt the temporary files are removed.
    """
    pending: list[tuple[str, Path]] = []
    try:
        for target, text in files.items():
            path = Path(target)
            pending.append((_write_temp(path, text), path))
        with _interrupts_deferred():
            while pending:
                tmp, path = pending[0]
                os.replace(tmp, path)
                pending.pop(0)
    finally:
        for tmp, _ in pending:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    for folder in {Path(p).parent for p in files}:
        _sync_dir(folder)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write a UTF-8 text file atomically: temporary file in the same folder, fsync, rename."""
    atomic_write_files({path: text})
