"""Decoding after a draft: the tokens an earlier decode of nearly the same prompt wrote, checked in one
pass with the prompt and kept as far as greedy decoding picks them itself (what makes a live step cheap).

The work is split in two: `prefill_draft` prefills the prompt and the draft and keeps the draft's
right tokens (a `DraftStart`: the row's cache and its next pick), and the row then decodes on in a
DecodeBatch, alone (`decode_alone`) or beside other rows (`DraftStart.join`, the server's batch).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

import mlx.core as mx

from mlx_qwen3asr.model.batch import DecodeBatch, Generation, HeaderIds, Row, chosen_scores, ends_in_loop
from mlx_qwen3asr.model.cache import KVCache
from mlx_qwen3asr.model.prefill import Prefix, prefill_chunks
from mlx_qwen3asr.model.qwen3asr import Qwen3ASR


@dataclass
class DraftStart:
    """A prompt prefilled with its draft, the draft's right tokens kept: the row decodes on from here.

    done: the Generation when nothing is left to decode (EOS met within the draft). Otherwise cache
    holds one row (per layer; its prefix the prompt start it was prefilled after), `tokens` the draft
    tokens kept, with their `logprobs`, and y, logits, scores the row's next pick (not in the cache yet);
    budget: the tokens it may still decode.
    """

    tokens: list[int]
    logprobs: list[float]
    budget: int = 0
    cache: list[KVCache] | None = None
    y: mx.array | None = None
    logits: mx.array | None = None
    scores: mx.array | None = None
    done: Generation | None = None
    prompt_tokens: int = field(default=0)  # the row's positions after its prefix: prompt and kept tokens

    def join(self, batch: DecodeBatch, key: Hashable) -> None:
        """Let the row decode on in `batch` (under `key`): its cache is taken from the end of the
        batch's prompt start, which must be where this row's prompt begins (the same ids), so that the
        positions after it become the row's own. The row's keys and values of that start stay its own."""
        start = 0 if batch.prefix is None else len(batch.prefix.ids)
        caches = []
        for layer, c in enumerate(self.cache):
            if c.prefix_len < start:
                raise ValueError("a row prefilled after a shorter prompt start cannot join this batch")
            own = KVCache(None if batch.prefix is None else batch.prefix.layers[layer], c.left_pad)
            own.keys, own.values = c.keys, c.values
            own.offset = c.prefix_len + c.offset - start
            caches.append(own)
        self.cache = None
        row = Row(key, self.budget, [], [] if batch.keep_logits else None)
        batch.join([caches], [row], self.y, self.logits, self.scores)

    def finish(self, rest: Generation) -> Generation:
        """The whole Generation: the kept draft tokens, then what the row decoded."""
        tokens = self.tokens + rest.tokens
        return Generation(
            tokens,
            truncated=rest.truncated,
            repetitive=rest.repetitive or ends_in_loop(tokens),
            logprobs=self.logprobs + rest.logprobs,
            drafted=len(self.tokens),
        )


def prefill_draft(
    net: Qwen3ASR,
    prompt_ids: list[int],
    audio_features: mx.array,
    max_new_tokens: int,
    eos_ids: set[int] | frozenset[int],
    prefix: Prefix | None,
    draft: list[int],
    header: HeaderIds | None = None,
) -> DraftStart:
    """The prompt and the draft prefilled together (after `prefix`), the greedy picks at the draft's
    positions compared with it, and the cache cut back to the prompt and the tokens it got right.
    An empty draft is the prompt's prefill and its first pick. At most max_new_tokens - 1 draft tokens
    are checked, so that the row always has a token left to decode."""
    if int(max_new_tokens) <= 0:
        return DraftStart([], [], done=Generation([], truncated=True, repetitive=False))
    eos = frozenset(eos_ids)
    draft = [int(t) for t in draft][: max(0, int(max_new_tokens) - 1)]
    ids = [int(i) for i in prompt_ids] + draft
    embeds = net.embed(mx.array([ids], dtype=mx.int32), audio_features.reshape(-1, audio_features.shape[-1]))
    cache = net.make_cache(None if prefix is None else prefix.layers)
    n = len(draft) + 1  # the picks after the prompt's last token and after each draft token
    tail = []
    for start, stop, hidden in prefill_chunks(net, embeds, cache):
        if stop > len(ids) - n:
            tail.append(hidden[:, max(0, len(ids) - n - start) :, :])
    logits = net.logits(mx.concatenate(tail, axis=1)[0])
    picks = mx.argmax(logits, axis=-1)
    scores = chosen_scores(logits, picks, 0 if header is None else header.none)
    mx.eval(scores, [c.state for c in cache])
    rows = scores.tolist()
    tokens: list[int] = []
    logprobs: list[float] = []
    at = 0
    while True:
        token, logprob, _ = rows[at]
        token = int(token)
        if token in eos:
            logprobs.append(logprob)
            done = Generation(
                tokens, truncated=False, repetitive=False, logprobs=logprobs, drafted=len(tokens)
            )
            return DraftStart(tokens, logprobs, done=done)
        if at < len(draft) and token == draft[at]:
            tokens.append(token)
            logprobs.append(logprob)
            at += 1
            continue
        break
    # Picks 0..at-1 were the draft's; pick `at` is the model's own next token, not in the cache yet.
    for c in cache:
        c.offset = len(prompt_ids) + at
    return DraftStart(
        tokens,
        logprobs,
        budget=int(max_new_tokens) - len(tokens),
        cache=cache,
        y=picks[at : at + 1],
        logits=logits[at : at + 1],
        scores=scores[at : at + 1],
        prompt_tokens=len(prompt_ids) + at,
    )


def decode_alone(
    net: Qwen3ASR,
    start: DraftStart,
    eos_ids: set[int] | frozenset[int],
    prefix: Prefix | None,
    header: HeaderIds | None = None,
) -> Generation:
    """Decode a prefilled row on to its end in a batch of its own (`prefix`: the one it was prefilled
    after)."""
    if start.done is not None:
        return start.done
    batch = DecodeBatch(net, frozenset(eos_ids), prefix=prefix, header=header)
    start.join(batch, "draft")
    results: dict = {}
    while len(batch):
        results.update(batch.step())
    return start.finish(results["draft"])


__all__ = ["DraftStart", "decode_alone", "prefill_draft"]
