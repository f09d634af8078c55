"""The realtime WebSocket's events: what a live session sends (OpenAI's realtime transcription events
where they fit, and the session's final transcript), what ends it early, and the client's audio and
settings read from its frames."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from typing import Any

import numpy as np

from mlx_qwen3asr.audio.vad import VadOptions
from mlx_qwen3asr.outputs.folder import file_warnings
from mlx_qwen3asr.outputs.render import render_json
from mlx_qwen3asr.pipeline.result import Transcription
from mlx_qwen3asr.pipeline.streaming import StreamUpdate
from mlx_qwen3asr.runtime.messages import one_line

# Close codes (RFC 6455).
CLOSE_NORMAL = 1000
CLOSE_INVALID_DATA = 1007
CLOSE_POLICY = 1008
CLOSE_TOO_BIG = 1009
CLOSE_INTERNAL = 1011
CLOSE_SERVICE_RESTART = 1012
CLOSE_TRY_LATER = 1013

_EVENT = "conversation.item.input_audio_transcription"


class SessionError(Exception):
    """What ends a socket's live session early: the error event's code and message, and the close code."""

    def __init__(self, code: str, message: str, close: int, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.code, self.message, self.close, self.kind = code, one_line(message), close, kind

    def event(self) -> dict[str, Any]:
        return {"type": "error", "error": {"message": self.message, "type": self.kind, "code": self.code}}


def shutting_down() -> SessionError:
    return SessionError("shutting_down", "the server is shutting down", CLOSE_SERVICE_RESTART, "server_error")


def delta_event(item: int, update: StreamUpdate, previous: str) -> dict[str, Any]:
    """The event of one step: the text as it now stands, and how it changed since `previous`: the last
    `replaced` characters of the previous text give way to `delta`."""
    same = len(os.path.commonprefix([previous, update.text]))
    return {
        "type": f"{_EVENT}.delta",
        "item_id": f"item_{item}",
        "content_index": 0,
        "delta": update.text[same:],
        "replaced": len(previous) - same,
        "text": update.text,
        "stable": update.stable,
        "unstable": update.unstable,
        "language": update.language,
        "audio_seconds": round(update.seconds, 6),
        "final": update.final,
    }


def completed_event(item: int, segment: Any) -> dict[str, Any]:
    return {
        "type": f"{_EVENT}.completed",
        "item_id": f"item_{item}",
        "content_index": 0,
        "transcript": segment.text,
        "language": segment.language,
        "start": round(segment.start, 6),
        "end": round(segment.end, 6),
    }


def update_events(updates: list[StreamUpdate], state: dict[str, Any]) -> list[dict[str, Any]]:
    """The events of a list of updates, in order: each step's delta, then the segments it committed.
    state carries the previous text and the number of segments completed from one call to the next."""
    events = []
    for update in updates:
        events.append(delta_event(state["items"], update, state["text"]))
        state["text"] = update.text
        for segment in update.committed:
            events.append(completed_event(state["items"], segment))
            state["items"] += 1
    return events


def turn_detection(value: Any, current: VadOptions | None) -> VadOptions | None:
    """The speech detection a session update's turn_detection asks for: null turns it off; {"type":
    "server_vad", "threshold": P} (as OpenAI's, whose other fields are ignored) turns it on: only speech
    reaches the model, and text is committed where it pauses (P: the current threshold when not given)."""
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("type", "server_vad") != "server_vad":
        raise SessionError(
            "invalid_session",
            '\'turn_detection\' must be null or {"type": "server_vad", "threshold": P}',
            CLOSE_POLICY,
        )
    threshold = value.get("threshold", current.threshold if current is not None else VadOptions.threshold)
    try:
        return VadOptions(threshold=threshold)
    except ValueError as e:
        raise SessionError("invalid_session", f"turn_detection: {e}", CLOSE_POLICY) from None


def pcm_samples(data: bytes) -> np.ndarray:
    if len(data) % 2:
        raise SessionError(
            "invalid_audio", f"audio of {len(data)} bytes is not 16-bit PCM (odd count)", CLOSE_INVALID_DATA
        )
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


def transcript_event(result: Transcription, model_id: str) -> dict[str, Any]:
    """The session's final transcript, as `mlxasr live --json` writes it for the same audio: text,
    language, duration, the truncated and repetitive flags, warnings, speech regions and the segments
    with their words (the JSON writer's document, less the cues, options and source a file has)."""
    result = replace(result, warnings=file_warnings(result))
    doc = json.loads(render_json(result, [], model=model_id))
    for key in ("cues", "options", "source"):
        doc.pop(key, None)
    return {"type": "transcription_session.transcript", "transcript": doc}


__all__ = [
    "SessionError",
    "completed_event",
    "delta_event",
    "pcm_samples",
    "shutting_down",
    "transcript_event",
    "turn_detection",
    "update_events",
]
