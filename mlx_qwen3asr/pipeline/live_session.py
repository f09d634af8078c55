"""One live session, as `mlxasr live` and the realtime WebSocket run it: the stream fed and committed
(StreamingTranscriber), the session's audio kept, the words of committed segments timed by the forced
aligner, and the final Transcription.

Where the model works is the front end's choice: the transcriber's decodes run here or as rows of the
server's Engine (StreamingTranscriber's ``rows``), and the aligner through ``run(fn, *args)`` (here by
default; the server's runs it on the Engine's thread, ``Engine.call``). The terminal keeps its
sources, display, files and signals, the server its protocol and limits.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np

from mlx_qwen3asr.audio.features import SAMPLE_RATE
from mlx_qwen3asr.audio.signal import ArraySignal, FileSignal, Signal
from mlx_qwen3asr.pipeline.alignment import align_span
from mlx_qwen3asr.pipeline.inputs import NO_SPEECH
from mlx_qwen3asr.pipeline.joined import JoinedTexts
from mlx_qwen3asr.pipeline.result import Segment, Transcription, main_language
from mlx_qwen3asr.pipeline.streaming import StreamingTranscriber, StreamUpdate
from mlx_qwen3asr.runtime.messages import one_line

# Where the session's audio goes (an unnamed file in the temporary folder).
spill_file = tempfile.TemporaryFile


class AudioKeepError(OSError):
    """The session's audio could not be kept (the temporary folder is full or unwritable)."""


class SessionAudio:
    """The session's audio (16 kHz mono float32), which word timing and subtitle cues read, appended to
    an unnamed temporary file: hours of it take disk rather than memory, nothing is copied again as it
    grows, and the file is gone however the process ends. Without `keep` nothing is kept."""

    def __init__(self, keep: bool, spill: Callable[[], Any] | None = None) -> None:
        self.file = (spill or spill_file)() if keep else None
        self.count = 0

    def add(self, block: np.ndarray) -> None:
        if self.file is not None:
            try:
                self.file.write(np.ascontiguousarray(block, dtype=np.float32).tobytes())
            except OSError as e:
                raise AudioKeepError(
                    f"cannot keep the session's audio in the temporary folder ({(e.strerror or str(e)).lower()})"
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


def run_here(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


class LiveSession:
    """A live stream from its first samples to its Transcription.

    transcriber: the stream (its decodes already placed, see StreamingTranscriber). keep_audio: keep
    the session's audio (for word timing and subtitle cues; aligner implies it). aligner: the forced
    aligner that times the words of each committed segment (None: estimated timing). language: the
    forced language (canonical), for the aligner and the final text. run(fn, *args): where the
    aligner runs (default: here). warn(line): told when the aligner fails on a segment (its words keep
    estimated times). spill: makes the file the audio is kept in (default: an unnamed temporary one).
    vad: the stream detects speech (the Transcription then lists the speech regions taken).
    """

    def __init__(
        self,
        transcriber: StreamingTranscriber,
        *,
        keep_audio: bool = False,
        aligner: Any = None,
        language: str | None = None,
        run: Callable[..., Any] = run_here,
        warn: Callable[[str], None] | None = None,
        spill: Callable[[], Any] | None = None,
        vad: bool = False,
    ) -> None:
        self.transcriber = transcriber
        self.vad = vad
        self._joined = JoinedTexts()
        self.aligner, self.language, self.run = aligner, language, run
        self.warn = warn or (lambda line: None)
        self.audio = SessionAudio(keep_audio or aligner is not None, spill)

    @property
    def segments(self) -> list[Segment]:
        """The committed segments (only ever appended to), their words timed."""
        return self.transcriber.segments

    @property
    def speech(self) -> list[tuple[float, float]]:
        """With speech detection, the speech regions taken, in seconds."""
        return self.transcriber.speech

    def feed(self, block: np.ndarray) -> list[StreamUpdate]:
        """Keep 16 kHz mono float32 samples and feed them to the stream; the updates they make, the
        words of the segments they commit timed. Raises AudioKeepError when the audio cannot be kept."""
        self.audio.add(block)
        updates = self.transcriber.feed(block)
        for update in updates:
            self._time_words(update.committed)
        return updates

    def finish(self) -> StreamUpdate:
        """The final update: the stream's tail decoded and committed, its words timed."""
        update = self.transcriber.finish()
        self._time_words(update.committed)
        return update

    def committed_before(self, update: StreamUpdate) -> str:
        """The committed text before the segments `update` committed, as the display shows it apart from
        the live text: joined as it grows, not again at every step."""
        count = len(self.segments) - len(update.committed)
        return self._joined.text(self.segments, update.language or self.language, count)

    def warnings(self) -> list[str]:
        """What the session's end has to say about its audio: with speech detection, that audio came
        and none of it was speech."""
        return [NO_SPEECH] if self.vad and self.audio.count and not self.speech else []

    def transcription(self, warnings: list[str] | tuple[str, ...] = ()) -> Transcription:
        """The session as a Transcription: the committed segments, their text, main language, the audio's
        duration, `warnings` and, with speech detection, the speech regions taken."""
        segments = self.segments
        language = main_language(segments) if segments else (self.language or "")
        return Transcription(
            text=self._joined.text(segments, language or self.language),
            language=language,
            segments=list(segments),
            duration=self.audio.count / SAMPLE_RATE,
            warnings=list(warnings),
            speech=list(self.speech) if self.vad else None,
        )

    def close(self) -> None:
        self.audio.close()

    def _time_words(self, segments: list[Segment]) -> None:
        """Time the words of newly committed segments with the forced aligner (when there is one and it
        serves the segment: text, a language it knows). A failure keeps the segment's estimated timing,
        with one line."""
        if self.aligner is None or not segments:
            return
        signal = self.audio.signal()
        for seg in segments:
            try:
                samples = signal.read(round(seg.start * SAMPLE_RATE), round(seg.end * SAMPLE_RATE))
                words = self.run(
                    align_span,
                    self.aligner,
                    samples,
                    seg.text,
                    seg.language or self.language,
                    (seg.start, seg.end),
                )
            except Exception as e:  # the text stands, with estimated timing
                self.warn(
                    f"the aligner failed on {seg.start:.1f}-{seg.end:.1f} s ({one_line(e) or type(e).__name__}); "
                    "its cue times are estimated"
                )
                continue
            if words is not None:
                seg.words, seg.timing = words, "aligned"


__all__ = ["AudioKeepError", "LiveSession", "SessionAudio", "spill_file"]
