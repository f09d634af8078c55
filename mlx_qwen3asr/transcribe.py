"""Transcription: audio in, text with segment timing out."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np

from .audio import SAMPLE_RATE, load_audio, log_mel_spectrogram, prepare_audio
from .generate import greedy_generate, token_budget
from .loading import ASRModel
from .model import encoder_batch
from .prompt import build_prompt_ids, fix_repetitions_flag, join_texts, parse_output, resolve_language
from .segment import segment_audio, split_on_silence

# Pieces of about 30 s transcribe more accurately than long ones (the model was tuned on short clips),
# and a segment is the unit of timing in the output.
DEFAULT_MAX_SEGMENT_SECONDS = 30.0
# Encoder work per call, in 100-frame chunks: bounds memory for long files.
ENCODER_CHUNKS_PER_CALL = 256

AudioInput = str | os.PathLike | np.ndarray | tuple


@dataclass
class Segment:
    start: float  # seconds
    end: float
    text: str
    language: str
    truncated: bool = False  # the token budget ran out before the model finished
    repetitive: bool = False  # the model ran into a loop; the repetition was collapsed


@dataclass
class Transcription:
    text: str
    language: str
    segments: list[Segment] = field(default_factory=list)
    duration: float = 0.0
    source: str | None = None

    @property
    def truncated(self) -> bool:
        return any(s.truncated for s in self.segments)

    @property
    def repetitive(self) -> bool:
        return any(s.repetitive for s in self.segments)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _waveform(audio: AudioInput) -> tuple[np.ndarray, str | None]:
    if isinstance(audio, (str, os.PathLike)):
        return load_audio(audio), str(audio)
    if isinstance(audio, tuple) and len(audio) == 2:
        array, rate = audio
        return prepare_audio(np.asarray(array), int(rate)), None
    if isinstance(audio, (np.ndarray, mx.array)):
        return prepare_audio(np.asarray(audio), SAMPLE_RATE), None
    raise TypeError(
        f"unsupported audio input {type(audio).__name__}: give a path, an array, or (array, rate)"
    )


def encode_segments(model: ASRModel, mels: list[np.ndarray]) -> list[mx.array]:
    """Audio features of each segment; segments share encoder calls up to a chunk budget."""
    cfg = model.config.audio_config
    features: list[mx.array] = []
    group: list[np.ndarray] = []
    chunks = 0

    def flush():
        batch = encoder_batch(group, cfg, model.dtype)
        out = model.net.audio_tower(batch)
        mx.eval(out)
        offsets = np.cumsum([0, *batch.token_counts])
        features.extend(out[offsets[i] : offsets[i + 1]] for i in range(len(group)))

    for mel in mels:
        n = -(-mel.shape[1] // cfg.chunk_frames)
        if group and chunks + n > ENCODER_CHUNKS_PER_CALL:
            flush()
            group, chunks = [], 0
        group.append(mel)
        chunks += n
    if group:
        flush()
    return features


def transcribe_waveform(
    model: ASRModel,
    wav: np.ndarray,
    *,
    language: str | None = None,
    context: str = "",
    max_segment_seconds: float = DEFAULT_MAX_SEGMENT_SECONDS,
    on_segment: Callable[[Segment], None] | None = None,
) -> Transcription:
    """Transcribe a mono 16 kHz float32 waveform."""
    forced = resolve_language(language)
    tok = model.tokenizer
    eos = frozenset({tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")})
    spans = split_on_silence(wav, max_seconds=max_segment_seconds, sample_rate=SAMPLE_RATE)
    mels = [log_mel_spectrogram(segment_audio(wav, s, sample_rate=SAMPLE_RATE)) for s in spans]
    features = encode_segments(model, mels)

    segments: list[Segment] = []
    for span, feats in zip(spans, features):
        prompt = build_prompt_ids(tok, int(feats.shape[0]), context=context, language=forced)
        gen = greedy_generate(model.net, prompt, feats, token_budget(span.duration), eos)
        raw = tok.decode(gen.tokens, skip_special_tokens=True)
        seg_language, text = parse_output(raw, forced)
        _, collapsed = fix_repetitions_flag(raw.strip())
        seg = Segment(
            start=span.start_seconds,
            end=span.end_seconds,
            text=text,
            language=seg_language,
            truncated=gen.truncated,
            repetitive=gen.repetitive or collapsed,
        )
        segments.append(seg)
        if on_segment is not None:
            on_segment(seg)

    language_out = forced or _main_language(segments)
    return Transcription(
        text=join_texts([s.text for s in segments], language_out),
        language=language_out,
        segments=segments,
        duration=len(wav) / SAMPLE_RATE,
    )


def _main_language(segments: list[Segment]) -> str:
    """The language spoken longest; segments without speech have none."""
    time = Counter()
    for s in segments:
        if s.language:
            time[s.language] += s.end - s.start
    return time.most_common(1)[0][0] if time else ""


def transcribe(
    model: ASRModel,
    audio: AudioInput | Sequence[AudioInput],
    *,
    language: str | None = None,
    context: str = "",
    max_segment_seconds: float = DEFAULT_MAX_SEGMENT_SECONDS,
    on_segment: Callable[[Segment], None] | None = None,
) -> Transcription | list[Transcription]:
    """Transcribe a file, an array (16 kHz, or `(array, sample_rate)`), or a list of them.

    language: force the language (a name such as "English" or a code such as "en"); None detects it.
    context: text that biases recognition (names, terms), placed in the system prompt.
    Returns one Transcription per input, a list for a list.
    """
    resolve_language(language)  # fail before any audio is read
    if isinstance(audio, list):
        return [
            transcribe(model, a, language=language, context=context,
                       max_segment_seconds=max_segment_seconds, on_segment=on_segment)
            for a in audio
        ]  # fmt: skip
    wav, source = _waveform(audio)
    result = transcribe_waveform(
        model, wav, language=language, context=context,
        max_segment_seconds=max_segment_seconds, on_segment=on_segment,
    )  # fmt: skip
    result.source = source
    return result


__all__ = ["Segment", "Transcription", "transcribe", "transcribe_waveform"]
