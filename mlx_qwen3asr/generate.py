"""Greedy decoding with a KV cache, one step kept in flight."""

from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from .model import Qwen3ASR

# Audio tokens arrive at 12.5 per second and speech never needs more text tokens than that; the extra
# covers the `language X<asr_text>` header and very short segments.
TOKENS_PER_SECOND = 12.5
BUDGET_MARGIN = 32
# A pattern of up to MAX_PERIOD tokens repeated REPEAT_THRESHOLD times in a row is a runaway loop.
REPEAT_THRESHOLD = 20
MAX_PERIOD = 20
LOOP_CHECK_EVERY = 16


@dataclass
class Generation:
    tokens: list[int]
    truncated: bool  # stopped by the token budget before EOS
    repetitive: bool  # stopped because the output ran into a loop
    logits: list[mx.array] | None = None  # per step, when asked for (parity checks)


def token_budget(seconds: float) -> int:
    """New-token budget for a segment of this duration."""
    return BUDGET_MARGIN + math.ceil(max(seconds, 0.0) * TOKENS_PER_SECOND)


def ends_in_loop(tokens: list[int], threshold: int = REPEAT_THRESHOLD, max_period: int = MAX_PERIOD) -> bool:
    """True when the tail is one pattern of 1..max_period tokens repeated at least `threshold` times."""
    n = len(tokens)
    if n < threshold:
        return False
    arr = np.asarray(tokens[-threshold * max_period :])
    for period in range(1, max_period + 1):
        span = period * threshold
        if span > arr.size:
            break
        tail = arr[-span:]
        if np.array_equal(tail[period:], tail[:-period]):
            return True
    return False


def greedy_generate(
    net: Qwen3ASR,
    prompt_ids: list[int],
    audio_features: mx.array,
    max_new_tokens: int,
    eos_ids: set[int] | frozenset[int],
    keep_logits: bool = False,
) -> Generation:
    """Decode one prompt greedily until EOS, the budget, or a runaway loop."""
    cache = net.make_cache()
    ids = mx.array([prompt_ids], dtype=mx.int32)
    hidden = net.model(net.embed(ids, audio_features), cache=cache)
    # Only the last position goes through the vocabulary head.
    logits = net.logits(hidden[:, -1, :])
    y = mx.argmax(logits, axis=-1)
    mx.async_eval(y)

    kept: list[mx.array] | None = [] if keep_logits else None
    tokens: list[int] = []

    def done(truncated: bool = False, repetitive: bool = False) -> Generation:
        return Generation(tokens, truncated=truncated, repetitive=repetitive, logits=kept)

    for step in range(max_new_tokens):
        if kept is not None:
            kept.append(logits[0])
        next_y = None
        if step + 1 < max_new_tokens:
            hidden = net.model(net.model.embed_tokens(y[:, None]), cache=cache)
            logits = net.logits(hidden[:, -1, :])
            next_y = mx.argmax(logits, axis=-1)
            mx.async_eval(next_y)
        token = int(y.item())
        if token in eos_ids:
            return done()
        tokens.append(token)
        if len(tokens) % LOOP_CHECK_EVERY == 0 and ends_in_loop(tokens):
            return done(repetitive=True)
        y = next_y
    return done(truncated=True)


def prefill_logits(net: Qwen3ASR, prompt_ids: list[int], audio_features: mx.array) -> mx.array:
    """Logits of every prompt position (for parity checks and scoring)."""
    ids = mx.array([prompt_ids], dtype=mx.int32)
    return net(net.embed(ids, audio_features))[0]
