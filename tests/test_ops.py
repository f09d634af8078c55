"""The CPU fast paths of mlx_qwen3asr.model.ops against float64 references and MLX's own kernels."""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from mlx_qwen3asr.model import ops


def grid() -> np.ndarray:
    # Dense over the approximated range and past both bounds, plus large values.
    x = np.concatenate([np.linspace(-40.0, 40.0, 200_001), [-1e6, -3e4, 3e4, 1e6, 1e30, -1e30]])
    return x.astype(np.float32)


def gelu64(x: np.ndarray) -> np.ndarray:
    return np.array([0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))) for v in x.astype(np.float64)])


def silu64(x: np.ndarray) -> np.ndarray:
    return np.array([v / (1.0 + math.exp(-v)) if v > -700 else -0.0 for v in x.astype(np.float64)])


@pytest.mark.parametrize("name, reference", [("gelu", gelu64), ("silu", silu64)])
def test_activation_matches_float64_to_float32_rounding(name, reference):
    x = grid()
    ours = np.array(getattr(ops, name)(mx.array(x))).astype(np.float64)
    want = reference(x)
    assert np.isfinite(ours).all()
    # Error relative to the output's magnitude (at least 1): float32 rounding of x * g(x) and of the
    # cancellation in 1/2 + (odd part) for negative x, as in the exact formula computed in float32.
    err = np.abs(ours - want) / np.maximum(np.abs(want), 1.0)
    assert err.max() < 3e-6, (name, float(x[err.argmax()]), float(err.max()))
    # For x > 0 (no cancellation), a few float32 ulps of relative error.
    positive = x > 0
    assert (np.abs(ours - want)[positive] / np.abs(want)[positive]).max() < 2e-6
    # Saturation: exactly x above the bound and exactly 0 below.
    bound = ops.TABLES[name].bound
    assert np.array_equal(ours[x > bound], x[x > bound].astype(np.float64))
    assert (ours[x < -bound] == 0).all()


@pytest.mark.parametrize("name, mlx_fn", [("gelu", nn.gelu), ("silu", nn.silu)])
def test_activation_matches_mlx_on_activations_of_any_shape(name, mlx_fn):
    x = mx.random.normal((3, 7, 129), key=mx.random.key(1)) * 4
    ours, theirs = getattr(ops, name)(x), mlx_fn(x)
    assert ours.shape == x.shape and ours.dtype == x.dtype
    assert mx.allclose(ours, theirs, rtol=2e-6, atol=2e-6).item()
    # Non-contiguous input (a transposed view) gives the same values.
    assert mx.array_equal(getattr(ops, name)(x.transpose(2, 0, 1)), ours.transpose(2, 0, 1)).item()


def test_activations_fall_back_for_other_dtypes():
    x = (mx.random.normal((64,), key=mx.random.key(2)) * 3).astype(mx.bfloat16)
    assert ops.gelu(x).dtype == mx.bfloat16
    assert mx.array_equal(ops.gelu(x), nn.gelu(x)).item()
    assert mx.array_equal(ops.silu(x), nn.silu(x)).item()


def test_softmax_matches_float64_and_masks_exactly():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((6, 5, 300)) * 20).astype(np.float32)
    x[0, 0, 5:] = -np.inf  # masked entries
    x[1, 1, :] = 3.0  # a flat row
    x[2, 2, 7] = 200.0  # everything else underflows to 0
    ours = np.array(ops.softmax(mx.array(x))).astype(np.float64)
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    want = e / e.sum(-1, keepdims=True)
    assert np.abs(ours - want).max() < 2e-6
    nonzero = want > 1e-30
    assert (np.abs(ours - want)[nonzero] / want[nonzero]).max() < 1e-5
    assert (ours[0, 0, 5:] == 0).all() and np.allclose(ours.sum(-1), 1.0, atol=2e-6)
    assert ours[2, 2, 7] == 1.0


def reference_attention(q, k, v, scale, mask):
    """float64 numpy attention with grouped heads, mask True where a query may see a key."""
    q, k, v = (np.array(a).astype(np.float64) for a in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    s = scale * q @ k.swapaxes(-1, -2)
    if mask is not None:
        s = np.where(np.array(mask), s, -np.inf)
    s = np.exp(s - s.max(-1, keepdims=True))
    return (s / s.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize(
    "B, H, Hk, L, S, D, mask_kind",
    [
        (1, 16, 8, 37, 37, 128, "causal"),  # prefill, grouped heads
        (2, 4, 4, 5, 9, 32, "causal"),  # last L of S positions
        (5, 16, 8, 1, 70, 64, None),  # decoding step, no padding
        (3, 16, 8, 1, 40, 64, "keys"),  # decoding step, left-padded rows
        (4, 14, 14, 26, 26, 64, "keys"),  # encoder windows with empty slots
        (3, 8, 2, 12, 12, 16, "full"),  # per-row (B, 1, L, S) mask
    ],
)
def test_attention_matches_reference_and_mlx(B, H, Hk, L, S, D, mask_kind):
    keys = mx.random.split(mx.random.key(3), 3)
    q = mx.random.normal((B, H, L, D), key=keys[0])
    k = mx.random.normal((B, Hk, S, D), key=keys[1])
    v = mx.random.normal((B, Hk, S, D), key=keys[2])
    rng = np.random.default_rng(4)
    if mask_kind == "causal":
        mask, dense = "causal", np.arange(S - L, S)[:, None] >= np.arange(S)[None, :]
    elif mask_kind == "keys":
        allowed = rng.random((B, S)) > 0.3
        allowed[:, -1] = True
        mask = mx.array(allowed[:, None, None, :])
        dense = np.broadcast_to(allowed[:, None, None, :], (B, 1, L, S))
    elif mask_kind == "full":
        allowed = rng.random((B, 1, L, S)) > 0.5
        allowed[..., 0] = True
        mask = dense = mx.array(allowed)
    else:
        mask = dense = None
    scale = D**-0.5
    ours = ops.attention(q, k, v, scale, mask)
    assert ours.shape == (B, H, L, D)
    want = reference_attention(q, k, v, scale, dense)
    assert np.abs(np.array(ours) - want).max() < 2e-5
    theirs = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
    assert mx.allclose(ours, theirs, atol=2e-5).item()


@pytest.mark.parametrize("L, S", [(1, 1), (1, 9), (4, 4), (3, 11)])
def test_causal_mask_hides_later_keys_and_each_rows_padding(L, S):
    """The last L of S positions see the keys up to their own; with left padding a real query sees no
    pad key and a pad query sees only itself (never an all-masked row)."""
    causal = np.arange(S - L, S)[:, None] >= np.arange(S)[None, :]
    plain = ops.causal_mask(L, S)
    assert plain.shape == (1, 1, L, S) and plain.dtype == mx.bool_
    np.testing.assert_array_equal(np.array(plain)[0, 0], causal)
    pads = [0, S - 1, S // 2]
    padded = np.array(ops.causal_mask(L, S, mx.array(pads, dtype=mx.int32)))
    assert padded.shape == (3, 1, L, S)
    for row, pad in enumerate(pads):
        for i, query in enumerate(range(S - L, S)):
            seen = [key for key in range(S) if padded[row, 0, i, key]]
            want = [query] if query < pad else [key for key in range(pad, query + 1)]
            assert seen == want, (row, query)


def test_attention_rejects_masks_it_cannot_broadcast():
    q = mx.zeros((1, 2, 3, 4))
    with pytest.raises(ValueError, match="mask"):
        ops.attention(q, q, q, 0.5, mx.ones((1, 2, 3, 3), dtype=mx.bool_))
    with pytest.raises(ValueError, match="unknown mask"):
        ops.attention(q, q, q, 0.5, "sliding")


def test_committed_coefficients_are_what_the_fitting_tool_produces():
    from tools.fit_activations import main as fit_main

    assert fit_main(["--check"]) == 0
