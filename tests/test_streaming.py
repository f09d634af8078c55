"""Live transcription (mlx_qwen3asr/pipeline/streaming.py) against the official streaming algorithm.

The reference is the official `Qwen3ASRModel.streaming_transcribe` / `finish_streaming_transcribe`
themselves, run with backend "vllm" on an adapter that serves their `generate` calls with the official
transformers model: the official processor tokenizes the prompt text and extracts the features, the
encoder is windowed as vLLM runs it (tests/reference.py), decoding is greedy, and the new tokens are
decoded with special tokens skipped, as vLLM returns them. Both sides run the tiny random-weight
checkpoint in float32 with the same small token budget: random weights rarely write EOS, so every
decode runs to the budget and the texts are long enough for the rollback to matter.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from official import official_inference_module, official_module
from reference import OfficialReference, test_signal

import mlx_qwen3asr
from mlx_qwen3asr.checkpoints.tokenizer import Tokenizer, official_loader_patches_regex
from mlx_qwen3asr.pipeline.streaming import (
    StreamingTranscriber,
    rollback_prefix,
    tail_rollback_prefix,
)
from mlx_qwen3asr.text.output import join_texts

SR = 16000
BUDGET = 12  # below the 20 repetitions that stop our decoding early (vLLM has no such stop)
CHUNK = 2 * SR


class TransformersAsVLLM:
    """What the official streaming methods call on `self.model`: vLLM's `generate`, served by the
    official processor and transformers model. Records the prompt ids of every call."""

    def __init__(self, ref: OfficialReference, processor):
        self.ref, self.processor = ref, processor
        self.prompt_ids: list[list[int]] = []
        self.prompts: list[str] = []

    @torch.no_grad()
    def generate(self, inputs, sampling_params=None, use_tqdm=True):
        assert len(inputs) == 1
        item = inputs[0]
        audio = item["multi_modal_data"]["audio"]
        enc = self.processor(text=[item["prompt"]], audio=audio, return_tensors="pt", padding=True)
        ids = enc["input_ids"][0].tolist()
        self.prompt_ids.append(ids)
        self.prompts.append(item["prompt"])
        with self.ref.windowed():
            out = self.ref.model.generate(
                **enc, max_new_tokens=sampling_params.max_tokens, do_sample=False, pad_token_id=151643
            )
        new = out.sequences[0, len(ids) :].tolist()
        text = self.processor.tokenizer.decode(new, skip_special_tokens=True)
        return [SimpleNamespace(outputs=[SimpleNamespace(text=text)])]


class Scripted:
    """A stand-in for vLLM that answers each call with the next of a list of texts."""

    def __init__(self, texts):
        self.texts, self.prompts = list(texts), []

    def generate(self, inputs, sampling_params=None, use_tqdm=True):
        self.prompts.append(inputs[0]["prompt"])
        return [SimpleNamespace(outputs=[SimpleNamespace(text=self.texts.pop(0))])]


@pytest.fixture(scope="module")
def tiny(checkpoints):
    return checkpoints("tiny")


@pytest.fixture(scope="module")
def model(tiny):
    return mlx_qwen3asr.load(tiny, dtype="float32")


@pytest.fixture(scope="module")
def reference(tiny):
    return OfficialReference(tiny)


@pytest.fixture(scope="module")
def processors(tiny, reference):
    """The official processor with the model's own (Qwen) split, and as the official loader builds it."""
    backend = official_module("core.transformers_backend")
    qwen = backend.Qwen3ASRProcessor.from_pretrained(str(tiny), fix_mistral_regex=False)
    return {"qwen": qwen, "loader": reference.processor}


def official_wrapper(model, processor, budget=BUDGET):
    """The official Qwen3ASRModel with backend "vllm", on `model` (anything with vLLM's generate)."""
    inference = official_inference_module()
    return inference.Qwen3ASRModel(
        backend="vllm",
        model=model,
        processor=processor,
        sampling_params=SimpleNamespace(temperature=0.0, max_tokens=budget),
        max_new_tokens=None,
    )


def speech_with_pauses(seconds: float, seed: int) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Speech-like bursts of 1.5-3.5 s between near-silent pauses of 0.5-1.0 s; returns the audio and
    the pauses as [start, end) sample spans."""
    rng = np.random.default_rng(seed)
    total = int(seconds * SR)
    parts, pauses, pos = [], [], 0
    while pos < total:
        burst = int(rng.uniform(1.5, 3.5) * SR)
        parts.append(test_signal(burst / SR, seed=int(rng.integers(1 << 30))))
        pos += burst
        gap = int(rng.uniform(0.5, 1.0) * SR)
        parts.append((1e-4 * rng.standard_normal(gap)).astype(np.float32))
        pauses.append((pos, pos + gap))
        pos += gap
    return np.concatenate(parts)[:total], pauses


def feed_sizes(total: int, seed: int) -> list[int]:
    """Uneven piece sizes adding up to `total`: empty pieces, single samples, several chunks at once."""
    rng = np.random.default_rng(seed)
    sizes, left = [], total
    while left > 0:
        n = int(rng.choice([0, 1, 777, 5000, 16001, 40000, 70000]))
        n = min(n, left)
        sizes.append(n)
        left -= n
    return sizes


def run_both(model, reference, processor, audio, sizes, *, language=None, context="", tokenizer=None):
    """Feed `audio` in pieces of `sizes` to both sides; checks language, text and prompt ids after every
    piece and after finish. Returns (official state, our transcriber, adapter)."""
    adapter = TransformersAsVLLM(reference, processor)
    official = official_wrapper(adapter, processor)
    state = official.init_streaming_state(context=context, language=language)
    ours = StreamingTranscriber(
        model,
        language=language,
        context=context,
        max_new_tokens=BUDGET,
        max_window_seconds=None,
        tokenizer=tokenizer,
    )
    pos = 0
    for n in sizes:
        piece = audio[pos : pos + n]
        pos += n
        calls = len(adapter.prompt_ids)
        official.streaming_transcribe(piece, state)
        updates = ours.feed(piece)
        assert len(updates) == len(adapter.prompt_ids) - calls
        assert ours.chunk_id == state.chunk_id
        assert (ours.window_language, ours.text) == (state.language, state.text)
        if updates:
            assert ours.last_prompt_ids == adapter.prompt_ids[-1]
            assert (updates[-1].language, updates[-1].text) == (state.language, state.text)
    calls = len(adapter.prompt_ids)
    official.finish_streaming_transcribe(state)
    final = ours.finish()
    if len(adapter.prompt_ids) > calls:
        assert ours.last_prompt_ids == adapter.prompt_ids[-1]
    assert (final.language, final.text) == (state.language, state.text)
    assert final.final and final.stable == final.text and final.unstable == ""
    return state, ours, adapter


def check_rollback_was_exercised(official, adapter, tokenizer):
    """The prefixes were real: some prompt carried a prefix of several tokens."""
    prefixes = [p[len(official) :] for p in adapter.prompts]
    assert prefixes[:2] == ["", ""]
    assert any(len(tokenizer.encode(p)) >= 3 for p in prefixes[2:])


def test_parity_chunk_by_chunk(model, reference, processors, measurements):
    audio = test_signal(9.0, seed=3)
    state, ours, adapter = run_both(model, reference, processors["qwen"], audio, [CHUNK] * 4 + [SR])
    assert len(adapter.prompt_ids) == 5  # four chunks and the tail
    raw_tokens = len(model.tokenizer.encode(state._raw_decoded))
    assert raw_tokens > 8
    prompt_raw = official_wrapper(None, processors["qwen"])._build_text_prompt("", None)
    check_rollback_was_exercised(prompt_raw, adapter, model.tokenizer)
    prefix_tokens = [len(model.tokenizer.encode(p[len(prompt_raw) :])) for p in adapter.prompts]
    measurements.append(
        f"streaming parity tiny 9.0 s: 5 decodes equal (language, text, prompt ids); prefix tokens per "
        f"decode {prefix_tokens}, final raw {raw_tokens} tokens"
    )
    # The official step re-encodes everything from the start.
    assert ours.step_encoded_samples == [2 * SR, 4 * SR, 6 * SR, 8 * SR, 9 * SR]
    assert [(s.start, s.end, s.text) for s in ours.segments] == [(0.0, 9.0, state.text)]


def test_parity_with_encoder_windows_kept_between_steps(model, reference, processors, measurements):
    """Past 8 s the transcriber keeps the encoder output and prompt keys/values of complete encoder
    windows instead of encoding everything again; the official steps still come out."""
    noise = 0.01 * np.random.default_rng(6).standard_normal(21 * SR).astype(np.float32)
    audio = test_signal(21.0, seed=6) + noise
    state, ours, adapter = run_both(model, reference, processors["qwen"], audio, [CHUNK] * 10 + [SR])
    assert len(adapter.prompt_ids) == 11
    kept = [n for k, n in enumerate(ours.step_encoded_samples[:10], start=1) if n < k * CHUNK]
    assert len(kept) >= 5  # from the step at 12 s on, the first 8 s are not encoded again
    measurements.append(
        f"streaming parity tiny 21 s with encoder windows kept: 11 decodes equal; encoded "
        f"{sum(ours.step_encoded_samples) / SR:.0f} s of audio where the official steps encode "
        f"{sum(min(k * 2.0, 21.0) for k in range(1, 12)):.0f} s"
    )


@pytest.mark.parametrize(
    "language, context",
    [("English", ""), (None, "Glossary: MLX, Qwen3-ASR, Hugging Face."), ("french", "Réunion du comité")],
)
def test_parity_uneven_pieces_with_language_and_context(model, reference, processors, language, context):
    audio = test_signal(9.3, seed=5)
    sizes = feed_sizes(audio.size, seed=len(context))
    assert 0 in sizes and max(sizes) > CHUNK
    state, ours, adapter = run_both(
        model, reference, processors["qwen"], audio, sizes, language=language, context=context
    )
    prompt = official_wrapper(None, processors["qwen"])._build_text_prompt(context, state.force_language)
    check_rollback_was_exercised(prompt, adapter, model.tokenizer)
    if language:
        assert state.force_language == state.language == ours.window_language


def test_parity_with_the_official_loader_split(tiny, model, reference, processors):
    """With the official loader's tokenizer (fix_mistral_regex) on both sides the steps agree too."""
    patched = Tokenizer.from_dir(tiny, fix_mistral_regex=official_loader_patches_regex(tiny))
    audio = test_signal(7.0, seed=11)
    run_both(model, reference, processors["loader"], audio, [CHUNK] * 3 + [SR], tokenizer=patched)


def test_parity_int16_odd_sizes_and_a_two_dimensional_piece(model, reference, processors):
    audio = (test_signal(6.5, seed=7) * 32767).astype(np.int16)
    sizes = [1, 0, 3 * SR - 1, 1, 12345, audio.size - 3 * SR - 1 - 12345]
    adapter = TransformersAsVLLM(reference, processors["qwen"])
    official = official_wrapper(adapter, processors["qwen"])
    state = official.init_streaming_state()
    ours = StreamingTranscriber(model, max_new_tokens=BUDGET, max_window_seconds=None)
    pos = 0
    for n in sizes:
        piece = audio[pos : pos + n].reshape(-1, 1)  # (n, 1): flattened on both sides
        pos += n
        official.streaming_transcribe(piece, state)
        ours.feed(piece)
        assert ours.buffer.dtype == np.float32 and ours.buffer.size == state.buffer.size
        assert np.array_equal(ours.buffer, state.buffer)
        assert (ours.window_language, ours.text, ours.chunk_id) == (
            state.language,
            state.text,
            state.chunk_id,
        )
    official.finish_streaming_transcribe(state)
    assert ours.finish().text == state.text
    assert np.array_equal(ours.window.audio, state.audio_accum)


def test_finish_with_nothing_buffered_does_not_decode(model, reference, processors):
    audio = test_signal(4.0, seed=9)
    state, ours, adapter = run_both(model, reference, processors["qwen"], audio, [audio.size])
    assert len(adapter.prompt_ids) == 2  # the two chunks; finish had nothing to send
    assert ours.steps == 2 and ours.step_encoded_samples[-1] == 0
    assert state.text and ours.segments[-1].text == state.text


def test_empty_stream_and_empty_pieces_follow_the_official(model, processors):
    scripted = Scripted([])
    official = official_wrapper(scripted, processors["qwen"])
    state = official.init_streaming_state()
    ours = StreamingTranscriber(model, max_new_tokens=BUDGET)
    for piece in (np.zeros(0, np.float32), np.zeros(0, np.int16), []):
        official.streaming_transcribe(piece, state)
        assert ours.feed(piece) == []
    official.finish_streaming_transcribe(state)
    final = ours.finish()
    assert scripted.prompts == [] and ours.steps == 0 and ours.encoded_samples == 0
    assert (final.language, final.text, final.committed) == (state.language, state.text, [])
    assert final.final and ours.segments == []
    with pytest.raises(ValueError):
        official.streaming_transcribe(None, state)
    with pytest.raises(RuntimeError):
        ours.feed(np.zeros(10, np.float32))
    assert StreamingTranscriber(model).finish().text == ""
    with pytest.raises(ValueError):
        StreamingTranscriber(model).feed(None)
    with pytest.raises(ValueError):
        StreamingTranscriber(model, chunk_seconds=0)


# "𠀋𠀍" is two characters of three tokens each: cutting tokens off can leave U+FFFD.
ROLLBACK_TEXTS = [
    "language English<asr_text>Hello there, general Kenobi",
    "language Chinese<asr_text>今天下午我们在图书馆讨论了新项目的计划。😀🎉",
    "𠀋𠀍 ok",
    "a",
    "",
]


@pytest.mark.parametrize("raw", ROLLBACK_TEXTS)
@pytest.mark.parametrize("k", [0, 1, 2, 3, 5, 40])
def test_rollback_rules_equal_the_official_steps(model, processors, raw, k):
    """The prefix of a chunk step and of the tail step, read from the prompts the official methods
    send after a scripted previous output."""
    processor = processors["qwen"]
    tok = model.tokenizer
    ids = tok.encode(raw)
    for tail in (False, True):
        scripted = Scripted(["x", raw, "y"])
        official = official_wrapper(scripted, processor)
        state = official.init_streaming_state(unfixed_chunk_num=2, unfixed_token_num=k, chunk_size_sec=0.5)
        official.streaming_transcribe(np.zeros(SR // 2, np.float32), state)
        official.streaming_transcribe(np.zeros(SR // 2, np.float32), state)  # now raw is the scripted text
        assert state._raw_decoded == raw
        if tail:
            official.streaming_transcribe(np.zeros(SR // 4, np.float32), state)
            official.finish_streaming_transcribe(state)
            expected, ours = scripted.prompts[-1][len(state.prompt_raw) :], tail_rollback_prefix(tok, raw, k)
        else:
            official.streaming_transcribe(np.zeros(SR // 2, np.float32), state)
            expected, ours = scripted.prompts[-1][len(state.prompt_raw) :], rollback_prefix(tok, raw, k)
        assert ours == expected
    # The cases cover a broken character being dropped, and the tail's first token kept.
    if raw == "𠀋𠀍 ok" and k == 2:
        assert len(ids) == 7 and rollback_prefix(tok, raw, k) == "𠀋"
        assert tail_rollback_prefix(tok, raw, k) == "𠀋\ufffd"
    if raw == "a":
        assert tail_rollback_prefix(tok, raw, 5) == "a" and rollback_prefix(tok, raw, 5) == ""


def test_prompt_ids_equal_the_official_tokenization_of_prompt_and_prefix(model, processors):
    """Our ids for prompt + prefix equal the official processor's tokenization of the rendered text,
    for prefixes that merge with the text before them or start with a control-looking string."""
    processor = processors["qwen"]
    official = official_wrapper(None, processor)
    wav = test_signal(3.0, seed=1)
    prefixes = [
        "",
        "language English<asr_text>Hello",
        "language English\n<asr_text> spaced",
        "\n\nnew lines",
        " leading space",
        "<asr_text>tag first",
        "language Chinese<asr_text>今天下午",
        "ünïcödé's",
    ]
    for language in (None, "English"):
        for context in ("", "Glossary: JavaScript"):
            prompt_raw = official._build_text_prompt(context=context, force_language=language)
            ours = StreamingTranscriber(model, language=language, context=context)
            for prefix in prefixes:
                enc = processor(text=[prompt_raw + prefix], audio=[wav], return_tensors="pt", padding=True)
                expected = enc["input_ids"][0].tolist()
                n = expected.count(model.tokenizer.token_to_id("<|audio_pad|>"))
                assert ours.prompt_ids(n, prefix) == expected, (language, context, prefix)


# --- bounded cost -----------------------------------------------------------------------------------


def test_bounded_window_commits_at_pauses(model, measurements):
    audio, pauses = speech_with_pauses(150.0, seed=2)
    max_window = 8.0
    stream = StreamingTranscriber(model, max_new_tokens=6, max_window_seconds=max_window)
    updates = []
    pos = 0
    for n in feed_sizes(audio.size, seed=4):
        updates += stream.feed(audio[pos : pos + n])
        pos += n
    final = stream.finish()
    committed = [s for u in updates for s in u.committed]
    measurements.append(
        f"streaming bounded tiny 150 s, max window {max_window:g} s: {len(committed)} commits, encoder "
        f"samples per step max {max(stream.step_encoded_samples) / SR:.1f} s, "
        f"segments {min(s.end - s.start for s in committed):.1f}-{max(s.end - s.start for s in committed):.1f} s"
    )
    assert len(updates) == audio.size // CHUNK
    assert len(committed) >= 150 / (max_window + 2.0)
    # Each step encodes at most the window bound, at the start as at the end of the stream.
    bound = int((max_window + 2.0) * SR)
    assert max(u.encoded_samples for u in updates) <= bound
    assert max(stream.step_encoded_samples) <= bound
    assert sum(stream.step_encoded_samples) == stream.encoded_samples
    # Every cut lies in a pause.
    for seg in committed:
        cut = round(seg.end * SR)
        assert any(a <= cut < b for a, b in pauses), seg.end
    # In order, touching, from 0 up to the last commit; finish commits the rest.
    segments = stream.segments
    assert segments == committed + final.committed and len(final.committed) == 1
    assert segments[0].start == 0.0 and segments[-1].end == audio.size / SR
    for a, b in zip(segments, segments[1:]):
        assert a.end == b.start and a.end > a.start
    assert all(s.text for s in segments)
    assert final.text == join_texts([s.text for s in segments], final.language)
    # The text after a commit begins with the committed text, marked stable.
    for u in updates:
        assert u.text == u.stable + u.unstable
        if u.committed:
            assert u.committed[-1].text in u.stable


def test_a_window_under_the_threshold_is_the_official_stream(model):
    """Bounded mode changes nothing while the window stays under max_window_seconds."""
    audio = test_signal(9.0, seed=3)
    runs = []
    for max_window in (None, 20.0):
        stream = StreamingTranscriber(model, max_new_tokens=BUDGET, max_window_seconds=max_window)
        updates = stream.feed(audio[: 5 * SR]) + stream.feed(audio[5 * SR :]) + [stream.finish()]
        runs.append([(u.language, u.text, u.stable, u.encoded_samples) for u in updates])
        assert [(s.start, s.end) for s in stream.segments] == [(0.0, 9.0)]
    assert runs[0] == runs[1] and len(runs[0]) == 5


def test_stable_part_is_the_next_prefix(model):
    """The unstable tail is what the next step rolls back: the next prompt carries exactly the stable
    window text (in parity mode, where the window is the whole stream)."""
    audio = test_signal(8.0, seed=13)
    stream = StreamingTranscriber(model, max_new_tokens=BUDGET, max_window_seconds=None)
    updates = stream.feed(audio)
    assert [bool(u.stable) for u in updates] == [False, True, True, True]
    assert updates[0].unstable == updates[0].text
    for u in updates[1:]:
        assert u.unstable and u.text == u.stable + u.unstable
    rolled = rollback_prefix(stream.tokenizer, stream.window.raw, stream.unfixed_tokens)
    assert updates[-1].stable.strip() and updates[-1].stable.strip() in rolled


def test_window_threshold_must_leave_stable_audio(model):
    with pytest.raises(ValueError, match="max_window_seconds"):
        StreamingTranscriber(model, max_window_seconds=4.5)
    StreamingTranscriber(model, max_window_seconds=float("inf"))


def test_the_decode_seam_gets_each_window_and_the_ids_after_the_prompt_start(model):
    """A decode given to the transcriber receives every decode's audio, the builder of the ids after
    the prompt start and the budget; serving them as the default does gives the same stream."""
    from mlx_qwen3asr.audio.features import log_mel_spectrogram
    from mlx_qwen3asr.model.generate import greedy_generate, prefill_prefix
    from mlx_qwen3asr.pipeline.encoding import encode_segments
    from mlx_qwen3asr.text.prompt import prompt_prefix_ids

    audio = test_signal(7.0, seed=21)
    tok = model.tokenizer
    start_ids = prompt_prefix_ids(tok, "notes")
    start = prefill_prefix(model.net, start_ids)
    eos = {tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")}
    calls = []

    def decode(samples, suffix, budget):
        features = encode_segments(model, [log_mel_spectrogram(samples)])[0]
        rest = suffix(int(features.shape[0]))
        calls.append((samples.shape[0], start_ids + rest, budget))
        return greedy_generate(model.net, rest, features, budget, eos, prefix=start)

    runs, prompts = [], []
    for seam in (None, decode):
        stream = StreamingTranscriber(
            model, context="notes", max_new_tokens=BUDGET, max_window_seconds=5.0, decode=seam
        )
        updates = stream.feed(audio[: 3 * SR])
        prompts.append(stream.last_prompt_ids)
        updates += stream.feed(audio[3 * SR :]) + [stream.finish()]
        runs.append([(u.language, u.text, u.stable, u.encoded_samples, len(u.committed)) for u in updates])
    assert runs[0] == runs[1] and any(r[-1] for r in runs[0][:-1])  # a commit during the stream
    assert prompts[0] == prompts[1] == calls[0][1] and len(calls) == stream.steps + len(stream.segments) - 1
    assert all(budget == BUDGET for _, _, budget in calls)
    # The window grows a chunk a step (the whole window is encoded again).
    assert [n for n, _, _ in calls][:2] == [2 * SR, 4 * SR]
