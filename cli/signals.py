"""Ctrl-C and SIGTERM for the commands: both stop what runs through the same cleanup."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["Terminated", "stop_handlers", "terminate"]

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Terminated(BaseException):
    """SIGTERM, turned into an exception so that the same cleanup as for Ctrl-C runs."""


def terminate(signum: int, frame: object) -> None:
    """A SIGTERM handler: raise Terminated."""
    raise Terminated()


def _stop(signum: int, frame: object) -> None:
    """The first Ctrl-C or SIGTERM stops the run; those that follow (a key held down, a storm of
    signals) are ignored while the run cleans up and prints its summary."""
    for sig in _STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated()


@contextmanager
def stop_handlers(restore_after_stop: bool = True) -> Iterator[None]:
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
