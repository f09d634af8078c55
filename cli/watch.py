"""`mlxasr PATH... --watch`: after the first pass over what exists, the PATHs are polled and every audio
file that is new or has changed is transcribed once it has stopped growing, by the same models (loaded
once for the whole watch).

What the watch knows of a file is the state (size, modification time, inode) in which it was last
handled: transcribed, skipped or failed. A file is handled again only once it is in another state and
has held that state over two polls in a row, so a file still being copied in is not read half-written,
nothing is transcribed twice, and a file that failed waits until it changes. A new file follows the
resume rules of a rerun (all of its outputs there and up to date: skipped); a file that changed after it
was handled, or whose outputs are older than it, has its outputs replaced, through the same redo marker
as `--overwrite` (a stop before they are replaced leaves a rerun to redo it)."""

from __future__ import annotations

import argparse
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from mlx_qwen3asr.cli.options import EXIT_OK, EXIT_USAGE
from mlx_qwen3asr.cli.plan import plan_file, prepare_folders
from mlx_qwen3asr.cli.reporter import Reporter, Summary
from mlx_qwen3asr.cli.signals import raise_if_stopped
from mlx_qwen3asr.outputs.folder import (
    FileJob,
    InputError,
    InputFile,
    OutputClash,
    find_inputs,
    mark_redo,
    outputs_older_than_input,
    plan_jobs,
)

__all__ = ["WATCH_INTERVAL", "WATCH_INTERVAL_RANGE", "Stamp", "Tracker", "Watch", "stamp_of"]

# Seconds between two looks at the watched PATHs (--watch-interval), and the range the option takes.
WATCH_INTERVAL = 1.0
WATCH_INTERVAL_RANGE = (0.1, 3600.0)
# The longest single wait on the stop event: where a timed wait is not cut short by a signal (macOS),
# Ctrl-C and SIGTERM are still acted on within it.
WAIT_SLICE = 0.25
# A file that holds its state but cannot be opened yet (another program has it locked) is waited for
# over this many more polls, then handed over anyway, so that its error is said once.
UNREADABLE_POLLS = 3

# A regular file's size, modification time in nanoseconds, inode and device.
Stamp = tuple[int, int, int, int]


def stamp_of(path: str | os.PathLike[str]) -> Stamp | None:
    """The state of a regular file (Stamp); None when it is gone or is not a regular file."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev


def _opens(path: Path) -> bool:
    """Whether the file can be opened for reading now (never blocking: it is a regular file)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return False
    os.close(fd)
    return True


class Tracker:
    """Which of the inputs found are due: in another state than the one they were last handled in (new
    files have none), and holding it over two polls in a row."""

    def __init__(self) -> None:
        self.handled: dict[Path, Stamp] = {}
        # The files not handled in their present state: that state, and the polls since it was first seen.
        self._seen: dict[Path, tuple[Stamp, int]] = {}

    def know(self, inputs: Iterable[InputFile]) -> None:
        """Take inputs as handled in their present state (the files of the first pass)."""
        for inp in inputs:
            st = stamp_of(inp.path)
            if st is not None:
                self.handled[inp.path] = st

    def due(self, inputs: Iterable[InputFile]) -> list[tuple[InputFile, Stamp]]:
        """The inputs to handle now, each with its state. Files that are gone are forgotten until they
        come back; a file that is handled keeps its record, so that one put back unchanged is not
        transcribed again."""
        seen: dict[Path, tuple[Stamp, int]] = {}
        ready: list[tuple[InputFile, Stamp]] = []
        for inp in inputs:
            st = stamp_of(inp.path)
            if st is None or self.handled.get(inp.path) == st:
                continue
            before, polls = self._seen.get(inp.path, (None, -1))
            polls = polls + 1 if before == st else 0
            if polls >= 1 and (polls > UNREADABLE_POLLS or _opens(inp.path)):
                ready.append((inp, st))
            else:
                seen[inp.path] = (st, polls)
        self._seen = seen
        return ready


class Watch:
    """The polling after the first pass: each poll finds the inputs of the PATHs as a run does, plans
    the due ones' outputs as a rerun would name them, and hands the files to transcribe to
    `transcribe`, which writes their outputs and returns EXIT_OK, or EXIT_USAGE when the models cannot
    be loaded (the watch then stops with that status). Errors are said once each, as long as they
    last. Waits are on `stop` (ended when it is set) and are cut short by Ctrl-C and SIGTERM, whose
    exceptions reach the caller as in a run."""

    def __init__(
        self,
        paths: Sequence[str | os.PathLike[str]],
        formats: Sequence[str],
        output_dir: Path | None,
        *,
        overwrite: bool,
        report: Reporter,
        summary: Summary,
        interval: float = WATCH_INTERVAL,
        stop: threading.Event | None = None,
    ) -> None:
        self.paths = [os.fspath(p) for p in paths]
        self.formats, self.output_dir, self.overwrite = list(formats), output_dir, overwrite
        self.report, self.summary, self.interval = report, summary, interval
        self.stop = stop if stop is not None else threading.Event()
        self.tracker = Tracker()
        self._told: set[tuple[str, str]] = set()  # the input errors said, while they last
        self._clashed: set[Path] = set()  # files that failed because another's outputs have their names

    @classmethod
    def of(
        cls,
        args: argparse.Namespace,
        paths: Sequence[str | os.PathLike[str]],
        formats: Sequence[str],
        report: Reporter,
        summary: Summary,
    ) -> Watch:
        """The watch that --watch and --watch-interval ask for over paths, outputs named as the run
        names them (--output-dir, --overwrite)."""
        interval = WATCH_INTERVAL if args.watch_interval is None else args.watch_interval
        return cls(
            paths,
            formats,
            args.output_dir,
            overwrite=args.overwrite,
            report=report,
            summary=summary,
            interval=interval,
        )

    def start(self, inputs: Sequence[InputFile], errors: Sequence[InputError]) -> None:
        """What the first pass found: its inputs as handled in their present state (taken before the
        pass reads them, so that a file still growing then is transcribed again once complete), its
        errors as said."""
        self.tracker.know(inputs)
        self._told = {(e.path, e.reason) for e in errors}

    def run(self, transcribe: Callable[[list[FileJob]], int]) -> int:
        """Say what is watched, then poll until `stop` is set; returns EXIT_OK, or EXIT_USAGE from
        `transcribe`."""
        if not self.report.quiet:
            paths = ", ".join(self.paths)
            self.report.write(self.report.err, f"watching {paths} for new audio (Ctrl-C to stop)")
        while not self._pause():
            raise_if_stopped()
            if self.poll(transcribe) == EXIT_USAGE:
                return EXIT_USAGE
        return EXIT_OK

    def _pause(self) -> bool:
        """Wait one interval on `stop`, in slices of at most WAIT_SLICE; whether it was set."""
        deadline = time.monotonic() + self.interval
        while (left := deadline - time.monotonic()) > 0:
            if self.stop.wait(min(left, WAIT_SLICE)):
                return True
        return self.stop.is_set()

    def poll(self, transcribe: Callable[[list[FileJob]], int]) -> int:
        """One look at the PATHs: the due files handled; the status of `transcribe` (EXIT_OK when there
        was nothing to transcribe)."""
        inputs, errors = find_inputs(self.paths)
        self._tell(errors)
        ready = self.tracker.due(inputs)
        if not ready:
            return EXIT_OK
        changed = {inp.path for inp, _ in ready if inp.path in self.tracker.handled}
        for inp, st in ready:  # whatever comes of it, a file is not handled again in this state
            self.tracker.handled[inp.path] = st
        jobs = self._plan(inputs, [inp for inp, _ in ready])
        replacing: set[Path] = set()
        todo = [job for job in jobs if self._take(job, job.path in changed, replacing)]
        if not todo:
            return EXIT_OK
        todo, _ = prepare_folders(todo, self.report, self.summary, [])
        for job in todo:
            if job.path in replacing:
                mark_redo(job)  # its outputs are replaced (outputs.folder.redo_pending), or redone by a rerun
        return transcribe(todo) if todo else EXIT_OK

    def _fail(self, path: Path | str, reason: str) -> None:
        self.summary.failed.append((str(path), reason))
        self.report.error(f"{path}: {reason}")

    def _tell(self, errors: Sequence[InputError]) -> None:
        """Say the input errors not said at the last poll. A path that is gone by now vanished while
        the folders were walked: dropped without a word, unless it is a PATH itself."""
        told: set[tuple[str, str]] = set()
        for error in errors:
            if error.path not in self.paths and not os.path.lexists(error.path):
                continue
            key = (error.path, error.reason)
            told.add(key)
            if key not in self._told:
                self._fail(error.path, error.reason)
        self._told = told

    def _plan(self, inputs: list[InputFile], ready: list[InputFile]) -> list[FileJob]:
        """The jobs of the ready inputs, their outputs named as a rerun over all inputs names them. A
        ready file whose outputs would take the path of another argument's file's outputs fails."""
        wanted = {inp.path for inp in ready}
        try:
            jobs = plan_jobs(inputs, self.formats, self.output_dir)
        except OutputClash:
            handled = self.tracker.handled
            accepted = [i for i in inputs if i.path in handled and i.path not in wanted | self._clashed]
            try:
                plan_jobs(accepted, self.formats, self.output_dir)
            except OutputClash:
                accepted = []
            for inp in ready:
                try:
                    plan_jobs([*accepted, inp], self.formats, self.output_dir)
                except OutputClash as e:
                    self._clashed.add(inp.path)
                    self._fail(inp.path, str(e))
                    continue
                accepted.append(inp)
            jobs = plan_jobs(accepted, self.formats, self.output_dir)
        self._clashed -= {job.path for job in jobs}
        return [job for job in jobs if job.path in wanted]

    def _take(self, job: FileJob, changed: bool, replacing: set[Path]) -> bool:
        """Whether a due file is transcribed; adds it to replacing when its existing outputs are to be
        replaced. A file whose outputs cannot be written fails; one whose outputs all exist, none older
        than it, is skipped unless it changed after it was handled."""
        plan = plan_file(job, self.overwrite)
        if plan.problem is not None:
            self._fail(job.path, plan.problem)
            return False
        if plan.replace and not plan.redo:  # --overwrite; a redo marker already replaces
            replacing.add(job.path)
        elif plan.keep and (changed or outputs_older_than_input(job)):
            replacing.add(job.path)
        elif plan.skip:
            self.summary.skipped += 1
            if self.report.verbose:
                self.report.info(f"  skipped {job.path}")
            return False
        return True
