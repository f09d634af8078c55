"""Decoders: opening an audio file safely and reading it in blocks, through soundfile or ffmpeg.

Formats libsndfile knows go through soundfile; m4a/aac/video containers (and anything soundfile rejects,
when ffmpeg is installed) through an ffmpeg subprocess: `decode` is that fallback chain, for both the
whole-file reader and the stream (files.py). Each decoder gives blocks of (frames, channels) float32
samples at the file's own rate. Anything but a regular file is refused before it is opened; native
decoders' chatter on stderr is captured and turned into our own message.
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import BinaryIO, TypeVar

import numpy as np
import soundfile as sf

from mlx_qwen3asr.audio.features import _FFMPEG_EXTENSIONS, _SOUNDFILE_EXTENSIONS, AudioError
from mlx_qwen3asr.audio.wav import RateRefused, declared_frames, sound_input
from mlx_qwen3asr.runtime.messages import one_line

# The longest decoder or system message quoted in an error.
MESSAGE_LIMIT = 200
# Frames per decoded block (fewer for files of more than 8 channels), and about the most samples one
# resampling step produces: memory is bounded by a block whatever the rates and channel count.
DECODE_BLOCK = 1 << 16
# Sun AU encoding code for 32-bit IEEE float samples.
_AU_FLOAT32 = 6
_FFMPEG_HINT = "install it with 'brew install ffmpeg' (macOS) or your package manager"
# Lines native decoders (libmpg123 inside libsndfile) print on the process's stderr.
_NATIVE_CHATTER = re.compile(r"^(Note|Warning|Error): |^\[src/libmpg123|mpg123")
_CAPTURE_LOCK = threading.Lock()


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
    kind: str = "soundfile"  # or "ffmpeg"

    def release(self) -> None:
        """Release the decoder (a second call does nothing)."""
        close, self.close = self.close, None
        if callable(close):
            close()


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
    source = _Source(int(rate), None, iter(()), close=close, kind="ffmpeg")

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


def _decode_failure(e: Exception) -> str:
    """The reason a decoder gave up, as one line without the path (named by the caller)."""
    # error_string omits soundfile's "Error opening '<path>': " prefix.
    reason = one_line(getattr(e, "error_string", None) or str(e), MESSAGE_LIMIT).rstrip(".")
    if "does not exist or is not a regular file" in reason:
        # libsndfile's message when its mp3 decoder finds no frames; the file was checked before.
        return "no audio frames found"
    return reason


def _decoder_note(notes: list[str]) -> str:
    return f" (decoder: {notes[0]})" if notes else ""


T = TypeVar("T")


def _ffmpeg_taken(path: str, ffmpeg: str, take: Callable[[_Source], T]) -> tuple[_Source, T]:
    source = _ffmpeg_source(path, ffmpeg)
    try:
        return source, take(source)
    except BaseException:
        source.release()
        raise


def decode(path: str, f: BinaryIO, notes: list[str], take: Callable[[_Source], T]) -> tuple[_Source, T]:
    """Open the decoder for the file `f` (opened with _open_regular) and give it to `take`; returns the
    decoder and what `take` returned. The fallback chain: m4a/aac/video containers need ffmpeg; other
    files go to soundfile, and to ffmpeg (when installed) when soundfile cannot open or read them (its
    decoder notes are then dropped). A failed decoder is released; RateRefused and AudioTooLong pass
    through, any other failure is one AudioError saying why the file is no audio file."""
    ext = _extension(path)
    ffmpeg = shutil.which("ffmpeg")
    if ext in _FFMPEG_EXTENSIONS:
        if ffmpeg is None:
            raise AudioError(path, f"cannot decode .{ext} without ffmpeg; {_FFMPEG_HINT}")
        return _ffmpeg_taken(path, ffmpeg, take)
    source = None
    try:
        source = _soundfile_source(path, f, notes)
        return source, take(source)
    except BaseException as e:
        if source is not None:
            source.release()
        if not isinstance(e, (sf.LibsndfileError, RuntimeError, ValueError, _DecodeFailed)):
            raise
        reason = _decode_failure(e)
    if ffmpeg is not None:
        try:
            found = _ffmpeg_taken(path, ffmpeg, take)
        except (RateRefused, AudioTooLong):
            raise
        except AudioError:
            raise AudioError(path, f"not an audio file ({reason}){_decoder_note(notes)}") from None
        notes.clear()
        return found
    if ext and ext not in _SOUNDFILE_EXTENSIONS:
        raise AudioError(path, f"cannot decode .{ext} without ffmpeg; {_FFMPEG_HINT}")
    raise AudioError(path, f"not an audio file ({reason}){_decoder_note(notes)}")
