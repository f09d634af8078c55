"""Transcription: audio in, text with segment timing out."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from mlx_qwen3asr.audio.vad import VadOptions
from mlx_qwen3asr.checkpoints.loading import ASRModel
from mlx_qwen3asr.pipeline.inputs import DEFAULT_MAX_SEGMENT_SECONDS, AudioInput
from mlx_qwen3asr.pipeline.parts import Parts
from mlx_qwen3asr.pipeline.result import Segment, Transcription
from mlx_qwen3asr.pipeline.scheduler import transcribe_stream
from mlx_qwen3asr.text.languages import resolve_language


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
) -> list[Transcription]:
    results: list[Transcription | None] = [None] * len(inputs)
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
    )
    for res in stream:
        if res.error is not None:
            stream.close()
            raise res.error
        results[res.index] = res.transcription
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
    Returns one Transcription per input, a list for a list. An input that cannot be read raises.
    """
    resolve_language(language)  # fail before any audio is read
    many = isinstance(audio, list)
    results = _transcribe_all(
        model, audio if many else [audio], language=language, context=context,
        max_segment_seconds=max_segment_seconds, batch_size=batch_size, on_segment=on_segment,
        aligner=aligner, vad=vad, parts=parts,
    )  # fmt: skip
    return results if many else results[0]


__all__ = ["Segment", "Transcription", "transcribe"]
