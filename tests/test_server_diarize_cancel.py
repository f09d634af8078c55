"""mlxasr serve --diarize and clients that go away: a diarized_json request whose client leaves (while it is
transcribed, while it waits for its speakers, mid-stream) cancels its diarization, so that the server's
one diarizer is free for the next request; one still queued leaves the queue without stopping the run
of another, and without an error in the log; /health counts the audio the diarizer holds. Speech
detection picks what is diarized: audio without speech never reaches the diarizer. The real server on
a loopback port; the diarizer is a stand-in that blocks until it is cancelled, and the real library
(isolated, as mlxasr serve loads it) on the random-weight preset."""

from __future__ import annotations

import logging
import socket
import threading
import time

import httpx
import numpy as np
import pytest
import soundfile as sf
from scripted import Swappable, script_batches
from test_server import KEY, Served, wav_file

import mlx_qwen3asr
import mlx_qwen3asr.diarize as library
from mlx_qwen3asr.audio.features import SAMPLE_RATE
from mlx_qwen3asr.pipeline.engine import Engine
from mlx_qwen3asr.serve.app import Speakers, create_app
from tools.make_checkpoint import DIARIZER_PRESET
from tools.sounds import espeak, trimmed

SAID = "So the first thing I want to talk about today, is the budget for next year."
STAGES = Swappable()
# Long enough that a test waiting on it would fail its deadlines first.
BLOCK_SECONDS = 30.0


class Blocking:
    """A stand-in diarizer shared as the real one is: with `block` set, a call blocks until cancel() (which,
    as the real one's, stops only a call in progress) and raises DiarizeCancelled; otherwise it gives
    speaker 0 over the whole audio at once. calls: (seconds of audio, speech) of each call."""

    def __init__(self) -> None:
        self.block = False
        self.calls: list[tuple[float, object]] = []
        self.cancels = 0
        self.started = threading.Event()
        self._lock = threading.Lock()
        self._token: threading.Event | None = None

    def __call__(self, samples: np.ndarray, options, *, speech=None) -> list:
        seconds = samples.shape[0] / SAMPLE_RATE
        token = threading.Event()
        with self._lock:
            self.calls.append((seconds, speech))
            self._token = token
        self.started.set()
        try:
            if self.block:
                if token.wait(BLOCK_SECONDS):
                    raise library.DiarizeCancelled("diarization was cancelled")
                raise AssertionError("the stand-in diarizer was never cancelled")
            return [library.Turn(0.0, seconds, 0)]
        finally:
            with self._lock:
                self._token = None

    def cancel(self) -> None:
        with self._lock:
            self.cancels += 1
            if self._token is not None:
                self._token.set()

    def reset(self) -> None:
        self.block, self.cancels = False, 0
        self.calls.clear()
        self.started.clear()


DIARIZER = Blocking()


@pytest.fixture(scope="module")
def model(checkpoints):
    return mlx_qwen3asr.load(checkpoints("tiny"))


def serve(model, uploads, *, vad: bool) -> tuple[Served, Speakers]:
    engine = Engine(model, vad=vad, parts=STAGES.parts)
    speakers = Speakers(DIARIZER, library)
    app = create_app(engine, model_id="m", api_key=KEY, upload_dir=uploads, speakers=speakers)
    return Served(app, engine, uploads), speakers


@pytest.fixture(scope="module")
def served(model, tmp_path_factory):
    s, speakers = serve(model, tmp_path_factory.mktemp("uploads"), vad=False)
    yield s
    s.stop()
    speakers.close()


@pytest.fixture
def say(model, monkeypatch):
    """The model says SAID for every segment."""
    forced = model.tokenizer.token_to_id("<asr_text>")
    said = script_batches(
        lambda prompt: model.tokenizer.encode(
            SAID if forced in prompt else f"language English<asr_text>{SAID}"
        )
    )
    monkeypatch.setattr(STAGES, "batch", said.batch)
    monkeypatch.setattr("mlx_qwen3asr.model.batch.LOOP_CHECK_EVERY", 10**9)
    DIARIZER.reset()
    yield said
    DIARIZER.reset()


@pytest.fixture
def server(served, say):
    yield served
    deadline = time.monotonic() + 10
    while served.uploads() or served.engine.queued_seconds() or health(served)["diarization_queued_seconds"]:
        assert time.monotonic() < deadline, f"left behind: {served.uploads()}, {health(served)}"
        time.sleep(0.02)


def health(s: Served) -> dict:
    return httpx.get(f"{s.url}/health", headers={"Authorization": f"Bearer {KEY}"}, timeout=10).json()


class Leaving:
    """A diarized_json request sent over a socket of its own, which leave() closes before the answer."""

    def __init__(self, s: Served, audio: bytes, **fields: str) -> None:
        request = httpx.Request(
            "POST",
            f"{s.url}/v1/audio/transcriptions",
            files={"file": ("talk.wav", audio)},
            data={"model": "m", "response_format": "diarized_json", **fields},
            headers={"Authorization": f"Bearer {KEY}"},
        )
        body = request.read()
        head = f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: 127.0.0.1:{s.port}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in request.headers.items() if k.lower() != "host")
        self.sock = socket.create_connection(("127.0.0.1", s.port))
        self.sock.sendall(head.encode() + b"\r\n" + body)

    def leave(self) -> None:
        self.sock.close()


def until(condition, what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.01)


def answered_promptly(s: Served, path) -> float:
    """A short diarized_json request, answered (200, one speaker) well before a blocked diarizer lets go."""
    t0 = time.monotonic()
    response = httpx.post(
        f"{s.url}/v1/audio/transcriptions",
        files={"file": ("short.wav", path.read_bytes())},
        data={"model": "m", "response_format": "diarized_json"},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=BLOCK_SECONDS / 3,
    )
    took = time.monotonic() - t0
    assert response.status_code == 200, response.text
    assert [seg["speaker"] for seg in response.json()["segments"]] == ["A"]
    return took


def no_errors(caplog) -> None:
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_leaves_while_its_speakers_are_found_frees_the_diarizer(
    server, tmp_path, caplog, stream
):
    DIARIZER.block = True
    gone = Leaving(server, wav_file(tmp_path, 20.0, seed=1).read_bytes(), stream=str(stream).lower())
    until(DIARIZER.started.is_set, "the diarizer started")
    until(lambda: server.engine.queued_seconds() == 0, "the transcription is done")
    gone.leave()
    until(lambda: DIARIZER.cancels > 0, "the diarizer was told to stop")
    DIARIZER.block = False
    assert answered_promptly(server, wav_file(tmp_path, 2.0, seed=2)) < 5
    assert [round(c[0], 2) for c in DIARIZER.calls] == [20.0, 2.0]
    no_errors(caplog)  # the stopped run is no failure


def test_a_client_that_leaves_during_its_transcription_cancels_its_diarization(server, monkeypatch, tmp_path):
    release = threading.Event()

    class Held(STAGES.batch):
        def step(self):
            release.wait(BLOCK_SECONDS)
            return super().step()

    monkeypatch.setattr(STAGES, "batch", Held)
    DIARIZER.block = True
    try:
        gone = Leaving(server, wav_file(tmp_path, 8.0, seed=3).read_bytes())
        until(DIARIZER.started.is_set, "the diarizer started")
        assert server.engine.queued_seconds() > 0  # still transcribing
        gone.leave()
        until(lambda: DIARIZER.cancels > 0, "the diarizer was told to stop")
    finally:
        release.set()
    DIARIZER.block = False
    assert answered_promptly(server, wav_file(tmp_path, 2.0, seed=2)) < 5


def test_a_queued_request_that_leaves_is_dropped_quietly_and_health_counts_the_diarizer(
    server, tmp_path, caplog
):
    caplog.set_level(logging.INFO)
    DIARIZER.block = True
    running = Leaving(server, wav_file(tmp_path, 6.0, seed=1).read_bytes())
    until(DIARIZER.started.is_set, "the first request is diarized")
    queued = Leaving(server, wav_file(tmp_path, 4.0, seed=2).read_bytes())
    # The one running and the one waiting behind it.
    until(lambda: health(server)["diarization_queued_seconds"] == 10.0, "/health counts both")
    until(lambda: server.engine.queued_seconds() == 0, "both are transcribed")
    assert health(server)["queued_seconds"] == 0.0

    queued.leave()
    until(lambda: health(server)["diarization_queued_seconds"] == 6.0, "/health drops the one that left")
    time.sleep(0.2)  # time for a wrong cancel to reach the diarizer
    assert DIARIZER.cancels == 0  # the other request's run goes on
    assert [round(c[0], 2) for c in DIARIZER.calls] == [6.0]

    running.leave()
    until(lambda: DIARIZER.cancels > 0, "the running one is stopped")
    until(lambda: health(server)["diarization_queued_seconds"] == 0.0, "/health counts nothing")
    DIARIZER.block = False
    assert answered_promptly(server, wav_file(tmp_path, 2.0, seed=3)) < 5
    assert [round(c[0], 2) for c in DIARIZER.calls] == [6.0, 2.0]  # the queued one never ran
    no_errors(caplog)
    assert any("went away" in r.getMessage() for r in caplog.records)


def test_only_speech_is_diarized_and_audio_without_speech_never_reaches_the_diarizer(model, say, tmp_path):
    uploads = tmp_path / "uploads"
    uploads.mkdir()
    s, speakers = serve(model, uploads, vad=True)
    try:
        silence = tmp_path / "silence.wav"
        sf.write(silence, np.zeros(10 * SAMPLE_RATE, np.float32), SAMPLE_RATE)
        response = s.post(
            files={"file": ("silence.wav", silence.read_bytes())},
            data={"model": "m", "response_format": "diarized_json"},
        )
        assert response.status_code == 200, response.text
        assert response.json()["segments"] == [] and DIARIZER.calls == []

        # A sentence between 2 s of silence and 1 s more: its stretch alone is given, in seconds.
        sentence = trimmed(espeak("en", "The committee will meet again on Thursday."))
        quiet = np.zeros(2 * SAMPLE_RATE, np.float32)
        talk = tmp_path / "talk.wav"
        sf.write(talk, np.concatenate([quiet, 0.5 * sentence, quiet[:SAMPLE_RATE]]), SAMPLE_RATE)
        response = s.post(
            files={"file": ("talk.wav", talk.read_bytes())},
            data={"model": "m", "response_format": "diarized_json"},
        )
        assert response.status_code == 200, response.text
        assert [seg["speaker"] for seg in response.json()["segments"]] == ["A"]
        ((seconds, speech),) = DIARIZER.calls
        end = 2 + len(sentence) / SAMPLE_RATE
        assert seconds == pytest.approx(end + 1, abs=0.01)
        assert len(speech) == 1 and all(isinstance(t, float) for t in speech[0])
        assert speech[0][0] == pytest.approx(2.0, abs=0.3) and speech[0][1] == pytest.approx(end, abs=0.4)
    finally:
        s.stop()
        speakers.close()


def test_with_the_library_a_client_that_leaves_frees_the_diarizer_at_once(model, say, tmp_path, checkpoints):
    """speakrs checks its cancel token only between its stages (a minute and more apart here): the
    server's diarizer runs it in a worker process, which a client leaving kills."""
    pytest.importorskip("speakrs", reason="speakrs (the diarize extra, Python 3.11+) is not installed")
    diarizer = library.load_diarizer(checkpoints(DIARIZER_PRESET), isolated=True)
    uploads = tmp_path / "uploads"
    uploads.mkdir()
    engine = Engine(model, vad=False, parts=STAGES.parts)
    speakers = Speakers(diarizer, library)
    s = Served(
        create_app(engine, model_id="m", api_key=KEY, upload_dir=uploads, speakers=speakers), engine, uploads
    )
    try:
        gone = Leaving(s, wav_file(tmp_path, 90.0, seed=1).read_bytes())
        until(lambda: diarizer.progress() is not None, "the diarizer started", 30)
        until(
            lambda: health(s)["diarization_queued_seconds"] > 0 and engine.queued_seconds() == 0,
            "transcribed",
        )
        pid = diarizer.worker_pid
        gone.leave()
        until(lambda: diarizer.progress() is None, "the diarization stopped", 3)
        until(lambda: health(s)["diarization_queued_seconds"] == 0, "/health counts nothing", 3)
        t0 = time.monotonic()
        response = httpx.post(
            f"{s.url}/v1/audio/transcriptions",
            files={"file": ("short.wav", wav_file(tmp_path, 3.0, seed=2).read_bytes())},
            data={"model": "m", "response_format": "diarized_json"},
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=60,
        )
        assert response.status_code == 200, response.text
        assert time.monotonic() - t0 < 15  # a fresh worker: the models loaded again, 3 s diarized
        assert diarizer.worker_pid not in (None, pid)
    finally:
        s.stop()
        speakers.close()
        diarizer.close()
