"""The live WebSocket (/v1/realtime/transcription) of mlxasr serve at the edges of a stream: a stream too
short to hold a log-mel frame, and speech detection in the session, over a real uvicorn server with the
websockets client, on the tiny random-weight checkpoint."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
import uvicorn
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

import mlx_qwen3asr
from mlx_qwen3asr.pipeline.engine import Engine
from mlx_qwen3asr.pipeline.inputs import NO_SPEECH
from mlx_qwen3asr.serve.app import create_app, uvicorn_config
from mlx_qwen3asr.serve.live import LIVE_PATH, LiveLimits

KEY = "socket-key-7d2e"
LIMITS = LiveLimits(chunk_seconds=0.5, max_window_seconds=2.0, max_new_tokens=4, idle_timeout=20.0)
DEADLINE = 120.0


@pytest.fixture(scope="module")
def model(checkpoints):
    return mlx_qwen3asr.load(checkpoints("tiny"), dtype="float32")


class Served:
    """The app on a fresh engine, run by uvicorn on a free loopback port."""

    def __init__(self, model, tmp_path, limits: LiveLimits = LIMITS, vad=False):
        self.engine = Engine(model, vad=vad)
        app = create_app(self.engine, model_id="tiny", api_key=KEY, upload_dir=tmp_path, live=limits)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"ws://127.0.0.1:{self.sock.getsockname()[1]}{LIVE_PATH}"
        self.server = uvicorn.Server(uvicorn_config(app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)

    def session(self, *frames: bytes | str) -> tuple[list[dict], int]:
        """Open a session, send the frames and session.finish; every event until the close, and its code."""
        headers = {"Authorization": f"Bearer {KEY}"}
        with connect(self.url, additional_headers=headers, open_timeout=30, close_timeout=10) as ws:
            events = [json.loads(ws.recv(timeout=30))]
            assert events[0]["type"] == "transcription_session.created"
            try:
                for frame in frames:
                    ws.send(frame)
                ws.send(json.dumps({"type": "session.finish"}))
            except ConnectionClosed:  # refused before all was sent: its events are still there to read
                pass
            with pytest.raises(ConnectionClosed):
                while True:
                    events.append(json.loads(ws.recv(timeout=DEADLINE)))
            return events, ws.close_code

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()
        self.engine.close()


@pytest.fixture
def served(model, tmp_path):
    made = []

    def make(**kwargs) -> Served:
        made.append(Served(model, tmp_path, **kwargs))
        return made[-1]

    yield make
    for s in made:
        s.stop()


@pytest.mark.parametrize("size", [2, 318])
def test_a_session_of_a_few_bytes_ends_with_an_empty_transcript(served, size):
    server = served()
    events, code = server.session((bytes(range(1, 256)) * 2)[:size])
    kinds = [e["type"] for e in events]
    assert code == 1000, events
    assert "error" not in kinds
    assert kinds[-1] == "transcription_session.finished"
    assert events[-1]["text"] == "" and events[-1]["audio_seconds"] == pytest.approx(
        size // 2 / 16000, abs=1e-6
    )
    assert not [e for e in events if e["type"].endswith(".completed")]


# --- speech detection -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def noise() -> bytes:
    """20 s of silence and noise as 16-bit PCM (no speech)."""
    import numpy as np

    from tools.sounds import non_speech

    rng = np.random.default_rng(2)
    audio = np.concatenate(
        [np.zeros(8 * 16000, np.float32)]
        + [non_speech(k, 4 * 16000, rng, 0.1) for k in ("pink", "hiss", "brown")]
    )
    return (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()


def counted_steps(server: Served) -> list[int]:
    """The decodes the sessions submit to the engine, counted as they are submitted."""
    steps: list[int] = []
    submit = server.engine.submit_step

    def counting(samples, *args, **kwargs):
        steps.append(int(samples.shape[0]))
        return submit(samples, *args, **kwargs)

    server.engine.submit_step = counting
    return steps


def pieces(data: bytes, size: int = 9600) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def test_sessions_detect_speech_as_the_server_does_and_turn_detection_sets_it(served, noise):
    """A server with speech detection (the default) gives its live sessions the same: silence and noise
    make no step of the engine and no text. turn_detection null turns it off for a session, a
    threshold is taken and shown."""
    server = served(vad=True)
    steps = counted_steps(server)
    events, code = server.session(*pieces(noise))
    assert code == 1000
    assert events[0]["session"]["turn_detection"] == {"type": "server_vad", "threshold": 0.5}
    assert steps == []
    assert [e["type"] for e in events[1:]] == [
        "conversation.item.input_audio_transcription.delta",  # the final one, empty
        "transcription_session.transcript",
        "transcription_session.finished",
    ]
    assert events[-1]["text"] == "" and events[-1]["audio_seconds"] == pytest.approx(20.0)
    # The transcript says what mlxasr live says of such audio.
    transcript = events[-2]["transcript"]
    assert transcript["text"] == "" and transcript["segments"] == [] and transcript["speech"] == []
    assert transcript["warnings"] == [NO_SPEECH] and transcript["duration"] == pytest.approx(20.0)

    update = {
        "type": "transcription_session.update",
        "session": {"turn_detection": {"type": "server_vad", "threshold": 0.7}},
    }
    events, code = server.session(json.dumps(update), *pieces(noise[: 4 * 32000]))
    assert code == 1000 and events[1]["session"]["turn_detection"] == {"type": "server_vad", "threshold": 0.7}
    assert steps == []

    update = {"type": "transcription_session.update", "session": {"turn_detection": None}}
    events, code = server.session(json.dumps(update), *pieces(noise[: 4 * 32000]))
    assert code == 1000 and events[1]["session"]["turn_detection"] is None
    assert len(steps) >= 8  # every 0.5 s chunk of the 4 s


def test_a_server_without_speech_detection_decodes_every_chunk(served, noise):
    server = served(vad=False)
    steps = counted_steps(server)
    events, code = server.session(*pieces(noise[: 2 * 32000]))
    assert code == 1000 and events[0]["session"]["turn_detection"] is None
    assert len(steps) >= 4  # every 0.5 s chunk of the 2 s


@pytest.mark.parametrize(
    "detection",
    [{"type": "semantic_vad"}, {"type": "server_vad", "threshold": 2}, "on"],
)
def test_a_bad_turn_detection_is_refused(served, detection):
    server = served(vad=True)
    update = {"type": "transcription_session.update", "session": {"turn_detection": detection}}
    events, code = server.session(json.dumps(update))
    assert code == 1008
    assert events[-1]["type"] == "error" and events[-1]["error"]["code"] == "invalid_session"
