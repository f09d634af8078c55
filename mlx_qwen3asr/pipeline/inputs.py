"""Inputs made ready for the model: decoded to 16 kHz mono, checked for speech, cut into segments.

An input is a path, a 16 kHz array or `(array, sample_rate)`. Preparing it decodes it once (long
files stay on disk, read by range), finds its speech regions when speech detection is on, and cuts it
into segments at quiet points; each segment's mel spectrogram is computed only when its batch comes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from mlx_qwen3asr.audio import files as decode
from mlx_qwen3asr.audio.cutting import Span, padded_length, segment_audio, split_on_silence, split_speech
from mlx_qwen3asr.audio.features import SAMPLE_RATE, log_mel_spectrogram, mel_frame_count, prepare_audio
from mlx_qwen3asr.audio.files import DecodedAudio, read_audio
from mlx_qwen3asr.audio.signal import ArraySignal, Signal
from mlx_qwen3asr.audio.vad import VadOptions, detect_speech

# Pieces of about 30 s transcribe more accurately than long ones (the model was tuned on short clips),
# and a segment is the unit of timing in the output.
DEFAULT_MAX_SEGMENT_SECONDS = 30.0
# Seconds of decoded audio that inputs read ahead and not yet finished may hold in memory (150 MB):
# decoding ahead stops there, so many files just short of decode.SPILL_SECONDS (kept in memory, not
# spilled to disk) do not pile up in memory while the model works. One input is always let in.
HELD_SECONDS = 2400.0

AudioInput = str | os.PathLike | np.ndarray | tuple


def load_input(audio: AudioInput) -> tuple[DecodedAudio, str | None]:
    """A mono 16 kHz float32 waveform from a path, a 16 kHz array or `(array, sample_rate)`."""
    if isinstance(audio, (str, os.PathLike)):
        return read_audio(audio), str(audio)
    if isinstance(audio, tuple) and len(audio) == 2:
        array, rate = audio
        samples = prepare_audio(np.asarray(array), int(rate))
    elif isinstance(audio, (np.ndarray, mx.array)):
        samples = prepare_audio(np.asarray(audio), SAMPLE_RATE)
    else:
        samples = None
    if samples is not None:
        return DecodedAudio(ArraySignal(samples), samples.size / SAMPLE_RATE), None
    raise TypeError(
        f"unsupported audio input {type(audio).__name__}: give a path, an array, or (array, rate)"
    )


def source_name(audio: AudioInput) -> str | None:
    return str(audio) if isinstance(audio, (str, os.PathLike)) else None


def samples_in_memory(signal: Signal) -> int:
    """Samples of a decoded input held in memory (a long file's live in a temporary file)."""
    return len(signal) if isinstance(signal, ArraySignal) else 0


def samples_at_most(audio: AudioInput) -> int:
    """The most samples an input not decoded yet may hold in memory once it is: a file is spilled to
    disk past decode.SPILL_SECONDS, an array is kept whole (resampled to 16 kHz)."""
    if isinstance(audio, (str, os.PathLike)):
        return int(decode.SPILL_SECONDS * SAMPLE_RATE)
    array, rate = audio if isinstance(audio, tuple) and len(audio) == 2 else (audio, SAMPLE_RATE)
    try:
        size, rate = int(np.size(array)), float(rate)
    except (TypeError, ValueError):
        return 0  # refused when it is prepared
    return int(size * SAMPLE_RATE / rate) + 1 if rate > 0 else 0


@dataclass
class PreparedInput:
    """An input made ready for the model: its decoded audio and where it is cut into segments.

    The audio of a long file lives in a temporary file (audio.signal.FileSignal); each segment's mel
    spectrogram is computed from it when the segment's batch comes, so memory does not grow with
    the length of a file.
    """

    index: int
    source: str | None
    wav: Signal  # the decoded samples (an array for short inputs, a temporary file for long ones)
    spans: list[Span]
    skipped: bool = False  # the `skip` predicate held: nothing is sent to the model
    warnings: list[str] = field(default_factory=list)  # what decoding found wrong with the file
    header_seconds: float | None = None  # the length its header states, when decoding fell short
    speech: list[Span] | None = None  # the speech regions found (None: speech detection was off)


NO_SPEECH = "no speech found in the audio; nothing was transcribed"


def prepare_input(
    index: int,
    audio: AudioInput,
    max_segment_seconds: float,
    skip: Callable[[Signal], bool] | None = None,
    vad: VadOptions | None = None,
    *,
    load: Callable[[AudioInput], tuple[DecodedAudio, str | None]] = load_input,
) -> PreparedInput:
    """Decode an input (with `load`) and cut it into segments: at quiet points over the whole audio, or,
    with speech detection (vad), around the speech regions only."""
    decoded, source = load(audio)
    signal = decoded.signal
    skipped = skip is not None and skip(signal)
    warnings = list(decoded.warnings)
    speech = None
    if skipped:
        spans = []
    elif vad is not None:
        speech = detect_speech(signal, vad)
        spans = split_speech(signal, speech, max_seconds=max_segment_seconds, sample_rate=SAMPLE_RATE)
        if not spans:
            warnings.append(NO_SPEECH)
    else:
        spans = split_on_silence(signal, max_seconds=max_segment_seconds, sample_rate=SAMPLE_RATE)
    header = decoded.header_seconds if decoded.truncated else None
    return PreparedInput(index, source, signal, spans, skipped, warnings, header, speech)


def segment_mel(signal: Signal, span: Span) -> np.ndarray:
    """The log-mel spectrogram of one segment, read from its input's decoded samples."""
    return log_mel_spectrogram(segment_audio(signal, span, sample_rate=SAMPLE_RATE))


def segment_frames(span: Span) -> int:
    """Mel frames of a segment, known without computing them."""
    return mel_frame_count(padded_length(span))


@dataclass(frozen=True)
class InputOptions:
    """How one input is transcribed."""

    language: str | None = None  # a canonical name (resolve_language), or None to detect
    context: str = ""
    align: bool = False  # time the words (needs the scheduler's aligner)
    skip: Callable[[Signal], bool] | None = None  # inputs this holds for are not sent to the model
    vad: VadOptions | None = None  # speech detection: only speech regions are sent to the model


def speech_span(span: Span) -> tuple[float, float]:
    """A speech region in seconds, to the millisecond."""
    return (round(span.start_seconds, 3), round(span.end_seconds, 3))


__all__ = [
    "DEFAULT_MAX_SEGMENT_SECONDS",
    "NO_SPEECH",
    "AudioInput",
    "InputOptions",
    "PreparedInput",
    "load_input",
    "prepare_input",
    "segment_frames",
    "segment_mel",
    "speech_span",
]
