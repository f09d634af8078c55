"""What `mlxasr live` shows: committed segments and the live tail, in place on a terminal (the unstable
words dimmed), one line per committed segment otherwise."""

from __future__ import annotations

import sys

from mlx_qwen3asr.pipeline.result import Segment
from mlx_qwen3asr.pipeline.streaming import StreamUpdate
from mlx_qwen3asr.runtime.messages import one_line


def _clock(seconds: float) -> str:
    ms = max(0, int(round(seconds * 1000)))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}.{ms:03d}"


def segment_line(segment: Segment) -> str:
    """How a committed segment is printed when stdout is not a terminal."""
    return f"[{_clock(segment.start)} --> {_clock(segment.end)}] {one_line(segment.text)}"


class Display:
    """Committed segments and the live tail on stdout: in place on a terminal, line by line otherwise."""

    def __init__(self, quiet: bool, out=None) -> None:
        self.out = out or sys.stdout
        self.quiet = quiet
        self.live = None
        self.console = None
        if quiet:
            return
        if self.out.isatty():
            from rich.console import Console
            from rich.live import Live

            self.console = Console(file=self.out)
            self.live = Live(console=self.console, auto_refresh=False, transient=True)
            self.live.start()

    def update(self, update: StreamUpdate, committed_text: str) -> None:
        if self.quiet:
            return
        for segment in update.committed:
            if self.live is not None:
                self.console.print(one_line(segment.text), markup=False, highlight=False)
            else:
                print(segment_line(segment), file=self.out, flush=True)
        if self.live is not None:
            from rich.text import Text

            cut = len(committed_text) if update.text.startswith(committed_text) else 0
            stable = update.stable[cut:].lstrip() if cut <= len(update.stable) else ""
            shown = Text(stable)
            shown.append(update.unstable, style="dim")
            self.live.update(shown, refresh=True)

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None


__all__ = ["Display", "segment_line"]
