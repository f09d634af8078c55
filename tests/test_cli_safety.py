"""mlxasr never loses a user's file, never hangs and never crashes: existing outputs are kept, output
folders are checked before the model loads, temporary files are recognisable and cleaned up, names
with control characters print on one line, non-regular files are refused unopened, a Ctrl-C storm
still ends with the summary, option values are range-checked, and transcription warnings are shown."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np
import pytest
import soundfile as sf
from locked import read_only_folder
from test_cli import ALL, check_outputs, drop_a_ctrl_c, errors_for, temporaries, write_audio

import mlx_qwen3asr.cli.models as cli_models
import mlx_qwen3asr.cli.reporter as cli_reporter
import mlx_qwen3asr.cli.run as cli_run
from mlx_qwen3asr.cli.main import main
from mlx_qwen3asr.outputs import render as writers
from mlx_qwen3asr.outputs.cues import CueOptions
from mlx_qwen3asr.outputs.folder import find_inputs
from mlx_qwen3asr.runtime import atomic
from mlx_qwen3asr.runtime.atomic import atomic_write_files

REPO_ROOT = Path(__file__).resolve().parents[1]
OUR_TEMP = re.compile(r"^\.(.+)\.mlxasr-(\d+)-[0-9a-z]+\.tmp$", re.S)


@pytest.fixture(scope="module")
def ckpt(checkpoints) -> str:
    return str(checkpoints("tiny"))


@pytest.fixture
def no_model(monkeypatch):
    """Fails the test if the model is loaded."""
    monkeypatch.setattr(cli_models, "load", lambda *a, **k: pytest.fail("the model was loaded"))


def lines_with(text: str, fragment: str) -> list[str]:
    return [line for line in text.splitlines() if fragment in line]


def state(path: Path) -> tuple[int, bytes]:
    return path.stat().st_mtime_ns, path.read_bytes()


def cli(*args: str, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    """mlxasr in a child process, as a user runs it (speech detection off: the tests' audio is tones)."""
    if args[:1] != ("serve",):
        args = ("--no-vad", *args)
    return subprocess.run(
        [sys.executable, "-m", "mlx_qwen3asr.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,
    )


# --- 1. existing outputs are never replaced without --overwrite ---------------------------------------


def test_a_hand_corrected_output_is_kept_and_only_missing_outputs_are_written(tmp_path, ckpt, capsys):
    talk = write_audio(tmp_path / "talk.wav", 2.0, 1)
    srt_path, json_path = tmp_path / "talk.srt", tmp_path / "talk.json"
    assert main(["--no-vad", str(talk), "--srt", "--model", ckpt]) == 0
    capsys.readouterr()
    srt_path.write_text("1\n00:00:00,000 --> 00:00:02,000\nCorrected by hand.\n\n", encoding="utf-8")
    os.utime(srt_path, (1_000_000_000, 1_000_000_000))  # older than the input, as an old edit would be
    corrected = state(srt_path)

    assert main(["--no-vad", str(talk), "--srt", "--json", "--model", ckpt]) == 0
    out = capsys.readouterr().out
    assert state(srt_path) == corrected  # byte for byte, mtime too
    assert json_path.is_file() and '"segments"' in json_path.read_text(encoding="utf-8")
    assert lines_with(out, "kept existing") == [f"kept existing {srt_path} (use --overwrite to replace it)"]
    assert "summary: 1 transcribed, 0 skipped, 0 failed, 1 existing output(s) kept" in out
    assert temporaries(tmp_path) == []

    # Every requested output exists now: the file is skipped, and said to be older than its input.
    json_state = state(json_path)
    assert main(["--no-vad", str(talk), "--srt", "--json", "--model", ckpt]) == 0
    out = capsys.readouterr().out
    assert "summary: 0 transcribed, 1 skipped, 0 failed" in out and "loading model" not in out
    stale = f"skipped {talk}: its outputs exist but are older than it; use --overwrite"
    assert lines_with(out, "older than it") == [stale]
    assert state(srt_path) == corrected and state(json_path) == json_state

    # --overwrite still replaces, atomically.
    assert main(["--no-vad", str(talk), "--srt", "--json", "--model", ckpt, "--overwrite"]) == 0
    capsys.readouterr()
    assert "Corrected by hand" not in srt_path.read_text(encoding="utf-8")
    assert state(json_path) != json_state


def test_an_older_output_the_user_already_had_is_not_replaced(tmp_path, ckpt, capsys):
    wav = write_audio(tmp_path / "interview.wav", 1.5, 2)
    mine = tmp_path / "interview.srt"
    mine.write_text("my own subtitles\n", encoding="utf-8")
    os.utime(mine, (1_000_000_000, 1_000_000_000))
    before = state(mine)

    assert main(["--no-vad", str(wav), "--srt", "--model", ckpt]) == 0
    out = capsys.readouterr().out
    assert state(mine) == before
    assert lines_with(out, "older than it") == [
        f"skipped {wav}: its outputs exist but are older than it; use --overwrite"
    ]
    assert "summary: 0 transcribed, 1 skipped, 0 failed" in out

    assert main(["--no-vad", str(wav), "--srt", "--txt", "--model", ckpt]) == 0
    out = capsys.readouterr().out
    assert state(mine) == before and (tmp_path / "interview.txt").read_text(encoding="utf-8").strip()
    assert lines_with(out, "kept existing") == [f"kept existing {mine} (use --overwrite to replace it)"]


def test_dry_run_shows_the_keep_and_skip_decisions(tmp_path, capsys, no_model):
    a = write_audio(tmp_path / "a.wav", 1.0, 1)
    b = write_audio(tmp_path / "b.wav", 1.0, 2)
    c = write_audio(tmp_path / "c.wav", 1.0, 3)
    (tmp_path / "a.srt").write_text("mine\n", encoding="utf-8")  # a: srt kept, vtt to write
    for ext in ("srt", "vtt"):  # b: everything exists and is older than b.wav
        (tmp_path / f"b.{ext}").write_text("old\n", encoding="utf-8")
        os.utime(tmp_path / f"b.{ext}", (1_000_000_000, 1_000_000_000))
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["--no-vad", str(tmp_path), "--srt", "--vtt", "--dry-run", "--model", "/no/such/model"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"transcribe: {a} -> {tmp_path / 'a.vtt'}; keeping existing {tmp_path / 'a.srt'} "
        "(use --overwrite to replace it)",
        f"skip (outputs exist but are older than it; use --overwrite): {b} -> "
        f"{tmp_path / 'b.srt'}, {tmp_path / 'b.vtt'}",
        f"transcribe: {c} -> {tmp_path / 'c.srt'}, {tmp_path / 'c.vtt'}",
        "dry run: 2 to transcribe, 1 skipped, 0 failed, 1 existing output(s) kept",
    ]
    assert (
        main(["--no-vad", str(a), "--srt", "--vtt", "--dry-run", "--overwrite", "--model", "/no/such/model"])
        == 0
    )
    assert capsys.readouterr().out.splitlines() == [
        f"transcribe: {a} -> {tmp_path / 'a.srt'}, {tmp_path / 'a.vtt'}; replacing existing {tmp_path / 'a.srt'}",
        "dry run: 1 to transcribe, 0 skipped, 0 failed",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_an_output_that_appears_during_transcription_is_not_replaced(tmp_path, ckpt, capsys, monkeypatch):
    talk = write_audio(tmp_path / "talk.wav", 1.5, 1)
    other = tmp_path / "talk.srt"
    real_stream = cli_run.transcribe_stream

    def stream_with_a_racing_writer(*args, **kwargs):
        for res in real_stream(*args, **kwargs):
            other.write_text("written by another run meanwhile\n", encoding="utf-8")
            yield res

    monkeypatch.setattr(cli_run, "transcribe_stream", stream_with_a_racing_writer)
    assert main(["--no-vad", str(talk), "--srt", "--txt", "--model", ckpt]) == 0
    out = capsys.readouterr().out
    assert other.read_text(encoding="utf-8") == "written by another run meanwhile\n"
    assert (tmp_path / "talk.txt").read_text(encoding="utf-8").strip()
    assert lines_with(out, "kept existing") == [f"kept existing {other} (use --overwrite to replace it)"]
    assert "1 existing output(s) kept" in out
    assert temporaries(tmp_path) == [], temporaries(tmp_path)


def test_no_replace_write_keeps_a_file_created_between_check_and_rename(tmp_path, monkeypatch):
    a, b = tmp_path / "a.srt", tmp_path / "b.srt"
    real_link = os.link

    def link_after_someone_else(src, dst, **kwargs):
        if Path(dst) == b:
            b.write_text("theirs\n", encoding="utf-8")
        return real_link(src, dst, **kwargs)

    monkeypatch.setattr(atomic.os, "link", link_after_someone_else)
    kept = atomic_write_files({a: "ours a\n", b: "ours b\n"}, replace=False)
    assert kept == [b]
    assert a.read_text(encoding="utf-8") == "ours a\n" and b.read_text(encoding="utf-8") == "theirs\n"
    assert os.stat(a).st_nlink == 1  # the temporary name is gone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.srt", "b.srt"]


def test_no_replace_write_without_hard_links_falls_back_to_check_and_rename(tmp_path, monkeypatch):
    a, b = tmp_path / "a.vtt", tmp_path / "b.vtt"
    b.write_text("theirs\n", encoding="utf-8")

    def no_links(src, dst, **kwargs):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(atomic.os, "link", no_links)
    assert atomic_write_files({a: "ours\n", b: "ours\n"}, replace=False) == [b]
    assert a.read_text(encoding="utf-8") == "ours\n" and b.read_text(encoding="utf-8") == "theirs\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.vtt", "b.vtt"]


def test_the_rule_is_stated_in_help(capsys):
    assert main(["--no-vad", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "An existing output file is never replaced unless --overwrite is given" in text


# --- 2. output folders are created and probed before the model is loaded --------------------------


def test_a_read_only_output_folder_stops_the_run_before_the_model_loads(
    tmp_path, capsys, no_model, monkeypatch
):
    a = write_audio(tmp_path / "in" / "a.wav", 1.0, 1)
    b = write_audio(tmp_path / "in" / "b.wav", 1.0, 2)
    locked = read_only_folder(tmp_path / "locked", monkeypatch)
    try:
        status = main(["--no-vad", str(a), str(b), "--srt", "-o", str(locked), "--model", "unused"])
    finally:
        locked.chmod(0o755)
    err = capsys.readouterr().err
    assert status == 2
    assert errors_for(err, a) == f"cannot write output in {locked} (permission denied)"
    assert errors_for(err, b) == f"cannot write output in {locked} (permission denied)"
    assert list(locked.iterdir()) == []


def test_output_dir_below_a_regular_file_stops_the_run_before_the_model_loads(tmp_path, capsys, no_model):
    a = write_audio(tmp_path / "a.wav", 1.0, 1)
    notes = tmp_path / "notes.txt"
    notes.write_text("a file\n", encoding="utf-8")
    assert main(["--no-vad", str(a), "--srt", "-o", str(notes / "out"), "--model", "unused"]) == 2
    err = capsys.readouterr().err
    assert errors_for(err, a) == f"cannot create output folder {notes / 'out'} (a file is in the way)"
    assert notes.read_text(encoding="utf-8") == "a file\n"


def test_a_mirrored_folder_that_cannot_be_made_fails_its_files_before_the_model_loads(
    tmp_path, ckpt, capsys, monkeypatch
):
    good = write_audio(tmp_path / "rec" / "good.wav", 1.0, 1)
    blocked = write_audio(tmp_path / "rec" / "sub" / "blocked.wav", 1.0, 2)
    out = tmp_path / "out"
    (out / "rec").mkdir(parents=True)
    (out / "rec" / "sub").write_text("a file where the mirrored folder would go\n", encoding="utf-8")
    errors_at_load = []
    real_load = cli_models.load

    def load(*args, **kwargs):
        errors_at_load.append(capsys.readouterr().err)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(cli_models, "load", load)
    assert main(["--no-vad", str(tmp_path / "rec"), "--srt", "-o", str(out), "--model", ckpt]) == 1
    cap = capsys.readouterr()
    before_load, _ = errors_at_load  # the model, then the aligner (subtitles time their words)
    assert errors_for(before_load, blocked) == (
        f"cannot create output folder {out / 'rec' / 'sub'} (a file is in the way)"
    )
    assert "error:" not in cap.err
    assert (out / "rec" / "good.srt").is_file() and not (out / "rec" / "sub").is_dir()
    assert f"failed: {blocked}: cannot create output folder" in cap.out
    assert good.exists()


def test_a_bad_model_leaves_no_output_folder_behind(tmp_path, capsys):
    a = write_audio(tmp_path / "a.wav", 1.0, 1)
    out = tmp_path / "out"
    assert (
        main(
            [
                "--no-vad",
                str(a),
                "--srt",
                "-o",
                str(out / "deep" / "er"),
                "--model",
                str(tmp_path / "no-model"),
            ]
        )
        == 2
    )
    assert capsys.readouterr().err.startswith(f"mlxasr: error: model {tmp_path / 'no-model'}: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.wav"]


def test_an_output_path_taken_by_a_folder_fails_its_file_and_is_never_kept(tmp_path, ckpt, capsys):
    """in/a.wav and in/a.txt/c.wav mirrored: out/in/a.txt is the folder of c.wav's outputs, so a.wav
    fails (before the model loads, and again on every rerun) instead of counting as done."""
    a = write_audio(tmp_path / "in" / "a.wav", 1.0, 1)
    c = write_audio(tmp_path / "in" / "a.txt" / "c.wav", 1.0, 2)
    out = tmp_path / "out"
    for run in range(2):
        assert main(["--no-vad", str(tmp_path / "in"), "-o", str(out), "--model", ckpt]) == 1
        cap = capsys.readouterr()
        reason = f"output {out / 'in' / 'a.txt'} is the folder that the outputs of {c} go to"
        assert errors_for(cap.err, a) == reason
        assert f"failed: {a}: {reason}" in cap.out and "kept existing" not in cap.out
        assert f"summary: {1 - run} transcribed, {run} skipped, 1 failed" in cap.out
        assert (out / "in" / "a.txt" / "c.txt").is_file()
    assert main(["--no-vad", str(tmp_path / "in"), "-o", str(out), "--dry-run"]) == 1
    assert f"fail: {a}: {reason}" in capsys.readouterr().out


def test_an_output_beside_its_input_taken_by_a_folder_or_a_fifo_fails_before_the_model_loads(
    tmp_path, capsys, no_model
):
    rec = tmp_path / "rec"
    a = write_audio(rec / "a.wav", 1.0, 1)
    b = write_audio(rec / "b.wav", 1.0, 2)
    c = write_audio(rec / "c.wav", 1.0, 3)
    (rec / "a.txt").mkdir()
    os.mkfifo(rec / "b.txt")
    (rec / "c.txt").symlink_to(rec / "nowhere.txt")
    assert main(["--no-vad", str(rec)]) == 1
    cap = capsys.readouterr()
    assert errors_for(cap.err, a) == f"output {rec / 'a.txt'} is a directory, not a file"
    assert errors_for(cap.err, b) == f"output {rec / 'b.txt'} is a FIFO, not a regular file"
    assert errors_for(cap.err, c) == f"output {rec / 'c.txt'} is a broken symbolic link"
    assert "summary: 0 transcribed, 0 skipped, 3 failed" in cap.out and "kept" not in cap.out
    assert (rec / "a.txt").is_dir() and list((rec / "a.txt").iterdir()) == []


def test_an_output_name_too_long_for_the_file_system_fails_before_the_model_loads(tmp_path, ckpt, capsys):
    long = write_audio(tmp_path / ("x" * 251 + ".wav"), 1.0, 1)  # a 255-byte name: .json takes 256
    short = write_audio(tmp_path / "short.wav", 1.0, 2)
    loaded = []
    real_load = cli_models.load

    def load(*args, **kwargs):
        loaded.append(capsys.readouterr().err)
        return real_load(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cli_models, "load", load)
        assert main(["--no-vad", str(long), str(short), "--txt", "--json", "--model", ckpt]) == 1
    cap = capsys.readouterr()
    (before_load,) = loaded
    reason = f"output name {'x' * 251}.json is too long (256 bytes; the file system takes 255)"
    assert errors_for(before_load, long) == reason
    assert "summary: 1 transcribed, 0 skipped, 1 failed" in cap.out
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".wav")) == [
        "short.json",
        "short.txt",
    ]


# --- 3. temporary files: recognisable, removed, stale ones cleaned --------------------------------


KILLED_WRITER = """
import os, signal, sys
from mlx_qwen3asr.runtime import atomic
def die(fd):
    os.kill(os.getpid(), signal.SIGKILL)
atomic.os.fsync = die
atomic.atomic_write_text(sys.argv[1], "half a subtitle file")
"""


def test_a_temporary_file_left_by_sigkill_is_removed_by_the_next_run(tmp_path, ckpt, capsys):
    talk = write_audio(tmp_path / "talk.wav", 1.5, 1)
    proc = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(tmp_path / "talk.srt")], timeout=120)
    assert proc.returncode == -signal.SIGKILL
    (left,) = [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    match = OUR_TEMP.match(left.name)
    assert match and match.group(1) == "talk.srt", left.name
    dead_pid = int(match.group(2))

    old = time.time() - 3600
    os.utime(left, (old, old))
    # A fresh one of a (just) finished process, and an old one of a live process: both may belong to a
    # run that is writing right now, and must stay. A user's own dot-file stays too.
    fresh = tmp_path / f".talk.vtt.mlxasr-{dead_pid}-abcd1234.tmp"
    fresh.write_text("x", encoding="utf-8")
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        live = tmp_path / f".talk.txt.mlxasr-{sleeper.pid}-abcd1234.tmp"
        live.write_text("x", encoding="utf-8")
        os.utime(live, (old, old))
        users = tmp_path / ".talk.srt.backup.tmp"
        users.write_text("mine", encoding="utf-8")
        os.utime(users, (old, old))

        assert main(["--no-vad", str(talk), "--srt", "--model", ckpt]) == 0
    finally:
        sleeper.kill()
        sleeper.wait()
    capsys.readouterr()
    assert not left.exists()
    assert fresh.exists() and live.exists() and users.exists()
    assert (tmp_path / "talk.srt").is_file()


def test_our_temporary_names_carry_the_pid_and_are_removed_on_failure(tmp_path, monkeypatch):
    seen = []
    real_fsync = os.fsync

    def fsync(fd):
        seen.extend(p.name for p in tmp_path.iterdir())
        if len(seen) > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    with pytest.raises(OSError, match="No space"):
        atomic_write_files({tmp_path / "x.srt": "a\n", tmp_path / "x.vtt": "b\n"}, replace=False)
    assert seen and all(OUR_TEMP.match(n) and f"mlxasr-{os.getpid()}-" in n for n in seen), seen
    assert list(tmp_path.iterdir()) == []


# --- 4. messages, odd files and interrupts --------------------------------------------------------


def test_control_characters_in_names_are_escaped_on_every_line(tmp_path, ckpt, capsys):
    folder = tmp_path / "rec"
    newline = write_audio(folder / "new\nline.wav", 1.5, 1)
    escape = write_audio(folder / "esc\x1b[31mred.wav", 1.0, 2)
    bad = folder / "tab\tbad.wav"
    bad.write_text("not audio", encoding="utf-8")
    shown = {
        p: str(p).replace("\n", "\\n").replace("\t", "\\t").replace("\x1b", "\\x1b")
        for p in (newline, escape, bad)
    }

    assert main(["--no-vad", str(folder), "--dry-run", "--srt", "--model", ckpt]) == 0
    dry = capsys.readouterr()
    assert main(["--no-vad", str(folder), "--verbose", "--srt", "--model", ckpt]) == 1
    run = capsys.readouterr()
    for text in (dry.out, dry.err, run.out, run.err):
        assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f]", text), repr(text)
    srt_shown = shown[newline][: -len(".wav")] + ".srt"
    assert f"transcribe: {shown[newline]} -> {srt_shown}" in dry.out.splitlines()
    problems = [line for line in run.err.splitlines() if not line.startswith("mlxasr: warning: ")]
    assert len(problems) == 1 and problems[0].startswith(f"mlxasr: error: {shown[bad]}: not an audio file"), (
        problems
    )
    assert f"  failed: {shown[bad]}: " in run.out
    assert any(line.startswith("[") and f"done {shown[newline]}: " in line for line in run.out.splitlines())
    assert f"  wrote {shown[escape][: -len('.wav')]}.srt" in run.out.splitlines()
    assert (folder / "new\nline.srt").is_file()


def test_symbolic_link_loops_and_broken_links_are_told_apart(tmp_path, capsys, no_model):
    folder = tmp_path / "rec"
    folder.mkdir()
    (folder / "x.wav").symlink_to("x.wav")  # ln -s x.wav x.wav
    (folder / "gone.wav").symlink_to("nowhere.wav")
    files, errors = find_inputs([folder, folder / "x.wav", folder / "gone.wav"])
    assert files == []
    assert [(Path(e.path).name, e.reason) for e in errors] == [
        ("gone.wav", "broken symbolic link"),
        ("x.wav", "symbolic link loop"),
        ("x.wav", "symbolic link loop"),
        ("gone.wav", "broken symbolic link"),
    ]
    assert main(["--no-vad", str(folder), "--srt", "--model", "unused"]) == 1
    err = capsys.readouterr().err
    assert errors_for(err, folder / "x.wav") == "symbolic link loop"
    assert errors_for(err, folder / "gone.wav") == "broken symbolic link"


def test_fifos_sockets_and_devices_are_refused_without_being_opened(tmp_path, ckpt):
    folder = tmp_path / "rec"
    good = write_audio(folder / "good.wav", 1.5, 1)
    os.mkfifo(folder / "pipe.wav")
    os.mkfifo(tmp_path / "named.wav")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(folder / "sock.flac"))
        os.mkfifo(folder / "notes")  # not an audio name: ignored like any other non-audio file
        # Nothing ever writes to the FIFOs: opening one for reading would block for ever.
        proc = cli(str(tmp_path / "named.wav"), "/dev/null", str(folder), "--model", ckpt, timeout=60)
    finally:
        sock.close()
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("mlxasr: error:")]
    assert errors == [
        f"mlxasr: error: {tmp_path / 'named.wav'}: is a FIFO, not a regular file",
        "mlxasr: error: /dev/null: is a character device, not a regular file",
        f"mlxasr: error: {folder / 'pipe.wav'}: is a FIFO, not a regular file",
        f"mlxasr: error: {folder / 'sock.flac'}: is a socket, not a regular file",
    ]
    assert "summary: 1 transcribed, 0 skipped, 4 failed" in proc.stdout
    assert good.with_suffix(".txt").read_text(encoding="utf-8").strip()


def test_a_refused_input_alone_is_one_line(tmp_path, ckpt):
    """A FIFO named on its own is one error line: no second line saying that no audio was found."""
    fifo = tmp_path / "live.wav"
    os.mkfifo(fifo)
    proc = cli(str(fifo), "--model", ckpt, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.splitlines() == [f"mlxasr: error: {fifo}: is a FIFO, not a regular file"]


def test_estimates_never_open_a_fifo(tmp_path):
    fifo = tmp_path / "x.wav"
    os.mkfifo(fifo)
    # Run in a child so that a blocking open cannot hang the test run.
    code = (
        "import sys; from mlx_qwen3asr.audio.files import estimate_duration, probe_seconds; "
        "print(probe_seconds(sys.argv[1]), estimate_duration(sys.argv[1]))"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.split() == ["None", "0.0"], proc.stderr


def run_and_signal(
    tmp_path: Path, ckpt: str, signals: list[int], gap: float
) -> tuple[subprocess.Popen, str, Path]:
    folder = tmp_path / "long"
    for i in range(8):
        write_audio(folder / f"f{i}.wav", 8.0, i)
    log = tmp_path / "stdout.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mlx_qwen3asr.cli.main",
                "--no-vad",
                str(folder),
                *ALL,
                "--model",
                ckpt,
                "--batch-size",
                "1",
            ],
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
        try:
            deadline = time.monotonic() + 120
            while "done" not in log.read_text(encoding="utf-8"):
                assert proc.poll() is None, "mlxasr ended before it could be interrupted"
                assert time.monotonic() < deadline, "mlxasr did not start working"
                time.sleep(0.02)
            for sig in signals:
                if proc.poll() is None:
                    proc.send_signal(sig)
                time.sleep(gap)
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    return proc, err, folder


def test_a_ctrl_c_storm_still_prints_the_summary_and_exits_130(tmp_path, ckpt):
    proc, err, folder = run_and_signal(tmp_path, ckpt, [signal.SIGINT] * 5, 0.05)
    out = (tmp_path / "stdout.log").read_text(encoding="utf-8")
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert len(lines_with(out, "interrupted: ")) == 1, out
    assert "mlxasr: interrupted; finished files are kept, rerun to resume" in err
    assert temporaries(folder) == []
    for p in folder.glob("*.wav"):
        outputs = [p.with_suffix(f".{ext}").exists() for ext in ("txt", "srt", "vtt", "json")]
        assert all(outputs) or not any(outputs), p


def test_sigterm_stops_cleanly_with_status_143(tmp_path, ckpt):
    proc, err, folder = run_and_signal(tmp_path, ckpt, [signal.SIGTERM], 0.0)
    out = (tmp_path / "stdout.log").read_text(encoding="utf-8")
    assert proc.returncode == 143, err
    assert "interrupted: " in out and "not finished" in out
    assert temporaries(folder) == []
    finished = [p for p in folder.glob("*.wav") if p.with_suffix(".json").exists()]
    assert finished
    for p in finished:
        check_outputs(p.with_suffix(""))


def test_signals_during_the_interrupt_handling_are_ignored_until_the_summary(tmp_path, capsys, monkeypatch):
    a = write_audio(tmp_path / "a.wav", 1.0, 1)
    monkeypatch.setattr(cli_models, "load", lambda *args, **kwargs: object())
    monkeypatch.setattr(cli_models, "require_kind", lambda *args: None)

    def interrupted_stream(*args, **kwargs):
        signal.raise_signal(signal.SIGINT)  # the first Ctrl-C, while transcribing
        yield from ()

    real_stop = cli_reporter.Reporter.stop
    real_summary = cli_reporter.Reporter.summary

    def stop(self):
        for _ in range(3):  # more Ctrl-C while the interrupt is being handled
            signal.raise_signal(signal.SIGINT)
        real_stop(self)

    def summary(self, s):
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGTERM)
        real_summary(self, s)

    monkeypatch.setattr(cli_run, "transcribe_stream", interrupted_stream)
    monkeypatch.setattr(cli_reporter.Reporter, "stop", stop)
    monkeypatch.setattr(cli_reporter.Reporter, "summary", summary)
    previous = signal.getsignal(signal.SIGINT)
    assert main(["--no-vad", str(a), "--srt"]) == 130
    assert signal.getsignal(signal.SIGINT) is previous
    out = capsys.readouterr().out
    assert "interrupted: 0 transcribed, 0 skipped, 0 failed, 1 not finished" in out


def test_a_ctrl_c_that_a_finalizer_drops_still_stops_the_run(tmp_path, ckpt, capsys, monkeypatch):
    # The run must stop all the same, and without the report of the dropped exception.
    inputs = [write_audio(tmp_path / f"f{i}.wav", 1.0, i) for i in range(3)]
    real_stream = cli_run.transcribe_stream

    def stream(*args, **kwargs):
        results = real_stream(*args, **kwargs)
        try:
            for res in results:
                yield res
                drop_a_ctrl_c()
        finally:
            results.close()

    monkeypatch.setattr(cli_run, "transcribe_stream", stream)
    previous = signal.getsignal(signal.SIGINT)
    args = ["--no-vad", str(tmp_path), "--srt", "--model", ckpt, "--batch-size", "1"]
    assert main(args) == 130
    assert signal.getsignal(signal.SIGINT) is previous
    captured = capsys.readouterr()
    assert "Exception ignored" not in captured.err and "Traceback" not in captured.err, captured.err
    assert "interrupted: 1 transcribed, 0 skipped, 0 failed, 2 not finished" in captured.out
    assert [p.with_suffix(".srt").exists() for p in inputs].count(True) == 1
    assert temporaries(tmp_path) == []


# --- 5. option ranges -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--max-segment-seconds", "1e-9", "must be between 1 and 1200 seconds"),
        ("--max-segment-seconds", "0.99", "must be between 1 and 1200 seconds"),
        ("--max-segment-seconds", "1201", "must be between 1 and 1200 seconds"),
        ("--max-segment-seconds", "nan", "must be between 1 and 1200 seconds"),
        ("--max-segment-seconds", "inf", "must be between 1 and 1200 seconds"),
        ("--max-segment-seconds", "x", "not a number"),
        ("--max-cue-seconds", "0.1", f"must be between {CueOptions.min_duration:g} and 3600 seconds"),
        ("--max-cue-seconds", "inf", f"must be between {CueOptions.min_duration:g} and 3600 seconds"),
        ("--max-cue-seconds", "nan", f"must be between {CueOptions.min_duration:g} and 3600 seconds"),
        ("--max-line-width", "9", "must be between 10 and 1000"),
        ("--max-line-width", "1001", "must be between 10 and 1000"),
        ("--max-line-count", "0", "must be between 1 and 20"),
        ("--max-line-count", "21", "must be between 1 and 20"),
        ("--batch-size", "0", "must be between 1 and 256"),
        ("--batch-size", "257", "must be between 1 and 256"),
        ("--batch-size", "2.5", "not an integer"),
    ],
)
def test_out_of_range_options_are_usage_errors(tmp_path, capsys, no_model, option, value, message):
    a = write_audio(tmp_path / "a.wav", 1.0, 1)
    assert main(["--no-vad", str(a), option, value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"mlxasr: error: argument {option}: {message}"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.wav"]


@pytest.mark.parametrize(
    "args",
    [
        ["--max-segment-seconds", "1"],
        ["--max-segment-seconds", "1200"],
        ["--max-cue-seconds", str(CueOptions.min_duration)],
        ["--max-line-width", "10"],
        ["--max-line-count", "20"],
        ["--batch-size", "256"],
    ],
)
def test_the_limits_themselves_are_accepted(tmp_path, capsys, no_model, args):
    a = write_audio(tmp_path / "a.wav", 1.0, 1)
    assert main(["--no-vad", str(a), "--dry-run", "--srt", *args]) == 0  # cue options need subtitles
    assert "dry run: 1 to transcribe" in capsys.readouterr().out


def test_the_shortest_segment_and_cue_transcribe(tmp_path, ckpt, capsys):
    a = write_audio(tmp_path / "a.wav", 2.5, 1)
    args = [
        "--max-segment-seconds",
        "1",
        "--max-cue-seconds",
        str(CueOptions.min_duration),
        "--max-line-width",
        "10",
    ]
    assert main(["--no-vad", str(a), "--json", "--srt", "--model", ckpt, *args]) == 0
    capsys.readouterr()
    text = (tmp_path / "a.json").read_text(encoding="utf-8")
    assert '"max_segment_seconds": 1.0' in text and text.count('"truncated"') >= 4  # 3 segments + total


def test_ranges_are_stated_in_help(capsys):
    assert main(["--no-vad", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for fragment in (
        "1 to 1200",
        "1 to 256",
        "10 to 1000",
        "1 to 20",
        f"{CueOptions.min_duration:g} to 3600",
    ):
        assert fragment in text, fragment


# --- 6. warnings a transcription carries ----------------------------------------------------------


def test_transcription_warnings_are_printed_and_counted(tmp_path, ckpt, capsys, monkeypatch):
    a = write_audio(tmp_path / "a.wav", 1.5, 1)
    b = write_audio(tmp_path / "b.wav", 1.5, 2)
    real_stream = cli_run.transcribe_stream
    messages = ["decoded 0.8 s of 1.5 s stated in the header; the file looks truncated", "second note"]

    def stream_with_warnings(*args, **kwargs):
        for res in real_stream(*args, **kwargs):
            for seg in res.transcription.segments:  # no flagged segments: only our warnings are printed
                seg.truncated = seg.repetitive = False
            if res.source == str(a):
                res.transcription.warnings = list(messages)  # the field Transcription is gaining
            yield res

    monkeypatch.setattr(cli_run, "transcribe_stream", stream_with_warnings)
    assert main(["--no-vad", str(a), str(b), "--srt", "--model", ckpt]) == 0
    cap = capsys.readouterr()
    assert lines_with(cap.err, "mlxasr: warning:") == [f"mlxasr: warning: {a}: {m}" for m in messages]
    assert "summary: 2 transcribed, 0 skipped, 0 failed, 1 with warnings" in cap.out
    assert (tmp_path / "a.srt").is_file()


# --- output to a pipe whose reader has gone -------------------------------------------------------


def test_a_closed_stdout_pipe_does_not_stop_the_run(tmp_path, ckpt):
    a = write_audio(tmp_path / "a.wav", 1.5, 1)
    b = write_audio(tmp_path / "b.wav", 1.5, 2)
    read_end, write_end = os.pipe()
    os.close(read_end)  # `mlxasr ... | head -0`: the first line written gets EPIPE
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "mlx_qwen3asr.cli.main",
                "--no-vad",
                str(a),
                str(b),
                "--srt",
                "--model",
                ckpt,
            ],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr
    assert a.with_suffix(".srt").is_file() and b.with_suffix(".srt").is_file()


# --- standard streams closed by the caller --------------------------------------------------------


def closing(fds: tuple[int, ...]):
    """A preexec_fn that starts the command with these descriptors closed, as `<&-`, `>&-`, `2>&-` do."""

    def close() -> None:
        for fd in fds:
            os.close(fd)

    return close


@pytest.mark.parametrize("fds", [(0,), (1,), (2,), (0, 1, 2)], ids=["stdin", "stdout", "stderr", "all"])
def test_a_command_started_with_closed_standard_streams_transcribes(tmp_path, ckpt, fds):
    """No file opened later takes fd 0, 1 or 2: the checkpoint is not read as stdin, no message is
    written into a transcript, and a missing sys.stdout is no traceback."""
    a = write_audio(tmp_path / "a.wav", 1.5, 1)
    b = write_audio(tmp_path / "b.wav", 1.5, 2)
    proc = cli(str(a), str(b), "--txt", "--json", "--model", ckpt, preexec_fn=closing(fds), timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    for path in (a, b):
        doc = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))
        assert doc["source"] == str(path)
        assert path.with_suffix(".txt").read_text(encoding="utf-8") == writers.render_txt(
            SimpleNamespace(
                segments=[SimpleNamespace(text=s["text"]) for s in doc["segments"]], text=doc["text"]
            )
        )
    assert temporaries(tmp_path) == []


def test_the_converter_started_with_closed_standard_streams_converts(tmp_path, ckpt):
    dst = tmp_path / "converted"
    proc = subprocess.run(
        [sys.executable, "-m", "mlx_qwen3asr.cli.convert", ckpt, "-o", str(dst), "--bits", "8"],
        capture_output=True,
        text=True,
        timeout=180,
        preexec_fn=closing((0, 1, 2)),
    )
    assert proc.returncode == 0
    assert json.loads((dst / "config.json").read_text(encoding="utf-8"))["quantization"]["bits"] == 8
    assert cli(str(write_audio(tmp_path / "a.wav", 1.5, 1)), "--model", str(dst)).returncode == 0


def ignoring_interrupts_and(close):
    """A preexec_fn that also starts the command with SIGINT ignored, as a shell without job control
    starts a background job."""

    def start() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        close()

    return start


@pytest.mark.parametrize(
    ("command", "ignored"),
    [
        (["mlx_qwen3asr.cli.main", "serve"], False),
        (["mlx_qwen3asr.cli.serve"], False),
        (["mlx_qwen3asr.cli.main", "serve"], True),
    ],
    ids=["mlxasr-serve", "module", "sigint-ignored-at-start"],
)
def test_the_server_started_with_closed_standard_streams_serves(tmp_path, ckpt, command, ignored):
    env = {k: v for k, v in os.environ.items() if k != "MLXASR_API_KEY"}
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", *command, "--model", ckpt, "--port", str(port)],
        env=env,
        preexec_fn=ignoring_interrupts_and(closing((0, 1, 2))) if ignored else closing((0, 1, 2)),
    )
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            time.sleep(0.1)
        assert proc.poll() is None, f"the server exited with status {proc.returncode}"
        audio = write_audio(tmp_path / "a.wav", 1.5, 1).read_bytes()
        answer = httpx.post(
            f"{url}/v1/audio/transcriptions",
            files={"file": ("a.wav", audio)},
            data={"model": "m", "response_format": "json"},
            timeout=120,
        )
        assert answer.status_code == 200 and "text" in answer.json()
    finally:
        proc.send_signal(signal.SIGINT)
        status = proc.wait(timeout=60)
    assert status == 130


def test_the_json_warnings_are_the_lines_the_terminal_printed(tmp_path, ckpt, capsys, monkeypatch):
    from scripted import script_batches, through_cli

    from mlx_qwen3asr.checkpoints.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(Path(ckpt))
    said = script_batches(lambda prompt: tok.encode("language English<asr_text>So it goes"), to_budget=True)
    through_cli(monkeypatch, batch=said.batch)
    cut = write_audio(tmp_path / "cut.wav", 2.0, 1)
    quiet = tmp_path / "quiet.wav"
    sf.write(quiet, np.zeros(16000, dtype=np.float32), 16000)
    assert main(["--no-vad", str(cut), str(quiet), "--json", "--txt", "--model", ckpt]) == 0
    err = capsys.readouterr().err
    for path, expected in (
        (cut, ["1 segment(s) ran into a loop or the token limit"]),
        (quiet, ["silent audio, nothing to transcribe"]),
    ):
        printed = [
            line.removeprefix(f"mlxasr: warning: {path}: ")
            for line in lines_with(err, f"mlxasr: warning: {path}: ")
        ]
        doc = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))
        assert doc["warnings"] == printed
        assert [w.split(";")[0] for w in printed] == expected, printed


def test_an_interrupted_overwrite_run_resumes_without_overwrite(tmp_path, ckpt, capsys, monkeypatch):
    inputs = [write_audio(tmp_path / f"f{i}.wav", 1.0, i) for i in range(3)]
    args = ["--no-vad", str(tmp_path), "--txt", "--json", "--model", ckpt]
    assert main(args) == 0
    capsys.readouterr()
    real_stream = cli_run.transcribe_stream

    def one_then_ctrl_c(*a, **k):
        stream = real_stream(*a, **k)
        try:
            yield next(stream)
            raise KeyboardInterrupt
        finally:
            stream.close()

    monkeypatch.setattr(cli_run, "transcribe_stream", one_then_ctrl_c)
    assert main([*args, "--overwrite"]) == 130
    err = capsys.readouterr().err
    assert (
        "mlxasr: interrupted; finished files are kept, rerun without --overwrite to resume "
        "(files finished in this run are up to date)"
    ) in err
    monkeypatch.setattr(cli_run, "transcribe_stream", real_stream)
    after_stop = {p: state(p.with_suffix(".json")) for p in inputs}

    # The rerun without --overwrite keeps the file finished before the stop and redoes the other two.
    assert main([*args, "--dry-run"]) == 0
    listing = capsys.readouterr().out
    assert "dry run: 2 to transcribe, 1 skipped, 0 failed" in listing
    assert len(lines_with(listing, "(an interrupted run with --overwrite left it to redo)")) == 2
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "summary: 2 transcribed, 1 skipped, 0 failed" in out
    redone = [p for p in inputs if state(p.with_suffix(".json")) != after_stop[p]]
    assert len(redone) == 2
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no record is left
    assert main(args) == 0
    assert "summary: 0 transcribed, 3 skipped, 0 failed" in capsys.readouterr().out


def test_an_overwrite_run_stopped_by_a_usage_error_leaves_no_redo_mark(tmp_path, ckpt, capsys):
    """--overwrite with a checkpoint of the wrong kind stops before any file is transcribed: no redo
    mark stays behind, so a later run without --overwrite still skips an output edited by hand."""
    audio = write_audio(tmp_path / "a.wav", 1.0, 1)
    args = ["--no-vad", str(audio), "--txt", "--model", ckpt]
    assert main(args) == 0
    assert main([*args, "--word-timestamps", "--aligner", ckpt, "--overwrite"]) == 2
    assert "word timing needs a Qwen3-ForcedAligner checkpoint" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    audio.with_suffix(".txt").write_text("edited by hand\n", encoding="utf-8")
    assert main(args) == 0
    assert "summary: 0 transcribed, 1 skipped, 0 failed" in capsys.readouterr().out
    assert audio.with_suffix(".txt").read_text(encoding="utf-8") == "edited by hand\n"


def test_an_interrupted_run_without_overwrite_says_rerun_to_resume(tmp_path, ckpt, capsys, monkeypatch):
    write_audio(tmp_path / "a.wav", 1.0, 1)

    def ctrl_c(*a, **k):
        raise KeyboardInterrupt
        yield

    monkeypatch.setattr(cli_run, "transcribe_stream", ctrl_c)
    assert main(["--no-vad", str(tmp_path), "--txt", "--model", ckpt]) == 130
    assert "mlxasr: interrupted; finished files are kept, rerun to resume" in capsys.readouterr().err
