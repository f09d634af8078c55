"""Decoded blocks to 16 kHz mono as they come: channels mixed by their mean (as the official pipeline's
librosa does), then a soxr stream, which gives the same samples as resampling the whole file at once."""

from __future__ import annotations

import math

import numpy as np
import soxr

from mlx_qwen3asr.audio.decoders import DECODE_BLOCK
from mlx_qwen3asr.audio.features import SAMPLE_RATE


def to_mono(block: np.ndarray) -> np.ndarray:
    """A (frames, channels) float32 block as mono float32: the mean of its channels."""
    return block[:, 0] if block.shape[1] == 1 else np.mean(block, axis=-1, dtype=np.float32)


class MonoResampler:
    """Mono samples at `rate` -> 16 kHz, piece by piece, with the exact length of the whole at the end."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self.frames = 0  # input samples taken
        self._stream = None
        if rate != SAMPLE_RATE:
            self._stream = soxr.ResampleStream(rate, SAMPLE_RATE, 1, dtype="float32", quality="HQ")
        # Input samples per step: upsampling lengthens a block by 16000 / rate, so it is fed in pieces
        # whose output is about DECODE_BLOCK samples (the stream gives the same samples however cut).
        self._step = max(1, DECODE_BLOCK * rate // SAMPLE_RATE)

    def resample(self, mono: np.ndarray) -> list[np.ndarray]:
        """The 16 kHz pieces for the next input samples (some may be empty)."""
        self.frames += mono.shape[0]
        if self._stream is None:
            return [mono]
        step = self._step
        return [
            self._stream.resample_chunk(mono[i : i + step], last=False) for i in range(0, mono.shape[0], step)
        ]

    def finish(self) -> np.ndarray:
        """The samples the resampler still holds, once the input has ended."""
        if self._stream is None:
            return np.zeros(0, np.float32)
        return self._stream.resample_chunk(np.zeros(0, np.float32), last=True)

    @property
    def length(self) -> int:
        """The output's exact length for the input taken (as librosa's resample(fix=True))."""
        if self._stream is None:
            return self.frames
        return math.ceil(self.frames * (float(SAMPLE_RATE) / self.rate))
