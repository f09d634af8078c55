"""The decoding step of a batch as one compiled function: traced once per shape, then replayed.

A one-row step of a small model is bound by the host, not the device: building its lazy graph and
launching its operations takes longer than running them. `mx.compile` traces the step once and
replays it, fusing the element-wise operations, so what the host pays per step no longer grows with
the model's depth. A trace is only valid for the shapes and the Python values it saw, so the step
takes everything that changes between steps as arrays:

- the cache as whole buffers of a fixed capacity (the prefix, then room for every row's positions to
  its budget, in blocks of KVCache.step), written at `write` with `mx.slice_update`;
- attention over the cache's first positions up to the query, rounded up to a block of
  ATTEND_BLOCK (the length of the `key_index` input, so that it is part of the trace's shapes), the
  positions not yet written masked: the work past the query stays under one block;
- the write position, each row's left padding, the prefix's length and the " None" id as arrays.

So a step is traced once per (rows, capacity, attended block, dtype) and replayed until rows join or
leave or the attended length passes a block: the traces a run makes are bounded by its batch sizes
and the blocks of its longest row, however many steps it takes. The modules are the same as the eager step's; only the cache object differs
(StepCache here, KVCache there).

Where MLX cannot compile (its CPU backend builds fused kernels with the system's C++ compiler), or
where compiling is switched off, the step runs eagerly, with one line in the log.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable

import mlx.core as mx

from mlx_qwen3asr.model.qwen3asr import Qwen3ASR

log = logging.getLogger(__name__)

# Set to "0" to run every decoding step eagerly.
ENV = "MLXASR_COMPILE"


class StepCache:
    """One decoder layer's cache inside the compiled step (the interface of KVCache that the decoder
    uses): whole-capacity keys and values, the write position and each row's rotary position as
    arrays, and the step's attention mask."""

    def __init__(self, keys, values, write: mx.array, positions: mx.array, mask: mx.array, attended: int):
        self.keys, self.values = keys, values
        self.attended = attended
        self.write = write
        self.positions = positions
        self._mask = mask

    def mask(self, length: int) -> mx.array:
        return self._mask

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        self.keys = mx.slice_update(self.keys, keys, self.write, axes=(2,))
        self.values = mx.slice_update(self.values, values, self.write, axes=(2,))
        return self.keys[..., : self.attended, :], self.values[..., : self.attended, :]


# Attention in a compiled step runs over the cache's positions up to the query rounded up to this.
ATTEND_BLOCK = 64


def attended(positions: int, capacity: int) -> int:
    """Positions a step attends over when `positions` (the query's included) are written."""
    return min(capacity, -(-int(positions) // ATTEND_BLOCK) * ATTEND_BLOCK)


def step_mask(key_index: mx.array, write: mx.array, left_pad: mx.array, prefix_len: mx.array) -> mx.array:
    """(rows, 1, 1, len(key_index)) True where the query written at `write` may see a key: the prefix,
    and each row's own positions up to its query (its left padding and the room not yet written
    hidden). key_index: the positions attended, 0, 1, 2, ..."""
    key = key_index[None, :]
    own = key >= prefix_len + left_pad[:, None]
    return ((key <= write) & ((key < prefix_len) | own))[:, None, None, :]


def chosen_scores(logits: mx.array, y: mx.array, none: int | mx.array) -> mx.array:
    """(rows, 3) float32: each row's chosen token (exact in float32 below 2**24), its log-probability
    (max - logsumexp) and the log-probability of `none`, so that one read-back carries all three."""
    logits = logits.astype(mx.float32)
    norm = mx.logsumexp(logits, axis=-1)
    picked = mx.take(logits, none, axis=-1)
    return mx.stack([y.astype(mx.float32), mx.max(logits, axis=-1) - norm, picked - norm], axis=1)


class Traces:
    """How many times the step was traced (each trace is one compile), for the tests and the bench."""

    count = 0


def _step(model: weakref.ref) -> Callable:
    # The model is held weakly: the compiled function is kept for it (compiled_step) and must not keep
    # it alive; a trace runs only while it lives.
    def step(y, write, left_pad, prefix_len, none, key_index, keys, values):
        Traces.count += 1
        net = model()
        mask = step_mask(key_index, write, left_pad, prefix_len)
        positions = write - left_pad  # the prefix's length plus the row's own positions before this one
        span = key_index.shape[0]
        caches = [StepCache(k, v, write, positions, mask, span) for k, v in zip(keys, values)]
        hidden = net.model(net.model.embed_tokens(y[:, None]), cache=caches)
        logits = net.logits(hidden[:, -1, :])
        next_y = mx.argmax(logits, axis=-1)
        scores = chosen_scores(logits, next_y, none)
        return next_y, logits, scores, [c.keys for c in caches], [c.values for c in caches]

    return mx.compile(step)


_compiled: dict[int, Callable] = {}
_lock = threading.Lock()
_usable: bool | None = None


def compiling() -> bool:
    """Whether decoding steps run compiled here: MLX can compile (checked once, with one line in the
    log when it cannot) and MLXASR_COMPILE is not "0"."""
    global _usable
    if os.environ.get(ENV, "1") == "0":
        return False
    if _usable is None:
        _usable = _can_compile()
        if not _usable:
            log.warning("MLX cannot compile here: decoding steps run eagerly (slower on a GPU)")
    return _usable


def _can_compile() -> bool:
    """A small function compiled and called twice must be traced once and give the eager result."""
    traced = []

    def probe(x):
        traced.append(1)
        return mx.sigmoid(x) * x + 1

    try:
        fn = mx.compile(probe)
        x = mx.arange(8, dtype=mx.float32)
        a, b = fn(x), fn(x + 1)
        mx.eval(a, b)
        return len(traced) == 1 and bool(mx.allclose(a, probe(x)))
    except Exception:  # noqa: BLE001 - any failure to compile means running eagerly
        return False


def compiled_step(net: Qwen3ASR) -> Callable:
    """The compiled step of this model, made once per model and dropped with it (with the traces
    MLX keeps for it). Calls are serialized: a step is built by one thread at a time."""
    key = id(net)
    with _lock:
        fn = _compiled.get(key)
        if fn is None:
            fn = _compiled[key] = _step(weakref.ref(net))
            weakref.finalize(net, _compiled.pop, key, None)

    def call(*args):
        with _lock:
            return fn(*args)

    return call


__all__ = [
    "ATTEND_BLOCK",
    "ENV",
    "StepCache",
    "Traces",
    "attended",
    "chosen_scores",
    "compiled_step",
    "compiling",
    "step_mask",
]
