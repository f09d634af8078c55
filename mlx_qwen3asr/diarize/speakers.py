"""Speakers for a transcript: each aligned word and segment takes the speaker of the turns over it,
segments are cut where the speaker changes."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from mlx_qwen3asr.diarize.turns import Turn
from mlx_qwen3asr.pipeline.result import Segment, Transcription, Word

# A word or segment is marked `overlap` when two or more speakers talk together over at least this
# share of its span (for a word without duration: at its instant).
OVERLAP_SHARE = 0.5


class _Activity:
    """Who speaks when: each speaker's merged intervals, and where two or more talk at once, queried
    by bisection (a transcript of hours has thousands of turns and tens of thousands of words)."""

    def __init__(self, turns: Sequence[Turn]) -> None:
        by_speaker: dict[int, list[tuple[float, float]]] = {}
        for t in turns:
            if t.end > t.start:
                by_speaker.setdefault(t.speaker, []).append((float(t.start), float(t.end)))
        self.order = {s: k for k, s in enumerate(by_speaker)}  # first appearance
        self.intervals = {s: _Spans(_merged(spans)) for s, spans in by_speaker.items()}
        # Where two or more speakers talk: a sweep over every speaker's interval ends.
        events = sorted(
            [(a, 1) for spans in self.intervals.values() for a, _ in spans.spans]
            + [(b, -1) for spans in self.intervals.values() for _, b in spans.spans],
            key=lambda e: (e[0], e[1]),
        )
        both, talking, opened = [], 0, 0.0
        for at, step in events:
            if talking >= 2 and at > opened:
                both.append((opened, at))
            talking += step
            opened = at
        self.crosstalk = _Spans(_merged(both))

    def who(self, start: float, end: float) -> tuple[int, bool]:
        """The speaker of [start, end] (the one talking longest in it; for a span without duration, at
        its instant; else the nearest) and whether it is overlapped speech."""
        if end > start:
            shares = {s: spans.within(start, end) for s, spans in self.intervals.items()}
            shares = {s: t for s, t in shares.items() if t > 0}
            if shares:
                speaker = max(shares, key=lambda s: (shares[s], -self.order[s]))
                return speaker, self.crosstalk.within(start, end) >= OVERLAP_SHARE * (end - start)
        here = [s for s, spans in self.intervals.items() if spans.gap(start, start) == 0.0]
        if here:
            return min(here, key=self.order.__getitem__), len(here) >= 2
        return min(self.intervals, key=lambda s: (self.intervals[s].gap(start, end), self.order[s])), False


class _Spans:
    """Sorted, disjoint intervals."""

    def __init__(self, spans: list[tuple[float, float]]) -> None:
        self.spans = spans
        self.ends = [b for _, b in spans]

    def within(self, start: float, end: float) -> float:
        """Seconds of the intervals inside [start, end]."""
        time = 0.0
        for a, b in self.spans[bisect.bisect_right(self.ends, start) :]:
            if a >= end:
                break
            time += max(0.0, min(b, end) - max(a, start))
        return time

    def gap(self, start: float, end: float) -> float:
        """How far [start, end] is from the nearest interval (0 where they touch or overlap)."""
        k = bisect.bisect_left(self.ends, start)  # the first interval ending at or after start
        best = math.inf
        if k < len(self.spans):
            best = max(self.spans[k][0] - end, 0.0)
        if k > 0:
            best = min(best, start - self.ends[k - 1])
        return best


def _merged(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def _aligned(segment: Segment) -> bool:
    return segment.timing == "aligned" and bool(segment.words)


def _word_spans(text: str, words: Sequence[Word]) -> list[tuple[int, int]] | None:
    """Each word's span in text (its char_start/char_end, or found by its text where those are
    unusable); None when a word cannot be placed."""
    spans = []
    pos = 0
    for w in words:
        cs, ce = w.char_start, w.char_end
        if not (isinstance(cs, int) and isinstance(ce, int) and pos <= cs < ce <= len(text)):
            needle = (w.text or "").strip()
            found = text.find(needle, pos) if needle else -1
            if found < 0:
                return None
            cs, ce = found, found + len(needle)
        spans.append((cs, ce))
        pos = ce
    return spans


def split_at_speakers(segment: Segment) -> list[Segment]:
    """The segment cut where the speaker of its words changes: each piece holds one speaker's run of
    words, its text from that run's first word up to the next run's, its words' spans re-based. The
    cuts are timed by the words (a piece ends with its last word and the next starts with its first);
    the first piece keeps the segment's start and the last its end. A segment whose words share one
    speaker (or that has no aligned words) comes back as it is."""
    words = segment.words
    if not _aligned(segment) or len({w.speaker for w in words}) < 2:
        return [segment]
    spans = _word_spans(segment.text, words)
    if spans is None:
        return [segment]
    runs: list[list[int]] = []
    for k, w in enumerate(words):
        if runs and words[runs[-1][-1]].speaker == w.speaker:
            runs[-1].append(k)
        else:
            runs.append([k])
    pieces = []
    for r, run in enumerate(runs):
        cut_from = 0 if r == 0 else spans[run[0]][0]
        cut_to = len(segment.text) if r + 1 == len(runs) else spans[runs[r + 1][0]][0]
        raw = segment.text[cut_from:cut_to]
        lead = len(raw) - len(raw.lstrip())
        text = raw.strip()
        offset = cut_from + lead
        run_words = [
            replace(
                words[k],
                char_start=max(0, min(spans[k][0] - offset, len(text))),
                char_end=max(0, min(spans[k][1] - offset, len(text))),
            )
            for k in run
        ]
        first, last = words[run[0]], words[run[-1]]
        start = segment.start if r == 0 else first.start
        end = segment.end if r + 1 == len(runs) else last.end
        pieces.append(
            replace(
                segment,
                start=start,
                end=max(end, start),
                text=text,
                words=run_words,
                speaker=first.speaker,
                overlap=any(w.overlap for w in run_words),
            )
        )
    return pieces


def speaker_label(number: int, names: Sequence[str] | None = None, *, letters: bool = False) -> str:
    """The label of the speaker that appears number-th (0-based): names[number], else "Speaker N" (N from
    1: the writers' convention), or with letters OpenAI's: A, B, ..., Z, AA, AB, ..."""
    if names is not None and number < len(names):
        return names[number]
    if not letters:
        return f"Speaker {number + 1}"
    label = ""
    k = number + 1
    while k:
        k, rest = divmod(k - 1, 26)
        label = chr(ord("A") + rest) + label
    return label


def _check_names(names: Sequence[str] | None) -> list[str] | None:
    if names is None:
        return None
    if isinstance(names, str):
        raise ValueError("names must be a list of names, not one string")
    out = [str(n).strip() for n in names]
    if any(not n for n in out):
        raise ValueError("speaker names must not be empty")
    duplicates = sorted({n for n in out if out.count(n) > 1})
    if duplicates:
        raise ValueError(f"speaker names must differ: {', '.join(duplicates)} given twice")
    return out


def assign_speakers(
    transcription: Transcription, turns: Sequence[Turn], names: Sequence[str] | None = None
) -> Transcription:
    """The transcription with a speaker on every segment and aligned word, and its speakers listed.

    An aligned word takes the speaker who talks over most of its span (a word without duration: the
    one talking at its instant; a word between turns: the nearest); a segment is cut where the speaker
    changes between its words (split_at_speakers), so that none spans two speakers. A segment without
    word timing takes the speaker of most of its time. Where turns overlap the dominant speaker is kept,
    and a word or segment with two or more speakers over at least half its span is marked `overlap`.
    Speakers are labelled "Speaker 1", "Speaker 2", ... (or names, in that order) in order of first
    appearance in the transcript; a speaker who says nothing transcribed gets no label. Without turns
    the transcription comes back unchanged. The input is not modified.
    """
    names = _check_names(names)
    if not turns:
        return transcription
    activity = _Activity(turns)
    if not activity.intervals:
        return transcription
    labels: dict[int, str] = {}

    def label(speaker: int) -> str:
        if speaker not in labels:
            labels[speaker] = speaker_label(len(labels), names)
        return labels[speaker]

    segments: list[Segment] = []
    for seg in transcription.segments:
        if _aligned(seg) and all(_finite(w.start) and _finite(w.end) for w in seg.words):
            words = []
            for w in seg.words:
                speaker, overlap = activity.who(float(w.start), max(float(w.start), float(w.end)))
                words.append(replace(w, speaker=label(speaker), overlap=overlap))
            pieces = split_at_speakers(replace(seg, words=words))
            if len(pieces) == 1 and len({w.speaker for w in words}) > 1:
                # Words that cannot be placed in the text: the segment goes to its main speaker.
                time: dict[str, float] = {}
                for w in words:
                    time[w.speaker] = time.get(w.speaker, 0.0) + max(float(w.end) - float(w.start), 1e-3)
                main = max(time, key=lambda s: time[s])
                pieces = [replace(seg, words=words, speaker=main, overlap=any(w.overlap for w in words))]
            else:
                pieces = [
                    replace(p, speaker=p.words[0].speaker, overlap=any(w.overlap for w in p.words))
                    for p in pieces
                ]
            segments.extend(pieces)
        elif _finite(seg.start) and _finite(seg.end):
            speaker, overlap = activity.who(float(seg.start), max(float(seg.start), float(seg.end)))
            segments.append(replace(seg, speaker=label(speaker), overlap=overlap))
        else:
            segments.append(seg)
    return replace(transcription, segments=segments, speakers=list(labels.values()))
