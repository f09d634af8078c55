"""The one diarizer worker that `mlxasr --diarize`, `mlxasr align --diarize` and the server share
(mlx_qwen3asr.diarize.queue): order and hurry, a failure that ends its own job alone, cancelling that drops
a waiting job and stops a running one (and never another's run), what it holds for /health and the bar,
and close(). (Speech detection's part: test_diarize_progress.py.) The diarizers are stand-ins."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from mlx_qwen3asr.diarize import DiarizeCancelled, Turn
from mlx_qwen3asr.diarize.queue import DiarizeQueue

RATE = 16000


def audio(seconds: float, value: float = 0.0) -> np.ndarray:
    return np.full(int(seconds * RATE), value, dtype=np.float32)


class Gated:
    """A diarizer whose calls wait for `gate` (or for cancel(), which stops only a call in progress and
    raises DiarizeCancelled). calls: each call's seconds of audio; cancels: while which call (its seconds)
    cancel() was called; a call on audio whose first sample is negative fails."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.calls: list[float] = []
        self.cancels: list[float] = []
        self.running: float | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, samples, options, speech=None):
        seconds = samples.shape[0] / RATE
        with self._lock:
            self.calls.append(seconds)
            self.running = seconds
            self._stop.clear()
        try:
            while not self.gate.wait(0.01):
                if self._stop.is_set():
                    raise DiarizeCancelled("diarization was cancelled")
            if samples.size and samples[0] < 0:
                raise RuntimeError("this one fails")
            return [Turn(0.0, seconds, 0)]
        finally:
            with self._lock:
                self.running = None

    def cancel(self) -> None:
        with self._lock:
            if self.running is not None:
                self.cancels.append(self.running)
                self._stop.set()

    def progress(self):
        running = self.running
        if running is None:
            return None
        return SimpleNamespace(fraction=0.25, seconds_left=3.0, attempt=1, attempts=1)

    def estimate(self, seconds: float) -> float:
        return seconds / 2


def until(condition, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.005)


def test_a_failure_ends_its_own_job_alone_and_the_others_keep_their_order():
    diarizer = Gated()
    diarizer.gate.set()
    queue = DiarizeQueue(diarizer, None)
    try:
        jobs = [
            queue.submit(None, audio(1.0)),
            queue.submit(None, audio(2.0, -1.0)),
            queue.submit(None, audio(3.0)),
        ]
        outcomes = [job.future.result(timeout=5) for job in jobs]
    finally:
        queue.close()
    assert diarizer.calls == [1.0, 2.0, 3.0]
    assert [o.error is None for o in outcomes] == [True, False, True]
    assert str(outcomes[1].error) == "this one fails" and outcomes[1].seconds == 2.0
    assert outcomes[2].turns == [Turn(0.0, 3.0, 0)]


def test_a_file_someone_waits_for_goes_next():
    diarizer = Gated()
    queue = DiarizeQueue(diarizer, None)
    try:
        for key in range(3):
            queue.submit(key, audio(key + 1.0), key + 1.0)
        until(lambda: diarizer.calls == [1.0])
        queue.hurry(2)
        diarizer.gate.set()
        assert [queue.outcome(k).seconds for k in (0, 1, 2)] == [1.0, 2.0, 3.0]
    finally:
        queue.close()
    assert diarizer.calls == [1.0, 3.0, 2.0]


def test_cancelling_drops_a_waiting_job_and_stops_only_the_run_it_owns():
    diarizer = Gated()
    queue = DiarizeQueue(diarizer, None)
    try:
        running = queue.submit("a", audio(6.0), 6.0)
        waiting = queue.submit("b", audio(4.0), 4.0)
        until(lambda: diarizer.running == 6.0)
        assert queue.queued_seconds() == pytest.approx(4.0 + 6.0 * 0.75)  # the running one by what is left
        assert queue.backlog().files == 2 and queue.backlog().key == "a"
        assert queue.backlog().left == pytest.approx(3.0 + 2.0)  # its progress, then estimate(4 s)

        waiting.cancel()
        assert waiting.future.cancelled() and queue.lost(["b"]) == {"b"}
        assert queue.queued_seconds() == pytest.approx(6.0 * 0.75)
        time.sleep(0.1)
        assert diarizer.cancels == []  # the other job's run goes on

        later = queue.submit("c", audio(2.0), 2.0)
        queue.cancel("a")  # by key, as the CLI does for a file whose transcription failed
        until(lambda: diarizer.calls == [6.0, 2.0])
        assert set(diarizer.cancels) == {6.0}  # never the next job's run
        diarizer.gate.set()
        assert later.future.result(timeout=5).turns == [Turn(0.0, 2.0, 0)]
        assert running.future.cancelled() and queue.take() == {"c": later.future.result()}
    finally:
        queue.close()
    assert queue.queued_seconds() == 0.0 and queue.backlog().files == 0


def test_close_cancels_everything_and_refuses_more():
    diarizer = Gated()
    queue = DiarizeQueue(diarizer, None)
    running, waiting = queue.submit(0, audio(1.0)), queue.submit(1, audio(1.0))
    until(lambda: diarizer.running is not None)
    queue.close(wait=True, timeout=5)
    assert running.future.cancelled() and waiting.future.cancelled()
    assert diarizer.cancels == [1.0] and queue.lost([0, 1]) == {0, 1}
    assert queue.outcome(1).error is not None  # never diarized: an error, not a wait
    with pytest.raises(RuntimeError, match="closed"):
        queue.submit(2, audio(1.0))
