"""Jobs outlive the server: `mlxasr serve` killed with SIGKILL during a job, started again on the same
library, runs the job again from its kept audio to `done`; the database is whole and no transcript is
half-written. And `--no-library` keeps nothing."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import httpx
from test_server import wav_file

KEY = "restart-key-51c0"
HEADERS = {"Authorization": f"Bearer {KEY}"}


def start(checkpoints, tmp_path, *extra: str) -> tuple[subprocess.Popen, str, list[str]]:
    env = {k: v for k, v in os.environ.items() if k != "MLXASR_API_KEY"}
    env.update(HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"), MLXASR_API_KEY=KEY)
    command = [sys.executable, "-m", "mlx_qwen3asr.cli.main", "serve", "--model", str(checkpoints("tiny"))]
    proc = subprocess.Popen(
        [*command, "--port", "0", "--no-aligner", "--no-vad", *extra],
        cwd=tmp_path,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    deadline = time.monotonic() + 120
    for line in proc.stderr:
        lines.append(line)
        if line.startswith("listening on "):
            break
        assert time.monotonic() < deadline, lines
    found = re.match(r"listening on (http://\S+)", lines[-1])
    assert found, lines
    threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()
    return proc, found.group(1), lines


def job_state(url: str, job_id: str) -> dict:
    return httpx.get(f"{url}/v1/jobs/{job_id}", headers=HEADERS, timeout=30).json()


def test_a_job_killed_with_the_server_runs_again_after_a_restart(checkpoints, tmp_path):
    library = tmp_path / "library"
    wav = wav_file(tmp_path, 60.0, seed=3, name="lecture.wav")
    proc, url, lines = start(checkpoints, tmp_path, "--library", str(library))
    try:
        with open(wav, "rb") as f:
            r = httpx.post(
                f"{url}/v1/jobs",
                files={"file": ("lecture.wav", f)},
                data={"title": "Lecture"},
                headers=HEADERS,
            )
        assert r.status_code == 202, r.text
        job_id = r.json()["id"]
        deadline = time.monotonic() + 120
        while job_state(url, job_id)["status"] != "running":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.3)
        assert job_state(url, job_id)["status"] == "running"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)

    with sqlite3.connect(library / "library.sqlite3") as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert db.execute("SELECT status FROM jobs WHERE id = ?", (job_id,)).fetchone()[0] == "running"
        assert db.execute("SELECT count(*) FROM transcripts").fetchone()[0] == 0

    started = time.monotonic()
    proc, url, lines = start(checkpoints, tmp_path, "--library", str(library))
    try:
        deadline = time.monotonic() + 300
        while (job := job_state(url, job_id))["status"] not in ("done", "failed", "cancelled"):
            assert time.monotonic() < deadline, job
            time.sleep(0.1)
        took = time.monotonic() - started
        assert job["status"] == "done", (job, lines)
        doc = httpx.get(f"{url}/v1/transcripts/{job['transcript_id']}", headers=HEADERS, timeout=30).json()
        assert doc["title"] == "Lecture" and doc["duration"] == 60.0 and doc["segments"]
        assert doc["segments"][-1]["end"] > 50
        audio = httpx.get(f"{url}/v1/transcripts/{doc['id']}/audio", headers=HEADERS, timeout=30)
        assert audio.content == wav.read_bytes()
        print(f"after the restart, the 60 s job was done in {took:.1f} s (server start included)")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    assert not list((library / "jobs").iterdir())


def test_no_library_keeps_nothing_and_has_no_jobs(checkpoints, tmp_path):
    proc, url, _ = start(checkpoints, tmp_path, "--no-library")
    try:
        r = httpx.post(f"{url}/v1/jobs", files={"file": ("a.wav", b"RIFF")}, headers=HEADERS, timeout=30)
        assert r.status_code in (404, 405)
        assert httpx.get(f"{url}/v1/transcripts", headers=HEADERS, timeout=30).status_code == 404
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    assert not any(tmp_path.rglob("library.sqlite3"))


def test_a_second_server_on_the_same_library_is_refused_in_one_line(checkpoints, tmp_path):
    """Two servers would both run the library's unfinished jobs: the second one is refused before it
    loads anything, and starts once the first has gone."""
    library = tmp_path / "library"
    proc, url, _ = start(checkpoints, tmp_path, "--library", str(library))
    try:
        env = {k: v for k, v in os.environ.items() if k != "MLXASR_API_KEY"}
        env.update(HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
        second = subprocess.run(
            [sys.executable, "-m", "mlx_qwen3asr.cli.main", "serve", "--model", str(checkpoints("tiny"))]
            + ["--port", "0", "--no-aligner", "--library", str(library)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert second.returncode == 2
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and "in use by another server" in lines[0] and str(library) in lines[0]
        assert httpx.get(f"{url}/health", headers=HEADERS, timeout=30).status_code == 200
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    proc, url, _ = start(checkpoints, tmp_path, "--library", str(library))  # the lock went with the process
    proc.send_signal(signal.SIGINT)
    proc.wait(60)


def test_the_uploads_folder_of_a_killed_server_is_removed_by_the_next_one(checkpoints, tmp_path, monkeypatch):
    """A server killed with SIGKILL cannot remove its uploads folder, nor an upload it was receiving: the
    next server to start removes them, once nothing was added there for a minute; its own folder goes
    at shutdown."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    proc, _, _ = start(checkpoints, tmp_path, "--no-library")
    (left,) = temp.glob(f"mlxasr-uploads-{proc.pid}-*")
    (left / "upload-cut-off.wav").write_bytes(b"RIFF" + bytes(4096))
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    earlier = time.time() - 120
    for path in (left / "upload-cut-off.wav", left):
        os.utime(path, (earlier, earlier))
    proc, _, _ = start(checkpoints, tmp_path, "--no-library")
    try:
        assert not left.exists()
        (own,) = temp.glob(f"mlxasr-uploads-{proc.pid}-*")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    assert not own.exists()
