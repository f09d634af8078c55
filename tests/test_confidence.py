"""Segment confidence as Whisper's clients read it: avg_logprob (the mean log-probability of the greedy
tokens of the text) and no_speech_prob (the probability of the answer "language None"), checked against
the official model's scores, row by row in a batch, and in the JSON documents."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from reference import OfficialReference, test_signal

import mlx_qwen3asr
from mlx_qwen3asr.audio.cutting import Span
from mlx_qwen3asr.audio.features import log_mel_spectrogram
from mlx_qwen3asr.model.encoder import encoder_batch
from mlx_qwen3asr.model.generate import (
    DecodeBatch,
    Generation,
    HeaderIds,
    greedy_generate,
)
from mlx_qwen3asr.outputs.render import render_json, segment_json
from mlx_qwen3asr.pipeline.assembly import decoded_segment
from mlx_qwen3asr.pipeline.result import Segment, Transcription
from tools.prompts import build_prompt_ids

EOS = frozenset({151643, 151645})
STEPS = 24
SECONDS = 3.0
WAV = test_signal(SECONDS, seed=7)


@pytest.fixture(scope="module")
def pair(checkpoints):
    path = checkpoints("tiny")
    return OfficialReference(path), mlx_qwen3asr.load(path, dtype="float32")


@pytest.fixture(scope="module")
def detected(pair):
    """The official greedy run with the language left to the model."""
    ref, _ = pair
    return ref.run(WAV, steps=STEPS)


@pytest.fixture(scope="module")
def features(pair, detected):
    """Our encoder's output for the official mel spectrogram (each stage judged on its own)."""
    _, ours = pair
    return ours.net.audio_tower(encoder_batch([detected.mel], ours.config.audio_config))


@pytest.fixture(scope="module")
def real(pair) -> HeaderIds:
    """The answer's header ids, as the checkpoint's tokenizer spells them."""
    return HeaderIds.from_tokenizer(pair[1].tokenizer)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    return torch.log_softmax(torch.from_numpy(np.asarray(logits, dtype=np.float32)), dim=-1).numpy()


def chosen_logprobs(step_logits: np.ndarray, ids: list[int]) -> np.ndarray:
    """The official log-probability of each greedy token (EOS included), from its step's scores."""
    steps = log_softmax(step_logits[: len(ids)])
    return steps[np.arange(len(ids)), ids]


@torch.no_grad()
def official_next_logits(ref: OfficialReference, text: str) -> tuple[list[int], np.ndarray]:
    """The official prompt ids and the logits at its last position, for a prompt text given whole."""
    inputs = ref.processor(text=[text], audio=[WAV], return_tensors="pt", padding=True)
    with ref.windowed():
        out = ref.model.generate(
            **inputs, max_new_tokens=1, do_sample=False, pad_token_id=151643, output_logits=True
        )
    return inputs["input_ids"][0].tolist(), out.logits[0][0].float().numpy()


def decode(net, prompts, feats, budgets, header, prefill_rows=None) -> list[Generation]:
    batch = DecodeBatch(net, EOS, header=header, prefill_rows=prefill_rows)
    done = dict(batch.add(prompts, feats, budgets, range(len(prompts))))
    while len(batch):
        done.update(batch.step())
    return [done[i] for i in range(len(prompts))]


def test_the_header_ids_are_the_vocabulary_s(pair):
    tok = pair[1].tokenizer
    header = HeaderIds.from_tokenizer(tok)
    assert header == HeaderIds(turn=151644, language=11528, none=2240)  # the Qwen3-ASR vocabulary's
    assert tok.encode("assistant\nlanguage None") == [
        tok.encode("assistant")[0],
        198,
        header.language,
        header.none,
    ]
    assert tok.encode("language None<asr_text>")[:2] == [header.language, header.none]
    assert tok.token_to_id("<|im_start|>") == header.turn


def test_avg_logprob_is_the_official_mean_log_softmax_of_the_greedy_tokens(
    pair,
    detected,
    features,
):
    _, ours = pair
    prompt = build_prompt_ids(ours.tokenizer, int(features.shape[0]))
    assert prompt == detected.input_ids
    gen = greedy_generate(ours.net, prompt, features, STEPS, EOS)
    ids = detected.greedy_ids
    assert gen.tokens == [t for t in ids if t not in EOS]
    expected = chosen_logprobs(detected.step_logits, ids)
    # One value per token, and one for the EOS when decoding ended on one.
    assert len(gen.logprobs) == len(ids)
    np.testing.assert_allclose(gen.logprobs, expected, atol=1e-3)
    assert all(lp <= 0 for lp in gen.logprobs) and min(gen.logprobs) < -1e-3

    seg = decoded_segment(ours.tokenizer, gen, Span(0, len(WAV)), None)
    tag = ours.tokenizer.token_to_id("<asr_text>")
    text_from = ids.index(tag) + 1 if tag in ids else 0  # the header the model writes is left out
    assert seg.avg_logprob == pytest.approx(float(np.mean(expected[text_from:])), abs=1e-3)


def test_no_speech_prob_where_the_model_names_the_language(pair, detected, features, real):
    """Random weights never write "language" first: the model's own first token stands in for it here,
    so the step after it is where the probability of " None" is read."""
    _, ours = pair
    ids = detected.greedy_ids
    first = ids[0]
    assert first not in EOS and len(ids) > 2
    header = HeaderIds(turn=real.turn, language=first, none=real.none)
    (gen,) = decode(ours.net, [detected.input_ids], [features], [STEPS], header)
    expected = float(log_softmax(detected.step_logits[1])[real.none])
    assert gen.no_speech_prob is not None and 0 < gen.no_speech_prob < 1
    assert np.log(gen.no_speech_prob) == pytest.approx(expected, abs=1e-3)
    # With the real header ids the model never named a language: there is no such place.
    (plain,) = decode(ours.net, [detected.input_ids], [features], [STEPS], real)
    assert plain.tokens == gen.tokens and plain.no_speech_prob is None
    assert decoded_segment(ours.tokenizer, plain, Span(0, len(WAV)), None).no_speech_prob == 0.0


def test_a_forced_language_takes_no_speech_prob_from_the_prompt(pair, features, real):
    ref, ours = pair
    forced = ref.run(WAV, language="English", steps=8)
    prompt = build_prompt_ids(ours.tokenizer, int(features.shape[0]), language="English")
    assert prompt == forced.input_ids
    at = len(prompt) - 3  # ... "language" " English" <asr_text>
    assert prompt[at] == real.language
    head_ids, head_logits = official_next_logits(ref, ref.prompt_text() + "language")
    assert head_ids == prompt[: at + 1]
    gen = greedy_generate(ours.net, prompt, features, 8, EOS, header=real)
    assert gen.tokens == [t for t in forced.greedy_ids if t not in EOS]
    assert gen.no_speech_prob is not None and 0 < gen.no_speech_prob < 1
    expected = float(log_softmax(head_logits)[real.none])
    assert np.log(gen.no_speech_prob) == pytest.approx(expected, abs=1e-3)
    # No header is written: every token is text.
    expected_lp = chosen_logprobs(forced.step_logits, forced.greedy_ids)
    seg = decoded_segment(ours.tokenizer, gen, Span(0, len(WAV)), "English")
    assert seg.avg_logprob == pytest.approx(float(np.mean(expected_lp)), abs=1e-3)
    assert seg.no_speech_prob == gen.no_speech_prob


def test_each_row_of_a_batch_gets_what_it_gets_alone(pair, real):
    _, ours = pair
    tok = ours.tokenizer
    rng = np.random.default_rng(3)
    seconds = [2.0, 5.5, 0.8, 3.3]
    languages = [None, "English", "Chinese", None]
    mels = [log_mel_spectrogram(test_signal(s, seed=int(rng.integers(100)))) for s in seconds]
    feats = [ours.net.audio_tower(encoder_batch([m], ours.config.audio_config)) for m in mels]
    prompts = [
        build_prompt_ids(tok, int(f.shape[0]), language=lang)
        for f, lang in zip(feats, languages, strict=True)
    ]
    budgets = [12, 7, 15, 9]
    # The first row's own first token stands in for "language": its next step names the language, and
    # it takes the place of "language" in the headers of the prompts with a forced language.
    first = decode(ours.net, prompts[:1], feats[:1], [1], real)[0].tokens[0]
    header = HeaderIds(turn=real.turn, language=first, none=real.none)
    prompts = [[first if t == real.language else t for t in p] for p in prompts]
    alone = [
        decode(ours.net, [p], [f], [b], header)[0] for p, f, b in zip(prompts, feats, budgets, strict=True)
    ]
    together = decode(ours.net, prompts, feats, budgets, header, prefill_rows=3)
    assert alone[0].no_speech_prob is not None  # read at a decoding step
    assert all(a.no_speech_prob is not None for a, lang in zip(alone, languages) if lang)  # in the prefill
    for a, t in zip(alone, together, strict=True):
        assert t.tokens == a.tokens
        np.testing.assert_allclose(t.logprobs, a.logprobs, atol=1e-4)
        assert len(t.logprobs) == len(t.tokens) + (0 if t.truncated or t.repetitive else 1)
        if a.no_speech_prob is None:
            assert t.no_speech_prob is None
        else:
            assert np.log(t.no_speech_prob) == pytest.approx(np.log(a.no_speech_prob), abs=1e-4)


def test_scripted_generations_need_no_scores():
    gen = Generation([1, 2], truncated=False, repetitive=False)
    assert gen.logprobs == [] and gen.no_speech_prob is None


def test_segment_json_carries_both_to_four_significant_digits():
    seg = Segment(0.0, 1.5, "hi", "English", avg_logprob=-0.123456, no_speech_prob=1.23456e-7)
    doc = segment_json(seg)
    assert (doc["avg_logprob"], doc["no_speech_prob"]) == (-0.1235, 1.235e-07)
    assert segment_json(Segment(0.0, 1.0, "", ""))["no_speech_prob"] == 0.0
    assert segment_json(Segment(0.0, 1.0, "", "", avg_logprob=float("-inf")))["avg_logprob"] is None
    result = Transcription("hi", "English", [seg], duration=1.5)
    (written,) = json.loads(render_json(result, []))["segments"]
    assert written["avg_logprob"] == -0.1235 and written["no_speech_prob"] == 1.235e-07


def test_the_text_s_mean_leaves_the_header_out(pair):
    tok = pair[1].tokenizer
    tokens = tok.encode("language English<asr_text>hello there")
    logprobs = [-0.5, -2.0, -0.25] + [-1.0] * (len(tokens) - 3) + [-0.1]  # then the EOS
    gen = Generation(tokens, truncated=False, repetitive=False, logprobs=logprobs, no_speech_prob=0.25)
    seg = decoded_segment(tok, gen, Span(0, 16000), None)
    text = logprobs[3:]
    assert seg.text == "hello there" and seg.language == "English"
    assert seg.avg_logprob == pytest.approx(sum(text) / len(text))
    assert seg.no_speech_prob == 0.25
    empty = Generation([], truncated=True, repetitive=False)
    assert decoded_segment(tok, empty, Span(0, 16000), None).avg_logprob == 0.0
