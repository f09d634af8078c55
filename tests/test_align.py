"""The forced aligner against the official one on the same random-weight checkpoints, and batching."""

from __future__ import annotations

import pytest
from reference import OfficialAligner, max_abs, test_signal

import mlx_qwen3asr
from mlx_qwen3asr.audio.features import log_mel_spectrogram
from mlx_qwen3asr.pipeline.alignment import aligner_prompt, timestamp_classes
from mlx_qwen3asr.pipeline.encoding import encode_segments

ENGLISH = "so the first thing i want to talk about today is the budget for next year".split()

_pairs: dict = {}

# The longest audio the aligner takes (180 s) on the tiny shapes; the real shapes up to 90 s (at 170 s the
# float32 reference alone takes minutes on two cores). One preset after the other: the pair of models is
# loaded once per preset.
CASES = [("aligner-tiny", s) for s in (1.0, 8.1, 30.0, 170.0)] + [
    ("aligner", s) for s in (1.0, 8.1, 30.0, 90.0)
]


def signal(seconds: float):
    return test_signal(seconds, seed=int(seconds * 10))


def words_for(seconds: float) -> list[str]:
    return ENGLISH * max(1, int(seconds // 10))


def pair(checkpoints, preset):
    """(official aligner, ours) for a preset; one pair alive at a time to bound memory."""
    if preset not in _pairs:
        _pairs.clear()
        path = checkpoints(preset)
        # The real shapes' official results come from the committed golden data while it is valid.
        _pairs[preset] = (OfficialAligner(path, preset), mlx_qwen3asr.load(path, dtype="float32"))
    return _pairs[preset]


@pytest.fixture(scope="module", autouse=True)
def _release():
    yield
    _pairs.clear()


def our_classes(aligner, wavs, word_lists, keep_logits=False):
    features = encode_segments(aligner, [log_mel_spectrogram(w) for w in wavs])
    prompts = [aligner_prompt(aligner, int(f.shape[0]), words) for f, words in zip(features, word_lists)]
    return prompts, timestamp_classes(aligner, prompts, features, keep_logits=keep_logits)


@pytest.mark.parametrize(("preset", "seconds"), CASES)
def test_timestamp_classes_match_official(checkpoints, measurements, preset, seconds):
    official, ours = pair(checkpoints, preset)
    wav = signal(seconds)
    words = words_for(seconds)
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
    from mlx_qwen3asr.pipeline import alignment as align

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


def scripted_decoding(monkeypatch, model, texts):
    """Parts with which the speech model 'says' the given texts (random weights never end a sentence
    themselves)."""
    from scripted import script_batches

    queue = list(texts)
    return script_batches(
        lambda prompt: model.tokenizer.encode(f"language English<asr_text>{queue.pop(0)}")
    ).parts()


def test_transcribe_with_an_aligner_times_the_words(checkpoints, monkeypatch):
    model = mlx_qwen3asr.load(checkpoints("tiny"))
    aligner = mlx_qwen3asr.load(checkpoints("aligner-tiny"))
    texts = ["So the first thing, I want to talk about today.", "Is the budget for next year!"]
    parts = scripted_decoding(monkeypatch, model, texts)
    wav = test_signal(50.0, seed=8)
    result = mlx_qwen3asr.transcribe(
        model, wav, aligner=aligner, max_segment_seconds=30.0, vad=False, parts=parts
    )
    assert [s.text for s in result.segments] == texts
    for seg in result.segments:
        assert seg.timing == "aligned"
        assert [w.text for w in seg.words] == seg.text.split()  # the transcript's own words, punctuation kept
        assert all(seg.start <= w.start <= w.end <= seg.end for w in seg.words)
        assert all(a.start <= b.start for a, b in zip(seg.words, seg.words[1:]))  # repaired: monotonic
        assert [seg.text[w.char_start : w.char_end] for w in seg.words] == [w.text for w in seg.words]
    assert result.warnings == []
    # The same words and times as aligning each segment alone with the public function.
    for seg in result.segments:
        piece = wav[int(seg.start * 16000) : int(seg.end * 16000)]
        alone = mlx_qwen3asr.align(aligner, piece, seg.text, "English")
        assert [(w.text, round(w.start + seg.start, 3), round(w.end + seg.start, 3)) for w in alone] == [
            (w.text, round(w.start, 3), round(w.end, 3)) for w in seg.words
        ]


def test_unsupported_language_keeps_estimated_timing_and_says_so(checkpoints, monkeypatch):
    from scripted import script_batches

    model = mlx_qwen3asr.load(checkpoints("tiny"))
    aligner = mlx_qwen3asr.load(checkpoints("aligner-tiny"))

    thai = script_batches(lambda prompt: model.tokenizer.encode("language Thai<asr_text>สวัสดีครับ"))
    result = mlx_qwen3asr.transcribe(
        model, test_signal(4.0, seed=1), aligner=aligner, vad=False, parts=thai.parts()
    )
    (seg,) = result.segments
    assert seg.timing == "estimated" and seg.words == []
    assert result.warnings == [
        "word timing is estimated for 1 segment(s): Thai is not among the aligner's languages"
    ]


TEXTS = {
    "English": ("English", "So the first thing, I want to talk about today is the budget for next year."),
    "Chinese": ("Chinese", "今天下午三点，我们在会议室讨论语音识别的新方案。"),
    "mixed": ("Chinese", "我用iPhone拍了3张照片，然后发到了WeChat群里。"),
    "German": ("German", "Die Besprechung über Spracherkennung beginnt um 15 Uhr in München."),
    "Japanese": ("Japanese", "今日の午後三時に音声認識の会議があります。"),
    "Korean": ("Korean", "오늘 오후 세 시에 음성 인식 회의가 있습니다."),
}


@pytest.mark.parametrize("name", list(TEXTS))
def test_words_classes_and_times_match_official(checkpoints, name):
    """The official Qwen3ForcedAligner.align pipeline, step by step, against ours on the same text."""
    import torch
    from official import official_aligner_module

    from mlx_qwen3asr.text.words import split_items, word_times

    language, text = TEXTS[name]
    official, ours = pair(checkpoints, "aligner-tiny")
    processor = official_aligner_module().Qwen3ForceAlignProcessor()
    words, _ = processor.encode_timestamp(text, language)
    wav = test_signal(8.1, seed=len(text))
    # "iPhone" and "WeChat" are split differently by the official loader's Mistral regex; the
    # comparison runs the official pipeline with the model's own split, and the difference is checked.
    mixed_case = any(w != w.lower() and w[1:] != w[1:].lower() for w in words)
    loader_ids, _, _ = official.run(wav, words)
    ids, expected, _ = official.run(wav, words, qwen_split=True)
    assert (loader_ids != ids) == mixed_case
    timestamp_ms = (torch.from_numpy(expected) * 80.0).numpy()  # as the official align() computes it
    expected_times = [
        (round(w["start_time"] / 1000.0, 3), round(w["end_time"] / 1000.0, 3))
        for w in processor.parse_timestamp(words, timestamp_ms)
    ]
    items = split_items(text, language)
    assert [i.text for i in items] == words and len(words) >= 5
    (prompt,), (classes,) = our_classes(ours, [wav], [[i.text for i in items]])
    assert prompt.ids == ids and classes.tolist() == expected.tolist()
    assert word_times(classes.tolist(), 80.0, len(items)) == expected_times
    assert len(set(expected_times)) > 1


# --- memory: a file is decoded no further than the aligner takes -------------------------------------


def test_align_decodes_a_long_file_no_further_than_the_aligner_takes(checkpoints, tmp_path, monkeypatch):
    """align() of a file longer than 180 s is refused once 180 s are decoded: no decoded block nor read
    holds the whole file (it used to be decoded whole and read back into memory, 1.1 GB for 2 h)."""
    import numpy as np
    import soundfile as sf

    from mlx_qwen3asr.audio import files
    from mlx_qwen3asr.audio import signal as signals
    from mlx_qwen3asr.pipeline.alignment import MAX_SECONDS

    rate = 16000
    long_file = tmp_path / "long.wav"
    seconds = MAX_SECONDS + 220.0  # past the 300 s from which decoded audio goes to a temporary file
    sf.write(long_file, test_signal(seconds, seed=5), rate, subtype="PCM_16")
    short_file = tmp_path / "short.wav"
    sf.write(short_file, test_signal(6.0, seed=6), rate, subtype="PCM_16")

    decoded: list[int] = []  # samples each decode had stored, after every block
    reads: list[int] = []  # samples of every read from decoded audio
    real_add = files._SignalWriter.add

    def add(self, x):
        real_add(self, x)
        decoded.append(self.count)

    def spy(read):
        def wrapper(self, start, stop):
            out = read(self, start, stop)
            reads.append(int(out.shape[0]))
            return out

        return wrapper

    monkeypatch.setattr(files._SignalWriter, "add", add)
    for kind in (signals.ArraySignal, signals.FileSignal):
        monkeypatch.setattr(kind, "read", spy(kind.read))

    aligner = mlx_qwen3asr.load(checkpoints("aligner-tiny"), dtype="float32")
    with pytest.raises(ValueError, match="longer than the aligner's 180 s"):
        mlx_qwen3asr.align(aligner, long_file, "so the first thing i want to talk about")
    limit = (MAX_SECONDS + 5.0) * rate
    assert decoded and max(decoded) <= limit, max(decoded) / rate
    assert max(reads, default=0) <= limit
    assert mlx_qwen3asr.align(aligner, long_file, "  ") == []  # no text: nothing to refuse

    # A file the aligner takes is still read whole and timed.
    decoded.clear()
    words = mlx_qwen3asr.align(aligner, short_file, "so the first thing i want", "English")
    assert [w.text for w in words] == "so the first thing i want".split()
    assert max(decoded) == 6 * rate and all(0.0 <= w.start <= w.end <= 6.0 for w in words)
    assert np.isclose(sum(reads[-1:]), 6 * rate)
