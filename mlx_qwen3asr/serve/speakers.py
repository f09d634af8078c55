"""Speakers for the server's diarized_json: each request's audio diarized by the server-wide diarizer on a
worker thread while the engine transcribes it (the library releases the GIL), then its segments given
their speakers (the library's assign_speakers).

Requests are diarized one at a time, in order. Each has a Diarization that its request cancels when its
client goes away: one still waiting leaves the queue, the one running is stopped with the diarizer's
cancel() (only ever for the request whose run it is: the diarizer is shared). Only the speech that speech
detection finds is diarized; audio without speech never reaches the diarizer."""

from __future__ import annotations

import logging
import threading
from collections import deque
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from typing import Any

import numpy as np

from mlx_qwen3asr.audio.features import SAMPLE_RATE
from mlx_qwen3asr.audio.vad import VadOptions
from mlx_qwen3asr.diarize.given import diarize_speech, read_samples, speech_seconds
from mlx_qwen3asr.pipeline.result import Transcription

__all__ = ["Diarization", "Speakers"]

log = logging.getLogger(__name__)

# How often a running diarization being cancelled is told again to stop, until its run ends (a cancel
# that comes before the diarizer has started its run would otherwise find nothing to stop).
CANCEL_EVERY_SECONDS = 0.05


class Diarization:
    """One request's diarization: `future` gives its speaker turns (a list) or raises why there are none;
    cancel() stops it, whether it waits or runs (nothing once it is done)."""

    def __init__(self, owner: Speakers, audio: np.ndarray | str, seconds: float) -> None:
        self.future: Future = Future()
        self.audio: np.ndarray | str | None = audio
        self.seconds = seconds
        self.cancelled = False
        self._owner = owner

    def cancel(self) -> None:
        self._owner._cancel(self)

    def done(self) -> bool:
        return self.future.done()


class Speakers:
    """The server's diarizer: submit() queues a request's audio (one file at a time, in order) and gives
    its Diarization; assign() gives a transcription its speakers.

    lib: the diarization library (mlx_qwen3asr.diarize: DiarizeOptions, assign_speakers); options: the
    library's DiarizeOptions every request is diarized with (default: the library's defaults). vad: the
    speech detection that picks what is diarized (VadOptions; None: all the audio), the engine's own
    (create_app sets it)."""

    def __init__(
        self, diarizer: Any, lib: Any, options: Any | None = None, vad: VadOptions | None = None
    ) -> None:
        self.diarizer, self.lib = diarizer, lib
        self.options = options if options is not None else lib.DiarizeOptions()
        self.vad = vad
        self._cond = threading.Condition()
        self._waiting: deque[Diarization] = deque()
        self._running: Diarization | None = None
        self._closed = False
        self._worker: threading.Thread | None = None

    def submit(self, audio: np.ndarray | str, seconds: float) -> Diarization:
        """Diarize audio (16 kHz samples, or a file to decode again) after those already queued."""
        item = Diarization(self, audio, seconds)
        with self._cond:
            if self._closed:
                raise RuntimeError("the server's diarizer is closed")
            self._waiting.append(item)
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name="mlxasr-diarize", daemon=True)
                self._worker.start()
            self._cond.notify()
        return item

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                item = self._waiting.popleft()
                self._running = item
            try:
                if item.future.set_running_or_notify_cancel():
                    self._run(item)
            finally:
                item.audio = None
                with self._cond:
                    self._running = None

    def _run(self, item: Diarization) -> None:
        try:
            turns = self._diarize(item)
        except BaseException as e:
            if item.cancelled:  # its client went away: the diarizer stopped as asked
                log.debug(
                    "the diarization of a request whose client went away stopped (%s)", type(e).__name__
                )
            item.future.set_exception(e)
        else:
            item.future.set_result(turns)

    def _diarize(self, item: Diarization) -> list[Any]:
        audio = item.audio
        if isinstance(audio, str):  # a long upload, kept on disk: read whole for the diarizer
            samples = read_samples(audio)
        else:
            samples = np.ascontiguousarray(audio, dtype=np.float32)
        seconds = samples.shape[0] / SAMPLE_RATE
        speech = speech_seconds(samples, self.vad)
        if speech is not None:
            if not speech:
                log.debug("no speech in %.1f s of audio: nothing to diarize", seconds)
                return []
        if item.cancelled:
            raise self._cancelled()
        log.debug("diarizing %.1f s of audio", seconds)
        return list(diarize_speech(self.diarizer, samples, self.options, speech))

    def _cancelled(self) -> Exception:
        kind = getattr(self.lib, "DiarizeCancelled", None)
        return kind("diarization was cancelled") if isinstance(kind, type) else RuntimeError("cancelled")

    def _cancel(self, item: Diarization) -> None:
        with self._cond:
            if item.future.done():
                return
            item.cancelled = True
            running = self._running is item and item.future.running()
            if not running and item in self._waiting:
                self._waiting.remove(item)
        if not running:
            item.future.cancel()
            return
        if callable(getattr(self.diarizer, "cancel", None)):
            threading.Thread(
                target=self._stop, args=(item,), name="mlxasr-diarize-cancel", daemon=True
            ).start()

    def _stop(self, item: Diarization) -> None:
        """Tell the diarizer to stop until item's run is over: never another request's run, since the
        worker starts no other while item is the one running."""
        while True:
            with self._cond:
                if self._running is not item:
                    return
                self.diarizer.cancel()
            wait_futures([item.future], timeout=CANCEL_EVERY_SECONDS)

    def queued_seconds(self) -> float:
        """Audio waiting for the diarizer or being diarized, in seconds (the one running counted by what is
        left of it, where the diarizer reports its progress)."""
        progress = getattr(self.diarizer, "progress", None)
        with self._cond:
            total = sum(d.seconds for d in self._waiting)
            running = self._running
        if running is not None and not running.future.done():
            left = 1.0
            if callable(progress):
                try:
                    now = progress()
                except Exception:  # a snapshot is never worth failing /health for
                    now = None
                if now is not None:
                    left = min(1.0, max(0.0, 1.0 - float(now.fraction)))
            total += running.seconds * left
        return max(0.0, total)

    def assign(self, result: Transcription, turns: list[Any]) -> Transcription:
        """result with its segments' speakers (named in the answer: openai.openai_speaker)."""
        return self.lib.assign_speakers(result, turns)

    def close(self) -> None:
        """Drop what waits; the file being diarized is cancelled where the diarizer can be, and not
        waited for."""
        with self._cond:
            self._closed = True
            dropped = list(self._waiting)
            self._waiting.clear()
            running = self._running
            self._cond.notify_all()
        for item in dropped:
            item.cancelled = True
            item.future.cancel()
        if running is not None:
            running.cancel()
