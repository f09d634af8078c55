"""mlxasr serve: the real server (uvicorn on 127.0.0.1) answered by the official openai client for every
response format, word timestamps and streaming; errors, limits, the API key, concurrency and clients
that go away, checked over plain HTTP."""

from __future__ import annotations

import functools
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
import srt
import uvicorn
import webvtt
from reference import test_signal
from scripted import Swappable, script_batches, spy_batches

import mlx_qwen3asr
from mlx_qwen3asr.model.generate import Generation
from mlx_qwen3asr.outputs.cues import build_cues
from mlx_qwen3asr.outputs.render import render
from mlx_qwen3asr.pipeline.alignment import align_segments
from mlx_qwen3asr.pipeline.engine import Engine, JobCancelled
from mlx_qwen3asr.runtime.atomic import host_tag
from mlx_qwen3asr.serve.app import create_app, uvicorn_config
from mlx_qwen3asr.serve.uploads import remove_stale_upload_folders
from mlx_qwen3asr.text.languages import SUPPORTED_LANGUAGES

KEY = "test-key-9f2c"
MODEL_ID = "qwen3-asr-tiny"
LIMIT = 2 * 1024 * 1024  # --max-upload-mb 2
SAID = "So the first thing I want to talk about today, is the budget for next year."
# The stages of the module's engine, which a test may swap (a budget, a scripted batch, a paced aligner);
# transcriptions it compares with use them too.
STAGES = Swappable()


# --- the server -----------------------------------------------------------------------------------


class Served:
    """An app run by uvicorn on a free loopback port in a background thread."""

    def __init__(self, app, engine: Engine, upload_dir: Path):
        self.app, self.engine, self.upload_dir = app, engine, upload_dir
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn_config(
            app, log_level="warning", timeout_graceful_shutdown=2
        )  # as mlxasr serve runs it
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()
        self.engine.close()

    def client(self, key: str = KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0, timeout=120)

    def post(self, files=None, data=None, key: str | None = KEY, **kwargs) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
        return httpx.post(
            f"{self.url}/v1/audio/transcriptions",
            files=files,
            data=data,
            headers=headers,
            timeout=120,
            **kwargs,
        )

    def uploads(self) -> list[str]:
        return sorted(os.listdir(self.upload_dir))


@pytest.fixture(scope="module")
def model(checkpoints):
    return mlx_qwen3asr.load(checkpoints("tiny"))


@pytest.fixture(scope="module")
def aligner(checkpoints):
    return mlx_qwen3asr.load(checkpoints("aligner-tiny"))


@pytest.fixture(scope="module")
def served(model, aligner, tmp_path_factory):
    uploads = tmp_path_factory.mktemp("uploads")
    engine = Engine(model, aligner=aligner, vad=False, parts=STAGES.parts)
    app = create_app(engine, model_id=MODEL_ID, api_key=KEY, max_upload_bytes=LIMIT, upload_dir=uploads)
    s = Served(app, engine, uploads)
    yield s
    s.stop()


@pytest.fixture
def server(served):
    """The shared server; every test leaves its upload folder empty and its engine idle."""
    assert served.uploads() == []
    yield served
    deadline = time.monotonic() + 10
    while served.uploads() or served.engine.queued_seconds():
        assert time.monotonic() < deadline, (
            f"left behind: {served.uploads()}, {served.engine.queued_seconds()} s"
        )
        time.sleep(0.02)


@pytest.fixture
def short_budgets(monkeypatch):
    """Random weights never stop: a small budget per segment, no loop check (fast, and batch-independent)."""
    monkeypatch.setattr("mlx_qwen3asr.model.batch.LOOP_CHECK_EVERY", 10**9)
    monkeypatch.setattr(STAGES, "budget", lambda seconds: 6 + int(3 * seconds))


def wav_file(folder: Path, seconds: float, seed: int = 0, name: str | None = None) -> Path:
    path = folder / (name or f"clip-{seconds:g}s-{seed}.wav")
    sf.write(path, test_signal(seconds, seed=seed), 16000)
    return path


def said(tokenizer, text: str = SAID):
    """The model 'says' text in English (the prompt already holds the language when it is forced)."""
    forced = tokenizer.token_to_id("<asr_text>")
    return lambda prompt: tokenizer.encode(text if forced in prompt else f"language English<asr_text>{text}")


@pytest.fixture
def paced(monkeypatch):
    """The aligner times words at a speaking pace (random weights put them anywhere): 0.32 s apart, 0.25 s long."""

    def classes(aligner, prompts, features, keep_logits=False):
        return [
            np.array([c for i in range(len(p.timestamps) // 2) for c in (4 * i, 4 * i + 3)]) for p in prompts
        ]

    monkeypatch.setattr(STAGES, "align", functools.partial(align_segments, classes=classes))


def error_of(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert "\n" not in body["error"]["message"] and body["error"]["message"]
    assert "Traceback" not in response.text and KEY not in response.text
    return body["error"]


# --- every response format, through the openai client ----------------------------------------------


def test_every_response_format_parses_with_the_openai_client(server, model, short_budgets, tmp_path):
    path = wav_file(tmp_path, 3.0, seed=1)
    alone = mlx_qwen3asr.transcribe(model, str(path), vad=False, parts=STAGES.parts)
    assert alone.text  # random weights say something
    client = server.client()

    def create(**kwargs):
        with open(path, "rb") as f:
            return client.audio.transcriptions.create(model="anything", file=f, **kwargs)

    as_json = create(temperature=0.7)  # accepted; decoding stays greedy
    assert isinstance(as_json, openai.types.audio.Transcription)
    assert as_json.text == alone.text
    assert as_json.usage.type == "duration" and as_json.usage.seconds == pytest.approx(3.0)

    assert create(response_format="text") == alone.text + "\n"

    cues = build_cues(alone.segments, mlx_qwen3asr.load_audio(path), duration=alone.duration)
    as_srt = create(response_format="srt")
    assert as_srt == render("srt", alone, cues)
    assert [s.content for s in srt.parse(as_srt)] == [c.text for c in cues] and len(cues) > 1
    as_vtt = create(response_format="vtt")
    assert as_vtt == render("vtt", alone, cues)
    vtt_path = tmp_path / "out.vtt"
    vtt_path.write_text(as_vtt, encoding="utf-8")
    assert [c.text for c in webvtt.read(str(vtt_path), strict=True)] == [c.text for c in cues]

    verbose = create(response_format="verbose_json")
    assert isinstance(verbose, openai.types.audio.TranscriptionVerbose)
    assert verbose.text == alone.text and verbose.duration == pytest.approx(3.0)
    assert verbose.words is None  # not asked for
    assert [(s.id, s.start, s.end, s.text) for s in verbose.segments] == [
        (k, round(s.start, 3), round(s.end, 3), s.text) for k, s in enumerate(alone.segments)
    ]
    seg = verbose.segments[0]
    assert seg.tokens == model.tokenizer.encode(alone.segments[0].text)
    assert seg.temperature == 0.0 and seg.seek == 0 and seg.compression_ratio > 0
    assert seg.avg_logprob == pytest.approx(alone.segments[0].avg_logprob, rel=1e-3) and seg.avg_logprob < 0


def test_verbose_json_segments_carry_the_model_s_confidence(server, model, short_budgets, tmp_path):
    """avg_logprob and no_speech_prob are the model's (Segment's), not placeholders: with the language
    forced, the probability of "language None" is read where the prompt names the language."""
    path = wav_file(tmp_path, 4.0, seed=3)
    alone = mlx_qwen3asr.transcribe(model, str(path), language="en", vad=False, parts=STAGES.parts)
    body = server.post(
        files={"file": ("talk.wav", path.read_bytes())},
        data={"model": "m", "response_format": "verbose_json", "language": "en"},
    ).json()
    assert len(body["segments"]) == len(alone.segments) > 0
    for got, seg in zip(body["segments"], alone.segments):
        assert got["avg_logprob"] == pytest.approx(seg.avg_logprob, rel=1e-3)
        assert got["no_speech_prob"] == pytest.approx(seg.no_speech_prob, rel=1e-3)
        assert -50 < got["avg_logprob"] < 0 and 0 < got["no_speech_prob"] < 1


def test_verbose_json_with_word_and_segment_timestamps(server, model, aligner, monkeypatch, paced, tmp_path):
    monkeypatch.setattr(STAGES, "batch", script_batches(said(model.tokenizer)).batch)
    path = wav_file(tmp_path, 6.0, seed=2)
    with open(path, "rb") as f:
        verbose = server.client().audio.transcriptions.create(
            model="whisper-1",
            file=f,
            response_format="verbose_json",
            timestamp_granularities=["word", "segment"],
            language="en",
        )
    alone = mlx_qwen3asr.transcribe(
        model, str(path), language="en", aligner=aligner, vad=False, parts=STAGES.parts
    )
    assert isinstance(verbose, openai.types.audio.TranscriptionVerbose)
    assert verbose.language == "english" and verbose.text == SAID and verbose.duration == pytest.approx(6.0)
    assert [w.word for w in verbose.words] == SAID.split()
    expected = [(w.text, round(w.start, 3), round(w.end, 3)) for s in alone.segments for w in s.words]
    assert [(w.word, w.start, w.end) for w in verbose.words] == expected
    starts = [w.start for w in verbose.words]
    assert starts == sorted(starts) and len(set(starts)) == len(starts)
    assert all(0 <= w.start <= w.end <= 6.0 for w in verbose.words)
    assert [(s.id, s.text, s.start, s.end) for s in verbose.segments] == [(0, SAID, 0.0, 6.0)]
    assert verbose.segments[0].tokens == model.tokenizer.encode(SAID)

    only_words = server.post(
        files={"file": ("talk.wav", path.read_bytes())},
        data={"model": "m", "response_format": "verbose_json", "timestamp_granularities[]": "word"},
    ).json()
    assert "segments" not in only_words and len(only_words["words"]) == len(SAID.split())


def test_srt_and_vtt_with_word_timestamps_use_word_cues(server, model, aligner, monkeypatch, paced, tmp_path):
    monkeypatch.setattr(STAGES, "batch", script_batches(said(model.tokenizer)).batch)
    path = wav_file(tmp_path, 8.0, seed=3)
    audio = mlx_qwen3asr.load_audio(path)
    timed = mlx_qwen3asr.transcribe(model, str(path), aligner=aligner, vad=False, parts=STAGES.parts)
    word_cues = build_cues(timed.segments, audio, duration=timed.duration)
    plain = mlx_qwen3asr.transcribe(model, str(path), vad=False, parts=STAGES.parts)
    estimated = build_cues(plain.segments, audio, duration=plain.duration)
    assert render("srt", timed, word_cues) != render("srt", plain, estimated)
    client = server.client()
    for fmt in ("srt", "vtt"):
        with open(path, "rb") as f:
            words = client.audio.transcriptions.create(
                model="m", file=f, response_format=fmt, timestamp_granularities=["word"]
            )
        with open(path, "rb") as f:
            segments = client.audio.transcriptions.create(model="m", file=f, response_format=fmt)
        assert words == render(fmt, timed, word_cues)
        assert segments == render(fmt, plain, estimated)


def test_streaming_sends_a_delta_per_segment_then_the_whole_text(server, model, short_budgets, tmp_path):
    path = wav_file(tmp_path, 40.0, seed=4)
    alone = mlx_qwen3asr.transcribe(model, str(path), vad=False, parts=STAGES.parts)
    assert len([s for s in alone.segments if s.text.strip()]) == 2
    with open(path, "rb") as f:
        stream = server.client().audio.transcriptions.create(model="m", file=f, stream=True)
        events = list(stream)
    assert [e.type for e in events] == ["transcript.text.delta"] * 2 + ["transcript.text.done"]
    assert events[0].delta == alone.segments[0].text
    assert "".join(e.delta for e in events[:-1]) == events[-1].text == alone.text


def test_models_and_health(server):
    client = server.client()
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_ID] and models.data[0].object == "model"
    assert client.models.retrieve(MODEL_ID).id == MODEL_ID
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o-transcribe")
    health = httpx.get(f"{server.url}/health", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert health == {
        "status": "ok",
        "model": MODEL_ID,
        "word_timestamps": True,
        "diarization": False,
        "library": False,
        "max_job_upload_bytes": None,
        "languages": list(SUPPORTED_LANGUAGES),
        "queued_seconds": 0.0,
        "diarization_queued_seconds": 0.0,
    }
    assert "English" in health["languages"] and "Chinese" in health["languages"]


def test_the_prompt_is_the_context(server, model, monkeypatch, short_budgets, tmp_path):
    submitted = []
    real = server.engine.submit
    monkeypatch.setattr(server.engine, "submit", lambda *a, **k: submitted.append(k) or real(*a, **k))
    path = wav_file(tmp_path, 2.0)
    response = server.post(
        files={"file": ("a.wav", path.read_bytes())}, data={"model": "m", "prompt": "Ada Lovelace"}
    )
    assert response.status_code == 200 and submitted[0]["context"] == "Ada Lovelace"
    assert submitted[0]["language"] is None and submitted[0]["word_timestamps"] is False

    too_long = server.post(
        files={"file": ("a.wav", path.read_bytes())}, data={"model": "m", "prompt": "word " * 9000}
    )
    assert too_long.status_code == 400 and error_of(too_long)["param"] == "prompt"


# --- bad requests ---------------------------------------------------------------------------------


def test_bad_requests_are_400_with_an_openai_error_body(server, tmp_path):
    audio = wav_file(tmp_path, 1.0).read_bytes()

    notes = server.post(files={"file": ("notes.txt", b"these are not samples\n" * 50)}, data={"model": "m"})
    assert notes.status_code == 400
    err = error_of(notes)
    assert err["param"] == "file" and err["code"] == "invalid_audio" and "audio" in err["message"]
    assert str(server.upload_dir) not in notes.text and "upload-" not in notes.text
    assert err["type"] == "invalid_request_error"

    empty = server.post(files={"file": ("empty.wav", b"")}, data={"model": "m"})
    assert empty.status_code == 400 and error_of(empty)["code"] == "empty_file"

    no_file = server.post(data={"model": "m"}, files={"other": ("x.bin", b"123")})
    assert no_file.status_code == 400 and error_of(no_file)["param"] == "file"

    no_model = server.post(files={"file": ("a.wav", audio)})
    assert no_model.status_code == 400 and error_of(no_model)["param"] == "model"

    klingon = server.post(files={"file": ("a.wav", audio)}, data={"model": "m", "language": "Klingon"})
    assert klingon.status_code == 400
    err = error_of(klingon)
    assert err["param"] == "language" and "Klingon" in err["message"] and "English (en)" in err["message"]

    streamed = server.post(
        files={"file": ("notes.txt", b"not audio\n" * 50)}, data={"model": "m", "stream": "true"}
    )
    assert streamed.status_code == 400 and error_of(streamed)["code"] == "invalid_audio"  # before any event

    fmt = server.post(
        files={"file": ("a.wav", audio)}, data={"model": "m", "response_format": "diarized_json"}
    )
    assert fmt.status_code == 400 and error_of(fmt)["param"] == "response_format"

    grain = server.post(
        files={"file": ("a.wav", audio)}, data={"model": "m", "timestamp_granularities[]": "syllable"}
    )
    assert grain.status_code == 400 and error_of(grain)["param"] == "timestamp_granularities[]"

    form = httpx.post(
        f"{server.url}/v1/audio/transcriptions",
        json={"model": "m"},
        headers={"Authorization": f"Bearer {KEY}"},
    )
    assert form.status_code == 400 and "multipart/form-data" in error_of(form)["message"]

    with pytest.raises(openai.BadRequestError, match="Klingon"):
        server.client().audio.transcriptions.create(model="m", file=("a.wav", audio), language="Klingon")


def test_the_api_key_is_required_and_compared_exactly(server, tmp_path):
    audio = wav_file(tmp_path, 1.0).read_bytes()
    for key in (None, "wrong", KEY + "x", KEY[:-1]):
        r = server.post(files={"file": ("a.wav", audio)}, data={"model": "m"}, key=key)
        assert r.status_code == 401 and error_of(r)["code"] == "invalid_api_key"
        assert r.headers["www-authenticate"] == "Bearer"
    basic = httpx.get(f"{server.url}/health", headers={"Authorization": f"Basic {KEY}"})
    assert basic.status_code == 401
    assert httpx.get(f"{server.url}/v1/models").status_code == 401
    assert httpx.get(f"{server.url}/health", headers={"Authorization": f"bearer {KEY}"}).status_code == 200
    with pytest.raises(openai.AuthenticationError):
        server.client("wrong").models.list()


def multipart(fields: dict[str, str], data: bytes, filename: str = "a.wav") -> tuple[bytes, str]:
    boundary = "b0undary7d3f"
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
        for k, v in fields.items()
    ]
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n".encode()
        + data
        + b"\r\n"
    )
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def read_response(sock: socket.socket, timeout: float = 20.0) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of the next response on the connection."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    while len(body) < int(headers.get("content-length", "0")):
        chunk = sock.recv(65536)
        assert chunk, "connection closed in the body"
        body += chunk
    return int(lines[0].split()[1]), headers, body


def request_head(server: Served, extra: str) -> bytes:
    return (
        f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
        f"Authorization: Bearer {KEY}\r\n{extra}\r\n"
    ).encode()


def health_on(sock: socket.socket, server: Served) -> int:
    sock.sendall(
        f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nAuthorization: Bearer {KEY}\r\n\r\n".encode()
    )
    return read_response(sock)[0]


def test_an_upload_over_the_limit_is_413_without_reading_the_rest(server, tmp_path):
    # Declared: refused on the headers alone, before any of the body is sent. The connection then
    # drops the body as it comes, and serves the next request.
    payload, ctype = multipart({"model": "m"}, b"\0" * LIMIT)
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(request_head(server, f"Content-Type: {ctype}\r\nContent-Length: {len(payload)}\r\n"))
        status, headers, body = read_response(sock)
        assert status == 413 and "connection" not in headers
        assert json.loads(body)["error"]["code"] == "file_too_large"
        sock.sendall(payload)
        assert health_on(sock, server) == 200
    assert server.uploads() == []

    # Far over the limit: not worth taking in; the connection closes.
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(request_head(server, f"Content-Type: {ctype}\r\nContent-Length: {10 * LIMIT}\r\n"))
        status, headers, _ = read_response(sock)
        assert status == 413 and headers["connection"] == "close"
        assert sock.recv(1) == b""

    # Chunked (no Content-Length): counted as it streams, refused as soon as it passes the limit,
    # while the client is still sending.
    payload, ctype = multipart({"model": "m"}, b"\0" * (LIMIT + 300_000))
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(request_head(server, f"Content-Type: {ctype}\r\nTransfer-Encoding: chunked\r\n"))
        sent = 0
        while sent < LIMIT + 100_000:
            piece = payload[sent : sent + 65536]
            sock.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            sent += len(piece)
        status, headers, body = read_response(sock)
        assert status == 413 and json.loads(body)["error"]["code"] == "file_too_large"
        assert server.uploads() == []  # its partial file is gone already
        rest = payload[sent:]
        sock.sendall(f"{len(rest):x}\r\n".encode() + rest + b"\r\n0\r\n\r\n")
        assert health_on(sock, server) == 200

    # Through the openai client: an APIStatusError with 413, not a network error.
    with pytest.raises(openai.APIStatusError) as caught:
        server.client().audio.transcriptions.create(model="m", file=("big.wav", b"\0" * (LIMIT + 1)))
    assert caught.value.status_code == 413

    # Just under the limit is read in full (and refused only as not audio).
    payload, ctype = multipart({"model": "m"}, b"\1" * (LIMIT - 1000))
    r = httpx.post(
        f"{server.url}/v1/audio/transcriptions",
        content=payload,
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": ctype},
        timeout=60,
    )
    assert r.status_code == 400 and error_of(r)["code"] == "invalid_audio"


# --- many clients, and clients that leave ---------------------------------------------------------


def test_concurrent_clients_each_get_what_their_file_gives_alone(
    server, model, monkeypatch, short_budgets, tmp_path
):
    paths = [wav_file(tmp_path, 1.0 + 1.5 * i, seed=10 + i) for i in range(12)]
    alone = [mlx_qwen3asr.transcribe(model, str(p), vad=False, parts=STAGES.parts).text for p in paths]
    assert len(set(alone)) == len(alone)
    record = spy_batches()
    monkeypatch.setattr(STAGES, "batch", record.batch)
    texts: list[str | None] = [None] * len(paths)
    errors = []
    start = threading.Barrier(len(paths))

    def ask(i: int) -> None:
        try:
            client = server.client()
            start.wait()
            with open(paths[i], "rb") as f:
                texts[i] = client.audio.transcriptions.create(model="m", file=f).text
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(paths))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert errors == []
    assert texts == alone
    assert max(record.sizes) > 1  # requests were decoded side by side


class Gate:
    """A stand-in decoding batch whose long rows (prompts over `long` tokens) finish only when allowed
    (longest first), so that a request stays in the batch as long as a test needs; short rows finish
    at their first step."""

    def __init__(self, monkeypatch, say, long: int = 60):
        self.allow, self.dropped, self.jobs = 0, [], []
        gate = self

        class Gated:
            def __init__(self, net, eos_ids, *, prefix=None, keep_logits=False, header=None):
                self.prefix, self.rows = prefix, {}

            def __len__(self):
                return len(self.rows)

            @property
            def keys(self):
                return list(self.rows)

            def add(self, prompts, audio_features, max_new_tokens, keys):
                self.rows.update(zip(keys, prompts))
                return []

            def step(self):
                time.sleep(0.005)
                done = [k for k, p in self.rows.items() if len(p) <= long]
                held = sorted((k for k in self.rows if k not in done), key=lambda k: -len(self.rows[k]))
                while held and gate.allow > 0:
                    gate.allow -= 1
                    done.append(held.pop(0))
                return [
                    (k, Generation(say(self.rows.pop(k)), truncated=False, repetitive=False)) for k in done
                ]

            def drop(self, keys):
                gate.dropped += list(keys)
                for k in keys:
                    self.rows.pop(k, None)

        monkeypatch.setattr(STAGES, "batch", Gated)

    def record_jobs(self, monkeypatch, engine: Engine) -> None:
        real = engine.submit
        monkeypatch.setattr(
            engine, "submit", lambda *a, **k: self.jobs.append(real(*a, **k)) or self.jobs[-1]
        )


def wait_until(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_client_that_leaves_has_its_job_cancelled(server, model, monkeypatch, tmp_path):
    gate = Gate(monkeypatch, said(model.tokenizer, "hello there"))
    gate.record_jobs(monkeypatch, server.engine)
    payload, ctype = multipart({"model": "m"}, wav_file(tmp_path, 25.0, seed=5).read_bytes())
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(
            request_head(server, f"Content-Type: {ctype}\r\nContent-Length: {len(payload)}\r\n") + payload
        )
        wait_until(lambda: gate.jobs and server.engine.queued_seconds() > 0)
        assert server.uploads() != []  # its upload is being transcribed
        time.sleep(0.3)
        assert not gate.jobs[0].done  # held in the batch
    wait_until(lambda: gate.jobs[0].done)
    with pytest.raises(JobCancelled):
        gate.jobs[0].result(timeout=0)
    wait_until(lambda: gate.dropped != [])  # its row left the batch
    wait_until(lambda: server.uploads() == [] and server.engine.queued_seconds() == 0)

    with open(wav_file(tmp_path, 2.0, seed=6), "rb") as f:  # the engine goes on serving
        assert server.client().audio.transcriptions.create(model="m", file=f).text == "hello there"


def test_a_client_that_leaves_during_the_upload_leaves_no_file(server, tmp_path):
    payload, ctype = multipart({"model": "m"}, b"\1" * (LIMIT - 100_000))
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(request_head(server, f"Content-Type: {ctype}\r\nContent-Length: {len(payload)}\r\n"))
        sock.sendall(payload[: len(payload) * 3 // 4])
        wait_until(lambda: server.uploads() != [])  # written as it arrives
    wait_until(lambda: server.uploads() == [])
    assert server.engine.queued_seconds() == 0


def test_a_stream_whose_client_leaves_has_its_job_cancelled(server, model, monkeypatch, tmp_path):
    gate = Gate(monkeypatch, said(model.tokenizer, "first part"))
    gate.record_jobs(monkeypatch, server.engine)
    gate.allow = 1  # the first segment is decoded, the second is held
    path = wav_file(tmp_path, 40.0, seed=4)
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.stream(
        "POST",
        f"{server.url}/v1/audio/transcriptions",
        files={"file": ("long.wav", path.read_bytes())},
        data={"model": "m", "stream": "true"},
        headers=headers,
        timeout=60,
    ) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith(
            "text/event-stream"
        )
        lines = response.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert json.loads(first[6:]) == {"type": "transcript.text.delta", "delta": "first part"}
        assert not gate.jobs[0].done
    wait_until(lambda: gate.jobs[0].done)
    with pytest.raises(JobCancelled):
        gate.jobs[0].result(timeout=0)
    wait_until(lambda: len(gate.dropped) == 1)
    wait_until(lambda: server.uploads() == [] and server.engine.queued_seconds() == 0)


# --- the command: start errors, a missing default aligner, a full queue ---------------------------


def test_model_errors_at_start_are_one_line_and_status_2(checkpoints, capsys, tmp_path):
    from mlx_qwen3asr.cli.serve import main

    assert main(["--model", str(tmp_path / "missing"), "--port", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"mlxasr serve: error: model {tmp_path / 'missing'}: ") and len(err) == 2

    assert main(["--model", str(checkpoints("aligner-tiny")), "--port", "0"]) == 2
    assert "ForcedAligner word-timing model" in capsys.readouterr().err.strip().splitlines()[-1]

    args = ["--model", str(checkpoints("tiny")), "--aligner", str(tmp_path / "no-aligner"), "--port", "0"]
    assert main(args) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[-1]
        .startswith(f"mlxasr serve: error: aligner {tmp_path / 'no-aligner'}: ")
    )

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        assert main(["--model", str(checkpoints("tiny")), "--port", str(port)]) == 2
        assert "cannot listen on 127.0.0.1" in capsys.readouterr().err

    assert main(["--max-upload-mb", "0"]) == 2
    assert main(["--max-queue-seconds", "-1"]) == 2


def test_serve_without_the_default_aligner_and_with_a_full_queue(checkpoints, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("MLXASR_ALIGNER", "MLXASR_API_KEY")}
    env.update(HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"), MLXASR_API_KEY=KEY)
    command = [sys.executable, "-m", "mlx_qwen3asr.cli.main", "serve", "--model", str(checkpoints("tiny"))]
    proc = subprocess.Popen(
        command + ["--port", "0", "--max-queue-seconds", "1"],
        cwd=tmp_path,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    try:
        for line in proc.stderr:
            lines.append(line)
            if line.startswith("listening on "):
                break
        url = re.match(r"listening on (http://\S+)", lines[-1]).group(1)
        threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()
        assert any(
            line.startswith("mlxasr serve: warning: default aligner not cached, ")
            and line.rstrip().endswith(": word timestamps refused; use --aligner PATH or --no-aligner")
            for line in lines
        ), lines
        headers = {"Authorization": f"Bearer {KEY}"}
        wait_until(lambda: httpx.get(f"{url}/health", headers=headers).status_code == 200, 60)

        short = wav_file(tmp_path, 2.0).read_bytes()
        post = lambda data, audio=short: httpx.post(  # noqa: E731
            f"{url}/v1/audio/transcriptions",
            files={"file": ("a.wav", audio)},
            data=data,
            headers=headers,
            timeout=300,
        )
        words = post({"model": "m", "response_format": "verbose_json", "timestamp_granularities[]": "word"})
        assert words.status_code == 400
        message = error_of(words)["message"]
        assert "word timestamps are not available" in message and "Qwen/Qwen3-ForcedAligner-0.6B" in message
        assert post({"model": "m", "response_format": "verbose_json"}).status_code == 200  # the rest works

        long_answer = []
        first = threading.Thread(
            target=lambda: long_answer.append(
                post({"model": "m"}, wav_file(tmp_path, 120.0, seed=7).read_bytes())
            )
        )
        first.start()
        health = lambda: httpx.get(f"{url}/health", headers=headers).json()  # noqa: E731
        wait_until(lambda: health()["queued_seconds"] > 1, 60)
        busy = post({"model": "m"})
        assert busy.status_code == 503 and int(busy.headers["retry-after"]) >= 1
        assert error_of(busy)["type"] == "server_error"
        first.join(timeout=300)
        assert long_answer[0].status_code == 200
        assert post({"model": "m"}).status_code == 200  # the queue drained: served again
    finally:
        proc.send_signal(2)  # SIGINT: Ctrl-C
        status = proc.wait(timeout=60)
    assert status == 130, "".join(lines)


def test_a_full_queue_is_refused_with_a_retry_after_from_the_recent_speed():
    from mlx_qwen3asr.serve.load import DEFAULT_RETRY_AFTER, MAX_RETRY_AFTER, SPEED_WINDOW_SECONDS, Load

    class Holding:
        seconds = 0.0

        def queued_seconds(self) -> float:
            return self.seconds

    engine, speakers = Holding(), Holding()
    load = Load(engine, speakers, max_queue_seconds=100.0)
    load.started -= SPEED_WINDOW_SECONDS  # a whole window measured
    assert load.busy() is None
    engine.seconds = 160.0
    assert load.busy().status == 503
    assert load.busy().headers["Retry-After"] == str(DEFAULT_RETRY_AFTER)  # nothing done yet to measure
    load.finished(240.0)  # 2 s of audio a second lately: the 60 s over the limit take 30 s
    assert load.busy().headers["Retry-After"] == "30" and load.busy().code == "server_busy"
    engine.seconds, speakers.seconds = 0.0, 160.0  # the diarizer's queue counts for diarized answers alone
    assert load.busy() is None and load.busy(diarize=True).headers["Retry-After"] == "30"
    engine.seconds = 1e9
    assert load.busy().headers["Retry-After"] == str(MAX_RETRY_AFTER)


def test_only_the_uploads_folders_of_servers_that_are_gone_and_idle_are_removed(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(30)
    now = time.time()

    def made(name: str, age: float, folder: bool = True) -> Path:
        path = tmp_path / name
        if folder:
            path.mkdir()
            (path / "upload-a.wav").write_bytes(b"x")
            os.utime(path / "upload-a.wav", (now - age, now - age))
        else:
            path.write_bytes(b"x")
        os.utime(path, (now - age, now - age))
        return path

    here = host_tag()
    elsewhere = "0" * 8 if here != "0" * 8 else "1" * 8  # another machine sharing the folder
    killed = made(f"mlxasr-uploads-{gone.pid}-{here}-k1", 120)
    kept = [
        made(f"mlxasr-uploads-{gone.pid}-{here}-recent", 5),  # something was added a moment ago
        made(f"mlxasr-uploads-{gone.pid}-{here}-writing", 120),  # an upload was written a moment ago
        made(f"mlxasr-uploads-{os.getpid()}-{here}-live", 120),  # its server runs
        made(f"mlxasr-uploads-{gone.pid}-{elsewhere}-far", 120),  # its process may run there
        made("mlxasr-uploads-abc_1234", 120),  # not named for a process
        made(f"mlxasr-uploads-{gone.pid}-{here}-file", 120, folder=False),  # not a folder
    ]
    os.utime(kept[1] / "upload-a.wav", (now - 5, now - 5))
    assert remove_stale_upload_folders(tmp_path, now=now) == [killed]
    assert not killed.exists() and all(p.exists() for p in kept)
