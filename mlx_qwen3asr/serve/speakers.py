"""Speakers for the server's diarized_json: each request's audio diarized by the server-wide diarizer on the
shared DiarizeQueue (mlx_qwen3asr.diarize.queue) while the engine transcribes it, then its segments given
their speakers (the library's assign_speakers).

Requests are diarized one at a time, in order, and only where speech detection finds speech. Each has a
DiarizeJob that the request cancels when its client goes away: one still waiting leaves the queue, the one
running is stopped with the diarizer's cancel() (only ever for the request whose run it is: the diarizer
is shared)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import numpy as np

from mlx_qwen3asr.audio.vad import VadOptions
from mlx_qwen3asr.diarize.queue import DiarizeJob, DiarizeQueue
from mlx_qwen3asr.pipeline.result import Transcription
from mlx_qwen3asr.serve.errors import APIError

__all__ = ["DiarizeJob", "Speakers"]

log = logging.getLogger(__name__)


class Speakers:
    """The server's diarizer: submit() queues a request's audio and gives its DiarizeJob; speakers() gives
    a transcription the speakers of its job.

    lib: the diarization library (mlx_qwen3asr.diarize: DiarizeOptions, assign_speakers); options: the
    library's DiarizeOptions every request is diarized with (default: the library's defaults). vad: the
    speech detection that picks what is diarized (VadOptions; None: all the audio), the engine's own
    (create_app sets it)."""

    def __init__(
        self, diarizer: Any, lib: Any, options: Any | None = None, vad: VadOptions | None = None
    ) -> None:
        self.diarizer, self.lib = diarizer, lib
        options = options if options is not None else lib.DiarizeOptions()
        self.queue = DiarizeQueue(diarizer, options, vad=vad)

    @property
    def vad(self) -> VadOptions | None:
        return self.queue.vad

    @vad.setter
    def vad(self, vad: VadOptions | None) -> None:
        self.queue.vad = vad

    def submit(self, audio: np.ndarray | str, seconds: float, num_speakers: int | None = None) -> DiarizeJob:
        """Diarize audio (16 kHz samples, or a file to decode again) after those already queued; looking for
        exactly num_speakers speakers where given (else as the server's options say)."""
        options = None if num_speakers is None else self.lib.DiarizeOptions(num_speakers=num_speakers)
        return self.queue.submit(None, audio, seconds, options)

    def queued_seconds(self) -> float:
        """Audio waiting for the diarizer or being diarized, in seconds (/health, the busy limit)."""
        return self.queue.queued_seconds()

    async def speakers(
        self,
        job: DiarizeJob,
        result: Transcription,
        watch: Callable[[asyncio.Future], Awaitable[Any]] | None = None,
    ) -> Transcription:
        """result with the speakers of job (from submit), awaited through watch (which raises when the
        client leaves) where given; leaving, or the task cancelled, cancels the job. Raises APIError (500)
        when diarization failed."""
        future = asyncio.wrap_future(job.future)
        try:
            outcome = await (watch(future) if watch is not None else future)
        except BaseException:
            job.cancel()
            raise
        if outcome.error is not None:
            e = outcome.error
            log.error("speaker diarization failed", exc_info=(type(e), e, e.__traceback__))
            raise APIError(
                500,
                "speaker diarization failed (internal error; see the server log)",
                code="diarization_failed",
            )
        return await anyio.to_thread.run_sync(self.assign, result, outcome.turns)

    def assign(self, result: Transcription, turns: list[Any]) -> Transcription:
        """result with its segments' speakers (named in the answer: openai.openai_speaker)."""
        return self.lib.assign_speakers(result, turns)

    def close(self) -> None:
        """Drop what waits; the request being diarized is cancelled where the diarizer can be, and not
        waited for."""
        self.queue.close()
