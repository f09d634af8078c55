"""mlxasr --diarize while the diarizer works: the bar says it is finding speakers with the diarizer's own
progress, the time left counts the diarization still to do, the log lines outside a terminal keep coming
while the run waits for speakers; and only speech is diarized (a file with none is never given to the
diarizer).

The diarizers are stand-ins with the library's progress() and estimate() (or without them)."""

from __future__ import annotations

import io
import json
import re
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf
from rich.console import Console, Group
from scripted import script_batches, through_cli

import mlx_qwen3asr.cli.diarizing as diarizing
import mlx_qwen3asr.cli.reporter as reporter_module
import mlx_qwen3asr.diarize as library
from mlx_qwen3asr.audio.vad import VadOptions
from mlx_qwen3asr.cli.diarize_queue import SpeakerPairs, speaker_work
from mlx_qwen3asr.cli.main import main
from mlx_qwen3asr.cli.reporter import Reporter
from mlx_qwen3asr.diarize import Turn
from mlx_qwen3asr.diarize.queue import DiarizeQueue
from tools.sounds import espeak, trimmed

RATE = 16000


class Timed:
    """A diarizer that takes `takes` seconds a call and tells its progress as the library's does
    (progress(): a snapshot of the call in progress; estimate(): seconds of compute for so much audio,
    here `per_second` of compute a second of audio). calls: each call's (seconds of audio, speech)."""

    def __init__(self, takes: float, per_second: float = 0.5):
        self.takes, self.per_second = takes, per_second
        self.calls: list[tuple[float, object]] = []
        self._started: float | None = None
        self._audio = 0.0

    def __call__(self, samples, options, speech=None):
        self.calls.append((samples.shape[0] / RATE, speech))
        self._audio = samples.shape[0] / RATE
        self._started = time.monotonic()
        try:
            time.sleep(self.takes)
        finally:
            self._started = None
        return [Turn(0.0, self._audio, 0)]

    def progress(self):
        started = self._started
        if started is None:
            return None
        elapsed = time.monotonic() - started
        return SimpleNamespace(
            audio_seconds=self._audio,
            elapsed=elapsed,
            fraction=min(elapsed / max(self.takes, 1e-3), 0.99),
            seconds_left=max(self.takes - elapsed, 0.0),
            attempt=1,
            attempts=1,
        )

    def estimate(self, audio_seconds: float) -> float:
        return audio_seconds * self.per_second


class Library:
    """The diarization library, its load_diarizer giving `diarizer`."""

    def __init__(self, diarizer):
        self.diarizer = diarizer

    def __getattr__(self, name):
        return getattr(library, name)

    def load_diarizer(self, path=None):
        return self.diarizer


def rendered(report: Reporter, width: int) -> list[str]:
    """The bar's lines as a terminal `width` columns wide shows them."""
    console = Console(file=io.StringIO(), width=width, color_system=None, record=True)
    console.print(Group(*report._progress.get_renderables()))
    return console.export_text().rstrip("\n").split("\n")


def eta(line: str) -> int:
    h, m, s = map(int, re.search(r"eta (\d+):(\d\d):(\d\d)$", line).groups())
    return h * 3600 + m * 60 + s


@pytest.fixture
def terminal(monkeypatch):
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setattr(reporter_module, "BAR_EVERY", 0.0)


def test_the_bar_says_it_finds_speakers_and_its_time_left_counts_them(terminal):
    """Both files transcribed, their speakers still to find (0.6 s of diarizer each, 10 s estimated for
    the 20 s one waiting): the bar says "finding speakers" with the share of the file being diarized,
    and its time left holds the waiting file's estimate; it ends at 100%."""
    diarizer = Timed(0.6, per_second=0.5)
    report = Reporter(io.StringIO(), io.StringIO())
    assert report.rich
    report.start([20.0, 20.0], stages=2)
    report.batch_started(2, 1)
    seen: list[tuple[int, str]] = []

    def told(work):
        report.diarizing(work)
        seen.append((work.files, rendered(report, 100)[0]))

    queue = DiarizeQueue(diarizer, None, read=lambda samples: samples)
    pairs = SpeakerPairs(queue, report.progress, told)
    try:
        for key in (0, 1):
            queue.submit(key, np.zeros(20 * RATE, dtype=np.float32), 20.0)
        for key in (0, 1):
            pairs.progress(key, 20.0)  # transcribed
        for key in (0, 1):
            list(pairs.add(SimpleNamespace(index=key, error=None, wav=None)))
        settled = list(pairs.rest())
        end = rendered(report, 100)[0]
    finally:
        pairs.close()
        report.stop()
    assert len(settled) == 2 and all(outcome.error is None for _, outcome in settled)
    both = [line for files, line in seen if files == 2]
    assert both and all("finding speakers" in line for line in both), seen
    assert any(re.search(r"finding speakers \d+%", line) for line in both), seen
    # the waiting file's 10 s (estimate(20 s)) is still to come while the first is diarized
    assert all(eta(line) >= 10 for line in both), both
    last = [line for files, line in seen if files == 1]
    assert last and all(eta(line) <= 1 for line in last), last
    assert "100% of audio" in end and "finding speakers" not in end, end


@pytest.mark.parametrize("width", [40, 80])
def test_the_bar_fits_the_terminal_and_keeps_its_time_left_whole(terminal, width):
    report = Reporter(io.StringIO(), io.StringIO())
    report.start([3600.0, 1800.0, 600.0], stages=2)
    report.batch_started(3, 4)
    report.file_finished(1, 3, 2, None)
    report.progress(0, 3600.0)
    report.progress(1, 900.0)
    report.diarizing(
        reporter_module.SpeakerWork(files=2, key=0, fraction=0.4, left=4523.0, attempt=2, attempts=4)
    )
    lines = rendered(report, width)
    report.stop()
    assert len(lines) == 1, lines
    assert len(lines[0]) <= width, lines
    assert lines[0].endswith("eta 1:15:23"), lines  # 4523 s, whole
    assert "speakers 40%" in lines[0], lines
    if width == 80:
        assert "1/3 files (1 failed)" in lines[0] and "finding speakers 40%" in lines[0], lines


def test_outside_a_terminal_the_log_keeps_coming_while_speakers_are_found(
    tmp_path, checkpoints, monkeypatch, capsys
):
    """Transcription is over long before the diarizer (1.5 s on the file): log lines still come while
    the run waits, and say that speakers are being found."""
    monkeypatch.setattr(reporter_module, "PROGRESS_EVERY", 0.3)
    diarizer = Timed(1.5)
    monkeypatch.setattr(diarizing, "library", lambda: Library(diarizer))
    model = str(checkpoints("tiny"))
    from mlx_qwen3asr.checkpoints.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(model)
    through_cli(
        monkeypatch, batch=script_batches(lambda p: tok.encode("language English<asr_text>Hi.")).batch
    )
    talk = tmp_path / "talk.wav"
    sf.write(talk, np.random.default_rng(0).normal(0, 0.1, 4 * RATE).astype(np.float32), RATE)
    assert main(["--no-vad", str(talk), "--model", model, "--diarize", "--no-word-timestamps", "--json"]) == 0
    out = capsys.readouterr().out.splitlines()
    finding = [line for line in out if line.startswith("progress:") and "finding speakers" in line]
    assert len(finding) >= 2, out
    assert json.loads((tmp_path / "talk.json").read_text())["speakers"] == ["Speaker 1"]


def test_silence_is_never_given_to_the_diarizer(tmp_path, checkpoints, monkeypatch, capsys):
    """30 s of digital silence with --diarize: speech detection finds no speech, so the diarizer does not
    run; with --no-vad, as asked, all of it is diarized."""
    diarizer = Timed(0.0)
    monkeypatch.setattr(diarizing, "library", lambda: Library(diarizer))
    model = str(checkpoints("tiny"))
    silence = tmp_path / "silence.wav"
    sf.write(silence, np.zeros(30 * RATE, dtype=np.float32), RATE)
    args = [str(silence), "--model", model, "--diarize", "--json", "--no-word-timestamps"]
    assert main(args) == 0
    assert diarizer.calls == []
    doc = json.loads((tmp_path / "silence.json").read_text())
    assert doc["segments"] == [] and doc.get("speakers", []) == []
    capsys.readouterr()

    assert main([*args, "--no-vad", "--overwrite"]) == 0
    assert [(round(seconds), speech) for seconds, speech in diarizer.calls] == [(30, None)]


def test_only_the_speech_is_given_to_the_diarizer():
    """A sentence between 2 s of silence on each side: the diarizer is given the speech found, in
    seconds, around where the sentence is; one that does not take speech= is given the whole audio."""
    sentence = trimmed(espeak("en", "The committee will meet again on Thursday to review the budget."))
    gap = np.zeros(2 * RATE, dtype=np.float32)
    samples = np.concatenate([gap, sentence.astype(np.float32), gap])
    start, end = 2.0, 2.0 + len(sentence) / RATE

    diarizer = Timed(0.0)
    queue = DiarizeQueue(diarizer, None, read=lambda s: s, vad=VadOptions())
    queue.submit(0, samples)
    outcome = queue.outcome(0)
    queue.close()
    assert outcome.error is None
    [(seconds, speech)] = diarizer.calls
    assert seconds == pytest.approx(len(samples) / RATE)
    assert (
        speech
        and speech[0][0] == pytest.approx(start, abs=0.4)
        and speech[-1][1] == pytest.approx(end, abs=0.4)
    )

    calls: list[int] = []
    lock = threading.Lock()

    def plain(samples, options):  # a stand-in that knows nothing of speech=
        with lock:
            calls.append(samples.shape[0])
        return []

    queue = DiarizeQueue(plain, None, read=lambda s: s, vad=VadOptions())
    queue.submit(0, samples)
    assert queue.outcome(0).error is None
    queue.submit(1, np.zeros(5 * RATE, dtype=np.float32))  # silence: not given to it at all
    assert queue.outcome(1).turns == []
    queue.close()
    assert calls == [len(samples)]


def test_without_progress_or_estimate_the_bar_still_says_it_finds_speakers(terminal):
    report = Reporter(io.StringIO(), io.StringIO())
    report.start([10.0], stages=2)
    report.progress(0, 10.0)
    queue = DiarizeQueue(lambda samples, options: time.sleep(0.3) or [], None, read=lambda s: s)
    queue.submit(0, np.zeros(10 * RATE, dtype=np.float32), 10.0)
    deadline = time.monotonic() + 5
    while not queue.backlog().key == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    work = speaker_work(queue)
    report.diarizing(work)
    line = rendered(report, 80)[0]
    queue.close(wait=True)
    report.stop()
    assert work.files == 1 and work.fraction is None and work.left is None
    assert "finding speakers eta" not in line and "finding speakers" in line, line


def test_the_log_line_names_the_files_left(monkeypatch):
    monkeypatch.setattr(reporter_module, "PROGRESS_EVERY", 0.0)
    out = io.StringIO()
    report = Reporter(out, io.StringIO())
    report.start([60.0, 60.0], stages=2)
    report.progress(0, 60.0)
    report.progress(1, 60.0)
    report.diarizing(reporter_module.SpeakerWork(files=2, key=0, fraction=0.5, left=95.0, waiting=True))
    last = out.getvalue().splitlines()[-1]
    assert last.startswith("progress: 62% of 2:00 of audio"), last
    assert "about 1:35 left" in last and "finding speakers 50%, 2 file(s) to go" in last, last
