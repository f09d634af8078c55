"""The forced aligner against the official one on the same random-weight checkpoints, and batching."""

from __future__ import annotations

import pytest
from reference import OfficialAligner, max_abs, test_signal

import mlx_qwen3asr
from mlx_qwen3asr.align import aligner_prompt, timestamp_classes
from mlx_qwen3asr.audio import log_mel_spectrogram
from mlx_qwen3asr.scheduler import encode_segments

ENGLISH = "so the first thing i want to talk about today is the budget for next year".split()

_pairs: dict = {}


def pair(checkpoints, preset):
    """(official aligner, ours) for a preset; one pair alive at a time to bound memory."""
    if preset not in _pairs:
        _pairs.clear()
        path = checkpoints(preset)
        _pairs[preset] = (OfficialAligner(path), mlx_qwen3asr.load(path, dtype="float32"))
    return _pairs[preset]


@pytest.fixture(scope="module", autouse=True)
def _release():
    yield
    _pairs.clear()


def our_classes(aligner, wavs, word_lists, keep_logits=False):
    features = encode_segments(aligner, [log_mel_spectrogram(w) for w in wavs])
    prompts = [aligner_prompt(aligner, int(f.shape[0]), words) for f, words in zip(features, word_lists)]
    return prompts, timestamp_classes(aligner, prompts, features, keep_logits=keep_logits)


@pytest.mark.parametrize("preset", ["aligner-tiny", "aligner"])
@pytest.mark.parametrize("seconds", [1.0, 8.1, 30.0, 170.0])
def test_timestamp_classes_match_official(checkpoints, measurements, preset, seconds):
    official, ours = pair(checkpoints, preset)
    wav = test_signal(seconds, seed=int(seconds * 10))
    words = ENGLISH * max(1, int(seconds // 10))
    ids, expected, logits = official.run(wav, words)
    (prompt,), (ours_logits,) = our_classes(ours, [wav], [words], keep_logits=True)
    assert prompt.ids == ids
    assert len(set(expected.tolist())) > 3  # the reference's classes vary: the comparison has teeth
    classes = ours_logits.argmax(-1)
    assert classes.tolist() == expected.tolist()
    diff = max_abs(ours_logits, logits)
    measurements.append(
        f"aligner {preset:>12} {seconds:5.1f}s  {len(words)} words: timestamp classes identical, "
        f"logits max-abs {diff:.1e}"
    )


def test_a_batch_gives_each_row_what_it_gets_alone(checkpoints):
    aligner = mlx_qwen3asr.load(checkpoints("aligner-tiny"), dtype="float32")
    wavs = [test_signal(s, seed=i) for i, s in enumerate([3.0, 11.0, 0.7, 25.0])]
    word_lists = [ENGLISH[:4], ENGLISH, ENGLISH[:1], ENGLISH * 4]
    _, together = our_classes(aligner, wavs, word_lists)
    for wav, words, batched in zip(wavs, word_lists, together):
        _, (alone,) = our_classes(aligner, [wav], [words])
        assert alone.tolist() == batched.tolist() and len(alone) == 2 * len(words)


def test_long_prompts_are_aligned_in_chunks(checkpoints, monkeypatch):
    from mlx_qwen3asr import align

    aligner = mlx_qwen3asr.load(checkpoints("aligner-tiny"), dtype="float32")
    wav = test_signal(40.0, seed=5)
    words = ENGLISH * 6
    _, (chunked,) = our_classes(aligner, [wav], [words])
    monkeypatch.setattr(align, "ALIGN_CHUNK", 10**6)
    _, (whole,) = our_classes(aligner, [wav], [words])
    assert chunked.tolist() == whole.tolist()


def test_aligning_with_a_speech_model_is_refused(checkpoints):
    asr = mlx_qwen3asr.load(checkpoints("tiny"))
    wav = test_signal(1.0)
    with pytest.raises(mlx_qwen3asr.WrongModelError, match="word timing needs a Qwen3-ForcedAligner"):
        our_classes(asr, [wav], [["hello"]])
