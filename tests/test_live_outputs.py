"""mlxasr live's output files (cli/live_outputs.LiveOutputs, outputs/appending): after a commit only
what its segments add is written, so that a commit's work does not grow with the session; the files
are valid and hold every committed segment after each commit, and the last write is what `mlxasr`
writes for the same transcript."""

from __future__ import annotations

import errno
import json
import types

import numpy as np
import pytest
import srt
import webvtt

from mlx_qwen3asr.audio.features import SAMPLE_RATE
from mlx_qwen3asr.audio.signal import ArraySignal, Signal
from mlx_qwen3asr.cli.live_error import LiveError
from mlx_qwen3asr.cli.live_outputs import LiveOutputs
from mlx_qwen3asr.outputs import appending
from mlx_qwen3asr.outputs.cues import FrameEnergy, build_cues, frame_energy_db
from mlx_qwen3asr.outputs.finding import InputFile
from mlx_qwen3asr.outputs.folder import FileJob, TranscribeOptions, write_outputs
from mlx_qwen3asr.outputs.render import render_txt, segment_json
from mlx_qwen3asr.outputs.wrapping import clean_text
from mlx_qwen3asr.pipeline.result import Segment, Transcription, Word, main_language
from mlx_qwen3asr.runtime import atomic
from mlx_qwen3asr.text.output import join_texts
from tools.live_commit_bench import make_segments

FORMATS = ("txt", "srt", "vtt", "json")
WORDS = (
    "so the plan for today is simple, we read the numbers first. then we talk about what they mean "
    "for the next quarter & whether <anything> changes. right? okay, let's start."
).split()


def segments(count: int, *, timed: bool, seed: int = 0, start: float = 0.0) -> list[Segment]:
    """count segments of 5 to 15 s of speech (a pause of up to 1.5 s between), with words spread over
    each when timed; the words include characters the writers escape."""
    return make_segments(timed, count=count, seed=seed, start=start, words=WORDS)


class Tone(Signal):
    """A long signal made as it is read (a tone and noise that swell and fade every 1.7 s), counting
    the samples read."""

    def __init__(self, seconds: float) -> None:
        self.num_samples = int(seconds * SAMPLE_RATE)
        self.samples_read = 0

    def read(self, start: int, stop: int) -> np.ndarray:
        start, stop = max(0, start), min(max(0, stop), self.num_samples)
        if stop <= start:
            return np.zeros(0, np.float32)
        self.samples_read += stop - start
        n = np.arange(start, stop)
        loud = 0.3 * (1 + np.sin(2 * np.pi * n / (SAMPLE_RATE * 1.7)))  # a pause every 1.7 s
        noise = ((n * 2654435761) % 1000) / 1000.0 - 0.5
        return (loud * (0.5 * np.sin(2 * np.pi * 220 * n / SAMPLE_RATE) + 0.2 * noise)).astype(np.float32)


def job_for(tmp_path, name="talk", formats=FORMATS) -> FileJob:
    return FileJob(InputFile(tmp_path / "stdin"), {fmt: tmp_path / f"{name}.{fmt}" for fmt in formats})


def session(committed: list[Segment], speech=()) -> types.SimpleNamespace:
    return types.SimpleNamespace(segments=committed, speech=list(speech))


def options(**changes) -> TranscribeOptions:
    return TranscribeOptions(language=None, max_segment_seconds=30.0, **changes)


def expected(tmp_path, committed, audio, opts, warnings=(), speech=None) -> dict[str, bytes]:
    """What `mlxasr` writes for the session's transcript (as the live command's last write did)."""
    out = tmp_path / "expected"
    out.mkdir(exist_ok=True)
    job = FileJob(InputFile(tmp_path / "stdin"), {fmt: out / f"talk.{fmt}" for fmt in FORMATS})
    lang = main_language(committed)
    result = Transcription(
        text=join_texts([s.text for s in committed], lang),
        language=lang,
        segments=list(committed),
        duration=len(audio) / SAMPLE_RATE,
        warnings=list(warnings),
        speech=speech,
    )
    write_outputs(job, result, audio, opts, model_name="tiny", overwrite=True)
    return {fmt: path.read_bytes() for fmt, path in job.outputs.items()}


def check_valid(job: FileJob, committed: list[Segment]) -> None:
    """Each file is a valid document holding every committed segment."""
    paths = job.outputs
    said = " ".join(clean_text(s.text) for s in committed).split()
    assert paths["txt"].read_text(encoding="utf-8") == render_txt(
        Transcription(text="", language="", segments=committed)
    )
    doc = json.loads(paths["json"].read_text(encoding="utf-8"))
    assert doc["partial"] is True
    assert doc["segments"] == json.loads(json.dumps([segment_json(s) for s in committed]))
    assert doc["language"] == ("English" if committed else "")
    cues = list(srt.parse(paths["srt"].read_text(encoding="utf-8"), ignore_errors=False))
    assert [c.index for c in cues] == list(range(1, len(cues) + 1))
    assert all(a.end <= b.start for a, b in zip(cues, cues[1:]))
    assert " ".join(c.content for c in cues).split() == said
    vtt = list(webvtt.read(str(paths["vtt"])))
    assert len(vtt) == len(cues)
    escaped = [w.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") for w in said]
    assert " ".join(c.text for c in vtt).split() == escaped


@pytest.mark.parametrize("timed", [True, False], ids=["words", "estimated"])
@pytest.mark.parametrize("vad", [False, True], ids=["all", "vad"])
def test_files_hold_every_commit_and_end_as_mlxasr_writes_them(tmp_path, timed, vad):
    from mlx_qwen3asr.audio.vad import VadOptions

    committed = segments(9, timed=timed, seed=3)
    seconds = committed[-1].end + 2.0
    audio = ArraySignal(Tone(seconds).read(0, int(seconds * SAMPLE_RATE)))
    opts = options(word_timestamps=timed, vad=VadOptions() if vad else None)
    job = job_for(tmp_path)
    outputs = LiveOutputs(job, opts, "tiny")
    source = session([])
    outputs.write(source, audio, None)  # before any commit: empty, valid files
    check_valid(job, [])
    for upto in (1, 2, 5, 6, 9):  # commits of one segment and of several
        source.segments.extend(committed[len(source.segments) : upto])
        source.speech.append((source.segments[-1].start, source.segments[-1].end))
        outputs.write(source, audio, None)
        check_valid(job, committed[:upto])
        assert outputs.written == list(job.outputs.values())
    outputs.write(source, audio, None, ["a warning"], final=True)
    want = expected(tmp_path, committed, audio, opts, ["a warning"], list(source.speech) if vad else None)
    for fmt, path in job.outputs.items():
        assert path.read_bytes() == want[fmt], fmt


@pytest.mark.parametrize("highlight", ["underline", "karaoke"])
def test_the_last_write_is_byte_for_byte_mlxasrs_with_highlighted_words(tmp_path, highlight):
    committed = segments(4, timed=True, seed=5)
    audio = ArraySignal(np.zeros(int((committed[-1].end + 1) * SAMPLE_RATE), np.float32))
    opts = options(word_timestamps=True, highlight_words=highlight)
    job = job_for(tmp_path)
    outputs = LiveOutputs(job, opts, "tiny")
    source = session([])
    for seg in committed:
        source.segments.append(seg)
        outputs.write(source, audio, "English")
        assert list(srt.parse(job.outputs["srt"].read_text(encoding="utf-8")))
        assert list(webvtt.read(str(job.outputs["vtt"])))
    outputs.write(source, audio, "English", final=True)
    want = expected(tmp_path, committed, audio, opts)
    assert {fmt: p.read_bytes() for fmt, p in job.outputs.items()} == want


def test_a_commits_work_does_not_grow_with_the_session(tmp_path, monkeypatch):
    """The audio read and the bytes written for a commit at segment 1000 are those of one at segment
    10 (the whole session's, before: its energy measured over all the audio, the files rewritten)."""
    written = []
    whole, part = atomic._write_temp, appending._write_at
    monkeypatch.setattr(
        atomic, "_write_temp", lambda path, data: written.append(len(data)) or whole(path, data)
    )
    monkeypatch.setattr(
        appending, "_write_at", lambda fd, data, at: written.append(len(data)) or part(fd, data, at)
    )
    monkeypatch.setattr(appending, "_sync", lambda fd: None)  # the disk's time is not what is counted
    first = segments(999, timed=False, seed=1)
    # Commits 10 and 1000 add the same segment (text and length), so that their work compares.
    same = segments(1, timed=False, seed=2)[0]
    at10 = Segment(first[8].end + 0.5, round(first[8].end + 0.5 + same.end, 3), same.text, "English")
    # The segments between are one timed word each (whose cue needs no audio): the test runs fast.
    t = at10.end + 0.5
    first[9:] = [at10]
    for k in range(989):
        at = round(t + 2 * k, 3)
        word = Word("Yes.", at, at + 0.5, 0, 4)
        first.append(Segment(at, at + 1, "Yes.", "English", timing="aligned", words=[word]))
    at1000 = Segment(first[-1].end + 0.5, round(first[-1].end + 0.5 + same.end, 3), same.text, "English")
    audio = Tone(at1000.end + 1.0)
    outputs = LiveOutputs(job_for(tmp_path), options(), "tiny")
    source = session([])

    def commit(*new: Segment) -> tuple[int, int]:
        source.segments.extend(new)
        read, written[:] = audio.samples_read, []
        outputs.write(source, audio, "English")
        return audio.samples_read - read, sum(written)

    for seg in first[:9]:
        commit(seg)
    read10, bytes10 = commit(first[9])
    commit(*first[10:])
    read1000, bytes1000 = commit(at1000)
    assert 0 < read10 < 20 * SAMPLE_RATE  # the segment's audio, not the session's
    assert read1000 == read10
    assert 0 < bytes10 and bytes1000 <= bytes10 + 16  # (times and cue numbers with a digit more)


def test_a_full_disk_leaves_each_file_as_the_last_commit_left_it(tmp_path, monkeypatch):
    committed = segments(3, timed=True, seed=4)
    audio = ArraySignal(np.zeros(int((committed[-1].end + 1) * SAMPLE_RATE), np.float32))
    job = job_for(tmp_path)
    outputs = LiveOutputs(job, options(word_timestamps=True), "tiny")
    source = session(committed[:2])
    outputs.write(source, audio, None)
    before = {fmt: p.read_bytes() for fmt, p in job.outputs.items()}
    part = appending._write_at

    def full(fd, data, at):  # half of it goes in, then the disk is full
        part(fd, data[: len(data) // 2], at)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(appending, "_write_at", full)
    source.segments.append(committed[2])
    with pytest.raises(LiveError) as caught:
        outputs.write(source, audio, None)
    assert str(caught.value) == f"cannot write output {job.outputs['txt']} (no space left on device)"
    assert {fmt: p.read_bytes() for fmt, p in job.outputs.items()} == before
    # Room again: the next commit writes the files whole, with everything.
    monkeypatch.setattr(appending, "_write_at", part)
    outputs.write(source, audio, None)
    check_valid(job, committed)


def test_an_interrupted_append_is_undone(tmp_path, monkeypatch):
    committed = segments(2, timed=False, seed=6)
    audio = ArraySignal(np.zeros(int((committed[-1].end + 1) * SAMPLE_RATE), np.float32))
    job = job_for(tmp_path, formats=("json",))
    outputs = LiveOutputs(job, options(), "tiny")
    source = session(committed[:1])
    outputs.write(source, audio, None)
    before = job.outputs["json"].read_bytes()
    part = appending._write_at

    def interrupted(fd, data, at):
        part(fd, data[:7], at)
        raise KeyboardInterrupt

    monkeypatch.setattr(appending, "_write_at", interrupted)
    source.segments.append(committed[1])
    with pytest.raises(KeyboardInterrupt):
        outputs.write(source, audio, None)
    assert job.outputs["json"].read_bytes() == before
    assert json.loads(before)["segments"] == [segment_json(committed[0])]


def test_a_file_removed_or_changed_meanwhile_is_written_whole_again(tmp_path):
    committed = segments(4, timed=True, seed=7)
    audio = ArraySignal(np.zeros(int((committed[-1].end + 1) * SAMPLE_RATE), np.float32))
    job = job_for(tmp_path)
    outputs = LiveOutputs(job, options(word_timestamps=True), "tiny")
    source = session(committed[:2])
    outputs.write(source, audio, None)
    job.outputs["srt"].unlink()
    job.outputs["txt"].write_text("edited\n", encoding="utf-8")
    source.segments.append(committed[2])
    outputs.write(source, audio, None)
    check_valid(job, committed[:3])
    source.segments.append(committed[3])
    outputs.write(source, audio, None)
    check_valid(job, committed)


def test_an_output_that_cannot_be_created_is_named_in_the_error(tmp_path, monkeypatch):
    whole = atomic._write_temp

    def full(path, data):
        if path.suffix == ".vtt":
            raise OSError(errno.ENOSPC, "No space left on device")
        return whole(path, data)

    monkeypatch.setattr(atomic, "_write_temp", full)
    committed = segments(1, timed=False)
    audio = ArraySignal(np.zeros(int((committed[-1].end + 1) * SAMPLE_RATE), np.float32))
    job = job_for(tmp_path)
    with pytest.raises(LiveError) as caught:
        LiveOutputs(job, options(), "tiny").write(session(committed), audio, None)
    assert str(caught.value) == f"cannot write output {job.outputs['vtt']} (no space left on device)"
    assert not job.outputs["vtt"].exists()


@pytest.mark.parametrize("smooth", [5, 4, 1])
def test_frame_energy_by_range_is_the_whole_computations_to_the_bit(smooth):
    rng = np.random.default_rng(0)
    for n in (1, 319, 321, 6400, 177_777):
        x = (rng.standard_normal(n) * np.linspace(0.001, 0.6, n)).astype(np.float32)
        whole = frame_energy_db(x, smooth_frames=smooth)
        energy = FrameEnergy(x, smooth_frames=smooth)
        assert len(energy) == len(whole)
        for a, b in [
            (0, 1),
            (0, len(whole)),
            (len(whole) - 1, len(whole)),
            *rng.integers(0, len(whole), (20, 2)),
        ]:
            a, b = min(a, b), max(a, b)
            fresh = FrameEnergy(x, smooth_frames=smooth)[a:b]
            assert np.array_equal(fresh, whole[a:b]) and np.array_equal(energy[a:b], whole[a:b]), (n, a, b)


def test_cues_read_the_audio_of_the_segments_that_need_it():
    audio = Tone(3600.0)
    late = segments(2, timed=False, seed=8, start=3000.0)
    cues = build_cues(late, audio)
    assert cues and 0 < audio.samples_read < (late[-1].end - late[0].start + 1) * SAMPLE_RATE
    before = audio.samples_read
    build_cues(segments(2, timed=True, seed=8, start=3000.0), audio)  # timed words: no audio needed
    assert audio.samples_read == before
