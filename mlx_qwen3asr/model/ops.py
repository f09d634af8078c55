"""GELU, SiLU, softmax, attention and projections written to be fast on MLX's CPU backend.

These run on the CPU path only (runtime/backend.py); on the GPU path every function here hands over to MLX's
fused kernels (mx.fast.scaled_dot_product_attention, nn.gelu, nn.silu, mx.softmax, `x @ w.T`).

MLX's CPU kernels evaluate erf and exp one element at a time through library calls (about 28 ns per
element for GELU, 17 ns for SiLU and 12 ns for softmax on the reference machine): GELU was about 60%
of the audio encoder's time and softmax plus SiLU a quarter of the decoder's prefill. On the CPU these
are built instead from multiplies, adds, a divide and integer shifts, which MLX fuses into vectorised
kernels:

- GELU and SiLU are x * g(x) with g(x) = 1/2 + x P(x^2) / Q(x^2) for |x| <= X (a rational
  approximation of 1/2 + erf(x / sqrt 2) / 2, resp. of the sigmoid 1/2 + tanh(x / 2) / 2), and
  g = 1 above X, 0 below -X.
- exp(t) = 2^n 2^f with n = trunc(t log2 e), 2^f a polynomial on (-1, 0] and 2^n made from its bits.

The coefficients come from tools/fit_activations.py; errors are at the level of float32 rounding
(tests/test_ops.py). Other dtypes use MLX's own kernels on the CPU path too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import mlx.core as mx
import mlx.nn as nn

from mlx_qwen3asr.runtime.backend import cpu_path


@dataclass(frozen=True)
class Rational:
    """x P(x^2) / Q(x^2) approximating g(x) - 1/2 on |x| <= bound; coefficients low to high, Q monic."""

    p: tuple[float, ...]
    q: tuple[float, ...]
    bound: float


# tools/fit_activations.py
TABLES = {
    "gelu": Rational(
        p=(
            340588.859245475,
            29619.360658376583,
            4034.7591168787844,
            151.0761299817274,
            5.434302674125159,
            0.018628019166604858,
        ),
        q=(
            853729.8095783686,
            216532.0968057995,
            24860.79383913619,
            1648.2748519763798,
            64.91034707650485,
            1.0,
        ),
        bound=5.656854249492381,
    ),
    "silu": Rational(
        p=(
            83090173.22032213,
            2777948.0532762655,
            18106.143924088014,
            26.577745064638556,
            0.004279094131085201,
        ),
        q=(332360724.14469135, 38808488.82449557, 536801.2604870609, 1698.8523159420615, 1.0),
        bound=18.0,
    ),
}
# 2^f on (-1, 0], low to high (tools/fit_activations.py).
EXP2 = (
    0.9999999981331663,
    0.6931470125200574,
    0.2402239654572689,
    0.0554894178300586,
    0.009577005899974574,
    0.0012730489552703378,
    0.00010851074803637899,
)


def _fast_path(x: mx.array) -> bool:
    return cpu_path() and x.dtype == mx.float32


def _estrin(c: tuple[float, ...], x: mx.array, x2: mx.array, x4: mx.array) -> mx.array:
    """c0 + c1 x + ... + c7 x^7 (degree <= 7) in Estrin's form: a shallow graph that MLX fuses whole
    (it fuses at most 11 operations deep)."""
    c = c + (0.0,) * (8 - len(c))
    pairs = [
        c[i] if c[i + 1] == 0.0 else c[i] + (x if c[i + 1] == 1.0 else c[i + 1] * x) for i in (0, 2, 4, 6)
    ]
    low = pairs[0] + x2 * pairs[1]
    if c[4:] == (0.0,) * 4:
        return low
    high = pairs[2] if c[6:] == (0.0, 0.0) else pairs[2] + x2 * pairs[3]
    return low + x4 * high


# --------------------------------------------------------------------------------------------------
# GELU and SiLU
# --------------------------------------------------------------------------------------------------


class _GatedActivation:
    """x * g(x) as two fused kernels: the ratio P/Q, then the gate."""

    def __init__(self, table: Rational, fallback):
        def ratio(x: mx.array) -> mx.array:
            v = x * x
            v2 = v * v
            v4 = v2 * v2
            return _estrin(table.p, v, v2, v4) / _estrin(table.q, v, v2, v4)

        def gate(x: mx.array, r: mx.array) -> mx.array:
            # Beyond the bound the ratio is not used (it may overflow); the gate is exactly 0 or 1 there.
            g = mx.where(x > table.bound, 1.0, mx.where(x < -table.bound, 0.0, 0.5 + x * r))
            return x * g.astype(x.dtype)

        self.ratio = mx.compile(ratio, shapeless=True)
        self.gate = mx.compile(gate, shapeless=True)
        self.fallback = fallback

    def __call__(self, x: mx.array) -> mx.array:
        if not _fast_path(x):
            return self.fallback(x)
        return self.gate(x, self.ratio(x))


gelu = _GatedActivation(TABLES["gelu"], nn.gelu)
silu = _GatedActivation(TABLES["silu"], nn.silu)


# --------------------------------------------------------------------------------------------------
# Softmax and attention
# --------------------------------------------------------------------------------------------------

_LOG2E = 1.0 / math.log(2.0)


@partial(mx.compile, shapeless=True)
def _exp_parts(x: mx.array, top: mx.array) -> tuple[mx.array, mx.array]:
    """exp(x - top) for x <= top as 2^f (a polynomial, f in (-1, 0]) and the bits of 2^n (int32).

    Differences below 2^-127 (and masked -inf entries) give n = -127, whose bits are those of 0.0.
    """
    t = (x - top) * _LOG2E
    t = mx.where(t < -127.0, -127.0, t)
    n = t.astype(mx.int32)  # truncation: n = ceil(t) for t <= 0
    f = t - n.astype(t.dtype)
    f2 = f * f
    return _estrin(EXP2, f, f2, f2 * f2), (n + 127) << 23


_scale = mx.compile(lambda p, bits: p * bits, shapeless=True)
_divide = mx.compile(lambda e, total: e / total, shapeless=True)


def softmax(x: mx.array) -> mx.array:
    """Softmax over the last axis."""
    if not _fast_path(x):
        return mx.softmax(x, axis=-1, precise=True)
    poly, bits = _exp_parts(x, mx.max(x, axis=-1, keepdims=True))
    e = _scale(poly, bits.view(mx.float32))
    return _divide(e, e.sum(axis=-1, keepdims=True))


def causal_mask(length: int, width: int, left_pad: mx.array | None = None) -> mx.array:
    """Boolean (B or 1, 1, length, width) mask, True where a query may see a key.

    The queries are the last `length` of `width` positions and each sees the keys up to its own.
    left_pad: (B,) positions in front of each row's first real one (a left-padded batch). No real query
    sees a pad key; a pad query sees itself, so that no row of scores is all masked (a softmax of NaN),
    and nothing it produces reaches a real token.
    """
    query = mx.arange(width - length, width)[:, None]
    key = mx.arange(width)[None, :]
    causal = key <= query
    if left_pad is None:
        return causal[None, None]
    real_key = key[None] >= left_pad[:, None, None]
    return (causal[None] & (real_key | (key == query)[None]))[:, None]


def _mask_array(mask, length: int, width: int) -> mx.array | None:
    """An attention mask argument (None, "causal" or a boolean array) as None or a boolean array."""
    if isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"unknown mask {mask!r}")
        return causal_mask(length, width)
    return mask


def attention(q: mx.array, k: mx.array, v: mx.array, scale: float, mask=None) -> mx.array:
    """Scaled dot-product attention with grouped key/value heads, as mx.fast.scaled_dot_product_attention.

    q: (B, H, L, D); k, v: (B, Hk, S, D) with H a multiple of Hk; mask: None, "causal" (the last L of S
    positions) or a boolean array broadcastable to (B, 1, L, S), True where a query may see a key.
    """
    if not _fast_path(q):
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
    B, H, L, D = q.shape
    Hk, S = k.shape[1], k.shape[2]
    rep = H // Hk
    # Query heads that share a key/value head become extra rows of one product.
    scores = (q * scale).reshape(B, Hk, rep * L, D) @ k.swapaxes(-1, -2)
    mask = _mask_array(mask, L, S)
    if mask is not None:
        if mask.ndim != 4 or mask.shape[1] != 1:
            raise ValueError(f"mask must be (B or 1, 1, L or 1, S), got {mask.shape}")
        scores = mx.where(mask[:, :, None], scores.reshape(B, Hk, rep, L, S), -mx.inf).reshape(
            B, Hk, rep * L, S
        )
    return (softmax(scores) @ v).reshape(B, H, L, D)


def attention_with_prefix(
    q: mx.array, prefix_k: mx.array, prefix_v: mx.array, k: mx.array, v: mx.array, scale: float, mask=None
) -> mx.array:
    """attention() over a shared prefix followed by each row's own keys and values.

    prefix_k, prefix_v: (1, Hk, P, D), the same for every row and visible to every query (a system
    prompt computed once); k, v: (B, Hk, S, D), each row's own positions after it, which `mask`
    ("causal" or a boolean array, as in attention) applies to. One softmax runs over both parts.
    """
    B, H, L, D = q.shape
    Hk, P, S = k.shape[1], prefix_k.shape[2], k.shape[2]
    rep = H // Hk
    q = (q * scale).reshape(B, Hk, rep * L, D)
    # Rows of every batch entry share one product with the prefix (no copy of it per row).
    rows = q.transpose(1, 0, 2, 3).reshape(Hk, B * rep * L, D)
    shared = (rows @ prefix_k[0].swapaxes(-1, -2)).reshape(Hk, B, rep * L, P).transpose(1, 0, 2, 3)
    own = q @ k.swapaxes(-1, -2)
    mask = _mask_array(mask, L, S)
    if mask is not None:
        own = mx.where(mask[:, :, None], own.reshape(B, Hk, rep, L, S), -mx.inf).reshape(B, Hk, rep * L, S)
    weights = softmax(mx.concatenate([shared, own], axis=-1))
    w_shared = weights[..., :P].transpose(1, 0, 2, 3).reshape(Hk, B * rep * L, P)
    out = (w_shared @ prefix_v[0]).reshape(Hk, B, rep * L, D).transpose(1, 0, 2, 3)
    out = out + weights[..., P:] @ v
    return out.reshape(B, H, L, D)


# --------------------------------------------------------------------------------------------------
# Projections
# --------------------------------------------------------------------------------------------------

# Up to this many rows (decoding: one per sequence in the batch), a product runs weight-major on the CPU.
WEIGHT_MAJOR_ROWS = 3


def project(weight: mx.array, x: mx.array) -> mx.array:
    """x @ weight.T, computed as (weight @ x.T).T when x has very few rows on the CPU path.

    MLX's CPU backend hands every product to BLAS sgemm. With the weights as the left operand,
    OpenBLAS streams them faster for 1 to 3 rows (a 0.6b decode step: 180-230 ms against 250-310);
    from 4 rows on, that orientation's speed varies from process to process, often to twice the
    time, while x @ weight.T holds steady (4 rows 330 ms, 16 rows 440, 32 rows 660). Where the
    package's kernel for few rows is loaded (runtime/cpu.py), 1 to 8 rows run there in either orientation.
    """
    rows = x.size // x.shape[-1]
    if rows <= WEIGHT_MAJOR_ROWS and cpu_path():
        return (weight @ x.reshape(rows, -1).T).T.reshape(*x.shape[:-1], -1)
    return x @ weight.T


class Linear(nn.Linear):
    """nn.Linear whose bias-free products run weight-major for few rows on the CPU path (project).

    Quantization (nn.quantize) replaces it with nn.QuantizedLinear, as it does nn.Linear."""

    def __call__(self, x: mx.array) -> mx.array:
        if "bias" in self:
            return super().__call__(x)
        return project(self.weight, x)


__all__ = [
    "EXP2",
    "TABLES",
    "WEIGHT_MAJOR_ROWS",
    "Linear",
    "attention",
    "attention_with_prefix",
    "causal_mask",
    "gelu",
    "project",
    "silu",
    "softmax",
]
