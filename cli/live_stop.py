"""Ctrl-C and SIGTERM during an `mlxasr live` session: the last words are finished and written."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import numpy as np

from mlx_qwen3asr.cli.signals import Terminated


class Stop:
    """Ctrl-C and SIGTERM during a session: raised at once while it waits for audio, noted while the
    model works (the step finishes first), and ignored once given so that the session can end."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.waiting = False

    def __call__(self, signum: int, frame: object) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        self.signum = signum
        if self.waiting:
            self.waiting = False
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise Terminated()

    def pause(self, seconds: float) -> None:
        self.waiting = True
        try:
            if self.signum is None:
                time.sleep(seconds)
        finally:
            self.waiting = False

    def blocks(self, source: Iterator[np.ndarray], drain=None) -> Iterator[np.ndarray]:
        """The source's blocks, interruptible while the next one is waited for; after a stop, the
        blocks drain() gives (the audio a microphone recorded before it)."""
        while self.signum is None:
            self.waiting = True
            try:
                block = next(source, None)
            except (KeyboardInterrupt, Terminated):
                break
            finally:
                self.waiting = False
            if block is None:
                return
            yield block
        if drain is not None:
            close = getattr(source, "close", None)
            if close is not None:
                close()
            yield from drain()


__all__ = ["Stop"]
