"""Progress: reported as the work is done (each decoding step), not only as segments come out in order."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pytest
import soundfile as sf
from scripted import through_cli

import mlx_qwen3asr
import mlx_qwen3asr.cli.reporter as reporter
from mlx_qwen3asr.audio.signal import is_silent
from mlx_qwen3asr.cli.main import main
from mlx_qwen3asr.model.generate import Generation
from mlx_qwen3asr.pipeline.parts import Parts
from mlx_qwen3asr.pipeline.transcribe import transcribe_stream

RATE = 16000


@pytest.fixture(scope="module")
def model(checkpoints):
    return mlx_qwen3asr.load(checkpoints("tiny"))


def noise_with_pauses(seconds: list[float], seed: int) -> np.ndarray:
    """Noise in pieces of these lengths, 0.2 s of silence between them: the cutter cuts in the pauses."""
    rng = np.random.default_rng(seed)
    parts = []
    for i, s in enumerate(seconds):
        if i:
            parts.append(np.zeros(int(0.2 * RATE), np.float32))
        parts.append((rng.standard_normal(int(s * RATE)) * 0.1).astype(np.float32))
    return np.concatenate(parts)


@dataclass
class _Row:
    key: object
    script: list[int]
    budget: int
    tokens: list[int] = field(default_factory=list)


def speaking_batches(tokenizer, before_step=None) -> type:
    """A decoding batch whose rows 'say' words, a third as many as the row's audio tokens (about 4 a
    second of audio, as speech), one token a step, then end; before_step() runs before each step."""
    pad = tokenizer.token_to_id("<|audio_pad|>")
    header = tokenizer.encode("language English<asr_text>")
    word = tokenizer.encode(" word")

    class Speaking:
        def __init__(self, net, eos_ids, *, prefix=None, keep_logits=False, header=None):
            self.rows: list[_Row] = []

        def __len__(self) -> int:
            return len(self.rows)

        @property
        def keys(self):
            return [r.key for r in self.rows]

        def add(self, prompts, audio_features, max_new_tokens, keys):
            for key, prompt, budget in zip(keys, prompts, max_new_tokens):
                self.rows.append(_Row(key, header + word * (list(prompt).count(pad) // 3), int(budget)))
            return []

        def step(self):
            if before_step is not None:
                before_step()
            done, still = [], []
            for r in self.rows:
                if len(r.tokens) == len(r.script):  # the end token
                    done.append((r.key, Generation(r.tokens, truncated=False, repetitive=False)))
                else:
                    r.tokens.append(r.script[len(r.tokens)])
                    still.append(r)
            self.rows = still
            return done

        def row_progress(self):
            return [(r.key, len(r.tokens), r.budget) for r in self.rows]

        def drop(self, keys):
            self.rows = [r for r in self.rows if r.key not in keys]

    return Speaking


def test_progress_rises_with_each_step_across_interleaved_inputs(model):
    """16 inputs of 3 segments (two long, a short tail) decoded 8 rows at a time, longest first: rows of
    several inputs interleave and no input finishes before its tail, decoded last."""
    inputs = [noise_with_pauses([3.7, 3.7, 0.6 + 0.1 * (i % 5)], seed=i) for i in range(16)]
    durations = [len(a) / RATE for a in inputs]
    total = sum(durations)
    per_input = [0.0] * len(inputs)
    now = {"work": 0.0, "segments": 0.0}  # progress by on_progress, and as on_segment would give it
    steps: list[tuple[float, float]] = []  # both, before each decoding step
    before_first_done: list[tuple[float, float]] = []

    def on_progress(index, seconds):
        assert seconds > 0
        if per_input[index] + seconds >= durations[index] - 1e-9 and not before_first_done:
            before_first_done.append((now["work"], now["segments"]))
        per_input[index] += seconds
        now["work"] += seconds

    def on_segment(index, seg):
        now["segments"] += seg.end - seg.start

    batch = speaking_batches(model.tokenizer, lambda: steps.append((now["work"], now["segments"])))
    finished = []
    for res in transcribe_stream(
        model,
        inputs,
        batch_size=8,
        max_segment_seconds=4.0,
        vad=False,
        on_progress=on_progress,
        on_segment=on_segment,
        parts=Parts(batch=batch),
    ):
        assert res.error is None
        assert len(res.transcription.segments) == 3
        # An input's progress adds up to its duration before its result comes out.
        assert per_input[res.index] == pytest.approx(durations[res.index], abs=1e-9)
        assert res.transcription.duration == durations[res.index]
        finished.append(res.index)
    steps.append((now["work"], now["segments"]))
    assert sorted(finished) == list(range(len(inputs)))
    assert now["work"] == pytest.approx(total, abs=1e-9)
    assert len(steps) > 40

    work = [w for w, _ in steps]
    assert all(b >= a for a, b in zip(work, work[1:]))  # never back
    jumps = [b - a for a, b in zip(work, work[1:])]
    assert max(jumps) < 0.05 * total  # rises step by step
    assert before_first_done[0][0] > 0.2 * total
    # Steps along the way show work: after the first tenth of the steps, progress is under way.
    assert work[len(work) // 10] > 0.05 * total

    # The same run counted from on_segment (segments in time order) moves in jumps of whole batches.
    by_segments = [s for _, s in steps]
    assert max(b - a for a, b in zip(by_segments, by_segments[1:])) > 0.15 * total
    assert by_segments[len(by_segments) // 10] == 0.0


def test_transcribe_reports_done_and_total_rising_to_the_total(model):
    inputs = [noise_with_pauses([3.7, 1.0 + 0.3 * i], seed=20 + i) for i in range(5)]
    seen: list[tuple[float, float]] = []
    results = mlx_qwen3asr.transcribe(
        model,
        inputs,
        batch_size=4,
        max_segment_seconds=4.0,
        vad=False,
        parts=Parts(batch=speaking_batches(model.tokenizer)),
        on_progress=lambda done, total: seen.append((done, total)),
    )
    total = sum(r.duration for r in results)
    assert total == pytest.approx(sum(len(a) / RATE for a in inputs))
    assert len(seen) > 10
    assert all(0 <= done <= t for done, t in seen)
    done = [d for d, _ in seen]
    assert all(b >= a for a, b in zip(done, done[1:]))
    assert seen[-1] == (total, total)
    assert seen[0][1] == pytest.approx(total)  # arrays: the total is known from the start


def test_a_raising_on_progress_fails_only_its_input_and_silence_counts_at_once(model):
    inputs = [noise_with_pauses([2.5, 1.0], seed=30 + i) for i in range(4)]
    inputs.insert(2, np.zeros(3 * RATE, np.float32))  # skipped: silent
    calls: dict[int, list[float]] = {}

    def on_progress(index, seconds):
        calls.setdefault(index, []).append(seconds)
        if index == 1 and len(calls[index]) == 3:
            raise RuntimeError("the progress display broke")

    results = {
        r.index: r
        for r in transcribe_stream(
            model,
            inputs,
            batch_size=4,
            max_segment_seconds=4.0,
            vad=False,
            skip=is_silent,
            on_progress=on_progress,
            parts=Parts(batch=speaking_batches(model.tokenizer)),
        )
    }
    assert sorted(results) == [0, 1, 2, 3, 4]
    assert isinstance(results[1].error, RuntimeError)
    assert "progress display broke" in str(results[1].error)
    assert len(calls[1]) == 3  # no more reports for a failed input
    for i in (0, 2, 3, 4):
        assert results[i].error is None
        assert sum(calls[i]) == pytest.approx(results[i].transcription.duration, abs=1e-9)
    assert results[2].skipped and calls[2] == [3.0]  # all at once
    assert all(len(calls[i]) > 3 for i in (0, 3, 4))


# --- the command line -----------------------------------------------------------------------------------


def write_inputs(folder, count: int) -> list:
    paths = []
    for i in range(count):
        path = folder / f"talk{i:02d}.wav"
        sf.write(path, noise_with_pauses([3.7, 3.7, 0.8], seed=40 + i), RATE, subtype="FLOAT")
        paths.append(path)
    return paths


def test_log_mode_prints_progress_lines_one_start_line_and_no_speed_when_nothing_was_transcribed(
    tmp_path, checkpoints, model, capsys, monkeypatch
):
    write_inputs(tmp_path, 6)
    through_cli(monkeypatch, batch=speaking_batches(model.tokenizer))
    monkeypatch.setattr(reporter, "PROGRESS_EVERY", 0.0)
    args = [str(tmp_path), "--no-vad", "--txt", "--batch-size", "4", "--max-segment-seconds", "4"]
    assert main([*args, "--model", str(checkpoints("tiny"))]) == 0
    out = capsys.readouterr().out.splitlines()
    starts = [line for line in out if "transcribing" in line]
    assert len(starts) == 1
    assert re.fullmatch(r"loaded in \d+\.\d s; transcribing 6 file\(s\), 4 segment\(s\) at a time", starts[0])
    progress = [i for i, line in enumerate(out) if line.startswith("progress: ")]
    assert len(progress) > 5
    pattern = r"progress: (\d+)% of \S+( s)? of audio, \d+\.\dx realtime, about \S+( s)? left"
    shares = [int(re.fullmatch(pattern, out[i]).group(1)) for i in progress]
    assert shares == sorted(shares) and shares[0] < 50
    summary = [i for i, line in enumerate(out) if line.startswith("summary: ")]
    assert len(summary) == 1 and progress[-1] < summary[0]
    assert "realtime" in out[summary[0]]

    # Everything up to date: the summary states no speed.
    assert main([*args, "--model", str(checkpoints("tiny"))]) == 0
    out = capsys.readouterr().out.splitlines()
    assert not [line for line in out if line.startswith("progress: ") or "transcribing" in line]
    summary = [line for line in out if line.startswith("summary: ")]
    assert summary == [summary[0]] and "6 skipped" in summary[0]
    assert "realtime" not in summary[0]


def test_the_real_decoding_batch_reports_progress_while_rows_decode(model):
    inputs = [noise_with_pauses([1.5], seed=50), noise_with_pauses([2.5], seed=51)]
    calls: dict[int, list[float]] = {}
    results = {
        r.index: r
        for r in transcribe_stream(
            model,
            inputs,
            batch_size=2,
            vad=False,
            on_progress=lambda index, seconds: calls.setdefault(index, []).append(seconds),
        )
    }
    for i, res in results.items():
        assert res.error is None
        assert len(res.transcription.segments) == 1
        assert sum(calls[i]) == pytest.approx(res.transcription.duration, abs=1e-9)
        assert len(calls[i]) > 3  # in parts while its one segment decodes
        assert max(calls[i][:-1]) < 0.5 * res.transcription.duration


# --- what the counter, the bar and the summary say --------------------------------------------------


def test_every_file_takes_its_place_in_the_count_failed_ones_too(
    tmp_path, checkpoints, model, capsys, monkeypatch
):
    write_inputs(tmp_path, 5)
    (tmp_path / "bad.wav").write_text("not audio", encoding="utf-8")  # fails as it is decoded
    through_cli(monkeypatch, batch=speaking_batches(model.tokenizer))
    args = [str(tmp_path), "--no-vad", "--txt", "--batch-size", "4", "--max-segment-seconds", "4"]
    assert main([*args, "--model", str(checkpoints("tiny"))]) == 1
    cap = capsys.readouterr()
    counted = [re.match(r"\[(\d+)/(\d+)\] (done|failed) (\S+)", line) for line in cap.out.splitlines()]
    counted = [m.groups() for m in counted if m]
    assert [(int(k), int(n)) for k, n, _, _ in counted] == [(k, 6) for k in range(1, 7)], cap.out
    assert [(what, name) for _, _, what, name in counted if what == "failed"] == [
        ("failed", str(tmp_path / "bad.wav"))
    ]
    assert sum(what == "done" for _, _, what, _ in counted) == 5
    assert f"mlxasr: error: {tmp_path / 'bad.wav'}: " in cap.err  # the reason, as before


def test_the_bar_says_that_its_share_is_of_the_audio_and_counts_failed_files(monkeypatch):
    """Segments are decoded longest first, so most of the audio is done while few files are: the
    percentage says it is of the audio, and the label counts every finished file, failed ones too."""
    import io

    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "150")
    monkeypatch.delenv("NO_COLOR", raising=False)
    out, err = io.StringIO(), io.StringIO()
    report = reporter.Reporter(out, err)
    assert report.rich
    report.start([10.0] * 6)
    report.batch_started(6, 4)
    report.file_finished(1, 6, 0, None)  # failed before any of its audio was done
    for index in range(1, 6):
        report.progress(index, 9.7)
    report.file_finished(2, 6, 1, 10.0)
    report.file_finished(3, 6, 2, 10.0)
    report.stop()
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    done, total = 3 * 9.7 + 20.0, 50.0  # the failed file's estimate no longer counts
    assert "3/6 files (1 failed)" in text, text
    assert f" {100 * done / total:.0f}% of audio " in text, text
    assert not re.search(r"\d%(?! of audio)", text), text  # no bare percentage beside "3/6 files"


@pytest.mark.parametrize(
    ("audio", "wall", "said"),
    [
        (2.0, 3.4, "2.0 s of audio in 3.4 s wall time"),
        (185.0, 61.0, "3 min 05 s of audio in 1 min 01 s wall time"),
        (7500.0, 1800.0, "2 h 05 min of audio in 30 min 00 s wall time"),
    ],
)
def test_the_summary_says_durations_as_people_read_them(audio, wall, said, monkeypatch):
    import io

    out = io.StringIO()
    summary = reporter.Summary(done=1, audio_seconds=audio, work_seconds=wall, wall_seconds=wall)
    reporter.Reporter(out, io.StringIO()).summary(summary)
    line = out.getvalue().strip()
    assert line.startswith("summary: 1 transcribed") and said in line, line
    assert " h of audio" not in line or audio >= 3600

    # On a terminal, the table says the same.
    monkeypatch.setenv("FORCE_COLOR", "1")
    out = io.StringIO()
    reporter.Reporter(out, io.StringIO()).summary(summary)
    table = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert re.search(rf"audio\s+│\s+{re.escape(said.split(' of audio')[0])}\s", table), table
    assert "0.00 h" not in table
