"""From decoded rows to results: a segment from the tokens of its row, an input's Transcription from its
segments."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from mlx_qwen3asr.audio.cutting import Span
from mlx_qwen3asr.audio.features import SAMPLE_RATE
from mlx_qwen3asr.checkpoints.tokenizer import Tokenizer
from mlx_qwen3asr.model.generate import Generation
from mlx_qwen3asr.pipeline.inputs import PreparedInput, speech_span
from mlx_qwen3asr.pipeline.result import Segment, Transcription, main_language
from mlx_qwen3asr.text.output import fix_repetitions_flag, join_texts, parse_output


def text_logprob(tokenizer: Tokenizer, gen: Generation, forced: bool) -> float:
    """The mean log-probability of the tokens of the text (after the model's `<asr_text>` unless the
    language was forced, as parse_output splits the output) and of the EOS that ended them; 0.0 when
    there are none."""
    start = 0
    if not forced:
        tags = np.flatnonzero(np.asarray(gen.tokens, dtype=np.int64) == tokenizer.token_to_id("<asr_text>"))
        start = int(tags[0]) + 1 if tags.size else 0
    chosen = gen.logprobs[start:]
    return float(np.mean(chosen)) if chosen else 0.0


def decoded_segment(tokenizer: Tokenizer, gen: Generation, span: Span, language: str | None) -> Segment:
    """The segment a row decoded: its text and language (the forced one, or the one the model named),
    flagged when the budget ran out or the model ran into a loop, with the confidence figures Whisper's
    clients read (Segment.avg_logprob, Segment.no_speech_prob)."""
    raw = tokenizer.decode(gen.tokens, skip_special_tokens=True)
    avg_logprob = text_logprob(tokenizer, gen, forced=bool(language))
    language, text = parse_output(raw, language)
    _, collapsed = fix_repetitions_flag(raw.strip())
    return Segment(
        start=span.start_seconds,
        end=span.end_seconds,
        text=text,
        language=language,
        truncated=gen.truncated,
        repetitive=gen.repetitive or collapsed,
        avg_logprob=avg_logprob,
        no_speech_prob=gen.no_speech_prob or 0.0,
    )


def assemble(
    prepared: PreparedInput, segments: list[Segment], language: str | None, timing_notes: Sequence[str] = ()
) -> Transcription:
    """An input's transcription from its segments in time order. language: the forced one (None: the
    language spoken longest); timing_notes: why segments kept estimated word timing, one per segment."""
    language_out = language or main_language(segments)
    warnings = list(prepared.warnings)
    for note, count in Counter(timing_notes).items():
        warnings.append(f"word timing is estimated for {count} segment(s): {note}")
    return Transcription(
        text=join_texts([s.text for s in segments], language_out),
        language=language_out,
        segments=segments,
        duration=len(prepared.wav) / SAMPLE_RATE,
        source=prepared.source,
        warnings=warnings,
        header_duration=prepared.header_seconds,
        speech=None if prepared.speech is None else [speech_span(s) for s in prepared.speech],
    )


__all__ = ["assemble", "decoded_segment", "text_logprob"]
