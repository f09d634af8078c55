"""Transcript documents (TXT, SRT, WebVTT, JSON) and crash-safe writing of them."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import signal
import stat
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

from mlx_qwen3asr.outputs.cues import Cue, clean_text, format_timestamp, to_milliseconds
from mlx_qwen3asr.pipeline.transcribe import Transcription

__all__ = [
    "FORMATS",
    "NAME_MAX",
    "TEMP_PATTERN",
    "atomic_write_files",
    "atomic_write_text",
    "name_max",
    "probe_folder",
    "render",
    "render_json",
    "render_srt",
    "render_txt",
    "render_vtt",
    "remove_stale_temporaries",
    "temp_name",
]

FORMATS: tuple[str, ...] = ("txt", "srt", "vtt", "json")
# Temporary files are named ".<target name>.mlxasr-<pid>-<random>.tmp": the leading dot keeps folder
# walks and file browsers off them, the rest tells ours apart from anyone else's and names the process
# that writes them, so that one left by a killed run can be recognised and removed (see
# remove_stale_temporaries).
TEMP_SUFFIX = ".tmp"
TEMP_PATTERN = re.compile(r"\.(?P<name>.+)\.mlxasr-(?P<pid>[0-9]+)-(?P<token>[0-9a-z]+)\.tmp", re.S)
# A temporary file lives for the seconds between writing and renaming it; one older than this whose
# process is gone was left by a run that was killed.
STALE_SECONDS = 60.0
# The longest file name in bytes where the file system does not say (NAME_MAX of most file systems).
NAME_MAX = 255
# Errors with which os.link says that the file system has no hard links.
_NO_HARD_LINKS = frozenset(
    e
    for e in (
        errno.EPERM,
        getattr(errno, "EOPNOTSUPP", None),
        getattr(errno, "ENOTSUP", None),
        errno.ENOSYS,
        errno.EMLINK,
        errno.EXDEV,
    )
    if e is not None
)


def render_txt(result: Transcription) -> str:
    """The transcript as plain text, one paragraph per segment (pieces of up to ~30 s of audio)."""
    paragraphs = [clean_text(s.text) for s in result.segments]
    paragraphs = [p for p in paragraphs if p]
    if not paragraphs and result.text.strip():
        paragraphs = [clean_text(result.text)]
    return "\n\n".join(paragraphs) + "\n" if paragraphs else ""


def _word_groups(cue: Cue) -> list[tuple[int, list[int]]]:
    """The cue's words grouped by when they start (milliseconds, within the cue, never decreasing)."""
    first, last = to_milliseconds(cue.start), to_milliseconds(cue.end)
    groups: list[tuple[int, list[int]]] = []
    for k, word in enumerate(cue.words):
        start = min(max(to_milliseconds(word.start), first), max(first, last - 1))
        if groups and start <= groups[-1][0]:
            groups[-1][1].append(k)  # starts no later than the word before: shown together
        else:
            groups.append((start, [k]))
    return groups


def _underlined(cue: Cue, spoken: Sequence[int]) -> str:
    """The cue's text with the given words wrapped in <u>...</u>, line by line."""
    marks = sorted((cue.words[k].char_start, cue.words[k].char_end) for k in spoken)
    out, pos = [], 0
    for start, end in marks:
        out.append(cue.text[pos:start])
        out.append("\n".join(f"<u>{line}</u>" if line else "" for line in cue.text[start:end].split("\n")))
        pos = end
    out.append(cue.text[pos:])
    return "".join(out)


def _srt_entries(cue: Cue, highlight_words: bool) -> list[tuple[float, float, str]]:
    if not (highlight_words and cue.words):
        return [(cue.start, cue.end, cue.text)]
    groups = _word_groups(cue)
    entries = []
    if to_milliseconds(cue.start) < groups[0][0]:
        entries.append((cue.start, groups[0][0] / 1000, cue.text))
    for k, (start, spoken) in enumerate(groups):
        end = groups[k + 1][0] / 1000 if k + 1 < len(groups) else cue.end
        entries.append((start / 1000, end, _underlined(cue, spoken)))
    return entries


def render_srt(cues: Sequence[Cue], *, highlight_words: bool = False) -> str:
    """SubRip: numbered blocks, HH:MM:SS,mmm times, a blank line after each block.

    highlight_words: a cue with words becomes one block per word, from its start to the next word's
    start (the last to the cue's end), showing the cue's text with that word underlined (<u>...</u>).
    """
    entries = [entry for c in cues for entry in _srt_entries(c, highlight_words)]
    return "".join(
        f"{i}\n{format_timestamp(start)} --> {format_timestamp(end)}\n{text}\n\n"
        for i, (start, end, text) in enumerate(entries, 1)
    )


def _vtt_escape(text: str) -> str:
    # '&' and '<' start character references and tags in cue text.
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _vtt_text(cue: Cue, highlight_words: bool) -> str:
    if not (highlight_words and cue.words):
        return _vtt_escape(cue.text)
    out, pos = [], 0
    for start, spoken in _word_groups(cue)[1:]:
        at = cue.words[spoken[0]].char_start
        out.append(_vtt_escape(cue.text[pos:at]))
        out.append(f"<{format_timestamp(start / 1000, '.')}>")
        pos = at
    out.append(_vtt_escape(cue.text[pos:]))
    return "".join(out)


def render_vtt(cues: Sequence[Cue], *, highlight_words: bool = False) -> str:
    """WebVTT: the WEBVTT header, then one block per cue with HH:MM:SS.mmm times.

    highlight_words: in a cue with words, a timestamp tag (<HH:MM:SS.mmm>) before each word after the
    first says when it is spoken, for players that colour the words already said.
    """
    blocks = [
        f"{format_timestamp(c.start, '.')} --> {format_timestamp(c.end, '.')}\n{_vtt_text(c, highlight_words)}\n"
        for c in cues
    ]
    return "WEBVTT\n\n" + "\n".join(blocks)


def _displayable(text: str) -> str:
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _as_dict(obj: Any) -> dict[str, Any]:
    return asdict(obj) if is_dataclass(obj) else dict(vars(obj))


def _ms(seconds: float) -> float | None:
    """Seconds rounded to whole milliseconds; None for a time that is not a finite number."""
    try:
        return to_milliseconds(seconds) / 1000
    except (TypeError, ValueError):
        return None


def _segment_dict(segment: Any) -> dict[str, Any]:
    """A segment's times, text, flags, how its words were timed and the words (times in whole ms)."""
    d = _as_dict(segment)
    out = {k: d[k] for k in ("start", "end", "text", "language", "truncated", "repetitive")}
    out["timing"] = d.get("timing", "estimated")
    out["words"] = [
        {"text": w["text"], "start": _ms(w["start"]), "end": _ms(w["end"])}
        for w in (_as_dict(w) if not isinstance(w, Mapping) else w for w in d.get("words") or [])
    ]
    return out


def render_json(
    result: Transcription,
    cues: Sequence[Cue],
    *,
    model: str | None = None,
    options: Mapping[str, Any] | None = None,
) -> str:
    """Everything in one document: text, language, segments with their flags, timing ("aligned" or
    "estimated") and words (text, start, end), cues, model and options."""
    doc = {
        "text": result.text,
        "language": result.language,
        "duration": result.duration,
        "truncated": any(s.truncated for s in result.segments),
        "repetitive": any(s.repetitive for s in result.segments),
        # The file decoded to less audio than its header states (a cut-off or damaged file).
        "audio_truncated": result.header_duration is not None,
        "header_duration": result.header_duration,
        "warnings": list(result.warnings),
        # Where speech was found ([start, end] in seconds), when speech detection chose what was
        # transcribed; null when it was off.
        "speech": None if result.speech is None else [list(r) for r in result.speech],
        "segments": [_segment_dict(s) for s in result.segments],
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
    highlight_words: bool = False,
) -> str:
    """The document for one of FORMATS; highlight_words marks the spoken word in SRT and WebVTT cues."""
    if fmt == "txt":
        return render_txt(result)
    if fmt == "srt":
        return render_srt(cues, highlight_words=highlight_words)
    if fmt == "vtt":
        return render_vtt(cues, highlight_words=highlight_words)
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


def name_max(folder: str | os.PathLike[str]) -> int:
    """The longest file name, in bytes, that the file system of folder takes (folder, or the nearest
    folder above it that exists; NAME_MAX where the system does not say)."""
    probe = Path(os.path.abspath(folder))
    while not os.path.isdir(probe) and probe != probe.parent:
        probe = probe.parent
    try:
        limit = os.pathconf(probe, "PC_NAME_MAX")
    except (OSError, ValueError):
        return NAME_MAX
    return limit if isinstance(limit, int) and limit > 0 else NAME_MAX


def temp_name(target_name: str, limit: int = NAME_MAX) -> str:
    """A fresh name for one of our temporary files beside a file called target_name, at most limit
    bytes long: the target's name is shortened to make room for the rest."""
    tail = f".mlxasr-{os.getpid()}-{secrets.token_hex(4)}{TEMP_SUFFIX}"
    room = limit - 1 - len(tail)
    name = target_name
    while len(os.fsencode(name)) > room and len(name) > 1:
        name = name[:-1]
    return f".{name}{tail}"


def _create_temp(folder: Path, target_name: str, mode: int = 0o600) -> tuple[int, Path]:
    """Create a new temporary file (never an existing one) in folder; returns its descriptor and path."""
    limit = name_max(folder)
    for _ in range(100):
        tmp = folder / temp_name(target_name, limit)
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), mode), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary file name", str(folder))


def _write_temp(path: Path, text: str) -> Path:
    """A fully written and synced temporary file beside path; returns its path."""
    fd, tmp = _create_temp(path.parent, path.name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            # Created 0600; give it the mode a plain open() would.
            os.fchmod(f.fileno(), _new_file_mode(path))
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp


def probe_folder(folder: str | os.PathLike[str]) -> None:
    """Check that files can be created in folder: create one of our temporary files and remove it.

    Raises OSError (the folder is missing, read-only, full of inodes, not a folder, ...).
    """
    fd, tmp = _create_temp(Path(folder), "write-probe")
    os.close(fd)
    os.unlink(tmp)


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists but belongs to someone else, or we cannot tell: leave its files alone
        return True
    return True


def remove_stale_temporaries(
    folder: str | os.PathLike[str], *, min_age: float = STALE_SECONDS, now: float | None = None
) -> list[Path]:
    """Remove our temporary files left in folder by runs that were killed; returns those removed.

    Only regular files named like ours (TEMP_PATTERN), last modified more than min_age seconds ago,
    whose writing process no longer exists, are removed: a run writing into the same folder right now
    keeps its files.
    """
    now = time.time() if now is None else now
    removed: list[Path] = []
    try:
        with os.scandir(folder) as it:
            entries = [e for e in it if TEMP_PATTERN.fullmatch(e.name)]
    except OSError:
        return removed
    for entry in entries:
        match = TEMP_PATTERN.fullmatch(entry.name)
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode) or now - st.st_mtime < min_age or _pid_alive(int(match["pid"])):
            continue
        with contextlib.suppress(OSError):
            os.unlink(entry.path)
            removed.append(Path(entry.path))
    return removed


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


def _link_new(tmp: Path, path: Path) -> bool:
    """Give the finished temporary file tmp the name path unless path exists; False if it did.

    A hard link fails if the name is taken, whatever appeared there meanwhile, so nothing is ever
    replaced. Where the file system has no hard links, a check and a rename come closest.
    """
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    except OSError as e:
        if e.errno not in _NO_HARD_LINKS:
            raise
        if os.path.lexists(path):
            return False
        os.rename(tmp, path)
        return True
    with contextlib.suppress(OSError):  # a leftover name is removed by the next run as stale
        os.unlink(tmp)
    return True


def atomic_write_files(files: Mapping[str | os.PathLike[str], str], *, replace: bool = True) -> list[Path]:
    """Write several UTF-8 text files so that each is either complete or untouched.

    Every file is first written to a temporary file in its own folder and synced; only then are they
    renamed to their targets, with Ctrl-C held back so that the set is renamed together. On any
    error or interrupt the temporary files are removed.

    replace=True: existing targets are replaced (atomically). replace=False: an existing target is
    never replaced, even one that appears while the files are being written; such targets are left
    as they are and returned.
    """
    pending: list[tuple[Path, Path]] = []
    kept: list[Path] = []
    try:
        for target, text in files.items():
            path = Path(target)
            pending.append((_write_temp(path, text), path))
        with _interrupts_deferred():
            while pending:
                tmp, path = pending[0]
                if replace:
                    os.replace(tmp, path)
                elif not _link_new(tmp, path):
                    kept.append(path)
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
                pending.pop(0)
    finally:
        for tmp, _ in pending:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    for folder in {Path(p).parent for p in files}:
        _sync_dir(folder)
    return kept


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write a UTF-8 text file atomically: temporary file in the same folder, fsync, rename."""
    atomic_write_files({path: text})
