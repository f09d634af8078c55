"""Forced alignment with Qwen3-ForcedAligner: word times from one forward pass over audio and text.

The aligner is the same thinker as the speech model with its own audio encoder and a head of 5000
timestamp classes (class k = k x 80 ms). Its prompt has no chat template:

    <|audio_start|> <|audio_pad|> x N <|audio_end|> word1 <timestamp><timestamp> word2 <timestamp><timestamp> ...

Each word's two <timestamp> positions read its start and end class (the argmax of the head there);
the official longest-non-decreasing repair then makes the times monotonic (words.word_times). Many
segments are aligned in one padded forward pass: the prompts are padded on the right, so causal
attention keeps every row as it would be alone, and only the timestamp positions go through the head.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from mlx_qwen3asr.audio.features import SAMPLE_RATE, log_mel_spectrogram
from mlx_qwen3asr.audio.files import AudioTooLong, read_audio
from mlx_qwen3asr.checkpoints.layouts import ALIGNER_LANGUAGES
from mlx_qwen3asr.checkpoints.loading import ASRModel, require_kind
from mlx_qwen3asr.model.generate import prefill_chunks
from mlx_qwen3asr.pipeline.encoding import encode_segments
from mlx_qwen3asr.pipeline.inputs import load_input
from mlx_qwen3asr.pipeline.result import Word
from mlx_qwen3asr.text.languages import resolve_language
from mlx_qwen3asr.text.words import display_spans, split_items, word_times

TIMESTAMP_TOKEN = "<timestamp>"
# The official aligner takes at most this much audio per call.
MAX_SECONDS = 180.0
# Positions per forward call, as for prefill: bounds the attention scores of long prompts.
ALIGN_CHUNK = 512
# Rows per forward call: bounds the key/value memory of a batch of long prompts.
ALIGN_ROWS = 8


@dataclass(frozen=True)
class AlignerPrompt:
    ids: list[int]
    timestamps: list[int]  # positions of the <timestamp> tokens, two per item


def aligner_prompt(aligner: ASRModel, n_audio_tokens: int, items: Sequence[str]) -> AlignerPrompt:
    """The official aligner prompt for these items (words as the aligner sees them)."""
    require_kind(aligner, "aligner")
    tok, cfg = aligner.tokenizer, aligner.config
    stamp = cfg.timestamp_token_id if cfg.timestamp_token_id is not None else tok.token_to_id(TIMESTAMP_TOKEN)
    ids = [cfg.audio_start_token_id, *([cfg.audio_token_id] * n_audio_tokens), cfg.audio_end_token_id]
    positions: list[int] = []
    for item in items:
        ids.extend(tok.encode(item))
        positions.extend((len(ids), len(ids) + 1))
        ids.extend((stamp, stamp))
    return AlignerPrompt(ids, positions)


def timestamp_classes(
    aligner: ASRModel,
    prompts: Sequence[AlignerPrompt],
    features: Sequence[mx.array],
    keep_logits: bool = False,
) -> list[np.ndarray]:
    """The head's argmax class at every timestamp position of each prompt, rows aligned together.

    keep_logits: return the head's logits there instead, (timestamps, classes) per row (parity checks).
    """
    require_kind(aligner, "aligner")
    out: list[np.ndarray] = []
    for start in range(0, len(prompts), ALIGN_ROWS):
        rows = slice(start, start + ALIGN_ROWS)
        out.extend(_classes(aligner, prompts[rows], features[rows], keep_logits))
    return out


def _classes(
    aligner: ASRModel, prompts: Sequence[AlignerPrompt], features: Sequence[mx.array], keep_logits: bool
) -> list[np.ndarray]:
    net = aligner.net
    width = max(len(p.ids) for p in prompts)
    ids = np.full((len(prompts), width), aligner.config.padding_id, dtype=np.int32)
    for row, prompt in enumerate(prompts):
        ids[row, : len(prompt.ids)] = prompt.ids
    audio = mx.concatenate([f.reshape(-1, f.shape[-1]) for f in features], axis=0)
    embeds = net.embed(mx.array(ids), audio)
    # Right padding: a row's pads come after all its tokens, so causal attention keeps rows apart.
    cache = net.make_cache()
    wanted = [np.asarray(p.timestamps, dtype=np.int64) for p in prompts]
    picked: list[list[np.ndarray]] = [[] for _ in prompts]
    for start, stop, hidden in prefill_chunks(net, embeds, cache, ALIGN_CHUNK):
        rows, cols = [], []
        for row, positions in enumerate(wanted):
            inside = positions[(positions >= start) & (positions < stop)]
            rows.extend([row] * inside.size)
            cols.extend((inside - start).tolist())
        if rows:
            gathered = hidden[mx.array(rows), mx.array(cols)]
            logits = net.logits(gathered)
            classes = logits if keep_logits else mx.argmax(logits, axis=-1)
            mx.eval(classes, [c.state for c in cache])
            values = np.array(classes)
            offset = 0
            for row, positions in enumerate(wanted):
                count = int(((positions >= start) & (positions < stop)).sum())
                picked[row].append(values[offset : offset + count])
                offset += count
        else:
            mx.eval([c.state for c in cache])
    empty = np.zeros((0, aligner.config.classify_num) if keep_logits else 0, dtype=np.float32)
    return [np.concatenate(p) if p else empty for p in picked]


def aligner_languages(aligner: ASRModel) -> tuple[str, ...]:
    """The languages the aligner was trained on (its config's `support_languages`)."""
    return tuple(aligner.config.support_languages or ALIGNER_LANGUAGES)


def why_not_aligned(aligner: ASRModel, text: str, language: str | None, seconds: float) -> str | None:
    """Why this segment keeps estimated timing, or None when the aligner can serve it."""
    if not text.strip():
        return "no text"
    if language not in aligner_languages(aligner):
        return f"{language or 'an unknown language'} is not among the aligner's languages"
    if seconds > MAX_SECONDS:
        return f"longer than the aligner's {MAX_SECONDS:g} s"
    return None


def align_segments(
    aligner: ASRModel,
    mels: Sequence[np.ndarray],
    texts: Sequence[str],
    languages: Sequence[str],
    spans: Sequence[tuple[float, float]],
    *,
    classes: Callable[[ASRModel, Sequence[AlignerPrompt], Sequence[mx.array]], list[np.ndarray]] = (
        timestamp_classes
    ),
) -> list[list[Word]]:
    """Words with times for each segment (its mel, text, language and [start, end] in the input),
    all segments aligned in one padded forward pass; times are clamped to the segment's span.

    classes: the aligner's class at every timestamp position of each prompt (timestamp_classes; tests
    give a stand-in that times words at a chosen pace)."""

    items = [split_items(text, language) for text, language in zip(texts, languages)]
    features = encode_segments(aligner, list(mels))
    prompts = [
        aligner_prompt(aligner, int(f.shape[0]), [i.text for i in its]) for f, its in zip(features, items)
    ]
    stamps = classes(aligner, prompts, features)
    step_ms = float(aligner.config.timestamp_segment_time or 80)
    out: list[list[Word]] = []
    for text, its, row, (start, end) in zip(texts, items, stamps, spans):
        times = word_times(row.tolist(), step_ms, len(its))
        words = []
        for (a, b), (t0, t1) in zip(display_spans(text, its), times):
            w0 = min(max(start + t0, start), end)
            words.append(Word(text[a:b], w0, min(max(start + t1, w0), end), a, b))
        out.append(words)
    return out


def align_span(
    aligner: ASRModel, samples: np.ndarray, text: str, language: str | None, span: tuple[float, float]
) -> list[Word] | None:
    """The words of `text` timed in `samples` (16 kHz, the audio of `span`, [start, end] seconds of the
    whole input), times in the input's; None when the aligner cannot serve it (why_not_aligned)."""
    start, end = span
    if why_not_aligned(aligner, text, language, end - start) is not None:
        return None
    return align_segments(aligner, [log_mel_spectrogram(samples)], [text], [language], [span])[0]


def align(aligner: ASRModel, audio, text: str, language: str | None = None) -> list[Word]:
    """Time the words of `text` in `audio` (a path, a 16 kHz array or `(array, sample_rate)`; at most
    180 s). language: a name or code among the aligner's languages (default English).

    A file is decoded no further than the aligner takes: a longer one is refused once MAX_SECONDS are
    decoded, so its length costs neither memory nor time."""

    name = resolve_language(language) or "English"
    too_long = f"cannot align: longer than the aligner's {MAX_SECONDS:g} s"
    if isinstance(audio, (str, os.PathLike)):
        try:
            decoded = read_audio(audio, max_seconds=MAX_SECONDS)
        except AudioTooLong:
            if not text.strip():
                return []
            raise ValueError(too_long) from None
    else:
        decoded, _ = load_input(audio)
    signal = decoded.signal
    try:
        seconds = len(signal) / SAMPLE_RATE
        reason = why_not_aligned(aligner, text, name, seconds)
        if reason == "no text":
            return []
        if reason is not None:
            raise ValueError(f"cannot align: {reason}")
        samples = signal.read(0, len(signal))
    finally:
        signal.close()
    return align_segments(aligner, [log_mel_spectrogram(samples)], [text], [name], [(0.0, seconds)])[0]


__all__ = [
    "ALIGN_CHUNK",
    "MAX_SECONDS",
    "AlignerPrompt",
    "align",
    "align_segments",
    "align_span",
    "aligner_languages",
    "aligner_prompt",
    "timestamp_classes",
    "why_not_aligned",
]
