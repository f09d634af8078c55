"""Batched decoding and scheduling: every row decodes as it would alone."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
import soundfile as sf
from reference import test_signal
from scripted import short_budgets

import mlx_qwen3asr
from mlx_qwen3asr.audio.features import log_mel_spectrogram
from mlx_qwen3asr.model import batch as decoding
from mlx_qwen3asr.model import generate
from mlx_qwen3asr.model.cache import KVCache
from mlx_qwen3asr.model.generate import greedy_generate, greedy_generate_batch
from mlx_qwen3asr.pipeline import scheduler as scheduler_module
from mlx_qwen3asr.pipeline.encoding import encode_segments
from mlx_qwen3asr.pipeline.inputs import InputOptions
from mlx_qwen3asr.pipeline.memory import MEMORY_FRACTION, kv_bytes_per_position
from mlx_qwen3asr.pipeline.parts import Parts
from mlx_qwen3asr.pipeline.scheduler import Scheduler
from mlx_qwen3asr.pipeline.transcribe import transcribe_stream
from tools.prompts import build_prompt_ids

SECONDS = [3.0, 11.5, 0.7, 7.9, 20.0]  # prompts of very different lengths: heavy left padding


@pytest.fixture(scope="module")
def model(checkpoints):
    return mlx_qwen3asr.load(checkpoints("tiny"))


@pytest.fixture(scope="module")
def rows(model):
    """Prompts and audio features of segments of different lengths."""
    rng = np.random.default_rng(0)
    mels = [
        log_mel_spectrogram((rng.standard_normal(int(s * 16000)) * 0.1).astype(np.float32)) for s in SECONDS
    ]
    feats = encode_segments(model, mels)
    prompts = [build_prompt_ids(model.tokenizer, int(f.shape[0]), context="", language=None) for f in feats]
    return prompts, feats


def eos_of(model):
    tok = model.tokenizer
    return frozenset({tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")})


# --- RoPE with a position offset per row ------------------------------------------------------------


@pytest.mark.parametrize("B,L", [(2, 1), (5, 1), (4, 7), (16, 3)])
def test_rope_with_per_row_offsets_matches_each_row_alone(B, L):
    """The decoder relies on mx.fast.rope taking a (B,) offset array (negative for left padding),
    on inputs laid out as the attention transposes them."""
    rng = np.random.default_rng(B * 100 + L)
    x = mx.array(rng.standard_normal((B, L, 4, 128)).astype(np.float32)).transpose(0, 2, 1, 3)
    offsets = rng.integers(-40, 900, size=B)
    together = mx.fast.rope(x, 128, traditional=False, base=1e6, scale=1.0, offset=mx.array(offsets))
    for b in range(B):
        alone = mx.fast.rope(
            x[b : b + 1], 128, traditional=False, base=1e6, scale=1.0, offset=int(offsets[b])
        )
        np.testing.assert_allclose(np.array(together[b]), np.array(alone[0]), rtol=0, atol=1e-6)
    # And the rotation itself is right: row b at offset o equals a float64 rotation by positions o + l.
    inv = 1e6 ** (-np.arange(0, 128, 2) / 128)
    xb = np.array(x[B - 1], dtype=np.float64)
    angle = (offsets[B - 1] + np.arange(L))[:, None] * inv[None, :]
    expect = np.concatenate(
        [
            xb[..., :64] * np.cos(angle) - xb[..., 64:] * np.sin(angle),
            xb[..., 64:] * np.cos(angle) + xb[..., :64] * np.sin(angle),
        ],
        axis=-1,
    )
    np.testing.assert_allclose(np.array(together[B - 1]), expect, atol=5e-4)


# --- batched greedy decoding ------------------------------------------------------------------------


@pytest.mark.parametrize("prefill_rows", [8, 2])
def test_each_row_decodes_exactly_as_it_would_alone(model, rows, prefill_rows, monkeypatch):
    """With 2 rows per prefill call, the batch is prefilled as 3 groups of different widths, joined."""
    prompts, feats = rows
    budgets = [40, 25, 60, 3, 50]
    eos = eos_of(model)
    solo = [
        greedy_generate(model.net, p, f, b, eos, keep_logits=True) for p, f, b in zip(prompts, feats, budgets)
    ]
    joined = []
    real_stack = KVCache.stack.__func__

    def stack(cls, caches, capacity=0):
        joined.append([c.offset for c in caches])
        return real_stack(cls, caches, capacity)

    monkeypatch.setattr(KVCache, "stack", classmethod(stack))
    batch = greedy_generate_batch(
        model.net, prompts, feats, budgets, eos, keep_logits=True, prefill_rows=prefill_rows
    )
    if prefill_rows == 2:
        widths = [max(len(p) for p in prompts[i : i + 2]) for i in (0, 2, 4)]
        assert joined == [widths] * model.config.text_config.num_hidden_layers
        assert len(set(widths)) == 3
    else:  # one prefill call: its cache is given room for the budgets in one copy
        assert joined == [[max(len(p) for p in prompts)]] * model.config.text_config.num_hidden_layers
    assert len(batch) == len(solo)
    for alone, together in zip(solo, batch):
        assert together.tokens == alone.tokens
        assert (together.truncated, together.repetitive) == (alone.truncated, alone.repetitive)
        assert len(together.logits) == len(alone.logits)
        worst = max(float(mx.abs(a - b).max()) for a, b in zip(alone.logits, together.logits))
        assert worst < 1e-3


def test_rows_stop_at_their_own_eos_and_leave_the_batch(model, rows, monkeypatch):
    prompts, feats = rows
    eos = eos_of(model)
    first = [greedy_generate(model.net, p, f, 30, eos) for p, f in zip(prompts, feats)]
    # Declare one token each of two rows produce early an end token: those rows stop there.
    stop = {first[1].tokens[4], first[3].tokens[9]}
    stops = eos | stop
    solo = [greedy_generate(model.net, p, f, 30, stops) for p, f in zip(prompts, feats)]
    assert any(not g.truncated and len(g.tokens) < 30 for g in solo)

    sizes = []
    real_keep = KVCache.keep_rows

    def spy(self, rows_kept):
        sizes.append(int(rows_kept.size))
        return real_keep(self, rows_kept)

    monkeypatch.setattr(KVCache, "keep_rows", spy)
    batch = greedy_generate_batch(model.net, prompts, feats, [30] * len(prompts), stops)
    for alone, together in zip(solo, batch):
        assert together.tokens == alone.tokens and together.truncated == alone.truncated
    # The cache shrank as rows finished (once per layer each time).
    assert sizes and min(sizes) < len(prompts)


def test_prefill_sends_only_the_last_position_through_the_head(model, rows, monkeypatch):
    prompts, feats = rows
    shapes = []
    real = type(model.net).logits

    def spy(self, hidden):
        shapes.append(hidden.shape)
        return real(self, hidden)

    monkeypatch.setattr(type(model.net), "logits", spy)
    greedy_generate_batch(model.net, prompts[:3], feats[:3], [2, 2, 2], eos_of(model))
    assert shapes[0] == (3, model.config.text_config.hidden_size)


def test_a_zero_budget_row_and_an_empty_batch(model, rows):
    prompts, feats = rows
    assert greedy_generate_batch(model.net, [], [], [], eos_of(model)) == []
    out = greedy_generate_batch(model.net, prompts[:2], feats[:2], [0, 5], eos_of(model))
    assert out[0].tokens == [] and out[0].truncated
    assert out[1].tokens == greedy_generate(model.net, prompts[1], feats[1], 5, eos_of(model)).tokens


# --- scheduling --------------------------------------------------------------------------------------


def inputs_for_test():
    return [
        test_signal(65.0, seed=3),
        test_signal(3.0, seed=1),
        (test_signal(5.0, seed=2), 16000),
        test_signal(12.0, seed=4),
    ]


def test_batch_size_does_not_change_any_text(model, monkeypatch):
    monkeypatch.setattr("mlx_qwen3asr.model.batch.LOOP_CHECK_EVERY", 10**9)  # same work whatever stops a row
    one = mlx_qwen3asr.transcribe(model, inputs_for_test(), batch_size=1, vad=False, parts=short_budgets())
    many = mlx_qwen3asr.transcribe(model, inputs_for_test(), batch_size=6, vad=False, parts=short_budgets())
    assert [r.text for r in one] == [r.text for r in many]
    assert [[(s.start, s.end, s.text) for s in r.segments] for r in one] == [
        [(s.start, s.end, s.text) for s in r.segments] for r in many
    ]


def test_segments_of_several_inputs_share_batches(model):
    from scripted import spy_batches

    record = spy_batches()
    parts = record.parts(budget=short_budgets().budget)
    mlx_qwen3asr.transcribe(model, inputs_for_test(), batch_size=4, vad=False, parts=parts)
    # 3 + 1 + 1 + 1 segments: 4 rows at once, the other 2 joining as rows finish.
    assert max(record.sizes) == 4 and record.adds[0]["running"] == 0
    assert sum(len(a["prompts"]) for a in record.adds) == 6
    assert len(record.adds) >= 2 and any(a["running"] > 0 for a in record.adds[1:])  # joined a running batch


def test_stream_reports_bad_inputs_and_keeps_going(model, tmp_path):
    bad = tmp_path / "broken.wav"
    bad.write_bytes(b"not audio at all")
    good = tmp_path / "good.flac"
    sf.write(good, test_signal(4.0, seed=7), 16000)
    seen: dict[int, list] = {}
    results = list(
        transcribe_stream(
            model,
            [str(good), str(bad), test_signal(40.0, seed=8)],
            batch_size=3,
            on_segment=lambda i, seg: seen.setdefault(i, []).append(seg),
            vad=False,
            parts=short_budgets(),
        )
    )
    by_index = {r.index: r for r in results}
    assert sorted(by_index) == [0, 1, 2]
    assert by_index[1].error is not None and "broken.wav" in str(by_index[1].error)
    assert by_index[0].error is None and by_index[0].transcription.source == str(good)
    long = by_index[2].transcription
    assert len(long.segments) == 2
    # on_segment saw each input's segments in time order, the same ones the result holds.
    assert seen[2] == long.segments and seen[0] == by_index[0].transcription.segments


def test_skip_predicate_keeps_audio_from_the_model(model):
    results = list(transcribe_stream(model, [np.zeros(32000, np.float32)], skip=lambda wav: True, vad=False))
    assert len(results) == 1 and results[0].skipped
    assert results[0].transcription.segments == [] and results[0].transcription.duration == 2.0


def run_all(model, inputs, scheduler=Scheduler, **kwargs) -> list:
    """Every input through one Scheduler (built with kwargs) until it is idle; the results in input order."""
    sched = scheduler(model, **kwargs)
    try:
        for i, audio in enumerate(inputs):
            sched.submit(i, audio, InputOptions())
        results = []
        while not sched.idle:
            results += sched.run_once()
    finally:
        sched.close()
    return sorted(results, key=lambda r: r.index)


def test_automatic_batches_fit_their_kv_cache_in_the_memory_share(model, monkeypatch):
    """Without batch_size, the batch holds as many rows (longest first) as the KV memory share allows."""
    from scripted import spy_batches

    monkeypatch.setattr("mlx_qwen3asr.model.batch.LOOP_CHECK_EVERY", 10**9)
    per_position = kv_bytes_per_position(model)

    def run(memory: int, max_batch: int = 32):
        from mlx_qwen3asr.runtime.device import Tuning

        monkeypatch.setattr(scheduler_module, "tuning", lambda: Tuning(max_batch=max_batch))
        record = spy_batches()
        parts = record.parts(memory=lambda: memory, budget=short_budgets().budget)
        results = run_all(model, inputs_for_test(), parts=parts)
        assert all(r.error is None for r in results)
        return record

    everything = run(1 << 50)
    assert [len(a["prompts"]) for a in everything.adds] == [6]  # 3 + 1 + 1 + 1 segments, all at once
    first = everything.adds[0]
    # Positions a row holds at most, allocated in whole blocks.
    longest = KVCache.blocks(max(len(p) for p in first["prompts"]) + max(first["budgets"]))
    prefix = len(first["prefix"].ids)  # computed once, then copied into every row's cache
    # A share of exactly the prefix and two such rows (each with its copy of the prefix): never more
    # than two rows at a time.
    share = (prefix + 2 * (prefix + longest)) * per_position
    two = run(int(share / MEMORY_FRACTION))
    assert len(two.adds[0]["prompts"]) == 2 and sum(len(a["prompts"]) for a in two.adds) == 6
    # Whenever rows join, the cache the batch holds fits the share (shorter segments fit more rows).
    assert all((prefix + kv) * per_position <= share for kv in two.kv_positions)
    assert max(two.sizes) < 6
    assert max(run(0).sizes) == 1  # no room: one row at a time, still done
    assert max(run(1 << 50, max_batch=4).sizes) == 4  # plenty of room: max_batch rows at most


def test_stacked_caches_right_align_rows_and_leave_room():
    rng = np.random.default_rng(5)
    caches = []
    for rows_, offset in [(2, 5), (1, 9)]:
        c = KVCache()
        k = mx.array(rng.standard_normal((rows_, 2, offset, 4)).astype(np.float32))
        c.update_and_fetch(k, -k)
        caches.append(c)
    joined = KVCache.stack(caches, capacity=300)
    assert joined.offset == 9
    assert joined.keys.shape == (3, 2, 300, 4)  # room for 300 positions
    keys = np.array(joined.keys)
    np.testing.assert_array_equal(keys[:2, :, :4], 0)  # the shorter rows' padding comes first
    np.testing.assert_array_equal(keys[:2, :, 4:9], np.array(caches[0].keys[..., :5, :]))
    np.testing.assert_array_equal(keys[2, :, :9], np.array(caches[1].keys[0, :, :9]))
    np.testing.assert_array_equal(np.array(joined.values[:, :, :9]), -keys[:, :, :9])
    np.testing.assert_array_equal(keys[:, :, 9:], 0)
    # Decoding appends after the joined positions without growing the arrays.
    k_new = mx.ones((3, 2, 1, 4))
    full_k, _ = joined.update_and_fetch(k_new, k_new)
    assert full_k.shape == (3, 2, 10, 4) and joined.keys.shape[2] == 300


def test_rows_joining_a_running_batch_decode_exactly_as_alone(model, rows):
    """Continuous batching: prompts prefilled and joined between steps, at different widths and while
    other rows are part-way through, each decode the ids (and logits) they get alone."""
    from mlx_qwen3asr.model.generate import DecodeBatch

    prompts, feats = rows
    budgets = [40, 25, 60, 3, 50]
    eos = eos_of(model)
    solo = [
        greedy_generate(model.net, p, f, b, eos, keep_logits=True) for p, f, b in zip(prompts, feats, budgets)
    ]
    batch = DecodeBatch(model.net, eos, keep_logits=True)
    results = dict(batch.add(prompts[:2], feats[:2], budgets[:2], [0, 1]))
    joins = {4: [2, 3], 11: [4]}  # steps at which rows join
    sizes = []
    for step in range(200):
        if step in joins:
            keys = joins[step]
            results.update(
                batch.add(
                    [prompts[k] for k in keys], [feats[k] for k in keys], [budgets[k] for k in keys], keys
                )
            )
        if not len(batch) and step > max(joins):
            break
        sizes.append(len(batch))
        results.update(batch.step())
    assert max(sizes) == 4 and sorted(results) == [0, 1, 2, 3, 4]
    for key, alone in enumerate(solo):
        together = results[key]
        assert together.tokens == alone.tokens
        assert (together.truncated, together.repetitive) == (alone.truncated, alone.repetitive)
        worst = max((float(mx.abs(a - b).max()) for a, b in zip(alone.logits, together.logits)), default=0.0)
        assert worst < 1e-3


def test_dropped_rows_leave_the_others_untouched(model, rows):
    from mlx_qwen3asr.model.generate import DecodeBatch

    prompts, feats = rows
    eos = eos_of(model)
    solo = greedy_generate(model.net, prompts[2], feats[2], 30, eos)
    batch = DecodeBatch(model.net, eos)
    results = dict(batch.add(prompts[:3], feats[:3], [30, 30, 30], ["a", "b", "c"]))
    for step in range(100):
        if step == 3:
            batch.drop({"a", "b"})
            assert batch.keys == ["c"]
        if not len(batch):
            break
        results.update(batch.step())
    assert "a" not in results and "b" not in results
    assert results["c"].tokens == solo.tokens


def test_continuous_batching_gives_the_texts_of_batch_after_batch(model, monkeypatch):
    """Segments that stop at very different steps (as real speech does): rows that finish are replaced
    at once, and every segment's text is the one it gets when batches are closed until they drain."""
    from scripted import spy_batches

    from tools.bench import ClosedBatches

    monkeypatch.setattr("mlx_qwen3asr.model.batch.LOOP_CHECK_EVERY", 10**9)
    rng = np.random.default_rng(4)
    rates = {}

    def budget(seconds):  # 0.5 to 6 tokens per second of audio, fixed per segment
        return max(1, round(rates.setdefault(round(seconds, 3), rng.uniform(0.5, 6.0)) * seconds))

    wavs = [test_signal(s, seed=i) for i, s in enumerate([9.0, 2.0, 14.0, 4.0, 6.5, 11.0, 3.0, 8.0])]

    def run(continuous):
        record = spy_batches()
        parts = record.parts(budget=budget)
        scheduler = Scheduler if continuous else ClosedBatches
        results = run_all(model, wavs, batch_size=3, parts=parts, scheduler=scheduler)
        return {r.index: [s.text for s in r.transcription.segments] for r in results}, record

    joined, continuous = run(True)
    closed, batched = run(False)
    assert joined == closed and len(joined) == len(wavs)
    assert any(a["running"] > 0 for a in continuous.adds)  # rows joined while others ran
    assert all(a["running"] == 0 for a in batched.adds)
    assert len(continuous.sizes) < len(batched.sizes)  # fewer steps: places did not sit empty


def test_inputs_read_ahead_hold_at_most_the_memory_budget_of_samples(model, tmp_path, monkeypatch):
    """Files just short of the spill threshold are kept in memory whole: reading ahead stops when the
    samples held by inputs prepared and not finished reach held_seconds (one input is always let in),
    however many files wait. Files over the threshold live on disk and hold nothing."""
    import threading
    import weakref

    from mlx_qwen3asr.audio import files as decode
    from mlx_qwen3asr.audio.signal import ArraySignal

    monkeypatch.setattr(decode, "SPILL_SECONDS", 2.0)
    paths = []
    for i in range(10):
        paths.append(tmp_path / f"{i}.wav")
        sf.write(paths[-1], test_signal(1.9, seed=i), 16000)  # 30400 samples each, in memory
    paths.append(tmp_path / "long.wav")
    sf.write(paths[-1], test_signal(5.0, seed=99), 16000)  # spilled to a temporary file
    lock = threading.Lock()
    alive = [0]  # samples of decoded inputs held in memory (not garbage yet)

    def count(n: int) -> None:
        with lock:
            alive[0] += n

    real_prepare = Parts().prepare

    def prepare_input(*args, **kwargs):
        prepared = real_prepare(*args, **kwargs)
        if isinstance(prepared.wav, ArraySignal):
            count(len(prepared.wav))
            weakref.finalize(prepared.wav, count, -len(prepared.wav))
        return prepared

    parts = Parts(prepare=prepare_input, budget=lambda seconds: 3)

    def run(held_seconds: float) -> int:
        monkeypatch.setattr(scheduler_module, "HELD_SECONDS", held_seconds)
        sched = Scheduler(model, batch_size=4, parts=parts)
        for i, path in enumerate(paths):
            sched.submit(i, str(path))
        done, peak = 0, 0
        while not sched.idle:
            results = sched.run_once()
            assert all(r.error is None for r in results)
            done += len(results)
            del results
            peak = max(peak, alive[0])
        sched.close()
        assert done == len(paths)
        return peak

    assert run(6.0) <= 6.0 * 16000
    assert run(1.0) == 30400  # a budget short of one input: one at a time, still done


def test_every_stage_goes_through_the_parts_given(model, checkpoints):
    """Each stage of Parts is called through the parts the scheduler is given: one called by its own
    name instead would escape the stand-ins of tests and the timing of tools/bench.py."""
    import dataclasses
    from collections import Counter

    from scripted import script_batches

    aligner = mlx_qwen3asr.load(checkpoints("aligner-tiny"))
    said = script_batches(lambda prompt: model.tokenizer.encode("language English<asr_text>So it goes."))
    base = said.parts()
    calls: Counter[str] = Counter()

    def counted(name, stage):
        def call(*args, **kwargs):
            calls[name] += 1
            return stage(*args, **kwargs)

        return call

    names = [f.name for f in dataclasses.fields(Parts)]
    parts = Parts(**{name: counted(name, getattr(base, name)) for name in names})
    inputs = [test_signal(3.0, seed=1), test_signal(2.0, seed=2)]
    stream = transcribe_stream(model, inputs, context="Names: Ada.", aligner=aligner, vad=False, parts=parts)
    results = list(stream)
    assert all(r.error is None for r in results) and len(results) == 2
    assert all(s.timing == "aligned" for r in results for s in r.transcription.segments)
    assert sorted(calls) == sorted(names)


def test_the_benchmark_times_every_stage_and_decodes_the_budget(model, tmp_path):
    """tools/bench.py hands the scheduler timed stages: each is timed, and every segment decodes exactly
    its budget (EOS off), so the work is the same whatever random weights say."""
    from tools.bench import Budget, run_ours

    paths = []
    for i, seconds in enumerate([3.0, 40.0]):  # one segment, then two
        paths.append(tmp_path / f"{i}.wav")
        sf.write(paths[-1], test_signal(seconds, seed=i), 16000)
    run = run_ours(model, paths, Budget(new_tokens=4), batch_size=None)
    assert run.segments == 3 and sum(run.batches) == 3
    assert [len(texts) for texts in run.texts] == [1, 2]
    assert run.tokens == 3 * 4  # rows decoded at each step: every row its whole budget, whatever it says
    for stage in ("audio decode", "mel + cutting", "encoder", "prefill", "decode"):
        assert run.stages[stage] > 0, stage
    assert decoding.LOOP_CHECK_EVERY < 1000  # the loop stop is back on after the run


@pytest.mark.parametrize("context", ["", "Qwen, MLX, " * 60], ids=["system-prompt", "long-context"])
def test_a_shared_prompt_start_decodes_as_the_whole_prompt(model, rows, context):
    """The scheduler computes the prompt start once (Prefix), and its keys and values are copied into
    every row's cache as the row joins: every row decodes the ids of its whole prompt decoded alone."""
    from mlx_qwen3asr.model.generate import DecodeBatch, prefill_prefix
    from mlx_qwen3asr.text.prompt import prompt_prefix_ids, prompt_suffix_ids

    _, feats = rows
    eos = eos_of(model)
    start = prompt_prefix_ids(model.tokenizer, context)
    suffixes = [prompt_suffix_ids(model.tokenizer, int(f.shape[0]), None) for f in feats]
    solo = [greedy_generate(model.net, start + s, f, 12, eos) for s, f in zip(suffixes, feats)]
    batch = DecodeBatch(model.net, eos, prefix=prefill_prefix(model.net, start))
    results = dict(batch.add(suffixes, feats, [12] * len(feats), range(len(feats))))
    assert batch.cache[0].prefix_len == len(start)
    while len(batch):
        results.update(batch.step())
    assert [results[i].tokens for i in range(len(feats))] == [g.tokens for g in solo]


def test_a_step_of_another_context_waits_for_the_batch_to_drain(model, monkeypatch):
    """A step (submit_step) is one row with its own prompt after the start of its context: with another
    context than the running batch's, it starts a batch of its own once that one has drained; its
    result is the row's Generation, as greedy decoding gives it alone."""
    from scripted import spy_batches

    from mlx_qwen3asr.pipeline.scheduler import Step, StepResult
    from mlx_qwen3asr.pipeline.streaming import window_suffix_ids
    from mlx_qwen3asr.text.prompt import prompt_prefix_ids

    monkeypatch.setattr("mlx_qwen3asr.model.batch.LOOP_CHECK_EVERY", 10**9)
    tok = model.tokenizer
    record = spy_batches()
    starts = []  # each join's prompt start

    class Starts(record.batch):
        def add(self, prompts, audio_features, max_new_tokens, keys):
            starts.append(list(self.prefix.ids))
            return super().add(prompts, audio_features, max_new_tokens, keys)

    parts = Parts(batch=Starts, budget=lambda seconds: 12)
    scheduler = Scheduler(model, batch_size=4, parts=parts)
    live = test_signal(1.2, seed=6)

    def suffix(n_audio_tokens):
        return window_suffix_ids(tok, n_audio_tokens, None, "so far")

    try:
        scheduler.submit("file", test_signal(2.0, seed=7), InputOptions())
        results = []
        while not scheduler.rows:  # the file's row decodes
            results += scheduler.run_once()
        scheduler.submit_step("step", Step(live, suffix, 5), context="another context")
        while not scheduler.idle:
            results += scheduler.run_once()
    finally:
        scheduler.close()
    by_key = {r.index: r for r in results}
    assert sorted(by_key) == ["file", "step"] and by_key["file"].error is None
    assert isinstance(by_key["step"], StepResult) and by_key["step"].error is None
    step_adds = [i for i, a in enumerate(record.adds) if a["prompts"][0][-3:] == suffix(0)[-3:]]
    assert len(step_adds) == 1 and len(record.adds) == 2
    assert record.adds[step_adds[0]]["running"] == 0
    assert starts[step_adds[0]] == prompt_prefix_ids(tok, "another context")
    assert starts[1 - step_adds[0]] == prompt_prefix_ids(tok, "")
    features = encode_segments(model, [log_mel_spectrogram(live)])[0]
    start = generate.prefill_prefix(model.net, prompt_prefix_ids(tok, "another context"))
    alone = greedy_generate(
        model.net, suffix(int(features.shape[0])), features, 5, eos_of(model), prefix=start
    )
    assert by_key["step"].generation.tokens == alone.tokens
