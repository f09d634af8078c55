"""A read-only folder for tests that run as root, where a folder's mode stops no write: os.open refuses
to create files in it as the kernel would for anyone else."""

from __future__ import annotations

import errno
import os
from pathlib import Path


def read_only_folder(folder: Path, monkeypatch) -> Path:
    """folder, made with mode 0o555, in which os.open refuses O_CREAT with EACCES (until the test ends).
    The caller gives it mode 0o755 back when done, so that pytest can remove it."""
    folder.mkdir()
    folder.chmod(0o555)
    real_open = os.open

    def read_only_open(path, flags, *args, **kwargs):
        if Path(os.fsdecode(path)).parent == folder and flags & os.O_CREAT:
            raise PermissionError(errno.EACCES, "Permission denied", os.fsdecode(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only_open)
    return folder
