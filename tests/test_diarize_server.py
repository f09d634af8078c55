"""mlxasr serve --diarize: OpenAI's diarized_json (segments with speaker, start, end, text), streamed
transcript.text.segment events, known_speaker_names[], chunking_strategy, known_speaker_references[]
refused, diarization beside transcription, a failure that fails its request alone, and the start errors,
through the official openai client on a real uvicorn server. The diarizer is a stand-in (no model is
downloaded)."""

from __future__ import annotations

import threading
import time

import httpx
import numpy as np
import openai
import pytest
from scripted import Swappable, script_batches
from test_diarize_cli import StandIn, Turn
from test_server import KEY, Served, error_of, wav_file

import mlx_qwen3asr
import mlx_qwen3asr.cli.diarizing as diarizing
from mlx_qwen3asr.pipeline.engine import Engine
from mlx_qwen3asr.serve.app import Speakers, create_app

SAID = "So the first thing I want to talk about today, is the budget for next year."
STAGES = Swappable()


class Diarizer:
    """The server's stand-in diarizer: speaker 0 for the first half of the audio, speaker 1 for the rest,
    after `sleep` seconds; `fail` makes it raise. calls: (seconds of audio, start, end); speech: the
    speech= of each call (None: the server runs without speech detection)."""

    def __init__(self) -> None:
        self.sleep, self.fail = 0.0, False
        self.calls: list[tuple[float, float, float]] = []
        self.speech: list = []

    def __call__(self, samples: np.ndarray, options, *, speech=None) -> list[Turn]:
        t0 = time.monotonic()
        self.speech.append(speech)
        time.sleep(self.sleep)
        seconds = samples.shape[0] / 16000
        self.calls.append((seconds, t0, time.monotonic()))
        if self.fail:
            raise RuntimeError("the stand-in diarizer failed")
        return [Turn(0.0, seconds / 2, 0), Turn(seconds / 2, seconds, 1)]


DIARIZER = Diarizer()


@pytest.fixture(scope="module")
def model(checkpoints):
    return mlx_qwen3asr.load(checkpoints("tiny"))


@pytest.fixture(scope="module")
def served(model, tmp_path_factory):
    uploads = tmp_path_factory.mktemp("uploads")
    engine = Engine(model, vad=False, parts=STAGES.parts)
    speakers = Speakers(DIARIZER, StandIn())
    app = create_app(engine, model_id="m", api_key=KEY, upload_dir=uploads, speakers=speakers)
    s = Served(app, engine, uploads)
    yield s
    s.stop()
    speakers.close()


@pytest.fixture
def server(served, model, monkeypatch):
    """The model says SAID for every segment; the diarizer starts each test plain."""
    forced = model.tokenizer.token_to_id("<asr_text>")
    say = script_batches(
        lambda prompt: model.tokenizer.encode(
            SAID if forced in prompt else f"language English<asr_text>{SAID}"
        )
    )
    monkeypatch.setattr(STAGES, "batch", say.batch)
    monkeypatch.setattr("mlx_qwen3asr.model.batch.LOOP_CHECK_EVERY", 10**9)
    DIARIZER.sleep, DIARIZER.fail = 0.0, False
    DIARIZER.calls.clear()
    DIARIZER.speech.clear()
    yield served
    deadline = time.monotonic() + 10
    while served.uploads() or served.engine.queued_seconds():
        assert time.monotonic() < deadline, f"left behind: {served.uploads()}"
        time.sleep(0.02)


def test_diarized_json_through_the_openai_client(server, tmp_path):
    path = wav_file(tmp_path, 40.0, seed=4)  # two segments: about 0-30 s and 30-40 s
    client = server.client()
    with open(path, "rb") as f:
        result = client.audio.transcriptions.create(
            model="gpt-4o-transcribe-diarize",
            file=f,
            response_format="diarized_json",
            chunking_strategy="auto",
        )
    assert isinstance(result, openai.types.audio.TranscriptionDiarized)
    assert result.task == "transcribe" and result.duration == pytest.approx(40.0)
    assert result.text == f"{SAID} {SAID}"
    assert [s.type for s in result.segments] == ["transcript.text.segment"] * 2
    assert [s.id for s in result.segments] == ["seg_0", "seg_1"]
    assert [s.text for s in result.segments] == [SAID, SAID]
    assert [s.speaker for s in result.segments] == ["A", "B"]  # OpenAI's labels without names
    assert result.segments[0].start == 0.0 and result.segments[1].end == pytest.approx(40.0)
    assert 20 < result.segments[0].end == result.segments[1].start < 40
    assert result.usage.type == "duration" and result.usage.seconds == pytest.approx(40.0)
    assert [round(c[0], 2) for c in DIARIZER.calls] == [40.0]
    assert DIARIZER.speech == [None]  # the server runs without speech detection: all the audio

    # known_speaker_names[] name the speakers in the order they first speak; the server_vad object the
    # openai client sends as chunking_strategy[...] fields is accepted.
    with open(path, "rb") as f:
        named = client.audio.transcriptions.create(
            model="m",
            file=f,
            response_format="diarized_json",
            known_speaker_names=["Ana"],
            chunking_strategy={"type": "server_vad", "threshold": 0.4, "silence_duration_ms": 300},
        )
    assert [s.speaker for s in named.segments] == ["Ana", "B"]

    # Other formats are not diarized: the diarizer is not called for them.
    DIARIZER.calls.clear()
    with open(path, "rb") as f:
        assert client.audio.transcriptions.create(model="m", file=f).text == result.text
    assert DIARIZER.calls == []


def test_a_streamed_diarized_answer_sends_the_segments_with_their_speakers(server, tmp_path):
    path = wav_file(tmp_path, 40.0, seed=4)
    with open(path, "rb") as f:
        events = list(
            server.client().audio.transcriptions.create(
                model="m",
                file=f,
                response_format="diarized_json",
                stream=True,
                known_speaker_names=["Ana", "Bo"],
            )
        )
    types = [e.type for e in events]
    assert types == ["transcript.text.delta"] * 2 + ["transcript.text.segment"] * 2 + ["transcript.text.done"]
    segments = [e for e in events if e.type == "transcript.text.segment"]
    assert [(s.speaker, s.text) for s in segments] == [("Ana", SAID), ("Bo", SAID)]
    assert events[-1].text == f"{SAID} {SAID}"


def test_diarization_runs_beside_the_transcription(server, monkeypatch, tmp_path):
    """The request's audio is diarized while the engine transcribes it: a 2 s diarizer and a 2 s
    transcription answer in about 2 s, not 4."""
    steps: list[tuple[float, float]] = []
    slow = STAGES.batch

    class Slow(slow):
        def step(self):
            t0 = time.monotonic()
            time.sleep(2.0)
            steps.append((t0, time.monotonic()))
            return super().step()

    monkeypatch.setattr(STAGES, "batch", Slow)
    DIARIZER.sleep = 2.0
    path = wav_file(tmp_path, 6.0, seed=1)
    response = server.post(
        files={"file": ("talk.wav", path.read_bytes())},
        data={"model": "m", "response_format": "diarized_json"},
    )
    assert response.status_code == 200 and [s["speaker"] for s in response.json()["segments"]] == ["A"]
    (_, d0, d1), (s0, s1) = DIARIZER.calls[0], steps[0]
    assert min(d1, s1) - max(d0, s0) > 1.0  # they overlapped by more than half of each


def test_a_failed_diarization_fails_its_request_alone(server, tmp_path):
    path = wav_file(tmp_path, 4.0, seed=2)
    DIARIZER.fail = True
    response = server.post(
        files={"file": ("talk.wav", path.read_bytes())},
        data={"model": "m", "response_format": "diarized_json"},
    )
    assert response.status_code == 500
    error = error_of(response)
    assert error["code"] == "diarization_failed" and "stand-in" not in error["message"]
    DIARIZER.fail = False
    again = server.post(
        files={"file": ("talk.wav", path.read_bytes())},
        data={"model": "m", "response_format": "diarized_json"},
    )
    assert again.status_code == 200 and again.json()["segments"][0]["speaker"] == "A"


def test_a_hundred_known_speaker_names_are_taken_and_one_more_is_refused_naming_the_field(server, tmp_path):
    """The documented 100 names, with every other field a request can send; the 101st is a 400 whose
    param names known_speaker_names[]."""
    path = wav_file(tmp_path, 40.0, seed=4)  # two speakers
    names = [f"Speaker {k}" for k in range(100)]
    fields = {
        "model": "m",
        "response_format": "diarized_json",
        "language": "en",
        "prompt": "A meeting.",
        "temperature": "0",
        "stream": "false",
        "timestamp_granularities[]": ["segment", "word"],
        "chunking_strategy[type]": "server_vad",
        "chunking_strategy[threshold]": "0.5",
        "chunking_strategy[prefix_padding_ms]": "300",
        "chunking_strategy[silence_duration_ms]": "500",
        "include[]": "logprobs",
    }
    response = server.post(
        files={"file": ("talk.wav", path.read_bytes())}, data={**fields, "known_speaker_names[]": names}
    )
    assert response.status_code == 200, response.text
    assert [s["speaker"] for s in response.json()["segments"]] == names[:2]

    response = server.post(
        files={"file": ("talk.wav", path.read_bytes())},
        data={**fields, "known_speaker_names[]": [*names, "One more"]},
    )
    assert response.status_code == 400
    error = error_of(response)
    assert error["param"] == "known_speaker_names[]" and "at most 100" in error["message"]
    assert len(DIARIZER.calls) == 1


@pytest.mark.parametrize(
    "data, param, words",
    [
        (
            {"known_speaker_names[]": "Ana", "known_speaker_references[]": "data:audio/wav;base64,UklGRg=="},
            "known_speaker_references[]",
            "does not match voices to names",
        ),
        ({"known_speaker_names[]": ["Ana", "Ana"]}, "known_speaker_names[]", "'Ana' twice"),
        ({"known_speaker_names[]": ["Ana", " "]}, "known_speaker_names[]", "an empty name"),
        ({"chunking_strategy": "manual"}, "chunking_strategy", "unsupported chunking_strategy 'manual'"),
        (
            {"chunking_strategy": '{"type": "server_vad", "threshold": 2}'},
            "chunking_strategy[threshold]",
            "0 to 1",
        ),
        ({"chunking_strategy[type]": "client_vad"}, "chunking_strategy[type]", "must be server_vad"),
        (
            {"chunking_strategy[type]": "server_vad", "chunking_strategy[speed]": "1"},
            "chunking_strategy[speed]",
            "unknown",
        ),
    ],
)
def test_diarization_fields_that_cannot_be_honoured_are_400(server, tmp_path, data, param, words):
    path = wav_file(tmp_path, 1.0)
    response = server.post(
        files={"file": ("talk.wav", path.read_bytes())},
        data={"model": "m", "response_format": "diarized_json", **data},
    )
    assert response.status_code == 400
    error = error_of(response)
    assert error["param"] == param and words in error["message"]
    assert DIARIZER.calls == []


def test_a_server_without_a_diarizer_refuses_diarized_json(model, tmp_path):
    engine = Engine(model, vad=False)
    app = create_app(engine, model_id="m", api_key=KEY, upload_dir=tmp_path / "up")
    (tmp_path / "up").mkdir()
    s = Served(app, engine, tmp_path / "up")
    try:
        path = wav_file(tmp_path, 1.0)
        response = s.post(
            files={"file": ("talk.wav", path.read_bytes())},
            data={"model": "m", "response_format": "diarized_json"},
        )
        assert response.status_code == 400
        error = error_of(response)
        assert error["code"] == "diarization_unavailable" and "--diarize" in error["message"]
        health = httpx.get(f"{s.url}/health", headers={"Authorization": f"Bearer {KEY}"}).json()
        assert health["diarization"] is False
    finally:
        s.stop()


def test_serve_diarize_without_the_library_is_one_line_and_status_2(checkpoints, monkeypatch, capsys):
    import mlx_qwen3asr.cli.loading as cli_loading
    import mlx_qwen3asr.cli.serve as cli_serve

    monkeypatch.setattr(cli_loading, "load_model", lambda *a: pytest.fail("the model was loaded"))

    def missing():
        raise diarizing.Unavailable(f"speaker diarization is not installed; {diarizing.INSTALL}")

    monkeypatch.setattr(diarizing, "library", missing)
    args = ["--model", str(checkpoints("tiny")), "--port", "0", "--no-aligner"]
    assert cli_serve.main([*args, "--diarize"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and diarizing.INSTALL in err

    lib = StandIn()

    def unavailable(path=None, **options):
        raise lib.DiarizerUnavailable(
            f"diarization needs a package that is not installed: {diarizing.INSTALL}"
        )

    lib.load_diarizer = unavailable
    monkeypatch.setattr(diarizing, "library", lambda: lib)
    assert cli_serve.main([*args, "--diarize", "--diarizer", "dia"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        err[-1]
        == f"mlxasr serve: error: diarization needs a package that is not installed: {diarizing.INSTALL}"
    )

    assert cli_serve.main([*args, "--diarizer", "dia"]) == 2  # a usage error without --diarize
    assert "argument --diarizer: has no effect without --diarize" in capsys.readouterr().err


def test_serve_diarize_end_to_end_with_the_library(checkpoints, monkeypatch, tmp_path):
    """mlxasr serve --diarize --diarizer DIR, in process, with speakrs itself on the random-weight model
    files of `tools/make_checkpoint.py --preset diarizer`: diarized_json segments name their speakers."""
    pytest.importorskip("speakrs")
    import mlx_qwen3asr.cli.serve as cli_serve
    from tools.make_checkpoint import write_diarizer

    models = write_diarizer(tmp_path / "dia")
    import uvicorn

    servers = []
    real_server = uvicorn.Server

    class Recorded(real_server):
        def __init__(self, cfg):
            super().__init__(cfg)
            servers.append(self)

    monkeypatch.setattr(uvicorn, "Server", Recorded)
    status = []
    args = ["--model", str(checkpoints("tiny")), "--port", "0", "--no-aligner", "--no-vad", "--api-key", KEY]
    thread = threading.Thread(
        target=lambda: status.append(cli_serve.main([*args, "--diarize", "--diarizer", str(models)])),
        daemon=True,
    )
    thread.start()
    try:
        deadline = time.monotonic() + 120
        while not (servers and servers[0].started):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        port = servers[0].servers[0].sockets[0].getsockname()[1]
        path = wav_file(tmp_path, 8.0)
        response = httpx.post(
            f"http://127.0.0.1:{port}/v1/audio/transcriptions",
            files={"file": ("talk.wav", path.read_bytes())},
            data={"model": "m", "response_format": "diarized_json"},
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=120,
        )
        assert response.status_code == 200, response.text
        body = response.json()
        segments = body["segments"]
        assert segments and " ".join(s["text"] for s in segments) == body["text"]
        labels = list(dict.fromkeys(s["speaker"] for s in segments))
        assert labels == ["A", "B", "C", "D"][: len(labels)]  # OpenAI's letters, in order of first appearance
        health = httpx.get(f"http://127.0.0.1:{port}/health", headers={"Authorization": f"Bearer {KEY}"})
        assert health.json()["diarization"] is True
    finally:
        for server in servers:
            server.should_exit = True
        thread.join(60)
    assert status == [0]


def test_a_library_job_with_diarize_names_its_speakers(model, monkeypatch, tmp_path):
    """POST /v1/jobs with diarize, num_speakers and speaker_names: the transcript filed in the library has
    the named speakers on its segments, and they export (RTTM, Markdown)."""
    from mlx_qwen3asr.library.store import Library

    forced = model.tokenizer.token_to_id("<asr_text>")
    say = script_batches(
        lambda prompt: model.tokenizer.encode(
            SAID if forced in prompt else f"language English<asr_text>{SAID}"
        )
    )
    monkeypatch.setattr(STAGES, "batch", say.batch)
    library = Library(tmp_path / "library")
    engine = Engine(model, vad=False, parts=STAGES.parts, max_segment_seconds=4.0)  # two segments
    options: list = []

    class Counting(Diarizer):
        def __call__(self, samples, opts, *, speech=None):
            options.append(opts)
            return super().__call__(samples, opts, speech=speech)

    speakers = Speakers(Counting(), StandIn())
    app = create_app(
        engine, model_id="m", api_key=KEY, upload_dir=tmp_path / "up", speakers=speakers, library=library
    )
    (tmp_path / "up").mkdir()
    s = Served(app, engine, tmp_path / "up")
    auth = {"Authorization": f"Bearer {KEY}"}
    try:
        wav = wav_file(tmp_path, 8.0, seed=3)
        with open(wav, "rb") as f:
            r = httpx.post(
                f"{s.url}/v1/jobs",
                files={"file": ("meeting.wav", f)},
                data={"diarize": "true", "num_speakers": "2", "speaker_names": "Ana, Bo"},
                headers=auth,
            )
        assert r.status_code == 202, r.text
        job_id = r.json()["id"]
        deadline = time.monotonic() + 120
        while (job := httpx.get(f"{s.url}/v1/jobs/{job_id}", headers=auth).json())["status"] not in (
            "done",
            "failed",
        ):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert job["status"] == "done", job
        doc = httpx.get(f"{s.url}/v1/transcripts/{job['transcript_id']}", headers=auth).json()
        assert doc["speakers"] == ["Ana", "Bo"] and {seg["speaker"] for seg in doc["segments"]} <= {
            "Ana",
            "Bo",
        }
        assert options and options[-1].num_speakers == 2
        rttm = httpx.get(
            f"{s.url}/v1/transcripts/{doc['id']}/export", params={"format": "rttm"}, headers=auth
        )
        assert rttm.status_code == 200 and "Ana" in rttm.text
        md = httpx.get(f"{s.url}/v1/transcripts/{doc['id']}/export", params={"format": "md"}, headers=auth)
        assert "**Ana**" in md.text
        bad = httpx.post(
            f"{s.url}/v1/jobs", files={"file": ("a.wav", b"RIFF")}, data={"num_speakers": "0"}, headers=auth
        )
        assert bad.status_code == 400 and error_of(bad)["param"] == "num_speakers"
    finally:
        s.stop()
        speakers.close()
        library.close()
