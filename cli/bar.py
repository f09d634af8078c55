"""The progress bar of `mlxasr` on a terminal: one line that fits the terminal's width. As the width
shrinks, the least needed parts go first (the speed, the time elapsed, the words "of audio", the
long form of what the diarizer is doing, the files count, the bar itself); the time left always stays
whole."""

from __future__ import annotations

from collections.abc import Iterable

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.progress import Progress, Task
from rich.text import Text

__all__ = ["FittedProgress", "bar_line", "clock"]

# The bar's own width: at least this much, or it is left out; at most this much.
MIN_BAR, MAX_BAR = 8, 40


def clock(seconds: float | None) -> str:
    """Seconds as H:MM:SS ("-:--:--" when unknown)."""
    if seconds is None:
        return "-:--:--"
    m, s = divmod(int(round(max(seconds, 0.0))), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}"


def _speakers(text: str, short: bool) -> str:
    """What the diarizer is doing, in the long form ("finding speakers 40% (run 2 of 4)") or the short
    one ("speakers 40%")."""
    if not short or not text:
        return text
    text = text.replace("finding speakers", "speakers")
    return text.split(" (", 1)[0]


# The parts each layout shows, richest first: files count, speakers (long/short), bar, share
# (long/short), speed, elapsed. The time left ends every layout.
_LAYOUTS = (
    ("label", "speakers", "bar", "share", "speed", "elapsed"),
    ("label", "speakers", "bar", "share", "elapsed"),
    ("label", "speakers", "bar", "share"),
    ("label", "speakers", "bar", "pct"),
    ("label", "spk", "bar", "pct"),
    ("spk", "bar", "pct"),
    ("label", "spk", "pct"),
    ("spk", "pct"),
    ("pct",),
    (),
)


def bar_line(task: Task, width: int) -> Text:
    """The bar's line for task (its fields: label, speakers, speed, left) in at most width cells."""
    share = min(100.0, 100.0 * task.completed / task.total) if task.total else 0.0
    speed = task.fields.get("speed")
    activity = task.fields.get("speakers") or ""
    parts = {
        "label": (task.fields.get("label") or "", None),
        "speakers": (_speakers(activity, short=False), "magenta"),
        "spk": (_speakers(activity, short=True), "magenta"),
        "share": (f"{share:3.0f}% of audio", "progress.percentage"),
        "pct": (f"{share:3.0f}%", "progress.percentage"),
        "speed": (f"{speed:.1f}x realtime" if speed else "", "cyan"),
        "elapsed": (clock(task.elapsed), "progress.elapsed"),
    }
    eta = f"eta {clock(task.fields.get('left'))}"
    for layout in _LAYOUTS:
        pieces = [(name, *parts.get(name, ("", None))) for name in layout]
        pieces = [p for p in pieces if p[0] == "bar" or p[1]]
        texts = [p[1] for p in pieces if p[0] != "bar"] + [eta]
        used = sum(cell_len(t) for t in texts) + len(pieces)  # one space after each piece
        room = width - used
        has_bar = any(p[0] == "bar" for p in pieces)
        if has_bar and room < MIN_BAR or room < 0:
            continue
        line = Text(no_wrap=True, overflow="crop")
        for name, text, style in pieces:
            if name == "bar":
                _append_bar(line, share / 100.0, min(room, MAX_BAR))
            else:
                line.append(text, style=style)
            line.append(" ")
        line.append(eta, style="progress.remaining")
        return line
    line = Text(eta, style="progress.remaining", no_wrap=True, overflow="crop")
    line.truncate(max(width, 0))
    return line


def _append_bar(line: Text, done: float, width: int) -> None:
    filled = int(round(min(max(done, 0.0), 1.0) * width))
    line.append("━" * filled, style="bar.complete" if filled < width else "bar.finished")
    line.append("━" * (width - filled), style="bar.back")


class _Line:
    """A task's bar_line, drawn in the width it is given."""

    def __init__(self, task: Task) -> None:
        self.task = task

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield bar_line(self.task, options.max_width)


class FittedProgress(Progress):
    """A rich Progress whose tasks are each drawn as bar_line, fitted to the console's width."""

    def get_renderables(self) -> Iterable[RenderableType]:
        for task in self.tasks:
            if task.visible:
                yield _Line(task)
