"""The stages the Scheduler calls, handed to it rather than looked up as module globals.

Transcription goes through a few replaceable steps: decoding an input, cutting it, a segment's mel
spectrogram, the encoder, the prompt start's prefill, the decoding batch, each segment's token budget,
the memory probe that sizes batches, the aligner and the assembly of an input's result. `Parts` holds
them; its defaults are the real ones. Tests give stand-ins (a batch that 'says' given texts, a fault at
one stage for one input) and benchmarks wrap them to time each stage, through the `parts` argument of
Scheduler, Engine, transcribe_stream and transcribe.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from mlx_qwen3asr.audio.cutting import Span
from mlx_qwen3asr.audio.files import DecodedAudio
from mlx_qwen3asr.audio.signal import Signal
from mlx_qwen3asr.checkpoints.loading import ASRModel
from mlx_qwen3asr.model.generate import DecodeBatch, Prefix, prefill_prefix, token_budget
from mlx_qwen3asr.pipeline.alignment import align_segments
from mlx_qwen3asr.pipeline.assembly import assemble
from mlx_qwen3asr.pipeline.encoding import encode_segments
from mlx_qwen3asr.pipeline.inputs import AudioInput, PreparedInput, load_input, prepare_input, segment_mel
from mlx_qwen3asr.pipeline.memory import available_memory
from mlx_qwen3asr.pipeline.result import Transcription, Word


@dataclass(frozen=True)
class Parts:
    """What the Scheduler calls at each stage (defaults: the real ones).

    load(audio) -> (DecodedAudio, source): decodes an input (a path, an array, (array, rate)).
    prepare(index, audio, max_segment_seconds, skip, vad, load=load) -> PreparedInput: decodes an input
        with `load` and cuts it into segments (on the scheduler's background thread).
    mel(signal, span) -> the log-mel spectrogram of one segment, when its batch comes.
    encode(model, mels) -> the audio features of each segment.
    prefill(net, ids) -> Prefix: the keys and values of a prompt start (system prompt and context).
    batch(net, eos_ids, prefix=..., header=...) -> a DecodeBatch: rows join with add(), advance with
        step(), leave with drop(); header: the answer's header ids, read from the tokenizer.
    budget(seconds) -> the most tokens a segment of that length may decode.
    memory() -> bytes the process can still use (sizes automatic batches).
    align(aligner, mels, texts, languages, spans) -> each segment's timed words.
    assemble(prepared, segments, language, timing_notes) -> an input's Transcription.
    """

    load: Callable[[AudioInput], tuple[DecodedAudio, str | None]] = load_input
    prepare: Callable[..., PreparedInput] = prepare_input
    mel: Callable[[Signal, Span], np.ndarray] = segment_mel
    encode: Callable[[ASRModel, Sequence[np.ndarray]], list[mx.array]] = encode_segments
    prefill: Callable[[Any, Sequence[int]], Prefix] = prefill_prefix
    batch: Callable[..., DecodeBatch] = DecodeBatch
    budget: Callable[[float], int] = token_budget
    memory: Callable[[], int] = available_memory
    align: Callable[..., list[list[Word]]] = align_segments
    assemble: Callable[..., Transcription] = assemble


__all__ = ["Parts"]
