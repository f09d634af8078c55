"""library.export: a stored transcript in every format, each read back by its own parser."""

from __future__ import annotations

import csv
import html
import io
import json

import docx
import pytest
import srt
import webvtt

from mlx_qwen3asr.library.export import EXPORT_FORMATS, Exported, ExportError, export, markdown_escape
from mlx_qwen3asr.outputs.cue_types import format_timestamp
from mlx_qwen3asr.outputs.cues import CueOptions, build_cues
from mlx_qwen3asr.outputs.render import render, render_json, render_rttm, render_txt
from mlx_qwen3asr.pipeline.result import Segment, Transcription, Word

SPECIAL = "Look: [link](http://x) and *bold* _here_ <b>tag</b> `code` | a & b."


def _words(text: str, start: float, step: float) -> list[Word]:
    """Aligned words of a text with spaces, each `step` seconds long."""
    words, pos = [], 0
    for k, piece in enumerate(text.split(" ")):
        words.append(Word(piece, start + k * step, start + (k + 1) * step - 0.05, pos, pos + len(piece)))
        pos += len(piece) + 1
    return words


DIARIZED = Transcription(
    text="",
    language="English",
    segments=[
        Segment(
            0.5, 6.0, SPECIAL, "English", timing="aligned", words=_words(SPECIAL, 0.5, 0.4), speaker="Ann"
        ),
        Segment(6.0, 8.0, '=SUM(A1:A9), she said "twice".', "English", speaker="Ann"),
        Segment(8.0, 11.0, "你好，世界。", "Chinese", speaker="Bob"),
        Segment(11.0, 14.0, "今天天气很好。", "Chinese", speaker="Bob"),
        Segment(14.0, 20.0, "", ""),
        Segment(3700.0, 3703.5, "- not a list\n# nor a heading", "English", speaker="Ann"),
    ],
    duration=3710.0,
    source="/recordings/standup.wav",
    speakers=["Ann", "Bob"],
)
DIARIZED.text = " ".join(s.text for s in DIARIZED.segments if s.text)

PLAIN = Transcription(
    text="",
    language="Japanese",
    segments=[
        Segment(0.0, 4.0, "今日は良い天気ですね。", "Japanese"),
        Segment(
            4.0,
            7.0,
            "日本語 の テキスト。",
            "Japanese",
            timing="aligned",
            words=_words("日本語 の テキスト。", 4.2, 0.8),
        ),
        Segment(7.0, 9.0, "+1 555 0100, @home", "English"),
        Segment(3725.0, 3730.0, "1. First *point*", "English"),
    ],
    duration=3731.0,
    source=None,
)
PLAIN.text = " ".join(s.text for s in PLAIN.segments)

TRANSCRIPTS = {"diarized": DIARIZED, "plain": PLAIN}


def _cues(result: Transcription, options: CueOptions | None = None):
    return build_cues(result.segments, None, options=options, duration=result.duration)


def _spoken(result: Transcription) -> list[Segment]:
    return [s for s in result.segments if s.text.strip()]


def test_every_format_has_its_media_type_and_extension():
    assert EXPORT_FORMATS == ("txt", "srt", "vtt", "json", "rttm", "csv", "md", "docx")
    expected = {
        "txt": "text/plain; charset=utf-8",
        "srt": "application/x-subrip; charset=utf-8",
        "vtt": "text/vtt; charset=utf-8",
        "json": "application/json",
        "rttm": "text/plain; charset=utf-8",
        "csv": "text/csv; charset=utf-8",
        "md": "text/markdown; charset=utf-8",
        "docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    }
    for fmt in EXPORT_FORMATS:
        out = export(DIARIZED, fmt)
        assert isinstance(out, Exported)
        assert (out.media_type, out.extension) == (expected[fmt], fmt)
        assert isinstance(out.data, bytes) and out.data


@pytest.mark.parametrize("name", list(TRANSCRIPTS))
def test_txt_is_what_mlxasr_writes(name):
    result = TRANSCRIPTS[name]
    assert export(result, "txt").data == render_txt(result).encode("utf-8")
    custom = export(result, "txt", speaker_format="[{speaker}] ").data.decode("utf-8")
    assert custom == render_txt(result, speaker_format="[{speaker}] ")


@pytest.mark.parametrize("name", list(TRANSCRIPTS))
@pytest.mark.parametrize("highlight", [None, True])
def test_srt_reads_back_with_the_srt_package(name, highlight):
    result = TRANSCRIPTS[name]
    text = export(result, "srt", highlight_words=highlight).data.decode("utf-8")
    cues = _cues(result)
    assert text == render("srt", result, cues, highlight_words=highlight)
    subs = list(srt.parse(text))
    assert [s.index for s in subs] == list(range(1, len(subs) + 1))
    shown = "".join(s.content for s in subs).replace("\n", "")
    for seg in _spoken(result):
        for piece in seg.text.replace("\n", " ").split():
            assert piece.replace("<u>", "") in shown.replace("<u>", "").replace("</u>", "")
    if highlight:
        assert "<u>" in text and len(subs) > len(cues)
    else:
        assert len(subs) == len(cues)
        assert [(s.start.total_seconds(), s.end.total_seconds()) for s in subs] == [
            (c.start, c.end) for c in cues
        ]
    assert subs[-1].end.total_seconds() <= result.duration
    if result.speakers:
        assert subs[0].content.startswith("Ann: ")


@pytest.mark.parametrize("name", list(TRANSCRIPTS))
@pytest.mark.parametrize("highlight", [None, "karaoke"])
def test_vtt_reads_back_with_webvtt(name, highlight):
    result = TRANSCRIPTS[name]
    text = export(result, "vtt", highlight_words=highlight).data.decode("utf-8")
    cues = _cues(result)
    assert text == render("vtt", result, cues, highlight_words=highlight)
    captions = webvtt.from_buffer(io.StringIO(text)).captions
    assert len(captions) == len(cues)
    assert [(c.start, c.end) for c in captions] == [
        (format_timestamp(c.start, "."), format_timestamp(c.end, ".")) for c in cues
    ]
    assert [c.voice for c in captions] == [c.speaker for c in cues]
    shown = html.unescape("".join(c.text for c in captions).replace("\n", ""))
    for seg in _spoken(result):
        for piece in seg.text.split():
            assert piece in shown
    if highlight == "karaoke" and result is PLAIN:
        assert "日本語 <00:00:05.000>の <00:00:05.800>テキスト。" in text


@pytest.mark.parametrize("name", list(TRANSCRIPTS))
def test_json_is_render_json_of_the_same_cues(name):
    result = TRANSCRIPTS[name]
    options = {"language": None, "word_timestamps": True}
    data = export(result, "json", model="Qwen/Qwen3-ASR-1.7B", options=options).data
    assert data == render_json(result, _cues(result), model="Qwen/Qwen3-ASR-1.7B", options=options).encode()
    doc = json.loads(data)
    assert doc["model"] == "Qwen/Qwen3-ASR-1.7B" and doc["options"] == options
    assert [c["text"] for c in doc["cues"]] == [c.text for c in _cues(result)]
    back = Transcription.from_dict(doc)
    assert [(s.start, s.end, s.text, s.speaker) for s in back.segments] == [
        (s.start, s.end, s.text, s.speaker) for s in result.segments
    ]


def test_cue_options_cut_the_subtitles():
    narrow = CueOptions(max_width=12, max_lines=1)
    data = export(DIARIZED, "srt", cue_options=narrow).data.decode("utf-8")
    assert data == render("srt", DIARIZED, _cues(DIARIZED, narrow))
    assert len(list(srt.parse(data))) > len(list(srt.parse(export(DIARIZED, "srt").data.decode()))) + 3
    assert json.loads(export(DIARIZED, "json", cue_options=narrow).data)["cues"] == [
        c.to_dict() for c in _cues(DIARIZED, narrow)
    ]


def test_an_unknown_duration_does_not_cut_the_cues_short():
    result = Transcription(
        "hello there", "English", [Segment(1.0, 4.0, "hello there", "English")], duration=0.0
    )
    subs = list(srt.parse(export(result, "srt").data.decode("utf-8")))
    assert [(s.start.total_seconds(), s.end.total_seconds(), s.content) for s in subs] == [
        (1.0, 4.0, "hello there")
    ]


def test_rttm_needs_speakers():
    assert export(DIARIZED, "rttm").data.decode("utf-8") == render_rttm(DIARIZED)
    lines = export(DIARIZED, "rttm").data.decode("utf-8").splitlines()
    assert lines[0].split()[:5] == ["SPEAKER", "standup", "1", "0.500", "5.500"]
    assert {line.split()[7] for line in lines} == {"Ann", "Bob"}
    with pytest.raises(ExportError, match="this transcript has no speakers"):
        export(PLAIN, "rttm")
    assert issubclass(ExportError, ValueError)


def _csv_rows(data: bytes) -> list[list[str]]:
    assert data.startswith(b"\xef\xbb\xbf")
    text = data.decode("utf-8-sig")
    assert not text.startswith("\ufeff")
    return list(csv.reader(io.StringIO(text, newline="")))


@pytest.mark.parametrize("name", list(TRANSCRIPTS))
def test_csv_has_a_row_per_segment(name):
    result = TRANSCRIPTS[name]
    rows = _csv_rows(export(result, "csv").data)
    assert rows[0] == ["start", "end", "speaker", "text"]
    expected = []
    for seg in _spoken(result):
        text = " ".join(seg.text.split())
        if text[0] in "=+-@":
            text = "'" + text
        expected.append([f"{seg.start:.3f}", f"{seg.end:.3f}", seg.speaker or "", text])
    assert rows[1:] == expected


def test_csv_quotes_and_neutralises_formulas():
    rows = _csv_rows(export(DIARIZED, "csv").data)
    assert rows[2][3] == '\'=SUM(A1:A9), she said "twice".'
    assert rows[3][3] == "你好，世界。"
    assert rows[-1] == ["3700.000", "3703.500", "Ann", "'- not a list # nor a heading"]
    plain = _csv_rows(export(PLAIN, "csv").data)
    assert plain[3] == ["7.000", "9.000", "", "'+1 555 0100, @home"]
    hostile = Transcription(
        "",
        "English",
        [
            Segment(0.0, 1.0, "@SUM(1)", "English", speaker='=HYPERLINK("http://x")'),
            Segment(1.0, 2.0, "-2+3", "English", speaker="+Bob"),
            Segment(2.0, 3.0, "plain = fine", "English", speaker="@x"),
        ],
    )
    rows = _csv_rows(export(hostile, "csv").data)
    assert rows[1:] == [
        ["0.000", "1.000", '\'=HYPERLINK("http://x")', "'@SUM(1)"],
        ["1.000", "2.000", "'+Bob", "'-2+3"],
        ["2.000", "3.000", "'@x", "plain = fine"],
    ]


def test_markdown_of_speaker_turns():
    text = export(DIARIZED, "md", title="Stand-up *notes*").data.decode("utf-8")
    blocks = text.rstrip("\n").split("\n\n")
    assert blocks[0] == "# Stand-up \\*notes\\*"
    assert blocks[1].startswith("**Ann** [00:00]\\\nLook: \\[link\\](http://x) and \\*bold\\* \\_here\\_")
    assert "\\<b\\>tag\\</b\\>" in blocks[1] and "\\`code\\` \\| a \\& b." in blocks[1]
    assert '=SUM(A1:A9), she said "twice".' in blocks[1]
    # One turn per speaker: Bob's Chinese segments join without a space.
    assert blocks[2] == "**Bob** [00:08]\\\n你好，世界。今天天气很好。"
    assert blocks[3] == "**Ann** [1:01:40]\\\n\\- not a list \\# nor a heading"
    assert len(blocks) == 4
    assert "[link](" not in text and "*bold*" not in text


def test_markdown_without_speakers():
    text = export(PLAIN, "md").data.decode("utf-8")
    assert text.split("\n\n") == [
        "# Transcript",
        "[00:00] 今日は良い天気ですね。",
        "[00:04] 日本語 の テキスト。",
        "[00:07] \\+1 555 0100, @home",
        "[1:02:05] 1\\. First \\*point\\*\n",
    ]
    named = Transcription("x", "English", [Segment(0.0, 1.0, "x", "English")], source="/a/b/talk [1].wav")
    assert export(named, "md").data.decode().startswith("# talk \\[1\\]\n")


def test_markdown_renders_no_markup_from_the_transcript():
    markdown_it = pytest.importorskip("markdown_it")
    parser = markdown_it.MarkdownIt("commonmark").enable("table").enable("strikethrough")
    for result in TRANSCRIPTS.values():
        page = parser.render(export(result, "md", title="A [t](http://t) ~~x~~").data.decode("utf-8"))
        for tag in ("<a ", "<em>", "<b>", "<code>", "<ul>", "<ol>", "<h2>", "<table>", "<s>", "<del>"):
            assert tag not in page
        assert page.count("<strong>") == (3 if result is DIARIZED else 0)
        assert page.count("<h1>") == 1
    for line in ("- a", "+ a", "=", "1) a", "12. a", "# a", "> a", "```", "***", "<div>", "| a | b |"):
        rendered = parser.render("text\\\n" + markdown_escape(line))
        assert rendered.count("<p>") == 1 and "<h" not in rendered and "<li>" not in rendered, line


def _docx_paragraphs(data: bytes):
    document = docx.Document(io.BytesIO(data))
    return document, document.paragraphs


def test_docx_reads_back_with_python_docx():
    document, paragraphs = _docx_paragraphs(export(DIARIZED, "docx", title="Stand-up").data)
    assert document.core_properties.title == "Stand-up"
    assert paragraphs[0].text == "Stand-up" and paragraphs[0].style.name == "Title"
    body = "\n".join(p.text for p in paragraphs[1:])
    for seg in _spoken(DIARIZED):
        assert " ".join(seg.text.split()) in body
    bold = [r.text for p in paragraphs[1:] for r in p.runs if r.bold]
    assert bold == ["Ann", "Bob", "Ann"]
    assert paragraphs[2].text == "Bob  [00:08]\n你好，世界。今天天气很好。"
    assert paragraphs[3].text.startswith("Ann  [1:01:40]\n")


def test_docx_without_speakers():
    document, paragraphs = _docx_paragraphs(export(PLAIN, "docx").data)
    assert document.core_properties.title == "Transcript"
    assert [p.text for p in paragraphs] == [
        "Transcript",
        "[00:00] 今日は良い天気ですね。",
        "[00:04] 日本語 の テキスト。",
        "[00:07] +1 555 0100, @home",
        "[1:02:05] 1. First *point*",
    ]
    assert not any(r.bold for p in paragraphs for r in p.runs)


def test_docx_takes_text_xml_cannot_hold():
    result = Transcription(
        "", "English", [Segment(0.0, 1.0, "bell\x07 and \ufffe end", "English", speaker="A\x00")]
    )
    _, paragraphs = _docx_paragraphs(export(result, "docx", title="T\x01").data)
    assert [p.text for p in paragraphs] == ["T", "A  [00:00]\nbell and end"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"fmt": "pdf"}, "unknown export format 'pdf': use one of txt, srt, vtt, json, rttm, csv, md, docx"),
        ({"fmt": "srt", "highlight_words": "blink"}, "unknown highlight style 'blink'"),
        ({"fmt": "txt", "speaker_format": "Speaker: "}, "does not hold {speaker}"),
    ],
)
def test_bad_requests_raise_export_error(kwargs, message):
    with pytest.raises(ExportError) as info:
        export(DIARIZED, **kwargs)
    assert message in str(info.value)
