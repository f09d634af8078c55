"""Measure what each mlxasr-convert recipe costs and keeps: size, load time, memory, agreement with bf16.

    python tools/quant_table.py                      # the random-weight 0.6b preset, built in a temp dir
    python tools/quant_table.py --src Qwen/Qwen3-ASR-0.6B --json quant.json

For every recipe the source is converted, then loaded twice: once in --load-dtype (bfloat16, what a
GPU runs) for the load time and the peak memory after loading, and once with float32 compute for the
accuracy figures, so that only the stored weights differ between recipes (quantized layers keep their
packed weights either way). Against the bf16 conversion, on a few synthetic test signals, it reports
the cosine of the prefill logits at the last prompt position (what picks the first token) and the
fraction of the first --steps greedy ids that equal the bf16 model's (EOS ignored, so every run
decodes the same number of steps), and, since one early disagreement derails free-running greedy
decoding, the top-1 agreement when every model is fed the bf16 model's greedy ids as history. On random weights the accuracy columns measure how far quantization
moves the model, not transcription quality.
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

# isort: off
# mlx_qwen3asr goes first: it preloads OpenBLAS, which MLX's CPU matmul only picks up if loaded before it.
import mlx_qwen3asr  # noqa: E402
import mlx.core as mx  # noqa: E402

# isort: on
from mlx_qwen3asr.audio.features import SAMPLE_RATE, log_mel_spectrogram  # noqa: E402
from mlx_qwen3asr.checkpoints.convert import convert_checkpoint  # noqa: E402
from mlx_qwen3asr.model.encoder import encoder_batch  # noqa: E402
from mlx_qwen3asr.model.qwen3asr import Qwen3ASR  # noqa: E402
from tools.prompts import build_prompt_ids  # noqa: E402

# name -> (convert keyword arguments, the CLI flags that give them)
RECIPES: dict[str, tuple[dict, str]] = {
    "bf16": ({}, "(none)"),
    "8-bit": ({"bits": 8}, "--bits 8"),
    "4-bit": ({"bits": 4}, "--bits 4"),
    "8-bit, encoder too": ({"bits": 8, "encoder_bits": 8}, "--bits 8 --encoder-bits 8"),
    "4-bit, encoder too": ({"bits": 4, "encoder_bits": 4}, "--bits 4 --encoder-bits 4"),
    "4-bit decoder + 8-bit encoder": ({"bits": 4, "encoder_bits": 8}, "--bits 4 --encoder-bits 8"),
}
REFERENCE = "bf16"
AUDIO_SECONDS = (4.0, 7.5, 11.0)


@dataclass
class Row:
    recipe: str
    flags: str
    weight_bytes: int
    load_seconds: float
    peak_memory_bytes: int
    cosines: list[float] = field(default_factory=list)
    agreements: list[float] = field(default_factory=list)
    forced_agreements: list[float] = field(default_factory=list)

    @property
    def cosine_mean(self) -> float:
        return float(np.mean(self.cosines))

    @property
    def cosine_min(self) -> float:
        return float(np.min(self.cosines))

    @property
    def agreement(self) -> float:
        return float(np.mean(self.agreements))

    @property
    def forced_agreement(self) -> float:
        return float(np.mean(self.forced_agreements))


def test_signal(seconds: float, seed: int) -> np.ndarray:
    """Speech-like audio: noise bursts at a syllable rate over a tone whose pitch wanders like a voice."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    syllables = 0.5 + 0.5 * np.sin(2 * np.pi * rng.uniform(3.0, 5.0) * t + rng.uniform(0, 2 * np.pi))
    pitch = rng.uniform(120, 220) + 30 * np.sin(2 * np.pi * 0.4 * t)
    voice = np.sin(2 * np.pi * np.cumsum(pitch) / SAMPLE_RATE)
    return (0.3 * syllables * (0.6 * voice + 0.4 * rng.standard_normal(t.size))).astype(np.float32)


test_signal.__test__ = False  # a helper, not a test


def encode(asr: mlx_qwen3asr.ASRModel, wav: np.ndarray) -> tuple[mx.array, list[int]]:
    features = asr.net.audio_tower(
        encoder_batch([log_mel_spectrogram(wav)], asr.config.audio_config, asr.dtype)
    )
    return features, build_prompt_ids(asr.tokenizer, int(features.shape[0]))


def decode(asr: mlx_qwen3asr.ASRModel, wav: np.ndarray, steps: int) -> tuple[np.ndarray, list[int]]:
    """Prefill logits at the last prompt position and `steps` greedy ids (EOS not honoured)."""
    net: Qwen3ASR = asr.net
    features, prompt = encode(asr, wav)
    cache = net.make_cache()
    hidden = net.model(net.embed(mx.array([prompt], dtype=mx.int32), features), cache=cache)
    logits = net.logits(hidden[:, -1, :])
    first = np.array(logits[0].astype(mx.float32))
    ids: list[int] = []
    y = mx.argmax(logits, axis=-1)
    for _ in range(steps):
        ids.append(int(y.item()))
        hidden = net.model(net.model.embed_tokens(y[:, None]), cache=cache)
        y = mx.argmax(net.logits(hidden[:, -1, :]), axis=-1)
    return first, ids


def forced_ids(asr: mlx_qwen3asr.ASRModel, wav: np.ndarray, history: list[int]) -> list[int]:
    """The model's top-1 id at each step when fed `history` (the reference's greedy ids) instead of its own."""
    features, prompt = encode(asr, wav)
    ids = mx.array([prompt + history[:-1]], dtype=mx.int32)
    logits = asr.net(asr.net.embed(ids, features))[0, len(prompt) - 1 :]
    return np.array(mx.argmax(logits, axis=-1)).tolist()


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def timed_load(path: Path, dtype: str) -> tuple[float, int]:
    gc.collect()
    mx.clear_cache()
    mx.reset_peak_memory()
    start = time.perf_counter()
    asr = mlx_qwen3asr.load(path, dtype=dtype)
    seconds = time.perf_counter() - start
    peak = mx.get_peak_memory()
    del asr
    gc.collect()
    mx.clear_cache()
    return seconds, peak


def measure(
    src: Path | str,
    work: Path,
    recipes: list[str],
    audios: list[np.ndarray],
    steps: int,
    load_dtype: str,
    on_row: Callable[[list[Row]], None] = lambda rows: None,
) -> list[Row]:
    rows: list[Row] = []
    reference: list[tuple[np.ndarray, list[int]]] = []
    for name in [REFERENCE, *[r for r in recipes if r != REFERENCE]]:
        kwargs, flags = RECIPES[name]
        dst = work / name.replace(" ", "_").replace("+", "and")
        start = time.perf_counter()
        result = convert_checkpoint(src, dst, force=True, **kwargs)
        print(f"[{name}] converted in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
        seconds, peak = timed_load(dst, load_dtype)
        row = Row(name, flags, result.weight_bytes, seconds, peak)
        asr = mlx_qwen3asr.load(dst, dtype="float32")
        for i, wav in enumerate(audios):
            first, ids = decode(asr, wav, steps)
            if name == REFERENCE:
                reference.append((first, ids))
            ref_first, ref_ids = reference[i]
            row.cosines.append(cosine(first, ref_first))
            row.agreements.append(float(np.mean(np.array(ids) == np.array(ref_ids))))
            forced = forced_ids(asr, wav, ref_ids)
            row.forced_agreements.append(float(np.mean(np.array(forced) == np.array(ref_ids))))
        del asr
        gc.collect()
        mx.clear_cache()
        print(
            f"[{name}] {result.weight_bytes / 1e6:.0f} MB, load {seconds:.2f} s, peak {peak / 1e6:.0f} MB, "
            f"cosine {row.cosine_mean:.4f}, greedy agreement {row.agreement:.3f}, "
            f"teacher-forced top-1 agreement {row.forced_agreement:.3f}",
            file=sys.stderr,
            flush=True,
        )
        if name != REFERENCE:
            shutil.rmtree(dst, ignore_errors=True)  # keep the disk footprint to two checkpoints
        rows.append(row)
        on_row(rows)  # partial figures survive an interrupted run
    return rows


def markdown(rows: list[Row], steps: int, n_audios: int, load_dtype: str) -> str:
    lines = [
        f"| Recipe | `mlxasr-convert` flags | Size on disk | Load time ({load_dtype}) | Peak memory after load "
        f"| Logits cosine vs bf16 (mean / min of {n_audios}) | Greedy agreement (first {steps} ids) "
        "| Top-1 agreement, bf16 history |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.recipe} | `{r.flags}` | {r.weight_bytes / 1e6:,.0f} MB | {r.load_seconds:.2f} s "
            f"| {r.peak_memory_bytes / 1e6:,.0f} MB | {r.cosine_mean:.4f} / {r.cosine_min:.4f} | {r.agreement:.3f} "
            f"| {r.forced_agreement:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", default=None, help="checkpoint to convert (default: random-weight --preset)")
    ap.add_argument("--preset", default="0.6b", help="random-weight preset built when --src is not given")
    ap.add_argument("--recipes", nargs="+", choices=list(RECIPES), default=list(RECIPES))
    ap.add_argument("--audios", type=int, default=len(AUDIO_SECONDS), help="number of test signals")
    ap.add_argument("--steps", type=int, default=32, help="greedy steps compared")
    ap.add_argument("--load-dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--workdir", default=None, help="where conversions are written (default: a temp dir)")
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = ap.parse_args(argv)

    own_work = args.workdir is None
    work = Path(tempfile.mkdtemp(prefix="quant-table-")) if own_work else Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    seconds = [AUDIO_SECONDS[i % len(AUDIO_SECONDS)] + i // len(AUDIO_SECONDS) for i in range(args.audios)]
    audios = [test_signal(s, seed=i) for i, s in enumerate(seconds)]
    source = args.src or f"random-weight {args.preset} preset (tools/make_checkpoint.py, seed 0)"

    def save(rows: list[Row]) -> None:
        if not args.json:
            return
        payload = {
            "source": str(source),
            "audio_seconds": seconds,
            "steps": args.steps,
            "load_dtype": args.load_dtype,
            "device": str(mx.default_device()),
            "rows": [
                {
                    **asdict(r),
                    "cosine_mean": r.cosine_mean,
                    "cosine_min": r.cosine_min,
                    "greedy_agreement": r.agreement,
                    "teacher_forced_agreement": r.forced_agreement,
                }
                for r in rows
            ],
            "markdown": markdown(rows, args.steps, len(audios), args.load_dtype),
        }
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n")

    try:
        if args.src:
            src: Path | str = Path(args.src) if Path(args.src).exists() else args.src
        else:
            from tools.make_checkpoint import write_checkpoint

            start = time.perf_counter()
            src = write_checkpoint(work / f"random-{args.preset}", args.preset, seed=0)
            print(f"built random {args.preset} in {time.perf_counter() - start:.1f} s", file=sys.stderr)
        rows = measure(src, work, args.recipes, audios, args.steps, args.load_dtype, on_row=save)
    finally:
        if own_work:
            shutil.rmtree(work, ignore_errors=True)
    print(markdown(rows, args.steps, len(audios), args.load_dtype))
    return 0


if __name__ == "__main__":
    sys.exit(main())
