"""Standard streams for the command entry points (`mlxasr`, `mlxasr serve`, `mlxasr-convert`)."""

from __future__ import annotations

import os
import sys

__all__ = ["open_closed_standard_streams"]

_STREAMS = ((0, "stdin", os.O_RDONLY, "r"), (1, "stdout", os.O_WRONLY, "w"), (2, "stderr", os.O_WRONLY, "w"))


def open_closed_standard_streams() -> None:
    """Open the null device on whichever of file descriptors 0, 1 and 2 is closed.

    A command started with `<&-`, `>&-` or `2>&-` has no such descriptor, and the next file it opens
    would take that number: a checkpoint read as standard input (MLX then fails to load it), or a
    transcript that messages and native warnings are written into. Python leaves sys.stdin, sys.stdout
    or sys.stderr as None then; each gets a stream on the null device, so reading finds end of file
    and writing goes nowhere.
    """
    for fd, name, flags, mode in _STREAMS:
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        null = os.open(os.devnull, flags)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        os.set_inheritable(fd, True)  # as a standard stream is, for the programs started from here
        if getattr(sys, name) is None:
            stream = open(fd, mode, encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
            setattr(sys, name, stream)
