"""Benchmark mlx_qwen3asr: stage times, decode speed per batch size, throughput, and ratios against peers.

    python tools/bench.py --mode clip                       # one 10 s clip: latency
    python tools/bench.py --mode file --file-seconds 600    # one long file
    python tools/bench.py --mode folder --files 16          # a folder of 20 s files: throughput
    python tools/bench.py --mode vad --vad-minutes 60       # half speech, half noise: --vad vs --no-vad
    python tools/bench.py --mode live --preset tiny         # a 10 min stream played live (tools/live_bench.py)
    python tools/bench.py --mode all --peers --peer-python /path/to/peers-venv/bin/python --json out.json

Without --model, a random-weight 0.6b checkpoint in the release layout is built once under
checkpoints/ (tools/make_checkpoint.py). Random weights rarely emit EOS, so every segment decodes
exactly its budget (EOS and loop stops off): --tokens-per-second R tokens per second of the segment
(default 4, about what speech transcribes to: ~150 words a minute at ~1.3 tokens a word, plus the
language prefix of every segment), so the same audio costs every system the same number of tokens
however it is cut; or --new-tokens N per segment. With
--peers the same checkpoint and the same audio files go through moona3k's mlx-qwen3-asr and
mlx-audio (tools/peers.py, run with --peer-python, an environment that has them), and the table gives
our wall time divided by theirs. Stage times come from the end-to-end runs themselves.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

# isort: off
# mlx_qwen3asr goes first: it preloads OpenBLAS, which MLX's CPU matmul only picks up if loaded before it.
import mlx_qwen3asr  # noqa: E402
import mlx.core as mx  # noqa: E402

# isort: on
mlx_qwen3asr.tune_malloc()  # as the commands do
import numpy as np  # noqa: E402
import soundfile as sf  # noqa: E402

from mlx_qwen3asr.audio.features import SAMPLE_RATE, log_mel_spectrogram  # noqa: E402
from mlx_qwen3asr.model import batch as decoding  # noqa: E402
from mlx_qwen3asr.model.generate import greedy_generate_batch  # noqa: E402
from mlx_qwen3asr.pipeline.encoding import encode_segments  # noqa: E402
from mlx_qwen3asr.pipeline.inputs import InputOptions  # noqa: E402
from mlx_qwen3asr.pipeline.parts import Parts  # noqa: E402
from mlx_qwen3asr.pipeline.scheduler import Scheduler  # noqa: E402
from mlx_qwen3asr.runtime import cpu as _cpu  # noqa: E402
from mlx_qwen3asr.runtime.device import tuning  # noqa: E402
from tools.prompts import build_prompt_ids  # noqa: E402

MODES = ("clip", "file", "folder")
PEERS = ("moona3k", "mlx-audio")


# --------------------------------------------------------------------------------------------------
# Audio


def speechlike(seconds: float, seed: int) -> np.ndarray:
    """Syllable-rate bursts of harmonics and noise with pauses: cuts fall in quiet gaps, like speech."""
    rng = np.random.default_rng(seed)
    n = int(seconds * SAMPLE_RATE)
    t = np.arange(n) / SAMPLE_RATE
    f0 = 120 + 40 * np.sin(2 * np.pi * 0.3 * t + seed)
    phase = 2 * np.pi * np.cumsum(f0) / SAMPLE_RATE
    voice = sum(np.sin(k * phase) / k for k in range(1, 6))
    syllables = np.clip(np.sin(2 * np.pi * 4.0 * t) * 1.5, 0, 1)
    pauses = (np.sin(2 * np.pi * 0.17 * t + seed) > -0.8).astype(np.float64)
    wav = 0.2 * syllables * pauses * (0.8 * voice + 0.2 * rng.standard_normal(n))
    return wav.astype(np.float32)


def write_audio(folder: Path, mode: str, args: argparse.Namespace) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    lengths = {
        "clip": [args.clip_seconds],
        "file": [args.file_seconds],
        "folder": [args.folder_seconds] * args.files,
    }[mode]
    paths = []
    for i, seconds in enumerate(lengths):
        path = folder / f"{mode}-{i:02d}.wav"
        sf.write(path, speechlike(seconds, seed=i), SAMPLE_RATE, subtype="PCM_16")
        paths.append(path)
    return paths


# --------------------------------------------------------------------------------------------------
# Our side


@dataclass
class Run:
    wall_s: float
    stages: dict[str, float]
    segments: int
    tokens: int
    peak_memory_bytes: int
    batches: list[int] = field(default_factory=list)  # rows of each join to the running batch
    texts: list[list[str]] = field(default_factory=list)  # each file's segment texts
    heard_s: float = 0.0  # seconds of audio given to the model (the segments' lengths)


@dataclass
class Stages:
    """Time spent per stage during one end-to-end run (wrappers around the scheduler's calls)."""

    times: dict[str, float] = field(default_factory=dict)
    tokens: int = 0
    segments: int = 0
    batches: list[int] = field(default_factory=list)

    def add(self, stage: str, seconds: float) -> None:
        self.times[stage] = self.times.get(stage, 0.0) + seconds


SPREAD_SEED = 20261122


@dataclass(frozen=True)
class Budget:
    """New tokens per segment: a fixed count, or a rate per second of the segment's audio."""

    new_tokens: int | None = None
    per_second: float | None = None
    # Realistic stops: each segment's rate drawn (seeded, from the segment's length) in [low, high].
    spread: tuple[float, float] | None = None

    def tokens(self, seconds: float) -> int:
        if self.spread is not None:
            rng = np.random.default_rng([SPREAD_SEED, int(round(seconds * 1000))])
            return max(1, round(rng.uniform(*self.spread) * seconds))
        if self.per_second is None:
            return int(self.new_tokens)
        return max(1, round(self.per_second * seconds))

    def peer_args(self) -> list[str]:
        if self.per_second is None:
            return ["--new-tokens", str(self.new_tokens)]
        return ["--tokens-per-second", f"{self.per_second:g}"]

    def describe(self) -> str:
        if self.spread is not None:
            return f"realistic stops: each segment {self.spread[0]:g} to {self.spread[1]:g} tokens per second (seeded)"
        if self.per_second is None:
            return f"{self.new_tokens} new tokens per segment"
        return f"{self.per_second:g} new tokens per second of audio"


@contextlib.contextmanager
def no_loop_stop():
    """Rows are never stopped for looping (random weights loop often): each decodes its whole budget."""
    if not hasattr(decoding, "LOOP_CHECK_EVERY"):
        raise RuntimeError(
            "mlx_qwen3asr.model.batch.LOOP_CHECK_EVERY is gone: the loop stop cannot be turned off"
        )
    real = decoding.LOOP_CHECK_EVERY
    decoding.LOOP_CHECK_EVERY = 1 << 30
    try:
        yield
    finally:
        decoding.LOOP_CHECK_EVERY = real


def instrumented(stages: Stages, budget: Budget) -> Parts:
    """The scheduler's stages timed into `stages`, with every segment decoding exactly its budget (EOS off;
    loops are not stopped under no_loop_stop)."""
    real = Parts()

    def timed(stage: str, fn):
        def call(*args, **kwargs):
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            stages.add(stage, time.perf_counter() - start)
            return out

        return call

    class Batch(real.batch):
        """The scheduler's decoding batch with EOS off and its joins (prefill) and steps (decode) timed.

        Rows join as others finish (continuous batching); `batches` records how many rows each join adds.
        """

        def __init__(self, net, eos_ids, **kwargs):
            super().__init__(net, frozenset(), **kwargs)

        def add(self, prompts, audio_features, max_new_tokens, keys):
            start = time.perf_counter()
            out = super().add(prompts, audio_features, max_new_tokens, keys)
            if self.y is not None:
                mx.eval(self.y)
            stages.add("prefill", time.perf_counter() - start)
            stages.segments += len(prompts)
            stages.batches.append(len(prompts))
            return out

        def step(self):
            start = time.perf_counter()
            rows = len(self)
            out = super().step()
            stages.add("decode", time.perf_counter() - start)
            stages.tokens += rows
            return out

    return Parts(
        load=timed("audio decode", real.load),
        # Runs on the scheduler's background thread, overlapping model work; includes load.
        prepare=timed("preparing", real.prepare),
        mel=timed("mel", real.mel),  # a segment's samples read and its spectrogram, when its batch comes
        encode=timed("encoder", real.encode),
        # The prompt start shared by every segment (system prompt and context), computed once a run.
        prefill=timed("prefill", real.prefill),
        batch=Batch,
        budget=budget.tokens,  # equal work: the budget is the whole of every segment's decode
    )


class ClosedBatches(Scheduler):
    """A Scheduler whose batch stays closed until its last row finishes (batch after batch): what
    continuous batching is compared with."""

    def _refill(self) -> None:
        if not self.rows:
            super()._refill()


def transcribe_all(
    model,
    paths: list[Path],
    batch_size: int | None,
    continuous: bool = True,
    options: InputOptions | None = None,
    parts: Parts | None = None,
) -> list:
    """Every file through one Scheduler; continuous=False closes each batch until its last row ends
    (ClosedBatches). The default options send all the audio to the model (no speech detection)."""
    sched = (Scheduler if continuous else ClosedBatches)(model, batch_size=batch_size, parts=parts)
    try:
        for i, path in enumerate(paths):
            sched.submit(i, str(path), options or InputOptions())
        results = []
        while not sched.idle:
            results += sched.run_once()
    finally:
        sched.close()
    return sorted(results, key=lambda r: r.index)


def run_ours(
    model,
    paths: list[Path],
    budget: Budget,
    batch_size: int | None,
    continuous: bool = True,
    options: InputOptions | None = None,
) -> Run:
    stages = Stages()
    parts = instrumented(stages, budget)
    mx.clear_cache()
    mx.reset_peak_memory()
    with no_loop_stop():
        start = time.perf_counter()
        results = transcribe_all(model, paths, batch_size, continuous, options, parts)
        wall = time.perf_counter() - start
    for r in results:
        if r.error is not None:
            raise r.error
    times = dict(stages.times)
    # Cutting runs on the preparation thread; each segment's mel (read and computed) when its batch comes.
    times["mel + cutting"] = (
        times.pop("preparing", 0.0) - times.get("audio decode", 0.0) + times.pop("mel", 0.0)
    )
    texts = [[s.text for s in r.transcription.segments] for r in results]
    run = Run(wall, times, stages.segments, stages.tokens, int(mx.get_peak_memory()), stages.batches, texts)
    run.heard_s = sum(s.end - s.start for r in results for s in r.transcription.segments)
    return run


def decode_sweep(model, batch_sizes: list[int], steps: int, prompt_seconds: float = 5.0) -> dict[int, float]:
    """Milliseconds per decode step with B rows (prefill excluded), B rows of one 5 s prompt."""
    wav = speechlike(prompt_seconds, seed=99)
    feats = encode_segments(model, [log_mel_spectrogram(wav)])[0]
    prompt = build_prompt_ids(model.tokenizer, int(feats.shape[0]), context="", language=None)
    out = {}
    for b in batch_sizes:
        times = []
        for _ in range(2):
            marks: list[float] = []
            mark = marks.append
            with no_loop_stop():
                greedy_generate_batch(
                    model.net,
                    [prompt] * b,
                    [feats] * b,
                    [steps] * b,
                    frozenset(),
                    on_first_tokens=lambda mark=mark: mark(time.perf_counter()),
                )
            times.append((time.perf_counter() - marks[0]) / (steps - 1))
        out[b] = min(times) * 1000
    return out


def _best_seconds(run, repeats: int = 5) -> float:
    """The shortest of `repeats` timed calls of run()."""
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def memory_bandwidth() -> float:
    """Bytes per second the CPU reads: numpy sums over a 1 GiB array split across all cores, best of 5."""
    from concurrent.futures import ThreadPoolExecutor

    a = np.ones(1 << 28, dtype=np.float32)
    parts = np.array_split(a, os.cpu_count() or 1)
    with ThreadPoolExecutor(len(parts)) as pool:
        return a.nbytes / _best_seconds(lambda: list(pool.map(np.sum, parts)))


def decoder_bytes(model) -> int:
    """Bytes one decode step reads: the decoder's weights and the vocabulary head."""
    from mlx.utils import tree_flatten

    return sum(v.nbytes for _, v in tree_flatten(model.net.model.parameters()))


def encoder_scaling(model, seconds: list[float]) -> dict[float, float]:
    """Encoder seconds per audio second for one segment of each length."""
    out = {}
    for s in seconds:
        mel = log_mel_spectrogram(speechlike(s, seed=7))
        encode_segments(model, [mel[:, :200]])  # warm
        start = time.perf_counter()
        encode_segments(model, [mel])
        out[s] = (time.perf_counter() - start) / s
    return out


# --------------------------------------------------------------------------------------------------
# Peers


def run_peer(
    python: str,
    peer: str,
    model: Path,
    paths: list[Path],
    budget: Budget,
    mode: str,
    runs: int,
    dtype: str = "float32",
    timeout: float = 3600.0,
    warmup: int = 1,
) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = Path(f.name)
    cmd = [python, str(REPO_ROOT / "tools" / "peers.py"), "--peer", peer, "--model", str(model)]
    cmd += budget.peer_args() + ["--mode", mode, "--runs", str(runs), "--json", str(out), "--dtype", dtype]
    cmd += ["--warmup", str(warmup)]
    cmd += [str(p) for p in paths]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"peer": peer, "error": [f"did not finish within {timeout:g} s"]}
    if proc.returncode not in (0, 1) or not out.exists() or out.stat().st_size == 0:
        return {"peer": peer, "error": (proc.stderr or proc.stdout).strip().splitlines()[-1:]}
    data = json.loads(out.read_text())
    out.unlink()
    return data


# --------------------------------------------------------------------------------------------------


ALIGN_PASSAGE = (
    "So the first thing I want to talk about today is the budget for next year. We looked at every "
    "department, and most of them asked for more than last time. That is not a surprise, because the "
    "costs of almost everything went up, and the plans we made two years ago did not expect that."
).split()


def checkpoint_path(given: str | None, preset: str) -> Path:
    """The checkpoint to measure: `given`, or this repository's random-weight `preset` (built once)."""
    if given:
        return Path(given)
    path = REPO_ROOT / "checkpoints" / f"random-{preset}"
    if not (path / "config.json").exists():
        from tools.make_checkpoint import write_checkpoint

        print(f"building {path}", file=sys.stderr)
        write_checkpoint(path, preset, seed=0)
    return path


def alignment_bench(args: argparse.Namespace, work: Path) -> dict:
    """Forced alignment of a folder's segments: seconds per audio second, batched and one at a time,
    and moona3k's aligner on the same segments and texts (with --peers)."""
    from mlx_qwen3asr.checkpoints.convert import convert_checkpoint
    from mlx_qwen3asr.pipeline.alignment import align_segments

    path = checkpoint_path(args.aligner, "aligner")
    aligner = mlx_qwen3asr.load(str(path), dtype=args.dtype)
    seconds = args.folder_seconds
    wavs = [speechlike(seconds, seed=i) for i in range(args.files)]
    # About 2.5 words a second, as speech has.
    count = max(1, int(2.5 * seconds))
    texts = [
        " ".join((ALIGN_PASSAGE * (count // len(ALIGN_PASSAGE) + 1))[i : i + count]) for i in range(len(wavs))
    ]
    mels = [log_mel_spectrogram(w) for w in wavs]
    english = ["English"] * len(wavs)

    def batched():
        return align_segments(aligner, mels, texts, english, [(0.0, seconds)] * len(wavs))

    def alone():
        return [
            align_segments(aligner, [m], [t], ["English"], [(0.0, seconds)])[0] for m, t in zip(mels, texts)
        ]

    batched()  # warm-up
    runs = {"batched": [], "one at a time": []}
    for _ in range(args.runs):
        for name, fn in (("batched", batched), ("one at a time", alone)):
            start = time.perf_counter()
            fn()
            runs[name].append(time.perf_counter() - start)
    audio = seconds * len(wavs)
    out = {
        "aligner": str(path),
        "segments": len(wavs),
        "segment_seconds": seconds,
        "words": count * len(wavs),
        "seconds": {k: median(v) for k, v in runs.items()},
        "seconds_per_audio_second": {k: median(v) / audio for k, v in runs.items()},
    }
    if args.peers:
        float_copy = work / "aligner-mlx"
        if not float_copy.exists():
            convert_checkpoint(path, float_copy, dtype="float32")
        clips = []
        for i, w in enumerate(wavs):
            clips.append(work / f"align-{i}.wav")
            sf.write(clips[-1], w, SAMPLE_RATE)
        (work / "texts.json").write_text(json.dumps(texts))
        cmd = [args.peer_python, str(REPO_ROOT / "tools" / "peer_align.py"), "--model", str(float_copy)]
        cmd += ["--texts", str(work / "texts.json"), *map(str, clips)]
        peer_runs = []
        for _ in range(args.peer_runs or args.runs):
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"moona3k aligner failed: {proc.stderr[-1500:]}")
            peer_runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        out["moona3k"] = {
            "version": peer_runs[0]["version"],
            "seconds": median([r["seconds"] for r in peer_runs]),
            "words": peer_runs[0]["words"],
        }
        out["moona3k"]["seconds_per_audio_second"] = out["moona3k"]["seconds"] / audio
    return out


def alignment_markdown(report: dict) -> str:
    rows = [
        f"Forced alignment: {report['segments']} segments of {report['segment_seconds']:g} s, "
        f"{report['words']} words, {report['aligner']}",
        "",
        "| system | seconds | seconds per audio second |",
        "| --- | --- | --- |",
    ]
    for name, value in report["seconds"].items():
        rows.append(
            f"| mlx_qwen3asr, {name} | {value:.2f} | {report['seconds_per_audio_second'][name]:.4f} |"
        )
    if "moona3k" in report:
        peer = report["moona3k"]
        rows.append(
            f"| moona3k mlx-qwen3-asr {peer['version']} | {peer['seconds']:.2f} | {peer['seconds_per_audio_second']:.4f} |"
        )
    return "\n".join(rows)


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def summarize(mode: str, audio_seconds: float, runs: list[Run], load_s: float) -> dict:
    stages = {k: median([r.stages.get(k, 0.0) for r in runs]) for k in runs[0].stages}
    wall = median([r.wall_s for r in runs])
    tokens = runs[0].tokens
    return {
        "mode": mode,
        "audio_seconds": audio_seconds,
        "runs": [r.__dict__ for r in runs],
        "load_s": load_s,
        "median_wall_s": wall,
        "stages_s": stages,
        "segments": runs[0].segments,
        "batches": runs[0].batches,
        "tokens": tokens,
        "x_realtime": audio_seconds / wall,
        "tokens_per_s": tokens / wall,
        "decode_ms_per_token": 1000 * stages.get("decode", 0.0) / max(tokens - runs[0].segments, 1),
        "peak_memory_mb": max(r.peak_memory_bytes for r in runs) / 2**20,
    }


def markdown(report: dict) -> str:
    lines = [
        f"machine: {report['machine']}; mlx {report['mlx']} ({report['device']}); dtype {report['dtype']}; "
        f"OpenBLAS: {report['openblas'] or 'no'}",
        f"model: {report['model']}; {report['budget']}; medians of {report['runs']} runs",
        "",
        "| mode | audio | segments (rows per batch) | load s | audio decode s | mel s | encoder s | prefill s | decode s | ms/token | wall s "
        "| x realtime | tokens/s | peak MB |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for m in report["modes"]:
        st = m["stages_s"]
        lines.append(
            f"| {m['mode']} | {m['audio_seconds']:.0f} s | {m['segments']} ({'+'.join(map(str, m['batches']))}) "
            f"| {m['load_s']:.2f} "
            f"| {st.get('audio decode', 0):.2f} | {st.get('mel + cutting', 0):.2f} | {st.get('encoder', 0):.2f} "
            f"| {st.get('prefill', 0):.2f} | {st.get('decode', 0):.2f} | {m['decode_ms_per_token']:.1f} "
            f"| {m['median_wall_s']:.2f} | {m['x_realtime']:.1f} | {m['tokens_per_s']:.1f} | {m['peak_memory_mb']:.0f} |"
        )
    if report.get("decode_sweep_ms"):
        lines += [
            "",
            "| decode rows B | ms per step | ms per token | tokens/s |",
            "| --- | --- | --- | --- |",
        ]
        for b, ms in report["decode_sweep_ms"].items():
            lines.append(f"| {b} | {ms:.1f} | {ms / int(b):.1f} | {1000 * int(b) / ms:.1f} |")
        floor = report["bandwidth_floor_ms"]
        one = report["decode_sweep_ms"].get("1") or report["decode_sweep_ms"].get(1)
        if one:
            lines.append(
                f"\nbandwidth floor per step: {floor:.1f} ms ({report['decoder_mb']:.0f} MB of decoder weights at "
                f"{report['bandwidth_gbs']:.1f} GB/s); batch-1 step = {one / floor:.2f}x the floor"
            )
    if report.get("encoder_s_per_audio_s"):
        cells = ", ".join(
            f"{float(k):g} s: {v * 1000:.1f} ms" for k, v in report["encoder_s_per_audio_s"].items()
        )
        lines.append(f"\nencoder time per audio second: {cells}")
    if report.get("peers"):
        lines += [
            "",
            "| mode | system | segments | tokens | wall s (median) | load s | ours / theirs | speed-up |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        ours = {m["mode"]: m for m in report["modes"]}
        for p in report["peers"]:
            m = ours[p["mode"]]
            if p.get("error"):
                lines.append(f"| {p['mode']} | {p['peer']} | failed: {p['error']} | | | | | |")
                continue
            segs = sum(p.get("segments_per_file") or [])
            earlier = " (earlier run)" if p.get("reused_from_earlier_run") else ""
            ratio = m["median_wall_s"] / p["median_wall_s"]
            lines.append(
                f"| {p['mode']} | {p['peer']} {p.get('version', '')}{earlier} | {segs} | {p['runs'][0]['tokens']} "
                f"| {p['median_wall_s']:.2f} | {p['load_s']:.2f} | {ratio:.2f} | {1 / ratio:.2f}x |"
            )
        for m in report["modes"]:
            lines.append(
                f"| {m['mode']} | mlx_qwen3asr | {m['segments']} | {m['tokens']} | {m['median_wall_s']:.2f} "
                f"| {m['load_s']:.2f} | 1.00 | 1.00x |"
            )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Speech detection: a long file that is half speech, half silence, noise and music-like tones


def half_speech(minutes: float, seed: int = 7) -> np.ndarray:
    """espeak-ng sentences, each followed by as long a stretch of silence, hiss, noise, chords or a beat."""
    from tools.sounds import NOISES, SENTENCES, espeak, non_speech, trimmed

    rng = np.random.default_rng(seed)
    spoken = [trimmed(espeak(voice, text)) for voice, text in SENTENCES]
    parts, total, i = [], 0, 0
    while total < minutes * 60 * SAMPLE_RATE:
        sentence = spoken[i % len(spoken)]
        gap = non_speech(NOISES[i % len(NOISES)], sentence.size, rng, level=0.03)
        parts += [sentence, gap]
        total += 2 * sentence.size
        i += 1
    return np.concatenate(parts).astype(np.float32)


def vad_bench(args: argparse.Namespace, model, budget: Budget, folder: Path) -> dict:
    from mlx_qwen3asr.audio.vad import VadOptions, detect_speech

    audio = half_speech(args.vad_minutes)
    path = folder / "half-speech.wav"
    sf.write(path, audio, SAMPLE_RATE, subtype="PCM_16")
    seconds = audio.size / SAMPLE_RATE
    start, cpu = time.perf_counter(), time.process_time()
    regions = detect_speech(audio)
    vad_wall, vad_cpu = time.perf_counter() - start, time.process_time() - cpu
    run_ours(model, [path], Budget(new_tokens=4), args.batch_size)  # warm-up
    runs = {}
    for name, vad in (("all audio (--no-vad)", None), ("speech only (--vad)", VadOptions())):
        runs[name] = run_ours(model, [path], budget, args.batch_size, options=InputOptions(vad=vad))
        print(f"{name}: {runs[name].wall_s:.1f} s", file=sys.stderr)
    base = runs["all audio (--no-vad)"].wall_s
    return {
        "audio_s": seconds,
        "speech_s": sum(r.duration for r in regions),
        "vad_wall_s_per_audio_hour": vad_wall / seconds * 3600,
        "vad_cpu_s_per_audio_hour": vad_cpu / seconds * 3600,
        "budget": budget.describe(),
        "runs": {
            name: {
                "wall_s": r.wall_s,
                "x_realtime": seconds / r.wall_s,
                "heard_s": r.heard_s,
                "segments": r.segments,
                "tokens": r.tokens,
                "time_vs_no_vad": r.wall_s / base,
            }
            for name, r in runs.items()
        },
    }


def vad_markdown(result: dict) -> str:
    lines = [
        f"{result['audio_s'] / 60:.0f} min file, {result['speech_s'] / 60:.1f} min found to be speech; "
        f"{result['budget']}. Speech detection itself: {result['vad_wall_s_per_audio_hour']:.1f} s "
        f"({result['vad_cpu_s_per_audio_hour']:.1f} s CPU) per audio hour.",
        "",
        "| run | audio given to the model | segments | tokens | wall | time vs --no-vad |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in result["runs"].items():
        lines.append(
            f"| {name} | {r['heard_s'] / 60:.1f} min | {r['segments']} | {r['tokens']} | "
            f"{r['wall_s']:.1f} s ({r['x_realtime']:.1f}x realtime) | {r['time_vs_no_vad']:.2f} |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Live transcription: one stream fed chunk by chunk at real time (virtual clock, tools/live_bench.py)


def live_bench(args: argparse.Namespace, model, model_path: Path, work: Path) -> dict:
    """The --live-seconds stream with the bounded window, the first --unbounded-seconds of it with an
    unbounded one and, with --peers, moona3k's streaming on the same audio."""
    from tools import live_bench as live

    rate = args.tokens_per_second or 4.0
    settings = dict(chunk_seconds=args.chunk_seconds, tokens_per_second=rate, language=args.language or None)
    audio = speechlike(args.live_seconds, seed=0)
    windows = [("bounded", args.max_window_seconds, audio)]
    if args.unbounded_seconds:
        windows.append(("unbounded", None, audio[: int(round(args.unbounded_seconds * SAMPLE_RATE))]))
    runs = []
    with no_loop_stop():
        warm = speechlike(3 * args.chunk_seconds, seed=1)
        live.run_ours(model, warm, max_window_seconds=args.max_window_seconds, **settings)
        for name, window, samples in windows:
            start = time.perf_counter()
            steps = live.run_ours(model, samples, max_window_seconds=window, **settings)
            print(f"live, {name} window: {time.perf_counter() - start:.1f} s", file=sys.stderr)
            label = f"{window:g} s" if window else "unbounded"
            summary = live.summarize(steps, args.chunk_seconds)
            runs.append({"system": "mlx_qwen3asr", "window": label, **summary})
            runs[-1]["step_log"] = [s.__dict__ for s in steps]
    if args.peers:
        wav = work / "live.wav"
        sf.write(wav, audio, SAMPLE_RATE, subtype="FLOAT")
        print("live: running moona3k", file=sys.stderr)
        peer = live.run_peer(
            args.peer_python,
            model_path,
            wav,
            work / "moona3k.json",
            chunk_seconds=args.chunk_seconds,
            max_window_seconds=args.max_window_seconds,
            tokens_per_second=rate,
            language=args.language or "",
        )
        name = f"moona3k mlx-qwen3-asr {peer.get('version', '')}".strip()
        runs.append({"system": name, "window": f"{args.max_window_seconds:g} s", **peer})
    return {
        "mode": "live",
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "mlx": mx.__version__,
        "device": str(mx.default_device()),
        "dtype": str(model.dtype).replace("mlx.core.", ""),
        "model": str(model_path),
        "chunk_seconds": args.chunk_seconds,
        "language": args.language,
        "budget": f"{rate:g} tokens per second of audio decoded, less the prefix's tokens (EOS and loop stop off)",
        "runs": runs,
    }


def live_markdown(report: dict) -> str:
    def pair(d: dict) -> str:
        return "-" if not d.get("n") else f"{d['p50']:.2f} / {d['p95']:.2f}"

    lines = [
        f"model: {report['model']} ({report['dtype']}, mlx {report['mlx']}, {report['device']}); chunks of "
        f"{report['chunk_seconds']:g} s, language {report['language'] or 'detected'}; {report['budget']}. "
        "Played at real time on a virtual clock: chunk k arrives at (k+1) x chunk, its step starts when "
        "it has arrived and the previous step is done, and lasts its measured wall time.",
        "",
        "| system | window | audio | steps | compute per audio s | behind at end s | partial latency p50 / p95 s "
        "| commit latency p50 / p95 s | commits before the end | chunks committed at end | tokens |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in report["runs"]:
        if r.get("error"):
            lines.append(f"| {r['system']} | {r['window']} | failed: {r['error']} | | | | | | | | |")
            continue
        lines.append(
            f"| {r['system']} | {r['window']} | {r['audio_s']:.0f} s | {r['steps']} | {r['compute_per_audio_s']:.3f} "
            f"| {r['lag_at_end_s']:.2f} | {pair(r['partial_latency_s'])} | {pair(r['commit_latency_s'])} "
            f"| {r['commits_before_end']} | {r['chunks_committed_at_end']} | {r['tokens']} |"
        )
    lines += [
        "",
        "| system | window | minute | steps | median step ms | median audio encoded per step s | most encoded s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in report["runs"]:
        for minute, m in r.get("per_minute", {}).items():
            lines.append(
                f"| {r['system']} | {r['window']} | {minute} | {m['steps']} | {1000 * m['median_step_s']:.0f} "
                f"| {m['median_encoded_s']:.1f} | {m['max_encoded_s']:.1f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="checkpoint directory or repo id (default: random 0.6b, built once)")
    ap.add_argument("--mode", choices=(*MODES, "all", "align", "server", "vad", "live"), default="all")
    ap.add_argument(
        "--preset",
        default="0.6b",
        help="random-weight preset built and measured without --model (default 0.6b)",
    )
    ap.add_argument("--live-seconds", type=float, default=600.0, help="length of the --mode live stream")
    ap.add_argument("--chunk-seconds", type=float, default=2.0, help="--mode live: audio per step")
    ap.add_argument("--max-window-seconds", type=float, default=20.0, help="--mode live: the bounded window")
    ap.add_argument(
        "--unbounded-seconds",
        type=float,
        default=180.0,
        help="--mode live: seconds streamed again with an unbounded window (0 skips)",
    )
    ap.add_argument("--language", default="English", help="--mode live: forced language ('' detects it)")
    ap.add_argument("--vad-minutes", type=float, default=60.0, help="length of the --mode vad file")
    ap.add_argument("--clients", default="1,4,16,64", help="concurrent clients for --mode server")
    ap.add_argument(
        "--aligner", help="forced aligner for --mode align (default: random aligner preset, built once)"
    )
    ap.add_argument(
        "--dtype",
        default=None,
        help="float32, bfloat16 or float16 (default: float32 on CPU, bfloat16 on a GPU); the peers get the same",
    )
    budget_args = ap.add_mutually_exclusive_group()
    budget_args.add_argument("--new-tokens", type=int, help="tokens decoded per segment")
    budget_args.add_argument(
        "--realistic-stops",
        action="store_true",
        help="each segment decodes a budget drawn (seeded) from 0.5 to 6 tokens per second of its audio",
    )
    budget_args.add_argument(
        "--tokens-per-second", type=float, help="tokens decoded per second of each segment (default 4)"
    )
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=None, help="rows decoded together (default: automatic)")
    ap.add_argument("--clip-seconds", type=float, default=10.0)
    ap.add_argument("--file-seconds", type=float, default=600.0)
    ap.add_argument("--folder-seconds", type=float, default=20.0)
    ap.add_argument("--files", type=int, default=16)
    ap.add_argument("--sweep", default="1,4,8,16", help="batch sizes for the decode-step sweep ('' skips it)")
    ap.add_argument("--sweep-steps", type=int, default=16)
    ap.add_argument(
        "--encoder-seconds", default="10,60,300", help="audio lengths for encoder scaling ('' skips)"
    )
    ap.add_argument("--peers", action="store_true", help="also run moona3k's mlx-qwen3-asr and mlx-audio")
    ap.add_argument("--peer-python", default=sys.executable, help="python of an environment with the peers")
    ap.add_argument("--peer-runs", type=int, default=None, help="runs per peer (default: --runs)")
    ap.add_argument("--peer-timeout", type=float, default=3600.0, help="seconds a peer's run may take")
    ap.add_argument(
        "--peer-warmup",
        type=int,
        default=1,
        help="untimed runs of each peer first (ours has one): kernels compiled on first use are not timed",
    )
    ap.add_argument(
        "--peer-results",
        nargs="*",
        default=[],
        metavar="JSON",
        help="take the peers' figures from earlier --json reports (same checkpoint, audio and budget) "
        "instead of running them again",
    )
    ap.add_argument(
        "--compare-batching",
        action="store_true",
        help="also run each mode with every batch closed until its last row ends (no rows joining)",
    )
    ap.add_argument("--json", help="write the full report here")
    args = ap.parse_args(argv)

    if args.mode == "align":
        with tempfile.TemporaryDirectory(prefix="bench-align-") as tmp:
            result = alignment_bench(args, Path(tmp))
        text = alignment_markdown(result)
        print(text)
        if args.json:
            Path(args.json).write_text(json.dumps({**result, "markdown": text}, indent=2) + "\n")
        return 0
    if args.mode == "server":
        from tools.server_bench import run as server_run

        path = checkpoint_path(args.model, "0.6b")
        result = server_run(
            path,
            clients=tuple(int(c) for c in args.clients.split(",")),
            seconds=args.folder_seconds,
            tokens_per_second=args.tokens_per_second or 4.0,
            batch_size=args.batch_size,
            dtype=args.dtype,
            peer_python=args.peer_python if args.peers else None,
            peer_clients=(1, 4),
        )
        print(result["markdown"])
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2, default=str) + "\n")
        return 0
    model_path = checkpoint_path(args.model, args.preset)
    modes = list(MODES) if args.mode == "all" else [args.mode]
    if args.realistic_stops:
        budget = Budget(spread=(0.5, 6.0))
    elif args.new_tokens is not None:
        budget = Budget(new_tokens=args.new_tokens)
    else:
        budget = Budget(per_second=args.tokens_per_second or 4.0)

    start = time.perf_counter()
    model = mlx_qwen3asr.load(str(model_path), dtype=args.dtype)
    load_s = time.perf_counter() - start
    if args.mode == "live":
        from tools import live_bench as live

        with tempfile.TemporaryDirectory(prefix="bench-live-") as tmp:
            keep = live.prompt_tokens(model, args.language or None)
            model_path = live.wordy_checkpoint(model_path, Path(tmp) / "wordy", keep)
            del model
            model = mlx_qwen3asr.load(str(model_path), dtype=args.dtype)
            result = live_bench(args, model, model_path, Path(tmp))
        result["load_s"] = load_s
        result["markdown"] = live_markdown(result)
        print(result["markdown"])
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2, default=str) + "\n")
        return 0
    if args.mode == "vad":
        with tempfile.TemporaryDirectory(prefix="bench-vad-") as tmp:
            result = vad_bench(args, model, budget, Path(tmp))
        text = vad_markdown(result)
        print(text)
        if args.json:
            Path(args.json).write_text(json.dumps({**result, "markdown": text}, indent=2) + "\n")
        return 0
    report: dict = {
        "machine": f"{platform.machine()} {platform.processor() or ''} {mx.device_info().get('device_name', '')}".strip(),
        "mlx": mx.__version__,
        "device": str(mx.default_device()),
        "dtype": str(model.dtype).replace("mlx.core.", ""),
        "openblas": _cpu.loaded and f"{_cpu.loaded} ({_cpu.openblas_core()} kernels)",
        "malloc_tuned": _cpu.malloc_tuned,
        "model": str(model_path),
        "budget": budget.describe(),
        "new_tokens": budget.new_tokens,
        "tokens_per_second": budget.per_second,
        "runs": args.runs,
        "batch_size": args.batch_size or f"automatic (at most {tuning().max_batch})",
        "modes": [],
        "peers": [],
    }
    with tempfile.TemporaryDirectory(prefix="bench-audio-") as tmp:
        for mode in modes:
            paths = write_audio(Path(tmp) / mode, mode, args)
            seconds = sum(sf.info(p).duration for p in paths)
            run_ours(model, paths[:1], Budget(new_tokens=4), args.batch_size)  # warm-up
            runs = []
            for i in range(args.runs):
                runs.append(run_ours(model, paths, budget, args.batch_size))
                print(f"{mode}, run {i + 1}: {runs[-1].wall_s:.2f} s", file=sys.stderr)
            report["modes"].append(summarize(mode, seconds, runs, load_s))
            if args.compare_batching:
                closed = []
                for i in range(args.runs):
                    closed.append(run_ours(model, paths, budget, args.batch_size, continuous=False))
                    print(
                        f"{mode} batch after batch, run {i + 1}: {closed[-1].wall_s:.2f} s", file=sys.stderr
                    )
                summary = summarize(f"{mode} (batch after batch)", seconds, closed, load_s)
                summary["same_texts_as_continuous"] = closed[0].texts == runs[0].texts
                report["modes"].append(summary)
            earlier = [
                p
                for f in args.peer_results
                for p in json.loads(Path(f).read_text()).get("peers", [])
                if p.get("mode") == mode
                and p.get("new_tokens") == budget.new_tokens
                and p.get("tokens_per_second") == budget.per_second
            ]
            for p in earlier:
                p["reused_from_earlier_run"] = True
            report["peers"].extend(earlier)
            if args.peers and not earlier:
                for peer in PEERS:
                    print(f"{mode}: running {peer}", file=sys.stderr)
                    result = run_peer(
                        args.peer_python,
                        peer,
                        model_path,
                        paths,
                        budget,
                        mode,
                        args.peer_runs or args.runs,
                        report["dtype"],
                        args.peer_timeout,
                        args.peer_warmup,
                    )
                    result["mode"] = mode
                    report["peers"].append(result)
            if args.json:
                Path(args.json).write_text(json.dumps(report, indent=2, default=str) + "\n")
    if args.sweep:
        sizes = [int(b) for b in args.sweep.split(",")]
        report["decode_sweep_ms"] = {
            str(b): ms for b, ms in decode_sweep(model, sizes, args.sweep_steps).items()
        }
        weights = decoder_bytes(model)
        bandwidth = memory_bandwidth()
        report["decoder_mb"] = weights / 1e6
        report["bandwidth_gbs"] = bandwidth / 1e9
        report["bandwidth_floor_ms"] = 1000 * weights / bandwidth
    if args.encoder_seconds:
        lengths = [float(s) for s in args.encoder_seconds.split(",")]
        report["encoder_s_per_audio_s"] = {str(k): v for k, v in encoder_scaling(model, lengths).items()}
    report["markdown"] = markdown(report)
    print(report["markdown"])
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
