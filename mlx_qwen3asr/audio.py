"""Audio loading and the log-mel front end of Qwen3-ASR.

Mirrors the official pipeline: decode, mix to mono, resample to 16 kHz with soxr "HQ" (librosa's
default `soxr_hq`), peak-normalise only when the signal exceeds full scale, then compute the
128-bin Whisper log-mel spectrogram without the 30 s padding.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import math
import os
import re
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

import numpy as np
import soundfile as sf
import soxr
from numpy.lib.stride_tricks import as_strided

# The audio encoder was trained on 16 kHz input.
SAMPLE_RATE = 16000
# 25 ms analysis window at 16 kHz: 0.025 * 16000.
N_FFT = 400
# 10 ms frame step at 16 kHz: 0.010 * 16000, i.e. 100 mel frames per second.
HOP_LENGTH = 160
# Whisper-large-v3 style front end: 128 mel bins.
N_MELS = 128

# Filters span 0 Hz to Nyquist (SAMPLE_RATE / 2), over the N_FFT // 2 + 1 one-sided bins.
_F_MAX = SAMPLE_RATE / 2
_N_BINS = N_FFT // 2 + 1
# Frames per FFT batch; bounds the temporary float64 frame matrix to about 26 MB.
_BLOCK_FRAMES = 8192

# Extensions soundfile (libsndfile >= 1.1) decodes itself.
_SOUNDFILE_EXTENSIONS = frozenset(
    {"wav", "flac", "mp3", "ogg", "oga", "opus", "aiff", "aif", "aifc", "caf", "w64", "au", "snd"}
)
# Containers/codecs libsndfile cannot read; these always go through ffmpeg.
_FFMPEG_EXTENSIONS = frozenset({"m4a", "aac", "mp4", "mov", "m4v", "webm", "mkv", "wma"})
# Lowercase file extensions, without the leading dot, that `load_audio` is meant to handle.
AUDIO_EXTENSIONS = _SOUNDFILE_EXTENSIONS | _FFMPEG_EXTENSIONS

# Sun AU encoding code for 32-bit IEEE float samples.
_AU_FLOAT32 = 6

_FFMPEG_HINT = "install it with 'brew install ffmpeg' (macOS) or your package manager"


class AudioError(Exception):
    """An audio file could not be read; the message is one line naming the file and the reason."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        self.path = os.fspath(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


@dataclass
class DecodedAudio:
    """A file's samples (mono, 16 kHz, normalised) and what the decode found out about the file."""

    samples: np.ndarray
    seconds: float  # decoded length, at the file's own rate
    header_seconds: float | None = None  # what the header or container states, when it says
    warnings: list[str] = field(default_factory=list)

    @property
    def truncated(self) -> bool:
        """Decoded clearly less than the header states: a cut-off download or a damaged file."""
        if self.header_seconds is None:
            return False
        return self.header_seconds - self.seconds > max(TRUNCATION_SECONDS, 0.01 * self.header_seconds)


# A file decoding to less than its header states by more than this (and 1%) is reported truncated.
TRUNCATION_SECONDS = 0.5
# Frames per decoded block.
_DECODE_BLOCK = 1 << 16
# Lines native decoders (libmpg123 inside libsndfile) print on the process's stderr.
_NATIVE_CHATTER = re.compile(r"^(Note|Warning|Error): |^\[src/libmpg123|mpg123")
_CAPTURE_LOCK = threading.Lock()


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _extension(path: str) -> str:
    return os.path.splitext(path)[1].lower().lstrip(".")


@contextlib.contextmanager
def _native_stderr(notes: list[str]) -> Iterator[None]:
    """Capture what native code writes to file descriptor 2 while the block runs.

    Decoder chatter goes into `notes` (it names no file; the caller turns it into its own message).
    Anything else written meanwhile (another thread's messages) is passed on once the block ends.
    """
    with _CAPTURE_LOCK, tempfile.TemporaryFile() as sink:
        try:
            sys.stderr.flush()
        except (AttributeError, OSError, ValueError):
            pass
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            others = []
            for line in sink.read().decode("utf-8", "replace").splitlines():
                if _NATIVE_CHATTER.search(line):
                    notes.append(_one_line(line))
                elif line.strip():
                    others.append(line)
            if others:
                os.write(2, ("\n".join(others) + "\n").encode("utf-8", "replace"))


_FILE_KINDS = (
    (stat.S_ISDIR, "is a directory, not a file"),
    (stat.S_ISFIFO, "is a FIFO (named pipe), not a regular file"),
    (stat.S_ISSOCK, "is a socket, not a regular file"),
    (stat.S_ISCHR, "is a character device, not a regular file"),
    (stat.S_ISBLK, "is a block device, not a regular file"),
)


def not_regular_reason(mode: int) -> str | None:
    """Why a file of this st_mode is no audio file to open (a FIFO would block forever), or None."""
    for test, reason in _FILE_KINDS:
        if test(mode):
            return reason
    return None if stat.S_ISREG(mode) else "is not a regular file"


def _open_regular(path: str) -> BinaryIO:
    """Open a regular, non-empty file for reading; anything else is an AudioError, and never blocks."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise AudioError(path, "no such file") from None
    except IsADirectoryError:
        raise AudioError(path, "is a directory, not a file") from None
    except PermissionError:
        raise AudioError(path, "permission denied") from None
    except OSError as e:
        reason = "symbolic link loop" if e.errno == errno.ELOOP else _one_line(e.strerror or str(e))
        raise AudioError(path, reason) from None
    st = os.fstat(fd)
    reason = not_regular_reason(st.st_mode)
    if reason is None and st.st_size == 0:
        reason = "file is empty"
    if reason is not None:
        os.close(fd)
        raise AudioError(path, reason)
    return os.fdopen(fd, "rb")


def _wav_declared_frames(f: BinaryIO) -> int | None:
    """Frames a RIFF/WAVE header declares in its data chunk (libsndfile reports what is present)."""
    head = os.pread(f.fileno(), 1 << 16, 0)
    if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        return None
    pos, block_align = 12, 0
    while pos + 8 <= len(head):
        cid, size = head[pos : pos + 4], struct.unpack("<I", head[pos + 4 : pos + 8])[0]
        if cid == b"fmt " and pos + 22 <= len(head):
            block_align = struct.unpack("<H", head[pos + 20 : pos + 22])[0]
        elif cid == b"data":
            # 0 and 0xFFFFFFFF are what streaming writers put when they cannot know the length.
            if block_align == 0 or size in (0, 0xFFFFFFFF):
                return None
            return size // block_align
        pos += 8 + size + (size & 1)
    return None


def _decode_soundfile(
    f: BinaryIO, path: str, notes: list[str]
) -> tuple[np.ndarray, int, int | None, str | None]:
    """(frames x channels float32, rate, frames the header states, the error that stopped decoding)."""
    with _native_stderr(notes):
        snd = sf.SoundFile(f)
    with snd:
        rate = int(snd.samplerate)
        declared = _wav_declared_frames(f) if snd.format == "WAV" else None
        header = declared if declared is not None else (snd.frames if snd.frames > 0 else None)
        blocks: list[np.ndarray] = []
        stopped = None
        while True:
            try:
                # float32 like librosa.load, which is what the official pipeline reads files with.
                with _native_stderr(notes):
                    block = snd.read(_DECODE_BLOCK, dtype="float32", always_2d=True)
            except (sf.LibsndfileError, RuntimeError) as e:
                stopped = _one_line(getattr(e, "error_string", None) or str(e)).strip(" .:")
                break
            if len(block) == 0:
                break
            blocks.append(block)
    if not blocks and stopped is not None:
        raise _DecodeFailed(stopped)
    data = np.concatenate(blocks) if blocks else np.zeros((0, max(1, snd.channels)), np.float32)
    return data, rate, header, stopped


class _DecodeFailed(Exception):
    """The decoder produced nothing; the message is its reason."""


def _ffprobe_seconds(path: str) -> float | None:
    """The container's duration (ffprobe, when installed), or None."""
    ffprobe = shutil.which("ffprobe")
    if ffprobe is None:
        return None
    cmd = [ffprobe, "-v", "error", "-show_entries", "format=duration", "-of", "csv=p=0"]
    try:
        out = subprocess.run([*cmd, "file:" + os.path.abspath(path)], capture_output=True, timeout=60)
        seconds = float(out.stdout.decode().strip() or "nan")
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None
    return seconds if math.isfinite(seconds) and seconds > 0 else None


def _decode_ffmpeg(path: str, ffmpeg: str) -> tuple[np.ndarray, int, str | None]:
    """Decode the first audio stream at its native rate and channel count.

    Mixing and resampling stay with prepare_audio: ffmpeg's own `-ac 1` sums stereo at 1/sqrt(2) per
    channel (3 dB louder than the official mean) and its resampler is not soxr. Sun AU output gives
    the rate and channel count in a fixed header; float samples avoid int16 rounding. Returns the
    samples, the rate, and ffmpeg's complaint when it stopped early with some audio decoded.
    """
    # "file:" stops ffmpeg from reading a ':' in the name as a protocol.
    cmd = [ffmpeg, "-nostdin", "-v", "error", "-i", "file:" + os.path.abspath(path)]
    cmd += ["-map", "0:a:0", "-c:a", "pcm_f32be", "-f", "au", "-"]
    try:
        proc = subprocess.run(cmd, capture_output=True, check=False)
    except OSError as e:
        raise AudioError(path, f"could not run ffmpeg ({_one_line(str(e))})") from None
    err = proc.stderr.decode("utf-8", "replace").replace("file:" + os.path.abspath(path) + ": ", "")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    complaint = _one_line(lines[-1]).rstrip(".") if lines else f"exit status {proc.returncode}"
    out = proc.stdout
    has_audio = len(out) >= 24 and out[:4] == b".snd"
    if proc.returncode != 0 and (not has_audio or len(out) <= struct.unpack(">I", out[4:8])[0]):
        if "matches no streams" in err:
            raise AudioError(path, "contains no audio stream")
        if "Invalid data found" in complaint:
            raise AudioError(path, f"not an audio file ({complaint})")
        raise AudioError(path, f"ffmpeg could not decode the file ({complaint})")
    if not has_audio:
        raise AudioError(path, "ffmpeg produced no audio")
    offset, _, encoding, rate, channels = struct.unpack(">5I", out[4:24])
    if encoding != _AU_FLOAT32 or rate == 0 or channels == 0 or offset < 24:
        raise AudioError(path, "ffmpeg produced an unexpected stream")
    # Whole frames only; a torn tail would shift every channel after it.
    n_frames = (len(out) - offset) // (4 * channels)
    data = np.frombuffer(out, dtype=">f4", count=n_frames * channels, offset=offset)
    stopped = complaint if proc.returncode != 0 else None
    return data.astype(np.float32).reshape(n_frames, channels), int(rate), stopped


def _decoder_note(notes: list[str]) -> str:
    return f" (decoder: {notes[0]})" if notes else ""


def read_audio(path: str | os.PathLike[str]) -> DecodedAudio:
    """Read an audio file as float32 mono 16 kHz samples, normalised like the official pipeline.

    Formats libsndfile knows go through soundfile; m4a/aac/video containers (and anything soundfile
    rejects, when ffmpeg is installed) are decoded by an ffmpeg subprocess. Anything but a regular
    file is refused before it is opened. A file that decodes to clearly less than its header states
    is returned with a warning (and `truncated`). Raises AudioError.
    """
    path = os.fspath(path)
    ext = _extension(path)
    ffmpeg = shutil.which("ffmpeg")
    notes: list[str] = []
    warnings: list[str] = []
    header_frames: int | None = None
    header_seconds: float | None = None
    stopped: str | None = None
    damaged: str | None = None
    with _open_regular(path) as f:
        if ext in _FFMPEG_EXTENSIONS:
            if ffmpeg is None:
                raise AudioError(path, f"cannot decode .{ext} without ffmpeg; {_FFMPEG_HINT}")
            audio, sr, stopped = _decode_ffmpeg(path, ffmpeg)
            header_seconds = _ffprobe_seconds(path)
        else:
            try:
                audio, sr, header_frames, stopped = _decode_soundfile(f, path, notes)
            except (sf.LibsndfileError, RuntimeError, ValueError, _DecodeFailed) as e:
                # error_string omits soundfile's "Error opening '<path>': " prefix; the path is already named.
                reason = _one_line(getattr(e, "error_string", None) or str(e)).rstrip(".")
                if "does not exist or is not a regular file" in reason:
                    # libsndfile's message when its mp3 decoder finds no frames; the file was checked above.
                    reason = "no audio frames found"
                if ffmpeg is not None:
                    try:
                        audio, sr, stopped = _decode_ffmpeg(path, ffmpeg)
                    except AudioError:
                        raise AudioError(
                            path, f"not an audio file ({reason}){_decoder_note(notes)}"
                        ) from None
                    header_seconds = _ffprobe_seconds(path)
                    notes.clear()
                elif ext and ext not in _SOUNDFILE_EXTENSIONS:
                    raise AudioError(path, f"cannot decode .{ext} without ffmpeg; {_FFMPEG_HINT}") from None
                else:
                    raise AudioError(path, f"not an audio file ({reason}){_decoder_note(notes)}") from None

        if stopped is not None and ffmpeg is not None and ext not in _FFMPEG_EXTENSIONS:
            # libsndfile gives up at damaged data; ffmpeg resynchronises past it.
            try:
                again, again_sr, again_stopped = _decode_ffmpeg(path, ffmpeg)
            except AudioError:
                again = None
            if again is not None and again.shape[0] / again_sr > audio.shape[0] / sr + TRUNCATION_SECONDS:
                skipped_at = audio.shape[0] / sr
                damaged = f"damaged audio data at {skipped_at:.1f} s ({stopped}); decoded past it with ffmpeg"
                audio, sr, stopped = again, again_sr, again_stopped
                notes.clear()

    if audio.shape[0] == 0:
        raise AudioError(path, "contains no audio samples")
    seconds = audio.shape[0] / sr
    if header_frames is not None:
        header_seconds = header_frames / sr
    try:
        samples = prepare_audio(audio, sr)
    except ValueError as e:
        raise AudioError(path, _one_line(str(e))) from None
    decoded = DecodedAudio(samples, seconds, header_seconds, warnings)
    if decoded.truncated:
        how = f" ({stopped})" if stopped else ""
        warnings.append(
            f"decoded {seconds:.1f} s of the {header_seconds:.1f} s its header states; "
            f"the file looks truncated{how}"
        )
    elif damaged:
        warnings.append(damaged)
    elif stopped:
        warnings.append(f"decoding stopped early at {seconds:.1f} s ({stopped})")
    elif any("Illegal Audio-MPEG-Header" in n or "resync" in n.lower() or "Skipped" in n for n in notes):
        warnings.append(f"damaged audio frames were skipped{_decoder_note(notes)}")
    return decoded


def load_audio(path: str | os.PathLike[str]) -> np.ndarray:
    """read_audio's samples: float32 mono 16 kHz, normalised like the official pipeline."""
    return read_audio(path).samples


def probe_seconds(path: str | os.PathLike[str]) -> float | None:
    """The duration a libsndfile-readable file's header states, read without decoding; None when that
    is unknown or the path is not a regular file (which is never opened). Decoder chatter is held back."""
    path = os.fspath(path)
    try:
        f = _open_regular(path)
    except AudioError:
        return None
    notes: list[str] = []
    with f:
        try:
            with _native_stderr(notes):
                info = sf.info(f)
        except Exception:  # any format or I/O problem just means "unknown"
            return None
        declared = _wav_declared_frames(f) if info.format == "WAV" else None
    frames = declared if declared is not None else info.frames
    if info.samplerate > 0 and frames > 0:
        return frames / info.samplerate
    return None


def _to_float(audio: np.ndarray) -> np.ndarray:
    if audio.dtype.kind == "f":
        # float64 stays float64 through resampling, as in the official path for arrays.
        return audio if audio.dtype == np.float64 else audio.astype(np.float32)
    if audio.dtype.kind == "i":
        full_scale = float(2 ** (8 * audio.dtype.itemsize - 1))
        return (audio.astype(np.float64) / full_scale).astype(np.float32)
    if audio.dtype.kind == "u":
        mid = float(2 ** (8 * audio.dtype.itemsize - 1))
        return ((audio.astype(np.float64) - mid) / mid).astype(np.float32)
    raise ValueError(f"unsupported audio dtype {audio.dtype}")


def prepare_audio(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    """Mix to mono, resample to 16 kHz and peak-normalise like the official `normalize_audio_input`.

    Accepts (frames,), (frames, channels) or (channels, frames) with at most 8 channels. Integer
    samples are scaled from full scale to [-1, 1]. Returns C-contiguous float32.
    """
    x = np.asarray(audio)
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, np.integer)) or sample_rate <= 0:
        raise ValueError(f"sample_rate must be a positive integer, got {sample_rate!r}")
    sample_rate = int(sample_rate)
    if x.ndim not in (1, 2):
        raise ValueError(f"audio must be 1-D or 2-D (frames, channels), got shape {x.shape}")
    x = _to_float(x)
    if x.ndim == 2:
        # Same heuristic as the official to_mono: a short first axis is the channel axis.
        if x.shape[0] <= 8 and x.shape[1] > x.shape[0]:
            x = x.T
        x = np.mean(x, axis=-1, dtype=x.dtype)
    if x.size and not np.isfinite(x).all():
        raise ValueError("audio contains NaN or infinite samples")
    if x.size == 0:
        return np.zeros(0, dtype=np.float32)

    if sample_rate != SAMPLE_RATE:
        x = np.ascontiguousarray(x)
        # librosa.resample(fix=True) trims/zero-pads soxr's rounded output to this float ceil.
        n_out = int(math.ceil(x.shape[0] * (float(SAMPLE_RATE) / sample_rate)))
        y = soxr.resample(x, sample_rate, SAMPLE_RATE, quality="HQ")
        if y.shape[0] > n_out:
            y = y[:n_out]
        elif y.shape[0] < n_out:
            y = np.pad(y, (0, n_out - y.shape[0]))
        x = y

    x = x.astype(np.float32)
    peak = float(np.max(np.abs(x)))
    if peak > 1.0:
        x = x / np.float32(peak)
    x = np.clip(x, -1.0, 1.0)
    return np.ascontiguousarray(x, dtype=np.float32)


def _hz_to_mel(freq: np.ndarray) -> np.ndarray:
    # Slaney scale: linear below 1 kHz (3 mels per 200 Hz), logarithmic above.
    freq = np.asarray(freq, dtype=np.float64)
    linear = 3.0 * freq / 200.0
    log = 15.0 + np.log(np.maximum(freq, 1e-10) / 1000.0) * (27.0 / np.log(6.4))
    return np.where(freq >= 1000.0, log, linear)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    linear = 200.0 * mel / 3.0
    log = 1000.0 * np.exp((np.log(6.4) / 27.0) * (mel - 15.0))
    return np.where(mel >= 15.0, log, linear)


@functools.lru_cache(maxsize=1)
def _mel_filters_cached() -> np.ndarray:
    bin_freqs = np.linspace(0.0, _F_MAX, _N_BINS)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(_F_MAX), N_MELS + 2))
    lower, center, upper = edges[:-2], edges[1:-1], edges[2:]
    rising = (bin_freqs[:, None] - lower) / (center - lower)
    falling = (upper - bin_freqs[:, None]) / (upper - center)
    weights = np.maximum(0.0, np.minimum(rising, falling))
    # Slaney normalisation: equal area per filter.
    weights *= 2.0 / (upper - lower)
    weights.setflags(write=False)
    return weights


def mel_filters() -> np.ndarray:
    """Slaney-scale, Slaney-normalised mel filter bank, shape (201, 128), float64 (read-only, cached)."""
    return _mel_filters_cached()


@functools.lru_cache(maxsize=1)
def _hann_window() -> np.ndarray:
    # Periodic Hann, as torch.hann_window and transformers' window_function(periodic=True).
    w = 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(N_FFT) / N_FFT)
    w.setflags(write=False)
    return w


def mel_frame_count(n_samples: int) -> int:
    """Number of mel frames for n_samples: the centred STFT gives n // hop + 1, the last is dropped."""
    if n_samples < 0:
        raise ValueError(f"n_samples must be >= 0, got {n_samples}")
    return int(n_samples) // HOP_LENGTH


def audio_token_count(n_frames: int) -> int:
    """Audio tokens the encoder emits for n_frames mel frames.

    The encoder runs three stride-2 convolutions over windows of 100 frames (13 tokens each) and over
    the remainder, as the official `_get_feat_extract_output_lengths`.
    """
    if n_frames < 0:
        raise ValueError(f"n_frames must be >= 0, got {n_frames}")
    n_frames = int(n_frames)
    rest = n_frames % 100
    # Floor division on purpose: for rest == 0 it yields 0 extra tokens, as the official code.
    length = (rest - 1) // 2 + 1
    length = ((length - 1) // 2 + 1 - 1) // 2 + 1
    return length + (n_frames // 100) * 13


def log_mel_spectrogram(audio: np.ndarray) -> np.ndarray:
    """Whisper log-mel features of 16 kHz mono audio, shape (128, len(audio) // 160), float32.

    Equals WhisperFeatureExtractor(feature_size=128) without the 30 s padding: centred STFT with
    reflect padding, power spectrum, mel projection, log10 floored at 1e-10, last frame dropped,
    dynamic range limited to 8 (log10 units) below the maximum, then (x + 4) / 4.
    """
    x = np.asarray(audio)
    if x.ndim != 1:
        raise ValueError(f"audio must be 1-D, got shape {x.shape}")
    # The reference casts to float32 first; do the same so inputs round identically.
    x = x.astype(np.float32, copy=False)
    n_frames = mel_frame_count(x.shape[0])
    if n_frames == 0:
        return np.zeros((N_MELS, 0), dtype=np.float32)

    # np.pad's reflect repeats the reflection when the signal is shorter than the pad, like numpy's
    # reference path; float64 keeps rounding far below the 1e-4 agreement target.
    padded = np.pad(x, N_FFT // 2, mode="reflect").astype(np.float64)
    step = padded.strides[0]
    frames = as_strided(padded, shape=(n_frames, N_FFT), strides=(HOP_LENGTH * step, step), writeable=False)
    window = _hann_window()
    filters = mel_filters()

    mel = np.empty((n_frames, N_MELS), dtype=np.float64)
    for s in range(0, n_frames, _BLOCK_FRAMES):
        spec = np.fft.rfft(frames[s : s + _BLOCK_FRAMES] * window, axis=-1)
        power = spec.real**2 + spec.imag**2
        np.matmul(power, filters, out=mel[s : s + _BLOCK_FRAMES])

    log_spec = np.log10(np.maximum(mel, 1e-10)).astype(np.float32)
    log_spec = np.maximum(log_spec, log_spec.max() - np.float32(8.0))
    log_spec = (log_spec + np.float32(4.0)) / np.float32(4.0)
    return np.ascontiguousarray(log_spec.T)
