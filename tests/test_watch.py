"""`mlxasr PATH... --watch`: the polling that finds new and changed files once they hold still (without a
model), and the command end to end on the tiny random-weight checkpoint: files copied in slowly,
changed, removed and broken while it watches, mirrored outputs, Ctrl-C and SIGTERM."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from scripted import short_budgets, through_cli

import mlx_qwen3asr.cli.run as cli_run
from mlx_qwen3asr.cli.reporter import Reporter, Summary
from mlx_qwen3asr.cli.watch import Tracker, Watch
from mlx_qwen3asr.outputs.folder import FileJob, find_inputs, redo_pending
from mlx_qwen3asr.pipeline.transcribe import transcribe_stream

RATE = 16000
INTERVAL = 0.5  # seconds between polls in the end-to-end runs


def audio_bytes(seconds: float, seed: int) -> bytes:
    """A 16-bit WAV of speech-like noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    sig = 0.3 * np.sin(2 * np.pi * (150 + 50 * rng.random()) * t) * (0.5 + 0.5 * np.sin(2 * np.pi * 4 * t))
    sig += 0.05 * rng.standard_normal(t.size)
    buf = io.BytesIO()
    sf.write(buf, sig.astype(np.float32), RATE, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def write_audio(path: Path, seconds: float, seed: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(audio_bytes(seconds, seed))
    return path


def hidden_files(folder: Path) -> list[Path]:
    """Temporary files and redo markers: every hidden file below folder."""
    return [p for p in folder.rglob(".*") if p.is_file()]


# --- the polling, without a model --------------------------------------------------------------------


def test_a_file_is_due_once_it_holds_its_state_over_two_polls(tmp_path):
    tracker = Tracker()
    growing = tmp_path / "a.wav"
    growing.write_bytes(b"RIFF")
    for _ in range(4):  # still being written: never due
        assert tracker.due(find_inputs([tmp_path])[0]) == []
        with open(growing, "ab") as f:
            f.write(b"x" * 100)
    assert tracker.due(find_inputs([tmp_path])[0]) == []  # first seen in its last state
    [(inp, stamp)] = tracker.due(find_inputs([tmp_path])[0])
    assert inp.path == growing and stamp[0] == 404
    tracker.handled[inp.path] = stamp
    assert tracker.due(find_inputs([tmp_path])[0]) == []  # handled in this state: never again
    assert tracker.due(find_inputs([tmp_path])[0]) == []


def test_a_file_that_vanishes_is_forgotten_and_one_put_back_unchanged_is_not_due(tmp_path):
    tracker = Tracker()
    a = write_audio(tmp_path / "a.wav", 0.2, 1)
    tracker.know(find_inputs([tmp_path])[0])
    b = write_audio(tmp_path / "b.wav", 0.2, 2)
    assert tracker.due(find_inputs([tmp_path])[0]) == []
    b.unlink()  # seen once, gone before it held still
    assert tracker.due(find_inputs([tmp_path])[0]) == []
    assert tracker.due(find_inputs([tmp_path])[0]) == []
    kept = a.read_bytes(), a.stat()
    a.rename(tmp_path / "away")
    assert tracker.due(find_inputs([tmp_path])[0]) == []
    (tmp_path / "away").rename(a)
    assert (a.read_bytes(), a.stat().st_mtime_ns) == (kept[0], kept[1].st_mtime_ns)
    assert tracker.due(find_inputs([tmp_path])[0]) == []
    assert tracker.due(find_inputs([tmp_path])[0]) == []


class Transcriber:
    """A stand-in for the session: records the files handed over and writes their outputs, or not (to
    fail them), as told."""

    def __init__(self) -> None:
        self.handed: list[list[FileJob]] = []
        self.marked: list[bool] = []  # whether each file handed over was marked to replace its outputs
        self.fail: set[str] = set()

    def __call__(self, todo: list[FileJob]) -> int:
        self.handed.append(todo)
        for job in todo:
            self.marked.append(redo_pending(job))
            if job.path.name not in self.fail:
                for out in job.outputs.values():
                    out.write_text("done\n", encoding="utf-8")
        return 0

    def names(self) -> list[str]:
        return [job.path.name for todo in self.handed for job in todo]


def watching(paths: list[Path], output_dir: Path | None = None) -> tuple[Watch, io.StringIO, Summary]:
    err = io.StringIO()
    summary = Summary()
    watch = Watch(
        paths, ["json"], output_dir, overwrite=False, report=Reporter(io.StringIO(), err), summary=summary
    )
    watch.start(*find_inputs(paths))
    return watch, err, summary


def polls(watch: Watch, transcriber: Transcriber, n: int = 2) -> None:
    for _ in range(n):
        assert watch.poll(transcriber) == 0


def test_new_changed_failed_and_done_files_are_handled_by_the_resume_rules(tmp_path):
    inbox = tmp_path / "inbox"
    old = write_audio(inbox / "old.wav", 0.2, 1)
    (inbox / "old.json").write_text("{}\n", encoding="utf-8")
    watch, err, summary = watching([inbox])
    run = Transcriber()
    polls(watch, run, 3)
    assert run.names() == []  # what the first pass found is not looked at again

    new = write_audio(inbox / "sub" / "new.wav", 0.2, 2)
    polls(watch, run)
    assert run.names() == ["new.wav"] and (inbox / "sub" / "new.json").exists()
    polls(watch, run, 3)
    assert run.names() == ["new.wav"]  # never twice

    # A new file whose outputs are all there and newer than it is done already: skipped.
    ready = write_audio(inbox / "ready.wav", 0.2, 3)
    os.utime(ready, ns=(1_000_000_000, 1_000_000_000))
    (inbox / "ready.json").write_text("{}\n", encoding="utf-8")
    polls(watch, run)
    assert run.names() == ["new.wav"] and summary.skipped == 1

    # Changed after they were handled: transcribed again, their outputs replaced (marked for it).
    write_audio(new, 0.3, 4)
    write_audio(old, 0.3, 5)
    polls(watch, run)
    assert sorted(run.names()[1:]) == ["new.wav", "old.wav"] and run.marked[1:] == [True, True]

    run.fail.add("bad.wav")
    write_audio(inbox / "bad.wav", 0.2, 6)
    polls(watch, run, 4)
    assert run.names().count("bad.wav") == 1  # a failed file waits until it changes
    write_audio(inbox / "bad.wav", 0.3, 7)
    polls(watch, run)
    assert run.names().count("bad.wav") == 2
    assert err.getvalue() == "" and summary.failed == []


def test_a_file_whose_outputs_another_argument_has_fails_once_and_the_watch_goes_on(tmp_path):
    first, second = tmp_path / "x" / "rec", tmp_path / "y" / "rec"  # both mirrored as out/rec
    write_audio(first / "a.wav", 0.2, 1)
    second.mkdir(parents=True)
    watch, err, summary = watching([first, second], tmp_path / "out")
    run = Transcriber()
    write_audio(second / "a.wav", 0.2, 2)
    polls(watch, run, 4)
    assert run.names() == []
    assert len(err.getvalue().splitlines()) == 1 and "would both be written to" in err.getvalue()
    write_audio(second / "b.wav", 0.2, 3)
    polls(watch, run)
    assert run.names() == ["b.wav"] and (tmp_path / "out" / "rec" / "b.json").exists()
    assert len(summary.failed) == 1


def test_a_watch_stops_when_told_and_its_wait_is_cut_short(tmp_path):
    watch, err, _ = watching([tmp_path])
    watch.interval = 60.0
    threading.Timer(0.2, watch.stop.set).start()
    began = time.monotonic()
    assert watch.run(Transcriber()) == 0
    assert time.monotonic() - began < 10
    assert err.getvalue() == f"watching {tmp_path} for new audio (Ctrl-C to stop)\n"


# --- the command --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ckpt(checkpoints) -> str:
    return str(checkpoints("tiny"))


class Command:
    """`mlxasr ... --watch` in a child process, its standard output and error in files read as it goes."""

    def __init__(self, tmp_path: Path, args: list[str]) -> None:
        self.out_path, self.err_path = tmp_path / "stdout.log", tmp_path / "stderr.log"
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mlx_qwen3asr.cli.main", *args],
                stdout=out,
                stderr=err,
                env=dict(os.environ, PYTHONUNBUFFERED="1"),
            )

    @property
    def out(self) -> str:
        return self.out_path.read_text(encoding="utf-8")

    @property
    def err(self) -> str:
        return self.err_path.read_text(encoding="utf-8")

    def wait_for(self, done: Callable[[], bool], what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            assert self.proc.poll() is None, (
                f"mlxasr ended ({self.proc.returncode}) before {what}: {self.err}"
            )
            assert time.monotonic() < deadline, f"no {what} after {timeout} s: {self.out}\n{self.err}"
            time.sleep(0.05)

    def done_count(self, path: Path) -> int:
        return sum(f" done {path}: " in line for line in self.out.splitlines())

    def stop(self, sig: int) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=60)


@pytest.fixture
def command(tmp_path):
    """Start `mlxasr ... --watch` (Command); one still running when the test ends is killed."""
    started: list[Command] = []

    def start(args: list[str]) -> Command:
        started.append(Command(tmp_path, args))
        return started[-1]

    yield start
    for run in started:
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait(timeout=60)


def duration(json_path: Path) -> float:
    doc = json.loads(json_path.read_text(encoding="utf-8"))
    assert not doc["audio_truncated"]
    return doc["duration"]


def copy_slowly(data: bytes, dst: Path, seconds: float) -> None:
    """Write data to dst in pieces over about `seconds`, as a slow copy does."""
    pieces = 40
    step = -(-len(data) // pieces)
    with open(dst, "wb") as f:
        for i in range(0, len(data), step):
            f.write(data[i : i + step])
            f.flush()
            time.sleep(seconds / pieces)


def test_watch_transcribes_new_and_changed_files_once_each_and_stops_on_ctrl_c(tmp_path, ckpt, command):
    inbox = tmp_path / "inbox"
    a = write_audio(inbox / "a.wav", 1.5, 1)
    run = command(
        [str(inbox), "--json", "--no-vad", "--model", ckpt, "--watch", "--watch-interval", str(INTERVAL)],
    )
    watching_line = f"watching {inbox} for new audio (Ctrl-C to stop)"
    run.wait_for(lambda: watching_line in run.err, "the first pass")
    assert run.done_count(a) == 1 and duration(inbox / "a.json") == 1.5

    # Copied in over 2 s: transcribed once, whole.
    b = inbox / "b.wav"
    copy_slowly(audio_bytes(2.0, 2), b, 2.0)
    run.wait_for(lambda: run.done_count(b) == 1, "b.wav transcribed")
    assert duration(inbox / "b.json") == 2.0
    b_written = (inbox / "b.json").stat().st_mtime_ns

    # Not audio: one error line; a file gone before it held still: not a word.
    bad = inbox / "bad.wav"
    bad.write_text("not audio\n", encoding="utf-8")
    gone = write_audio(inbox / "gone.wav", 1.0, 3)
    time.sleep(INTERVAL / 4)  # seen at most once
    gone.unlink()
    run.wait_for(lambda: f"{bad}: " in run.err, "the error of bad.wav")

    # Changed: transcribed again, its outputs replaced.
    write_audio(a, 1.0, 4)
    run.wait_for(lambda: run.done_count(a) == 2, "the changed a.wav transcribed")
    assert duration(inbox / "a.json") == 1.0
    c = write_audio(inbox / "c.wav", 1.0, 5)  # the watch goes on after the bad file
    run.wait_for(lambda: run.done_count(c) == 1, "c.wav transcribed")
    time.sleep(3 * INTERVAL)  # more polls: nothing is done again

    status = run.stop(signal.SIGINT)
    out, err = run.out, run.err
    assert status == 130, err
    assert "Traceback" not in err
    assert err.count(watching_line) == 1
    assert [run.done_count(p) for p in (a, b, c)] == [2, 1, 1], out
    assert (inbox / "b.json").stat().st_mtime_ns == b_written
    errors = [line for line in err.splitlines() if line.startswith("mlxasr: error:")]
    assert errors == [f"mlxasr: error: {bad}: not an audio file (Format not recognised)"], err
    assert "gone.wav" not in out + err and not (inbox / "gone.json").exists()
    assert "interrupted: 4 transcribed, 0 skipped, 1 failed, 0 not finished" in out
    assert hidden_files(inbox) == []


def test_watch_with_mirrored_outputs_loads_the_model_for_the_first_new_file_and_stops_on_sigterm(
    tmp_path, ckpt, command
):
    inbox, out_dir = tmp_path / "inbox", tmp_path / "out"
    inbox.mkdir()
    run = command(
        [str(inbox), "--srt", "--json", "--no-vad", "--model", ckpt, "-o", str(out_dir), "--watch"]
        + ["--watch-interval", str(INTERVAL)],
    )
    run.wait_for(lambda: "watching" in run.err, "the first pass")
    assert "loading model" not in run.out  # nothing to transcribe yet
    talk = write_audio(inbox / "day 1" / "talk.wav", 1.5, 1)
    run.wait_for(lambda: run.done_count(talk) == 1, "talk.wav transcribed")
    assert duration(out_dir / "inbox" / "day 1" / "talk.json") == 1.5
    assert (out_dir / "inbox" / "day 1" / "talk.srt").is_file()
    assert not (inbox / "day 1" / "talk.json").exists()
    assert run.stop(signal.SIGTERM) == 143, run.err
    assert run.out.count("loading model") == 1
    assert hidden_files(out_dir) == [] and hidden_files(inbox) == []


def test_a_file_removed_before_it_is_read_is_dropped_without_an_error(tmp_path, ckpt, capsys, monkeypatch):
    from mlx_qwen3asr.cli.main import main

    real = through_cli(monkeypatch, short_budgets())
    keep, gone = write_audio(tmp_path / "keep.wav", 1.0, 1), write_audio(tmp_path / "gone.wav", 1.0, 2)

    def stream(model, inputs, **kwargs):
        gone.unlink()  # after the run found it, before it is read
        return transcribe_stream(model, inputs, parts=real, **kwargs)

    monkeypatch.setattr(cli_run, "transcribe_stream", stream)
    monkeypatch.setattr(Watch, "poll", lambda self, transcribe: signal.raise_signal(signal.SIGINT))
    argv = [str(tmp_path), "--json", "--no-vad", "--model", ckpt, "--watch", "--watch-interval", "0.1"]
    assert main(argv) == 130
    out, err = capsys.readouterr()
    assert "gone.wav" not in out + err, out + err
    assert f"[1/1] done {keep}: " in out and keep.with_suffix(".json").is_file()
    assert "interrupted: 1 transcribed, 0 skipped, 0 failed, 0 not finished" in out


# --- usage --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["-", "--watch"], "argument --watch: standard input (-) cannot be watched"),
        (["--watch", "--dry-run"], "argument --dry-run: not allowed with argument --watch"),
        (["--watch-interval", "2"], "argument --watch-interval: has no effect without --watch"),
        (["--watch", "--watch-interval", "0"], "argument --watch-interval: must be between 0.1 and 3600"),
    ],
)
def test_usage_errors(tmp_path, capsys, extra, message):
    from mlx_qwen3asr.cli.main import main

    write_audio(tmp_path / "a.wav", 0.5, 1)
    assert main([str(tmp_path), *extra, "-o", str(tmp_path / "out")]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("mlxasr: error:")]
    assert len(errors) == 1 and message in errors[0], errors
    assert not (tmp_path / "out").exists()
