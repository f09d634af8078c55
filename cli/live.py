"""`mlxasr live`: live transcription on the terminal.

mlxasr live                                   the microphone (needs the sounddevice package)
ffmpeg -i talk.m4a -f wav - | mlxasr live -   a WAV stream, or raw 16-bit PCM, on standard input
mlxasr live --input talk.m4a --realtime       a file played at speaking pace

The audio goes through mlx_qwen3asr.pipeline.streaming.StreamingTranscriber: the transcript is revised
every chunk and committed at pauses, so each step costs about the same at minute 1 and hour 3. On a
terminal the committed text is printed as it commits and the words still being revised are shown
dimmed below it; otherwise each committed segment is printed as "[start --> end] text". Outputs (TXT,
SRT, WebVTT, JSON) are rewritten crash-safely after each commit, so they always hold every committed
segment; Ctrl-C finishes the last words, writes them and exits with status 130. Speech detection is
on as for files (--no-vad turns it off): silence and noise never reach the model, and text is
committed where the speech pauses.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import queue
import select
import signal
import stat
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import soxr

from mlx_qwen3asr.audio.features import SAMPLE_RATE, AudioError, sample_rate_problem
from mlx_qwen3asr.audio.files import AudioStream, not_regular_reason
from mlx_qwen3asr.audio.signal import ArraySignal, FileSignal, Signal
from mlx_qwen3asr.audio.vad import VadUnavailable
from mlx_qwen3asr.cli.exits import stopped
from mlx_qwen3asr.cli.live_error import LiveError
from mlx_qwen3asr.cli.live_names import outputs_name
from mlx_qwen3asr.cli.live_outputs import LiveOutputs
from mlx_qwen3asr.cli.loading import load_in_order, untimed
from mlx_qwen3asr.cli.models import load_model
from mlx_qwen3asr.cli.options import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    EXIT_USAGE,
    add_formats,
    add_model,
    add_speech_detection,
    add_word_timing,
    check_vad,
    chosen_formats,
    moot,
    number_in,
    span,
    vad_options,
)
from mlx_qwen3asr.cli.signals import Terminated
from mlx_qwen3asr.cli.stdio import Say
from mlx_qwen3asr.outputs.folder import (
    FileJob,
    InputFile,
    TranscribeOptions,
    existing_outputs,
    output_problem,
    output_stem,
    prepare_output_folder,
)
from mlx_qwen3asr.pipeline.alignment import align_span
from mlx_qwen3asr.pipeline.inputs import NO_SPEECH
from mlx_qwen3asr.pipeline.memory import wired_limit
from mlx_qwen3asr.pipeline.result import Segment
from mlx_qwen3asr.pipeline.streaming import DEFAULT_MAX_WINDOW_SECONDS, StreamingTranscriber, StreamUpdate
from mlx_qwen3asr.runtime.messages import one_line
from mlx_qwen3asr.text.languages import resolve_language
from mlx_qwen3asr.text.output import join_texts

__all__ = ["LiveError", "WavStream", "build_parser", "main"]

PROG = "mlxasr live"
STDIN = "-"
# The outputs' name for a stream that is no file (--name NAME gives another).
STDIN_NAME = "stdin"
MICROPHONE_NAME = "microphone"
SOUNDDEVICE_HINT = "the microphone needs the sounddevice package: pip install 'mlx-qwen3asr[live]'"

CHUNK_SECONDS_RANGE = (0.1, 30.0)
WINDOW_SECONDS_RANGE = (3.0, 600.0)
# Audio handed to the transcriber at a time: small enough that a stream read or a played file keeps
# pace with speech, large enough not to cost a step per block.
BLOCK_SECONDS = 0.1
READ_BYTES = 1 << 15

EPILOG = f"""\
sources:
  mlxasr live                      the default microphone (pip install 'mlx-qwen3asr[live]')
  mlxasr live -                    standard input: a WAV stream (any PCM or float encoding, rate and
                                   channel count), or else raw 16-bit little-endian mono PCM at
                                   --sample-rate (16000 Hz by default); its end ends the session
  mlxasr live --input FILE         any audio or video file mlxasr reads, as fast as it goes, or at
                                   speaking pace with --realtime

examples:
  ffmpeg -loglevel error -i talk.m4a -f wav - | mlxasr live - --srt --name talk
  arecord -q -f S16_LE -r 16000 -c 1 | mlxasr live - --txt -o notes/
  mlxasr live --input lecture.mp3 --realtime --language en

outputs:
  With a format option (--txt, --srt, --vtt, --json), -o DIR or --name NAME, the committed segments
  are written to DIR/NAME.txt, DIR/NAME.srt, ... (TXT when no format is named) and rewritten after
  each commit, each file replaced whole. -o is the output folder, as for mlxasr (default: beside the
  --input file); NAME defaults to the --input file's name without its extension, to "stdin" for
  standard input and to "microphone" (an audio or output extension given with it is dropped:
  --name talk.wav writes talk.txt). Outputs of standard input or the microphone need -o DIR or
  --name NAME (then in the current folder). Existing outputs are refused before the model loads
  unless --overwrite is given. With SRT or VTT (or --word-timestamps) the words of each
  committed segment are timed by the forced aligner, so cues break between words; an aligner that
  cannot be had gives one line and estimated cue times.

exit status:
  {EXIT_OK}    the source ended and the outputs were written
  {EXIT_FAILED}    the audio could not be read (a damaged stream, a file that does not decode), or an
       output could not be written; what was committed before is written
  {EXIT_USAGE}    usage error (bad option, existing outputs, no microphone or no sounddevice), or the
       model could not be loaded; nothing is written
  {EXIT_INTERRUPTED}  Ctrl-C: the last words are finished and the outputs written ({EXIT_TERMINATED} for SIGTERM)"""


def build_parser() -> argparse.ArgumentParser:
    """The `mlxasr live` argument parser."""
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Transcribe live audio on the terminal: the microphone, a stream on standard input,\n"
        "or a file played at speaking pace.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "source",
        nargs="?",
        metavar="-",
        help="read the audio from standard input (default: the microphone)",
    )
    p.add_argument("--input", "-i", metavar="FILE", help="transcribe an audio or video file as a live stream")
    p.add_argument(
        "--realtime",
        action="store_true",
        help="with --input: send the file's audio at speaking pace (default: as fast as it goes)",
    )
    p.add_argument(
        "--sample-rate",
        type=int,
        default=SAMPLE_RATE,
        metavar="HZ",
        help=f"rate of raw PCM on standard input (default: {SAMPLE_RATE}; a WAV stream states its own)",
    )
    model = p.add_argument_group("model")
    add_model(model)
    model.add_argument(
        "--language", metavar="L", help="force the language, by name or code (default: detect)"
    )
    model.add_argument(
        "--context",
        "--initial-prompt",
        dest="context",
        default="",
        metavar="TEXT",
        help="context for the model: names, terms, the topic",
    )
    model.add_argument(
        "--chunk-seconds",
        type=number_in(CHUNK_SECONDS_RANGE),
        default=2.0,
        metavar="S",
        help=f"audio per update ({span(CHUNK_SECONDS_RANGE)}; default: 2)",
    )
    model.add_argument(
        "--max-window-seconds",
        type=number_in(WINDOW_SECONDS_RANGE),
        default=DEFAULT_MAX_WINDOW_SECONDS,
        metavar="S",
        help=f"most audio since the last commit: text is committed at a pause past half of it, and at a cut "
        f"once it is reached ({span(WINDOW_SECONDS_RANGE)}; default: {DEFAULT_MAX_WINDOW_SECONDS:g}); at least "
        "twice --chunk-seconds plus 1",
    )
    add_word_timing(model)
    add_speech_detection(model)
    out = p.add_argument_group("output")
    add_formats(
        out,
        {
            "txt": "plain-text transcript",
            "srt": "SubRip subtitles",
            "vtt": "WebVTT subtitles",
            "json": "text, segments, cues and options",
        },
        lists=False,
    )
    out.add_argument(
        "-o",
        "--output-dir",
        type=Path,
        metavar="DIR",
        help="write the outputs in DIR, as mlxasr does (default: beside the --input file; standard input "
        "and the microphone need -o DIR or --name NAME)",
    )
    out.add_argument(
        "--name",
        metavar="NAME",
        help=f"the outputs' name: DIR/NAME.txt, DIR/NAME.srt, ... (default: the --input file's name without "
        f"its extension; {STDIN_NAME} for standard input; {MICROPHONE_NAME} for the microphone)",
    )
    out.add_argument("--overwrite", action="store_true", help="replace existing outputs")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    return p


# --- sources ------------------------------------------------------------------------------------------


class _Mono16k:
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


def _wav_format(body: bytes, name: str) -> WavFormat:
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


def _decode_frames(data: bytes, fmt: WavFormat) -> np.ndarray:
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
        self.convert = _Mono16k(self.fmt.rate)

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
                self.fmt = _wav_format(body[:size], self.name)
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
            yield self.convert(_decode_frames(data[:whole], fmt))
        tail = self.convert(np.zeros((0, 1), np.float32), last=True)
        if tail.shape[0]:
            yield tail


def _file_blocks(path: str, say: Say, cleanup: contextlib.ExitStack) -> Iterator[np.ndarray]:
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


def _paced(blocks: Iterator[np.ndarray], pause) -> Iterator[np.ndarray]:
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


def _open_microphone():
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
    return _Microphone(stream, blocks, _Mono16k(rate))


class _Microphone:
    """The input stream's blocks as they are recorded; after a stop, those recorded before it."""

    def __init__(self, stream, recorded: queue.Queue, convert: _Mono16k) -> None:
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


# --- display --------------------------------------------------------------------------------------


def _clock(seconds: float) -> str:
    ms = max(0, int(round(seconds * 1000)))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}.{ms:03d}"


def segment_line(segment: Segment) -> str:
    """How a committed segment is printed when stdout is not a terminal."""
    return f"[{_clock(segment.start)} --> {_clock(segment.end)}] {one_line(segment.text)}"


class _Display:
    """Committed segments and the live tail on stdout: in place on a terminal, line by line otherwise."""

    def __init__(self, quiet: bool, out=None) -> None:
        self.out = out or sys.stdout
        self.quiet = quiet
        self.live = None
        self.console = None
        if quiet:
            return
        if self.out.isatty():
            from rich.console import Console
            from rich.live import Live

            self.console = Console(file=self.out)
            self.live = Live(console=self.console, auto_refresh=False, transient=True)
            self.live.start()

    def update(self, update: StreamUpdate, committed_text: str) -> None:
        if self.quiet:
            return
        for segment in update.committed:
            if self.live is not None:
                self.console.print(one_line(segment.text), markup=False, highlight=False)
            else:
                print(segment_line(segment), file=self.out, flush=True)
        if self.live is not None:
            from rich.text import Text

            cut = len(committed_text) if update.text.startswith(committed_text) else 0
            stable = update.stable[cut:].lstrip() if cut <= len(update.stable) else ""
            shown = Text(stable)
            shown.append(update.unstable, style="dim")
            self.live.update(shown, refresh=True)

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None


# --- the session ----------------------------------------------------------------------------------


class _Stop:
    """Ctrl-C and SIGTERM during a session: raised at once while it waits for audio, noted while the
    model works (the step finishes first), and ignored once given so that the session can end."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.waiting = False

    def __call__(self, signum: int, frame: object) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        self.signum = signum
        if self.waiting:
            self.waiting = False
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise Terminated()

    def pause(self, seconds: float) -> None:
        self.waiting = True
        try:
            if self.signum is None:
                time.sleep(seconds)
        finally:
            self.waiting = False

    def blocks(self, source: Iterator[np.ndarray], drain=None) -> Iterator[np.ndarray]:
        """The source's blocks, interruptible while the next one is waited for; after a stop, the
        blocks drain() gives (the audio a microphone recorded before it)."""
        while self.signum is None:
            self.waiting = True
            try:
                block = next(source, None)
            except (KeyboardInterrupt, Terminated):
                break
            finally:
                self.waiting = False
            if block is None:
                return
            yield block
        if drain is not None:
            close = getattr(source, "close", None)
            if close is not None:
                close()
            yield from drain()


# Where the session's audio goes (an unnamed file in the temporary folder).
_spill_file = tempfile.TemporaryFile


class _Audio:
    """The session's audio (16 kHz mono float32), which the subtitle cues are timed against, appended to
    an unnamed temporary file: hours of it take disk rather than memory, nothing is copied again as it
    grows, and the file is gone however the process ends. Without outputs nothing is kept."""

    def __init__(self, keep: bool) -> None:
        self.file = _spill_file() if keep else None
        self.count = 0

    def add(self, block: np.ndarray) -> None:
        if self.file is not None:
            try:
                self.file.write(np.ascontiguousarray(block, dtype=np.float32).tobytes())
            except OSError as e:
                raise LiveError(
                    f"cannot keep the session's audio in the temporary folder ({(e.strerror or str(e)).lower()})",
                    EXIT_FAILED,
                ) from None
        self.count += int(block.shape[0])

    def signal(self) -> Signal:
        """The audio so far, read by range from the file."""
        if self.file is None:
            return ArraySignal(np.zeros(0, np.float32))
        self.file.flush()
        return FileSignal(self.file, self.count, peak=1.0)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def _time_words(aligner, segments: list[Segment], audio: _Audio, language: str | None, say: Say) -> None:
    """Time the words of newly committed segments with the forced aligner (when there is one and it
    serves the segment: text, a language it knows). A failure keeps the segment's estimated timing,
    with one line."""
    if aligner is None:
        return
    signal_ = audio.signal()
    for seg in segments:
        try:
            samples = signal_.read(round(seg.start * SAMPLE_RATE), round(seg.end * SAMPLE_RATE))
            words = align_span(aligner, samples, seg.text, seg.language or language, (seg.start, seg.end))
        except Exception as e:  # the text stands, with estimated timing
            say.warning(
                f"the aligner failed on {seg.start:.1f}-{seg.end:.1f} s ({one_line(e) or type(e).__name__}); "
                "its cue times are estimated"
            )
            continue
        if words is not None:
            seg.words, seg.timing = words, "aligned"


def _plan(args: argparse.Namespace) -> FileJob | None:
    """The session's outputs: DIR/NAME.<format> (-o DIR, --name NAME), or None when none is asked for."""
    placed = args.output_dir is not None or args.name is not None
    formats = chosen_formats(args, "txt" if placed else None)
    if not formats:
        return None
    name = args.name
    try:
        name = None if name is None else outputs_name(name)
    except ValueError as e:
        raise LiveError(f"--name {name!r}: {e}") from None
    if args.input is not None:
        source = Path(args.input)
        folder = args.output_dir if args.output_dir is not None else source.parent
        name = name or output_stem(source.name)
    elif placed:
        source = Path(STDIN_NAME if args.source == STDIN else MICROPHONE_NAME)
        folder = args.output_dir if args.output_dir is not None else Path()
        name = name or source.name
    else:
        raise LiveError(
            "outputs of standard input or the microphone need a place: -o DIR (DIR/"
            f"{STDIN_NAME if args.source == STDIN else MICROPHONE_NAME}.txt, ...) or --name NAME"
        )
    outputs = {fmt: folder / f"{name}.{fmt}" for fmt in formats}
    job = FileJob(InputFile(source), outputs)
    if args.input is not None:
        for path in outputs.values():
            if os.path.lexists(path) and os.path.lexists(args.input) and os.path.samefile(path, args.input):
                raise LiveError(f"output {path} would replace the input; name the outputs with --name NAME")
    problem = output_problem(job)
    if problem is not None:
        raise LiveError(problem)
    taken = existing_outputs(job)
    if taken and not args.overwrite:
        names = ", ".join(str(outputs[f]) for f in taken)
        exist = "exists" if len(taken) == 1 else "exist"
        raise LiveError(f"output {names} already {exist}; --overwrite replaces, --name NAME names others")
    problem = prepare_output_folder(folder)
    if problem is not None:
        raise LiveError(problem)
    return job


def _source(
    args: argparse.Namespace, stop: _Stop, say: Say, cleanup: contextlib.ExitStack
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
        blocks = _file_blocks(args.input, say, cleanup)
        return args.input, (_paced(blocks, stop.pause) if args.realtime else blocks), None
    if args.realtime:
        raise LiveError("--realtime paces a file: give it with --input FILE")
    if args.source == STDIN:
        fd = _stdin_fd()
        stream = WavStream(lambda n: os.read(fd, n), "stdin", args.sample_rate)
        return "stdin", stream.blocks(), None
    microphone = _open_microphone()
    return "microphone", microphone.blocks(), microphone.drain


def _stdin_fd() -> int:
    return sys.stdin.fileno() if sys.stdin is not None else 0


def _stdin_is_terminal() -> bool:
    try:
        return os.isatty(_stdin_fd())
    except (OSError, ValueError):
        return False


def _stdin_ready() -> bool:
    """Whether standard input has bytes (or its end) to read at once."""
    try:
        return bool(select.select([_stdin_fd()], [], [], 0)[0])
    except (OSError, ValueError):
        return True


def _session(args: argparse.Namespace, say: Say, stop: _Stop) -> int:
    if args.source is not None and args.source != STDIN:
        raise LiveError(
            f"{args.source!r}: the only source argument is - (standard input); a file goes with --input"
        )
    if args.sample_rate != SAMPLE_RATE and args.source != STDIN:
        raise LiveError("--sample-rate is the rate of raw PCM on standard input: use it with -")
    if args.source == STDIN and _stdin_is_terminal():  # typed text would be read as PCM
        raise LiveError(f"{STDIN} reads audio from standard input, which is a terminal; pipe audio in")
    try:
        language = resolve_language(args.language)
    except ValueError as e:
        raise LiveError(f"--language: {e}") from None
    least = 2 * args.chunk_seconds + 1.0  # the two chunks still revised, plus a second to commit
    if args.max_window_seconds < least:
        raise LiveError(
            f"--max-window-seconds {args.max_window_seconds:g}: must be at least {least:g} "
            f"with --chunk-seconds {args.chunk_seconds:g}"
        )
    job = _plan(args)
    with _outputs_lock(job), contextlib.ExitStack() as cleanup:
        return _run_session(args, say, stop, job, language, cleanup)


@contextlib.contextmanager
def _outputs_lock(job: FileJob | None) -> Iterator[None]:
    """Hold a lock on the session's output names, so that a second session writing them is refused
    rather than interleaved with this one. An advisory lock on a hidden file beside the outputs: the
    system releases it however the process ends (kill -9 included); the file is removed at the end."""
    if job is None:
        yield
        return
    first = next(iter(job.outputs.values()))
    path = first.parent / f".{first.stem}.mlxasr-live.lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        raise LiveError(
            f"cannot write in {first.parent} ({(e.strerror or str(e)).lower()})", EXIT_FAILED
        ) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise LiveError(
                f"another mlxasr live session is writing {first.with_suffix('')}.*; "
                "give this one another --name NAME or -o DIR"
            ) from None
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
    finally:
        os.close(fd)


def _run_session(
    args: argparse.Namespace,
    say: Say,
    stop: _Stop,
    job: FileJob | None,
    language: str | None,
    cleanup: contextlib.ExitStack,
) -> int:
    # Until the session starts nothing is written: a stop ends the command at once.
    stop.waiting = True
    try:
        if args.source == STDIN and not _stdin_ready():
            # Nothing is there yet (the stream may start much later): say so, and load the model
            # meanwhile rather than once the first bytes come.
            say.info("waiting for audio on standard input")
            model = load_model(args.model, args.dtype, say)
            name, blocks, drain = _source(args, stop, say, cleanup)
        else:
            name, blocks, drain = _source(args, stop, say, cleanup)
            model = load_model(args.model, args.dtype, say)
    finally:
        stop.waiting = False
    if model is None:
        return EXIT_USAGE
    cleanup.enter_context(wired_limit(model))  # on Metal: weights and caches resident for the session
    vad = vad_options(args)
    try:
        transcriber = StreamingTranscriber(
            model,
            language=language,
            context=args.context,
            chunk_seconds=args.chunk_seconds,
            max_window_seconds=args.max_window_seconds,
            vad=vad,
        )
    except (ValueError, VadUnavailable) as e:
        raise LiveError(one_line(e)) from None
    aligner, aligner_source = None, None
    timed = args.word_timestamps
    if timed is None:  # timing words matters for subtitles, not for a transcript
        timed = job is not None and bool({"srt", "vtt"} & set(job.outputs))
    if job is not None and timed:
        # The model is loaded already, beside the source (load_in_order's order).
        loaded = load_in_order(args, say, model=False, aligner=untimed(job.outputs))
        if loaded is None:
            return EXIT_USAGE
        aligner = loaded.aligner.model
        aligner_source = loaded.aligner.source if aligner is not None else None
    options = TranscribeOptions(
        language=language,
        context=args.context,
        max_segment_seconds=args.max_window_seconds,
        word_timestamps=aligner is not None,
        aligner=aligner_source,
        vad=vad,
    )
    outputs = LiveOutputs(job, options, args.model)
    audio = _Audio(keep=job is not None)
    display = _Display(args.quiet)
    failure: LiveError | None = None
    try:
        if name == "microphone":
            say.info("listening; Ctrl-C ends the session")
        try:
            for block in stop.blocks(blocks, drain):
                audio.add(block)
                for update in transcriber.feed(block):
                    committed = [
                        s.text
                        for s in transcriber.segments[: len(transcriber.segments) - len(update.committed)]
                    ]
                    display.update(update, join_texts(committed, update.language or language))
                    if update.committed:
                        _time_words(aligner, update.committed, audio, language, say)
                        outputs.write(transcriber, audio.signal(), language)
        except LiveError as e:
            failure = e
        if audio.count == 0 and failure is None and stop.signum is None:
            failure = LiveError(f"{name}: no audio samples", EXIT_FAILED)
        if audio.count or transcriber.segments:
            final = transcriber.finish()
            committed = [
                s.text for s in transcriber.segments[: len(transcriber.segments) - len(final.committed)]
            ]
            display.update(final, join_texts(committed, final.language or language))
            _time_words(aligner, final.committed, audio, language, say)
            warnings = []
            if vad is not None and audio.count and not transcriber.speech:
                warnings.append(NO_SPEECH)
                say.warning(NO_SPEECH)
            outputs.write(transcriber, audio.signal(), language, warnings, final=True)
    finally:
        display.close()
        audio.close()
    if outputs.written:
        say.info(f"wrote {', '.join(map(str, outputs.written))}")
    if failure is not None:
        raise failure
    if stop.signum == signal.SIGTERM:
        say.info("terminated; the outputs hold everything transcribed")
        return EXIT_TERMINATED
    if stop.signum is not None:
        say.info("interrupted; the outputs hold everything transcribed")
        return EXIT_INTERRUPTED
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run `mlxasr live` with the given arguments (default: sys.argv[2:]); returns the exit status."""
    return stopped(
        PROG, lambda: _main(sys.argv[2:] if argv is None else list(argv)), errors=LiveError, on_error=_said
    )


def _said(e: LiveError) -> int:
    Say(PROG, False).error(str(e), e.label)
    return e.status


def _main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_vad(parser, args)
    if args.word_timestamps is False and args.aligner is not None:
        moot(parser, "--aligner", "with --no-word-timestamps (words are not timed)")
    say = Say(PROG, args.quiet)
    stop = _Stop()
    in_main = threading.current_thread() is threading.main_thread()
    old = {}
    if in_main:
        old = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _session(args, say, stop)
    finally:
        if in_main and stop.signum is None:
            for sig, handler in old.items():
                signal.signal(sig, handler)
