"""What mlxasr serve holds on to: a model passed to the server is freed once the server run has ended
(the app built, served by uvicorn on a loopback port, requests answered, shut down, its engine closed)."""

from __future__ import annotations

import gc
import io
import json
import socket
import threading
import time
import weakref
from dataclasses import replace

import httpx
import numpy as np
import soundfile as sf
import uvicorn
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

import mlx_qwen3asr
from mlx_qwen3asr.pipeline.engine import Engine
from mlx_qwen3asr.pipeline.parts import Parts
from mlx_qwen3asr.serve.app import create_app, uvicorn_config
from mlx_qwen3asr.serve.live import LIVE_PATH, LiveLimits

SR = 16000
DEADLINE = 120.0
KEY = "lifetime-key-7d21"


def _signal(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SR)) / SR
    return (0.3 * (0.5 + 0.5 * np.sin(2 * np.pi * 4.0 * t)) * rng.standard_normal(t.shape[0])).astype(
        np.float32
    )


def _wav(samples: np.ndarray) -> bytes:
    out = io.BytesIO()
    sf.write(out, samples, SR, format="WAV")
    return out.getvalue()


def _pcm(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()


def _live(url: str, auth: dict[str, str], frames: list[str | bytes], leave: bool = False) -> list[dict]:
    """A live session that sends `frames`, then reads until the server closes (or, leave: goes away)."""
    with connect(url, additional_headers=auth, open_timeout=30, close_timeout=10) as ws:
        assert json.loads(ws.recv(timeout=30))["type"] == "transcription_session.created"
        for frame in frames:
            ws.send(frame)
        if leave:
            return []
        events = []
        try:
            while True:
                events.append(json.loads(ws.recv(timeout=DEADLINE)))
        except ConnectionClosed:
            pass
        return events


def _serve_once(checkpoints, tmp_path) -> list[weakref.ref]:
    """Load the model and the aligner, serve them, make file requests (plain, streamed, with words) and
    live sessions (finished, refused a bad frame, left by their client), stop the server and close the
    engine; only weak references to the models leave this function."""
    model = mlx_qwen3asr.load(checkpoints("tiny"), dtype="float32")
    aligner = mlx_qwen3asr.load(checkpoints("aligner-tiny"))
    refs = [weakref.ref(model), weakref.ref(aligner)]
    parts = replace(Parts(), budget=lambda seconds: 6 + int(3 * seconds))  # random weights never stop
    engine = Engine(model, aligner=aligner, vad=False, parts=parts)
    del model, aligner
    limits = LiveLimits(chunk_seconds=0.5, max_window_seconds=2.0, max_new_tokens=4, idle_timeout=20.0)
    app = create_app(engine, model_id="tiny", api_key=KEY, upload_dir=tmp_path, live=limits)
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn_config(app, log_level="warning", timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
            time.sleep(0.02)
        auth = {"Authorization": f"Bearer {KEY}"}
        url = f"http://127.0.0.1:{port}/v1/audio/transcriptions"
        with httpx.Client(timeout=DEADLINE) as http:
            forms = [
                {"response_format": "verbose_json"},
                {"stream": "true"},
                {"language": "en", "response_format": "verbose_json", "timestamp_granularities[]": "word"},
            ]
            for form in forms:
                answer = http.post(
                    url,
                    headers=auth,
                    files={"file": ("a.wav", _wav(_signal(1.5, seed=1)))},
                    data={"model": "x", **form},
                )
                assert answer.status_code == 200, answer.text
            assert http.get(f"http://127.0.0.1:{port}/health", headers=auth).status_code == 200
        live = f"ws://127.0.0.1:{port}{LIVE_PATH}"
        samples = _signal(1.5, seed=2)
        audio = [_pcm(samples[i : i + SR // 4]) for i in range(0, samples.shape[0], SR // 4)]
        events = _live(live, auth, [*audio, json.dumps({"type": "session.finish"})])
        assert events[-1]["type"] == "transcription_session.finished"
        events = _live(live, auth, [audio[0], "{broken"])
        assert [e["error"]["code"] for e in events if e["type"] == "error"] == ["invalid_json"]
        _live(live, auth, audio, leave=True)
        deadline = time.monotonic() + DEADLINE
        while app.state.live.active:
            assert time.monotonic() < deadline, "the session left by its client did not end"
            time.sleep(0.02)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
        engine.close()
    assert not thread.is_alive(), "the server did not stop"
    assert all(ref() is not None for ref in refs)  # still held here, by the engine
    return refs


def test_the_model_is_freed_when_the_server_run_ends(checkpoints, tmp_path):
    refs = _serve_once(checkpoints, tmp_path)
    for _ in range(5):
        gc.collect()
        if all(ref() is None for ref in refs):
            break
        time.sleep(0.2)  # threads that ended may still be unwinding their last frame
    for name, ref in zip(("model", "aligner"), refs):
        held = ref()
        if held is not None:
            holders = sorted(type(r).__name__ for r in gc.get_referrers(held))
            del held
            raise AssertionError(f"the {name} outlived the server run; held by {holders}")
