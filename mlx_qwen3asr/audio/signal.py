"""Decoded audio: mono 16 kHz float32 samples read by range, in memory or in a temporary file."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import BinaryIO

import numpy as np

# Peak below which a file is treated as silence (-80 dBFS): nothing to transcribe.
SILENCE_PEAK = 1e-4


class Signal:
    """Mono 16 kHz float32 samples, normalised, read by range. `len()` is the number of samples."""

    num_samples: int = 0

    def __len__(self) -> int:
        return self.num_samples

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        x = self.samples()
        return x if dtype is None else x.astype(dtype)

    def read(self, start: int, stop: int) -> np.ndarray:
        raise NotImplementedError

    def samples(self) -> np.ndarray:
        """All of it in memory (for API callers that want an array)."""
        return self.read(0, self.num_samples)

    def blocks(self, size: int = 1 << 20) -> Iterator[np.ndarray]:
        for start in range(0, self.num_samples, size):
            yield self.read(start, min(start + size, self.num_samples))

    def peak(self) -> float:
        return max((float(np.max(np.abs(b))) for b in self.blocks() if b.size), default=0.0)

    def close(self) -> None:
        pass


class ArraySignal(Signal):
    def __init__(self, samples: np.ndarray):
        self.array = np.ascontiguousarray(samples, dtype=np.float32)
        self.num_samples = int(self.array.shape[0])

    def read(self, start: int, stop: int) -> np.ndarray:
        return self.array[max(0, start) : max(0, stop)]

    def samples(self) -> np.ndarray:
        return self.array


class FileSignal(Signal):
    """Samples in an unnamed temporary file (gone when closed, or when the process ends however it ends)."""

    def __init__(self, file: BinaryIO, num_samples: int, peak: float):
        self.file, self.num_samples = file, num_samples
        # As prepare_audio: divided by the peak only when it exceeds full scale.
        self.scale = np.float32(peak) if peak > 1.0 else None

    def read(self, start: int, stop: int) -> np.ndarray:
        start, stop = max(0, start), min(max(0, stop), self.num_samples)
        if stop <= start:
            return np.zeros(0, np.float32)
        raw = os.pread(self.file.fileno(), 4 * (stop - start), 4 * start)
        x = np.frombuffer(raw, dtype=np.float32)
        if self.scale is not None:
            x = x / self.scale
        return np.clip(x, -1.0, 1.0)

    def close(self) -> None:
        self.file.close()


def is_silent(wav) -> bool:
    """No sample reaches SILENCE_PEAK: digital silence or close to it.

    `wav` is an array or a decoded signal (a Signal, read block by block).
    """
    if hasattr(wav, "peak"):
        return len(wav) == 0 or wav.peak() < SILENCE_PEAK
    # max and min avoid the full-size temporary that abs() would allocate for long files.
    return wav.size == 0 or max(float(np.max(wav)), -float(np.min(wav))) < SILENCE_PEAK


__all__ = ["ArraySignal", "FileSignal", "SILENCE_PEAK", "Signal", "is_silent"]
