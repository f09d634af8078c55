"""How many rows a batch may hold: the memory the process can still use, and the keys and values each
row caches.

Without a fixed batch size, the running batch takes as many segments as a share of the free memory
holds KV caches for. A row holds, in every decoder layer, keys and values for its prompt (the shared
prompt start copied in, then its own part) and for every token it may still decode; rows that join are right-aligned
with the running ones, so every row takes the widest prompt and the largest budget of the batch.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator

import mlx.core as mx
from mlx.utils import tree_flatten

from mlx_qwen3asr.checkpoints.loading import ASRModel
from mlx_qwen3asr.model.cache import KVCache

# Share of the available memory that the batch's KV cache may take.
MEMORY_FRACTION = 0.25


def available_memory() -> int:
    """Bytes the process can still use (GPU working set on Apple silicon, free RAM elsewhere).

    MLX's buffer cache (freed arrays kept for reuse) counts as used: it is released at joins and every
    few hundred decoding steps (model/generate.py), and a batch sized into it would keep it growing."""
    info = mx.device_info()
    limit = info.get("max_recommended_working_set_size") or info.get("memory_size")
    if limit:
        return max(0, int(limit) - mx.get_active_memory() - mx.get_cache_memory())
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2


def kv_bytes_per_position(model: ASRModel) -> int:
    """Bytes of keys and values that one cached position of one row takes, over all decoder layers."""
    t = model.config.text_config
    return 2 * t.num_hidden_layers * t.num_key_value_heads * t.head_dim * model.dtype.size


def rows_that_fit(
    rows: Iterable[tuple[int, int]],
    memory: int,
    per_position: int,
    shared: int = 0,
    running: tuple[int, int, int] = (0, 0, 0),
) -> int:
    """How many of these rows, taken in order, can join the running ones with the KV cache of them all
    in `memory` bytes; at least one when nothing runs.

    rows: (prompt positions after the shared start, token budget) of each new row. per_position:
    kv_bytes_per_position. shared: positions of the prompt start, computed once and copied into every
    row's cache. running: (rows, cached positions per row after the shared start, the largest token
    budget a running row has left).
    """
    count, width, budget = running
    memory -= shared * per_position
    n = 0
    for n, (prompt, tokens) in enumerate(rows, start=1):
        width, budget = max(width, prompt), max(budget, tokens)
        if (count + n) * (shared + KVCache.blocks(width + budget)) * per_position > memory:
            return n - 1 if count or n > 1 else 1
    return n


def metal_available() -> bool:
    """Whether MLX runs on Metal (Apple silicon), where weights can be wired into memory."""
    return mx.metal.is_available()


@contextlib.contextmanager
def wired_limit(model: ASRModel | None) -> Iterator[None]:
    """While a model generates on Metal: raise the wired limit to the recommended working set, so the
    weights and caches stay resident instead of being paged out between steps; the old limit is set
    back after (once the device is done). Nothing happens elsewhere."""
    if model is None or not metal_available():
        yield
        return
    limit = int(mx.device_info()["max_recommended_working_set_size"])
    weights = sum(a.nbytes for _, a in tree_flatten(model.net.parameters()))
    if weights > 0.9 * limit:
        # Wiring more than the working set would make the system swap: leave the limit alone.
        yield
        return
    old = mx.set_wired_limit(limit)
    try:
        yield
    finally:
        mx.synchronize()
        mx.set_wired_limit(old)


__all__ = [
    "MEMORY_FRACTION",
    "metal_available",
    "wired_limit",
    "available_memory",
    "kv_bytes_per_position",
    "rows_that_fit",
]
