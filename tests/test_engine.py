"""The Engine: jobs submitted from many threads share the running batch; each result is what the input
gives alone; a cancelled job leaves the batch."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
from reference import test_signal

import mlx_qwen3asr
from mlx_qwen3asr.model import generate
from mlx_qwen3asr.model.generate import DecodeBatch
from mlx_qwen3asr.pipeline.engine import Engine, JobCancelled
from mlx_qwen3asr.pipeline.parts import Parts


@pytest.fixture(scope="module")
def model(checkpoints):
    return mlx_qwen3asr.load(checkpoints("tiny"))


def texts(result):
    return [(s.start, s.end, s.text) for s in result.segments]


def test_concurrent_jobs_share_steps_and_each_gets_its_own_result(model, monkeypatch):
    from scripted import spy_batches

    monkeypatch.setattr("mlx_qwen3asr.model.batch.LOOP_CHECK_EVERY", 10**9)
    # Segments of different lengths stop at different steps, as real speech does.
    record = spy_batches()
    parts = record.parts(budget=lambda seconds: 6 + int(3 * seconds))
    wavs = [test_signal(s, seed=i) for i, s in enumerate([2.0, 7.0, 3.5, 12.0, 1.0, 5.0])]
    alone = [
        mlx_qwen3asr.transcribe(model, w, vad=False, parts=replace(parts, batch=DecodeBatch)) for w in wavs
    ]
    engine = Engine(model, batch_size=4, vad=False, parts=parts)
    try:
        jobs = [None] * len(wavs)

        def send(i):
            jobs[i] = engine.submit(wavs[i], seconds=len(wavs[i]) / 16000)

        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(wavs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        results = [job.result(timeout=120) for job in jobs]
    finally:
        engine.close()
    assert [texts(r) for r in results] == [texts(a) for a in alone]
    assert max(record.sizes) > 1  # jobs decoded side by side
    assert any(a["running"] > 0 for a in record.adds)  # and joined a running batch as rows finished
    assert engine.queued_seconds() == 0


def test_segments_stream_in_time_order(model):
    engine = Engine(model, vad=False)
    try:
        job = engine.submit(test_signal(40.0, seed=3))
        streamed = list(job.segments(timeout=120))
        result = job.result(timeout=120)
    finally:
        engine.close()
    assert streamed == result.segments and len(streamed) == 2


def test_a_cancelled_job_leaves_and_the_others_finish(model, monkeypatch):
    monkeypatch.setattr("mlx_qwen3asr.model.batch.LOOP_CHECK_EVERY", 10**9)
    engine = Engine(model, batch_size=4, vad=False)
    try:
        keep = engine.submit(test_signal(4.0, seed=1), seconds=4.0)
        drop = engine.submit(test_signal(30.0, seed=2), seconds=30.0)
        assert engine.queued_seconds() == 34.0
        drop.cancel()
        with pytest.raises(JobCancelled):
            drop.result(timeout=60)
        assert texts(keep.result(timeout=120)) == texts(
            mlx_qwen3asr.transcribe(model, test_signal(4.0, seed=1), vad=False)
        )
        assert list(drop.segments(timeout=5)) == []
    finally:
        engine.close()


def test_bad_submissions_fail_at_once(model):
    engine = Engine(model, vad=False)
    try:
        with pytest.raises(ValueError, match="Klingon"):
            engine.submit(test_signal(1.0), language="Klingon")
        with pytest.raises(ValueError, match="need an aligner"):
            engine.submit(test_signal(1.0), word_timestamps=True)
        bad = engine.submit("/no/such/file.wav")
        with pytest.raises(mlx_qwen3asr.AudioError, match="no such file"):
            bad.result(timeout=60)
    finally:
        engine.close()


def test_a_step_joins_the_batch_of_file_segments_and_decodes_as_alone(model, monkeypatch):
    from scripted import spy_batches

    from mlx_qwen3asr.audio.features import log_mel_spectrogram
    from mlx_qwen3asr.pipeline.encoding import encode_segments
    from mlx_qwen3asr.pipeline.streaming import window_suffix_ids
    from mlx_qwen3asr.text.prompt import prompt_prefix_ids

    monkeypatch.setattr("mlx_qwen3asr.model.batch.LOOP_CHECK_EVERY", 10**9)
    record = spy_batches()
    steps: list[list] = []  # the row keys of every decoding step
    joins: list[tuple[list, list]] = []  # the keys and prompts of every join
    live = test_signal(1.5, seed=5)
    tok = model.tokenizer

    def suffix(n_audio_tokens):
        return window_suffix_ids(tok, n_audio_tokens, "English", "hello there")

    holder: dict = {}

    class Rows(record.batch):
        def add(self, prompts, audio_features, max_new_tokens, keys):
            joins.append((list(keys), [list(p) for p in prompts]))
            return super().add(prompts, audio_features, max_new_tokens, keys)

        def step(self):
            steps.append(list(self.keys))
            if "step" not in holder:  # the file's rows decode: a live step comes now
                holder["step"] = engine.submit_step(live, suffix, 8)
            return super().step()

    parts = replace(record.parts(budget=lambda seconds: 40), batch=Rows)
    engine = Engine(model, batch_size=4, vad=False, parts=parts)
    try:
        file_job = engine.submit(test_signal(3.0, seed=4), seconds=3.0)
        result = file_job.result(timeout=120)
        gen = holder["step"].result(timeout=120)
    finally:
        engine.close()
    language = generate.HeaderIds.from_tokenizer(tok).language
    step_keys = [keys for keys, prompts in joins if any(language in p for p in prompts)]
    file_keys = [keys for keys, prompts in joins if not any(language in p for p in prompts)]
    assert len(step_keys) == 1 and len(step_keys[0]) == 1 and file_keys
    step_key, file_key = step_keys[0][0], file_keys[0][0]
    assert any(step_key in keys and file_key in keys for keys in steps)  # decoded side by side
    assert any(a["running"] > 0 for a in record.adds)  # it joined the running batch
    # Each row decoded as it would alone.
    features = encode_segments(model, [log_mel_spectrogram(live)])[0]
    start = generate.prefill_prefix(model.net, prompt_prefix_ids(tok, ""))
    eos = {tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")}
    alone = generate.greedy_generate(
        model.net, suffix(int(features.shape[0])), features, 8, eos, prefix=start
    )
    assert gen.tokens == alone.tokens and gen.truncated == alone.truncated
    solo = mlx_qwen3asr.transcribe(
        model, test_signal(3.0, seed=4), vad=False, parts=replace(parts, batch=DecodeBatch)
    )
    assert texts(result) == texts(solo)


def test_a_prepared_live_step_keeps_its_stream_s_work_and_decodes_beside_a_file(model, monkeypatch):
    """A live stream whose decodes are prepared steps of the engine (as the realtime socket's): its
    updates and the samples it encodes at each step are those of the stream decoding alone (its encoder
    blocks kept, its drafts checked), and its rows decode in the same steps as a file's rows."""
    from mlx_qwen3asr.model.draft import DraftStart
    from mlx_qwen3asr.pipeline.streaming import StreamingTranscriber

    monkeypatch.setattr("mlx_qwen3asr.model.batch.LOOP_CHECK_EVERY", 10**9)
    beside, drafted = [], []  # per live row joining the engine's batch: whether file rows ran in it
    join = DraftStart.join

    def joining(self, batch, key):
        join(self, batch, key)
        if isinstance(batch, Rows):
            beside.append(len(batch) > 1)

    class Rows(DecodeBatch):
        pass

    monkeypatch.setattr(DraftStart, "join", joining)
    engine = Engine(model, batch_size=4, vad=False, parts=replace(Parts(), batch=Rows, budget=lambda s: 300))
    audio = test_signal(20.0, seed=6)

    def rows(samples, suffix, budget, prepare):
        gen = engine.submit_step(samples, suffix, budget, prepare=prepare).result(timeout=120)
        drafted.append(gen.drafted)
        return gen

    def run(stream):
        updates = []
        for pos in range(0, audio.shape[0], 32000):
            updates += stream.feed(audio[pos : pos + 32000])
        updates.append(stream.finish())
        return [(u.text, u.stable, len(u.committed)) for u in updates]

    settings = dict(language="English", max_new_tokens=8, max_window_seconds=None)
    try:
        file_job = engine.submit(test_signal(30.0, seed=4), seconds=30.0)
        served = StreamingTranscriber(model, rows=rows, **settings)
        got = run(served)
        file_job.result(timeout=300)
    finally:
        engine.close()
    alone = StreamingTranscriber(model, **settings)
    assert got == run(alone)
    assert served.step_encoded_samples == alone.step_encoded_samples
    assert sum(served.step_encoded_samples) < 20 * 16000 * 10 / 2  # far less than every window whole
    assert sum(drafted) > 0 and len(beside) == len(drafted) == served.steps
    assert any(beside)  # joined the file's running rows, and decoded in their steps
