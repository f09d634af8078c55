"""Who said what (--diarize): the options that `mlxasr`, `mlxasr align` and `mlxasr serve` share, the
diarization library reached through one seam (`library`), and DiarizeQueue, which diarizes files on a
worker thread while the engine transcribes them.

The library (mlx_qwen3asr.diarize) is an optional extra. Without it a command that is asked to diarize
says so on one line naming the install command and stops with status 2 before any model loads."""

from __future__ import annotations

import argparse
import os
import threading
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from mlx_qwen3asr.audio.features import SAMPLE_RATE
from mlx_qwen3asr.audio.files import read_audio
from mlx_qwen3asr.cli.models import Messages, load_reason
from mlx_qwen3asr.cli.options import int_in, span
from mlx_qwen3asr.outputs.render import check_speaker_format
from mlx_qwen3asr.pipeline.inputs import samples_in_memory
from mlx_qwen3asr.runtime.messages import one_line

__all__ = [
    "DIARIZER_ENV",
    "INSTALL",
    "DiarizeQueue",
    "Diarization",
    "Outcome",
    "SpeakerPairs",
    "Unavailable",
    "add_diarization",
    "check_diarization",
    "library",
    "load_diarizer",
]

DIARIZER_ENV = "MLXASR_DIARIZER"
# What installs the library, for the one line said when it is missing.
INSTALL = 'pip install "mlx-qwen3asr[diarize]"'  # as mlx_qwen3asr.diarize.INSTALL_COMMAND
SPEAKERS_RANGE = (1, 100)
# Transcribed files waiting for their speakers hold at most this many samples of decoded audio in memory
# (40 minutes, as many as the inputs read ahead may hold); past it the run waits for the diarizer.
WAITING_SAMPLES = 40 * 60 * SAMPLE_RATE
# What a file waiting for speakers the diarizer will never give (its thread ended) fails with.
_LOST = "the diarizer stopped before this file"
# The options that only mean something with --diarize, by their dest.
_NEEDS_DIARIZE = {
    "diarizer": "--diarizer",
    "num_speakers": "--num-speakers",
    "min_speakers": "--min-speakers",
    "max_speakers": "--max-speakers",
    "speaker_names": "--speaker-names",
    "speaker_format": "--speaker-format",
}


class Unavailable(Exception):
    """Speaker diarization cannot run here: the extra is not installed (or this Python cannot run it).
    The message is one line naming the install command."""


def library() -> ModuleType:
    """The diarization API: Turn, DiarizeOptions, DiarizerUnavailable, load_diarizer, assign_speakers,
    rttm_lines. Tests stand another in here. Raises Unavailable when it cannot be imported."""
    try:
        from mlx_qwen3asr import diarize
    except ImportError as e:
        raise Unavailable(f"speaker diarization is not installed ({one_line(str(e))}); {INSTALL}") from e
    return diarize


@dataclass(frozen=True)
class Diarization:
    """What --diarize and its options ask for: the library, its options and the speakers' names."""

    lib: Any
    options: Any  # the library's DiarizeOptions
    names: list[str] | None = None  # named in order of first appearance
    speaker_format: str | None = None  # the SRT/TXT prefix (None: the writers' default)

    def assign(self, transcription: Any, turns: Sequence[Any]) -> Any:
        """transcription with its segments' (and words') speakers from turns."""
        return self.lib.assign_speakers(transcription, list(turns), names=self.names)


def add_diarization(
    parser_or_group, *, speaker_format: bool = True, counts: bool = True, what: str | None = None
) -> None:
    """--diarize (what: what it does, for its help), --diarizer and, with counts, --num-speakers,
    --min-speakers, --max-speakers and --speaker-names; with speaker_format, --speaker-format (the SRT
    and TXT prefix)."""
    g = parser_or_group
    what = what or (
        "tell the speakers apart: every segment and word gets its speaker, subtitles and transcripts "
        "name who speaks, JSON has 'speaker'"
    )
    g.add_argument("--diarize", action="store_true", help=f"{what} (needs the extra: {INSTALL})")
    g.add_argument(
        "--diarizer",
        default=None,
        metavar="DIR",
        help=f"speaker diarization model files on disk (default: ${DIARIZER_ENV}, else the library's own "
        "download)",
    )
    if counts:
        for option, help_text in (
            (
                "--num-speakers",
                f"the number of speakers, when known ({span(SPEAKERS_RANGE)}; default: estimated)",
            ),
            ("--min-speakers", "at least this many speakers (default: no bound)"),
            ("--max-speakers", "at most this many speakers (default: no bound)"),
        ):
            g.add_argument(option, type=int_in(SPEAKERS_RANGE), default=None, metavar="N", help=help_text)
        g.add_argument(
            "--speaker-names",
            default=None,
            metavar="NAMES",
            help='names for the speakers in the order they first speak, comma-separated ("Ana,Bo"); '
            "the others keep Speaker N",
        )
    if speaker_format:
        g.add_argument(
            "--speaker-format",
            default=None,
            metavar="FMT",
            help="how SRT and TXT name the speaker at each change, with {speaker} for the name "
            "(default: '{speaker}: ')",
        )


def _names(value: str) -> list[str]:
    """The names of --speaker-names; ValueError for an empty, repeated or unprintable one."""
    names = [n.strip() for n in value.split(",")]
    if not any(names):
        raise ValueError("no names given")
    for name in names:
        if not name:
            raise ValueError(f"an empty name in {value!r}")
        if not name.isprintable():
            raise ValueError(f"{name!r} holds a control character")
        if any(ch in name for ch in "<>&"):
            raise ValueError(f"{name!r} holds <, > or &, which subtitles cannot show as a name")
    repeated = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if repeated is not None:
        raise ValueError(f"{repeated!r} is named twice")
    return names


def check_diarization(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Diarization | None:
    """What --diarize asks for, checked: usage errors (parser.error) for its options given without it,
    speaker counts that contradict each other, more names than speakers, a bad --speaker-format, and
    (status 2, one line naming the install command) a library that is not installed. None without
    --diarize. Nothing is loaded here."""
    if not getattr(args, "diarize", False):
        for dest, option in _NEEDS_DIARIZE.items():
            if getattr(args, dest, None) is not None:
                parser.error(f"argument {option}: has no effect without --diarize")
        return None
    num = getattr(args, "num_speakers", None)
    low, high = getattr(args, "min_speakers", None), getattr(args, "max_speakers", None)
    if num is not None and (low is not None or high is not None):
        other = "--min-speakers" if low is not None else "--max-speakers"
        parser.error(f"argument --num-speakers: not allowed with {other} (the number is known)")
    if low is not None and high is not None and low > high:
        parser.error(f"argument --min-speakers: {low} is more than --max-speakers {high}")
    names = None
    if getattr(args, "speaker_names", None) is not None:
        try:
            names = _names(args.speaker_names)
        except ValueError as e:
            parser.error(f"argument --speaker-names: {e}")
        most = num if num is not None else high
        if most is not None and len(names) > most:
            parser.error(f"argument --speaker-names: {len(names)} names for at most {most} speaker(s)")
    fmt = None
    if getattr(args, "speaker_format", None) is not None:
        try:
            fmt = check_speaker_format(args.speaker_format)
        except ValueError as e:
            parser.error(f"argument --speaker-format: {one_line(str(e))}")
    lib = library()  # Unavailable: the caller says it and stops (status 2)
    try:
        options = lib.DiarizeOptions(num_speakers=num, min_speakers=low, max_speakers=high)
    except ValueError as e:
        parser.error(f"argument --num-speakers/--min-speakers/--max-speakers: {one_line(str(e))}")
    return Diarization(lib, options, names, fmt)


def diarizer_source(flag: str | None) -> str | None:
    """The diarizer's model files: --diarizer, else $MLXASR_DIARIZER, else None (the library's download)."""
    return flag or os.environ.get(DIARIZER_ENV) or None


def load_diarizer(diarization: Diarization, flag: str | None, say: Messages) -> Any | None:
    """The diarizer of --diarizer (else $MLXASR_DIARIZER, else the library's download), or None once the
    error is said: the library unavailable (the install command), model files missing or unreadable."""
    source = diarizer_source(flag)
    shown = source or "(default)"
    say.info(f"loading diarizer {shown}")
    lib = diarization.lib
    try:
        return lib.load_diarizer(source)
    except getattr(lib, "DiarizerError", lib.DiarizerUnavailable) as e:  # its own one line says it all
        say.error(one_line(str(e)))
    except Exception as e:
        say.error(f"diarizer {shown}: {load_reason(source or '', e, '--diarizer')}")
    return None


def diarize_samples(diarizer: Any, samples: np.ndarray, options: Any) -> Any:
    """The speaker turns of 16 kHz float32 samples (the library's Turns: a list, with its `warnings`)."""
    return diarizer(np.ascontiguousarray(samples, dtype=np.float32), options)


def turn_warnings(turns: Any) -> list[str]:
    """What the diarizer said about a file's turns (e.g. a speaker count it could not reach)."""
    return [str(w) for w in getattr(turns, "warnings", None) or []]


def read_samples(audio: Any) -> np.ndarray:
    """A file's samples (16 kHz float32 mono, as transcription reads them), whole."""
    decoded = read_audio(audio)
    try:
        return np.array(decoded.signal.samples(), dtype=np.float32, copy=True)
    finally:
        decoded.signal.close()


@dataclass(frozen=True)
class Outcome:
    """A file diarized: its speaker turns, or the error that stopped it; seconds: its audio's length."""

    turns: list[Any] | None
    seconds: float = 0.0
    error: BaseException | None = None


class DiarizeQueue:
    """Files diarized one at a time on a worker thread (the library releases the GIL, so this runs beside
    transcription), in the order given, except that a file someone waits for (hurry) goes first.

    Outcomes are collected with take(); wait() blocks until one of some keys is done (or a timeout);
    close() drops what has not started and does not wait for the file being diarized."""

    def __init__(
        self,
        diarizer: Any,
        options: Any,
        *,
        read: Callable[[Any], np.ndarray] = read_samples,
    ) -> None:
        self._diarizer, self._options, self._read = diarizer, options, read
        self._cond = threading.Condition()
        self._pending: list[tuple[Hashable, Any]] = []
        self._urgent: set[Hashable] = set()
        self._running: Hashable | None = None
        self._done: dict[Hashable, Outcome] = {}
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="mlxasr-diarize", daemon=True)
        self._thread.start()

    def submit(self, key: Hashable, audio: Any) -> None:
        with self._cond:
            self._pending.append((key, audio))
            self._cond.notify_all()

    def hurry(self, key: Hashable) -> None:
        """Diarize key next (its transcription is done and waits for it)."""
        with self._cond:
            self._urgent.add(key)

    def cancel(self, key: Hashable) -> None:
        """Forget key: not diarized if it has not started; its outcome dropped if it has."""
        with self._cond:
            self._pending = [(k, a) for k, a in self._pending if k != key]
            self._urgent.discard(key)
            self._done.pop(key, None)
            if self._running == key:
                self._running = None  # its outcome is not kept

    def take(self) -> dict[Hashable, Outcome]:
        """The outcomes finished since the last call."""
        with self._cond:
            done, self._done = self._done, {}
        return done

    def wait(self, keys: Iterable[Hashable], timeout: float) -> None:
        """Until an outcome of one of keys is waiting to be taken, one of them never will be (lost), or
        timeout."""
        keys = set(keys)
        with self._cond:
            self._cond.wait_for(lambda: keys & self._done.keys() or self._lost(keys), timeout)

    def lost(self, keys: Iterable[Hashable]) -> set[Hashable]:
        """Those of keys that will never have an outcome to take: not waiting, not being diarized and not
        done (taken already, never submitted, or the queue closed or its thread gone)."""
        with self._cond:
            return self._lost(set(keys))

    def _lost(self, keys: set[Hashable]) -> set[Hashable]:
        if self._closed or not self._thread.is_alive():
            return keys - self._done.keys()
        queued = {k for k, _ in self._pending} | {self._running}
        return keys - queued - self._done.keys()

    def outcome(self, key: Hashable) -> Outcome:
        """key's outcome, once it is done (taken here); an error outcome if it never will be."""
        while True:
            self.wait([key], timeout=0.5)
            with self._cond:
                if key in self._done:
                    return self._done.pop(key)
                if self._lost({key}):
                    return Outcome(None, error=RuntimeError(_LOST))

    @property
    def busy(self) -> bool:
        """Some file is still to be diarized or being diarized."""
        with self._cond:
            return bool(self._pending) or self._running is not None

    def close(self, wait: bool = False, timeout: float | None = None) -> None:
        """Drop what has not started; a file being diarized is cancelled where the diarizer can be
        (the library stops at its next stage), and waited for only with wait."""
        with self._cond:
            self._closed = True
            self._pending.clear()
            running = self._running is not None
            self._cond.notify_all()
        cancel = getattr(self._diarizer, "cancel", None)
        if running and callable(cancel):
            cancel()
        if wait:
            self._thread.join(timeout)

    def _next(self) -> tuple[Hashable, Any] | None:
        with self._cond:
            self._cond.wait_for(lambda: self._pending or self._closed)
            if self._closed:
                return None
            at = next((i for i, (k, _) in enumerate(self._pending) if k in self._urgent), 0)
            key, audio = self._pending.pop(at)
            self._urgent.discard(key)
            self._running = key
            return key, audio

    def _work(self) -> None:
        try:
            self._diarize_all()
        finally:  # however it ends, nobody waits for it any more
            with self._cond:
                self._closed = True
                self._cond.notify_all()

    def _diarize_all(self) -> None:
        while (item := self._next()) is not None:
            key, audio = item
            seconds = 0.0
            try:
                samples = self._read(audio)
                seconds = samples.shape[0] / SAMPLE_RATE
                outcome = Outcome(diarize_samples(self._diarizer, samples, self._options), seconds)
            except Exception as e:  # one file's failure is that file's outcome
                outcome = Outcome(None, seconds, e)
            with self._cond:
                if self._running == key:
                    self._done[key] = outcome
                self._running = None
                self._cond.notify_all()


class SpeakerPairs:
    """A run's transcriptions paired with their files' speaker turns (diarized by a DiarizeQueue beside
    transcription): add() each transcribed file as it comes and settle the pairs it gives, then the pairs
    of rest(); progress() is the engine's on_progress, which also counts the files diarized.

    A transcription waits for its turns (its file goes to the front of the diarizer's queue). While those
    waiting hold more than WAITING_SAMPLES of audio in memory, add() waits for the diarizer."""

    def __init__(self, queue: DiarizeQueue, report_progress: Callable[[int, float], None]) -> None:
        self.queue, self._report = queue, report_progress
        self._outcomes: dict[Hashable, Outcome] = {}  # diarized, the transcription not yet come
        self._waiting: dict[Hashable, Any] = {}  # transcribed (InputResult), waiting for speakers

    def progress(self, index: int, seconds: float) -> None:
        self._report(index, seconds)
        self._collect()

    def _collect(self) -> None:
        for key, outcome in self.queue.take().items():
            self._outcomes[key] = outcome
            self._report(key, outcome.seconds)

    def add(self, res: Any) -> Iterator[tuple[Any, Outcome | None]]:
        """The pairs ready once res (an InputResult) has come: res itself with None when it failed."""
        if res.error is not None:  # not transcribed: its speakers are not needed
            self.queue.cancel(res.index)
            self._outcomes.pop(res.index, None)
            yield res, None
            return
        self._waiting[res.index] = res
        self.queue.hurry(res.index)
        yield from self._ready()
        while self._held() > WAITING_SAMPLES:
            self.queue.wait(self._waiting, timeout=0.5)
            yield from self._ready()

    def rest(self) -> Iterator[tuple[Any, Outcome | None]]:
        """The pairs of the transcriptions still waiting, as their speakers come."""
        yield from self._ready()
        while self._waiting:
            self.queue.wait(self._waiting, timeout=0.5)
            yield from self._ready()

    def close(self) -> None:
        """Stop diarizing (not waiting for the file being diarized) and drop what waits."""
        self.queue.close()
        for res in self._waiting.values():
            if res.wav is not None:
                res.wav.close()
        self._waiting.clear()

    def _held(self) -> int:
        return sum(samples_in_memory(r.wav) for r in self._waiting.values() if r.wav is not None)

    def _ready(self) -> Iterator[tuple[Any, Outcome]]:
        self._collect()
        lost = self.queue.lost(k for k in self._waiting if k not in self._outcomes)
        for key in [k for k in self._waiting if k in self._outcomes or k in lost]:
            outcome = self._outcomes.pop(key, None) or Outcome(None, error=RuntimeError(_LOST))
            yield self._waiting.pop(key), outcome


def failure(e: BaseException) -> str:
    """Why a file's diarization failed, on one line."""
    reason = getattr(e, "reason", None)  # an AudioError says why the audio could not be read
    text = one_line(str(reason or e)) or type(e).__name__
    return f"speaker diarization failed: {text.removeprefix('diarization failed: ')}"
