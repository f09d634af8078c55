"""What `mlxasr` and `mlxasr serve` share on their command lines: the model and aligner defaults and the
environment variables that set them, the exit statuses, the ranges and parsers of the numeric options,
and the speech detection options."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from typing import NoReturn

from mlx_qwen3asr.audio.vad import VadOptions
from mlx_qwen3asr.checkpoints.loading import DTYPES
from mlx_qwen3asr.outputs.render import FORMATS

__all__ = [
    "ALIGNER_ENV",
    "BATCH_SIZE_RANGE",
    "DEFAULT_ALIGNER",
    "DEFAULT_MODEL",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_TERMINATED",
    "EXIT_USAGE",
    "MODEL_ENV",
    "OUTPUT_FORMATS",
    "RTTM",
    "TRANSCRIPT_FORMATS",
    "VAD_THRESHOLD_RANGE",
    "add_batch_size",
    "add_dtype",
    "add_formats",
    "add_model",
    "add_speech_detection",
    "add_word_timing",
    "check_vad",
    "chosen_formats",
    "exit_status",
    "int_in",
    "moot",
    "number_in",
    "span",
    "vad_options",
]

DEFAULT_MODEL = "Qwen/Qwen3-ASR-0.6B"
MODEL_ENV = "MLXASR_MODEL"
DEFAULT_ALIGNER = "Qwen/Qwen3-ForcedAligner-0.6B"
ALIGNER_ENV = "MLXASR_ALIGNER"

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
EXIT_TERMINATED = 143  # 128 + SIGTERM

BATCH_SIZE_RANGE = (1, 256)
VAD_THRESHOLD_RANGE = (0.01, 0.99)


def int_in(limits: tuple[int, int]) -> Callable[[str], int]:
    """An argparse type: an integer within limits (both included)."""
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


def number_in(limits: tuple[float, float], unit: str = "seconds") -> Callable[[str], float]:
    """An argparse type: a finite number within limits (both included), unit naming it in the error."""
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


def span(limits: tuple[float, float]) -> str:
    """A range as the help texts give it: "1 to 1200"."""
    return f"{limits[0]:g} to {limits[1]:g}"


def add_model(group, dtype_group=None) -> None:
    """--model and --dtype (in dtype_group where given), as the commands that load a speech model take
    them."""
    group.add_argument(
        "--model",
        default=os.environ.get(MODEL_ENV) or DEFAULT_MODEL,
        metavar="M",
        help=f"checkpoint folder or Hugging Face repo id (default: ${MODEL_ENV} or {DEFAULT_MODEL})",
    )
    add_dtype(group if dtype_group is None else dtype_group)


def add_word_timing(group) -> None:
    """--word-timestamps / --no-word-timestamps (None when neither is given) and --aligner."""
    words = group.add_mutually_exclusive_group()
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
    group.add_argument(
        "--aligner",
        default=None,
        metavar="A",
        help=f"forced aligner checkpoint folder or repo id (default: ${ALIGNER_ENV} or {DEFAULT_ALIGNER}); "
        "loaded only when words are timed",
    )


def add_dtype(group) -> None:
    """--dtype, the compute dtype of the models a command loads."""
    group.add_argument(
        "--dtype",
        choices=sorted(DTYPES),
        default=None,
        help="compute dtype (default: bfloat16 on a GPU, float32 on CPU)",
    )


# The transcript formats ("all" of -f), and the speaker turns of --diarize (RTTM), which "all" adds
# only when speakers are told apart.
TRANSCRIPT_FORMATS: tuple[str, ...] = tuple(f for f in FORMATS if f != "rttm")
RTTM = "rttm"
OUTPUT_FORMATS: tuple[str, ...] = (*TRANSCRIPT_FORMATS, RTTM)


def _format_list(allowed: tuple[str, ...]) -> Callable[[str], list[str]]:
    """An argparse type: a comma-separated list of the allowed output formats ("all" for every one)."""

    def parse(value: str) -> list[str]:
        names = [v.strip().lower() for v in value.split(",") if v.strip()]
        if not names:
            raise argparse.ArgumentTypeError("empty format list")
        for name in names:
            if name != "all" and name not in allowed:
                raise argparse.ArgumentTypeError(
                    f"invalid format {name!r} (choose from {', '.join(allowed)}, all)"
                )
        return names

    return parse


def add_formats(group, helps: dict[str, str], *, lists: bool = True) -> None:
    """An option for each format of helps (what each holds, by format: --txt, --srt, --vtt, --json,
    --rttm; args.formats) and, with lists, -f/--output-format (args.format_lists); chosen_formats reads
    them."""
    allowed = tuple(f for f in OUTPUT_FORMATS if f in helps)
    for fmt in allowed:
        group.add_argument(f"--{fmt}", dest="formats", action="append_const", const=fmt, help=helps[fmt])
    if lists:
        group.add_argument(
            "-f",
            "--output-format",
            dest="format_lists",
            action="append",
            type=_format_list(allowed),
            metavar="FMT",
            help=f"{', '.join(allowed)} or all ({', '.join(TRANSCRIPT_FORMATS)}"
            + (f", and {RTTM} with --diarize" if RTTM in allowed else "")
            + "); repeat the option or separate with commas",
        )


def chosen_formats(args: argparse.Namespace, default: str | None = "txt") -> list[str]:
    """The output formats asked for (add_formats), in OUTPUT_FORMATS order; [default] when none is.
    "all" is every transcript format, and RTTM too when speakers are told apart (args.diarize)."""
    chosen = set(getattr(args, "formats", None) or [])
    every = (*TRANSCRIPT_FORMATS, RTTM) if getattr(args, "diarize", False) else TRANSCRIPT_FORMATS
    for names in getattr(args, "format_lists", None) or []:
        chosen.update(every if "all" in names else names)
    return [f for f in OUTPUT_FORMATS if f in chosen] or ([default] if default else [])


def add_batch_size(group, decoded_from: str, most: str) -> None:
    """--batch-size; decoded_from says whose segments share a batch, most what the default is bounded by."""
    group.add_argument(
        "--batch-size",
        type=int_in(BATCH_SIZE_RANGE),
        default=None,
        metavar="N",
        help=f"segments decoded together, {decoded_from} ({span(BATCH_SIZE_RANGE)}; "
        f"default: as many as a quarter of the free memory holds KV caches for{most}); lower it if memory is short",
    )


def add_speech_detection(group, what: str | None = None) -> None:
    """--vad/--no-vad and --vad-threshold (check_vad refuses a threshold with --no-vad); what: what
    speech detection does for this command, for the help."""
    group.add_argument(
        "--vad",
        action=argparse.BooleanOptionalAction,
        default=True,
        help=what
        or "speech detection (Silero VAD): only the stretches where someone speaks are transcribed, "
        "so noise, music and silence give no text (default: on; --no-vad sends all the audio)",
    )
    group.add_argument(
        "--vad-threshold",
        type=number_in(VAD_THRESHOLD_RANGE, unit=""),
        default=None,
        metavar="P",
        help=f"speech probability from which audio counts as speech; lower keeps quieter speech and lets in "
        f"more noise ({span(VAD_THRESHOLD_RANGE)}; default: {VadOptions.threshold:g})",
    )


def moot(parser: argparse.ArgumentParser, option: str, why: str) -> NoReturn:
    """The one rule of every command for an option that another option (or its absence) makes moot: a
    usage error (status 2) naming the option and why, e.g. moot(parser, "--aligner", "with
    --no-word-timestamps") says "argument --aligner: has no effect with --no-word-timestamps"."""
    parser.error(f"argument {option}: has no effect {why}")


def check_vad(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A usage error (moot) for --vad-threshold given with --no-vad."""
    if args.vad_threshold is not None and not args.vad:
        moot(parser, "--vad-threshold", "with --no-vad")


def vad_options(args: argparse.Namespace) -> VadOptions | None:
    """The speech detection that --vad/--no-vad and --vad-threshold ask for; None with --no-vad."""
    return VadOptions(threshold=args.vad_threshold or VadOptions.threshold) if args.vad else None


def exit_status(e: SystemExit) -> int:
    """The exit status of argparse's SystemExit (usage errors, --help, --version) as main() returns it."""
    return e.code if isinstance(e.code, int) else (EXIT_OK if e.code is None else EXIT_USAGE)
