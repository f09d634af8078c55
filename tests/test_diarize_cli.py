"""mlxasr --diarize: speakers told apart beside transcription (each file diarized on a worker thread while
the engine transcribes), their options checked before anything loads, the library missing in one line,
a diarization failure failing its file alone, Ctrl-C stopping both, and the progress counting both.

The diarizer is a stand-in handed to the command through its seam (mlx_qwen3asr.cli.diarizing.library):
no model is downloaded."""

from __future__ import annotations

import io
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import soundfile as sf
from reference import test_signal
from scripted import script_batches, through_cli

import mlx_qwen3asr.cli.diarizing as diarizing
import mlx_qwen3asr.cli.reporter as reporter_module
import mlx_qwen3asr.cli.run as cli_run
from mlx_qwen3asr.cli.main import main
from mlx_qwen3asr.cli.reporter import Reporter

SAID = "So the first thing I want to talk about today, is the budget for next year."


# --- the stand-in library -------------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    start: float
    end: float
    speaker: int


@dataclass(frozen=True)
class DiarizeOptions:
    num_speakers: int | None = None
    min_speakers: int | None = None
    max_speakers: int | None = None

    def __post_init__(self):
        if self.num_speakers is not None and self.num_speakers > 8:
            raise ValueError(f"num_speakers must be at most 8, got {self.num_speakers}")


class DiarizerUnavailable(Exception):
    pass


def assign_speakers(transcription, turns, names=None):
    """Each segment's speaker: the turn it overlaps most (enough to see the turns reach the outputs)."""
    for seg in transcription.segments:
        best = max(turns, key=lambda t: min(t.end, seg.end) - max(t.start, seg.start), default=None)
        seg.speaker = None if best is None else best.speaker
    transcription.speakers = sorted({t.speaker for t in turns})
    transcription.speaker_names = names
    return transcription


class StandIn:
    """The diarization library's API with a diarizer that says `turns(samples)`; calls records each
    call's (seconds of audio, start, end) and options the options it was given."""

    def __init__(self, turns=None, *, sleep: float = 0.0, fail_on: float | None = None):
        self.turns = turns or (lambda seconds: [Turn(0.0, seconds / 2, 0), Turn(seconds / 2, seconds, 1)])
        self.sleep, self.fail_on = sleep, fail_on
        self.calls: list[tuple[float, float, float]] = []
        self.options: list = []
        self.loaded: list = []
        self.lock = threading.Lock()
        self.Turn, self.DiarizeOptions, self.DiarizerUnavailable = Turn, DiarizeOptions, DiarizerUnavailable
        self.assign_speakers = assign_speakers

    def load_diarizer(self, path=None):
        self.loaded.append(path)
        return self.diarize

    def diarize(self, samples, options):
        t0 = time.monotonic()
        seconds = samples.shape[0] / 16000
        time.sleep(self.sleep)
        with self.lock:
            self.calls.append((seconds, t0, time.monotonic()))
            self.options.append(options)
        if self.fail_on is not None and abs(seconds - self.fail_on) < 0.01:
            raise RuntimeError("the stand-in diarizer fails on this file")
        return self.turns(seconds)


@pytest.fixture
def standin(monkeypatch):
    lib = StandIn()
    monkeypatch.setattr(diarizing, "library", lambda: lib)
    return lib


@pytest.fixture
def model(checkpoints) -> str:
    return str(checkpoints("tiny"))


def scripted(monkeypatch, model: str, step_seconds: float = 0.0, steps: list | None = None):
    """The speech model says SAID for every segment; each decoding step takes step_seconds (recorded in
    steps as (start, end))."""
    from mlx_qwen3asr.checkpoints.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(model)
    said = script_batches(lambda prompt: tok.encode(f"language English<asr_text>{SAID}"))

    class Slow(said.batch):
        def step(self):
            t0 = time.monotonic()
            time.sleep(step_seconds)
            if steps is not None:
                steps.append((t0, time.monotonic()))
            return super().step()

    through_cli(monkeypatch, batch=Slow)


def write(folder: Path, name: str, seconds: float, seed: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    sf.write(path, test_signal(seconds, seed=seed), 16000)
    return path


# --- the options ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--diarizer", "dia"], "argument --diarizer: has no effect without --diarize"),
        (["--num-speakers", "2"], "argument --num-speakers: has no effect without --diarize"),
        (["--speaker-names", "Ana"], "argument --speaker-names: has no effect without --diarize"),
        (["--speaker-format", "{speaker}: "], "argument --speaker-format: has no effect without --diarize"),
        (["--diarize", "--num-speakers", "2", "--min-speakers", "1"], "not allowed with --min-speakers"),
        (["--diarize", "--min-speakers", "3", "--max-speakers", "2"], "3 is more than --max-speakers 2"),
        (["--diarize", "--num-speakers", "0"], "must be between 1 and 100, got 0"),
        (["--diarize", "--num-speakers", "2", "--speaker-names", "A,B,C"], "3 names for at most 2 speaker"),
        (["--diarize", "--max-speakers", "1", "--speaker-names", "A,B"], "2 names for at most 1 speaker"),
        (["--diarize", "--speaker-names", "Ana,,Bo"], "an empty name in 'Ana,,Bo'"),
        (["--diarize", "--speaker-names", "Ana,Ana"], "'Ana' is named twice"),
        (["--diarize", "--speaker-names", "<b>"], "subtitles cannot show as a name"),
        (["--diarize", "--speaker-format", "[{name}] "], "does not hold {speaker}"),
        (["--diarize", "--speaker-format", "{speaker} {0}"], "is no template"),
        (
            ["--diarize", "--num-speakers", "9"],
            "num_speakers must be at most 8, got 9",
        ),  # the library's own check
    ],
)
def test_speaker_options_are_checked_before_anything_loads(
    tmp_path, model, standin, monkeypatch, capsys, extra, message
):
    talk = write(tmp_path, "talk.wav", 1.0)
    monkeypatch.setattr(cli_run, "load_model", lambda *a: pytest.fail("the model was loaded"))
    assert main([str(talk), "--model", model, *extra]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert standin.loaded == [] and sorted(os.listdir(tmp_path)) == ["talk.wav"]


def test_without_the_library_one_line_names_the_install_command_and_nothing_loads(
    tmp_path, model, monkeypatch, capsys
):
    talk = write(tmp_path, "talk.wav", 1.0)
    monkeypatch.setattr(cli_run, "load_model", lambda *a: pytest.fail("the model was loaded"))

    def missing():  # as on Python 3.10 or without the extra: the import fails
        raise diarizing.Unavailable(f"speaker diarization is not installed; {diarizing.INSTALL}")

    monkeypatch.setattr(diarizing, "library", missing)
    for args in (["--diarize"], ["--diarize", "-f", "srt,json"]):
        assert main([str(talk), "--model", model, *args]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and diarizing.INSTALL in err and err.startswith("error: ")
    assert sorted(os.listdir(tmp_path)) == ["talk.wav"]

    # The library is there but cannot run (its own dependency missing): the same, when it loads, first.
    lib = StandIn()

    def unavailable(path=None):
        raise DiarizerUnavailable(f"diarization needs a package that is not installed: {diarizing.INSTALL}")

    lib.load_diarizer = unavailable
    monkeypatch.setattr(diarizing, "library", lambda: lib)
    assert main([str(talk), "--model", model, "--diarize", "--txt"]) == 2
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if line.startswith("error")] == [
        f"error: diarization needs a package that is not installed: {diarizing.INSTALL}"
    ]
    assert sorted(os.listdir(tmp_path)) == ["talk.wav"]


def test_the_diarizer_folder_comes_from_the_option_or_the_environment(
    tmp_path, model, standin, monkeypatch, capsys
):
    scripted(monkeypatch, model)
    talk = write(tmp_path, "talk.wav", 3.0)
    monkeypatch.setenv(diarizing.DIARIZER_ENV, str(tmp_path / "from-env"))
    assert main(["--no-vad", str(talk), "--model", model, "--diarize", "--no-word-timestamps"]) == 0
    assert (
        main(["--no-vad", str(talk), "--model", model, "--diarize", "--overwrite", "--diarizer", "dia"]) == 0
    )
    monkeypatch.delenv(diarizing.DIARIZER_ENV)
    assert main(["--no-vad", str(talk), "--model", model, "--diarize", "--overwrite"]) == 0
    assert standin.loaded == [str(tmp_path / "from-env"), "dia", None]
    out = capsys.readouterr().out
    assert "speakers told apart by dia" in out

    # A folder the library cannot load: one line naming it, status 2, before the speech model loads.
    def broken(path=None):
        raise FileNotFoundError(f"{path}: no segmentation model in it")

    standin.load_diarizer = broken
    monkeypatch.setattr(cli_run, "load_model", lambda *a: pytest.fail("the model was loaded"))
    assert main([str(talk), "--model", model, "--diarize", "--overwrite", "--diarizer", "nowhere"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert errors == ["error: diarizer nowhere: no segmentation model in it"]


# --- beside transcription -------------------------------------------------------------------------


def test_diarization_runs_beside_transcription(tmp_path, model, monkeypatch, capsys):
    """Two files: transcription takes about 3 s (decoding steps that sleep) and diarization about 3 s
    (1.5 s a file); run together they take about the longer, not the sum."""
    lib = StandIn(sleep=1.5)
    monkeypatch.setattr(diarizing, "library", lambda: lib)
    steps: list[tuple[float, float]] = []
    scripted(monkeypatch, model, step_seconds=1.5, steps=steps)
    folder = tmp_path / "rec"
    write(folder, "a.wav", 4.0, seed=1)
    write(folder, "b.wav", 5.0, seed=2)
    # One row at a time: a decoding step per file.
    args = ["--no-vad", str(folder), "--model", model, "--diarize", "--json", "--batch-size", "1"]
    assert main([*args, "--no-word-timestamps"]) == 0
    capsys.readouterr()
    assert len(steps) == 2 and len(lib.calls) == 2
    asr = sum(b - a for a, b in steps)
    dia = sum(b - a for _, a, b in lib.calls)
    start = min(a for a, _ in steps + [(a, b) for _, a, b in lib.calls])
    end = max(b for _, b in steps + [(a, b) for _, a, b in lib.calls])
    # Overlapped: the span of all that work is far shorter than its sum (about max(asr, dia) = 3 s).
    assert end - start < asr + dia - 0.5 * min(asr, dia), (end - start, asr, dia)
    overlap = sum(max(0.0, min(b1, b2) - max(a1, a2)) for a1, b1 in steps for _, a2, b2 in lib.calls)
    assert overlap > 1.0
    assert {round(seconds, 2) for seconds, _, _ in lib.calls} == {4.0, 5.0}


def test_a_failed_diarization_fails_its_file_alone_and_a_rerun_redoes_it(
    tmp_path, model, monkeypatch, capsys
):
    lib = StandIn(fail_on=5.0)
    monkeypatch.setattr(diarizing, "library", lambda: lib)
    scripted(monkeypatch, model)
    folder = tmp_path / "rec"
    write(folder, "a.wav", 4.0, seed=1)
    write(folder, "b.wav", 5.0, seed=2)
    write(folder, "c.wav", 6.0, seed=3)
    args = ["--no-vad", str(folder), "--model", model, "--diarize", "--json", "--txt"]
    assert main(args) == 1
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if line.startswith("error")]
    assert errors == [
        f"error: {folder / 'b.wav'}: speaker diarization failed: the stand-in diarizer fails on this file"
    ]
    assert sorted(os.listdir(folder)) == ["a.json", "a.txt", "a.wav", "b.wav", "c.json", "c.txt", "c.wav"]
    assert "failed " + str(folder / "b.wav") in captured.out and "1 failed" in captured.out

    # The rerun transcribes and diarizes the failed file alone.
    lib.fail_on = None
    lib.calls.clear()
    assert main(args) == 0
    assert [round(c[0], 2) for c in lib.calls] == [5.0]
    assert {"b.json", "b.txt"} <= set(os.listdir(folder))


def test_a_file_that_cannot_be_read_fails_once_and_is_not_diarized_after(
    tmp_path, model, standin, monkeypatch, capsys
):
    scripted(monkeypatch, model)
    folder = tmp_path / "rec"
    write(folder, "a.wav", 4.0, seed=1)
    (folder / "bad.wav").write_bytes(b"RIFF" + b"\0" * 60)
    assert main(["--no-vad", str(folder), "--model", model, "--diarize", "--txt"]) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and "bad.wav" in errors[0] and "diarization" not in errors[0]
    assert (folder / "a.txt").exists()


def test_ctrl_c_stops_transcription_and_diarization(tmp_path, model, monkeypatch, capsys):
    """Ctrl-C while a file is being diarized: the run stops at once (the diarizer is not waited for),
    status 130, no output of an unfinished file and no temporary file."""
    release = threading.Event()
    started = threading.Event()
    lib = StandIn()

    def stuck(samples, options):  # a diarizer that takes (nearly) forever
        started.set()
        release.wait(60)
        return []

    lib.load_diarizer = lambda path=None: stuck
    monkeypatch.setattr(diarizing, "library", lambda: lib)
    scripted(monkeypatch, model)
    folder = tmp_path / "rec"
    write(folder, "a.wav", 4.0, seed=1)
    write(folder, "b.wav", 5.0, seed=2)

    def interrupt():
        if started.wait(60):
            time.sleep(0.3)
            os.kill(os.getpid(), signal.SIGINT)

    sender = threading.Thread(target=interrupt, daemon=True)
    sender.start()
    try:
        t0 = time.monotonic()
        status = main(["--no-vad", str(folder), "--model", model, "--diarize", "--txt", "--json"])
        took = time.monotonic() - t0
    finally:
        release.set()
        sender.join(10)
    assert status == 130
    assert took < 30
    captured = capsys.readouterr()
    assert "interrupted" in captured.err
    assert sorted(os.listdir(folder)) == ["a.wav", "b.wav"]


# --- progress ----------------------------------------------------------------------------------------


def test_the_progress_counts_transcription_and_diarization(monkeypatch):
    """With both passes, a file's audio is half done when it is transcribed and done when it is also
    diarized; the speed is of audio whose passes are all done."""
    monkeypatch.setattr(reporter_module, "PROGRESS_EVERY", 0.0)
    out = io.StringIO()
    report = Reporter(out, io.StringIO())
    report.start([10.0, 30.0], stages=2)
    report.progress(0, 10.0)  # transcribed
    report.progress(1, 30.0)
    report.progress(0, 10.0)  # diarized
    report.progress(1, 30.0)
    shares = [line.split("%")[0].split()[-1] for line in out.getvalue().splitlines()]
    assert shares == ["12", "50", "62", "100"]

    out = io.StringIO()
    report = Reporter(out, io.StringIO())
    report.start([10.0, 30.0])
    report.progress(0, 10.0)
    assert out.getvalue().startswith("progress: 25%")


def test_a_transcribed_file_waits_for_its_speakers(tmp_path, model, monkeypatch, capsys):
    """A file is done (its line, its outputs) only once it is diarized as well: a diarizer held back
    keeps the transcribed file from being written."""
    gate = threading.Event()
    lib = StandIn()
    seen: list[bool] = []
    folder = tmp_path / "rec"

    def held(samples, options):
        gate.wait(30)
        return [Turn(0.0, samples.shape[0] / 16000, 0)]

    lib.load_diarizer = lambda path=None: held
    monkeypatch.setattr(diarizing, "library", lambda: lib)
    scripted(monkeypatch, model)
    write(folder, "a.wav", 4.0, seed=1)
    original = cli_run._finish_one

    def finish(job, res, *rest):
        seen.append(gate.is_set())
        return original(job, res, *rest)

    monkeypatch.setattr(cli_run, "_finish_one", finish)
    timer = threading.Timer(1.5, gate.set)
    timer.start()
    try:
        assert main(["--no-vad", str(folder), "--model", model, "--diarize", "--txt"]) == 0
    finally:
        timer.cancel()
        gate.set()
    assert seen == [True]
    assert (folder / "a.txt").exists()


# --- mlxasr align --diarize ---------------------------------------------------------------------------


def test_align_diarizes_and_fails_without_writing_when_diarization_does(tmp_path, monkeypatch, capsys):
    lib = StandIn()
    monkeypatch.setattr(diarizing, "library", lambda: lib)
    audio = write(tmp_path, "talk.wav", 6.0)
    (tmp_path / "talk.txt").write_text(SAID, encoding="utf-8")
    args = ["align", str(audio), "--text", str(tmp_path / "talk.txt"), "--json", "--diarize"]
    assert main([*args, "--num-speakers", "2", "--diarizer", "dia"]) == 0
    assert [round(c[0], 2) for c in lib.calls] == [6.0] and lib.loaded == ["dia"]
    assert lib.options[0].num_speakers == 2
    assert (tmp_path / "talk.json").exists()

    lib.fail_on = 6.0
    assert main([*args, "--overwrite", "--vtt"]) == 1
    err = capsys.readouterr().err
    assert "speaker diarization failed: the stand-in diarizer fails on this file" in err
    assert not (tmp_path / "talk.vtt").exists()


def test_align_diarize_without_the_library_loads_nothing(tmp_path, monkeypatch, capsys):
    import mlx_qwen3asr.cli.align as cli_align

    monkeypatch.setattr(cli_align, "load", lambda *a, **k: pytest.fail("the aligner was loaded"))

    def missing():
        raise diarizing.Unavailable(f"speaker diarization is not installed; {diarizing.INSTALL}")

    monkeypatch.setattr(diarizing, "library", missing)
    audio = write(tmp_path, "talk.wav", 2.0)
    (tmp_path / "talk.txt").write_text(SAID, encoding="utf-8")
    assert main(["align", str(audio), "--text", str(tmp_path / "talk.txt"), "--diarize"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and diarizing.INSTALL in err
    assert main(["align", str(audio), "--text", str(tmp_path / "talk.txt"), "--num-speakers", "2"]) == 2
    assert "has no effect without --diarize" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["talk.txt", "talk.wav"]
