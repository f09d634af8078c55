"""Transcription: audio in, text with segment timing out; many inputs through one Scheduler as they
finish (transcribe_stream), or all of them at once (transcribe)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from mlx_qwen3asr.audio.features import SAMPLE_RATE
from mlx_qwen3asr.audio.files import estimate_duration
from mlx_qwen3asr.audio.vad import VadOptions, vad_options
from mlx_qwen3asr.checkpoints.loading import ASRModel
from mlx_qwen3asr.pipeline.inputs import DEFAULT_MAX_SEGMENT_SECONDS, AudioInput, InputOptions
from mlx_qwen3asr.pipeline.memory import wired_limit
from mlx_qwen3asr.pipeline.parts import Parts
from mlx_qwen3asr.pipeline.result import InputResult, Segment, Transcription
from mlx_qwen3asr.pipeline.scheduler import Scheduler
from mlx_qwen3asr.text.languages import resolve_language


def transcribe_stream(
    model: ASRModel,
    inputs: Sequence[AudioInput],
    *,
    language: str | None = None,
    context: str = "",
    max_segment_seconds: float = DEFAULT_MAX_SEGMENT_SECONDS,
    batch_size: int | None = None,
    skip: Callable[[np.ndarray], bool] | None = None,
    on_segment: Callable[[int, Segment], None] | None = None,
    aligner: ASRModel | None = None,
    vad: bool | VadOptions = True,
    parts: Parts | None = None,
    on_progress: Callable[[int, float], None] | None = None,
) -> Iterator[InputResult]:
    """Transcribe many inputs, decoding segments of several inputs together; yields results as inputs finish.

    batch_size: rows decoded together (None: as many as MEMORY_FRACTION of the free memory holds
        KV caches for, given the segments' lengths, up to the device's Tuning.max_batch, runtime/device.py); finished rows are replaced by
        waiting segments as they go (continuous batching).
    skip: inputs whose waveform this returns True for are not sent to the model (empty result).
    on_segment(input index, segment): each input's segments, in time order, as they become known.
    on_progress(input index, seconds): work done on an input since the last call, in seconds of its
        audio, after each decoding step (Scheduler); an input's calls add up to its duration
        (InputResult's transcription.duration) before its result is yielded.
    aligner: a Qwen3-ForcedAligner; segments then get word times (segment.words), aligned in groups
        right after their text is decoded.
    vad: speech detection (True, False, or VadOptions): only the speech regions reach the model.
    parts: the stages the scheduler calls (default: the real ones; tests and benchmarks give their own).
    An input that cannot be read, or whose batch fails, gives a result carrying the error; the others
    go on (on_segment or on_progress raising fails that input only). Results come in the order inputs
    finish, which is not the input order.
    """
    options = InputOptions(resolve_language(language), context, aligner is not None, skip, vad_options(vad))
    scheduler = Scheduler(
        model,
        aligner=aligner,
        max_segment_seconds=max_segment_seconds,
        batch_size=batch_size,
        on_segment=on_segment,
        on_progress=on_progress,
        parts=parts,
    )
    try:
        for index, audio in enumerate(inputs):
            scheduler.submit(index, audio, options)
        with wired_limit(model):  # on Metal: weights and caches stay resident until the last result
            while not scheduler.idle:
                yield from scheduler.run_once()
    finally:
        scheduler.close()


def _estimated_seconds(audio: AudioInput) -> float:
    """An input's duration before it is decoded: a file's header (or a guess from its size), an
    array's length."""
    if isinstance(audio, (str, os.PathLike)):
        return estimate_duration(audio)
    array, rate = audio if isinstance(audio, tuple) and len(audio) == 2 else (audio, SAMPLE_RATE)
    try:
        shape, rate = np.shape(array), float(rate)
    except (TypeError, ValueError):
        return 0.0  # refused when it is prepared
    return max(shape, default=0) / rate if rate > 0 else 0.0


class _Progress:
    """Seconds of audio done and in all, over the inputs, for transcribe's on_progress: an input counts
    its estimated duration until it is transcribed, then its real one; done never passes the total."""

    def __init__(self, inputs: Sequence[AudioInput], report: Callable[[float, float], None]) -> None:
        self.report = report
        self.totals = [_estimated_seconds(a) for a in inputs]
        self.done = [0.0] * len(inputs)
        self.done_sum, self.total_sum = 0.0, sum(self.totals)

    def add(self, index: int, seconds: float) -> None:
        """Work done on an input (seconds of its audio)."""
        self.done[index] += seconds
        self.done_sum += seconds
        if self.done[index] > self.totals[index]:  # the estimate fell short
            self.total_sum += self.done[index] - self.totals[index]
            self.totals[index] = self.done[index]
        self.report(min(self.done_sum, self.total_sum), self.total_sum)

    def finished(self, index: int, seconds: float) -> None:
        """An input is transcribed: its real duration replaces its estimate."""
        self.done[index] = self.totals[index] = seconds
        total = sum(self.totals)
        # Summed afresh (exact once every input is finished), never below what was reported.
        done = min(max(sum(self.done), self.done_sum), total)
        if (done, total) != (self.done_sum, self.total_sum):
            self.done_sum, self.total_sum = done, total
            self.report(done, total)


def _transcribe_all(
    model: ASRModel,
    inputs: Sequence[AudioInput],
    *,
    language: str | None,
    context: str,
    max_segment_seconds: float,
    batch_size: int | None,
    on_segment: Callable[[Segment], None] | None,
    aligner: ASRModel | None = None,
    vad: bool | VadOptions = True,
    parts: Parts | None = None,
    on_progress: Callable[[float, float], None] | None = None,
) -> list[Transcription]:
    results: list[Transcription | None] = [None] * len(inputs)
    progress = None if on_progress is None else _Progress(inputs, on_progress)
    stream = transcribe_stream(
        model,
        inputs,
        language=language,
        context=context,
        max_segment_seconds=max_segment_seconds,
        batch_size=batch_size,
        on_segment=None if on_segment is None else (lambda _index, seg: on_segment(seg)),
        aligner=aligner,
        vad=vad,
        parts=parts,
        on_progress=None if progress is None else progress.add,
    )
    for res in stream:
        if res.error is not None:
            stream.close()
            raise res.error
        results[res.index] = res.transcription
        if progress is not None:
            progress.finished(res.index, res.transcription.duration)
    return [r for r in results if r is not None]


def transcribe(
    model: ASRModel,
    audio: AudioInput | Sequence[AudioInput],
    *,
    language: str | None = None,
    context: str = "",
    max_segment_seconds: float = DEFAULT_MAX_SEGMENT_SECONDS,
    batch_size: int | None = None,
    on_segment: Callable[[Segment], None] | None = None,
    aligner: ASRModel | None = None,
    vad: bool | VadOptions = True,
    parts: Parts | None = None,
    on_progress: Callable[[float, float], None] | None = None,
) -> Transcription | list[Transcription]:
    """Transcribe a file, an array (16 kHz, or `(array, sample_rate)`), or a list of them.

    language: force the language (a name such as "English" or a code such as "en"); None detects it.
    context: text that biases recognition (names, terms), placed in the system prompt.
    batch_size: segments decoded together, from one input or several (None: chosen automatically).
    on_segment: called with each segment as it is transcribed, in time order within each input.
    aligner: a Qwen3-ForcedAligner model (`load("Qwen/Qwen3-ForcedAligner-0.6B")`): segments then carry
        `words` with their times and `timing == "aligned"` where the aligner serves their language.
    vad: speech detection (Silero VAD): only the speech regions are transcribed, so noise, music and
        silence give no text (`Transcription.speech` lists the regions). False sends all the audio, cut
        at quiet points; VadOptions(threshold=...) tunes it.
    parts: the stages transcription goes through (pipeline.parts.Parts; default: the real ones), for
        tests and benchmarks.
    on_progress: called with (seconds done, total seconds) of audio as the work goes, after each
        decoding step: a segment being decoded counts in part, a finished one in full. The total is the
        inputs' durations: a file's as its header states it (or guessed from its size) and an array's
        length until the input is transcribed, then its decoded length; at the end done equals total.
    Returns one Transcription per input, a list for a list. An input that cannot be read raises.
    """
    resolve_language(language)  # fail before any audio is read
    many = isinstance(audio, list)
    results = _transcribe_all(
        model, audio if many else [audio], language=language, context=context,
        max_segment_seconds=max_segment_seconds, batch_size=batch_size, on_segment=on_segment,
        aligner=aligner, vad=vad, parts=parts, on_progress=on_progress,
    )  # fmt: skip
    return results if many else results[0]


__all__ = ["Segment", "Transcription", "transcribe", "transcribe_stream"]
