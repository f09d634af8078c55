"""Timing a transcript the user already has: its words spread over the pieces of long audio, each piece
timed by the forced aligner.

The aligner takes at most MAX_SECONDS of audio per call, so long audio is cut at quiet points
(audio.cutting.split_on_silence) into pieces of at most PIECE_SECONDS, and the transcript's words
have to be shared out among them:

1. Each word gets a weight, its length in characters (a CJK ideograph, about a syllable, counts as
   three) plus one for the pause after it; the words go to the pieces in proportion to the pieces'
   durations (initial_split).
2. Every piece is aligned with its words.
3. At each boundary between two pieces, words that the aligner piles at the very edge are moved across:
   a run of words at the end of a piece that all start within EDGE_SECONDS of its end was not heard
   there and goes to the next piece; a run at the start of a piece that all end within EDGE_SECONDS of
   its start goes to the piece before. A boundary moves words one way only, so nothing goes back and
   forth; the pieces whose words changed are aligned again, for at most MAX_ROUNDS rounds (share).

The words keep their order, so times never go backwards from one piece to the next, and each word's
time lies inside its piece. A transcript that the audio cannot hold (many more words than speech of
that length has, or words left piled at the end of the audio) is said in one warning (coverage_warning).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from mlx_qwen3asr.audio.cutting import Span, split_on_silence
from mlx_qwen3asr.audio.features import SAMPLE_RATE
from mlx_qwen3asr.checkpoints.loading import ASRModel
from mlx_qwen3asr.pipeline.alignment import (
    ALIGN_ROWS,
    MAX_SECONDS,
    AlignerPrompt,
    aligner_prompt,
    timestamp_classes,
)
from mlx_qwen3asr.pipeline.encoding import encode_segments
from mlx_qwen3asr.pipeline.inputs import segment_mel
from mlx_qwen3asr.pipeline.result import Segment, Transcription, Word
from mlx_qwen3asr.text.output import join_texts
from mlx_qwen3asr.text.words import display_spans, is_cjk, split_items, word_times

__all__ = [
    "EDGE_SECONDS",
    "MAX_ROUNDS",
    "PASS_SECONDS",
    "PIECE_SECONDS",
    "Shared",
    "TranscriptWord",
    "align_pieces",
    "coverage_warning",
    "passes",
    "initial_split",
    "retime_transcript",
    "share",
    "transcript_words",
    "word_weight",
]

# The longest piece of audio given to the aligner at once.
PIECE_SECONDS = MAX_SECONDS
# A word that starts this close to the end of its piece (or ends this close to its start) sits at the
# edge: three of the aligner's 80 ms steps.
EDGE_SECONDS = 0.24
# Alignments after the first, moving words between neighbouring pieces.
MAX_ROUNDS = 3
# Weight a second of speech holds at most (characters and pauses; plain speech has about 15): a
# transcript heavier than this for its audio cannot all be in it.
MAX_WEIGHT_PER_SECOND = 40.0
# Past this many times that weight the transcript is not aligned at all: it cannot be this audio's, and
# aligning it would cost a forward pass as long as the text (a 16 MB file against a short clip).
REFUSE_FACTOR = 4.0
# Words piled at the end of the audio from which the transcript counts as not covered.
PILE_WORDS = 3
# Padded audio in one forward pass of the aligner, at most: its rows times the longest of them (a row is
# padded to the longest). Memory follows that product, so a pass holds no more than one piece of the
# longest length does, and an hour's pieces need no more memory than ten minutes' do.
PASS_SECONDS = MAX_SECONDS

# The aligner's times for the words of the pieces asked for: pieces (their indices) and the range of
# words each one holds -> (start, end) in seconds of the whole audio, per word of each range.
AlignPieces = Callable[[Sequence[int], Sequence[tuple[int, int]]], list[list[tuple[float, float]]]]


@dataclass(frozen=True)
class TranscriptWord:
    """A word of the transcript as the aligner times it."""

    block: int  # the block (subtitle cue or paragraph) it belongs to
    item: str  # its text as the aligner sees it
    char_start: int  # its span in the block's text, with the punctuation around it
    char_end: int
    weight: float


def word_weight(item: str) -> float:
    """How long a word takes to say, roughly: its characters (CJK ideographs three) and a pause."""
    return float(sum(3 if is_cjk(ch) else 1 for ch in item) + 1)


def transcript_words(blocks: Sequence[str], language: str | None) -> list[TranscriptWord]:
    """The words the aligner times in each block of text, in order (see text.words.split_items)."""
    words: list[TranscriptWord] = []
    for index, text in enumerate(blocks):
        items = split_items(text, language)
        for item, (a, b) in zip(items, display_spans(text, items)):
            words.append(TranscriptWord(index, item.text, a, b, word_weight(item.text)))
    return words


def initial_split(weights: Sequence[float], durations: Sequence[float]) -> list[int]:
    """Where the words are cut among pieces, in proportion to the pieces' durations.

    Returns bounds b of len(durations) + 1 entries: piece p gets words [b[p], b[p + 1]); a word goes
    to the piece its middle falls in once the total weight is spread over the total duration.
    """
    count = len(durations)
    if count == 0:
        raise ValueError("initial_split: no pieces")
    w = np.asarray(weights, dtype=np.float64)
    d = np.asarray(durations, dtype=np.float64)
    if w.size == 0 or d.sum() <= 0:  # no words, or no audio: every word (if any) in the first piece
        return [0] + [int(w.size)] * count
    middles = np.cumsum(w) - w / 2
    targets = np.cumsum(d)[:-1] / d.sum() * w.sum()
    inner = np.searchsorted(middles, targets, side="left").tolist()
    return [0, *[int(i) for i in inner], int(w.size)]


@dataclass
class Shared:
    """The transcript's words shared out among the pieces and timed."""

    bounds: list[int]  # piece p holds words [bounds[p], bounds[p + 1])
    times: list[tuple[float, float]]  # (start, end) of each word, in seconds of the whole audio
    rounds: int  # alignments made after the first one
    piled_at_end: int  # words of the last piece that start within EDGE_SECONDS of its end


def _tail_pile(times: Sequence[tuple[float, float]], lo: int, hi: int, end: float) -> int:
    n = 0
    while hi - n > lo and times[hi - n - 1][0] >= end - EDGE_SECONDS:
        n += 1
    return n


def _head_pile(times: Sequence[tuple[float, float]], lo: int, hi: int, start: float) -> int:
    n = 0
    while lo + n < hi and times[lo + n][1] <= start + EDGE_SECONDS:
        n += 1
    return n


def share(
    weights: Sequence[float],
    spans: Sequence[tuple[float, float]],
    align: AlignPieces,
    *,
    max_rounds: int | None = None,
) -> Shared:
    """Share words (their weights) out among pieces (their [start, end] in seconds, in order) and time
    them with align; see the module docstring for the moves between rounds."""
    rounds_allowed = MAX_ROUNDS if max_rounds is None else max_rounds
    count = len(spans)
    n = len(weights)
    bounds = initial_split(weights, [max(b - a, 0.0) for a, b in spans])
    times: list[tuple[float, float]] = [(0.0, 0.0)] * n
    direction = [0] * max(count - 1, 0)  # +1: words moved forward across boundary k, -1: back
    dirty = set(range(count))
    rounds = 0
    while True:
        todo = [p for p in sorted(dirty) if bounds[p] < bounds[p + 1]]
        if todo:
            ranges = [(bounds[p], bounds[p + 1]) for p in todo]
            for p, (lo, hi), got in zip(todo, ranges, align(todo, ranges)):
                if len(got) != hi - lo:
                    raise ValueError(f"the aligner timed {len(got)} words of piece {p}, not {hi - lo}")
                start, end = spans[p]
                for k, (a, b) in zip(range(lo, hi), got):
                    a = min(max(a, start), end)
                    times[k] = (a, min(max(b, a), end))
        if rounds >= rounds_allowed:
            break
        moved = list(bounds)
        for k in range(count - 1):  # the boundary between piece k and k + 1
            tail = _tail_pile(times, bounds[k], bounds[k + 1], spans[k][1])
            head = _head_pile(times, bounds[k + 1], bounds[k + 2], spans[k + 1][0])
            if tail and not head and direction[k] >= 0:
                moved[k + 1] = bounds[k + 1] - tail
                direction[k] = 1
            elif head and not tail and direction[k] <= 0:
                moved[k + 1] = bounds[k + 1] + head
                direction[k] = -1
        for k in range(1, count):  # a piece whose words go both ways gives each side its own
            moved[k] = max(moved[k], moved[k - 1])
        for k in range(count - 1, 0, -1):
            moved[k] = min(moved[k], moved[k + 1])
        dirty = {p for k in range(1, count) if moved[k] != bounds[k] for p in (k - 1, k)}
        bounds = moved
        if not dirty:
            break
        rounds += 1
    last = count - 1
    piled = _tail_pile(times, bounds[last], bounds[last + 1], spans[last][1])
    return Shared(bounds, times, rounds, piled)


class TranscriptTooLong(ValueError):
    """A transcript far longer than its audio can hold: it is not aligned."""


def coverage_warning(words: int, weight: float, seconds: float, piled_at_end: int) -> str | None:
    """One line when the audio cannot hold the transcript: far more words than speech of its length
    has, or words piled at the end of the audio; None otherwise."""
    if words == 0:
        return None
    rate = words / seconds if seconds > 0 else float("inf")
    if seconds <= 0 or weight / seconds > MAX_WEIGHT_PER_SECOND:
        return (
            f"the transcript has {words} words for {seconds:.1f} s of audio ({rate:.1f} a second), more "
            "than speech holds: it does not match the audio, and its times are not to be trusted"
        )
    if piled_at_end >= PILE_WORDS:
        return (
            f"the last {piled_at_end} words of the transcript are piled at the end of the audio: the "
            "audio does not cover the transcript (cut short, or the text goes on past it)"
        )
    return None


def passes(durations: Sequence[float]) -> list[tuple[int, int]]:
    """The pieces (their durations, in seconds) aligned together, as [first, last) ranges in order: at
    most ALIGN_ROWS of them, their number times the longest at most PASS_SECONDS, or one piece."""
    out: list[tuple[int, int]] = []
    first, longest = 0, 0.0
    for k, duration in enumerate(durations):
        wider = max(longest, duration)
        if k > first and (k - first >= ALIGN_ROWS or (k - first + 1) * wider > PASS_SECONDS):
            out.append((first, k))
            first, wider = k, duration
        longest = wider
    if first < len(durations):
        out.append((first, len(durations)))
    return out


def align_pieces(
    aligner: ASRModel,
    signal,
    spans: Sequence[Span],
    items: Sequence[Sequence[str]],
    *,
    classes: Callable[[ASRModel, Sequence[AlignerPrompt], Sequence[mx.array]], list[np.ndarray]] = (
        timestamp_classes
    ),
) -> list[list[tuple[float, float]]]:
    """(start, end) in seconds of the whole audio for each item of each piece of signal, in forward
    passes of at most ALIGN_ROWS pieces and PASS_SECONDS of padded audio (passes). The items go to the aligner as they are (not split again), so a piece's words are those
    of the transcript whatever the piece's neighbours hold.

    classes: the aligner's class at every timestamp position (timestamp_classes; tests give a stand-in).
    """
    step_ms = float(aligner.config.timestamp_segment_time or 80)
    out: list[list[tuple[float, float]]] = []
    for first, last in passes([span.duration for span in spans]):
        group = list(zip(spans[first:last], items[first:last]))
        features = encode_segments(aligner, [segment_mel(signal, span) for span, _ in group])
        prompts = [
            aligner_prompt(aligner, int(f.shape[0]), list(its)) for f, (_, its) in zip(features, group)
        ]
        for (span, its), row in zip(group, classes(aligner, prompts, features)):
            offset = span.start_seconds
            out.append([(offset + a, offset + b) for a, b in word_times(row.tolist(), step_ms, len(its))])
    return out


def _segments(
    blocks: Sequence[str],
    words: Sequence[TranscriptWord],
    times: Sequence[tuple[float, float]],
    language: str,
    duration: float,
) -> list[Segment]:
    """A segment for each block: its words and their times ("aligned"); a block without words (only
    punctuation or symbols) is given the time between its neighbours ("estimated")."""
    by_block: dict[int, list[int]] = {}
    for k, word in enumerate(words):
        by_block.setdefault(word.block, []).append(k)
    segments: list[Segment | None] = []
    for index, text in enumerate(blocks):
        ks = by_block.get(index)
        if not ks:
            segments.append(None)
            continue
        timed = [
            Word(
                text[words[k].char_start : words[k].char_end],
                times[k][0],
                times[k][1],
                words[k].char_start,
                words[k].char_end,
            )
            for k in ks
        ]
        end = max(w.end for w in timed)
        segments.append(Segment(timed[0].start, end, text, language, timing="aligned", words=timed))
    out: list[Segment] = []
    for index, seg in enumerate(segments):
        if seg is None:
            before = out[-1].end if out else 0.0
            after = next((s.start for s in segments[index + 1 :] if s is not None), duration)
            seg = Segment(before, max(before, after), blocks[index], language)
        out.append(seg)
    return out


def retime_transcript(
    aligner: ASRModel,
    signal,
    blocks: Sequence[str],
    language: str,
    *,
    classes: Callable[[ASRModel, Sequence[AlignerPrompt], Sequence[mx.array]], list[np.ndarray]] = (
        timestamp_classes
    ),
) -> Transcription:
    """Time the words of blocks of text (subtitle cues, paragraphs) in decoded 16 kHz audio (an array or
    an audio.signal.Signal): one "aligned" segment per block, its words timed; warnings say when the
    audio does not cover the text (coverage_warning). language: a canonical name the aligner supports.
    Raises TranscriptTooLong, before anything is aligned, for a text far beyond what the audio holds."""
    words = transcript_words(blocks, language)
    duration = len(signal) / SAMPLE_RATE
    weight = sum(w.weight for w in words)
    if weight > REFUSE_FACTOR * MAX_WEIGHT_PER_SECOND * duration:
        raise TranscriptTooLong(
            f"the transcript has {len(words)} words for {duration:.1f} s of audio, far more than speech "
            "holds; it is not this audio's transcript (nothing aligned)"
        )
    pieces = split_on_silence(signal, max_seconds=min(PIECE_SECONDS, MAX_SECONDS), sample_rate=SAMPLE_RATE)
    spans = [(p.start_seconds, p.end_seconds) for p in pieces]

    def align(indices: Sequence[int], ranges: Sequence[tuple[int, int]]) -> list[list[tuple[float, float]]]:
        items = [[w.item for w in words[lo:hi]] for lo, hi in ranges]
        return align_pieces(aligner, signal, [pieces[p] for p in indices], items, classes=classes)

    shared = share([w.weight for w in words], spans, align)
    warnings = []
    warning = coverage_warning(len(words), weight, duration, shared.piled_at_end)
    if warning is not None:
        warnings.append(warning)
    segments = _segments(blocks, words, shared.times, language, duration)
    return Transcription(
        text=join_texts(list(blocks), language),
        language=language,
        segments=segments,
        duration=duration,
        warnings=warnings,
    )
