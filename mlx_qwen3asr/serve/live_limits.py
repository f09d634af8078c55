"""The bounds and settings of the realtime WebSocket's live sessions (live.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlx_qwen3asr.audio.vad import VadOptions
from mlx_qwen3asr.pipeline.streaming import (
    DEFAULT_MAX_WINDOW_SECONDS,
    Decode,
    RowDecode,
    StreamingTranscriber,
)

__all__ = ["LiveLimits"]

DEFAULT_MAX_SESSIONS = 4
DEFAULT_MAX_SECONDS = 3600.0
DEFAULT_IDLE_TIMEOUT = 30.0
DEFAULT_MAX_BUFFER_SECONDS = 30.0
DEFAULT_MAX_FRAME_BYTES = 1024 * 1024


@dataclass(frozen=True)
class LiveLimits:
    """Bounds and settings of the live sessions.

    max_sessions: sessions at once; more are refused (error ``too_many_sessions``, close 1013).
    max_seconds: the longest session, counted both in audio received and in time connected.
    idle_timeout: the longest wait for the client's next frame while the session is open.
    max_buffer_seconds: audio received and not yet taken by the model; more (a client sending faster
    than the model keeps up) ends the session (``buffer_overflow``). max_frame_bytes: the largest
    frame. chunk_seconds, unfixed_chunks, unfixed_tokens, max_window_seconds, max_new_tokens: the
    StreamingTranscriber's settings.
    """

    max_sessions: int = DEFAULT_MAX_SESSIONS
    max_seconds: float = DEFAULT_MAX_SECONDS
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    max_buffer_seconds: float = DEFAULT_MAX_BUFFER_SECONDS
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    chunk_seconds: float = 2.0
    unfixed_chunks: int = 2
    unfixed_tokens: int = 5
    max_window_seconds: float | None = DEFAULT_MAX_WINDOW_SECONDS
    max_new_tokens: int | None = None

    def transcriber(
        self,
        model: Any,
        language: str | None,
        context: str,
        decode: Decode | None = None,
        vad: VadOptions | None = None,
        rows: RowDecode | None = None,
    ) -> StreamingTranscriber:
        """A session's stream; vad: its speech detection (None: off); decode, rows: where its decodes
        run (default: here), see StreamingTranscriber."""
        return StreamingTranscriber(
            model,
            language=language,
            context=context,
            chunk_seconds=self.chunk_seconds,
            unfixed_chunks=self.unfixed_chunks,
            unfixed_tokens=self.unfixed_tokens,
            max_window_seconds=self.max_window_seconds,
            max_new_tokens=self.max_new_tokens,
            decode=decode,
            rows=rows,
            vad=vad,
        )
