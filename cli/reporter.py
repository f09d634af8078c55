"""What `mlxasr` tells the person running it: a progress bar on a terminal or plain log lines, errors and
warnings on stderr, and the summary at the end; every message one line that cannot drive the terminal."""

from __future__ import annotations

import contextlib
import os
import time
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

from mlx_qwen3asr.cli.bar import FittedProgress
from mlx_qwen3asr.cli.stdio import problem_line
from mlx_qwen3asr.outputs.cue_types import format_timestamp
from mlx_qwen3asr.pipeline.result import Segment
from mlx_qwen3asr.runtime.device import tuning
from mlx_qwen3asr.runtime.messages import one_line

__all__ = ["Reporter", "SpeakerWork", "Summary", "duration", "length", "printable"]

_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# Bidirectional overrides and isolates reorder the text around them on a terminal.
_BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")

# Plain log lines: a progress line at most this often (seconds) while files are transcribed.
PROGRESS_EVERY = 10.0
# The bar is moved by progress reports at most this often (seconds); a finished file moves it at once.
BAR_EVERY = 0.25


def _escape(ch: str) -> str:
    code = ord(ch)
    if ch in _ESCAPES:
        return _ESCAPES[ch]
    if 0xDC80 <= code <= 0xDCFF:  # a byte of a file name that is not valid UTF-8
        return f"\\x{code - 0xDC00:02x}"
    if ch in _BIDI_CONTROLS or unicodedata.category(ch) in ("Cc", "Cs", "Zl", "Zp"):
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
    return ch


def printable(text: str) -> str:
    """text with control characters (newline, tab, ESC, ...), line separators, bidirectional controls
    and the undecodable bytes of file names written as escapes (\\n, \\t, \\x1b, \\xe9), so that a
    message stays one line and cannot drive the terminal."""
    if text.isprintable():
        return text
    return "".join(_escape(ch) for ch in text)


def duration(s: float) -> str:
    """Seconds as people read them: "42.0 s", "3:05", "1:02:03"."""
    if s < 60:
        return f"{s:.1f} s"
    m, s = divmod(int(round(s)), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def length(s: float) -> str:
    """An amount of audio or time in words: "42.0 s", "3 min 05 s", "2 h 05 min" (never "0.00 h")."""
    if s < 60:
        return f"{s:.1f} s"
    m, sec = divmod(int(round(s)), 60)
    if m < 60:
        return f"{m} min {sec:02d} s"
    h, m = divmod(m, 60)
    return f"{h} h {m:02d} min"


def files_done(finished: int, count: int, failed: int = 0) -> str:
    """The files finished so far, as the bar's label: "2/6 files", "2/6 files (1 failed)"."""
    return f"{finished}/{count} files" + (f" ({failed} failed)" if failed else "")


@dataclass
class Summary:
    """What a run did, counted as it goes, for the summary at its end."""

    done: int = 0
    skipped: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)
    kept: int = 0  # existing outputs left as they were
    warned: int = 0  # transcribed files with warnings
    audio_seconds: float = 0.0
    work_seconds: float = 0.0
    wall_seconds: float = 0.0
    interrupted: bool = False
    processed: int = 0  # files transcribed or failed in this run
    remaining: int = 0

    @property
    def speed(self) -> float:
        return self.audio_seconds / self.work_seconds if self.work_seconds > 0 else 0.0

    @property
    def speed_text(self) -> str | None:
        """The speed as "4.1x realtime", or None when no audio was transcribed."""
        return f"{self.speed:.1f}x realtime" if self.audio_seconds > 0 and self.work_seconds > 0 else None


@dataclass(frozen=True)
class SpeakerWork:
    """How far the diarizer has got (--diarize), as the bar and the log lines say it."""

    files: int = 0  # files still to diarize, the one it works on included
    key: Any = None  # the file it works on (its position in start's estimates), None between files
    fraction: float | None = None  # the share of that file done, where the diarizer tells
    left: float | None = None  # seconds of diarization left in all, where the diarizer can estimate
    attempt: int = 1  # the run of its speaker-count search
    attempts: int = 1
    waiting: bool = False  # every file is transcribed: the run waits for speakers alone

    def describe(self) -> str:
        """ "finding speakers 40%", "finding speakers 40% (run 2 of 4)" ("" when nothing is left)."""
        if self.files <= 0:
            return ""
        text = "finding speakers"
        if self.fraction is not None:  # never 100% while it still works
            text += f" {min(int(100 * self.fraction), 99)}%"
        if self.attempts > 1:
            text += f" (run {self.attempt} of {self.attempts})"
        return text


def _discard_output(stream: TextIO) -> None:
    """Point a stream whose pipe is closed at the null device, so that flushing it (at exit too)
    cannot fail again."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, stream.fileno())
        finally:
            os.close(null)


class Reporter:
    """Progress and messages: a rich progress bar on a terminal, plain log lines otherwise,
    nothing but errors when quiet. Errors and warnings go to stderr."""

    def __init__(
        self, out: TextIO, err: TextIO, *, quiet: bool = False, verbose: bool = False, prog: str = "mlxasr"
    ) -> None:
        self.out, self.err, self.prog = out, err, prog
        self.quiet, self.verbose = quiet, verbose
        self.console = Console(file=out, highlight=False, soft_wrap=True)
        self.rich = not quiet and self.console.is_terminal
        self._progress: Progress | None = None
        self._task = None
        # Progress over the files: seconds of audio done per file, and what each file counts in the total
        # (its estimated duration, or more once more is done, until it is finished).
        self._done: list[float] = []
        self._totals: list[float] = []
        self._completed = 0.0
        self._total = 0.0
        self._started = self._last_line = self._last_bar = 0.0
        self._failed = 0  # files failed while transcribed, for the bar's label
        self._stages = 1  # passes over each file's audio (start)
        self._gone: set[int] = set()  # streams whose reader has gone
        self._label = ""  # the files finished, as the bar says it
        self._speakers = SpeakerWork()  # how far the diarizer has got (--diarize)
        self._partial = 0.0  # the audio of the file being diarized that counts as done so far

    def write(self, stream: TextIO, line: str) -> None:
        """One line to a stream, whatever the mode."""
        if id(stream) in self._gone:
            return
        line = printable(line)
        try:
            try:
                stream.write(line + "\n")
            except UnicodeEncodeError:
                enc = getattr(stream, "encoding", None) or "ascii"
                stream.write(line.encode(enc, "backslashreplace").decode(enc) + "\n")
            stream.flush()
        except BrokenPipeError:
            # The reader went away (`mlxasr ... | head`): the files are still transcribed and written.
            self._gone.add(id(stream))
            _discard_output(stream)

    def info(self, line: str) -> None:
        if self.quiet:
            return
        if self._progress is not None:
            self._progress.console.print(Text(printable(line)))
        else:
            self.write(self.out, line)

    def _problem(self, kind: str, line: str, style: str) -> None:
        line = problem_line(self.prog, kind, line)
        if self._progress is not None and self.err.isatty():
            # Same terminal: print above the live bar instead of tearing through it.
            self._progress.console.print(Text(printable(line), style=style))
        else:
            self.write(self.err, line)

    def error(self, line: str) -> None:
        self._problem("error", line, "red")

    def warning(self, line: str) -> None:
        if not self.quiet:
            self._problem("warning", line, "yellow")

    # Progress over the audio of the files being transcribed.

    def start(self, estimates: Sequence[float], stages: int = 1) -> None:
        """Files are about to be transcribed: `estimates` holds each one's estimated duration.

        stages: the passes each file's audio goes through (2 when speakers are told apart beside
        transcription); the work of each counts for its share of the file, so that the bar (and the
        speed) measures audio whose every pass is done."""
        self._stages = max(1, int(stages))
        self._totals = [max(float(e), 0.0) for e in estimates]
        self._done = [0.0] * len(self._totals)
        self._completed, self._total = 0.0, sum(self._totals)
        self._failed = 0
        self._label, self._speakers, self._partial = "", SpeakerWork(), 0.0
        self._started = self._last_line = self._last_bar = time.monotonic()
        if not self.rich:
            return
        self._progress = FittedProgress(console=self.console, redirect_stderr=self.err.isatty())
        self._progress.start()
        self._task = self._progress.add_task("", total=max(self._total, 1e-6), label="", speakers="")

    def batch_started(
        self,
        count: int,
        batch_size: int | None,
        *,
        loaded_seconds: float | None = None,
        aligner: str | None = None,
        diarizer: str | None = None,
    ) -> None:
        """One line: how long loading took, the files to transcribe, the batch, the aligner and the
        diarizer."""
        self._label = files_done(0, count)
        if self._progress is not None:
            self._progress.update(self._task, label=self._label)
        if batch_size:
            line = f"transcribing {count} file(s), {batch_size} segment(s) at a time"
        else:
            line = f"transcribing {count} file(s), up to {tuning().max_batch} segments at a time as memory allows"
        if loaded_seconds is not None:
            line = f"loaded in {loaded_seconds:.1f} s; {line}"
        if aligner:
            line += f", words timed by {aligner}"
        if diarizer:
            line += f", speakers told apart by {diarizer} beside it"
        self.info(line)

    def _speed(self, now: float) -> tuple[float | None, float | None]:
        """Seconds of audio per wall-clock second so far and the seconds left (None before any work is
        done, or while unknown). The diarization still to do counts where the diarizer can estimate it:
        it is the time left once every file is transcribed, and the least time left before."""
        elapsed = now - self._started
        done = self._completed + self._partial
        work = self._speakers
        if done <= 0 or elapsed <= 0:
            return None, work.left if work.files and work.left is not None else None
        speed = done / elapsed
        left = max(self._total - done, 0.0) / speed
        if work.files and work.left is not None:
            left = work.left if work.waiting else max(left, work.left)
        return speed, left

    def _show(self, now: float) -> None:
        """Move the bar to the progress so far."""
        speed, left = self._speed(now)
        self._last_bar = now
        self._progress.update(
            self._task,
            completed=min(self._completed + self._partial, self._total),
            total=max(self._total, 1e-6),
            label=self._label,
            speakers=self._speakers.describe(),
            speed=speed,
            left=left,
        )

    def _tick(self, now: float) -> None:
        """Show the progress: the bar at most every BAR_EVERY seconds, a log line every PROGRESS_EVERY."""
        if self._progress is not None:
            if now - self._last_bar >= BAR_EVERY:
                self._show(now)
        elif not self.quiet and now - self._last_line >= PROGRESS_EVERY:
            self._last_line = now
            self.info(self._progress_line(now))

    def _progress_line(self, now: float) -> str:
        speed, left = self._speed(now)
        done = self._completed + self._partial
        share = 100 * done / self._total if self._total > 0 else 100.0
        line = f"progress: {share:.0f}% of {duration(self._total)} of audio"
        if speed is not None:
            line += f", {speed:.1f}x realtime"
        if left is not None:
            line += f", about {duration(left)} left"
        work = self._speakers
        if work.files:
            line += f"; {work.describe()}, {work.files} file(s) to go"
        return line

    def diarizing(self, work: SpeakerWork) -> None:
        """How far the diarizer has got (--diarize): said by the bar and the log lines, the share done of
        the file it works on counted as done, the diarization left counted in the time left. Called
        while the run waits for speakers too, so that the progress never stands still."""
        self._speakers = work
        index = work.key
        partial = 0.0
        if work.fraction is not None and isinstance(index, int) and 0 <= index < len(self._totals):
            # at most the file's share of the pass, less what is counted already
            partial = work.fraction * self._totals[index] / self._stages
            partial = max(0.0, min(partial, self._totals[index] - self._done[index]))
        self._partial = partial
        self._tick(time.monotonic())

    def progress(self, index: int, seconds: float) -> None:
        """Work done on file `index` (its position in start's estimates) by one of its passes, in seconds
        of its audio."""
        if seconds <= 0 or not 0 <= index < len(self._done):
            return
        seconds /= self._stages
        self._done[index] += seconds
        self._completed += seconds
        if self._done[index] > self._totals[index]:  # its estimate fell short
            self._total += self._done[index] - self._totals[index]
            self._totals[index] = self._done[index]
        if index == self._speakers.key:  # what is counted now is no longer the diarizer's partial share
            self._partial = max(0.0, min(self._partial, self._totals[index] - self._done[index]))
        self._tick(time.monotonic())

    def segment(self, seg: Segment, source: Path | None = None) -> None:
        """A transcribed segment (shown with --verbose); source names its file when segments of several
        files interleave."""
        if self.verbose:
            stamp = f"{format_timestamp(seg.start, '.')} --> {format_timestamp(seg.end, '.')}"
            where = "" if source is None else f"{source} "
            self.info(f"  {where}[{stamp}] {one_line(seg.text)}")

    def file_finished(
        self, finished: int, count: int, index: int, actual_seconds: float | None, source: Path | None = None
    ) -> None:
        """File `index` is finished, the `finished`-th of `count`: its real duration (None: it failed,
        and counts for the work done on it) replaces its estimate; the progress never goes back.

        source: name the file on a line of its own, "[2/6] done talk.wav: 42.0 s of audio" or
        "[1/6] failed bad.wav", so that every file takes its place in the count visibly."""
        if 0 <= index < len(self._done):
            done = self._done[index]
            if actual_seconds is not None and actual_seconds > done:  # the work not yet reported
                self._completed += actual_seconds - done
                self._done[index] = done = actual_seconds
            self._total += done - self._totals[index]
            self._totals[index] = done
        self._failed += actual_seconds is None
        self._label = files_done(finished, count, self._failed)
        if self._progress is not None:
            self._show(time.monotonic())
        if source is not None:
            if actual_seconds is None:
                self.info(f"[{finished}/{count}] failed {source}")
            else:
                self.info(f"[{finished}/{count}] done {source}: {duration(actual_seconds)} of audio")

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def summary(self, s: Summary) -> None:
        if self.quiet:
            return
        if self.rich:
            table = Table(title="mlxasr summary", show_header=False, title_justify="left")
            table.add_column(style="bold")
            table.add_column(justify="right")
            table.add_row("transcribed", str(s.done))
            table.add_row("skipped (outputs exist)", str(s.skipped))
            table.add_row("failed", str(len(s.failed)), style="red" if s.failed else None)
            if s.interrupted:
                table.add_row("not finished (interrupted)", str(s.remaining), style="yellow")
            if s.kept:
                table.add_row("existing outputs kept", str(s.kept))
            if s.warned:
                table.add_row("with warnings", str(s.warned), style="yellow")
            table.add_row("audio", length(s.audio_seconds))
            table.add_row("wall time", length(s.wall_seconds))
            if s.speed_text is not None:
                table.add_row("speed", s.speed_text)
            self.console.print(table)
            if s.failed:
                failures = Table(title="failed", title_justify="left")
                failures.add_column("file", overflow="fold")
                failures.add_column("reason", overflow="fold")
                for path, reason in s.failed:
                    failures.add_row(printable(path), printable(reason))
                self.console.print(failures)
            return
        state = "interrupted" if s.interrupted else "summary"
        line = f"{state}: {s.done} transcribed, {s.skipped} skipped, {len(s.failed)} failed"
        if s.interrupted:
            line += f", {s.remaining} not finished"
        if s.kept:
            line += f", {s.kept} existing output(s) kept"
        if s.warned:
            line += f", {s.warned} with warnings"
        line += f"; {length(s.audio_seconds)} of audio in {length(s.wall_seconds)} wall time"
        if s.speed_text is not None:
            line += f" ({s.speed_text})"
        self.write(self.out, line)
        for path, reason in s.failed:
            self.write(self.out, f"  failed: {path}: {reason}")
