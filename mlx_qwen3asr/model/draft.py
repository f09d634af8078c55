"""Decoding after a draft: the tokens an earlier decode of nearly the same prompt wrote, checked in one
pass with the prompt and kept as far as greedy decoding picks them itself (what makes a live step cheap)."""

from __future__ import annotations

import mlx.core as mx

from mlx_qwen3asr.model.batch import DecodeBatch, Generation, HeaderIds, _Row, chosen_scores, ends_in_loop
from mlx_qwen3asr.model.prefill import Prefix, prefill_chunks
from mlx_qwen3asr.model.qwen3asr import Qwen3ASR


def generate_after_draft(
    net: Qwen3ASR,
    prompt_ids: list[int],
    audio_features: mx.array,
    max_new_tokens: int,
    eos_ids: set[int] | frozenset[int],
    prefix: Prefix | None,
    draft: list[int],
    header: HeaderIds | None = None,
) -> Generation:
    """greedy_generate with a draft: the prompt and the draft prefilled together, the greedy picks at
    the draft's positions compared with it, the cache cut back to the prompt and the accepted tokens,
    and a decode batch of one row started there."""
    eos = frozenset(eos_ids)
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
        logprobs.append(logprob)
        if token in eos:
            return Generation(
                tokens, truncated=False, repetitive=False, logprobs=logprobs, drafted=len(tokens)
            )
        if at < len(draft) and token == draft[at]:
            tokens.append(token)
            at += 1
            continue
        break
    # Picks 0..at-1 were the draft's; pick `at` is the model's own next token, not in the cache yet.
    for c in cache:
        c.offset = len(prompt_ids) + at
    logprobs.pop()
    budget = int(max_new_tokens) - len(tokens)
    batch = DecodeBatch(net, eos, prefix=prefix, header=header)
    row = _Row("draft", budget, [], None)
    y = picks[at : at + 1]
    batch._join([cache], [row], y, logits[at : at + 1], scores[at : at + 1])
    results: dict = {}
    while len(batch):
        results.update(batch.step())
    rest = results["draft"]
    return Generation(
        tokens + rest.tokens,
        truncated=rest.truncated,
        repetitive=rest.repetitive or ends_in_loop(tokens + rest.tokens),
        logprobs=logprobs + rest.logprobs,
        drafted=len(tokens),
    )


__all__ = ["generate_after_draft"]
