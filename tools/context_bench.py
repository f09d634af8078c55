"""Prefill with a long context: computed once per run (shared prefix) against once per segment.

    python tools/context_bench.py --preset 0.6b --context-tokens 4096 --files 10 --seconds 20

The same segments (one per file) decode in batches twice: once the way the scheduler does it, the
context's keys and values computed once and shared by every row, and once with each row's whole
prompt (context included) prefilled on its own, as before the shared prefix. Both decode a few
tokens per row; the ids must be identical. Prints the prefill times, the ratio and peak memory.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# isort: off
# mlx_qwen3asr goes first: it preloads OpenBLAS, which MLX's CPU matmul only picks up if loaded before it.
import mlx_qwen3asr  # noqa: E402
import mlx.core as mx  # noqa: E402

# isort: on
from mlx_qwen3asr.audio.features import log_mel_spectrogram  # noqa: E402
from mlx_qwen3asr.model.generate import greedy_generate_batch, prefill_prefix  # noqa: E402
from mlx_qwen3asr.pipeline.encoding import encode_segments  # noqa: E402
from mlx_qwen3asr.text.prompt import prompt_prefix_ids, prompt_suffix_ids  # noqa: E402
from tools.layout_table import clip  # noqa: E402
from tools.make_checkpoint import write_checkpoint  # noqa: E402
from tools.prompts import build_prompt_ids  # noqa: E402

GLOSSARY = (
    "Speakers: Dr. Anna Müller (chair), Wang Xiaoming, Priya Raghunathan, Olumide Adeyemi. Terms: "
    "Qwen3-ASR, MLX, Metal, unified memory, KV cache, quantization, Kubernetes, PostgreSQL, OAuth. "
)


def context_of(tokenizer, tokens: int) -> str:
    ids = tokenizer.encode(GLOSSARY * (tokens // 30 + 2))[:tokens]
    return tokenizer.decode(ids)


def timed_batches(model, prompts, features, steps, batch, prefix=None):
    """Decode in batches of `batch` rows; returns (ids, prefill seconds, total seconds)."""
    ids, prefill, start = [], 0.0, time.perf_counter()
    for i in range(0, len(prompts), batch):
        t0 = time.perf_counter()
        first: list[float] = []
        mark = first.append
        out = greedy_generate_batch(
            model.net,
            prompts[i : i + batch],
            features[i : i + batch],
            [steps] * len(prompts[i : i + batch]),
            frozenset(),
            on_first_tokens=lambda mark=mark: mark(time.perf_counter()),
            prefix=prefix,
        )
        prefill += first[0] - t0
        ids.extend(g.tokens for g in out)
    return ids, prefill, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="0.6b")
    ap.add_argument("--model", default=None, help="a checkpoint folder instead of a random-weight preset")
    ap.add_argument("--context-tokens", type=int, default=4096)
    ap.add_argument("--files", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--steps", type=int, default=8, help="new tokens per segment")
    ap.add_argument("--batch", type=int, default=10, help="rows per batch")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory() as work:
        path = Path(args.model) if args.model else write_checkpoint(Path(work) / args.preset, args.preset)
        model = mlx_qwen3asr.load(path, dtype="float32")
        tok = model.tokenizer
        context = context_of(tok, args.context_tokens)
        mels = [log_mel_spectrogram(clip(args.seconds, seed=i)) for i in range(args.files)]
        features = encode_segments(model, mels)

        mx.reset_peak_memory()
        t0 = time.perf_counter()
        prefix_ids = prompt_prefix_ids(tok, context)
        prefix = prefill_prefix(model.net, prefix_ids)
        prefix_s = time.perf_counter() - t0
        suffixes = [prompt_suffix_ids(tok, int(f.shape[0])) for f in features]
        shared_ids, shared_prefill, shared_total = timed_batches(
            model, suffixes, features, args.steps, args.batch, prefix
        )
        shared_peak = mx.get_peak_memory()

        mx.reset_peak_memory()
        whole = [build_prompt_ids(tok, int(f.shape[0]), context=context) for f in features]
        whole_ids, whole_prefill, whole_total = timed_batches(model, whole, features, args.steps, args.batch)
        whole_peak = mx.get_peak_memory()

    report = {
        "model": str(args.model or f"random {args.preset}"),
        "context_tokens": len(prefix_ids) - len(prompt_prefix_ids(tok, "")),
        "segments": args.files,
        "segment_seconds": args.seconds,
        "batch": args.batch,
        "shared": {
            "prefix_s": prefix_s,
            "prefill_s": prefix_s + shared_prefill,
            "total_s": prefix_s + shared_total,
        },
        "per_segment": {"prefill_s": whole_prefill, "total_s": whole_total},
        "prefill_speedup": whole_prefill / (prefix_s + shared_prefill),
        "ids_identical": shared_ids == whole_ids,
        "peak_memory_mb": {"shared": shared_peak / 2**20, "per_segment": whole_peak / 2**20},
    }
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["ids_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
