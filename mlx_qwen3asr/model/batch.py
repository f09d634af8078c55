"""The decoding batch: rows decoded together greedily, one step at a time, joining and leaving between
steps (continuous batching), with each token's log-probability, the no-speech probability and the
runaway-loop stop."""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np

from mlx_qwen3asr.model.cache import KVCache
from mlx_qwen3asr.model.prefill import Prefix, prefill_padded
from mlx_qwen3asr.model.qwen3asr import Qwen3ASR
from mlx_qwen3asr.model.step import attended, chosen_scores, compiled_step, compiling
from mlx_qwen3asr.runtime.device import tuning

# A pattern of up to MAX_PERIOD tokens repeated REPEAT_THRESHOLD times in a row is a runaway loop.
REPEAT_THRESHOLD = 20
MAX_PERIOD = 20
LOOP_CHECK_EVERY = 16
# MLX keeps freed buffers for reuse; decoding releases them this often (and after every join), so the
# cache holds one step's worth rather than everything a long run ever freed.
CLEAR_CACHE_EVERY = 256


@dataclass(frozen=True)
class HeaderIds:
    """Tokens of the `language X<asr_text>` header that starts the model's answer, read from the
    checkpoint's tokenizer: the assistant's turn starts after `turn` (<|im_start|>); `language` is
    followed by the language's name, which is `none` (" None") for audio without speech."""

    turn: int
    language: int
    none: int

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> HeaderIds:
        """The ids as the tokenizer (token_to_id, encode) spells them; "language None" must be the two
        tokens "language" and " None", as in the Qwen3-ASR vocabulary."""
        pieces = tokenizer.encode("language None")
        if len(pieces) != 2:
            raise ValueError(f"the tokenizer spells 'language None' in {len(pieces)} tokens, not 2")
        return cls(turn=tokenizer.token_to_id("<|im_start|>"), language=pieces[0], none=pieces[1])


# Where no header is given: ids no prompt or answer holds, so no no-speech probability is read.
_NO_HEADER = HeaderIds(turn=-1, language=-1, none=0)


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


def _language_position(prompt: Sequence[int], header: HeaderIds) -> int | None:
    """Where the prompt's assistant turn holds "language" (a forced language): the position whose
    prediction is the language's name; None when the model is to name the language itself."""
    ids = np.asarray(prompt)
    turns = np.flatnonzero(ids == header.turn)
    if turns.size == 0:
        return None
    hits = np.flatnonzero(ids[turns[-1] :] == header.language)
    return int(turns[-1] + hits[0]) if hits.size else None


@dataclass
class Row:
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
    "language", projected through the LM head along with the last one. Without `header`
    (HeaderIds.from_tokenizer) no such probability is read and no_speech_prob stays None.

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
        header: HeaderIds | None = None,
    ):
        self.net, self.eos, self.prefix, self.keep_logits = net, frozenset(eos_ids), prefix, keep_logits
        self.header = header if header is not None else _NO_HEADER
        settings = tuning()
        self.prefill_rows = max(1, int(prefill_rows or settings.prefill_rows))
        self.rows: list[Row] = []
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
            Row(keys[i], int(max_new_tokens[i]), [], [] if self.keep_logits else None) for i in chosen
        ]
        positions = [_language_position(p, self.header) for p in prompts]
        caches, lasts = [], []
        for start in range(0, len(prompts), self.prefill_rows):
            rows = slice(start, start + self.prefill_rows)
            probed = [k for k, at in enumerate(positions[rows]) if at is not None]
            at = [len(p) - 1 if q is None else q for p, q in zip(prompts[rows], positions[rows])]
            cache, last, picked = prefill_padded(
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
        self.join(caches, new_rows, y, logits, chosen_scores(logits, y, self.header.none))
        return done

    def join(
        self,
        caches: list[list[KVCache]],
        new_rows: list[Row],
        y: mx.array,
        logits: mx.array,
        scores: mx.array,
    ) -> None:
        """Let prefilled rows join: stack the running rows' caches and the new ones (per layer, of this
        batch's prefix), every row right-aligned at the widest. y, logits, scores: each new row's next
        token, the distribution it came from and its chosen_scores. A join that fails leaves the
        batch empty."""
        try:
            self._stack(caches, new_rows, y, logits, scores)
        except BaseException:
            # Joining rewrites the running rows' cache layer by layer: part-way through, none of it
            # holds; the batch is left empty (its rows are gone) rather than inconsistent.
            self.rows, self.cache, self.y, self.scores, self.logits = [], None, None, None, None
            raise

    def _stack(self, caches, new_rows, y, logits, scores) -> None:
        parts = ([self.cache] if self.cache is not None else []) + caches
        width = max(c[0].offset for c in parts)
        remaining = max(r.budget - len(r.tokens) for r in self.rows + new_rows)
        # Room for every row to its budget, in whole blocks: the compiled step is traced per capacity.
        capacity = KVCache.blocks(width + remaining)
        joined = []
        for layer in range(len(self.net.model.layers)):
            joined.append(KVCache.stack([c[layer] for c in parts], capacity))
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
            next_y, next_logits, next_scores = self._forward()
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

    def _forward(self) -> tuple[mx.array, mx.array, mx.array]:
        """The next step's graph for every row: its tokens, logits and chosen_scores (model/step.py
        compiled, or built eagerly where MLX cannot compile)."""
        net, cache = self.net, self.cache
        if not compiling():
            hidden = net.model(net.model.embed_tokens(self.y[:, None]), cache=cache)
            logits = net.logits(hidden[:, -1, :])
            y = mx.argmax(logits, axis=-1)
            return y, logits, chosen_scores(logits, y, self.header.none)
        first = cache[0]
        for c in cache:
            c.reserve(1)
        left_pad = first.left_pad if first.left_pad is not None else mx.zeros((len(self.rows),), mx.int32)
        y, logits, scores, keys, values = compiled_step(net)(
            self.y,
            mx.array([first.prefix_len + first.offset], dtype=mx.int32),
            left_pad,
            mx.array(first.prefix_len, dtype=mx.int32),
            mx.array(self.header.none, dtype=mx.int32),
            mx.arange(attended(first.prefix_len + first.offset + 1, first.keys.shape[2]), dtype=mx.int32),
            [c.keys for c in cache],
            [c.values for c in cache],
        )
        for c, k, v in zip(cache, keys, values):
            c.keys, c.values = k, v
            c.offset += 1
        return y, logits, scores

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


__all__ = ["DecodeBatch", "Generation", "HeaderIds", "Row", "chosen_scores", "ends_in_loop"]
