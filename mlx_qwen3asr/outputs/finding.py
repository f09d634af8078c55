"""Finding the audio files a run transcribes: files named as arguments, and those found in folder
arguments (walked once each, links followed, a file reached several ways listed once)."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from mlx_qwen3asr.audio.features import AUDIO_EXTENSIONS
from mlx_qwen3asr.audio.files import not_regular_reason

__all__ = ["InputError", "InputFile", "find_inputs", "is_audio_name"]


@dataclass(frozen=True)
class InputFile:
    path: Path  # as found: the argument, or the folder argument joined with the relative path
    root: Path | None = None  # the folder argument it was found under; None when named directly

    @property
    def relative(self) -> Path:
        """Path under its folder argument (just the name for a file named directly)."""
        return self.path.relative_to(self.root) if self.root is not None else Path(self.path.name)


@dataclass(frozen=True)
class InputError:
    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def is_audio_name(name: str) -> bool:
    """Whether a file name has an audio or video extension that load_audio handles (any case)."""
    ext = os.path.splitext(name)[1]
    return ext[1:].lower() in AUDIO_EXTENSIONS


def _reason(e: OSError) -> str:
    if isinstance(e, FileNotFoundError):
        return "no such file or directory"
    if isinstance(e, PermissionError):
        return "permission denied"
    if e.errno == errno.ELOOP:
        return "symbolic link loop"
    return (e.strerror or str(e)).lower()


def _stat_reason(path: str | os.PathLike[str], e: OSError) -> str:
    """Why stat failed: a symbolic link loop and a link to nothing are told apart."""
    if e.errno == errno.ELOOP:
        return "symbolic link loop"
    if isinstance(e, FileNotFoundError) and os.path.islink(path):
        return "broken symbolic link"
    return _reason(e)


def _preference(inp: InputFile) -> tuple[bool, int, bytes]:
    # A file reached several ways is listed where it sorts first: found in a folder before named on
    # its own, by the outermost folder argument (longest path below it), then by path.
    return inp.root is None, -len(inp.relative.parts), os.fsencode(inp.path)


class _Finder:
    def __init__(self) -> None:
        # By real identity, in the order first reached; which way it is listed does not depend on the
        # order of the arguments (see _preference), so neither do its output names.
        self.files: dict[tuple[int, int], InputFile] = {}
        self.errors: list[InputError] = []
        # Real identities of the folders walked for the current argument: a symlink loop or a folder
        # reached twice is walked once.
        self.seen_dirs: set[tuple[int, int]] = set()

    def add_file(self, path: Path, st: os.stat_result, root: Path | None) -> None:
        key = (st.st_dev, st.st_ino)
        found = InputFile(path, root)
        if key not in self.files or _preference(found) < _preference(self.files[key]):
            self.files[key] = found

    def walk(self, folder: Path, root: Path) -> None:
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as e:
            self.errors.append(InputError(str(folder), f"cannot read folder ({_reason(e)})"))
            return
        for entry in entries:
            if entry.name.startswith("."):
                continue
            path = folder / entry.name
            try:
                is_dir = entry.is_dir()
            except OSError:
                is_dir = False
            if is_dir:
                try:
                    st = entry.stat()
                except OSError as e:
                    self.errors.append(InputError(str(path), _reason(e)))
                    continue
                if (st.st_dev, st.st_ino) not in self.seen_dirs:
                    self.seen_dirs.add((st.st_dev, st.st_ino))
                    self.walk(path, root)
            elif is_audio_name(entry.name):
                try:
                    st = entry.stat()
                except OSError as e:
                    self.errors.append(InputError(str(path), _stat_reason(path, e)))
                    continue
                if stat.S_ISREG(st.st_mode):
                    self.add_file(path, st, root)
                else:
                    # A FIFO would block whoever opens it; devices and sockets are no recordings.
                    self.errors.append(InputError(str(path), not_regular_reason(st.st_mode)))

    def add_argument(self, arg: str | os.PathLike[str]) -> None:
        path = Path(arg)
        try:
            st = os.stat(path)
        except OSError as e:
            self.errors.append(InputError(os.fspath(arg), _stat_reason(path, e)))
            return
        if stat.S_ISDIR(st.st_mode):
            # Every folder argument is walked whole, even one inside another: where its files are
            # listed must not depend on which argument came first.
            self.seen_dirs = {(st.st_dev, st.st_ino)}
            self.walk(path, path)
        elif stat.S_ISREG(st.st_mode):
            # Named explicitly: attempted whatever its extension, and fails cleanly if it is not audio.
            self.add_file(path, st, None)
        else:
            # Never opened: reading a FIFO nobody writes to would block the whole run.
            self.errors.append(InputError(os.fspath(arg), not_regular_reason(st.st_mode)))


def find_inputs(paths: Iterable[str | os.PathLike[str]]) -> tuple[list[InputFile], list[InputError]]:
    """Audio and video files under the given files and folders, in argument order, folders walked
    recursively in sorted name order.

    Hidden files and folders (leading dot) are skipped inside folders; a file reached twice (named
    twice, through a link, inside two arguments) is listed once, whatever the order of the arguments:
    found in a folder rather than named on its own, under the outermost folder argument. Paths that do not exist or cannot be
    read come back as errors, and so do FIFOs, sockets and devices named as arguments or carrying an
    audio extension inside a folder (they are never opened); other files without an audio extension
    inside folders are passed over.
    """
    finder = _Finder()
    for arg in paths:
        finder.add_argument(arg)
    return list(finder.files.values()), finder.errors
