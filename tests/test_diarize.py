"""Speaker diarization (mlx_qwen3asr.diarize): speakrs itself on the random-weight `diarizer` preset of
tools/make_checkpoint.py (nothing downloaded), the API around it, and the speakers given to a
transcript's words and segments, from scripted turns."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from mlx_qwen3asr import diarize
from mlx_qwen3asr.diarize import (
    DiarizeCancelled,
    DiarizeOptions,
    DiarizerLoadError,
    DiarizerUnavailable,
    Turn,
    Turns,
    assign_speakers,
    load_diarizer,
    rttm_lines,
    split_at_speakers,
)
from mlx_qwen3asr.pipeline.result import Segment, Transcription, Word
from tools.make_checkpoint import (
    DIARIZER_PRESET,
    EMBEDDING_FILE,
    PLDA_FILES,
    SEGMENTATION_FILE,
    write_checkpoint,
    write_diarizer,
)

ROOT = Path(__file__).resolve().parents[1]
RATE = 16000


def needs_speakrs():
    return pytest.importorskip("speakrs", reason="speakrs (the diarize extra, Python 3.11+) is not installed")


@pytest.fixture(scope="session")
def diarizer_dir(checkpoints) -> Path:
    return checkpoints(DIARIZER_PRESET)


@pytest.fixture(scope="session")
def diarizer(diarizer_dir):
    needs_speakrs()
    return load_diarizer(diarizer_dir)


def noise(seconds: float, seed: int = 0) -> np.ndarray:
    """Bursts of noise and of a buzzing tone: a sound the random segmentation model answers with turns."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    buzz = 0.2 * np.sign(np.sin(2 * np.pi * 150 * t)) * (np.sin(2 * np.pi * 0.4 * t) > 0)
    hiss = 0.1 * rng.standard_normal(t.size) * (np.sin(2 * np.pi * 0.3 * t + 1) > 0)
    return (buzz + hiss).astype(np.float32)


# --------------------------------------------------------------------------------------------------
# The random-weight model folder
# --------------------------------------------------------------------------------------------------


def test_the_preset_holds_every_file_speakrs_loads_with_its_dtypes(diarizer_dir):
    speakrs = needs_speakrs()
    assert sorted(p.name for p in diarizer_dir.iterdir()) == sorted(speakrs.required_model_files("CPU"))
    for name in (SEGMENTATION_FILE, EMBEDDING_FILE):
        tensors = load_file(str(diarizer_dir / name))
        assert tensors and {str(v.dtype) for v in tensors.values()} == {"float32"}, name
    for name in PLDA_FILES:
        assert np.load(diarizer_dir / name).dtype == np.float64, name
    assert (diarizer_dir / "wespeaker-voxceleb-resnet34.min_num_samples.txt").read_text().strip().isdigit()


def test_the_preset_is_seeded(tmp_path, diarizer_dir):
    same = write_diarizer(tmp_path / "same", seed=0)
    other = write_diarizer(tmp_path / "other", seed=1)
    for name in (SEGMENTATION_FILE, EMBEDDING_FILE, *PLDA_FILES):
        assert (same / name).read_bytes() == (diarizer_dir / name).read_bytes(), name
        assert (other / name).read_bytes() != (diarizer_dir / name).read_bytes(), name


def test_the_command_writes_the_preset(tmp_path, diarizer_dir):
    out = tmp_path / "diarizer"
    done = subprocess.run(
        [sys.executable, "tools/make_checkpoint.py", "--preset", "diarizer", "-o", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in diarizer_dir.iterdir())
    assert (out / EMBEDDING_FILE).read_bytes() == (diarizer_dir / EMBEDDING_FILE).read_bytes()


def test_speakrs_checks_the_layout_so_loading_the_preset_means_something(tmp_path, diarizer_dir):
    """A tensor of another shape, or one missing, is refused by name: loading the preset checks every
    name and shape."""
    needs_speakrs()
    folder = write_checkpoint(tmp_path / "bad", DIARIZER_PRESET)
    tensors = load_file(str(folder / SEGMENTATION_FILE))
    tensors["sincnet.conv1d.1.weight"] = np.zeros((60, 80, 3), np.float32)
    save_file(tensors, str(folder / SEGMENTATION_FILE))
    with pytest.raises(DiarizerLoadError) as e:
        load_diarizer(folder)
    assert str(folder) in str(e.value) and "sincnet.conv1d.1.weight" in str(e.value)
    assert "\n" not in str(e.value)

    tensors = load_file(str(diarizer_dir / EMBEDDING_FILE))
    del tensors["resnet.layer3.2.conv1.weight_bias"]
    save_file(tensors, str(folder / EMBEDDING_FILE))
    (folder / SEGMENTATION_FILE).write_bytes((diarizer_dir / SEGMENTATION_FILE).read_bytes())
    with pytest.raises(DiarizerLoadError, match="missing or extra names"):
        load_diarizer(folder)


# --------------------------------------------------------------------------------------------------
# The real library on the random preset
# --------------------------------------------------------------------------------------------------


def check_turns(turns, seconds: float) -> None:
    assert isinstance(turns, Turns) and isinstance(turns, list)
    assert turns, "no turns"
    for t in turns:
        assert type(t) is Turn and type(t.start) is float and type(t.end) is float and type(t.speaker) is int
        assert 0.0 <= t.start < t.end <= seconds
    assert [t.start for t in turns] == sorted(t.start for t in turns)
    # Numbered 0, 1, ... in order of first appearance.
    seen: list[int] = []
    for t in turns:
        if t.speaker not in seen:
            assert t.speaker == len(seen)
            seen.append(t.speaker)


def test_the_library_gives_turns_within_the_audio(diarizer):
    seconds = 4.0
    turns = diarizer(noise(seconds))
    check_turns(turns, seconds)
    assert turns.warnings == []
    # The library pads the last 10 s window; no turn reaches past the audio.
    assert max(t.end for t in turns) <= seconds
    # The same audio gives the same turns; float64 samples are taken as float32.
    assert diarizer(noise(seconds).astype(np.float64)) == turns


def test_samples_are_checked(diarizer):
    assert diarizer(np.zeros(0, np.float32)) == []
    with pytest.raises(ValueError, match="mono"):
        diarizer(np.zeros((2, RATE), np.float32))
    bad = noise(1.0)
    bad[10] = np.nan
    with pytest.raises(ValueError, match="finite"):
        diarizer(bad)


class Recorder:
    """The real pipeline, recording the AHC threshold of each run."""

    def __init__(self, pipeline):
        self.pipeline, self.thresholds = pipeline, []

    @property
    def pipeline_config(self):
        return self.pipeline.pipeline_config

    def diarize_samples(self, samples, *, pipeline_config=None, cancel_token=None):
        config = pipeline_config or self.pipeline.pipeline_config
        self.thresholds.append(round(config.clustering.ahc.threshold, 4))
        return self.pipeline.diarize_samples(
            samples, pipeline_config=pipeline_config, cancel_token=cancel_token
        )


def test_a_speaker_count_is_sought_through_the_clustering_threshold(diarizer_dir):
    """speakrs has no speaker-count setting: a count outside the range is sought by clustering again
    with another AHC threshold (higher for fewer speakers). The random model's embeddings are all alike
    and it finds the same speakers at every threshold: the closest result comes back, with a warning."""
    needs_speakrs()
    d = load_diarizer(diarizer_dir)
    d._pipeline = recorder = Recorder(d._pipeline)
    audio = noise(3.0)
    plain = d(audio)
    found = plain.speaker_count
    default = recorder.thresholds[0]
    assert default == 0.6 and found >= 1

    recorder.thresholds.clear()
    assert d(audio, DiarizeOptions(num_speakers=found)) == plain
    assert recorder.thresholds == [default], "a count already met costs no second run"

    recorder.thresholds.clear()
    assert d(audio, DiarizeOptions(max_speakers=1)) == [Turn(0.0, 3.0, 0)]
    assert recorder.thresholds == [], "one speaker needs no run"
    fewer = d(audio, DiarizeOptions(max_speakers=found - 1)) if found > 2 else None
    if fewer is not None:
        assert recorder.thresholds[0] == default and recorder.thresholds[1] == 2.0
        assert all(t > default for t in recorder.thresholds[1:])
    recorder.thresholds.clear()
    more = d(audio, DiarizeOptions(min_speakers=found + 1))
    check_turns(more, 3.0)
    assert recorder.thresholds[0] == default and recorder.thresholds[1] == 0.0
    assert all(t < default for t in recorder.thresholds[1:]) and len(recorder.thresholds) <= 3
    assert more.warnings == [
        f"asked for at least {found + 1} speakers, the clustering found {more.speaker_count} "
        "at every threshold tried"
    ]


class StandIn:
    """A pipeline whose clustering finds 4, 3, 2 or 1 speakers as the AHC threshold rises."""

    def __init__(self, speakrs):
        self.pipeline_config = speakrs.PipelineConfig.for_mode("CPU")
        self.thresholds = []

    def diarize_samples(self, samples, *, pipeline_config=None, cancel_token=None):
        threshold = (pipeline_config or self.pipeline_config).clustering.ahc.threshold
        self.thresholds.append(threshold)
        count = 4 if threshold < 0.3 else 3 if threshold < 0.9 else 2 if threshold < 1.5 else 1

        class Seg:
            def __init__(self, k):
                self.start, self.end, self.speaker = float(k), k + 0.5, f"SPEAKER_{count - 1 - k:02d}"

        class Result:
            segments = [Seg(k) for k in range(count)]

        return Result()


@pytest.mark.parametrize(
    ("options", "count", "warned"),
    [
        (DiarizeOptions(), 3, False),
        (DiarizeOptions(num_speakers=3), 3, False),
        (DiarizeOptions(num_speakers=2), 2, False),
        (DiarizeOptions(max_speakers=2), 2, False),
        (DiarizeOptions(min_speakers=4), 4, False),
        (DiarizeOptions(min_speakers=2, max_speakers=5), 3, False),
        (DiarizeOptions(num_speakers=5), 4, True),
    ],
)
def test_the_threshold_search_reaches_the_count(options, count, warned):
    speakrs = needs_speakrs()
    d = diarize.Diarizer(StandIn(speakrs), speakrs, "stand-in")
    turns = d(np.zeros(5 * RATE, np.float32), options)
    assert turns.speaker_count == count
    # Renumbered by first appearance, whatever the library's labels.
    assert [t.speaker for t in turns] == list(range(count))
    assert bool(turns.warnings) == warned
    assert len(d._pipeline.thresholds) <= 3


def test_the_library_releases_the_gil_while_it_works(diarizer):
    """Another Python thread keeps running while a call is in progress (so diarization runs beside
    transcription): were the GIL held, this thread would stall for the whole call."""
    audio = noise(3.0, seed=3)
    worker = threading.Thread(target=diarizer, args=(audio,))
    stamps = [time.perf_counter()]
    worker.start()
    while worker.is_alive():
        sum(range(200))  # pure Python: needs the GIL
        time.sleep(0.002)  # and leaves the cores to the library
        stamps.append(time.perf_counter())
    worker.join()
    took = stamps[-1] - stamps[0]
    longest = max(b - a for a, b in zip(stamps, stamps[1:]))
    assert took > 0.3, "the call was too short to tell"
    assert longest < 0.5 * took, f"Python stalled {longest:.2f} s of a {took:.2f} s call"
    assert len(stamps) > 20


def test_a_call_can_be_cancelled_and_the_diarizer_goes_on(diarizer):
    audio = noise(11.0, seed=4)  # two windows: the library checks for cancellation between its stages
    outcome: list[object] = []

    def run():
        try:
            outcome.append(diarizer(audio))
        except Exception as e:
            outcome.append(e)

    worker = threading.Thread(target=run)
    worker.start()
    time.sleep(0.3)
    diarizer.cancel()
    worker.join(timeout=120)
    assert not worker.is_alive()
    assert isinstance(outcome[0], DiarizeCancelled), outcome
    diarizer.cancel()  # nothing running: nothing to stop, and the next call is not cancelled
    check_turns(diarizer(noise(2.0)), 2.0)


# --------------------------------------------------------------------------------------------------
# Loading: folders, the hub, the library missing
# --------------------------------------------------------------------------------------------------


def test_a_bad_folder_is_one_line_naming_it(tmp_path, diarizer_dir):
    needs_speakrs()
    with pytest.raises(DiarizerLoadError, match=r"^diarizer folder .*nowhere does not exist$"):
        load_diarizer(tmp_path / "nowhere")
    (tmp_path / "file").write_text("x")
    with pytest.raises(DiarizerLoadError, match=r"^diarizer folder .*file is not a folder$"):
        load_diarizer(tmp_path / "file")
    partial = tmp_path / "partial"
    partial.mkdir()
    for p in diarizer_dir.iterdir():
        if p.name != EMBEDDING_FILE:
            (partial / p.name).write_bytes(p.read_bytes())
    with pytest.raises(DiarizerLoadError) as e:
        load_diarizer(partial)
    assert str(e.value) == f"diarizer folder {partial} lacks {EMBEDDING_FILE}"
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DiarizerLoadError, match=r"lacks \S+ \(and 8 more of its 9 model files\)$"):
        load_diarizer(empty)
    (partial / EMBEDDING_FILE).write_bytes(b"not safetensors")
    with pytest.raises(DiarizerLoadError) as e:
        load_diarizer(partial)
    assert str(e.value).startswith(f"cannot load the diarization models in {partial}: ")
    assert "\n" not in str(e.value)


def offline(monkeypatch, cache: Path) -> None:
    """The hub out of reach (a closed port), the library's cache in cache."""
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("SPEAKRS_CACHE_DIR", str(cache))


def test_without_the_hub_the_default_says_how_to_give_local_files(tmp_path, monkeypatch):
    needs_speakrs()
    offline(monkeypatch, tmp_path / "cache")
    with pytest.raises(DiarizerLoadError) as e:
        load_diarizer()
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(
        "cannot get the diarization models (avencera/speakrs-models) from the Hugging Face hub"
    )
    assert "--diarizer DIR" in message and "MLXASR_DIARIZER" in message


def test_offline_the_default_uses_the_library_cache(tmp_path, monkeypatch, diarizer_dir):
    speakrs = needs_speakrs()
    offline(monkeypatch, tmp_path / "cache")
    snapshot = (
        tmp_path / "cache" / "models--avencera--speakrs-models" / "snapshots" / speakrs.DEFAULT_MODEL_REVISION
    )
    snapshot.mkdir(parents=True)
    for p in diarizer_dir.iterdir():
        (snapshot / p.name).write_bytes(p.read_bytes())
    d = load_diarizer()
    assert d.source == f"avencera/speakrs-models@{speakrs.DEFAULT_MODEL_REVISION}"
    check_turns(d(noise(2.0)), 2.0)


def test_without_the_library_the_message_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "speakrs", None)  # import speakrs raises ImportError
    monkeypatch.setattr(sys, "version_info", (3, 12, 4, "final", 0))
    with pytest.raises(DiarizerUnavailable) as e:
        load_diarizer("anywhere")
    assert str(e.value) == 'speaker diarization needs speakrs: pip install "mlx-qwen3asr[diarize]"'
    monkeypatch.setattr(sys, "version_info", (3, 10, 14, "final", 0))
    with pytest.raises(DiarizerUnavailable) as e:
        load_diarizer()
    assert str(e.value) == (
        "speaker diarization needs Python 3.11 or newer (speakrs), this is Python 3.10; "
        'on 3.11+: pip install "mlx-qwen3asr[diarize]"'
    )


def test_the_extra_pins_the_version_built_against():
    text = (ROOT / "pyproject.toml").read_text()
    assert f"diarize = [\"speakrs=={diarize.SPEAKRS_VERSION}; python_version >= '3.11'\"]" in text
    speakrs = pytest.importorskip("speakrs")
    assert speakrs.__version__ == diarize.SPEAKRS_VERSION


# --------------------------------------------------------------------------------------------------
# Options
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_speakers": 0}, "num_speakers must be a whole number of at least 1, got 0"),
        ({"min_speakers": -2}, "min_speakers must be a whole number of at least 1, got -2"),
        ({"max_speakers": 2.5}, "max_speakers must be a whole number of at least 1, got 2.5"),
        ({"max_speakers": True}, "max_speakers must be a whole number of at least 1, got True"),
        ({"min_speakers": 3, "max_speakers": 2}, "min_speakers (3) must not exceed max_speakers (2)"),
        (
            {"num_speakers": 2, "max_speakers": 3},
            "give num_speakers alone, or min_speakers and/or max_speakers",
        ),
    ],
)
def test_bad_options_are_one_clear_error(kwargs, message):
    with pytest.raises(ValueError) as e:
        DiarizeOptions(**kwargs)
    assert str(e.value) == message


def test_options_bounds():
    assert DiarizeOptions().bounds == (1, float("inf"))
    assert DiarizeOptions(num_speakers=2).bounds == (2, 2)
    assert DiarizeOptions(min_speakers=2, max_speakers=2).bounds == (2, 2)
    assert DiarizeOptions(max_speakers=3).bounds == (1, 3)


# --------------------------------------------------------------------------------------------------
# Speakers for a transcript, from scripted turns
# --------------------------------------------------------------------------------------------------


def aligned(text: str, times: list[tuple[float, float]], start: float, end: float, cut=str.split) -> Segment:
    """A segment whose words (cut from text) have the given times and their spans in text."""
    words, pos = [], 0
    for piece, (a, b) in zip(cut(text), times, strict=True):
        at = text.index(piece, pos)
        words.append(Word(piece, a, b, at, at + len(piece)))
        pos = at + len(piece)
    return Segment(start, end, text, "English", timing="aligned", words=words)


def transcription(*segments: Segment) -> Transcription:
    return Transcription(" ".join(s.text for s in segments), "English", list(segments), duration=30.0)


TWO = [Turn(0.0, 2.0, 0), Turn(2.2, 4.0, 1), Turn(4.1, 6.0, 0)]


def test_each_word_takes_the_speaker_of_most_of_its_span_and_segments_are_cut_at_changes():
    seg = aligned(
        "Hello there, how are you? Fine, thanks. And you?",
        [
            (0.1, 0.5),
            (0.6, 1.0),
            (1.1, 1.3),
            (1.4, 1.6),
            (1.7, 2.15),
            (2.3, 2.8),
            (2.9, 3.6),
            (4.3, 4.6),
            (4.7, 5.0),
        ],
        0.0,
        5.5,
    )
    before = copy.deepcopy(seg)
    out = assign_speakers(transcription(seg), TWO)
    assert seg == before, "the input is not modified"
    assert out.speakers == ["Speaker 1", "Speaker 2"]
    assert [(s.text, s.speaker) for s in out.segments] == [
        ("Hello there, how are you?", "Speaker 1"),  # "you?" is 0.1 s in turn 0, 0.05 s in turn 1
        ("Fine, thanks.", "Speaker 2"),
        ("And you?", "Speaker 1"),
    ]
    # Cut between words, timed by them; the first piece keeps the segment's start, the last its end.
    assert [(s.start, s.end) for s in out.segments] == [(0.0, 2.15), (2.3, 3.6), (4.3, 5.5)]
    for s in out.segments:
        assert s.timing == "aligned" and s.language == "English" and not s.overlap
        for w in s.words:
            assert s.text[w.char_start : w.char_end] == w.text
            assert w.speaker == s.speaker and w.overlap is False
    assert [w.text for s in out.segments for w in s.words] == [w.text for w in seg.words]
    assert out.text == seg.text


def test_speakers_are_labelled_in_order_of_first_appearance_in_the_transcript():
    seg = aligned("one two three", [(2.5, 2.8), (0.5, 0.8), (3.0, 3.2)], 0.0, 4.0)
    # The diarizer's speaker 1 speaks first in the transcript: it is "Speaker 1".
    out = assign_speakers(transcription(seg), TWO)
    assert [(w.text, w.speaker) for s in out.segments for w in s.words] == [
        ("one", "Speaker 1"),
        ("two", "Speaker 2"),
        ("three", "Speaker 1"),
    ]
    assert out.speakers == ["Speaker 1", "Speaker 2"]
    named = assign_speakers(transcription(seg), TWO, names=["Ada", "Grace"])
    assert [s.speaker for s in named.segments] == ["Ada", "Grace", "Ada"]
    assert named.speakers == ["Ada", "Grace"]
    # Fewer names than speakers: the others are numbered by their place.
    few = assign_speakers(transcription(seg), TWO, names=["Ada"])
    assert few.speakers == ["Ada", "Speaker 2"]
    # A speaker who says nothing transcribed gets no label.
    three = [*TWO, Turn(10.0, 12.0, 2)]
    assert assign_speakers(transcription(seg), three).speakers == ["Speaker 1", "Speaker 2"]


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (["Ada", "Ada"], "speaker names must differ: Ada given twice"),
        (["Ada", " "], "speaker names must not be empty"),
        ("Ada", "names must be a list of names, not one string"),
    ],
)
def test_bad_names_are_refused(names, message):
    with pytest.raises(ValueError) as e:
        assign_speakers(transcription(aligned("a", [(0.1, 0.2)], 0, 1)), TWO, names=names)
    assert str(e.value) == message


def test_words_between_turns_and_without_duration():
    seg = aligned("gap instant late", [(2.03, 2.13), (3.0, 3.0), (7.0, 7.5)], 2.0, 8.0)
    out = assign_speakers(transcription(seg), TWO)
    words = [(w.text, w.speaker) for s in out.segments for w in s.words]
    # 2.03-2.13 lies in the gap between turns 0 (ends 2.0) and 1 (starts 2.2): the nearest is turn 0;
    # "instant" is at 3.0, inside turn 1; "late" is after every turn: the last speaker's.
    assert words == [("gap", "Speaker 1"), ("instant", "Speaker 2"), ("late", "Speaker 1")]


def test_overlapping_speech_keeps_the_dominant_speaker_and_is_marked():
    turns = [Turn(0.0, 3.0, 0), Turn(1.0, 1.8, 1), Turn(2.5, 5.0, 1)]
    seg = aligned(
        "alone crosstalk more edge after",
        [(0.2, 0.8), (1.1, 1.6), (1.9, 2.4), (2.6, 3.2), (3.5, 4.0)],
        0.0,
        4.5,
    )
    out = assign_speakers(transcription(seg), turns)
    words = [(w.text, w.speaker, w.overlap) for s in out.segments for w in s.words]
    assert words == [
        ("alone", "Speaker 1", False),
        ("crosstalk", "Speaker 1", True),  # both talk over all of it: the first speaker is kept
        ("more", "Speaker 1", False),
        ("edge", "Speaker 2", True),  # 0.4 s of its 0.6 s with both; the second talks longer in it
        ("after", "Speaker 2", False),
    ]
    assert [(s.text, s.speaker, s.overlap) for s in out.segments] == [
        ("alone crosstalk more", "Speaker 1", True),
        ("edge after", "Speaker 2", True),
    ]


def test_segments_without_word_timing_take_the_speaker_of_most_of_their_time():
    segs = [
        Segment(0.0, 2.5, "first", "English"),  # 2.0 s of speaker 0, 0.3 s of speaker 1
        Segment(2.0, 4.2, "second", "English"),
        Segment(3.3, 4.2, "third", "English"),  # 0.7 s of speaker 1, 0.6 s of speaker 0
        Segment(8.0, 9.0, "after", "English"),  # no turn: the nearest
    ]
    turns = [*TWO, Turn(3.5, 4.0, 0)]
    out = assign_speakers(transcription(*segs), turns)
    assert [(s.text, s.speaker, s.overlap) for s in out.segments] == [
        ("first", "Speaker 1", False),
        ("second", "Speaker 2", False),
        ("third", "Speaker 2", True),  # 0.5 s of its 0.9 s has both speakers
        ("after", "Speaker 1", False),
    ]
    assert [(s.start, s.end) for s in out.segments] == [(s.start, s.end) for s in segs]


def test_text_without_spaces_and_words_without_spans():
    chinese = aligned(
        "你好世界再见", [(0.5, 1.0), (1.2, 1.8), (2.5, 3.0)], 0.0, 3.5, cut=lambda t: ["你好", "世界", "再见"]
    )
    unplaced = aligned("Yes. No.", [(1.0, 1.5), (2.5, 3.0)], 0.5, 3.5)
    for w in unplaced.words:
        w.char_start = w.char_end = 0  # unknown spans: found by their text
    out = assign_speakers(transcription(chinese, unplaced), TWO)
    assert [(s.text, s.speaker) for s in out.segments] == [
        ("你好世界", "Speaker 1"),
        ("再见", "Speaker 2"),
        ("Yes.", "Speaker 1"),
        ("No.", "Speaker 2"),
    ]
    for s in out.segments:
        for w in s.words:
            assert s.text[w.char_start : w.char_end] == w.text


def test_no_turns_change_nothing():
    t = transcription(aligned("a b", [(0.1, 0.2), (0.3, 0.4)], 0, 1))
    assert assign_speakers(t, []) is t
    assert t.speakers == [] and all(s.speaker is None and not s.overlap for s in t.segments)


def test_split_at_speakers_leaves_one_speaker_alone():
    seg = aligned("a b", [(0.1, 0.2), (0.3, 0.4)], 0, 1)
    assert split_at_speakers(seg) == [seg]
    plain = Segment(0, 1, "x", "English")
    assert split_at_speakers(plain) == [plain]


# --------------------------------------------------------------------------------------------------
# RTTM
# --------------------------------------------------------------------------------------------------


def read_rttm(text: str) -> list[dict]:
    """RTTM as the NIST format defines it: ten space-separated fields per line."""
    rows = []
    for line in text.splitlines():
        fields = line.split(" ")
        assert len(fields) == 10, line
        kind, file_id, channel, start, duration, ortho, stype, name, conf, lookahead = fields
        assert kind == "SPEAKER" and channel == "1"
        assert (ortho, stype, conf, lookahead) == ("<NA>", "<NA>", "<NA>", "<NA>")
        rows.append({"file": file_id, "start": float(start), "duration": float(duration), "speaker": name})
    return rows


def test_rttm_of_turns_and_of_a_transcription():
    rows = read_rttm(rttm_lines("talk", [Turn(2.2, 4.0, 1), Turn(0.0, 2.0, 0)]))
    assert rows == [
        {"file": "talk", "start": 0.0, "duration": 2.0, "speaker": "Speaker_1"},
        {"file": "talk", "start": 2.2, "duration": 1.8, "speaker": "Speaker_2"},
    ]
    seg = aligned("Hi Bob. Hi Ada.", [(0.1, 0.5), (0.6, 1.0), (2.3, 2.6), (2.7, 3.1)], 0.0, 3.5)
    out = assign_speakers(transcription(seg), TWO, names=["Ada Lovelace", "Bob"])
    rows = read_rttm(rttm_lines("my talk", out))
    assert rows == [
        {"file": "my_talk", "start": 0.0, "duration": 1.0, "speaker": "Ada_Lovelace"},
        {"file": "my_talk", "start": 2.3, "duration": 1.2, "speaker": "Bob"},
    ]
    assert rttm_lines("x", []) == "" and rttm_lines("x", transcription(seg)) == ""


def test_turns_carry_warnings_and_compare_as_lists():
    turns = Turns([Turn(0.0, 1.0, 0)], ["note"])
    assert turns == [Turn(0.0, 1.0, 0)] and turns.warnings == ["note"] and turns.speaker_count == 1
    assert json.dumps([t.__dict__ for t in turns]) == '[{"start": 0.0, "end": 1.0, "speaker": 0}]'
