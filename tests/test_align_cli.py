"""`mlxasr align`: a transcript the user has, timed by the forced aligner on a random-weight checkpoint,
against the official aligner; long audio in pieces (pipeline/retime.py); subtitles re-timed; errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import srt
from locked import read_only_folder
from reference import test_signal

from mlx_qwen3asr.audio.cutting import split_on_silence
from mlx_qwen3asr.audio.files import read_audio
from mlx_qwen3asr.cli.align import read_blocks
from mlx_qwen3asr.cli.main import main
from mlx_qwen3asr.pipeline import retime
from mlx_qwen3asr.pipeline.retime import coverage_warning, initial_split, share, transcript_words

TEXT = "So the first thing, I want to talk about today is the budget for next year."
LONG_TEXT = " ".join(
    [
        "so the first thing i want to talk about today is the budget for next year",
        "and then we will look at what the team has done since the last meeting",
        "before we open the floor for questions from everyone who is here today",
    ]
)


def write_wav(path: Path, seconds: float, seed: int) -> Path:
    sf.write(path, test_signal(seconds, seed=seed), 16000, subtype="FLOAT")
    return path


def run(capsys, *args) -> tuple[int, str]:
    capsys.readouterr()
    status = main(["align", *map(str, args)])
    return status, capsys.readouterr().err


def words_of(json_path: Path) -> list[dict]:
    doc = json.loads(json_path.read_text(encoding="utf-8"))
    return [w for seg in doc["segments"] for w in seg["words"]]


# --- parity with the official aligner ----------------------------------------------------------------


def test_times_match_the_official_aligner_for_the_same_audio_and_text(tmp_path, checkpoints, capsys):
    import torch
    from official import official_aligner_module
    from reference import OfficialAligner

    seconds = 100.0
    audio = write_wav(tmp_path / "talk.wav", seconds, seed=11)
    (tmp_path / "talk.txt").write_text(LONG_TEXT + "\n", encoding="utf-8")
    status, err = run(capsys, audio, "--text", tmp_path / "talk.txt", "--json", "--dtype", "float32")
    assert status == 0, err
    ours = words_of(tmp_path / "talk.json")

    official = OfficialAligner(checkpoints("aligner-tiny"))
    processor = official_aligner_module().Qwen3ForceAlignProcessor()
    words, _ = processor.encode_timestamp(LONG_TEXT, "English")
    decoded = read_audio(audio)
    wav = decoded.signal.read(0, len(decoded.signal))
    _, classes, _ = official.run(wav, words)
    timestamp_ms = (torch.from_numpy(classes) * 80.0).numpy()  # as the official align() computes it
    expected = [
        # Our times are kept inside the audio; the official ones of a random-weight model may run past it.
        (w["text"], min(w["start_time"] / 1000.0, seconds), min(w["end_time"] / 1000.0, seconds))
        for w in processor.parse_timestamp(words, timestamp_ms)
    ]
    assert [w["text"] for w in ours] == [text for text, _, _ in expected]
    got = [t for w in ours for t in (w["start"], w["end"])]
    assert got == pytest.approx([t for _, a, b in expected for t in (a, b)], abs=1e-9)
    # The comparison has teeth: some times lie inside the audio (a random-weight aligner mostly names
    # classes past its end; test_align.py compares the classes themselves on many texts).
    inside = {t for _, a, b in expected for t in (a, b) if t < seconds}
    assert len(inside) >= 2 and len(expected) > 30


# --- long audio: pieces --------------------------------------------------------------------------------


def test_long_audio_is_aligned_in_pieces_with_every_word_in_order(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(retime, "PIECE_SECONDS", 12.0)
    seen: list[float] = []
    real = retime.align_pieces

    def spy(aligner, signal, spans, items, **kw):
        seen.extend(span.duration for span in spans)
        return real(aligner, signal, spans, items, **kw)

    monkeypatch.setattr(retime, "align_pieces", spy)
    audio = write_wav(tmp_path / "long.wav", 40.0, seed=4)
    paragraphs = [LONG_TEXT, "and that is all for today thank you"]
    (tmp_path / "words.txt").write_text("\n\n".join(paragraphs) + "\n", encoding="utf-8")
    status, err = run(capsys, audio, "--text", tmp_path / "words.txt", "--json", "--txt")
    assert status == 0, err
    assert len(seen) > 3 and max(seen) <= 12.0  # several pieces, none longer than the limit
    doc = json.loads((tmp_path / "long.json").read_text(encoding="utf-8"))
    assert [s["text"] for s in doc["segments"]] == paragraphs
    assert (tmp_path / "long.txt").read_text(encoding="utf-8") == "\n\n".join(paragraphs) + "\n"
    words = words_of(tmp_path / "long.json")
    assert [w["text"] for w in words] == " ".join(paragraphs).split()
    starts = [w["start"] for w in words]
    assert starts == sorted(starts) and all(w["start"] <= w["end"] for w in words)
    decoded = read_audio(audio)
    pieces = [(p.start_seconds, p.end_seconds) for p in split_on_silence(decoded.signal, 12.0)]
    assert len(pieces) >= 4
    for w in words:
        assert any(a - 1e-3 <= w["start"] <= w["end"] <= b + 1e-3 for a, b in pieces), w


def test_passes_hold_no_more_padded_audio_than_one_long_piece():
    assert retime.PASS_SECONDS == retime.MAX_SECONDS
    # Pieces near the longest go one at a time; short ones share a pass, as many as the budget holds.
    assert retime.passes([170.0, 60.0, 175.0]) == [(0, 1), (1, 2), (2, 3)]
    assert retime.passes([100.0, 80.0, 10.0]) == [(0, 1), (1, 3)]
    assert retime.passes([20.0] * 20) == [(0, 8), (8, 16), (16, 20)]  # ALIGN_ROWS rows at most
    assert retime.passes([200.0]) == [(0, 1)] and retime.passes([]) == []


def test_long_audio_is_aligned_a_bounded_pass_at_a_time(checkpoints, monkeypatch):
    """Memory follows the rows of a pass times their length: however long the audio, a pass holds no
    more padded audio than PASS_SECONDS (lowered here so that a minute stands for an hour)."""
    from mlx_qwen3asr.checkpoints.loading import load

    monkeypatch.setattr(retime, "PIECE_SECONDS", 10.0)
    monkeypatch.setattr(retime, "PASS_SECONDS", 20.0, raising=False)
    aligner = load(checkpoints("aligner-tiny"))
    rows: list[list[int]] = []

    def classes(aligner, prompts, features):  # the audio tokens of each row of one pass
        rows.append([int(f.shape[0]) for f in features])
        return [np.zeros(len(p.timestamps), dtype=np.int64) for p in prompts]

    result = retime.retime_transcript(
        aligner, test_signal(60.0, seed=3), [LONG_TEXT], "English", classes=classes
    )
    assert len([w for s in result.segments for w in s.words]) == len(LONG_TEXT.split())
    tokens_per_second = max(max(r) for r in rows) / 10.0  # a piece holds 10 s at most
    assert len(rows) >= 6 and max(len(r) for r in rows) >= 2  # short pieces still share passes
    assert all(len(r) * max(r) <= 20.0 * tokens_per_second + 1 for r in rows), rows


def pace(truth: list[tuple[float, float]]):
    """A stand-in aligner that knows when each word is spoken: inside its piece it gives that time, a word
    spoken before or after the piece is piled at the piece's edge, as the real aligner piles words it
    does not hear."""
    calls: list[list[int]] = []

    def align(indices, ranges, spans):
        out = []
        for p, (lo, hi) in zip(indices, ranges):
            start, end = spans[p]
            calls.append([p, lo, hi])
            out.append(
                [
                    (a, b) if start <= a and b <= end else ((start, start) if b <= start else (end, end))
                    for a, b in truth[lo:hi]
                ]
            )
        return out

    return align, calls


@pytest.mark.parametrize("spoken", [(5, 15, 10), (15, 5, 10), (8, 8, 14)])
def test_words_move_to_the_piece_they_are_spoken_in(spoken):
    spans = [(0.0, 10.0), (10.0, 20.0), (20.0, 30.0)]
    truth = []
    for (a, b), count in zip(spans, spoken):  # each piece's words evenly over its second half
        step = (b - a) / 2 / count
        truth += [(a + (b - a) / 2 + i * step, a + (b - a) / 2 + (i + 0.8) * step) for i in range(count)]
    weights = [1.0] * len(truth)
    assert initial_split(weights, [10, 10, 10]) != [0, spoken[0], spoken[0] + spoken[1], len(truth)]
    align, calls = pace(truth)
    shared = share(weights, spans, lambda i, r: align(i, r, spans))
    assert shared.bounds == [0, spoken[0], spoken[0] + spoken[1], len(truth)]
    assert np.allclose(shared.times, truth)
    assert shared.piled_at_end == 0 and 1 <= shared.rounds <= retime.MAX_ROUNDS


def test_a_boundary_moves_words_one_way_only():
    spans = [(0.0, 10.0), (10.0, 20.0)]

    def contrary(indices, ranges):
        """Piece 0 piles all its words at its end; piece 1 piles at its start whatever it was given
        beyond its own three words: each piece sends the words back."""
        out = []
        for p, (lo, hi) in zip(indices, ranges):
            if p == 0:
                out.append([(10.0, 10.0)] * (hi - lo))
            else:
                extra = max(hi - lo - 3, 0)
                out.append([(10.0, 10.0)] * extra + [(12.0 + i, 12.5 + i) for i in range(hi - lo - extra)])
        return out

    shared = share([1.0] * 6, spans, contrary)
    assert shared.bounds == [0, 0, 6]  # moved forward once, and never back
    assert shared.rounds == 1


def test_initial_split_follows_the_durations():
    assert initial_split([1.0] * 8, [10.0, 30.0]) == [0, 2, 8]
    assert initial_split([3.0, 1.0, 1.0, 1.0], [10.0, 10.0]) == [0, 1, 4]
    assert initial_split([1.0] * 10, [5.0]) == [0, 10]
    assert initial_split([], [5.0, 5.0]) == [0, 0, 0]


def test_coverage_warning():
    assert coverage_warning(20, 120.0, 10.0, 0) is None
    assert "more than speech holds" in coverage_warning(400, 2400.0, 10.0, 0)
    assert "piled at the end of the audio" in coverage_warning(20, 120.0, 10.0, 5)


# --- subtitles in ----------------------------------------------------------------------------------------

SRT_IN = """\
1
00:00:01,000 --> 00:00:04,000
<i>So the first thing,</i>
I want to talk about

2
00:00:05,000 --> 00:00:09,000
today is the budget

3
00:00:10,000 --> 00:00:12,500
for next year.
"""

VTT_IN = """\
WEBVTT

NOTE a corrected transcript

intro
00:01.000 --> 00:04.000
<v Ann>So the first thing, &amp; then</v>

00:05.000 --> 00:09.000 align:start
today is the budget
"""


def test_subtitles_are_read_as_their_cue_texts(tmp_path):
    (tmp_path / "a.srt").write_text(SRT_IN, encoding="utf-8-sig")
    (tmp_path / "b.vtt").write_text(VTT_IN, encoding="utf-8")
    (tmp_path / "c.txt").write_text("first  paragraph\nstill first\n\n\nsecond 你\n好\n", encoding="utf-8")
    assert read_blocks(tmp_path / "a.srt") == (
        ["So the first thing, I want to talk about", "today is the budget", "for next year."],
        "cue",
    )
    assert read_blocks(tmp_path / "b.vtt") == (["So the first thing, & then", "today is the budget"], "cue")
    assert read_blocks(tmp_path / "c.txt") == (["first paragraph still first", "second 你好"], "paragraph")


def test_srt_is_retimed_keeping_its_cue_texts(tmp_path, capsys):
    audio = write_wav(tmp_path / "talk.wav", 100.0, seed=11)
    (tmp_path / "fixed.srt").write_text(SRT_IN, encoding="utf-8")
    status, err = run(capsys, audio, "--text", tmp_path / "fixed.srt", "--srt", "--json")
    assert status == 0, err
    cues = ["So the first thing, I want to talk about", "today is the budget", "for next year."]
    doc = json.loads((tmp_path / "talk.json").read_text(encoding="utf-8"))
    assert [s["text"] for s in doc["segments"]] == cues
    assert all(s["timing"] == "aligned" for s in doc["segments"])
    out = list(srt.parse((tmp_path / "talk.srt").read_text(encoding="utf-8")))
    # Each output cue lies within one input cue: the cue boundaries are kept.
    texts = [" ".join(c.content.split()) for c in out]
    owners, index, rest = [], 0, cues[0]
    for text in texts:
        if not rest:  # the input cue is used up: the next output cue starts the next one
            index += 1
            rest = cues[index]
        assert rest.startswith(text), (text, rest)  # never a piece of two input cues
        rest = rest[len(text) :].lstrip()
        owners.append(index)
    assert owners[-1] == 2 and not rest


# --- no-clobber ------------------------------------------------------------------------------------------


def test_existing_outputs_are_kept_without_overwrite(tmp_path, capsys):
    audio = write_wav(tmp_path / "talk.wav", 8.0, seed=1)
    (tmp_path / "talk.txt").write_text(TEXT, encoding="utf-8")
    out = tmp_path / "out"
    out.mkdir()
    (out / "talk.srt").write_text("mine\n", encoding="utf-8")
    status, err = run(capsys, audio, "--text", tmp_path / "talk.txt", "--srt", "--json", "-o", out)
    assert status == 0, err
    assert (out / "talk.srt").read_text(encoding="utf-8") == "mine\n"
    assert (out / "talk.json").is_file() and "kept existing" in err
    json_before = (out / "talk.json").read_bytes()
    status, err = run(capsys, audio, "--text", tmp_path / "talk.txt", "--srt", "--json", "-o", out)
    assert status == 0 and "nothing to do" in err
    assert (out / "talk.json").read_bytes() == json_before
    status, err = run(capsys, audio, "--text", tmp_path / "talk.txt", "--srt", "-o", out, "--overwrite")
    assert status == 0, err
    assert list(srt.parse((out / "talk.srt").read_text(encoding="utf-8")))
    assert sorted(p.name for p in out.iterdir()) == ["talk.json", "talk.srt"]


# --- warnings and errors ------------------------------------------------------------------------------------


def test_a_transcript_the_audio_cannot_hold_is_warned_about(tmp_path, capsys):
    audio = write_wav(tmp_path / "short.wav", 2.0, seed=2)
    (tmp_path / "long.txt").write_text(LONG_TEXT, encoding="utf-8")  # 44 words in 2 s
    status, err = run(capsys, audio, "--text", tmp_path / "long.txt", "--json")
    assert status == 0, err
    warnings = [line for line in err.splitlines() if "warning:" in line]
    assert len(warnings) == 1 and "more than speech holds" in warnings[0], err
    assert "more than speech holds" in json.loads((tmp_path / "short.json").read_text())["warnings"][0]


def test_a_transcript_far_beyond_the_audio_is_not_aligned(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(retime, "align_pieces", lambda *a, **k: pytest.fail("the aligner ran"))
    audio = write_wav(tmp_path / "short.wav", 2.0, seed=2)
    (tmp_path / "long.txt").write_text(" ".join([LONG_TEXT] * 10), encoding="utf-8")  # 440 words
    status, err = run(capsys, audio, "--text", tmp_path / "long.txt", "--json")
    assert status == 1
    assert errors_of(err) == [
        f"mlxasr align: error: {audio}: the transcript has 440 words for 2.0 s of audio, far more than "
        "speech holds; it is not this audio's transcript (nothing aligned)"
    ]
    assert not (tmp_path / "short.json").exists()


def errors_of(err: str) -> list[str]:
    return [line for line in err.splitlines() if "error:" in line]


@pytest.mark.parametrize(
    "case, status, message",
    [
        ("missing audio", 2, "nope.wav: no such file"),
        ("folder as audio", 2, "is a folder"),
        ("missing text", 2, "--text {tmp}/nope.txt: no such file"),
        ("empty text", 2, "the text is empty"),
        ("not utf-8", 2, "not UTF-8 text"),
        ("srt without cues", 2, "no subtitle cues found"),
        ("speech model as aligner", 2, "speech recognition model; word timing needs a Qwen3-ForcedAligner"),
        ("unsupported language", 2, "Thai is not among the aligner's languages"),
        ("unknown language", 2, "--language"),
        ("undecodable audio", 1, "bad.wav"),
        ("output is the text", 2, "would replace the --text file"),
    ],
)
def test_errors_are_one_line_and_write_nothing(case, status, message, tmp_path, capsys, checkpoints):
    audio = write_wav(tmp_path / "talk.wav", 3.0, seed=1)
    text = tmp_path / "talk.txt"
    text.write_text(TEXT, encoding="utf-8")
    args = [audio, "--text", text, "--json", "--srt"]
    if case == "missing audio":
        args[0] = tmp_path / "nope.wav"
    elif case == "folder as audio":
        args[0] = tmp_path
    elif case == "missing text":
        args[2] = tmp_path / "nope.txt"
    elif case == "empty text":
        text.write_text(" \n\n ", encoding="utf-8")
    elif case == "not utf-8":
        text.write_bytes(b"caf\xe9\n")
    elif case == "srt without cues":
        args[2] = tmp_path / "x.srt"
        args[2].write_text("just words\n", encoding="utf-8")
    elif case == "speech model as aligner":
        args += ["--aligner", checkpoints("tiny")]
    elif case == "unsupported language":
        args += ["--language", "th"]
    elif case == "unknown language":
        args += ["--language", "xx-nope"]
    elif case == "undecodable audio":
        args[0] = tmp_path / "bad.wav"
        args[0].write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(range(200)))
    elif case == "output is the text":
        args[2] = tmp_path / "talk.srt"
        args[2].write_text(SRT_IN, encoding="utf-8")
    before = sorted(p.name for p in tmp_path.iterdir())
    got, err = run(capsys, *args)
    assert got == status, err
    (line,) = errors_of(err)
    assert message.format(tmp=tmp_path) in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_an_unwritable_output_folder_stops_before_the_audio_is_decoded(tmp_path, capsys, monkeypatch):

    from mlx_qwen3asr.cli import align as align_cli
    from mlx_qwen3asr.cli import models as cli_models

    audio = write_wav(tmp_path / "talk.wav", 3.0, seed=1)
    text = tmp_path / "talk.txt"
    text.write_text(TEXT, encoding="utf-8")
    locked = read_only_folder(tmp_path / "locked", monkeypatch)
    monkeypatch.setattr(align_cli, "read_audio", lambda *a, **k: pytest.fail("the audio was decoded"))
    monkeypatch.setattr(cli_models, "load", lambda *a, **k: pytest.fail("the aligner was loaded"))
    try:
        status, err = run(capsys, audio, "--text", text, "--srt", "--json", "-o", locked)
        # A folder that cannot be made is said the same way, and nothing is left of it.
        below = tmp_path / "talk.txt" / "out"
        status_below, err_below = run(capsys, audio, "--text", text, "--srt", "-o", below)
    finally:
        locked.chmod(0o755)
    assert status == 2
    assert err.splitlines() == [f"mlxasr align: error: cannot write output in {locked} (permission denied)"]
    assert list(locked.iterdir()) == []
    assert status_below == 2
    assert errors_of(err_below) == [
        f"mlxasr align: error: cannot create output folder {below} (a file is in the way)"
    ]


def test_a_folder_made_for_the_outputs_is_removed_when_nothing_is_written(tmp_path, capsys):
    audio = write_wav(tmp_path / "talk.wav", 3.0, seed=1)
    text = tmp_path / "talk.txt"
    text.write_text(TEXT, encoding="utf-8")
    out = tmp_path / "new" / "out"
    status, err = run(capsys, audio, "--text", text, "--srt", "-o", out, "--language", "th")
    assert status == 2 and "Thai is not among the aligner's languages" in err
    assert not (tmp_path / "new").exists()
    status, err = run(capsys, audio, "--text", text, "--srt", "-o", out)
    assert status == 0, err
    assert [p.name for p in out.iterdir()] == ["talk.srt"]


def test_align_writes_no_rttm_turn_of_zero_length(tmp_path, capsys, monkeypatch):
    """A paragraph whose words the aligner piles at one instant is a segment of no length: it keeps its
    speaker in the subtitles and JSON, but makes no RTTM line of duration 0.000."""
    import functools

    import mlx_qwen3asr.cli.align as align_cli
    import mlx_qwen3asr.cli.diarizing as diarizing
    import mlx_qwen3asr.diarize as library

    class Library:  # the diarization library with a stand-in diarizer: one speaker throughout
        def __getattr__(self, name):
            return getattr(library, name)

        def load_diarizer(self, path=None):
            return lambda samples, options, **kw: [library.Turn(0.0, samples.shape[0] / 16000, 0)]

    def classes(aligner, prompts, features):  # "one two three" over 0.88 s, "four" at 2.4 s sharp
        return [np.array([0, 3, 4, 7, 8, 11, 30, 30]) for _ in prompts]

    monkeypatch.setattr(diarizing, "library", lambda: Library())
    monkeypatch.setattr(
        align_cli, "retime_transcript", functools.partial(retime.retime_transcript, classes=classes)
    )
    audio = write_wav(tmp_path / "talk.wav", 4.0, seed=2)
    (tmp_path / "talk.txt").write_text("one two three\n\nfour\n", encoding="utf-8")
    status, err = run(capsys, audio, "--text", tmp_path / "talk.txt", "--json", "--rttm", "--no-vad")
    assert status == 0, err
    segments = json.loads((tmp_path / "talk.json").read_text(encoding="utf-8"))["segments"]
    assert [(s["start"], s["end"], s["speaker"]) for s in segments] == [
        (0.0, 0.88, "Speaker 1"),
        (2.4, 2.4, "Speaker 1"),
    ]
    rttm = (tmp_path / "talk.rttm").read_text(encoding="utf-8")
    assert rttm == "SPEAKER talk 1 0.000 0.880 <NA> <NA> Speaker_1 <NA> <NA>\n"


def test_help_of_align(capsys):
    assert main(["align", "--help"]) == 0
    text = capsys.readouterr().out
    assert "--text" in text and "exit status" in text and ".srt" in text


def test_transcript_words_keep_their_blocks_and_punctuation():
    words = transcript_words(["Hello, world!", "«Bonjour» le monde."], "French")
    assert [(w.block, w.item) for w in words] == [
        (0, "Hello"),
        (0, "world"),
        (1, "Bonjour"),
        (1, "le"),
        (1, "monde"),
    ]
    assert [w.char_end - w.char_start for w in words] == [6, 6, 9, 2, 6]
    assert np.all([w.weight > 1 for w in words])


@pytest.mark.parametrize(
    ("text", "language"),
    [
        ("今日はいい天気ですね", "Japanese"),
        ("오늘은 날씨가 좋네요", "Korean"),
        ("今天天气很好", "Chinese"),
        ("Heute ist das Wetter schön", "English"),
    ],
)
def test_without_language_the_script_of_the_text_decides(text, language, tmp_path, capsys):
    audio = write_wav(tmp_path / "talk.wav", 4.0, seed=5)
    (tmp_path / "talk.txt").write_text(text + "\n", encoding="utf-8")
    status, err = run(capsys, audio, "--text", tmp_path / "talk.txt", "--json")
    assert status == 0, err
    assert json.loads((tmp_path / "talk.json").read_text(encoding="utf-8"))["language"] == language


@pytest.mark.parametrize(
    ("text", "language"),
    [("今天天气很好，我们去公园吧", "Chinese"), ("今日はいい天気ですね", "Japanese"), (TEXT, "English")],
)
def test_the_words_said_to_be_timed_are_the_words_the_aligner_times(text, language, tmp_path, capsys):
    audio = write_wav(tmp_path / "talk.wav", 4.0, seed=5)
    (tmp_path / "talk.txt").write_text(text + "\n", encoding="utf-8")
    status, err = run(capsys, audio, "--text", tmp_path / "talk.txt", "--json", "--language", language)
    assert status == 0, err
    count = len(transcript_words([text], language))
    assert count > 3
    assert f"timing {count} words in 1 paragraph(s)" in err, err
    timed = words_of(tmp_path / "talk.json")
    assert len(timed) == count


@pytest.mark.parametrize(
    "body",
    [
        "1\nthe meeting --> the budget\nso the first thing\n",  # prose with an arrow, named .srt
        "1\n00:00:01,000 --> soon\nso the first thing\n",
        SRT_IN + "\n4\n00:00:13 --> 00:00:14\nand a damaged cue\n",
    ],
)
def test_a_subtitle_file_without_valid_cues_is_refused_by_name(body, tmp_path, capsys):
    audio = write_wav(tmp_path / "talk.wav", 3.0, seed=1)
    subtitles = tmp_path / "fixed.srt"
    subtitles.write_text(body, encoding="utf-8")
    before = sorted(p.name for p in tmp_path.iterdir())
    status, err = run(capsys, audio, "--text", subtitles, "--srt", "--json")
    assert status == 2, err
    (line,) = errors_of(err)
    assert line.startswith(f"mlxasr align: error: --text {subtitles}: line ") and "no cue timing" in line
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_long_audio_is_read_by_range_and_never_whole(tmp_path, capsys, monkeypatch):
    """As for transcription, a long file stays in its temporary file and is read back piece by piece:
    no read covers the whole file (the thresholds are lowered so that a short file stands for hours)."""
    from mlx_qwen3asr.audio import files
    from mlx_qwen3asr.audio import signal as signals
    from mlx_qwen3asr.outputs import cues

    seconds, piece = 100.0, 20.0
    monkeypatch.setattr(files, "SPILL_SECONDS", 30.0)
    monkeypatch.setattr(retime, "PIECE_SECONDS", piece)
    monkeypatch.setattr(cues, "_ENERGY_BLOCK_FRAMES", 256)  # 5 s blocks of loudness for cue timing
    reads: list[tuple[str, int]] = []

    def spy(kind):
        read = kind.read

        def wrapper(self, start, stop):
            out = read(self, start, stop)
            reads.append((kind.__name__, int(out.shape[0])))
            return out

        monkeypatch.setattr(kind, "read", wrapper)

    spy(signals.ArraySignal)
    spy(signals.FileSignal)
    audio = write_wav(tmp_path / "talk.wav", seconds, seed=11)
    (tmp_path / "talk.txt").write_text(LONG_TEXT + "\n", encoding="utf-8")
    status, err = run(capsys, audio, "--text", tmp_path / "talk.txt", "--srt", "--json")
    assert status == 0, err
    assert len(words_of(tmp_path / "talk.json")) == len(LONG_TEXT.split())
    assert {kind for kind, _ in reads} == {"FileSignal"}  # spilled, as a long file is
    assert len(reads) > 10 and max(n for _, n in reads) <= (piece + 1.0) * 16000
