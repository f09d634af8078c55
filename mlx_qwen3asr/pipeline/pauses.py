"""Where a live window can be committed: pauses and quiet points found from the audio's energy.

A pause is PAUSE_MS whose every PAUSE_STEP_MS holds under PAUSE_ENERGY x the median energy of the
audio's PAUSE_MS stretches (20 dB under it): an onset or a word's tail next to silence is no pause.
Without one, the quietest QUIET_WINDOW_MS (the low-energy rule of ``audio.cutting``) is the cut.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from mlx_qwen3asr.audio.cutting import quietest_sample
from mlx_qwen3asr.audio.features import SAMPLE_RATE

# Energy window of the quiet-point search (the official low-energy rule uses 100 ms).
QUIET_WINDOW_MS = 100.0
# A decode whose end has the PAUSE_MS around it under PAUSE_ENERGY x the window's median energy (per
# PAUSE_MS) ended in a pause: a commit can take its output as it is.
PAUSE_MS = 200.0
PAUSE_ENERGY = 0.01
PAUSE_STEP_MS = 25.0  # every 25 ms of it: an onset or a word's tail next to silence is no pause

QUIET_WINDOW = max(4, int(QUIET_WINDOW_MS / 1000.0 * SAMPLE_RATE))
_STEP = max(1, int(PAUSE_STEP_MS / 1000.0 * SAMPLE_RATE))
PAUSE_HALF_SAMPLES = int(PAUSE_MS / 2000.0 * SAMPLE_RATE)  # a decode's end at least this far in


class Heard(Protocol):
    samples: int  # where a decode of the window ended


def quietest(audio: np.ndarray, left: int, right: int) -> int:
    """The quietest sample of the quietest QUIET_WINDOW_MS in [left, right) (right when too short)."""
    if right - left <= QUIET_WINDOW:
        return right
    return left + quietest_sample(audio[left:right], QUIET_WINDOW)


def loudness(audio: np.ndarray, at: int) -> float:
    """Mean magnitude of the QUIET_WINDOW_MS centred on sample `at`."""
    half = QUIET_WINDOW // 2
    around = audio[max(0, at - half) : at + half]
    return float(np.abs(around, dtype=np.float64).mean()) if around.size else 0.0


def pause_floor(audio: np.ndarray) -> tuple[np.ndarray, float | None]:
    """Per-sample power and the pause floor: PAUSE_ENERGY x the median energy of the audio's PAUSE_MS
    stretches (None when it is shorter than one)."""
    width = 2 * PAUSE_HALF_SAMPLES
    power = audio.astype(np.float64) ** 2
    frames = power[: power.shape[0] // width * width].reshape(-1, width).mean(axis=1)
    return power, (PAUSE_ENERGY * float(np.median(frames)) if frames.size else None)


def latest_pause(audio: np.ndarray, left: int, right: int) -> int | None:
    """The middle of the latest PAUSE_MS in [left, right) whose every PAUSE_STEP_MS is under the pause
    floor, or None."""
    power, floor = pause_floor(audio)
    need = max(1, int(round(PAUSE_MS / PAUSE_STEP_MS)))
    n = (right - left) // _STEP
    if floor is None or n < need:
        return None
    quiet = power[left : left + n * _STEP].reshape(n, _STEP).mean(axis=1) <= floor
    run = np.convolve(quiet.astype(np.int32), np.ones(need, dtype=np.int32), mode="valid")
    full = np.flatnonzero(run == need)
    if full.size == 0:
        return None
    return left + int(full[-1]) * _STEP + need * _STEP // 2


def ended_in_pause(audio: np.ndarray, points: Sequence[Heard]) -> Heard | None:
    """The latest of `points` (decodes of the window) whose end lies in a pause: every PAUSE_STEP_MS of
    the PAUSE_MS around it under the pause floor of `audio`, each at least PAUSE_HALF_SAMPLES in. None
    when there is none."""
    if not points:
        return None
    power, floor = pause_floor(audio)
    if floor is None:
        return None
    for h in reversed(points):
        around = power[h.samples - PAUSE_HALF_SAMPLES : h.samples + PAUSE_HALF_SAMPLES]
        around = around[: around.size // _STEP * _STEP].reshape(-1, _STEP)
        if around.size and float(around.mean(axis=1).max()) <= floor:
            return h
    return None


__all__ = [
    "PAUSE_ENERGY",
    "PAUSE_HALF_SAMPLES",
    "PAUSE_MS",
    "PAUSE_STEP_MS",
    "QUIET_WINDOW_MS",
    "ended_in_pause",
    "latest_pause",
    "loudness",
    "pause_floor",
    "quietest",
]
