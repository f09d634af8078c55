"""The live endpoint of mlxasr serve (WebSocket /v1/realtime/transcription) on the tiny random checkpoint:
its events against StreamingTranscriber on the same audio, who may connect, the session bounds, bad
frames, and file requests served beside a live session; in process (Starlette's TestClient) and over a
real uvicorn server with a websockets client."""

from __future__ import annotations

import base64
import io
import json
import logging
import socket
import threading
import time
from dataclasses import replace

import numpy as np
import pytest
import soundfile as sf
import uvicorn
from starlette.testclient import TestClient, WebSocketDenialResponse
from starlette.websockets import WebSocketDisconnect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

import mlx_qwen3asr
from mlx_qwen3asr.pipeline.engine import Engine
from mlx_qwen3asr.pipeline.parts import Parts
from mlx_qwen3asr.serve.app import ConnectionLimits, create_app, uvicorn_config
from mlx_qwen3asr.serve.live import KEY_PROTOCOL, LIVE_PATH, LiveLimits

KEY = "live-key-51c0"
MODEL_ID = "qwen3-asr-tiny"
SR = 16000
# Short chunks and a short window: a few seconds of audio make many steps and commit segments.
LIMITS = LiveLimits(
    chunk_seconds=0.5,
    unfixed_chunks=2,
    unfixed_tokens=5,
    max_window_seconds=2.0,
    max_new_tokens=4,
    max_sessions=2,
    idle_timeout=20.0,
)
DEADLINE = 120.0
URL = "ws://127.0.0.1" + LIVE_PATH


@pytest.fixture(scope="module")
def model(checkpoints):
    return mlx_qwen3asr.load(checkpoints("tiny"), dtype="float32")


def signal(seconds: float, seed: int = 0) -> np.ndarray:
    """Speech-like audio: noise under a syllable-rate envelope, with a pause every 1.5 s."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(round(seconds * SR))) / SR
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 4.0 * t)
    envelope[(t % 1.5) > 1.2] = 0.01
    return (0.3 * envelope * rng.standard_normal(t.shape[0])).astype(np.float32)


def pcm(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()


def frames(samples: np.ndarray, seconds: float = 0.3) -> list[bytes]:
    step = int(seconds * SR)
    return [pcm(samples[i : i + step]) for i in range(0, samples.shape[0], step)]


def append(data: bytes) -> str:
    return json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(data).decode()})


def expected(model, data: list[bytes], limits: LiveLimits = LIMITS, language=None, context=""):
    """What StreamingTranscriber gives on the same audio, fed frame by frame: each step's fields and the
    segments it committed."""
    stream = limits.transcriber(model, language, context)
    updates = []
    for piece in data:
        updates += stream.feed(np.frombuffer(piece, dtype="<i2"))
    updates.append(stream.finish())
    steps = [(u.text, u.stable, u.unstable, u.language, u.final) for u in updates]
    segments = [(s.text, round(s.start, 6), round(s.end, 6)) for u in updates for s in u.committed]
    return steps, segments


def observed(events: list[dict]):
    """The same fields from the server's events; checks that every delta turns the previous text into
    the new one."""
    steps, segments, text = [], [], ""
    for e in events:
        if e["type"].endswith(".delta"):
            assert text[: len(text) - e["replaced"]] + e["delta"] == e["text"]
            text = e["text"]
            assert e["stable"] + e["unstable"] == e["text"]
            steps.append((e["text"], e["stable"], e["unstable"], e["language"], e["final"]))
        elif e["type"].endswith(".completed"):
            segments.append((e["transcript"], e["start"], e["end"]))
    return steps, segments


class App:
    """The app on a fresh engine whose file requests decode a short budget (random weights never stop)."""

    def __init__(self, model, tmp_path, limits: LiveLimits = LIMITS, batch=None, **kwargs):
        parts = replace(Parts(), budget=lambda seconds: 6 + int(3 * seconds))
        if batch is not None:  # a stand-in decoding batch (tests/scripted.py)
            parts = replace(parts, batch=batch)
        self.engine = Engine(model, vad=False, parts=parts)
        self.app = create_app(
            self.engine,
            model_id=MODEL_ID,
            api_key=KEY,
            upload_dir=tmp_path,
            live=limits,
            **kwargs,
        )

    @property
    def active(self) -> int:
        return self.app.state.live.active

    def close(self) -> None:
        self.engine.close()


@pytest.fixture
def make(model, tmp_path):
    apps = []

    def build(limits: LiveLimits = LIMITS, batch=None, **kwargs) -> App:
        app = App(model, tmp_path, limits, batch, **kwargs)
        apps.append(app)
        return app

    yield build
    for app in apps:
        app.close()


def client(app: App) -> TestClient:
    return TestClient(app.app, base_url="http://127.0.0.1")


def auth() -> dict[str, str]:
    """The key's header, in a new dict: the test client adds its own headers to the one it is given."""
    return {"Authorization": f"Bearer {KEY}"}


def until_closed(ws) -> tuple[list[dict], int]:
    """Every event the server sends until it closes, and the close code."""
    events = []
    while True:
        try:
            events.append(ws.receive_json())
        except WebSocketDisconnect as e:
            return events, e.code


def wait_for(condition, what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def run_stream(ws, data: list[bytes]) -> tuple[list[dict], int]:
    for i, piece in enumerate(data):  # binary and JSON frames alike
        if i % 2:
            ws.send_bytes(piece)
        else:
            ws.send_text(append(piece))
    ws.send_json({"type": "session.finish"})
    return until_closed(ws)


# --- (a) the events are StreamingTranscriber's ---------------------------------------------------


def decodes(model, data: list[bytes], limits: LiveLimits = LIMITS) -> int:
    """The decodes StreamingTranscriber makes of the same audio: one per window step, one per commit
    made before finish."""
    stream = limits.transcriber(model, None, "")
    commits = sum(len(u.committed) for piece in data for u in stream.feed(np.frombuffer(piece, dtype="<i2")))
    stream.finish()
    return stream.steps + commits


def test_events_equal_the_streaming_transcriber(model, make, monkeypatch):
    from scripted import spy_batches

    from mlx_qwen3asr.model.draft import DraftStart

    data = frames(signal(5.2))
    want_steps, want_segments = expected(model, data)
    assert len(want_segments) >= 2  # segments committed during the stream, and the last at finish
    n_decodes = decodes(model, data)
    joined = []  # the batch each prepared live row joined
    join = DraftStart.join
    monkeypatch.setattr(
        DraftStart, "join", lambda self, batch, key: joined.append(type(batch)) or join(self, batch, key)
    )
    record = spy_batches()
    app = make(batch=record.batch)
    with client(app) as c, c.websocket_connect(URL, headers=auth()) as ws:
        created = ws.receive_json()
        assert created["type"] == "transcription_session.created"
        assert created["session"]["model"] == MODEL_ID
        events, code = run_stream(ws, data)
    assert code == 1000
    assert observed(events) == (want_steps, want_segments)
    assert events[-1]["type"] == "transcription_session.finished"
    assert events[-1]["text"] == want_steps[-1][0]
    ids = [e["item_id"] for e in events if e["type"].endswith(".completed")]
    assert ids == [f"item_{i}" for i in range(len(want_segments))]
    # Every decode of the stream was a row of the engine's batch, encoded and prefilled by the stream
    # (its kept encoder blocks, its draft) rather than whole with the segments.
    assert not record.adds and joined == [record.batch] * n_decodes
    wait_for(lambda: app.active == 0, "the session slot was not freed")


def test_session_update_sets_language_and_prompt(model, make):
    data = frames(signal(1.6, seed=3))
    want = expected(model, data, language="English", context="budget meeting")
    other = expected(model, data)
    assert want != other  # the settings change what the model is asked
    app = make()
    with client(app) as c, c.websocket_connect(URL, headers=auth()) as ws:
        ws.receive_json()
        update = {"language": "en", "prompt": "budget meeting", "input_audio_format": "pcm16"}
        ws.send_json({"type": "transcription_session.update", "session": update})
        updated = ws.receive_json()
        assert updated["type"] == "transcription_session.updated"
        assert (updated["session"]["language"], updated["session"]["prompt"]) == ("en", "budget meeting")
        events, code = run_stream(ws, data)
    assert code == 1000
    assert observed(events) == want


# --- (b) who may connect ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "status", "code"),
    [
        ({}, 401, "invalid_api_key"),
        ({"Authorization": "Bearer wrong"}, 401, "invalid_api_key"),
        ({**auth(), "host": "evil.example"}, 421, "host_not_allowed"),
        ({**auth(), "origin": "https://evil.example"}, 403, "origin_not_allowed"),
    ],
)
def test_refused_connections(make, headers, status, code):
    app = make()
    with client(app) as c:
        with (
            pytest.raises(WebSocketDenialResponse) as refused,
            c.websocket_connect(URL, headers=headers),
        ):
            pass
        assert refused.value.status_code == status
        assert refused.value.json()["error"]["code"] == code
        assert app.active == 0


def test_key_as_subprotocol_and_own_origin_accepted(make):
    app = make(cors_origins=["https://app.example"])
    with client(app) as c:
        protocols = ["realtime", KEY_PROTOCOL + KEY]
        with c.websocket_connect(URL, subprotocols=protocols) as ws:
            assert ws.accepted_subprotocol == "realtime"
            assert ws.receive_json()["type"] == "transcription_session.created"
        for origin in ("http://127.0.0.1", "https://app.example"):
            with c.websocket_connect(URL, headers={**auth(), "origin": origin}) as ws:
                assert ws.receive_json()["type"] == "transcription_session.created"
        with (
            pytest.raises(WebSocketDenialResponse) as refused,
            c.websocket_connect(URL, subprotocols=["realtime", KEY_PROTOCOL + "wrong"]),
        ):
            pass
        assert refused.value.status_code == 401


# --- (c) bounded sessions --------------------------------------------------------------------------


def test_sessions_past_the_limit_are_refused(make):
    app = make()
    with client(app) as c:
        with (
            c.websocket_connect(URL, headers=auth()) as first,
            c.websocket_connect(URL, headers=auth()) as second,
        ):
            for ws in (first, second):
                assert ws.receive_json()["type"] == "transcription_session.created"
            assert app.active == 2
            with c.websocket_connect(URL, headers=auth()) as third:
                events, code = until_closed(third)
            assert code == 1013
            assert [e["error"]["code"] for e in events] == ["too_many_sessions"]
            assert events[0]["type"] == "error"
        wait_for(lambda: app.active == 0, "the session slots were not freed")
        with c.websocket_connect(URL, headers=auth()) as ws:
            assert ws.receive_json()["type"] == "transcription_session.created"


# --- (d) a silent client is timed out --------------------------------------------------------------


def test_silent_client_is_closed_after_the_idle_timeout(make):
    app = make(replace(LIMITS, idle_timeout=1.0, max_sessions=1))
    with client(app) as c:
        with c.websocket_connect(URL, headers=auth()) as ws:
            assert ws.receive_json()["type"] == "transcription_session.created"
            ws.send_bytes(pcm(signal(0.2)))
            events, code = until_closed(ws)  # nothing more is sent
        assert code == 1008
        assert [(e["type"], e["error"]["code"]) for e in events] == [("error", "idle_timeout")]
        wait_for(lambda: app.active == 0, "the session slot was not freed")
        with c.websocket_connect(URL, headers=auth()) as ws:  # the only slot is free again
            assert ws.receive_json()["type"] == "transcription_session.created"


def test_session_length_and_buffer_are_bounded(make):
    app = make(replace(LIMITS, max_seconds=1.0))
    with client(app) as c, c.websocket_connect(URL, headers=auth()) as ws:
        ws.receive_json()
        ws.send_bytes(pcm(signal(1.5)))
        events, code = until_closed(ws)
    assert code == 1008
    assert events[-1]["error"]["code"] == "session_too_long"
    app = make(replace(LIMITS, max_buffer_seconds=1.0))
    with client(app) as c, c.websocket_connect(URL, headers=auth()) as ws:
        ws.receive_json()
        ws.send_bytes(pcm(signal(1.5)))  # 1.5 s at once: more than the model may have waiting
        events, code = until_closed(ws)
    assert code == 1008
    assert events[-1]["error"]["code"] == "buffer_overflow"


# --- (e) bad frames --------------------------------------------------------------------------------


def wav_bytes(samples: np.ndarray) -> bytes:
    out = io.BytesIO()
    sf.write(out, samples, SR, format="WAV")
    return out.getvalue()


def transcribed_alone(app: App, wav: bytes) -> str:
    """The text the engine gives the file's samples with nothing else running."""
    samples, _ = sf.read(io.BytesIO(wav), dtype="float32")
    return app.engine.submit(samples, seconds=samples.shape[0] / SR).result(timeout=DEADLINE).text


@pytest.mark.parametrize(
    ("frame", "code", "close"),
    [
        ("{not json", "invalid_json", 1007),
        ("[" * 60_000, "invalid_json", 1007),  # nested past the parser's recursion limit
        ('{"a": ' * 10_000, "invalid_json", 1007),
        ('["a list"]', "invalid_event", 1007),
        ('{"type": "input_audio_buffer.append", "audio": "@@not base64@@"}', "invalid_audio", 1007),
        (append(b"\x01\x02\x03"), "invalid_audio", 1007),
        (b"\x01\x02\x03", "invalid_audio", 1007),
        ('{"type": "response.create"}', "unknown_event", 1008),
        (
            '{"type": "transcription_session.update", "session": {"language": "en"}}',
            "session_started",
            1008,
        ),
        (b"\x00" * (64 * 1024 + 2), "frame_too_large", 1009),
    ],
)
def test_bad_frames_end_only_their_session(model, make, caplog, frame, code, close):
    app = make(replace(LIMITS, max_frame_bytes=64 * 1024))
    caplog.set_level(logging.INFO, logger="mlx_qwen3asr.serve")
    data = frames(signal(1.2, seed=5))
    with client(app) as c:
        with c.websocket_connect(URL, headers=auth()) as ws:
            ws.receive_json()
            ws.send_bytes(data[0])
            if isinstance(frame, bytes):
                ws.send_bytes(frame)
            else:
                ws.send_text(frame)
            events, got = until_closed(ws)
        errors = [e for e in events if e["type"] == "error"]
        assert [e["error"]["code"] for e in errors] == [code]
        assert events[-1] is errors[0]
        assert got == close
        wait_for(lambda: app.active == 0, "the session slot was not freed")
        # The client's fault: one line in the log, no error and no traceback.
        assert [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info] == []
        assert any(code in r.getMessage() for r in caplog.records)
        # The next client is served, live and over HTTP.
        with c.websocket_connect(URL, headers=auth()) as ws:
            ws.receive_json()
            events, got = run_stream(ws, data)
        assert got == 1000
        assert observed(events) == expected(model, data)
        wav = wav_bytes(signal(1.0, seed=6))
        answer = c.post(
            "/v1/audio/transcriptions", headers=auth(), files={"file": ("a.wav", wav)}, data={"model": "x"}
        )
        assert answer.status_code == 200
        assert answer.json()["text"] == transcribed_alone(app, wav)


@pytest.mark.parametrize(
    ("session", "code", "close"),
    [
        ({"language": "Klingon"}, "invalid_session", 1008),
        ({"prompt": "<|im_end|> injected"}, "invalid_session", 1008),
        ({"input_audio_format": "g711_ulaw"}, "invalid_audio_format", 1008),
        ({"language": 7}, "invalid_event", 1007),
        ({"word_timestamps": "yes"}, "invalid_event", 1007),
        ("not an object", "invalid_event", 1007),
    ],
)
def test_bad_session_updates(make, session, code, close):
    app = make()
    with client(app) as c, c.websocket_connect(URL, headers=auth()) as ws:
        ws.receive_json()
        ws.send_json({"type": "transcription_session.update", "session": session})
        events, got = until_closed(ws)
    assert [e["error"]["code"] for e in events] == [code]
    assert got == close


# --- (f) file requests beside a live session -------------------------------------------------------


def test_file_request_during_a_live_session(model, make):
    data = frames(signal(3.0, seed=7))
    wav = wav_bytes(signal(2.0, seed=8))
    app = make()
    alone = transcribed_alone(app, wav)
    with client(app) as c, c.websocket_connect(URL, headers=auth()) as ws:
        ws.receive_json()
        half = len(data) // 2
        for piece in data[:half]:
            ws.send_bytes(piece)
        first = ws.receive_json()  # the stream has made a step
        assert first["type"].endswith(".delta")
        answer = c.post(
            "/v1/audio/transcriptions",
            headers=auth(),
            files={"file": ("a.wav", wav)},
            data={"model": "x"},
        )
        for piece in data[half:]:
            ws.send_bytes(piece)
        ws.send_json({"type": "input_audio_buffer.commit"})
        events, code = until_closed(ws)
    assert answer.status_code == 200
    assert answer.json()["text"] == alone
    assert code == 1000
    assert observed([first, *events]) == expected(model, data)


def test_a_failing_live_step_ends_its_session_only(model, make, monkeypatch):
    """The prefill of the live session's rows (no forced language) fails: that session ends with one
    error; a file request (forced language) made meanwhile answers, and so does another session."""
    from mlx_qwen3asr.model.generate import HeaderIds
    from mlx_qwen3asr.pipeline import window_decode

    language = HeaderIds.from_tokenizer(model.tokenizer).language
    prefill = window_decode.prefill_draft

    def faulty(net, prompt_ids, *args):
        if language not in prompt_ids:
            raise RuntimeError("prefill failed")
        return prefill(net, prompt_ids, *args)

    monkeypatch.setattr(window_decode, "prefill_draft", faulty)
    data = frames(signal(1.6, seed=11))
    wav = wav_bytes(signal(2.0, seed=12))
    app = make()
    samples, _ = sf.read(io.BytesIO(wav), dtype="float32")
    alone = app.engine.submit(samples, language="English").result(timeout=DEADLINE).text
    answers = []
    with client(app) as c:

        def post():
            answers.append(
                c.post(
                    "/v1/audio/transcriptions",
                    headers=auth(),
                    files={"file": ("a.wav", wav)},
                    data={"model": "x", "language": "en"},
                )
            )

        poster = threading.Thread(target=post)
        poster.start()
        with c.websocket_connect(URL, headers=auth()) as ws:
            ws.receive_json()
            events, code = run_stream(ws, data)
        poster.join(timeout=DEADLINE)
        with c.websocket_connect(URL, headers=auth()) as ws:
            ws.receive_json()
            ws.send_json({"type": "transcription_session.update", "session": {"language": "English"}})
            ws.receive_json()
            others, other_code = run_stream(ws, data)
    assert [e["type"] for e in events] == ["error"]
    assert events[0]["error"]["code"] == "internal_error" and code == 1011
    assert len(answers) == 1 and answers[0].status_code == 200
    assert answers[0].json()["text"] == alone
    assert other_code == 1000 and observed(others) == expected(model, data, language="English")


# --- over a real server ----------------------------------------------------------------------------


class Served:
    """The app run by uvicorn (as mlxasr serve runs it) on a free loopback port."""

    def __init__(self, app: App, limits: ConnectionLimits | None = None):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"ws://127.0.0.1:{self.sock.getsockname()[1]}{LIVE_PATH}"
        self.server = uvicorn.Server(
            uvicorn_config(app.app, limits, log_level="warning", timeout_graceful_shutdown=2)
        )
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        wait_for(lambda: self.server.started, "the server did not start", 30)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()


def test_over_a_real_server(model, make):
    data = frames(signal(3.0, seed=9))
    app = make()
    served = Served(app)
    try:
        with pytest.raises(InvalidStatus) as refused:
            connect(served.url, additional_headers={"Authorization": "Bearer wrong"}, open_timeout=30)
        assert refused.value.response.status_code == 401
        assert json.loads(refused.value.response.body)["error"]["code"] == "invalid_api_key"
        with connect(served.url, additional_headers=auth(), open_timeout=30, close_timeout=10) as ws:
            assert json.loads(ws.recv(timeout=30))["type"] == "transcription_session.created"
            for i, piece in enumerate(data):
                ws.send(piece if i % 2 else append(piece))
            ws.send(json.dumps({"type": "session.finish"}))
            events = []
            with pytest.raises(ConnectionClosed):
                while True:
                    events.append(json.loads(ws.recv(timeout=DEADLINE)))
            assert ws.close_code == 1000
        assert observed(events) == expected(model, data)
        with connect(served.url, additional_headers=auth(), open_timeout=30) as ws:
            ws.recv(timeout=30)
            ws.send("{broken")
            error = json.loads(ws.recv(timeout=30))
            assert error["error"]["code"] == "invalid_json"
            with pytest.raises(ConnectionClosed):
                ws.recv(timeout=30)
            assert ws.close_code == 1007
    finally:
        served.stop()


def test_websockets_count_towards_max_connections(make):
    """A WebSocket handshake on a connection past --max-connections is refused as an HTTP request
    would be, with 503 too_many_connections before the app sees it; once the open one closes, the next
    is accepted."""
    app = make()  # two live sessions allowed: only the connection bound refuses the second
    served = Served(app, ConnectionLimits(max_connections=1))
    try:
        with connect(served.url, additional_headers=auth(), open_timeout=30, close_timeout=10) as first:
            assert json.loads(first.recv(timeout=30))["type"] == "transcription_session.created"
            with pytest.raises(InvalidStatus) as refused:
                connect(served.url, additional_headers=auth(), open_timeout=30)
            response = refused.value.response
            assert response.status_code == 503 and response.headers["Retry-After"] == "1"
            error = json.loads(response.body)["error"]
            assert error["code"] == "too_many_connections" and "at most 1" in error["message"]
            assert app.active == 1
        deadline = time.monotonic() + 10
        while True:  # the server may see the first connection go a moment after the client does
            try:
                second = connect(served.url, additional_headers=auth(), open_timeout=30, close_timeout=10)
                break
            except InvalidStatus as e:
                assert e.response.status_code == 503 and time.monotonic() < deadline, "never accepted"
                time.sleep(0.05)
        with second:
            assert json.loads(second.recv(timeout=30))["type"] == "transcription_session.created"
    finally:
        served.stop()


class Listener:
    """Every event a websockets client receives, on a thread, until the server closes the connection."""

    def __init__(self, ws):
        self.ws, self.events, self.closed_at = ws, [], None
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        try:
            while True:
                self.events.append(json.loads(self.ws.recv(timeout=DEADLINE)))
        except (ConnectionClosed, TimeoutError):
            self.closed_at = time.monotonic()

    def join(self, seconds: float) -> None:
        self.thread.join(timeout=seconds)
        assert not self.thread.is_alive(), f"the connection was still open after {seconds:g} s"


def test_a_live_session_outlives_the_body_timeout(make):
    """The HTTP body deadline does not apply to a WebSocket: a client streaming at real time in 100 ms
    frames for twice the body timeout (and past the idle timeout) keeps its session; then, silent, it
    gets the idle timeout's event and close code, not a dropped connection."""
    body_timeout, idle = 1.0, 1.5
    app = make(replace(LIMITS, idle_timeout=idle))
    served = Served(app, ConnectionLimits(header_timeout=body_timeout, body_timeout=body_timeout))
    try:
        with connect(served.url, additional_headers=auth(), open_timeout=30, close_timeout=10) as ws:
            assert json.loads(ws.recv(timeout=30))["type"] == "transcription_session.created"
            listener = Listener(ws)
            start = time.monotonic()
            for i, piece in enumerate(frames(signal(2.5 * body_timeout, seed=13), seconds=0.1)):
                time.sleep(max(0.0, start + 0.1 * i - time.monotonic()))
                assert listener.closed_at is None, (
                    f"the connection was closed {time.monotonic() - start:.1f} s in"
                )
                ws.send(piece)
            last = time.monotonic()
            listener.join(idle + DEADLINE)
            code = ws.close_code
        events = listener.events
        assert last - start >= 2 * body_timeout
        assert any(e["type"].endswith(".delta") for e in events)
        assert [e["error"]["code"] for e in events if e["type"] == "error"] == ["idle_timeout"]
        assert events[-1]["type"] == "error"
        assert code == 1008
        assert listener.closed_at - last >= idle - 0.2
        wait_for(lambda: app.active == 0, "the session slot was not freed")
    finally:
        served.stop()


def test_engine_calls_run_on_its_thread(model):
    engine = Engine(model, vad=False)
    try:
        assert engine.call(threading.current_thread).result(timeout=DEADLINE).name == "mlxasr-engine"
        with pytest.raises(ZeroDivisionError):
            engine.call(lambda: 1 / 0).result(timeout=DEADLINE)
        assert engine.call(max, 2, 5).result(timeout=DEADLINE) == 5  # a failed call leaves it running
    finally:
        engine.close()
    with pytest.raises(RuntimeError, match="closed"):
        engine.call(int)


def test_session_ends_when_the_engine_stops(make):
    app = make()
    with client(app) as c, c.websocket_connect(URL, headers=auth()) as ws:
        ws.receive_json()
        app.engine.close()
        ws.send_bytes(pcm(signal(0.6)))
        events, code = until_closed(ws)
    assert [e["error"]["code"] for e in events] == ["shutting_down"]
    assert code == 1012


def test_a_session_with_word_timestamps_ends_with_the_transcript_mlxasr_live_writes(
    model, checkpoints, tmp_path
):
    """word_timestamps: the session's last events carry its transcript, words timed by the server's
    aligner: what `mlxasr live --input --json --word-timestamps` writes for the same audio."""
    import os

    from mlx_qwen3asr.cli.main import main

    samples = signal(6.0, seed=21)
    wav = tmp_path / "talk.wav"
    sf.write(wav, samples, SR, subtype="PCM_16")
    stream = ["--chunk-seconds", "1", "--max-window-seconds", "4", "--no-vad", "--language", "en"]
    args = ["live", "--input", str(wav), "--model", str(checkpoints("tiny")), *stream, "--json"]
    assert main([*args, "--word-timestamps", "-o", str(tmp_path), "--name", "cli", "-q"]) == 0
    written = json.loads((tmp_path / "cli.json").read_text(encoding="utf-8"))

    aligner = mlx_qwen3asr.load(os.environ["MLXASR_ALIGNER"], dtype="float32")
    engine = Engine(model, aligner=aligner, vad=False)
    limits = LiveLimits(chunk_seconds=1.0, max_window_seconds=4.0)
    app = create_app(engine, model_id=MODEL_ID, api_key=KEY, upload_dir=tmp_path, live=limits)
    data, _ = sf.read(wav, dtype="int16")
    try:
        with (
            TestClient(app, base_url="http://127.0.0.1") as c,
            c.websocket_connect(URL, headers=auth()) as ws,
        ):
            ws.receive_json()
            session = {"language": "English", "word_timestamps": True}
            ws.send_json({"type": "transcription_session.update", "session": session})
            assert ws.receive_json()["session"]["word_timestamps"] is True
            events, code = run_stream(ws, frames(data.astype(np.float32) / 32768.0))
    finally:
        engine.close()
    assert code == 1000 and events[-2]["type"] == "transcription_session.transcript"
    transcript = events[-2]["transcript"]
    assert sum(bool(s["words"]) for s in written["segments"]) >= 2
    assert all(s["timing"] == "aligned" for s in written["segments"] if s["text"].strip())
    keys = ("text", "language", "duration", "truncated", "repetitive", "warnings", "speech", "segments")
    assert {k: transcript[k] for k in keys} == {k: written[k] for k in keys}


def test_word_timestamps_need_the_server_s_aligner(make):
    app = make()  # an engine without an aligner
    with client(app) as c, c.websocket_connect(URL, headers=auth()) as ws:
        ws.receive_json()
        ws.send_json({"type": "transcription_session.update", "session": {"word_timestamps": True}})
        events, code = until_closed(ws)
    assert code == 1008 and events[-1]["error"]["code"] == "invalid_session"
    assert "aligner" in events[-1]["error"]["message"]
