"""Crash-safe writing: a file or a folder is either complete or untouched, whatever happens meanwhile.

Each file is written to a temporary file beside it, synced, and only then renamed to its name; a set of
files is renamed together with Ctrl-C held back. A folder (a converted checkpoint) is written into a
temporary folder beside it and renamed into place (replace_folder). Temporary files and folders carry
the writing process's id, so that those left by a killed run can be recognised and removed later
(remove_stale_temporaries, remove_stale_folders).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import secrets
import shutil
import signal
import socket
import stat
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

__all__ = [
    "NAME_MAX",
    "pid_alive",
    "STALE_SECONDS",
    "TEMP_FOLDER",
    "TEMP_PATTERN",
    "TEMP_SUFFIX",
    "atomic_write_bytes",
    "atomic_write_files",
    "atomic_write_text",
    "folder_left_by_killed_run",
    "host_tag",
    "make_temp_folder",
    "name_max",
    "probe_folder",
    "remove_stale_folders",
    "remove_stale_temporaries",
    "replace_folder",
    "temp_folder",
    "temp_name",
]

# Temporary files are named ".<target name>.mlxasr-<pid>-<random>.tmp": the leading dot keeps folder
# walks and file browsers off them, the rest tells ours apart from anyone else's and names the process
# that writes them, so that one left by a killed run can be recognised and removed (see
# remove_stale_temporaries).
TEMP_SUFFIX = ".tmp"
TEMP_PATTERN = re.compile(r"\.(?P<name>.+)\.mlxasr-(?P<pid>[0-9]+)-(?P<token>[0-9a-z]+)\.tmp", re.S)
# Temporary folders, ".<target name>.mlxasr-<pid>-<host>-<random>.<kind>": the folder being written
# (.partial), and an old one being replaced (.old); they name the process and the machine (a hash of
# its host name), since a folder may be shared between machines.
TEMP_FOLDER = re.compile(
    r"\.(?P<name>.+)\.mlxasr-(?P<pid>[0-9]+)-(?P<host>[0-9a-f]{8})-[0-9a-f]+\.(?P<kind>partial|old)", re.S
)
# A temporary file or folder whose process is gone and where nothing was written for this long was
# left by a run that was killed.
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
    return _hidden_name(target_name, f".mlxasr-{os.getpid()}-{secrets.token_hex(4)}{TEMP_SUFFIX}", limit)


def _hidden_name(name: str, tail: str, limit: int) -> str:
    """ "." + name + tail, the name shortened so that the whole is at most limit bytes."""
    room = limit - 1 - len(tail)
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


def _write_temp(path: Path, data: str | bytes) -> Path:
    """A fully written and synced temporary file beside path (text as UTF-8); returns its path."""
    fd, tmp = _create_temp(path.parent, path.name)
    try:
        with os.fdopen(fd, "wb") as f:
            # Created 0600; give it the mode a plain open() would.
            os.fchmod(f.fileno(), _new_file_mode(path))
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
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


def pid_alive(pid: int) -> bool:
    """Whether a process of this pid may be alive (one of another user counts as alive)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists but belongs to someone else, or we cannot tell: leave its files alone
        return True
    return True


def _left_by_killed_run(match: re.Match[str], idle: float, min_age: float) -> bool:
    """Whether a temporary file or folder of ours (its name's match), where nothing was written for
    `idle` seconds, was left by a run that was killed: its process is gone and min_age has passed."""
    return idle >= min_age and not pid_alive(int(match["pid"]))


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
        if not stat.S_ISREG(st.st_mode) or not _left_by_killed_run(match, now - st.st_mtime, min_age):
            continue
        with contextlib.suppress(OSError):
            os.unlink(entry.path)
            removed.append(Path(entry.path))
    return removed


def sync_folder(folder: Path) -> None:
    """Make the names just created, renamed or removed in folder durable (where the platform allows: some
    cannot open a directory, which is fine to skip)."""
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


def atomic_write_files(
    files: Mapping[str | os.PathLike[str], str | bytes], *, replace: bool = True
) -> list[Path]:
    """Write several files (text as UTF-8, bytes as they are) so that each is either complete or untouched.

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
        for target, data in files.items():
            path = Path(target)
            pending.append((_write_temp(path, data), path))
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
        sync_folder(folder)
    return kept


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write a UTF-8 text file atomically: temporary file in the same folder, fsync, rename."""
    atomic_write_files({path: text})


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write a file of bytes atomically: temporary file in the same folder, fsync, rename."""
    atomic_write_files({path: data})


# --------------------------------------------------------------------------------------------------
# Folders
# --------------------------------------------------------------------------------------------------


def host_tag() -> str:
    """This machine, as the temporary folders name it: a short hash of its host name."""
    return hashlib.sha1(socket.gethostname().encode("utf-8", "replace")).hexdigest()[:8]


def temp_folder(folder: Path, name: str, kind: str) -> Path:
    """A fresh temporary folder name ("partial" or "old") beside `folder / name`, within the file
    system's name limit."""
    tail = f".mlxasr-{os.getpid()}-{host_tag()}-{secrets.token_hex(4)}.{kind}"
    return folder / _hidden_name(name, tail, name_max(folder))


def make_temp_folder(folder: Path, name: str) -> Path:
    """Create a new ".partial" temporary folder beside `folder / name` (never an existing one)."""
    for _ in range(100):
        path = temp_folder(folder, name, "partial")
        try:
            path.mkdir()  # the usual permissions (umask), which the rename keeps
        except FileExistsError:
            continue
        return path
    raise FileExistsError(errno.EEXIST, "no free temporary folder name", str(folder))


def _exists(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def _last_written(path: Path) -> float:
    """The latest modification time of a folder and of what it holds (one level: a checkpoint's)."""
    latest = path.lstat().st_mtime
    with contextlib.suppress(OSError), os.scandir(path) as entries:
        for entry in entries:
            with contextlib.suppress(OSError):
                latest = max(latest, entry.stat(follow_symlinks=False).st_mtime)
    return latest


def folder_left_by_killed_run(
    path: Path, match: re.Match[str], *, min_age: float = STALE_SECONDS, now: float | None = None
) -> bool:
    """Whether a temporary folder of ours (its name's match: "pid" and "host") was left by a run that was
    killed: made on this machine, its process gone, nothing in it written for min_age seconds. Raises
    OSError where the folder cannot be read."""
    if match["host"] != host_tag():
        return False
    now = time.time() if now is None else now
    return _left_by_killed_run(match, now - _last_written(path), min_age)


def remove_stale_folders(
    folder: Path, *, min_age: float = STALE_SECONDS, now: float | None = None
) -> tuple[list[Path], list[Path]]:
    """Clear the temporary folders that killed runs left in folder: returns (removed, restored).

    Only folders named like ours (TEMP_FOLDER) made on this machine by a process that no longer exists,
    where nothing was written for min_age seconds, are touched: a live run keeps its folder, whichever
    machine runs it. A `.partial` one is removed. An `.old` one is a folder that was being replaced:
    removed when its replacement is in place, else renamed back to its name.
    """
    now = time.time() if now is None else now
    removed: list[Path] = []
    restored: list[Path] = []
    try:
        with os.scandir(folder) as it:
            found = [(Path(e.path), m) for e in it if (m := TEMP_FOLDER.fullmatch(e.name))]
    except OSError:
        return removed, restored
    for path, match in found:
        try:
            if not stat.S_ISDIR(path.lstat().st_mode):
                continue
            if not folder_left_by_killed_run(path, match, min_age=min_age, now=now):
                continue
            if match["kind"] == "old":
                target = folder / match["name"]
                if not _exists(target):
                    os.rename(path, target)
                    restored.append(target)
                    continue
            shutil.rmtree(path)
            removed.append(path)
        except OSError:
            continue
    return removed, restored


def replace_folder(tmp: Path, dst: Path) -> None:
    """Put the finished folder tmp in the place of the existing dst: dst is renamed aside (".old"),
    tmp renamed to dst, and only then the old one removed; if the second rename fails, dst is put back.
    A run killed in between leaves the ".old" folder, which remove_stale_folders renames back."""
    old = temp_folder(dst.parent, dst.name, "old")
    os.rename(dst, old)
    try:
        os.rename(tmp, dst)
    except BaseException:
        os.rename(old, dst)
        raise
    if old.is_dir() and not old.is_symlink():
        shutil.rmtree(old, ignore_errors=True)
    else:
        old.unlink()
