"""Throughput and latency of `mlxasr serve` under concurrent clients, against the same requests sent
one at a time; optionally moona3k's mlx-qwen3-asr server on the same checkpoint and audio.

    python tools/server_bench.py --model checkpoints/random-0.6b --clients 1 4 16 64 --seconds 20
    python tools/server_bench.py --model DIR --peer-python peers-venv/bin/python --json server.json

For N clients, N synthetic speech-like files of `seconds` each are posted at once (one thread per
client, response_format=json) to a server running in a subprocess; we report audio seconds per wall
second, and the median and 95th percentile latency. The sequential baseline sends the same files
one after another to the same server (its figures for N clients are those of the first N files).
Random weights rarely emit EOS, so in the server process EOS and the loop stop are off and every
segment decodes exactly `tokens_per_second` new tokens per second of its audio (4 by default, as
tools/bench.py), so the work per request is fixed whatever is decoded.

With --peer-python, moona3k's server (`mlx-qwen3-asr serve`, FastAPI; its /v1/audio/transcriptions)
runs in that environment with the same budget per chunk (tools/peers.py's patches: EOS and its
repetition stop off), float32 weights, the same CPU settings (OpenBLAS, malloc), its rate limit and
queue depth raised so that no request is refused. It needs fastapi, uvicorn and python-multipart
there (the package's `serve` extra); without them the report says so.

`run(model_path, ...)` returns the report as a dict; the command prints a table (and writes JSON).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import wave
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
TOOLS = REPO_ROOT / "tools"
KEY = "server-bench"
SAMPLE_RATE = 16000
START_TIMEOUT = 600.0  # seconds for a server to load its model and answer /health


# --- audio ----------------------------------------------------------------------------------------


def synthetic_speech(seconds: float, seed: int):
    """Voiced syllables at about 4 a second with pauses between phrases (quiet gaps to cut at)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    pitch = 110 + 30 * np.sin(2 * np.pi * 0.25 * t + seed)
    phase = 2 * np.pi * np.cumsum(pitch) / SAMPLE_RATE
    voiced = sum(np.sin(k * phase) / k for k in range(1, 7))
    syllables = np.clip(1.4 * np.sin(2 * np.pi * 3.7 * t + rng.uniform(0, 6)), 0, 1)
    phrases = (np.sin(2 * np.pi * 0.15 * t + seed) > -0.7).astype(np.float64)
    wav = 0.25 * syllables * phrases * (0.85 * voiced + 0.15 * rng.standard_normal(t.size))
    return (np.clip(wav, -1, 1) * 32767).astype("<i2")


def write_files(folder: Path, count: int, seconds: float) -> list[Path]:
    paths = []
    for i in range(count):
        path = folder / f"request-{i:03d}.wav"
        with wave.open(str(path), "wb") as f:
            f.setnchannels(1)
            f.setsampwidth(2)
            f.setframerate(SAMPLE_RATE)
            f.writeframes(synthetic_speech(seconds, seed=i).tobytes())
        paths.append(path)
    return paths


# --- the servers (each in a process of its own) -----------------------------------------------------


def serve_ours(args: argparse.Namespace) -> int:
    """Serve as `mlxasr serve` does with its defaults (no aligner, limits raised so that no request is
    refused), its engine given parts with which every segment decodes exactly its budget: EOS off, loops
    not stopped, tokens_per_second tokens per second of audio."""
    sys.path.insert(0, str(REPO_ROOT))
    import mlx_qwen3asr  # (first: it loads OpenBLAS before MLX)
    from mlx_qwen3asr.model import batch as decoding
    from mlx_qwen3asr.pipeline.engine import Engine
    from mlx_qwen3asr.pipeline.parts import Parts
    from mlx_qwen3asr.serve.app import create_app, uvicorn_config

    rate = args.tokens_per_second
    real = Parts()

    class WithoutEOS(real.batch):
        def __init__(self, net, eos_ids, **kwargs):
            super().__init__(net, frozenset(), **kwargs)

    parts = Parts(batch=WithoutEOS, budget=lambda seconds: max(1, round(rate * seconds)))
    if not hasattr(decoding, "LOOP_CHECK_EVERY"):
        raise RuntimeError("mlx_qwen3asr.model.batch.LOOP_CHECK_EVERY is gone: the loop stop stays on")
    decoding.LOOP_CHECK_EVERY = 1 << 30

    import uvicorn

    model = mlx_qwen3asr.load(args.model, dtype=args.dtype)
    engine = Engine(model, batch_size=args.batch_size, parts=parts)
    app = create_app(
        engine,
        model_id=Path(args.model).name,
        api_key=KEY,
        max_upload_bytes=1000 * 1024 * 1024,
        max_queue_seconds=10_000_000,
        words_unavailable="the benchmark serves without an aligner",
    )
    print(f"listening on http://127.0.0.1:{args.port}", file=sys.stderr, flush=True)
    config = uvicorn_config(app, host="127.0.0.1", port=args.port, log_level="warning")
    uvicorn.Server(config).run()
    sys.stdout.flush()
    sys.stderr.flush()
    # As the command leaves: at once, the engine's thread as it is (MLX may abort a process whose threads
    # that used it end during its exit).
    os._exit(0)


def serve_moona3k(args: argparse.Namespace) -> int:
    """Run moona3k's server (with the peer's python) under tools/peers.py's fixed-work patches."""
    sys.path.insert(0, str(TOOLS))
    import peers  # CPU settings as for every peer run, then mlx

    notes: list[str] = []
    peers.STATE.stages = False
    peers.STATE.new_tokens, peers.STATE.tokens_per_second = None, args.tokens_per_second
    peers._patch_moona3k(notes)
    load_dir, _ = peers._moona3k_model_dir(Path(args.model), notes)

    import mlx.core as mx
    import mlx_qwen3_asr.session as session
    from mlx.utils import tree_flatten
    from mlx_qwen3_asr.load_models import _cast_tree_dtype, _model_uses_tied_lm_head
    from mlx_qwen3_asr.server import ServerConfig, run_server

    real_load = session.load_model

    def load_model(path, dtype=mx.float32):
        # Its loader keeps the checkpoint's bfloat16 weights under float32; cast them as tools/peers.py does.
        model, config = real_load(path, dtype=dtype)
        model.load_weights(list(tree_flatten(_cast_tree_dtype(model.parameters(), mx.float32))))
        if _model_uses_tied_lm_head(config):
            model.lm_head.weight = model.model.embed_tokens.weight
        mx.eval(model.parameters())
        return model, config

    session.load_model = load_model
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    config = ServerConfig(
        host="127.0.0.1",
        port=args.port,
        api_keys=[KEY],
        model=str(load_dir),
        dtype="float32",
        rate_limit=1_000_000,
        max_file_size_mb=1000,
        max_queue_depth=1_000_000,
    )
    run_server(config)
    return 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """A server started with `python tools/server_bench.py --serve-SYSTEM ...`; its log goes to a file."""

    def __init__(
        self, python: str, system: str, model: Path, tokens_per_second: float, options: list[str], log: Path
    ):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        command = [python, str(Path(__file__).resolve()), f"--serve-{system}", "--model", str(model)]
        command += ["--port", str(self.port), "--tokens-per-second", f"{tokens_per_second:g}", *options]
        self.log = open(log, "w")  # noqa: SIM115 - closed in stop()
        started = time.perf_counter()
        self.proc = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
        self._wait_ready()
        self.start_s = time.perf_counter() - started

    def _wait_ready(self) -> None:
        import httpx

        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with status {self.proc.returncode}: {self.tail()}")
            try:
                if httpx.get(f"{self.url}/health", headers=_auth(), timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the server did not answer within {START_TIMEOUT:g} s: {self.tail()}")

    def tail(self, lines: int = 5) -> str:
        self.log.flush()
        text = self.log_path.read_text(errors="replace").strip().splitlines()
        return " | ".join(text[-lines:])

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def _auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


# --- clients --------------------------------------------------------------------------------------


def _post(url: str, path: Path, data: bytes) -> tuple[float, float, int, str]:
    """(start, end, status, text) of one transcription request."""
    import httpx

    start = time.perf_counter()
    r = httpx.post(
        f"{url}/v1/audio/transcriptions",
        files={"file": (path.name, data, "audio/wav")},
        data={"model": "bench", "response_format": "json"},
        headers=_auth(),
        timeout=None,
    )
    end = time.perf_counter()
    text = r.json().get("text", "") if r.status_code == 200 else r.text[:200]
    return start, end, r.status_code, text


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _figures(clients: int, seconds: float, marks: list[tuple[float, float, int, str]]) -> dict:
    latencies = [end - start for start, end, _, _ in marks]
    wall = max(end for _, end, _, _ in marks) - min(start for start, _, _, _ in marks)
    ok = sum(status == 200 for _, _, status, _ in marks)
    return {
        "clients": clients,
        "requests": len(marks),
        "failed": len(marks) - ok,
        "audio_s": seconds * ok,
        "wall_s": round(wall, 3),
        "audio_seconds_per_s": round(seconds * ok / wall, 3) if wall > 0 else None,
        "p50_s": round(statistics.median(latencies), 3),
        "p95_s": round(_percentile(latencies, 0.95), 3),
    }


def concurrent(url: str, paths: list[Path], blobs: list[bytes]) -> list[tuple[float, float, int, str]]:
    """Every file posted at once, one client thread each."""
    marks: list = [None] * len(paths)
    barrier = threading.Barrier(len(paths))

    def client(i: int) -> None:
        barrier.wait()
        try:
            marks[i] = _post(url, paths[i], blobs[i])
        except Exception as e:  # counted as failed
            now = time.perf_counter()
            marks[i] = (now, now, 0, f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(paths))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return marks


def measure(url: str, paths: list[Path], blobs: list[bytes], clients: Sequence[int], seconds: float) -> dict:
    """Concurrent rounds for each N, then the same files one at a time."""
    _post(url, paths[0], blobs[0])  # warm-up: first-call costs are not the server's steady state
    rounds = {}
    texts: dict[int, str] = {}
    for n in clients:
        marks = concurrent(url, paths[:n], blobs[:n])
        rounds[n] = _figures(n, seconds, marks)
        for i, (_, _, status, text) in enumerate(marks):
            if status == 200:
                texts.setdefault(i, text)
        print(f"  {n} clients at once: {rounds[n]}", file=sys.stderr)
    alone = [_post(url, p, b) for p, b in zip(paths[: max(clients)], blobs)]
    sequential = {n: _figures(n, seconds, alone[:n]) for n in clients}
    print(f"  one at a time: {sequential[max(clients)]}", file=sys.stderr)
    same = all(texts[i] == alone[i][3] for i in texts if alone[i][2] == 200)
    return {"concurrent": rounds, "sequential": sequential, "texts_match_sequential": same}


# --- the report -----------------------------------------------------------------------------------


def _peer_missing(python: str) -> str | None:
    probe = "import fastapi, uvicorn, multipart, mlx_qwen3_asr.server"
    done = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    if done.returncode == 0:
        return None
    last = (done.stderr.strip().splitlines() or ["unknown error"])[-1]
    return (
        f"its server cannot start in {python} ({last}); install its serve extra there: "
        "pip install fastapi uvicorn python-multipart"
    )


def _version(python: str, package: str) -> str | None:
    code = f"from importlib.metadata import version; print(version({package!r}))"
    done = subprocess.run([python, "-c", code], capture_output=True, text=True)
    return done.stdout.strip() or None if done.returncode == 0 else None


def run(
    model_path: str | os.PathLike[str],
    clients: Sequence[int] = (1, 4, 16, 64),
    seconds: float = 20.0,
    *,
    tokens_per_second: float = 4.0,
    batch_size: int | None = None,
    dtype: str | None = None,
    peer_python: str | None = None,
    peer_clients: Sequence[int] | None = None,
    workdir: str | os.PathLike[str] | None = None,
) -> dict:
    """Serve `model_path` and measure N concurrent clients against the same requests one at a time.

    Returns {"model", "seconds", "budget", "clients", "systems": {name: {"concurrent": {N: figures},
    "sequential": {N: figures}, "texts_match_sequential", "start_s"} or {"error": why}}, "markdown"}.
    Figures: clients, requests, failed, audio_s, wall_s, audio_seconds_per_s, p50_s, p95_s.
    peer_clients: the rounds for the peer (default: the same as ours; it serves one request at a time,
    so large rounds take long).
    """
    clients = sorted({int(n) for n in clients})
    model = Path(model_path).resolve()
    own = workdir is None
    folder = Path(tempfile.mkdtemp(prefix="server-bench-") if own else workdir)
    folder.mkdir(parents=True, exist_ok=True)
    paths = write_files(folder, max(clients), seconds)
    blobs = [p.read_bytes() for p in paths]
    report: dict = {
        "model": str(model),
        "seconds": seconds,
        "budget": f"{tokens_per_second:g} new tokens per second of audio (EOS and loop stops off)",
        "clients": clients,
        "batch_size": batch_size,
        "systems": {},
    }
    options = (["--batch-size", str(batch_size)] if batch_size else []) + (
        ["--dtype", dtype] if dtype else []
    )
    systems = [("mlx_qwen3asr", sys.executable, "ours", options, clients)]
    if peer_python:
        rounds = sorted({int(n) for n in peer_clients or clients} & set(clients))
        systems.append(("moona3k", peer_python, "moona3k", [], rounds))
    for name, python, system, extra, rounds in systems:
        print(f"{name}: starting its server", file=sys.stderr)
        if system == "moona3k":
            missing = _peer_missing(python)
            if missing is not None:
                report["systems"][name] = {"error": missing}
                print(f"{name}: {missing}", file=sys.stderr)
                continue
        try:
            server = ServerProcess(python, system, model, tokens_per_second, extra, folder / f"{system}.log")
        except Exception as e:
            report["systems"][name] = {"error": " ".join(str(e).split())}
            continue
        try:
            figures = measure(server.url, paths, blobs, rounds, seconds)
            figures["start_s"] = round(server.start_s, 2)
            if system == "moona3k":
                figures["version"] = _version(python, "mlx-qwen3-asr")
            report["systems"][name] = figures
        except Exception as e:
            report["systems"][name] = {"error": f"{type(e).__name__}: {' '.join(str(e).split())}"}
        finally:
            server.stop()
    report["markdown"] = markdown(report)
    if own:
        for p in folder.iterdir():
            p.unlink()
        folder.rmdir()
    return report


def markdown(report: dict) -> str:
    lines = [
        f"model: {report['model']}; {report['seconds']:g} s per request; {report['budget']}",
        "",
        "| system | clients | at once: audio s/s | p50 s | p95 s | one at a time: audio s/s | p50 s | p95 s | "
        "throughput gain |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, figures in report["systems"].items():
        if "error" in figures:
            lines.append(f"| {name} | could not run: {figures['error']} | | | | | | | |")
            continue
        for n in figures["concurrent"]:
            c, s = figures["concurrent"][n], figures["sequential"][n]
            gain = (
                c["audio_seconds_per_s"] / s["audio_seconds_per_s"] if s["audio_seconds_per_s"] else math.nan
            )
            failed = f" ({c['failed']} failed)" if c["failed"] else ""
            lines.append(
                f"| {name} | {n}{failed} | {c['audio_seconds_per_s']:.2f} | {c['p50_s']:.2f} | {c['p95_s']:.2f} "
                f"| {s['audio_seconds_per_s']:.2f} | {s['p50_s']:.2f} | {s['p95_s']:.2f} | {gain:.2f}x |"
            )
    ours, peer = report["systems"].get("mlx_qwen3asr", {}), report["systems"].get("moona3k", {})
    shared = [n for n in ours.get("concurrent", {}) if n in peer.get("concurrent", {})]
    if shared:
        lines += ["", "| clients at once | mlx_qwen3asr audio s/s | moona3k audio s/s | ours / theirs |"]
        lines.append("| --- | --- | --- | --- |")
        for n in shared:
            a, b = ours["concurrent"][n]["audio_seconds_per_s"], peer["concurrent"][n]["audio_seconds_per_s"]
            lines.append(f"| {n} | {a:.2f} | {b:.2f} | {a / b:.2f}x |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="checkpoint directory")
    ap.add_argument(
        "--clients", type=int, nargs="+", default=[1, 4, 16, 64], help="concurrent clients per round"
    )
    ap.add_argument("--seconds", type=float, default=20.0, help="audio per request")
    ap.add_argument("--tokens-per-second", type=float, default=4.0, help="new tokens per second of audio")
    ap.add_argument("--batch-size", type=int, default=None, help="the server's --batch-size")
    ap.add_argument("--dtype", default=None, help="the server's --dtype")
    ap.add_argument("--peer-python", default=None, help="python of an environment with mlx-qwen3-asr")
    ap.add_argument(
        "--peer-clients", type=int, nargs="+", default=None, help="the peer's rounds (default: all)"
    )
    ap.add_argument("--json", default=None, help="write the report here")
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--serve-ours", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--serve-moona3k", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve_ours:
        return serve_ours(args)
    if args.serve_moona3k:
        return serve_moona3k(args)
    report = run(
        args.model,
        args.clients,
        args.seconds,
        tokens_per_second=args.tokens_per_second,
        batch_size=args.batch_size,
        dtype=args.dtype,
        peer_python=args.peer_python,
        peer_clients=args.peer_clients,
    )
    print(report["markdown"])
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
