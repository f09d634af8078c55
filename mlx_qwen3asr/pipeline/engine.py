"""One scheduler serving many callers at once (the server's requests): jobs share decoding steps.

The Engine runs the continuous-batching Scheduler on a thread of its own. `submit` queues an input
and returns a Job at once; the input's segments join the running batch as places free up, next to
those of every other job, so concurrent requests cost little more than one. A Job gives its
segments as they are decoded (for streaming), its result when done, and can be cancelled (a client
that went away), which frees its rows and waiting segments.

`submit_step` queues one decode of given audio with its own prompt after the shared start (a live
stream's step): its row joins the running batch of its context like a segment, and its Job's result
is the row's Generation. A step given `prepare` is encoded and prefilled by it, on the engine's thread
(a live stream's kept encoder blocks and draft, pipeline/window_decode.py), and joins the batch as
it is (pipeline/steps.py).
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import numpy as np

from mlx_qwen3asr.audio.files import estimate_duration
from mlx_qwen3asr.audio.vad import VadOptions, vad_options
from mlx_qwen3asr.checkpoints.loading import ASRModel
from mlx_qwen3asr.model.draft import DraftStart
from mlx_qwen3asr.model.generate import Generation
from mlx_qwen3asr.pipeline.inputs import DEFAULT_MAX_SEGMENT_SECONDS, AudioInput, InputOptions
from mlx_qwen3asr.pipeline.memory import wired_limit
from mlx_qwen3asr.pipeline.parts import Parts
from mlx_qwen3asr.pipeline.result import Segment, Transcription
from mlx_qwen3asr.pipeline.scheduler import InputResult, Scheduler, Step, StepResult
from mlx_qwen3asr.text.languages import resolve_language
from mlx_qwen3asr.text.prompt import prompt_prefix_ids


class JobCancelled(Exception):
    """The job was cancelled before it finished."""


class Job:
    """A submitted input: its segments as they come, and its transcription when it is done (a step's
    Generation, for submit_step)."""

    def __init__(self, engine: Engine, key: int, seconds: float):
        self.engine, self.key, self.seconds = engine, key, seconds
        self._done = threading.Event()
        self._segments: queue.Queue[Segment | None] = queue.Queue()
        self._result: InputResult | StepResult | None = None
        self._error: BaseException | None = None

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> Transcription | Generation:
        """The transcription (a step's Generation); raises the input's error, JobCancelled, or
        TimeoutError."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"job {self.key} not done after {timeout} s")
        if self._error is not None:
            raise self._error
        if isinstance(self._result, StepResult):
            return self._result.generation
        return self._result.transcription

    @property
    def input_result(self) -> InputResult | None:
        return self._result if isinstance(self._result, InputResult) else None

    def segments(self, timeout: float | None = None) -> Iterator[Segment]:
        """The segments in time order as they are decoded; ends when the job does."""
        while True:
            try:
                seg = self._segments.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"no segment of job {self.key} within {timeout} s") from None
            if seg is None:
                return
            yield seg

    def cancel(self) -> None:
        """Stop working on this job (its rows leave the batch); result() then raises JobCancelled."""
        self.engine._cancel(self)

    def _finish(
        self, result: InputResult | StepResult | None = None, error: BaseException | None = None
    ) -> None:
        if self._done.is_set():
            return
        self._result = result
        self._error = error if error is not None else (result.error if result is not None else None)
        self._done.set()
        self._segments.put(None)


class Engine:
    """The Scheduler on a background thread, fed by `submit` from any thread."""

    def __init__(
        self,
        model: ASRModel,
        *,
        aligner: ASRModel | None = None,
        max_segment_seconds: float = DEFAULT_MAX_SEGMENT_SECONDS,
        batch_size: int | None = None,
        vad: bool | VadOptions = True,
        parts: Parts | None = None,
    ) -> None:
        """vad: speech detection for every job (True, False or VadOptions), as in transcribe. parts: the
        stages its scheduler calls (default: the real ones; tests and benchmarks give their own)."""
        self.model, self.aligner = model, aligner
        self.vad = vad_options(vad)
        self._new_scheduler = lambda: Scheduler(
            model,
            aligner=aligner,
            max_segment_seconds=max_segment_seconds,
            batch_size=batch_size,
            on_segment=self._on_segment,
            parts=parts,
        )
        self._scheduler = self._new_scheduler()
        self._lock = threading.Condition()
        self._inbox: list[tuple[str, object]] = []
        self._jobs: dict[int, Job] = {}
        self._keys = itertools.count()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="mlxasr-engine", daemon=True)
        self._thread.start()

    # -- callers' side ---------------------------------------------------------------------------

    def submit(
        self,
        audio: AudioInput,
        *,
        language: str | None = None,
        context: str = "",
        word_timestamps: bool = False,
        seconds: float | None = None,
    ) -> Job:
        """Queue an input; raises ValueError for a bad language, an over-long context, or word timing
        without an aligner. seconds: its length, when known (for queued_seconds)."""
        if word_timestamps and self.aligner is None:
            raise ValueError("word timestamps need an aligner (start the engine with one)")
        options = InputOptions(resolve_language(language), context, word_timestamps, vad=self.vad)
        prompt_prefix_ids(self.model.tokenizer, context)  # an over-long context is refused here, at once
        if seconds is None:
            seconds = estimate_duration(audio) if isinstance(audio, str) else 0.0
        with self._lock:
            if self._closed:
                raise RuntimeError("the engine is closed")
            job = Job(self, next(self._keys), seconds)
            self._jobs[job.key] = job
            self._inbox.append(("submit", (job.key, audio, options)))
            self._lock.notify()
        return job

    def submit_step(
        self,
        samples: np.ndarray,
        suffix: Callable[[int], list[int]],
        budget: int,
        *,
        context: str = "",
        prepare: Callable[[], DraftStart] | None = None,
    ) -> Job:
        """Queue one decode of `samples` (16 kHz mono, encoded whole): the prompt start of `context`, then
        suffix(n_audio_tokens), decoding at most `budget` tokens; no speech detection, no cutting. Its row
        joins the running batch when the batch's context is the same (else it waits for its turn like
        any other context). The Job's result is the row's Generation. prepare: encodes and prefills the
        row itself, on the engine's thread, instead (its prompt must begin with the prompt start of
        `context`; samples and suffix then only size the row). Raises ValueError for an over-long
        context, RuntimeError when the engine is closed."""
        prompt_prefix_ids(self.model.tokenizer, context)
        step = Step(np.asarray(samples, dtype=np.float32).reshape(-1), suffix, int(budget), prepare)
        with self._lock:
            if self._closed:
                raise RuntimeError("the engine is closed")
            job = Job(self, next(self._keys), 0.0)
            self._jobs[job.key] = job
            self._inbox.append(("step", (job.key, step, context)))
            self._lock.notify()
        return job

    def call(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Run fn(*args) on the engine's thread, between two steps of its batch, and return a Future of
        its result: model work done outside the scheduler that never uses the
        model at the same time as the batch. Raises RuntimeError when the engine is closed; a call still
        waiting when it closes raises JobCancelled."""
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the engine is closed")
            self._inbox.append(("call", (future, fn, args)))
            self._lock.notify()
        return future

    def queued_seconds(self) -> float:
        """Seconds of audio submitted and not finished yet."""
        with self._lock:
            return sum(j.seconds for j in self._jobs.values())

    def _cancel(self, job: Job) -> None:
        with self._lock:
            if self._jobs.pop(job.key, None) is None:
                return
            self._inbox.append(("cancel", job.key))
            self._lock.notify()
        job._finish(error=JobCancelled(f"job {job.key} was cancelled"))

    def close(self) -> None:
        """Stop the engine; jobs not done are cancelled."""
        with self._lock:
            self._closed = True
            jobs = list(self._jobs.values())
            calls, self._inbox = (
                [item for kind, item in self._inbox if kind == "call"],
                [(kind, item) for kind, item in self._inbox if kind != "call"],
            )
            self._lock.notify()
        self._refuse(calls)
        for job in jobs:
            job.cancel()
        self._thread.join(timeout=30)
        self._scheduler.close()

    # -- the engine's thread ---------------------------------------------------------------------

    def _on_segment(self, key, seg: Segment) -> None:
        job = self._jobs.get(key)
        if job is not None:
            job._segments.put(seg)

    def _run(self) -> None:
        try:
            with wired_limit(self.model):  # weights and caches stay resident while the engine runs
                self._loop()
        except BaseException as e:  # the engine cannot go on: no job waits for it forever
            with self._lock:
                self._closed = True
                jobs, self._jobs = list(self._jobs.values()), {}
                calls = [item for kind, item in self._inbox if kind == "call"]
            for job in jobs:
                job._finish(error=RuntimeError(f"the engine stopped ({type(e).__name__}: {e})"))
            self._refuse(calls)
            raise

    def _loop(self) -> None:
        scheduler = self._scheduler
        while True:
            with self._lock:
                while not self._inbox and scheduler.idle and not self._closed:
                    self._lock.wait()
                if self._closed:
                    return
                inbox, self._inbox = self._inbox, []
            for kind, item in inbox:
                if kind == "call":
                    self._call(*item)
                    continue
                try:
                    if kind == "submit":
                        key, audio, options = item
                        scheduler.submit(key, audio, options)
                    elif kind == "step":
                        key, step, context = item
                        scheduler.submit_step(key, step, context)
                    else:
                        scheduler.cancel(item)
                except Exception as e:  # that job fails; the engine goes on
                    if kind in ("submit", "step"):
                        self._finish(item[0], error=e)
            if scheduler.idle:
                continue
            try:
                results = scheduler.run_once()
            except Exception as e:  # a fault of the engine itself: every job in it fails alike
                with self._lock:
                    jobs, self._jobs = list(self._jobs.values()), {}
                for job in jobs:
                    job._finish(error=e)
                # A scheduler left in an unknown state is replaced, so that the engine never spins.
                scheduler.close()
                scheduler = self._scheduler = self._new_scheduler()
                continue
            for res in results:
                self._finish(res.index, result=res)

    @staticmethod
    def _refuse(calls: list[tuple[Future, Callable[..., Any], tuple]]) -> None:
        """Calls that will not run (the engine stopped): their futures raise JobCancelled."""
        for future, _, _ in calls:
            if future.set_running_or_notify_cancel():
                future.set_exception(JobCancelled("the engine stopped before the call ran"))

    @staticmethod
    def _call(future: Future, fn: Callable[..., Any], args: tuple) -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            result = fn(*args)
        except BaseException as e:  # the caller's failure, not the engine's
            future.set_exception(e)
        else:
            future.set_result(result)

    def _finish(
        self, key: int, result: InputResult | StepResult | None = None, error: BaseException | None = None
    ) -> None:
        with self._lock:
            job = self._jobs.pop(key, None)
        if job is not None:
            job._finish(result, error)


__all__ = ["Engine", "Job", "JobCancelled"]
