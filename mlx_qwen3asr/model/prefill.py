"""Prefill: prompts through the decoder into a KV cache, in chunks of PREFILL_CHUNK positions; a
prompt start shared by many prompts computed once (Prefix), and left-padded prompts prefilled together."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from mlx_qwen3asr.model.cache import KVCache
from mlx_qwen3asr.model.qwen3asr import Qwen3ASR

# Query positions per prefill call: bounds the attention scores of long prompts (a long context) to
# rows x heads x PREFILL_CHUNK x keys instead of a square of the prompt length per layer.
PREFILL_CHUNK = 512


@dataclass
class Prefix:
    """A prompt start shared by every row (system prompt and context), computed once.

    layers: per decoder layer, keys and values of shape (1, Hk, len(ids), D).
    audio_tokens: audio placeholders among `ids` (their features are in the keys and values only, so
    such a prefix is never recomputed from its ids).
    """

    ids: list[int]
    layers: list[tuple[mx.array, mx.array]]
    audio_tokens: int = 0

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.layers)


def prefill_chunks(
    net: Qwen3ASR, embeds: mx.array, cache: list[KVCache], chunk: int | None = None
) -> Iterator[tuple[int, int, mx.array]]:
    """Run (B, L, hidden) input embeddings through the decoder into `cache`, `chunk` positions at a time
    (default PREFILL_CHUNK): yields (start, stop, hidden states of positions start..stop).

    Chunks bound the attention scores of a long prompt to rows x heads x chunk x keys instead of a
    square of its length per layer; the cache is evaluated after each chunk but the last, and the
    masks are the cache's (causal, padding hidden), so the result is that of one pass.
    """
    chunk = chunk or PREFILL_CHUNK
    width = embeds.shape[1]
    for start in range(0, width, chunk):
        stop = min(start + chunk, width)
        yield start, stop, net.model(embeds[:, start:stop], cache=cache)
        if stop < width:
            mx.eval([c.state for c in cache])


def prefill_prefix(net: Qwen3ASR, ids: Sequence[int]) -> Prefix:
    """The decoder's keys and values for a prompt start, in chunks of PREFILL_CHUNK positions."""
    ids = [int(i) for i in ids]
    cache = net.make_cache()
    for _ in prefill_chunks(net, net.model.embed_tokens(mx.array([ids], dtype=mx.int32)), cache):
        pass
    layers = [c.held() for c in cache]
    mx.eval(layers)
    return Prefix(ids, layers)


def extend_prefix(
    net: Qwen3ASR, prefix: Prefix, ids: Sequence[int], audio_features: mx.array | None = None
) -> Prefix:
    """`prefix` followed by `ids`, whose audio placeholders take the rows of `audio_features` in order:
    the keys and values of the whole, for prompts that share more than the system prompt (a live
    window's audio up to its last complete encoder window)."""
    ids = [int(i) for i in ids]
    n_audio = sum(1 for i in ids if i == net.config.audio_token_id)
    if n_audio != (0 if audio_features is None else audio_features.shape[0]):
        raise ValueError(
            f"{n_audio} audio placeholders for {0 if audio_features is None else audio_features.shape[0]} features"
        )
    tokens = mx.array([ids], dtype=mx.int32)
    embeds = net.model.embed_tokens(tokens) if audio_features is None else net.embed(tokens, audio_features)
    cache = net.make_cache(prefix.layers)
    for _ in prefill_chunks(net, embeds, cache):
        pass
    layers = [c.held() for c in cache]
    mx.eval(layers)
    return Prefix(prefix.ids + ids, layers, prefix.audio_tokens + n_audio)


def prefill_padded(
    net: Qwen3ASR,
    prompts: Sequence[list[int]],
    audio_features: Sequence[mx.array],
    prefix: Prefix | None = None,
    at: Sequence[int] | None = None,
) -> tuple[list[KVCache], mx.array, mx.array | None]:
    """Prompts (after the shared prefix, when given) left-padded to one width through the decoder:
    its cache (which holds each row's padding), each row's last hidden state and, when `at` is given,
    each row's hidden state at position at[row] of its prompt.

    The padding is masked out of attention and every row's positions count from its own first token
    (after the prefix). Long prompts go through in chunks of PREFILL_CHUNK positions.
    """
    lengths = [len(p) for p in prompts]
    width = max(lengths)
    pad_counts = [width - length for length in lengths]
    ids = np.full((len(prompts), width), net.config.padding_id, dtype=np.int32)
    for row, prompt in enumerate(prompts):
        ids[row, pad_counts[row] :] = prompt
    features = mx.concatenate([f.reshape(-1, f.shape[-1]) for f in audio_features], axis=0)
    embeds = net.embed(mx.array(ids), features)
    left_pad = mx.array(pad_counts, dtype=mx.int32) if any(pad_counts) else None
    cache = net.make_cache(None if prefix is None else prefix.layers, left_pad)
    wanted = None if at is None else np.asarray(pad_counts) + np.asarray(at)
    last = picked = None
    for start, stop, hidden in prefill_chunks(net, embeds, cache):
        last = hidden[:, -1, :]
        inside = None if wanted is None else (wanted >= start) & (wanted < stop)
        if inside is not None and inside.any():
            index = mx.array(np.clip(wanted - start, 0, stop - start - 1), dtype=mx.int32)
            here = mx.take_along_axis(hidden, index[:, None, None], axis=1)[:, 0, :]
            picked = here if picked is None else mx.where(mx.array(inside)[:, None], here, picked)
            if stop < embeds.shape[1]:
                mx.eval(picked)  # no chunk's activations outlive it
    return cache, last, picked


__all__ = ["PREFILL_CHUNK", "Prefix", "extend_prefix", "prefill_chunks", "prefill_padded", "prefill_prefix"]
