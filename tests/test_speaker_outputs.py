"""Speakers in every output: cues never span two speakers, SRT and TXT name the speaker where it changes,
WebVTT voice spans, JSON fields, RTTM; each document read back by a parser (srt, webvtt-py, json, and a
small RTTM reader). Without speakers every document is as before."""

from __future__ import annotations

import json

import numpy as np
import pytest
import srt
import webvtt

from mlx_qwen3asr.diarize import Turn, assign_speakers
from mlx_qwen3asr.outputs.cues import CueOptions, build_cues
from mlx_qwen3asr.outputs.folder import InputFile, TranscribeOptions, plan_jobs, write_outputs
from mlx_qwen3asr.outputs.render import (
    DEFAULT_SPEAKER_FORMAT,
    SPEAKER_FORMATS,
    render,
    render_rttm,
    render_srt,
    render_txt,
    render_vtt,
)
from mlx_qwen3asr.pipeline.result import Segment, Transcription, Word
from tools.sounds import RATE, espeak, trimmed


def aligned(text: str, times: list[tuple[float, float]], start: float, end: float) -> Segment:
    words, pos = [], 0
    for piece, (a, b) in zip(text.split(), times, strict=True):
        at = text.index(piece, pos)
        words.append(Word(piece, a, b, at, at + len(piece)))
        pos = at + len(piece)
    return Segment(start, end, text, "English", timing="aligned", words=words)


def spread(text: str, start: float, end: float) -> list[tuple[float, float]]:
    """Times for text's words, spread evenly over [start, end]."""
    n = len(text.split())
    step = (end - start) / n
    return [(start + k * step, start + (k + 0.8) * step) for k in range(n)]


TURNS = [Turn(0.0, 4.0, 0), Turn(4.2, 7.0, 1), Turn(6.8, 9.0, 0), Turn(9.5, 12.0, 1)]
FIRST = "Good morning everyone, welcome to the weekly meeting of the committee."
SECOND = "Thanks. I have two points today."
THIRD = "Go ahead, we are listening."


def diarized(names=None) -> Transcription:
    """Aligned words over three turns in one segment, an estimated segment, and the transcript after
    assign_speakers."""
    first = aligned(f"{FIRST} {SECOND}", spread(FIRST, 0.2, 3.8) + spread(SECOND, 4.3, 6.6), 0.0, 6.7)
    second = aligned(THIRD, spread(THIRD, 7.1, 8.8), 7.0, 9.0)
    third = Segment(9.6, 11.8, "Right, the budget first.", "English")
    result = Transcription(" ".join([first.text, second.text, third.text]), "English", [first, second, third])
    result.duration, result.source = 12.0, "/recordings/weekly talk.wav"
    return assign_speakers(result, TURNS, names=names)


EXPECTED = [  # (text, speaker) of the segments after assign_speakers
    (FIRST, "Speaker 1"),
    (SECOND, "Speaker 2"),
    (THIRD, "Speaker 1"),
    ("Right, the budget first.", "Speaker 2"),
]


def test_segments_are_cut_at_the_change_and_cues_never_span_two_speakers():
    result = diarized()
    assert [(s.text, s.speaker) for s in result.segments] == EXPECTED
    cues = build_cues(result.segments, duration=result.duration)
    assert cues and all(c.speaker in ("Speaker 1", "Speaker 2") for c in cues)
    for cue in cues:
        owners = [s for s in result.segments if s.start - 1e-3 <= cue.start and cue.end <= s.end + 1.0]
        assert owners and owners[0].speaker == cue.speaker, cue
        # The cue's words are its segment's, with its speaker.
        said = {w.text for s in result.segments if s.speaker == cue.speaker for w in s.words}
        assert all(w.text in said for w in cue.words)
    assert [c.speaker for c in cues][:1] == ["Speaker 1"] and cues[-1].speaker == "Speaker 2"
    # Cues follow the segments' order: the speakers change exactly where the segments' do.
    changes = [c.speaker for k, c in enumerate(cues) if k == 0 or c.speaker != cues[k - 1].speaker]
    assert changes == ["Speaker 1", "Speaker 2", "Speaker 1", "Speaker 2"]


def test_a_segment_with_words_of_two_speakers_is_cut_into_cues_of_one():
    """Segments labelled word by word, not through assign_speakers: the cue layout still cuts at the
    change, which is not a pause (the words run on)."""
    seg = aligned("one two three four five six", [(k * 0.3, k * 0.3 + 0.25) for k in range(6)], 0.0, 2.0)
    for k, w in enumerate(seg.words):
        w.speaker = "A" if k < 3 else "B"
    seg.speaker = "A"
    cues = build_cues([seg], duration=3.0, options=CueOptions(max_width=80))
    assert [(c.text, c.speaker) for c in cues] == [("one two three", "A"), ("four five six", "B")]
    plain = aligned("one two three four five six", [(k * 0.3, k * 0.3 + 0.25) for k in range(6)], 0.0, 2.0)
    assert [c.text for c in build_cues([plain], duration=3.0, options=CueOptions(max_width=80))] == [
        "one two three four five six"
    ]


def test_srt_names_the_speaker_where_it_changes():
    result = diarized()
    # One short line per cue: a speaker keeps talking over several cues.
    cues = build_cues(
        result.segments, duration=result.duration, options=CueOptions(max_width=24, max_lines=1)
    )
    subs = list(srt.parse(render_srt(cues)))
    assert len(subs) == len(cues)
    last, named = None, 0
    for sub, cue in zip(subs, cues):
        if cue.speaker != last:
            assert sub.content == f"{cue.speaker}: {cue.text}"
            named += 1
        else:
            assert sub.content == cue.text
        last = cue.speaker
    assert named == 4 and len(cues) > 8
    custom = list(srt.parse(render_srt(cues, speaker_format="[{speaker}] ")))
    assert custom[0].content.startswith("[Speaker 1] ")
    # Highlighted words: every block of a cue where the speaker changes carries the name.
    blocks = list(srt.parse(render_srt(cues, highlight_words=True)))
    assert len(blocks) > len(cues)
    assert all(b.content.startswith("Speaker 1: ") for b in blocks[: len(cues[0].words)])
    assert sum(b.content.startswith(("Speaker 1: ", "Speaker 2: ")) for b in blocks) >= 4


@pytest.mark.parametrize("bad", ["- ", "{name}: ", "{speaker!z}", "{0}"])
def test_a_speaker_format_without_its_field_is_refused(bad):
    with pytest.raises(ValueError, match="speaker format"):
        render_txt(diarized(), speaker_format=bad)


def test_vtt_voice_spans():
    result = diarized(names=["Ada <chair>", "Bob & co"])
    cues = build_cues(result.segments, duration=result.duration)
    for style in (None, "underline", "karaoke"):
        doc = webvtt.from_string(render_vtt(cues, highlight_words=style))
        captions = list(doc.captions)
        assert len(captions) >= len(cues)
        voices = {c.voice for c in captions}
        assert voices == {"Ada &lt;chair&gt;", "Bob &amp; co"}, style
        assert all(c.raw_text.startswith(f"<v {c.voice}>") for c in captions)
    plain = webvtt.from_string(render_vtt(cues))
    assert [c.text for c in plain.captions] == [
        c.text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") for c in cues
    ]


def test_txt_names_the_speaker_of_each_paragraph_where_it_changes():
    text = render_txt(diarized())
    assert text == (
        f"Speaker 1: {FIRST}\n\nSpeaker 2: {SECOND}\n\nSpeaker 1: {THIRD}\n\nSpeaker 2: Right, the budget first.\n"
    )
    # Two paragraphs of one speaker: the name once.
    result = diarized()
    result.segments[2].speaker = "Speaker 2"
    assert render_txt(result, speaker_format="{speaker} - ").startswith(
        f"Speaker 1 - {FIRST}\n\nSpeaker 2 - {SECOND}\n\n{THIRD}\n\n"
    )


def test_json_carries_speakers_on_segments_words_and_cues():
    result = diarized()
    result.segments[1].words[0].overlap = True
    cues = build_cues(result.segments, duration=result.duration)
    doc = json.loads(render("json", result, cues))
    assert doc["speakers"] == ["Speaker 1", "Speaker 2"]
    assert [(s["text"], s["speaker"]) for s in doc["segments"]] == EXPECTED
    assert all(s["overlap"] is False for s in doc["segments"])
    words = [w for s in doc["segments"] for w in s["words"]]
    assert words and all(set(w) == {"text", "start", "end", "speaker", "overlap"} for w in words)
    assert [w["overlap"] for w in doc["segments"][1]["words"]][:2] == [True, False]
    assert all(w["speaker"] == s["speaker"] for s in doc["segments"] for w in s["words"])
    assert [c["speaker"] for c in doc["cues"]] == [c.speaker for c in cues]


def read_rttm(text: str) -> list[tuple[str, float, float, str]]:
    rows = []
    for line in text.splitlines():
        fields = line.split(" ")
        assert len(fields) == 10 and fields[0] == "SPEAKER" and fields[2] == "1", line
        assert fields[5:7] == ["<NA>", "<NA>"] and fields[8:] == ["<NA>", "<NA>"], line
        rows.append((fields[1], float(fields[3]), float(fields[4]), fields[7]))
    return rows


def test_rttm_output():
    assert SPEAKER_FORMATS == ("rttm",)
    result = diarized(names=["Ada Lovelace", "Bob"])
    rows = read_rttm(render("rttm", result, []))
    assert [(f, s) for f, _, _, s in rows] == [
        ("weekly_talk", "Ada_Lovelace"),
        ("weekly_talk", "Bob"),
        ("weekly_talk", "Ada_Lovelace"),
        ("weekly_talk", "Bob"),
    ]
    assert [round(start, 3) for _, start, _, _ in rows] == [round(s.start, 3) for s in result.segments]
    assert all(d > 0 for _, _, d, _ in rows)
    assert read_rttm(render_rttm(result, file_id="x"))[0][0] == "x"
    undiarized = Transcription("hi", "English", [Segment(0, 1, "hi", "English")])
    assert render("rttm", undiarized, []) == ""
    with pytest.raises(ValueError, match="use one of txt, srt, vtt, json, rttm"):
        render("ass", undiarized, [])


def test_without_speakers_nothing_changes():
    result = diarized()
    plain = Transcription(
        result.text,
        "English",
        [
            Segment(
                s.start,
                s.end,
                s.text,
                s.language,
                timing=s.timing,
                words=[Word(w.text, w.start, w.end, w.char_start, w.char_end) for w in s.words],
            )
            for s in result.segments
        ],
        duration=result.duration,
    )
    cues = build_cues(plain.segments, duration=plain.duration)
    assert all(c.speaker is None for c in cues)
    doc = json.loads(render("json", plain, cues))
    assert "speakers" not in doc
    assert all("speaker" not in s and "overlap" not in s for s in doc["segments"])
    assert all(set(w) == {"text", "start", "end"} for s in doc["segments"] for w in s["words"])
    assert all(set(c) == {"start", "end", "text"} for c in doc["cues"])
    for fmt in ("txt", "srt", "vtt"):
        text = render(fmt, plain, cues, speaker_format="{speaker} says ")
        assert "Speaker" not in text and "<v" not in text and " says " not in text
    # The diarized cues are the same cues with a speaker.
    assert [(c.start, c.end, c.text) for c in build_cues(result.segments, duration=12.0)] == [
        (c.start, c.end, c.text) for c in cues
    ]


def test_two_voices_alternating_written_and_read_back(tmp_path):
    """Two espeak-ng voices take turns (known times); a stand-in diarizer gives those turns; the file's
    outputs, written as mlxasr writes them, say who said what."""
    lines = [
        ("en", "The committee will meet again on Thursday."),
        ("en-us+f3", "Please remember to bring your notebook."),
        ("en", "Thank you, that is all for today."),
    ]
    gap = np.zeros(int(0.6 * RATE), np.float32)
    parts, spans, pos = [gap], [], gap.size
    for voice, text in lines:
        speech = trimmed(espeak(voice, text))
        spans.append((pos / RATE, (pos + speech.size) / RATE))
        parts += [speech, gap]
        pos += speech.size + gap.size
    audio = np.concatenate(parts)
    turns = [Turn(a, b, 0 if voice == "en" else 1) for (a, b), (voice, _) in zip(spans, lines)]
    # One aligned segment over the first two sentences (words spread over each), one estimated segment.
    (a0, b0), (a1, b1), (a2, b2) = spans
    first = aligned(
        f"{lines[0][1]} {lines[1][1]}",
        spread(lines[0][1], a0, b0) + spread(lines[1][1], a1, b1),
        0.0,
        b1 + 0.3,
    )
    result = Transcription(
        " ".join(t for _, t in lines),
        "English",
        [first, Segment(a2 - 0.1, b2 + 0.1, lines[2][1], "English")],
        duration=audio.size / RATE,
    )
    result = assign_speakers(result, turns, names=["Chair", "Guest"])
    talk = tmp_path / "talk.wav"
    talk.write_bytes(b"")  # the input file (not read: its samples are given)
    (job,) = plan_jobs([InputFile(talk)], ["txt", "srt", "vtt", "json", "rttm"])
    written = write_outputs(job, result, audio, TranscribeOptions(speaker_format="{speaker}: "))
    assert sorted(p.suffix for p in written.written) == [".json", ".rttm", ".srt", ".txt", ".vtt"]

    said = [("Chair", lines[0][1]), ("Guest", lines[1][1]), ("Chair", lines[2][1])]
    assert (tmp_path / "talk.txt").read_text() == "".join(f"{w}: {t}\n\n" for w, t in said)[:-1]
    doc = json.loads((tmp_path / "talk.json").read_text())
    assert doc["speakers"] == ["Chair", "Guest"] and doc["options"]["speaker_format"] == "{speaker}: "
    assert [(s["speaker"], s["text"]) for s in doc["segments"]] == said
    rows = read_rttm((tmp_path / "talk.rttm").read_text())
    assert [(f, s) for f, _, _, s in rows] == [("talk", "Chair"), ("talk", "Guest"), ("talk", "Chair")]
    for (_, start, duration, _), (a, b) in zip(rows, spans):
        assert a - 0.7 <= start and start + duration <= b + 0.7  # each line over its voice's turn
    subs = list(srt.parse((tmp_path / "talk.srt").read_text()))
    captions = list(webvtt.from_string((tmp_path / "talk.vtt").read_text()).captions)
    assert len(subs) == len(captions) >= 3
    for sub, caption in zip(subs, captions):
        start = sub.start.total_seconds()
        voice = "Chair" if start < a1 - 0.3 or start > a2 - 0.3 else "Guest"
        assert caption.voice == voice, (start, caption.raw_text)
    named = [s.content.split(": ", 1)[0] for s in subs if s.content.startswith(("Chair: ", "Guest: "))]
    assert named == ["Chair", "Guest", "Chair"]


def test_default_speaker_format():
    assert DEFAULT_SPEAKER_FORMAT == "{speaker}: "
    assert render("txt", diarized(), []).startswith("Speaker 1: ")


def test_one_speaker_label_in_the_writers_and_in_openais_convention():
    """The writers say "Speaker N" (from 1), the server's diarized_json OpenAI's letters; names come
    first in both."""
    from mlx_qwen3asr.diarize import speaker_label
    from mlx_qwen3asr.serve.openai import openai_speaker

    assert [speaker_label(k) for k in (0, 1, 9)] == ["Speaker 1", "Speaker 2", "Speaker 10"]
    assert [speaker_label(k, letters=True) for k in (0, 1, 25, 26, 27, 701, 702)] == [
        "A", "B", "Z", "AA", "AB", "ZZ", "AAA",
    ]  # fmt: skip
    assert speaker_label(1, ["Ana", "Bo"]) == speaker_label(1, ["Ana", "Bo"], letters=True) == "Bo"
    order: dict = {}
    segments = [Segment(0.0, 1.0, "a", "English", speaker=s) for s in (7, 3, 7, None)]
    assert [openai_speaker(s, order, ("Ana",)) for s in segments] == ["Ana", "B", "Ana", ""]
