"""Reading audio files: decoded once, in blocks, to 16 kHz mono; long ones kept on disk, read by range.

The decoders (soundfile, ffmpeg, the fallback between them) are in decoders.py, mixing and resampling
in mono.py. Blocks are mixed to mono and resampled with a soxr stream as they come (the same samples as
resampling the whole file at once), so memory stays flat however long a file is: past SPILL_SECONDS the
samples go to an unnamed temporary file, and segments, cut points and subtitle timing read them back by
range. The official normalisation (divide by the peak when it exceeds full scale) is applied as samples
are read.

A sample rate outside MIN_SAMPLE_RATE..MAX_SAMPLE_RATE is refused before anything is decoded; a file
that decodes to clearly less than its header states is kept, with a warning naming both durations; a
WAV whose data chunk states a size of 0 (a recorder that stopped before writing it) is read to the end
of the file. AudioStream reads a file a block at a time, for `mlxasr live --input`.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

import numpy as np
import soundfile as sf

from mlx_qwen3asr.audio.decoders import (
    DECODE_BLOCK,  # noqa: F401 (the block size, read here by the tests)
    AudioTooLong,
    _decoder_note,
    _ffmpeg_source,
    _ffprobe_seconds,
    _native_stderr,
    _open_regular,
    _Source,
    decode,
    not_regular_reason,
)
from mlx_qwen3asr.audio.features import SAMPLE_RATE, AudioError, prepare_audio, sample_rate_problem
from mlx_qwen3asr.audio.mono import MonoResampler, to_mono
from mlx_qwen3asr.audio.signal import ArraySignal, FileSignal, Signal
from mlx_qwen3asr.audio.wav import RateRefused, declared_frames, sound_input

# Bytes per second assumed for a compressed file whose length cannot be read cheaply (128 kbit/s).
_ASSUMED_BYTES_PER_SECOND = 16_000

# Decoded audio longer than this goes to an unnamed temporary file instead of memory (19 MB a 5 min).
SPILL_SECONDS = 300.0
# A file decoding to less than its header states by more than this (and 1%) is reported truncated.
TRUNCATION_SECONDS = 0.5

# --------------------------------------------------------------------------------------------------
# Decoded samples: in memory, or on disk for long files
# --------------------------------------------------------------------------------------------------


class _SignalWriter:
    """Collects resampled mono blocks; spills to a temporary file once they pass SPILL_SECONDS."""

    def __init__(self, path: str):
        self.path = path
        self.blocks: list[np.ndarray] = []
        self.count = 0
        self.peak = 0.0
        self.file: BinaryIO | None = None

    def add(self, x: np.ndarray) -> None:
        if not x.size:
            return
        if not np.isfinite(x).all():
            raise AudioError(self.path, "audio contains NaN or infinite samples")
        self.peak = max(self.peak, float(np.max(np.abs(x))))
        self.count += x.size
        if self.file is None and self.count > SPILL_SECONDS * SAMPLE_RATE:
            self.file = tempfile.TemporaryFile(prefix="mlxasr-audio-")
            for block in self.blocks:
                self._write(block)
            self.blocks = []
        if self.file is None:
            self.blocks.append(x)
        else:
            self._write(x)

    def _write(self, x: np.ndarray) -> None:
        try:
            self.file.write(np.ascontiguousarray(x, dtype=np.float32).tobytes())
        except OSError as e:
            raise AudioError(
                self.path, f"no room for the decoded audio in {tempfile.gettempdir()} ({e.strerror})"
            ) from None

    def finish(self, length: int) -> Signal:
        """The signal, trimmed or zero-padded to `length` samples (as librosa's resample(fix=True))."""
        if self.file is None:
            x = np.concatenate(self.blocks) if self.blocks else np.zeros(0, np.float32)
            x = x[:length] if x.size >= length else np.pad(x, (0, length - x.size))
            return ArraySignal(prepare_audio(x, SAMPLE_RATE))
        if self.count > length:
            self.file.truncate(4 * length)
        elif self.count < length:
            self._write(np.zeros(length - self.count, np.float32))
        self.file.flush()
        peak = self.peak
        return FileSignal(self.file, length, peak)

    def discard(self) -> None:
        if self.file is not None:
            self.file.close()


# --------------------------------------------------------------------------------------------------
# Reading a file
# --------------------------------------------------------------------------------------------------


@dataclass
class DecodedAudio:
    """A file's samples (mono, 16 kHz, normalised) and what the decode found out about the file."""

    signal: Signal
    seconds: float  # decoded length, at the file's own rate
    header_seconds: float | None = None  # what the header or container states, when it says
    warnings: list[str] = field(default_factory=list)

    @property
    def samples(self) -> np.ndarray:
        return self.signal.samples()

    @property
    def truncated(self) -> bool:
        """Decoded clearly less than the header states: a cut-off download or a damaged file."""
        if self.header_seconds is None:
            return False
        return self.header_seconds - self.seconds > max(TRUNCATION_SECONDS, 0.01 * self.header_seconds)


def _drain(path: str, source: _Source, max_seconds: float | None = None) -> tuple[Signal, float]:
    """Mix, resample and store every block of a source; returns the signal and the decoded seconds.
    Past `max_seconds` of audio it stops at once with AudioTooLong."""
    writer = _SignalWriter(path)
    try:
        if (problem := sample_rate_problem(source.rate)) is not None:
            raise RateRefused(path, problem)
        resampler = MonoResampler(source.rate)
        for block in source.blocks:
            if max_seconds is not None and resampler.frames + block.shape[0] > max_seconds * source.rate:
                raise AudioTooLong(path, (resampler.frames + block.shape[0]) / source.rate, max_seconds)
            for piece in resampler.resample(to_mono(block)):
                writer.add(piece)
        writer.add(resampler.finish())
        if resampler.frames == 0:
            raise AudioError(path, "contains no audio samples")
        return writer.finish(resampler.length), resampler.frames / source.rate
    except BaseException:
        writer.discard()
        raise
    finally:
        source.release()


def read_audio(path: str | os.PathLike[str], max_seconds: float | None = None) -> DecodedAudio:
    """Decode an audio file to float32 mono 16 kHz, normalised like the official pipeline.

    A file that decodes to clearly less than its header states is returned with a warning (and
    `truncated`); libsndfile giving up at damaged data is retried with ffmpeg. Raises AudioError;
    AudioTooLong as soon as more than `max_seconds` have been decoded (when given), so that a small
    file holding days of audio costs no more than the limit.
    """
    path = os.fspath(path)
    notes: list[str] = []
    warnings: list[str] = []
    damaged: str | None = None
    with _open_regular(path) as f:
        source, (signal, seconds) = decode(path, f, notes, lambda s: _drain(path, s, max_seconds))
        if source.kind == "ffmpeg":
            source.header_seconds = _ffprobe_seconds(path)
        elif source.stopped and (ffmpeg := shutil.which("ffmpeg")) is not None:
            # libsndfile gives up at damaged data; ffmpeg resynchronises past it.
            try:
                again = _ffmpeg_source(path, ffmpeg)
                again_signal, again_seconds = _drain(path, again, max_seconds)
            except AudioError:
                again = None
            if again is not None and again_seconds > seconds + TRUNCATION_SECONDS:
                damaged = f"damaged audio data at {seconds:.1f} s ({source.stopped[0]}); decoded past it with ffmpeg"
                signal.close()
                again.header_seconds = source.header_seconds
                signal, seconds, source = again_signal, again_seconds, again
                notes.clear()
            elif again is not None:
                again_signal.close()

    decoded = DecodedAudio(signal, seconds, source.header_seconds, warnings)
    stopped = source.stopped[0] if source.stopped else None
    if decoded.truncated:
        how = f" ({stopped})" if stopped else ""
        warnings.append(
            f"decoded {seconds:.1f} s of the {decoded.header_seconds:.1f} s its header states; "
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
    """A file's samples as one array: float32 mono 16 kHz, normalised like the official pipeline."""
    decoded = read_audio(path)
    try:
        return decoded.samples
    finally:
        decoded.signal.close()


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
            view, header = sound_input(path, f)
            with _native_stderr(notes):
                info = sf.info(view)
        except Exception:  # any format or I/O problem, or an implausible rate, just means "unknown"
            return None
        declared = declared_frames(header) if info.format == "WAV" else None
    frames = declared if declared is not None else info.frames
    if sample_rate_problem(info.samplerate) is None and frames > 0:
        return frames / info.samplerate
    return None


def estimate_duration(path: str | os.PathLike[str]) -> float:
    """probe_seconds, or a guess from the file size at a typical compressed bit rate; 0 if unreadable."""
    seconds = probe_seconds(path)
    if seconds is not None:
        return seconds
    try:
        st = os.stat(path)
    except OSError:
        return 0.0
    return st.st_size / _ASSUMED_BYTES_PER_SECOND if stat.S_ISREG(st.st_mode) else 0.0


# --------------------------------------------------------------------------------------------------
# Reading a file as a stream
# --------------------------------------------------------------------------------------------------


class AudioStream:
    """A file's audio as it is read: 16 kHz mono float32 blocks, each decoded, mixed and resampled as
    it is taken, so that memory holds a block or so however long the file is (read_audio decodes the
    whole file before it returns). What `mlxasr live --input` plays.

    It is opened as read_audio opens a file, with the same AudioError for one that cannot be read
    (missing, not audio, .m4a without ffmpeg, an implausible rate, no samples); damaged data partway
    ends the blocks there, with the reason in `warnings`. The samples are those read_audio gives (the
    same resampling stream, the same length), except that samples past full scale are clipped: read_audio
    divides the whole file by its peak, which a stream does not know before its end. Use it as a context
    manager, or close() it (that stops an ffmpeg decoder)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = path = os.fspath(path)
        self.warnings: list[str] = []
        self._source: _Source | None = None
        self._file = _open_regular(path)
        try:
            self._source, self._first = decode(path, self._file, [], lambda source: next(source.blocks, None))
            if (problem := sample_rate_problem(self._source.rate)) is not None:
                raise RateRefused(path, problem)
            if self._first is None:
                raise AudioError(path, "contains no audio samples")
        except BaseException:
            self.close()
            raise

    def blocks(self) -> Iterator[np.ndarray]:
        """The audio, 16 kHz mono float32 in [-1, 1], a decoded block at a time (about 4 s at most)."""
        source, path = self._source, self.path
        first, self._first = self._first, None
        if first is None:
            return
        resampler = MonoResampler(source.rate)
        given = 0
        held = np.zeros(0, np.float32)  # the last piece, held back until the length is known
        for block in _chain_first(first, source.blocks):
            mono = to_mono(block)
            if not np.isfinite(mono).all():
                raise AudioError(path, "audio contains NaN or infinite samples")
            for piece in resampler.resample(mono):
                if piece.size:
                    if held.size:
                        given += held.size
                        yield np.clip(held, -1.0, 1.0)
                    held = piece
        # As read_audio: trimmed or zero-padded to the rate's exact length (librosa's fix=True).
        held = np.concatenate([held, resampler.finish()])
        want = max(0, resampler.length - given)
        held = held[:want] if held.size >= want else np.pad(held, (0, want - held.size))
        if held.size:
            yield np.clip(held, -1.0, 1.0)
        seconds = resampler.frames / source.rate
        if source.stopped:
            self.warnings.append(f"decoding stopped early at {seconds:.1f} s ({source.stopped[0]})")

    def close(self) -> None:
        source, self._source = self._source, None
        if source is not None:
            source.release()
        self._file.close()

    def __enter__(self) -> AudioStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _chain_first(first: np.ndarray, rest: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
    yield first
    yield from rest


__all__ = [
    "estimate_duration",
    "ArraySignal",
    "AudioTooLong",
    "AudioStream",
    "DecodedAudio",
    "FileSignal",
    "Signal",
    "load_audio",
    "not_regular_reason",
    "probe_seconds",
    "read_audio",
]
