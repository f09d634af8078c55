"""Scheduling: the segments of many inputs transcribed in batches, upcoming audio prepared meanwhile.

Decoding reads every decoder weight once per step whatever the number of rows, so segments are
decoded together, from one long file or from many files. Inputs are loaded, cut at quiet points and
turned into mel spectrograms on a background thread while the model works; the pool of waiting
segments is sorted by length before each batch so that rows of a batch need little padding.

The stages it calls (decoding, the encoder, the decoding batch, the aligner...) come in `Parts`
(parts.py). Reading ahead is in readahead.py, batch sizing in memory.py, the shared prompt starts in
prefixes.py, the segments and results made of decoded rows in assembly.py, what is kept for each input
and segment in tasks.py, live streams' steps in steps.py; transcribe_stream (transcribe.py) runs many
inputs through a Scheduler.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence

from mlx_qwen3asr.audio.features import log_mel_spectrogram
from mlx_qwen3asr.checkpoints.loading import ASRModel, require_kind
from mlx_qwen3asr.model.generate import DecodeBatch, Generation, HeaderIds
from mlx_qwen3asr.pipeline.alignment import why_not_aligned
from mlx_qwen3asr.pipeline.assembly import decoded_segment
from mlx_qwen3asr.pipeline.inputs import (
    DEFAULT_MAX_SEGMENT_SECONDS,
    HELD_SECONDS,
    AudioInput,
    InputOptions,
    samples_in_memory,
)
from mlx_qwen3asr.pipeline.memory import MEMORY_FRACTION, kv_bytes_per_position, rows_that_fit
from mlx_qwen3asr.pipeline.parts import Parts
from mlx_qwen3asr.pipeline.prefixes import PromptStarts
from mlx_qwen3asr.pipeline.readahead import ReadAhead
from mlx_qwen3asr.pipeline.result import InputResult, Segment
from mlx_qwen3asr.pipeline.steps import LiveSteps
from mlx_qwen3asr.pipeline.tasks import (
    Pending,
    Step,
    StepResult,
    Task,
    expected_tokens,
    input_seconds,
    progress_deltas,
)
from mlx_qwen3asr.runtime.device import tuning
from mlx_qwen3asr.text.prompt import PromptIds, prompt_suffix_ids

# Decoded segments aligned together (as the aligner prefills them: 8 rows a call).
ALIGN_GROUP = 8


class Scheduler(LiveSteps):
    """Segments of many inputs decoded together, continuously: rows that finish are replaced at once.

    Inputs are decoded from their files and cut at quiet points on a background thread; their
    segments wait in a pool. The running batch takes as many as its memory share allows (longest first,
    so rows need little padding), and whenever a quarter of its places are free, waiting segments are
    prefilled and join it at the next step (continuous batching); every row decodes the ids it would
    alone. Rows of a batch share their prompt start (system prompt and context), computed once per
    context; segments of another context wait until the batch drains. With an aligner, decoded
    segments of inputs that ask for word timing are aligned in groups, right after their text.

    One thread drives it: `submit` inputs, call `run_once` until `idle`, collect the InputResults it
    returns as inputs finish. transcribe_stream and the server's Engine are built on it.

    parts: the stages it calls (Parts(): the real ones); tests and benchmarks pass their own.

    on_progress(key, seconds): the work done on an input since the last call, in seconds of its audio,
    after each decoding step (one call an input at most): a decoding segment counts in proportion to
    its tokens (below its full share), a finished one (decoded, and aligned when asked) in full, an
    input skipped or without speech at once; an input's calls add up to its duration, the last one
    before its result comes out.

    A fault anywhere (reading audio, a mel spectrogram, the encoder, a prefill, a decoding step, the
    text of a row, on_segment, on_progress) fails the inputs whose work it was doing, each with a result
    carrying the error; the others go on, and the scheduler always reaches idle. The aligner failing leaves
    the text with estimated word timing.
    """

    def __init__(
        self,
        model: ASRModel,
        *,
        aligner: ASRModel | None = None,
        max_segment_seconds: float = DEFAULT_MAX_SEGMENT_SECONDS,
        batch_size: int | None = None,
        on_segment: Callable[[Hashable, Segment], None] | None = None,
        on_progress: Callable[[Hashable, float], None] | None = None,
        parts: Parts | None = None,
    ) -> None:
        """Inputs read ahead hold at most HELD_SECONDS of decoded audio in memory at once; a batch sized
        automatically holds at most the device's Tuning.max_batch rows (runtime/device.py)."""
        require_kind(model, "asr")
        self.parts = parts if parts is not None else Parts()
        if aligner is not None:
            require_kind(aligner, "aligner")
        self.model, self.aligner, self.on_segment = model, aligner, on_segment
        self.on_progress = on_progress
        self.max_segment_seconds = max_segment_seconds
        self.fixed = max(1, int(batch_size)) if batch_size else None
        self.size = self.fixed or max(1, int(tuning().max_batch))
        self.kv_memory = None if self.fixed else int(self.parts.memory() * MEMORY_FRACTION)
        self.eos = PromptIds.from_tokenizer(model.tokenizer).eos
        self.header = HeaderIds.from_tokenizer(model.tokenizer)
        self.inputs = ReadAhead(self.parts, max_segment_seconds, HELD_SECONDS)
        self.pending: dict[Hashable, Pending] = {}
        self.pool: list[Task] = []
        self.batch: DecodeBatch | None = None
        self.batch_context: str | None = None
        self.in_batch: dict[int, Task] = {}  # row key (id of the task) -> task
        self.to_align: list[tuple[Task, Segment]] = []
        self.starts = PromptStarts(model, self.parts.prefill)
        self.admitted = 0
        self.failed: list[InputResult] = []  # inputs failed during this iteration
        self.touched: dict[int, Pending] = {}  # inputs with segments finished since the last progress
        self._overheads: dict[str | None, int] = {}

    # -- inputs ----------------------------------------------------------------------------------

    def submit(self, key: Hashable, audio: AudioInput, options: InputOptions | None = None) -> None:
        """Queue an input; its result comes out of run_once under this key."""
        options = options if options is not None else InputOptions()
        self.starts.ids(options.context)  # an over-long context is refused before any work
        if options.align and self.aligner is None:
            raise ValueError("word timing needs a scheduler built with an aligner")
        self.inputs.add(key, audio, options)

    def cancel(self, key: Hashable) -> None:
        """Forget an input: its waiting segments leave the pool and its rows the batch; no result."""
        self.inputs.cancel(key)
        entry = self.pending.pop(key, None)
        if entry is not None:
            self._forget(entry)

    def _forget(self, entry: Pending) -> None:
        """Take an input that left `pending` out of the pool, the alignment queue and the batch."""
        self.pool = [t for t in self.pool if t.pending is not entry]
        self.to_align = [(t, s) for t, s in self.to_align if t.pending is not entry]
        rows = {k for k, t in self.in_batch.items() if t.pending is entry}
        for k in rows:
            del self.in_batch[k]
        if rows and self.batch is not None:
            try:
                self.batch.drop(rows)
            except Exception as e:  # the batch is unusable: its other rows fail too
                self._fail_batch(e)

    def _fail(self, entries: Iterable[Pending], error: Exception) -> None:
        """These inputs failed: each leaves with a result carrying the error; the others go on."""
        for entry in list(entries):
            if self.pending.get(entry.key) is not entry:
                continue  # failed or cancelled already
            del self.pending[entry.key]
            self._forget(entry)
            self.failed.append(
                InputResult(entry.key, entry.prepared.source, wav=entry.prepared.wav, error=error)
            )

    def _fail_batch(self, error: Exception) -> None:
        """The running batch failed: the inputs with rows in it fail."""
        entries = {t.pending.key: t.pending for t in self.in_batch.values()}
        self.batch, self.in_batch = None, {}
        self._fail(entries.values(), error)

    def _alive(self, task: Task) -> bool:
        return self.pending.get(task.pending.key) is task.pending

    @property
    def idle(self) -> bool:
        return not (self.inputs.busy or self.pending)

    @property
    def rows(self) -> int:
        return 0 if self.batch is None else len(self.batch)

    def close(self) -> None:
        self.inputs.close()

    # -- one iteration ---------------------------------------------------------------------------

    def run_once(self) -> list[InputResult | StepResult]:
        """Prepare and admit inputs, refill the batch, decode one step, align what is due; returns the
        inputs that finished (or failed)."""
        # With no row running there is nothing to overlap: wait until the pool can fill a batch (unless
        # a step waits: it goes at once).
        stepping = any(t.step is not None for t in self.pool)
        results = self._admit(block=not self.rows and not self.to_align and not stepping)
        self._refill()
        if self.rows:
            self._step()
        self._align_if_due()
        self._report_progress()
        results += self._complete()
        if self.pending and not (self.pool or self.rows or self.to_align):
            # Inputs with segments nowhere to be done: they fail rather than wait forever.
            self._fail(list(self.pending.values()), RuntimeError("segments were lost by the scheduler"))
        results += self.failed
        self.failed = []
        return results

    def _admit(self, block: bool) -> list[InputResult]:
        """Move prepared inputs into the pool until it holds two batches (waiting for them if `block`)."""
        results = []
        while True:
            # Read ahead while the pool is short of two batches (long inputs fill it at once, and their
            # samples are not held for many more inputs meanwhile).
            short = len(self.pool) < 2 * self.size
            self.inputs.start(max(2, self.size), short, self._samples_held)
            item = self.inputs.take(block) if short else None
            if item is None:
                break
            try:
                prepared = item.future.result()
                if not prepared.spans:
                    empty = self.parts.assemble(prepared, [], item.options.language)
                    if self.on_progress is not None:
                        self.on_progress(item.key, input_seconds(prepared))  # nothing to decode: done at once
                    results.append(
                        InputResult(item.key, prepared.source, empty, prepared.wav, skipped=prepared.skipped)
                    )
                    continue
            except Exception as e:  # unreadable audio (or on_progress raised): this input fails
                results.append(InputResult(item.key, item.source, error=e))
                continue
            entry = Pending(item.key, prepared, item.options, [None] * len(prepared.spans))
            entry.seconds = input_seconds(prepared)
            spoken = sum(span.duration for span in prepared.spans)
            entry.scale = entry.seconds / spoken if spoken > 0 else 0.0
            self.pending[item.key] = entry
            for i, span in enumerate(prepared.spans):
                self.pool.append(Task(entry, i, self.admitted, share=span.duration * entry.scale))
                self.admitted += 1
        return results

    def _samples_held(self) -> int:
        """Samples in memory of the inputs admitted and not finished."""
        return sum(samples_in_memory(e.prepared.wav) for e in self.pending.values())

    # -- decoding --------------------------------------------------------------------------------

    def rows_that_fit(self, tasks: Sequence[Task], memory: int, context: str) -> int:
        """How many of these tasks, taken in order, can join the running rows (if any) with the KV cache
        of them all in `memory` bytes; at least one when nothing runs (memory.rows_that_fit)."""
        audio = self.model.config.audio_config
        rows = (self._row_size(t, audio.audio_tokens(t.frames)) for t in tasks)
        running = (0, 0, 0)
        if self.rows:
            left = max(r.budget - len(r.tokens) for r in self.batch.rows)
            running = (len(self.batch), self.batch.cache[0].offset, left)
        shared = len(self.starts.ids(context))
        return rows_that_fit(rows, memory, kv_bytes_per_position(self.model), shared, running)

    def _row_size(self, task: Task, audio_tokens: int) -> tuple[int, int]:
        """A task's prompt positions after the shared start, and its token budget."""
        if task.step is not None:
            return len(task.step.suffix(audio_tokens)), task.step.budget
        overhead = self._suffix_overhead(task.pending.options.language)
        return overhead + audio_tokens, self.parts.budget(task.span.duration)

    def _suffix_overhead(self, language: str | None) -> int:
        """Prompt positions after the shared start besides the audio, per language (kept by this
        scheduler, so nothing outlives it)."""
        if language not in self._overheads:
            self._overheads[language] = len(prompt_suffix_ids(self.model.tokenizer, 0, language))
        return self._overheads[language]

    def _refill(self) -> None:
        """Start a batch, or let waiting segments of its context take the places finished rows left."""
        if not self.pool:
            return
        if not self.rows:
            self.batch = None
            # The context whose segment has waited longest goes next.
            self.batch_context = min(self.pool, key=lambda t: t.order).context
        candidates = [t for t in self.pool if t.context == self.batch_context]
        try:
            chosen = self._choose(candidates)
        except Exception as e:  # the waiting segments it weighed fail
            self._fail([t.pending for t in candidates], e)
            return
        if not chosen:
            return
        chosen_ids = {id(t) for t in chosen}
        self.pool = [t for t in self.pool if id(t) not in chosen_ids]
        # Steps are encoded and prefilled apart from the segments of inputs: a fault in either group
        # leaves the other.
        for task in [t for t in chosen if t.step is not None and t.step.prepare is not None]:
            self._join_prepared(task)
        steps = [t for t in chosen if t.step is not None and t.step.prepare is None]
        for group in (steps, [t for t in chosen if t.step is None]):
            if group:
                self._join(group)

    def _join(self, chosen: list[Task]) -> None:
        """Encode these tasks together, prefill them and let them join the batch (starting it if none runs)."""
        # A segment whose samples cannot be read or turned into a mel spectrogram fails its input.
        for t in chosen:
            if self._alive(t):
                try:
                    if t.step is not None:
                        t.mel = log_mel_spectrogram(t.step.samples)
                    else:
                        t.mel = self.parts.mel(t.pending.prepared.wav, t.span)
                except Exception as e:
                    self._fail([t.pending], e)
        chosen = [t for t in chosen if self._alive(t)]
        if not chosen:
            return
        try:
            prefix = self.starts.prefix(self.batch_context) if self.batch is None else None
            features = self.parts.encode(self.model, [t.mel for t in chosen])
            tok = self.model.tokenizer
            prompts = [
                t.step.suffix(int(f.shape[0]))
                if t.step is not None
                else prompt_suffix_ids(tok, int(f.shape[0]), t.pending.options.language)
                for f, t in zip(features, chosen)
            ]
            budgets = [
                t.step.budget if t.step is not None else self.parts.budget(t.span.duration) for t in chosen
            ]
            for t, budget in zip(chosen, budgets):
                t.expected = expected_tokens(t.span.duration, budget)
        except Exception as e:  # the segments encoded together fail; rows already running go on
            self._fail([t.pending for t in chosen], e)
            return
        if self.batch is None:
            self.batch = self.parts.batch(self.model.net, self.eos, prefix=prefix, header=self.header)
        for t in chosen:
            self.in_batch[id(t)] = t
        try:
            done = self.batch.add(prompts, features, budgets, [id(t) for t in chosen])
        except Exception as e:
            self._fail([t.pending for t in chosen], e)
            # Rows the batch lost (a join that failed part-way drops the running rows) fail too.
            kept = set(self.batch.keys) if self.batch is not None else set()
            self._fail([t.pending for k, t in self.in_batch.items() if k not in kept], e)
            return
        for key, gen in done:
            self._row_done(key, gen)

    def _choose(self, candidates: list[Task]) -> list[Task]:
        """The waiting segments (of the batch's context) that join the batch now, longest first."""
        # Steps (live streams) first: they wait for no quarter of the places to free up.
        candidates = sorted(candidates, key=lambda t: (t.step is None, -t.frames))
        if not candidates:
            return []
        running = self.rows
        if self.fixed:
            free = self.fixed - running
        else:
            fits = self.rows_that_fit(candidates[: self.size - running], self.kv_memory, self.batch_context)
            free = min(fits, self.size - running)
        # Join when a quarter of the places are free (or every waiting segment fits): a prefill and a
        # cache join cost about as much for one new row as for several.
        if free <= 0:
            return []
        if free < max(1, (running + free) // 4) and len(candidates) > free and candidates[0].step is None:
            return []
        return candidates[:free]

    def _step(self) -> None:
        try:
            done = self.batch.step()
        except Exception as e:  # e.g. out of memory: the inputs in the batch fail, the others go on
            self._fail_batch(e)
            return
        for key, gen in done:
            self._row_done(key, gen)

    def _row_done(self, key: int, gen: Generation) -> None:
        task = self.in_batch.pop(key, None)
        if task is None or not self._alive(task):
            return
        try:
            self._finished(task, gen)
        except Exception as e:  # its text could not be made: its input fails
            self._fail([task.pending], e)

    def _finished(self, task: Task, gen: Generation) -> None:
        """A row is done: its segment's text; with word timing asked for, it waits for the aligner."""
        if task.step is not None:
            task.mel, task.pending.generation = None, self._step_generation(task, gen)
            return
        options = task.pending.options
        seg = decoded_segment(self.model.tokenizer, gen, task.span, options.language)
        if options.align and not (seg.truncated or seg.repetitive):
            reason = why_not_aligned(self.aligner, seg.text, seg.language, task.span.duration)
            if reason is None:
                self.to_align.append((task, seg))  # the aligner reads its mel again
                return
            if reason != "no text":
                task.pending.timing_notes.append(reason)
        self._segment_done(task, seg)

    def _segment_done(self, task: Task, seg: Segment) -> None:
        """A segment is finished (decoded, and aligned when asked): it counts in full in the progress."""
        task.mel = None
        entry = task.pending
        entry.segments[task.position] = seg
        entry.finished += task.share
        self.touched[id(entry)] = entry

    # -- word timing -----------------------------------------------------------------------------

    def _align_if_due(self) -> None:
        """Align the decoded segments waiting for it: in groups, or at once when an input waits only for them."""
        if not self.to_align:
            return
        aligning = {(id(t.pending), t.position) for t, _ in self.to_align}
        entries = {id(t.pending): t.pending for t, _ in self.to_align}.values()
        only_alignment = any(
            all(s is not None or (id(e), i) in aligning for i, s in enumerate(e.segments)) for e in entries
        )
        if len(self.to_align) < ALIGN_GROUP and self.rows and not only_alignment:
            return
        group, self.to_align = self.to_align, []
        try:
            words = self.parts.align(
                self.aligner,
                [t.mel for t, _ in group],
                [s.text for _, s in group],
                [s.language for _, s in group],
                [(s.start, s.end) for _, s in group],
            )
        except Exception as e:  # e.g. out of memory: the text stands, with estimated timing
            words = None
            for task, _ in group:
                task.pending.timing_notes.append(f"the aligner failed ({type(e).__name__}: {e})")
        for i, (task, seg) in enumerate(group):
            if words is not None:
                seg.words, seg.timing = words[i], "aligned"
            self._segment_done(task, seg)

    # -- progress --------------------------------------------------------------------------------

    def _report_progress(self) -> None:
        """Pass on_progress the work done on each input since its last call: finished segments in full,
        the segments decoding (or waiting for the aligner) in proportion to their tokens. Only counts
        the batch keeps on the host are read; nothing is evaluated."""
        touched, self.touched = self.touched, {}
        if self.on_progress is None:
            return
        # A stand-in batch without row_progress: its segments count only once finished.
        counts = getattr(self.batch, "row_progress", None) if self.rows else None
        running = counts() if counts is not None else ()
        aligning = [t for t, _ in self.to_align]
        for entry, delta in progress_deltas(self.pending, touched, running, self.in_batch, aligning):
            try:
                self.on_progress(entry.key, delta)
            except Exception as e:  # this input fails, the others go on
                self._fail([entry], e)

    # -- results ---------------------------------------------------------------------------------

    def _complete(self) -> list[InputResult | StepResult]:
        """Report new segments in time order, and hand out the inputs whose segments are all done."""
        results = []
        for key, entry in list(self.pending.items()):
            if self.pending.get(key) is not entry:
                continue  # failed meanwhile
            if entry.step is not None:
                if entry.generation is not None:
                    del self.pending[key]
                    results.append(StepResult(key, entry.generation))
                continue
            try:
                while entry.reported < len(entry.segments) and entry.segments[entry.reported] is not None:
                    entry.reported += 1
                    if self.on_segment is not None:
                        self.on_segment(key, entry.segments[entry.reported - 1])
                if entry.complete:
                    result = self.parts.assemble(
                        entry.prepared, entry.segments, entry.options.language, entry.timing_notes
                    )
                    del self.pending[key]
                    results.append(InputResult(key, entry.prepared.source, result, entry.prepared.wav))
            except Exception as e:  # e.g. on_segment raised: this input fails, the others go on
                self._fail([entry], e)
        return results


__all__ = ["InputResult", "Scheduler", "Step", "StepResult"]
