"""`mlxasr live` end to end on a tiny random-weight checkpoint: files, standard input, the microphone
(a stand-in sounddevice module), Ctrl-C, bad streams and existing outputs."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import srt
from reference import test_signal

import mlx_qwen3asr.cli.live as live
import mlx_qwen3asr.cli.live_display as live_display
from mlx_qwen3asr.audio.files import load_audio
from mlx_qwen3asr.checkpoints.loading import load
from mlx_qwen3asr.cli.main import main
from mlx_qwen3asr.pipeline import live_session
from mlx_qwen3asr.pipeline.result import Segment
from mlx_qwen3asr.pipeline.streaming import StreamingTranscriber
from mlx_qwen3asr.text.output import join_texts

# Short chunks and windows, so that a few seconds of audio make several commits; the test audio is no
# speech (tests/reference.py test_signal), so speech detection is off to have it transcribed. Random
# weights never end an answer themselves: every update writes its whole budget, kept short.
NEW_TOKENS = 12
STREAM = [
    "--chunk-seconds",
    "1",
    "--max-window-seconds",
    "4",
    "--no-vad",
    "--max-new-tokens",
    str(NEW_TOKENS),
]


@pytest.fixture(scope="module")
def ckpt(checkpoints) -> str:
    return str(checkpoints("tiny"))


def write_wav(path: Path, seconds: float, seed: int) -> Path:
    """16-bit mono 16 kHz: the file, its raw PCM and a WAV stream of it hold the same samples."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(path, test_signal(seconds, seed), 16000, subtype="PCM_16")
    return path


def raw_pcm(path: Path) -> bytes:
    data, rate = sf.read(path, dtype="int16")
    assert rate == 16000 and data.ndim == 1
    return data.astype("<i2").tobytes()


def direct_segments(ckpt: str, path: Path):
    """What StreamingTranscriber commits for the file's audio, fed in one piece."""
    transcriber = StreamingTranscriber(
        load(ckpt), chunk_seconds=1.0, max_window_seconds=4.0, max_new_tokens=NEW_TOKENS
    )
    transcriber.feed(load_audio(path))
    transcriber.finish()
    return transcriber.segments


def run_live(*args: str, stdin: bytes | None = None, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mlx_qwen3asr.cli.main", "live", *args],
        input=stdin,
        capture_output=True,
        timeout=300,
        cwd=cwd,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "loading model" not in line]


# --- files --------------------------------------------------------------------------------------------


def test_input_file_writes_what_the_streaming_transcriber_commits(tmp_path, ckpt, capsys):
    audio = write_wav(tmp_path / "talk.wav", 8.0, 1)
    status = main(["live", "--input", str(audio), "--model", ckpt, *STREAM, "--txt", "--srt", "--json"])
    out = capsys.readouterr().out.splitlines()
    assert status == 0
    expected = direct_segments(ckpt, audio)
    assert len(expected) >= 2  # the window committed before the end

    doc = json.loads((tmp_path / "talk.json").read_text(encoding="utf-8"))
    got = [(s["start"], s["end"], s["text"]) for s in doc["segments"]]
    assert got == [
        (pytest.approx(s.start, abs=1e-3), pytest.approx(s.end, abs=1e-3), s.text) for s in expected
    ]
    assert doc["text"] == join_texts([s.text for s in expected], doc["language"])
    assert doc["duration"] == pytest.approx(8.0)

    txt = (tmp_path / "talk.txt").read_text(encoding="utf-8")
    assert len([p for p in txt.split("\n\n") if p.strip()]) == len([s for s in expected if s.text.strip()])
    cues = list(srt.parse((tmp_path / "talk.srt").read_text(encoding="utf-8")))
    assert cues and cues[-1].end.total_seconds() <= 8.0

    # Not a terminal: one line per committed segment as it commits, and nothing else (the text once).
    assert out == [live.segment_line(s) for s in expected]


def test_session_audio_is_kept_on_disk_and_read_back_exactly():
    kept = live_session.SessionAudio(keep=True)
    blocks = [np.linspace(-1, 1, n, dtype=np.float32) for n in (5, 0, 16000, 7)]
    for block in blocks:
        kept.add(block)
    signal_ = kept.signal()
    assert len(signal_) == kept.count == 16012
    assert np.array_equal(signal_.read(0, len(signal_)), np.concatenate(blocks))
    assert np.array_equal(signal_.read(10, 20), np.concatenate(blocks)[10:20])
    kept.close()
    nothing = live_session.SessionAudio(keep=False)  # no outputs: the audio is only counted
    nothing.add(blocks[2])
    assert nothing.count == 16000 and len(nothing.signal()) == 0


def test_a_full_temporary_folder_ends_the_session_with_one_line_and_what_was_committed(
    tmp_path, ckpt, monkeypatch, capsys
):
    class Full(io.BytesIO):
        def write(self, data):
            if self.tell() + len(data) > 4 * 16000 * 5:  # 5 s of audio fit
                raise OSError(28, "No space left on device")
            return super().write(data)

        def fileno(self):
            raise OSError("no descriptor")

    monkeypatch.setattr(live_session, "spill_file", Full)
    monkeypatch.setattr(
        live_session,
        "FileSignal",
        lambda f, n, peak: live_session.ArraySignal(np.frombuffer(f.getvalue(), dtype=np.float32)[:n]),
    )
    audio = write_wav(tmp_path / "talk.wav", 8.0, 1)
    status = main(["live", "--input", str(audio), "--model", ckpt, *STREAM, "--json"])
    err = capsys.readouterr().err
    assert status == 1
    assert [line for line in err.splitlines() if "error" in line] == [
        "mlxasr live: error: cannot keep the session's audio in the temporary folder (no space left on device)"
    ]
    doc = json.loads((tmp_path / "talk.json").read_text(encoding="utf-8"))
    assert doc["segments"] and doc["duration"] <= 5.0 + 1e-6


def test_realtime_input_takes_the_audio_duration(tmp_path, ckpt, capsys):
    audio = write_wav(tmp_path / "three.wav", 3.0, 2)
    began = time.monotonic()
    status = main(["live", "--input", str(audio), "--realtime", "--model", ckpt, "--no-vad", "-q"])
    elapsed = time.monotonic() - began
    captured = capsys.readouterr()
    assert status == 0
    assert elapsed >= 0.9 * 3.0
    assert captured.out == "" and captured.err == ""


# --- standard input ---------------------------------------------------------------------------------


def test_raw_pcm_and_wav_on_stdin_give_the_input_file_text(tmp_path, ckpt):
    audio = write_wav(tmp_path / "talk.wav", 6.0, 3)
    assert main(["live", "--input", str(audio), "--model", ckpt, *STREAM, "--txt", "-q"]) == 0
    expected = (tmp_path / "talk.txt").read_text(encoding="utf-8")
    assert expected.strip()

    raw = run_live(
        "-", "--model", ckpt, *STREAM, "--txt", "--name", "raw", stdin=raw_pcm(audio), cwd=tmp_path
    )
    assert raw.returncode == 0, raw.stderr
    assert (tmp_path / "raw.txt").read_text(encoding="utf-8") == expected

    wav = run_live(
        "-", "--model", ckpt, *STREAM, "--txt", "--name", "wav", stdin=audio.read_bytes(), cwd=tmp_path
    )
    assert wav.returncode == 0, wav.stderr
    assert (tmp_path / "wav.txt").read_text(encoding="utf-8") == expected


def test_wav_stream_of_another_rate_and_layout_is_resampled_and_mixed(tmp_path, ckpt):
    mono = test_signal(3.0, 4, sample_rate=44100)
    buffer = io.BytesIO()
    sf.write(buffer, np.stack([mono, 0.5 * mono], axis=1), 44100, format="WAV", subtype="FLOAT")
    done = run_live(
        "-", "--model", ckpt, "--json", "--no-vad", "--name", "st", stdin=buffer.getvalue(), cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads((tmp_path / "st.json").read_text(encoding="utf-8"))
    assert doc["duration"] == pytest.approx(3.0, abs=1e-3)
    assert doc["segments"] and doc["segments"][-1]["end"] == pytest.approx(3.0, abs=1e-3)


def stopped_after_a_commit(tmp_path, ckpt, formats: list[str], signum: int) -> tuple[int, str]:
    """`mlxasr live -` fed 6 s of audio on a stream that stays open, sent `signum` once a segment is
    committed: its status and standard error."""
    audio = write_wav(tmp_path / "talk.wav", 6.0, 5)
    log = tmp_path / "stdout.log"
    cmd = [sys.executable, "-m", "mlx_qwen3asr.cli.main", "live", "-", "--model", ckpt, *STREAM]
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [*cmd, *formats, "--name", "cut"],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.PIPE,
            cwd=tmp_path,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
        try:
            proc.stdin.write(raw_pcm(audio))  # then the stream stays open: it never ends by itself
            proc.stdin.flush()
            deadline = time.monotonic() + 120
            while not log.read_text(encoding="utf-8").startswith("["):
                assert proc.poll() is None, proc.stderr.read().decode()
                assert time.monotonic() < deadline, "no segment was committed"
                time.sleep(0.05)
            proc.send_signal(signum)
            status = proc.wait(timeout=120)
            err = proc.stderr.read().decode()
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.stdin.close()
            proc.stderr.close()
    return status, err


def test_ctrl_c_finishes_the_last_words_and_writes_complete_files(tmp_path, ckpt):
    status, err = stopped_after_a_commit(tmp_path, ckpt, ["--srt", "--json"], signal.SIGINT)
    log = tmp_path / "stdout.log"
    assert status == 130, err
    assert "interrupted" in err
    doc = json.loads((tmp_path / "cut.json").read_text(encoding="utf-8"))
    # Everything heard before the stop was transcribed: the last segment ends with the audio read, past
    # the segment committed before the stop. (How much of the pipe was read by then depends on the load.)
    first = log.read_text(encoding="utf-8").splitlines()[0]
    first_end = srt.srt_timestamp_to_timedelta(first[1:].split(" --> ")[1].split("]")[0].replace(".", ","))
    assert first_end.total_seconds() < doc["duration"] <= 6.0
    assert doc["segments"][-1]["end"] == pytest.approx(doc["duration"], abs=1e-3)
    cues = list(srt.parse((tmp_path / "cut.srt").read_text(encoding="utf-8")))
    assert cues and cues[-1].end.total_seconds() <= doc["duration"]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


RIFF = b"RIFF\x24\x00\x00\x00WAVE"


def fmt_chunk(tag: int = 1, channels: int = 1, rate: int = 16000, bits: int = 16) -> bytes:
    block = channels * bits // 8
    body = np.array([tag, channels], "<u2").tobytes() + np.array([rate, rate * block], "<u4").tobytes()
    return b"fmt \x10\x00\x00\x00" + body + np.array([block, bits], "<u2").tobytes()


BAD_STREAMS = {
    "not WAVE": (RIFF[:8] + b"AVI LIST", "a RIFF stream that is not WAVE audio"),
    "cut header": (RIFF + b"fmt ", "the stream ended inside the WAVE header"),
    "0 Hz": (
        RIFF + fmt_chunk(rate=0) + b"data\xff\xff\xff\xff" + bytes(3200),
        "implausible sample rate 0 Hz",
    ),
    "mu-law": (RIFF + fmt_chunk(tag=7, bits=8) + b"data\xff\xff\xff\xff", "unsupported WAVE encoding"),
    "data first": (RIFF + b"data\x00\x00\x00\x00", "the WAVE data comes before its fmt chunk"),
}


@pytest.mark.parametrize("case", sorted(BAD_STREAMS))
def test_a_bad_wav_header_on_stdin_is_one_line_and_status_1(tmp_path, case, monkeypatch, capsys):
    data, reason = BAD_STREAMS[case]
    (tmp_path / "in").write_bytes(data)
    with open(tmp_path / "in", "rb") as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        status = main(["live", "-", "--model", str(tmp_path / "no-model"), "--txt", "--name", "x"])
    err = capsys.readouterr().err.splitlines()
    assert status == 1
    assert len(err) == 1 and err[0].startswith("mlxasr live: error: stdin: ") and reason in err[0], err
    assert not (tmp_path / "x.txt").exists()


def test_an_odd_byte_count_on_stdin_is_said_and_the_rest_written(tmp_path, ckpt, monkeypatch, capsys):
    pcm = raw_pcm(write_wav(tmp_path / "talk.wav", 2.0, 6))
    (tmp_path / "in").write_bytes(pcm + b"\x01")
    with open(tmp_path / "in", "rb") as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        status = main(
            ["live", "-", "--model", ckpt, "--json", "--no-vad", "-o", str(tmp_path), "--name", "odd", "-q"]
        )
    err = capsys.readouterr().err.splitlines()
    assert status == 1
    assert err == [
        "mlxasr live: error: stdin: the stream ended inside a sample frame "
        "(1 trailing byte(s) of a 2-byte frame); they were dropped"
    ]
    assert json.loads((tmp_path / "odd.json").read_text(encoding="utf-8"))["duration"] == pytest.approx(2.0)


def test_wav_stream_reads_a_stated_data_size_and_stops_there():
    samples = (np.arange(1000) % 50 - 25).astype("<i2")
    data = samples.tobytes()
    stream = RIFF + b"LIST\x03\x00\x00\x00abc\x00" + fmt_chunk() + b"data" + np.uint32(len(data)).tobytes()
    reader = io.BytesIO(stream + data + b"junk after the data")
    wav = live.WavStream(reader.read)
    got = np.concatenate(list(wav.blocks()))
    np.testing.assert_array_equal(got, samples.astype(np.float32) / 32768.0)


# --- the microphone -----------------------------------------------------------------------------------


def test_no_sounddevice_is_one_line_and_status_2(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "sounddevice", None)  # import sounddevice raises ImportError
    status = main(["live", "--model", "not-loaded"])
    assert status == 2
    assert capsys.readouterr().err.splitlines() == [
        "mlxasr live: the microphone needs the sounddevice package: pip install 'mlx-qwen3asr[live]'"
    ]


def fake_sounddevice(samples: np.ndarray | None, rate: int = 48000) -> types.ModuleType:
    """A sounddevice stand-in whose default input plays `samples` (None: there is no input device),
    then presses Ctrl-C, as the user of a microphone ends a session."""
    module = types.ModuleType("sounddevice")

    def query_devices(kind=None):
        if samples is None:
            raise RuntimeError("Error querying device -1")
        return {"name": "test input", "default_samplerate": float(rate)}

    class InputStream:
        def __init__(self, samplerate, channels, dtype, callback):
            assert (samplerate, channels, dtype) == (rate, 1, "float32")
            self.callback = callback

        def play(self):
            for start in range(0, samples.shape[0], 4800):
                block = samples[start : start + 4800].reshape(-1, 1)
                self.callback(block, block.shape[0], None, None)
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGINT)

        def __enter__(self):
            threading.Thread(target=self.play, daemon=True).start()
            return self

        def __exit__(self, *exc):
            return False

    module.query_devices = query_devices
    module.InputStream = InputStream
    return module


def test_microphone_session_ends_with_ctrl_c_and_writes_its_outputs(tmp_path, ckpt, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "sounddevice", fake_sounddevice(test_signal(3.0, 7, sample_rate=48000)))
    status = main(["live", "--model", ckpt, "--json", "-o", str(tmp_path), "--name", "mic", "-q"])
    assert status == 130, capsys.readouterr().err
    doc = json.loads((tmp_path / "mic.json").read_text(encoding="utf-8"))
    assert doc["duration"] == pytest.approx(3.0, abs=1e-3)
    assert doc["source"] == "microphone"


def test_no_input_device_is_one_line_and_status_2(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "sounddevice", fake_sounddevice(None))
    status = main(["live", "--model", "not-loaded"])
    err = capsys.readouterr().err.splitlines()
    assert status == 2
    assert len(err) == 1 and err[0].startswith("mlxasr live: error: microphone: no input device"), err


# --- outputs and usage ------------------------------------------------------------------------------


def test_existing_output_is_refused_before_the_model_loads(tmp_path, ckpt, capsys):
    audio = write_wav(tmp_path / "talk.wav", 2.0, 8)
    (tmp_path / "talk.srt").write_text("kept\n", encoding="utf-8")
    status = main(["live", "--input", str(audio), "--model", str(tmp_path / "no-model"), "--srt", "--txt"])
    err = capsys.readouterr().err.splitlines()
    assert status == 2
    assert err == [
        f"mlxasr live: error: output {tmp_path / 'talk.srt'} already exists; "
        "--overwrite replaces, --name NAME names others"
    ]
    assert (tmp_path / "talk.srt").read_text(encoding="utf-8") == "kept\n"
    assert not (tmp_path / "talk.txt").exists()

    assert (
        main(["live", "--input", str(audio), "--model", ckpt, "--srt", "--overwrite", "--no-vad", "-q"]) == 0
    )
    assert list(srt.parse((tmp_path / "talk.srt").read_text(encoding="utf-8")))


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_max_new_tokens_is_a_count_of_at_least_one(value, capsys):
    assert main(["live", "-", "--max-new-tokens", value, "--model", "not-loaded"]) == 2
    assert (
        capsys.readouterr().err.splitlines()[-1].startswith("mlxasr live: error: argument --max-new-tokens: ")
    )


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["talk.wav"], "the only source argument is - (standard input)"),
        (["-", "--txt"], "outputs of standard input or the microphone need a place: -o DIR"),
        (["--realtime"], "--realtime paces a file: give it with --input FILE"),
        (["-", "--language", "Klingon"], "--language:"),
        (
            ["-", "--chunk-seconds", "2", "--max-window-seconds", "4"],
            "must be at least 5 with --chunk-seconds 2",
        ),
    ],
)
def test_usage_errors_are_one_line_and_status_2(args, reason, capsys):
    status = main(["live", *args, "--model", "not-loaded"])
    err = capsys.readouterr().err.splitlines()
    assert status == 2
    assert len(err) == 1 and reason in err[0], err


def test_an_input_that_is_no_regular_file_is_named_before_the_model_loads(tmp_path, capsys):
    os.mkfifo(tmp_path / "pipe.wav")
    (tmp_path / "folder").mkdir()
    for name, reason in (
        ("pipe.wav", "is a FIFO, not a regular file"),
        ("folder", "is a folder"),
        ("absent.wav", "no such file"),
    ):
        status = main(["live", "--input", str(tmp_path / name), "--model", "not-loaded"])
        assert status == 2
        assert capsys.readouterr().err.splitlines() == [
            f"mlxasr live: error: --input {tmp_path / name}: {reason}"
        ]


def test_terminal_display_shows_the_unstable_tail_dimmed(monkeypatch):
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.delenv("NO_COLOR", raising=False)

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    screen = Terminal()
    display = live_display.Display(quiet=False, out=screen)
    update = live.StreamUpdate(
        language="English", text="hello there world", stable="hello there", unstable=" world"
    )
    display.update(update, "")
    display.close()
    shown = screen.getvalue()
    assert "hello there" in shown
    assert "\x1b[2m world" in shown  # dim


def test_a_second_session_on_the_same_outputs_is_refused_and_the_lock_goes_with_the_session(
    tmp_path, ckpt, capsys
):
    import fcntl

    audio = write_wav(tmp_path / "talk.wav", 3.0, 1)
    lock = tmp_path / ".talk.mlxasr-live.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another session holds the names
    try:
        status = main(["live", "--input", str(audio), "--model", ckpt, *STREAM, "--txt"])
        err = capsys.readouterr().err
        assert status == 2
        assert [line for line in err.splitlines() if "error" in line] == [
            f"mlxasr live: error: another mlxasr live session is writing {tmp_path / 'talk'}.*; "
            "give this one another --name NAME or -o DIR"
        ]
        assert not (tmp_path / "talk.txt").exists()
    finally:
        os.close(fd)  # that session ends: its lock goes with it
    assert main(["live", "--input", str(audio), "--model", ckpt, *STREAM, "--txt"]) == 0
    assert (tmp_path / "talk.txt").exists() and not lock.exists()


# --- word timing --------------------------------------------------------------------------------------


def live_json(tmp_path, ckpt, *extra: str, name: str = "talk"):
    audio = tmp_path / "talk.wav"
    if not audio.exists():
        write_wav(audio, 8.0, 3)
    args = ["live", "--input", str(audio), "--model", ckpt, *STREAM, "--language", "en", "--json", *extra]
    status = main([*args, "-o", str(tmp_path), "--name", name])
    return status, json.loads((tmp_path / f"{name}.json").read_text(encoding="utf-8"))


def test_subtitles_time_the_words_of_each_committed_segment_with_the_aligner(tmp_path, ckpt, capsys):
    """The words of each committed segment are what the forced aligner gives for that segment's audio
    and text; SRT and VTT turn word timing on, as in mlxasr."""
    from mlx_qwen3asr.audio.features import log_mel_spectrogram
    from mlx_qwen3asr.pipeline.alignment import align_segments

    status, doc = live_json(tmp_path, ckpt, "--srt")
    err = capsys.readouterr().err
    assert status == 0 and "loading aligner" in err
    assert (
        doc["options"]["word_timestamps"] is True
        and doc["options"]["aligner"] == os.environ["MLXASR_ALIGNER"]
    )
    segments = [s for s in doc["segments"] if s["text"].strip()]
    assert len(segments) >= 2 and all(s["timing"] == "aligned" for s in segments)
    aligner = load(os.environ["MLXASR_ALIGNER"])
    samples = load_audio(tmp_path / "talk.wav")
    for s in segments:
        piece = samples[round(s["start"] * 16000) : round(s["end"] * 16000)]
        [words] = align_segments(
            aligner, [log_mel_spectrogram(piece)], [s["text"]], ["English"], [(s["start"], s["end"])]
        )
        assert [w["text"] for w in s["words"]] == [w.text for w in words]
        assert [w["start"] for w in s["words"]] == [pytest.approx(w.start, abs=1e-3) for w in words]


def test_word_timing_off_or_without_subtitles_loads_no_aligner(tmp_path, ckpt, capsys):
    for extra, name in ((["--srt", "--no-word-timestamps"], "off"), ([], "plain")):
        status, doc = live_json(tmp_path, ckpt, *extra, name=name)
        err = capsys.readouterr().err
        assert status == 0 and "loading aligner" not in err
        assert doc["options"]["word_timestamps"] is False
        assert all(s["timing"] == "estimated" and not s["words"] for s in doc["segments"])


def test_an_aligner_failure_keeps_the_text_with_estimated_times_and_one_line(
    tmp_path, ckpt, monkeypatch, capsys
):
    def broken(*args, **kwargs):
        raise MemoryError("out of memory")

    monkeypatch.setattr(live_session, "align_span", broken)
    status, doc = live_json(tmp_path, ckpt, "--srt")
    err = [line for line in capsys.readouterr().err.splitlines() if "aligner failed" in line]
    assert status == 0 and doc["segments"] and all(s["timing"] == "estimated" for s in doc["segments"])
    assert len(err) == len([s for s in doc["segments"] if s["text"].strip()])
    assert "out of memory" in err[0] and "estimated" in err[0]
    assert (tmp_path / "talk.srt").read_text(encoding="utf-8").strip()


def test_a_named_aligner_that_cannot_load_is_a_usage_error(tmp_path, ckpt, capsys):
    audio = write_wav(tmp_path / "talk.wav", 3.0, 4)
    status = main(
        ["live", "--input", str(audio), "--model", ckpt, "--srt", "--aligner", str(tmp_path / "none")]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and "aligner" in err[-1] and str(tmp_path / "none") in err[-1]
    assert not (tmp_path / "talk.srt").exists()


def test_a_default_aligner_out_of_reach_gives_one_line_and_estimated_times(
    tmp_path, ckpt, monkeypatch, capsys
):
    monkeypatch.delenv("MLXASR_ALIGNER")
    monkeypatch.setattr("mlx_qwen3asr.cli.models.DEFAULT_ALIGNER", str(tmp_path / "unreachable"))
    status, doc = live_json(tmp_path, ckpt, "--srt")
    err = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert status == 0 and len(err) == 1 and "aligner" in err[0] and "estimated" in err[0]
    assert all(s["timing"] == "estimated" for s in doc["segments"]) and doc["segments"]


# --- streams too short to transcribe ------------------------------------------------------------------


def short_pcm(size: int) -> bytes:
    """`size` bytes of 16-bit PCM (size // 2 samples, not silent)."""
    return ((np.arange(size // 2) * 7919) % 20000 - 10000).astype("<i2").tobytes()


@pytest.mark.parametrize("size", [2, 100, 318])
def test_under_10_ms_on_stdin_is_an_empty_transcript(tmp_path, ckpt, monkeypatch, capsys, size):
    """Less than one log-mel frame (160 samples) of audio: nothing to decode, empty outputs, status 0,
    as silence gives."""
    (tmp_path / "in").write_bytes(short_pcm(size))
    with open(tmp_path / "in", "rb") as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        status = main(
            ["live", "-", "--model", ckpt, "--json", "--txt", "-o", str(tmp_path), "--name", "short"]
        )
    err = capsys.readouterr().err
    assert status == 0, err
    assert "error" not in err
    doc = json.loads((tmp_path / "short.json").read_text(encoding="utf-8"))
    assert doc["segments"] == [] and doc["text"] == ""
    assert doc["duration"] == pytest.approx(size // 2 / 16000)
    assert (tmp_path / "short.txt").read_text(encoding="utf-8").strip() == ""


def test_under_10_ms_through_the_command_and_as_a_file_is_no_crash(tmp_path, ckpt):
    done = run_live("-", "--model", ckpt, "--json", "--name", "piped", stdin=short_pcm(2), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert b"Traceback" not in done.stderr and b"error" not in done.stderr
    assert json.loads((tmp_path / "piped.json").read_text(encoding="utf-8"))["segments"] == []

    audio = write_wav(tmp_path / "click.wav", 0.005, 1)  # 80 samples
    done = run_live("--input", str(audio), "--model", ckpt, "--txt", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert b"Traceback" not in done.stderr
    assert (tmp_path / "click.txt").read_text(encoding="utf-8").strip() == ""


# --- stops and failures -------------------------------------------------------------------------------


def test_a_full_disk_while_writing_names_the_output_in_one_line(tmp_path, ckpt, monkeypatch, capsys):
    """Writing the data is what fails on a full disk, and its error names no file: the line names the
    output that could not be written."""
    import errno

    from mlx_qwen3asr.runtime import atomic

    written = atomic._write_temp

    def full(path, data):
        if path.suffix == ".srt":
            raise OSError(errno.ENOSPC, "No space left on device")
        return written(path, data)

    monkeypatch.setattr(atomic, "_write_temp", full)
    audio = write_wav(tmp_path / "talk.wav", 3.0, 1)
    status = main(["live", "--input", str(audio), "--model", ckpt, *STREAM, "--txt", "--srt", "-q"])
    err = capsys.readouterr().err.splitlines()
    assert status == 1
    assert err == [
        f"mlxasr live: error: cannot write output {tmp_path / 'talk.srt'} (no space left on device)"
    ]
    assert not (tmp_path / "talk.srt").exists()


def test_sigterm_is_a_stop_with_status_143_not_an_error(tmp_path, ckpt):
    status, err = stopped_after_a_commit(tmp_path, ckpt, ["--json"], signal.SIGTERM)
    assert status == 143, err
    assert "mlxasr live: terminated; the outputs hold everything transcribed" in err.splitlines()
    assert "error" not in err
    assert json.loads((tmp_path / "cut.json").read_text(encoding="utf-8"))["segments"]


# --- standard input: a terminal, a stream that has not started --------------------------------------


def test_a_terminal_on_stdin_is_refused_in_one_line_with_status_2(tmp_path):
    import pty

    leader, follower = pty.openpty()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "mlx_qwen3asr.cli.main", "live", "-", "--model", "not-loaded"],
            stdin=follower,
            capture_output=True,
            timeout=120,
            cwd=tmp_path,
        )
    finally:
        os.close(follower)
        os.close(leader)
    assert done.returncode == 2, done.stderr
    assert done.stderr.decode().splitlines() == [
        "mlxasr live: error: - reads audio from standard input, which is a terminal; pipe audio in"
    ]


def test_a_stream_that_has_not_started_is_waited_for_with_the_model_loaded(tmp_path, ckpt):
    """`sleep 1000 | mlxasr live -`: one line says what it waits for, and the model loads meanwhile,
    not once the first bytes come."""
    audio = write_wav(tmp_path / "talk.wav", 2.0, 3)
    cmd = [sys.executable, "-m", "mlx_qwen3asr.cli.main", "live", "-", "--model", ckpt, "--txt", "--no-vad"]
    proc = subprocess.Popen(
        [*cmd, "--name", "later"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(line.decode() for line in proc.stderr), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while not any("loading model" in line for line in lines):
            assert proc.poll() is None, lines
            assert time.monotonic() < deadline, f"the model was not loaded while waiting: {lines}"
            time.sleep(0.05)
        assert lines[0] == "mlxasr live: waiting for audio on standard input\n"
        proc.stdin.write(raw_pcm(audio))
        proc.stdin.close()
        status = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(timeout=30)
    assert status == 0, lines
    assert (tmp_path / "later.txt").read_text(encoding="utf-8").strip()


# --- a long file, read as it is played ----------------------------------------------------------------


def test_input_file_is_read_as_it_is_played_in_bounded_memory(tmp_path, monkeypatch, capsys):
    """--input decodes a block at a time as the session takes the audio (as mlxasr keeps long files
    on disk): the first audio reaches the transcriber before the file is read to its end, and memory
    stays far under that of the decoded file (10 minutes: 38 MB of float32)."""
    import tracemalloc

    path = tmp_path / "long.wav"
    rng = np.random.default_rng(0)
    with sf.SoundFile(path, "w", 16000, 1, subtype="PCM_16") as f:
        for _ in range(10):
            f.write((0.1 * rng.standard_normal(60 * 16000)).astype(np.float32))
    reads = []
    read = sf.SoundFile.read
    monkeypatch.setattr(sf.SoundFile, "read", lambda self, *a, **k: reads.append(1) or read(self, *a, **k))

    class Transcriber:  # takes the audio, decodes nothing
        def __init__(self, model, **kwargs):
            self.segments, self.speech, self.samples, self.reads_at_first = [], [], 0, None

        def feed(self, block):
            if self.reads_at_first is None:
                self.reads_at_first = len(reads)
            self.samples += block.shape[0]
            return []

        def finish(self):
            made.append(self)
            return live.StreamUpdate(language="", text="", stable="", unstable="", final=True)

    made = []
    monkeypatch.setattr(live, "StreamingTranscriber", Transcriber)
    monkeypatch.setattr(live, "load_model", lambda *args, **kwargs: object())
    tracemalloc.start()
    try:
        status = main(["live", "--input", str(path), "--model", "stub", "-q"])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert status == 0, capsys.readouterr().err
    [transcriber] = made
    assert transcriber.samples == 10 * 60 * 16000
    assert len(reads) > 100 and transcriber.reads_at_first <= 3
    assert peak < 10_000_000, f"{peak / 1e6:.1f} MB at the peak"


# --- -o DIR and --name ----------------------------------------------------------------------------------


def test_o_is_the_output_folder_as_for_mlxasr_and_name_the_outputs_name(tmp_path, ckpt, monkeypatch, capsys):
    audio = write_wav(tmp_path / "talk.wav", 1.5, 2)
    assert main(["live", "--input", str(audio), "--model", ckpt, "-o", str(tmp_path / "out"), "-q"]) == 0
    assert (tmp_path / "out" / "talk.txt").is_file() and not (tmp_path / "out.txt").exists()
    args = ["live", "--input", str(audio), "--model", ckpt, "--json", "-q"]
    assert main([*args, "-o", str(tmp_path / "out"), "--name", "meeting"]) == 0
    assert (tmp_path / "out" / "meeting.json").is_file()

    (tmp_path / "in").write_bytes(raw_pcm(audio))
    with open(tmp_path / "in", "rb") as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        assert main(["live", "-", "--model", ckpt, "--srt", "-o", str(tmp_path / "piped"), "-q"]) == 0
    assert (tmp_path / "piped" / "stdin.srt").is_file()
    capsys.readouterr()


@pytest.mark.parametrize(
    "name, reason",
    [
        ("a/b", "give a file name without folder"),
        ("a\\b", "give a file name without folder"),
        ("..", "give a file name without folder"),
        ("", "give a file name without folder"),
        ("x\ny", "a control character (a newline, a tab, ...) is in it"),
        ("x\ty", "a control character"),
        ("x\x1b[2Jy", "a control character"),
    ],
)
def test_a_name_that_is_no_plain_file_name_is_a_usage_error(tmp_path, name, reason, capsys):
    audio = write_wav(tmp_path / "talk.wav", 1.0, 2)
    status = main(["live", "--input", str(audio), "--model", "not-loaded", "--name", name])
    err = capsys.readouterr().err.splitlines()
    assert status == 2
    # One line: the name shown escaped.
    assert len(err) == 1 and err[0].startswith(f"mlxasr live: error: --name {name!r}: {reason}"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["talk.wav"]


def test_a_known_extension_is_dropped_from_the_name(tmp_path, monkeypatch, capsys):
    from mlx_qwen3asr.cli.live_names import outputs_name

    assert [outputs_name(n) for n in ("in.wav", "talk.M4A", "notes.srt", "a.b.json", "v1.2", "talk")] == [
        "in",
        "talk",
        "notes",
        "a.b",
        "v1.2",
        "talk",
    ]
    audio = write_wav(tmp_path / "talk.wav", 1.0, 2)

    class Transcriber:  # decodes nothing
        def __init__(self, model, **kwargs):
            self.segments, self.speech = [], []

        def feed(self, block):
            return []

        def finish(self):
            return live.StreamUpdate(language="", text="", stable="", unstable="", final=True)

    monkeypatch.setattr(live, "StreamingTranscriber", Transcriber)
    monkeypatch.setattr(live, "load_model", lambda *args, **kwargs: object())
    status = main(["live", "--input", str(audio), "--model", "stub", "--name", "in.wav", "--txt", "-q"])
    assert status == 0, capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "talk.wav"]


def test_outside_a_terminal_each_committed_text_is_printed_once(tmp_path, monkeypatch, capsys):
    said = [Segment(0.0, 2.0, "first words", "English"), Segment(2.0, 3.5, "last words", "English")]

    class Transcriber:  # commits one segment while the audio comes, the other at the end
        def __init__(self, model, **kwargs):
            self.segments, self.speech = [], []

        def feed(self, block):
            if self.segments:
                return []
            self.segments.append(said[0])
            return [live.StreamUpdate("English", "first words", "first words", "", committed=[said[0]])]

        def finish(self):
            self.segments.append(said[1])
            text = "first words last words"
            return live.StreamUpdate("English", text, text, "", final=True, committed=[said[1]])

    monkeypatch.setattr(live, "StreamingTranscriber", Transcriber)
    monkeypatch.setattr(live, "load_model", lambda *args, **kwargs: object())
    audio = write_wav(tmp_path / "talk.wav", 3.5, 2)
    assert main(["live", "--input", str(audio), "--model", "stub", "--no-vad"]) == 0
    captured = capsys.readouterr()
    assert not sys.stdout.isatty()
    assert captured.out.splitlines() == [live.segment_line(s) for s in said]
    assert "first words" not in captured.err and "last words" not in captured.err
