"""One diarizer's work, shared by every front end: `mlxasr --diarize` and `mlxasr align --diarize` (the
CLI's diarize_queue.py) and the server's diarized_json (serve/speakers.py).

Audio is diarized one piece at a time on a worker thread (the library releases the GIL, so this runs beside
transcription), in the order submitted, except that audio someone waits for (hurry) goes next. Only the
speech that speech detection finds is diarized (vad; None: all the audio); audio without speech never
reaches the diarizer.

Each submit() gives a DiarizeJob, whose future gives its Outcome: its speaker turns, or the error that
stopped it (an error ends that job alone). A job submitted with a key can also be collected by it: take(),
wait(), outcome(). cancel() drops a job that waits and stops one that runs, with the diarizer's cancel()
where it has one (told again every CANCEL_EVERY_SECONDS until that run is over, and only while that job's
run is the one in progress: the diarizer is shared); a cancelled job has no outcome. close() cancels them
all. backlog() says how far the diarizer has got and the compute left (the CLI's bar); queued_seconds() the
audio it still holds (the server's /health and its busy limit)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from mlx_qwen3asr.audio.vad import VadOptions
from mlx_qwen3asr.diarize.given import diarize_speech, read_samples, speech_seconds
from mlx_qwen3asr.diarize.turns import SAMPLE_RATE, DiarizeCancelled

__all__ = ["CANCEL_EVERY_SECONDS", "LOST", "Backlog", "DiarizeJob", "DiarizeQueue", "Outcome"]

log = logging.getLogger(__name__)

# What a job the diarizer will never give an outcome to (its thread ended) fails with.
LOST = "the diarizer stopped before this file"
# How often a running job being cancelled has the diarizer told again to stop, until its run ends (a
# cancel that comes before the diarizer has started its run would otherwise find nothing to stop).
CANCEL_EVERY_SECONDS = 0.05
# How often outcome() looks again while it waits (so that the waiting thread stays interruptible).
POLL_SECONDS = 0.5

_WAITING, _RUNNING, _DONE, _CANCELLED = "waiting", "running", "done", "cancelled"


@dataclass(frozen=True)
class Outcome:
    """A job diarized: its speaker turns, or the error that stopped it; seconds: its audio's length."""

    turns: list[Any] | None
    seconds: float = 0.0
    error: BaseException | None = None


@dataclass(frozen=True)
class Backlog:
    """How far the diarizer has got: the jobs left (the one it works on included), that one's key and the
    share of it done, and the seconds of compute left in all, where the diarizer tells (progress(),
    estimate()); attempt and attempts: the run of its speaker-count search."""

    files: int = 0
    key: Hashable = None
    fraction: float | None = None
    left: float | None = None
    attempt: int = 1
    attempts: int = 1


class DiarizeJob:
    """One piece of audio queued for the diarizer: `future` gives its Outcome (cancelled, it gives none);
    cancel() drops it if it waits and stops it if it runs (nothing once it is done)."""

    def __init__(
        self, queue: DiarizeQueue, key: Hashable, audio: Any, seconds: float, options: Any | None = None
    ) -> None:
        self.key, self.audio = key, audio
        self.options = options  # None: the queue's
        self.seconds = max(float(seconds), 0.0)  # the audio's length: as estimated, then as read
        self.given = self.seconds  # what the diarizer is given (its speech, where detection ran)
        self.future: Future[Outcome] = Future()
        self.state = _WAITING
        self._queue = queue

    @property
    def cancelled(self) -> bool:
        return self.state == _CANCELLED

    def cancel(self) -> None:
        self._queue._cancel(self)

    def done(self) -> bool:
        return self.future.done()


def _samples(audio: Any) -> np.ndarray:
    """16 kHz samples as given, or a file's read whole."""
    if isinstance(audio, np.ndarray):
        return np.ascontiguousarray(audio, dtype=np.float32)
    return read_samples(audio)


class DiarizeQueue:
    """A diarizer's jobs, run one at a time on a worker thread (started by the first submit).

    diarizer: called as diarizer(samples, options[, speech=...]); where it has them, its cancel() stops
    the run in progress, progress() tells how far that run is and estimate(seconds) what a run costs.
    read: what turns the audio given to submit() into samples (default: arrays as they are, files read
    whole). vad: speech detection's options (None: the whole audio is diarized); settable until the
    first job runs."""

    def __init__(
        self,
        diarizer: Any,
        options: Any,
        *,
        read: Callable[[Any], np.ndarray] = _samples,
        vad: VadOptions | None = None,
    ) -> None:
        self.diarizer, self.options, self.vad = diarizer, options, vad
        self._read = read
        self._cond = threading.Condition()
        self._waiting: list[DiarizeJob] = []
        self._running: DiarizeJob | None = None
        self._urgent: set[Hashable] = set()
        self._done: dict[Hashable, Outcome] = {}  # the outcomes of keyed jobs, not yet taken
        self._closed = False
        self._thread: threading.Thread | None = None

    # -- submitting and cancelling --

    def submit(
        self, key: Hashable, audio: Any, seconds: float = 0.0, options: Any | None = None
    ) -> DiarizeJob:
        """Diarize audio (16 kHz samples, or what read reads) after the jobs already queued; seconds: its
        length as estimated (for the time left). key: what take(), wait(), outcome(), hurry() and
        cancel() know it by (None: its future alone gives its outcome). options: this job's
        DiarizeOptions (None: the queue's). RuntimeError once closed."""
        with self._cond:
            if self._closed:
                raise RuntimeError("the diarizer is closed")
            job = DiarizeJob(self, key, audio, seconds, options)
            self._waiting.append(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="mlxasr-diarize", daemon=True)
                self._thread.start()
            self._cond.notify_all()
        return job

    def hurry(self, key: Hashable) -> None:
        """Diarize key next (someone waits for it)."""
        with self._cond:
            self._urgent.add(key)

    def cancel(self, key: Hashable) -> None:
        """Forget key: not diarized if it waits, stopped if it runs, its outcome dropped if it is done."""
        with self._cond:
            self._urgent.discard(key)
            self._done.pop(key, None)
            jobs = [j for j in [self._running, *self._waiting] if j is not None and j.key == key]
        for job in jobs:
            self._cancel(job)

    def _cancel(self, job: DiarizeJob) -> None:
        with self._cond:
            running = self._drop(job)
        self._dropped(job, running)

    def _drop(self, job: DiarizeJob) -> bool | None:
        """job marked cancelled and out of the queue (under the lock): whether it was running; None when it
        was over already."""
        if job.state not in (_WAITING, _RUNNING):
            return None
        running = job.state == _RUNNING
        job.state = _CANCELLED
        if not running:
            self._waiting.remove(job)
        self._cond.notify_all()
        return running

    def _dropped(self, job: DiarizeJob, running: bool | None) -> None:
        """After _drop: its future cancelled, and its run (if it was running) stopped."""
        if running is None:
            return
        job.future.cancel()  # the worker never sets the outcome of a cancelled job
        if running and callable(getattr(self.diarizer, "cancel", None)):
            threading.Thread(
                target=self._stop, args=(job,), name="mlxasr-diarize-cancel", daemon=True
            ).start()

    def _stop(self, job: DiarizeJob) -> None:
        """Tell the diarizer to stop until job's run is over: never another job's run, since the worker
        starts no other while job is the one running."""
        with self._cond:
            while self._running is job:
                self.diarizer.cancel()
                self._cond.wait(CANCEL_EVERY_SECONDS)

    def close(self, wait: bool = False, timeout: float | None = None) -> None:
        """Cancel every job (the one running stopped where the diarizer can be); its run is waited for only
        with wait. Later submits raise."""
        with self._cond:
            self._closed = True
            jobs = [j for j in [self._running, *self._waiting] if j is not None]
            dropped = [(job, self._drop(job)) for job in jobs]
        for job, running in dropped:
            self._dropped(job, running)
        if wait and self._thread is not None:
            self._thread.join(timeout)

    # -- outcomes by key --

    def take(self) -> dict[Hashable, Outcome]:
        """The outcomes of keyed jobs finished since the last call."""
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
        done (taken already, never submitted, cancelled, or the queue closed or its thread gone)."""
        with self._cond:
            return self._lost(set(keys))

    def _lost(self, keys: set[Hashable]) -> set[Hashable]:
        if self._closed:
            return keys - self._done.keys()
        queued = {j.key for j in self._waiting}
        if self._running is not None and self._running.state == _RUNNING:
            queued.add(self._running.key)
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

    # -- how far it has got --

    def _snapshot(self) -> Any:
        """The diarizer's progress() of its run in progress, where it tells (never worth failing for)."""
        progress = getattr(self.diarizer, "progress", None)
        if not callable(progress):
            return None
        try:
            return progress()
        except Exception:
            return None

    def backlog(self) -> Backlog:
        """The jobs left, the one being diarized and the share of it done, and the compute left in all."""
        with self._cond:
            running = self._running if self._running is not None and self._running.state == _RUNNING else None
            queued = [j.given for j in self._waiting]
            current = running.given if running is not None else 0.0
        snap = self._snapshot() if running is not None else None
        estimate = getattr(self.diarizer, "estimate", None)
        left = None
        if callable(estimate):
            now = (
                snap.seconds_left if snap is not None else (estimate(current) if running is not None else 0.0)
            )
            left = max(float(now), 0.0) + sum(float(estimate(s)) for s in queued if s > 0)
        elif snap is not None and not queued:
            left = max(float(snap.seconds_left), 0.0)
        return Backlog(
            files=len(queued) + (running is not None),
            key=None if running is None else running.key,
            fraction=None if snap is None else min(max(float(snap.fraction), 0.0), 1.0),
            left=left,
            attempt=1 if snap is None else int(snap.attempt),
            attempts=1 if snap is None else int(snap.attempts),
        )

    def queued_seconds(self) -> float:
        """Audio waiting for the diarizer or in its run, in seconds (the one running counted by what is left
        of it, where the diarizer tells its progress; a cancelled run until it stops)."""
        with self._cond:
            total = sum(j.seconds for j in self._waiting)
            running = self._running
        if running is not None:
            snap = self._snapshot()
            left = 1.0 if snap is None else min(1.0, max(0.0, 1.0 - float(snap.fraction)))
            total += running.seconds * left
        return max(0.0, total)

    # -- the worker --

    def _next(self) -> DiarizeJob | None:
        with self._cond:
            self._cond.wait_for(lambda: self._waiting or self._closed)
            if self._closed:
                return None
            at = next((i for i, j in enumerate(self._waiting) if j.key in self._urgent), 0)
            job = self._waiting.pop(at)
            self._urgent.discard(job.key)
            job.state, self._running = _RUNNING, job
            return job

    def _work(self) -> None:
        try:
            while (job := self._next()) is not None:
                outcome = self._run(job)
                with self._cond:
                    self._running = None
                    kept = job.state == _RUNNING
                    if kept:
                        job.state = _DONE
                        if job.key is not None:
                            self._done[job.key] = outcome
                    self._cond.notify_all()
                if kept:
                    job.future.set_result(outcome)
        finally:  # however it ends, nobody waits for it any more: what is left fails as lost
            with self._cond:
                self._closed = True
                left = [j for j in [self._running, *self._waiting] if j is not None and j.state != _CANCELLED]
                self._running = None
                self._waiting.clear()
                for job in left:
                    job.state = _DONE
                self._cond.notify_all()
            for job in left:
                job.future.set_result(Outcome(None, job.seconds, RuntimeError(LOST)))

    def _run(self, job: DiarizeJob) -> Outcome:
        """job's outcome: its turns, or what stopped it (an error ends this job alone)."""
        seconds = 0.0
        try:
            samples = self._read(job.audio)
            seconds = samples.shape[0] / SAMPLE_RATE
            speech = speech_seconds(samples, self.vad)
            with self._cond:
                job.seconds = job.given = seconds
                if speech is not None:  # what the diarizer is given, for the time left
                    job.given = sum(end - start for start, end in speech)
            if speech is not None and not speech:  # nothing said: no speakers, and no diarizer run
                log.debug("no speech in %.1f s of audio: nothing to diarize", seconds)
                return Outcome([], seconds)
            if job.cancelled:
                raise DiarizeCancelled("diarization was cancelled")
            log.debug("diarizing %.1f s of audio", seconds)
            return Outcome(
                diarize_speech(self.diarizer, samples, job.options or self.options, speech), seconds
            )
        except BaseException as e:  # one job's failure is that job's outcome
            if job.cancelled:
                log.debug("a cancelled diarization stopped (%s)", type(e).__name__)
            return Outcome(None, seconds, e)
        finally:
            job.audio = None
