"""mlxasr --diarize beside transcription: the run's files diarized by the shared DiarizeQueue
(mlx_qwen3asr.diarize.queue; only where speech detection finds speech), the transcriptions paired with
their speakers as both come (SpeakerPairs), and the diarizer's progress as the reporter says it
(speaker_work)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from typing import Any

from mlx_qwen3asr.audio.features import SAMPLE_RATE
from mlx_qwen3asr.cli.reporter import SpeakerWork
from mlx_qwen3asr.diarize.queue import LOST, DiarizeQueue, Outcome
from mlx_qwen3asr.pipeline.inputs import samples_in_memory

__all__ = [
    "WAITING_SAMPLES",
    "DiarizeQueue",
    "Outcome",
    "SpeakerPairs",
    "speaker_work",
]

# Transcribed files waiting for their speakers hold at most this many samples of decoded audio in memory
# (40 minutes, as many as the inputs read ahead may hold); past it the run waits for the diarizer.
WAITING_SAMPLES = 40 * 60 * SAMPLE_RATE
# How often (seconds) a run waiting for speakers tells the reporter how the diarizer is getting on.
POLL_SECONDS = 0.5


def speaker_work(queue: DiarizeQueue, waiting: bool = False) -> SpeakerWork:
    """How far the queue's diarizer has got, as the bar and the log lines say it; waiting: every file is
    transcribed (the run waits for speakers alone)."""
    b = queue.backlog()
    return SpeakerWork(b.files, b.key, b.fraction, b.left, b.attempt, b.attempts, waiting)


class SpeakerPairs:
    """A run's transcriptions paired with their files' speaker turns (diarized by a DiarizeQueue beside
    transcription): add() each transcribed file as it comes and settle the pairs it gives, then the pairs
    of rest(); progress() is the engine's on_progress, which also counts the files diarized.

    A transcription waits for its turns (its file goes to the front of the diarizer's queue). While those
    waiting hold more than WAITING_SAMPLES of audio in memory, add() waits for the diarizer. Whenever
    progress comes, and every POLL_SECONDS while the run waits, report_speakers (if given) is told how
    far the diarizer has got (SpeakerWork, `waiting` once transcription is over)."""

    def __init__(
        self,
        queue: DiarizeQueue,
        report_progress: Callable[[int, float], None],
        report_speakers: Callable[[SpeakerWork], None] | None = None,
    ) -> None:
        self.queue, self._report, self._speakers = queue, report_progress, report_speakers
        self._outcomes: dict[Hashable, Outcome] = {}  # diarized, the transcription not yet come
        self._waiting: dict[Hashable, Any] = {}  # transcribed (InputResult), waiting for speakers
        self._transcribed = False  # every file is transcribed: only speakers are left

    def progress(self, index: int, seconds: float) -> None:
        self._report(index, seconds)
        self._collect()
        self._tell()

    def _tell(self) -> None:
        if self._speakers is not None:
            self._speakers(speaker_work(self.queue, self._transcribed))

    def _collect(self) -> None:
        for key, outcome in self.queue.take().items():
            self._outcomes[key] = outcome
            self._report(key, outcome.seconds)

    def _wait(self) -> None:
        self.queue.wait(self._waiting, timeout=POLL_SECONDS)
        self._tell()

    def add(self, res: Any) -> Iterator[tuple[Any, Outcome | None]]:
        """The pairs ready once res (an InputResult) has come: res itself with None when it failed."""
        if res.error is not None:  # not transcribed: its speakers are not needed
            self.queue.cancel(res.index)
            self._outcomes.pop(res.index, None)
            yield res, None
            return
        self._waiting[res.index] = res
        self.queue.hurry(res.index)
        yield from self._ready()
        while self._held() > WAITING_SAMPLES:
            self._wait()
            yield from self._ready()

    def rest(self) -> Iterator[tuple[Any, Outcome | None]]:
        """The pairs of the transcriptions still waiting, as their speakers come."""
        self._transcribed = True
        yield from self._ready()
        while self._waiting:
            self._wait()
            yield from self._ready()

    def close(self) -> None:
        """Stop diarizing (not waiting for the file being diarized) and drop what waits."""
        self.queue.close()
        for res in self._waiting.values():
            if res.wav is not None:
                res.wav.close()
        self._waiting.clear()

    def _held(self) -> int:
        return sum(samples_in_memory(r.wav) for r in self._waiting.values() if r.wav is not None)

    def _ready(self) -> Iterator[tuple[Any, Outcome]]:
        self._collect()
        lost = self.queue.lost(k for k in self._waiting if k not in self._outcomes)
        for key in [k for k in self._waiting if k in self._outcomes or k in lost]:
            outcome = self._outcomes.pop(key, None) or Outcome(None, error=RuntimeError(LOST))
            yield self._waiting.pop(key), outcome
