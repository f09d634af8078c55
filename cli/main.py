"""mlxasr: transcribe audio and video files and folders to TXT, SRT, WebVTT and JSON.

The command's entry. Its first argument may name a subcommand:

    mlxasr serve ...     the transcription server (mlx_qwen3asr.cli.serve)
    mlxasr app ...       the server on a free port with its web page opened in the browser (cli.serve)
    mlxasr convert ...   MLX checkpoints from any Qwen3-ASR release (mlx_qwen3asr.cli.convert)
    mlxasr align ...     time a transcript the user already has (mlx_qwen3asr.cli.align)
    mlxasr live ...      live transcription of the microphone, a stream or a file (mlx_qwen3asr.cli.live)
    mlxasr library ...   the transcript library: list, search, export, import (mlx_qwen3asr.cli.library)

anything else is a folder run (mlx_qwen3asr.cli.run), transcription being the default. A first argument
`serve`, `app`, `convert`, `align`, `library` or `live` always means the subcommand, whatever exists on disk: a file or
folder of that name is transcribed as `./serve` (`./convert`, `./align`, `./live`). Ctrl-C and SIGTERM
stop every command cleanly.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from mlx_qwen3asr import tune_malloc
from mlx_qwen3asr.cli import align, convert, library, live, serve
from mlx_qwen3asr.cli.arguments import build_parser
from mlx_qwen3asr.cli.exits import stopped
from mlx_qwen3asr.cli.options import EXIT_INTERRUPTED, EXIT_TERMINATED
from mlx_qwen3asr.cli.run import run
from mlx_qwen3asr.cli.signals import stop_handlers
from mlx_qwen3asr.cli.stdio import open_closed_standard_streams

__all__ = ["SUBCOMMANDS", "build_parser", "entry", "main"]

# The subcommands, by the first argument that names them.
SUBCOMMANDS = ("align", "app", "convert", "library", "live", "serve")


def main(argv: Sequence[str] | None = None) -> int:
    """Run mlxasr with the given arguments (default: sys.argv[1:]); returns the exit status.

    A first argument `serve`, `convert`, `align` or `live` runs that subcommand with the arguments after it.
    """
    return _main(argv, restore_after_stop=True)


def _subcommand(args: Sequence[str]) -> str | None:
    """The subcommand the first argument names, or None for a transcription."""
    return args[0] if args and args[0] in SUBCOMMANDS else None


def _main(argv: Sequence[str] | None, restore_after_stop: bool) -> int:
    open_closed_standard_streams()  # before any file is opened: none may take fd 0, 1 or 2
    tune_malloc()  # freed activations are reused rather than page-faulted in afresh (mlx_qwen3asr.runtime.cpu)
    args_list = list(sys.argv[1:] if argv is None else argv)
    command = _subcommand(args_list)
    if command in ("serve", "app"):
        return serve.main(args_list[1:], exiting=not restore_after_stop, app=command == "app")
    if command == "convert":
        return convert.main(args_list[1:], prog="mlxasr convert", restore_after_stop=restore_after_stop)
    with stop_handlers(restore_after_stop):
        if command == "align":
            return align.main(args_list[1:])
        if command == "live":
            return live.main(args_list[1:])
        if command == "library":
            # Each transcript is filed in one transaction: a stop leaves those before it, whole.
            return stopped("mlxasr library", lambda: library.main(args_list[1:]))
        parser = build_parser()
        # A stop that run() does not handle comes before any file is being transcribed (walking folders).
        return stopped("mlxasr", lambda: run(parser, parser.parse_args(args_list), sys.stdout, sys.stderr))


def entry() -> None:
    """The `mlxasr` command: main(), then exit with its status.

    After Ctrl-C (or SIGTERM) the process ends at once rather than waiting for model work already
    queued on the device (a long prefill can run for many seconds more): every finished output is
    written and closed by then, and no temporary file is left. `mlxasr serve` always leaves this
    way, its engine's thread left running (see mlx_qwen3asr.cli.serve.main).
    """
    status = _main(None, restore_after_stop=False)
    if status in (EXIT_INTERRUPTED, EXIT_TERMINATED) or _subcommand(sys.argv[1:]) in ("serve", "app"):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


if __name__ == "__main__":
    entry()
