"""Document rendering (TXT, SRT, WebVTT, JSON) and atomic writes."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import stat

import pytest
import srt
import webvtt

from mlx_qwen3asr.outputs.cues import Cue
from mlx_qwen3asr.outputs.render import render, render_json, render_srt, render_txt, render_vtt
from mlx_qwen3asr.pipeline.transcribe import Segment, Transcription
from mlx_qwen3asr.runtime import atomic
from mlx_qwen3asr.runtime.atomic import atomic_write_files, atomic_write_text

CUES = [
    Cue(0.0, 2.5, "Hello <b>world</b> & friends,\nhow are you?"),
    Cue(2.5, 4.0, "你好，世界。"),
    Cue(3661.0, 3665.123, "An hour later."),
]

RESULT = Transcription(
    text="Hello world. 你好，世界。",
    language="English",
    segments=[
        Segment(0.0, 3.0, "Hello world.", "English"),
        Segment(3.0, 6.0, "", ""),
        Segment(
            6.0,
            9.0,
            "你好，世界。",
            "Chinese",
            truncated=True,
            avg_logprob=-0.4321987,
            no_speech_prob=0.0123456,
        ),
    ],
    duration=9.0,
    source="talk.wav",
)

VTT_TIMING = re.compile(r"^(\d{2,}):([0-5]\d):([0-5]\d)\.(\d{3}) --> (\d{2,}):([0-5]\d):([0-5]\d)\.(\d{3})$")


def test_srt_round_trips_through_the_srt_package():
    text = render_srt(CUES)
    assert srt.compose(srt.parse(text)) == text
    subs = list(srt.parse(text))
    assert [s.index for s in subs] == [1, 2, 3]
    assert subs[0].content == "Hello <b>world</b> & friends,\nhow are you?"
    assert subs[2].start.total_seconds() == 3661.0
    assert "01:01:05,123" in text
    assert render_srt([]) == ""


def test_vtt_passes_the_strict_parser(tmp_path):
    path = tmp_path / "x.vtt"
    path.write_text(render_vtt(CUES), encoding="utf-8")
    vtt = webvtt.read(str(path), strict=True)
    assert len(vtt.captions) == 3
    assert vtt.captions[0].lines == ["Hello &lt;b&gt;world&lt;/b&gt; &amp; friends,", "how are you?"]
    assert (vtt.captions[2].start, vtt.captions[2].end) == ("01:01:01.000", "01:01:05.123")
    text = path.read_text(encoding="utf-8")
    assert text.startswith("WEBVTT\n\n")
    assert all(VTT_TIMING.match(line) for line in text.splitlines() if "-->" in line)

    empty = tmp_path / "empty.vtt"
    empty.write_text(render_vtt([]), encoding="utf-8")
    assert webvtt.read(str(empty), strict=True).captions == []


def test_txt_has_one_paragraph_per_segment_with_text():
    assert render_txt(RESULT) == "Hello world.\n\n你好，世界。\n"
    assert render_txt(Transcription(text="", language="")) == ""


def test_json_holds_everything_and_keeps_non_ascii():
    doc_text = render_json(RESULT, CUES, model="tiny", options={"language": None, "max_line_width": 42})
    assert "你好" in doc_text  # ensure_ascii=False
    doc = json.loads(doc_text)
    assert doc["text"] == RESULT.text and doc["language"] == "English" and doc["duration"] == 9.0
    assert doc["truncated"] is True and doc["repetitive"] is False
    assert doc["segments"][2] == {
        "start": 6.0,
        "end": 9.0,
        "text": "你好，世界。",
        "language": "Chinese",
        "truncated": True,
        "repetitive": False,
        "timing": "estimated",
        "avg_logprob": -0.4322,
        "no_speech_prob": 0.01235,
        "words": [],
    }
    assert doc["cues"][0] == {"start": 0.0, "end": 2.5, "text": CUES[0].text}
    assert doc["model"] == "tiny" and doc["options"]["max_line_width"] == 42
    assert doc["source"] == "talk.wav"


def test_render_dispatches_and_rejects_unknown_formats():
    assert render("srt", RESULT, CUES) == render_srt(CUES)
    assert render("vtt", RESULT, CUES) == render_vtt(CUES)
    assert render("txt", RESULT, CUES) == render_txt(RESULT)
    with pytest.raises(ValueError, match="docx"):
        render("docx", RESULT, CUES)


def leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(atomic.TEMP_SUFFIX))


def test_atomic_write_replaces_the_file_with_normal_permissions(tmp_path):
    target = tmp_path / "a.srt"
    old_mask = os.umask(0o022)
    try:
        atomic_write_text(target, "first\n")
    finally:
        os.umask(old_mask)
    assert target.read_text(encoding="utf-8") == "first\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    atomic_write_text(target, "second ü\n")
    assert target.read_bytes() == "second ü\n".encode()
    assert leftovers(tmp_path) == []


def test_interrupt_between_files_leaves_whole_files_and_no_temporaries(tmp_path, monkeypatch):
    real_replace = os.replace
    calls = []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(atomic.os, "replace", replace)
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    b.write_text("old b\n", encoding="utf-8")
    with pytest.raises(KeyboardInterrupt):
        atomic_write_files({a: "new a\n", b: "new b\n"})
    assert a.read_text(encoding="utf-8") == "new a\n"
    assert b.read_text(encoding="utf-8") == "old b\n"
    assert leftovers(tmp_path) == []


def test_failure_while_writing_keeps_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "a.vtt"
    target.write_text("old\n", encoding="utf-8")

    def fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    with pytest.raises(OSError, match="No space"):
        atomic_write_text(target, "new\n")
    assert target.read_text(encoding="utf-8") == "old\n"
    assert leftovers(tmp_path) == []


def test_json_source_with_an_undecodable_file_name_is_still_valid_utf8(tmp_path):
    name = os.fsdecode(b"caf\xe9.wav")  # Latin-1 bytes in a file name on a UTF-8 system
    result = Transcription(text="", language="", source=name)
    text = render_json(result, [])
    atomic_write_text(tmp_path / "x.json", text)
    assert json.loads((tmp_path / "x.json").read_text(encoding="utf-8"))["source"] == "caf\ufffd.wav"


def test_ctrl_c_during_the_renames_is_held_until_the_set_is_complete(tmp_path, monkeypatch):
    real_replace = os.replace

    def replace(src, dst):
        signal.raise_signal(signal.SIGINT)  # to this thread: the handler runs before the next line
        real_replace(src, dst)

    monkeypatch.setattr(atomic.os, "replace", replace)
    a, b = tmp_path / "a.srt", tmp_path / "b.srt"
    # Python's own Ctrl-C handler, whatever earlier code in this process installed.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            atomic_write_files({a: "a\n", b: "b\n"})
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)
    assert a.read_text(encoding="utf-8") == "a\n" and b.read_text(encoding="utf-8") == "b\n"
    assert leftovers(tmp_path) == []


def test_the_temporary_name_fits_wherever_the_final_name_fits(tmp_path, monkeypatch):
    """On a file system with short names (eCryptfs takes 143 bytes), a file whose name fits is written:
    its temporary name is shortened to the folder's own limit."""
    limit = 143
    real_open = os.open

    def short_names_open(path, flags, *args, **kwargs):
        if len(os.fsencode(os.path.basename(path))) > limit:
            raise OSError(errno.ENAMETOOLONG, "File name too long", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(atomic.os, "pathconf", lambda path, name: limit)
    monkeypatch.setattr(atomic.os, "open", short_names_open)
    for stem in ("x" * 138, "音" * 45 + "x"):  # 143 bytes with ".json": ASCII, and 3-byte characters
        target = tmp_path / f"{stem}.json"
        assert len(os.fsencode(target.name)) <= limit
        atomic_write_text(target, "{}\n")
        assert target.read_text(encoding="utf-8") == "{}\n"
        name = atomic.temp_name(target.name, limit)
        assert len(os.fsencode(name)) <= limit and atomic.TEMP_PATTERN.fullmatch(name)
    assert leftovers(tmp_path) == []
