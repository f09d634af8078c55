"""The decoder's key/value cache: one per layer, holding a batch of rows that may be left-padded."""

from __future__ import annotations

import mlx.core as mx


def causal(length: int) -> str | None:
    """The mask of `length` new queries that each see every key up to their own: "causal" (built by the
    attention kernel itself, the queries being the last `length` keys), or none for a single query."""
    return "causal" if length > 1 else None


def causal_mask(length: int, width: int, left_pad: mx.array | None = None, prefix: int = 0) -> mx.array:
    """Boolean (B or 1, 1, length, width) mask, True where a query may see a key.

    The queries are the last `length` of `width` positions and each sees the keys up to its own.
    prefix: the first `prefix` keys (a shared prompt start) are seen by every query.
    left_pad: (B,) pad positions after the prefix and in front of each row's first real one (a
    left-padded batch). No real query sees a pad key; a pad query sees itself, so that no row of scores
    is all masked (a softmax of NaN), and nothing it produces reaches a real token.
    """
    query = mx.arange(width - length, width)[:, None]
    key = mx.arange(width)[None, :]
    causal = key <= query
    if left_pad is None:
        return causal[None, None]
    real_key = (key[None] >= left_pad[:, None, None] + prefix) | (key[None] < prefix)
    return (causal[None] & (real_key | (key == query)[None]))[:, None]


class KVCache:
    """Keys and values of one decoder layer, grown in steps so decoding appends without copying.

    A cache may start from a shared prefix (keys and values of a prompt start that every row has,
    batch 1, computed once): its keys and values are copied into every row's cache when the rows are
    first written, so attention always runs over one contiguous cache (MLX's fused kernel). `offset`
    counts only the row's own positions after it.

    Rows of different lengths are right-aligned after the prefix: `left_pad` (B,) counts the pad
    positions between the prefix and each row's first real one (None when no row has any). The cache
    then gives every row its own positions (`positions`) and hides the pad keys (`mask`), so each row
    is computed as it would be alone.
    """

    step = 256

    def __init__(self, prefix: tuple[mx.array, mx.array] | None = None, left_pad: mx.array | None = None):
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.offset = 0
        self.prefix = prefix
        self.prefix_len = 0 if prefix is None else prefix[0].shape[2]
        self.left_pad = left_pad

    @property
    def positions(self) -> int | mx.array:
        """Rotary position of the next query: after the prefix and the positions held. Per row (B,) when
        rows are left-padded: a row's first real token follows the prefix directly, its pads come before."""
        offset = self.prefix_len + self.offset
        return offset if self.left_pad is None else offset - self.left_pad

    def mask(self, length: int):
        """The attention mask of the next `length` queries over the keys held and theirs (the prefix is
        seen by every query): causal, and with the pad keys hidden when rows are left-padded."""
        if self.left_pad is None:
            return causal(length)
        return causal_mask(length, self.prefix_len + self.offset + length, self.left_pad, self.prefix_len)

    def _grow(self, B: int, L: int, keys: mx.array, values: mx.array) -> None:
        """Room for L more positions: a first allocation starts with the prefix copied into every row."""
        P, prev = self.prefix_len, self.offset
        n_steps = (self.step + L - 1) // self.step
        H, Dk, Dv = keys.shape[1], keys.shape[3], values.shape[3]
        grow_k = mx.zeros((B, H, n_steps * self.step, Dk), dtype=keys.dtype)
        grow_v = mx.zeros((B, H, n_steps * self.step, Dv), dtype=values.dtype)
        if self.keys is not None:
            self.keys = mx.concatenate([self.keys[..., : P + prev, :], grow_k], axis=2)
            self.values = mx.concatenate([self.values[..., : P + prev, :], grow_v], axis=2)
        elif P:
            pk, pv = self.prefix
            self.keys = mx.concatenate(
                [mx.broadcast_to(pk, (B, H, P, Dk)).astype(keys.dtype), grow_k], axis=2
            )
            self.values = mx.concatenate(
                [mx.broadcast_to(pv, (B, H, P, Dv)).astype(values.dtype), grow_v], axis=2
            )
        else:
            self.keys, self.values = grow_k, grow_v

    @classmethod
    def blocks(cls, positions: int) -> int:
        """`positions` rounded up to whole steps of growth."""
        return -(-int(positions) // cls.step) * cls.step

    def reserve(self, length: int) -> None:
        """Room for `length` more positions after those held (a cache already written)."""
        if self.keys is not None and self.prefix_len + self.offset + length > self.keys.shape[2]:
            self._grow(self.keys.shape[0], length, self.keys, self.values)

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Append (B, Hk, L, D) keys and values; returns every key and value a query now sees."""
        B, _, L, _ = keys.shape
        P, prev = self.prefix_len, self.offset
        if self.keys is None or P + prev + L > self.keys.shape[2]:
            self._grow(B, L, keys, values)
        self.offset += L
        self.keys[..., P + prev : P + self.offset, :] = keys
        self.values[..., P + prev : P + self.offset, :] = values
        return self.keys[..., : P + self.offset, :], self.values[..., : P + self.offset, :]

    def held(self) -> tuple[mx.array, mx.array]:
        """The keys and values held, prefix included: (B, Hk, prefix_len + offset, D)."""
        end = self.prefix_len + self.offset
        return self.keys[..., :end, :], self.values[..., :end, :]

    @classmethod
    def stack(cls, caches: list[KVCache], capacity: int = 0) -> KVCache:
        """One cache holding the rows of several (of one prefix), each one's own positions right-aligned
        at the largest offset.

        Rows of a shorter cache get zero keys and values between the prefix and their own, counted in
        the result's `left_pad` (and so masked). The result has room for `capacity` own positions (at
        least the largest offset); past them it grows in steps as usual.
        """
        width = max(c.offset for c in caches)
        capacity = max(capacity, width)
        P = caches[0].prefix_len
        if any(c.prefix_len != P for c in caches):
            raise ValueError("caches of different prompt starts cannot be stacked")

        def aligned(a: mx.array, offset: int) -> mx.array:
            own = mx.pad(
                a[..., P : P + offset, :], [(0, 0), (0, 0), (width - offset, capacity - width), (0, 0)]
            )
            return mx.concatenate([a[..., :P, :], own], axis=2) if P else own

        out = cls(caches[0].prefix)
        out.keys = mx.concatenate([aligned(c.keys, c.offset) for c in caches], axis=0)
        out.values = mx.concatenate([aligned(c.values, c.offset) for c in caches], axis=0)
        out.offset = width
        out.left_pad = _joined_padding(caches, width)
        return out

    def keep_rows(self, rows: mx.array) -> None:
        """Drop the batch rows not listed (finished sequences stop costing attention work)."""
        if self.keys is not None:
            self.keys, self.values = self.keys[rows], self.values[rows]
        if self.left_pad is not None:
            self.left_pad = self.left_pad[rows]

    @property
    def state(self) -> list[mx.array]:
        return [] if self.keys is None else [self.keys, self.values]


def _joined_padding(caches: list[KVCache], width: int) -> mx.array | None:
    """The left padding of the caches' rows stacked and right-aligned at `width`; None when no row has any."""
    if all(c.left_pad is None and c.offset == width for c in caches):
        return None
    pads = []
    for c in caches:
        own = c.left_pad if c.left_pad is not None else mx.zeros((c.keys.shape[0],), dtype=mx.int32)
        pads.append(own + (width - c.offset))
    left_pad = mx.concatenate(pads)
    # A narrower cache pads every row of its own; otherwise only the rows' own padding can be left.
    if any(c.offset != width for c in caches) or bool(mx.any(left_pad > 0)):
        return left_pad
    return None


__all__ = ["KVCache", "causal", "causal_mask"]
