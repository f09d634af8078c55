"""The compiled decoding step (model/step.py): the eager step's ids, a bounded number of traces however
long the run, and the eager step where MLX cannot compile."""

from __future__ import annotations

import logging
import os

import mlx.core as mx
import numpy as np
import pytest

import mlx_qwen3asr
from mlx_qwen3asr.model import batch as decoding
from mlx_qwen3asr.model import step
from mlx_qwen3asr.model.cache import KVCache
from mlx_qwen3asr.model.generate import HeaderIds, prefill_prefix


@pytest.fixture(scope="module")
def model(checkpoints):
    return mlx_qwen3asr.load(checkpoints("tiny"), dtype="float32")


@pytest.fixture
def compiled(monkeypatch):
    """Switch the compiled step on or off for this test."""

    def switch(on: bool) -> None:
        monkeypatch.setenv(step.ENV, "1" if on else "0")

    return switch


def prompts(count: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1000, 150000, int(rng.integers(3, 40))).tolist() for _ in range(count)]


def run_batch(model, plan, *, prefix_ids=None, keep_logits=False):
    """Rows joining a running batch as `plan` says: {step: [(key, prompt, budget), ...]}; every step's
    row count and cache capacity, and each row's Generation."""
    net = model.net
    header = HeaderIds.from_tokenizer(model.tokenizer)
    prefix = prefill_prefix(net, prefix_ids) if prefix_ids else None
    batch = decoding.DecodeBatch(net, frozenset(), prefix=prefix, keep_logits=keep_logits, header=header)
    hidden = net.config.text_config.hidden_size
    results, shapes, at = {}, [], 0
    last = max(plan)
    while at <= last or len(batch):
        for key, prompt, budget in plan.get(at, []):
            results.update(batch.add([prompt], [mx.zeros((0, hidden))], [budget], [key]))
        if len(batch):
            first = batch.cache[0]
            capacity = first.keys.shape[2]
            span = step.attended(first.prefix_len + first.offset + 1, capacity)
            shapes.append((len(batch), capacity, span))
            results.update(batch.step())
        at += 1
    return results, shapes


def plan_of(seed: int, joins: int, every: int) -> dict:
    rng = np.random.default_rng(seed)
    plan: dict = {}
    for j in range(joins):
        (prompt,) = prompts(1, seed * 1000 + j)
        plan.setdefault(j * every, []).append((j, prompt, int(rng.integers(2, 40))))
    return plan


def test_the_compiled_step_gives_the_eager_ids_scores_and_logits(model, compiled, monkeypatch):
    """Rows of different lengths after a shared prompt start, joining while others run and leaving at
    different steps: every row's tokens, log-probabilities and logits are the eager step's."""
    monkeypatch.setattr(decoding, "LOOP_CHECK_EVERY", 10**9)
    plan = plan_of(seed=1, joins=7, every=5)
    header = HeaderIds.from_tokenizer(model.tokenizer)
    plan[0].append(("forced", prompts(1, 77)[0] + [header.turn, header.language], 12))
    start = prompts(1, 99)[0]
    before = step.Traces.count
    compiled(False)
    eager, _ = run_batch(model, plan, prefix_ids=start, keep_logits=True)
    assert step.Traces.count == before
    compiled(True)
    fast, shapes = run_batch(model, plan, prefix_ids=start, keep_logits=True)
    assert step.Traces.count > before  # it did run compiled
    assert set(fast) == set(eager) and len(eager) == 8
    assert len({rows for rows, *_ in shapes}) > 2  # rows joined and left
    for key, gen in eager.items():
        other = fast[key]
        assert other.tokens == gen.tokens and other.truncated == gen.truncated
        assert np.allclose(other.logprobs, gen.logprobs, atol=1e-5)
        assert len(other.logits) == len(gen.logits)
        for a, b in zip(other.logits, gen.logits):
            assert np.allclose(np.array(a), np.array(b), atol=1e-4)
        if key == "forced":
            assert other.no_speech_prob == pytest.approx(gen.no_speech_prob, rel=1e-4)


def test_traces_stay_bounded_over_a_thousand_steps_and_memory_does_not_grow(model, compiled, monkeypatch):
    """Over 1000+ steps of rows joining and leaving, a step is traced once per (rows, capacity) shape
    and replayed after; running the same again traces nothing more, and the process's memory stays."""
    monkeypatch.setattr(decoding, "LOOP_CHECK_EVERY", 10**9)
    compiled(True)
    plan = plan_of(seed=2, joins=90, every=6)
    before = step.Traces.count
    _, shapes = run_batch(model, plan)
    traced = step.Traces.count - before
    assert 0 < traced <= len(set(shapes)) <= 60
    rss = resident_bytes()
    _, again = run_batch(model, plan)
    assert again == shapes and len(shapes) + len(again) >= 1000
    assert step.Traces.count - before == traced  # the same shapes: replayed, not traced
    assert resident_bytes() - rss < 32 * 2**20


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_where_mlx_cannot_compile_the_eager_step_runs_with_one_line(model, compiled, monkeypatch, caplog):
    monkeypatch.setattr(decoding, "LOOP_CHECK_EVERY", 10**9)
    compiled(False)
    plan = plan_of(seed=3, joins=3, every=4)
    eager, _ = run_batch(model, plan)

    def no_compiler(fn, *args, **kwargs):
        raise RuntimeError("no C++ compiler")

    compiled(True)
    monkeypatch.setattr(step, "_usable", None)
    monkeypatch.setattr(step.mx, "compile", no_compiler)
    before = step.Traces.count
    with caplog.at_level(logging.WARNING, logger=step.__name__):
        first, _ = run_batch(model, plan)
        second, _ = run_batch(model, plan)
    assert step.Traces.count == before
    lines = [r.getMessage() for r in caplog.records if r.name == step.__name__]
    assert lines == ["MLX cannot compile here: decoding steps run eagerly (slower on a GPU)"]
    for key, gen in eager.items():
        assert first[key].tokens == second[key].tokens == gen.tokens


def test_a_compile_that_retraces_every_call_counts_as_unavailable(monkeypatch):
    """MLX without a C++ compiler returns the function itself from mx.compile (traced every call)."""
    monkeypatch.setattr(step.mx, "compile", lambda fn, *a, **k: fn)
    assert step._can_compile() is False
    monkeypatch.undo()
    assert step._can_compile() is True


def test_a_full_cache_grows_by_a_block_keeping_what_it_holds():
    cache = KVCache()
    keys = mx.array(np.random.default_rng(0).standard_normal((2, 2, 5, 4)).astype(np.float32))
    cache.update_and_fetch(keys, keys + 1)
    cache.offset = KVCache.step  # as if every position of its first block were written
    held = np.array(cache.keys)
    cache.reserve(1)
    assert cache.keys.shape[2] == 2 * KVCache.step
    assert np.array_equal(np.array(cache.keys[:, :, : KVCache.step]), held)
    cache.reserve(1)
    assert cache.keys.shape[2] == 2 * KVCache.step  # room already
    assert KVCache.blocks(1) == KVCache.blocks(KVCache.step) == KVCache.step
    assert KVCache.blocks(KVCache.step + 1) == 2 * KVCache.step


def test_the_step_mask_shows_the_prefix_and_each_row_s_own_positions():
    mask = step.step_mask(mx.arange(8), mx.array([5]), mx.array([0, 2]), mx.array(2))
    seen = np.array(mask)[:, 0, 0, :].astype(int).tolist()
    assert seen == [[1, 1, 1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 1, 1, 0, 0]]
