"""Live streams' steps in the Scheduler's batch: a single decode of given audio, as a row beside the
segments of file inputs.

A plain step (``Step(samples, suffix, budget)``) is encoded whole and prefilled with the segments. A
prepared step (``Step(..., prepare=fn)``) is encoded and prefilled by its stream: ``prepare()`` runs
here, on the scheduler's thread, between two decoding steps, and gives a ``DraftStart`` (the stream's
kept encoder blocks and prompt keys and values used, its draft checked); the row then joins the
running batch with its cache as it is, its positions after the batch's prompt start its own.
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

from mlx_qwen3asr.audio.cutting import Span
from mlx_qwen3asr.audio.signal import ArraySignal
from mlx_qwen3asr.model.generate import Generation
from mlx_qwen3asr.pipeline.inputs import InputOptions, PreparedInput
from mlx_qwen3asr.pipeline.tasks import Pending, Step, Task


class LiveSteps:
    """The Scheduler's methods for live steps (see the module docstring)."""

    def submit_step(self, key: Hashable, step: Step, context: str = "") -> None:
        """Queue one decode (a live stream's step): its row joins a batch of its context like any segment
        and its StepResult comes out of run_once under this key."""
        self.starts.ids(context)  # an over-long context is refused before any work
        samples = np.asarray(step.samples, dtype=np.float32).reshape(-1)
        step = Step(samples, step.suffix, int(step.budget), step.prepare)
        span = Span(0, samples.shape[0])
        prepared = PreparedInput(0, None, ArraySignal(samples), [span])
        entry = Pending(key, prepared, InputOptions(context=context), [None], step=step)
        self.pending[key] = entry
        self.pool.append(Task(entry, 0, self.admitted))
        self.admitted += 1

    def _join_prepared(self, task: Task) -> None:
        """A prepared step: prepared now, then its row joins the batch (starting one if none runs)."""
        if not self._alive(task):
            return
        try:
            start = task.step.prepare()
            task.started = start
            if start.done is None:
                if self.batch is None:
                    prefix = self.starts.prefix(self.batch_context)
                    self.batch = self.parts.batch(self.model.net, self.eos, prefix=prefix, header=self.header)
                self.in_batch[id(task)] = task
                start.join(self.batch, id(task))
        except Exception as e:  # this step fails; a join that failed part-way lost the running rows too
            self.in_batch.pop(id(task), None)
            self._fail([task.pending], e)
            kept = set(self.batch.keys) if self.batch is not None else set()
            self._fail([t.pending for k, t in self.in_batch.items() if k not in kept], e)
            return
        if start.done is not None:
            self._row_done_now(task, start.done)

    def _row_done_now(self, task: Task, gen: Generation) -> None:
        try:
            self._finished(task, gen)
        except Exception as e:
            self._fail([task.pending], e)

    @staticmethod
    def _step_generation(task: Task, gen: Generation) -> Generation:
        """A step's whole Generation: a prepared row's kept draft tokens, then what it decoded."""
        start = task.started
        return gen if start is None or gen is start.done else start.finish(gen)


__all__ = ["LiveSteps"]
