"""Transcript documents: plain text, SubRip, WebVTT and JSON."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, is_dataclass
from pathlib import PurePath
from typing import Any

from mlx_qwen3asr.diarize import rttm_lines
from mlx_qwen3asr.outputs.cue_types import Cue, format_timestamp, to_milliseconds
from mlx_qwen3asr.outputs.wrapping import clean_text
from mlx_qwen3asr.pipeline.transcribe import Transcription

__all__ = [
    "DEFAULT_SPEAKER_FORMAT",
    "FORMATS",
    "HIGHLIGHT_STYLES",
    "SPEAKER_FORMATS",
    "render",
    "render_json",
    "render_rttm",
    "render_srt",
    "render_txt",
    "render_vtt",
    "rttm_file_id",
    "segment_json",
    "srt_blocks",
    "txt_paragraphs",
    "vtt_blocks",
]

FORMATS: tuple[str, ...] = ("txt", "srt", "vtt", "json")
# Formats that only speaker diarization fills: RTTM, who spoke when, as diarization tools write it.
SPEAKER_FORMATS: tuple[str, ...] = ("rttm",)
# How TXT and SRT name the speaker where it changes ({speaker}: its label, "Speaker 1" or a given name).
DEFAULT_SPEAKER_FORMAT = "{speaker}: "
# How subtitles show the word being spoken: "underline" repeats a cue once per word with that word in
# <u>...</u> (SRT and WebVTT, as whisper writes them); "karaoke" tags each word's time in WebVTT
# (<HH:MM:SS.mmm>) and underlines in SRT, which has no such tags.
HIGHLIGHT_STYLES: tuple[str, ...] = ("underline", "karaoke")


def _highlight_style(highlight_words: bool | str | None) -> str | None:
    """The style asked for: None or False for none, True for "underline", or one of HIGHLIGHT_STYLES."""
    if highlight_words is None or highlight_words is False:
        return None
    if highlight_words is True:
        return HIGHLIGHT_STYLES[0]
    if highlight_words not in HIGHLIGHT_STYLES:
        raise ValueError(
            f"unknown highlight style {highlight_words!r}: use one of {', '.join(HIGHLIGHT_STYLES)}"
        )
    return highlight_words


def check_speaker_format(speaker_format: str) -> str:
    """A speaker format with one {speaker} field and no line break, as given; ValueError otherwise
    (the message names the format)."""
    where = f"speaker format {speaker_format!r}"
    if "{speaker}" not in speaker_format:
        raise ValueError(f"{where} does not hold {{speaker}}, where the name goes")
    try:
        speaker_format.format(speaker="Speaker 1")
    except (KeyError, IndexError, ValueError, AttributeError) as e:
        raise ValueError(f"{where} is no template with only {{speaker}} in it ({e})") from None
    if "\n" in speaker_format or "\r" in speaker_format:
        raise ValueError(f"{where} holds a line break")
    return speaker_format


def _speaker_prefix(speaker_format: str) -> Callable[[str], str]:
    """The prefix for a speaker's label (check_speaker_format)."""
    check_speaker_format(speaker_format)
    return lambda label: speaker_format.format(speaker=label)


def _changes(speakers: Sequence[str | None], last: str | None = None) -> list[str | None]:
    """For each item, its speaker where it differs from the last speaker before it (`last` before the
    first), else None."""
    out: list[str | None] = []
    for speaker in speakers:
        out.append(speaker if speaker is not None and speaker != last else None)
        if speaker is not None:
            last = speaker
    return out


def render_txt(result: Transcription, *, speaker_format: str = DEFAULT_SPEAKER_FORMAT) -> str:
    """The transcript as plain text, one paragraph per segment (pieces of up to ~30 s of audio).

    With speakers (speaker diarization), a paragraph where the speaker changes starts with
    speaker_format ("{speaker}: " gives "Speaker 1: ...").
    """
    paragraphs = txt_paragraphs(result.segments, speaker_format=speaker_format)
    if not paragraphs and result.text.strip():
        paragraphs = [clean_text(result.text)]
    return "\n\n".join(paragraphs) + "\n" if paragraphs else ""


def txt_paragraphs(
    segments: Sequence[Any],
    *,
    speaker_format: str = DEFAULT_SPEAKER_FORMAT,
    speaker: str | None = None,
) -> list[str]:
    """The plain text's paragraphs of these segments (render_txt), after paragraphs whose last speaker
    was `speaker`."""
    prefix = _speaker_prefix(speaker_format)
    kept = [(clean_text(s.text), getattr(s, "speaker", None)) for s in segments]
    kept = [(p, who) for p, who in kept if p]
    return [
        (prefix(change) if change is not None else "") + p
        for (p, _), change in zip(kept, _changes([who for _, who in kept], speaker))
    ]


def _word_groups(cue: Cue) -> list[tuple[int, list[int]]]:
    """The cue's words grouped by when they start (milliseconds, within the cue, never decreasing)."""
    first, last = to_milliseconds(cue.start), to_milliseconds(cue.end)
    groups: list[tuple[int, list[int]]] = []
    for k, word in enumerate(cue.words):
        start = min(max(to_milliseconds(word.start), first), max(first, last - 1))
        if groups and start <= groups[-1][0]:
            groups[-1][1].append(k)  # starts no later than the word before: shown together
        else:
            groups.append((start, [k]))
    return groups


def _underlined(cue: Cue, spoken: Sequence[int], escape: Callable[[str], str]) -> str:
    """The cue's text (through escape) with the given words wrapped in <u>...</u>, line by line."""
    marks = sorted((cue.words[k].char_start, cue.words[k].char_end) for k in spoken)
    out, pos = [], 0
    for start, end in marks:
        out.append(escape(cue.text[pos:start]))
        lines = cue.text[start:end].split("\n")
        out.append("\n".join(f"<u>{escape(line)}</u>" if line else "" for line in lines))
        pos = end
    out.append(escape(cue.text[pos:]))
    return "".join(out)


def _underlined_entries(
    cue: Cue, underline: bool, escape: Callable[[str], str]
) -> list[tuple[float, float, str]]:
    """The cue as subtitle entries: itself, or (underline, a cue with words) one entry per word, from
    its start to the next word's start (the last to the cue's end), with that word underlined; the
    plain text before the first word."""
    if not (underline and cue.words):
        return [(cue.start, cue.end, escape(cue.text))]
    groups = _word_groups(cue)
    entries = []
    if to_milliseconds(cue.start) < groups[0][0]:
        entries.append((cue.start, groups[0][0] / 1000, escape(cue.text)))
    for k, (start, spoken) in enumerate(groups):
        end = groups[k + 1][0] / 1000 if k + 1 < len(groups) else cue.end
        entries.append((start / 1000, end, _underlined(cue, spoken, escape)))
    return entries


def _as_is(text: str) -> str:
    return text


def render_srt(
    cues: Sequence[Cue],
    *,
    highlight_words: bool | str | None = None,
    speaker_format: str = DEFAULT_SPEAKER_FORMAT,
) -> str:
    """SubRip: numbered blocks, HH:MM:SS,mmm times, a blank line after each block.

    highlight_words (any style; see HIGHLIGHT_STYLES): a cue with words becomes one block per word,
    from its start to the next word's start (the last to the cue's end), showing the cue's text with
    that word underlined (<u>...</u>).
    With speakers (Cue.speaker), a cue where the speaker changes starts with speaker_format
    ("{speaker}: " gives "Speaker 1: ..."), in each of its blocks.
    """
    return "".join(srt_blocks(cues, highlight_words=highlight_words, speaker_format=speaker_format))


def srt_blocks(
    cues: Sequence[Cue],
    *,
    highlight_words: bool | str | None = None,
    speaker_format: str = DEFAULT_SPEAKER_FORMAT,
    first: int = 1,
    speaker: str | None = None,
) -> list[str]:
    """The SubRip blocks of these cues (render_srt), numbered from `first`, after cues whose last
    speaker was `speaker`."""
    underline = _highlight_style(highlight_words) is not None
    prefix = _speaker_prefix(speaker_format)
    changes = _changes([c.speaker for c in cues], speaker)
    entries = [
        (start, end, (prefix(change) if change is not None else "") + text)
        for c, change in zip(cues, changes)
        for start, end, text in _underlined_entries(c, underline, _as_is)
    ]
    return [
        f"{i}\n{format_timestamp(start)} --> {format_timestamp(end)}\n{text}\n\n"
        for i, (start, end, text) in enumerate(entries, first)
    ]


def _vtt_escape(text: str) -> str:
    # '&' and '<' start character references and tags in cue text.
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _vtt_voice(cue: Cue) -> str:
    """The opening tag of the cue's voice span (WebVTT <v>), or "" without a speaker."""
    if cue.speaker is None:
        return ""
    # The annotation holds no line break and no '>' (escaped, as '&' and '<').
    return f"<v {_vtt_escape(' '.join(cue.speaker.split()))}>"


def _vtt_karaoke(cue: Cue) -> str:
    if not cue.words:
        return _vtt_escape(cue.text)
    out, pos = [], 0
    for start, spoken in _word_groups(cue)[1:]:
        at = cue.words[spoken[0]].char_start
        out.append(_vtt_escape(cue.text[pos:at]))
        out.append(f"<{format_timestamp(start / 1000, '.')}>")
        pos = at
    out.append(_vtt_escape(cue.text[pos:]))
    return "".join(out)


def render_vtt(cues: Sequence[Cue], *, highlight_words: bool | str | None = None) -> str:
    """WebVTT: the WEBVTT header, then one block per cue with HH:MM:SS.mmm times.

    highlight_words "underline" (or True): a cue with words becomes one block per word, as in SRT
    (render_srt), with that word in <u>...</u>. "karaoke": in a cue with words, a timestamp tag
    (<HH:MM:SS.mmm>) before each word after the first says when it is spoken, for players that colour
    the words already said.
    With speakers (Cue.speaker), every cue of a speaker is a voice span, `<v Speaker 1>...`.
    """
    return "WEBVTT\n\n" + "\n".join(vtt_blocks(cues, highlight_words=highlight_words))


def vtt_blocks(cues: Sequence[Cue], *, highlight_words: bool | str | None = None) -> list[str]:
    """The WebVTT blocks of these cues (render_vtt: the header, then the blocks a blank line apart)."""
    style = _highlight_style(highlight_words)
    if style == "karaoke":
        entries = [(c.start, c.end, _vtt_voice(c) + _vtt_karaoke(c)) for c in cues]
    else:
        entries = [
            (start, end, _vtt_voice(c) + text)
            for c in cues
            for start, end, text in _underlined_entries(c, style is not None, _vtt_escape)
        ]
    return [
        f"{format_timestamp(start, '.')} --> {format_timestamp(end, '.')}\n{text}\n"
        for start, end, text in entries
    ]


def _displayable(text: str) -> str:
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _as_dict(obj: Any) -> dict[str, Any]:
    return asdict(obj) if is_dataclass(obj) else dict(vars(obj))


def _ms(seconds: float) -> float | None:
    """Seconds rounded to whole milliseconds; None for a time that is not a finite number."""
    try:
        return to_milliseconds(seconds) / 1000
    except (TypeError, ValueError):
        return None


def _figure(value: Any) -> float | None:
    """A probability or log-probability to 4 significant digits; None for one that is not finite."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return float(f"{value:.4g}") if math.isfinite(value) else None


def segment_json(segment: Any, *, round_times: Callable[[Any], float | None] | None = None) -> dict[str, Any]:
    """A segment as JSON: start, end, text, language, truncated, repetitive, timing ("aligned" or
    "estimated"), avg_logprob and no_speech_prob (Segment's, to 4 significant digits) and words (text,
    start, end); a time that is not a finite number is None.

    round_times: how times are written. None (the JSON output file): the segment's times as they are,
    its words' in whole milliseconds rounded half up as subtitle times are. A function (the server's
    verbose_json rounds with Python's round() to 3 places): every time, the segment's and its words',
    goes through it.
    With speaker diarization, a segment or word with a speaker also has "speaker" (its label) and
    "overlap" (another speaker talks at the same time); without, neither key is written.
    """
    d = _as_dict(segment)
    out = {k: d[k] for k in ("start", "end", "text", "language", "truncated", "repetitive")}
    diarized = d.get("speaker") is not None
    word_time = _ms if round_times is None else round_times
    if round_times is not None:
        out["start"], out["end"] = round_times(out["start"]), round_times(out["end"])
    out["timing"] = d.get("timing", "estimated")
    out["avg_logprob"] = _figure(d.get("avg_logprob", 0.0))
    out["no_speech_prob"] = _figure(d.get("no_speech_prob", 0.0))
    if diarized:
        out["speaker"] = d["speaker"]
        out["overlap"] = bool(d.get("overlap", False))
    out["words"] = [
        _word_json(w, word_time)
        for w in (_as_dict(w) if not isinstance(w, Mapping) else w for w in d.get("words") or [])
    ]
    return out


def _word_json(w: Mapping[str, Any], word_time: Callable[[Any], float | None]) -> dict[str, Any]:
    out = {"text": w["text"], "start": word_time(w["start"]), "end": word_time(w["end"])}
    if w.get("speaker") is not None:
        out["speaker"] = w["speaker"]
        out["overlap"] = bool(w.get("overlap", False))
    return out


def render_json(
    result: Transcription,
    cues: Sequence[Cue],
    *,
    model: str | None = None,
    options: Mapping[str, Any] | None = None,
) -> str:
    """Everything in one document: text, language, segments with their flags, timing ("aligned" or
    "estimated") and words (text, start, end), cues, model and options. With speaker diarization:
    "speakers" (the labels in order of first appearance), and "speaker" and "overlap" on segments,
    words and cues (cues: "speaker" only)."""
    doc = {
        "text": result.text,
        "language": result.language,
        "duration": result.duration,
        "truncated": any(s.truncated for s in result.segments),
        "repetitive": any(s.repetitive for s in result.segments),
        # The file decoded to less audio than its header states (a cut-off or damaged file).
        "audio_truncated": result.header_duration is not None,
        "header_duration": result.header_duration,
        "warnings": list(result.warnings),
        # Where speech was found ([start, end] in seconds), when speech detection chose what was
        # transcribed; null when it was off.
        "speech": None if result.speech is None else [list(r) for r in result.speech],
        "segments": [segment_json(s) for s in result.segments],
        **({"speakers": list(result.speakers)} if getattr(result, "speakers", None) else {}),
        "cues": [c.to_dict() for c in cues],
        "model": model,
        "options": dict(options or {}),
        # A file name that is not valid UTF-8 carries surrogate escapes, which JSON text cannot hold.
        "source": None if result.source is None else _displayable(result.source),
    }
    return json.dumps(doc, ensure_ascii=False, indent=2) + "\n"


def rttm_file_id(result: Transcription) -> str:
    """The file id of a transcription's RTTM lines: its source's name without the extension."""
    source = getattr(result, "source", None)
    name = "" if not source or source == "-" else _displayable(PurePath(source).stem)
    return name or "audio"


def render_rttm(result: Transcription, file_id: str | None = None) -> str:
    """RTTM: one SPEAKER line per segment with a speaker (see diarize.rttm_lines); file_id defaults to
    rttm_file_id(result). Empty without speakers."""
    return rttm_lines(rttm_file_id(result) if file_id is None else file_id, result)


def render(
    fmt: str,
    result: Transcription,
    cues: Sequence[Cue],
    *,
    model: str | None = None,
    options: Mapping[str, Any] | None = None,
    highlight_words: bool | str | None = None,
    speaker_format: str = DEFAULT_SPEAKER_FORMAT,
) -> str:
    """The document for one of FORMATS or SPEAKER_FORMATS; highlight_words (a style of HIGHLIGHT_STYLES,
    True for "underline") marks the spoken word in SRT and WebVTT cues; speaker_format is how TXT and
    SRT name the speaker where it changes."""
    if fmt == "txt":
        return render_txt(result, speaker_format=speaker_format)
    if fmt == "srt":
        return render_srt(cues, highlight_words=highlight_words, speaker_format=speaker_format)
    if fmt == "vtt":
        return render_vtt(cues, highlight_words=highlight_words)
    if fmt == "json":
        return render_json(result, cues, model=model, options=options)
    if fmt == "rttm":
        return render_rttm(result)
    known = ", ".join((*FORMATS, *SPEAKER_FORMATS))
    raise ValueError(f"unknown output format {fmt!r}: use one of {known}")
