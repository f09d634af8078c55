"""How every command's main() ends: the exception that stops it, turned into the exit status it returns
and the one line it says.

    SystemExit from argparse (usage errors, --help, --version)   its status (options.exit_status)
    the command's own error class                                 what the command's handler returns
    KeyboardInterrupt (Ctrl-C)                                    130, "<prog>: interrupted<after>"
    Terminated (SIGTERM)                                          143, "<prog>: terminated<after>"
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from mlx_qwen3asr.cli.options import EXIT_INTERRUPTED, EXIT_TERMINATED, exit_status
from mlx_qwen3asr.cli.signals import Terminated, raise_if_stopped, stop_taken

__all__ = ["status_of", "stopped"]


def stopped(
    prog: str,
    body: Callable[[], int],
    *,
    after: str = "",
    errors: type[Exception] | tuple[type[Exception], ...] = (),
    on_error: Callable[[Exception], int] | None = None,
) -> int:
    """body()'s exit status, or the status of the exception that stopped it.

    after: what the stop lines add (e.g. "; nothing was written"). errors, on_error: the command's own
    error class(es) and what says one and gives its status."""
    try:
        return body()  # a stop dropped as it finished does not undo what it did (cli/signals.py)
    except SystemExit as e:
        return exit_status(e)
    except errors as e:
        assert on_error is not None
        return on_error(e)
    except KeyboardInterrupt:
        stop_taken()
        print(f"{prog}: interrupted{after}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Terminated:
        stop_taken()
        print(f"{prog}: terminated{after}", file=sys.stderr)
        return EXIT_TERMINATED


def status_of(body: Callable[[], int]) -> int:
    """body()'s exit status, or that of the Ctrl-C (130) or SIGTERM (143) that stopped it, said by the
    caller (a folder run's summary says it; stopped() says it for a command)."""
    try:
        status = body()
        raise_if_stopped()  # a Ctrl-C that the run did not see (cli/signals.py) is still its status
        return status
    except KeyboardInterrupt:
        stop_taken()
        return EXIT_INTERRUPTED
    except Terminated:
        stop_taken()
        return EXIT_TERMINATED
