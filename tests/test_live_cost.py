"""What keeps a live step cheap (mlx_qwen3asr/pipeline/window_decode.py and commits.py,
model/draft.py): drafts checked in one pass, the keys and values of a longer shared prompt start, encoder windows kept between steps,
commits at pauses without another decode, and a commit's head decoded after what the window wrote.
Each is checked against the plain computation it replaces; the official parity of a stream that
keeps encoder windows is in tests/test_streaming.py."""

from __future__ import annotations

import numpy as np
import pytest
from reference import test_signal

import mlx_qwen3asr
from mlx_qwen3asr.audio.features import log_mel_spectrogram
from mlx_qwen3asr.model.generate import extend_prefix, greedy_generate, prefill_prefix
from mlx_qwen3asr.pipeline import rollback, window_decode
from mlx_qwen3asr.pipeline.encoding import encode_segments
from mlx_qwen3asr.pipeline.streaming import StreamingTranscriber

SR = 16000
CHUNK = 2 * SR


@pytest.fixture(scope="module")
def model(checkpoints):
    return mlx_qwen3asr.load(str(checkpoints("tiny")))


@pytest.fixture(scope="module")
def prompt(model):
    """A live prompt (system start, 6 s of audio, a text prefix) and its audio features."""
    features = encode_segments(model, [log_mel_spectrogram(test_signal(6.0, seed=5))])[0]
    stream = StreamingTranscriber(model, language="English")
    start = prefill_prefix(model.net, stream._start_ids)
    rest = stream._rest_ids(int(features.shape[0]), "the words so far")
    return start, rest, features


def eos_of(model):
    tok = model.tokenizer
    return frozenset({tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")})


# --------------------------------------------------------------------------------------------------
# Drafts and longer prefixes (model/generate.py)


@pytest.mark.parametrize("kind", ["right", "half right", "wrong", "longer than the budget"])
def test_a_draft_gives_the_tokens_of_plain_greedy_decoding(model, prompt, kind):
    start, rest, features = prompt
    plain = greedy_generate(model.net, rest, features, 20, eos_of(model), prefix=start)
    assert len(plain.tokens) == 20 and plain.drafted == 0
    draft, budget, taken = {
        "right": (plain.tokens[:10], 20, 10),
        "half right": (plain.tokens[:4] + [t + 1 for t in plain.tokens[4:10]], 20, 4),
        "wrong": ([t + 1 for t in plain.tokens[:6]], 20, 0),
        "longer than the budget": (plain.tokens, 7, 6),
    }[kind]
    out = greedy_generate(model.net, rest, features, budget, eos_of(model), prefix=start, draft=draft)
    assert out.tokens == plain.tokens[:budget]
    assert out.drafted == taken
    assert out.truncated and not out.repetitive
    assert len(out.logprobs) == len(out.tokens)
    assert np.allclose(out.logprobs, plain.logprobs[:budget], atol=1e-4)


def test_a_draft_stops_where_greedy_decoding_meets_eos(model, prompt):
    """EOS picked inside the draft, or right after the accepted part, ends decoding as it would."""
    start, rest, features = prompt
    plain = greedy_generate(model.net, rest, features, 20, frozenset(), prefix=start)
    stop = frozenset({plain.tokens[5]}) - set(plain.tokens[:5])
    assert stop  # the sixth token has not come earlier
    alone = greedy_generate(model.net, rest, features, 20, stop, prefix=start)
    for draft in (plain.tokens[:12], plain.tokens[:5]):
        out = greedy_generate(model.net, rest, features, 20, stop, prefix=start, draft=draft)
        assert out.tokens == alone.tokens == plain.tokens[:5]
        assert not out.truncated and out.drafted == 5


def test_a_prefix_that_holds_audio_decodes_as_the_whole_prompt(model, prompt):
    start, rest, features = prompt
    audio_id = model.net.config.audio_token_id
    head = rest.index(audio_id)
    whole = greedy_generate(model.net, rest, features, 16, eos_of(model), prefix=start)
    for k in (13, 50):
        longer = extend_prefix(model.net, start, rest[: head + k], features[:k])
        assert longer.audio_tokens == k and len(longer.ids) == len(start.ids) + head + k
        part = greedy_generate(model.net, rest[head + k :], features[k:], 16, eos_of(model), prefix=longer)
        assert part.tokens == whole.tokens
        assert np.allclose(part.logprobs, whole.logprobs, atol=1e-4)
    with pytest.raises(ValueError, match="audio placeholders"):
        extend_prefix(model.net, start, rest[: head + 5], features[:4])


# --------------------------------------------------------------------------------------------------
# Encoder windows kept between steps


def stream_texts(model, audio, **options):
    stream = StreamingTranscriber(model, language="English", max_new_tokens=6, **options)
    updates = []
    for pos in range(0, audio.shape[0], CHUNK):
        updates += stream.feed(audio[pos : pos + CHUNK])
    updates.append(stream.finish())
    return stream, [(u.text, u.stable, len(u.committed)) for u in updates]


def test_kept_encoder_windows_give_the_stream_of_encoding_everything(model, measurements):
    # A noise floor 40 dB down keeps every mel bin above the log-mel floor (80 dB under the loudest),
    # so louder frames later change no earlier frame.
    audio = test_signal(30.0, seed=8) + 0.01 * np.random.default_rng(8).standard_normal(30 * SR).astype(
        np.float32
    )
    kept, kept_texts = stream_texts(model, audio, max_window_seconds=None)
    whole, whole_texts = stream_texts(model, audio, max_window_seconds=None, reuse_blocks=False)
    assert kept_texts == whole_texts
    assert whole.step_encoded_samples[:15] == [CHUNK * (k + 1) for k in range(15)]

    # An encoder window (8 s) is complete once a mel frame follows it: a step encodes the audio after
    # the windows that were complete at the step before.
    def complete(n: int) -> int:
        return max(0, (n // 160 - 1) // 800) * 800 * 160

    sizes = [CHUNK * (k + 1) for k in range(15)]
    assert kept.step_encoded_samples[:15] == [n - complete(n - CHUNK) for n in sizes]
    assert kept.step_encoded_samples[5:8] == [4 * SR, 6 * SR, 8 * SR]
    measurements.append(
        f"live encoder windows kept, tiny 30 s unbounded: {sum(kept.step_encoded_samples) / SR:.0f} s encoded "
        f"vs {sum(whole.step_encoded_samples) / SR:.0f} s, the same text at all {len(kept_texts)} steps"
    )


def test_a_louder_sound_later_encodes_the_changed_windows_again(model):
    """The log-mel floor follows the loudest frame: quiet frames of earlier windows change with it,
    and those windows are encoded again; before and after, the kept ones are used."""
    audio = test_signal(24.0, seed=9) * 0.05
    audio[: 2 * SR] = 0.0  # digital silence sits on the floor
    audio[int(15.2 * SR) : int(15.6 * SR)] *= 40.0  # arrives with the chunk that ends at 16 s
    kept, kept_texts = stream_texts(model, audio, max_window_seconds=None)
    _, whole_texts = stream_texts(model, audio, max_window_seconds=None, reuse_blocks=False)
    assert kept_texts == whole_texts
    steps = kept.step_encoded_samples
    assert steps[5] == 4 * SR  # 12 s: the window 0-8 s kept
    assert steps[7] == 16 * SR  # 16 s: everything again
    assert steps[8:10] == [10 * SR, 4 * SR]  # 18 s: the first window kept again; 20 s: both


def test_the_conv_stem_of_complete_chunks_is_kept(model, monkeypatch):
    calls = []
    tower = model.net.audio_tower
    embed = type(tower).embed_chunks

    def counted(self, chunks):
        calls.append(int(chunks.shape[0]))
        return embed(self, chunks)

    monkeypatch.setattr(type(tower), "embed_chunks", counted)
    stream = StreamingTranscriber(model, language="English", max_new_tokens=4, max_window_seconds=None)
    audio = test_signal(6.0, seed=10)
    for pos in range(0, audio.shape[0], CHUNK):
        calls.clear()
        stream.feed(audio[pos : pos + CHUNK])
        # 2 s more: the chunk that was last (no frame after it) and the new ones; 1, then 2 + 1.
        assert sum(calls) == (2 if pos == 0 else 3)


# --------------------------------------------------------------------------------------------------
# Commits


def speech_then_pause(pause_at: float, seconds: float, seed: int) -> np.ndarray:
    """Speech-like audio with a 1.2 s near-silent pause starting at `pause_at` s."""
    audio = test_signal(seconds, seed=seed)
    a, b = int(pause_at * SR), int((pause_at + 1.2) * SR)
    audio[a:b] = 1e-4 * np.random.default_rng(seed).standard_normal(b - a)
    return audio


class Counting:
    """A decode seam that decodes as the default does and records each call's samples and prompt."""

    def __init__(self, model):
        self.model = model
        stream = StreamingTranscriber(model, language="English")
        self.start_ids = stream._start_ids
        self.start = prefill_prefix(model.net, self.start_ids)
        self.calls: list[tuple[int, list[int]]] = []

    def __call__(self, samples, suffix, budget):
        features = encode_segments(self.model, [log_mel_spectrogram(samples)])[0]
        rest = suffix(int(features.shape[0]))
        self.calls.append((samples.shape[0], rest))
        return greedy_generate(self.model.net, rest, features, budget, eos_of(self.model), prefix=self.start)


def test_a_pause_where_a_decode_ended_is_committed_without_decoding_again(model):
    audio = speech_then_pause(11.4, 20.0, seed=11)  # 11.4-12.6 s: the decode at 12 s ends in it
    seam = Counting(model)
    stream = StreamingTranscriber(model, language="English", max_new_tokens=8, decode=seam)
    updates = []
    for pos in range(0, audio.shape[0], CHUNK):
        updates += stream.feed(audio[pos : pos + CHUNK])
    step = next(k for k, u in enumerate(updates) if u.committed)
    # Committed at the step after 12 s (past half the 20 s bound), at 12 s, with the text the decode
    # at 12 s wrote; one decode per chunk, none for the commit.
    assert step == 6 and updates[step].seconds == 14.0
    [segment] = updates[step].committed
    assert (segment.start, segment.end) == (0.0, 12.0)
    assert segment.text == updates[5].text and segment.text
    assert len(seam.calls) == len(updates) == stream.steps
    assert stream.window.start == 12 * SR and seam.calls[6][0] == 2 * SR
    assert updates[step].stable.startswith(segment.text)


def test_no_pause_no_commit_before_the_bound(model):
    audio = test_signal(20.0, seed=12)  # speech throughout
    stream = StreamingTranscriber(model, language="English", max_new_tokens=4)
    updates = []
    for pos in range(0, audio.shape[0], CHUNK):
        updates += stream.feed(audio[pos : pos + CHUNK])
    assert not any(u.committed for u in updates) and stream.window.start == 0


def test_a_commit_cut_between_decodes_decodes_the_head_after_what_the_window_wrote(model):
    """Without a pause where a decode ended, the cut is the latest pause of the search range, and the
    head is decoded after the rollback of the last output that heard no audio past the cut."""
    audio = speech_then_pause(14.7, 24.0, seed=13)  # 14.7-15.9 s: between the decodes at 14 and 16 s
    seam = Counting(model)
    stream = StreamingTranscriber(model, language="English", max_new_tokens=8, decode=seam)
    updates = []
    for pos in range(0, audio.shape[0], CHUNK):
        updates += stream.feed(audio[pos : pos + CHUNK])
    [(k, segment)] = [(k, s) for k, u in enumerate(updates) for s in u.committed]
    assert 14.7 < segment.end < 15.9 and updates[k].seconds == 22.0
    head_samples, head_rest = seam.calls[k]  # the step's first decode is the head's
    assert head_samples == round(segment.end * SR)
    prefix = model.tokenizer.decode(head_rest, skip_special_tokens=False).split("<asr_text>")[-1]
    heard_at_14 = updates[6].stable[len("") :]  # the stable text after the decode at 14 s
    assert prefix and heard_at_14.startswith(prefix.strip()[:10])
    assert len(seam.calls) == stream.steps + 1


@pytest.mark.parametrize(
    ("window", "prefix", "head", "carried"),
    [
        ("one two three four five", "one two", " three", "four five"),
        ("one two three, four five", "one two", " three.", "four five"),
        ("language English<asr_text>one two three", "language English<asr_text>one", " two three.", ""),
        ("one two three four", "one two", " tree", ""),  # the head disagrees: nothing carried
        ("one two three four", "one, two", " three", ""),  # the window lost the prefix
    ],
)
def test_the_text_carried_into_the_new_window(window, prefix, head, carried):
    assert rollback.carried_text(window, prefix, head) == carried


def test_the_header_of_a_raw_output():
    assert rollback.header("language German<asr_text>Hallo") == "language German<asr_text>"
    assert rollback.header("Hallo") == ""


def test_an_unbounded_window_keeps_a_bounded_number_of_prompt_starts(model):
    """Each kept prompt start holds the keys and values of everything before it: only the last few
    are kept, however long the window."""
    audio = test_signal(50.0, seed=14) + 0.01 * np.random.default_rng(14).standard_normal(50 * SR).astype(
        np.float32
    )
    stream = StreamingTranscriber(model, language="English", max_new_tokens=2, max_window_seconds=None)
    for pos in range(0, audio.shape[0], CHUNK):
        stream.feed(audio[pos : pos + CHUNK])
    blocks = stream.windows.blocks
    assert len(blocks.prefixes) == 6  # 50 s: six complete 8 s windows
    held = [p for p in blocks.prefixes if p is not None]
    assert len(held) == window_decode.KEPT_PREFIXES and blocks.prefixes[-1] is held[-1]
    assert sum(f is not None for f in blocks.features) == window_decode.KEPT_PREFIXES
    assert stream.step_encoded_samples[-1] == 10 * SR  # still kept: only the audio after 40 s


def test_a_draft_after_a_prompt_without_audio(model, prompt):
    start, _, features = prompt
    text = model.tokenizer.encode("<|im_start|>assistant\nlanguage English<asr_text>hello")
    none = features[:0]
    plain = greedy_generate(model.net, text, none, 8, frozenset(), prefix=start)
    out = greedy_generate(model.net, text, none, 8, frozenset(), prefix=start, draft=plain.tokens[:3])
    assert out.tokens == plain.tokens and out.drafted == 3


# --------------------------------------------------------------------------------------------------
# The committed text


def test_a_step_joins_only_the_texts_committed_since_the_last(model, monkeypatch):
    """The transcript of an update, and the committed text the terminal shows beside the live words,
    are kept as they grow: a step at hour 3 joins as few texts as one at minute 1."""
    from mlx_qwen3asr.pipeline import joined, live_session, streaming
    from mlx_qwen3asr.pipeline.result import Segment
    from mlx_qwen3asr.text.output import join_texts

    counts = []

    def counting(texts, language=""):
        texts = list(texts)
        counts.append(len(texts))
        return join_texts(texts, language)

    monkeypatch.setattr(joined, "join_texts", counting)
    monkeypatch.setattr(streaming, "join_texts", counting)
    stream = StreamingTranscriber(model, language="English", max_new_tokens=2, chunk_seconds=0.5)
    session = live_session.LiveSession(stream, language="English")
    audio = test_signal(2.0, seed=15)
    work = []
    for k, at in enumerate(range(0, audio.shape[0], SR // 2)):
        stream.segments.extend(
            Segment(i, i + 1.0, f"word{i}", "English") for i in range(k * 500, (k + 1) * 500)
        )
        counts.clear()
        for update in session.feed(audio[at : at + SR // 2]):
            session.committed_before(update)
        work.append(sum(counts))
    want = join_texts([s.text for s in stream.segments], "English")
    assert session.committed_before(stream._last_update) == want
    assert stream._last_update.text.startswith(want)
    # 500 more committed segments before each step: each step joins those 500 (once for the update,
    # once for the display) and a few texts more, never the 2000 of them all.
    assert work[1:] == [work[1]] * 3 and work[1] <= 2 * 502 + 4
