"""Compute per audio second of one live stream through the realtime WebSocket against `mlxasr live --input`.

    python tools/live_socket_bench.py --model checkpoints/random-0.6b --seconds 300 --json live.json

The same speech-like stream (tools/bench.speechlike, written as 16-bit PCM so that both read the same
samples) goes through both front ends of live transcription, in this process, one after the other:

* terminal: ``mlxasr live --input FILE --no-vad --language English -q`` (the command's main());
* socket: ``mlx_qwen3asr.serve`` on an Engine (speech detection off), a WebSocket client sending the
  stream a chunk at a time and waiting for that chunk's delta event before sending the next (the
  compute, not the client's pace, sets the time), then ``session.finish``.

Both run on the checkpoint's wordy copy with the decode budget of tools/live_bench.py (EOS and the
loop stop off, tokens_per_second x the seconds decoded less the prefix's tokens), so that random
weights decode what speech would. Figures: ``steps_s``, the wall time of the stream's steps (every
``StreamingTranscriber.feed`` and ``finish``, on whichever thread runs them) and ``wall_s``, the whole
session (the command's, model loading excluded; the socket's, from the first frame to the finished
event); each divided by the audio's seconds. A short warm-up stream runs first through each.

--root DIR runs another checkout of the package (e.g. a ``git worktree`` of an earlier commit), to
measure before and after on the same machine.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
REPO_ROOT = TOOLS.parent


def use_root(root: Path) -> None:
    """Import mlx_qwen3asr (and its cli/, installed as mlx_qwen3asr.cli) from another checkout."""
    sys.path.insert(0, str(root))
    import mlx_qwen3asr

    assert Path(mlx_qwen3asr.__file__).resolve().parent == (root / "mlx_qwen3asr").resolve()
    spec = importlib.util.spec_from_file_location(
        "mlx_qwen3asr.cli", root / "cli" / "__init__.py", submodule_search_locations=[str(root / "cli")]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["mlx_qwen3asr.cli"] = module
    spec.loader.exec_module(module)


class Meter:
    """The stream's steps timed, and each decode given the bench's budget (EOS off)."""

    def __init__(self, tokens_per_second: float) -> None:
        self.rate = tokens_per_second
        self.steps_s = 0.0
        self.tokens = self.drafted = self.decodes = 0

    def install(self):
        from live_bench import decode_budget

        from mlx_qwen3asr.pipeline.streaming import SAMPLE_RATE, StreamingTranscriber

        meter = self
        decode, feed, finish = (
            StreamingTranscriber._decode,
            StreamingTranscriber.feed,
            StreamingTranscriber.finish,
        )

        def budgeted(self, audio, prefix, draft=()):
            self._eos = frozenset()
            given = len(self.tokenizer.encode(prefix)) if prefix else 0
            self.max_new_tokens = decode_budget(meter.rate, audio.shape[0] / SAMPLE_RATE, given)
            gen, prompt = decode(self, audio, prefix, draft)
            meter.tokens += len(gen.tokens)
            meter.drafted += gen.drafted
            meter.decodes += 1
            return gen, prompt

        def timed(step):
            def run(self, *args):
                start = time.perf_counter()
                try:
                    return step(self, *args)
                finally:
                    meter.steps_s += time.perf_counter() - start

            return run

        StreamingTranscriber._decode = budgeted
        StreamingTranscriber.feed, StreamingTranscriber.finish = timed(feed), timed(finish)

    def reset(self) -> None:
        self.steps_s = 0.0
        self.tokens = self.drafted = self.decodes = 0

    def figures(self) -> dict:
        return {
            "steps_s": self.steps_s,
            "tokens": self.tokens,
            "drafted": self.drafted,
            "decodes": self.decodes,
        }


def run_terminal(model_dir: Path, wav: Path, meter: Meter) -> dict:
    from mlx_qwen3asr.cli import live, models

    load = models.load_model
    loading = [0.0]

    def timed_load(*args, **kwargs):
        start = time.perf_counter()
        try:
            return load(*args, **kwargs)
        finally:
            loading[0] += time.perf_counter() - start

    live.load_model = timed_load
    meter.reset()
    start = time.perf_counter()
    status = live.main(
        ["--input", str(wav), "--model", str(model_dir), "--no-vad", "--language", "English", "-q"]
    )
    wall = time.perf_counter() - start - loading[0]
    assert status == 0, f"mlxasr live exited with {status}"
    return {"wall_s": wall, **meter.figures()}


def run_socket(model, samples, chunk_seconds: float, meter: Meter, work: Path) -> dict:
    import numpy as np
    from starlette.testclient import TestClient

    from mlx_qwen3asr.pipeline.engine import Engine
    from mlx_qwen3asr.serve.app import create_app
    from mlx_qwen3asr.serve.live import LIVE_PATH, LiveLimits

    engine = Engine(model, vad=False)
    engine._scheduler.eos = frozenset()  # as the bench's decodes: EOS off
    app = create_app(
        engine,
        model_id="bench",
        upload_dir=work,
        live=LiveLimits(chunk_seconds=chunk_seconds, idle_timeout=3600.0, max_buffer_seconds=3600.0),
    )
    pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2")
    step = int(round(chunk_seconds * 16000))
    meter.reset()
    try:
        with (
            TestClient(app, base_url="http://127.0.0.1") as client,
            client.websocket_connect("ws://127.0.0.1" + LIVE_PATH) as ws,
        ):
            assert ws.receive_json()["type"] == "transcription_session.created"
            ws.send_json({"type": "transcription_session.update", "session": {"language": "English"}})
            assert ws.receive_json()["type"] == "transcription_session.updated"
            start = time.perf_counter()
            sent = 0
            for at in range(0, pcm.shape[0], step):
                piece = pcm[at : at + step]
                ws.send_bytes(piece.tobytes())
                sent += piece.shape[0]
                if piece.shape[0] < step:
                    break
                while True:  # this chunk's step
                    event = ws.receive_json()
                    assert event["type"] != "error", event
                    if event["type"].endswith(".delta") and event["audio_seconds"] * 16000 >= sent - 0.5:
                        break
            ws.send_json({"type": "session.finish"})
            while ws.receive_json()["type"] != "transcription_session.finished":
                pass
            wall = time.perf_counter() - start
    finally:
        engine.close()
    return {"wall_s": wall, **meter.figures()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--model", required=True, help="a checkpoint folder (e.g. tools/make_checkpoint.py --preset 0.6b)"
    )
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--chunk-seconds", type=float, default=2.0)
    ap.add_argument("--tokens-per-second", type=float, default=4.0)
    ap.add_argument("--warmup-seconds", type=float, default=6.0)
    ap.add_argument(
        "--work", default="/tmp/live-socket-bench", help="folder for the wordy checkpoint and audio"
    )
    ap.add_argument("--root", help="the checkout to measure (default: this one)")
    ap.add_argument("--only", choices=("terminal", "socket"))
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if args.root:
        use_root(Path(args.root).resolve())
    sys.path.insert(1, str(TOOLS))
    sys.path.insert(2, str(REPO_ROOT))
    import mlx_qwen3asr

    mlx_qwen3asr.tune_malloc()
    import soundfile as sf
    from bench import no_loop_stop, speechlike
    from live_bench import prompt_tokens, wordy_checkpoint

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    source = Path(args.model).resolve()
    wordy = work / f"wordy-{source.name}"
    if not (wordy / "config.json").exists():
        base = mlx_qwen3asr.load(str(source), dtype="float32")
        wordy_checkpoint(source, wordy, keep=prompt_tokens(base, "English"))
        del base
    model = mlx_qwen3asr.load(str(wordy), dtype="float32")
    audio = speechlike(args.seconds, seed=0)
    warm = speechlike(args.warmup_seconds, seed=1)
    files = {}
    for name, samples in (("stream", audio), ("warm", warm)):
        files[name] = work / f"{name}-{args.seconds:g}.wav"
        sf.write(files[name], samples, 16000, subtype="PCM_16")
    audio, _ = sf.read(files["stream"], dtype="float32")
    warm, _ = sf.read(files["warm"], dtype="float32")
    meter = Meter(args.tokens_per_second)
    meter.install()
    report = {"audio_s": audio.shape[0] / 16000, "model": str(source), "root": args.root or str(REPO_ROOT)}
    with no_loop_stop():
        if args.only in (None, "terminal"):
            run_terminal(wordy, files["warm"], meter)
            report["terminal"] = run_terminal(wordy, files["stream"], meter)
            print(f"terminal: {report['terminal']}", file=sys.stderr)
        if args.only in (None, "socket"):
            run_socket(model, warm, args.chunk_seconds, meter, work)
            report["socket"] = run_socket(model, audio, args.chunk_seconds, meter, work)
            print(f"socket: {report['socket']}", file=sys.stderr)
    for name in ("terminal", "socket"):
        if name in report:
            for key in ("steps_s", "wall_s"):
                report[name][key.replace("_s", "_per_audio_s")] = report[name][key] / report["audio_s"]
    if "terminal" in report and "socket" in report:
        report["socket_over_terminal"] = report["socket"]["steps_s"] / report["terminal"]["steps_s"]
        report["socket_wall_over_terminal"] = report["socket"]["wall_s"] / report["terminal"]["wall_s"]
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
