"""mlxasr --diarize: speakers told apart beside transcription (each file diarized on a worker thread while
the engine transcribes), their options checked before anything loads, the library missing in one line,
a diarization failure failing its file alone, Ctrl-C stopping both, and the progress counting both.

The diarizer is a stand-in handed to the command through its seam (mlx_qwen3asr.cli.diarizing.library):
no model is downloaded."""

from __future__ import annotations

import functools
import io
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf
import srt
import webvtt
from reference import test_signal
from scripted import script_batches, through_cli

import mlx_qwen3asr.cli.diarizing as diarizing
import mlx_qwen3asr.cli.loading as cli_loading
import mlx_qwen3asr.cli.reporter as reporter_module
import mlx_qwen3asr.cli.run as cli_run
import mlx_qwen3asr.diarize as library
from mlx_qwen3asr.cli.main import main
from mlx_qwen3asr.cli.reporter import Reporter
from mlx_qwen3asr.diarize import DiarizerUnavailable, Turn

SAID = "So the first thing I want to talk about today, is the budget for next year."


# --- the library, with a stand-in diarizer --------------------------------------------------------


class StandIn:
    """The diarization library (mlx_qwen3asr.diarize) whose load_diarizer gives a stand-in diarizer that
    says `turns(seconds of audio)` (default: speaker 0 for the first half, 1 for the rest) after `sleep`
    seconds; calls records each call's (seconds of audio, start, end), options the options it was given
    and loaded the folders it was loaded from."""

    def __init__(self, turns=None, *, sleep: float = 0.0, fail_on: float | None = None):
        self.turns = turns or (lambda seconds: [Turn(0.0, seconds / 2, 0), Turn(seconds / 2, seconds, 1)])
        self.sleep, self.fail_on = sleep, fail_on
        self.calls: list[tuple[float, float, float]] = []
        self.options: list = []
        self.loaded: list = []
        self.lock = threading.Lock()

    def __getattr__(self, name):  # everything else is the library's own
        return getattr(library, name)

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


@pytest.fixture
def paced(monkeypatch):
    """The aligner times words at a speaking pace: each word 0.32 s after the previous, 0.25 s long,
    with a 0.9 s pause after every seventh word (random weights put them anywhere)."""
    from mlx_qwen3asr.pipeline.alignment import align_segments

    def classes(aligner, prompts, features, keep_logits=False):
        out = []
        for prompt in prompts:
            ms, stamps = 0.0, []
            for i in range(len(prompt.timestamps) // 2):
                stamps += [int(ms / 80), int((ms + 250) / 80)]
                ms += 320 + (900 if i % 7 == 6 else 0)
            out.append(np.array(stamps))
        return out

    through_cli(monkeypatch, align=functools.partial(align_segments, classes=classes))


def read_rttm(path: Path) -> list[tuple[str, float, float, str]]:
    """An RTTM file's SPEAKER lines as (file id, start, end, speaker), checking every field."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        fields = line.split()
        assert len(fields) == 10, line
        kind, file_id, channel, start, duration, ortho, stype, speaker, conf, lookahead = fields
        assert (kind, channel, ortho, stype, conf, lookahead) == (
            "SPEAKER",
            "1",
            "<NA>",
            "<NA>",
            "<NA>",
            "<NA>",
        )
        assert float(duration) >= 0
        rows.append((file_id, float(start), float(start) + float(duration), speaker))
    return rows


# --- every output names the speakers ------------------------------------------------------------------


def test_every_output_names_the_speakers(tmp_path, model, monkeypatch, paced, capsys):
    """Two speakers, the second from 2.5 s: the words before it are Ana's (the first, named), after it
    Speaker 2's; the segment is cut there, and each format says who speaks, parsed by its own reader."""
    lib = StandIn(lambda seconds: [Turn(0.0, 2.5, 0), Turn(2.5, seconds, 1)])
    monkeypatch.setattr(diarizing, "library", lambda: lib)
    scripted(monkeypatch, model)
    talk = write(tmp_path, "talk.wav", 8.0)
    assert (
        main(["--no-vad", str(talk), "--model", model, "--diarize", "-f", "all", "--speaker-names", "Ana"])
        == 0
    )
    capsys.readouterr()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["talk.json", "talk.rttm", "talk.srt", "talk.txt", "talk.vtt", "talk.wav"]

    doc = json.loads((tmp_path / "talk.json").read_text(encoding="utf-8"))
    assert doc["speakers"] == ["Ana", "Speaker 2"]
    words = SAID.split()
    first, second = " ".join(words[:7]), " ".join(words[7:])  # the 8th word is 3.14 s in, after the pause
    assert [(s["speaker"], s["text"]) for s in doc["segments"]] == [("Ana", first), ("Speaker 2", second)]
    for seg in doc["segments"]:
        assert {w["speaker"] for w in seg["words"]} == {seg["speaker"]}
        assert all((w["start"] < 2.5) == (seg["speaker"] == "Ana") for w in seg["words"])
    assert doc["segments"][0]["end"] <= doc["segments"][1]["start"]

    subs = list(srt.parse((tmp_path / "talk.srt").read_text(encoding="utf-8")))
    prefixed = [
        (k, s.content.split(":")[0])
        for k, s in enumerate(subs)
        if s.content.startswith(("Ana:", "Speaker 2:"))
    ]
    change = next(k for k, s in enumerate(subs) if s.start.total_seconds() >= 2.5)
    assert prefixed == [(0, "Ana"), (change, "Speaker 2")]  # the name at each change, and only there
    spoken = " ".join(" ".join(s.content.split()) for s in subs)
    assert spoken == f"Ana: {first} Speaker 2: {second}"

    vtt = webvtt.read(str(tmp_path / "talk.vtt"))
    assert [c.voice for c in vtt] == ["Ana"] * change + ["Speaker 2"] * (len(vtt) - change)
    assert " ".join(" ".join(c.text.split()) for c in vtt) == SAID

    txt = (tmp_path / "talk.txt").read_text(encoding="utf-8")
    assert txt.split("\n\n") == [f"Ana: {first}", f"Speaker 2: {second}\n"]

    rttm = read_rttm(tmp_path / "talk.rttm")
    assert [(f, speaker) for f, _, _, speaker in rttm] == [("talk", "Ana"), ("talk", "Speaker_2")]
    for (_, start, end, _), seg in zip(rttm, doc["segments"]):
        assert start == pytest.approx(seg["start"], abs=1e-3) and end == pytest.approx(seg["end"], abs=1e-3)

    # The prefix is --speaker-format's, and recorded with the options.
    assert (
        main(
            [
                "--no-vad",
                str(talk),
                "--model",
                model,
                "--diarize",
                "--srt",
                "--txt",
                "--json",
                "--overwrite",
                "--speaker-format",
                "[{speaker}] ",
            ]
        )
        == 0
    )
    txt = (tmp_path / "talk.txt").read_text(encoding="utf-8")
    assert txt.split("\n\n") == [f"[Speaker 1] {first}", f"[Speaker 2] {second}\n"]
    assert (
        srt.parse((tmp_path / "talk.srt").read_text(encoding="utf-8"))
        .__next__()
        .content.startswith("[Speaker 1] ")
    )
    doc = json.loads((tmp_path / "talk.json").read_text(encoding="utf-8"))
    assert doc["options"]["speaker_format"] == "[{speaker}] "


def test_rttm_alone_diarizes_and_keeps_the_naming_and_no_clobber_rules(
    tmp_path, model, standin, monkeypatch, capsys
):
    scripted(monkeypatch, model)
    folder = tmp_path / "rec"
    write(folder, "a.wav", 4.0, seed=1)
    write(folder, "a.flac", 3.0, seed=2)  # named like a.wav: both keep their extension
    out = tmp_path / "out"
    assert (
        main(["--no-vad", str(folder), "--model", model, "--rttm", "-o", str(out)]) == 0
    )  # --rttm is --diarize
    assert sorted(p.name for p in (out / "rec").iterdir()) == ["a.flac.rttm", "a.wav.rttm"]
    rows = read_rttm(out / "rec" / "a.wav.rttm")
    assert rows and {r[0] for r in rows} == {"a"} and {r[3] for r in rows} <= {"Speaker_1", "Speaker_2"}
    before = (out / "rec" / "a.wav.rttm").read_bytes()
    (out / "rec" / "a.wav.rttm").write_text("kept by hand\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["--no-vad", str(folder), "--model", model, "-f", "rttm,txt", "-o", str(out)]) == 0
    assert (out / "rec" / "a.wav.rttm").read_text(encoding="utf-8") == "kept by hand\n"
    assert "kept existing " + str(out / "rec" / "a.wav.rttm") in capsys.readouterr().out
    assert main(["--no-vad", str(folder), "--model", model, "--rttm", "-o", str(out), "--overwrite"]) == 0
    assert (out / "rec" / "a.wav.rttm").read_bytes() == before
    assert not [p for p in (out / "rec").iterdir() if p.name.startswith(".")]


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
            ["--diarize", "--speaker-names", ",".join(f"P{i}" for i in range(101))],
            "argument --speaker-names: 101 names, more than the 100 speakers a file can have",
        ),
    ],
)
def test_speaker_options_are_checked_before_anything_loads(
    tmp_path, model, standin, monkeypatch, capsys, extra, message
):
    talk = write(tmp_path, "talk.wav", 1.0)
    monkeypatch.setattr(cli_loading, "load_model", lambda *a: pytest.fail("the model was loaded"))
    assert main([str(talk), "--model", model, *extra]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert standin.loaded == [] and sorted(os.listdir(tmp_path)) == ["talk.wav"]


def test_without_the_library_one_line_names_the_install_command_and_nothing_loads(
    tmp_path, model, monkeypatch, capsys
):
    talk = write(tmp_path, "talk.wav", 1.0)
    monkeypatch.setattr(cli_loading, "load_model", lambda *a: pytest.fail("the model was loaded"))

    def missing():  # as on Python 3.10 or without the extra: the import fails
        raise diarizing.Unavailable(f"speaker diarization is not installed; {diarizing.INSTALL}")

    monkeypatch.setattr(diarizing, "library", missing)
    for args in (["--diarize"], ["--diarize", "-f", "srt,json"]):
        assert main([str(talk), "--model", model, *args]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and diarizing.INSTALL in err and err.startswith("mlxasr: error: ")
    assert sorted(os.listdir(tmp_path)) == ["talk.wav"]

    # The library is there but cannot run (its own dependency missing): the same, when it loads, first.
    lib = StandIn()

    def unavailable(path=None):
        raise DiarizerUnavailable(f"diarization needs a package that is not installed: {diarizing.INSTALL}")

    lib.load_diarizer = unavailable
    monkeypatch.setattr(diarizing, "library", lambda: lib)
    assert main([str(talk), "--model", model, "--diarize", "--txt"]) == 2
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if line.startswith("mlxasr: error")] == [
        f"mlxasr: error: diarization needs a package that is not installed: {diarizing.INSTALL}"
    ]
    assert sorted(os.listdir(tmp_path)) == ["talk.wav"]


class _Version(tuple):
    """sys.version_info as the library reads it: compared as a tuple, with major and minor."""

    @property
    def major(self):
        return self[0]

    @property
    def minor(self):
        return self[1]


@pytest.mark.parametrize("python", ["3.11+", "3.10"])
def test_without_speakrs_the_real_library_says_so_in_one_line_before_any_model_loads(
    tmp_path, model, monkeypatch, capsys, python
):
    """The real library with its dependency missing (the import of speakrs fails), on this Python and
    as on Python 3.10, which speakrs does not support: one line naming the install command, status 2."""
    monkeypatch.setitem(sys.modules, "speakrs", None)  # `import speakrs` raises ImportError
    version = (3, 10, 14) if python == "3.10" else (3, 12, 0)  # whatever Python runs the tests
    monkeypatch.setattr(library.loading, "sys", SimpleNamespace(version_info=_Version(version)))
    monkeypatch.setattr(cli_loading, "load_model", lambda *a: pytest.fail("the model was loaded"))
    talk = write(tmp_path, "talk.wav", 1.0)
    assert main([str(talk), "--model", model, "--diarize", "--srt"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("mlxasr: error")]
    assert len(errors) == 1 and errors[0].endswith(diarizing.INSTALL)
    assert ("Python 3.11 or newer" in errors[0]) == (python == "3.10")
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
    monkeypatch.setattr(cli_loading, "load_model", lambda *a: pytest.fail("the model was loaded"))
    assert main([str(talk), "--model", model, "--diarize", "--overwrite", "--diarizer", "nowhere"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("mlxasr: error")]
    assert errors == ["mlxasr: error: diarizer nowhere: no segmentation model in it"]


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
    errors = [line for line in captured.err.splitlines() if line.startswith("mlxasr: error")]
    assert errors == [
        f"mlxasr: error: {folder / 'b.wav'}: speaker diarization failed: the stand-in diarizer fails on this file"
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
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("mlxasr: error")]
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
    args = ["align", str(audio), "--text", str(tmp_path / "talk.txt"), "--json", "--diarize", "--no-vad"]
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
    import mlx_qwen3asr.cli.models as cli_models

    monkeypatch.setattr(cli_models, "load", lambda *a, **k: pytest.fail("the aligner was loaded"))

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


# --- end to end, on the real library ------------------------------------------------------------------


def test_end_to_end_with_the_library_on_random_diarizer_weights(tmp_path, model, monkeypatch, paced, capsys):
    """mlxasr --diarize with speakrs itself on the random-weight model files of
    `tools/make_checkpoint.py --preset diarizer`: every segment and word gets one of the file's speakers,
    and the RTTM, JSON and subtitles agree."""
    pytest.importorskip("speakrs")
    from tools.make_checkpoint import write_diarizer

    models = write_diarizer(tmp_path / "diarizer")
    scripted(monkeypatch, model)
    talk = write(tmp_path, "talk.wav", 10.0, seed=5)
    monkeypatch.setenv(diarizing.DIARIZER_ENV, str(models))
    args = ["--no-vad", str(talk), "--model", model, "--diarize", "--json", "--vtt", "--rttm"]
    assert main([*args, "--max-speakers", "3"]) == 0
    out = capsys.readouterr().out
    assert f"speakers told apart by {models}" in out
    doc = json.loads((tmp_path / "talk.json").read_text(encoding="utf-8"))
    speakers = doc["speakers"]
    assert 1 <= len(speakers) and speakers == [f"Speaker {k + 1}" for k in range(len(speakers))]
    assert " ".join(s["text"] for s in doc["segments"]) == SAID
    assert all(s["speaker"] in speakers for s in doc["segments"])
    assert all(w["speaker"] == s["speaker"] for s in doc["segments"] for w in s["words"])
    order = list(dict.fromkeys(s["speaker"] for s in doc["segments"]))
    assert order == speakers  # numbered in order of first appearance
    rows = read_rttm(tmp_path / "talk.rttm")
    assert [r[3] for r in rows] == [s["speaker"].replace(" ", "_") for s in doc["segments"]]
    voices = [c.voice for c in webvtt.read(str(tmp_path / "talk.vtt"))]
    assert set(voices) <= set(speakers) and voices[0] == speakers[0]


def test_align_diarizes_only_the_speech_found(tmp_path, monkeypatch, capsys):
    """mlxasr align --diarize: speech detection (on by default) finds no speech in silence, so the
    diarizer is never called; --no-vad diarizes all of it; the detection options need --diarize."""
    lib = StandIn()
    monkeypatch.setattr(diarizing, "library", lambda: lib)
    audio = tmp_path / "quiet.wav"
    sf.write(audio, np.zeros(6 * 16000, np.float32), 16000)
    (tmp_path / "quiet.txt").write_text(SAID, encoding="utf-8")
    args = ["align", str(audio), "--text", str(tmp_path / "quiet.txt"), "--json"]
    assert main([*args, "--diarize"]) == 0
    assert lib.calls == []
    assert main([*args, "--diarize", "--no-vad", "--overwrite"]) == 0
    assert [round(c[0], 2) for c in lib.calls] == [6.0]
    capsys.readouterr()
    assert main([*args, "--no-vad", "--overwrite"]) == 2
    assert "argument --no-vad: has no effect without --diarize" in capsys.readouterr().err
    assert main([*args, "--diarize", "--no-vad", "--vad-threshold", "0.4", "--overwrite"]) == 2
    assert "argument --vad-threshold: has no effect with --no-vad" in capsys.readouterr().err
