"""What 8-bit and 4-bit conversions do to the forced aligner: size, load time, and words that move.

    python tools/aligner_table.py                   # the random-weight aligner preset (real shapes)
    python tools/aligner_table.py --src Qwen/Qwen3-ForcedAligner-0.6B

The aligner is converted unquantized (bf16), 8-bit and 4-bit (the encoder left unquantized, as by
default); each conversion aligns the same texts in the same clips, and every word's start and end
class (the head's argmax at its two timestamp slots, before the repair and before times are clamped
to the clip) is compared with the bf16 conversion's: how many words move by more than one 80 ms
timestamp bin, and the mean shift. Raw classes are compared because a random-weight head often
points past the end of the clip, where every clamped time would be equal. On random weights this
measures how far quantization moves the timestamps, not how good they are.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

# isort: off
# mlx_qwen3asr goes first: it preloads OpenBLAS, which MLX's CPU matmul only picks up if loaded before it.
import mlx_qwen3asr  # noqa: E402
import mlx.core as mx  # noqa: E402

# isort: on
import numpy as np  # noqa: E402

from mlx_qwen3asr.audio.features import log_mel_spectrogram  # noqa: E402
from mlx_qwen3asr.checkpoints.convert import convert_checkpoint  # noqa: E402
from mlx_qwen3asr.pipeline.alignment import aligner_prompt, timestamp_classes  # noqa: E402
from mlx_qwen3asr.pipeline.encoding import encode_segments  # noqa: E402
from mlx_qwen3asr.text.words import split_items  # noqa: E402
from tools.layout_table import clip  # noqa: E402
from tools.make_checkpoint import write_checkpoint  # noqa: E402

RECIPES = {"bf16": {}, "8-bit": {"bits": 8}, "4-bit": {"bits": 4}}
TEXT = (
    "So the first thing I want to talk about today is the budget for next year. We looked at every "
    "department, and most of them asked for more than last time."
)


def raw_times(aligner: mlx_qwen3asr.ASRModel, clips: list[np.ndarray]) -> np.ndarray:
    """(words, 2): each word's start and end in seconds as the head's argmax classes give them."""
    items = [i.text for i in split_items(TEXT, "English")]
    features = encode_segments(aligner, [log_mel_spectrogram(c) for c in clips])
    prompts = [aligner_prompt(aligner, int(f.shape[0]), items) for f in features]
    classes = np.concatenate(timestamp_classes(aligner, prompts, features))
    step_s = float(aligner.config.timestamp_segment_time or 80) / 1000
    return classes.reshape(-1, 2) * step_s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--src", default=None, help="aligner checkpoint (default: the random-weight aligner preset)"
    )
    ap.add_argument("--preset", default="aligner", help="random-weight preset when --src is not given")
    ap.add_argument("--clips", type=float, nargs="+", default=[8.0, 20.0, 30.0], help="clip lengths (s)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    rows, times = [], {}
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        src = Path(args.src) if args.src else write_checkpoint(work / "src", args.preset)
        clips = [clip(seconds, seed=i) for i, seconds in enumerate(args.clips)]
        for name, options in RECIPES.items():
            path = convert_checkpoint(src, work / name, **options).path
            size = sum(p.stat().st_size for p in path.glob("*.safetensors"))
            start = time.perf_counter()
            aligner = mlx_qwen3asr.load(path, dtype="float32")
            load_s = time.perf_counter() - start
            start = time.perf_counter()
            times[name] = raw_times(aligner, clips)
            align_s = time.perf_counter() - start
            rows.append({"recipe": name, "size_mb": size / 1e6, "load_s": load_s, "align_s": align_s})
            del aligner
            gc.collect()
            mx.clear_cache()
    reference = times["bf16"]
    print(f"{len(reference)} words in {len(args.clips)} clips ({', '.join(f'{s:g} s' for s in args.clips)})")
    print("| recipe | size on disk | load time | words moved > 80 ms (start or end class) | mean shift |")
    print("| --- | --- | --- | --- | --- |")
    for row in rows:
        shift = np.abs(times[row["recipe"]] - reference)
        row["moved"] = int((shift.max(axis=1) > 0.08 + 1e-9).sum())
        row["words"] = len(reference)
        row["mean_shift_s"] = float(shift.mean())
        print(
            f"| {row['recipe']} | {row['size_mb']:.0f} MB | {row['load_s']:.2f} s | {row['moved']} of "
            f"{row['words']} | {1000 * row['mean_shift_s']:.0f} ms |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
