"""Fit the approximations behind mlx_qwen3asr/model/ops.py (GELU, SiLU, softmax's exp) and check the committed ones.

GELU and SiLU are x * g(x) with a gate g = 1/2 + (an odd function saturating at +-1/2):
    GELU: g(x) = 1/2 + erf(x / sqrt 2) / 2      SiLU: g(x) = 1/2 + tanh(x / 2) / 2
We write the odd part as x * P(x^2) / Q(x^2) on |x| <= X, where it has reached +-1/2 in float32, and
fit P/Q by Sanathanan-Koerner iterations (linearised least squares reweighted by the last Q) followed
by Lawson reweighting towards the minimax error, all in float64 against math.erf / math.tanh.
Q is made monic so its top coefficient costs nothing.

Softmax's exp(t) = 2^n 2^f needs 2^f on (-1, 0]: a degree-6 polynomial fitted the same way (least
squares in relative error, Lawson-reweighted).

    python tools/fit_activations.py            # print the coefficient tables
    python tools/fit_activations.py --check    # refit and compare with the committed tables
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]

# name: (odd part h(x) = g(x) - 1/2, bound X, degree of P, degree of Q)
TARGETS = {
    "gelu": (lambda x: 0.5 * math.erf(x / math.sqrt(2.0)), 4.0 * math.sqrt(2.0), 5, 5),
    "silu": (lambda x: 0.5 * math.tanh(x / 2.0), 18.0, 4, 4),
}


def fit(h, bound: float, deg_p: int, deg_q: int, samples: int = 40001, iters: int = 60):
    """Coefficients (low to high) of P and monic Q with h(x) ~ x P(x^2) / Q(x^2) on [0, bound]."""
    x = np.linspace(bound / samples, bound, samples)
    f = np.array([h(t) for t in x]) / x  # even, smooth in v = x^2
    v = (x / bound) ** 2  # fitted in v / bound^2 in [0, 1] for conditioning, rescaled at the end
    vp = np.vander(v, deg_p + 1, increasing=True)
    vq = np.vander(v, deg_q + 1, increasing=True)
    q_prev = np.ones_like(v)
    weights = np.full_like(v, 1.0 / v.size)
    for it in range(iters):
        # P(v) - f Q(v) = 0 with Q's constant term 1, scaled by 1 / Q_prev (Sanathanan-Koerner).
        a = np.concatenate([vp, -f[:, None] * vq[:, 1:]], axis=1)
        w = np.sqrt(weights) / np.abs(q_prev)
        sol, *_ = np.linalg.lstsq(a * w[:, None], f * w, rcond=None)
        p = sol[: deg_p + 1]
        q = np.concatenate([[1.0], sol[deg_p + 1 :]])
        q_prev = vq @ q
        err = np.abs(x * (vp @ p) / q_prev - x * f)
        if it >= 5:  # Lawson: weight where the error is large
            weights = weights * (err / err.max()) + 1e-300
            weights /= weights.sum()
    if np.any(q <= 0):
        raise RuntimeError("fit produced a denominator with a non-positive coefficient (possible pole)")
    p = p / bound ** (2.0 * np.arange(deg_p + 1))
    q = q / bound ** (2.0 * np.arange(deg_q + 1))
    return p / q[-1], q / q[-1], float(err.max())


def fit_exp2(degree: int = 6, samples: int = 20001, iters: int = 60) -> tuple[list[float], float]:
    """Coefficients (low to high) of a polynomial ~ 2^f on [-1, 0], and its max relative error."""
    f = np.linspace(-1.0, 0.0, samples)
    y = 2.0**f
    vander = np.vander(f, degree + 1, increasing=True)
    weights = np.full_like(f, 1.0 / f.size)
    for _ in range(iters):
        w = np.sqrt(weights) / y
        c, *_ = np.linalg.lstsq(vander * w[:, None], y * w, rcond=None)
        err = np.abs(vander @ c - y) / y
        weights = weights * (err / err.max()) + 1e-300
        weights /= weights.sum()
    return [float(v) for v in c], float(err.max())


def tables() -> dict[str, tuple[list[float], list[float], float, float]]:
    out = {}
    for name, (h, bound, deg_p, deg_q) in TARGETS.items():
        p, q, err = fit(h, bound, deg_p, deg_q)
        out[name] = ([float(c) for c in p], [float(c) for c in q], bound, err)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="compare a fresh fit with the committed tables")
    args = parser.parse_args(argv)
    fitted = tables()
    exp2, exp2_err = fit_exp2()
    if not args.check:
        for name, (p, q, bound, err) in fitted.items():
            print(f"# {name}: |x| <= {bound!r}, max error of the odd part in float64 {err:.2e}")
            print(f"{name.upper()}_P = {tuple(p)!r}")
            print(f"{name.upper()}_Q = {tuple(q)!r}")
        print(f"# 2^f on (-1, 0]: max relative error in float64 {exp2_err:.2e}")
        print(f"EXP2 = {tuple(exp2)!r}")
        return 0
    sys.path.insert(0, str(REPO))
    from mlx_qwen3asr.model import ops

    worst = 0.0
    for name, (p, q, bound, _) in fitted.items():
        committed = ops.TABLES[name]
        assert committed.bound == bound, (name, committed.bound, bound)
        for mine, theirs in ((p, committed.p), (q, committed.q)):
            rel = np.abs(np.array(mine) - np.array(theirs)) / np.abs(np.array(mine))
            worst = max(worst, float(rel.max()))
    rel = np.abs(np.array(exp2) - np.array(ops.EXP2)) / np.abs(np.array(exp2))
    worst = max(worst, float(rel.max()))
    print(f"largest relative difference between refit and committed coefficients: {worst:.2e}")
    return 0 if worst < 1e-6 else 1


if __name__ == "__main__":
    raise SystemExit(main())
