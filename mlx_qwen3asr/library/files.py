"""The audio a library keeps: each transcript's in audio/, each unfinished job's in jobs/.

A file is placed whole or not at all (a hard link, or a copy to a temporary name that is synced and then
renamed), before the row naming it is committed; it is removed after the row naming it is gone. A file no
row names is an orphan, removed once it is ORPHAN_SECONDS old (so that another process's file about to be
committed is left alone). Only the suffix of a user's file name is ever kept, and only a short
alphanumeric one.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
from collections.abc import Mapping, Set
from pathlib import Path

from mlx_qwen3asr.library.errors import LibraryError
from mlx_qwen3asr.runtime.atomic import sync_folder, temp_name
from mlx_qwen3asr.runtime.messages import one_line

__all__ = [
    "AUDIO_FOLDER",
    "JOBS_FOLDER",
    "ORPHAN_SECONDS",
    "audio_suffix",
    "kept_file",
    "place_audio",
    "remove",
    "remove_orphans",
    "sync_folder",
]

AUDIO_FOLDER = "audio"
JOBS_FOLDER = "jobs"
# A file in audio/ or jobs/ that no row names is removed once nothing touched it for this long.
ORPHAN_SECONDS = 60.0
_SUFFIX = re.compile(r"\.[A-Za-z0-9]{1,10}")


def audio_suffix(path: Path) -> str:
    """The suffix an audio file keeps in the library: its own when it is a short alphanumeric
    extension (lower-cased), else ".audio". No other part of a user's file name is ever used."""
    suffix = path.suffix
    return suffix.lower() if _SUFFIX.fullmatch(suffix) else ".audio"


def _age(st: os.stat_result, now: float) -> float:
    """Seconds since the file was last touched: written, linked or renamed."""
    # A hard link or a rename leaves the modification time alone but changes the status-change time.
    return now - max(st.st_mtime, st.st_ctime)


def remove(path: Path | None) -> None:
    """Remove the file, if there is one (a missing file or a failed removal is left to cleanup)."""
    if path is not None:
        with contextlib.suppress(OSError):
            os.unlink(path)


def place_audio(source: Path, folder: Path, stem: str, *, move: bool) -> Path:
    """Put the audio file `source` into folder as <stem><suffix>, whole or not at all: a hard link
    when moving (the source is removed by the caller once the row naming the new file is committed),
    else (or where a link cannot be made) a copy written to a temporary name, synced and renamed."""
    if not source.is_file():
        raise LibraryError(f"{source}: no such audio file")
    target = folder / f"{stem}{audio_suffix(source)}"
    if move:
        try:
            os.link(source, target)
        except OSError:
            pass
        else:
            sync_folder(folder)
            return target
    tmp = folder / temp_name(target.name)
    try:
        with open(source, "rb") as src, open(tmp, "xb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
            dst.flush()
            os.fsync(dst.fileno())
        os.replace(tmp, target)
    except OSError as e:
        remove(tmp)
        raise LibraryError(f"{source}: cannot copy the audio into the library: {one_line(e)}") from None
    sync_folder(folder)
    return target


def kept_file(folder: Path, name: str | None) -> Path | None:
    """The file `name` in folder when a row names one and it is there, else None."""
    if not name:
        return None
    path = folder / name
    return path if path.is_file() else None


def remove_orphans(named: Mapping[Path, Set[str]], min_age: float, now: float) -> list[Path]:
    """Remove the regular files in each folder that are not among its names and that nothing touched
    for min_age seconds; returns those removed. A folder that cannot be read is passed over."""
    removed: list[Path] = []
    for folder, names in named.items():
        try:
            with os.scandir(folder) as it:
                entries = [e for e in it if e.name not in names]
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and _age(st, now) >= min_age:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                    removed.append(Path(entry.path))
    return removed
