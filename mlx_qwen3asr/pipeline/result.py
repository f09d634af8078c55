"""What transcription returns: timed segments and the text of a whole input."""

from __future__ import annotations

from collections import Counter
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


@dataclass
class Transcription:
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
        return asdict(self)


@dataclass
class InputResult:
    """The outcome for one input of many: a transcription, or the error that stopped it."""

    index: int  # the input's key (its position among transcribe_stream's inputs)
    source: str | None
    transcription: Transcription | None = None
    wav: Signal | None = None  # the decoded samples (read by range for long files)
    error: Exception | None = None
    skipped: bool = False


def main_language(segments: list[Segment]) -> str:
    """The language spoken longest; segments without speech have none."""
    time: Counter[str] = Counter()
    for s in segments:
        if s.language:
            time[s.language] += s.end - s.start
    return time.most_common(1)[0][0] if time else ""


__all__ = ["InputResult", "Segment", "Transcription", "Word", "main_language"]
