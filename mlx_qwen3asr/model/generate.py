"""Greedy decoding of one or many prompts with a KV cache, one step kept in flight."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from mlx_qwen3asr.model.cache import KVCache
from mlx_qwen3asr.model.qwen3asr import Qwen3ASR
from mlx_qwen3asr.runtime.backend import tuning

# Audio tokens arrive at 12.5 per second and speech never needs more text tokens than that; the extra
# covers the `language X<asr_text>` header and very short segments.
TOKENS_PER_SECOND = 12.5
BUDGET_MARGIN = 32
# A pattern of up to MAX_PERIOD tokens repeated REPEAT_THRESHOLD times in a row is a runaway loop.
REPEAT_THRESHOLD = 20
MAX_PERIOD = 20
LOOP_CHECK_EVERY = 16


# Query positions per prefill call: bounds the attention scores of long prompts (a long context) to
# rows x heads x PREFILL_CHUNK x keys instead of a square of the prompt length per layer.
PREFILL_CHUNK = 512
# MLX keeps freed buffers for reuse; decoding releases them this often (and after every join), so the
# cache holds one step's worth rather than everything a long run ever freed.
CLEAR_CACHE_EVERY = 256


@dataclass(frozen=True)
class HeaderIds:
    """Tokens of the `language X<asr_text>` header that starts the model's answer, in the Qwen3-ASR
    vocabulary: the assistant's turn starts after `turn`; `language` is followed by the language's
    name, which is `none` (" None") for audio without speech."""

    turn: int = 151644  # <|im_start|>
    language: int = 11528  # "language"
    none: int = 2240  # " None"


HEADER = HeaderIds()


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


@dataclass
class Generation:
    """What decoding one prompt gave.

    logprobs: the log-probability (log-softmax) of each token of `tokens` as greedy decoding chose it,
    then that of the EOS that ended decoding, when one did (len(tokens) + 1 values then).
    no_speech_prob: the probability the model gave the language name " None" (audio without speech)
    where its answer names the language: in the prompt when it holds the header (a forced language),
    else at the step after the model wrote "language"; None when there is no such place.
    """

    tokens: list[int]
    truncated: bool  # stopped by the token budget before EOS
    repetitive: bool  # stopped because the output ran into a loop
    logits: list[mx.array] | None = None  # per step, when asked for (parity checks)
    logprobs: list[float] = field(default_factory=list)
    no_speech_prob: float | None = None
    drafted: int = 0  # leading tokens taken from a draft (greedy_generate) rather than decoded one by one


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
    draft: Sequence[int] = (),
) -> Generation:
    """Decode one prompt greedily until EOS, the budget, or a runaway loop.

    draft: tokens the decoding is expected to start with (what an earlier decode of nearly the same
    prompt wrote). They go through the decoder with the prompt, in one pass, and are kept as far as
    greedy decoding picks them itself, position by position; decoding goes on from the first one it
    would not have picked. The tokens are those of decoding without a draft (up to the order of float
    sums); a draft that is right saves a decoding step per token.
    """
    draft = [int(t) for t in draft][: max(0, int(max_new_tokens) - 1)]
    if draft and not keep_logits:
        return _generate_after_draft(net, prompt_ids, audio_features, max_new_tokens, eos_ids, prefix, draft)
    batch = greedy_generate_batch(
        net, [prompt_ids], [audio_features], [max_new_tokens], eos_ids, keep_logits, prefix=prefix
    )
    return batch[0]


def _generate_after_draft(
    net: Qwen3ASR,
    prompt_ids: list[int],
    audio_features: mx.array,
    max_new_tokens: int,
    eos_ids: set[int] | frozenset[int],
    prefix: Prefix | None,
    draft: list[int],
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
    scores = _chosen_scores(logits, picks, HEADER.none)
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
    batch = DecodeBatch(net, eos, prefix=prefix)
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


def _prefill(
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


def _language_position(prompt: Sequence[int], header: HeaderIds) -> int | None:
    """Where the prompt's assistant turn holds "language" (a forced language): the position whose
    prediction is the language's name; None when the model is to name the language itself."""
    ids = np.asarray(prompt)
    turns = np.flatnonzero(ids == header.turn)
    if turns.size == 0:
        return None
    hits = np.flatnonzero(ids[turns[-1] :] == header.language)
    return int(turns[-1] + hits[0]) if hits.size else None


def _chosen_scores(logits: mx.array, y: mx.array, none: int) -> mx.array:
    """(rows, 3) float32: each row's chosen token (exact in float32 below 2**24), its log-probability
    (max - logsumexp) and the log-probability of `none`, so that one read-back carries all three."""
    logits = logits.astype(mx.float32)
    norm = mx.logsumexp(logits, axis=-1)
    return mx.stack([y.astype(mx.float32), mx.max(logits, axis=-1) - norm, logits[:, none] - norm], axis=1)


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
) -> list[Generation]:
    """Decode several prompts together, each greedily until its EOS, budget, or a runaway loop.

    Prompts are left-padded to one length; the padding is masked out of attention and every row's
    positions count from its own first token, so each row decodes as it would alone. Rows that
    finish leave the batch (their cache rows are dropped), so the rest stop paying for them.
    prefix: a prompt start every row shares, computed once (prefill_prefix); `prompts` then hold
    what follows it. prefill_rows: rows per prefill call (default: the path's tuning).
    """
    n = len(prompts)
    if not (n == len(audio_features) == len(max_new_tokens)):
        raise ValueError("prompts, audio_features and max_new_tokens must have the same length")
    batch = DecodeBatch(net, eos_ids, prefix=prefix, keep_logits=keep_logits, prefill_rows=prefill_rows)
    results: dict[int, Generation] = dict(batch.add(prompts, audio_features, max_new_tokens, range(n)))
    first = True
    while len(batch):
        finished = batch.step()
        if first and on_first_tokens is not None:
            on_first_tokens()  # the prompt is processed (benchmarks split prefill from decoding here)
        first = False
        results.update(finished)
    return [results[i] for i in range(n)]


@dataclass
class _Row:
    key: Hashable
    budget: int
    tokens: list[int]
    logits: list[mx.array] | None
    logprobs: list[float] = field(default_factory=list)
    no_speech_prob: float | None = None

    def result(self, *, truncated: bool, repetitive: bool) -> Generation:
        return Generation(
            self.tokens,
            truncated=truncated,
            repetitive=repetitive,
            logits=self.logits,
            logprobs=self.logprobs,
            no_speech_prob=self.no_speech_prob,
        )


class DecodeBatch:
    """Rows decoded together greedily, one step at a time; new rows may join between steps.

    A decoding step reads every weight once however many rows it advances, so rows that finish are
    dropped at once and waiting prompts can take their place (continuous batching): `add` prefills the
    new prompts and joins their caches to the running ones, each row right-aligned with its own
    padding masked and its own positions, so every row decodes exactly as it would alone. The next
    step is kept in flight while the current tokens are read back.

    Every step also yields, on the device, each row's log-probability of the token it chose and of
    header.none (" None"), read back with the tokens: they make Generation.logprobs and, at the step
    after a row wrote "language", Generation.no_speech_prob. A prompt that already holds the header
    (a forced language) has that probability taken from its prefill, at the position after
    "language", projected through the LM head along with the last one.

    A shared prompt start (prefix) is computed once; its keys and values are copied into the cache of
    every row that joins, so that every attention is MLX's fused kernel over one contiguous cache.
    """

    def __init__(
        self,
        net: Qwen3ASR,
        eos_ids: set[int] | frozenset[int],
        *,
        prefix: Prefix | None = None,
        keep_logits: bool = False,
        prefill_rows: int | None = None,
        header: HeaderIds = HEADER,
    ):
        self.net, self.eos, self.prefix, self.keep_logits = net, frozenset(eos_ids), prefix, keep_logits
        self.header = header
        settings = tuning()
        self.prefill_rows = max(1, int(prefill_rows or settings.prefill_rows))
        self.rows: list[_Row] = []
        self.steps = 0  # decoding steps taken
        self.cache: list[KVCache] | None = None  # per layer; each holds the rows' padding (left_pad)
        self.y: mx.array | None = None  # (rows,) each row's next token, possibly still being computed
        self.scores: mx.array | None = None  # (rows, 3) with y: _chosen_scores of the same logits
        self.logits: mx.array | None = None  # (rows, vocab) the distribution y came from (keep_logits)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def keys(self) -> list[Hashable]:
        return [r.key for r in self.rows]

    def row_progress(self) -> list[tuple[Hashable, int, int]]:
        """Each running row's key, the tokens it has decoded so far and its budget (read from the
        counts kept on the host: nothing is evaluated)."""
        return [(r.key, len(r.tokens), r.budget) for r in self.rows]

    def add(
        self,
        prompts: Sequence[list[int]],
        audio_features: Sequence[mx.array],
        max_new_tokens: Sequence[int],
        keys: Sequence[Hashable],
    ) -> list[tuple[Hashable, Generation]]:
        """Prefill these prompts and join them to the batch; returns rows that are done at once
        (a budget of 0)."""
        done = []
        chosen = []
        for i, (key, budget) in enumerate(zip(keys, max_new_tokens)):
            if int(budget) <= 0:
                done.append(
                    (
                        key,
                        Generation(
                            [], truncated=True, repetitive=False, logits=[] if self.keep_logits else None
                        ),
                    )
                )
            else:
                chosen.append(i)
        if not chosen:
            return done
        prompts = [list(prompts[i]) for i in chosen]
        features = [audio_features[i] for i in chosen]
        new_rows = [
            _Row(keys[i], int(max_new_tokens[i]), [], [] if self.keep_logits else None) for i in chosen
        ]
        positions = [_language_position(p, self.header) for p in prompts]
        caches, lasts = [], []
        for start in range(0, len(prompts), self.prefill_rows):
            rows = slice(start, start + self.prefill_rows)
            probed = [k for k, at in enumerate(positions[rows]) if at is not None]
            at = [len(p) - 1 if q is None else q for p, q in zip(prompts[rows], positions[rows])]
            cache, last, picked = _prefill(
                self.net, prompts[rows], features[rows], self.prefix, at if probed else None
            )
            none = None
            if probed:
                # One more position per forced-language row through the LM head: where the model
                # would name the language.
                heads = self.net.logits(picked[mx.array(probed, dtype=mx.int32)]).astype(mx.float32)
                none = heads[:, self.header.none] - mx.logsumexp(heads, axis=-1)
            mx.eval(last, none, [c.state for c in cache])
            for k, value in zip(probed, [] if none is None else none.tolist()):
                new_rows[start + k].no_speech_prob = math.exp(value)
            caches.append(cache)
            lasts.append(last)
            mx.clear_cache()  # the group's activations are done with
        logits = self.net.logits(mx.concatenate(lasts, axis=0))
        y = mx.argmax(logits, axis=-1)
        try:
            self._join(caches, new_rows, y, logits, _chosen_scores(logits, y, self.header.none))
        except BaseException:
            # Joining rewrites the running rows' cache layer by layer: part-way through, none of it
            # holds; the batch is left empty (its rows are gone) rather than inconsistent.
            self.rows, self.cache, self.y, self.scores, self.logits = [], None, None, None, None
            raise
        return done

    def _join(
        self,
        caches: list[list[KVCache]],
        new_rows: list[_Row],
        y: mx.array,
        logits: mx.array,
        scores: mx.array,
    ) -> None:
        """Stack the running rows' caches and the new ones, every row right-aligned at the widest."""
        parts = ([self.cache] if self.cache is not None else []) + caches
        width = max(c[0].offset for c in parts)
        remaining = max(r.budget - len(r.tokens) for r in self.rows + new_rows)
        joined = []
        for layer in range(len(self.net.model.layers)):
            joined.append(KVCache.stack([c[layer] for c in parts], width + remaining))
            for c in parts:
                c[layer] = None  # each part's layer is freed once joined
            mx.eval(joined[-1].state)
        self.cache = joined
        self.y = y if self.y is None else mx.concatenate([self.y, y])
        self.scores = scores if self.scores is None else mx.concatenate([self.scores, scores])
        if self.keep_logits:
            self.logits = logits if self.logits is None else mx.concatenate([self.logits, logits])
        self.rows.extend(new_rows)
        mx.async_eval(self.y, self.scores)
        mx.clear_cache()  # the parts' caches, copied into the joined one

    def step(self) -> list[tuple[Hashable, Generation]]:
        """Take every row's next token; returns the rows that finished (EOS, budget or a loop)."""
        if not self.rows:
            return []
        if self.keep_logits:
            for row, r in enumerate(self.rows):
                r.logits.append(self.logits[row])
        # Keep the next step in flight while this one's tokens are read.
        next_y = next_logits = next_scores = None
        self.steps += 1
        if self.steps % CLEAR_CACHE_EVERY == 0:
            mx.clear_cache()
        if any(len(r.tokens) + 1 < r.budget for r in self.rows):
            net = self.net
            hidden = net.model(net.model.embed_tokens(self.y[:, None]), cache=self.cache)
            next_logits = net.logits(hidden[:, -1, :])
            next_y = mx.argmax(next_logits, axis=-1)
            next_scores = _chosen_scores(next_logits, next_y, self.header.none)
            mx.async_eval(next_y, next_scores)
        finished, still = [], []
        language = self.header.language
        for row, (r, (token, logprob, none)) in enumerate(zip(self.rows, self.scores.tolist())):
            token = int(token)
            if r.no_speech_prob is None and len(r.tokens) == 1 and r.tokens[0] == language:
                r.no_speech_prob = math.exp(none)  # this step names the language
            r.logprobs.append(logprob)
            if token in self.eos:
                finished.append((r.key, r.result(truncated=False, repetitive=False)))
                continue
            r.tokens.append(token)
            count = len(r.tokens)
            if count % LOOP_CHECK_EVERY == 0 and ends_in_loop(r.tokens):
                finished.append((r.key, r.result(truncated=False, repetitive=True)))
            elif count >= r.budget:
                finished.append((r.key, r.result(truncated=True, repetitive=False)))
            else:
                still.append(row)
        if not still:
            self.rows, self.cache, self.y, self.scores, self.logits = [], None, None, None, None
            return finished
        if len(still) < len(self.rows):
            keep = mx.array(still, dtype=mx.int32)
            next_y = _keep(keep, self.cache, next_y)
            next_scores = next_scores[keep]
            if next_logits is not None and self.keep_logits:
                next_logits = next_logits[keep]
            self.rows = [self.rows[i] for i in still]
        self.y, self.scores, self.logits = next_y, next_scores, next_logits
        return finished

    def drop(self, keys: set[Hashable]) -> None:
        """Remove these rows (their requests went away) without finishing them."""
        still = [i for i, r in enumerate(self.rows) if r.key not in keys]
        if len(still) == len(self.rows):
            return
        if not still:
            self.rows, self.cache, self.y, self.scores, self.logits = [], None, None, None, None
            return
        keep = mx.array(still, dtype=mx.int32)
        self.y = _keep(keep, self.cache, self.y)
        self.scores = self.scores[keep]
        if self.logits is not None:
            self.logits = self.logits[keep]
        self.rows = [self.rows[i] for i in still]


def _keep(rows: mx.array, cache: list[KVCache], y: mx.array) -> mx.array:
    """Shrink the batch to the listed rows (those still decoding); returns their tokens."""
    for layer_cache in cache:
        layer_cache.keep_rows(rows)
    return y[rows]


def prefill_logits(net: Qwen3ASR, prompt_ids: list[int], audio_features: mx.array) -> mx.array:
    """Logits of every prompt position (for parity checks and scoring)."""
    ids = mx.array([prompt_ids], dtype=mx.int32)
    return net(net.embed(ids, audio_features))[0]
