"""An isolated diarizer (load_diarizer(..., isolated=True)): the library runs in a worker process that
cancel() kills, so a cancelled call stops at once rather than at speakrs's next stage boundary (minutes
away on long audio). It gives the turns the diarizer in this process gives; a worker killed from outside
fails only its call, in one line; no worker outlives its diarizer or its parent; the worker imports
neither mlx nor this package. The real library on the random-weight preset."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from reference import test_signal

from mlx_qwen3asr.diarize import (
    DiarizeCancelled,
    DiarizeOptions,
    DiarizerError,
    load_diarizer,
)
from mlx_qwen3asr.diarize import process as worker_process
from tools.make_checkpoint import DIARIZER_PRESET

pytest.importorskip("speakrs", reason="speakrs (the diarize extra, Python 3.11+) is not installed")

RATE = 16000
ROOT = Path(__file__).resolve().parents[1]
# Long enough that speakrs's first stage alone outlasts every deadline here (about a second of compute
# per audio second on this preset).
LONG_SECONDS = 90.0


def gone(pid: int) -> bool:
    """Whether process pid has ended (a zombie left to its new parent counts as ended)."""
    stat = Path(f"/proc/{pid}/stat")
    if Path("/proc/self/stat").exists():
        try:
            return stat.read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
        except (FileNotFoundError, ProcessLookupError):
            return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    state = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True).stdout
    return state.strip().startswith("Z") or not state.strip()


def until(condition, what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.01)


@pytest.fixture(scope="module")
def folder(checkpoints) -> Path:
    return checkpoints(DIARIZER_PRESET)


@pytest.fixture(scope="module")
def isolated(folder):
    d = load_diarizer(folder, isolated=True)
    yield d
    d.close()


class Call:
    """A diarizer call on a thread of its own: its turns, or what it raised, and when it ended."""

    def __init__(self, diarizer, samples: np.ndarray) -> None:
        self.outcome = None
        self.ended = None
        self._thread = threading.Thread(target=self._run, args=(diarizer, samples), daemon=True)
        self._thread.start()

    def _run(self, diarizer, samples) -> None:
        try:
            self.outcome = diarizer(samples)
        except BaseException as e:
            self.outcome = e
        self.ended = time.monotonic()

    def join(self, seconds: float):
        self._thread.join(seconds)
        assert not self._thread.is_alive(), f"the call did not end within {seconds} s"
        return self.outcome


def short() -> np.ndarray:
    return test_signal(6.0, seed=3)


def test_an_isolated_diarizer_gives_the_turns_of_the_one_in_this_process(folder, isolated):
    assert isolated.isolated and isolated.worker_pid is None  # started on first use
    samples = test_signal(9.0, seed=1)
    speech = [(0.5, 4.0), (4.8, 8.5)]
    here = load_diarizer(folder)
    assert not here.isolated
    # A count out of reach: the first run, then the search's two more (other thresholds), each in the
    # worker process.
    options = DiarizeOptions(min_speakers=9)
    expected = here(samples, options, speech=speech)
    assert expected and expected.warnings
    got = isolated(samples, options, speech=speech)
    assert list(got) == list(expected) and got.warnings == expected.warnings
    pid = isolated.worker_pid
    assert pid is not None and pid != os.getpid()
    assert isolated.progress() is None and isolated.speed > 0


def test_the_worker_imports_neither_mlx_nor_this_package(folder, capfd, monkeypatch):
    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")  # the worker's imports, on the stderr it shares
    d = load_diarizer(folder, isolated=True)
    try:
        d(short())
    finally:
        d.close()
    imported = [line.rsplit("|", 1)[-1].strip() for line in capfd.readouterr().err.splitlines()]
    imported = [name for name in imported if name and name != "imported package"]
    assert "speakrs" in imported and "numpy" in imported
    assert [name for name in imported if name.split(".")[0] in ("mlx", "mlx_qwen3asr")] == []


def test_cancel_stops_a_long_run_at_once_and_the_next_call_works(isolated):
    first = isolated(short())  # the worker started, its models loaded
    pid = isolated.worker_pid
    call = Call(isolated, test_signal(LONG_SECONDS, seed=2))
    until(lambda: isolated.progress() is not None, "the long call started")
    time.sleep(0.5)  # well inside the library's run
    asked = time.monotonic()
    isolated.cancel()
    outcome = call.join(5.0)
    assert isinstance(outcome, DiarizeCancelled), outcome
    assert call.ended - asked < 1.5
    assert gone(pid) and isolated.worker_pid is None and isolated.progress() is None
    assert list(isolated(short())) == list(first)  # a fresh worker, the same turns
    assert isolated.worker_pid not in (None, pid)


@pytest.mark.parametrize("stop", ["cancel", "close"])
def test_cancel_or_close_while_the_worker_starts_stops_the_call(isolated, stop):
    isolated.close()
    call = Call(isolated, test_signal(LONG_SECONDS, seed=2))
    until(lambda: isolated.progress() is not None, "the call started")
    getattr(isolated, stop)()
    assert isinstance(call.join(5.0), DiarizeCancelled)
    assert isolated.worker_pid is None and isolated.progress() is None


def test_a_worker_killed_from_outside_fails_its_call_in_one_line_and_the_next_call_works(isolated):
    first = isolated(short())
    pid = isolated.worker_pid
    call = Call(isolated, test_signal(LONG_SECONDS, seed=2))
    until(lambda: isolated.progress() is not None, "the long call started")
    os.kill(pid, signal.SIGKILL)
    outcome = call.join(5.0)
    assert isinstance(outcome, DiarizerError) and not isinstance(outcome, DiarizeCancelled)
    assert str(outcome) == (
        "the diarizer process stopped: killed by SIGKILL (out of memory, or killed from outside)"
    )
    assert list(isolated(short())) == list(first)
    assert isolated.worker_pid not in (None, pid)


def test_a_worker_that_cannot_load_the_models_fails_the_call_in_one_line(folder, tmp_path):
    copy = tmp_path / "diarizer"
    copy.mkdir()
    for p in folder.iterdir():
        (copy / p.name).write_bytes(p.read_bytes())
    d = load_diarizer(copy, isolated=True)
    try:
        (copy / "segmentation-3.0.safetensors").unlink()  # gone after loading here
        with pytest.raises(DiarizerError) as e:
            d(short())
        message = str(e.value)
        assert message.startswith(f"the diarizer process cannot load the models in {copy}: ")
        assert "\n" not in message and d.worker_pid is None
    finally:
        d.close()


def test_no_worker_outlives_its_diarizer(folder, isolated):
    isolated(short())
    pid = isolated.worker_pid
    isolated.close()
    assert gone(pid) and isolated.worker_pid is None
    isolated(short())  # a later call starts another
    pid = isolated.worker_pid
    worker_process._close_all()  # what the interpreter's exit runs
    assert gone(pid) and isolated.worker_pid is None
    d = load_diarizer(folder, isolated=True)
    d(short())
    pid = d.worker_pid
    del d
    gc.collect()
    until(lambda: gone(pid), "the worker of a diarizer collected ended", 3.0)


def test_a_worker_ends_when_its_parent_dies_even_mid_run(folder):
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, signal, sys, threading, time\n"
            "from mlx_qwen3asr.diarize import load_diarizer\n"
            "sys.path.insert(0, 'tests')\n"
            "from signals import test_signal\n"
            f"d = load_diarizer({str(folder)!r}, isolated=True)\n"
            "d(test_signal(3.0))\n"
            "threading.Thread(target=d, args=(test_signal(60.0),), daemon=True).start()\n"
            "while d.progress() is None: time.sleep(0.01)\n"
            "print(d.worker_pid, flush=True)\n"
            "time.sleep(0.3)\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    out, _ = parent.communicate(timeout=60)
    assert parent.returncode == -signal.SIGKILL
    pid = int(out.split()[0])
    until(lambda: gone(pid), "the worker of a dead parent ended", 3.0)
