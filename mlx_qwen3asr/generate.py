"""Greedy decoding of one or many prompts with a KV cache, one step kept in flight."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from .model import KVCache, Qwen3ASR

# Audio tokens arrive at 12.5 per second and speech never needs more text tokens than that; the extra
# covers the `language X<asr_text>` header and very short segments.
TOKENS_PER_SECOND = 12.5
BUDGET_MARGIN = 32
# A pattern of up to MAX_PERIOD tokens repeated REPEAT_THRESHOLD times in a row is a runaway loop.
REPEAT_THRESHOLD = 20
MAX_PERIOD = 20
LOOP_CHECK_EVERY = 16
# Rows per prefill call. Prefill costs about the same per token up to 16 rows on a 2-core CPU
# (0.6b: 6.4-6.8 ms), then more (10 ms at 30 rows): the activations of many rows stop fitting in cache.
PREFILL_ROWS = 8


# Query positions per prefill call: bounds the attention scores of long prompts (a long context) to
# rows x heads x PREFILL_CHUNK x keys instead of a square of the prompt length per layer.
PREFILL_CHUNK = 512


@dataclass
class Prefix:
    """A prompt start shared by every row (system prompt and context), computed once.

    layers: per decoder layer, keys and values of shape (1, Hk, len(ids), D).
    """

    ids: list[int]
    layers: list[tuple[mx.array, mx.array]]

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.layers)


def prefill_prefix(net: Qwen3ASR, ids: Sequence[int]) -> Prefix:
    """The decoder's keys and values for a prompt start, in chunks of PREFILL_CHUNK positions."""
    ids = [int(i) for i in ids]
    cache = net.make_cache()
    for start in range(0, len(ids), PREFILL_CHUNK):
        chunk = mx.array([ids[start : start + PREFILL_CHUNK]], dtype=mx.int32)
        net.model(net.model.embed_tokens(chunk), cache=cache)
        mx.eval([c.state for c in cache])
    layers = [(c.keys[..., : c.offset, :], c.values[..., : c.offset, :]) for c in cache]
    mx.eval(layers)
    return Prefix(ids, layers)


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
    prefix: Prefix | None = None,
) -> Generation:
    """Decode one prompt greedily until EOS, the budget, or a runaway loop."""
    batch = greedy_generate_batch(
        net, [prompt_ids], [audio_features], [max_new_tokens], eos_ids, keep_logits, prefix=prefix
    )
    return batch[0]


def _pad_id(net: Qwen3ASR) -> int:
    """Any token that is not the audio placeholder fills the left padding (masked out everywhere)."""
    return 0 if net.config.audio_token_id != 0 else 1


def _prefill(
    net: Qwen3ASR,
    prompts: Sequence[list[int]],
    audio_features: Sequence[mx.array],
    prefix: Prefix | None = None,
) -> tuple[list[KVCache], mx.array, list[int]]:
    """Prompts (after the shared prefix, when given) left-padded to one width through the decoder:
    its cache, each row's last hidden state, and each row's count of pad tokens.

    The padding is masked out of attention and every row's positions count from its own first token
    (after the prefix). Long prompts go through in chunks of PREFILL_CHUNK positions.
    """
    lengths = [len(p) for p in prompts]
    width = max(lengths)
    pad_counts = [width - length for length in lengths]
    ids = np.full((len(prompts), width), _pad_id(net), dtype=np.int32)
    for row, prompt in enumerate(prompts):
        ids[row, pad_counts[row] :] = prompt
    features = mx.concatenate([f.reshape(-1, f.shape[-1]) for f in audio_features], axis=0)
    embeds = net.embed(mx.array(ids), features)
    cache = net.make_cache(None if prefix is None else prefix.layers)
    left_pad = mx.array(pad_counts, dtype=mx.int32) if any(pad_counts) else None
    hidden = None
    for start in range(0, width, PREFILL_CHUNK):
        stop = min(start + PREFILL_CHUNK, width)
        mask = None
        if left_pad is not None:
            # Causal, and no real query sees a pad key; a pad query sees itself (a row of all-masked
            # scores would be NaN) and nothing it produces reaches a real token.
            query, key = mx.arange(start, stop)[:, None], mx.arange(stop)[None, :]
            causal = key <= query
            real_key = key[None] >= left_pad[:, None, None]
            mask = (causal[None] & (real_key | (key == query)[None]))[:, None]
        elif stop - start > 1:
            mask = "causal"
        hidden = net.model(embeds[:, start:stop], mask=mask, cache=cache, left_pad=left_pad)
        if stop < width:
            mx.eval(hidden, [c.state for c in cache])
    return cache, hidden[:, -1, :], pad_counts


def greedy_generate_batch(
    net: Qwen3ASR,
    prompts: Sequence[list[int]],
    audio_features: Sequence[mx.array],
    max_new_tokens: Sequence[int],
    eos_ids: set[int] | frozenset[int],
    keep_logits: bool = False,
    on_first_tokens: Callable[[], None] | None = None,
    prefix: Prefix | None = None,
) -> list[Generation]:
    """Decode several prompts together, each greedily until its EOS, budget, or a runaway loop.

    Prompts are left-padded to one length; the padding is masked out of attention and every row's
    positions count from its own first token, so each row decodes as it would alone. Rows that
    finish leave the batch (their cache rows are dropped), so the rest stop paying for them.
    prefix: a prompt start every row shares, computed once (prefill_prefix); `prompts` then hold
    what follows it.
    """
    n = len(prompts)
    if not (n == len(audio_features) == len(max_new_tokens)):
        raise ValueError("prompts, audio_features and max_new_tokens must have the same length")
    if n == 0:
        return []
    budgets = [max(0, int(b)) for b in max_new_tokens]
    if n <= PREFILL_ROWS:
        cache, last, pad_counts = _prefill(net, prompts, audio_features, prefix)
    else:
        # Groups of rows prefilled apart, then their caches joined (right-aligned, so every row's
        # padding stays in front): costs less per token than one call over every row.
        group_caches, group_lasts = [], []
        for start in range(0, n, PREFILL_ROWS):
            rows = slice(start, start + PREFILL_ROWS)
            group_cache, group_last, _ = _prefill(net, prompts[rows], audio_features[rows], prefix)
            mx.eval(group_last, [c.state for c in group_cache])
            group_caches.append(group_cache)
            group_lasts.append(group_last)
        width = max(len(p) for p in prompts)
        pad_counts = [width - len(p) for p in prompts]
        cache = []
        for layer in range(len(net.model.layers)):
            cache.append(KVCache.stack([g[layer] for g in group_caches], width + max(budgets)))
            for g in group_caches:
                g[layer] = None  # each group's layer is freed once joined
            mx.eval(cache[-1].state)
        last = mx.concatenate(group_lasts, axis=0)
    left_pad = mx.array(pad_counts, dtype=mx.int32) if any(pad_counts) else None
    # Only the last position goes through the vocabulary head.
    logits = net.logits(last)
    y = mx.argmax(logits, axis=-1)
    mx.async_eval(y)

    tokens: list[list[int]] = [[] for _ in range(n)]
    kept: list[list[mx.array]] | None = [[] for _ in range(n)] if keep_logits else None
    results: list[Generation | None] = [None] * n
    active = list(range(n))  # batch row -> original index

    def finish(index: int, truncated: bool = False, repetitive: bool = False) -> None:
        logits_out = None if kept is None else kept[index]
        results[index] = Generation(
            tokens[index], truncated=truncated, repetitive=repetitive, logits=logits_out
        )

    for index in range(n):
        if budgets[index] == 0:
            finish(index, truncated=True)
    active = [i for i in active if results[i] is None]
    if len(active) < n and active:
        y, left_pad = _keep(mx.array(active, dtype=mx.int32), cache, y, left_pad)

    step = 0
    while active:
        if kept is not None:
            for row, index in enumerate(active):
                kept[index].append(logits[row])
        # Keep the next step in flight while this one's tokens are read back.
        next_y = None
        if any(len(tokens[i]) + 1 < budgets[i] for i in active):
            key_mask = None
            if left_pad is not None:
                key_mask = (mx.arange(cache[0].offset + 1)[None, :] >= left_pad[:, None])[:, None, None, :]
            hidden = net.model(
                net.model.embed_tokens(y[:, None]), mask=key_mask, cache=cache, left_pad=left_pad
            )
            logits = net.logits(hidden[:, -1, :])
            next_y = mx.argmax(logits, axis=-1)
            mx.async_eval(next_y)
        step += 1
        step_tokens = y.tolist()
        if step == 1 and on_first_tokens is not None:
            on_first_tokens()  # the prompt is processed (benchmarks split prefill from decoding here)
        still: list[int] = []
        for index, token in zip(active, step_tokens):
            if token in eos_ids:
                finish(index)
                continue
            tokens[index].append(token)
            count = len(tokens[index])
            if count % LOOP_CHECK_EVERY == 0 and ends_in_loop(tokens[index]):
                finish(index, repetitive=True)
            elif count >= budgets[index]:
                finish(index, truncated=True)
            else:
                still.append(index)
        if not still:
            break
        if len(still) < len(active):
            row_of = {index: row for row, index in enumerate(active)}
            rows = mx.array([row_of[i] for i in still], dtype=mx.int32)
            next_y, left_pad = _keep(rows, cache, next_y, left_pad)
            if kept is not None:
                logits = logits[rows]
        active = still
        y = next_y
    return [r for r in results if r is not None]


def _keep(
    rows: mx.array, cache: list[KVCache], y: mx.array, left_pad: mx.array | None
) -> tuple[mx.array, mx.array | None]:
    """Shrink the batch to the listed rows (those still decoding)."""
    for layer_cache in cache:
        layer_cache.keep_rows(rows)
    return y[rows], None if left_pad is None else left_pad[rows]


def prefill_logits(net: Qwen3ASR, prompt_ids: list[int], audio_features: mx.array) -> mx.array:
    """Logits of every prompt position (for parity checks and scoring)."""
    ids = mx.array([prompt_ids], dtype=mx.int32)
    return net(net.embed(ids, audio_features))[0]
