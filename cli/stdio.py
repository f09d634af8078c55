"""Standard streams for the command entry points (`mlxasr`, `mlxasr serve`, `mlxasr-convert`)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TextIO

from mlx_qwen3asr.runtime.messages import one_line

__all__ = [
    "STDIN",
    "STDIN_NAME",
    "Say",
    "StdinInput",
    "open_closed_standard_streams",
    "print_transcript",
    "problem_line",
    "spill_stdin",
    "stdin_problem",
]

# The PATH that means audio on standard input, and what messages and output names call that input.
STDIN = "-"
STDIN_NAME = "stdin"

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


def spill_stdin(folder: Path, stream: BinaryIO | None = None) -> Path:
    """Copy standard input (or stream) to folder/stdin, and return that path.

    The audio is decoded from the copy: decoders seek, and a pipe cannot. It is as long as the stream
    is, like any file the user names. Raises OSError when it cannot be read or written.
    """
    source = stream if stream is not None else sys.stdin.buffer
    path = folder / STDIN_NAME
    with open(path, "xb") as copy:
        shutil.copyfileobj(source, copy, 1 << 20)
    return path


def stdin_problem(paths: Sequence[str], formats: Sequence[str], output_dir: Path | None) -> str | None:
    """Why `-` (audio on standard input) cannot be used as asked, or None: with other PATHs it needs
    -o DIR, and without -o only one format can go to standard output; standard input must not be a
    terminal."""
    if STDIN not in paths:
        return None
    if output_dir is None:
        if any(p != STDIN for p in paths):
            return f"{STDIN} (standard input) with other PATHs needs -o DIR"
        if len(formats) > 1:
            return (
                f"{STDIN} without -o writes one format to standard output, not {len(formats)} "
                f"({', '.join(formats)}); choose one, or give -o DIR"
            )
    try:
        terminal = sys.stdin is not None and sys.stdin.isatty()
    except (OSError, ValueError):
        terminal = False
    if terminal:
        return f"{STDIN} reads audio from standard input, which is a terminal; pipe audio in"
    return None


@dataclass
class StdinInput:
    """Audio on standard input, as a folder run takes it: an input named "stdin", read from a copy in a
    temporary folder, whose outputs go to -o DIR, or (without -o) to that folder and then to standard
    output."""

    folder: Path
    to_stdout: bool

    @classmethod
    def make(cls, output_dir: Path | None) -> StdinInput:
        return cls(Path(tempfile.mkdtemp(prefix="mlxasr-stdin-")), output_dir is None)

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def print_transcript(path: Path, out: TextIO) -> None:
    """Write an output written for standard output there, as it is (nothing if it cannot be read)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return
    out.write(text)
    out.flush()


def problem_line(prog: str, kind: str, text: str) -> str:
    """An error or warning as every command prints it, as argparse prints a usage error:
    "mlxasr: error: ...", "mlxasr align: warning: ..." (kind: "error" or "warning")."""
    return f"{prog}: {kind}: {text}"


class Say:
    """What a subcommand tells its user on stderr, one line each, prefixed with its name: information
    (not when quiet), warnings and errors."""

    def __init__(self, prog: str, quiet: bool) -> None:
        self.prog, self.quiet = prog, quiet

    def _line(self, text: str) -> None:
        print(f"{self.prog}: {text}", file=sys.stderr, flush=True)

    def info(self, line: str) -> None:
        if not self.quiet:
            self._line(one_line(line))

    def warning(self, line: str) -> None:
        print(problem_line(self.prog, "warning", one_line(line)), file=sys.stderr, flush=True)

    def error(self, line: str, label: str = "error: ") -> None:
        self._line(f"{label}{one_line(line)}")
