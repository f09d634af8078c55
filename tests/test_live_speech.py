"""Speech detection in live transcription (StreamingTranscriber(vad=...), `mlxasr live`): silence and
noise never reach the model and give no text, speech is decoded and committed where it pauses; espeak-ng
sentences between stretches of silence and noise (tools/sounds.py), on the tiny random-weight checkpoint.
Decodes are counted through the transcriber's decode seam."""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile as sf

import mlx_qwen3asr
from mlx_qwen3asr.cli.main import main
from mlx_qwen3asr.model.generate import Generation
from mlx_qwen3asr.pipeline import streaming
from mlx_qwen3asr.pipeline.inputs import NO_SPEECH
from mlx_qwen3asr.pipeline.streaming import StreamingTranscriber
from tools.sounds import RATE, espeak, non_speech, speech_between, trimmed

SENTENCES = [
    ("en", "The committee will meet again on Thursday to review the budget."),
    ("en-us", "Please remember to bring your notebook to the exam tomorrow."),
]
NOISES = ("hiss", "white", "pink", "brown", "chords", "beat")
BLOCK = RATE // 10  # fed as the command feeds it: 100 ms at a time


@pytest.fixture(scope="module")
def model(checkpoints):
    return mlx_qwen3asr.load(checkpoints("tiny"), dtype="float32")


@pytest.fixture(scope="module")
def non_speech_only() -> np.ndarray:
    """Two minutes of digital silence, then half a minute of each kind of noise (-20 dBFS)."""
    rng = np.random.default_rng(4)
    return np.concatenate(
        [np.zeros(120 * RATE, np.float32)] + [non_speech(k, 30 * RATE, rng, 0.1) for k in NOISES]
    )


@pytest.fixture(scope="module")
def two_sentences() -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Silence, a sentence, 3 s of hiss (a pause), a sentence, silence."""
    sentences = [trimmed(espeak(voice, text)) for voice, text in SENTENCES]
    gaps = [("silence", 2.0), ("hiss", 3.0), ("silence", 2.0)]
    return speech_between(gaps, sentences, np.random.default_rng(6), level=0.03)


class Seam:
    """A decode seam that counts the decodes and the audio each was given, and answers one text."""

    def __init__(self, tokenizer):
        self.sizes: list[int] = []
        self.tokens = tokenizer.encode("language English<asr_text>hello there")

    def __call__(self, samples, suffix, budget) -> Generation:
        self.sizes.append(int(samples.shape[0]))
        return Generation(list(self.tokens), truncated=False, repetitive=False)


def stream(transcriber: StreamingTranscriber, audio: np.ndarray) -> list:
    updates = []
    for start in range(0, audio.shape[0], BLOCK):
        updates += transcriber.feed(audio[start : start + BLOCK])
    return [*updates, transcriber.finish()]


def test_minutes_of_silence_and_noise_reach_no_decode_and_give_no_text(model, non_speech_only):
    seam = Seam(model.tokenizer)
    transcriber = StreamingTranscriber(model, vad=True, decode=seam)
    updates = stream(transcriber, non_speech_only)
    assert seam.sizes == []
    assert transcriber.segments == [] and transcriber.speech == []
    assert [u.final for u in updates] == [True]  # no step but the final one
    assert updates[-1].text == "" and updates[-1].committed == []
    assert updates[-1].seconds == pytest.approx(non_speech_only.shape[0] / RATE)

    # Without speech detection the same audio goes to the model, chunk after chunk.
    seam = Seam(model.tokenizer)
    stream(StreamingTranscriber(model, decode=seam), non_speech_only[: 20 * RATE])
    assert len(seam.sizes) == 10


def test_speech_is_decoded_and_committed_where_it_pauses(model, two_sentences):
    audio, truth = two_sentences
    seam = Seam(model.tokenizer)
    transcriber = StreamingTranscriber(model, vad=True, decode=seam)
    updates = stream(transcriber, audio)
    segments = transcriber.segments
    assert [s.text for s in segments] == ["hello there", "hello there"]
    for segment, (start, end) in zip(segments, truth):
        # Each segment is one sentence, with at most a few tenths of a second around it.
        assert start / RATE - 0.35 <= segment.start <= start / RATE
        assert end / RATE <= segment.end <= end / RATE + 0.6
    # The first sentence is committed during the pause, before the second one begins (not at the end).
    [first] = [u for u in updates if u.committed and u.committed[0] is segments[0]]
    assert not first.final and first.seconds < truth[1][0] / RATE
    # So is the second, in the silence after it: the end of the stream commits nothing more.
    assert updates[-1].committed == [] and sum(len(u.committed) for u in updates) == 2
    # Every decode heard one sentence and the audio around it, nothing of the silence and noise.
    assert seam.sizes and max(seam.sizes) <= max(e - s for s, e in truth) + RATE
    assert sum(seam.sizes) < 3 * sum(e - s for s, e in truth)
    assert len(transcriber.speech) == 2


def test_a_region_under_way_at_the_end_is_decoded_and_the_silence_after_it_is_not(model, two_sentences):
    audio, truth = two_sentences
    seam = Seam(model.tokenizer)
    transcriber = StreamingTranscriber(model, vad=True, decode=seam)
    cut = truth[0][1] + 8 * RATE // 10  # 0.8 s into the pause: the region has not ended yet
    updates = stream(transcriber, audio[:cut])
    [segment] = transcriber.segments
    assert updates[-1].committed == [segment] and updates[-1].seconds == pytest.approx(cut / RATE)
    assert truth[0][1] / RATE <= segment.end <= truth[0][1] / RATE + 0.6
    assert max(seam.sizes) <= segment.end * RATE - segment.start * RATE


def sentence_file(path, two_sentences):
    audio, truth = two_sentences
    sf.write(path, audio, RATE, subtype="PCM_16")
    return truth


def test_live_transcribes_only_the_speech_and_no_vad_all_the_audio(
    tmp_path, checkpoints, two_sentences, monkeypatch, capsys
):
    """mlxasr live: speech detection is on by default (the decodes, counted at the transcriber's
    decode, hear only speech); --no-vad sends everything, as before; --vad-threshold sets it."""
    truth = sentence_file(tmp_path / "talk.wav", two_sentences)
    heard: list[int] = []
    decode = streaming.StreamingTranscriber._decode

    def counted(self, audio, *args, **kwargs):
        heard.append(int(audio.shape[0]))
        return decode(self, audio, *args, **kwargs)

    monkeypatch.setattr(streaming.StreamingTranscriber, "_decode", counted)
    ckpt = str(checkpoints("tiny"))
    args = [
        "live",
        "--input",
        str(tmp_path / "talk.wav"),
        "--model",
        ckpt,
        "--json",
        "-q",
        "--max-new-tokens",
        "12",
    ]
    assert main([*args, "--vad-threshold", "0.6"]) == 0
    doc = json.loads((tmp_path / "talk.json").read_text(encoding="utf-8"))
    assert len(doc["segments"]) == 2 and len(doc["speech"]) == 2
    assert doc["options"]["vad"] is True and doc["options"]["vad_threshold"] == 0.6
    for segment, (start, end) in zip(doc["segments"], truth):
        assert start / RATE - 0.35 <= segment["start"] and segment["end"] <= end / RATE + 0.6
    assert heard and max(heard) <= max(e - s for s, e in truth) + RATE

    heard.clear()
    assert main([*args, "--no-vad", "--name", "all"]) == 0
    doc = json.loads((tmp_path / "all.json").read_text(encoding="utf-8"))
    assert doc["speech"] is None and doc["options"]["vad"] is False
    assert doc["segments"][0]["start"] == 0.0 and sum(heard) > len(two_sentences[0])
    capsys.readouterr()

    assert main([*args, "--no-vad", "--vad-threshold", "0.6"]) == 2
    assert "--vad-threshold: has no effect with --no-vad" in capsys.readouterr().err


def test_live_on_silence_and_noise_decodes_nothing_and_says_so(
    tmp_path, checkpoints, non_speech_only, monkeypatch, capsys
):
    sf.write(tmp_path / "quiet.wav", non_speech_only, RATE, subtype="PCM_16")
    heard = []
    monkeypatch.setattr(
        streaming.StreamingTranscriber, "_decode", lambda self, audio, *a, **k: heard.append(audio) or 1 / 0
    )
    status = main(
        [
            "live",
            "--input",
            str(tmp_path / "quiet.wav"),
            "--model",
            str(checkpoints("tiny")),
            "--srt",
            "--json",
        ]
    )
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert heard == []
    doc = json.loads((tmp_path / "quiet.json").read_text(encoding="utf-8"))
    assert doc["segments"] == [] and doc["speech"] == [] and doc["warnings"] == [NO_SPEECH]
    assert (tmp_path / "quiet.srt").read_text(encoding="utf-8").strip() == ""
    assert f"mlxasr live: warning: {NO_SPEECH}" in captured.err.splitlines()
    assert "[" not in captured.out


def test_live_refuses_an_aligner_that_no_word_timing_makes_moot(tmp_path, capsys):
    """As mlxasr does: --aligner with --no-word-timestamps is a usage error naming the option."""
    wav = tmp_path / "talk.wav"
    sf.write(wav, np.zeros(16000, np.float32), RATE)
    status = main(["live", "--input", str(wav), "--no-word-timestamps", "--aligner", "somewhere", "--txt"])
    assert status == 2
    err = capsys.readouterr().err
    assert "argument --aligner: has no effect with --no-word-timestamps" in err and "Traceback" not in err
