"""The decoder's key/value cache: one per layer, holding a batch of rows that may be left-padded."""

from __future__ import annotations

import mlx.core as mx

from mlx_qwen3asr.model.ops import causal_mask


def causal(length: int) -> str | None:
    """The mask of `length` new queries that each see every key up to their own: "causal" (built by the
    attention kernel itself), or none at all for a single query."""
    return "causal" if length > 1 else None


class KVCache:
    """Keys and values of one decoder layer, grown in steps so decoding appends without copying.

    A cache may start from a shared prefix (keys and values of a prompt start that every row has,
    batch 1): it is attended to by every row without being copied per row, and `offset` counts only
    the row's own positions after it.

    Rows of different lengths are right-aligned: `left_pad` (B,) counts the pad positions in front of
    each row's first real one (None when no row has any). The cache then gives every row its own
    positions (`positions`) and hides the pad keys (`mask`), so each row is computed as it would be alone.
    """

    step = 256

    def __init__(self, prefix: tuple[mx.array, mx.array] | None = None, left_pad: mx.array | None = None):
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.offset = 0
        self.prefix = prefix
        self.left_pad = left_pad

    @property
    def prefix_len(self) -> int:
        return 0 if self.prefix is None else self.prefix[0].shape[2]

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
        return causal_mask(length, self.offset + length, self.left_pad)

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        B, H, L, Dk = keys.shape
        prev = self.offset
        if self.keys is None or prev + L > self.keys.shape[2]:
            n_steps = (self.step + L - 1) // self.step
            grow_k = mx.zeros((B, H, n_steps * self.step, Dk), dtype=keys.dtype)
            grow_v = mx.zeros((B, H, n_steps * self.step, values.shape[3]), dtype=values.dtype)
            if self.keys is not None:
                self.keys = mx.concatenate([self.keys[..., :prev, :], grow_k], axis=2)
                self.values = mx.concatenate([self.values[..., :prev, :], grow_v], axis=2)
            else:
                self.keys, self.values = grow_k, grow_v
        self.offset += L
        self.keys[..., prev : self.offset, :] = keys
        self.values[..., prev : self.offset, :] = values
        return self.keys[..., : self.offset, :], self.values[..., : self.offset, :]

    @classmethod
    def stack(cls, caches: list[KVCache], capacity: int = 0) -> KVCache:
        """One cache holding the rows of several, each one's positions right-aligned at the largest offset.

        Rows of a shorter cache get zero keys and values in front, counted in the result's `left_pad`
        (and so masked). The result has room for `capacity` positions (at least the largest offset);
        past them it grows in steps as usual.
        """
        width = max(c.offset for c in caches)
        capacity = max(capacity, width)

        def aligned(a: mx.array, offset: int) -> mx.array:
            return mx.pad(a[..., :offset, :], [(0, 0), (0, 0), (width - offset, capacity - width), (0, 0)])

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


__all__ = ["KVCache", "causal"]
