"""The transcription API on a tiny random-weight checkpoint."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
from reference import test_signal

import mlx_qwen3asr
from mlx_qwen3asr.model.generate import ends_in_loop, token_budget
from mlx_qwen3asr.pipeline.parts import Parts


@pytest.fixture(scope="module")
def model(checkpoints):
    return mlx_qwen3asr.load(checkpoints("tiny"))


def test_long_audio_is_split_into_contiguous_segments_of_bounded_length(model):
    wav = test_signal(65.0, seed=3)
    result = mlx_qwen3asr.transcribe(model, wav, max_segment_seconds=30.0, vad=False)
    assert len(result.segments) == 3
    assert result.segments[0].start == 0.0
    assert result.segments[-1].end == pytest.approx(65.0)
    for a, b in zip(result.segments, result.segments[1:]):
        assert a.end == b.start
    assert all(s.end - s.start <= 30.0 + 1e-9 for s in result.segments)
    assert result.duration == pytest.approx(65.0)


def test_a_file_path_and_a_list_of_inputs(model, tmp_path):
    wav = test_signal(3.0, seed=4)
    path = tmp_path / "clip.flac"
    sf.write(path, wav, 16000)
    results = mlx_qwen3asr.transcribe(model, [str(path), (wav, 16000)], vad=False)
    assert isinstance(results, list) and len(results) == 2
    assert results[0].source == str(path)
    assert results[1].source is None
    # Same audio through both routes gives the same tokens.
    assert results[0].text == results[1].text


def test_forced_language_by_code_is_reported_and_placed_in_the_prompt(model):
    from scripted import spy_batches

    record = spy_batches()
    result = mlx_qwen3asr.transcribe(model, test_signal(2.0), language="en", vad=False, parts=record.parts())
    assert result.language == "English"
    assert all(s.language == "English" for s in result.segments)
    prompts = [p for add in record.adds for p in add["prompts"]]
    tail = model.tokenizer.decode(prompts[0][-4:], skip_special_tokens=False)
    assert tail.endswith("language English<asr_text>")


def test_unsupported_language_fails_before_reading_audio(model):
    with pytest.raises(ValueError, match="Klingon"):
        mlx_qwen3asr.transcribe(model, "/no/such/file.wav", language="Klingon", vad=False)


def test_a_segment_that_exhausts_its_budget_is_flagged_truncated(model, monkeypatch):
    monkeypatch.setattr("mlx_qwen3asr.model.batch.LOOP_CHECK_EVERY", 10**9)
    parts = Parts(budget=lambda seconds: 3)
    result = mlx_qwen3asr.transcribe(model, test_signal(2.0, seed=5), vad=False, parts=parts)
    seg = result.segments[0]
    assert seg.truncated and result.truncated


def test_budget_grows_with_duration():
    assert token_budget(1.0) < token_budget(10.0) < token_budget(30.0)
    # Never below one text token per audio token (12.5 per second).
    assert token_budget(30.0) >= 30 * 12.5


def test_loop_detection():
    assert ends_in_loop([5] * 20)
    assert ends_in_loop([1, 2, 3] + [7, 8] * 20)
    assert not ends_in_loop([7, 8] * 19)
    assert not ends_in_loop(list(range(100)))


def test_silence_gives_a_result_without_crashing(model):
    result = mlx_qwen3asr.transcribe(model, np.zeros(16000 * 2, dtype=np.float32), vad=False)
    assert len(result.segments) == 1
    assert isinstance(result.text, str)


def test_a_truncated_file_is_transcribed_in_part_and_says_so(model, tmp_path):
    wav = test_signal(20.0, seed=9)
    full = tmp_path / "full.wav"
    sf.write(full, wav, 16000)
    cut = tmp_path / "cut.wav"
    cut.write_bytes(full.read_bytes()[:200_000])  # 16-bit mono: about 6.2 s of the 20 s
    result = mlx_qwen3asr.transcribe(model, str(cut), vad=False)
    assert result.duration == pytest.approx(6.25, abs=0.05)
    assert result.header_duration == pytest.approx(20.0) and result.audio_truncated
    assert result.warnings == [
        f"decoded {result.duration:.1f} s of the 20.0 s its header states; the file looks truncated"
    ]
    whole = mlx_qwen3asr.transcribe(model, str(full), vad=False)
    assert whole.warnings == [] and whole.header_duration is None and not whole.audio_truncated
