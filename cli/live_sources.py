"""Where `mlxasr live` takes its audio: a WAV stream or raw PCM on standard input, a file (as fast as
it decodes, or at speaking pace) or the microphone, each as 16 kHz mono float32 blocks."""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import select
import stat
import struct
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import soxr

from mlx_qwen3asr.audio.features import SAMPLE_RATE, AudioError, sample_rate_problem
from mlx_qwen3asr.audio.files import AudioStream, not_regular_reason
from mlx_qwen3asr.cli.live_error import LiveError
from mlx_qwen3asr.cli.live_stop import Stop
from mlx_qwen3asr.cli.options import EXIT_FAILED
from mlx_qwen3asr.cli.stdio import Say
from mlx_qwen3asr.runtime.messages import one_line

STDIN = "-"
SOUNDDEVICE_HINT = "the microphone needs the sounddevice package: pip install 'mlx-qwen3asr[live]'"
# Audio handed to the transcriber at a time: small enough that a stream read or a played file keeps
# pace with speech, large enough not to cost a step per block.
BLOCK_SECONDS = 0.1
READ_BYTES = 1 << 15


class Mono16k:
    """Blocks of (frames, channels) float32 at any rate -> mono float32 at 16 kHz, resampled as a stream."""

    def __init__(self, rate: int) -> None:
        self.resampler = None
        if rate != SAMPLE_RATE:
            self.resampler = soxr.ResampleStream(rate, SAMPLE_RATE, 1, dtype="float32", quality="HQ")

    def __call__(self, block: np.ndarray, last: bool = False) -> np.ndarray:
        x = block[:, 0] if block.shape[1] == 1 else np.mean(block, axis=1, dtype=np.float32)
        x = np.ascontiguousarray(x, dtype=np.float32)
        if self.resampler is not None:
            x = self.resampler.resample_chunk(x, last=last)
        return np.clip(x, -1.0, 1.0)


@dataclass
class WavFormat:
    tag: int  # 1 integer PCM, 3 IEEE float
    channels: int
    rate: int
    bits: int

    @property
    def frame_bytes(self) -> int:
        return self.channels * self.bits // 8


def wav_format(body: bytes, name: str) -> WavFormat:
    if len(body) < 16:
        raise LiveError(f"{name}: the WAVE fmt chunk is too short ({len(body)} bytes)", EXIT_FAILED)
    tag, channels, rate, _, _, bits = struct.unpack("<HHIIHH", body[:16])
    if tag == 0xFFFE and len(body) >= 26:  # WAVE_FORMAT_EXTENSIBLE: the real tag opens the subformat GUID
        tag = struct.unpack("<H", body[24:26])[0]
    if (problem := sample_rate_problem(rate)) is not None:
        raise LiveError(f"{name}: {problem}", EXIT_FAILED)
    if not 1 <= channels <= 64:
        raise LiveError(f"{name}: {channels} channels in the WAVE header (1 to 64 are read)", EXIT_FAILED)
    if (tag, bits) not in ((1, 8), (1, 16), (1, 24), (1, 32), (3, 32), (3, 64)):
        kind = {1: "integer", 3: "float"}.get(tag, f"format tag {tag}")
        raise LiveError(
            f"{name}: unsupported WAVE encoding ({kind}, {bits} bits); send PCM or float, "
            "e.g. ffmpeg ... -f wav -acodec pcm_s16le -",
            EXIT_FAILED,
        )
    return WavFormat(tag, channels, rate, bits)


def decode_frames(data: bytes, fmt: WavFormat) -> np.ndarray:
    """Whole frames of WAVE data as (frames, channels) float32 in [-1, 1]."""
    if fmt.tag == 3:
        x = np.frombuffer(data, dtype="<f4" if fmt.bits == 32 else "<f8").astype(np.float32)
        x = np.nan_to_num(x, nan=0.0, posinf=1.0, neginf=-1.0)
    elif fmt.bits == 8:
        x = (np.frombuffer(data, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    elif fmt.bits == 16:
        x = np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0
    elif fmt.bits == 24:
        b = np.frombuffer(data, dtype=np.uint8).reshape(-1, 3).astype(np.int32)
        v = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
        x = (np.where(v >= 1 << 23, v - (1 << 24), v)).astype(np.float32) / float(1 << 23)
    else:
        x = np.frombuffer(data, dtype="<i4").astype(np.float64) / float(1 << 31)
        x = x.astype(np.float32)
    return x.reshape(-1, fmt.channels)


class WavStream:
    """16 kHz mono blocks from a byte stream: a RIFF/RF64 WAVE stream, or raw 16-bit LE mono PCM.

    read(n) returns at most n bytes, b"" at the end (os.read on a pipe returns what is there, so a live
    stream is transcribed as it comes). Problems raise LiveError naming the stream and the reason.
    """

    def __init__(self, read, name: str = "stdin", raw_rate: int = SAMPLE_RATE) -> None:
        self._read = read
        self.name = name
        self._pending = b""
        self._eof = False
        self.fmt: WavFormat | None = None
        self.remaining: int | None = None  # data bytes the header states, None: to the end
        head = self._take(4, exact=False)
        if head in (b"RIFF", b"RF64", b"BW64"):
            self._header(head)
        else:
            if (problem := sample_rate_problem(raw_rate)) is not None:
                raise LiveError(f"--sample-rate: {problem}")
            self._pending = head + self._pending
            self.fmt = WavFormat(1, 1, raw_rate, 16)
        self.convert = Mono16k(self.fmt.rate)

    def _fill(self, n: int) -> None:
        while len(self._pending) < n and not self._eof:
            got = self._read(max(n - len(self._pending), READ_BYTES))
            if not got:
                self._eof = True
            self._pending += got

    def _take(self, n: int, exact: bool = True) -> bytes:
        self._fill(n)
        if exact and len(self._pending) < n:
            raise LiveError(f"{self.name}: the stream ended inside the WAVE header", EXIT_FAILED)
        out, self._pending = self._pending[:n], self._pending[n:]
        return out

    def _header(self, riff: bytes) -> None:
        if self._take(8)[4:8] != b"WAVE":
            raise LiveError(f"{self.name}: a RIFF stream that is not WAVE audio", EXIT_FAILED)
        for _ in range(1024):
            cid = self._take(4)
            size = struct.unpack("<I", self._take(4))[0]
            if cid == b"data":
                if self.fmt is None:
                    raise LiveError(f"{self.name}: the WAVE data comes before its fmt chunk", EXIT_FAILED)
                unknown = size in (0, 0xFFFFFFFF) or riff != b"RIFF"
                self.remaining = None if unknown else size
                return
            if size > 1 << 20:
                raise LiveError(f"{self.name}: a WAVE header chunk of {size} bytes", EXIT_FAILED)
            body = self._take(size + (size & 1))
            if cid == b"fmt ":
                self.fmt = wav_format(body[:size], self.name)
        raise LiveError(f"{self.name}: no data chunk in the WAVE header", EXIT_FAILED)

    def blocks(self) -> Iterator[np.ndarray]:
        """16 kHz mono float32 blocks until the stream ends; LiveError for a trailing partial frame
        (raised after the last whole frames were given)."""
        fmt = self.fmt
        step = fmt.frame_bytes
        while True:
            want = READ_BYTES if self.remaining is None else min(READ_BYTES, self.remaining)
            if want <= 0:
                break
            if not self._pending and not self._eof:
                got = self._read(want)
                if not got:
                    self._eof = True
                self._pending += got
            if not self._pending and self._eof:
                break
            data = self._pending[:want]
            whole = len(data) - len(data) % step
            if whole == 0 and not self._eof:
                self._fill(step)
                continue
            if whole == 0:
                self._pending = b""
                raise LiveError(
                    f"{self.name}: the stream ended inside a sample frame ({len(data)} trailing byte(s) "
                    f"of a {step}-byte frame); they were dropped",
                    EXIT_FAILED,
                )
            self._pending = self._pending[whole:]
            if self.remaining is not None:
                self.remaining -= whole
            yield self.convert(decode_frames(data[:whole], fmt))
        tail = self.convert(np.zeros((0, 1), np.float32), last=True)
        if tail.shape[0]:
            yield tail


def file_blocks(path: str, say: Say, cleanup: contextlib.ExitStack) -> Iterator[np.ndarray]:
    """The file's audio in BLOCK_SECONDS blocks, decoded as they are taken (AudioStream): memory holds
    a decoded block, not the file. A file that cannot be opened is a LiveError now; one that fails
    partway ends its blocks with one (what came before is transcribed)."""
    try:
        stream = cleanup.enter_context(AudioStream(path))
    except AudioError as e:
        raise LiveError(f"{path}: {e.reason}", EXIT_FAILED) from None
    step = int(round(BLOCK_SECONDS * SAMPLE_RATE))

    def blocks() -> Iterator[np.ndarray]:
        rest = np.zeros(0, np.float32)
        try:
            for decoded in stream.blocks():
                rest = np.concatenate([rest, decoded]) if rest.size else decoded
                whole = rest.shape[0] - rest.shape[0] % step
                for start in range(0, whole, step):
                    yield rest[start : start + step]
                rest = rest[whole:]
        except AudioError as e:
            raise LiveError(f"{path}: {e.reason}", EXIT_FAILED) from None
        if rest.size:
            yield rest
        for warning in stream.warnings:
            say.warning(f"{path}: {warning}")

    return blocks()


def paced(blocks: Iterator[np.ndarray], pause) -> Iterator[np.ndarray]:
    """The blocks at speaking pace: each is given once the audio before it has had its time."""
    began = time.monotonic()
    sent = 0
    for block in blocks:
        wait = began + sent / SAMPLE_RATE - time.monotonic()
        if wait > 0:
            pause(wait)
        yield block
        sent += block.shape[0]
    wait = began + sent / SAMPLE_RATE - time.monotonic()
    if wait > 0:
        pause(wait)


def open_microphone():
    """The default input device opened as a stream of blocks, or LiveError (status 2)."""
    try:
        import sounddevice as sd
    except (ImportError, OSError):
        raise LiveError(SOUNDDEVICE_HINT, label="") from None
    try:
        device = sd.query_devices(kind="input")
        rate = int(round(float(device["default_samplerate"])))
    except Exception as e:
        raise LiveError(f"microphone: no input device ({one_line(e) or type(e).__name__})") from None
    if (problem := sample_rate_problem(rate)) is not None:
        raise LiveError(f"microphone: {problem}")
    blocks: queue.Queue = queue.Queue()

    def callback(indata, frames, when, status) -> None:
        blocks.put(np.array(indata, dtype=np.float32, copy=True))

    try:
        stream = sd.InputStream(samplerate=rate, channels=1, dtype="float32", callback=callback)
    except Exception as e:
        raise LiveError(
            f"microphone: cannot open {device.get('name', 'the input device')} ({one_line(e)})"
        ) from None
    return Microphone(stream, blocks, Mono16k(rate))


class Microphone:
    """The input stream's blocks as they are recorded; after a stop, those recorded before it."""

    def __init__(self, stream, recorded: queue.Queue, convert: Mono16k) -> None:
        self.stream = stream
        self.recorded = recorded
        self.convert = convert

    def blocks(self) -> Iterator[np.ndarray]:
        with self.stream:
            while True:
                try:
                    block = self.recorded.get(timeout=0.1)
                except queue.Empty:
                    continue
                yield self.convert(block.reshape(block.shape[0], -1))

    def drain(self) -> Iterator[np.ndarray]:
        """What was recorded and not yet taken, once the stream is closed."""
        while True:
            try:
                block = self.recorded.get_nowait()
            except queue.Empty:
                break
            yield self.convert(block.reshape(block.shape[0], -1))
        tail = self.convert(np.zeros((0, 1), np.float32), last=True)
        if tail.shape[0]:
            yield tail


def open_source(
    args: argparse.Namespace, stop: Stop, say: Say, cleanup: contextlib.ExitStack
) -> tuple[str, Iterator[np.ndarray], Any]:
    if args.input is not None:
        if args.source is not None:
            raise LiveError("give either - (standard input) or --input FILE, not both")
        try:
            mode = os.stat(args.input).st_mode
        except OSError as e:
            what = "no such file" if isinstance(e, FileNotFoundError) else (e.strerror or str(e)).lower()
            raise LiveError(f"--input {args.input}: {what}") from None
        what = "is a folder" if stat.S_ISDIR(mode) else not_regular_reason(mode)
        if what is not None:  # a FIFO or a device would never end, or never start
            raise LiveError(f"--input {args.input}: {what}")
        blocks = file_blocks(args.input, say, cleanup)
        return args.input, (paced(blocks, stop.pause) if args.realtime else blocks), None
    if args.realtime:
        raise LiveError("--realtime paces a file: give it with --input FILE")
    if args.source == STDIN:
        fd = stdin_fd()
        stream = WavStream(lambda n: os.read(fd, n), "stdin", args.sample_rate)
        return "stdin", stream.blocks(), None
    microphone = open_microphone()
    return "microphone", microphone.blocks(), microphone.drain


def stdin_fd() -> int:
    return sys.stdin.fileno() if sys.stdin is not None else 0


def stdin_is_terminal() -> bool:
    try:
        return os.isatty(stdin_fd())
    except (OSError, ValueError):
        return False


def stdin_ready() -> bool:
    """Whether standard input has bytes (or its end) to read at once."""
    try:
        return bool(select.select([stdin_fd()], [], [], 0)[0])
    except (OSError, ValueError):
        return True


__all__ = ["STDIN", "WavStream", "open_source", "stdin_is_terminal", "stdin_ready"]
