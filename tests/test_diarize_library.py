"""The diarizer around the library (mlx_qwen3asr.diarize): only speech is diarized, one speaker costs no
run, the speaker-count search is bounded, progress and estimates, the execution mode chosen for the
platform (through a stand-in speakrs), and model folders whose values cannot be right."""

from __future__ import annotations

import logging
import math
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from mlx_qwen3asr import diarize
from mlx_qwen3asr.diarize import (
    DiarizeOptions,
    DiarizeProgress,
    DiarizerLoadError,
    Turn,
    Turns,
    load_diarizer,
    loading,
    rttm_lines,
)
from mlx_qwen3asr.diarize import diarizer as running
from mlx_qwen3asr.diarize.turns import _wanted
from tools.make_checkpoint import DIARIZER_PRESET, PLDA_FILES, SEGMENTATION_FILE

RATE = 16000
MIN_SAMPLES = "wespeaker-voxceleb-resnet34.min_num_samples.txt"
CPU_FILES = [*PLDA_FILES, MIN_SAMPLES, SEGMENTATION_FILE, "wespeaker-multimask-tail.safetensors"]


# --------------------------------------------------------------------------------------------------
# A stand-in speakrs
# --------------------------------------------------------------------------------------------------


class SpeakrsError(Exception):
    def __init__(self, message: str, category: str = "model_load") -> None:
        super().__init__(message)
        self.message, self.category = message, category


class Config(SimpleNamespace):
    pass


class Pipeline:
    """Finds `count(threshold)` speakers, each over its own share of the audio, and records each run:
    (its length in seconds, its AHC threshold). `gate`, when set, holds each run until it is set."""

    def __init__(self, count=lambda threshold: 2, gate: threading.Event | None = None) -> None:
        self.count, self.gate, self.runs = count, gate, []
        self.pipeline_config = Config(
            activity=None,
            clustering=Config(ahc=Config(threshold=0.6), vbx=None, speaker_keep_threshold=None),
            merge_gap=None,
            reconstruct_method=None,
            smoothing_epsilon=None,
        )

    def diarize_samples(self, samples, *, pipeline_config=None, cancel_token=None):
        threshold = (pipeline_config or self.pipeline_config).clustering.ahc.threshold
        self.runs.append((samples.size / RATE, round(threshold, 4)))
        if self.gate is not None:
            self.gate.wait(10)
        n = self.count(threshold)
        seconds = samples.size / RATE
        share = seconds / n
        segments = [
            Config(start=k * share, end=(k + 1) * share, speaker=f"SPEAKER_{k:02d}") for k in range(n)
        ]
        return Config(segments=segments)


def stand_in_speakrs(modes=("CPU",), files=None, refuse=()) -> SimpleNamespace:
    """A speakrs module with these modes compiled in, `files` (mode -> model files; the CPU's by
    default), whose Pipeline.from_prepared refuses the modes in `refuse`."""
    files = {"CPU": CPU_FILES, **(files or {})}
    loaded = []

    def from_prepared(prepared):
        if prepared.mode in refuse:
            raise SpeakrsError(f"could not load the {prepared.mode} models")
        loaded.append(prepared.mode)
        return Pipeline()

    return SimpleNamespace(
        SpeakrsError=SpeakrsError,
        CancelToken=lambda: SimpleNamespace(cancel=lambda: None),
        AhcConfig=lambda threshold: Config(threshold=threshold),
        ClusteringConfig=Config,
        PipelineConfig=Config,
        available_modes=lambda: list(modes),
        required_model_files=lambda mode: list(files.get(mode, CPU_FILES)),
        prepare=lambda mode, model_dir=None: SimpleNamespace(mode=mode, model_dir=model_dir, revision=None),
        Pipeline=SimpleNamespace(from_prepared=from_prepared),
        loaded=loaded,
    )


def diarizer(pipeline: Pipeline) -> diarize.Diarizer:
    return diarize.Diarizer(pipeline, stand_in_speakrs(), "stand-in")


@pytest.fixture
def folder(tmp_path, checkpoints) -> Path:
    """A copy of the random-weight diarizer folder, to damage."""
    out = tmp_path / "diarizer"
    out.mkdir()
    for p in checkpoints(DIARIZER_PRESET).iterdir():
        (out / p.name).write_bytes(p.read_bytes())
    return out


# --------------------------------------------------------------------------------------------------
# Only speech is diarized
# --------------------------------------------------------------------------------------------------


def test_no_speech_costs_no_run():
    pipeline = Pipeline()
    d = diarizer(pipeline)
    silence = np.zeros(30 * RATE, np.float32)
    assert d(silence, speech=[]) == Turns() and pipeline.runs == []
    assert d(silence, speech=[(40.0, 50.0), (3.0, 3.0)]) == [] and pipeline.runs == []  # outside, empty
    assert d(silence, DiarizeOptions(num_speakers=1), speech=[]) == []


def test_speech_stretches_are_joined_and_turns_mapped_back():
    pipeline = Pipeline(count=lambda threshold: 3)
    d = diarizer(pipeline)
    audio = np.zeros(60 * RATE, np.float32)
    speech = [(30.0, 36.0), (2.0, 6.0), (6.2, 8.0)]  # unsorted; the last two are one stretch (0.2 s apart)
    turns = d(audio, speech=speech)
    # One run on the two stretches (6 s each) with a gap of 0.5 s between them: 12.5 s.
    assert running._JOIN_GAP == 0.5 and pipeline.runs == [(12.5, 0.6)]
    # The three speakers' thirds of the joined audio, mapped back and cut at the join: speaker 1 talks
    # on both sides of it, nothing is in the gap or outside the speech.
    assert turns == [Turn(2.0, 6.167, 0), Turn(6.167, 8.0, 1), Turn(30.0, 31.833, 1), Turn(31.833, 36.0, 2)]
    for t in turns:
        assert any(a <= t.start < t.end <= b for a, b in [(2.0, 8.0), (30.0, 36.0)])
    with pytest.raises(ValueError, match="not finite"):
        d(audio, speech=[(1.0, math.nan)])


def test_one_speaker_needs_no_run():
    pipeline = Pipeline()
    d = diarizer(pipeline)
    audio = np.ones(10 * RATE, np.float32) * 0.1
    for options in (DiarizeOptions(num_speakers=1), DiarizeOptions(max_speakers=1)):
        assert d(audio, options) == [Turn(0.0, 10.0, 0)]
        turns = d(audio, options, speech=[(1.0, 2.5), (7.0, 9.0)])
        assert turns == [Turn(1.0, 2.5, 0), Turn(7.0, 9.0, 0)] and turns.warnings == []
    assert pipeline.runs == []


def test_turns_of_zero_length_are_dropped():
    """A span shorter than a millisecond rounds to nothing: no turn (and no RTTM line of 0.000)."""
    pieces = [(0, 10 * RATE, 0)]
    turns = running._turns([(1.0001, 1.0004, "A"), (2.0, 3.0, "B")], pieces)
    assert turns == [Turn(2.0, 3.0, 0)]
    assert " 0.000 " not in rttm_lines("f", turns)
    # A span over a join gives a turn on each side; the part in the gap is no turn.
    pieces = [(RATE, 2 * RATE, 0), (5 * RATE, 6 * RATE, RATE + RATE // 2)]
    assert running._turns([(0.5, 2.0, "A"), (1.0, 1.5, "B")], pieces) == [
        Turn(1.5, 2.0, 0),
        Turn(5.0, 5.5, 0),
    ]


# --------------------------------------------------------------------------------------------------
# The speaker-count search
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", [1, 2, 3, 5, 8, 9])
def test_the_search_makes_at_most_two_more_runs(target):
    """However finely the count follows the threshold, a count asked for costs at most two more runs."""
    pipeline = Pipeline(count=lambda threshold: max(1, round(10 - 4.5 * threshold)))  # 7 at the default
    d = diarizer(pipeline)
    turns = d(np.zeros(5 * RATE, np.float32), DiarizeOptions(min_speakers=target, max_speakers=target + 1))
    assert len(pipeline.runs) <= 1 + running._MAX_RETRIES == 3
    assert turns.speaker_count >= 1


def test_a_far_end_that_does_not_help_stops_the_search_and_the_warning_reads_right():
    pipeline = Pipeline(count=lambda threshold: 3)
    d = diarizer(pipeline)
    audio = np.zeros(5 * RATE, np.float32)
    turns = d(audio, DiarizeOptions(max_speakers=2))
    assert [t for _, t in pipeline.runs] == [0.6, 2.0]
    assert turns.warnings == ["asked for at most 2 speakers, the clustering found 3 at every threshold tried"]
    pipeline.runs.clear()
    turns = d(audio, DiarizeOptions(min_speakers=4))
    assert [t for _, t in pipeline.runs] == [0.6, 0.0]
    assert turns.warnings == [
        "asked for at least 4 speakers, the clustering found 3 at every threshold tried"
    ]
    assert d(audio, DiarizeOptions(num_speakers=2)).warnings == [
        "asked for 2 speakers, the clustering found 3 at every threshold tried"
    ]
    assert d(audio, DiarizeOptions(min_speakers=4, max_speakers=6)).warnings == [
        "asked for 4 to 6 speakers, the clustering found 3 at every threshold tried"
    ]


def test_count_ranges_in_words():
    assert _wanted(1, 1) == "1 speaker"
    assert _wanted(1, 2) == "at most 2 speakers"
    assert _wanted(1, 1.0) == "1 speaker"
    assert _wanted(2, math.inf) == "at least 2 speakers"
    assert _wanted(3, 3) == "3 speakers"


# --------------------------------------------------------------------------------------------------
# Progress and estimates
# --------------------------------------------------------------------------------------------------


def watch(d, run) -> tuple[list[DiarizeProgress], list]:
    """Snapshots of d.progress() taken while run() goes on in another thread, and run()'s outcome."""
    outcome: list = []
    worker = threading.Thread(target=lambda: outcome.append(run()))
    worker.start()
    seen = []
    while worker.is_alive():
        p = d.progress()
        if p is not None:
            seen.append(p)
        time.sleep(0.005)
    worker.join()
    return seen, outcome


def test_progress_while_a_call_runs():
    gate = threading.Event()
    pipeline = Pipeline(gate=gate)
    d = diarizer(pipeline)
    assert d.progress() is None
    assert d.estimate(0) == 0.0
    assert d.estimate(70.0) == pytest.approx(running._PRIOR_SPEED * 61)  # a window per second past the first
    # Before any run, the prior of its mode: an accelerated one is far faster.
    assert diarize.Diarizer(Pipeline(), None, "x", mode="CUDA").estimate(70.0) < d.estimate(70.0) / 100
    threading.Timer(0.3, gate.set).start()
    seen, outcome = watch(d, lambda: d(np.zeros(30 * RATE, np.float32), speech=[(0.0, 12.0), (20.0, 24.0)]))
    assert outcome[0].speaker_count == 2 and d.progress() is None
    assert seen and all(p.audio_seconds == 16.0 and p.attempt == 1 and p.attempts == 1 for p in seen)
    assert all(0.0 <= p.fraction < 1.0 and p.seconds_left > 0 for p in seen)
    assert [p.elapsed for p in seen] == sorted(p.elapsed for p in seen)
    assert [p.fraction for p in seen] == sorted(p.fraction for p in seen)
    # The speed is now the run's: about 0.3 s for 7.5 windows (16.5 s joined).
    assert 0.2 / 7.5 < d.speed < 2.0 / 7.5
    assert d.estimate(100.0) == pytest.approx(d.speed * 91)


def test_progress_counts_the_attempts_of_a_count_search():
    gate = threading.Event()
    pipeline = Pipeline(count=lambda threshold: 3, gate=gate)
    d = diarizer(pipeline)
    d._spent, d._worked = 1.0, 1.0  # a second per window: the runs here take far less
    threading.Timer(0.3, gate.set).start()
    seen, outcome = watch(d, lambda: d(np.zeros(12 * RATE, np.float32), DiarizeOptions(max_speakers=2)))
    assert outcome[0].warnings and len(pipeline.runs) == 2
    assert {p.attempts for p in seen} == {3}
    assert seen[0].attempt == 1 and seen[0].seconds_left > 2 * 3 * 0.5  # the runs the search may make
    assert [p.fraction for p in seen] == sorted(p.fraction for p in seen)


def test_progress_past_its_estimate_keeps_moving_below_one():
    d = diarizer(Pipeline())
    now = time.monotonic()
    for late in (0.5, 5.0, 50.0):  # a run estimated at 1 s, `late` seconds in
        d._call = (now - late, 10.0, 1.0, 1, 1, now - late)
        p = d.progress()
        assert 0.0 < p.fraction < 1.0 and p.seconds_left > 0
    assert d.progress().fraction > 0.9
    d._call = None


# --------------------------------------------------------------------------------------------------
# The execution mode
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def platform_is(monkeypatch):
    def set_to(system: str, machine: str, driver: bool = False, **speakrs):
        fake = stand_in_speakrs(**speakrs)
        monkeypatch.setattr(loading, "_speakrs", lambda: fake)
        monkeypatch.setattr(loading.sys, "platform", system)
        monkeypatch.setattr(loading.platform, "machine", lambda: machine)
        monkeypatch.setattr(loading, "_nvidia_driver", lambda: driver)
        return fake

    return set_to


@pytest.mark.parametrize(
    ("system", "machine", "driver", "modes", "chosen"),
    [
        ("darwin", "arm64", False, ["CPU", "CoreML", "CoreMLFast"], "CoreML"),
        ("darwin", "arm64", False, ["CPU"], "CPU"),
        ("darwin", "x86_64", False, ["CPU", "CoreML"], "CPU"),
        ("linux", "x86_64", True, ["CPU", "CUDA", "CUDAFast"], "CUDA"),
        ("linux", "x86_64", False, ["CPU", "CUDA", "CUDAFast"], "CPU"),
        ("linux", "aarch64", True, ["CPU"], "CPU"),
        ("win32", "AMD64", True, ["CPU", "CUDA"], "CPU"),
    ],
)
def test_the_platforms_accelerated_mode_is_chosen(
    folder, platform_is, caplog, system, machine, driver, modes, chosen
):
    fake = platform_is(system, machine, driver, modes=modes)
    with caplog.at_level(logging.INFO, logger=diarize.__name__):
        d = load_diarizer(folder)
    assert d.mode == chosen and fake.loaded == [chosen]
    assert caplog.records == []  # silently
    assert load_diarizer(folder, mode="cpu").mode == "CPU"  # asked for: speakrs's spelling


def test_an_accelerated_mode_that_does_not_load_falls_back_to_the_cpu_in_one_line(
    folder, platform_is, caplog
):
    fake = platform_is("darwin", "arm64", modes=["CPU", "CoreML"], refuse=["CoreML"])
    with caplog.at_level(logging.INFO, logger=diarize.__name__):
        d = load_diarizer(folder)
    assert d.mode == "CPU" and fake.loaded == ["CPU"]
    assert len(caplog.records) == 1
    line = caplog.records[0].getMessage()
    assert "CoreML" in line and "could not load the CoreML models" in line and "CPU" in line
    assert "\n" not in line
    # Asked for by name, it is not replaced: the error says why.
    with pytest.raises(DiarizerLoadError, match="could not load the CoreML models"):
        load_diarizer(folder, mode="CoreML")


def test_a_folder_lacking_the_modes_files_falls_back_and_is_checked_for_them(folder, platform_is, caplog):
    coreml = [*CPU_FILES, "segmentation-3.0.mlmodelc"]
    fake = platform_is("darwin", "arm64", modes=["CPU", "CoreML"], files={"CoreML": coreml})
    with caplog.at_level(logging.INFO, logger=diarize.__name__):
        d = load_diarizer(folder)
    assert d.mode == "CPU" and fake.loaded == ["CPU"]
    assert len(caplog.records) == 1 and "lacks segmentation-3.0.mlmodelc" in caplog.records[0].getMessage()
    with pytest.raises(DiarizerLoadError) as e:
        load_diarizer(folder, mode="CoreML")
    assert (
        str(e.value) == f"diarizer folder {folder} lacks segmentation-3.0.mlmodelc for speakrs's CoreML mode"
    )
    (folder / "segmentation-3.0.mlmodelc").mkdir()  # a compiled CoreML model is a folder
    caplog.clear()
    assert load_diarizer(folder).mode == "CoreML" and caplog.records == []
    # A folder that is not there is no reason to try the CPU.
    with pytest.raises(DiarizerLoadError, match="does not exist"):
        load_diarizer(folder / "nowhere")


# --------------------------------------------------------------------------------------------------
# Values no model holds
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_weights_that_are_not_finite_are_refused_naming_the_file(folder, platform_is, bad):
    platform_is("linux", "x86_64")
    tensors = load_file(str(folder / SEGMENTATION_FILE))
    tensors["linear.0.bias"][3] = bad
    save_file(tensors, str(folder / SEGMENTATION_FILE))
    with pytest.raises(DiarizerLoadError) as e:
        load_diarizer(folder)
    assert (
        str(e.value)
        == f"diarizer folder {folder}: {SEGMENTATION_FILE} holds weights that are not finite numbers"
    )
    (folder / SEGMENTATION_FILE).unlink()
    tensors["linear.0.bias"][3] = 0.0
    save_file(tensors, str(folder / SEGMENTATION_FILE))
    plda = np.load(folder / "plda_psi.npy")
    plda[0] = bad
    np.save(folder / "plda_psi.npy", plda)
    with pytest.raises(DiarizerLoadError, match=r"plda_psi\.npy holds weights that are not finite numbers$"):
        load_diarizer(folder)


@pytest.mark.parametrize("value", ["0", "-400", "100000000000", "4e2", "", "many"])
def test_a_shortest_embedding_input_out_of_range_is_refused(folder, platform_is, value):
    platform_is("linux", "x86_64")
    (folder / MIN_SAMPLES).write_text(value + "\n")
    with pytest.raises(DiarizerLoadError) as e:
        load_diarizer(folder)
    message = str(e.value)
    assert message.startswith(f"diarizer folder {folder}: {MIN_SAMPLES} holds {value!r}, not a sample count")
    assert "\n" not in message
    (folder / MIN_SAMPLES).write_text("400\n")  # the preset's, as the real models take
    assert load_diarizer(folder).mode == "CPU"


# --------------------------------------------------------------------------------------------------
# The real library (the random-weight preset)
# --------------------------------------------------------------------------------------------------


def test_the_library_diarizes_only_the_speech_given(checkpoints):
    pytest.importorskip("speakrs", reason="speakrs (the diarize extra, Python 3.11+) is not installed")
    d = load_diarizer(checkpoints(DIARIZER_PRESET))
    assert d.mode == "CPU"  # no accelerator here
    audio = np.zeros(30 * RATE, np.float32)
    rng = np.random.default_rng(0)
    speech = [(2.0, 5.0), (20.0, 23.5)]
    for a, b in speech:
        audio[int(a * RATE) : int(b * RATE)] = 0.2 * rng.standard_normal(int((b - a) * RATE))
    began = time.perf_counter()
    assert d(audio, speech=[]) == []  # 30 s without speech: no run
    assert time.perf_counter() - began < 0.5
    turns = d(audio, speech=speech)
    assert turns and all(any(a <= t.start < t.end <= b for a, b in speech) for t in turns)
    assert d.progress() is None and d.speed != running._PRIOR_SPEED  # timed


def test_the_library_would_load_weights_that_are_not_finite(folder):
    """speakrs takes NaN weights without a word; the check before it refuses them."""
    speakrs = pytest.importorskip(
        "speakrs", reason="speakrs (the diarize extra, Python 3.11+) is not installed"
    )
    tensors = load_file(str(folder / SEGMENTATION_FILE))
    tensors["linear.0.bias"][:] = np.nan
    save_file(tensors, str(folder / SEGMENTATION_FILE))
    speakrs.Pipeline.from_prepared(speakrs.prepare("CPU", model_dir=folder))  # loads
    with pytest.raises(DiarizerLoadError, match="not finite"):
        load_diarizer(folder)
