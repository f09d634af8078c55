"""Peak memory of `mlxasr` against the length of one file: it should not grow with the audio.

    python tools/memory_bench.py --minutes 10 120 600 --preset tiny --json memory.json

For each length a synthetic speech-like WAV (16 kHz, 16-bit, syllable bursts and pauses) is written,
then `mlxasr FILE --srt --json` runs on it in a fresh process with a random-weight checkpoint; the
table gives the process's peak resident memory (ru_maxrss of the child), its wall time and the size
of the outputs. Random weights never emit EOS, so every segment decodes its whole token budget.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.make_checkpoint import write_checkpoint  # noqa: E402

RATE = 16000


def write_speechlike(path: Path, seconds: float, seed: int = 0) -> None:
    """Minute by minute: noise under a syllable-rate envelope, with a pause every few seconds."""
    rng = np.random.default_rng(seed)
    with sf.SoundFile(path, "w", RATE, 1, subtype="PCM_16") as out:
        done = 0
        while done < seconds * RATE:
            n = int(min(60 * RATE, seconds * RATE - done))
            t = (done + np.arange(n)) / RATE
            envelope = (0.5 + 0.5 * np.sin(2 * np.pi * 4.0 * t)) * (np.sin(2 * np.pi * 0.15 * t) > -0.6)
            tone = np.sin(2 * np.pi * (180 + 40 * np.sin(2 * np.pi * 0.5 * t)) * t)
            out.write((0.3 * envelope * (0.6 * tone + 0.4 * rng.standard_normal(n))).astype(np.float32))
            done += n


def measure(model: Path, audio: Path, out_dir: Path) -> dict:
    cmd = [sys.executable, "-m", "mlx_qwen3asr.cli.main", str(audio), "--srt", "--json", "-q"]
    cmd += ["--model", str(model), "-o", str(out_dir), "--overwrite"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"mlxasr failed ({proc.returncode}): {proc.stderr[-2000:]}")
    outputs = sum(p.stat().st_size for p in out_dir.rglob("*") if p.is_file())
    return {"peak_rss_mb": usage.ru_maxrss / 1024, "wall_s": wall, "output_bytes": outputs}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, nargs="+", default=[10, 120, 600])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--model", default=None, help="a checkpoint folder instead of a random-weight preset")
    ap.add_argument("--work", default=None, help="folder for the audio files (default: a temporary one)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(dir=args.work) as work:
        work = Path(work)
        model = Path(args.model) if args.model else write_checkpoint(work / args.preset, args.preset)
        for minutes in args.minutes:
            audio = work / f"{minutes:g}min.wav"
            write_speechlike(audio, minutes * 60)
            # Each measurement in its own child so ru_maxrss is that run's alone.
            code = (
                "import json, sys; from pathlib import Path; sys.path.insert(0, sys.argv[4]);"
                "from tools.memory_bench import measure;"
                "print(json.dumps(measure(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))))"
            )
            out_dir = work / f"out-{minutes:g}"
            child = subprocess.run(
                [sys.executable, "-c", code, str(model), str(audio), str(out_dir), str(REPO)],
                capture_output=True,
                text=True,
                check=True,
            )
            row = {"minutes": minutes, **json.loads(child.stdout.strip().splitlines()[-1])}
            rows.append(row)
            print(
                f"{minutes:g} min: peak RSS {row['peak_rss_mb']:.0f} MB, {row['wall_s']:.1f} s, "
                f"outputs {row['output_bytes'] / 1e6:.1f} MB",
                flush=True,
            )
            audio.unlink()
    base = rows[0]["peak_rss_mb"]
    print("| audio | peak RSS | against the first | wall time |")
    print("| --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['minutes']:g} min | {r['peak_rss_mb']:.0f} MB | {r['peak_rss_mb'] - base:+.0f} MB | {r['wall_s']:.0f} s |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
