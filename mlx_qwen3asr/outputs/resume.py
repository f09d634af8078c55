"""Resuming a run: whether a file's outputs are up to date with it, and the redo marker a run told to
replace outputs (--overwrite) leaves until it has, so that a later run redoes the file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from mlx_qwen3asr.outputs.naming import FileJob
from mlx_qwen3asr.runtime.atomic import atomic_write_bytes

__all__ = [
    "REDO_SUFFIX",
    "clear_redo",
    "is_up_to_date",
    "mark_redo",
    "outputs_older_than_input",
    "redo_marker",
    "redo_pending",
]


def _stats(job: FileJob) -> tuple[int, list[os.stat_result | None]] | None:
    """The input's modification time and each output's stat (None where it cannot be read);
    None when the input itself cannot be read."""
    try:
        source = os.stat(job.path).st_mtime_ns
    except OSError:
        return None
    outs: list[os.stat_result | None] = []
    for out in job.outputs.values():
        try:
            outs.append(os.stat(out))
        except OSError:
            outs.append(None)
    return source, outs


def outputs_older_than_input(job: FileJob) -> bool:
    """Whether some existing output was last modified before the input was."""
    source, outs = _stats(job) or (0, [])
    return any(st is not None and st.st_mtime_ns < source for st in outs)


def is_up_to_date(job: FileJob) -> bool:
    """Whether every output exists and was modified after the input."""
    source, outs = _stats(job) or (0, [])
    return bool(outs) and all(
        st is not None and stat.S_ISREG(st.st_mode) and st.st_mtime_ns > source for st in outs
    )


# A run told to replace a file's existing outputs (--overwrite) leaves ".<output stem>.mlxasr-redo"
# beside them until it has; a later run without --overwrite redoes such a file rather than skip it.
REDO_SUFFIX = ".mlxasr-redo"


def redo_marker(job: FileJob) -> Path | None:
    """Where job's redo marker goes (None for a job without outputs)."""
    first = next(iter(job.outputs.values()), None)
    if first is None:
        return None
    return first.parent / f".{os.path.splitext(first.name)[0]}{REDO_SUFFIX}"


def mark_redo(job: FileJob) -> bool:
    """Record that job's existing outputs are to be replaced; whether the record could be written."""
    marker = redo_marker(job)
    if marker is None:
        return False
    try:
        atomic_write_bytes(marker, b"")
    except OSError:
        return False
    return True


def clear_redo(job: FileJob) -> None:
    """Forget job's redo record (its outputs have been replaced)."""
    marker = redo_marker(job)
    if marker is not None:
        try:
            os.unlink(marker)
        except OSError:
            pass


def redo_pending(job: FileJob) -> bool:
    """Whether a run told to replace job's outputs stopped before it had."""
    marker = redo_marker(job)
    return marker is not None and os.path.isfile(marker)
