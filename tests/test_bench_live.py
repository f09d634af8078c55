"""tools/bench.py --mode live on the tiny preset: the report's structure and what must hold whatever the
timings (nothing here is timed)."""

from __future__ import annotations

import json

import pytest

from mlx_qwen3asr.model import batch as decoding
from tools import bench, live_bench


@pytest.fixture(scope="module")
def report(checkpoints, tmp_path_factory):
    out = tmp_path_factory.mktemp("live") / "live.json"
    args = ["--mode", "live", "--model", str(checkpoints("tiny")), "--live-seconds", "19"]
    args += ["--max-window-seconds", "12", "--unbounded-seconds", "7", "--json", str(out)]
    assert bench.main(args) == 0
    return json.loads(out.read_text())


def test_the_live_report_has_both_windows_and_a_table(report):
    assert report["mode"] == "live" and report["chunk_seconds"] == 2.0
    assert [(r["system"], r["window"]) for r in report["runs"]] == [
        ("mlx_qwen3asr", "12 s"),
        ("mlx_qwen3asr", "unbounded"),
    ]
    assert "| mlx_qwen3asr | 12 s | 19 s |" in report["markdown"]
    assert "| mlx_qwen3asr | unbounded | 1 |" in report["markdown"]
    assert decoding.LOOP_CHECK_EVERY < 1000  # the loop stop is back on after the run


def test_every_chunk_is_a_step_and_the_virtual_clock_never_runs_ahead_of_the_audio(report):
    bounded, unbounded = report["runs"]
    for run, seconds in ((bounded, 19.0), (unbounded, 7.0)):
        log = [live_bench.Step(**s) for s in run["step_log"]]
        assert run["audio_s"] == pytest.approx(seconds)
        assert run["steps"] == len(log) == int(seconds // 2) + 1  # full chunks, then finish with the tail
        assert [s.final for s in log] == [False] * (len(log) - 1) + [True]
        assert all(s.tokens > 0 for s in log)  # EOS off: every decode writes its budget
        for s, (start, end) in zip(log, live_bench.clock(log)):
            assert start >= s.audio_end_s and end == pytest.approx(start + s.wall_s)
        assert run["compute_per_audio_s"] == pytest.approx(sum(s.wall_s for s in log) / seconds)
        assert run["partial_latency_s"]["n"] == len(log)  # the tail is a chunk too
        assert 0 < run["partial_latency_s"]["p50"] <= run["partial_latency_s"]["p95"]
        assert log[-1].committed_until_s == pytest.approx(seconds)
        committed = [s.committed_until_s for s in log]
        assert committed == sorted(committed)
    # The bounded window commits mid-stream and never encodes more than window + chunk (a window of at
    # least the commit search and the unfixed chunks: 8 + 2 x 2 s); the unbounded one re-encodes
    # everything heard so far and commits only at the end.
    assert bounded["commit_latency_s"]["n"] > 0 and bounded["max_encoded_s"] <= 12 + 2
    assert bounded["commits_before_end"] > 0
    assert unbounded["commit_latency_s"]["n"] == 0 and unbounded["commits_before_end"] == 0
    assert unbounded["chunks_committed_at_end"] == unbounded["steps"]
    assert [s["encoded_samples"] for s in unbounded["step_log"][:3]] == [32000, 64000, 96000]


def test_decode_budget_is_speech_rate_less_the_prefix():
    assert live_bench.decode_budget(4.0, 2.0, 0) == 8
    assert live_bench.decode_budget(4.0, 10.0, 27) == 13
    assert live_bench.decode_budget(4.0, 1.0, 50) == 1


def test_the_report_counts_drafted_tokens(report):
    for run in report["runs"]:
        assert run["drafted_tokens"] == sum(s["drafted"] for s in run["step_log"])
        assert all(0 <= s["drafted"] <= s["tokens"] for s in run["step_log"])
    assert report["runs"][0]["drafted_tokens"] > 0  # the rolled-back tokens come back as drafts


def test_the_bench_checkpoint_writes_words(checkpoints, tmp_path):
    """Random weights pick pieces of multi-byte characters; the copy the live bench runs writes words
    (a space and lowercase letters), and the prompt's own tokens keep their embeddings."""
    import re

    import mlx.core as mx

    import mlx_qwen3asr
    from mlx_qwen3asr.model.generate import greedy_generate

    source = checkpoints("tiny")
    original = mlx_qwen3asr.load(str(source))
    keep = live_bench.prompt_tokens(original, "English")
    wordy = mlx_qwen3asr.load(str(live_bench.wordy_checkpoint(source, tmp_path / "wordy", keep)))
    features = mx.random.normal((40, original.config.audio_config.output_dim), key=mx.random.key(0))
    from mlx_qwen3asr.pipeline.streaming import StreamingTranscriber

    rest = StreamingTranscriber(original, language="English")
    prompt = rest.prompt_ids(40, "")
    word = re.compile("^\u0120[a-z]{2,}$")

    def written(model):
        tokens = greedy_generate(model.net, prompt, features, 40, frozenset()).tokens
        return [model.tokenizer.id_to_token(t) for t in tokens]

    assert all(word.match(t) for t in written(wordy))
    assert not all(word.match(t) for t in written(original))
    weights = mx.load(str(tmp_path / "wordy" / "model.safetensors"))
    [embed] = [w for name, w in weights.items() if name.endswith("embed_tokens.weight")]
    assert all(bool(mx.any(embed[i] != 0)) for i in sorted(keep))
