"""`mlxasr convert` (also installed as `mlxasr-convert`): MLX checkpoints, 4-bit or 8-bit, from any
Qwen3-ASR release.

mlxasr convert Qwen/Qwen3-ASR-0.6B -o qwen3-asr-0.6b-4bit --bits 4
mlxasr convert Qwen/Qwen3-ASR-1.7B -o qwen3-asr-1.7b-8bit --bits 8
mlxasr convert ./Qwen3-ASR-0.6B -o qwen3-asr-0.6b-bf16

Its exit statuses are those of `mlxasr`: 2 when nothing could be started (a usage error, a destination in
the way, a source that is unusable or out of reach), 1 when the conversion itself failed, 130 and 143 when
it was interrupted; a failed or interrupted conversion leaves nothing behind.
"""

from __future__ import annotations

import argparse
import sys

from mlx_qwen3asr import tune_malloc
from mlx_qwen3asr.checkpoints.convert import (
    ENCODER_BITS,
    GROUP_SIZES,
    QUANT_BITS,
    ConversionResult,
    ConvertError,
    convert_checkpoint,
)
from mlx_qwen3asr.checkpoints.loading import DTYPES, ModelLoadError
from mlx_qwen3asr.cli.exits import stopped
from mlx_qwen3asr.cli.options import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    EXIT_USAGE,
)
from mlx_qwen3asr.cli.signals import stop_handlers
from mlx_qwen3asr.cli.stdio import open_closed_standard_streams
from mlx_qwen3asr.runtime.messages import one_line

PROG = "mlxasr-convert"
# How many layer names to print before summarising the rest.
MAX_LISTED = 12


EPILOG = f"""\
Without --bits the checkpoint is written unquantized in --dtype. With --bits, decoder linears and the
token embedding use --bits and the audio encoder stays unquantized, as mlx-community publishes it:
mlx_qwen3asr, mlx-audio and mlx-qwen3-asr all read the output. --encoder-bits 4|8 quantizes the encoder
too (smaller; read by mlx_qwen3asr and mlx-qwen3-asr, not by mlx-audio). Convolutions and norms are
never quantized.

exit status:
  {EXIT_OK}    the checkpoint was written
  {EXIT_FAILED}    the conversion failed (unreadable tensor data, a full disk, a destination that
       became unwritable, an output that does not load); nothing is left behind
  {EXIT_USAGE}    usage error (bad option, DST exists without --overwrite, DST is the source, names no
       folder of its own such as ".", is a folder --overwrite may not replace because it holds more
       than a checkpoint, or cannot be written), or the source cannot be used: missing, not a
       Qwen3-ASR checkpoint, already quantized, not cached and the Hugging Face hub unreachable;
       nothing is written
  {EXIT_INTERRUPTED}  interrupted with Ctrl-C, nothing is left behind ({EXIT_TERMINATED} for SIGTERM)

A conversion killed outright (kill -9, a power cut) leaves a hidden folder
".DST.mlxasr-<pid>-<host>-<random>.partial" beside DST; the next conversion into the same folder
removes it once that process is gone, never one of a conversion still running."""


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=prog,
        description="Convert a Qwen3-ASR checkpoint (release, transformers -hf or MLX layout; ASR or forced "
        "aligner) into an MLX checkpoint, optionally quantized.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("src", help="checkpoint directory or Hugging Face repo id (org/name)")
    ap.add_argument("-o", "--output", required=True, metavar="DST", help="directory to create")
    ap.add_argument("--bits", type=int, choices=QUANT_BITS, default=None, help="quantize to this many bits")
    ap.add_argument(
        "--group-size", type=int, choices=GROUP_SIZES, default=64, help="quantization group size (default 64)"
    )
    ap.add_argument(
        "--encoder-bits",
        type=int,
        choices=ENCODER_BITS,
        default=None,
        help="bits of the audio encoder (default 16: unquantized, readable by every MLX tool)",
    )
    ap.add_argument(
        "--dtype",
        choices=list(DTYPES),
        default="bfloat16",
        help="dtype of unquantized weights (default bfloat16)",
    )
    ap.add_argument(
        "--overwrite",
        "--force",
        dest="overwrite",
        action="store_true",
        help="replace DST if it exists and holds a checkpoint and nothing else (once the new one is complete); "
        "--force is the same",
    )
    return ap


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:MAX_LISTED])
    return shown + (f" and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else "")


def summary(result: ConversionResult) -> list[str]:
    kind = "forced aligner" if result.forced_aligner else "ASR"
    lines = [
        f"converted {result.source} ({result.source_layout} layout, {kind}) -> {result.path}",
        f"  recipe: {result.recipe.describe()}",
        f"  read by: {result.recipe.readers}",
    ]
    if result.quantized:
        by_bits: dict[int, int] = {}
        for bits in result.quantized.values():
            by_bits[bits] = by_bits.get(bits, 0) + 1
        counts = ", ".join(f"{n} at {b} bits" for b, n in sorted(by_bits.items()))
        lines.append(f"  quantized layers: {counts}")
    if result.unquantized:
        lines.append(
            f"  left unquantized (input width not a multiple of {result.recipe.group_size}): "
            + _names(result.unquantized)
        )
    files = ", ".join(f"{name} ({_size(size)})" for name, size in result.files.items())
    lines.append(f"  weights: {_size(result.weight_bytes)} in {files}")
    return lines


def main(argv: list[str] | None = None, *, prog: str = PROG, restore_after_stop: bool = True) -> int:
    """Run the command with the given arguments (default: sys.argv[1:]); returns the exit status.

    prog: the name it goes by in messages (`mlxasr-convert`, or `mlxasr convert` as a subcommand)."""
    open_closed_standard_streams()  # `mlxasr-convert ... <&-`: no file opened later may take fd 0, 1 or 2
    tune_malloc()
    # The source is read and planned before the first progress line: what fails until then is a usage
    # error or an unusable source, what fails after it is the conversion itself.
    started = False

    def progress(message: str) -> None:
        nonlocal started
        started = True
        print(f"{prog}: {message}", file=sys.stderr, flush=True)

    def convert() -> int:
        args = build_parser(prog).parse_args(argv)
        with stop_handlers(restore_after_stop):
            result = convert_checkpoint(
                args.src,
                args.output,
                bits=args.bits,
                group_size=args.group_size,
                encoder_bits=args.encoder_bits,
                dtype=args.dtype,
                force=args.overwrite,
                log=progress,
            )
        for line in summary(result):
            print(line)
        return EXIT_OK

    def failed(e: Exception) -> int:
        print(f"{prog}: error: {one_line(e)}", file=sys.stderr)
        return EXIT_FAILED if started else EXIT_USAGE

    return stopped(
        prog, convert, after="; nothing was written", errors=(ConvertError, ModelLoadError), on_error=failed
    )


def entry() -> None:
    """The `mlxasr-convert` command: main(), then exit with its status."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
