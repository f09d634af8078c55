"""What a diarization gives and takes: speaker turns, the speaker counts asked for, the progress of a
call, and the errors."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# The speakrs release this is built and tested against (pyproject.toml's `diarize` extra pins it).
SPEAKRS_VERSION = "0.7.0"
INSTALL_COMMAND = 'pip install "mlx-qwen3asr[diarize]"'
SAMPLE_RATE = 16000


class DiarizerError(Exception):
    """Diarization cannot be done: the library is missing, the models cannot be loaded, or the run stopped."""


class DiarizerUnavailable(DiarizerError):
    """The diarization library (speakrs) is not installed, or cannot be on this Python."""


class DiarizerLoadError(DiarizerError):
    """The diarization models cannot be found or loaded (a bad folder, or the hub out of reach)."""


class DiarizeCancelled(DiarizerError):
    """Diarizer.cancel() stopped the run."""


@dataclass(frozen=True)
class Turn:
    """A stretch of one speaker's speech, in seconds; speakers are numbered 0, 1, ... in order of first
    appearance. Turns of different speakers overlap where they talk at once."""

    start: float
    end: float
    speaker: int


class Turns(list):
    """The turns of one run (a list of Turn, in time order), with what the run has to say about them."""

    def __init__(self, turns: Sequence[Turn] = (), warnings: Sequence[str] = ()) -> None:
        super().__init__(turns)
        self.warnings: list[str] = list(warnings)

    @property
    def speaker_count(self) -> int:
        return len({t.speaker for t in self})


@dataclass(frozen=True)
class DiarizeProgress:
    """Where a diarizer call stands (Diarizer.progress()).

    audio_seconds: the speech this call diarizes; elapsed: seconds since it started; fraction (0..1,
    below 1 until the call returns) and seconds_left: estimated from the elapsed time and the speed of
    the diarizer's timed runs, counting every run the speaker-count search may still make; attempt: the
    run in progress (1-based); attempts: the most runs this call may take (1 without a count search).
    """

    audio_seconds: float
    elapsed: float
    fraction: float
    seconds_left: float
    attempt: int
    attempts: int


def _count(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a whole number of at least 1, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class DiarizeOptions:
    """How many speakers to look for: exactly num_speakers, or between min_speakers and max_speakers
    (None: as many as the clustering finds)."""

    num_speakers: int | None = None
    min_speakers: int | None = None
    max_speakers: int | None = None

    def __post_init__(self) -> None:
        num = _count(self.num_speakers, "num_speakers")
        low = _count(self.min_speakers, "min_speakers")
        high = _count(self.max_speakers, "max_speakers")
        if num is not None and (low is not None or high is not None):
            raise ValueError("give num_speakers alone, or min_speakers and/or max_speakers")
        if low is not None and high is not None and low > high:
            raise ValueError(f"min_speakers ({low}) must not exceed max_speakers ({high})")

    @property
    def bounds(self) -> tuple[int, float]:
        """The counts allowed: (lowest, highest), highest inf without a limit."""
        if self.num_speakers is not None:
            return self.num_speakers, self.num_speakers
        return self.min_speakers or 1, math.inf if self.max_speakers is None else self.max_speakers


def _wanted(low: int, high: float) -> str:
    """A count range in words: "2 speakers", "at most 1 speaker", "at least 3 speakers", "2 to 4 speakers"."""

    def speakers(n: float) -> str:
        return f"{int(n)} speaker" + ("" if n == 1 else "s")

    if low == high:
        return speakers(low)
    if high == math.inf:
        return f"at least {speakers(low)}"
    if low <= 1:
        return f"at most {speakers(high)}"
    return f"{low} to {speakers(high)}"
