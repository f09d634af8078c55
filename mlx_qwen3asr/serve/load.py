"""How much audio the server holds, and when a client it refuses for it should come back: the 503 of a
server whose engine (or, for a diarized answer, whose diarizer) already holds more audio than allowed,
with a Retry-After from the speed of the jobs finished lately."""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Any

from mlx_qwen3asr.serve.errors import APIError

__all__ = ["DEFAULT_RETRY_AFTER", "MAX_RETRY_AFTER", "SPEED_WINDOW_SECONDS", "Load"]

# Retry-After when the server has not finished anything yet to measure its speed by.
DEFAULT_RETRY_AFTER = 5
MAX_RETRY_AFTER = 600
# Completed jobs within this many seconds give the speed that Retry-After is computed from.
SPEED_WINDOW_SECONDS = 120.0


class Load:
    """The audio queued on the engine (queued_seconds()) and on the server's diarizer (speakers, None
    without one), against max_queue_seconds; finished() records each job done, for the speed."""

    def __init__(self, engine: Any, speakers: Any, max_queue_seconds: float) -> None:
        self.engine, self.speakers, self.max_queue_seconds = engine, speakers, max_queue_seconds
        self.started = time.monotonic()
        self._finished: deque[tuple[float, float]] = deque()  # (when, audio seconds) of recent jobs

    def queued(self) -> float:
        """Seconds of audio the engine holds."""
        return self.engine.queued_seconds()

    def diarization_queued(self) -> float:
        """Seconds of audio the diarizer holds (0 without one)."""
        return self.speakers.queued_seconds() if self.speakers is not None else 0.0

    def finished(self, seconds: float) -> None:
        """A job of `seconds` of audio is done."""
        self._finished.append((time.monotonic(), seconds))

    def busy(self, diarize: bool = False) -> APIError | None:
        """The 503 to answer with when the engine (or, for a diarized answer, the diarizer) already holds
        more audio than allowed, else None."""
        queued = self.queued()
        if diarize:
            queued = max(queued, self.diarization_queued())
        if queued <= self.max_queue_seconds:
            return None
        retry = self.retry_after(queued - self.max_queue_seconds)
        return APIError(
            503,
            f"the server is busy: {queued:.0f} s of audio are waiting (limit {self.max_queue_seconds:g} s); "
            f"retry in {retry} s",
            code="server_busy",
            headers={"Retry-After": str(retry)},
        )

    def retry_after(self, excess: float) -> int:
        """Seconds until `excess` seconds of audio are done, at the speed of the recent jobs."""
        now = time.monotonic()
        while self._finished and self._finished[0][0] < now - SPEED_WINDOW_SECONDS:
            self._finished.popleft()
        window = min(SPEED_WINDOW_SECONDS, now - self.started)
        done = sum(s for _, s in self._finished)
        if not done or window <= 0:
            return DEFAULT_RETRY_AFTER
        return max(1, min(MAX_RETRY_AFTER, math.ceil(excess * window / done)))
