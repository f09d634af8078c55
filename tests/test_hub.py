"""Repo ids: a complete cached copy is used without the network; a hub that sends nothing fails in one line."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPO = "acme/tiny-asr"


# The read timeout the tests give the fetch ($MLXASR_HUB_TIMEOUT), and what a fetch may take beyond it
# on a loaded machine (starting the fetching process, importing huggingface_hub).
TIMEOUT = 1
SLACK = 10
HEADERS = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 4096\r\n\r\n"
# A repository lookup answered "no such repository", one byte at a time.
NOT_FOUND_BODY = b'{"error": "Repository not found"}'
NOT_FOUND = (
    b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nX-Error-Code: RepoNotFound\r\n"
    b"X-Error-Message: Repository not found\r\nContent-Length: %d\r\n\r\n" % len(NOT_FOUND_BODY)
)
# The trickle: each answer's body in TRICKLE_PIECES pieces, each after 0.6 of the timeout.
TRICKLE_PIECES = 3
TRICKLE_GAP = 0.6 * TIMEOUT
TRICKLE_SECONDS = TRICKLE_PIECES * TRICKLE_GAP


@pytest.fixture
def hub_server():
    """Loopback servers that play the hub: `start(answer)` serves every connection with `answer(conn,
    stop)` on a thread of its own and returns the endpoint. Connections stay open until the test ends."""
    stop = threading.Event()
    servers: list[socket.socket] = []
    held: list[socket.socket] = []
    threads: list[threading.Thread] = []

    def serve(server, answer):
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            held.append(conn)
            thread = threading.Thread(target=answer, args=(conn, stop), daemon=True)
            thread.start()
            threads.append(thread)

    def start(answer) -> str:
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        server.settimeout(0.2)
        servers.append(server)
        thread = threading.Thread(target=serve, args=(server, answer), daemon=True)
        thread.start()
        threads.append(thread)
        return f"http://127.0.0.1:{server.getsockname()[1]}"

    yield start
    stop.set()
    for thread in threads:
        thread.join(timeout=5)
    for sock in held + servers:
        sock.close()


def read_request(conn: socket.socket, stop: threading.Event) -> bytes | None:
    """A request's head; None when the client went away or the test ended first."""
    conn.settimeout(0.2)
    data = b""
    while b"\r\n\r\n" not in data:
        if stop.is_set():
            return None
        try:
            chunk = conn.recv(4096)
        except TimeoutError:
            continue
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
    return data


def never_answers(conn: socket.socket, stop: threading.Event) -> None:
    """Accepts the connection and sends nothing."""


def headers_then_stalls(conn: socket.socket, stop: threading.Event) -> None:
    """Answers with the status line, the headers and one byte of the body, then sends nothing."""
    if read_request(conn, stop):
        conn.sendall(HEADERS + b"{")


def trickles_not_found(conn: socket.socket, stop: threading.Event) -> None:
    """Answers every request "no such repository", the body in TRICKLE_PIECES pieces TRICKLE_GAP seconds
    apart."""
    size = -(-len(NOT_FOUND_BODY) // TRICKLE_PIECES)
    while read_request(conn, stop):
        conn.sendall(NOT_FOUND)
        for i in range(0, len(NOT_FOUND_BODY), size):
            if stop.wait(TRICKLE_GAP):
                return
            conn.sendall(NOT_FOUND_BODY[i : i + size])


def sha1(data: bytes) -> str:
    """The hub's id of a small file (git's blob hash)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def serves_repo(files: dict[str, bytes], stall: str | None = None):
    """A hub with one repository, answering as huggingface_hub expects: its file list from the API, each
    file's metadata and content from /resolve/. The file named `stall` sends half its content, then
    nothing."""

    def answer(conn: socket.socket, stop: threading.Event) -> None:
        while (head := read_request(conn, stop)) is not None:
            method, target = head.split(b" ", 2)[:2]
            path = target.decode().split("?")[0]
            name = path.rsplit("/", 1)[-1]
            if path.startswith(f"/api/models/{REPO}/tree/"):  # huggingface_hub 2.x lists the files
                tree = [{"type": "file", "path": n, "size": len(b), "oid": sha1(b)} for n, b in files.items()]
                body, extra = json.dumps(tree).encode(), ""
            elif path.startswith(f"/api/models/{REPO}"):
                siblings = [{"rfilename": n} for n in files]
                body = json.dumps({"id": REPO, "sha": COMMIT, "siblings": siblings}).encode()
                extra = ""
            elif path.startswith(f"/{REPO}/resolve/") and name in files:
                body = files[name]
                extra = f'X-Repo-Commit: {COMMIT}\r\nETag: "{sha1(body)}"\r\n'
            else:
                body, extra = b"{}", ""
            status = "200 OK" if body != b"{}" else "404 Not Found"
            conn.settimeout(30)  # a busy client reads the body late: only reading requests polls
            conn.sendall(
                f"HTTP/1.1 {status}\r\nContent-Type: application/octet-stream\r\n{extra}"
                f"Content-Length: {len(body)}\r\n\r\n".encode()
            )
            if method == b"HEAD":
                continue
            if name == stall:
                conn.sendall(body[: len(body) // 2])
                return
            conn.sendall(body)

    return answer


@pytest.fixture
def silent_hub(hub_server):
    """A server that accepts connections and never answers: the hub hanging."""
    return hub_server(never_answers)


def make_cache(root: Path, checkpoint: Path, repo: str = "acme/tiny-asr", drop: str | None = None) -> Path:
    folder = root / ("models--" + repo.replace("/", "--"))
    snapshot = folder / "snapshots" / COMMIT
    shutil.copytree(checkpoint, snapshot)
    if drop:
        (snapshot / drop).unlink()
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(COMMIT)
    return snapshot


def run_load(
    repo: str, env: dict[str, str], timeout: float = 60
) -> tuple[subprocess.CompletedProcess, float]:
    """mlx_qwen3asr.load(repo) in a fresh process; its output and the seconds the call took."""
    code = (
        "import sys, time, mlx_qwen3asr\n"
        "start = time.monotonic()\n"
        "try:\n"
        f"    m = mlx_qwen3asr.load({repo!r})\n"
        "    print('LOADED', m.path)\n"
        "except mlx_qwen3asr.ModelLoadError as e:\n"
        "    print('ERROR', e); sys.exit(2)\n"
        "finally:\n"
        "    print(f'\\nSECONDS {time.monotonic() - start:.3f}', file=sys.stderr)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO_ROOT,
    )
    return proc, float(proc.stderr.rsplit("SECONDS ", 1)[-1])


def hub_env(cache: Path, endpoint: str, **extra: str) -> dict[str, str]:
    env = {"HF_HUB_CACHE": str(cache), "HF_ENDPOINT": endpoint, "HF_HUB_OFFLINE": "0"}
    env.update(extra)
    return env


SILENT = (
    "ERROR acme/not-cached: the Hugging Face hub did not answer within 1 s; check the network, "
    "set MLXASR_HUB_TIMEOUT to wait longer, or give a local checkpoint folder"
)


def test_huggingface_hub_version_is_reported(measurements):
    """The hub tests run against the huggingface_hub installed here (the test extra pins an old one; a
    plain install gets the newest): the version is printed at the end of the run."""
    import huggingface_hub

    version = huggingface_hub.__version__
    assert version.split(".")[0].isdigit()
    measurements.append(f"tests/test_hub.py ran against huggingface_hub {version}")


def test_complete_cached_copy_loads_without_the_network(tmp_path, checkpoints, silent_hub):
    snapshot = make_cache(tmp_path / "hub", checkpoints("tiny"))
    proc, seconds = run_load("acme/tiny-asr", hub_env(tmp_path / "hub", silent_hub))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == f"LOADED {snapshot}"
    assert seconds < 30  # the silent hub was never asked


@pytest.mark.parametrize("answer", [never_answers, headers_then_stalls], ids=["silent", "headers-then-stall"])
def test_silent_hub_times_out_with_one_line(tmp_path, hub_server, answer):
    """Whatever timeouts huggingface_hub sets on its own requests (none, on 2.x's repository lookup),
    a hub that sends nothing for MLXASR_HUB_TIMEOUT seconds fails the fetch in one line."""
    (tmp_path / "hub").mkdir()
    env = hub_env(tmp_path / "hub", hub_server(answer), MLXASR_HUB_TIMEOUT=str(TIMEOUT))
    proc, seconds = run_load("acme/not-cached", env, timeout=TIMEOUT + SLACK + 30)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [SILENT]
    assert TIMEOUT <= seconds < TIMEOUT + SLACK


def test_a_trickling_hub_is_not_cut_off(tmp_path, hub_server):
    """Bytes arriving, however slowly, are not silence: answers whose pieces come 0.6 of the timeout
    apart, each longer than the timeout, are read to their end."""
    (tmp_path / "hub").mkdir()
    env = hub_env(tmp_path / "hub", hub_server(trickles_not_found), MLXASR_HUB_TIMEOUT=str(TIMEOUT))
    proc, seconds = run_load("acme/not-cached", env, timeout=TRICKLE_SECONDS + SLACK + 30)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [
        "ERROR acme/not-cached: no such repository on the Hugging Face hub, or it needs a login "
        "(huggingface-cli login)"
    ]
    assert TRICKLE_SECONDS <= seconds < TRICKLE_SECONDS + SLACK


def test_unreachable_hub_fails_at_once_with_one_line(tmp_path):
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens: connections are refused
    (tmp_path / "hub").mkdir()
    env = hub_env(tmp_path / "hub", f"http://127.0.0.1:{port}", MLXASR_HUB_TIMEOUT="30")
    proc, seconds = run_load("acme/not-cached", env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [
        "ERROR acme/not-cached: cannot reach the Hugging Face hub and no complete copy is cached; "
        "check the network, or give a local checkpoint folder"
    ]
    assert seconds < SLACK  # well inside the 30 s timeout


def repo_files(checkpoint: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(checkpoint.iterdir())}


def test_reachable_hub_downloads_the_checkpoint(tmp_path, checkpoints, hub_server):
    files = repo_files(checkpoints("tiny"))
    (tmp_path / "hub").mkdir()
    # A hub that answers: a loaded machine's pauses (this process serves the files) must not read as a
    # stall; the stall tests use TIMEOUT.
    env = hub_env(tmp_path / "hub", hub_server(serves_repo(files)), MLXASR_HUB_TIMEOUT="60")
    proc, _ = run_load(REPO, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    snapshot = tmp_path / "hub" / f"models--{REPO.replace('/', '--')}" / "snapshots" / COMMIT
    assert proc.stdout.splitlines() == [f"LOADED {snapshot}"]
    assert {p.name: p.read_bytes() for p in snapshot.iterdir()} == files


def test_hub_stalling_in_a_download_times_out_with_one_line(tmp_path, checkpoints, hub_server):
    """Half the weights arrive, then nothing: the fetch fails a timeout after the last bytes, although
    huggingface_hub's download threads are still waiting on the socket."""
    files = repo_files(checkpoints("tiny"))
    (tmp_path / "hub").mkdir()
    endpoint = hub_server(serves_repo(files, stall="model.safetensors"))
    proc, seconds = run_load(REPO, hub_env(tmp_path / "hub", endpoint, MLXASR_HUB_TIMEOUT=str(TIMEOUT)))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [SILENT.replace("acme/not-cached", REPO)]
    assert TIMEOUT <= seconds < TIMEOUT + SLACK


def test_incomplete_cached_copy_is_not_used(tmp_path, checkpoints):
    make_cache(tmp_path / "hub", checkpoints("tiny"), drop="model.safetensors")
    proc, _ = run_load("acme/tiny-asr", {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2
    assert "acme/tiny-asr: not in the local Hugging Face cache, and HF_HUB_OFFLINE is set" in proc.stdout


def run_command(args: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=TIMEOUT + SLACK + 60,
        cwd=REPO_ROOT,
    )
    return proc, time.monotonic() - start


def test_cli_stops_on_a_silent_hub_before_writing(tmp_path, silent_hub):
    import soundfile as sf

    sf.write(tmp_path / "talk.wav", np.zeros(16000, dtype=np.float32), 16000)
    (tmp_path / "hub").mkdir()
    env = hub_env(tmp_path / "hub", silent_hub, MLXASR_HUB_TIMEOUT=str(TIMEOUT))
    args = ["mlx_qwen3asr.cli.main", str(tmp_path / "talk.wav"), "--model", "acme/absent"]
    proc, seconds = run_command(args, env)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("mlxasr: error:")]
    assert len(errors) == 1 and "did not answer within 1 s" in errors[0], proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hub", "talk.wav"]
    assert seconds < TIMEOUT + 2 * SLACK  # starting the command included


def test_convert_stops_on_a_silent_hub_before_writing(tmp_path, silent_hub):
    (tmp_path / "hub").mkdir()
    env = hub_env(tmp_path / "hub", silent_hub, MLXASR_HUB_TIMEOUT=str(TIMEOUT))
    args = ["mlx_qwen3asr.cli.convert", "acme/absent", "-o", str(tmp_path / "out"), "--bits", "4"]
    proc, seconds = run_command(args, env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        "mlxasr-convert: error: acme/absent: the Hugging Face hub did not answer within 1 s; check the "
        "network, set MLXASR_HUB_TIMEOUT to wait longer, or give a local checkpoint folder"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hub"]
    assert seconds < TIMEOUT + 2 * SLACK


def test_size_mismatch_is_summarised(tmp_path, checkpoints):
    import mlx_qwen3asr

    path = tmp_path / "mismatch"
    shutil.copytree(checkpoints("tiny"), path)
    config = json.loads((path / "config.json").read_text())
    # Feed-forward widths: config.json's own checks pass them, the weights' shapes do not.
    config["thinker_config"]["text_config"]["intermediate_size"] = 256
    config["thinker_config"]["audio_config"]["encoder_ffn_dim"] = 256
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(mlx_qwen3asr.ModelLoadError) as err:
        mlx_qwen3asr.load(path)
    message = str(err.value)
    assert len(message) < 1200 and "\n" not in message
    assert "weight shape(s) differ: " in message and " more" in message
    assert "config.json's sizes do not match these weights" in message


def closed_port() -> int:
    """A local port where nothing listens: connections to it are refused at once."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    return port


def run_without_defaults(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """`mlxasr ARGS` as a first run: no $MLXASR_MODEL nor $MLXASR_ALIGNER, nothing in the hub cache."""
    clean = {k: v for k, v in os.environ.items() if k not in ("MLXASR_MODEL", "MLXASR_ALIGNER")}
    return subprocess.run(
        [sys.executable, "-m", "mlx_qwen3asr.cli.main", *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=SLACK + 120,
        cwd=REPO_ROOT,
    )


def test_a_first_run_without_a_hub_says_how_to_give_a_local_model(tmp_path):
    import soundfile as sf

    sf.write(tmp_path / "talk.wav", np.zeros(16000, dtype=np.float32), 16000)
    (tmp_path / "hub").mkdir()
    env = hub_env(tmp_path / "hub", f"http://127.0.0.1:{closed_port()}")
    proc = run_without_defaults([str(tmp_path / "talk.wav"), "--srt"], env)
    assert proc.returncode == 2, proc.stderr
    assert [line for line in proc.stderr.splitlines() if "error" in line] == [
        "mlxasr: error: model Qwen/Qwen3-ASR-0.6B: cannot reach the Hugging Face hub and no complete copy is "
        "cached; check the network, or give a local checkpoint folder with --model PATH"
    ]
    # mlxasr align names its own option for the aligner.
    (tmp_path / "talk.txt").write_text("hello there", encoding="utf-8")
    proc = run_without_defaults(
        ["align", str(tmp_path / "talk.wav"), "--text", str(tmp_path / "talk.txt")], env
    )
    assert proc.returncode == 2, proc.stderr
    (line,) = [line for line in proc.stderr.splitlines() if "error" in line]
    assert line.endswith("or give a local checkpoint folder with --aligner PATH"), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hub", "talk.txt", "talk.wav"]


def test_with_only_a_local_model_the_default_aligner_out_of_reach_is_one_short_warning(tmp_path, checkpoints):
    import soundfile as sf

    sf.write(tmp_path / "talk.wav", np.zeros(16000, dtype=np.float32), 16000)
    (tmp_path / "hub").mkdir()
    env = hub_env(tmp_path / "hub", f"http://127.0.0.1:{closed_port()}")
    proc = run_without_defaults(
        [str(tmp_path / "talk.wav"), "--srt", "--model", str(checkpoints("tiny"))], env
    )
    assert proc.returncode == 0, proc.stderr
    (warning,) = [line for line in proc.stderr.splitlines() if "aligner" in line]
    assert warning == (
        "mlxasr: warning: default aligner not cached, hub unreachable: cue times estimated; "
        "use --aligner PATH or --no-word-timestamps"
    )
    assert len(warning) <= 128, len(warning)  # with the "mlxasr: " every message starts with
    assert (tmp_path / "talk.srt").is_file()
    # Words asked for without subtitles: the same line says the words are not timed.
    proc = run_without_defaults(
        [str(tmp_path / "talk.wav"), "--json", "--word-timestamps", "--model", str(checkpoints("tiny"))], env
    )
    assert proc.returncode == 0, proc.stderr
    (warning,) = [line for line in proc.stderr.splitlines() if "aligner" in line]
    assert warning == (
        "mlxasr: warning: default aligner not cached, hub unreachable: words not timed; "
        "use --aligner PATH or --no-word-timestamps"
    )
    assert len(warning) <= 128, len(warning)  # with the "mlxasr: " every message starts with
    assert (tmp_path / "talk.json").is_file()
