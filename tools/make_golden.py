"""Regenerate the parity tests' golden data (tests/golden/) from the official implementation.

    python tools/make_golden.py                    # every real-shape preset: 0.6b and aligner
    python tools/make_golden.py --preset aligner

For each real-shape case that tests/test_parity.py and tests/test_align.py run (tests/golden.py's
`cases`), this runs the official model (tests/reference.py, torch float32) on the random-weight
checkpoint that the tests use (tools/make_checkpoint.py, built or found in the tests' cache as
tests/conftest.py does), checks that what it keeps rebuilds the official result (the logits recomputed
from the kept LM-head inputs: cosine > 0.9999999 and max-abs within 1e-5 of their scale, every row; the
float16 encoder output: cosine > 0.9999999), and writes one compressed .npz a case under
tests/golden/<preset>/, replacing the preset's old files. tests/golden.py says what a file records and
when the tests use it. A few minutes on two CPU cores, mostly the 0.6b greedy runs and the 90 s
alignment.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for path in (REPO, REPO / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import mlx_qwen3asr  # noqa: E402,F401  (first, as the tests import it: it sets up MLX's CPU backend)


def main(argv: list[str] | None = None) -> int:
    import cached
    import golden
    from reference import OfficialAligner, OfficialReference

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=golden.PRESETS, action="append", help="default: all")
    parser.add_argument("-o", "--out", type=Path, default=golden.GOLDEN, help="default: tests/golden")
    args = parser.parse_args(argv)
    presets = tuple(args.preset or golden.PRESETS)

    total = 0
    for preset in presets:
        checkpoint = cached.checkpoint(preset)
        started = time.perf_counter()
        weights = golden.checkpoint_hash(checkpoint)
        print(f"{preset}: {checkpoint} (hash {weights}, {time.perf_counter() - started:.1f} s)", flush=True)
        made = []
        refs: dict = {}  # one official model a preset (references without golden data: all live)
        for case in golden.cases((preset,)):
            kind = OfficialAligner if case["kind"] == "align" else OfficialReference
            ref = refs.setdefault(kind, kind(checkpoint))
            started = time.perf_counter()
            meta, arrays, report = golden.make(ref, case, weights)
            made.append((case, meta, arrays))
            for line in report:
                print(f"  {line}", flush=True)
            print(f"  {preset} {case['name']}: {time.perf_counter() - started:.1f} s", flush=True)
        folder = args.out / preset
        for old in folder.glob("*.npz"):
            old.unlink()
        for case, meta, arrays in made:
            path = folder / f"{case['name']}.npz"
            golden.write(path, meta, arrays)
            total += path.stat().st_size
            print(
                f"wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path} "
                f"({path.stat().st_size / 1e6:.2f} MB)"
            )
    print(f"{total / 1e6:.2f} MB written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
