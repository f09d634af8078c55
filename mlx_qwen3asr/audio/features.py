"""Samples and the log-mel front end of Qwen3-ASR (files are read by files.py).

Mirrors the official pipeline: mix to mono, resample to 16 kHz with soxr "HQ" (librosa's default
`soxr_hq`), peak-normalise only when the signal exceeds full scale, then compute the 128-bin Whisper
log-mel spectrogram without the 30 s padding.
"""

from __future__ import annotations

import functools
import math
import os

import numpy as np
import soxr
from numpy.lib.stride_tricks import as_strided

# The audio encoder was trained on 16 kHz input.
SAMPLE_RATE = 16000
# 25 ms analysis window at 16 kHz: 0.025 * 16000.
N_FFT = 400
# 10 ms frame step at 16 kHz: 0.010 * 16000, i.e. 100 mel frames per second.
HOP_LENGTH = 160
# Whisper-large-v3 style front end: 128 mel bins.
N_MELS = 128

# Filters span 0 Hz to Nyquist (SAMPLE_RATE / 2), over the N_FFT // 2 + 1 one-sided bins.
_F_MAX = SAMPLE_RATE / 2
_N_BINS = N_FFT // 2 + 1
# Frames per FFT batch; bounds the temporary float64 frame matrix to about 26 MB.
_BLOCK_FRAMES = 8192

# Sample rates accepted from files and callers, in Hz: from 1 kHz (below telephony's 8 kHz and the old
# 4-6 kHz formats) to 768 kHz (the highest rate PCM recorders and interfaces use). A rate outside this is
# a damaged or hostile header: 1 Hz would turn a 100 KB file into days of 16 kHz samples.
MIN_SAMPLE_RATE = 1000
MAX_SAMPLE_RATE = 768_000

# Extensions soundfile (libsndfile >= 1.1) decodes itself.
_SOUNDFILE_EXTENSIONS = frozenset(
    {"wav", "flac", "mp3", "ogg", "oga", "opus", "aiff", "aif", "aifc", "caf", "w64", "au", "snd"}
)
# Containers/codecs libsndfile cannot read; these always go through ffmpeg.
_FFMPEG_EXTENSIONS = frozenset({"m4a", "aac", "mp4", "mov", "m4v", "webm", "mkv", "wma"})
# Lowercase file extensions, without the leading dot, that `load_audio` is meant to handle.
AUDIO_EXTENSIONS = _SOUNDFILE_EXTENSIONS | _FFMPEG_EXTENSIONS


class AudioError(Exception):
    """An audio file could not be read; the message is one line naming the file and the reason."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        self.path = os.fspath(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


def sample_rate_problem(rate: int) -> str | None:
    """Why a stated sample rate is refused (outside MIN_SAMPLE_RATE..MAX_SAMPLE_RATE), or None."""
    if MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
        return None
    return f"implausible sample rate {rate} Hz (accepted: {MIN_SAMPLE_RATE} to {MAX_SAMPLE_RATE} Hz)"


def _to_float(audio: np.ndarray) -> np.ndarray:
    if audio.dtype.kind == "f":
        # float64 stays float64 through resampling, as in the official path for arrays.
        return audio if audio.dtype == np.float64 else audio.astype(np.float32)
    if audio.dtype.kind == "i":
        full_scale = float(2 ** (8 * audio.dtype.itemsize - 1))
        return (audio.astype(np.float64) / full_scale).astype(np.float32)
    if audio.dtype.kind == "u":
        mid = float(2 ** (8 * audio.dtype.itemsize - 1))
        return ((audio.astype(np.float64) - mid) / mid).astype(np.float32)
    raise ValueError(f"unsupported audio dtype {audio.dtype}")


def prepare_audio(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    """Mix to mono, resample to 16 kHz and peak-normalise like the official `normalize_audio_input`.

    Accepts (frames,), (frames, channels) or (channels, frames) with at most 8 channels. Integer
    samples are scaled from full scale to [-1, 1]. `sample_rate` is an integer from MIN_SAMPLE_RATE to
    MAX_SAMPLE_RATE (ValueError otherwise). Returns C-contiguous float32.
    """
    x = np.asarray(audio)
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, np.integer)) or sample_rate <= 0:
        raise ValueError(f"sample_rate must be a positive integer, got {sample_rate!r}")
    sample_rate = int(sample_rate)
    if (problem := sample_rate_problem(sample_rate)) is not None:
        raise ValueError(f"sample_rate: {problem}")
    if x.ndim not in (1, 2):
        raise ValueError(f"audio must be 1-D or 2-D (frames, channels), got shape {x.shape}")
    x = _to_float(x)
    if x.ndim == 2:
        # Same heuristic as the official to_mono: a short first axis is the channel axis.
        if x.shape[0] <= 8 and x.shape[1] > x.shape[0]:
            x = x.T
        x = np.mean(x, axis=-1, dtype=x.dtype)
    if x.size and not np.isfinite(x).all():
        raise ValueError("audio contains NaN or infinite samples")
    if x.size == 0:
        return np.zeros(0, dtype=np.float32)

    if sample_rate != SAMPLE_RATE:
        x = np.ascontiguousarray(x)
        # librosa.resample(fix=True) trims/zero-pads soxr's rounded output to this float ceil.
        n_out = int(math.ceil(x.shape[0] * (float(SAMPLE_RATE) / sample_rate)))
        y = soxr.resample(x, sample_rate, SAMPLE_RATE, quality="HQ")
        if y.shape[0] > n_out:
            y = y[:n_out]
        elif y.shape[0] < n_out:
            y = np.pad(y, (0, n_out - y.shape[0]))
        x = y

    x = x.astype(np.float32)
    peak = float(np.max(np.abs(x)))
    if peak > 1.0:
        x = x / np.float32(peak)
    x = np.clip(x, -1.0, 1.0)
    return np.ascontiguousarray(x, dtype=np.float32)


def _hz_to_mel(freq: np.ndarray) -> np.ndarray:
    # Slaney scale: linear below 1 kHz (3 mels per 200 Hz), logarithmic above.
    freq = np.asarray(freq, dtype=np.float64)
    linear = 3.0 * freq / 200.0
    log = 15.0 + np.log(np.maximum(freq, 1e-10) / 1000.0) * (27.0 / np.log(6.4))
    return np.where(freq >= 1000.0, log, linear)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    linear = 200.0 * mel / 3.0
    log = 1000.0 * np.exp((np.log(6.4) / 27.0) * (mel - 15.0))
    return np.where(mel >= 15.0, log, linear)


@functools.lru_cache(maxsize=1)
def _mel_filters_cached() -> np.ndarray:
    bin_freqs = np.linspace(0.0, _F_MAX, _N_BINS)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(_F_MAX), N_MELS + 2))
    lower, center, upper = edges[:-2], edges[1:-1], edges[2:]
    rising = (bin_freqs[:, None] - lower) / (center - lower)
    falling = (upper - bin_freqs[:, None]) / (upper - center)
    weights = np.maximum(0.0, np.minimum(rising, falling))
    # Slaney normalisation: equal area per filter.
    weights *= 2.0 / (upper - lower)
    weights.setflags(write=False)
    return weights


def mel_filters() -> np.ndarray:
    """Slaney-scale, Slaney-normalised mel filter bank, shape (201, 128), float64 (read-only, cached)."""
    return _mel_filters_cached()


@functools.lru_cache(maxsize=1)
def _hann_window() -> np.ndarray:
    # Periodic Hann, as torch.hann_window and transformers' window_function(periodic=True).
    w = 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(N_FFT) / N_FFT)
    w.setflags(write=False)
    return w


def mel_frame_count(n_samples: int) -> int:
    """Number of mel frames for n_samples: the centred STFT gives n // hop + 1, the last is dropped."""
    if n_samples < 0:
        raise ValueError(f"n_samples must be >= 0, got {n_samples}")
    return int(n_samples) // HOP_LENGTH


def log_mel_spectrogram(audio: np.ndarray) -> np.ndarray:
    """Whisper log-mel features of 16 kHz mono audio, shape (128, len(audio) // 160), float32.

    Equals WhisperFeatureExtractor(feature_size=128) without the 30 s padding: centred STFT with
    reflect padding, power spectrum, mel projection, log10 floored at 1e-10, last frame dropped,
    dynamic range limited to 8 (log10 units) below the maximum, then (x + 4) / 4.
    """
    x = np.asarray(audio)
    if x.ndim != 1:
        raise ValueError(f"audio must be 1-D, got shape {x.shape}")
    # The reference casts to float32 first; do the same so inputs round identically.
    x = x.astype(np.float32, copy=False)
    n_frames = mel_frame_count(x.shape[0])
    if n_frames == 0:
        return np.zeros((N_MELS, 0), dtype=np.float32)

    # np.pad's reflect repeats the reflection when the signal is shorter than the pad, like numpy's
    # reference path; float64 keeps rounding far below the 1e-4 agreement target.
    padded = np.pad(x, N_FFT // 2, mode="reflect").astype(np.float64)
    step = padded.strides[0]
    frames = as_strided(padded, shape=(n_frames, N_FFT), strides=(HOP_LENGTH * step, step), writeable=False)
    window = _hann_window()
    filters = mel_filters()

    mel = np.empty((n_frames, N_MELS), dtype=np.float64)
    for s in range(0, n_frames, _BLOCK_FRAMES):
        spec = np.fft.rfft(frames[s : s + _BLOCK_FRAMES] * window, axis=-1)
        power = spec.real**2 + spec.imag**2
        np.matmul(power, filters, out=mel[s : s + _BLOCK_FRAMES])

    log_spec = np.log10(np.maximum(mel, 1e-10)).astype(np.float32)
    log_spec = np.maximum(log_spec, log_spec.max() - np.float32(8.0))
    log_spec = (log_spec + np.float32(4.0)) / np.float32(4.0)
    return np.ascontiguousarray(log_spec.T)
