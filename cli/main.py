"""mlxasr: transcribe audio and video files and folders to TXT, SRT, WebVTT and JSON.

The command's entry: `mlxasr serve ...` goes to the server (mlx_qwen3asr.cli.serve), anything else is a
folder run (mlx_qwen3asr.cli.run) with Ctrl-C and SIGTERM stopping it cleanly.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from mlx_qwen3asr import tune_malloc
from mlx_qwen3asr.cli import serve
from mlx_qwen3asr.cli.arguments import build_parser
from mlx_qwen3asr.cli.options import EXIT_INTERRUPTED, EXIT_TERMINATED, exit_status
from mlx_qwen3asr.cli.run import run
from mlx_qwen3asr.cli.signals import Terminated, stop_handlers
from mlx_qwen3asr.cli.stdio import open_closed_standard_streams

__all__ = ["build_parser", "entry", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run mlxasr with the given arguments (default: sys.argv[1:]); returns the exit status.

    `mlxasr serve ...` starts the transcription server instead (mlx_qwen3asr.cli.serve).
    """
    return _main(argv, restore_after_stop=True)


def _serving(args: Sequence[str]) -> bool:
    """Whether the arguments ask for the server: `serve` first, and no file or folder of that name."""
    return list(args[:1]) == ["serve"] and not os.path.exists("serve")


def _main(argv: Sequence[str] | None, restore_after_stop: bool) -> int:
    open_closed_standard_streams()  # before any file is opened: none may take fd 0, 1 or 2
    tune_malloc()  # freed activations are reused rather than page-faulted in afresh (mlx_qwen3asr.runtime.cpu)
    args_list = list(sys.argv[1:] if argv is None else argv)
    if _serving(args_list):
        return serve.main(args_list[1:], exiting=not restore_after_stop)
    parser = build_parser()
    with stop_handlers(restore_after_stop):
        try:
            args = parser.parse_args(args_list)
            return run(parser, args, sys.stdout, sys.stderr)
        except SystemExit as e:  # argparse's usage errors, --help and --version
            return exit_status(e)
        except KeyboardInterrupt:  # before any file was being transcribed, e.g. while walking folders
            print("mlxasr: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
        except Terminated:
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
    if status in (EXIT_INTERRUPTED, EXIT_TERMINATED) or _serving(sys.argv[1:]):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


if __name__ == "__main__":
    entry()
