"""Test audio made from numpy alone: importing it costs nothing (tests/reference.py, which re-exports it,
imports torch and the official implementation), so a process that needs only the audio starts fast."""

from __future__ import annotations

import numpy as np


def test_signal(seconds: float, seed: int = 0, sample_rate: int = 16000) -> np.ndarray:
    """Speech-like test audio: noise shaped by a syllable-rate envelope over a wandering tone."""
    rng = np.random.default_rng(seed)
    n = int(round(seconds * sample_rate))
    t = np.arange(n) / sample_rate
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 4.0 * t + rng.uniform(0, 2 * np.pi))
    tone = np.sin(2 * np.pi * (180 + 40 * np.sin(2 * np.pi * 0.5 * t)) * t)
    noise = rng.standard_normal(n)
    return (0.3 * envelope * (0.6 * tone + 0.4 * noise)).astype(np.float32)


test_signal.__test__ = False  # a helper, not a test
