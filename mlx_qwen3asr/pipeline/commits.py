"""Where a live window is committed (the commit policy of ``StreamingTranscriber``): a window that
grows without end makes every step cost more than the last.

Re-encoding from the start makes every step cost more than the
last, without end, so the window (audio since the last commit) is committed and restarted:

* at a pause, early: once the window holds more than half of ``max_window_seconds``, a step whose
  previous decode ended in a pause (each 25 ms of the 200 ms around its end at least 20 dB under the
  window's median energy) commits the audio up to that point with that decode's text. That text is
  already the transcript of the audio before the pause, what the official algorithm gives a stream
  that ends there, so nothing is decoded again; the window restarts at the pause with the chunk just
  added.
* at the bound: when the window passes ``max_window_seconds``, the latest decode that ended in a
  pause is taken the same way. Without one, the cut is the latest pause (200 ms, as above) in the
  window's stable part (the window less its last ``max(1, unfixed_chunks)`` chunks, searched over
  ``COMMIT_SEARCH_SECONDS``), or else its quietest 100 ms (the low-energy rule of ``audio.cutting``),
  and the audio before the cut is decoded once more after the rollback prefix of the last output
  that heard nothing past the cut (a step's worth of new tokens, not the whole head again). When the
  window's latest output begins with what that decode wrote, the rest of it is the new window's text
  so far, and its next decode continues from it less the unstable tokens; otherwise the new window
  starts empty, as a stream would.

A new window counts the whole chunks it starts with, so its second decode continues from its first.
The committed text is not added to the context: the prompt (and every step's cost) stays bounded, and
a window that starts at a pause is the same task as a stream that starts there. Every step encodes at
most ``max(max_window_seconds, COMMIT_SEARCH_SECONDS + unfixed_chunks x chunk_seconds) +
chunk_seconds`` of audio (22 s with the defaults), the same at minute 1 and hour 3. With
``max_window_seconds=None`` nothing is committed before ``finish`` and the steps are the official ones.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from mlx_qwen3asr.audio.features import SAMPLE_RATE
from mlx_qwen3asr.model.generate import Generation
from mlx_qwen3asr.pipeline.pauses import PAUSE_HALF_SAMPLES, ended_in_pause, latest_pause, loudness, quietest
from mlx_qwen3asr.pipeline.result import Segment
from mlx_qwen3asr.pipeline.rollback import carried_text, draft_ids, header, rollback_prefix
from mlx_qwen3asr.text.output import parse_output


@dataclass
class Heard:
    """One decode of a window: the window's samples then, its chunk_id and raw output (and flags)."""

    samples: int
    chunk_id: int
    raw: str
    truncated: bool = False
    repetitive: bool = False


@dataclass
class Window:
    """Audio since the last commit and the official streaming state over it."""

    start: int = 0  # stream sample where the window begins
    audio: np.ndarray = field(default_factory=lambda: np.zeros((0,), dtype=np.float32))
    chunk_id: int = 0
    raw: str = ""
    language: str = ""
    text: str = ""
    truncated: bool = False
    repetitive: bool = False
    # every decode of the window: what the stream had written when it had heard that much
    history: list[Heard] = field(default_factory=list)


class Commits:
    """The commit policy of a live stream (the methods StreamingTranscriber commits with): its window,
    committed segments, settings (chunk_samples, margin_samples, min_commit_samples, search_samples,
    unfixed_chunks, unfixed_tokens), tokenizer, language and its decode."""

    window: Window
    segments: list[Segment]

    def _decode(self, audio: np.ndarray, prefix: str, draft: list[int] = ()) -> tuple[Generation, list[int]]:
        raise NotImplementedError

    def _commit(self, heard: Heard | None = None) -> list[Segment]:
        """Commit the window's audio up to a cut as a final segment and restart the window there.

        The cut is the latest point where an earlier decode of the window ended (a chunk boundary)
        that lies in a pause: that decode's output is already the transcript of the audio before it
        (what the official algorithm gives a stream that ends there), so nothing is decoded again.
        Without such a point, the cut is the latest pause in the window's stable part, else its
        quietest 100 ms, and the audio before it is decoded once more (``_head_prefix``)."""
        w = self.window
        heard = heard or self._pause(w)
        if heard is not None:
            cut = heard.samples
            head = Window(start=w.start, audio=w.audio[:cut], raw=heard.raw)
            head.truncated, head.repetitive = heard.truncated, heard.repetitive
            prefix, written = "", heard.raw
        else:
            right = w.audio.shape[0] - self.margin_samples
            left = max(self.min_commit_samples, right - self.search_samples)
            # The latest pause in the search range leaves the new window the least audio to write
            # again; without one, the quietest 100 ms.
            cut = latest_pause(w.audio, left, right)
            if cut is None:
                cut = quietest(w.audio, left, right)
            # A cut after the window's first decode (which came after `left` when the window started
            # with carried audio) keeps the head's decode short (_head_prefix): taken when it is
            # about as quiet.
            first = [h.samples for h in w.history if h.chunk_id + 1 >= self.unfixed_chunks]
            if first and left < first[0] and cut < first[0]:
                later = quietest(w.audio, first[0], right)
                if loudness(w.audio, later) <= 2.0 * loudness(w.audio, cut):
                    cut = later
            cut = min(max(cut, 1), w.audio.shape[0] - 1)
            head = Window(start=w.start, audio=w.audio[:cut])
            prefix = self._head_prefix(w, cut)
            gen, _ = self._decode(head.audio, prefix, draft_ids(self.tokenizer, w.raw, prefix))
            written = self.tokenizer.decode(gen.tokens)
            head.raw = prefix + written
            head.truncated, head.repetitive = gen.truncated, gen.repetitive
        head.language, head.text = parse_output(head.raw, self.language)
        segment = self._segment(head.start, head.start + cut, head)
        self.segments.append(segment)
        rest = w.audio[cut:]
        # The new window already holds whole chunks of audio: it counts them, so its first decode
        # continues from the text the old window wrote after the head's (when there is one).
        new = Window(start=w.start + cut, audio=rest, chunk_id=rest.shape[0] // self.chunk_samples)
        seed = carried_text(w.raw, prefix, written)
        if seed:
            new.raw = header(w.raw) + seed
            new.language, new.text = parse_output(new.raw, self.language)
            # The old window's last decode had not heard the chunk just added.
            before = rest.shape[0] - self.chunk_samples
            if before > 0:
                new.history.append(Heard(before, new.chunk_id - 1, new.raw))
        self.window = new
        return [segment]

    def _pause(self, w: Window, latest: bool = False) -> Heard | None:
        """The latest decode of the window (at least min_commit_seconds in, before the chunk just
        added) whose end lies in a pause (``pauses.ended_in_pause``), or None. latest: only the last
        decode (the one before the chunk just added) is looked at."""
        last = w.audio.shape[0] - self.chunk_samples
        points = [
            h
            for h in w.history
            if self.min_commit_samples <= h.samples <= last and h.samples >= PAUSE_HALF_SAMPLES
        ]
        if latest:
            points = [h for h in points[-1:] if h.samples == last]
        return ended_in_pause(w.audio, points)

    def _head_prefix(self, w: Window, cut: int) -> str:
        """The prefix of a commit's head decode: the rollback of the last output the window wrote
        having heard no audio past the cut (the prefix its next step took), kept only as far as the
        window's latest output still agrees with it. The head decode thus writes what that step's
        successor would have, had the stream ended at the cut: a chunk or so of tokens rather than
        the whole head again."""
        raw = ""
        for h in w.history:
            if h.samples > cut:
                break
            if h.chunk_id + 1 >= self.unfixed_chunks:
                raw = h.raw
        if not raw:
            return ""
        ids = self.tokenizer.encode(rollback_prefix(self.tokenizer, raw, self.unfixed_tokens))
        now = self.tokenizer.encode(w.raw)
        same = len(os.path.commonprefix([ids, now]))
        return rollback_prefix(
            self.tokenizer, self.tokenizer.decode(ids[:same], skip_special_tokens=False), 0
        )

    def _segment(self, start: int, end: int, w: Window) -> Segment:
        return Segment(
            start=start / SAMPLE_RATE,
            end=end / SAMPLE_RATE,
            text=w.text,
            language=w.language,
            truncated=w.truncated,
            repetitive=w.repetitive,
        )


__all__ = ["Commits", "Heard", "Window"]
