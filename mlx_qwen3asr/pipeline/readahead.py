"""Inputs read ahead: decoded and cut into segments on a background thread while the model works.

Inputs wait in submission order; a few at a time are prepared (Parts.prepare) ahead of the model, as
long as the decoded audio held in memory stays within a budget of samples, so that many files kept
whole in memory do not pile up while earlier ones are transcribed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from mlx_qwen3asr.audio.features import SAMPLE_RATE
from mlx_qwen3asr.pipeline.inputs import (
    AudioInput,
    InputOptions,
    PreparedInput,
    samples_at_most,
    samples_in_memory,
    source_name,
)
from mlx_qwen3asr.pipeline.parts import Parts


@dataclass(eq=False)
class Preparing:
    """An input being prepared (or prepared and not taken yet)."""

    key: Hashable
    options: InputOptions
    source: str | None
    future: Future[PreparedInput]
    most: int  # the most samples it may hold in memory once decoded


class ReadAhead:
    """Inputs waiting to be prepared, and those being prepared on one background thread.

    held_seconds: decoded audio that inputs prepared and not finished may hold in memory at once
    (one input is always let in when none is held).
    """

    def __init__(self, parts: Parts, max_segment_seconds: float, held_seconds: float) -> None:
        self.parts, self.max_segment_seconds = parts, max_segment_seconds
        self.held_samples = max(0, int(held_seconds * SAMPLE_RATE))
        self.waiting: deque[tuple[Hashable, AudioInput, InputOptions]] = deque()
        self.preparing: list[Preparing] = []
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="audio-prepare")

    @property
    def busy(self) -> bool:
        """Inputs are waiting or being prepared."""
        return bool(self.waiting or self.preparing)

    def add(self, key: Hashable, audio: AudioInput, options: InputOptions) -> None:
        self.waiting.append((key, audio, options))

    def cancel(self, key: Hashable) -> None:
        """Forget an input waiting or being prepared."""
        self.waiting = deque(w for w in self.waiting if w[0] != key)
        for item in [p for p in self.preparing if p.key == key]:
            item.future.cancel()
            self.preparing.remove(item)

    def held(self) -> int:
        """Samples in memory of the inputs being prepared or prepared and not taken (one being prepared
        counts the most it may hold)."""
        held = 0
        for item in self.preparing:
            if not item.future.done():
                held += item.most
            elif not item.future.cancelled() and item.future.exception() is None:
                held += samples_in_memory(item.future.result().wav)
        return held

    def start(self, ahead: int, more: bool, held_elsewhere: Callable[[], int]) -> None:
        """Start preparing waiting inputs until `ahead` are under way (only one when not `more`: the
        model has enough segments waiting), while the samples held in memory, these and
        held_elsewhere()'s (inputs taken and not finished), stay within held_seconds."""
        held = None
        while self.waiting and len(self.preparing) < ahead and (more or not self.preparing):
            key, audio, options = self.waiting[0]
            most = samples_at_most(audio)
            held = held_elsewhere() + self.held() if held is None else held
            if held and held + most > self.held_samples:
                break
            self.waiting.popleft()
            held += most
            args = (key, audio, self.max_segment_seconds, options.skip, options.vad)
            future = self.executor.submit(self.parts.prepare, *args, load=self.parts.load)
            self.preparing.append(Preparing(key, options, source_name(audio), future, most))

    def take(self, block: bool) -> Preparing | None:
        """The oldest input under way when it is prepared, or at once if `block` (its future's result then
        waits for it); None otherwise."""
        if not self.preparing or not (block or self.preparing[0].future.done()):
            return None
        return self.preparing.pop(0)

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


__all__ = ["Preparing", "ReadAhead"]
