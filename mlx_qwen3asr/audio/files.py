"""Reading audio files: decoded once, in blocks, to 16 kHz mono; long ones kept on disk, read by range.

Formats libsndfile knows go through soundfile; m4a/aac/video containers (and anything soundfile rejects,
when ffmpeg is installed) through an ffmpeg subprocess. Blocks are mixed to mono and resampled with a
soxr stream as they come (the same samples as resampling the whole file at once), so memory stays flat
however long a file is: past SPILL_SECONDS the samples go to an unnamed temporary file, and segments,
cut points and subtitle timing read them back by range. The official normalisation (divide by the peak
when it exceeds full scale) is applied as samples are read.

Anything but a regular file is refused before it is opened, and a sample rate outside
MIN_SAMPLE_RATE..MAX_SAMPLE_RATE before anything is decoded; a file that decodes to clearly less than
its header states is kept, with a warning naming both durations; a WAV whose data chunk states a size of
0 (a recorder that stopped before writing it) is read to the end of the file; native decoders' chatter
on stderr is captured and turned into our own message.
"""

from __future__ import annotations

import contextlib
import errno
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

from mlx_qwen3asr.audio.features import (
    _FFMPEG_EXTENSIONS,
    _SOUNDFILE_EXTENSIONS,
    SAMPLE_RATE,
    AudioError,
    prepare_audio,
    sample_rate_problem,
)
from mlx_qwen3asr.audio.signal import ArraySignal, FileSignal, Signal
from mlx_qwen3asr.audio.wav import RateRefused, declared_frames, sound_input
from mlx_qwen3asr.runtime.messages import one_line

# The longest decoder or system message quoted in an error.
MESSAGE_LIMIT = 200
# Bytes per second assumed for a compressed file whose length cannot be read cheaply (128 kbit/s).
_ASSUMED_BYTES_PER_SECOND = 16_000

# Decoded audio longer than this goes to an unnamed temporary file instead of memory (19 MB a 5 min).
SPILL_SECONDS = 300.0
# A file decoding to less than its header states by more than this (and 1%) is reported truncated.
TRUNCATION_SECONDS = 0.5
# Frames per decoded block (fewer for files of more than 8 channels), and about the most samples one
# resampling step produces: memory is bounded by a block whatever the rates and channel count.
DECODE_BLOCK = 1 << 16
# Sun AU encoding code for 32-bit IEEE float samples.
_AU_FLOAT32 = 6
_FFMPEG_HINT = "install it with 'brew install ffmpeg' (macOS) or your package manager"
# Lines native decoders (libmpg123 inside libsndfile) print on the process's stderr.
_NATIVE_CHATTER = re.compile(r"^(Note|Warning|Error): |^\[src/libmpg123|mpg123")
_CAPTURE_LOCK = threading.Lock()


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
# Opening, decoding in blocks
# --------------------------------------------------------------------------------------------------


def _extension(path: str) -> str:
    return os.path.splitext(path)[1].lower().lstrip(".")


@contextlib.contextmanager
def _native_stderr(notes: list[str]) -> Iterator[None]:
    """Capture what native code writes to file descriptor 2 while the block runs.

    Decoder chatter goes into `notes` (it names no file; the caller turns it into its own message).
    Anything else written meanwhile (another thread's messages) is passed on once the block ends.
    """
    with _CAPTURE_LOCK, tempfile.TemporaryFile() as sink:
        with contextlib.suppress(AttributeError, OSError, ValueError):
            sys.stderr.flush()
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
                    notes.append(one_line(line, MESSAGE_LIMIT))
                elif line.strip():
                    others.append(line)
            if others:
                os.write(2, ("\n".join(others) + "\n").encode("utf-8", "replace"))


_FILE_KINDS = (
    (stat.S_ISDIR, "is a directory, not a file"),
    (stat.S_ISFIFO, "is a FIFO, not a regular file"),
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
        reason = (
            "symbolic link loop" if e.errno == errno.ELOOP else one_line(e.strerror or str(e), MESSAGE_LIMIT)
        )
        raise AudioError(path, reason) from None
    st = os.fstat(fd)
    reason = not_regular_reason(st.st_mode)
    if reason is None and st.st_size == 0:
        reason = "file is empty"
    if reason is not None:
        os.close(fd)
        raise AudioError(path, reason)
    return os.fdopen(fd, "rb")


class AudioTooLong(AudioError):
    """The audio decodes to more than the caller's limit; decoding stopped there."""

    def __init__(self, path: str, seconds: float, limit: float):
        super().__init__(path, f"decodes to more than {limit:g} s of audio")
        self.seconds, self.limit = seconds, limit


def _block_frames(channels: int) -> int:
    """Frames per decoded block: DECODE_BLOCK, fewer past 8 channels so a block stays 8 * DECODE_BLOCK."""
    return max(1, min(DECODE_BLOCK, 8 * DECODE_BLOCK // max(1, channels)))


@dataclass
class _Source:
    """A decoder in progress: its format, and blocks of (frames, channels) float32 samples."""

    rate: int
    header_seconds: float | None
    blocks: Iterator[np.ndarray]
    stopped: list[str] = field(default_factory=list)  # why it stopped early, when it did
    close: object = None  # callable releasing the decoder


class _DecodeFailed(Exception):
    """The decoder produced nothing; the message is its reason."""


def _soundfile_source(path: str, f: BinaryIO, notes: list[str]) -> _Source:
    view, header = sound_input(path, f)
    with _native_stderr(notes):
        snd = sf.SoundFile(view)
    declared = declared_frames(header) if snd.format == "WAV" else None
    frames = declared if declared is not None else (snd.frames if snd.frames > 0 else None)
    rate = int(snd.samplerate)
    source = _Source(rate, None if frames is None else frames / rate, iter(()), close=snd.close)

    def blocks() -> Iterator[np.ndarray]:
        got, size = 0, _block_frames(snd.channels)
        while True:
            try:
                # float32 like librosa.load, which is what the official pipeline reads files with.
                with _native_stderr(notes):
                    block = snd.read(size, dtype="float32", always_2d=True)
            except (sf.LibsndfileError, RuntimeError) as e:
                reason = one_line(getattr(e, "error_string", None) or str(e), MESSAGE_LIMIT).strip(" .:")
                if not got:
                    raise _DecodeFailed(reason) from None
                source.stopped.append(reason)
                return
            if len(block) == 0:
                return
            got += len(block)
            yield block

    source.blocks = blocks()
    return source


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


def _ffmpeg_source(path: str, ffmpeg: str) -> _Source:
    """The first audio stream at its native rate and channel count, streamed from an ffmpeg process.

    Mixing and resampling stay with us: ffmpeg's own `-ac 1` sums stereo at 1/sqrt(2) per channel (3 dB
    louder than the official mean) and its resampler is not soxr. Sun AU output gives the rate and
    channel count in a fixed header; float samples avoid int16 rounding.
    """
    # "file:" stops ffmpeg from reading a ':' in the name as a protocol.
    url = "file:" + os.path.abspath(path)
    cmd = [
        ffmpeg,
        "-nostdin",
        "-v",
        "error",
        "-i",
        url,
        "-map",
        "0:a:0",
        "-c:a",
        "pcm_f32be",
        "-f",
        "au",
        "-",
    ]
    errors = tempfile.TemporaryFile()
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errors)
    except OSError as e:
        errors.close()
        raise AudioError(path, f"could not run ffmpeg ({one_line(e, MESSAGE_LIMIT)})") from None

    def complaint() -> tuple[str, str]:
        proc.wait()
        errors.seek(0)
        err = errors.read().decode("utf-8", "replace").replace(url + ": ", "")
        lines = [ln for ln in err.splitlines() if ln.strip()]
        return err, (
            one_line(lines[-1], MESSAGE_LIMIT).rstrip(".") if lines else f"exit status {proc.returncode}"
        )

    def fail() -> AudioError:
        err, reason = complaint()
        if "matches no streams" in err:
            return AudioError(path, "contains no audio stream")
        if "Invalid data found" in reason:
            return AudioError(path, f"not an audio file ({reason})")
        if proc.returncode == 0:
            return AudioError(path, "ffmpeg produced no audio")
        return AudioError(path, f"ffmpeg could not decode the file ({reason})")

    def close() -> None:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()
        errors.close()

    head = proc.stdout.read(24)
    if len(head) < 24 or head[:4] != b".snd":
        error = fail()
        close()
        raise error
    offset, _, encoding, rate, channels = struct.unpack(">5I", head[4:24])
    if encoding != _AU_FLOAT32 or rate == 0 or channels == 0 or offset < 24:
        close()
        raise AudioError(path, "ffmpeg produced an unexpected stream")
    proc.stdout.read(offset - 24)
    source = _Source(int(rate), None, iter(()), close=close)

    def blocks() -> Iterator[np.ndarray]:
        frame = 4 * channels
        rest = b""
        got = 0
        while True:
            data = proc.stdout.read(_block_frames(channels) * frame)
            if not data:
                break
            data = rest + data
            whole = len(data) // frame * frame  # a torn tail would shift every channel after it
            rest = data[whole:]
            if whole:
                got += whole // frame
                yield np.frombuffer(data[:whole], dtype=">f4").astype(np.float32).reshape(-1, channels)
        err, reason = complaint()
        if proc.returncode != 0:
            if not got:
                raise fail()
            source.stopped.append(reason)

    source.blocks = blocks()
    return source


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


def _decode_failure(e: Exception) -> str:
    """The reason a decoder gave up, as one line without the path (named by the caller)."""
    # error_string omits soundfile's "Error opening '<path>': " prefix.
    reason = one_line(getattr(e, "error_string", None) or str(e), MESSAGE_LIMIT).rstrip(".")
    if "does not exist or is not a regular file" in reason:
        # libsndfile's message when its mp3 decoder finds no frames; the file was checked before.
        return "no audio frames found"
    return reason


def _drain(path: str, source: _Source, max_seconds: float | None = None) -> tuple[Signal, float]:
    """Mix, resample and store every block of a source; returns the signal and the decoded seconds.
    Past `max_seconds` of audio it stops at once with AudioTooLong."""
    writer = _SignalWriter(path)
    resampler = None
    # Input frames per resampling step: upsampling lengthens a block by 16000 / rate, so it is fed in
    # pieces whose output is about DECODE_BLOCK samples (the stream gives the same samples however cut).
    step = max(1, DECODE_BLOCK * source.rate // SAMPLE_RATE)
    frames = 0
    try:
        if (problem := sample_rate_problem(source.rate)) is not None:
            raise RateRefused(path, problem)
        if source.rate != SAMPLE_RATE:
            resampler = soxr.ResampleStream(source.rate, SAMPLE_RATE, 1, dtype="float32", quality="HQ")
        for block in source.blocks:
            frames += block.shape[0]
            if max_seconds is not None and frames > max_seconds * source.rate:
                raise AudioTooLong(path, frames / source.rate, max_seconds)
            mono = block[:, 0] if block.shape[1] == 1 else np.mean(block, axis=-1, dtype=np.float32)
            if resampler is None:
                writer.add(mono)
                continue
            for start in range(0, mono.shape[0], step):
                writer.add(resampler.resample_chunk(mono[start : start + step], last=False))
        if resampler is not None:
            writer.add(resampler.resample_chunk(np.zeros(0, np.float32), last=True))
        if frames == 0:
            raise AudioError(path, "contains no audio samples")
        length = math.ceil(frames * (float(SAMPLE_RATE) / source.rate)) if resampler is not None else frames
        return writer.finish(length), frames / source.rate
    except BaseException:
        writer.discard()
        raise
    finally:
        if callable(source.close):
            source.close()


def _decoder_note(notes: list[str]) -> str:
    return f" (decoder: {notes[0]})" if notes else ""


def read_audio(path: str | os.PathLike[str], max_seconds: float | None = None) -> DecodedAudio:
    """Decode an audio file to float32 mono 16 kHz, normalised like the official pipeline.

    A file that decodes to clearly less than its header states is returned with a warning (and
    `truncated`); libsndfile giving up at damaged data is retried with ffmpeg. Raises AudioError;
    AudioTooLong as soon as more than `max_seconds` have been decoded (when given), so that a small
    file holding days of audio costs no more than the limit.
    """
    path = os.fspath(path)
    ext = _extension(path)
    ffmpeg = shutil.which("ffmpeg")
    notes: list[str] = []
    warnings: list[str] = []
    damaged: str | None = None
    with _open_regular(path) as f:
        if ext in _FFMPEG_EXTENSIONS:
            if ffmpeg is None:
                raise AudioError(path, f"cannot decode .{ext} without ffmpeg; {_FFMPEG_HINT}")
            source = _ffmpeg_source(path, ffmpeg)
            signal, seconds = _drain(path, source, max_seconds)
            source.header_seconds = _ffprobe_seconds(path)
        else:
            try:
                source = _soundfile_source(path, f, notes)
                signal, seconds = _drain(path, source, max_seconds)
            except (sf.LibsndfileError, RuntimeError, ValueError, _DecodeFailed) as e:
                reason = _decode_failure(e)
                if ffmpeg is not None:
                    try:
                        source = _ffmpeg_source(path, ffmpeg)
                        signal, seconds = _drain(path, source, max_seconds)
                    except (RateRefused, AudioTooLong):
                        raise
                    except AudioError:
                        raise AudioError(
                            path, f"not an audio file ({reason}){_decoder_note(notes)}"
                        ) from None
                    source.header_seconds = _ffprobe_seconds(path)
                    notes.clear()
                elif ext and ext not in _SOUNDFILE_EXTENSIONS:
                    raise AudioError(path, f"cannot decode .{ext} without ffmpeg; {_FFMPEG_HINT}") from None
                else:
                    raise AudioError(path, f"not an audio file ({reason}){_decoder_note(notes)}") from None
            if source.stopped and ffmpeg is not None:
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
            self._source, self._first = self._open(path)
            if (problem := sample_rate_problem(self._source.rate)) is not None:
                raise RateRefused(path, problem)
            if self._first is None:
                raise AudioError(path, "contains no audio samples")
        except BaseException:
            self.close()
            raise

    def _open(self, path: str) -> tuple[_Source, np.ndarray | None]:
        """The decoder and its first block (None: it has none), falling back to ffmpeg as read_audio does."""
        ext = _extension(path)
        ffmpeg = shutil.which("ffmpeg")
        if ext in _FFMPEG_EXTENSIONS:
            if ffmpeg is None:
                raise AudioError(path, f"cannot decode .{ext} without ffmpeg; {_FFMPEG_HINT}")
            source = _ffmpeg_source(path, ffmpeg)
            return source, self._first_block(source)
        notes: list[str] = []
        source = None
        try:
            source = _soundfile_source(path, self._file, notes)
            return source, self._first_block(source)
        except (sf.LibsndfileError, RuntimeError, ValueError, _DecodeFailed) as e:
            if source is not None and callable(source.close):
                source.close()
            self._source = None
            reason = _decode_failure(e)
            if ffmpeg is not None:
                try:
                    source = _ffmpeg_source(path, ffmpeg)
                    return source, self._first_block(source)
                except RateRefused:
                    raise
                except AudioError:
                    raise AudioError(path, f"not an audio file ({reason}){_decoder_note(notes)}") from None
            if ext and ext not in _SOUNDFILE_EXTENSIONS:
                raise AudioError(path, f"cannot decode .{ext} without ffmpeg; {_FFMPEG_HINT}") from None
            raise AudioError(path, f"not an audio file ({reason}){_decoder_note(notes)}") from None

    def _first_block(self, source: _Source) -> np.ndarray | None:
        self._source = source  # closed with the stream, however the rest of the opening goes
        return next(source.blocks, None)

    def blocks(self) -> Iterator[np.ndarray]:
        """The audio, 16 kHz mono float32 in [-1, 1], a decoded block at a time (about 4 s at most)."""
        source, path = self._source, self.path
        first, self._first = self._first, None
        if first is None:
            return
        resampler = None
        if source.rate != SAMPLE_RATE:
            resampler = soxr.ResampleStream(source.rate, SAMPLE_RATE, 1, dtype="float32", quality="HQ")
        step = max(1, DECODE_BLOCK * source.rate // SAMPLE_RATE)
        frames = given = 0
        held = np.zeros(0, np.float32)  # the last piece, held back until the length is known
        for block in _chain_first(first, source.blocks):
            frames += block.shape[0]
            mono = block[:, 0] if block.shape[1] == 1 else np.mean(block, axis=-1, dtype=np.float32)
            if not np.isfinite(mono).all():
                raise AudioError(path, "audio contains NaN or infinite samples")
            pieces = (
                [mono]
                if resampler is None
                else [
                    resampler.resample_chunk(mono[start : start + step], last=False)
                    for start in range(0, mono.shape[0], step)
                ]
            )
            for piece in pieces:
                if piece.size:
                    if held.size:
                        given += held.size
                        yield np.clip(held, -1.0, 1.0)
                    held = piece
        if resampler is not None:
            held = np.concatenate([held, resampler.resample_chunk(np.zeros(0, np.float32), last=True)])
            # As read_audio: trimmed or zero-padded to the rate's exact length (librosa's fix=True).
            want = max(0, math.ceil(frames * (float(SAMPLE_RATE) / source.rate)) - given)
            held = held[:want] if held.size >= want else np.pad(held, (0, want - held.size))
        if held.size:
            yield np.clip(held, -1.0, 1.0)
        seconds = frames / source.rate
        if source.stopped:
            self.warnings.append(f"decoding stopped early at {seconds:.1f} s ({source.stopped[0]})")

    def close(self) -> None:
        source, self._source = self._source, None
        if source is not None and callable(source.close):
            source.close()
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
    "AudioStream",
    "DecodedAudio",
    "FileSignal",
    "Signal",
    "load_audio",
    "not_regular_reason",
    "probe_seconds",
    "read_audio",
]
