"""Long files are decoded to a temporary file and read back by range: the same samples, cuts, cue timing
and transcripts as holding them whole, without memory growing with their length."""

from __future__ import annotations

import os
import subprocess
import tempfile

import numpy as np
import pytest
import soundfile as sf
from reference import test_signal
from scripted import short_budgets

import mlx_qwen3asr
from mlx_qwen3asr.audio import files as decode
from mlx_qwen3asr.audio.cutting import segment_audio, split_on_silence
from mlx_qwen3asr.audio.files import read_audio
from mlx_qwen3asr.audio.signal import ArraySignal, FileSignal
from mlx_qwen3asr.outputs.cues import frame_energy_db


def stereo_file(path, seconds: float, rate: int = 44100, gain: float = 1.0) -> None:
    left = test_signal(seconds, seed=1, sample_rate=rate)
    right = test_signal(seconds, seed=2, sample_rate=rate)
    sf.write(path, gain * np.stack([left, 0.7 * right], axis=1), rate, subtype="FLOAT")


def both_ways(path, monkeypatch):
    """(decoded whole in memory, decoded through a temporary file) of the same file."""
    monkeypatch.setattr(decode, "SPILL_SECONDS", 1e9)
    whole = read_audio(path)
    monkeypatch.setattr(decode, "SPILL_SECONDS", 5.0)
    spilled = read_audio(path)
    return whole, spilled


@pytest.mark.parametrize("gain", [0.5, 3.0])  # 3.0: over full scale, so the peak normalisation applies
def test_spilled_samples_equal_the_whole_decode(tmp_path, monkeypatch, gain):
    path = tmp_path / "long.wav"
    stereo_file(path, 40.0, gain=gain)
    whole, spilled = both_ways(path, monkeypatch)
    assert isinstance(whole.signal, ArraySignal) and isinstance(spilled.signal, FileSignal)
    a, b = whole.samples, spilled.samples
    assert a.dtype == b.dtype == np.float32 and a.shape == b.shape
    np.testing.assert_array_equal(a, b)
    assert float(np.max(np.abs(b))) <= 1.0
    # Reads by range are slices of the same samples.
    for start, stop in [(0, 10), (123_456, 200_000), (len(a) - 5, len(a) + 50)]:
        np.testing.assert_array_equal(spilled.signal.read(start, stop), a[start:stop])
    # Cuts, segment samples and cue energies are computed from ranges alike.
    spans = split_on_silence(spilled.signal, max_seconds=12.0)
    assert spans == split_on_silence(a, max_seconds=12.0) and len(spans) >= 4
    for span in spans:
        np.testing.assert_array_equal(segment_audio(spilled.signal, span), segment_audio(a, span))
    np.testing.assert_array_equal(frame_energy_db(spilled.signal), frame_energy_db(a))
    assert spilled.signal.peak() == pytest.approx(float(np.max(np.abs(a))))


def test_streamed_ffmpeg_decode_equals_the_whole_decode(tmp_path, monkeypatch):
    wav = tmp_path / "src.wav"
    stereo_file(wav, 30.0, rate=48000)
    path = tmp_path / "long.mkv"
    cmd = ["ffmpeg", "-nostdin", "-v", "error", "-y", "-i", str(wav), "-c:a", "flac", str(path)]
    subprocess.run(cmd, check=True)
    whole, spilled = both_ways(path, monkeypatch)
    assert isinstance(spilled.signal, FileSignal)
    np.testing.assert_array_equal(whole.samples, spilled.samples)
    assert spilled.seconds == pytest.approx(30.0, abs=0.01) and not spilled.warnings


def test_the_temporary_file_has_no_name_and_closes(tmp_path, monkeypatch):
    path = tmp_path / "long.flac"
    sf.write(path, test_signal(20.0, seed=4), 16000)
    # A temporary folder of its own: other processes (a compiler, another test) use the shared one.
    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    monkeypatch.setattr(decode, "SPILL_SECONDS", 5.0)
    decoded = read_audio(path)
    assert isinstance(decoded.signal, FileSignal)
    assert os.listdir(private) == []  # unlinked: nothing left behind
    decoded.signal.close()
    assert decoded.signal.file.closed


def test_a_spilled_file_transcribes_like_a_held_one(checkpoints, tmp_path, monkeypatch):
    model = mlx_qwen3asr.load(checkpoints("tiny"))
    path = tmp_path / "talk.wav"
    stereo_file(path, 70.0, rate=22050)
    monkeypatch.setattr(decode, "SPILL_SECONDS", 1e9)
    held = mlx_qwen3asr.transcribe(model, str(path), vad=False, parts=short_budgets())
    monkeypatch.setattr(decode, "SPILL_SECONDS", 10.0)
    spilled = mlx_qwen3asr.transcribe(model, str(path), vad=False, parts=short_budgets())
    assert len(held.segments) == len(spilled.segments) == 3
    assert [(s.start, s.end, s.text) for s in held.segments] == [
        (s.start, s.end, s.text) for s in spilled.segments
    ]
    assert held.duration == spilled.duration


def test_cli_names_a_truncated_mp3_once_and_prints_no_decoder_chatter(checkpoints, tmp_path):
    import json
    import sys
    from pathlib import Path

    wav = tmp_path / "src.wav"
    sf.write(wav, test_signal(20.0, seed=5), 16000)
    full = tmp_path / "full.mp3"
    subprocess.run(
        ["ffmpeg", "-nostdin", "-v", "error", "-y", "-i", str(wav), "-b:a", "64k", str(full)], check=True
    )
    cut = tmp_path / "talk.mp3"
    cut.write_bytes(full.read_bytes()[: full.stat().st_size // 2])
    full.unlink()
    wav.unlink()
    cmd = [
        sys.executable,
        "-m",
        "mlx_qwen3asr.cli.main",
        str(cut),
        "--json",
        "--model",
        str(checkpoints("tiny")),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[1])
    assert proc.returncode == 0, proc.stderr
    assert "Xing" not in proc.stderr and "Note:" not in proc.stderr and "Illegal" not in proc.stderr
    truncation = [line for line in proc.stderr.splitlines() if "looks truncated" in line]
    assert len(truncation) == 1 and truncation[0].startswith(f"mlxasr: warning: {cut}: decoded ")
    doc = json.loads((tmp_path / "talk.json").read_text())
    assert doc["audio_truncated"] and doc["header_duration"] == pytest.approx(20.0, abs=0.2)
    assert doc["duration"] < 15 and any("looks truncated" in w for w in doc["warnings"])


def test_a_full_temporary_folder_is_one_error_naming_the_file(tmp_path, monkeypatch):
    import errno

    class Full:
        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def close(self):
            pass

    path = tmp_path / "long.flac"
    sf.write(path, test_signal(20.0, seed=6), 16000)
    monkeypatch.setattr(decode, "SPILL_SECONDS", 5.0)
    real = decode.tempfile.TemporaryFile

    def temporary(**kwargs):  # only the decoded audio's file finds the disk full
        return Full() if kwargs.get("prefix", "").startswith("mlxasr-audio") else real(**kwargs)

    monkeypatch.setattr(decode.tempfile, "TemporaryFile", temporary)
    with pytest.raises(mlx_qwen3asr.AudioError) as err:
        read_audio(path)
    assert str(err.value).startswith(f"{path}: no room for the decoded audio in ")
    assert str(err.value).endswith("(No space left on device)")
