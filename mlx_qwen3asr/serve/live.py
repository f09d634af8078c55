"""Live transcription over a WebSocket: audio frames in, partial and committed text out as JSON events.

    GET /v1/realtime/transcription   upgraded to a WebSocket

The client sends 16-bit little-endian mono PCM at 16 kHz, as JSON
``{"type": "input_audio_buffer.append", "audio": "<base64>"}`` or as binary frames of raw PCM, then
``{"type": "session.finish"}`` (or ``input_audio_buffer.commit``): the tail is flushed, the final
events sent and the socket closed normally. ``{"type": "transcription_session.update", "session":
{"language", "prompt", "turn_detection", "word_timestamps"}}`` may come before the first audio
(turn_detection: speech detection, on as for the server's file requests unless null;
word_timestamps: the words of committed segments timed by the server's aligner; save: the finished
session filed in the server's transcript library with its audio, live_save.py). The server answers
with OpenAI's realtime transcription events where they fit, and the session's transcript at the end
(live_events.py; docs/server.md lists them); an ``error`` event, then a close, for anything refused.

Each session is a LiveSession (pipeline.live_session, as ``mlxasr live`` runs one) on a worker
thread. Each decode of its window is a prepared step of the Engine (Engine.submit_step): encoded with
the stream's kept encoder blocks and prefilled with its draft on the Engine's thread, then decoded
as a row of the running batch of the file requests (when their prompt start, the context, is the
same; otherwise it waits for its turn like any other context); its words are timed on the Engine's
thread too (Engine.call). The model is only ever used from the Engine's thread, and the event loop
never waits on the model. Who may connect is checked as for the HTTP API (Host, Origin, API key);
sessions, the audio waiting in a session, its length and its silences are bounded (LiveLimits).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import itertools
import json
import logging
import time
from typing import Any

import numpy as np
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from mlx_qwen3asr.audio.features import SAMPLE_RATE
from mlx_qwen3asr.audio.vad import VadOptions
from mlx_qwen3asr.library.store import Library, LibraryError
from mlx_qwen3asr.model.generate import Generation
from mlx_qwen3asr.pipeline.engine import Engine, Job, JobCancelled
from mlx_qwen3asr.pipeline.live_session import LiveSession
from mlx_qwen3asr.pipeline.streaming import StreamUpdate
from mlx_qwen3asr.runtime.messages import one_line
from mlx_qwen3asr.serve.access import Access, refusal
from mlx_qwen3asr.serve.live_events import (
    CLOSE_INTERNAL,
    CLOSE_INVALID_DATA,
    CLOSE_NORMAL,
    CLOSE_POLICY,
    CLOSE_TOO_BIG,
    CLOSE_TRY_LATER,
    SessionError,
    pcm_samples,
    shutting_down,
    transcript_event,
    turn_detection,
    update_events,
)
from mlx_qwen3asr.serve.live_limits import LiveLimits
from mlx_qwen3asr.serve.live_save import save_live_session
from mlx_qwen3asr.text.languages import resolve_language
from mlx_qwen3asr.text.prompt import prompt_prefix_ids

__all__ = ["LIVE_PATH", "KEY_PROTOCOL", "LiveLimits", "LiveSessions"]

log = logging.getLogger(__name__)

LIVE_PATH = "/v1/realtime/transcription"
# A browser cannot set headers on a WebSocket: it may send the key as a subprotocol, as OpenAI's own.
KEY_PROTOCOL = "openai-insecure-api-key."
# The subprotocol the server answers with when the client offers it.
REALTIME_PROTOCOL = "realtime"


class _Session:
    """One client's stream: frames are read (reader) while the model takes the audio (worker)."""

    def __init__(self, sessions: LiveSessions, websocket: WebSocket, number: int) -> None:
        self.sessions, self.ws, self.number = sessions, websocket, number
        self.limits = sessions.limits
        self.language: str | None = None
        self.context = ""
        # Speech detection, as the server's file requests have it (mlxasr serve --no-vad turns both off);
        # a session update's turn_detection changes it.
        self.vad: VadOptions | None = getattr(sessions.engine, "vad", None)
        self.word_timestamps = False
        self.save = False  # filed in the library when it finishes
        self.started = time.time()
        self.pending: list[np.ndarray] = []
        self.pending_samples = 0
        self.received_samples = 0
        self.finishing = False
        self.wake = asyncio.Event()
        self.state = {"text": "", "items": 0}
        self.deadline = time.monotonic() + self.limits.max_seconds
        self.stream: LiveSession | None = None
        self.job: Job | None = None  # the engine step the stream waits for
        self.closed = False  # the session ended: no more steps

    # -- the client's frames --

    async def reader(self) -> None:
        limits = self.limits
        while not self.finishing:
            wait = min(limits.idle_timeout, self.deadline - time.monotonic())
            if wait <= 0:
                raise self._too_long()
            try:
                message = await asyncio.wait_for(self.ws.receive(), timeout=wait)
            except asyncio.TimeoutError:
                if time.monotonic() >= self.deadline:
                    raise self._too_long() from None
                raise SessionError(
                    "idle_timeout", f"no frame from the client for {limits.idle_timeout:g} s", CLOSE_POLICY
                ) from None
            if message["type"] == "websocket.disconnect":
                raise WebSocketDisconnect(message.get("code", 1000))
            data, text = message.get("bytes"), message.get("text")
            size = len(data) if data is not None else len((text or "").encode("utf-8", "surrogatepass"))
            if size > limits.max_frame_bytes:
                raise SessionError(
                    "frame_too_large",
                    f"a frame of {size} bytes is larger than the limit of {limits.max_frame_bytes} bytes",
                    CLOSE_TOO_BIG,
                )
            if data is not None:
                self._audio(pcm_samples(data))
            else:
                await self._event(text or "")

    def _too_long(self) -> SessionError:
        return SessionError(
            "session_too_long", f"the session passed the limit of {self.limits.max_seconds:g} s", CLOSE_POLICY
        )

    async def _event(self, text: str) -> None:
        try:
            event = json.loads(text)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
            raise SessionError(
                "invalid_json", "a text frame is not a JSON object", CLOSE_INVALID_DATA
            ) from None
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            raise SessionError(
                "invalid_event", "an event must be a JSON object with a 'type'", CLOSE_INVALID_DATA
            )
        kind = event["type"]
        if kind == "input_audio_buffer.append":
            audio = event.get("audio")
            if not isinstance(audio, str):
                raise SessionError("invalid_audio", "'audio' must be a base64 string", CLOSE_INVALID_DATA)
            try:
                data = base64.b64decode(audio, validate=True)
            except (binascii.Error, ValueError):
                raise SessionError(
                    "invalid_audio", "'audio' is not valid base64", CLOSE_INVALID_DATA
                ) from None
            self._audio(pcm_samples(data))
        elif kind in ("input_audio_buffer.commit", "session.finish"):
            self.finishing = True
            self.wake.set()
        elif kind == "transcription_session.update":
            self._update(event.get("session"))
            await self.ws.send_json({"type": "transcription_session.updated", "session": self.settings()})
        else:
            raise SessionError("unknown_event", f"unknown event type {one_line(kind)[:60]!r}", CLOSE_POLICY)

    def _update(self, session: Any) -> None:
        if self.received_samples:
            raise SessionError(
                "session_started", "the session can only be updated before its first audio", CLOSE_POLICY
            )
        if not isinstance(session, dict):
            raise SessionError("invalid_event", "'session' must be an object", CLOSE_INVALID_DATA)
        audio_format = session.get("input_audio_format")
        if audio_format not in (None, "pcm16"):
            raise SessionError(
                "invalid_audio_format", "the only input_audio_format is 'pcm16' (16 kHz mono)", CLOSE_POLICY
            )
        language, prompt = session.get("language", self.language), session.get("prompt", self.context)
        if language is not None and not isinstance(language, str) or not isinstance(prompt, str):
            raise SessionError("invalid_event", "'language' and 'prompt' must be strings", CLOSE_INVALID_DATA)
        try:
            resolve_language(language or None)
            prompt_prefix_ids(self.sessions.engine.model.tokenizer, prompt)
        except ValueError as e:
            raise SessionError("invalid_session", str(e), CLOSE_POLICY) from None
        vad = turn_detection(session["turn_detection"], self.vad) if "turn_detection" in session else self.vad
        words, save = session.get("word_timestamps", self.word_timestamps), session.get("save", self.save)
        if not isinstance(words, bool) or not isinstance(save, bool):
            raise SessionError(
                "invalid_event", "'word_timestamps' and 'save' must be true or false", CLOSE_INVALID_DATA
            )
        if save and self.sessions.library is None:
            raise SessionError("invalid_session", "the server keeps no transcript library", CLOSE_POLICY)
        if words and getattr(self.sessions.engine, "aligner", None) is None:
            raise SessionError(
                "invalid_session", "word timestamps need an aligner; the server has none", CLOSE_POLICY
            )
        self.language, self.context, self.vad = language or None, prompt, vad
        self.word_timestamps, self.save = words, save

    def _audio(self, samples: np.ndarray) -> None:
        self.received_samples += samples.shape[0]
        if self.received_samples > self.limits.max_seconds * SAMPLE_RATE:
            raise self._too_long()
        self.pending.append(samples)
        self.pending_samples += samples.shape[0]
        if self.pending_samples > self.limits.max_buffer_seconds * SAMPLE_RATE:
            raise SessionError(
                "buffer_overflow",
                f"more than {self.limits.max_buffer_seconds:g} s of audio wait for the model: send audio "
                "no faster than it is spoken",
                CLOSE_POLICY,
            )
        self.wake.set()

    def settings(self) -> dict[str, Any]:
        limits = self.limits
        return {
            "id": f"sess_{self.number}",
            "object": "realtime.transcription_session",
            "model": self.sessions.model_id,
            "input_audio_format": "pcm16",
            "sample_rate": SAMPLE_RATE,
            "language": self.language,
            "prompt": self.context,
            "turn_detection": None
            if self.vad is None
            else {"type": "server_vad", "threshold": self.vad.threshold},
            "word_timestamps": self.word_timestamps,
            "save": self.save,
            "chunk_seconds": limits.chunk_seconds,
            "idle_timeout": limits.idle_timeout,
            "max_seconds": limits.max_seconds,
            "max_buffer_seconds": limits.max_buffer_seconds,
            "max_frame_bytes": limits.max_frame_bytes,
        }

    # -- the model's side --

    def _row(self, samples: np.ndarray, suffix, budget: int, prepare) -> Generation:
        """Where the stream's decodes run (on its worker thread): a prepared step of the engine (encoded
        with the stream's kept blocks and prefilled with its draft on the engine's thread, then a row of
        its batch), awaited until the session's deadline."""
        if self.closed:
            raise JobCancelled("the session ended")
        try:
            job = self.sessions.engine.submit_step(
                samples, suffix, budget, context=self.context, prepare=prepare
            )
        except RuntimeError:  # the engine is closed
            raise shutting_down() from None
        return self._wait(job)

    def _on_engine(self, fn, *args):
        """Run fn(*args) on the engine's thread (the aligner), awaited until the session's deadline."""
        if self.closed:
            raise JobCancelled("the session ended")
        try:
            future = self.sessions.engine.call(fn, *args)
        except RuntimeError:
            raise shutting_down() from None
        try:
            return future.result(timeout=max(0.0, self.deadline - time.monotonic()))
        except TimeoutError:
            future.cancel()
            raise self._too_long() from None
        except JobCancelled:
            raise shutting_down() from None

    def _wait(self, job: Job) -> Generation:
        self.job = job
        if self.closed:
            job.cancel()
        try:
            return job.result(timeout=max(0.0, self.deadline - time.monotonic()))
        except TimeoutError:
            job.cancel()
            raise self._too_long() from None
        except JobCancelled:
            raise shutting_down() from None
        finally:
            self.job = None

    def _feed(self, samples: np.ndarray | None) -> list[StreamUpdate]:
        """Feed the stream (None: finish it), on a worker thread; the stream is made at its first use."""
        if self.stream is None:
            engine = self.sessions.engine
            transcriber = self.limits.transcriber(
                engine.model, self.language, self.context, vad=self.vad, rows=self._row
            )
            self.stream = LiveSession(
                transcriber,
                aligner=engine.aligner if self.word_timestamps else None,
                keep_audio=self.save,
                language=transcriber.language,
                run=self._on_engine,
                warn=lambda line: log.warning("live session %d: %s", self.number, line),
                vad=self.vad is not None,
            )
        if samples is None:
            return [self.stream.finish()]
        return self.stream.feed(samples)

    def _saved(self, result: Any) -> dict[str, Any]:
        """The finished session filed in the library: the event that says so, or an error event (the
        session still ends normally: its transcript was sent)."""
        options = {
            "language": self.language,
            "context": self.context,
            "word_timestamps": self.word_timestamps,
        }
        try:
            tid = save_live_session(
                self.sessions.library,
                result,
                self.stream.audio.signal(),
                started=self.started,
                model=self.sessions.model_id,
                options=options,
            )
        except (LibraryError, OSError) as e:
            log.error("live session %d: not saved in the library: %s", self.number, one_line(e))
            return SessionError("save_failed", "the session could not be saved in the library", 0).event()
        return {"type": "transcription_session.saved", "transcript_id": tid}

    def _close(self) -> None:
        """No more steps: the one under way leaves the engine."""
        self.closed = True
        job = self.job
        if job is not None:
            job.cancel()

    async def worker(self) -> None:
        while True:
            if not self.pending and not self.finishing:
                await self.wake.wait()
                self.wake.clear()
                continue
            if self.pending:
                samples = np.concatenate(self.pending)
                self.pending, self.pending_samples = [], 0
                updates = await asyncio.to_thread(self._feed, samples)
                for event in update_events(updates, self.state):
                    await self.ws.send_json(event)
                continue
            if self.finishing:
                [final] = await asyncio.to_thread(self._feed, None)
                for event in update_events([final], self.state):
                    await self.ws.send_json(event)
                stream = self.stream
                result = stream.transcription(stream.warnings())
                await self.ws.send_json(transcript_event(result, self.sessions.model_id))
                if self.save:
                    await self.ws.send_json(await asyncio.to_thread(self._saved, result))
                stream.close()
                await self.ws.send_json(
                    {
                        "type": "transcription_session.finished",
                        "text": final.text,
                        "language": final.language,
                        "audio_seconds": round(final.seconds, 6),
                    }
                )
                return

    # -- the session --

    async def run(self) -> None:
        reader = asyncio.ensure_future(self.reader())
        worker = asyncio.ensure_future(self.worker())
        try:
            done, _ = await asyncio.wait({reader, worker}, return_when=asyncio.FIRST_EXCEPTION)
            if worker in done:
                worker.result()
                return
            reader.result()  # raises what ended the reading, if anything
            await worker  # finishing: the reader stopped after session.finish
        finally:
            self._close()
            for task in (reader, worker):
                if not task.done():
                    task.cancel()
            for task in (reader, worker):
                with contextlib.suppress(BaseException):
                    await task


class LiveSessions:
    """The live endpoint: who may connect, how many at once; the streams' decodes are steps of the engine."""

    def __init__(
        self,
        engine: Engine,
        *,
        model_id: str,
        access: Access,
        api_key: str | None,
        limits: LiveLimits | None = None,
        library: Library | None = None,
    ) -> None:
        self.engine, self.model_id, self.access, self.api_key = engine, model_id, access, api_key
        self.library = library  # where sessions that ask to be saved are filed
        self.limits = limits or LiveLimits()
        self.active = 0
        self._numbers = itertools.count(1)

    # -- who connects --

    async def endpoint(self, websocket: WebSocket) -> None:
        # The HTTP API's Host, Origin and key checks; the key may come as a subprotocol.
        error = refusal(self.access, self.api_key, websocket.scope, key_protocol=KEY_PROTOCOL)
        if error is not None:
            log.info("live connection refused: %s", error.code)
            if "websocket.http.response" in websocket.scope.get("extensions", {}):
                await websocket.send_denial_response(error.response())
            else:
                await websocket.close(CLOSE_POLICY)
            return
        offered = websocket.scope.get("subprotocols", [])
        await websocket.accept(subprotocol=REALTIME_PROTOCOL if REALTIME_PROTOCOL in offered else None)
        if self.active >= self.limits.max_sessions:
            log.info("live session refused: %d are open", self.active)
            await self._close_with(
                websocket,
                SessionError(
                    "too_many_sessions",
                    f"the server already holds {self.limits.max_sessions} live sessions; retry later",
                    CLOSE_TRY_LATER,
                    "server_error",
                ),
            )
            return
        self.active += 1
        session = _Session(self, websocket, next(self._numbers))
        try:
            await websocket.send_json(
                {"type": "transcription_session.created", "session": session.settings()}
            )
            await session.run()
            await websocket.close(CLOSE_NORMAL)
        except SessionError as e:
            log.info("live session %d closed: %s (%s)", session.number, e.code, e.message)
            await self._close_with(websocket, e)
        except WebSocketDisconnect:
            log.info("live session %d: the client went away", session.number)
        except Exception as e:
            log.error("live session %d failed", session.number, exc_info=(type(e), e, e.__traceback__))
            await self._close_with(
                websocket,
                SessionError(
                    "internal_error",
                    "transcription failed (see the server log)",
                    CLOSE_INTERNAL,
                    "server_error",
                ),
            )
        finally:
            self.active -= 1

    @staticmethod
    async def _close_with(websocket: WebSocket, error: SessionError) -> None:
        with contextlib.suppress(Exception):  # the client may be gone already
            if websocket.application_state == WebSocketState.CONNECTED:
                await websocket.send_json(error.event())
                await websocket.close(error.close)
