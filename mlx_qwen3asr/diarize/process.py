"""The diarizer's library runs in a worker process (worker.py) that can be killed: speakrs checks its cancel
token only between its pipeline stages (minutes apart on a long file on the CPU), a killed process stops at
once.

A Worker starts its process on first use (a Python of its own, importing only numpy and speakrs, which loads
the models again), keeps it for the runs that follow, and kills it to cancel a run: the run raises
DiarizeCancelled at once, and the next run starts a fresh process. A process that dies (a crash, killed from
outside, out of memory) fails only the run it was doing, in one line. The process ends with its Worker
(close(), garbage collection, the interpreter's exit) and, reading its stdin, with its parent.

POSIX only (it waits on pipes with select)."""

from __future__ import annotations

import atexit
import os
import select
import signal
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

import numpy as np

from mlx_qwen3asr.diarize import worker as protocol
from mlx_qwen3asr.diarize.turns import SAMPLE_RATE, DiarizeCancelled, DiarizerError

WORKER_SCRIPT = Path(__file__).with_name("worker.py")
# The most a new process may take to start and load the models (seconds).
START_SECONDS = 300.0
# close(): how long the process has to leave once its stdin is closed, before it is killed.
CLOSE_GRACE_SECONDS = 1.0
# How often a wait on the process looks at its cancel flag and deadline (a kill ends a wait sooner).
POLL_SECONDS = 0.1
# The samples go to the process in writes of at most this many bytes.
_CHUNK = 1 << 20

_workers: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for worker in list(_workers):
        worker.close()


class _Cancelled(Exception):
    pass


class _Gone(Exception):
    """The process went away in the middle of a request (its output ended, or its input broke)."""


def _stopped(proc: subprocess.Popen) -> str:
    """How a process that went away ended, in words."""
    try:
        code = proc.wait(timeout=2.0)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return "it closed its output"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        more = " (out of memory, or killed from outside)" if -code == signal.SIGKILL else ""
        return f"killed by {name}{more}"
    return f"exited with status {code}"


class Worker:
    """speakrs's runs in a process of their own, for one model folder and mode. run() is called by one
    thread at a time (the Diarizer's lock); kill() and close() from any thread."""

    def __init__(self, mode: str, model_dir: str) -> None:
        self.mode, self.model_dir = mode, model_dir
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._busy = False  # a run in progress (its thread owns the pipes)
        self._closed: subprocess.Popen | None = None  # the process close() killed in a run
        _workers.add(self)

    @property
    def pid(self) -> int | None:
        """The process's id while it runs, else None."""
        with self._lock:
            proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def run(
        self, samples: np.ndarray, threshold: float | None, cancelled: threading.Event
    ) -> tuple[list, float]:
        """The spans (start, end, label) of speakrs's run on samples, with the AHC threshold (None: the
        models' own), and the seconds it computed. Raises DiarizeCancelled once cancelled is set (kill()
        ends the run at once), DiarizerError when the run fails or the process stops."""
        with self._lock:
            self._busy = True
        try:
            proc = self._process(cancelled)
            data = memoryview(np.ascontiguousarray(samples, dtype=np.float32)).cast("B")
            head = {"op": "diarize", "threshold": threshold, "rate": SAMPLE_RATE}
            answer = self._ask(proc, head, data, cancelled, deadline=None)
        finally:
            with self._lock:
                self._busy = False
        if "error" in answer:
            raise DiarizerError(f"diarization failed: {answer['error']}")
        spans = [(float(s), float(e), str(label)) for s, e, label in answer["spans"]]
        return spans, float(answer.get("seconds", 0.0))

    def kill(self) -> None:
        """Kill the process (SIGKILL): a run in progress raises at once; the next run starts another."""
        with self._lock:
            proc = self._proc
            if proc is not None and proc.poll() is None:
                proc.kill()

    def close(self) -> None:
        """End the process: its stdin closed, then killed if it has not left within a grace period; killed
        at once in the middle of a run (whose thread then raises, and closes the pipes it uses)."""
        with self._lock:
            proc, self._proc = self._proc, None
            busy = self._busy
        if proc is None:
            return
        if busy:
            self._closed = proc
            if proc.poll() is None:
                proc.kill()
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout=CLOSE_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def _process(self, cancelled: threading.Event) -> subprocess.Popen:
        """The running process, started (and its models loaded) if there is none."""
        with self._lock:
            proc = self._proc
        if proc is not None and proc.poll() is None:
            return proc
        if proc is not None:
            self._forget(proc)
        if cancelled.is_set():
            raise DiarizeCancelled("diarization was cancelled")
        if not sys.executable:
            raise DiarizerError("cannot start the diarizer process: no Python interpreter (sys.executable)")
        try:
            proc = subprocess.Popen(
                [sys.executable, str(WORKER_SCRIPT)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                bufsize=0,
                close_fds=True,
            )
        except OSError as e:
            raise DiarizerError(f"cannot start the diarizer process: {e.strerror or e}") from e
        with self._lock:
            self._proc = proc
        head = {"op": "load", "mode": self.mode, "model_dir": self.model_dir}
        answer = self._ask(proc, head, b"", cancelled, deadline=time.monotonic() + START_SECONDS)
        if "error" in answer:
            self._end(proc)
            raise DiarizerError(
                f"the diarizer process cannot load the models in {self.model_dir}: {answer['error']}"
            )
        return proc

    def _ask(
        self,
        proc: subprocess.Popen,
        head: dict,
        data: bytes | memoryview,
        cancelled: threading.Event,
        deadline: float | None,
    ) -> dict:
        """Send a request to proc and read its answer, minding cancelled and the deadline. Whatever goes
        wrong midway ends the process (its stream is then out of step)."""
        try:
            if cancelled.is_set():
                raise _Cancelled
            self._send(proc, head, data, cancelled)
            answer, _ = self._receive(proc, cancelled, deadline)
            return answer
        except _Cancelled:
            self._end(proc)
            raise DiarizeCancelled("diarization was cancelled") from None
        except _Gone:
            if cancelled.is_set() or self._closed is proc:
                self._end(proc)
                raise DiarizeCancelled("diarization was cancelled") from None
            how = _stopped(proc)
            self._forget(proc)
            raise DiarizerError(f"the diarizer process stopped: {how}") from None
        except TimeoutError:
            self._end(proc)
            raise DiarizerError(
                f"the diarizer process did not load the models in {START_SECONDS:g} s; it was stopped"
            ) from None
        except BaseException:  # Ctrl-C, or anything unforeseen: the process is out of step
            self._end(proc)
            raise

    def _send(
        self, proc: subprocess.Popen, head: dict, data: bytes | memoryview, cancelled: threading.Event
    ) -> None:
        import json

        text = json.dumps(head).encode()
        fd = proc.stdin.fileno()
        pending = [memoryview(protocol.HEADER.pack(len(text), len(data)) + text), memoryview(data)]
        try:
            for view in pending:
                while len(view):
                    if cancelled.is_set():
                        raise _Cancelled
                    written = os.write(fd, view[:_CHUNK])
                    view = view[written:]
        except (BrokenPipeError, ConnectionResetError, ValueError) as e:
            raise _Gone from e

    def _receive(
        self, proc: subprocess.Popen, cancelled: threading.Event, deadline: float | None
    ) -> tuple[dict, bytes]:
        import json

        fd = proc.stdout.fileno()

        def read(size: int) -> bytes:
            parts, left = [], size
            while left:
                if cancelled.is_set():
                    raise _Cancelled
                wait = POLL_SECONDS
                if deadline is not None:
                    wait = min(wait, deadline - time.monotonic())
                    if wait <= 0:
                        raise TimeoutError
                ready, _, _ = select.select([fd], [], [], wait)
                if not ready:
                    continue
                chunk = os.read(fd, min(left, _CHUNK))
                if not chunk:
                    raise _Gone
                parts.append(chunk)
                left -= len(chunk)
            return b"".join(parts)

        size, data_size = protocol.HEADER.unpack(read(protocol.HEADER.size))
        head = json.loads(read(size))
        return head, read(data_size) if data_size else b""

    def _forget(self, proc: subprocess.Popen) -> None:
        with self._lock:
            if self._proc is proc:
                self._proc = None
        for stream in (proc.stdin, proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass

    def _end(self, proc: subprocess.Popen) -> None:
        """Kill proc and wait for it to go."""
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        self._forget(proc)
