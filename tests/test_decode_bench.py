"""tools/decode_bench.py: runs on the tiny preset and reports both systems' step times for each row count."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
ROWS = (1, 2)
STEPS = 3
WEIGHTS = ("bfloat16", "4bit")


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("decode-bench") / "report.json"
    command = [
        sys.executable,
        str(REPO_ROOT / "tools" / "decode_bench.py"),
        "--preset", "tiny",
        "--quantize", "none,4",
        "--rows", ",".join(map(str, ROWS)),
        "--steps", str(STEPS),
        "--warmup", "2",
        "--profile-rows", "1,2",
        "--profile-steps", "1",
        "--json", str(out),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"decode_bench failed:\n{done.stdout}\n{done.stderr}"
    print(done.stdout)
    return json.loads(out.read_text(encoding="utf-8"))


def positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def check_side(side: dict, rows: int) -> None:
    assert positive(side["ms_per_step"])
    assert positive(side["tokens_per_s"])
    assert side["tokens_per_s"] == pytest.approx(rows * 1000.0 / side["ms_per_step"])
    assert len(side["step_ms"]) == STEPS and all(positive(x) for x in side["step_ms"])


def test_our_step_times_for_every_row_count(report):
    assert report["versions"]["mlx"]
    assert report["device"]["default_device"]
    assert [(c["preset"], c["weights"]) for c in report["configs"]] == [("tiny", w) for w in WEIGHTS]
    for config in report["configs"]:
        assert [entry["rows"] for entry in config["rows"]] == list(ROWS)
        for entry in config["rows"]:
            check_side(entry["ours"], entry["rows"])
            profile = entry["ours"]["profile"]
            for key in ("step_ms", "build_ms", "host_only_ms", "graph_build_ms", "graph_eval_ms"):
                assert positive(profile[key]), key
            assert profile["graph"]["nodes"] > 0
            # The same step built op by op: the same tokens, and more primitives than the compiled
            # step, whose element-wise runs are fused; a trace for the batch's one shape.
            check_side(entry["eager"], entry["rows"])
            assert entry["compiled_eager_agree"][0] == entry["compiled_eager_agree"][1] > 0
            assert entry["eager"]["profile"]["graph"]["nodes"] > profile["graph"]["nodes"]
            assert entry["ours"]["traces"] <= 1 and "compiled" in entry["ours"]["loop"]


def test_mlx_lm_step_times_for_every_row_count(report):
    if not report["mlx_lm"]["available"]:
        reason = f"mlx-lm half skipped: mlx_lm is not importable ({report['mlx_lm']['error']})"
        print(reason)
        pytest.skip(reason)
    assert report["versions"]["mlx_lm"]
    for config in report["configs"]:
        # mlx-lm's model holds our decoder's own weights (quantized on the same layers for 4-bit).
        assert config["mlx_lm_model"]["weights"] == "ours (shared arrays)"
        for entry in config["rows"]:
            rows = entry["rows"]
            check_side(entry["mlx_lm"], rows)
            expected = "generate_step" if rows == 1 else "BatchGenerator"
            assert (
                entry["mlx_lm"]["loop"].endswith(expected) or "make_prompt_cache" in entry["mlx_lm"]["loop"]
            )
            assert positive(entry["ratio_ours_over_mlx_lm"])
            agree, total = entry["tokens_agree"]
            assert total == STEPS + 2 and 0 <= agree <= total
            profile = entry["mlx_lm"]["profile"]
            for key in ("step_ms", "build_ms", "host_only_ms", "graph_build_ms", "graph_eval_ms"):
                assert positive(profile[key]), key
            assert profile["graph"]["nodes"] > 0
