"""Repo ids: a complete cached copy is used without the network; a silent hub times out with one line."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def silent_hub():
    """A server that accepts connections and never answers: the hub hanging."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                held.append(conn)
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


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
    code = (
        "import sys, mlx_qwen3asr\n"
        "try:\n"
        f"    m = mlx_qwen3asr.load({repo!r})\n"
        "    print('LOADED', m.path)\n"
        "except mlx_qwen3asr.ModelLoadError as e:\n"
        "    print('ERROR', e); sys.exit(2)\n"
    )
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO_ROOT,
    )
    return proc, time.monotonic() - start


def hub_env(cache: Path, endpoint: str, **extra: str) -> dict[str, str]:
    env = {"HF_HUB_CACHE": str(cache), "HF_ENDPOINT": endpoint, "HF_HUB_OFFLINE": "0"}
    env.update(extra)
    return env


def test_complete_cached_copy_loads_without_the_network(tmp_path, checkpoints, silent_hub):
    snapshot = make_cache(tmp_path / "hub", checkpoints("tiny"))
    proc, seconds = run_load("acme/tiny-asr", hub_env(tmp_path / "hub", silent_hub))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == f"LOADED {snapshot}"
    assert seconds < 30  # the silent hub was never asked


def test_silent_hub_times_out_with_one_line(tmp_path, silent_hub):
    (tmp_path / "hub").mkdir()
    env = hub_env(tmp_path / "hub", silent_hub, MLXASR_HUB_TIMEOUT="1")
    proc, seconds = run_load("acme/not-cached", env)
    assert proc.returncode == 2
    assert proc.stdout.splitlines() == [
        "ERROR acme/not-cached: the Hugging Face hub did not answer within 1 s; check the network, "
        "set MLXASR_HUB_TIMEOUT to wait longer, or give a local checkpoint folder"
    ]
    assert seconds < 45


def test_incomplete_cached_copy_is_not_used(tmp_path, checkpoints):
    make_cache(tmp_path / "hub", checkpoints("tiny"), drop="model.safetensors")
    proc, _ = run_load("acme/tiny-asr", {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2
    assert "acme/tiny-asr: not in the local Hugging Face cache, and HF_HUB_OFFLINE is set" in proc.stdout


def test_cli_stops_on_a_silent_hub_before_writing(tmp_path, silent_hub):
    import soundfile as sf
    from reference import test_signal

    sf.write(tmp_path / "talk.wav", test_signal(1.0), 16000)
    (tmp_path / "hub").mkdir()
    env = {**os.environ, **hub_env(tmp_path / "hub", silent_hub, MLXASR_HUB_TIMEOUT="1")}
    cmd = [
        sys.executable,
        "-m",
        "mlx_qwen3asr.cli.main",
        str(tmp_path / "talk.wav"),
        "--model",
        "acme/absent",
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "did not answer within 1 s" in errors[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hub", "talk.wav"]


def test_size_mismatch_is_summarised(tmp_path, checkpoints):
    import mlx_qwen3asr

    path = tmp_path / "mismatch"
    shutil.copytree(checkpoints("tiny"), path)
    config = json.loads((path / "config.json").read_text())
    text = config["thinker_config"]["text_config"]
    text["hidden_size"], text["intermediate_size"] = 128, 256
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(mlx_qwen3asr.ModelLoadError) as err:
        mlx_qwen3asr.load(path)
    message = str(err.value)
    assert len(message) < 1200 and "\n" not in message
    assert "weight shape(s) differ: " in message and " more" in message
    assert "config.json's sizes do not match these weights" in message


def test_timeouts_reach_the_httpx_client_of_huggingface_hub_1_and_later(monkeypatch):
    """huggingface_hub >= 1.0 makes its requests with an httpx client (module `httpx2` from 2.0): the
    timeouts are set with that client's own Timeout class, whatever module it comes from."""
    import types

    from huggingface_hub.utils import _http as real_http

    from mlx_qwen3asr import hub

    class Timeout:  # stands in for httpx2.Timeout: hub must not import any httpx module by name
        def __init__(self, timeout, *, connect=None):
            self.read, self.connect = timeout, connect

    class Client:
        def __init__(self):
            self.timeout = Timeout(None)

    installed = []
    fake = types.ModuleType("huggingface_hub.utils._http")
    fake.default_client_factory = Client
    fake.set_client_factory = installed.append
    monkeypatch.setattr(sys.modules["huggingface_hub.utils"], "_http", fake)
    monkeypatch.setitem(sys.modules, "huggingface_hub.utils._http", fake)
    monkeypatch.setitem(sys.modules, "httpx", None)  # importing it would fail
    monkeypatch.setattr(hub, "_timeouts_installed", False)
    monkeypatch.setenv("MLXASR_HUB_TIMEOUT", "7")
    hub._install_timeouts()
    assert len(installed) == 1
    client = installed[0]()
    assert isinstance(client.timeout, Timeout)
    assert (client.timeout.read, client.timeout.connect) == (7.0, hub.CONNECT_TIMEOUT)
    assert real_http is not fake
