"""Faults at every stage of transcription fail exactly the inputs whose work they were doing: each gets a
result carrying the error, the others are transcribed as without the fault, and the scheduler, the
Engine and the mlxasr command always come to an end. Every run here is bounded by a timeout, so a
scheduler that no longer reaches idle fails the test instead of hanging it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from dataclasses import replace

import pytest
import soundfile as sf
from reference import test_signal
from scripted import through_cli

import mlx_qwen3asr
import mlx_qwen3asr.cli.main as cli_main
import mlx_qwen3asr.cli.run as cli_run
from mlx_qwen3asr.model.cache import KVCache
from mlx_qwen3asr.pipeline.engine import Engine
from mlx_qwen3asr.pipeline.inputs import InputOptions
from mlx_qwen3asr.pipeline.parts import Parts
from mlx_qwen3asr.pipeline.scheduler import Scheduler
from mlx_qwen3asr.text.prompt import prompt_prefix_ids

LIMIT = 120  # seconds any one run may take here (a few on a 2-core CPU)
SECONDS = {"a": 6.0, "b": 2.5, "c": 4.0}  # one segment each, of different lengths
# Rows stop after a fixed number of tokens that depends on the segment's length (a few steps).
SHORT = Parts(budget=lambda seconds: 2 + int(seconds))


class Injected(RuntimeError):
    """The fault the tests inject."""


def bounded(fn, seconds: float = LIMIT):
    """fn() on a thread of its own, given `seconds` to finish."""
    out: dict = {}

    def target():
        try:
            out["value"] = fn()
        except BaseException as e:  # handed to the test's thread
            out["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s: the run never came to an end"
    if "error" in out:
        raise out["error"]
    return out["value"]


@pytest.fixture(scope="module")
def model(checkpoints):
    return mlx_qwen3asr.load(checkpoints("tiny"))


@pytest.fixture(scope="module")
def aligner(checkpoints):
    return mlx_qwen3asr.load(checkpoints("aligner-tiny"))


@pytest.fixture(scope="module")
def wavs(tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("inputs")
    paths = {}
    for seed, (key, seconds) in enumerate(SECONDS.items()):
        paths[key] = str(folder / f"{key}.wav")
        sf.write(paths[key], test_signal(seconds, seed=seed), 16000)
    return paths


@pytest.fixture(autouse=True)
def no_loop_check(monkeypatch):
    """Rows run to their budget whatever they decode (the same work with or without a fault)."""
    monkeypatch.setattr("mlx_qwen3asr.model.batch.LOOP_CHECK_EVERY", 10**9)


def run(model, inputs: dict, *, on_segment=None, parts: Parts = SHORT, **kwargs) -> dict:
    """Every input through one Scheduler until it is idle; the results by key."""
    sched = Scheduler(model, on_segment=on_segment, parts=parts, **kwargs)
    for key, (audio, options) in inputs.items():
        sched.submit(key, audio, options)
    results: dict = {}

    def loop():
        while not sched.idle:
            for res in sched.run_once():
                assert res.index not in results, "an input finished twice"
                results[res.index] = res
        return results

    try:
        return bounded(loop)
    finally:
        sched.close()


def texts(transcription):
    return [(s.start, s.end, s.text) for s in transcription.segments]


@pytest.fixture(scope="module")
def clean(model, wavs):
    """What each input gives with no fault (budgets as SHORT sets them)."""
    mp = pytest.MonkeyPatch()
    mp.setattr("mlx_qwen3asr.model.batch.LOOP_CHECK_EVERY", 10**9)
    try:
        results = run(model, {k: (p, InputOptions()) for k, p in wavs.items()}, batch_size=1)
    finally:
        mp.undo()
    assert all(r.error is None for r in results.values())
    return {k: texts(r.transcription) for k, r in results.items()}


class Owners:
    """The input (its file) that each decoded signal, mel spectrogram, encoder output and batch row
    belongs to (faults are aimed at one input), recorded by stages wrapped around `base`: `parts`."""

    def __init__(self, base: Parts = SHORT):
        self.of: dict = {}
        owners = self

        def prepare(*args, **kwargs):
            prepared = base.prepare(*args, **kwargs)
            owners.of[id(prepared.wav)] = prepared.source
            return prepared

        def mel(signal, span):
            value = base.mel(signal, span)
            owners.of[id(value)] = owners.of.get(id(signal))
            return value

        def encode(model, mels):
            features = base.encode(model, mels)
            for m, f in zip(mels, features):
                owners.of[id(f)] = owners.of.get(id(m))
            return features

        class Batch(base.batch):
            def add(self, prompts, audio_features, max_new_tokens, keys):
                for key, f in zip(keys, audio_features):  # a row is keyed by its segment's task
                    owners.of[key] = owners.of.get(id(f))
                return super().add(prompts, audio_features, max_new_tokens, keys)

        self.parts = replace(base, prepare=prepare, mel=mel, encode=encode, batch=Batch)

    def source(self, obj) -> str | None:
        """The file a signal, a mel spectrogram or encoder output came from."""
        return self.of.get(id(obj))

    def any_of(self, objects, source: str) -> bool:
        return any(self.source(o) == source for o in objects)

    def any_row(self, rows, source: str) -> bool:
        """Whether a batch row (by its key) is of the input read from `source`."""
        return any(self.of.get(row) == source for row in rows)


def inject(stage: str, bad: str, wavs, model, owners: Owners | None = None) -> tuple[dict, Parts]:
    """Make `stage` fail for input `bad`: options per input (the prefix fault needs a context) and the
    parts to run with."""
    options = {k: InputOptions() for k in wavs}
    owners = owners or Owners()
    parts = owners.parts
    if stage == "load":

        def load(audio):
            if str(audio) == wavs[bad]:
                raise Injected("cannot read")
            return parts.load(audio)

        return options, replace(parts, load=load)
    if stage == "mel":

        def mel(signal, span):
            if owners.source(signal) == wavs[bad]:
                raise Injected("no mel")
            return parts.mel(signal, span)

        return options, replace(parts, mel=mel)
    if stage == "encoder":

        def encode(model, mels):
            if owners.any_of(mels, wavs[bad]):
                raise Injected("encoder failed")
            return parts.encode(model, mels)

        return options, replace(parts, encode=encode)
    if stage == "prefix":
        # The bad input has a context of its own, whose prompt start cannot be prefilled.
        options[bad] = InputOptions(context="a context of its own")
        bad_ids = prompt_prefix_ids(model.tokenizer, options[bad].context)

        def prefill(net, ids):
            if list(ids) == bad_ids:
                raise Injected("prefix prefill failed")
            return parts.prefill(net, ids)

        return options, replace(parts, prefill=prefill)
    if stage in ("prefill", "step"):

        class Faulty(parts.batch):
            def add(self, prompts, audio_features, max_new_tokens, keys):
                if stage == "prefill" and owners.any_of(audio_features, wavs[bad]):
                    raise Injected("prefill failed")
                return super().add(prompts, audio_features, max_new_tokens, keys)

            def step(self):
                if stage == "step" and owners.any_row(self.keys, wavs[bad]):
                    raise Injected("decoding step failed")
                return super().step()

        return options, replace(parts, batch=Faulty)
    if stage == "assemble":

        def assemble(prepared, *args, **kwargs):
            if prepared.source == wavs[bad]:
                raise Injected("cannot assemble")
            return parts.assemble(prepared, *args, **kwargs)

        return options, replace(parts, assemble=assemble)
    raise AssertionError(stage)


def inject_text(bad: str, wavs, monkeypatch) -> None:
    """Making the text of a row fails for input `bad` (the scheduler's own step, not a part)."""
    real_finished = Scheduler._finished

    def finished(self, task, gen):
        if task.pending.prepared.source == wavs[bad]:
            raise Injected("no text")
        return real_finished(self, task, gen)

    monkeypatch.setattr(Scheduler, "_finished", finished)


def faulty(stage: str, bad: str, wavs, model, monkeypatch) -> tuple[dict, Parts]:
    if stage == "text":
        inject_text(bad, wavs, monkeypatch)
        return {k: InputOptions() for k in wavs}, SHORT
    return inject(stage, bad, wavs, model)


STAGES = ["load", "mel", "encoder", "prefix", "prefill", "step", "text", "assemble", "on_segment"]


@pytest.mark.parametrize("stage", STAGES)
def test_a_fault_at_any_stage_fails_only_its_input(model, wavs, clean, monkeypatch, stage):
    """One segment per batch: the fault touches the bad input alone, and the run ends."""
    bad = "b"
    if stage == "on_segment":
        options, parts = {k: InputOptions() for k in wavs}, SHORT

        def on_segment(key, seg):
            if key == bad:
                raise Injected("the callback failed")

    else:
        options, parts = faulty(stage, bad, wavs, model, monkeypatch)
        on_segment = None
    inputs = {k: (p, options[k]) for k, p in wavs.items()}
    results = run(model, inputs, on_segment=on_segment, batch_size=1, parts=parts)
    assert sorted(results) == sorted(wavs)
    assert isinstance(results[bad].error, Injected) and results[bad].transcription is None
    for key in wavs:
        if key != bad:
            assert results[key].error is None, (key, results[key].error)
            assert texts(results[key].transcription) == clean[key]


@pytest.mark.parametrize("stage", ["mel", "encoder", "prefill", "join"])
def test_a_fault_in_segments_joining_a_running_batch_spares_the_running_rows(
    model, wavs, clean, monkeypatch, stage
):
    """Batches of 2: a and c start together, b joins when c finishes while a still runs. A fault in b's
    mel, encoding or prefill fails b alone; a join that fails part-way has rewritten a's cache too, so a
    fails with it (and the batch it leaves behind is empty, not inconsistent)."""
    bad = "b"
    owners = Owners()
    parts = owners.parts
    joins = []

    def name(source):
        return os.path.basename(source).removesuffix(".wav")

    if stage in ("mel", "encoder"):
        _, parts = inject(stage, bad, wavs, model, owners)
    real_stack = KVCache.stack.__func__

    class Recording(parts.batch):
        def add(self, prompts, audio_features, max_new_tokens, keys):
            joining = sorted(name(owners.source(f)) for f in audio_features)
            joins.append((joining, sorted(name(owners.of[k]) for k in self.keys)))
            if owners.any_of(audio_features, wavs[bad]) and stage == "prefill":
                raise Injected("prefill failed")
            if owners.any_of(audio_features, wavs[bad]) and stage == "join":
                stacked = []

                def stack(cls, caches, capacity=0):
                    if stacked:
                        raise Injected("join failed")
                    stacked.append(1)
                    return real_stack(cls, caches, capacity)

                monkeypatch.setattr(KVCache, "stack", classmethod(stack))
                try:
                    return super().add(prompts, audio_features, max_new_tokens, keys)
                finally:
                    assert len(self) == 0 and self.cache is None  # the failed join left it empty
                    monkeypatch.setattr(KVCache, "stack", classmethod(real_stack))
            return super().add(prompts, audio_features, max_new_tokens, keys)

    inputs = {k: (p, InputOptions()) for k, p in wavs.items()}
    results = run(model, inputs, batch_size=2, parts=replace(parts, batch=Recording))
    assert sorted(results) == sorted(wavs)
    if stage in ("prefill", "join"):
        assert joins[:2] == [(["a", "c"], []), (["b"], ["a"])]  # b joined while a ran
    assert isinstance(results["b"].error, Injected)
    assert texts(results["c"].transcription) == clean["c"]
    if stage == "join":
        assert results["a"].error is results["b"].error
    else:
        assert texts(results["a"].transcription) == clean["a"]


def no_temporary_folder(model, mels):
    raise RuntimeError("filesystem error: temp_directory_path: No such file or directory")


def test_a_fault_of_every_batch_fails_every_input_and_the_run_ends(model, wavs):
    """As when MLX cannot compile its kernels (TMPDIR missing, full or read-only): every encoder call
    raises; each input fails once, with that error."""
    inputs = {k: (p, InputOptions()) for k, p in wavs.items()}
    inputs["array"] = (test_signal(40.0, seed=9), InputOptions())  # two segments
    for batch_size in (None, 1):
        results = run(model, inputs, batch_size=batch_size, parts=replace(SHORT, encode=no_temporary_folder))
        assert sorted(results) == sorted(inputs)
        assert all("temp_directory_path" in str(r.error) for r in results.values())


def test_a_fault_of_the_aligner_leaves_the_text_with_estimated_timing(model, aligner, wavs):
    from scripted import script_batches

    calls = []

    def align_segments(*args, **kwargs):
        calls.append(len(args[1]))
        raise Injected("aligner failed")

    # Rows that end (random weights run to their token budget, and such rows are not aligned).
    record = script_batches(lambda prompt: model.tokenizer.encode("language English<asr_text>So it goes."))
    parts = replace(SHORT, batch=record.batch, align=align_segments)
    options = InputOptions(align=True)
    results = run(
        model, {k: (p, options) for k, p in wavs.items()}, aligner=aligner, batch_size=2, parts=parts
    )
    assert calls and sum(calls) == len(wavs)
    for res in results.values():
        assert res.error is None
        assert any("the aligner failed (Injected: aligner failed)" in w for w in res.transcription.warnings)
        assert all(s.timing != "aligned" for s in res.transcription.segments)


# --- the server's Engine ---------------------------------------------------------------------------


@pytest.mark.parametrize("stage", [s for s in STAGES if s != "on_segment"])
def test_engine_a_fault_at_any_stage_fails_only_its_job(model, wavs, clean, monkeypatch, stage):
    bad = "b"
    options, parts = faulty(stage, bad, wavs, model, monkeypatch)
    engine = Engine(model, batch_size=1, vad=False, parts=parts)
    try:
        jobs = {k: engine.submit(p, context=options[k].context) for k, p in wavs.items()}
        with pytest.raises(Injected):
            jobs[bad].result(timeout=LIMIT)
        for key, job in jobs.items():
            if key != bad:
                assert texts(job.result(timeout=LIMIT)) == clean[key]
        streamed = list(jobs[bad].segments(timeout=LIMIT))  # the failed job's stream ends
        assert streamed == [] or stage == "assemble"  # its segment was done before the fault
    finally:
        engine.close()


def test_engine_answers_every_job_when_every_batch_fails_and_goes_on(model, wavs, clean):
    broken = [True]

    def encode(model, mels):
        if broken[0]:
            no_temporary_folder(model, mels)
        return SHORT.encode(model, mels)

    engine = Engine(model, vad=False, parts=replace(SHORT, encode=encode))
    try:
        jobs = [engine.submit(p) for p in wavs.values()]
        for job in jobs:
            with pytest.raises(RuntimeError, match="temp_directory_path"):
                job.result(timeout=LIMIT)
        broken[0] = False  # the fault is gone
        assert texts(engine.submit(wavs["a"]).result(timeout=LIMIT)) == clean["a"]
        assert engine.queued_seconds() == 0
    finally:
        engine.close()


def test_engine_a_job_whose_submission_fails_on_its_thread_fails_alone(model, wavs, clean, monkeypatch):
    real_submit = Scheduler.submit

    def submit(self, key, audio, options):
        if audio == wavs["b"]:
            raise Injected("refused")
        return real_submit(self, key, audio, options)

    monkeypatch.setattr(Scheduler, "submit", submit)
    engine = Engine(model, batch_size=1, vad=False, parts=SHORT)
    try:
        bad, good = engine.submit(wavs["b"]), engine.submit(wavs["a"])
        with pytest.raises(Injected):
            bad.result(timeout=LIMIT)
        assert texts(good.result(timeout=LIMIT)) == clean["a"]
    finally:
        engine.close()


# --- the mlxasr command ------------------------------------------------------------------------------


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("mlxasr: error:")]


def test_cli_with_an_unusable_temporary_folder_ends_with_one_error_per_file(checkpoints, tmp_path):
    """MLX compiles its kernels in TMPDIR: when it is missing every batch fails; the command must end,
    with one line per file and a failure status, instead of spinning forever."""
    for key, seconds in SECONDS.items():
        sf.write(tmp_path / f"{key}.wav", test_signal(seconds, seed=1), 16000)
    env = dict(os.environ, TMPDIR=str(tmp_path / "missing" / "tmp"))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlx_qwen3asr.cli",
            "--no-vad",
            str(tmp_path),
            "--txt",
            "--model",
            str(checkpoints("tiny")),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=LIMIT,
    )
    assert proc.returncode == 1, proc.stderr
    lines = error_lines(proc.stderr)
    assert len(lines) == len(SECONDS)
    for key in SECONDS:
        assert sum(f"{key}.wav: " in line for line in lines) == 1
    assert all("temp_directory_path" in line for line in lines)
    assert not list(tmp_path.glob("*.txt"))


def test_cli_faults_in_one_file_leave_the_others_written(checkpoints, tmp_path, monkeypatch, capsys):
    """The encoder fails for b.wav and writing fails for c.wav: a.wav is still transcribed and written;
    each failed file has one error line; the status says some failed."""
    paths = {}
    for seed, (key, seconds) in enumerate(SECONDS.items()):
        paths[key] = str(tmp_path / f"{key}.wav")
        sf.write(paths[key], test_signal(seconds, seed=seed), 16000)
    _, parts = inject("encoder", "b", paths, None)
    through_cli(monkeypatch, parts)
    real_write = cli_run.write_outputs

    def write_outputs(job, *args, **kwargs):
        if str(job.path) == paths["c"]:
            raise OSError(28, "No space left on device", str(job.path))
        return real_write(job, *args, **kwargs)

    monkeypatch.setattr(cli_run, "write_outputs", write_outputs)
    argv = ["--no-vad", str(tmp_path), "--txt", "--batch-size", "1", "--model", str(checkpoints("tiny"))]
    status = bounded(lambda: cli_main.main(argv))
    err = capsys.readouterr().err
    assert status == 1
    lines = error_lines(err)
    assert len(lines) == 2
    assert sum("b.wav: Injected: encoder failed" in line for line in lines) == 1
    assert sum("c.wav: cannot write output" in line and "no space left" in line for line in lines) == 1
    assert (tmp_path / "a.txt").is_file() and not (tmp_path / "b.txt").exists()
    assert not (tmp_path / "c.txt").exists()
