"""A context (names, terms) is prefilled once per run and shared by every row; long prompts go in chunks."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from reference import test_signal

import mlx_qwen3asr
from mlx_qwen3asr import generate, scheduler
from mlx_qwen3asr.audio import log_mel_spectrogram
from mlx_qwen3asr.generate import greedy_generate_batch, prefill_prefix
from mlx_qwen3asr.prompt import (
    MAX_CONTEXT_TOKENS,
    ContextTooLongError,
    build_prompt_ids,
    prompt_prefix_ids,
    prompt_suffix_ids,
)
from mlx_qwen3asr.scheduler import encode_segments

EOS = frozenset({151643, 151645})
GLOSSARY = "Glossary: Qwen3-ASR, MLX, Metal, Apple silicon, Dr. Anna Müller, 王小明, Kubernetes. "


@pytest.fixture(scope="module")
def model(checkpoints):
    return mlx_qwen3asr.load(checkpoints("tiny"), dtype="float32")


def features_for(model, seconds: list[float]) -> list[mx.array]:
    mels = [log_mel_spectrogram(test_signal(s, seed=i)) for i, s in enumerate(seconds)]
    return encode_segments(model, mels)


def context_of(model, tokens: int) -> str:
    text = GLOSSARY * (tokens // 20 + 2)
    ids = model.tokenizer.encode(text)[:tokens]
    return model.tokenizer.decode(ids)


@pytest.mark.parametrize("context_tokens", [0, 300])
def test_shared_prefix_decodes_the_same_ids_as_whole_prompts(model, context_tokens):
    context = context_of(model, context_tokens) if context_tokens else ""
    features = features_for(model, [3.0, 7.5, 1.2])
    tok = model.tokenizer
    whole = [build_prompt_ids(tok, int(f.shape[0]), context=context) for f in features]
    suffixes = [prompt_suffix_ids(tok, int(f.shape[0])) for f in features]
    prefix = prefill_prefix(model.net, prompt_prefix_ids(tok, context))
    assert all(p == prefix.ids + s for p, s in zip(whole, suffixes))
    budgets = [24, 24, 24]
    expected = greedy_generate_batch(model.net, whole, features, budgets, EOS, keep_logits=True)
    shared = greedy_generate_batch(
        model.net, suffixes, features, budgets, EOS, keep_logits=True, prefix=prefix
    )
    for a, b in zip(expected, shared):
        assert a.tokens == b.tokens and len(a.tokens) > 4
        diff = max(float(mx.abs(x - y).max()) for x, y in zip(a.logits, b.logits))
        assert diff < 1e-3
    # Each row alone decodes as in the batch.
    for i in range(3):
        (alone,) = greedy_generate_batch(model.net, [suffixes[i]], [features[i]], [24], EOS, prefix=prefix)
        assert alone.tokens == shared[i].tokens


def test_chunked_prefill_equals_one_pass(model, monkeypatch):
    context = context_of(model, 1500)
    tok = model.tokenizer
    features = features_for(model, [4.0, 2.0])
    prompts = [build_prompt_ids(tok, int(f.shape[0]), context=context) for f in features]
    assert len(prompts[0]) > 3 * generate.PREFILL_CHUNK
    chunked = greedy_generate_batch(model.net, prompts, features, [16, 16], EOS, keep_logits=True)
    monkeypatch.setattr(generate, "PREFILL_CHUNK", 10**6)
    whole = greedy_generate_batch(model.net, prompts, features, [16, 16], EOS, keep_logits=True)
    for a, b in zip(chunked, whole):
        assert a.tokens == b.tokens
        np.testing.assert_allclose(np.array(a.logits[0]), np.array(b.logits[0]), atol=1e-3)
    monkeypatch.setattr(generate, "PREFILL_CHUNK", 512)
    prefix_chunked = prefill_prefix(model.net, prompt_prefix_ids(tok, context))
    monkeypatch.setattr(generate, "PREFILL_CHUNK", 10**6)
    prefix_whole = prefill_prefix(model.net, prompt_prefix_ids(tok, context))
    for (k1, v1), (k2, v2) in zip(prefix_chunked.layers, prefix_whole.layers):
        np.testing.assert_allclose(np.array(k1), np.array(k2), atol=1e-4)
        np.testing.assert_allclose(np.array(v1), np.array(v2), atol=1e-4)


def test_the_context_is_prefilled_once_per_run(model, monkeypatch):
    calls = []
    real = scheduler.prefill_prefix

    def spy(net, ids):
        calls.append(len(ids))
        return real(net, ids)

    monkeypatch.setattr(scheduler, "prefill_prefix", spy)
    monkeypatch.setattr(generate, "LOOP_CHECK_EVERY", 10**9)
    context = context_of(model, 400)
    inputs = [test_signal(s, seed=i) for i, s in enumerate([3.0, 5.0, 2.0, 4.0, 6.0])]
    results = mlx_qwen3asr.transcribe(model, inputs, context=context, batch_size=2)
    assert len(results) == 5 and all(r.segments for r in results)
    assert len(calls) == 1 and calls[0] > 400
    # The same texts as each input transcribed on its own, with its own run and prefix.
    for wav, result in zip(inputs[:2], results[:2]):
        alone = mlx_qwen3asr.transcribe(model, wav, context=context)
        assert [s.text for s in alone.segments] == [s.text for s in result.segments]
    assert len(calls) == 3


def test_a_long_context_keeps_prefill_memory_bounded(model):
    context = context_of(model, 6000)
    mx.clear_cache()
    mx.reset_peak_memory()
    base = mx.get_active_memory()
    result = mlx_qwen3asr.transcribe(model, test_signal(2.0, seed=3), context=context)
    assert result.segments
    peak = mx.get_peak_memory() - base
    # Whole-prompt prefill held a 6000 x 6000 score matrix per head and layer (about 0.6 GB each and
    # several GB in all for this model); in chunks of 512 queries it is a fraction of that.
    assert peak < 400 * 2**20, peak


def test_context_over_the_limit_is_refused_before_any_audio_is_read(model, tmp_path):
    too_long = context_of(model, MAX_CONTEXT_TOKENS + 50)
    with pytest.raises(ContextTooLongError, match=f"the limit is {MAX_CONTEXT_TOKENS} tokens") as err:
        mlx_qwen3asr.transcribe(model, str(tmp_path / "does-not-exist.wav"), context=too_long)
    assert str(err.value).startswith("the context has ") and "\n" not in str(err.value)
    at_limit = context_of(model, MAX_CONTEXT_TOKENS)
    assert len(prompt_prefix_ids(model.tokenizer, at_limit)) > MAX_CONTEXT_TOKENS


def test_cli_refuses_an_over_long_context_file_before_writing(checkpoints, tmp_path, capsys):
    import soundfile as sf
    from mlx_qwen3asr.cli.main import main as mlxasr

    model = mlx_qwen3asr.load(checkpoints("tiny"))
    sf.write(tmp_path / "talk.wav", test_signal(2.0, seed=1), 16000)
    context = tmp_path / "glossary.txt"
    context.write_text(context_of(model, MAX_CONTEXT_TOKENS + 500), encoding="utf-8")
    out = tmp_path / "out"
    rc = mlxasr([str(tmp_path / "talk.wav"), "--srt", "--model", str(checkpoints("tiny"))]
                + ["--context-file", str(context), "-o", str(out)])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: --context-file {context}: the context has ")
    assert f"the limit is {MAX_CONTEXT_TOKENS} tokens" in errors[0]
    assert not out.exists()
