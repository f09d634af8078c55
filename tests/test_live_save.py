"""A live session over the realtime WebSocket saved to the library (`"save": true`): the transcript it
ends with is filed whole, with its audio as a 16-bit WAV; a server without a library refuses the
setting; a save that fails (a full disk) ends the session normally with one error event and leaves
nothing behind in the library."""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile as sf
import test_server_live as live_tests
from test_server_live import URL, auth, client, frames, run_stream, signal

from mlx_qwen3asr.library.store import Library
from mlx_qwen3asr.serve import live_save

# The live server tests' fixtures: the tiny model, and apps on fresh engines.
model = live_tests.model
make = live_tests.make


@pytest.fixture
def library(tmp_path):
    with Library(tmp_path / "library") as lib:
        yield lib


def session(app, *, save: bool) -> tuple[list[dict], int, np.ndarray]:
    audio = signal(3.0, seed=4)
    with client(app) as c, c.websocket_connect(URL, headers=auth()) as ws:
        assert ws.receive_json()["type"] == "transcription_session.created"
        ws.send_json({"type": "transcription_session.update", "session": {"save": save}})
        updated = ws.receive_json()
        assert updated["type"] == "transcription_session.updated" and updated["session"]["save"] is save
        events, code = run_stream(ws, frames(audio))
    return events, code, audio


def test_a_saved_session_is_filed_with_its_transcript_and_audio(make, library):
    app = make(library=library)
    events, code, audio = session(app, save=True)
    assert code == 1000
    kinds = [e["type"] for e in events]
    assert kinds[-3:] == [
        "transcription_session.transcript",
        "transcription_session.saved",
        "transcription_session.finished",
    ]
    transcript = events[-3]["transcript"]
    tid = events[-2]["transcript_id"]
    stored = library.get(tid)
    assert stored["title"].startswith("Live captions ")
    assert stored["text"] == transcript["text"]
    assert [s["text"] for s in stored["segments"]] == [s["text"] for s in transcript["segments"]]
    wav = library.audio_path(tid)
    assert wav.suffix == ".wav"
    kept, rate = sf.read(wav, dtype="float32")
    assert rate == 16000 and sf.info(wav).subtype == "PCM_16"
    sent = np.frombuffer(b"".join(frames(audio)), dtype="<i2").astype(np.float32) / 32768.0
    assert kept.shape == sent.shape and np.abs(kept - sent).max() < 1.0 / 16384
    # Nothing else in the library's audio folder: no temporary file left.
    assert sorted(p.name for p in library.audio_folder.iterdir()) == [wav.name]


def test_without_save_nothing_is_filed(make, library):
    app = make(library=library)
    events, code, _ = session(app, save=False)
    assert code == 1000 and "transcription_session.saved" not in [e["type"] for e in events]
    assert library.list()[1] == 0


def test_save_on_a_server_without_a_library_is_refused(make):
    app = make()
    with client(app) as c, c.websocket_connect(URL, headers=auth()) as ws:
        ws.receive_json()
        ws.send_json({"type": "transcription_session.update", "session": {"save": True}})
        error = ws.receive_json()
    assert error["type"] == "error" and error["error"]["code"] == "invalid_session"
    assert error["error"]["message"] == "the server keeps no transcript library"


def test_a_save_that_fails_ends_the_session_normally_with_one_error(make, library, monkeypatch, caplog):
    real_write = live_save.sf.SoundFile.write

    def full(self, data):  # the disk fills while the audio is written
        real_write(self, data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(live_save.sf.SoundFile, "write", full)
    app = make(library=library)
    events, code, _ = session(app, save=True)
    assert code == 1000
    assert [e["type"] for e in events][-3:] == [
        "transcription_session.transcript",
        "error",
        "transcription_session.finished",
    ]
    assert events[-2]["error"]["code"] == "save_failed"
    assert library.list()[1] == 0
    assert list(library.audio_folder.iterdir()) == []
    lines = [r.getMessage() for r in caplog.records if "not saved" in r.getMessage()]
    assert len(lines) == 1 and "No space left on device" in lines[0] and "\n" not in lines[0]


def test_the_session_setting_must_be_a_boolean(make, library):
    app = make(library=library)
    with client(app) as c, c.websocket_connect(URL, headers=auth()) as ws:
        ws.receive_json()
        ws.send_text(json.dumps({"type": "transcription_session.update", "session": {"save": "yes"}}))
        error = ws.receive_json()
    assert error["error"]["code"] == "invalid_event"
