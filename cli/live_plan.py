"""Where an `mlxasr live` session writes: its outputs' names, checked before the model loads, and the
lock that keeps a second session off them."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from mlx_qwen3asr.cli.live_error import LiveError
from mlx_qwen3asr.cli.live_names import outputs_name
from mlx_qwen3asr.cli.live_sources import STDIN
from mlx_qwen3asr.cli.options import EXIT_FAILED, chosen_formats
from mlx_qwen3asr.outputs.folder import (
    FileJob,
    InputFile,
    existing_outputs,
    output_problem,
    output_stem,
    prepare_output_folder,
)

# The outputs' name for a stream that is no file (--name NAME gives another).
STDIN_NAME = "stdin"
MICROPHONE_NAME = "microphone"


def plan_outputs(args: argparse.Namespace) -> FileJob | None:
    """The session's outputs: DIR/NAME.<format> (-o DIR, --name NAME), or None when none is asked for."""
    placed = args.output_dir is not None or args.name is not None
    formats = chosen_formats(args, "txt" if placed else None)
    if not formats:
        return None
    name = args.name
    try:
        name = None if name is None else outputs_name(name)
    except ValueError as e:
        raise LiveError(f"--name {name!r}: {e}") from None
    if args.input is not None:
        source = Path(args.input)
        folder = args.output_dir if args.output_dir is not None else source.parent
        name = name or output_stem(source.name)
    elif placed:
        source = Path(STDIN_NAME if args.source == STDIN else MICROPHONE_NAME)
        folder = args.output_dir if args.output_dir is not None else Path()
        name = name or source.name
    else:
        raise LiveError(
            "outputs of standard input or the microphone need a place: -o DIR (DIR/"
            f"{STDIN_NAME if args.source == STDIN else MICROPHONE_NAME}.txt, ...) or --name NAME"
        )
    outputs = {fmt: folder / f"{name}.{fmt}" for fmt in formats}
    job = FileJob(InputFile(source), outputs)
    if args.input is not None:
        for path in outputs.values():
            if os.path.lexists(path) and os.path.lexists(args.input) and os.path.samefile(path, args.input):
                raise LiveError(f"output {path} would replace the input; name the outputs with --name NAME")
    problem = output_problem(job)
    if problem is not None:
        raise LiveError(problem)
    taken = existing_outputs(job)
    if taken and not args.overwrite:
        names = ", ".join(str(outputs[f]) for f in taken)
        exist = "exists" if len(taken) == 1 else "exist"
        raise LiveError(f"output {names} already {exist}; --overwrite replaces, --name NAME names others")
    problem = prepare_output_folder(folder)
    if problem is not None:
        raise LiveError(problem)
    return job


@contextlib.contextmanager
def outputs_lock(job: FileJob | None) -> Iterator[None]:
    """Hold a lock on the session's output names, so that a second session writing them is refused
    rather than interleaved with this one. An advisory lock on a hidden file beside the outputs: the
    system releases it however the process ends (kill -9 included); the file is removed at the end."""
    if job is None:
        yield
        return
    first = next(iter(job.outputs.values()))
    path = first.parent / f".{first.stem}.mlxasr-live.lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        raise LiveError(
            f"cannot write in {first.parent} ({(e.strerror or str(e)).lower()})", EXIT_FAILED
        ) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise LiveError(
                f"another mlxasr live session is writing {first.with_suffix('')}.*; "
                "give this one another --name NAME or -o DIR"
            ) from None
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
    finally:
        os.close(fd)


__all__ = ["MICROPHONE_NAME", "STDIN_NAME", "outputs_lock", "plan_outputs"]
