"""A stored transcript exported as a document: TXT, SRT, WebVTT, JSON, RTTM, CSV, Markdown or DOCX.

TXT, SRT, WebVTT, JSON and RTTM are written by the same writers as `mlxasr`'s output files
(outputs.render), from cues cut by the same rules (outputs.cues.build_cues). A stored transcript has
no audio beside it, so the cues of segments without timed words span their whole segment and their
boundaries stay where the text's length puts them, as build_cues does when it is given no audio.
CSV, Markdown and DOCX are for people: a spreadsheet row per segment, and a paragraph per speaker turn.
"""

from __future__ import annotations

import csv
import io
import math
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from mlx_qwen3asr.outputs.cue_types import to_milliseconds
from mlx_qwen3asr.outputs.cues import Cue, CueOptions, build_cues
from mlx_qwen3asr.outputs.render import (
    DEFAULT_SPEAKER_FORMAT,
    HIGHLIGHT_STYLES,
    check_speaker_format,
    render,
)
from mlx_qwen3asr.outputs.wrapping import clean_text
from mlx_qwen3asr.pipeline.result import Segment, Transcription

__all__ = [
    "EXPORT_FORMATS",
    "MEDIA_TYPES",
    "ExportError",
    "Exported",
    "export",
    "markdown_escape",
    "render_csv",
    "render_docx",
    "render_markdown",
    "transcript_cues",
]

# The formats written by outputs.render, as `mlxasr` writes them, then those written here.
_RENDERED: tuple[str, ...] = ("txt", "srt", "vtt", "json", "rttm")
EXPORT_FORMATS: tuple[str, ...] = (*_RENDERED, "csv", "md", "docx")

MEDIA_TYPES: dict[str, str] = {
    "txt": "text/plain; charset=utf-8",
    "srt": "application/x-subrip; charset=utf-8",
    "vtt": "text/vtt; charset=utf-8",
    "json": "application/json",
    "rttm": "text/plain; charset=utf-8",
    "csv": "text/csv; charset=utf-8",
    "md": "text/markdown; charset=utf-8",
    "docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
}

_DEFAULT_TITLE = "Transcript"
_UNNAMED = "Unnamed speaker"  # a speaker whose label is blank
# A spreadsheet reads a cell starting with one of these as a formula (or its start).
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
# Characters with a meaning anywhere in Markdown text (CommonMark and GitHub's extensions: tables,
# strikethrough, math), escaped with a backslash.
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>#|~&$])")
# At the start of a line: list markers, setext underlines and ordered-list numbers ("1." or "1)").
_MD_ORDERED_START = re.compile(r"^(\d{1,9})([.)])")


class ExportError(ValueError):
    """A transcript cannot be exported as asked: an unknown format, a bad option, or RTTM of a
    transcript without speakers."""


@dataclass(frozen=True)
class Exported:
    """An exported document: its bytes, its media type (for a Content-Type header) and the extension of
    its file name (without the dot)."""

    data: bytes
    media_type: str
    extension: str


def export(
    result: Transcription,
    fmt: str,
    *,
    title: str | None = None,
    model: str | None = None,
    options: Mapping[str, Any] | None = None,
    highlight_words: bool | str | None = None,
    speaker_format: str = DEFAULT_SPEAKER_FORMAT,
    cue_options: CueOptions | None = None,
) -> Exported:
    """The transcript as a document of format fmt, one of EXPORT_FORMATS.

    title: the heading and document title of Markdown and DOCX (default: the source's file name without
    its extension, or "Transcript"). model and options: what JSON records as the model and the options
    of the transcription. highlight_words (True, or a style of outputs.render.HIGHLIGHT_STYLES) marks the
    spoken word in SRT and WebVTT cues; speaker_format is how TXT and SRT name the speaker where it
    changes. cue_options: the limits subtitle cues are cut to (default CueOptions()).
    Raises ExportError (a ValueError) for an unknown format or a bad option, and for RTTM of a
    transcript without speakers.
    """
    if fmt not in EXPORT_FORMATS:
        raise ExportError(f"unknown export format {fmt!r}: use one of {', '.join(EXPORT_FORMATS)}")
    if not (
        highlight_words is None or isinstance(highlight_words, bool) or highlight_words in HIGHLIGHT_STYLES
    ):
        raise ExportError(
            f"unknown highlight style {highlight_words!r}: use one of {', '.join(HIGHLIGHT_STYLES)}"
        )
    try:
        check_speaker_format(speaker_format)
    except ValueError as e:
        raise ExportError(str(e)) from None
    if fmt == "rttm" and not any(s.speaker is not None for s in result.segments):
        raise ExportError("this transcript has no speakers")
    if fmt in _RENDERED:
        cues = transcript_cues(result, cue_options) if fmt in ("srt", "vtt", "json") else []
        text = render(
            fmt,
            result,
            cues,
            model=model,
            options=options,
            highlight_words=highlight_words,
            speaker_format=speaker_format,
        )
        data = _utf8(text)
    elif fmt == "csv":
        data = render_csv(result)
    elif fmt == "md":
        data = _utf8(render_markdown(result, _title(result, title)))
    else:
        data = render_docx(result, _title(result, title))
    return Exported(data, MEDIA_TYPES[fmt], fmt)


def transcript_cues(result: Transcription, options: CueOptions | None = None) -> list[Cue]:
    """The subtitle cues of a stored transcript (build_cues without the audio), none ending after the
    transcript's duration when that is known (a positive, finite number)."""
    duration = result.duration if math.isfinite(result.duration) and result.duration > 0 else None
    return build_cues(result.segments, None, options=options, duration=duration)


def _utf8(text: str) -> bytes:
    """The text in UTF-8; a character UTF-8 cannot hold (a lone surrogate) becomes '?'."""
    return text.encode("utf-8", "replace")


def _title(result: Transcription, title: str | None) -> str:
    """The given title on one line, else the source's file name without its extension, else the default."""
    if title is not None and clean_text(title):
        return clean_text(title)
    source = result.source
    if source and source != "-":
        stem = clean_text(PurePath(source).stem.encode("utf-8", "surrogateescape").decode("utf-8", "replace"))
        if stem:
            return stem
    return _DEFAULT_TITLE


# --- CSV ----------------------------------------------------------------------------------------


def _seconds(value: float) -> str:
    """Seconds with three decimals (whole milliseconds, rounded half up); empty for a time not finite."""
    try:
        ms = to_milliseconds(value)
    except (TypeError, ValueError):
        return ""
    return f"{ms // 1000}.{ms % 1000:03d}"


def _cell(text: str) -> str:
    """A text cell that a spreadsheet shows as text: one starting like a formula gets a leading apostrophe."""
    return "'" + text if text.startswith(_FORMULA_STARTS) else text


def render_csv(result: Transcription) -> bytes:
    """CSV: a header row `start,end,speaker,text`, then a row per segment with text (times in seconds
    with three decimals, the speaker's label or empty, the text on one line), quoted where needed.

    UTF-8 with a byte order mark, so that spreadsheet programs (Excel) read non-ASCII text as UTF-8;
    rows end in CRLF (RFC 4180). A text or speaker cell that starts like a formula (=, +, -, @, tab or
    carriage return) gets a leading apostrophe, so that opening the file runs nothing.
    """
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["start", "end", "speaker", "text"])
    for seg in result.segments:
        text = clean_text(seg.text)
        if not text:
            continue
        speaker = "" if seg.speaker is None else _cell(clean_text(seg.speaker))
        writer.writerow([_seconds(seg.start), _seconds(seg.end), speaker, _cell(text)])
    return _utf8("\ufeff" + out.getvalue())


# --- paragraphs: Markdown and DOCX --------------------------------------------------------------


@dataclass
class _Paragraph:
    """A speaker's turn (consecutive segments of one speaker), or a segment without a speaker."""

    speaker: str | None
    start: float
    texts: list[str]


def _paragraphs(segments: Sequence[Segment]) -> list[_Paragraph]:
    """The segments with text as paragraphs: a turn per speaker, a paragraph per segment without one."""
    out: list[_Paragraph] = []
    for seg in segments:
        text = clean_text(seg.text)
        if not text:
            continue
        speaker = None if seg.speaker is None else clean_text(seg.speaker) or _UNNAMED
        if speaker is not None and out and out[-1].speaker == speaker:
            out[-1].texts.append(text)
        else:
            out.append(_Paragraph(speaker, seg.start, [text]))
    return out


def _spaced(ch: str) -> bool:
    """Whether a script puts spaces between words: not Chinese, Japanese or fullwidth punctuation (wide
    characters), but Korean (Hangul) does."""
    if unicodedata.east_asian_width(ch) not in ("W", "F"):
        return True
    return unicodedata.name(ch, "").startswith("HANGUL")


def _joined(texts: Sequence[str]) -> str:
    """Texts of one turn as one: a space between two, unless both sides are of a script without spaces."""
    out = texts[0]
    for text in texts[1:]:
        out += (" " if _spaced(out[-1]) or _spaced(text[0]) else "") + text
    return out


def _clock(seconds: float) -> str | None:
    """mm:ss, or h:mm:ss from an hour on (whole seconds, rounded down); None for a time not finite."""
    if not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
        return None
    total = max(0, int(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def markdown_escape(text: str) -> str:
    """Text on one line that Markdown shows as it is: characters with a meaning (emphasis, links, code,
    HTML, tables, headings) are backslash-escaped, and so is a start that would open a list, a heading
    underline or a numbered list."""
    text = _MD_SPECIAL.sub(r"\\\1", clean_text(text))
    if text.startswith(("+", "-", "=")):
        return "\\" + text
    return _MD_ORDERED_START.sub(r"\1\\\2", text)


def render_markdown(result: Transcription, title: str) -> str:
    """Markdown: `# title`, then a paragraph per speaker turn, `**Speaker** [mm:ss]` and a hard line
    break before the turn's text; without a speaker, a paragraph per segment, `[mm:ss] text`. Times are
    when the paragraph starts ([h:mm:ss] from an hour on). The text is escaped (markdown_escape): a
    transcript cannot add formatting, links or HTML."""
    blocks = [f"# {markdown_escape(title)}"]
    for p in _paragraphs(result.segments):
        clock = _clock(p.start)
        stamp = f"[{clock}]" if clock is not None else ""
        text = markdown_escape(_joined(p.texts))
        if p.speaker is not None:
            head = f"**{markdown_escape(p.speaker)}**" + (f" {stamp}" if stamp else "")
            blocks.append(f"{head}\\\n{text}")
        else:
            blocks.append(f"{stamp} {text}" if stamp else text)
    return "\n\n".join(blocks) + "\n"


def _xml_text(text: str) -> str:
    """Text on one line that XML can hold: control characters, surrogates, U+FFFE and U+FFFF become
    spaces, and runs of spaces one."""
    kept = (" " if unicodedata.category(ch) in ("Cc", "Cs") or ch in "\ufffe\uffff" else ch for ch in text)
    return " ".join("".join(kept).split())


def render_docx(result: Transcription, title: str) -> bytes:
    """DOCX (Word): the title as the document's title heading and in its properties, then paragraphs as
    in the Markdown: a turn starts with the speaker in bold and its time, then a line break and the
    text; a segment without a speaker reads `[mm:ss] text`."""
    import docx

    document = docx.Document()
    properties = document.core_properties
    properties.title = _xml_text(title)
    properties.comments = ""
    document.add_heading(_xml_text(title), level=0)
    for p in _paragraphs(result.segments):
        clock = _clock(p.start)
        text = _xml_text(_joined(p.texts))
        paragraph = document.add_paragraph()
        if p.speaker is not None:
            paragraph.add_run(_xml_text(p.speaker)).bold = True
            if clock is not None:
                paragraph.add_run(f"  [{clock}]")
            paragraph.add_run().add_break()
            paragraph.add_run(text)
        else:
            paragraph.add_run(f"[{clock}] {text}" if clock is not None else text)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()
