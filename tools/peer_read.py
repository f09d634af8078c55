"""Load a checkpoint in a peer MLX port and run it once: does that tool read what we (or others) wrote?

    peers-venv/bin/python tools/peer_read.py --peer moona3k|mlx-audio --model DIR --audio CLIP.wav

Prints one JSON object: the peer and its version, whether the checkpoint loaded and ran, the error if
not, the text (ASR: a transcript of at most --max-tokens new tokens; forced aligner: the words of
--text with their start and end times), and the number of quantized layers the peer built. Runs in
the bench-only peer environment (see tools/peers.py), never in the package's own.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# isort: off
# tools.peers first: the same CPU setup as the benchmarks (OpenBLAS loaded before mlx).
from tools import peers  # noqa: E402
import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402

# isort: on
import numpy as np  # noqa: E402

PACKAGES = {"moona3k": "mlx-qwen3-asr", "mlx-audio": "mlx-audio"}


def _quantized_layers(module: nn.Module) -> int:
    return sum(isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)) for _, m in module.named_modules())


def _is_aligner(model_dir: Path) -> bool:
    config = json.loads((model_dir / "config.json").read_text())
    thinker = config.get("thinker_config") or {}
    return thinker.get("model_type") == "qwen3_forced_aligner" or "classify_num" in thinker


def run_moona3k(model_dir: Path, audio: str, max_tokens: int, text: str) -> dict:
    import mlx_qwen3_asr
    from mlx_qwen3_asr.audio import load_audio
    from mlx_qwen3_asr.load_models import load_model

    load_dir, _ = peers._moona3k_model_dir(model_dir, [])
    if _is_aligner(model_dir):
        from mlx_qwen3_asr.forced_aligner import ForcedAligner

        aligner = ForcedAligner(str(load_dir), dtype=mx.float32)
        wav = np.asarray(load_audio(audio), dtype=np.float32)
        words = aligner.align(wav, text, "English")
        return {"words": [[w.text, round(w.start_time, 3), round(w.end_time, 3)] for w in words]}
    model, _ = load_model(str(load_dir), dtype=mx.float32)
    result = mlx_qwen3_asr.transcribe(audio, model=model, dtype=mx.float32, max_new_tokens=max_tokens)
    return {"text": result.text, "quantized_layers": _quantized_layers(model)}


def run_mlx_audio(model_dir: Path, audio: str, max_tokens: int, text: str) -> dict:
    from mlx_audio.stt.utils import load_model

    model = load_model(str(model_dir))
    if _is_aligner(model_dir):
        result = model.generate(audio, text=text, language="English")
        items = getattr(result, "items", None) or getattr(result, "words", None) or []
        words = [[w.text, round(float(w.start_time), 3), round(float(w.end_time), 3)] for w in items]
        return {"words": words, "quantized_layers": _quantized_layers(model._model)}
    out = model.generate(audio, max_tokens=max_tokens, verbose=False)
    return {"text": out.text, "quantized_layers": _quantized_layers(model._model)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", choices=sorted(PACKAGES), required=True)
    ap.add_argument("--model", required=True, help="checkpoint directory")
    ap.add_argument("--audio", required=True, help="a short 16 kHz clip")
    ap.add_argument("--max-tokens", type=int, default=24, help="new tokens for an ASR checkpoint")
    ap.add_argument("--text", default="hello there general kenobi", help="transcript for an aligner")
    args = ap.parse_args(argv)
    report = {"peer": args.peer, "version": metadata.version(PACKAGES[args.peer]), "model": args.model}
    run = run_moona3k if args.peer == "moona3k" else run_mlx_audio
    try:
        report.update(run(Path(args.model), args.audio, args.max_tokens, args.text), ok=True)
    except Exception as e:
        last = traceback.extract_tb(e.__traceback__)[-1]
        report.update(
            ok=False, error=f"{type(e).__name__}: {e}"[:400], where=f"{last.filename}:{last.lineno}"
        )
    print(json.dumps(report, ensure_ascii=False))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
