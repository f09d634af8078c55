"""Every attention of every kind of decode is MLX's fused kernel: the model has one code path.

Each attention module call (decoder layer or encoder layer) must make exactly one call of
mx.fast.scaled_dot_product_attention, and nothing may compute a softmax outside it. Counted through the
modules themselves, so an attention written another way (unfused products and a softmax, say) is seen.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from reference import test_signal

import mlx_qwen3asr
from mlx_qwen3asr.audio.features import log_mel_spectrogram
from mlx_qwen3asr.model import decoder, encoder
from mlx_qwen3asr.model.generate import (
    DecodeBatch,
    greedy_generate,
    prefill_prefix,
)
from mlx_qwen3asr.model.prefill import PREFILL_CHUNK
from mlx_qwen3asr.pipeline.encoding import encode_segments
from mlx_qwen3asr.text.prompt import prompt_prefix_ids, prompt_suffix_ids


@pytest.fixture(scope="module")
def model(checkpoints):
    return mlx_qwen3asr.load(checkpoints("tiny"))


@pytest.fixture
def counted(monkeypatch):
    """Counts of attention module calls, fused kernel calls, and any other softmax."""
    calls = {"modules": 0, "fused": 0, "softmax": 0}
    fused = mx.fast.scaled_dot_product_attention

    def counting_fused(*args, **kwargs):
        calls["fused"] += 1
        return fused(*args, **kwargs)

    def counting_softmax(*args, **kwargs):
        calls["softmax"] += 1
        raise AssertionError("a softmax outside the fused attention kernel")

    monkeypatch.setattr(mx.fast, "scaled_dot_product_attention", counting_fused)
    monkeypatch.setattr(mx, "softmax", counting_softmax)
    for cls in (decoder.Attention, encoder.AudioAttention):
        original = cls.__call__

        def counting_module(self, *args, _original=original, **kwargs):
            calls["modules"] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(cls, "__call__", counting_module)

    def check():
        assert calls["modules"] > 0
        assert calls["fused"] == calls["modules"], calls
        assert calls["softmax"] == 0
        calls.update(modules=0, fused=0, softmax=0)

    return check


def eos_of(model):
    tok = model.tokenizer
    return {tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")}


def features(model, seconds: float, seed: int) -> mx.array:
    mel = log_mel_spectrogram(test_signal(seconds, seed=seed))
    return encode_segments(model, [mel])[0]


def test_encoder_windows(model, counted):
    # 20 s: several attention windows, the last one partial (masked keys).
    feats = features(model, 20.0, 1)
    mx.eval(feats)
    counted()


@pytest.mark.parametrize("context", ["", "Qwen, MLX, " * 100], ids=["system-prompt", "long-context"])
def test_prefill_and_batched_decode_after_a_shared_start(model, context, counted):
    feats = [features(model, s, seed) for s, seed in ((2.0, 2), (3.5, 3), (1.0, 4))]
    counted()
    start = prompt_prefix_ids(model.tokenizer, context)
    if context:
        assert len(start) > PREFILL_CHUNK  # a long context is prefilled in chunks
    batch = DecodeBatch(model.net, eos_of(model), prefix=prefill_prefix(model.net, start))
    suffixes = [prompt_suffix_ids(model.tokenizer, int(f.shape[0]), None) for f in feats]
    done = dict(batch.add(suffixes, feats, [6] * 3, range(3)))
    steps = 0
    while len(batch):
        done.update(batch.step())
        steps += 1
    assert len(done) == 3 and steps > 1
    counted()


def test_a_single_prompt_and_a_draft_decode(model, counted):
    feats = features(model, 2.0, 5)
    counted()
    start = prompt_prefix_ids(model.tokenizer, "")
    prompt = start + prompt_suffix_ids(model.tokenizer, int(feats.shape[0]), None)
    plain = greedy_generate(model.net, prompt, feats, 8, eos_of(model))
    counted()
    drafted = greedy_generate(model.net, prompt, feats, 8, eos_of(model), draft=plain.tokens[:4])
    assert drafted.tokens == plain.tokens
    counted()


def test_live_steps_with_kept_encoder_windows(model, counted):
    from mlx_qwen3asr.pipeline.streaming import StreamingTranscriber

    live = StreamingTranscriber(model, max_new_tokens=6)
    audio = test_signal(18.0, seed=6)
    for at in range(0, audio.size, 32000):
        live.feed(audio[at : at + 32000])
    live.finish()
    counted()


def test_the_aligner(checkpoints, counted):
    aligner = mlx_qwen3asr.load(checkpoints("aligner-tiny"))
    words = mlx_qwen3asr.align(aligner, (test_signal(4.0, seed=7), 16000), "one two three four")
    assert len(words) == 4 and all(np.isfinite(w.start) for w in words)
    counted()
