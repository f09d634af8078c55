"""mlxasr with word timing: the aligner's words reach the cues, the JSON and the highlighted subtitles;
a missing or wrong aligner is handled as the README says."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import srt
import webvtt
from reference import test_signal
from scripted import script_batches, through_cli
from test_word_cues import check_word_cues

import mlx_qwen3asr.cli.models as cli_models
from mlx_qwen3asr.cli.main import main
from mlx_qwen3asr.outputs.cues import CueOptions, build_cues
from mlx_qwen3asr.pipeline.result import Segment, Word

SAID = [
    "So the first thing I want to talk about today, is the budget for next year.",
    "We looked at every department, and most of them asked for more than last time!",
]


@pytest.fixture
def scripted(checkpoints, monkeypatch):
    """The speech model 'says' SAID, one text per segment, and stops (random weights never do)."""
    from mlx_qwen3asr.checkpoints.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(checkpoints("tiny"))
    queue = list(SAID)
    said = script_batches(
        lambda prompt: tok.encode(f"language English<asr_text>{queue.pop(0) if queue else ''}")
    )
    through_cli(monkeypatch, batch=said.batch)
    return queue


@pytest.fixture
def paced(monkeypatch):
    """The aligner times words at a speaking pace (random weights put them anywhere, often past the end):
    each word 0.32 s after the previous, 0.25 s long, with a 0.9 s pause after every seventh word."""
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


def write_talk(folder: Path, seconds: float = 50.0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "talk.wav"
    sf.write(path, test_signal(seconds, seed=11), 16000)
    return path


def segments_of(doc: dict) -> list[Segment]:
    out = []
    for s in doc["segments"]:
        seg = Segment(s["start"], s["end"], s["text"], s["language"], timing=s["timing"])
        at = 0
        for w in s["words"]:
            at = s["text"].index(w["text"], at)
            seg.words.append(Word(w["text"], w["start"], w["end"], at, at + len(w["text"])))
            at += len(w["text"])
        out.append(seg)
    return out


def test_words_are_timed_and_reach_every_output(tmp_path, checkpoints, scripted, paced, capsys):
    talk = write_talk(tmp_path)
    assert main(["--no-vad", str(talk), "--srt", "--vtt", "--json", "--model", str(checkpoints("tiny"))]) == 0
    out = capsys.readouterr().out
    assert f"words timed by {checkpoints('aligner-tiny')}" in out
    doc = json.loads((tmp_path / "talk.json").read_text(encoding="utf-8"))
    assert sorted(s["text"] for s in doc["segments"]) == sorted(SAID)  # batches run longest first
    assert all(s["timing"] == "aligned" for s in doc["segments"])
    for s in doc["segments"]:
        assert [w["text"] for w in s["words"]] == s["text"].split()
        # (times in the JSON are rounded to the millisecond)
        assert all(s["start"] - 5e-4 <= w["start"] <= w["end"] <= s["end"] + 5e-4 for w in s["words"])
        assert len({w["start"] for w in s["words"]}) == len(s["words"])
    segments = segments_of(doc)
    # The cues of the files are the word cues of these segments, and keep every rule.
    cues = build_cues(segments, duration=doc["duration"])
    check_word_cues(cues, segments, CueOptions(), duration=doc["duration"])
    subs = list(srt.parse((tmp_path / "talk.srt").read_text(encoding="utf-8")))
    assert [(s.start.total_seconds(), s.end.total_seconds(), s.content) for s in subs] == [
        (c.start, c.end, c.text) for c in cues
    ]
    vtt = webvtt.read(str(tmp_path / "talk.vtt"))
    assert [c.text for c in vtt] == [c.text for c in cues]
    firsts = [w.start for seg in segments for w in seg.words]
    assert all(any(abs(c.start - t) < 1e-3 for t in firsts) for c in cues)  # each cue starts at a word


def test_highlighted_subtitles_underline_each_word_once(tmp_path, checkpoints, scripted, paced, capsys):
    talk = write_talk(tmp_path)
    args = [str(talk), "--srt", "--vtt", "--json", "--highlight-words", "--model", str(checkpoints("tiny"))]
    assert main(args) == 0
    capsys.readouterr()
    doc = json.loads((tmp_path / "talk.json").read_text(encoding="utf-8"))
    spoken = [w["text"] for s in doc["segments"] for w in s["words"]]
    subs = list(srt.parse((tmp_path / "talk.srt").read_text(encoding="utf-8")))
    underlined = [s.content.split("<u>")[1].split("</u>")[0] for s in subs if "<u>" in s.content]
    assert underlined == spoken
    assert all(a.end <= b.start for a, b in zip(subs, subs[1:]))
    # WebVTT the same way, as whisper writes it: one cue per word, that word underlined.
    vtt = [c.raw_text for c in webvtt.read(str(tmp_path / "talk.vtt"))]
    assert [c.split("<u>")[1].split("</u>")[0] for c in vtt if "<u>" in c] == spoken
    assert [c.replace("<u>", "").replace("</u>", "") for c in vtt] == [
        s.content.replace("<u>", "").replace("</u>", "") for s in subs
    ]


def test_an_unsupported_language_keeps_estimated_timing_and_says_so(
    tmp_path, checkpoints, monkeypatch, capsys
):
    from mlx_qwen3asr.checkpoints.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(checkpoints("tiny"))

    thai = script_batches(lambda prompt: tok.encode("language Thai<asr_text>สวัสดีครับ ยินดีที่ได้รู้จัก"))
    through_cli(monkeypatch, batch=thai.batch)
    talk = write_talk(tmp_path, 5.0)
    assert main(["--no-vad", str(talk), "--srt", "--json", "--model", str(checkpoints("tiny"))]) == 0
    err = capsys.readouterr().err
    doc = json.loads((tmp_path / "talk.json").read_text(encoding="utf-8"))
    assert [s["timing"] for s in doc["segments"]] == ["estimated"] and doc["segments"][0]["words"] == []
    assert doc["warnings"] == [
        "word timing is estimated for 1 segment(s): Thai is not among the aligner's languages"
    ]
    assert f"mlxasr: warning: {talk}: word timing is estimated for 1 segment(s)" in err


def test_a_named_aligner_that_does_not_load_is_a_usage_error(tmp_path, checkpoints, capsys):
    talk = write_talk(tmp_path, 3.0)
    missing = tmp_path / "no-such-aligner"
    assert (
        main(["--no-vad", str(talk), "--srt", "--model", str(checkpoints("tiny")), "--aligner", str(missing)])
        == 2
    )
    err = capsys.readouterr().err
    assert f"mlxasr: error: aligner {missing}: no such directory" in err
    asr = str(checkpoints("tiny"))
    assert main(["--no-vad", str(talk), "--srt", "--model", asr, "--aligner", asr]) == 2
    assert "this is a Qwen3-ASR speech recognition model; word timing needs" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["talk.wav"]  # nothing written


def test_the_default_aligner_missing_means_one_warning_and_estimated_timing(
    tmp_path, checkpoints, monkeypatch, capsys
):
    import huggingface_hub.constants as hf_constants

    monkeypatch.delenv("MLXASR_ALIGNER")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    talk = write_talk(tmp_path / "in", 3.0)
    assert main(["--no-vad", str(talk), "--srt", "--json", "--model", str(checkpoints("tiny"))]) == 0
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("mlxasr: warning: default aligner")]
    assert len(warnings) == 1 and warnings[0].startswith("mlxasr: warning: default aligner not cached, ")
    assert warnings[0].endswith(": cue times estimated; use --aligner PATH or --no-word-timestamps")
    doc = json.loads((tmp_path / "in" / "talk.json").read_text(encoding="utf-8"))
    assert doc["options"]["aligner"] is None and all(s["timing"] == "estimated" for s in doc["segments"])
    assert (tmp_path / "in" / "talk.srt").is_file()


def test_transcripts_alone_do_not_load_the_aligner(tmp_path, checkpoints, monkeypatch, capsys):
    loaded = []
    real_load = cli_models.load
    monkeypatch.setattr(
        cli_models, "load", lambda path, **kw: loaded.append(str(path)) or real_load(path, **kw)
    )
    talk = write_talk(tmp_path, 3.0)
    assert main(["--no-vad", str(talk), "--txt", "--json", "--model", str(checkpoints("tiny"))]) == 0
    assert loaded == [str(checkpoints("tiny"))]
    assert (
        main(["--no-vad", str(talk), "--srt", "--no-word-timestamps", "--model", str(checkpoints("tiny"))])
        == 0
    )
    assert loaded == [str(checkpoints("tiny"))] * 2
    capsys.readouterr()
    assert main(["--no-vad", str(talk), "--srt", "--no-word-timestamps", "--highlight-words"]) == 2
    assert "--highlight-words: needs word timing" in capsys.readouterr().err


def test_the_real_random_aligner_still_gives_valid_outputs(tmp_path, checkpoints, scripted, capsys):
    """Random aligner weights put words anywhere, often past the segment: times are clamped into it."""
    talk = write_talk(tmp_path)
    assert (
        main(
            [
                "--no-vad",
                str(talk),
                "--srt",
                "--vtt",
                "--json",
                "--highlight-words",
                "--model",
                str(checkpoints("tiny")),
            ]
        )
        == 0
    )
    capsys.readouterr()
    doc = json.loads((tmp_path / "talk.json").read_text(encoding="utf-8"))
    assert all(s["timing"] == "aligned" for s in doc["segments"])
    segments = segments_of(doc)
    cues = build_cues(segments, duration=doc["duration"])
    check_word_cues(cues, segments, CueOptions(), duration=doc["duration"])
    subs = list(srt.parse((tmp_path / "talk.srt").read_text(encoding="utf-8")))
    assert subs and all(a.end <= b.start for a, b in zip(subs, subs[1:]))
    assert subs[-1].end.total_seconds() <= doc["duration"] + 1e-3
    assert list(webvtt.read(str(tmp_path / "talk.vtt")))
