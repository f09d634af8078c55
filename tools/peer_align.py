"""Time moona3k's mlx-qwen3-asr forced aligner on given clips and texts (equal work for tools/bench.py).

    peers-venv/bin/python tools/peer_align.py --model ALIGNER_DIR --texts texts.json CLIP1.wav [CLIP2.wav ...]

Each clip is aligned with its text (English), one call per clip as the peer works; the first clip is
aligned once before timing (warm-up). Prints one JSON object: version, seconds, words aligned.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# isort: off
# tools.peers first: the same CPU setup as the benchmarks (OpenBLAS loaded before mlx).
from tools import peers  # noqa: E402
import mlx.core as mx  # noqa: E402

# isort: on
import numpy as np  # noqa: E402
import soundfile as sf  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--texts", required=True, help="JSON list of texts, one per clip")
    ap.add_argument("clips", nargs="+")
    args = ap.parse_args(argv)
    from mlx_qwen3_asr.forced_aligner import ForcedAligner

    load_dir, _ = peers._moona3k_model_dir(Path(args.model), [])
    texts = json.loads(Path(args.texts).read_text())
    wavs = [np.asarray(sf.read(c, dtype="float32")[0]) for c in args.clips]
    aligner = ForcedAligner(str(load_dir), dtype=mx.float32)
    aligner.align(wavs[0], texts[0], "English")  # warm-up: loads the model
    start = time.perf_counter()
    words = sum(len(aligner.align(w, t, "English")) for w, t in zip(wavs, texts))
    seconds = time.perf_counter() - start
    print(
        json.dumps(
            {
                "peer": "moona3k",
                "version": metadata.version("mlx-qwen3-asr"),
                "seconds": seconds,
                "words": words,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
