"""Subtitle cues as data (Cue, CueWord), the limits they are cut to (CueOptions), and their times in
whole milliseconds."""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Protocol

__all__ = [
    "ROUNDING_SLACK",
    "Cue",
    "CueOptions",
    "CueWord",
    "RawCue",
    "TimedText",
    "duration_limit_ms",
    "format_timestamp",
    "to_milliseconds",
]

# Keeps cue lengths strictly under max_duration after rounding to milliseconds.
ROUNDING_SLACK = 0.002


@dataclass(frozen=True)
class CueOptions:
    """Readability limits for subtitle cues.

    The first five apply to every cue; the rest only to cues cut from aligned words (segments with
    timing "aligned"), whose cues are timed by their words rather than spread over the segment.
    """

    max_width: int = 42  # display cells per line
    max_lines: int = 2
    max_duration: float = 7.0  # seconds on screen, where the text can be split
    min_duration: float = 0.5  # seconds, where the audio allows (estimated segments)
    snap_radius: float = 1.0  # seconds a boundary may move towards a quiet point (estimated segments)
    # Word cues:
    pause: float = 0.6  # seconds of silence between two words that always end a cue
    word_min_duration: float = 0.8  # seconds on screen, where the gap to the next cue allows
    min_gap: float = 0.08  # seconds between a cue's end and the next cue's start
    max_cps: float = 20.0  # reading speed: display cells per second (a CJK character counts two)
    tail: float = 0.3  # seconds a cue stays after its last word ends, where there is room
    max_words_per_line: int | None = None  # None: no limit

    def __post_init__(self) -> None:
        if self.max_width < 1 or self.max_lines < 1:
            raise ValueError("max_width and max_lines must be at least 1")
        if not (self.max_duration > 0 and self.min_duration >= 0 and self.snap_radius >= 0):
            raise ValueError("max_duration must be positive; min_duration and snap_radius non-negative")
        if self.min_duration > self.max_duration:
            raise ValueError("min_duration must not exceed max_duration")
        for name in ("pause", "word_min_duration", "min_gap", "tail"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number of seconds, at least 0, got {value!r}")
        if self.pause <= 0:
            raise ValueError("pause must be positive")
        if not (isinstance(self.max_cps, (int, float)) and self.max_cps > 0):  # inf: no limit
            raise ValueError(f"max_cps must be positive, got {self.max_cps!r}")
        words = self.max_words_per_line
        if words is not None and (isinstance(words, bool) or not isinstance(words, int) or words < 1):
            raise ValueError(
                f"max_words_per_line must be None or a whole number of at least 1, got {words!r}"
            )


@dataclass(frozen=True)
class CueWord:
    """A word as a cue shows it: its text, its time, and its span [char_start, char_end) in the cue's text.

    The text is cue.text[char_start:char_end]: the word with the punctuation written next to it, and a
    line break where a word longer than a line was cut.
    """

    text: str
    start: float  # seconds, whole milliseconds, within the cue's interval
    end: float
    char_start: int
    char_end: int


@dataclass(frozen=True)
class Cue:
    """One subtitle cue: when it is shown, its lines, and the words it shows when they were timed."""

    start: float  # seconds, a whole number of milliseconds
    end: float
    text: str  # lines separated by "\n"
    words: tuple[CueWord, ...] = ()  # in order; empty for cues of estimated segments
    speaker: str | None = None  # with speaker diarization: who speaks (a cue never spans two speakers)

    @property
    def lines(self) -> list[str]:
        return self.text.split("\n")

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"start": self.start, "end": self.end, "text": self.text}
        if self.speaker is not None:
            out["speaker"] = self.speaker
        return out


class TimedText(Protocol):
    """What build_cues reads of a segment: its start and end in seconds, and its text (and, where it
    has them, its timing, words and speaker)."""

    start: float
    end: float
    text: str


@dataclass
class RawCue:
    """A cue before its final timing. Word cues carry their words and times in milliseconds."""

    start: float
    end: float
    text: str
    words: list[tuple[str, int, int, int, int]] | None = None  # (text, start, end, char_start, char_end)
    last_start: int = 0  # milliseconds: when the cue's last word starts
    natural_end: int = 0  # milliseconds: when the cue's last word ends
    speaker: str | None = None  # the speaker of the segment it was cut from


def to_milliseconds(seconds: float) -> int:
    """Whole milliseconds, rounding half up as the number reads in decimal (59.9996 -> 60000)."""
    if not math.isfinite(seconds):
        raise ValueError(f"time must be finite, got {seconds!r}")
    ms = (Decimal(repr(float(seconds))) * 1000).quantize(Decimal(1), rounding=ROUND_HALF_UP)
    return max(0, int(ms))


def format_timestamp(seconds: float, decimal_marker: str = ",") -> str:
    """HH:MM:SS,mmm (SRT); pass decimal_marker="." for WebVTT. Hours grow past two digits."""
    ms = to_milliseconds(seconds)
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal_marker}{ms:03d}"


def duration_limit_ms(options: CueOptions) -> int:
    """The longest a cue may last, in whole milliseconds: strictly under max_duration after rounding."""
    return max(1, math.floor(round((options.max_duration - ROUNDING_SLACK) * 1000, 6)))
