"""Memory on Metal, as mlx-lm handles it: the wired limit raised while a model generates and set back
after, MLX's buffer cache released at joins and every few hundred steps, and the batch's memory budget
counting that cache. Metal is not here: its calls are checked through seams."""

from __future__ import annotations

import mlx.core as mx
import pytest
from reference import test_signal

import mlx_qwen3asr
from mlx_qwen3asr.model import generate
from mlx_qwen3asr.pipeline import memory
from mlx_qwen3asr.pipeline.engine import Engine


@pytest.fixture(scope="module")
def model(checkpoints):
    return mlx_qwen3asr.load(checkpoints("tiny"))


@pytest.fixture
def metal(monkeypatch):
    """Metal as far as the wired limit goes: the calls recorded, the limit tracked."""
    state = {"limit": 7, "calls": [], "during": []}

    def set_wired_limit(value):
        old, state["limit"] = state["limit"], value
        state["calls"].append(value)
        return old

    monkeypatch.setattr(memory, "metal_available", lambda: True)
    monkeypatch.setattr(mx, "set_wired_limit", set_wired_limit)
    real_info = mx.device_info
    monkeypatch.setattr(
        mx, "device_info", lambda: {**real_info(), "max_recommended_working_set_size": 12 * 2**30}
    )
    return state


def test_the_wired_limit_is_raised_while_transcribing_and_set_back_after(model, metal, monkeypatch):
    real_step = generate.DecodeBatch.step

    def step(self):
        metal["during"].append(metal["limit"])
        return real_step(self)

    monkeypatch.setattr(generate.DecodeBatch, "step", step)
    result = mlx_qwen3asr.transcribe(model, (test_signal(2.0, seed=1), 16000), vad=False)
    assert result.segments
    assert metal["during"] and set(metal["during"]) == {12 * 2**30}
    assert metal["calls"] == [12 * 2**30, 7] and metal["limit"] == 7


def test_the_wired_limit_is_set_back_when_generation_fails(model, metal, monkeypatch):
    def broken(self):
        raise RuntimeError("injected")

    monkeypatch.setattr(generate.DecodeBatch, "step", broken)
    with pytest.raises(RuntimeError, match="injected"):
        with memory.wired_limit(model):
            generate.DecodeBatch(model.net, set()).step()
    assert metal["calls"] == [12 * 2**30, 7] and metal["limit"] == 7


def test_weights_larger_than_the_working_set_are_not_wired(model, metal, monkeypatch):
    monkeypatch.setattr(mx, "device_info", lambda: {"max_recommended_working_set_size": 1000})
    with memory.wired_limit(model):
        pass
    assert metal["calls"] == []


def test_an_engine_holds_the_wired_limit_while_it_runs(model, metal):
    engine = Engine(model, vad=False)
    try:
        job = engine.submit(test_signal(1.5, seed=2))
        job.result(timeout=120)
        assert metal["limit"] == 12 * 2**30
    finally:
        engine.close()
    assert metal["calls"] == [12 * 2**30, 7] and metal["limit"] == 7


def test_nothing_is_wired_without_metal(model, monkeypatch):
    calls = []
    monkeypatch.setattr(mx, "set_wired_limit", lambda value: calls.append(value) or 0)
    assert not memory.metal_available()  # this machine: MLX on its CPU
    mlx_qwen3asr.transcribe(model, (test_signal(1.0, seed=3), 16000), vad=False)
    assert calls == []


def test_the_buffer_cache_is_released_at_joins_and_every_few_hundred_steps(model, monkeypatch):
    cleared = []
    monkeypatch.setattr(mx, "clear_cache", lambda: cleared.append(1))
    monkeypatch.setattr("mlx_qwen3asr.model.batch.CLEAR_CACHE_EVERY", 4)
    monkeypatch.setattr("mlx_qwen3asr.model.batch.LOOP_CHECK_EVERY", 10**9)
    feats = mx.zeros((0, model.config.text_config.hidden_size))
    batch = generate.DecodeBatch(model.net, set())
    batch.add([[1, 2, 3], [4, 5]], [feats, feats], [13, 13], ["a", "b"])
    joined = len(cleared)
    assert joined >= 2  # after the prefill group and after the join
    steps = 0
    while len(batch):
        batch.step()
        steps += 1
    assert steps == 13 and len(cleared) - joined == steps // 4


def test_the_memory_budget_counts_mlx_s_buffer_cache(monkeypatch):
    monkeypatch.setattr(mx, "device_info", lambda: {"max_recommended_working_set_size": 10_000})
    monkeypatch.setattr(mx, "get_active_memory", lambda: 3_000)
    monkeypatch.setattr(mx, "get_cache_memory", lambda: 4_000)
    assert memory.available_memory() == 3_000
    monkeypatch.setattr(mx, "get_cache_memory", lambda: 9_000)
    assert memory.available_memory() == 0


def test_mlxasr_live_holds_the_wired_limit_for_its_session(checkpoints, metal, monkeypatch, tmp_path):
    import soundfile as sf

    from mlx_qwen3asr.cli import live
    from mlx_qwen3asr.pipeline import streaming

    real_feed = streaming.StreamingTranscriber.feed

    def feed(self, samples):
        metal["during"].append(metal["limit"])
        return real_feed(self, samples)

    monkeypatch.setattr(streaming.StreamingTranscriber, "feed", feed)
    wav = tmp_path / "talk.wav"
    sf.write(wav, test_signal(3.0, seed=5), 16000)
    code = live.main(
        [
            "--input",
            str(wav),
            "--model",
            str(checkpoints("tiny")),
            "--no-vad",
            "--txt",
            "-o",
            str(tmp_path),
            "-q",
        ]
    )
    assert code == 0 and (tmp_path / "talk.txt").exists()
    assert metal["during"] and set(metal["during"]) == {12 * 2**30}
    assert metal["calls"] == [12 * 2**30, 7] and metal["limit"] == 7
