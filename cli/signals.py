"""Ctrl-C and SIGTERM for the commands: both stop what runs through the same cleanup.

A stop is raised where the signal is handled, and also remembered: Python runs a signal's handler
between any two bytecodes of the main thread, a finalizer's (`__del__`, a generator closed by the
garbage collector) among them, and what a finalizer raises is only reported and dropped. The
commands ask raise_if_stopped() at their boundaries (between files, before the exit status), so that
a stop dropped that way still ends the run.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["Terminated", "raise_if_stopped", "stop_handlers", "stop_taken", "terminate"]

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Terminated(BaseException):
    """SIGTERM, turned into an exception so that the same cleanup as for Ctrl-C runs."""


def terminate(signum: int, frame: object) -> None:
    """A SIGTERM handler: raise Terminated."""
    raise Terminated()


_stopped_by: int | None = None  # the signal that stopped the run stop_handlers guards, until it is taken


def _stop_exception(signum: int) -> BaseException:
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated()


def _stop(signum: int, frame: object) -> None:
    """The first Ctrl-C or SIGTERM stops the run; those that follow (a key held down, a storm of
    signals) are ignored while the run cleans up and prints its summary."""
    global _stopped_by
    for sig in _STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    _stopped_by = signum
    raise _stop_exception(signum)


def raise_if_stopped() -> None:
    """Raise the stop (KeyboardInterrupt or Terminated) that a signal asked for during this run and
    that no one has taken (stop_taken) yet: its exception was dropped (raised inside a finalizer)."""
    if _stopped_by is not None:
        raise _stop_exception(_stopped_by)


def stop_taken() -> None:
    """The stop's exception has been caught and is being acted on: raise_if_stopped need not raise it
    again."""
    global _stopped_by
    _stopped_by = None


def _quiet_dropped_stops(previous: Callable[[Any], object]) -> Callable[[Any], object]:
    """A sys.unraisablehook that says nothing of a stop raised inside a finalizer (raise_if_stopped
    takes it up) and passes everything else on to the previous hook."""

    def hook(unraisable: Any) -> None:
        if not isinstance(unraisable.exc_value, (KeyboardInterrupt, Terminated)):
            previous(unraisable)

    return hook


@contextmanager
def stop_handlers(restore_after_stop: bool = True) -> Iterator[None]:
    """Install _stop for the run; afterwards put the caller's handlers back. A process that is
    about to exit after a stop (the `mlxasr` command) keeps ignoring further signals instead, so
    that the tail of a Ctrl-C storm cannot interrupt the summary or the exit."""
    # Ctrl-C raises KeyboardInterrupt even when the parent started us with SIGINT ignored.
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    global _stopped_by
    _stopped_by = None
    old_hook = sys.unraisablehook
    sys.unraisablehook = _quiet_dropped_stops(old_hook)
    old = {sig: signal.signal(sig, _stop) for sig in _STOP_SIGNALS}
    try:
        yield
    finally:
        stopped = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        if restore_after_stop or not stopped:
            for sig, handler in old.items():
                signal.signal(sig, handler)
            sys.unraisablehook = old_hook
            _stopped_by = None
