"""mlxasr serve against hostile or broken clients, over raw sockets on loopback: idle and slow
connections, too many of them, uploads cut short, a full disk, audio that decodes far longer than its
size says, foreign Host headers and cross-origin pages, an empty API key."""

from __future__ import annotations

import errno
import json
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import wave
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf
import uvicorn
from reference import test_signal
from test_server import read_response

import mlx_qwen3asr
from mlx_qwen3asr.audio.features import AudioError
from mlx_qwen3asr.pipeline.engine import Engine
from mlx_qwen3asr.pipeline.parts import Parts
from mlx_qwen3asr.serve.app import ConnectionLimits, create_app, uvicorn_config

KEY = "hostile-key-51c0"
BOUNDARY = "b0undaryHostile"


# --- the server -----------------------------------------------------------------------------------


class Served:
    """create_app(...) run by uvicorn, with the connection limits given, on a free loopback port."""

    def __init__(
        self, model, upload_dir: Path, limits: ConnectionLimits, parts: Parts | None = None, **options
    ):
        self.engine = Engine(model, vad=False, parts=parts)
        self.upload_dir = upload_dir
        options.setdefault("api_key", KEY)
        self.app = create_app(self.engine, model_id="tiny", upload_dir=upload_dir, **options)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn_config(self.app, limits, log_level="warning", timeout_graceful_shutdown=1)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        wait_until(lambda: self.server.started, 30)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()
        self.engine.close()

    def uploads(self) -> list[str]:
        return sorted(p.name for p in self.upload_dir.iterdir())

    def post(self, data: bytes, filename: str = "a.wav", headers: dict | None = None, **fields):
        payload, ctype = multipart({"model": "m", **fields}, data, filename)
        return httpx.post(
            f"{self.url}/v1/audio/transcriptions",
            content=payload,
            headers={"Authorization": f"Bearer {KEY}", "Content-Type": ctype, **(headers or {})},
            timeout=60,
        )


@pytest.fixture(scope="module")
def model(checkpoints):
    return mlx_qwen3asr.load(checkpoints("tiny"))


@pytest.fixture
def short_budgets(monkeypatch):
    """Random weights never stop: no loop check, and the engine's parts give a small budget per segment."""
    monkeypatch.setattr("mlx_qwen3asr.model.batch.LOOP_CHECK_EVERY", 10**9)
    return Parts(budget=lambda seconds: 4 + int(seconds))


@pytest.fixture
def serve(model, tmp_path, short_budgets):
    """serve(limits=ConnectionLimits(...), **create_app options) -> a running Served; stopped after."""
    started: list[Served] = []

    def start(limits: ConnectionLimits | None = None, **options) -> Served:
        folder = tmp_path / f"uploads-{len(started)}"
        folder.mkdir()
        s = Served(model, folder, limits or ConnectionLimits(), short_budgets, **options)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


def wait_until(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def multipart(fields: dict[str, str], data: bytes, filename: str = "a.wav") -> tuple[bytes, str]:
    parts = [
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
        for k, v in fields.items()
    ]
    parts.append(
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n".encode()
        + data
        + b"\r\n"
    )
    return b"".join(parts) + f"--{BOUNDARY}--\r\n".encode(), f"multipart/form-data; boundary={BOUNDARY}"


def wav_bytes(seconds: float, seed: int = 0) -> bytes:
    path = Path(tempfile.mkstemp(suffix=".wav")[1])
    try:
        sf.write(path, test_signal(seconds, seed=seed), 16000)
        return path.read_bytes()
    finally:
        path.unlink()


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes the connection within `seconds` (anything it sends first is read)."""
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def trickle(sock: socket.socket, data: bytes, size: int, every: float = 0.1) -> threading.Event:
    """Sends `data`, `size` bytes every `every` seconds, from a thread, until it is all sent, the
    connection fails, or the returned event is set."""
    stop = threading.Event()

    def run() -> None:
        for i in range(0, len(data), size):
            if stop.is_set():
                return
            try:
                sock.sendall(data[i : i + size])
            except OSError:
                return
            time.sleep(every)

    threading.Thread(target=run, daemon=True).start()
    return stop


def error_of(status_body: bytes | str) -> dict:
    body = json.loads(status_body)
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    message = body["error"]["message"]
    assert message and "\n" not in message and KEY not in message
    return body["error"]


def head(
    server: Served, method: str = "POST", path: str = "/v1/audio/transcriptions", extra: str = ""
) -> bytes:
    return (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
        f"Authorization: Bearer {KEY}\r\n{extra}\r\n"
    ).encode()


# --- connections: deadlines and a bound -----------------------------------------------------------


def test_idle_and_slow_connections_are_closed_and_leave_no_file(serve):
    server = serve(ConnectionLimits(header_timeout=0.5, body_timeout=0.5, body_min_rate=2000))

    # Nothing sent at all: closed, as an idle keep-alive connection is.
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        began = time.monotonic()
        assert closed_within(sock, 5)
        assert time.monotonic() - began < 3

    # Headers trickled in a byte at a time: the deadline counts from the connection, not the last byte.
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        began = time.monotonic()
        stop = trickle(sock, b"GET /health HTTP/1.1\r\nX-Padding: " + b"a" * 200, size=1)
        status, _, body = read_response(sock, 5.0)
        stop.set()
        assert status == 408 and error_of(body)["code"] == "request_timeout"
        assert time.monotonic() - began < 3
        assert closed_within(sock, 3)

    # A Content-Length longer than the body: the request is dropped, its partial file removed.
    payload, ctype = multipart({"model": "m"}, wav_bytes(3.0))
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(
            head(server, extra=f"Content-Type: {ctype}\r\nContent-Length: {len(payload) + 5000}\r\n")
        )
        sock.sendall(payload)
        began = time.monotonic()
        status, headers, body = read_response(sock, 5.0)
        assert status == 408 and headers["connection"] == "close"
        err = error_of(body)
        assert err["code"] == "request_timeout" and "stopped arriving" in err["message"]
        assert time.monotonic() - began < 3
        assert closed_within(sock, 3)
    wait_until(lambda: server.uploads() == [], 5)

    # A body that keeps coming, but at 100 bytes a second: cut off too.
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(head(server, extra=f"Content-Type: {ctype}\r\nContent-Length: {len(payload)}\r\n"))
        began = time.monotonic()
        stop = trickle(sock, payload, size=10)
        status, _, body = read_response(sock, 5.0)
        stop.set()
        assert status == 408 and error_of(body)["code"] == "request_timeout"
        assert time.monotonic() - began < 3
        assert closed_within(sock, 3)
    wait_until(lambda: server.uploads() == [], 5)

    # A client that sends at an ordinary pace is served as before.
    ok = server.post(wav_bytes(1.0))
    assert ok.status_code == 200 and "text" in ok.json()
    assert server.uploads() == []


def test_connections_past_the_limit_get_503(serve):
    server = serve(ConnectionLimits(header_timeout=30, max_connections=3))
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(3)]
    try:
        wait_until(lambda: len(server.server.server_state.connections) == 3)
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(head(server, "GET", "/health"))
            status, headers, body = read_response(sock, 5.0)
            assert status == 503 and headers["connection"] == "close" and headers["retry-after"] == "1"
            err = error_of(body)
            assert err["code"] == "too_many_connections" and "3" in err["message"]
            assert closed_within(sock, 3)
    finally:
        for sock in idle:
            sock.close()
    wait_until(
        lambda: (
            httpx.get(f"{server.url}/health", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        ),
        5,
    )


# --- uploads cut short, a full disk ---------------------------------------------------------------


def test_a_truncated_multipart_upload_is_400(serve):
    server = serve()
    payload, ctype = multipart({"model": "m"}, wav_bytes(2.0))
    closing = f"\r\n--{BOUNDARY}--\r\n".encode()
    for cut in (payload[: -len(closing)], payload[: len(payload) // 2]):  # no closing boundary; file cut
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(head(server, extra=f"Content-Type: {ctype}\r\nContent-Length: {len(cut)}\r\n") + cut)
            status, _, body = read_response(sock, 60)
        assert status == 400
        err = error_of(body)
        assert err["code"] == "incomplete_upload" and "cut short" in err["message"]
    assert server.uploads() == []
    assert server.post(wav_bytes(1.0)).status_code == 200  # the whole form is served


def test_a_full_disk_is_507_and_names_no_server_path(serve, monkeypatch):
    server = serve()

    def full(path, data, created):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(server.app.state.server, "write_upload", full)
    r = server.post(wav_bytes(1.0))
    assert r.status_code == 507
    err = error_of(r.text)
    assert err["code"] == "insufficient_storage" and "disk is full" in err["message"]
    for secret in (str(server.upload_dir), "upload-", tempfile.gettempdir()):
        assert secret not in r.text
    assert server.uploads() == []
    monkeypatch.undo()

    # The decoded audio finding no room either (long audio is spilled to the temporary folder).
    def no_room(path, max_seconds=None):
        raise AudioError(path, f"no room for the decoded audio in {tempfile.gettempdir()} (No space left)")

    monkeypatch.setattr(server.app.state.server, "read_audio", no_room)
    r = server.post(wav_bytes(1.0))
    assert r.status_code == 507 and error_of(r.text)["code"] == "insufficient_storage"
    for secret in (str(server.upload_dir), "upload-", tempfile.gettempdir()):
        assert secret not in r.text
    wait_until(lambda: server.uploads() == [], 5)


# --- audio counted as decoded ---------------------------------------------------------------------


def opus_webm(tmp_path: Path, seconds: float) -> bytes:
    """`seconds` of audio as Opus in WebM at 6 kb/s: far fewer bytes than its duration suggests, and a
    container the header probe cannot read (the duration is then guessed from the size)."""
    wav = tmp_path / "src.wav"
    sf.write(wav, test_signal(seconds, seed=3), 16000)
    out = tmp_path / f"clip-{seconds:g}.webm"
    subprocess.run(
        [
            shutil.which("ffmpeg"),
            "-v",
            "error",
            "-y",
            "-i",
            str(wav),
            "-c:a",
            "libopus",
            "-b:a",
            "6k",
            str(out),
        ],
        check=True,
        timeout=60,
    )
    return out.read_bytes()


def test_audio_is_counted_by_its_decoded_duration(serve, tmp_path, monkeypatch):
    server = serve(max_audio_seconds=30)
    submitted = []
    real = server.engine.submit
    monkeypatch.setattr(server.engine, "submit", lambda *a, **k: submitted.append(k) or real(*a, **k))

    long = opus_webm(tmp_path, 60.0)
    assert len(long) / 16_000 < 30  # what its size would have said
    r = server.post(long, filename="long.webm")
    assert r.status_code == 413
    err = error_of(r.text)
    assert err["code"] == "audio_too_long" and err["param"] == "file"
    assert "longer than 30 s" in err["message"]
    assert submitted == [] and server.engine.queued_seconds() == 0

    short = opus_webm(tmp_path, 20.0)
    r = server.post(short, filename="short.webm")
    assert r.status_code == 200
    assert submitted[0]["seconds"] == pytest.approx(20.0, abs=0.1)  # queued as what it decodes to

    # The finding: 32 KB of WAV stating 1 Hz (9 hours at that rate). Refused in one line, and the
    # queue of the others is never filled.
    path = tmp_path / "one-hertz.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(1)
        w.setframerate(1)
        w.writeframes(np.full(32_000, 128, np.uint8).tobytes())
    r = server.post(path.read_bytes(), filename="one-hertz.wav")
    assert 400 <= r.status_code < 500 and error_of(r.text)["param"] == "file"
    assert server.engine.queued_seconds() == 0
    assert server.post(wav_bytes(1.0)).status_code == 200


# --- Host and Origin ------------------------------------------------------------------------------


def ask(server: Served, host: str, *, origin: str | None = None, method="GET", path="/health", extra=""):
    lines = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {KEY}\r\n{extra}"
    if origin is not None:
        lines += f"Origin: {origin}\r\n"
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall((lines + "\r\n").encode())
        return read_response(sock, 5.0)


def test_host_and_origin_are_checked(serve):
    server = serve(allowed_hosts=["asr.internal"], cors_origins=["https://app.example"])
    port = server.port

    status, _, body = ask(server, "evil.example")  # a DNS-rebinding page names its own host
    assert status == 421 and error_of(body)["code"] == "host_not_allowed"
    assert ask(server, f"evil.example:{port}")[0] == 421
    for host in (
        f"127.0.0.1:{port}",
        f"localhost:{port}",
        f"[::1]:{port}",
        "asr.internal",
        f"ASR.internal:{port}",
    ):
        assert ask(server, host)[0] == 200, host

    # A page on another origin: refused, whether a simple form POST or a GET.
    for method, path in (("GET", "/health"), ("POST", "/v1/audio/transcriptions")):
        status, headers, body = ask(
            server, f"127.0.0.1:{port}", origin="http://evil.example", method=method, path=path
        )
        assert status == 403 and error_of(body)["code"] == "origin_not_allowed"
        assert "access-control-allow-origin" not in headers
    payload, ctype = multipart({"model": "m"}, wav_bytes(1.0))
    r = httpx.post(
        f"{server.url}/v1/audio/transcriptions",
        content=payload,
        headers={"Content-Type": ctype, "Authorization": f"Bearer {KEY}", "Origin": "http://evil.example"},
    )
    assert r.status_code == 403 and server.uploads() == []

    # The server's own origin, and the allowed one (with its CORS headers and preflight).
    assert ask(server, f"127.0.0.1:{port}", origin=f"http://127.0.0.1:{port}")[0] == 200
    status, headers, _ = ask(server, f"127.0.0.1:{port}", origin="https://app.example")
    assert status == 200 and headers["access-control-allow-origin"] == "https://app.example"
    assert "Origin" in headers["vary"]
    preflight = "Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: authorization\r\n"
    status, headers, _ = ask(
        server,
        f"127.0.0.1:{port}",
        origin="https://app.example",
        method="OPTIONS",
        path="/v1/audio/transcriptions",
        extra=preflight,
    )
    assert status == 204 and headers["access-control-allow-origin"] == "https://app.example"
    assert "POST" in headers["access-control-allow-methods"]
    assert "authorization" in headers["access-control-allow-headers"].lower()
    status, _, body = ask(
        server,
        f"127.0.0.1:{port}",
        origin="http://evil.example",
        method="OPTIONS",
        path="/v1/audio/transcriptions",
        extra=preflight,
    )
    assert status == 403
    r = httpx.post(
        f"{server.url}/v1/audio/transcriptions",
        content=payload,
        headers={"Content-Type": ctype, "Authorization": f"Bearer {KEY}", "Origin": "https://app.example"},
        timeout=60,
    )
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example"


def test_bound_to_every_interface_any_address_but_no_foreign_name_is_served(serve):
    server = serve(host="0.0.0.0")
    assert ask(server, f"192.168.1.20:{server.port}")[0] == 200
    assert ask(server, f"[fe80::1]:{server.port}")[0] == 200
    assert ask(server, f"{socket.gethostname()}:{server.port}")[0] == 200
    assert ask(server, f"localhost:{server.port}")[0] == 200
    assert ask(server, f"evil.example:{server.port}")[0] == 421
    assert ask(server, "192.168.1.20.evil.example")[0] == 421
    anything = serve(allowed_hosts=["*"])
    assert ask(anything, "whatever.example")[0] == 200


# --- the API key ----------------------------------------------------------------------------------


def test_an_empty_api_key_is_a_usage_error(capsys, monkeypatch, tmp_path):
    from mlx_qwen3asr.cli.serve import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    args = ["--model", str(tmp_path / "missing"), "--no-aligner", "--port", "0"]
    for env, flag, named in ((KEY, "", "--api-key"), (None, "", "--api-key"), ("", None, "$MLXASR_API_KEY")):
        if env is None:
            monkeypatch.delenv("MLXASR_API_KEY", raising=False)
        else:
            monkeypatch.setenv("MLXASR_API_KEY", env)
        assert main(args + (["--api-key", flag] if flag is not None else [])) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"mlxasr serve: error: {named}") and "empty" in err[0]
    with pytest.raises(ValueError, match="empty"):
        create_app(None, model_id="m", api_key="")
