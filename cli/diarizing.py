"""Who said what (--diarize): the options that `mlxasr`, `mlxasr align` and `mlxasr serve` share, the
diarization library reached through one seam (`library`), and DiarizeQueue, which diarizes files on a
worker thread while the engine transcribes them (mlx_qwen3asr.diarize.queue, the server's too), with the
run's pairing of transcriptions and speakers (SpeakerPairs, mlx_qwen3asr.cli.diarize_queue).

The library (mlx_qwen3asr.diarize) is an optional extra. Without it a command that is asked to diarize
says so on one line naming the install command and stops with status 2 before any model loads."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from mlx_qwen3asr.cli.diarize_queue import (
    WAITING_SAMPLES,
    DiarizeQueue,
    Outcome,
    SpeakerPairs,
)
from mlx_qwen3asr.cli.models import Messages, load_reason
from mlx_qwen3asr.cli.options import int_in, moot, span
from mlx_qwen3asr.outputs.render import check_speaker_format
from mlx_qwen3asr.runtime.messages import one_line

__all__ = [
    "DIARIZER_ENV",
    "INSTALL",
    "WAITING_SAMPLES",
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
    most = SPEAKERS_RANGE[1]
    if len(names) > most:
        raise ValueError(f"{len(names)} names, more than the {most} speakers a file can have")
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
                moot(parser, option, "without --diarize")
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


def load_diarizer(
    diarization: Diarization, flag: str | None, say: Messages, *, isolated: bool = False
) -> Any | None:
    """The diarizer of --diarizer (else $MLXASR_DIARIZER, else the library's download), or None once the
    error is said: the library unavailable (the install command), model files missing or unreadable.
    isolated: its runs made by a worker process that cancel() kills at once (the server's)."""
    source = diarizer_source(flag)
    shown = source or "(default)"
    say.info(f"loading diarizer {shown}")
    lib = diarization.lib
    try:
        if isolated:
            return lib.load_diarizer(source, isolated=True)
        return lib.load_diarizer(source)
    except getattr(lib, "DiarizerError", lib.DiarizerUnavailable) as e:  # its own one line says it all
        say.error(one_line(str(e)))
    except Exception as e:
        say.error(f"diarizer {shown}: {load_reason(source or '', e, '--diarizer')}")
    return None


def turn_warnings(turns: Any) -> list[str]:
    """What the diarizer said about a file's turns (e.g. a speaker count it could not reach)."""
    return [str(w) for w in getattr(turns, "warnings", None) or []]


def failure(e: BaseException) -> str:
    """Why a file's diarization failed, on one line."""
    reason = getattr(e, "reason", None)  # an AudioError says why the audio could not be read
    text = one_line(str(reason or e)) or type(e).__name__
    return f"speaker diarization failed: {text.removeprefix('diarization failed: ')}"
