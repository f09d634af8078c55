"""Scheduling: the segments of many inputs transcribed in batches, upcoming audio prepared meanwhile.

Decoding reads every decoder weight once per step whatever the number of rows, so segments are
decoded together, from one long file or from many files. Inputs are loaded, cut at quiet points and
turned into mel spectrograms on a background thread while the model works; the pool of waiting
segments is sorted by length before each batch so that rows of a batch need little padding.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from .alignment import align_segments, why_not_aligned
from .audio import SAMPLE_RATE, log_mel_spectrogram, mel_frame_count, prepare_audio
from .decode import ArraySignal, DecodedAudio, Signal, read_audio
from .generate import Prefix, greedy_generate_batch, prefill_prefix, token_budget
from .loading import ASRModel, require_kind
from .model import encoder_batch
from .prompt import (
    fix_repetitions_flag,
    join_texts,
    parse_output,
    prompt_prefix_ids,
    prompt_suffix_ids,
    resolve_language,
)
from .result import Segment, Transcription, main_language
from .segment import Segment as Span
from .segment import padded_length, segment_audio, split_on_silence

# Pieces of about 30 s transcribe more accurately than long ones (the model was tuned on short clips),
# and a segment is the unit of timing in the output.
DEFAULT_MAX_SEGMENT_SECONDS = 30.0
# Encoder work per call, in 100-frame chunks: bounds activation memory however much audio a batch holds.
ENCODER_CHUNKS_PER_CALL = 256
# Chunks through the conv stem at once (measured on a CPU: 8 is ~20% faster than 80, and bounds memory).
STEM_CHUNKS = 8
# Rows decoded together at most. Tokens per second still grow up to here on a 2-core CPU (0.6b: 36 at
# 16 rows, 48 at 32); past it, long prompts' prefill would hold too much attention memory at once.
MAX_BATCH = 32
# Share of the available memory that the batch's KV cache may take.
MEMORY_FRACTION = 0.25

AudioInput = str | os.PathLike | np.ndarray | tuple


def load_input(audio: AudioInput) -> tuple[DecodedAudio, str | None]:
    """A mono 16 kHz float32 waveform from a path, a 16 kHz array or `(array, sample_rate)`."""
    if isinstance(audio, (str, os.PathLike)):
        return read_audio(audio), str(audio)
    if isinstance(audio, tuple) and len(audio) == 2:
        array, rate = audio
        samples = prepare_audio(np.asarray(array), int(rate))
    elif isinstance(audio, (np.ndarray, mx.array)):
        samples = prepare_audio(np.asarray(audio), SAMPLE_RATE)
    else:
        samples = None
    if samples is not None:
        return DecodedAudio(ArraySignal(samples), samples.size / SAMPLE_RATE), None
    raise TypeError(
        f"unsupported audio input {type(audio).__name__}: give a path, an array, or (array, rate)"
    )


def _source(audio: AudioInput) -> str | None:
    return str(audio) if isinstance(audio, (str, os.PathLike)) else None


def available_memory() -> int:
    """Bytes the process can still use (GPU working set on Apple silicon, free RAM elsewhere)."""
    info = mx.device_info()
    limit = info.get("max_recommended_working_set_size") or info.get("memory_size")
    if limit:
        return max(0, int(limit) - mx.get_active_memory())
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2


def kv_bytes_per_position(model: ASRModel) -> int:
    """Bytes of keys and values that one cached position of one row takes, over all decoder layers."""
    t = model.config.text_config
    return 2 * t.num_hidden_layers * t.num_key_value_heads * t.head_dim * model.dtype.size


def encode_segments(model: ASRModel, mels: Sequence[np.ndarray]) -> list[mx.array]:
    """Audio features of each segment; segments share encoder calls up to a chunk budget."""
    cfg = model.config.audio_config
    features: list[mx.array] = []
    group: list[np.ndarray] = []
    chunks = 0

    def flush() -> None:
        batch = encoder_batch(group, cfg, model.dtype)
        tower = model.net.audio_tower
        # The conv stem's activations are the largest of the encoder: evaluated a few chunks at a time
        # they stay in cache and bounded.
        stem = []
        for i in range(0, batch.chunks.shape[0], STEM_CHUNKS):
            stem.append(tower.embed_chunks(batch.chunks[i : i + STEM_CHUNKS]))
            mx.eval(stem[-1])
        out = tower.encode_embedded(mx.concatenate(stem, axis=0), batch)
        mx.eval(out)
        offsets = np.cumsum([0, *batch.token_counts])
        features.extend(out[offsets[i] : offsets[i + 1]] for i in range(len(group)))

    for mel in mels:
        n = -(-mel.shape[1] // cfg.chunk_frames)
        if group and chunks + n > ENCODER_CHUNKS_PER_CALL:
            flush()
            group, chunks = [], 0
        group.append(mel)
        chunks += n
    if group:
        flush()
    return features


@dataclass
class PreparedInput:
    """An input made ready for the model: its decoded audio and where it is cut into segments.

    The audio of a long file lives in a temporary file (decode.FileSignal); each segment's mel
    spectrogram is computed from it when the segment's batch comes, so memory does not grow with
    the length of a file.
    """

    index: int
    source: str | None
    wav: Signal  # the decoded samples (an array for short inputs, a temporary file for long ones)
    spans: list[Span]
    skipped: bool = False  # the `skip` predicate held: nothing is sent to the model
    warnings: list[str] = field(default_factory=list)  # what decoding found wrong with the file
    header_seconds: float | None = None  # the length its header states, when decoding fell short


def prepare_input(
    index: int,
    audio: AudioInput,
    max_segment_seconds: float,
    skip: Callable[[Signal], bool] | None = None,
) -> PreparedInput:
    decoded, source = load_input(audio)
    signal = decoded.signal
    skipped = skip is not None and skip(signal)
    spans = (
        [] if skipped else split_on_silence(signal, max_seconds=max_segment_seconds, sample_rate=SAMPLE_RATE)
    )
    header = decoded.header_seconds if decoded.truncated else None
    return PreparedInput(index, source, signal, spans, skipped, list(decoded.warnings), header)


@dataclass
class InputResult:
    """The outcome for one input: a transcription, or the error that stopped it."""

    index: int
    source: str | None
    transcription: Transcription | None = None
    wav: Signal | None = None  # the decoded samples (read by range for long files)
    error: Exception | None = None
    skipped: bool = False


@dataclass
class _Pending:
    prepared: PreparedInput
    segments: list[Segment | None]
    reported: int = 0  # segments already passed to on_segment, in time order
    timing_notes: list[str] = field(default_factory=list)  # why segments kept estimated word timing

    @property
    def complete(self) -> bool:
        return all(s is not None for s in self.segments)


@dataclass
class _Task:
    pending: _Pending
    position: int  # segment number within its input
    _mel: np.ndarray | None = None

    @property
    def span(self) -> Span:
        return self.pending.prepared.spans[self.position]

    @property
    def frames(self) -> int:
        """Mel frames of the segment (known without computing them)."""
        return mel_frame_count(padded_length(self.span))

    @property
    def mel(self) -> np.ndarray:
        """The segment's log-mel spectrogram, computed from its samples when first needed."""
        if self._mel is None:
            samples = segment_audio(self.pending.prepared.wav, self.span, sample_rate=SAMPLE_RATE)
            self._mel = log_mel_spectrogram(samples)
        return self._mel


class _Decoder:
    """Runs one batch of segments: encoder, prompts, batched greedy decoding, text.

    The prompt start (system prompt and context) is the same for every segment: its keys and values
    are computed once, at the first batch, and shared by every row of every batch.
    """

    def __init__(
        self, model: ASRModel, language: str | None, context: str, aligner: ASRModel | None = None
    ) -> None:
        self.model, self.language, self.aligner = model, language, aligner
        tok = model.tokenizer
        self.eos = frozenset({tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")})
        self.prefix_ids = prompt_prefix_ids(tok, context)  # raises on an over-long context, before any work
        self.suffix_overhead = len(prompt_suffix_ids(tok, 0, language))
        self._prefix: Prefix | None = None

    @property
    def prefix(self) -> Prefix:
        if self._prefix is None:
            self._prefix = prefill_prefix(self.model.net, self.prefix_ids)
        return self._prefix

    def rows_that_fit(self, tasks: Sequence[_Task], memory: int) -> int:
        """How many of these tasks, taken in order, decode together with their KV cache in `memory` bytes.

        The cache holds, for every row, the longest prompt of the batch (after the shared prefix) plus
        the largest token budget; the prefix is held once.
        """
        cfg = self.model.config.audio_config
        per_position = kv_bytes_per_position(self.model)
        memory -= len(self.prefix_ids) * per_position
        width = budget = 0
        for n, task in enumerate(tasks, start=1):
            width = max(width, self.suffix_overhead + cfg.audio_tokens(task.frames))
            budget = max(budget, token_budget(task.span.duration))
            if n * (width + budget) * per_position > memory:
                return max(1, n - 1)
        return len(tasks)

    def __call__(self, tasks: Sequence[_Task]) -> list[Segment]:
        model, tok = self.model, self.model.tokenizer
        features = encode_segments(model, [t.mel for t in tasks])
        prompts = [prompt_suffix_ids(tok, int(f.shape[0]), self.language) for f in features]
        budgets = [token_budget(t.span.duration) for t in tasks]
        generations = greedy_generate_batch(
            model.net, prompts, features, budgets, self.eos, prefix=self.prefix
        )
        segments = []
        for task, gen in zip(tasks, generations):
            raw = tok.decode(gen.tokens, skip_special_tokens=True)
            language, text = parse_output(raw, self.language)
            _, collapsed = fix_repetitions_flag(raw.strip())
            segments.append(
                Segment(
                    start=task.span.start_seconds,
                    end=task.span.end_seconds,
                    text=text,
                    language=language,
                    truncated=gen.truncated,
                    repetitive=gen.repetitive or collapsed,
                )
            )
        if self.aligner is not None:
            self.align(tasks, segments)
        return segments

    def align(self, tasks: Sequence[_Task], segments: list[Segment]) -> None:
        """Time the words of the batch's segments in one aligner pass; the others keep estimated timing
        and their input records why."""
        chosen = []
        for i, (task, seg) in enumerate(zip(tasks, segments)):
            if seg.truncated or seg.repetitive:
                continue  # its text may be incomplete; it is flagged as such already
            reason = why_not_aligned(self.aligner, seg.text, seg.language, task.span.duration)
            if reason is None:
                chosen.append(i)
            elif reason != "no text":
                task.pending.timing_notes.append(reason)
        if not chosen:
            return
        try:
            words = align_segments(
                self.aligner,
                [tasks[i].mel for i in chosen],
                [segments[i].text for i in chosen],
                [segments[i].language for i in chosen],
                [(segments[i].start, segments[i].end) for i in chosen],
            )
        except Exception as e:  # e.g. out of memory: the text stands, with estimated timing
            for i in chosen:
                tasks[i].pending.timing_notes.append(f"the aligner failed ({type(e).__name__}: {e})")
            return
        for i, found in zip(chosen, words):
            segments[i].words, segments[i].timing = found, "aligned"


def _assemble(
    prepared: PreparedInput, segments: list[Segment], language: str | None, timing_notes: Sequence[str] = ()
) -> Transcription:
    language_out = language or main_language(segments)
    warnings = list(prepared.warnings)
    for note, count in Counter(timing_notes).items():
        warnings.append(f"word timing is estimated for {count} segment(s): {note}")
    return Transcription(
        text=join_texts([s.text for s in segments], language_out),
        language=language_out,
        segments=segments,
        duration=len(prepared.wav) / SAMPLE_RATE,
        source=prepared.source,
        warnings=warnings,
        header_duration=prepared.header_seconds,
    )


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
) -> Iterator[InputResult]:
    """Transcribe many inputs, decoding segments of several inputs together; yields results as inputs finish.

    batch_size: segments decoded together (None: as many as MEMORY_FRACTION of the free memory holds
        KV caches for, given the segments' lengths, up to MAX_BATCH).
    skip: inputs whose waveform this returns True for are not sent to the model (empty result).
    on_segment(input index, segment): each input's segments, in time order, as they become known.
    aligner: a Qwen3-ForcedAligner; each batch's segments then get word times (segment.words), aligned
        together right after their text is decoded.
    An input that cannot be read, or whose batch fails, gives a result carrying the error; the others
    go on. Results come in the order inputs finish, which is not the input order.
    """
    require_kind(model, "asr")
    if aligner is not None:
        require_kind(aligner, "aligner")
    forced = resolve_language(language)
    fixed = max(1, int(batch_size)) if batch_size else None
    size = fixed or MAX_BATCH
    kv_memory = None if fixed else int(available_memory() * MEMORY_FRACTION)
    decode = _Decoder(model, forced, context, aligner)
    inputs = list(inputs)
    ahead = max(2, size)  # inputs being prepared in the background
    queued: list[tuple[int, Future[PreparedInput]]] = []
    submitted = 0
    pool: list[_Task] = []
    pending: dict[int, _Pending] = {}
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="audio-prepare")
    try:
        while True:
            # Prepare ahead while the pool is short of two batches (long inputs fill it at once, and
            # their waveforms and mels are not held for many more inputs meanwhile).
            while submitted < len(inputs) and len(queued) < ahead and (len(pool) < 2 * size or not queued):
                args = (submitted, inputs[submitted], max_segment_seconds, skip)
                queued.append((submitted, executor.submit(prepare_input, *args)))
                submitted += 1
            # Admit prepared inputs until the pool holds two batches: enough to sort by length.
            if queued and len(pool) < 2 * size:
                index, future = queued.pop(0)
                try:
                    prepared = future.result()
                except Exception as e:  # unreadable audio: this input fails, the others go on
                    yield InputResult(index, _source(inputs[index]), error=e)
                    continue
                if not prepared.spans:
                    empty = _assemble(prepared, [], forced)
                    yield InputResult(index, prepared.source, empty, prepared.wav, skipped=prepared.skipped)
                    continue
                entry = _Pending(prepared, [None] * len(prepared.spans))
                pending[index] = entry
                pool.extend(_Task(entry, i) for i in range(len(prepared.spans)))
                continue
            if not pool:
                break
            pool.sort(key=lambda t: t.frames, reverse=True)
            rows = size if fixed else decode.rows_that_fit(pool[:size], kv_memory)
            batch, pool = pool[:rows], pool[rows:]
            touched = sorted({t.pending.prepared.index for t in batch})
            try:
                segments = decode(batch)
            except Exception as e:  # e.g. out of memory: the inputs of this batch fail, the rest go on
                pool = [t for t in pool if t.pending.prepared.index not in touched]
                for index in touched:
                    entry = pending.pop(index)
                    yield InputResult(index, entry.prepared.source, wav=entry.prepared.wav, error=e)
                continue
            for task, seg in zip(batch, segments):
                task.pending.segments[task.position] = seg
            for index in touched:
                entry = pending[index]
                while entry.reported < len(entry.segments) and entry.segments[entry.reported] is not None:
                    if on_segment is not None:
                        on_segment(index, entry.segments[entry.reported])
                    entry.reported += 1
                if entry.complete:
                    del pending[index]
                    result = _assemble(entry.prepared, entry.segments, forced, entry.timing_notes)
                    yield InputResult(index, entry.prepared.source, result, entry.prepared.wav)
    finally:
        executor.shutdown(wait=False, cancel_futures=True)


__all__ = [
    "DEFAULT_MAX_SEGMENT_SECONDS",
    "InputResult",
    "encode_segments",
    "kv_bytes_per_position",
    "load_input",
    "transcribe_stream",
]
