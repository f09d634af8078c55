"""Cues cut from aligned words: splitting, timing, the words they keep, and SRT/WebVTT/JSON output."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import re

import pytest
import srt
import webvtt

from mlx_qwen3asr.outputs.cues import Cue, CueOptions, CueWord, build_cues
from mlx_qwen3asr.outputs.render import render, render_json, render_srt, render_vtt
from mlx_qwen3asr.outputs.wrapping import reading_length, text_width
from mlx_qwen3asr.pipeline.result import Segment, Transcription, Word

OPTIONS = CueOptions()
SENTENCE_END = ".!?。！？…"
CLAUSE_END = ",;:，、；："
VTT_TAG = re.compile(r"<(\d{2,}):([0-5]\d):([0-5]\d)\.(\d{3})>")


def ms(seconds: float) -> int:
    return round(seconds * 1000)


def aligned(text: str, times, words: list[str] | None = None, language: str = "English") -> Segment:
    """A segment whose words (whitespace-separated, or the given pieces in order) have the given times."""
    pieces = text.split() if words is None else words
    assert len(pieces) == len(times)
    out, pos = [], 0
    for piece, (start, end) in zip(pieces, times):
        at = text.index(piece, pos)
        out.append(Word(piece, start, end, at, at + len(piece)))
        pos = at + len(piece)
    start = min(t[0] for t in times)
    end = max(t[1] for t in times)
    return Segment(start, end + 0.2, text, language, timing="aligned", words=out)


def steady(count: int, start: float, word: float = 0.3, gap: float = 0.05, pauses=None):
    """Word times: each word lasts `word` seconds, `gap` between words, extra silence before some."""
    pauses = pauses or {}
    times, t = [], start
    for k in range(count):
        t += pauses.get(k, 0.0)
        times.append((t, t + word))
        t += word + gap
    return times


def cjk_words(text: str) -> list[str]:
    """One word per ideograph, punctuation attached to the character before (as the aligner gives)."""
    words: list[str] = []
    for ch in text:
        if ch in "，。！？、；：" and words:
            words[-1] += ch
        else:
            words.append(ch)
    return words


def nonspace(text: str) -> str:
    return "".join(text.split())


def check_word_cues(cues, segments, options: CueOptions = OPTIONS, duration: float | None = None, exact=True):
    """Every rule of word cues (and the layout rules of all cues).

    exact: each cue word is one word of the segments, in order (not so for a word longer than a cue).
    """
    audio_end = math.inf if duration is None else math.ceil(duration * 1000 - 1e-6)
    gap, tail, pause = ms(options.min_gap), ms(options.tail), ms(options.pause)

    def clamp(seconds: float) -> int:  # words past the end of the audio are pulled back to it
        return min(ms(seconds), audio_end)

    shortest = ms(min(options.word_min_duration, options.max_duration))
    longest = ms(options.max_duration)
    ordered = sorted(segments, key=lambda s: s.start)
    originals = [w for s in ordered if s.timing == "aligned" for w in s.words]
    assert nonspace("".join(c.text for c in cues)) == nonspace("".join(s.text for s in ordered))
    used = 0
    prev_end = 0
    for k, cue in enumerate(cues):
        start, end = ms(cue.start), ms(cue.end)
        assert cue.start * 1000 == pytest.approx(start, abs=1e-6) and cue.end * 1000 == pytest.approx(
            end, abs=1e-6
        )
        assert prev_end <= start < end <= audio_end, cue
        prev_start_end, prev_end = prev_end, end
        lines = cue.text.split("\n")
        assert 1 <= len(lines) <= options.max_lines, cue
        assert all(line and line == line.strip() for line in lines), cue
        assert all(text_width(line) <= options.max_width for line in lines), cue
        if not cue.words:
            continue
        # The words: their spans hold their text, in order, and only spaces lie outside them.
        spans = [(w.char_start, w.char_end) for w in cue.words]
        assert all(cue.text[a:b] == w.text and w.text for (a, b), w in zip(spans, cue.words)), cue
        assert all(b <= a2 for (_, b), (a2, _) in zip(spans, spans[1:])), cue
        outside = "".join(
            cue.text[b:a] for (_, b), (a, _) in zip([(0, 0), *spans], [*spans, (len(cue.text), 0)])
        )
        assert outside.strip() == "", cue
        assert all(start <= ms(w.start) <= ms(w.end) <= end for w in cue.words), cue
        if options.max_words_per_line is not None:
            offset = 0
            for line in lines:
                inside = [w for w in cue.words if w.char_start < offset + len(line) and w.char_end > offset]
                assert len(inside) <= options.max_words_per_line, cue
                offset += len(line) + 1
        if not exact:
            continue
        mine = originals[used : used + len(cue.words)]
        used += len(cue.words)
        assert len(mine) == len(cue.words), cue
        assert all(o.text in w.text.replace("\n", "") for o, w in zip(mine, cue.words)), cue
        first, last = mine[0], mine[-1]
        if clamp(first.start) > audio_end - (len(cues) - k):
            # Words at the very end of the audio: each cue still gets a millisecond of its own.
            assert start == max(prev_start_end, audio_end - (len(cues) - k)), cue
            continue
        if clamp(first.start) < prev_start_end:
            # Words of no length at one time, split by the layout: the cue before takes a millisecond.
            assert start == prev_start_end == ms(cues[k - 1].start) + 1, cue
            continue
        assert start == clamp(first.start), cue
        # Never across a pause; never longer than max_duration unless one word takes longer.
        assert all(clamp(b.start) - clamp(a.end) < pause for a, b in zip(mine, mine[1:])), cue
        if len(mine) > 1:
            assert end - start <= longest, cue
        else:
            assert end - start <= max(longest, clamp(last.end) - start), cue
        nxt = ms(cues[k + 1].start) if k + 1 < len(cues) else None
        room = min(audio_end, math.inf if nxt is None else nxt - gap)
        natural = clamp(last.end)
        reading = reading_length(cue.text)
        if natural <= room:
            # Ends after its last word, with no more time than the tail, min duration or reading speed ask.
            assert end >= natural, cue
            asked = max(natural + tail, start + shortest, start + math.ceil(reading * 1000 / options.max_cps))
            assert end <= max(asked, natural, start + 1), cue
            assert end <= room, cue
            if end - start < shortest:
                assert end == room, cue  # no room for more
            if reading * 1000 > options.max_cps * (end - start):
                assert end >= min(room, max(start + longest - 2, natural)), cue
        else:
            # The words run into the next cue (or the end of the audio): min_gap before it, but the last
            # word stays visible for 0.1 s after it starts.
            visible = clamp(last.start) + 100
            hard = audio_end if nxt is None else min(audio_end, nxt)
            assert end == min(max(room, visible), hard), cue
        if nxt is not None:
            assert nxt - end >= gap or end <= clamp(last.start) + 100, cue
    if exact:
        assert used == len(originals)


# --- building --------------------------------------------------------------------------------------

TALK = (
    "So the first thing I want to talk about today is the budget for next year. "
    "We looked at every department, and most of them asked for more than last time; "
    "some asked for a lot more. Is that reasonable? I honestly do not think so, "
    "but let us hear what the finance team has to say before we decide anything."
)


def test_english_cues_keep_the_transcript_and_break_at_punctuation():
    seg = aligned(TALK, steady(len(TALK.split()), 1.0))
    cues = build_cues([seg], duration=60.0)
    check_word_cues(cues, [seg], duration=60.0)
    assert len(cues) >= 4
    assert " ".join(c.text.replace("\n", " ") for c in cues) == TALK
    # Every cue ends at a sentence or clause end here.
    assert all(c.text[-1] in SENTENCE_END + CLAUSE_END for c in cues), [c.text for c in cues]
    assert cues[0].text.endswith("next year.")
    # Contiguous speech: each cue ends min_gap before the next one starts.
    for a, b in zip(cues, cues[1:]):
        assert ms(b.start) - ms(a.end) == 80
    assert all(c.words and c.start == c.words[0].start for c in cues)


def test_casing_and_punctuation_come_from_the_transcript():
    text = "“Well,” she said — (quietly) — “it’s DONE!”"
    words = ["Well", "she", "said", "quietly", "it’s", "DONE"]
    seg = aligned(text, steady(6, 0.0), words=words)
    (cue,) = build_cues([seg])
    check_word_cues([cue], [seg])
    assert cue.text.replace("\n", " ") == text
    assert [w.text for w in cue.words] == ["“Well,”", "she", "said —", "(quietly) —", "“it’s", "DONE!”"]


def test_a_pause_always_ends_a_cue_and_the_tail_follows_the_last_word():
    text = "I was thinking that maybe we could go to the lake this weekend if the weather holds"
    times = steady(len(text.split()), 2.0, pauses={5: 1.5})  # 1.5 s of silence before "we"
    seg = aligned(text, times)
    cues = build_cues([seg])
    check_word_cues(cues, [seg])
    assert [c.text.replace("\n", " ") for c in cues] == [
        "I was thinking that maybe",
        "we could go to the lake this weekend if the weather holds",
    ]
    assert ms(cues[0].end) == ms(times[4][1]) + 300  # the tail
    assert ms(cues[1].start) == ms(times[5][0])
    # Without the pause the text is one cue.
    plain = aligned(text, steady(len(text.split()), 2.0))
    assert len(build_cues([plain])) == 1
    # A shorter pause option splits at shorter silences.
    short = aligned(text, steady(len(text.split()), 2.0, word=0.1, gap=0.25))
    assert len(build_cues([short])) == 1
    assert len(build_cues([short], options=CueOptions(pause=0.2))) == len(text.split())


def test_a_fast_speaker_gets_the_following_silence_to_read():
    text = "Absolutely, I'd love to come along tomorrow!"
    times = steady(7, 3.0, word=0.18, gap=0.02)  # 44 characters in 1.38 s
    seg = aligned(text, times)
    cue = build_cues([seg, Segment(9.0, 10.0, "Next.", "English")])[0]
    assert reading_length(text) == 44
    assert ms(cue.end) == 3000 + 2200  # 44 / 20 characters per second, past last word + tail
    assert ms(cue.end) > ms(times[-1][1]) + 300
    # With a faster allowance the usual tail is enough.
    (quick,) = build_cues([seg], options=CueOptions(max_cps=40))
    assert ms(quick.end) == max(ms(times[-1][1]) + 300, 3000 + 1100)
    # No silence after it: the cue cannot read slower, and ends min_gap before the next cue.
    crowded = [seg, aligned("Sure.", [(times[-1][1] + 0.1, times[-1][1] + 0.5)])]
    cues = build_cues(crowded)
    check_word_cues(cues, crowded)
    assert ms(cues[1].start) - ms(cues[0].end) == 80


def test_reading_speed_prefers_breaks_before_silences():
    """Fast words with a short silence in them: the cue that ends before the silence can stay on
    screen into it, so the text is split there rather than at the comma."""
    text = "We need to leave now, because the train leaves at noon today"
    times = steady(12, 0.0, word=0.18, gap=0.0, pauses={8: 0.5})  # silence before "leaves"
    seg = aligned(text, times)
    options = CueOptions(max_width=42, max_lines=1)
    cues = build_cues([seg], options=options)
    check_word_cues(cues, [seg], options)
    assert [c.text for c in cues] == ["We need to leave now, because the train", "leaves at noon today"]
    assert reading_length(cues[0].text) / (cues[0].end - cues[0].start) < 25
    # Without a reading-speed limit the comma is the better break.
    unlimited = CueOptions(max_width=42, max_lines=1, max_cps=math.inf)
    cues = build_cues([seg], options=unlimited)
    check_word_cues(cues, [seg], unlimited)
    assert [c.text for c in cues] == ["We need to leave now,", "because the train leaves at noon today"]


def test_fast_contiguous_speech_never_invents_time():
    words = ("supercalifragilistic expialidocious " * 12).split()
    text = " ".join(words)
    times = steady(len(words), 0.0, word=0.25, gap=0.0)
    seg = aligned(text, times)
    cues = build_cues([seg], duration=times[-1][1] + 0.1)
    check_word_cues(cues, [seg], duration=times[-1][1] + 0.1)
    too_fast = [c for c in cues if reading_length(c.text) > 20 * (c.end - c.start)]
    assert too_fast  # this speech cannot be read at 20 characters per second
    assert cues[-1].end == pytest.approx(times[-1][1] + 0.1)  # the last one uses the time up to the end


def test_cjk_cues_break_at_full_stops_and_commas_and_count_double_width():
    text = (
        "今天我们要讨论的第一个问题是明年的预算。我们看了每一个部门的申请，大部分部门都比去年要求得更多，"
        "有些部门要求得多很多。这样合理吗？我个人认为不太合理。"
    )
    pieces = cjk_words(text)
    seg = aligned(text, steady(len(pieces), 0.5, word=0.2, gap=0.03), words=pieces, language="Chinese")
    cues = build_cues([seg])
    check_word_cues(cues, [seg])
    assert "".join(c.text.replace("\n", "") for c in cues) == text
    assert all(c.text[-1] in "。，？" for c in cues), [c.text for c in cues]
    assert max(len(line) for c in cues for line in c.lines) <= 21
    for c in cues:
        for line in c.lines:
            assert line[0] not in "，。？"
    # Reading speed counts a Chinese character twice: 10 characters a second at max_cps 20.
    assert reading_length("预算。") == 6


def test_punctuation_the_aligner_gives_as_a_word_stays_with_the_word_before():
    text = "你好，世界。我们走吧！"
    pieces = ["你", "好", "，", "世", "界", "。", "我", "们", "走", "吧", "！"]
    seg = aligned(text, steady(len(pieces), 0.0, word=0.2, gap=0.0), words=pieces, language="Chinese")
    options = CueOptions(max_width=6, max_lines=2)
    cues = build_cues([seg], options=options)
    check_word_cues(cues, [seg], options, exact=False)
    shown = [w.text for c in cues for w in c.words]
    assert "好，" in shown and "界。" in shown and "吧！" in shown and "，" not in shown
    assert all(line[0] not in "，。！" for c in cues for line in c.lines)
    assert "".join(c.text.replace("\n", "") for c in cues) == text


def test_a_word_longer_than_a_line_is_cut_into_pieces():
    long = "Donaudampfschifffahrtsgesellschaftskapitänsmützenabzeichenherstellungsbetrieb"
    text = f"The word {long} is long."
    times = [(0.0, 0.2), (0.25, 0.5), (0.6, 3.6), (3.7, 3.8), (3.85, 4.2)]
    seg = aligned(text, times)
    options = CueOptions(max_width=20, max_lines=2)
    cues = build_cues([seg], options=options)
    check_word_cues(cues, [seg], options, exact=False)
    assert nonspace("".join(c.text for c in cues)) == nonspace(text)
    pieces = [w for c in cues for w in c.words if len(w.text) > 5 and w.text.replace("\n", "") in long]
    assert "".join(w.text.replace("\n", "") for w in pieces) == long
    assert len(pieces) >= 2  # 78 characters do not fit in 2 lines of 20
    assert all(0.6 <= w.start <= w.end <= 3.6 for w in pieces)
    assert all(a.start < b.start for a, b in zip(pieces, pieces[1:]))
    # One line wide enough for the whole cue count: one piece of at most two lines of 20 cells per cue.
    assert all(text_width(line) <= 20 for c in cues for line in c.lines)


def test_touching_words_leave_min_gap_but_keep_the_last_word_visible():
    text = "alpha beta gamma delta epsilon zeta eta theta"
    times = steady(8, 0.0, word=0.4, gap=0.0)
    seg = aligned(text, times)
    options = CueOptions(max_width=12, max_lines=1)
    cues = build_cues([seg], options=options)
    check_word_cues(cues, [seg], options)
    assert len(cues) >= 4
    for a, b in zip(cues, cues[1:]):
        assert ms(b.start) - ms(a.end) == 80
    # Words of 50 ms: min_gap would end a cue before its last word has been shown for 0.1 s.
    short = aligned(text, steady(8, 0.0, word=0.05, gap=0.0))
    cues = build_cues([short], options=options)
    check_word_cues(cues, [short], options)
    for a, b in zip(cues, cues[1:]):
        assert a.end == b.start  # touching, never overlapping
        assert ms(a.end) - ms(a.words[-1].start) == 50


def test_a_segment_at_the_end_of_the_audio_ends_with_it():
    text = "And that is all for today, thank you."
    times = steady(8, 7.2, word=0.25, gap=0.05)
    seg = aligned(text, times)
    duration = times[-1][1] + 0.1
    cues = build_cues([seg], duration=duration)
    check_word_cues(cues, [seg], duration=duration)
    assert ms(cues[-1].end) == round(duration * 1000)  # the tail stops at the end of the audio
    # Words the aligner placed after the end of the audio are pulled back to it.
    late = aligned("Goodbye.", [(9.9, 10.6)])
    (cue,) = build_cues([late], duration=10.0)
    assert (cue.start, cue.end) == (9.9, 10.0)
    assert cue.words[0].end == 10.0
    # Several cues past the end each keep a millisecond before it; no text is lost.
    later = [late, aligned("One two three.", [(10.2, 10.4), (10.4, 10.6), (10.6, 10.8)])]
    options = CueOptions(max_lines=1, max_words_per_line=1)
    cues = build_cues(later, options=options, duration=10.0)
    check_word_cues(cues, later, options, duration=10.0)
    assert [(ms(c.start), ms(c.end)) for c in cues] == [
        (9900, 9997),
        (9997, 9998),
        (9998, 9999),
        (9999, 10000),
    ]
    # Past the end there is no time, so no pause: words there share one cue.
    after = aligned("See you soon.", [(9.5, 9.8), (10.5, 10.6), (12.0, 12.3)])
    cues = build_cues([after], duration=10.0)
    check_word_cues(cues, [after], duration=10.0)
    assert [(c.text, ms(c.start), ms(c.end)) for c in cues] == [("See you soon.", 9500, 10000)]


def test_mixed_aligned_and_estimated_segments_give_one_ordered_list():
    first = aligned("Hello there, everyone.", steady(3, 0.5))
    second = Segment(3.0, 8.0, "This part has no word timing at all, so it is spread evenly.", "English")
    third = aligned("And now we are back to words.", steady(7, 9.0))
    fourth = Segment(13.0, 15.0, "Bye.", "English", timing="aligned")  # aligned but without words
    segs = [third, first, fourth, second]
    cues = build_cues(segs, duration=16.0)
    check_word_cues(cues, segs, duration=16.0)
    kinds = ["w" if c.words else "e" for c in cues]
    assert kinds[0] == "w" and kinds[-1] == "e" and "e" in kinds[1:-1]
    # The estimated segments are cut and timed exactly as without the aligned ones.
    alone = build_cues([second, fourth], duration=16.0)
    assert [c for c in cues if not c.words] == alone


def test_estimated_segments_ignore_words():
    seg = aligned("Some words here, and more words there.", steady(7, 0.0))
    estimated = dataclasses.replace(seg, timing="estimated")
    plain = Segment(seg.start, seg.end, seg.text, seg.language)
    assert build_cues([estimated]) == build_cues([plain])
    assert all(not c.words for c in build_cues([estimated]))


def test_max_words_per_line():
    text = "one two three four five six seven eight nine ten eleven twelve"
    seg = aligned(text, steady(12, 0.0, word=0.25, gap=0.05))
    options = CueOptions(max_words_per_line=3)
    cues = build_cues([seg], options=options)
    check_word_cues(cues, [seg], options)
    assert [len(line.split()) for c in cues for line in c.lines] == [3, 3, 3, 3]
    assert max(len(line.split()) for c in build_cues([seg]) for line in c.lines) > 3


def test_max_duration_splits_long_speech():
    words = [f"w{k}" for k in range(40)]
    seg = aligned(" ".join(words), steady(40, 0.0, word=0.4, gap=0.1))
    cues = build_cues([seg], options=CueOptions(max_width=80))
    check_word_cues(cues, [seg], CueOptions(max_width=80))
    assert len(cues) >= 3
    assert max(c.end - c.start for c in cues) <= 7.0
    # A single word longer than that stays on screen as long as it is spoken.
    (one,) = build_cues([aligned("Ooooh", [(1.0, 9.5)])])
    assert (one.start, one.end) == (1.0, 9.5)


def test_short_cues_take_min_duration_from_the_gap():
    seg = aligned("Yes.", [(1.0, 1.2)])
    cue = build_cues([seg, aligned("No.", [(5.0, 5.3)])])[0]
    assert (cue.start, cue.end) == (1.0, 1.8)
    tight = build_cues([seg, aligned("No.", [(1.5, 1.8)])])[0]
    assert ms(tight.end) == 1500 - 80


def test_a_split_avoids_a_cue_too_short_to_read():
    """Contiguous speech that needs two cues: "Yes." alone would have 0.12 s on screen."""
    text = "Yes. We will meet at the station at nine, and then we take the early train to the coast."
    seg = aligned(text, steady(len(text.split()), 0.0, word=0.2, gap=0.0))
    for options in (CueOptions(), CueOptions(max_cps=math.inf)):
        cues = build_cues([seg], options=options)
        check_word_cues(cues, [seg], options)
        assert [c.text.replace("\n", " ") for c in cues] == [
            "Yes. We will meet at the station at nine,",
            "and then we take the early train to the coast.",
        ]
        assert min(c.end - c.start for c in cues) >= 0.8


def test_no_arrow_forms_between_two_words():
    seg = aligned("go a-->b now", steady(4, 0.0), words=["go", "a--", ">b", "now"])
    (cue,) = build_cues([seg])
    assert cue.text == "go a-- >b now"
    assert [w.text for w in cue.words] == ["go", "a--", ">b", "now"]
    assert srt_entries(render_srt([cue]))[0][2] == cue.text


@pytest.mark.parametrize(
    "bad",
    [
        {"pause": 0},
        {"pause": -1},
        {"min_gap": -0.01},
        {"min_gap": math.nan},
        {"tail": math.inf},
        {"word_min_duration": -1},
        {"max_cps": 0},
        {"max_cps": math.nan},
        {"max_words_per_line": 0},
        {"max_words_per_line": 2.5},
        {"max_words_per_line": True},
    ],
)
def test_word_options_are_validated(bad):
    with pytest.raises(ValueError):
        CueOptions(**bad)


def test_option_defaults():
    o = CueOptions()
    assert (o.pause, o.word_min_duration, o.min_gap, o.max_cps, o.tail, o.max_words_per_line) == (
        0.6,
        0.8,
        0.08,
        20.0,
        0.3,
        None,
    )
    assert (o.max_width, o.max_lines, o.max_duration, o.min_duration, o.snap_radius) == (42, 2, 7.0, 0.5, 1.0)
    CueOptions(max_cps=math.inf, max_words_per_line=1, min_gap=0, tail=0)  # all accepted
    CueOptions(max_duration=0.5)  # shorter than word_min_duration: cues are then at most 0.5 s


def test_bad_word_spans_are_found_by_text_or_fall_back_to_estimated_timing():
    text = "Hello big world."
    words = [Word("Hello", 0.0, 0.3), Word("big", 0.4, 0.6), Word("world.", 0.7, 1.0)]  # no spans
    (cue,) = build_cues([Segment(0.0, 2.0, text, "English", timing="aligned", words=words)])
    assert cue.text == text and [w.text for w in cue.words] == ["Hello", "big", "world."]
    untimed = [
        Word("Hello", 0.0, 0.3, 0, 5),
        Word("big", math.nan, 0.6, 6, 9),
        Word("world.", 0.7, 1.0, 10, 16),
    ]
    (plain,) = build_cues([Segment(0.0, 2.0, text, "English", timing="aligned", words=untimed)])
    assert plain.words == () and (plain.start, plain.end) == (0.0, 2.0)
    lost = [Word("Goodbye", 0.0, 0.3)]
    (plain,) = build_cues([Segment(0.0, 2.0, text, "English", timing="aligned", words=lost)])
    assert plain.words == () and (plain.start, plain.end) == (0.0, 2.0)


# --- the checker fails on broken cues ----------------------------------------------------------------


def test_the_checker_catches_broken_cues():
    seg = aligned(TALK, steady(len(TALK.split()), 1.0))
    cues = build_cues([seg], duration=60.0)
    check_word_cues(cues, [seg], duration=60.0)

    def broken(k, **change):
        out = list(cues)
        out[k] = dataclasses.replace(out[k], **change)
        return out

    c0, c1 = cues[0], cues[1]
    mutations = [
        broken(0, end=c1.start + 0.5),  # overlaps
        broken(0, end=c1.start - 0.05),  # gap under min_gap
        broken(0, start=c0.start + 0.1),  # does not start with its first word
        broken(0, text=c0.text.lower(), words=()),  # casing lost
        broken(0, text=c0.text.replace(".", "")),  # punctuation lost
        broken(1, end=c1.start + 0.3),  # ends before its last word
        broken(1, end=c1.start + 7.5),  # too long
        broken(0, text="x" * 50),  # line too wide
        [dataclasses.replace(c, text=c.text.replace("\n", " \n")) for c in cues],  # trailing space
    ]
    for cues_ in mutations:
        with pytest.raises(AssertionError):
            check_word_cues(cues_, [seg], duration=60.0)
    with pytest.raises(AssertionError):
        check_word_cues(cues, [seg], duration=c1.start)  # past the end of the audio
    with pytest.raises(AssertionError):
        check_word_cues(cues, [seg], CueOptions(max_words_per_line=2), duration=60.0)


# --- random word timings -------------------------------------------------------------------------------

VOCAB = ["a", "word", "another", "Hello,", "end.", "why?", "so;", "OK:", "x" * 30, "“quoted”", "(aside)"]
CJK = ["我", "们", "好，", "的。", "吗？", "东京"]


def random_segments(rng: random.Random):
    segs, t = [], rng.uniform(0.0, 2.0)
    for _ in range(rng.randint(1, 4)):
        if rng.random() < 0.25:
            dur = rng.uniform(0.3, 8.0)
            segs.append(
                Segment(t, t + dur, " ".join(rng.choice(VOCAB) for _ in range(rng.randint(1, 15))), "x")
            )
            t += dur + rng.choice([0.0, 0.5])
            continue
        cjk = rng.random() < 0.3
        pieces = [rng.choice(CJK if cjk else VOCAB) for _ in range(rng.randint(1, 40))]
        sep = "" if cjk else " "
        text = sep.join(pieces)
        times = []
        for _ in pieces:
            t += rng.choice([0.0, 0.0, 0.02, 0.1, 0.3, 0.7, 2.0]) * rng.random()
            length = rng.choice([0.0, 0.03, 0.2, 0.4, 1.0, 9.0]) * rng.uniform(0.5, 1.0)
            times.append((t, t + length))
            t += length
        segs.append(aligned(text, times, words=pieces, language="x"))
        t += rng.choice([0.0, 0.3, 3.0])
    return segs, t


def test_random_word_timings_always_give_valid_cues(tmp_path):
    rng = random.Random(20250101)
    for _ in range(120):
        segs, t = random_segments(rng)
        options = CueOptions(
            max_width=rng.choice([12, 20, 42]),
            max_lines=rng.choice([1, 2, 3]),
            max_duration=rng.choice([2.0, 7.0]),
            pause=rng.choice([0.3, 0.6, 1.0]),
            word_min_duration=rng.choice([0.0, 0.8, 1.5]),
            min_gap=rng.choice([0.0, 0.08, 0.2]),
            max_cps=rng.choice([10.0, 20.0, math.inf]),
            tail=rng.choice([0.0, 0.3, 0.6]),
            max_words_per_line=rng.choice([None, None, 1, 3]),
        )
        duration = t + rng.choice([0.0, 0.2, 1.0])
        long_words = any(
            text_width(w.text) > options.max_width * options.max_lines for s in segs for w in s.words
        )
        cues = build_cues(segs, options=options, duration=duration)
        check_word_cues(cues, segs, options, duration=duration, exact=not long_words)
        check_written(cues, highlight=True, tmp_dir=tmp_path)


# --- writing -----------------------------------------------------------------------------------------


def srt_entries(text: str):
    subs = list(srt.parse(text))
    assert srt.compose(subs) == text
    return [(ms(s.start.total_seconds()), ms(s.end.total_seconds()), s.content) for s in subs]


def vtt_captions(text: str, tmp_dir):
    path = tmp_dir / "cues.vtt"
    path.write_text(text, encoding="utf-8")
    return webvtt.read(str(path), strict=True).captions


def vtt_time(caption_time: str) -> int:
    h, m, s = caption_time.split(":")
    return (int(h) * 3600 + int(m) * 60) * 1000 + round(float(s) * 1000)


def unescape(text: str) -> str:
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def underlined_positions(content: str) -> set[int]:
    """Positions (in the text without tags) of the characters inside <u>...</u>."""
    positions, pos, inside, k = set(), 0, False, 0
    while k < len(content):
        if content.startswith("<u>", k):
            inside, k = True, k + 3
        elif content.startswith("</u>", k):
            inside, k = False, k + 4
        else:
            if inside:
                positions.add(pos)
            pos, k = pos + 1, k + 1
    return positions


def tag_ms(match: re.Match) -> int:
    h, m, s, milli = (int(g) for g in match.groups())
    return ((h * 60 + m) * 60 + s) * 1000 + milli


def check_written(cues, highlight: bool, tmp_dir=None):
    """SRT (and WebVTT when tmp_dir is given) written from cues: parsed back, the same cues."""
    plain = srt_entries(render_srt(cues))
    assert plain == [(ms(c.start), ms(c.end), c.text) for c in cues]
    if highlight:
        entries = srt_entries(render_srt(cues, highlight_words=True))
        k = 0
        for cue in cues:
            mine = []
            while k < len(entries) and entries[k][1] <= ms(cue.end) and entries[k][0] >= ms(cue.start):
                mine.append(entries[k])
                k += 1
            if not cue.words:
                assert mine == [(ms(cue.start), ms(cue.end), cue.text)]
                continue
            # The entries tile the cue's time, each showing the cue's text with the spoken words underlined.
            assert mine[0][0] == ms(cue.start) and mine[-1][1] == ms(cue.end), cue
            assert all(a[1] == b[0] for a, b in zip(mine, mine[1:])), cue
            assert all(start < end for start, end, _ in mine)
            marked = []
            for _, _, content in mine:
                assert content.replace("<u>", "").replace("</u>", "") == cue.text
                marked.append(underlined_positions(content))
            # Every word is underlined in exactly one entry, in order, and nothing else is.
            owner = []
            for w in cue.words:
                chars = {p for p in range(w.char_start, w.char_end) if cue.text[p] != "\n"}
                holders = [e for e, positions in enumerate(marked) if chars <= positions]
                assert len(holders) == 1, (cue, w)
                owner.append(holders[0])
            assert owner == sorted(owner), cue
            words_at = set().union(*(range(w.char_start, w.char_end) for w in cue.words))
            assert set().union(*marked) <= words_at, cue
        assert k == len(entries)
    if tmp_dir is not None:
        if highlight:
            # Underlined WebVTT is the underlined SubRip, escaped: the same entries, the same <u> marks.
            underlined = vtt_captions(render_vtt(cues, highlight_words="underline"), tmp_dir)
            assert [
                (vtt_time(c.start), vtt_time(c.end), unescape(c.raw_text)) for c in underlined
            ] == srt_entries(render_srt(cues, highlight_words="underline"))
            assert render_srt(cues, highlight_words="karaoke") == render_srt(
                cues, highlight_words="underline"
            )
        for mode in (None, "karaoke") if highlight else (None,):
            captions = vtt_captions(render_vtt(cues, highlight_words=mode), tmp_dir)
            assert len(captions) == len(cues)
            for cue, cap in zip(cues, captions):
                start, end = vtt_time(cap.start), vtt_time(cap.end)
                assert (start, end) == (ms(cue.start), ms(cue.end))
                raw = cap.raw_text
                tags = [tag_ms(m) for m in VTT_TAG.finditer(raw)]
                assert unescape(VTT_TAG.sub("", raw)) == cue.text
                if not (mode and cue.words):
                    assert tags == []
                    continue
                assert all(start < t < end for t in tags), cue
                assert all(a < b for a, b in zip(tags, tags[1:])), cue
                shown_at = [min(ms(w.start), end - 1) for w in cue.words]
                assert len(tags) == len(set(shown_at)) - 1, cue
                # Each tag stands right before a word and carries that word's start.
                for m in VTT_TAG.finditer(raw):
                    after = unescape(VTT_TAG.sub("", raw[m.end() :]))
                    (k,) = [k for k, w in enumerate(cue.words) if cue.text[w.char_start :] == after]
                    assert shown_at[k] == tag_ms(m), cue


def test_written_srt_and_vtt_parse_back_with_highlighted_words(tmp_path):
    segs = [
        aligned(TALK, steady(len(TALK.split()), 1.0, pauses={20: 1.0})),
        Segment(40.0, 44.0, "Estimated text without words & <tags>.", "English"),
        aligned(
            "今天我们讨论预算。好，",
            steady(9, 45.0),
            words=cjk_words("今天我们讨论预算。好，"),
            language="Chinese",
        ),
    ]
    cues = build_cues(segs, duration=50.0)
    check_word_cues(cues, segs, duration=50.0)
    check_written(cues, highlight=True, tmp_dir=tmp_path)

    text = render_srt(cues, highlight_words=True)
    first = cues[0]
    entries = srt_entries(text)
    assert len(entries) == sum(max(1, len(c.words)) for c in cues)
    assert entries[0][2].startswith("<u>So</u> the first")
    assert entries[1][:2] == (ms(first.words[1].start), ms(first.words[2].start))
    assert render_srt(cues) == render("srt", Transcription("", "", segs), cues)
    assert render("srt", Transcription("", "", segs), cues, highlight_words=True) == text

    vtt = render_vtt(cues, highlight_words="karaoke")
    assert render("vtt", Transcription("", "", segs), cues, highlight_words="karaoke") == vtt
    block = vtt.split("\n\n")[1]
    assert block.split("\n")[1].startswith(f"So <00:00:0{first.words[1].start:.3f}>the")


def test_highlight_of_words_that_start_together():
    words = (CueWord("a", 1.0, 1.0, 0, 1), CueWord("b", 1.0, 1.2, 2, 3), CueWord("c", 1.5, 2.0, 4, 5))
    cue = Cue(0.5, 2.0, "a b c", words)
    entries = srt_entries(render_srt([cue], highlight_words=True))
    assert entries == [
        (500, 1000, "a b c"),  # before the first word: the plain text
        (1000, 1500, "<u>a</u> <u>b</u> c"),  # a and b start together
        (1500, 2000, "a b <u>c</u>"),
    ]
    assert render_vtt([cue], highlight_words="karaoke").endswith("a b <00:00:01.500>c\n")
    # A word starting at the cue's end is shown in its last millisecond.
    late = Cue(0.0, 1.0, "x y", (CueWord("x", 0.0, 0.5, 0, 1), CueWord("y", 1.0, 1.0, 2, 3)))
    assert srt_entries(render_srt([late], highlight_words=True))[-1] == (999, 1000, "x <u>y</u>")
    assert render_vtt([late], highlight_words="karaoke").endswith("x <00:00:00.999>y\n")


def test_highlighted_long_word_is_underlined_line_by_line():
    long = "x" * 30
    seg = aligned(f"go {long} now", [(0.0, 0.3), (0.4, 2.0), (2.1, 2.4)])
    cues = build_cues([seg], options=CueOptions(max_width=20))
    check_word_cues(cues, [seg], CueOptions(max_width=20))
    assert [c.text for c in cues] == ["go", f"{'x' * 20}\n{'x' * 10} now"]
    text = render_srt(cues, highlight_words=True)
    assert f"<u>{'x' * 20}</u>\n<u>{'x' * 10}</u> now" in text
    check_written(cues, highlight=True)


def test_json_segments_carry_timing_and_words():
    seg = aligned("Hi there.", [(0.12344, 0.4), (0.5, 0.98765)])
    result = Transcription(
        "Hi there.", "English", [seg, Segment(2.0, 3.0, "Plain.", "English")], duration=3.0
    )
    doc = json.loads(render_json(result, build_cues(result.segments)))
    assert doc["segments"][0]["timing"] == "aligned"
    assert doc["segments"][0]["words"] == [
        {"text": "Hi", "start": 0.123, "end": 0.4},
        {"text": "there.", "start": 0.5, "end": 0.988},
    ]
    assert doc["segments"][1]["timing"] == "estimated" and doc["segments"][1]["words"] == []
    assert doc["cues"][0] == {"start": 0.123, "end": 1.288, "text": "Hi there."}
    assert render("json", result, build_cues(result.segments), highlight_words=True) == render_json(
        result, build_cues(result.segments)
    )
    odd = dataclasses.replace(seg, words=[Word("Hi", math.nan, 0.4, 0, 2)])
    doc = json.loads(render_json(Transcription("Hi", "English", [odd]), []))
    assert doc["segments"][0]["words"] == [{"text": "Hi", "start": None, "end": 0.4}]


def test_highlighted_words_rendered_exactly_in_both_styles():
    words = (
        CueWord("Tom", 1.0, 1.4, 0, 3),
        CueWord("&", 1.5, 1.6, 4, 5),
        CueWord("Jerry,", 1.7, 2.2, 6, 12),
        CueWord("hi", 2.5, 2.8, 13, 15),
    )
    cue = Cue(0.8, 3.0, "Tom & Jerry,\nhi", words)
    plain = Cue(4.0, 5.0, "no <words>", ())
    assert render_vtt([cue, plain], highlight_words="underline") == (
        "WEBVTT\n\n"
        "00:00:00.800 --> 00:00:01.000\nTom &amp; Jerry,\nhi\n\n"
        "00:00:01.000 --> 00:00:01.500\n<u>Tom</u> &amp; Jerry,\nhi\n\n"
        "00:00:01.500 --> 00:00:01.700\nTom <u>&amp;</u> Jerry,\nhi\n\n"
        "00:00:01.700 --> 00:00:02.500\nTom &amp; <u>Jerry,</u>\nhi\n\n"
        "00:00:02.500 --> 00:00:03.000\nTom &amp; Jerry,\n<u>hi</u>\n\n"
        "00:00:04.000 --> 00:00:05.000\nno &lt;words&gt;\n"
    )
    assert render_vtt([cue, plain], highlight_words=True) == render_vtt(
        [cue, plain], highlight_words="underline"
    )
    assert render_vtt([cue, plain], highlight_words="karaoke") == (
        "WEBVTT\n\n"
        "00:00:00.800 --> 00:00:03.000\nTom <00:00:01.500>&amp; <00:00:01.700>Jerry,\n<00:00:02.500>hi\n\n"
        "00:00:04.000 --> 00:00:05.000\nno &lt;words&gt;\n"
    )
    underlined_srt = (
        "1\n00:00:00,800 --> 00:00:01,000\nTom & Jerry,\nhi\n\n"
        "2\n00:00:01,000 --> 00:00:01,500\n<u>Tom</u> & Jerry,\nhi\n\n"
        "3\n00:00:01,500 --> 00:00:01,700\nTom <u>&</u> Jerry,\nhi\n\n"
        "4\n00:00:01,700 --> 00:00:02,500\nTom & <u>Jerry,</u>\nhi\n\n"
        "5\n00:00:02,500 --> 00:00:03,000\nTom & Jerry,\n<u>hi</u>\n\n"
        "6\n00:00:04,000 --> 00:00:05,000\nno <words>\n\n"
    )
    assert render_srt([cue, plain], highlight_words="underline") == underlined_srt
    assert render_srt([cue, plain], highlight_words="karaoke") == underlined_srt  # SRT has no time tags
    assert render_vtt([cue, plain]) == (
        "WEBVTT\n\n00:00:00.800 --> 00:00:03.000\nTom &amp; Jerry,\nhi\n\n00:00:04.000 --> 00:00:05.000\nno &lt;words&gt;\n"
    )
    with pytest.raises(ValueError, match="unknown highlight style 'bold'"):
        render_vtt([cue], highlight_words="bold")


def test_underlined_cues_keep_the_cue_rules_and_leave_the_json_alone(tmp_path):
    segs = [aligned(TALK, steady(len(TALK.split()), 1.0, pauses={20: 1.0}))]
    options = CueOptions(max_width=20, max_lines=1, max_words_per_line=3)
    cues = build_cues(segs, duration=40.0, options=options)
    result = Transcription(TALK, "English", segs)
    for style in ("underline", "karaoke"):
        for fmt in ("srt", "vtt"):
            text = render(fmt, result, cues, highlight_words=style)
            shown = re.sub(r"</?u>|<\d\d:\d\d:\d\d\.\d{3}>", "", text)
            for line in shown.splitlines():
                if "-->" in line or not line.strip() or line.isdigit() or line == "WEBVTT":
                    continue
                assert text_width(unescape(line)) <= 20 and len(line.split()) <= 3, line
        assert render("json", result, cues, highlight_words=style) == render("json", result, cues)
