"""mlxasr: transcribe audio and video files and folders to TXT, SRT, WebVTT and JSON."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import sys
import threading
import time
import unicodedata
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from mlx_qwen3asr import __version__, tune_malloc
from mlx_qwen3asr.audio.features import AudioError
from mlx_qwen3asr.audio.files import estimate_duration, is_silent
from mlx_qwen3asr.audio.vad import VadOptions
from mlx_qwen3asr.checkpoints.loading import DTYPES, load, require_kind
from mlx_qwen3asr.cli.stdio import open_closed_standard_streams
from mlx_qwen3asr.outputs.cues import CueOptions, format_timestamp
from mlx_qwen3asr.outputs.folder import (
    FileJob,
    OutputClash,
    TranscribeOptions,
    existing_outputs,
    find_inputs,
    output_problem,
    outputs_older_than_input,
    plan_jobs,
    prepare_output_folder,
    remove_stale_temporaries,
    write_outputs,
)
from mlx_qwen3asr.outputs.render import FORMATS
from mlx_qwen3asr.pipeline.inputs import DEFAULT_MAX_SEGMENT_SECONDS
from mlx_qwen3asr.pipeline.result import Segment
from mlx_qwen3asr.pipeline.scheduler import InputResult, transcribe_stream
from mlx_qwen3asr.runtime.backend import tuning
from mlx_qwen3asr.text.prompt import ContextError, check_context, read_context_file, resolve_language

DEFAULT_MODEL = "Qwen/Qwen3-ASR-0.6B"
MODEL_ENV = "MLXASR_MODEL"
DEFAULT_ALIGNER = "Qwen/Qwen3-ForcedAligner-0.6B"
ALIGNER_ENV = "MLXASR_ALIGNER"

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
EXIT_TERMINATED = 143  # 128 + SIGTERM

# Limits of the numeric options. A segment must hold at least one 100-frame (1 s) mel chunk; at
# 1200 s (the official pipeline's longest input) its audio tokens and token budget still fit well
# inside the decoder's 65536 positions.
SEGMENT_SECONDS_RANGE = (1.0, 1200.0)
CUE_SECONDS_RANGE = (CueOptions.min_duration, 3600.0)
LINE_WIDTH_RANGE = (10, 1000)
LINE_COUNT_RANGE = (1, 20)
BATCH_SIZE_RANGE = (1, 256)
PAUSE_SECONDS_RANGE = (0.05, 10.0)
CUE_GAP_RANGE = (0.0, 1.0)
CPS_RANGE = (1.0, 100.0)
WORDS_PER_LINE_RANGE = (1, 100)
VAD_THRESHOLD_RANGE = (0.01, 0.99)

DESCRIPTION = """\
Transcribe audio and video files with Qwen3-ASR on MLX. Folders are searched recursively
(hidden files skipped). Each output goes beside its input, named like the input without its
extension ("talk.m4a" -> "talk.srt"), or under --output-dir: each folder argument under its own
name mirroring its tree ("rec/a/b.wav" -> "DIR/rec/a/b.srt"), each file argument at the top.
Files whose outputs all exist are skipped, so an interrupted run resumes."""

EPILOG = f"""\
examples:
  mlxasr ./recordings --srt
  mlxasr talk.m4a interview.wav -f srt,vtt,json -o subtitles/
  mlxasr ./lectures --txt --language en --context-file names.txt

existing outputs:
  An existing output file is never replaced unless --overwrite is given. A file whose requested
  outputs all exist is skipped (said so if the input is newer than them); one with some of them
  missing is transcribed and only the missing ones are written, the others are kept and named.
  An output that appears while its file is being transcribed is kept too.

exit status:
  {EXIT_OK}    every file was transcribed, or skipped because its outputs exist
  {EXIT_FAILED}    some input failed (missing path, unreadable or undecodable file, FIFO or device,
       output folder not writable, output name too long or taken by a folder); the other files
       were still processed, the summary lists the failures
  {EXIT_USAGE}    usage error (bad option, unknown --language, unreadable --context-file, none of
       the PATHs exists, files of two PATHs with the same output path), no output folder can be
       written, the model could not be loaded, or it is a forced aligner rather than a speech
       recognition model; nothing is written
  {EXIT_INTERRUPTED}  interrupted with Ctrl-C: finished files are kept, no partial or temporary files
       are left, and rerunning resumes ({EXIT_TERMINATED} for SIGTERM)

The model is loaded only when there is something to transcribe; the default model can be set
with the {MODEL_ENV} environment variable."""


class _Terminated(BaseException):
    """SIGTERM, turned into an exception so that the same cleanup as for Ctrl-C runs."""


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _stop(signum: int, frame: object) -> None:
    """The first Ctrl-C or SIGTERM stops the run; those that follow (a key held down, a storm of
    signals) are ignored while the run cleans up and prints its summary."""
    for sig in _STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise _Terminated()


@contextmanager
def _signal_handlers(restore_after_stop: bool = True) -> Iterator[None]:
    """Install _stop for the run; afterwards put the caller's handlers back. A process that is
    about to exit after a stop (the `mlxasr` command) keeps ignoring further signals instead, so
    that the tail of a Ctrl-C storm cannot interrupt the summary or the exit."""
    # Ctrl-C raises KeyboardInterrupt even when the parent started us with SIGINT ignored.
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {sig: signal.signal(sig, _stop) for sig in _STOP_SIGNALS}
    try:
        yield
    finally:
        stopped = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        if restore_after_stop or not stopped:
            for sig, handler in old.items():
                signal.signal(sig, handler)


# --- arguments ----------------------------------------------------------------------------------


def _format_list(value: str) -> list[str]:
    names = [v.strip().lower() for v in value.split(",") if v.strip()]
    if not names:
        raise argparse.ArgumentTypeError("empty format list")
    for name in names:
        if name != "all" and name not in FORMATS:
            raise argparse.ArgumentTypeError(
                f"invalid format {name!r} (choose from {', '.join(FORMATS)}, all)"
            )
    return names


def _int_in(limits: tuple[int, int]):
    low, high = limits

    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {value!r}") from None
        if not low <= n <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high}, got {n}")
        return n

    return parse


def _number_in(limits: tuple[float, float], unit: str = "seconds"):
    low, high = limits

    def parse(value: str) -> float:
        try:
            x = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
        if not (math.isfinite(x) and low <= x <= high):
            within = f"between {low:g} and {high:g}" + (f" {unit}" if unit else "")
            raise argparse.ArgumentTypeError(f"must be {within}, got {value}")
        return x

    return parse


def _range(limits: tuple[float, float]) -> str:
    return f"{limits[0]:g} to {limits[1]:g}"


def build_parser() -> argparse.ArgumentParser:
    """The mlxasr argument parser."""
    p = argparse.ArgumentParser(
        prog="mlxasr",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="audio or video files and folders")

    out = p.add_argument_group("output (without a format option, a .txt transcript is written)")
    for fmt, text in (
        ("txt", "plain-text transcript, one paragraph per segment"),
        ("srt", "SubRip subtitles"),
        ("vtt", "WebVTT subtitles"),
        ("json", "text, language, segments with flags, cues, model and options"),
    ):
        out.add_argument(f"--{fmt}", dest="formats", action="append_const", const=fmt, help=text)
    out.add_argument(
        "-f",
        "--output-format",
        dest="format_lists",
        action="append",
        type=_format_list,
        metavar="FMT",
        help="txt, srt, vtt, json or all; repeat the option or separate with commas",
    )
    out.add_argument(
        "-o",
        "--output-dir",
        type=Path,
        metavar="DIR",
        help="write outputs under DIR: a folder argument as DIR/<its name>/<its tree>, a file argument at the top "
        "(default: beside inputs)",
    )
    out.add_argument(
        "--overwrite",
        action="store_true",
        help="transcribe every file and replace its existing outputs (without it, existing outputs are kept)",
    )
    out.add_argument("--dry-run", action="store_true", help="list what would be done, and do nothing")

    model = p.add_argument_group("model")
    model.add_argument(
        "--model",
        default=os.environ.get(MODEL_ENV) or DEFAULT_MODEL,
        metavar="M",
        help=f"checkpoint folder or Hugging Face repo id (default: ${MODEL_ENV} or {DEFAULT_MODEL})",
    )
    model.add_argument(
        "--dtype",
        choices=sorted(DTYPES),
        default=None,
        help="compute dtype (default: bfloat16 on a GPU, float32 on CPU)",
    )
    words = model.add_mutually_exclusive_group()
    words.add_argument(
        "--word-timestamps",
        dest="word_timestamps",
        action="store_true",
        default=None,
        help="time every word with the forced aligner (default: on when SRT or VTT is written)",
    )
    words.add_argument(
        "--no-word-timestamps",
        dest="word_timestamps",
        action="store_false",
        help="estimate cue times from the text and the pauses instead of timing words",
    )
    model.add_argument(
        "--aligner",
        default=None,
        metavar="A",
        help=f"forced aligner checkpoint folder or repo id (default: ${ALIGNER_ENV} or {DEFAULT_ALIGNER}); "
        "loaded only when words are timed",
    )

    rec = p.add_argument_group("recognition")
    rec.add_argument(
        "--language",
        metavar="L",
        help="force the language, by name or code (English, en, zh, ...); default: detect per segment",
    )
    ctx = rec.add_mutually_exclusive_group()
    ctx.add_argument("--context", metavar="TEXT", help="text that biases recognition: names, terms, topic")
    ctx.add_argument("--context-file", type=Path, metavar="F", help="read the --context text from a file")
    rec.add_argument(
        "--max-segment-seconds",
        type=_number_in(SEGMENT_SECONDS_RANGE),
        default=DEFAULT_MAX_SEGMENT_SECONDS,
        metavar="S",
        help=f"longest piece of audio given to the model at once, cut at the quietest point "
        f"({_range(SEGMENT_SECONDS_RANGE)}; default: {DEFAULT_MAX_SEGMENT_SECONDS:g})",
    )
    rec.add_argument(
        "--vad",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="speech detection (Silero VAD): only the stretches where someone speaks are transcribed, "
        "so noise, music and silence give no text (default: on; --no-vad sends all the audio)",
    )
    rec.add_argument(
        "--vad-threshold",
        type=_number_in(VAD_THRESHOLD_RANGE, unit=""),
        default=None,
        metavar="P",
        help=f"speech probability from which audio counts as speech; lower keeps quieter speech and lets in "
        f"more noise ({_range(VAD_THRESHOLD_RANGE)}; default: {VadOptions.threshold:g})",
    )
    rec.add_argument(
        "--batch-size",
        type=_int_in(BATCH_SIZE_RANGE),
        default=None,
        metavar="N",
        help=f"segments decoded together, from one long file or from several files ({_range(BATCH_SIZE_RANGE)}; "
        "default: as many as a quarter of the free memory holds KV caches for, at most "
        f"{tuning().max_batch}); lower it if memory is short",
    )

    cues = p.add_argument_group("subtitle cues")
    defaults = CueOptions()
    cues.add_argument(
        "--max-line-width",
        type=_int_in(LINE_WIDTH_RANGE),
        default=defaults.max_width,
        metavar="N",
        help=f"display cells per line; CJK characters count two ({_range(LINE_WIDTH_RANGE)}; "
        f"default: {defaults.max_width})",
    )
    cues.add_argument(
        "--max-line-count",
        type=_int_in(LINE_COUNT_RANGE),
        default=defaults.max_lines,
        metavar="N",
        help=f"lines per cue ({_range(LINE_COUNT_RANGE)}; default: {defaults.max_lines})",
    )
    cues.add_argument(
        "--max-cue-seconds",
        type=_number_in(CUE_SECONDS_RANGE),
        default=defaults.max_duration,
        metavar="S",
        help=f"longest time a cue stays on screen, where the text can be split ({_range(CUE_SECONDS_RANGE)}; "
        f"default: {defaults.max_duration:g})",
    )
    cues.add_argument(
        "--highlight-words",
        action="store_true",
        help="underline the word being spoken in SRT (<u>) and tag each word's time in VTT (needs word timing)",
    )
    cues.add_argument(
        "--max-words-per-line",
        type=_int_in(WORDS_PER_LINE_RANGE),
        default=None,
        metavar="N",
        help=f"words per subtitle line at most, with word timing ({_range(WORDS_PER_LINE_RANGE)}; default: no limit)",
    )
    cues.add_argument(
        "--pause-seconds",
        type=_number_in(PAUSE_SECONDS_RANGE),
        default=defaults.pause,
        metavar="S",
        help=f"a pause between words this long ends a cue ({_range(PAUSE_SECONDS_RANGE)}; default: {defaults.pause:g})",
    )
    cues.add_argument(
        "--min-cue-gap",
        type=_number_in(CUE_GAP_RANGE),
        default=defaults.min_gap,
        metavar="S",
        help=f"time between two cues at least, with word timing ({_range(CUE_GAP_RANGE)}; default: {defaults.min_gap:g})",
    )
    cues.add_argument(
        "--max-chars-per-second",
        type=_number_in(CPS_RANGE, "characters per second"),
        default=defaults.max_cps,
        metavar="N",
        help=f"reading speed a cue keeps to where the text allows ({_range(CPS_RANGE)}; default: {defaults.max_cps:g})",
    )

    talk = p.add_mutually_exclusive_group()
    talk.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    talk.add_argument(
        "-v", "--verbose", action="store_true", help="print each segment's text as it is recognised"
    )
    p.add_argument("--version", action="version", version=f"mlxasr {__version__}")
    return p


def _formats(args: argparse.Namespace) -> list[str]:
    chosen = set(args.formats or [])
    for names in args.format_lists or []:
        chosen.update(FORMATS if "all" in names else names)
    return [f for f in FORMATS if f in chosen] or ["txt"]


# --- output ---------------------------------------------------------------------------------------


_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# Bidirectional overrides and isolates reorder the text around them on a terminal.
_BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _escape(ch: str) -> str:
    code = ord(ch)
    if ch in _ESCAPES:
        return _ESCAPES[ch]
    if 0xDC80 <= code <= 0xDCFF:  # a byte of a file name that is not valid UTF-8
        return f"\\x{code - 0xDC00:02x}"
    if ch in _BIDI_CONTROLS or unicodedata.category(ch) in ("Cc", "Cs", "Zl", "Zp"):
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
    return ch


def _printable(text: str) -> str:
    """text with control characters (newline, tab, ESC, ...), line separators, bidirectional controls
    and the undecodable bytes of file names written as escapes (\\n, \\t, \\x1b, \\xe9), so that a
    message stays one line and cannot drive the terminal."""
    if text.isprintable():
        return text
    return "".join(_escape(ch) for ch in text)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _seconds(s: float) -> str:
    if s < 60:
        return f"{s:.1f} s"
    m, s = divmod(int(round(s)), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


@dataclass
class Summary:
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


def _discard_output(stream: TextIO) -> None:
    """Point a stream whose pipe is closed at the null device, so that flushing it (at exit too)
    cannot fail again."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, stream.fileno())
        finally:
            os.close(null)


class _Realtime(ProgressColumn):
    """Audio seconds per wall-clock second."""

    def render(self, task: Task) -> Text:
        return Text(f"{task.speed:.1f}x realtime" if task.speed else "", style="cyan")


class Reporter:
    """Progress and messages: a rich progress bar on a terminal, plain log lines otherwise,
    nothing but errors when quiet. Errors and warnings go to stderr."""

    def __init__(self, out: TextIO, err: TextIO, *, quiet: bool = False, verbose: bool = False) -> None:
        self.out, self.err = out, err
        self.quiet, self.verbose = quiet, verbose
        self.console = Console(file=out, highlight=False, soft_wrap=True)
        self.rich = not quiet and self.console.is_terminal
        self._progress: Progress | None = None
        self._task = None
        self._done_seconds = 0.0
        self._remaining_estimate = 0.0
        self._file_estimate = 0.0
        self._gone: set[int] = set()  # streams whose reader has gone

    def write(self, stream: TextIO, line: str) -> None:
        """One line to a stream, whatever the mode."""
        if id(stream) in self._gone:
            return
        line = _printable(line)
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
            self._progress.console.print(Text(_printable(line)))
        else:
            self.write(self.out, line)

    def _problem(self, kind: str, line: str, style: str) -> None:
        line = f"{kind}: {line}"
        if self._progress is not None and self.err.isatty():
            # Same terminal: print above the live bar instead of tearing through it.
            self._progress.console.print(Text(_printable(line), style=style))
        else:
            self.write(self.err, line)

    def error(self, line: str) -> None:
        self._problem("error", line, "red")

    def warning(self, line: str) -> None:
        if not self.quiet:
            self._problem("warning", line, "yellow")

    # Progress over the audio of the files being transcribed.

    def start(self, estimates: Sequence[float]) -> None:
        self._remaining_estimate = float(sum(estimates))
        if not self.rich:
            return
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            _Realtime(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=self.console,
            redirect_stderr=self.err.isatty(),
        )
        self._progress.start()
        self._task = self._progress.add_task("", total=max(self._remaining_estimate, 1e-6))

    def batch_started(self, count: int, batch_size: int | None) -> None:
        if self._progress is not None:
            self._progress.update(self._task, description=f"0/{count} files")
        elif batch_size:
            self.info(f"transcribing {count} file(s), {batch_size} segment(s) at a time")
        else:
            self.info(
                f"transcribing {count} file(s), up to {tuning().max_batch} segments at a time as memory allows"
            )

    def segment(self, seg: Segment, source: Path | None = None) -> None:
        """A transcribed segment; source names its file when segments of several files interleave."""
        if self._progress is not None:
            self._progress.advance(self._task, seg.end - seg.start)
        if self.verbose:
            stamp = f"{format_timestamp(seg.start, '.')} --> {format_timestamp(seg.end, '.')}"
            where = "" if source is None else f"{source} "
            self.info(f"  {where}[{stamp}] {_one_line(seg.text)}")

    def file_finished(self, finished: int, count: int, estimate: float, actual_seconds: float | None) -> None:
        """Replace a file's estimated duration by what it really was (None: it failed)."""
        self._remaining_estimate -= estimate
        self._done_seconds += actual_seconds or 0.0
        if self._progress is not None:
            total = self._done_seconds + self._remaining_estimate
            self._progress.update(
                self._task,
                completed=self._done_seconds,
                total=max(total, 1e-6),
                description=f"{finished}/{count} files",
            )

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def summary(self, s: Summary) -> None:
        if self.quiet:
            return
        hours = s.audio_seconds / 3600
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
            table.add_row("audio", f"{hours:.2f} h ({_seconds(s.audio_seconds)})")
            table.add_row("wall time", _seconds(s.wall_seconds))
            table.add_row("speed", f"{s.speed:.1f}x realtime")
            self.console.print(table)
            if s.failed:
                failures = Table(title="failed", title_justify="left")
                failures.add_column("file", overflow="fold")
                failures.add_column("reason", overflow="fold")
                for path, reason in s.failed:
                    failures.add_row(_printable(path), _printable(reason))
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
        line += f"; {hours:.2f} h of audio in {_seconds(s.wall_seconds)} wall time ({s.speed:.1f}x realtime)"
        self.write(self.out, line)
        for path, reason in s.failed:
            self.write(self.out, f"  failed: {path}: {reason}")


# --- the run --------------------------------------------------------------------------------------


def _model_error(model: str, e: BaseException) -> str:
    reason = _one_line(str(e)) or type(e).__name__
    for prefix in (model, str(Path(model).expanduser()), str(Path(model).expanduser().resolve())):
        if reason.startswith(prefix + ": "):
            reason = reason[len(prefix) + 2 :]
    return f"model {model}: {reason}"


def _write_error(e: OSError) -> str:
    where = f" in {Path(e.filename).parent}" if e.filename else ""
    return f"cannot write output{where} ({(e.strerror or str(e)).lower()})"


@dataclass
class _Plan:
    """What a run does with one input, decided before the model is loaded."""

    job: FileJob
    keep: list[Path]  # existing outputs, left as they are
    skip: bool = False  # every requested output exists: not transcribed
    stale: bool = False  # skipped although the input changed after some of its outputs
    replace: list[Path] = field(default_factory=list)  # existing outputs replaced (--overwrite)
    problem: str | None = None  # why its outputs cannot be written: the file fails, untranscribed


def _plan(job: FileJob, overwrite: bool) -> _Plan:
    problem = output_problem(job)
    if problem is not None:
        return _Plan(job, [], problem=problem)
    existing = [job.outputs[fmt] for fmt in existing_outputs(job)]
    if overwrite:
        return _Plan(job, [], replace=existing)
    skip = len(existing) == len(job.outputs)
    return _Plan(job, existing, skip, skip and outputs_older_than_input(job))


def _paths(paths: Sequence[Path]) -> str:
    return ", ".join(str(p) for p in paths)


def _use_overwrite(paths: Sequence[Path]) -> str:
    return f"use --overwrite to replace {'it' if len(paths) == 1 else 'them'}"


def _dry_run(plans: list[_Plan], input_errors: int, report: Reporter, out: TextIO) -> int:
    kept = 0
    for plan in plans:
        job = plan.job
        if plan.problem is not None:
            report.write(out, f"fail: {job.path}: {plan.problem}")
            continue
        if plan.skip:
            why = "outputs exist but are older than it; use --overwrite" if plan.stale else "outputs exist"
            report.write(out, f"skip ({why}): {job.path} -> {_paths(list(job.outputs.values()))}")
            continue
        line = f"transcribe: {job.path} -> {_paths([p for p in job.outputs.values() if p not in plan.keep])}"
        if plan.keep:
            kept += len(plan.keep)
            line += f"; keeping existing {_paths(plan.keep)} ({_use_overwrite(plan.keep)})"
        if plan.replace:
            line += f"; replacing existing {_paths(plan.replace)}"
        report.write(out, line)
    todo = sum(not plan.skip and plan.problem is None for plan in plans)
    failed = input_errors + sum(plan.problem is not None for plan in plans)
    skipped = sum(plan.skip for plan in plans)
    line = f"dry run: {todo} to transcribe, {skipped} skipped, {failed} failed"
    if kept:
        line += f", {kept} existing output(s) kept"
    report.write(out, line)
    return EXIT_FAILED if failed else EXIT_OK


def _prepare_folders(
    todo: list[FileJob], report: Reporter, summary: Summary, created: list[Path]
) -> tuple[list[FileJob], bool]:
    """Create and probe every folder the files to transcribe will be written to, and clean our stale
    temporary files out of them. Files whose folder cannot be written fail here, before the model is
    loaded. Returns the files left, and whether any folder could be written at all."""
    folders = list(dict.fromkeys(p.parent for job in todo for p in job.outputs.values()))
    problems: dict[Path, str] = {}
    for folder in folders:
        reason = prepare_output_folder(folder, created)
        if reason is not None:
            problems[folder] = reason
            continue
        for stale in remove_stale_temporaries(folder):
            report.info(f"removed {stale}, a temporary file left by an interrupted run")
    ready = []
    for job in todo:
        reason = next((problems[p.parent] for p in job.outputs.values() if p.parent in problems), None)
        # Looked at again now that the folders exist: one made for other files may take an output's name.
        reason = reason or output_problem(job)
        if reason is None:
            ready.append(job)
        else:
            summary.failed.append((str(job.path), reason))
            report.error(f"{job.path}: {reason}")
    return ready, len(problems) < len(folders)


def _remove_created(created: list[Path]) -> None:
    # Folders this run made and nothing was written to (the run stopped before any output).
    for folder in reversed(created):
        with contextlib.suppress(OSError):
            folder.rmdir()


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    started = time.monotonic()
    # Checks that need neither the model nor any audio come first.
    try:
        language = resolve_language(args.language)
    except ValueError as e:
        parser.error(f"argument --language: {e}")
    context = args.context or ""
    if args.context_file is not None:
        try:
            context = read_context_file(args.context_file)  # bounded in bytes and, for a pipe, in time
        except ContextError as e:
            parser.error(f"argument --context-file: {_printable(str(args.context_file))}: {e}")
    if args.output_dir is not None and args.output_dir.exists() and not args.output_dir.is_dir():
        parser.error(f"argument -o/--output-dir: {_printable(str(args.output_dir))} is not a folder")
    formats = _formats(args)
    cue_options = CueOptions(
        max_width=args.max_line_width,
        max_lines=args.max_line_count,
        max_duration=args.max_cue_seconds,
        pause=args.pause_seconds,
        min_gap=args.min_cue_gap,
        max_cps=args.max_chars_per_second,
        max_words_per_line=args.max_words_per_line,
    )
    if args.word_timestamps is None:  # timing words matters for subtitles, not for a transcript
        args.word_timestamps = bool({"srt", "vtt"} & set(formats))
    if args.vad_threshold is not None and not args.vad:
        parser.error("argument --vad-threshold: has no effect with --no-vad")
    if args.highlight_words and not args.word_timestamps:
        parser.error("argument --highlight-words: needs word timing (drop --no-word-timestamps)")
    options = TranscribeOptions(
        language=language,
        context=context,
        max_segment_seconds=args.max_segment_seconds,
        cues=cue_options,
        word_timestamps=args.word_timestamps,
        highlight_words=args.highlight_words,
        vad=VadOptions(threshold=args.vad_threshold or VadOptions.threshold) if args.vad else None,
    )

    report = Reporter(out, err, quiet=args.quiet, verbose=args.verbose)
    summary = Summary()
    inputs, input_errors = find_inputs(args.paths)
    for problem in input_errors:
        report.error(str(problem))
        summary.failed.append((problem.path, problem.reason))
    if not any(os.path.lexists(p) for p in args.paths):
        return EXIT_USAGE
    if not inputs and not input_errors:  # a refused input has had its own line
        report.warning("no audio or video files found in " + ", ".join(map(str, args.paths)))

    try:
        jobs = plan_jobs(inputs, formats, args.output_dir)
    except OutputClash as e:
        parser.error(_printable(str(e)))
    plans = [_plan(job, args.overwrite) for job in jobs]
    if args.dry_run:
        return _dry_run(plans, len(input_errors), report, out)

    for plan in plans:
        if plan.problem is not None:
            summary.failed.append((str(plan.job.path), plan.problem))
            report.error(f"{plan.job.path}: {plan.problem}")
    plans = [plan for plan in plans if plan.problem is None]
    todo = [plan.job for plan in plans if not plan.skip]
    skipped = [plan for plan in plans if plan.skip]
    summary.skipped = len(skipped)
    if skipped:
        report.info(f"skipping {len(skipped)} file(s) whose outputs exist (--overwrite replaces them)")
        for plan in skipped:
            if plan.stale:
                report.info(
                    f"skipped {plan.job.path}: its outputs exist but are older than it; use --overwrite"
                )
            elif args.verbose:
                report.info(f"  skipped {plan.job.path}")

    status = EXIT_OK
    if todo:
        created: list[Path] = []
        todo, writable = _prepare_folders(todo, report, summary, created)
        if not writable:
            _remove_created(created)
            report.error("no output folder can be written; nothing was transcribed")
            return EXIT_USAGE
        try:
            status = _transcribe_all(todo, args, options, report, summary)
        except KeyboardInterrupt:
            status = EXIT_INTERRUPTED
        except _Terminated:
            status = EXIT_TERMINATED
        finally:
            report.stop()
        if status == EXIT_USAGE:
            _remove_created(created)
            return status
    summary.interrupted = status in (EXIT_INTERRUPTED, EXIT_TERMINATED)
    summary.remaining = len(todo) - summary.processed
    summary.wall_seconds = time.monotonic() - started
    if summary.interrupted:
        report.write(err, "mlxasr: interrupted; finished files are kept, rerun to resume")
    report.summary(summary)
    if summary.interrupted:
        return status
    return EXIT_FAILED if summary.failed else EXIT_OK


def _transcribe_all(
    todo: list[FileJob],
    args: argparse.Namespace,
    options: TranscribeOptions,
    report: Reporter,
    summary: Summary,
) -> int:
    report.info(f"loading model {args.model}")
    t0 = time.monotonic()
    try:
        model = load(args.model, dtype=args.dtype)
        require_kind(model, "asr")  # a forced aligner reads its timestamp classes as words
    except Exception as e:  # missing, unreadable, mismatched or wrong-kind checkpoints stop the run here
        report.error(_model_error(args.model, e))
        return EXIT_USAGE
    try:
        if options.context:
            check_context(model.tokenizer, options.context)  # length and control tokens need the tokenizer
    except ContextError as e:
        where = f"--context-file {args.context_file}" if args.context_file is not None else "--context"
        report.error(f"{where}: {e}")
        return EXIT_USAGE
    aligner = None
    if options.word_timestamps:
        source = _aligner_source(args)
        named = bool(args.aligner or os.environ.get(ALIGNER_ENV))
        aligner, status = _load_aligner(source, named, args, report)
        if status is not None:
            return status
        options = replace(options, aligner=None if aligner is None else source)
    timing = f", words timed by {options.aligner}" if options.aligner else ""
    report.info(f"loaded in {time.monotonic() - t0:.1f} s; transcribing {len(todo)} file(s){timing}")

    estimates = [estimate_duration(j.path) for j in todo]
    report.start(estimates)
    report.batch_started(len(todo), args.batch_size)
    started = time.monotonic()
    stream = transcribe_stream(
        model,
        [j.path for j in todo],
        language=options.language,
        context=options.context,
        max_segment_seconds=options.max_segment_seconds,
        batch_size=args.batch_size,  # None: each batch sized from its segments and the free memory
        skip=is_silent,  # silent audio is not sent to the model (it would only invent text)
        vad=options.vad or False,
        on_segment=lambda index, seg: report.segment(seg, todo[index].path if len(todo) > 1 else None),
        aligner=aligner,
    )
    try:
        for res in stream:
            job = todo[res.index]
            reason = _finish_one(job, res, args, options, report, summary)
            summary.processed += 1
            seconds = None if reason is not None else res.transcription.duration
            report.file_finished(summary.processed, len(todo), estimates[res.index], seconds)
            if reason is not None:
                summary.failed.append((str(job.path), reason))
                report.error(f"{job.path}: {reason}")
                continue
            summary.done += 1
            summary.audio_seconds += seconds
            summary.work_seconds = time.monotonic() - started
            report.info(f"[{summary.processed}/{len(todo)}] done {job.path}: {_seconds(seconds)} of audio")
    finally:
        stream.close()
    return EXIT_OK


def _aligner_source(args: argparse.Namespace) -> str:
    return args.aligner or os.environ.get(ALIGNER_ENV) or DEFAULT_ALIGNER


def _load_aligner(source: str, named: bool, args: argparse.Namespace, report: Reporter):
    """(the forced aligner or None, an exit status when the run must stop).

    One named with --aligner or the environment must load (a usage error otherwise, as a bad --model);
    when the default cannot be had (not cached and the hub unreachable), cue times are estimated.
    """
    report.info(f"loading aligner {source}")
    try:
        aligner = load(source, dtype=args.dtype)
        require_kind(aligner, "aligner")
    except Exception as e:
        reason = _model_error(source, e).removeprefix(f"model {source}: ")
        if named:
            report.error(f"aligner {source}: {reason}")
            return None, EXIT_USAGE
        report.warning(
            f"aligner {source}: {reason}; cue times are estimated from the text instead "
            f"(name an aligner with --aligner or ${ALIGNER_ENV}, or pass --no-word-timestamps)"
        )
        return None, None
    return aligner, None


def _failure(e: BaseException) -> str:
    if isinstance(e, AudioError):
        return e.reason
    if isinstance(e, OSError):
        return _write_error(e)
    return f"{type(e).__name__}: {_one_line(str(e))}"


def _finish_one(
    job: FileJob,
    res: InputResult,
    args: argparse.Namespace,
    options: TranscribeOptions,
    report: Reporter,
    summary: Summary,
) -> str | None:
    """Write one transcribed file's outputs; returns why the file failed, or None."""
    if res.error is not None:
        return _failure(res.error)
    problem = output_problem(job)  # what took an output's name while the file was transcribed
    if problem is not None:
        return problem
    try:
        written = write_outputs(
            job,
            res.transcription,
            res.wav,
            options,
            model_name=args.model,
            silent=res.skipped,
            overwrite=args.overwrite,
        )
    except Exception as e:  # a failure in one file must not end the batch
        return _failure(e)
    # A folder or other non-regular file that appeared in an output's place at the last moment is no
    # output kept: the file has no transcript there.
    taken = next((p for p in written.kept if not os.path.isfile(p)), None)
    if taken is not None:
        return f"output {taken} is not a regular file"
    if written.kept:
        summary.kept += len(written.kept)
        report.info(f"kept existing {_paths(written.kept)} ({_use_overwrite(written.kept)})")
    warnings = []
    if written.silent:
        warnings.append("silent audio, nothing to transcribe; the outputs are empty")
    flagged = [s for s in written.transcription.segments if s.truncated or s.repetitive]
    if flagged:
        warnings.append(
            f"{len(flagged)} segment(s) ran into a loop or the token limit; "
            "their text may be incomplete (flagged in JSON output)"
        )
    # What decoding noticed about the file (e.g. audio shorter than its header states).
    warnings.extend(str(w) for w in getattr(res.transcription, "warnings", None) or [])
    for warning in warnings:
        report.warning(f"{job.path}: {warning}")
    summary.warned += bool(warnings)
    if args.verbose and written.written:
        report.info("  wrote " + _paths(written.written))
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run mlxasr with the given arguments (default: sys.argv[1:]); returns the exit status.

    `mlxasr serve ...` starts the transcription server instead (mlx_qwen3asr.cli.serve).
    """
    return _main(argv, restore_after_stop=True)


def _main(argv: Sequence[str] | None, restore_after_stop: bool) -> int:
    open_closed_standard_streams()  # before any file is opened: none may take fd 0, 1 or 2
    tune_malloc()  # freed activations are reused rather than page-faulted in afresh (mlx_qwen3asr.runtime.cpu)
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["serve"] and not os.path.exists("serve"):
        from mlx_qwen3asr.cli.serve import main as serve

        return serve(args_list[1:], exiting=not restore_after_stop)
    parser = build_parser()
    with _signal_handlers(restore_after_stop):
        try:
            args = parser.parse_args(args_list)
            return _run(parser, args, sys.stdout, sys.stderr)
        except SystemExit as e:  # argparse's usage errors, --help and --version
            return e.code if isinstance(e.code, int) else (EXIT_OK if e.code is None else EXIT_USAGE)
        except KeyboardInterrupt:  # before any file was being transcribed, e.g. while walking folders
            print("mlxasr: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
        except _Terminated:
            print("mlxasr: terminated", file=sys.stderr)
            return EXIT_TERMINATED


def entry() -> None:
    """The `mlxasr` command: main(), then exit with its status.

    After Ctrl-C (or SIGTERM) the process ends at once rather than waiting for model work already
    queued on the device (a long prefill can run for many seconds more): every finished output is
    written and closed by then, and no temporary file is left. `mlxasr serve` always leaves this
    way, its engine's thread left running (see mlx_qwen3asr.cli.serve.main).
    """
    status = _main(None, restore_after_stop=False)
    serving = sys.argv[1:2] == ["serve"] and not os.path.exists("serve")
    if status in (EXIT_INTERRUPTED, EXIT_TERMINATED) or serving:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


if __name__ == "__main__":
    entry()
