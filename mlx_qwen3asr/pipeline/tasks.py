"""What the Scheduler keeps for its work: an input in progress (Pending), each of its segments waiting
or decoding (Task), a live stream's single decode (Step, StepResult), and how much of an input's
progress a segment counts for while it decodes."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from mlx_qwen3asr.audio.cutting import Span
from mlx_qwen3asr.audio.features import SAMPLE_RATE, mel_frame_count
from mlx_qwen3asr.model.draft import DraftStart
from mlx_qwen3asr.model.generate import Generation
from mlx_qwen3asr.pipeline.inputs import InputOptions, PreparedInput, segment_frames
from mlx_qwen3asr.pipeline.result import Segment

# Progress (on_progress): while a segment decodes, its share of the audio counts in proportion to its
# tokens against the text it is expected to hold (a header of a few tokens, then speech at about 4 text
# tokens a second), never beyond PARTIAL_SHARE of it; a finished segment counts in full.
EXPECTED_HEADER_TOKENS = 4
EXPECTED_TOKENS_PER_SECOND = 4.0
PARTIAL_SHARE = 0.9


@dataclass(frozen=True)
class Step:
    """One decode of given audio as a single row, with its own prompt after the shared start: a live
    stream's step. suffix(n_audio_tokens) gives the prompt ids after the prompt start (system prompt and
    context) for that many audio tokens; budget is the most tokens it may decode. No speech detection,
    no cutting, no progress, no segment: its result is the row's Generation."""

    samples: np.ndarray  # 16 kHz mono float32, encoded whole (no padding)
    suffix: Callable[[int], list[int]]
    budget: int
    # Set: the step is encoded and prefilled by prepare() (on the scheduler's thread) rather than with
    # the segments, and its row joins the batch as it is (pipeline/steps.py).
    prepare: Callable[[], DraftStart] | None = None


@dataclass
class StepResult:
    """The outcome of a Step: the Generation of its row, or the error that stopped it."""

    index: Hashable
    generation: Generation | None = None
    error: Exception | None = None


@dataclass
class Pending:
    key: Hashable
    prepared: PreparedInput
    options: InputOptions
    segments: list[Segment | None]
    reported: int = 0  # segments already passed to on_segment, in time order
    timing_notes: list[str] = field(default_factory=list)  # why segments kept estimated word timing
    seconds: float = 0.0  # the input's duration: what its progress adds up to
    scale: float = 0.0  # input seconds per second of its segments (a segment's share of the progress)
    finished: float = 0.0  # input seconds of its finished segments
    progressed: float = 0.0  # input seconds passed to on_progress
    step: Step | None = None  # a single decode (submit_step) rather than a transcribed input
    generation: Generation | None = None  # a step's row, once decoded

    @property
    def complete(self) -> bool:
        return all(s is not None for s in self.segments)


@dataclass(eq=False)
class Task:
    pending: Pending
    position: int  # segment number within its input
    order: int  # admission order: the oldest waiting context is served first
    mel: np.ndarray | None = None  # the segment's log-mel spectrogram, while it is needed
    share: float = 0.0  # input seconds the segment counts for in the progress
    expected: int = 1  # tokens the segment is expected to decode (progress while it decodes)
    partial: float = 0.0  # input seconds counted for it while it decodes or waits for the aligner
    started: DraftStart | None = None  # a prepared step's row, once prepared

    @property
    def span(self) -> Span:
        return self.pending.prepared.spans[self.position]

    @property
    def step(self) -> Step | None:
        return self.pending.step

    @property
    def frames(self) -> int:
        """Mel frames of the segment (known without computing them)."""
        if self.step is not None:
            return mel_frame_count(self.step.samples.shape[0])
        return segment_frames(self.span)

    @property
    def context(self) -> str:
        return self.pending.options.context


def input_seconds(prepared: PreparedInput) -> float:
    """An input's duration in seconds, as its result states it."""
    return len(prepared.wav) / SAMPLE_RATE


def expected_tokens(seconds: float, budget: int) -> int:
    """Tokens a segment of this length is expected to decode (within its budget), for its progress."""
    expected = EXPECTED_HEADER_TOKENS + math.ceil(EXPECTED_TOKENS_PER_SECOND * max(seconds, 0.0))
    return max(1, min(int(budget), expected))


def progress_deltas(
    pending: Mapping[Hashable, Pending],
    touched: dict[int, Pending],
    running: Iterable[tuple[Hashable, int, int]],
    in_batch: Mapping[Hashable, Task],
    aligning: list[Task],
) -> Iterator[tuple[Pending, float]]:
    """The progress of each input since it was last reported, as (input, seconds of its audio):
    finished segments in full, the segments decoding (`running`: the batch's row_progress) or waiting
    for the aligner in proportion to their tokens. `touched`: the inputs with segments finished since;
    inputs no longer in `pending` (failed or cancelled) and steps are passed over, when their turn
    comes."""
    partial: dict[int, float] = {}
    decoding = []
    for key, count, _budget in running:
        task = in_batch.get(key)
        if task is not None:
            task.partial = task.share * min(PARTIAL_SHARE, count / task.expected)
            decoding.append(task)
    for task in decoding + aligning:
        entry = task.pending
        partial[id(entry)] = partial.get(id(entry), 0.0) + task.partial
        touched[id(entry)] = entry
    for entry in touched.values():
        if pending.get(entry.key) is not entry or entry.step is not None:
            continue  # failed or cancelled, or a step (no progress)
        if entry.complete:
            done = entry.seconds
        else:
            done = min(entry.finished + partial.get(id(entry), 0.0), entry.seconds)
        if done <= entry.progressed:
            continue
        delta, entry.progressed = done - entry.progressed, done
        yield entry, delta


__all__ = ["Pending", "Step", "StepResult", "Task", "expected_tokens", "input_seconds", "progress_deltas"]
