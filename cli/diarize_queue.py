"""Files diarized on a worker thread while the engine transcribes them (DiarizeQueue), only where speech
detection finds speech, and the run's transcriptions paired with their speakers as both come
(SpeakerPairs), with the diarizer's own progress told to the reporter while it works."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from mlx_qwen3asr.audio.features import SAMPLE_RATE
from mlx_qwen3asr.audio.vad import VadOptions
from mlx_qwen3asr.cli.reporter import SpeakerWork
from mlx_qwen3asr.diarize.given import diarize_speech, read_samples, speech_seconds
from mlx_qwen3asr.pipeline.inputs import samples_in_memory

__all__ = [
    "WAITING_SAMPLES",
    "DiarizeQueue",
    "Outcome",
    "SpeakerPairs",
    "read_samples",
    "speech_seconds",
]

# Transcribed files waiting for their speakers hold at most this many samples of decoded audio in memory
# (40 minutes, as many as the inputs read ahead may hold); past it the run waits for the diarizer.
WAITING_SAMPLES = 40 * 60 * SAMPLE_RATE
# What a file waiting for speakers the diarizer will never give (its thread ended) fails with.
LOST = "the diarizer stopped before this file"
# How often (seconds) a run waiting for speakers tells the reporter how the diarizer is getting on.
POLL_SECONDS = 0.5


@dataclass(frozen=True)
class Outcome:
    """A file diarized: its speaker turns, or the error that stopped it; seconds: its audio's length."""

    turns: list[Any] | None
    seconds: float = 0.0
    error: BaseException | None = None


class DiarizeQueue:
    """Files diarized one at a time on a worker thread (the library releases the GIL, so this runs beside
    transcription), in the order given, except that a file someone waits for (hurry) goes first.

    vad: speech detection's options; each file is diarized only where it finds speech (a file with none
    is not given to the diarizer at all). None: the whole audio is diarized.

    Outcomes are collected with take(); wait() blocks until one of some keys is done (or a timeout);
    close() drops what has not started and does not wait for the file being diarized; work() says how
    far the diarizer has got."""

    def __init__(
        self,
        diarizer: Any,
        options: Any,
        *,
        read: Callable[[Any], np.ndarray] = read_samples,
        vad: VadOptions | None = None,
    ) -> None:
        self._diarizer, self._options, self._read, self._vad = diarizer, options, read, vad
        self._cond = threading.Condition()
        self._pending: list[tuple[Hashable, Any]] = []
        self._seconds: dict[Hashable, float] = {}  # each file's audio, estimated, then known
        self._urgent: set[Hashable] = set()
        self._running: Hashable | None = None
        self._done: dict[Hashable, Outcome] = {}
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="mlxasr-diarize", daemon=True)
        self._thread.start()

    def submit(self, key: Hashable, audio: Any, seconds: float = 0.0) -> None:
        """Diarize audio; seconds: its length as estimated (for the time left)."""
        with self._cond:
            self._pending.append((key, audio))
            self._seconds[key] = max(float(seconds), 0.0)
            self._cond.notify_all()

    def hurry(self, key: Hashable) -> None:
        """Diarize key next (its transcription is done and waits for it)."""
        with self._cond:
            self._urgent.add(key)

    def cancel(self, key: Hashable) -> None:
        """Forget key: not diarized if it has not started; its outcome dropped if it has."""
        with self._cond:
            self._pending = [(k, a) for k, a in self._pending if k != key]
            self._urgent.discard(key)
            self._done.pop(key, None)
            if self._running == key:
                self._running = None  # its outcome is not kept

    def take(self) -> dict[Hashable, Outcome]:
        """The outcomes finished since the last call."""
        with self._cond:
            done, self._done = self._done, {}
        return done

    def wait(self, keys: Iterable[Hashable], timeout: float) -> None:
        """Until an outcome of one of keys is waiting to be taken, one of them never will be (lost), or
        timeout."""
        keys = set(keys)
        with self._cond:
            self._cond.wait_for(lambda: keys & self._done.keys() or self._lost(keys), timeout)

    def lost(self, keys: Iterable[Hashable]) -> set[Hashable]:
        """Those of keys that will never have an outcome to take: not waiting, not being diarized and not
        done (taken already, never submitted, or the queue closed or its thread gone)."""
        with self._cond:
            return self._lost(set(keys))

    def _lost(self, keys: set[Hashable]) -> set[Hashable]:
        if self._closed or not self._thread.is_alive():
            return keys - self._done.keys()
        queued = {k for k, _ in self._pending} | {self._running}
        return keys - queued - self._done.keys()

    def outcome(self, key: Hashable) -> Outcome:
        """key's outcome, once it is done (taken here); an error outcome if it never will be."""
        while True:
            self.wait([key], timeout=POLL_SECONDS)
            with self._cond:
                if key in self._done:
                    return self._done.pop(key)
                if self._lost({key}):
                    return Outcome(None, error=RuntimeError(LOST))

    @property
    def busy(self) -> bool:
        """Some file is still to be diarized or being diarized."""
        with self._cond:
            return bool(self._pending) or self._running is not None

    def work(self) -> SpeakerWork:
        """How far the diarizer has got: the files left, the one it works on, the share of it done and the
        seconds left in all, where the diarizer tells (progress(), estimate(); stand-ins may lack them)."""
        with self._cond:
            running = self._running
            queued = [self._seconds.get(k, 0.0) for k, _ in self._pending]
            current = self._seconds.get(running, 0.0) if running is not None else 0.0
        files = len(queued) + (running is not None)
        progress = getattr(self._diarizer, "progress", None)
        snap = progress() if callable(progress) and running is not None else None
        estimate = getattr(self._diarizer, "estimate", None)
        left = None
        if callable(estimate):
            now = (
                snap.seconds_left if snap is not None else (estimate(current) if running is not None else 0.0)
            )
            left = max(float(now), 0.0) + sum(float(estimate(s)) for s in queued if s > 0)
        elif snap is not None and not queued:
            left = max(float(snap.seconds_left), 0.0)
        return SpeakerWork(
            files=files,
            key=running,
            fraction=None if snap is None else min(max(float(snap.fraction), 0.0), 1.0),
            left=left,
            attempt=1 if snap is None else int(snap.attempt),
            attempts=1 if snap is None else int(snap.attempts),
        )

    def close(self, wait: bool = False, timeout: float | None = None) -> None:
        """Drop what has not started; a file being diarized is cancelled where the diarizer can be
        (the library stops at its next stage), and waited for only with wait."""
        with self._cond:
            self._closed = True
            self._pending.clear()
            running = self._running is not None
            self._cond.notify_all()
        cancel = getattr(self._diarizer, "cancel", None)
        if running and callable(cancel):
            cancel()
        if wait:
            self._thread.join(timeout)

    def _next(self) -> tuple[Hashable, Any] | None:
        with self._cond:
            self._cond.wait_for(lambda: self._pending or self._closed)
            if self._closed:
                return None
            at = next((i for i, (k, _) in enumerate(self._pending) if k in self._urgent), 0)
            key, audio = self._pending.pop(at)
            self._urgent.discard(key)
            self._running = key
            return key, audio

    def _work(self) -> None:
        try:
            self._diarize_all()
        finally:  # however it ends, nobody waits for it any more
            with self._cond:
                self._closed = True
                self._cond.notify_all()

    def _diarize(self, key: Hashable, samples: np.ndarray) -> Any:
        speech = speech_seconds(samples, self._vad)
        if speech is not None and not speech:  # nothing said: no speakers, and no diarizer run
            return []
        with self._cond:
            if speech is not None:  # what the diarizer is given, for the time left
                self._seconds[key] = sum(end - start for start, end in speech)
        return diarize_speech(self._diarizer, samples, self._options, speech)

    def _diarize_all(self) -> None:
        while (item := self._next()) is not None:
            key, audio = item
            seconds = 0.0
            try:
                samples = self._read(audio)
                seconds = samples.shape[0] / SAMPLE_RATE
                with self._cond:
                    self._seconds[key] = seconds
                outcome = Outcome(self._diarize(key, samples), seconds)
            except Exception as e:  # one file's failure is that file's outcome
                outcome = Outcome(None, seconds, e)
            with self._cond:
                if self._running == key:
                    self._done[key] = outcome
                self._running = None
                self._cond.notify_all()


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
            self._speakers(replace(self.queue.work(), waiting=self._transcribed))

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
