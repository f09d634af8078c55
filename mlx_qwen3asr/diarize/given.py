"""What a diarizer is given: a file's samples read whole, the speech that speech detection finds in them,
and the call that hands both over (the batch CLI's queue and the server's speakers share these)."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from mlx_qwen3asr.audio.features import SAMPLE_RATE
from mlx_qwen3asr.audio.files import read_audio
from mlx_qwen3asr.audio.vad import VadOptions, detect_speech

__all__ = ["diarize_speech", "read_samples", "speech_seconds"]


def read_samples(audio: Any) -> np.ndarray:
    """A file's samples (16 kHz float32 mono, as transcription reads them), whole."""
    decoded = read_audio(audio)
    try:
        return np.array(decoded.signal.samples(), dtype=np.float32, copy=True)
    finally:
        decoded.signal.close()


def speech_seconds(samples: np.ndarray, vad: VadOptions | None) -> list[tuple[float, float]] | None:
    """Where speech detection finds speech in samples, as (start, end) seconds; None without detection."""
    if vad is None:
        return None
    return [(s.start / SAMPLE_RATE, s.end / SAMPLE_RATE) for s in detect_speech(samples, vad)]


def _takes_speech(diarizer: Any) -> bool:
    """Whether diarizer(samples, options, speech=...) is understood: a Diarizer is, and so is any callable
    with a `speech` keyword; a plain (samples, options) callable is given all the audio."""
    try:
        params = inspect.signature(diarizer).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "speech" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def diarize_speech(diarizer: Any, samples: np.ndarray, options: Any, speech: Any = None) -> Any:
    """The speaker turns of 16 kHz samples from diarizer(samples, options), given only the speech
    (start, end seconds; None: all of it) where the diarizer takes it."""
    samples = np.ascontiguousarray(samples, dtype=np.float32)
    if speech is not None and _takes_speech(diarizer):
        return diarizer(samples, options, speech=speech)
    return diarizer(samples, options)
