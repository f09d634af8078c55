from __future__ import annotations

import math
import os
import shutil
import struct
import subprocess
import sys
import threading

import numpy as np
import pytest
import soundfile as sf
import soxr
import torch
from official import official_module
from transformers import WhisperFeatureExtractor
from transformers.utils import is_torch_available

from mlx_qwen3asr.audio import decoders
from mlx_qwen3asr.audio import files as audio_mod
from mlx_qwen3asr.audio.features import (
    AUDIO_EXTENSIONS,
    HOP_LENGTH,
    N_FFT,
    N_MELS,
    SAMPLE_RATE,
    AudioError,
    log_mel_spectrogram,
    mel_filters,
    mel_frame_count,
    prepare_audio,
)
from mlx_qwen3asr.audio.files import AudioTooLong, load_audio, probe_seconds, read_audio
from mlx_qwen3asr.model.config import AudioConfig, conv_output_length

MEL_TOL = 1e-4


@pytest.fixture(scope="session")
def extractor() -> WhisperFeatureExtractor:
    return WhisperFeatureExtractor(feature_size=128, sampling_rate=16000, hop_length=160, n_fft=400)


def ref_torch(fe: WhisperFeatureExtractor, x: np.ndarray) -> tuple[np.ndarray, int]:
    """Features and frame count exactly as the official Qwen3ASRProcessor requests them."""
    out = fe(
        x,
        sampling_rate=16000,
        padding=True,
        truncation=False,
        return_attention_mask=True,
        return_tensors="np",
    )
    return out["input_features"][0], int(out["attention_mask"].sum())


def ref_numpy(fe: WhisperFeatureExtractor, x: np.ndarray) -> np.ndarray:
    return fe._np_extract_fbank_features(np.asarray(x, dtype=np.float32)[None], "cpu")[0]


@pytest.fixture(scope="session")
def speech(tmp_path_factory) -> np.ndarray:
    path = tmp_path_factory.mktemp("speech") / "speech.wav"
    text = "The quick brown fox jumps over the lazy dog. Speech recognition turns sound into text."
    subprocess.run(["espeak-ng", "-w", str(path), text], check=True, capture_output=True)
    data, sr = sf.read(path, dtype="float32")
    assert sr == 22050
    return prepare_audio(data, sr)


@pytest.fixture(scope="session")
def signals(speech) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1234)
    t = np.arange(4 * SAMPLE_RATE) / SAMPLE_RATE
    phase = 2 * np.pi * np.cumsum(np.linspace(40.0, 7900.0, t.size)) / SAMPLE_RATE
    quiet = np.concatenate([np.zeros(SAMPLE_RATE), 1e-5 * rng.standard_normal(2 * SAMPLE_RATE)])
    return {
        "speech": speech,
        "noise": (0.3 * rng.standard_normal(3 * SAMPLE_RATE)).astype(np.float32),
        "sweep": (0.5 * np.sin(phase)).astype(np.float32),
        "silence_tiny_noise": quiet.astype(np.float32),
    }


def test_reference_uses_torch_path():
    # The official pipeline runs the torch branch whenever torch is importable.
    assert is_torch_available()


@pytest.mark.parametrize("name", ["speech", "noise", "sweep", "silence_tiny_noise"])
def test_log_mel_matches_whisper_extractor(extractor, signals, name):
    x = signals[name]
    ours = log_mel_spectrogram(x)
    want_torch, frames = ref_torch(extractor, x)
    want_np = ref_numpy(extractor, x)
    assert ours.shape == want_torch.shape == want_np.shape == (N_MELS, len(x) // HOP_LENGTH)
    assert frames == ours.shape[1]
    d_torch = float(np.abs(ours - want_torch).max())
    d_np = float(np.abs(ours - want_np).max())
    print(f"{name}: max |diff| torch path {d_torch:.2e}, numpy path {d_np:.2e}")
    assert d_torch <= MEL_TOL
    assert d_np <= MEL_TOL


LENGTHS = [1, 159, 160, 161, 199, 200, 201, 399, 400, 401, 16000, 16001, int(7.9 * 16000), int(8.1 * 16000)]


@pytest.mark.parametrize("n", LENGTHS)
def test_log_mel_lengths(extractor, speech, n):
    x = np.resize(speech, n).astype(np.float32)
    ours = log_mel_spectrogram(x)
    assert ours.dtype == np.float32
    assert ours.flags.c_contiguous
    assert ours.shape == (N_MELS, n // HOP_LENGTH) == (N_MELS, mel_frame_count(n))
    if n < HOP_LENGTH:
        # The centred STFT has a single frame, which the extractor drops: nothing is left.
        return
    want_np = ref_numpy(extractor, x)
    d_np = float(np.abs(ours - want_np).max())
    msg = f"n={n}: numpy path {d_np:.2e}"
    assert want_np.shape == ours.shape
    assert d_np <= MEL_TOL
    if n > N_FFT // 2:
        # torch's reflect padding needs more than n_fft // 2 samples.
        want_torch, frames = ref_torch(extractor, x)
        d_torch = float(np.abs(ours - want_torch).max())
        msg += f", torch path {d_torch:.2e}"
        assert want_torch.shape == ours.shape
        assert frames == ours.shape[1]
        assert d_torch <= MEL_TOL
    print(msg)


def test_frame_count_matches_reference(extractor):
    rng = np.random.default_rng(7)
    lengths = list(range(201, 2200, 37)) + [int(v) for v in rng.integers(2200, 200_000, size=25)]
    for n in lengths:
        x = (0.1 * rng.standard_normal(n)).astype(np.float32)
        feats, frames = ref_torch(extractor, x)
        assert mel_frame_count(n) == frames == feats.shape[-1], n
    assert mel_frame_count(0) == 0
    with pytest.raises(ValueError):
        mel_frame_count(-1)


def test_token_count_matches_official():
    official = official_module(
        "core.transformers_backend.modeling_qwen3_asr"
    )._get_feat_extract_output_lengths
    lengths = np.arange(0, 3000)
    want_np = official(lengths)
    want_torch = official(torch.arange(0, 3000)).numpy()
    config = AudioConfig()
    ours = np.array([config.audio_tokens(int(n)) for n in lengths])
    np.testing.assert_array_equal(ours, want_np)
    np.testing.assert_array_equal(ours, want_torch)
    # Whole 100-frame chunks give 13 tokens each and no remainder tokens.
    assert config.audio_tokens(100) == 13 == conv_output_length(100)
    assert config.audio_tokens(3000) == 390


def test_mel_filters_match_reference(extractor):
    ours = mel_filters()
    assert ours.shape == (N_FFT // 2 + 1, N_MELS)
    np.testing.assert_allclose(ours, extractor.mel_filters, rtol=0, atol=1e-12)
    assert mel_filters() is ours


def test_log_mel_rejects_multichannel():
    with pytest.raises(ValueError):
        log_mel_spectrogram(np.zeros((2, 1600), np.float32))


def test_log_mel_long_audio_in_blocks(extractor):
    # Longer than one FFT block, so block boundaries are exercised.
    rng = np.random.default_rng(3)
    x = (0.2 * rng.standard_normal(20_000 * HOP_LENGTH + 77)).astype(np.float32)
    ours = log_mel_spectrogram(x)
    want, _ = ref_torch(extractor, x)
    assert ours.shape == want.shape
    assert float(np.abs(ours - want).max()) <= MEL_TOL


# prepare_audio


def librosa_style_resample(x: np.ndarray, sr: int) -> np.ndarray:
    """What librosa.resample(res_type='soxr_hq', fix=True) returns."""
    y = soxr.resample(x, sr, SAMPLE_RATE, quality="HQ")
    n = int(math.ceil(x.shape[0] * (SAMPLE_RATE / sr)))
    return y[:n] if y.shape[0] >= n else np.pad(y, (0, n - y.shape[0]))


def test_prepare_identity_at_16k():
    rng = np.random.default_rng(0)
    x = (0.5 * rng.uniform(-1, 1, 12345)).astype(np.float32)
    y = prepare_audio(x, 16000)
    assert y.dtype == np.float32 and y.flags.c_contiguous
    np.testing.assert_array_equal(y, x)


def test_prepare_channel_layouts():
    rng = np.random.default_rng(1)
    st = (0.4 * rng.uniform(-1, 1, (5000, 2))).astype(np.float32)
    mono = st.mean(axis=1)
    np.testing.assert_array_equal(prepare_audio(st, 16000), mono)
    np.testing.assert_array_equal(prepare_audio(st.T, 16000), mono)
    np.testing.assert_array_equal(prepare_audio(st[:, :1], 16000), st[:, 0])


def test_prepare_integer_scaling():
    x = np.array([16384, -32768, 0, 32767], dtype=np.int16)
    np.testing.assert_allclose(prepare_audio(x, 16000), [0.5, -1.0, 0.0, 32767 / 32768], atol=0)
    x32 = np.array([2**30, -(2**31)], dtype=np.int32)
    np.testing.assert_allclose(prepare_audio(x32, 16000), [0.5, -1.0])
    u8 = np.array([128, 192, 0], dtype=np.uint8)
    np.testing.assert_allclose(prepare_audio(u8, 16000), [0.0, 0.5, -1.0])


@pytest.mark.parametrize("sr", [8000, 22050, 44100, 48000])
def test_prepare_resamples_like_librosa_soxr_hq(sr):
    rng = np.random.default_rng(sr)
    # Peak stays below 1 after resampling, so no normalisation step is involved.
    x = (0.1 * rng.standard_normal(sr * 2 + 13)).astype(np.float32)
    y = prepare_audio(x, sr)
    assert float(np.abs(y).max()) < 1.0
    want = librosa_style_resample(x, sr)
    assert y.shape == (int(math.ceil(x.size * 16000 / sr)),)
    np.testing.assert_array_equal(y, want.astype(np.float32))


def test_prepare_peak_normalisation():
    x = np.array([0.1, -2.0, 1.0, 0.5], dtype=np.float32)
    np.testing.assert_allclose(prepare_audio(x, 16000), x / 2.0)
    quiet = np.array([0.1, -0.5, 0.25], dtype=np.float32)
    np.testing.assert_array_equal(prepare_audio(quiet, 16000), quiet)


def test_prepare_rejects_bad_input():
    with pytest.raises(ValueError, match="NaN or infinite"):
        prepare_audio(np.array([0.0, np.nan], np.float32), 16000)
    with pytest.raises(ValueError, match="NaN or infinite"):
        prepare_audio(np.array([[0.0, np.inf], [0.1, 0.2]] * 10, np.float32), 16000)
    with pytest.raises(ValueError):
        prepare_audio(np.zeros((2, 2, 2), np.float32), 16000)
    with pytest.raises(ValueError):
        prepare_audio(np.zeros(10, np.float32), 0)
    with pytest.raises(ValueError):
        prepare_audio(np.zeros(10, np.float32), 16000.5)
    assert prepare_audio(np.zeros(0, np.float32), 44100).shape == (0,)


# load_audio

SRC_RATE = 44100
SRC_FRAMES = SRC_RATE * 2 + 321


@pytest.fixture(scope="module")
def stereo_source() -> np.ndarray:
    """Two tones plus a little noise, int16 stereo at 44.1 kHz."""
    rng = np.random.default_rng(5)
    t = np.arange(SRC_FRAMES) / SRC_RATE
    left = 0.4 * np.sin(2 * np.pi * 330 * t) + 0.02 * rng.standard_normal(t.size)
    right = 0.3 * np.sin(2 * np.pi * 1250 * t) + 0.02 * rng.standard_normal(t.size)
    return np.round(np.stack([left, right], axis=1) * 32767).astype(np.int16)


@pytest.fixture(scope="module")
def stereo_reference(stereo_source) -> np.ndarray:
    mono = (stereo_source.astype(np.float32) / 32768.0).mean(axis=1)
    return librosa_style_resample(mono.astype(np.float32), SRC_RATE)


def expected_length() -> int:
    return int(math.ceil(SRC_FRAMES * SAMPLE_RATE / SRC_RATE))


def snr_db(got: np.ndarray, want: np.ndarray) -> float:
    # Lossy codecs smear the first and last frames; compare the body.
    edge = SAMPLE_RATE // 10
    n = min(got.size, want.size)
    g = got[edge : n - edge].astype(np.float64)
    w = want[edge : n - edge].astype(np.float64)
    return 10 * np.log10(np.sum(w**2) / max(np.sum((g - w) ** 2), 1e-30))


# (format, subtype, extension, minimum SNR against the lossless reference in dB)
SOUNDFILE_FORMATS = [
    ("WAV", "PCM_16", "wav", 60.0),
    ("FLAC", "PCM_16", "flac", 60.0),
    ("AIFF", "PCM_16", "aiff", 60.0),
    ("CAF", "PCM_16", "caf", 60.0),
    ("OGG", "VORBIS", "ogg", 15.0),
]


@pytest.mark.parametrize(("fmt", "subtype", "ext", "min_snr"), SOUNDFILE_FORMATS)
def test_load_soundfile_formats(tmp_path, stereo_source, stereo_reference, fmt, subtype, ext, min_snr):
    path = tmp_path / f"clip.{ext}"
    sf.write(path, stereo_source, SRC_RATE, format=fmt, subtype=subtype)
    y = load_audio(path)
    assert y.dtype == np.float32 and y.ndim == 1 and y.flags.c_contiguous
    assert abs(y.size - expected_length()) <= 1
    assert snr_db(y, stereo_reference) >= min_snr
    if min_snr >= 60:
        np.testing.assert_allclose(y, stereo_reference, atol=1e-5)


def test_load_mp3(tmp_path, stereo_source, stereo_reference):
    path = tmp_path / "clip.mp3"
    if "MP3" in sf.available_formats():
        # Float input: libsndfile 1.2.2 writes a corrupt MP3 stream from int16 frames.
        data = stereo_source.astype(np.float32) / 32768.0
        sf.write(path, data, SRC_RATE, format="MP3", subtype="MPEG_LAYER_III")
    else:
        wav = tmp_path / "src.wav"
        sf.write(wav, stereo_source, SRC_RATE)
        subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-y", "-i", str(wav), str(path)], check=True)
    y = load_audio(path)
    assert abs(y.size - expected_length()) <= 1
    assert snr_db(y, stereo_reference) >= 15.0


def make_m4a(tmp_path, stereo_source, name: str = "clip.m4a"):
    wav = tmp_path / "src.wav"
    sf.write(wav, stereo_source, SRC_RATE)
    path = tmp_path / name
    subprocess.run(
        [
            "ffmpeg",
            "-nostdin",
            "-v",
            "error",
            "-y",
            "-i",
            str(wav),
            "-c:a",
            "aac",
            "-b:a",
            "192k",
            "file:" + str(path),
        ],
        check=True,
    )
    return path


def check_aac_decode(y: np.ndarray, reference: np.ndarray) -> None:
    assert y.dtype == np.float32 and y.ndim == 1
    # AAC codes whole 1024-sample frames, so the tail may carry up to one frame of padding.
    frame = int(math.ceil(1024 * SAMPLE_RATE / SRC_RATE))
    assert expected_length() - 1 <= y.size <= expected_length() + frame
    assert snr_db(y, reference) >= 15.0


def test_load_m4a_via_ffmpeg(tmp_path, stereo_source, stereo_reference):
    y = load_audio(make_m4a(tmp_path, stereo_source))
    check_aac_decode(y, stereo_reference)


def test_load_m4a_with_colon_in_name(tmp_path, stereo_source, stereo_reference):
    # A name like "a:b" must not be read by ffmpeg as a protocol prefix.
    y = load_audio(make_m4a(tmp_path, stereo_source, "take:2.m4a"))
    check_aac_decode(y, stereo_reference)


def test_ffmpeg_path_mixes_and_resamples_like_soundfile_path(tmp_path):
    """Lossless PCM in a container only ffmpeg reads: the result must equal the soundfile route.

    Three channels at 48 kHz catch a downmix by ffmpeg (its -ac 1 is not the mean) and resampling by
    ffmpeg instead of soxr.
    """
    rng = np.random.default_rng(21)
    src = (0.3 * rng.uniform(-1, 1, (48000 + 77, 3)) * 32767).astype(np.int16)
    wav = tmp_path / "src.wav"
    sf.write(wav, src, 48000)
    mkv = tmp_path / "clip.mkv"
    subprocess.run(
        ["ffmpeg", "-nostdin", "-v", "error", "-y", "-i", str(wav), "-c:a", "pcm_s16le", str(mkv)], check=True
    )
    got = load_audio(mkv)
    want = load_audio(wav)
    mono = (src.astype(np.float32) / 32768.0).mean(axis=1)
    assert got.shape == want.shape == (int(math.ceil(src.shape[0] / 3)),)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    np.testing.assert_allclose(got, librosa_style_resample(mono.astype(np.float32), 48000), rtol=0, atol=1e-6)


def test_unknown_extension_falls_back_to_ffmpeg(tmp_path, stereo_source, stereo_reference, monkeypatch):
    src = make_m4a(tmp_path, stereo_source)
    odd = tmp_path / "clip.dat"
    shutil.copy(src, odd)
    check_aac_decode(load_audio(odd), stereo_reference)
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    with pytest.raises(AudioError, match="ffmpeg") as info:
        load_audio(odd)
    assert str(odd) in str(info.value)


def test_m4a_without_ffmpeg(tmp_path, stereo_source, monkeypatch):
    path = make_m4a(tmp_path, stereo_source, "talk.m4a")
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    assert shutil.which("ffmpeg") is None
    with pytest.raises(AudioError) as info:
        load_audio(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: cannot decode .m4a without ffmpeg")
    assert "brew install ffmpeg" in msg
    assert "\n" not in msg


def test_peak_normalisation_on_load(tmp_path):
    rng = np.random.default_rng(9)
    x = rng.uniform(-1, 1, 16000).astype(np.float32)
    x[100] = 1.0
    loud = tmp_path / "loud.wav"
    sf.write(loud, 2.0 * x, 16000, subtype="FLOAT")
    y = load_audio(loud)
    assert float(np.abs(y).max()) == 1.0
    np.testing.assert_allclose(y, x, atol=1e-7)
    quiet = tmp_path / "quiet.wav"
    sf.write(quiet, 0.5 * x, 16000, subtype="FLOAT")
    q = load_audio(quiet)
    assert float(np.abs(q).max()) == 0.5
    np.testing.assert_array_equal(q, 0.5 * x)


def test_error_missing_file(tmp_path):
    path = tmp_path / "x.wav"
    with pytest.raises(AudioError) as info:
        load_audio(path)
    assert str(info.value) == f"{path}: no such file"


def test_error_empty_file(tmp_path):
    path = tmp_path / "empty.wav"
    path.write_bytes(b"")
    with pytest.raises(AudioError) as info:
        load_audio(path)
    assert str(info.value) == f"{path}: file is empty"


@pytest.mark.parametrize("hide_ffmpeg", [False, True])
def test_error_text_file_named_wav(tmp_path, monkeypatch, hide_ffmpeg):
    path = tmp_path / "notes.wav"
    path.write_text("shopping list\nmilk\neggs\n")
    if hide_ffmpeg:
        monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    with pytest.raises(AudioError) as info:
        load_audio(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: not an audio file (")
    assert "\n" not in msg


@pytest.mark.parametrize("hide_ffmpeg", [False, True])
def test_error_corrupt_mp3_does_not_claim_the_file_is_missing(tmp_path, monkeypatch, hide_ffmpeg):
    path = tmp_path / "broken.mp3"
    path.write_bytes(b"garbage")
    if hide_ffmpeg:
        monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    with pytest.raises(AudioError) as info:
        load_audio(path)
    message = str(info.value)
    assert message.startswith(f"{path}: not an audio file (") and "\n" not in message
    assert "does not exist" not in message and "no such file" not in message


def test_error_text_file_named_m4a(tmp_path):
    path = tmp_path / "notes.m4a"
    path.write_text("not audio at all\n")
    with pytest.raises(AudioError) as info:
        load_audio(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: not an audio file (")
    # ffmpeg's own "file:/abs/path: " prefix is dropped, so the path appears once.
    assert msg.count(str(path)) == 1


def test_error_video_without_audio(tmp_path):
    path = tmp_path / "silent_film.mp4"
    subprocess.run(
        ["ffmpeg", "-nostdin", "-v", "error", "-y", "-f", "lavfi", "-i", "color=c=black:s=64x64:d=1"]
        + ["-c:v", "mpeg4", str(path)],
        check=True,
    )
    with pytest.raises(AudioError) as info:
        load_audio(path)
    assert str(info.value) == f"{path}: contains no audio stream"


def test_error_zero_samples(tmp_path):
    path = tmp_path / "silent.wav"
    sf.write(path, np.zeros((0, 1), np.float32), 16000)
    assert path.stat().st_size > 0
    with pytest.raises(AudioError) as info:
        load_audio(path)
    assert str(info.value) == f"{path}: contains no audio samples"


def test_error_directory(tmp_path):
    d = tmp_path / "folder.wav"
    d.mkdir()
    with pytest.raises(AudioError, match="directory"):
        load_audio(d)


def test_error_nan_samples(tmp_path):
    path = tmp_path / "nan.wav"
    sf.write(path, np.array([0.0, np.nan, 0.1], np.float32), 16000, subtype="FLOAT")
    with pytest.raises(AudioError, match="NaN"):
        load_audio(path)


def test_error_permission_denied(tmp_path, monkeypatch):
    path = tmp_path / "x.wav"
    sf.write(path, np.zeros(1600, np.float32), 16000)
    os.chmod(path, 0)
    try:
        with open(path, "rb"):
            blocked = False
    except PermissionError:
        blocked = True
    if not blocked:
        # Privileged users read through chmod 000; simulate the denial at the open call instead.
        real_open = os.open

        def deny(name, *args, **kwargs):
            if os.fspath(name) == str(path):
                raise PermissionError(13, "Permission denied", str(path))
            return real_open(name, *args, **kwargs)

        monkeypatch.setattr(audio_mod.os, "open", deny)
    try:
        with pytest.raises(AudioError) as info:
            load_audio(path)
    finally:
        os.chmod(path, 0o644)
    assert str(info.value) == f"{path}: permission denied"


def test_audio_extensions():
    expected = set(
        "wav flac mp3 ogg oga opus m4a aac mp4 mov m4v webm mkv aiff aif aifc caf wma w64 au snd".split()
    )
    assert isinstance(AUDIO_EXTENSIONS, frozenset)
    assert AUDIO_EXTENSIONS == expected
    assert all(e == e.lower() and not e.startswith(".") for e in AUDIO_EXTENSIONS)


def test_constants():
    assert (SAMPLE_RATE, N_FFT, HOP_LENGTH, N_MELS) == (16000, 400, 160, 128)


# Files that are not what they claim: never opened, never hanging, never partial without a word


def _in_thread(fn, timeout: float = 20.0):
    """Run fn in a thread; fail instead of hanging when it blocks (a FIFO opened for reading would)."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the test
            box["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "blocked"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def test_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "stream.wav"
    os.mkfifo(fifo)
    with pytest.raises(AudioError) as info:
        _in_thread(lambda: load_audio(fifo))
    assert str(info.value) == f"{fifo}: is a FIFO, not a regular file"
    assert _in_thread(lambda: probe_seconds(fifo)) is None


def test_character_device_is_refused():
    with pytest.raises(AudioError) as info:
        _in_thread(lambda: load_audio("/dev/null"))
    assert str(info.value) == "/dev/null: is a character device, not a regular file"


def test_symlink_loop_is_named(tmp_path):
    loop = tmp_path / "loop.wav"
    os.symlink(loop.name, loop)
    with pytest.raises(AudioError) as info:
        load_audio(loop)
    assert str(info.value) == f"{loop}: symbolic link loop"


def test_non_utf8_file_name_without_ffmpeg(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    name = os.fsdecode(os.fsencode(str(tmp_path)) + b"/caf\xe9.wav")
    x = (0.1 * np.sin(np.arange(16000) / 8)).astype(np.float32)
    with open(name, "wb") as f:
        sf.write(f, x, 16000, format="WAV", subtype="FLOAT")
    np.testing.assert_array_equal(load_audio(name), x)


@pytest.fixture(scope="module")
def minute(tmp_path_factory):
    """60 s of a modulated tone in several containers, and copies of each cut short."""
    root = tmp_path_factory.mktemp("truncated")
    t = np.arange(60 * 16000) / 16000
    x = (0.3 * np.sin(2 * np.pi * 220 * t) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)
    sf.write(root / "full.wav", x, 16000)
    sf.write(root / "full.flac", x, 16000)
    for ext, codec in (("mp3", ["-b:a", "64k"]), ("mkv", ["-c:a", "flac"])):
        cmd = ["ffmpeg", "-nostdin", "-v", "error", "-y", "-i", str(root / "full.wav"), *codec]
        subprocess.run([*cmd, str(root / f"full.{ext}")], check=True)
    for ext, keep in (("wav", 100_000), ("flac", 0.4), ("mp3", 0.5), ("mkv", 0.5)):
        data = (root / f"full.{ext}").read_bytes()
        n = keep if isinstance(keep, int) else int(len(data) * keep)
        (root / f"cut.{ext}").write_bytes(data[:n])
    return root


@pytest.mark.parametrize("ext", ["wav", "flac", "mp3", "mkv"])
def test_truncated_file_is_read_in_part_with_a_warning(minute, ext, capfd):
    full = read_audio(minute / f"full.{ext}")
    assert not full.truncated and full.warnings == []
    cut = read_audio(minute / f"cut.{ext}")
    assert cut.truncated and cut.header_seconds == pytest.approx(60.0, abs=0.1)
    assert 1.0 < cut.seconds < 45.0
    assert cut.samples.size == pytest.approx(cut.seconds * 16000, abs=2)
    (warning,) = cut.warnings
    assert warning.startswith(f"decoded {cut.seconds:.1f} s of the 60.0 s its header states")
    assert "truncated" in warning and "\n" not in warning
    # The decoders' own chatter (libmpg123's Xing warning) is held back: the file is named by us.
    assert "Xing" not in capfd.readouterr().err


def test_native_chatter_is_captured_and_other_output_kept(capfd):
    from mlx_qwen3asr.audio.files import _native_stderr

    notes: list[str] = []
    with _native_stderr(notes):
        os.write(2, b"Note: Illegal Audio-MPEG-Header 0x00000000 at offset 1234.\n")
        os.write(2, b"a message of someone else\n")
    assert notes == ["Note: Illegal Audio-MPEG-Header 0x00000000 at offset 1234."]
    assert capfd.readouterr().err == "a message of someone else\n"


@pytest.mark.parametrize("hide_ffmpeg", [False, True])
def test_damaged_mp3_is_reported_once(minute, tmp_path, capfd, monkeypatch, hide_ffmpeg):
    data = bytearray((minute / "full.mp3").read_bytes())
    middle = len(data) // 2
    data[middle : middle + 4000] = bytes(4000)  # a run of zeros where frames were
    path = tmp_path / "damaged.mp3"
    path.write_bytes(bytes(data))
    if hide_ffmpeg:
        monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    decoded = read_audio(path)
    (warning,) = decoded.warnings
    if hide_ffmpeg:  # libsndfile stops at the damage: what was read, and that the rest is missing
        assert decoded.truncated and warning.startswith(f"decoded {decoded.seconds:.1f} s of the 60.0 s")
    else:  # ffmpeg decodes past it
        assert decoded.seconds > 55 and not decoded.truncated
        assert warning.startswith("damaged audio data at ") and "decoded past it with ffmpeg" in warning
    err = capfd.readouterr().err
    assert "Illegal Audio-MPEG-Header" not in err and "Note:" not in err and "Xing" not in err


# Sample rates stated by headers, and WAV headers that state no length


def wav_with(path, fields: dict[int, int], source=None) -> bytes:
    """A 16-bit mono WAV (or `source`'s bytes) with 32-bit little-endian header fields overwritten."""
    if source is None:
        x = (0.3 * np.sin(np.arange(16000) / 5)).astype(np.float32)
        sf.write(path, x, 16000, subtype="PCM_16")
        source = path
    data = bytearray(source.read_bytes())
    for offset, value in fields.items():
        struct.pack_into("<I", data, offset, value)
    path.write_bytes(bytes(data))
    return bytes(data)


@pytest.mark.parametrize("rate", [0, 500, 10_000_000, 0xFFFFFFFF])
def test_implausible_wav_sample_rate_is_refused_by_name(tmp_path, rate):
    path = tmp_path / "odd rate.wav"
    wav_with(path, {24: rate, 28: 2 * rate & 0xFFFFFFFF})  # fmt: sample rate, bytes per second
    with pytest.raises(AudioError) as info:
        read_audio(path)
    assert str(info.value) == f"{path}: implausible sample rate {rate} Hz (accepted: 1000 to 768000 Hz)"
    assert probe_seconds(path) is None


@pytest.mark.parametrize("ext", ["au", "mkv"])  # read by libsndfile, by ffmpeg
def test_implausible_rate_in_other_formats_is_refused(tmp_path, ext):
    path = tmp_path / f"slow.{ext}"
    if ext == "au":
        sf.write(path, np.zeros(4000, np.float32), 500, format="AU")
    else:
        cmd = ["ffmpeg", "-nostdin", "-v", "error", "-f", "lavfi", "-i", "sine=f=100:r=500:d=2"]
        subprocess.run([*cmd, "-c:a", "pcm_s16le", str(path)], check=True)
    with pytest.raises(AudioError) as info:
        read_audio(path)
    assert str(info.value) == f"{path}: implausible sample rate 500 Hz (accepted: 1000 to 768000 Hz)"
    with pytest.raises(ValueError, match="implausible sample rate 500 Hz"):
        prepare_audio(np.zeros(4000, np.float32), 500)


@pytest.mark.parametrize("rate", [1000, 8000, 768000])
def test_sample_rates_at_the_edges_are_read(tmp_path, rate):
    path = tmp_path / "edge.wav"
    sf.write(path, 0.1 * np.sin(np.arange(2 * rate) / 3), rate, subtype="FLOAT")
    decoded = read_audio(path)
    assert decoded.seconds == 2.0 and decoded.samples.shape == (32000,) and not decoded.warnings
    assert probe_seconds(path) == 2.0


def test_one_hertz_wav_is_refused_at_once_in_bounded_memory(tmp_path):
    """131 KB declaring 1 Hz would be 18 hours at 16 kHz: refused before decoding, under a memory cap."""
    path = tmp_path / "one hertz.wav"
    sf.write(path, 0.1 * np.sin(np.arange(65536) / 5), 16000, subtype="PCM_16")
    wav_with(path, {24: 1, 28: 2}, source=path)
    # The child caps its address space at 1 GiB over what the imports took (Linux; elsewhere only the
    # peak resident memory is checked), so the old behaviour fails fast instead of taking the machine.
    child = (
        "import os, resource, sys\n"
        "from mlx_qwen3asr.audio.features import AudioError\n"
        "from mlx_qwen3asr.audio.files import read_audio\n"
        "if os.path.exists('/proc/self/status'):\n"
        "    vm = [int(ln.split()[1]) for ln in open('/proc/self/status') if ln.startswith('VmSize')][0]\n"
        "    resource.setrlimit(resource.RLIMIT_AS, ((vm << 10) + (1 << 30), resource.RLIM_INFINITY))\n"
        # The peak of this process's own memory: on Linux ru_maxrss keeps the parent's peak across
        # fork and exec (a large test run would hide any growth), /proc's VmHWM does not.
        "def peak():\n"
        "    if os.path.exists('/proc/self/status'):\n"
        "        return [int(ln.split()[1]) << 10 for ln in open('/proc/self/status') if ln.startswith('VmHWM')][0]\n"
        "    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"  # bytes on macOS
        "before = peak()\n"
        "try:\n"
        "    read_audio(sys.argv[1])\n"
        "except AudioError as e:\n"
        "    print(e)\n"
        "print((peak() - before) >> 20)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", child, str(path)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    message, grown_mb = out.stdout.splitlines()
    assert message == f"{path}: implausible sample rate 1 Hz (accepted: 1000 to 768000 Hz)"
    assert int(grown_mb) < 50


@pytest.mark.parametrize("rate", [1000, 8000])
def test_resampling_output_is_bounded_per_step(tmp_path, monkeypatch, rate):
    """Upsampling is fed in pieces: no step makes more than about a block, however low the rate."""
    path = tmp_path / "low.wav"
    x = (0.2 * np.sin(np.arange(3 * audio_mod.DECODE_BLOCK + 77) / 7)).astype(np.float32)
    sf.write(path, x, rate, subtype="FLOAT")
    sizes = []
    add = audio_mod._SignalWriter.add
    monkeypatch.setattr(audio_mod._SignalWriter, "add", lambda self, y: (sizes.append(y.size), add(self, y)))
    decoded = read_audio(path)
    assert max(sizes) <= audio_mod.DECODE_BLOCK + 1024 and sum(sizes) >= decoded.samples.size
    np.testing.assert_array_equal(decoded.samples, prepare_audio(x, rate))


def test_many_channels_are_decoded_in_bounded_blocks(tmp_path, monkeypatch):
    path = tmp_path / "many.wav"
    rng = np.random.default_rng(7)
    x = (0.1 * rng.standard_normal((20000, 64))).astype(np.float32)
    sf.write(path, x, 16000, subtype="FLOAT")
    sizes = []
    source = decoders._soundfile_source

    def recorded(*args):
        s = source(*args)
        blocks = s.blocks
        s.blocks = (sizes.append(b.size) or b for b in blocks)
        return s

    monkeypatch.setattr(decoders, "_soundfile_source", recorded)
    got = load_audio(path)
    assert max(sizes) <= 8 * audio_mod.DECODE_BLOCK and sum(sizes) == x.size
    np.testing.assert_allclose(got, x.mean(axis=1), atol=1e-7)


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    """A real WAV (espeak-ng's, 22.05 kHz 16-bit) and what reading it gives."""
    path = tmp_path_factory.mktemp("unsized") / "speech.wav"
    cmd = ["espeak-ng", "-w", str(path), "Recorded until the battery ran out."]
    subprocess.run(cmd, check=True, capture_output=True)
    data = path.read_bytes()
    assert data[:4] == b"RIFF" and data[36:40] == b"data"  # 44-byte header: sizes at 4 and 40
    return path, read_audio(path)


@pytest.mark.parametrize(
    "fields, tail",
    [
        ({40: 0}, b""),  # a recorder that stopped before writing the sizes
        ({4: 0, 40: 0}, b""),
        ({4: 0xFFFFFFFF, 40: 0xFFFFFFFF}, b""),  # a streaming writer
        ({4: 0}, b""),
        ({40: 0}, b"\x01"),  # cut inside a sample: the whole frames are read
    ],
)
def test_wav_whose_header_states_no_length_is_read_to_the_end(recording, tmp_path, fields, tail):
    source, want = recording
    path = tmp_path / "unsized.wav"
    wav_with(path, fields, source=source)
    path.write_bytes(path.read_bytes() + tail)
    got = read_audio(path)
    np.testing.assert_array_equal(got.samples, want.samples)
    assert got.seconds == want.seconds and got.seconds > 2.0
    assert not got.truncated and got.warnings == []
    assert probe_seconds(path) == want.seconds


def test_wav_stating_no_length_with_only_a_chunk_after_it_is_empty(tmp_path):
    path = tmp_path / "empty.wav"
    sf.write(path, np.zeros((0, 1), np.float32), 16000, subtype="PCM_16")
    info = b"INFOISFT\x06\x00\x00\x00mlxasr"
    data = bytearray(path.read_bytes() + b"LIST" + struct.pack("<I", len(info)) + info)
    struct.pack_into("<I", data, 4, len(data) - 8)
    path.write_bytes(bytes(data))
    with pytest.raises(AudioError) as error:
        read_audio(path)
    assert str(error.value) == f"{path}: contains no audio samples"


@pytest.mark.parametrize("ext", ["flac", "webm"])
def test_decoding_stops_as_soon_as_the_caller_s_limit_is_passed(tmp_path, ext):
    """A small file can hold hours (silence compresses to nothing): with max_seconds, decoding stops just
    past the limit instead of decoding (and spilling) all of it; within the limit nothing changes."""
    if ext == "webm" and shutil.which("ffmpeg") is None:
        pytest.fail("ffmpeg is needed for this test")
    path = tmp_path / f"long.{ext}"
    if ext == "flac":
        sf.write(path, np.zeros(16000 * 600, np.float32), 16000)  # 10 minutes in a few KB
    else:
        cmd = [shutil.which("ffmpeg"), "-v", "error", "-f", "lavfi", "-i", "anullsrc=r=48000:cl=mono",
               "-t", "600", "-c:a", "libopus", "-b:a", "6k", str(path)]  # fmt: skip
        subprocess.run(cmd, check=True, timeout=120)
    assert path.stat().st_size < 1_000_000
    with pytest.raises(AudioTooLong) as caught:
        read_audio(path, max_seconds=5.0)
    assert caught.value.limit == 5.0
    assert 5.0 < caught.value.seconds < 5.0 + 60  # stopped within a block of the limit, not at 600 s
    assert str(path) in str(caught.value) and "more than 5 s" in str(caught.value)
    decoded = read_audio(path, max_seconds=700.0)
    try:
        assert decoded.seconds == pytest.approx(600.0, abs=0.1)
    finally:
        decoded.signal.close()
