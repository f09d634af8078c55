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


@pytest.fixture(scope="module")
def model(checkpoints):
    return mlx_qwen3asr.load(checkpoints("tiny"))


def texts(result):
    return [(s.start, s.end, s.text) for s in result.segments]


def test_concurrent_jobs_share_steps_and_each_gets_its_own_result(model, monkeypatch):
    from scripted import spy_batches

    monkeypatch.setattr(generate, "LOOP_CHECK_EVERY", 10**9)
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
    monkeypatch.setattr(generate, "LOOP_CHECK_EVERY", 10**9)
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
