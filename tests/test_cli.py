"""The mlxasr command end to end on a tiny random-weight checkpoint, and the batch helpers under it."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import srt
import webvtt
from reference import test_signal
from scripted import short_budgets, through_cli

import mlx_qwen3asr.audio.files as audio_module
import mlx_qwen3asr.cli.models as cli_models
from mlx_qwen3asr.cli.main import main
from mlx_qwen3asr.outputs.folder import find_inputs, is_up_to_date, output_stem, plan_jobs
from mlx_qwen3asr.outputs.wrapping import text_width

ALL = ["--txt", "--srt", "--vtt", "--json"]
SRT_TIMING = re.compile(r"^\d{2,}:[0-5]\d:[0-5]\d,\d{3} --> \d{2,}:[0-5]\d:[0-5]\d,\d{3}$")
VTT_TIMING = re.compile(r"^(\d{2,}):([0-5]\d):([0-5]\d)\.(\d{3}) --> (\d{2,}):([0-5]\d):([0-5]\d)\.(\d{3})$")


@pytest.fixture(scope="module")
def ckpt(checkpoints) -> str:
    return str(checkpoints("tiny"))


@pytest.fixture(autouse=True)
def _short_budgets(monkeypatch):
    """main() in this process decodes short budgets (the random model's text is never checked for
    its length here, only for where it goes)."""
    through_cli(monkeypatch, short_budgets())


def write_audio(path: Path, seconds: float, seed: int, rate: int = 16000, channels: int = 1) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    sig = test_signal(seconds, seed=seed, sample_rate=rate)
    data = np.stack([sig, 0.5 * sig], axis=1) if channels == 2 else sig
    if path.suffix == ".m4a":
        tmp = path.with_suffix(".tmp.wav")
        sf.write(tmp, data, rate)
        subprocess.run(
            ["ffmpeg", "-nostdin", "-v", "error", "-y", "-i", str(tmp), "-c:a", "aac", str(path)], check=True
        )
        tmp.unlink()
    else:
        sf.write(path, data, rate)
    return path


def make_good_tree(root: Path) -> list[Path]:
    """Audio in every supported container, nested, with awkward names and a symlink loop."""
    files = [
        write_audio(root / "a talk.wav", 3.0, 1, rate=44100, channels=2),
        write_audio(root / "meeting.2024.01.m4a", 2.0, 2),
        write_audio(root / "nested" / "deeper" / "ünïcödé 音声.flac", 8.0, 3),
        write_audio(root / "nested" / "same.mp3", 2.0, 4),
        write_audio(root / "other" / "same.ogg", 2.0, 5),
    ]
    write_audio(root / ".hidden.wav", 1.0, 6)
    write_audio(root / ".cache" / "x.wav", 1.0, 7)
    (root / "notes.txt").write_text("not audio, not an input\n", encoding="utf-8")
    (root / "nested" / "loop").symlink_to(root, target_is_directory=True)
    return files


def make_bad_tree(root: Path) -> dict[str, Path]:
    root.mkdir(parents=True, exist_ok=True)
    bad = {
        "corrupt": root / "corrupt.wav",
        "empty": root / "empty.wav",
        "text": root / "readme.wav",
        "zero": root / "zero.wav",
    }
    bad["corrupt"].write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt " + os.urandom(200))
    bad["empty"].write_bytes(b"")
    bad["text"].write_text("this is a text file, not a wave file\n", encoding="utf-8")
    sf.write(bad["zero"], np.zeros(0, dtype=np.float32), 16000)
    return bad


def cue_seconds(stamp: str) -> float:
    h, m, rest = stamp.replace(",", ".").split(":")
    return int(h) * 3600 + int(m) * 60 + float(rest)


def check_cue_rules(cues: list[tuple[float, float, list[str]]]) -> None:
    prev_end = 0.0
    for start, end, lines in cues:
        assert 1 <= len(lines) <= 2, lines
        assert all(line.strip() and text_width(line) <= 42 for line in lines), lines
        assert end > start >= prev_end - 1e-9, (start, end, prev_end)
        if end - start > 7.0:
            assert len(lines) == 1 and " " not in lines[0], (start, end, lines)
        prev_end = end


def check_outputs(stem: Path, silent: bool = False) -> None:
    """All four documents of one input exist, parse strictly and agree with each other."""
    srt_text = stem.with_name(stem.name + ".srt").read_text(encoding="utf-8")
    assert srt.compose(srt.parse(srt_text)) == srt_text
    subs = list(srt.parse(srt_text))
    assert all(SRT_TIMING.match(line) for line in srt_text.splitlines() if "-->" in line)
    check_cue_rules([(s.start.total_seconds(), s.end.total_seconds(), s.content.split("\n")) for s in subs])

    vtt_path = stem.with_name(stem.name + ".vtt")
    vtt_text = vtt_path.read_text(encoding="utf-8")
    assert vtt_text.startswith("WEBVTT\n\n")
    captions = webvtt.read(str(vtt_path), strict=True).captions
    timing = [line for line in vtt_text.splitlines() if "-->" in line]
    assert len(timing) == len(captions) == len(subs)
    assert all(VTT_TIMING.match(line) for line in timing)
    vtt_cues = [
        (cue_seconds(c.start), cue_seconds(c.end), [html.unescape(x) for x in c.lines]) for c in captions
    ]
    check_cue_rules(vtt_cues)
    assert [(a, b, "\n".join(t)) for a, b, t in vtt_cues] == [
        (s.start.total_seconds(), s.end.total_seconds(), s.content) for s in subs
    ]

    doc = json.loads(stem.with_name(stem.name + ".json").read_text(encoding="utf-8"))
    assert set(doc) >= {"text", "language", "duration", "segments", "cues", "model", "options", "source"}
    assert len(doc["cues"]) == len(subs)
    assert [c["text"] for c in doc["cues"]] == [s.content for s in subs]
    txt = stem.with_name(stem.name + ".txt").read_text(encoding="utf-8")
    if silent:
        assert subs == [] and doc["segments"] == [] and txt == ""
    else:
        assert subs and doc["segments"] and txt.strip()
        fields = {"start", "end", "text", "language", "truncated", "repetitive", "timing", "words"}
        fields |= {"avg_logprob", "no_speech_prob"}
        assert all(set(s) == fields for s in doc["segments"])
        assert all(s["avg_logprob"] <= 0 <= s["no_speech_prob"] <= 1 for s in doc["segments"])
        assert all(s["timing"] in ("aligned", "estimated") for s in doc["segments"])
        assert doc["duration"] == pytest.approx(doc["segments"][-1]["end"])


def snapshot(folder: Path) -> dict[str, tuple[int, bytes]]:
    return {
        str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.read_bytes())
        for p in folder.rglob("*")
        if p.is_file()
    }


def temporaries(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.name.endswith(".tmp") or p.name.startswith(".") and p.is_file()]


# --- end to end -----------------------------------------------------------------------------------


def test_batch_with_mirrored_outputs_resume_and_overwrite(tmp_path, ckpt, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    make_good_tree(Path("good"))
    bad = make_bad_tree(Path("bad"))
    args = [
        "--no-vad",
        "good",
        "good/a talk.wav",
        "bad",
        "-o",
        "out",
        *ALL,
        "--model",
        ckpt,
        "--max-segment-seconds",
        "4",
    ]

    assert main(args) == 1
    cap = capsys.readouterr()
    out = Path("out")
    # The folder argument is mirrored under its own name; "good/a talk.wav", named on its own too, is
    # transcribed once, in its place in the mirrored tree.
    expected = [
        f"good/{stem}"
        for stem in ["a talk", "meeting.2024.01", "nested/deeper/ünïcödé 音声", "nested/same", "other/same"]
    ]
    for stem in expected:
        check_outputs(out / stem)
    made = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert made == sorted(f"{stem}.{ext}" for stem in expected for ext in ("json", "srt", "txt", "vtt"))
    # Nothing was written beside the inputs, and no temporary files were left anywhere.
    assert not list(Path("good").rglob("*.srt")) and not list(Path("bad").rglob("*.txt"))
    assert temporaries(out) == []
    # The 8 s file was cut into several segments, and its JSON records the options used.
    doc = json.loads((out / "good/nested/deeper/ünïcödé 音声.json").read_text(encoding="utf-8"))
    assert len(doc["segments"]) >= 2 and doc["options"]["max_segment_seconds"] == 4.0
    assert doc["model"] == ckpt and doc["source"] == str(Path("good/nested/deeper/ünïcödé 音声.flac"))

    errors = [line for line in cap.err.splitlines() if line.startswith("mlxasr: error:")]
    assert sorted(errors) == sorted(
        [
            f"mlxasr: error: {bad['corrupt']}: " + errors_for(cap.err, bad["corrupt"]),
            f"mlxasr: error: {bad['empty']}: file is empty",
            f"mlxasr: error: {bad['text']}: " + errors_for(cap.err, bad["text"]),
            f"mlxasr: error: {bad['zero']}: contains no audio samples",
        ]
    )
    # Random format bytes: refused as no audio, or for the sample rate they happen to state.
    assert re.search(r"not an audio file|implausible sample rate", errors_for(cap.err, bad["corrupt"]))
    assert "not an audio file" in errors_for(cap.err, bad["text"])
    assert "summary: 5 transcribed, 0 skipped, 4 failed" in cap.out
    for path in bad.values():
        assert f"failed: {path}: " in cap.out

    # Resume: every output exists, nothing is touched.
    before = snapshot(out)
    assert main(["--no-vad", "good", "-o", "out", *ALL, "--model", ckpt]) == 0
    cap = capsys.readouterr()
    assert "summary: 0 transcribed, 5 skipped, 0 failed" in cap.out
    assert "loading model" not in cap.out
    assert snapshot(out) == before

    # A changed input is not redone over its existing outputs: it is skipped, and the run says why.
    time.sleep(0.01)
    os.utime("good/other/same.ogg")
    assert main(["--no-vad", "good", "-o", "out", "--srt", "--model", ckpt]) == 0
    cap = capsys.readouterr()
    assert "summary: 0 transcribed, 5 skipped, 0 failed" in cap.out
    assert "skipped good/other/same.ogg: its outputs exist but are older than it; use --overwrite" in cap.out
    assert snapshot(out) == before

    # An interrupted file (some outputs missing) is finished: only the missing output is written.
    Path("out/good/other/same.vtt").unlink()
    assert main(["--no-vad", "good", "-o", "out", *ALL, "--model", ckpt]) == 0
    cap = capsys.readouterr()
    assert "summary: 1 transcribed, 4 skipped, 0 failed, 3 existing output(s) kept" in cap.out
    after = snapshot(out)
    vtt = "good/other/same.vtt"
    assert {k: v for k, v in after.items() if k != vtt} == {k: v for k, v in before.items() if k != vtt}
    assert after[vtt][1] == before[vtt][1]  # the same transcription again
    check_outputs(out / "good" / "other" / "same")

    # --overwrite redoes a file whose outputs exist.
    assert main(["--no-vad", "good", "-o", "out", "--txt", "--json", "--model", ckpt, "--overwrite"]) == 0
    assert "summary: 5 transcribed, 0 skipped, 0 failed" in capsys.readouterr().out
    final = snapshot(out)
    for ext in ("json", "txt"):
        assert final[f"good/a talk.{ext}"][0] > before[f"good/a talk.{ext}"][0]
    assert final["good/nested/same.srt"] == before["good/nested/same.srt"]
    check_outputs(out / "good" / "a talk")

    # A file named on its own is written at the top of the output folder.
    assert main(["--no-vad", "good/a talk.wav", "-o", "out", "--txt", "--model", ckpt]) == 0
    assert (out / "a talk.txt").read_text(encoding="utf-8") == (out / "good/a talk.txt").read_text(
        encoding="utf-8"
    )


def errors_for(stderr: str, path: Path) -> str:
    prefix = f"mlxasr: error: {path}: "
    (line,) = [line for line in stderr.splitlines() if line.startswith(prefix)]
    return line[len(prefix) :]


def test_outputs_beside_inputs_keep_the_extension_when_names_collide(tmp_path, ckpt, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLXASR_MODEL", ckpt)
    rec = Path("rec")
    write_audio(rec / "a.wav", 1.5, 1)
    write_audio(rec / "a.MP3", 1.5, 2)
    write_audio(rec / "meeting.2024.01.m4a", 1.5, 3)
    assert main(["--no-vad", "rec", "--batch-size", "3"]) == 0
    names = sorted(p.name for p in rec.iterdir())
    assert names == ["a.MP3", "a.MP3.txt", "a.wav", "a.wav.txt", "meeting.2024.01.m4a", "meeting.2024.01.txt"]
    assert all((rec / n).read_text(encoding="utf-8").strip() for n in names if n.endswith(".txt"))
    assert "summary: 3 transcribed" in capsys.readouterr().out


def test_format_option_lists_and_all(tmp_path, ckpt, capsys):
    src = write_audio(tmp_path / "x.wav", 1.5, 1)
    assert main(["--no-vad", str(src), "-f", "srt,vtt", "-f", "json", "--model", ckpt]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json", "x.srt", "x.vtt", "x.wav"]
    assert main(["--no-vad", str(src), "-f", "all", "--model", ckpt, "--overwrite"]) == 0
    assert (tmp_path / "x.txt").exists()
    check_outputs(tmp_path / "x")
    capsys.readouterr()


def test_unreadable_silent_and_ffmpeg_less_inputs_are_reported_and_the_batch_goes_on(
    tmp_path, ckpt, capsys, monkeypatch
):
    locked = write_audio(tmp_path / "locked.wav", 1.0, 1)
    locked.chmod(0)
    real_open = os.open

    def guarded_open(file, *args, **kwargs):
        # Root reads any file whatever its mode; refuse this one as the kernel would for others.
        if os.fspath(file) == str(locked):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(os, "open", guarded_open)
    silent = tmp_path / "silent.wav"
    sf.write(silent, np.zeros(32000, dtype=np.float32), 16000)
    m4a = write_audio(tmp_path / "clip.m4a", 1.0, 2)
    write_audio(tmp_path / "good.flac", 1.5, 3)
    monkeypatch.setattr(audio_module.shutil, "which", lambda name: None)
    try:
        status = main(["--no-vad", str(tmp_path), *ALL, "--model", ckpt])
    finally:
        locked.chmod(0o644)
    cap = capsys.readouterr()
    assert status == 1
    assert errors_for(cap.err, locked) == "permission denied"
    assert errors_for(cap.err, m4a).startswith("cannot decode .m4a without ffmpeg")
    assert f"mlxasr: warning: {silent}: silent audio" in cap.err
    assert len([line for line in cap.err.splitlines() if line.startswith("mlxasr: error:")]) == 2
    assert "summary: 2 transcribed, 0 skipped, 2 failed" in cap.out
    check_outputs(tmp_path / "silent", silent=True)
    check_outputs(tmp_path / "good")
    assert not (tmp_path / "clip.srt").exists() and not (tmp_path / "locked.srt").exists()


def test_quiet_verbose_and_dry_run(tmp_path, ckpt, capsys):
    src = write_audio(tmp_path / "x.wav", 2.0, 1)
    (tmp_path / "bad.wav").write_text("nope", encoding="utf-8")

    assert main(["--no-vad", str(tmp_path), "--dry-run", "--srt", "--model", "/no/such/model"]) == 0
    cap = capsys.readouterr()
    assert f"transcribe: {src} -> {tmp_path / 'x.srt'}" in cap.out
    assert "dry run: 2 to transcribe, 0 skipped, 0 failed" in cap.out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.wav", "x.wav"]

    assert main(["--no-vad", str(tmp_path), "--quiet", "--srt", "--model", ckpt]) == 1
    cap = capsys.readouterr()
    assert cap.out == ""
    assert cap.err.splitlines() == [
        f"mlxasr: error: {tmp_path / 'bad.wav'}: " + errors_for(cap.err, tmp_path / "bad.wav")
    ]

    assert main(["--no-vad", str(src), "--verbose", "--srt", "--model", ckpt, "--overwrite"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^  \[00:00:00\.000 --> 00:00:02\.000\] \S", out, re.M)
    assert f"wrote {tmp_path / 'x.srt'}" in out

    # With several files decoded together, each segment line names its file.
    other = write_audio(tmp_path / "y.wav", 1.5, 2)
    assert main(["--no-vad", str(src), str(other), "--verbose", "--srt", "--model", ckpt, "--overwrite"]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"^  {re.escape(str(src))} \[00:00:00\.000 --> 00:00:02\.000\] ", out, re.M)
    assert re.search(rf"^  {re.escape(str(other))} \[00:00:00\.000 --> 00:00:01\.500\] ", out, re.M)


def test_progress_bar_and_summary_table_on_a_terminal(tmp_path, ckpt, capsys, monkeypatch):
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.delenv("NO_COLOR", raising=False)
    src = write_audio(tmp_path / "x.wav", 2.0, 1)
    (tmp_path / "bad.wav").write_text("nope", encoding="utf-8")
    assert main(["--no-vad", str(tmp_path), "--srt", "--model", ckpt]) == 1
    cap = capsys.readouterr()
    assert "mlxasr summary" in cap.out and "realtime" in cap.out
    assert "\x1b[" in cap.out  # drawn for a terminal
    assert f"mlxasr: error: {tmp_path / 'bad.wav'}: " in cap.err
    assert src.with_suffix(".srt").exists()


def test_context_file_is_used(tmp_path, ckpt, capsys):
    src = write_audio(tmp_path / "x.wav", 1.0, 1)
    ctx = tmp_path / "names.txt"
    ctx.write_text("Qwen, MLX\n", encoding="utf-8")
    assert (
        main(
            ["--no-vad", str(src), "--json", "--context-file", str(ctx), "--language", "en", "--model", ckpt]
        )
        == 0
    )
    doc = json.loads((tmp_path / "x.json").read_text(encoding="utf-8"))
    assert doc["options"]["context"] == "Qwen, MLX" and doc["options"]["language"] == "English"
    assert doc["language"] == "English"
    capsys.readouterr()


def test_cue_and_recognition_options_reach_the_outputs(tmp_path, ckpt, capsys):
    src = write_audio(tmp_path / "x.wav", 6.0, 1)
    args = ["--max-line-width", "12", "--max-line-count", "1", "--max-cue-seconds", "1.5"]
    args += ["--max-segment-seconds", "2", "--context", "Qwen", "--dtype", "float32"]
    args += ["--max-words-per-line", "3", "--pause-seconds", "0.4", "--min-cue-gap", "0.1"]
    args += ["--max-chars-per-second", "15", "--highlight-words", "--highlight-style", "karaoke"]
    assert main(["--no-vad", str(src), "--json", "--srt", "--model", ckpt, *args]) == 0
    capsys.readouterr()
    doc = json.loads((tmp_path / "x.json").read_text(encoding="utf-8"))
    assert doc["options"] == {
        "language": None,
        "context": "Qwen",
        "max_segment_seconds": 2.0,
        "max_line_width": 12,
        "max_line_count": 1,
        "max_cue_seconds": 1.5,
        "word_timestamps": True,
        "aligner": os.environ["MLXASR_ALIGNER"],
        "highlight_words": "karaoke",
        "max_words_per_line": 3,
        "pause_seconds": 0.4,
        "min_cue_gap": 0.1,
        "max_chars_per_second": 15.0,
        "vad": False,
        "vad_threshold": None,
    }
    assert len(doc["segments"]) >= 3  # 6 s cut into pieces of at most 2 s
    assert all(s["end"] - s["start"] <= 2.0 + 1e-6 for s in doc["segments"])
    subs = list(srt.parse((tmp_path / "x.srt").read_text(encoding="utf-8")))
    assert subs and all("\n" not in s.content for s in subs)  # one line per cue
    assert main(["--no-vad", str(src), "--dtype", "int8", "--model", ckpt]) == 2
    assert "argument --dtype: invalid choice" in capsys.readouterr().err


# --- usage errors ---------------------------------------------------------------------------------


def test_usage_errors_exit_2_before_the_model_or_any_file_is_touched(tmp_path, ckpt, capsys, monkeypatch):
    src = write_audio(tmp_path / "x.wav", 1.0, 1)
    loads = []
    monkeypatch.setattr(cli_models, "load", lambda *a, **k: loads.append(a) or pytest.fail("model loaded"))

    assert main(["--no-vad", str(src), "--language", "Klingon"]) == 2
    assert "unsupported language 'Klingon'" in capsys.readouterr().err
    assert main(["--no-vad", str(src), "--context-file", str(tmp_path / "missing.txt")]) == 2
    assert "--context-file" in capsys.readouterr().err
    assert main(["--no-vad", str(src), "--context", "a", "--context-file", str(src)]) == 2
    assert main(["--no-vad", str(src), "-f", "docx"]) == 2
    assert "invalid format 'docx'" in capsys.readouterr().err
    assert main(["--no-vad", str(src), "--max-segment-seconds", "0"]) == 2
    assert main(["--no-vad", str(src), "--quiet", "--verbose"]) == 2
    assert main(["--no-vad", str(tmp_path / "nope.wav"), str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert f"mlxasr: error: {tmp_path / 'nope.wav'}: no such file or directory" in err
    assert main([]) == 2
    assert loads == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.wav"]


def test_a_missing_path_among_good_ones_fails_only_itself(tmp_path, ckpt, capsys):
    src = write_audio(tmp_path / "x.wav", 1.0, 1)
    assert main(["--no-vad", str(src), str(tmp_path / "nope.wav"), "--model", ckpt]) == 1
    cap = capsys.readouterr()
    assert f"mlxasr: error: {tmp_path / 'nope.wav'}: no such file or directory" in cap.err
    assert (tmp_path / "x.txt").exists()


def test_bad_model_fails_fast_with_one_message(tmp_path, capsys):
    src = write_audio(tmp_path / "x.wav", 1.0, 1)
    not_a_model = tmp_path / "empty-model"
    not_a_model.mkdir()
    for model in (str(tmp_path / "missing-model"), str(not_a_model)):
        assert main(["--no-vad", str(src), "--srt", "--model", model]) == 2
        errors = [line for line in capsys.readouterr().err.splitlines() if line]
        assert len(errors) == 1 and errors[0].startswith(f"mlxasr: error: model {model}: "), errors
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty-model", "x.wav"]


def test_the_first_screen_of_help_shows_the_common_options(capsys, monkeypatch):
    """--help starts with a short usage and the options most runs use, all within the first 40 lines of
    an 80-column terminal; the rest follows in titled groups."""
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["--help"]) == 0
    lines = capsys.readouterr().out.splitlines()
    first = "\n".join(lines[:40])
    for shown in (
        "PATH",
        "--txt",
        "--srt",
        "--vtt",
        "--json",
        "-o DIR",
        "--overwrite",
        "--model",
        "--language",
    ):
        assert shown in first, shown
    assert "-q, --quiet" in first and "-v, --verbose" in first
    assert lines[0] == "usage: mlxasr [options] PATH [PATH ...]"
    rest = "\n".join(lines[40:])
    for later in ("--max-line-width", "--num-speakers", "--vad-threshold", "--batch-size", "--context"):
        assert later not in first and later in rest, later
    titles = [line for line in lines if line and not line.startswith(" ") and line.endswith(":")]
    assert titles[:6] == [
        "common options (without a format option, a .txt transcript is written):",
        "model and word timing:",
        "more output:",
        "speakers (who said what):",
        "recognition:",
        "subtitle cues (SRT and VTT only; an error without them):",
    ], titles


def test_help_and_version(capsys):
    assert main(["--no-vad", "--version"]) == 0
    assert capsys.readouterr().out.startswith("mlxasr ")
    assert main(["--no-vad", "--help"]) == 0
    text = capsys.readouterr().out
    for flag in (
        "--srt",
        "--vtt",
        "--json",
        "--txt",
        "--output-format",
        "--overwrite",
        "--dry-run",
        "--batch-size",
    ):
        assert flag in text
    assert "exit status" in text and "130" in text
    for command in ("align AUDIO --text FILE", "convert SRC -o DST", "serve", "./serve"):
        assert command in text


def test_subcommands_win_over_a_folder_of_their_name(tmp_path, ckpt, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_audio(tmp_path / "serve" / "talk.wav", 2.0, 1)
    assert main(["serve", "--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: mlxasr serve")
    assert not (tmp_path / "serve" / "talk.txt").exists()
    for command in ("convert", "align"):
        assert main([command, "--help"]) == 0
        assert capsys.readouterr().out.startswith(f"usage: mlxasr {command}")
    assert main(["./serve", "--no-vad", "--txt", "--model", ckpt]) == 0
    assert (tmp_path / "serve" / "talk.txt").is_file()


# --- interrupt ------------------------------------------------------------------------------------


class _Finalized:
    def __del__(self) -> None:
        signal.raise_signal(signal.SIGINT)  # handled before raise_signal returns, inside __del__


def drop_a_ctrl_c() -> None:
    """A Ctrl-C whose KeyboardInterrupt is dropped: Python runs a signal's handler between any two
    bytecodes, a finalizer's among them, and only reports what a finalizer raises."""
    _Finalized()  # finalized at once


def test_sigint_stops_cleanly_with_status_130(tmp_path, ckpt):
    folder = tmp_path / "long"
    inputs = [write_audio(folder / f"f{i}.wav", 8.0, i) for i in range(8)]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    log = tmp_path / "stdout.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            # One segment at a time, so that files finish one by one and the signal lands mid-run.
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
            env=env,
        )
        try:
            deadline = time.monotonic() + 120
            while "done" not in log.read_text(encoding="utf-8"):
                assert proc.poll() is None, "mlxasr ended before it could be interrupted"
                assert time.monotonic() < deadline, "mlxasr did not start working"
                time.sleep(0.05)
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert "interrupted: " in log.read_text(encoding="utf-8")
    assert temporaries(folder) == []
    finished = [p for p in inputs if p.with_suffix(".srt").exists()]
    assert 1 <= len(finished) < len(inputs)
    for p in inputs:
        outputs = [p.with_suffix(f".{ext}").exists() for ext in ("txt", "srt", "vtt", "json")]
        assert all(outputs) or not any(outputs), p
    for p in finished:
        check_outputs(p.with_suffix(""))


# --- batch helpers --------------------------------------------------------------------------------


def test_find_inputs_walks_sorted_skips_hidden_and_survives_loops(tmp_path):
    root = tmp_path / "r"
    for name in ["b.WAV", "a.flac", "sub/c.mp3", "sub/z/d.m4a", ".h.wav", ".hid/e.wav", "notes.txt", "x.srt"]:
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x")
    (root / "sub" / "up").symlink_to(root, target_is_directory=True)
    (root / "sub" / "self").symlink_to(root / "sub", target_is_directory=True)
    (root / "link.wav").symlink_to(root / "a.flac")
    (root / "dangling.wav").symlink_to(root / "gone.wav")
    explicit = root / "notes.txt"
    files, errors = find_inputs([root, root / "a.flac", explicit, tmp_path / "missing"])
    rel = [str(f.path.relative_to(root)) for f in files]
    assert rel == ["a.flac", "b.WAV", "sub/c.mp3", "sub/z/d.m4a", "notes.txt"]
    assert files[0].root == root and files[-1].root is None
    assert [str(f.relative) for f in files] == ["a.flac", "b.WAV", "sub/c.mp3", "sub/z/d.m4a", "notes.txt"]
    assert [(Path(e.path).name, e.reason) for e in errors] == [
        ("dangling.wav", "broken symbolic link"),
        ("missing", "no such file or directory"),
    ]


def test_output_names():
    assert output_stem("meeting.2024.01.m4a") == "meeting.2024.01"
    assert output_stem("Talk.MP4") == "Talk"
    assert output_stem("notes.txt") == "notes.txt"
    assert output_stem(".wav") == ".wav"


def test_plan_mirrors_folders_and_disambiguates(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for p in [a / "x.wav", a / "sub" / "x.wav", a / "y.wav", a / "Y.mp3", b / "x.wav"]:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x")
    files, _ = find_inputs([a, b])
    out = tmp_path / "out"
    jobs = plan_jobs(files, ["srt", "txt"], out)
    got = [
        (str(j.path.relative_to(tmp_path)), [str(p.relative_to(out)) for p in j.outputs.values()])
        for j in jobs
    ]
    assert got == [
        ("a/Y.mp3", ["a/Y.mp3.txt", "a/Y.mp3.srt"]),
        ("a/sub/x.wav", ["a/sub/x.txt", "a/sub/x.srt"]),
        ("a/x.wav", ["a/x.txt", "a/x.srt"]),
        ("a/y.wav", ["a/y.wav.txt", "a/y.wav.srt"]),
        ("b/x.wav", ["b/x.txt", "b/x.srt"]),
    ]
    beside = plan_jobs(files, ["txt"])
    assert [j.outputs["txt"] for j in beside][:3] == [a / "Y.mp3.txt", a / "sub" / "x.txt", a / "x.txt"]
    with pytest.raises(ValueError):
        plan_jobs(files, ["docx"])


def test_output_paths_do_not_depend_on_the_order_of_the_arguments(tmp_path, ckpt, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for folder, seed in (("A", 1), ("B", 2)):
        write_audio(Path(folder) / "x.wav", 1.5, seed)
        write_audio(Path(folder) / "sub" / "y.wav", 1.5, seed + 10)
    runs = {}
    for order in (["A", "B"], ["B", "A"]):
        out = Path("out-" + "".join(order))
        assert main(["--no-vad", *order, "-o", str(out), "--json", "--model", ckpt]) == 0
        runs[out] = {str(p.relative_to(out)): json.loads(p.read_text()) for p in out.rglob("*.json")}
    first, second = runs.values()
    assert sorted(first) == sorted(second) == ["A/sub/y.json", "A/x.json", "B/sub/y.json", "B/x.json"]
    for name in first:  # each output holds its own file's transcript, in both runs
        assert first[name]["source"] == second[name]["source"] == name.removesuffix(".json") + ".wav"
        assert first[name]["text"] == second[name]["text"]
    capsys.readouterr()


def test_arguments_whose_outputs_would_share_a_path_are_a_usage_error(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli_models, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    for name in ("A/x.wav", "B/x.wav", "p/rec/a.wav", "q/rec/a.wav"):
        write_audio(Path(name), 1.0, 1)
    for args, message in (
        (["A/x.wav", "B/x.wav"], "A/x.wav and B/x.wav would both be written to out/x.txt"),
        (["B/x.wav", "A/x.wav"], "A/x.wav and B/x.wav would both be written to out/x.txt"),
        (["q/rec", "p/rec"], "p/rec/a.wav and q/rec/a.wav would both be written to out/rec/a.txt"),
    ):
        assert main(["--no-vad", *args, "-o", "out"]) == 2
        err = capsys.readouterr().err
        assert f"mlxasr: error: {message} (give them different output folders)\n" in err, err
        assert not Path("out").exists()
    # Beside their inputs they cannot clash.
    assert main(["--no-vad", "A/x.wav", "B/x.wav", "--dry-run"]) == 0
    assert "A/x.wav -> A/x.txt" in capsys.readouterr().out


def test_a_file_reached_by_two_arguments_is_placed_whatever_their_order(tmp_path):
    a = tmp_path / "a"
    for p in [a / "x.wav", a / "sub" / "y.wav"]:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x")
    out = tmp_path / "out"
    plans = []
    for order in ([a, a / "sub", a / "sub" / "y.wav"], [a / "sub" / "y.wav", a / "sub", a]):
        files, errors = find_inputs(order)
        assert errors == []
        jobs = plan_jobs(files, ["txt"], out)
        plans.append(sorted((str(j.path), str(j.outputs["txt"].relative_to(out))) for j in jobs))
    assert plans[0] == plans[1] == [(str(a / "sub" / "y.wav"), "a/sub/y.txt"), (str(a / "x.wav"), "a/x.txt")]


def test_up_to_date_needs_every_output_newer_than_the_input(tmp_path):
    src = tmp_path / "x.wav"
    src.write_bytes(b"x")
    (job,) = plan_jobs(find_inputs([src])[0], ["srt", "txt"])
    assert not is_up_to_date(job)
    job.outputs["srt"].write_text("", encoding="utf-8")
    assert not is_up_to_date(job)
    job.outputs["txt"].write_text("", encoding="utf-8")
    now = time.time()
    os.utime(src, (now - 10, now - 10))
    assert is_up_to_date(job)
    os.utime(src, (now + 10, now + 10))
    assert not is_up_to_date(job)


def test_cli_module_is_runnable(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "mlx_qwen3asr.cli", "--version"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and proc.stdout.startswith("mlxasr ")
    assert shutil.which("ffmpeg")  # the m4a inputs above are made with it


# --- options that do nothing for the formats chosen ------------------------------------------------


def test_options_that_others_make_moot_are_usage_errors_naming_them(tmp_path, capsys, monkeypatch):
    """One rule for every option another option makes moot: a usage error (status 2, before anything
    loads) naming the option and why, as --diarizer without --diarize always was."""
    monkeypatch.setattr(cli_models, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    a = write_audio(tmp_path / "a.wav", 1.0, 1)

    def refused(*args: str) -> str:
        assert main(["--no-vad", str(a), "--dry-run", *args]) == 2
        return capsys.readouterr().err.splitlines()[-1]

    assert refused("--no-word-timestamps", "--aligner", "A") == (
        "mlxasr: error: argument --aligner: has no effect with --no-word-timestamps (words are not timed)"
    )
    assert refused("--txt", "--max-words-per-line", "3") == (
        "mlxasr: error: argument --max-words-per-line: has no effect without --srt or --vtt "
        "(only subtitles are cut into cues)"
    )
    assert refused("--json", "--highlight-words", "--max-line-width", "20").startswith(
        "mlxasr: error: argument --highlight-words: has no effect without --srt or --vtt"
    )
    assert refused("--srt", "--highlight-style", "karaoke") == (
        "mlxasr: error: argument --highlight-style: has no effect without --highlight-words"
    )
    assert refused("--diarizer", "D") == "mlxasr: error: argument --diarizer: has no effect without --diarize"
    assert refused("--no-vad", "--vad-threshold", "0.3") == (
        "mlxasr: error: argument --vad-threshold: has no effect with --no-vad"
    )
    for fine in (
        ["--srt", "--max-words-per-line", "3", "--highlight-words", "--highlight-style", "karaoke"],
        ["--word-timestamps", "--aligner", "A", "--txt"],
        ["--txt"],
    ):
        assert main(["--no-vad", str(a), "--dry-run", *fine]) == 0, fine
        assert "error" not in capsys.readouterr().err


def test_highlight_words_errors_name_what_the_user_gave(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli_models, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    a = write_audio(tmp_path / "a.wav", 1.0, 1)
    assert main(["--no-vad", str(a), "--srt", "--no-word-timestamps", "--highlight-words", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (
        "mlxasr: error: argument --highlight-words: needs word timing, which --no-word-timestamps turns off"
    )
    # The option takes no value: a PATH right after it is still a PATH.
    assert main(["--no-vad", "--highlight-words", str(a), "--srt", "--dry-run"]) == 0
    assert main(["--no-vad", str(a), "--srt", "--highlight-style", "bold", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("mlxasr: error: argument --highlight-style: invalid choice: 'bold'")


def test_initial_prompt_is_whispers_name_for_context(capsys):
    from mlx_qwen3asr.cli.arguments import build_parser

    assert build_parser().parse_args(["a.wav", "--initial-prompt", "Qwen, MLX"]).context == "Qwen, MLX"
    assert main(["a.wav", "--initial-prompt", "x", "--context-file", "names.txt"]) == 2
    assert (
        "argument --context-file: not allowed with argument --context/--initial-prompt"
        in capsys.readouterr().err
    )
    assert main(["--help"]) == 0
    assert "--context TEXT, --initial-prompt TEXT" in capsys.readouterr().out


# --- audio on standard input ----------------------------------------------------------------------


def mlxasr(*args: str, stdin: bytes, cwd: Path) -> subprocess.CompletedProcess:
    """mlxasr in a child process fed stdin, its temporary files in cwd/tmp (MLX's compiled kernels, kept
    in TMPDIR/mlx, are the run's own: they are not compiled again)."""
    (cwd / "tmp").mkdir(exist_ok=True)
    kernels = Path(tempfile.gettempdir()) / "mlx"
    kernels.mkdir(exist_ok=True)
    if not (cwd / "tmp" / "mlx").exists():
        (cwd / "tmp" / "mlx").symlink_to(kernels, target_is_directory=True)
    return subprocess.run(
        [sys.executable, "-m", "mlx_qwen3asr.cli.main", "--no-vad", *args],
        input=stdin,
        capture_output=True,
        timeout=300,
        cwd=cwd,
        env=dict(os.environ, TMPDIR=str(cwd / "tmp")),
    )


def test_audio_piped_in_gives_its_transcript_on_stdout(tmp_path, ckpt):
    audio = write_audio(tmp_path / "talk.wav", 2.0, 1).read_bytes()
    proc = mlxasr("-", "--srt", "--model", ckpt, stdin=audio, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    subs = list(srt.parse(proc.stdout.decode("utf-8")))
    assert subs and subs[-1].end.total_seconds() <= 2.0 + 1e-3
    err = proc.stderr.decode("utf-8")
    assert "done stdin" in err and "summary: 1 transcribed" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["talk.wav", "tmp"]  # nothing written beside
    assert list((tmp_path / "tmp").glob("mlxasr-stdin-*")) == []  # the copy of the stream is removed

    # With -o, stdin is an input like the others, named "stdin".
    out = tmp_path / "out"
    proc = mlxasr(
        "-", "talk.wav", "--json", "--txt", "-o", str(out), "--model", ckpt, stdin=audio, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["stdin.json", "stdin.txt", "talk.json", "talk.txt"]
    doc = json.loads((out / "stdin.json").read_text(encoding="utf-8"))
    assert doc["source"] == "stdin" and doc["duration"] == pytest.approx(2.0, abs=0.01)
    assert (out / "stdin.txt").read_bytes() == (out / "talk.txt").read_bytes()
    assert "summary: 2 transcribed" in proc.stdout.decode("utf-8")


def test_stdin_usage_errors_and_an_empty_stream(tmp_path, ckpt):
    a = write_audio(tmp_path / "a.wav", 1.0, 1)
    proc = mlxasr("-", str(a), "--srt", "--model", ckpt, stdin=b"", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.decode().splitlines()[-1] == (
        "mlxasr: error: argument PATH: - (standard input) with other PATHs needs -o DIR"
    )
    proc = mlxasr("-", "--srt", "--json", "--model", ckpt, stdin=b"", cwd=tmp_path)
    assert proc.returncode == 2
    assert (
        "one format to standard output, not 2 (srt, json); choose one, or give -o DIR" in proc.stderr.decode()
    )
    proc = mlxasr("-", "--txt", "--model", ckpt, stdin=b"", cwd=tmp_path)
    assert proc.returncode == 1 and proc.stdout == b""
    assert "mlxasr: error: stdin: nothing was written to standard input" in proc.stderr.decode()
    assert "loading model" not in proc.stderr.decode()
    assert list((tmp_path / "tmp").glob("mlxasr-stdin-*")) == []
