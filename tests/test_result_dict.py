"""Transcription.from_dict: reading back to_dict() field for field, and the JSON output of `mlxasr --json`."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pytest

from mlx_qwen3asr.outputs.cues import build_cues
from mlx_qwen3asr.outputs.render import render_json
from mlx_qwen3asr.pipeline.result import Segment, Transcription, Word

# Every field of every dataclass, in every segment and word, differs from its default (checked by
# test_the_full_transcription_sets_every_field_to_a_non_default_value). The words that start the
# segments are left untimed so that no span starts at 0, char_start's default.
FULL = Transcription(
    text="Oh, hello world. 嗯，你好。",
    language="English",
    segments=[
        Segment(
            start=0.25,
            end=2.5,
            text="Oh, hello world.",
            language="English",
            truncated=True,
            repetitive=True,
            timing="aligned",
            words=[
                Word("hello", 0.3, 0.9, char_start=4, char_end=9, speaker="Speaker 1", overlap=True),
                Word("world.", 1.1, 2.2, char_start=10, char_end=16, speaker="Speaker 2", overlap=True),
            ],
            avg_logprob=-0.4321987,
            no_speech_prob=0.0123456,
            speaker="Speaker 1",
            overlap=True,
        ),
        Segment(
            start=2.5,
            end=4.75,
            text="嗯，你好。",
            language="Chinese",
            truncated=True,
            repetitive=True,
            timing="aligned",
            words=[Word("你好。", 2.6, 3.9, char_start=2, char_end=5, speaker="Speaker 2", overlap=True)],
            avg_logprob=-1.5,
            no_speech_prob=0.25,
            speaker="Speaker 2",
            overlap=True,
        ),
    ],
    duration=5.125,
    source="talks/meeting.wav",
    warnings=["the file decodes to 5.1 s of audio; its header states 9.0 s"],
    header_duration=9.0,
    speech=[(0.2, 2.6), (2.6, 4.8)],
    speakers=["Speaker 1", "Speaker 2"],
)


def _defaults_kept(obj: Any, where: str) -> list[str]:
    """The fields of a dataclass that keep their default, or (required fields) are empty or zero."""
    kept = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = None
        if value == default or (default is None and value in ("", 0, 0.0, [], None)):
            kept.append(f"{where}.{f.name}")
    return kept


def test_the_full_transcription_sets_every_field_to_a_non_default_value():
    kept = _defaults_kept(FULL, "transcription")
    for i, seg in enumerate(FULL.segments):
        kept += _defaults_kept(seg, f"segments[{i}]")
        for k, word in enumerate(seg.words):
            kept += _defaults_kept(word, f"segments[{i}].words[{k}]")
    assert kept == []


def test_to_dict_reads_back_field_for_field():
    back = Transcription.from_dict(FULL.to_dict())
    assert back == FULL
    assert all(type(r) is tuple for r in back.speech)
    assert back.segments[0].words[1] == FULL.segments[0].words[1]
    # Through JSON text too: tuples become lists there, and read back as tuples.
    again = Transcription.from_dict(json.loads(json.dumps(FULL.to_dict())))
    assert again == FULL
    assert again.speech == [(0.2, 2.6), (2.6, 4.8)]
    assert back is not FULL and back.segments is not FULL.segments


def test_defaults_read_back():
    plain = Transcription("hi", "English", [Segment(0.0, 1.0, "hi", "English")])
    assert Transcription.from_dict(plain.to_dict()) == plain
    assert Transcription.from_dict({"text": "", "language": ""}) == Transcription("", "")


def test_word_and_segment_from_dict():
    word = FULL.segments[0].words[0]
    assert Word.from_dict(dataclasses.asdict(word)) == word
    assert Word.from_dict({"text": "a", "start": 1, "end": 2, "extra": [1]}) == Word("a", 1.0, 2.0)
    seg = FULL.segments[1]
    assert Segment.from_dict({**dataclasses.asdict(seg), "id": "seg_1"}) == seg
    read = Segment.from_dict({"start": 0, "end": 1, "text": "x", "language": "English"})
    assert read == Segment(0.0, 1.0, "x", "English")
    assert isinstance(read.start, float) and read.timing == "estimated" and read.words == []


def _json_document() -> tuple[str, list]:
    cues = build_cues(FULL.segments, None, duration=FULL.duration)
    options = {"language": None, "word_timestamps": True}
    return render_json(FULL, cues, model="Qwen/Qwen3-ASR-0.6B", options=options), cues


def test_reads_the_json_output_back():
    document, cues = _json_document()
    doc = json.loads(document)
    assert {"cues", "model", "options", "audio_truncated", "truncated"} <= set(doc)
    for k, seg in enumerate(doc["segments"]):
        seg["id"] = f"seg_{k}"  # as the library stores them
    back = Transcription.from_dict(doc)
    # The JSON output leaves out the words' spans and rounds probabilities to 4 significant digits.
    expected = dataclasses.replace(
        FULL,
        segments=[
            dataclasses.replace(
                s,
                words=[dataclasses.replace(w, char_start=0, char_end=0) for w in s.words],
                avg_logprob=float(f"{s.avg_logprob:.4g}"),
                no_speech_prob=float(f"{s.no_speech_prob:.4g}"),
            )
            for s in FULL.segments
        ],
    )
    assert back == expected
    assert back.speech == [(0.2, 2.6), (2.6, 4.8)]
    assert back.header_duration == 9.0 and back.audio_truncated
    # What is read back writes the same document again.
    assert render_json(back, cues, model=doc["model"], options=doc["options"]) == document


def test_json_without_speakers_or_speech():
    plain = Transcription("hi", "English", [Segment(0.0, 1.0, "hi", "English")], duration=1.0)
    doc = json.loads(render_json(plain, []))
    assert "speakers" not in doc and doc["speech"] is None
    assert Transcription.from_dict(doc) == plain


def test_a_null_probability_reads_as_nan():
    doc = json.loads(_json_document()[0])
    doc["segments"][0]["avg_logprob"] = None
    doc["segments"][0]["no_speech_prob"] = None
    seg = Transcription.from_dict(doc).segments[0]
    assert math.isnan(seg.avg_logprob) and math.isnan(seg.no_speech_prob)


def _full_dict() -> dict[str, Any]:
    return FULL.to_dict()


@pytest.mark.parametrize(
    ("change", "field_name"),
    [
        (lambda d: d.pop("text"), "text: missing"),
        (lambda d: d.update(language=None), "language"),
        (lambda d: d.update(duration=None), "duration"),
        (lambda d: d.update(duration=True), "duration"),
        (lambda d: d.update(duration="5.0"), "duration"),
        (lambda d: d.update(header_duration="long"), "header_duration"),
        (lambda d: d.update(source=3), "source"),
        (lambda d: d.update(warnings="one"), "warnings"),
        (lambda d: d.update(warnings=["ok", 2]), "warnings[1]"),
        (lambda d: d.update(speakers=[None]), "speakers[0]"),
        (lambda d: d.update(speech=[[0.0, 1.0, 2.0]]), "speech[0]"),
        (lambda d: d.update(speech=[[0.0, None]]), "speech[0][1]"),
        (lambda d: d.update(segments={"start": 0}), "segments"),
        (lambda d: d.update(segments=[1]), "segments[0]"),
        (lambda d: d["segments"][1].update(start=None), "segments[1].start"),
        (lambda d: d["segments"][0].pop("end"), "segments[0].end: missing"),
        (lambda d: d["segments"][0].update(truncated="yes"), "segments[0].truncated"),
        (lambda d: d["segments"][0].update(timing=None), "segments[0].timing"),
        (lambda d: d["segments"][0].update(speaker=1), "segments[0].speaker"),
        (lambda d: d["segments"][0].update(words=None), "segments[0].words"),
        (lambda d: d["segments"][0]["words"][1].update(start=None), "segments[0].words[1].start"),
        (lambda d: d["segments"][0]["words"][0].update(char_end=2.5), "segments[0].words[0].char_end"),
        (lambda d: d["segments"][0]["words"][0].update(overlap=None), "segments[0].words[0].overlap"),
        (lambda d: d["segments"][0]["words"][0].pop("text"), "segments[0].words[0].text: missing"),
    ],
)
def test_bad_input_names_the_field(change, field_name):
    d = _full_dict()
    change(d)
    with pytest.raises(ValueError) as info:
        Transcription.from_dict(d)
    assert str(info.value).startswith(field_name)


def test_not_a_mapping():
    with pytest.raises(ValueError, match="transcription: expected an object"):
        Transcription.from_dict(["text"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="word: expected an object"):
        Word.from_dict(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"segment\.start: expected a number"):
        Segment.from_dict({"start": None, "end": 1.0, "text": "", "language": ""})
