"""Greedy decoding of one or many prompts with a KV cache, one step kept in flight: the entry points.

The work is in prefill.py (prompts into the cache), batch.py (the decoding batch) and draft.py
(decoding after a draft); their classes and functions are importable from here too. The knobs that
tests and benchmarks turn (LOOP_CHECK_EVERY, PREFILL_CHUNK) are read where they are used, in batch.py
and prefill.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import mlx.core as mx

from mlx_qwen3asr.model.batch import (
    DecodeBatch,
    Generation,
    HeaderIds,
    ends_in_loop,
)
from mlx_qwen3asr.model.draft import decode_alone, prefill_draft
from mlx_qwen3asr.model.prefill import Prefix, extend_prefix, prefill_chunks, prefill_prefix
from mlx_qwen3asr.model.qwen3asr import Qwen3ASR

# Audio tokens arrive at 12.5 per second and speech never needs more text tokens than that; the extra
# covers the `language X<asr_text>` header and very short segments.
TOKENS_PER_SECOND = 12.5
BUDGET_MARGIN = 32


def token_budget(seconds: float) -> int:
    """New-token budget for a segment of this duration."""
    return BUDGET_MARGIN + math.ceil(max(seconds, 0.0) * TOKENS_PER_SECOND)


def greedy_generate(
    net: Qwen3ASR,
    prompt_ids: list[int],
    audio_features: mx.array,
    max_new_tokens: int,
    eos_ids: set[int] | frozenset[int],
    keep_logits: bool = False,
    prefix: Prefix | None = None,
    draft: Sequence[int] = (),
    header: HeaderIds | None = None,
) -> Generation:
    """Decode one prompt greedily until EOS, the budget, or a runaway loop.

    draft: tokens the decoding is expected to start with (what an earlier decode of nearly the same
    prompt wrote). They go through the decoder with the prompt, in one pass, and are kept as far as
    greedy decoding picks them itself, position by position; decoding goes on from the first one it
    would not have picked. The tokens are those of decoding without a draft (up to the order of float
    sums); a draft that is right saves a decoding step per token.
    header: the answer's header ids (HeaderIds.from_tokenizer), for Generation.no_speech_prob; None:
    no such probability.
    """
    draft = [int(t) for t in draft][: max(0, int(max_new_tokens) - 1)]
    if draft and not keep_logits:
        # The prompt and the draft prefilled together, then a decode batch of one row from the first
        # token the draft got wrong.
        start = prefill_draft(net, prompt_ids, audio_features, max_new_tokens, eos_ids, prefix, draft, header)
        return decode_alone(net, start, eos_ids, prefix, header)
    batch = greedy_generate_batch(
        net,
        [prompt_ids],
        [audio_features],
        [max_new_tokens],
        eos_ids,
        keep_logits,
        prefix=prefix,
        header=header,
    )
    return batch[0]


def greedy_generate_batch(
    net: Qwen3ASR,
    prompts: Sequence[list[int]],
    audio_features: Sequence[mx.array],
    max_new_tokens: Sequence[int],
    eos_ids: set[int] | frozenset[int],
    keep_logits: bool = False,
    on_first_tokens: Callable[[], None] | None = None,
    prefix: Prefix | None = None,
    prefill_rows: int | None = None,
    header: HeaderIds | None = None,
) -> list[Generation]:
    """Decode several prompts together, each greedily until its EOS, budget, or a runaway loop.

    Prompts are left-padded to one length; the padding is masked out of attention and every row's
    positions count from its own first token, so each row decodes as it would alone. Rows that
    finish leave the batch (their cache rows are dropped), so the rest stop paying for them.
    prefix: a prompt start every row shares, computed once (prefill_prefix); `prompts` then hold
    what follows it. prefill_rows: rows per prefill call (default: the batch size tuning's).
    header: as for greedy_generate.
    """
    n = len(prompts)
    if not (n == len(audio_features) == len(max_new_tokens)):
        raise ValueError("prompts, audio_features and max_new_tokens must have the same length")
    batch = DecodeBatch(
        net, eos_ids, prefix=prefix, keep_logits=keep_logits, prefill_rows=prefill_rows, header=header
    )
    results: dict[int, Generation] = dict(batch.add(prompts, audio_features, max_new_tokens, range(n)))
    first = True
    while len(batch):
        finished = batch.step()
        if first and on_first_tokens is not None:
            on_first_tokens()  # the prompt is processed (benchmarks split prefill from decoding here)
        first = False
        results.update(finished)
    return [results[i] for i in range(n)]


__all__ = [
    "BUDGET_MARGIN",
    "TOKENS_PER_SECOND",
    "DecodeBatch",
    "Generation",
    "HeaderIds",
    "Prefix",
    "ends_in_loop",
    "extend_prefix",
    "greedy_generate",
    "greedy_generate_batch",
    "prefill_chunks",
    "prefill_prefix",
    "token_budget",
]
