"""Speakers for the server's diarized_json: each request's audio diarized by the server-wide diarizer on a
worker thread while the engine transcribes it (the library releases the GIL), then its segments given
their speakers (the library's assign_speakers)."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from mlx_qwen3asr.audio.features import SAMPLE_RATE
from mlx_qwen3asr.audio.files import read_audio
from mlx_qwen3asr.pipeline.result import Transcription

__all__ = ["Speakers"]

log = logging.getLogger(__name__)


class Speakers:
    """The server's diarizer: submit() queues a request's audio (one file at a time, in order), the
    Future giving its speaker turns; assign() gives a transcription its speakers.

    lib: the diarization library (mlx_qwen3asr.diarize: DiarizeOptions, assign_speakers); options: the
    library's DiarizeOptions every request is diarized with (default: the library's defaults)."""

    def __init__(self, diarizer: Any, lib: Any, options: Any | None = None) -> None:
        self.diarizer, self.lib = diarizer, lib
        self.options = options if options is not None else lib.DiarizeOptions()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlxasr-diarize")
        self._lock = threading.Lock()
        self._queued = 0.0

    def submit(self, audio: np.ndarray | str, seconds: float) -> Future:
        """Diarize audio (16 kHz samples, or a file to decode again) after those already queued."""
        with self._lock:
            self._queued += seconds
        future = self._pool.submit(self._diarize, audio)

        def done(f: Future) -> None:
            with self._lock:
                self._queued -= seconds

        future.add_done_callback(done)
        return future

    def _diarize(self, audio: np.ndarray | str) -> list[Any]:
        if isinstance(audio, str):  # a long upload, kept on disk: read whole for the diarizer
            decoded = read_audio(audio)
            try:
                samples = np.array(decoded.signal.samples(), dtype=np.float32, copy=True)
            finally:
                decoded.signal.close()
        else:
            samples = np.ascontiguousarray(audio, dtype=np.float32)
        log.debug("diarizing %.1f s of audio", samples.shape[0] / SAMPLE_RATE)
        return list(self.diarizer(samples, self.options))

    def queued_seconds(self) -> float:
        """Audio waiting for the diarizer or being diarized, in seconds."""
        with self._lock:
            return max(0.0, self._queued)

    def assign(self, result: Transcription, turns: list[Any]) -> Transcription:
        """result with its segments' speakers (named in the answer: openai.speaker_label)."""
        return self.lib.assign_speakers(result, turns)

    def close(self) -> None:
        """Drop what waits; the file being diarized is cancelled where the diarizer can be, and not
        waited for."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        cancel = getattr(self.diarizer, "cancel", None)
        if callable(cancel) and self.queued_seconds() > 0:
            cancel()
