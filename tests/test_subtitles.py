"""Cue splitting, timing, snapping and timestamp formatting."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import numpy as np
import pytest
from reference import test_signal

from mlx_qwen3asr.outputs.cue_types import format_timestamp, to_milliseconds
from mlx_qwen3asr.outputs.cues import CueOptions, build_cues
from mlx_qwen3asr.outputs.wrapping import clean_text, split_text, text_width, wrap_lines

SR = 16000


@dataclass
class Seg:
    start: float
    end: float
    text: str


def check_cues(cues, options: CueOptions | None = None) -> None:
    """The readability rules every cue list must meet."""
    options = options or CueOptions()
    prev_end = 0.0
    for cue in cues:
        lines = cue.text.split("\n")
        assert 1 <= len(lines) <= options.max_lines, cue
        assert all(line and line == line.strip() for line in lines), cue
        assert all(text_width(line) <= options.max_width for line in lines), cue
        assert cue.end > cue.start >= prev_end, cue
        assert round(cue.start * 1000) == pytest.approx(cue.start * 1000, abs=1e-6)
        if cue.end - cue.start > options.max_duration:
            # Only a single unbreakable word may stay longer on screen.
            assert len(lines) == 1 and " " not in cue.text, cue
        prev_end = cue.end


def words(text: str) -> str:
    return "".join(text.split())


# --- timestamps -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "srt", "vtt"),
    [
        (0.0, "00:00:00,000", "00:00:00.000"),
        (59.9996, "00:01:00,000", "00:01:00.000"),
        (59.9994, "00:00:59,999", "00:00:59.999"),
        (1.0005, "00:00:01,001", "00:00:01.001"),
        (3661.5, "01:01:01,500", "01:01:01.500"),
        (36000 * 10 + 0.25, "100:00:00,250", "100:00:00.250"),
        (-0.2, "00:00:00,000", "00:00:00.000"),
    ],
)
def test_timestamps(seconds, srt, vtt):
    assert format_timestamp(seconds) == srt
    assert format_timestamp(seconds, ".") == vtt


def test_milliseconds_reject_non_finite_times():
    assert to_milliseconds(2.0004) == 2000
    with pytest.raises(ValueError):
        to_milliseconds(float("nan"))


def test_text_width_counts_wide_characters_twice():
    assert text_width("abc") == 3
    assert text_width("中文") == 4
    assert text_width("ＡＢ") == 4  # fullwidth Latin
    assert text_width("ｱｲ") == 2  # halfwidth katakana
    assert text_width("e\u0301") == 1  # combining accent takes no cell


def test_clean_text_removes_line_breaks_controls_and_arrows():
    assert clean_text(" a\nb\r\n\tc\x00d --> e ---> f \u2028g ") == "a b c d -> e -> f g"


# --- splitting ------------------------------------------------------------------------------------

ENGLISH = (
    "So the first thing I want to talk about today is the budget for next year. "
    "We looked at every department, and most of them asked for more than last time; "
    "some asked for a lot more. Is that reasonable? I honestly do not think so, "
    "but let us hear what the finance team has to say before we decide anything."
)

CHINESE = (
    "今天我们要讨论的第一个问题是明年的预算。我们看了每一个部门的申请，大部分部门都比去年要求得更多，"
    "有些部门要求得多很多。这样合理吗？我个人认为不太合理，但是在做出任何决定之前，"
    "我们先听听财务团队怎么说。"
)


def test_long_english_text_splits_at_sentences_and_clauses():
    cues = split_text(ENGLISH)
    assert len(cues) >= 4
    for cue in cues:
        lines = cue.split("\n")
        assert len(lines) <= 2 and all(text_width(line) <= 42 for line in lines)
    assert " ".join(c.replace("\n", " ") for c in cues) == ENGLISH
    # Every cue ends at punctuation here, none in the middle of a clause.
    assert all(c[-1] in ".?,;" for c in cues), cues
    assert cues[0].endswith("next year.")


def test_two_lines_are_balanced():
    text = "one two three four five six seven eight nine ten eleven twelve"
    (cue,) = split_text(text)
    top, bottom = cue.split("\n")
    assert abs(len(top) - len(bottom)) <= 8
    assert wrap_lines("short line") == ["short line"]


def test_cjk_text_breaks_between_characters_and_counts_double_width():
    cues = split_text(CHINESE)
    assert "".join(c.replace("\n", "") for c in cues) == CHINESE
    for cue in cues:
        for line in cue.split("\n"):
            assert text_width(line) <= 42
            assert line[0] not in "，。？、"  # punctuation never starts a line
    assert sum(c.endswith(("。", "？", "，")) for c in cues) >= len(cues) - 1
    # Lines hold up to 21 characters, more than 42 // 2 never.
    assert max(len(line) for c in cues for line in c.split("\n")) <= 21


def test_single_very_long_word_is_cut_into_line_sized_pieces():
    word = "Donaudampfschifffahrtsgesellschaftskapitänsmützenabzeichenherstellungsbetrieb" * 2
    cues = split_text(word)
    assert "".join(c.replace("\n", "") for c in cues) == word
    assert all(text_width(line) <= 42 for c in cues for line in c.split("\n"))
    timed = build_cues([Seg(0.0, 20.0, word)])
    check_cues(timed)
    assert timed[0].start == 0.0 and timed[-1].end == 20.0


def test_empty_text_gives_no_cues():
    assert split_text("") == []
    assert split_text("   \n ") == []
    assert build_cues([Seg(0, 5, ""), Seg(5, 9, "  "), Seg(9, 12, "\n")]) == []
    cues = build_cues([Seg(0, 5, ""), Seg(5, 9, "Hello there.")])
    assert [c.text for c in cues] == ["Hello there."]
    assert cues[0].start == 5.0 and cues[0].end == 9.0


# --- timing ---------------------------------------------------------------------------------------


def test_times_are_proportional_to_text_length_without_audio():
    text = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu"
    options = CueOptions(max_width=20, max_lines=1)
    cues = build_cues([Seg(10.0, 22.0, text)], options=options)
    assert len(cues) >= 3
    check_cues(cues, options)
    assert cues[0].start == 10.0 and cues[-1].end == 22.0
    done = ""
    for prev, cue in zip(cues, cues[1:]):
        done = (done + " " + prev.text).strip()
        expected = 10.0 + 12.0 * len(done) / len(text)
        assert prev.end == cue.start
        assert cue.start == pytest.approx(expected, abs=0.0015)


def test_cues_are_at_most_seven_seconds_when_the_text_can_be_split():
    text = " ".join(["word"] * 30)
    cues = build_cues([Seg(0.0, 30.0, text)])
    assert len(cues) >= 5
    check_cues(cues)
    assert max(c.end - c.start for c in cues) <= 7.0


def test_short_cue_is_extended_into_the_following_pause():
    cues = build_cues([Seg(0.0, 0.2, "Yes."), Seg(3.0, 5.0, "No.")])
    assert cues[0].start == 0.0 and cues[0].end == 0.5
    assert cues[1].start == 3.0


def test_short_cue_takes_time_from_its_neighbours_up_to_an_equal_share():
    options = CueOptions(max_width=5, max_lines=1)
    cues = build_cues([Seg(0.0, 5.3, "Hi. " + "abcd " * 10)], options=options)
    assert [c.text for c in cues] == ["Hi."] + ["abcd"] * 10
    check_cues(cues, options)
    # "Hi." would get 0.3 s in proportion to its length; every cue gets at least 5.3 / 11 s.
    assert min(c.end - c.start for c in cues) >= 5.3 / 11 - 0.001


def test_cue_boundary_snaps_to_a_silent_gap_in_the_audio():
    first = "The first sentence has some words in it."
    second = "The second sentence has more words too."
    assert len(first) == 40 and len(second) == 39  # the proportional boundary is at 40 / 80 of 10 s
    options = CueOptions(max_width=42, max_lines=1)
    seg = Seg(0.0, 10.0, f"{first} {second}")
    without_audio = build_cues([seg], options=options)
    assert [c.text for c in without_audio] == [first, second]
    assert without_audio[0].end == pytest.approx(5.0, abs=0.001)

    for gap in ((5.6, 6.0), (4.1, 4.5)):
        audio = test_signal(10.0, seed=7)
        audio[int(gap[0] * SR) : int(gap[1] * SR)] = 0.0
        cues = build_cues([seg], audio, options=options)
        assert [c.text for c in cues] == [first, second]
        assert gap[0] <= cues[0].end <= gap[1], (gap, cues)
        assert cues[1].start == cues[0].end
        assert cues[0].start == 0.0 and cues[1].end == 10.0


def test_snapping_stays_within_one_second():
    seg = Seg(0.0, 10.0, "The first sentence has some words in it. The second sentence has more words too.")
    audio = test_signal(10.0, seed=8)
    audio[int(7.5 * SR) : int(8.0 * SR)] = 0.0  # too far from the 5 s proportional boundary
    cues = build_cues([seg], audio, options=CueOptions(max_lines=1))
    assert 4.0 <= cues[0].end <= 6.0


def test_cues_span_the_speech_not_the_leading_silence():
    audio = np.zeros(10 * SR, dtype=np.float32)
    audio[4 * SR : 7 * SR] = test_signal(3.0, seed=9)
    (cue,) = build_cues([Seg(0.0, 10.0, "Only a few words here.")], audio)
    assert 3.7 <= cue.start <= 4.0
    assert 7.0 <= cue.end <= 7.3


def test_silent_audio_keeps_the_segment_span():
    audio = np.zeros(4 * SR, dtype=np.float32)
    (cue,) = build_cues([Seg(0.0, 4.0, "Words anyway.")], audio)
    assert (cue.start, cue.end) == (0.0, 4.0)


def test_random_segments_always_give_valid_cues():
    rng = random.Random(1234)
    vocab = [
        "a",
        "word",
        "another",
        "x" * 50,
        "中文字符",
        "。",
        "，",
        "hello,",
        "end.",
        "why?",
        "ไทย",
        "测试一下吧",
    ]
    options = CueOptions()
    for case in range(150):
        t, segs = 0.0, []
        for _ in range(rng.randint(1, 4)):
            # Audio shorter than a millisecond per cue joins cues (test_cues_end_with_the_audio).
            shortest = 0.001 if case % 2 == 0 else 0.3
            dur = rng.choice([shortest, 0.3, 2.0, 9.0, 30.0]) * rng.uniform(0.5, 1.0)
            n = rng.randint(0, 60)
            text = "".join(rng.choice(vocab) + rng.choice([" ", "", " "]) for _ in range(n))
            segs.append(Seg(t, t + dur, text))
            t += dur
        audio = test_signal(t, seed=case) if case % 2 else None
        if audio is not None and len(audio) > SR:
            audio[len(audio) // 3 : len(audio) // 2] = 0.0
        cues = build_cues(segs, audio, options=options)
        check_cues(cues, options)
        if audio is not None and cues:
            assert cues[-1].end <= math.ceil(len(audio) / SR * 1000) / 1000
        assert words("".join(c.text for c in cues)) == words("".join(s.text for s in segs))


def test_options_are_validated():
    with pytest.raises(ValueError):
        CueOptions(max_width=0)
    with pytest.raises(ValueError):
        CueOptions(max_duration=1.0, min_duration=2.0)


@pytest.mark.parametrize("samples", [1, 160, 800, 8000, 16001])
def test_cues_end_with_the_audio(samples):
    """No cue ends after the file does, however short it is; no word is lost."""
    audio = test_signal(samples / SR, seed=samples)[:samples]
    duration_ms = math.ceil(samples / SR * 1000)
    # What the model might say for a clip padded to 0.5 s: segments that end after the audio does.
    text = "Thank you. And goodbye, everyone, see you next time!"
    segs = [Seg(0.0, 0.5, text), Seg(0.5, 0.7, "Bye.")]
    cues = build_cues(segs, audio)
    assert cues and cues[-1].end * 1000 <= duration_ms
    assert all(0 <= c.start < c.end for c in cues)
    assert all(a.end <= b.start for a, b in zip(cues, cues[1:]))
    assert words("".join(c.text for c in cues)) == words(text + "Bye.")
    no_audio = build_cues(segs, duration=samples / SR)
    assert no_audio[-1].end * 1000 <= duration_ms


def test_estimated_cues_are_the_same_as_before_word_timing():
    """Cues of segments without word timing, as build_cues made them before cues could be cut from
    aligned words (recorded from that version)."""
    english = (
        "So the first thing I want to talk about today is the budget for next year. "
        "We looked at every department, and most of them asked for more than last time; "
        "some asked for a lot more. Is that reasonable?"
    )
    chinese = (
        "今天我们要讨论的第一个问题是明年的预算。我们看了每一个部门的申请，大部分部门都比去年要求得更多。"
    )
    segs = [Seg(0.3, 14.0, english), Seg(14.0, 14.2, "Yes."), Seg(15.0, 27.5, chinese)]
    audio = test_signal(28.0, seed=5)
    audio[int(5.1 * SR) : int(5.6 * SR)] = 0.0
    two_lines = [
        (0.3, 5.37, "So the first thing I want to talk about\ntoday is the budget for next year."),
        (5.37, 10.73, "We looked at every department, and most\nof them asked for more than last time;"),
        (10.73, 14.0, "some asked for a lot more.\nIs that reasonable?"),
        (14.0, 14.5, "Yes."),
        (15.0, 21.23, "今天我们要讨论的第一个问\n题是明年的预算。我们看了"),
        (21.23, 27.5, "每一个部门的申请，大部分\n部门都比去年要求得更多。"),
    ]
    assert [(c.start, c.end, c.text) for c in build_cues(segs, audio)] == two_lines
    one_line = [
        (0.3, 1.99, "So the first thing I want"),
        (1.99, 3.49, "to talk about today is"),
        (3.49, 5.37, "the budget for next year."),
        (5.37, 7.49, "We looked at every department,"),
        (7.49, 8.99, "and most of them asked"),
        (8.99, 10.73, "for more than last time;"),
        (10.73, 12.49, "some asked for a lot more."),
        (12.49, 14.0, "Is that reasonable?"),
        (14.0, 14.5, "Yes."),
        (15.0, 17.49, "今天我们要讨论的第一"),
        (17.49, 20.23, "个问题是明年的预算。"),
        (20.23, 23.49, "我们看了每一个部门的申请，"),
        (23.49, 27.5, "大部分部门都比去年要求得更多。"),
    ]
    options = CueOptions(max_width=30, max_lines=1)
    cues = build_cues(segs, audio, options=options)
    assert [(c.start, c.end, c.text) for c in cues] == one_line
    assert all(c.words == () for c in cues)
    # The word-cue options change nothing here.
    other = CueOptions(
        max_width=30, max_lines=1, pause=0.1, min_gap=1.0, max_cps=1.0, tail=0.0, max_words_per_line=1
    )
    assert build_cues(segs, audio, options=other) == cues
