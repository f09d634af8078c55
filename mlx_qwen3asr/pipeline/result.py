"""What transcription returns: timed segments and the text of a whole input."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from mlx_qwen3asr.audio.signal import Signal


@dataclass
class Word:
    """A word of a segment's text with its time in the audio (from the forced aligner)."""

    text: str  # as written in the transcript, with the punctuation attached to it ("Hello,")
    start: float  # seconds, in the input's time
    end: float
    char_start: int = 0  # the word's span [char_start, char_end) in its segment's text
    char_end: int = 0
    # With speaker diarization (mlx_qwen3asr.diarize.assign_speakers): who said it, and whether another
    # speaker talked at the same time.
    speaker: str | None = None
    overlap: bool = False

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Word:
        """The word that dataclasses.asdict wrote, or a word of the JSON output (without char_start and
        char_end, which then take their defaults). See Transcription.from_dict for what is accepted."""
        return _word(d, "word")


@dataclass
class Segment:
    """A piece of the input transcribed on its own.

    avg_logprob: the mean log-probability greedy decoding gave the tokens of the text, and the EOS that
    ended it (as Whisper counts its end-of-text token); the `language X<asr_text>` header the model
    writes before the text is left out, so that it reads the same whether the language was detected or
    forced. 0.0 when nothing was decoded.
    no_speech_prob: the probability the model gave to answering "language None" (no speech) where it
    names the language (for a forced language: the name it would have written in its place); 0.0 when
    its answer has no such place.
    """

    start: float  # seconds
    end: float
    text: str
    language: str
    truncated: bool = False  # the token budget ran out before the model finished
    repetitive: bool = False  # the model ran into a loop; the repetition was collapsed
    # "aligned": the words were timed by the forced aligner; "estimated": the text is spread over the
    # segment's speech in proportion to its length (no aligner, or it cannot serve this segment).
    timing: str = "estimated"
    words: list[Word] = field(default_factory=list)
    avg_logprob: float = 0.0
    no_speech_prob: float = 0.0
    # With speaker diarization: the speaker of the whole segment (a segment never spans two), and
    # whether another speaker talks over it.
    speaker: str | None = None
    overlap: bool = False

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Segment:
        """The segment that dataclasses.asdict wrote, or a segment of the JSON output. See
        Transcription.from_dict for what is accepted."""
        return _segment(d, "segment")


@dataclass
class Transcription:
    """A whole input transcribed: its text, main language, segments, and what was found in its audio."""

    text: str
    language: str
    segments: list[Segment] = field(default_factory=list)
    duration: float = 0.0
    source: str | None = None
    # Problems found in the audio itself, one line each (e.g. a file that decodes to less than its
    # header states), and that stated length when the decoded one falls short of it.
    warnings: list[str] = field(default_factory=list)
    header_duration: float | None = None
    # Where speech was found, (start, end) in seconds, when speech detection chose what was transcribed.
    speech: list[tuple[float, float]] | None = None
    # With speaker diarization: the speakers' labels in order of first appearance; empty without.
    speakers: list[str] = field(default_factory=list)

    @property
    def truncated(self) -> bool:
        return any(s.truncated for s in self.segments)

    @property
    def repetitive(self) -> bool:
        return any(s.repetitive for s in self.segments)

    @property
    def audio_truncated(self) -> bool:
        """The file decoded to clearly less audio than its header states."""
        return self.header_duration is not None

    def to_dict(self) -> dict[str, Any]:
        """Every field, nested segments and words included, as plain dicts and lists (dataclasses.asdict)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Transcription:
        """The transcription that to_dict wrote, field for field; also reads the JSON output of
        outputs.render.render_json (`mlxasr --json`).

        Keys the dataclasses do not have (cues, model, options, audio_truncated, a segment's id...) are
        ignored; a missing key that has a default takes it. Times are numbers (an int reads as a float),
        a word's char_start and char_end whole numbers, flags true or false; null stays None only where
        the field allows None (source, header_duration, speech, speaker). avg_logprob and no_speech_prob of null read as NaN: the JSON output writes null for a
        value that was not finite. Speech ranges become (start, end) tuples.
        Raises ValueError naming the field (as `segments[2].words[0].start`) for a missing required
        key or a value of the wrong type.
        """
        _check_mapping(d, "transcription")
        speech = d.get("speech")
        if speech is not None:
            speech = [_pair(r, f"speech[{k}]") for k, r in enumerate(_list(speech, "speech"))]
        return cls(
            text=_str(d, "text", "text"),
            language=_str(d, "language", "language"),
            segments=[
                _segment(s, f"segments[{k}]") for k, s in enumerate(_list(d.get("segments", []), "segments"))
            ],
            duration=_float(d, "duration", "duration", 0.0),
            source=_optional_str(d, "source", "source"),
            warnings=_str_list(d.get("warnings", []), "warnings"),
            header_duration=_optional_float(d, "header_duration", "header_duration"),
            speech=speech,
            speakers=_str_list(d.get("speakers", []), "speakers"),
        )


@dataclass
class InputResult:
    """The outcome for one input of many: a transcription, or the error that stopped it."""

    index: int  # the input's key (its position among transcribe_stream's inputs)
    source: str | None
    transcription: Transcription | None = None
    wav: Signal | None = None  # the decoded samples (read by range for long files)
    error: Exception | None = None
    skipped: bool = False


_REQUIRED = object()


def _check_mapping(d: Any, where: str) -> None:
    if not isinstance(d, Mapping):
        raise ValueError(f"{where}: expected an object (a mapping), got {type(d).__name__}")


def _value(d: Mapping[str, Any], key: str, where: str, default: Any) -> Any:
    """d[key], or default when the key is missing; ValueError when it is missing and required."""
    if key in d:
        return d[key]
    if default is _REQUIRED:
        raise ValueError(f"{where}: missing")
    return default


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}: expected a number, got {value!r}")
    return float(value)


def _float(d: Mapping[str, Any], key: str, where: str, default: Any = _REQUIRED) -> float:
    return _number(_value(d, key, where, default), where)


def _optional_float(d: Mapping[str, Any], key: str, where: str) -> float | None:
    value = d.get(key)
    return None if value is None else _number(value, where)


def _probability(d: Mapping[str, Any], key: str, where: str) -> float:
    """A log-probability or probability; null (what the JSON output writes for one not finite) is NaN."""
    value = _value(d, key, where, 0.0)
    return math.nan if value is None else _number(value, where)


def _int(d: Mapping[str, Any], key: str, where: str, default: int) -> int:
    value = _value(d, key, where, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}: expected a whole number, got {value!r}")
    return value


def _bool(d: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
    value = _value(d, key, where, default)
    if not isinstance(value, bool):
        raise ValueError(f"{where}: expected true or false, got {value!r}")
    return value


def _str(d: Mapping[str, Any], key: str, where: str, default: Any = _REQUIRED) -> str:
    value = _value(d, key, where, default)
    if not isinstance(value, str):
        raise ValueError(f"{where}: expected a string, got {value!r}")
    return value


def _optional_str(d: Mapping[str, Any], key: str, where: str) -> str | None:
    value = d.get(key)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{where}: expected a string or null, got {value!r}")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{where}: expected a list, got {type(value).__name__}")
    return list(value)


def _str_list(value: Any, where: str) -> list[str]:
    items = _list(value, where)
    for k, item in enumerate(items):
        if not isinstance(item, str):
            raise ValueError(f"{where}[{k}]: expected a string, got {item!r}")
    return items


def _pair(value: Any, where: str) -> tuple[float, float]:
    items = _list(value, where)
    if len(items) != 2:
        raise ValueError(f"{where}: expected [start, end], got {len(items)} items")
    return _number(items[0], f"{where}[0]"), _number(items[1], f"{where}[1]")


def _word(d: Any, where: str) -> Word:
    _check_mapping(d, where)
    return Word(
        text=_str(d, "text", f"{where}.text"),
        start=_float(d, "start", f"{where}.start"),
        end=_float(d, "end", f"{where}.end"),
        char_start=_int(d, "char_start", f"{where}.char_start", 0),
        char_end=_int(d, "char_end", f"{where}.char_end", 0),
        speaker=_optional_str(d, "speaker", f"{where}.speaker"),
        overlap=_bool(d, "overlap", f"{where}.overlap", False),
    )


def _segment(d: Any, where: str) -> Segment:
    _check_mapping(d, where)
    words = _list(d.get("words", []), f"{where}.words")
    return Segment(
        start=_float(d, "start", f"{where}.start"),
        end=_float(d, "end", f"{where}.end"),
        text=_str(d, "text", f"{where}.text"),
        language=_str(d, "language", f"{where}.language"),
        truncated=_bool(d, "truncated", f"{where}.truncated", False),
        repetitive=_bool(d, "repetitive", f"{where}.repetitive", False),
        timing=_str(d, "timing", f"{where}.timing", "estimated"),
        words=[_word(w, f"{where}.words[{k}]") for k, w in enumerate(words)],
        avg_logprob=_probability(d, "avg_logprob", f"{where}.avg_logprob"),
        no_speech_prob=_probability(d, "no_speech_prob", f"{where}.no_speech_prob"),
        speaker=_optional_str(d, "speaker", f"{where}.speaker"),
        overlap=_bool(d, "overlap", f"{where}.overlap", False),
    )


def main_language(segments: list[Segment]) -> str:
    """The language spoken longest; segments without speech have none."""
    time: Counter[str] = Counter()
    for s in segments:
        if s.language:
            time[s.language] += s.end - s.start
    return time.most_common(1)[0][0] if time else ""


__all__ = ["InputResult", "Segment", "Transcription", "Word", "main_language"]
