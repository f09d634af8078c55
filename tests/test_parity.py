"""Stage-by-stage parity with the official qwen-asr implementation (transformers backend, float32).

Both sides run the same random-weight checkpoint in the release layout (tools/make_checkpoint.py).
The reference encoder is made windowed as tests/reference.py explains: each encoder attention call
gets the official block-diagonal mask built from the official cu_seqlens (104-token windows), which
is what FlashAttention's varlen path and vLLM compute; the plain sdpa/eager path attends across the
whole segment (QwenLM/Qwen3-ASR issue 213).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from reference import OfficialReference, cosine, max_abs, test_signal

import mlx_qwen3asr
from mlx_qwen3asr.audio.features import log_mel_spectrogram
from mlx_qwen3asr.model.encoder import encoder_batch
from mlx_qwen3asr.model.generate import greedy_generate, greedy_generate_batch
from tools.prompts import build_prompt_ids

PRESETS = ["tiny", "0.6b"]
SECONDS = [1.0, 7.9, 8.1, 20.0, 65.0]
WINDOW_SECONDS = 8.1  # the case whose unwindowed encoder output shows that the window matters
GREEDY_STEPS = 32
EOS = {151643, 151645}

_models: dict = {}
_runs: dict = {}


def signal(seconds: float):
    return test_signal(seconds, seed=int(seconds * 10))


def pair(checkpoints, preset):
    """(official reference, our model) for a preset; one pair alive at a time to bound memory."""
    if preset not in _models:
        _models.clear()
        _runs.clear()
        path = checkpoints(preset)
        # The real shapes' official results come from the committed golden data while it is valid.
        _models[preset] = (OfficialReference(path, preset), mlx_qwen3asr.load(path, dtype="float32"))
    return _models[preset]


def reference_run(checkpoints, preset, seconds):
    ref, _ = pair(checkpoints, preset)
    key = (preset, seconds)
    if key not in _runs:
        _runs[key] = ref.run(signal(seconds), steps=GREEDY_STEPS)
    return _runs[key]


# The real shapes decode their cases as one batch, as the Engine decodes files (each prompt prefilled
# alone, the rows joined right-aligned, padding masked): each row must still give its own case's official
# result, and 32 steps of 5 rows cost about what 32 steps of one do. The tiny shapes decode each case alone.
BATCHED = {"0.6b"}


def our_run(checkpoints, preset, seconds):
    """(encoder output, prompt ids, Generation) of our model for a case, fed the reference's mel."""
    _, ours = pair(checkpoints, preset)
    key = ("ours", preset, seconds)
    if key not in _runs:
        cases = SECONDS if preset in BATCHED else [seconds]
        cfg = ours.config.audio_config
        encs = [
            ours.net.audio_tower(encoder_batch([reference_run(checkpoints, preset, s).mel], cfg))
            for s in cases
        ]
        mx.eval(encs)
        prompts = [build_prompt_ids(ours.tokenizer, enc.shape[0]) for enc in encs]
        if len(cases) > 1:
            gens = greedy_generate_batch(
                ours.net, prompts, encs, [GREEDY_STEPS] * len(cases), EOS, keep_logits=True, prefill_rows=1
            )
        else:
            gens = [greedy_generate(ours.net, prompts[0], encs[0], GREEDY_STEPS, EOS, keep_logits=True)]
        for s, enc, prompt, gen in zip(cases, encs, prompts, gens):
            _runs["ours", preset, s] = (np.array(enc), prompt, gen)
    return _runs[key]


@pytest.fixture(scope="module", autouse=True)
def _release_models():
    yield
    _models.clear()
    _runs.clear()


# One preset after the other (pair() keeps one pair of models loaded): the real shapes load once.
@pytest.mark.parametrize(("preset", "seconds"), [(p, s) for p in PRESETS for s in SECONDS])
def test_stages_match_official(checkpoints, measurements, preset, seconds):
    ref, ours = pair(checkpoints, preset)
    run = reference_run(checkpoints, preset, seconds)
    wav = signal(seconds)

    mel = log_mel_spectrogram(wav)
    assert mel.shape == run.mel.shape
    mel_diff = max_abs(mel, run.mel)
    assert mel_diff <= 1e-4

    # The encoder is fed the reference's mel so that each stage is judged on its own.
    enc, prompt, gen = our_run(checkpoints, preset, seconds)
    assert enc.shape == run.encoder.shape
    enc_cos, enc_diff = cosine(enc, run.encoder), max_abs(enc, run.encoder)
    assert enc_cos >= 0.99999

    assert prompt == run.input_ids

    ours_logits = np.stack([np.array(x) for x in gen.logits])
    logit_cos = cosine(ours_logits[0], run.prefill_logits)
    logit_diff = max_abs(ours_logits[0], run.prefill_logits)
    assert logit_cos >= 0.99999

    expected = [t for t in run.greedy_ids if t not in EOS]
    assert gen.tokens == expected
    # Every step of the two decodes, not only the first, sees the same distribution.
    steps = min(len(ours_logits), len(run.step_logits))
    step_cos = min(cosine(ours_logits[i], run.step_logits[i]) for i in range(steps))
    assert step_cos >= 0.9999
    measurements.append(
        f"{preset:>5} {seconds:5.1f}s  mel max-abs {mel_diff:.1e} | encoder cos {enc_cos:.7f} max-abs "
        f"{enc_diff:.1e} | prefill logits cos {logit_cos:.7f} max-abs {logit_diff:.1e} | "
        f"greedy ids {sum(a == b for a, b in zip(gen.tokens, expected))}/{len(expected)} equal, "
        f"worst step cos {step_cos:.6f}"
    )


@pytest.mark.parametrize("preset", PRESETS[::-1])  # the real shapes first: still loaded
def test_the_window_mask_changes_the_reference_past_8_seconds(checkpoints, preset):
    """The 8.1 s case can only catch a missing window if windowing matters there."""
    ref, _ = pair(checkpoints, preset)
    run = reference_run(checkpoints, preset, WINDOW_SECONDS)
    unwindowed = ref.encode(run.mel, windowed=False)
    ours_out, _, _ = our_run(checkpoints, preset, WINDOW_SECONDS)  # the encoder output the case judged
    assert max_abs(unwindowed, run.encoder) > 1e-2
    assert max_abs(ours_out, unwindowed) > 1e-2


# bfloat16 and float16: each stage against the official float32 run, by cosine.
HALF_MIN_COSINE = {"encoder": 0.995, "prefill logits": 0.99}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_follows_official(checkpoints, measurements, dtype):
    ref, _ = pair(checkpoints, "tiny")
    run = reference_run(checkpoints, "tiny", 7.9)
    ours = mlx_qwen3asr.load(checkpoints("tiny"), dtype=dtype)
    cfg = ours.config.audio_config
    enc = ours.net.audio_tower(encoder_batch([run.mel], cfg, ours.dtype))
    prompt = build_prompt_ids(ours.tokenizer, enc.shape[0])
    gen = greedy_generate(ours.net, prompt, enc, 4, EOS, keep_logits=True)
    enc = np.array(enc.astype(mx.float32))
    logits = np.array(gen.logits[0].astype(mx.float32))
    figures = {"encoder": cosine(enc, run.encoder), "prefill logits": cosine(logits, run.prefill_logits)}
    measurements.append(f"{dtype} tiny 7.9s: " + ", ".join(f"{k} cos {v:.5f}" for k, v in figures.items()))
    for stage, value in figures.items():
        assert value >= HALF_MIN_COSINE[stage], (stage, value)
