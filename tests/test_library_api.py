"""The library's HTTP API on the real server (uvicorn on 127.0.0.1) and the real SQLite: jobs from upload to
transcript, their events, edits with revisions, search, re-timing, the kept audio with HTTP Range, every
export read back by its parser, and hostile requests."""

from __future__ import annotations

import csv
import functools
import io
import json
import sqlite3
import threading
import time

import docx
import httpx
import pytest
import srt
import webvtt
from scripted import Swappable, script_batches
from test_server import KEY, MODEL_ID, Served, said, wav_file

import mlx_qwen3asr
from mlx_qwen3asr.library.store import Library
from mlx_qwen3asr.pipeline.alignment import align_segments
from mlx_qwen3asr.pipeline.engine import Engine
from mlx_qwen3asr.serve.app import create_app

STAGES = Swappable()
HEADERS = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def model(checkpoints):
    return mlx_qwen3asr.load(checkpoints("tiny"))


@pytest.fixture(scope="module")
def aligner(checkpoints):
    return mlx_qwen3asr.load(checkpoints("aligner-tiny"))


@pytest.fixture(scope="module")
def served(model, aligner, tmp_path_factory):
    library = Library(tmp_path_factory.mktemp("library"))
    uploads = tmp_path_factory.mktemp("uploads")
    engine = Engine(model, aligner=aligner, vad=False, parts=STAGES.parts)
    app = create_app(
        engine,
        model_id=MODEL_ID,
        api_key=KEY,
        upload_dir=uploads,
        library=library,
        max_job_upload_bytes=8 << 20,
    )
    s = Served(app, engine, uploads)
    s.library = library
    yield s
    s.stop()
    library.close()


@pytest.fixture
def api(served, model, monkeypatch):
    """The server with decoding scripted to say a sentence (random weights say nothing searchable)."""
    monkeypatch.setattr(STAGES, "batch", script_batches(said(model.tokenizer)).batch)
    return served


def call(s: Served, method: str, path: str, **kwargs) -> httpx.Response:
    kwargs.setdefault("headers", HEADERS)
    return httpx.request(method, s.url + path, timeout=60, **kwargs)


def submit(s: Served, wav, **fields) -> str:
    with open(wav, "rb") as f:
        r = call(s, "POST", "/v1/jobs", files={"file": (wav.name, f, "audio/wav")}, data=fields)
    assert r.status_code == 202, r.text
    body = r.json()
    assert body["status"] == "queued" and set(body) == {"id", "object", "status"}
    return body["id"]


def wait_done(s: Served, job_id: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        job = call(s, "GET", f"/v1/jobs/{job_id}").json()
        if job["status"] in ("done", "failed", "cancelled"):
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.05)


def error_of(r: httpx.Response) -> dict:
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert "\n" not in body["error"]["message"] and "Traceback" not in r.text
    return body["error"]


def test_a_job_becomes_a_transcript_with_its_audio_and_every_export(api, tmp_path):
    wav = wav_file(tmp_path, 3.0, seed=1, name="Interview one.wav")
    job_id = submit(api, wav, title="Interview one", language="English")
    events = []
    with httpx.stream("GET", f"{api.url}/v1/jobs/{job_id}/events", headers=HEADERS, timeout=60) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    assert events[-1]["status"] == "done" and events[-1]["transcript_id"]
    assert [e["progress"] for e in events] == sorted(e["progress"] for e in events)
    job = call(api, "GET", f"/v1/jobs/{job_id}").json()
    assert job["status"] == "done" and job["progress"] == 1.0 and job["error"] is None
    tid = job["transcript_id"]

    doc = call(api, "GET", f"/v1/transcripts/{tid}").json()
    assert doc["id"] == tid and doc["title"] == "Interview one" and doc["revision"] == 1
    assert "talk about today" in doc["text"] and doc["language"] == "English"
    assert [s["id"] for s in doc["segments"]] == list(range(len(doc["segments"])))
    assert {"cues", "model", "options", "segments", "duration"} <= set(doc) and doc["model"] == MODEL_ID

    listed = call(api, "GET", "/v1/transcripts").json()
    assert listed["object"] == "list" and tid in [t["id"] for t in listed["data"]]
    jobs = call(api, "GET", "/v1/jobs").json()
    assert jobs["object"] == "list" and job_id in [j["id"] for j in jobs["data"]]

    # The kept audio, whole and by range, as a browser seeks it.
    whole = call(api, "GET", f"/v1/transcripts/{tid}/audio")
    assert whole.status_code == 200 and whole.content == wav.read_bytes()
    part = call(api, "GET", f"/v1/transcripts/{tid}/audio", headers={**HEADERS, "Range": "bytes=100-1099"})
    assert part.status_code == 206 and part.content == wav.read_bytes()[100:1100]
    assert part.headers["content-range"] == f"bytes 100-1099/{wav.stat().st_size}"
    bad = call(api, "GET", f"/v1/transcripts/{tid}/audio", headers={**HEADERS, "Range": "bytes=99999999-"})
    assert bad.status_code == 416

    def exported(fmt: str) -> httpx.Response:
        r = call(api, "GET", f"/v1/transcripts/{tid}/export", params={"format": fmt})
        assert r.status_code == 200, (fmt, r.text)
        assert (
            "attachment" in r.headers["content-disposition"] and f".{fmt}" in r.headers["content-disposition"]
        )
        return r

    texts = [s["text"] for s in doc["segments"]]
    subs = list(srt.parse(exported("srt").text))
    assert subs and " ".join(s.content.replace("\n", " ") for s in subs).count("budget") == len(texts)
    cues = webvtt.from_buffer(io.StringIO(exported("vtt").text))
    assert len(cues) == len(subs)
    assert exported("txt").text.strip().startswith("So the first thing")
    rows = list(csv.reader(io.StringIO(exported("csv").content.decode("utf-8-sig"))))
    assert rows[0] == ["start", "end", "speaker", "text"] and [r[3] for r in rows[1:]] == texts
    paragraphs = [p.text for p in docx.Document(io.BytesIO(exported("docx").content)).paragraphs]
    assert paragraphs[0] == "Interview one" and all(any(t in p for p in paragraphs) for t in texts)
    assert exported("md").text.startswith("# Interview one")
    assert json.loads(exported("json").text)["segments"][0]["text"] == texts[0]
    no_speakers = call(api, "GET", f"/v1/transcripts/{tid}/export", params={"format": "rttm"})
    assert no_speakers.status_code == 400 and "speaker" in error_of(no_speakers)["message"]
    assert call(api, "GET", f"/v1/transcripts/{tid}/export", params={"format": "exe"}).status_code == 400


def test_two_jobs_finish_together_and_an_edit_during_a_job_is_kept(api, tmp_path):
    first = submit(api, wav_file(tmp_path, 2.0, seed=2), title="first")
    tid = wait_done(api, first)["transcript_id"]
    a = submit(api, wav_file(tmp_path, 4.0, seed=3), title="second")
    b = submit(api, wav_file(tmp_path, 3.0, seed=4), title="third")
    edited = call(api, "PATCH", f"/v1/transcripts/{tid}", json={"title": "first, renamed"})
    assert edited.status_code == 200 and edited.json()["revision"] == 2
    done = [wait_done(api, j) for j in (a, b)]
    assert [d["status"] for d in done] == ["done", "done"]
    titles = {t["title"] for t in call(api, "GET", "/v1/transcripts", params={"limit": 500}).json()["data"]}
    assert {"first, renamed", "second", "third"} <= titles
    assert call(api, "GET", f"/v1/transcripts/{tid}").json()["title"] == "first, renamed"


def test_edits_are_revisions_that_can_be_restored_and_speakers_renamed_everywhere(api, tmp_path):
    tid = wait_done(api, submit(api, wav_file(tmp_path, 2.0, seed=5), title="edits"))["transcript_id"]
    doc = call(api, "GET", f"/v1/transcripts/{tid}").json()
    original = doc["segments"][0]["text"]
    r = call(
        api, "PATCH", f"/v1/transcripts/{tid}", json={"segments": [{"id": 0, "text": "Corrected words."}]}
    )
    assert r.status_code == 200 and r.json()["segments"][0]["text"] == "Corrected words."
    assert r.json()["revision"] == 2
    r = call(api, "PATCH", f"/v1/transcripts/{tid}", json={"segments": [{"id": 0, "speaker": "SPEAKER_00"}]})
    assert r.json()["segments"][0]["speaker"] == "SPEAKER_00"
    r = call(api, "PATCH", f"/v1/transcripts/{tid}", json={"speaker_names": {"SPEAKER_00": "Ana"}})
    assert r.json()["segments"][0]["speaker"] == "Ana" and r.json()["revision"] == 4
    stale = call(api, "PATCH", f"/v1/transcripts/{tid}", json={"title": "x", "revision": 2})
    assert stale.status_code == 409
    revisions = call(api, "GET", f"/v1/transcripts/{tid}/revisions").json()["data"]
    assert [v["revision"] for v in revisions][:1] in ([4], [1]) and len(revisions) == 4
    first = call(api, "GET", f"/v1/transcripts/{tid}/revisions/1").json()
    assert first["segments"][0]["text"] == original
    restored = call(api, "POST", f"/v1/transcripts/{tid}/revisions/1/restore")
    assert restored.status_code == 200 and restored.json()["revision"] == 5
    assert restored.json()["segments"][0]["text"] == original
    assert len(call(api, "GET", f"/v1/transcripts/{tid}/revisions").json()["data"]) == 5
    assert call(api, "POST", f"/v1/transcripts/{tid}/revisions/99/restore").status_code == 404


def test_search_finds_segments_and_refuses_bad_syntax_with_a_400(api, tmp_path):
    tid = wait_done(api, submit(api, wav_file(tmp_path, 2.0, seed=6), title="searchable"))["transcript_id"]
    call(
        api,
        "PATCH",
        f"/v1/transcripts/{tid}",
        json={"segments": [{"id": 0, "text": "Le café de Zoë est fermé."}]},
    )
    hits = call(api, "GET", "/v1/transcripts", params={"q": "café"}).json()["data"]
    assert any(h["transcript_id"] == tid and h["segment_id"] == 0 and "<mark>" in h["snippet"] for h in hits)
    assert call(api, "GET", "/v1/transcripts", params={"q": "CAFÉ"}).json()["data"]
    for bad in ('"unclosed', "AND", "foo NOT"):
        r = call(api, "GET", "/v1/transcripts", params={"q": bad})
        assert r.status_code == 400 and error_of(r)["param"] == "q", bad
    injected = call(api, "GET", "/v1/transcripts", params={"q": "x'); DROP TABLE transcripts; --"})
    assert injected.status_code in (200, 400)
    assert call(api, "GET", f"/v1/transcripts/{tid}").status_code == 200


def test_retime_times_the_edited_segments_against_their_audio(api, monkeypatch, tmp_path):
    tid = wait_done(api, submit(api, wav_file(tmp_path, 3.0, seed=7), title="retime"))["transcript_id"]
    call(
        api,
        "PATCH",
        f"/v1/transcripts/{tid}",
        json={"segments": [{"id": 0, "text": "Budget talk for next year."}]},
    )

    def paced(aligner, prompts, features, keep_logits=False):
        import numpy as np

        return [
            np.array([c for i in range(len(p.timestamps) // 2) for c in (4 * i, 4 * i + 3)]) for p in prompts
        ]

    monkeypatch.setattr(
        "mlx_qwen3asr.library.retime.align_segments", functools.partial(align_segments, classes=paced)
    )
    r = call(api, "POST", f"/v1/transcripts/{tid}/retime", json={"segments": [0]})
    assert r.status_code == 200, r.text
    seg = r.json()["segments"][0]
    assert r.json()["retimed"] == [0] and seg["timing"] == "aligned"
    assert [w["text"] for w in seg["words"]] == ["Budget", "talk", "for", "next", "year."]
    starts = [w["start"] for w in seg["words"]]
    assert starts == sorted(starts) and seg["start"] <= starts[0] and starts[-1] <= seg["end"]
    assert call(api, "POST", f"/v1/transcripts/{tid}/retime", json={"segments": [999]}).status_code == 400
    assert call(api, "POST", f"/v1/transcripts/{tid}/retime", json={"segments": "0"}).status_code == 400


def test_a_job_can_be_cancelled_and_a_bad_file_fails_alone_in_one_line(api, tmp_path):
    bad = tmp_path / "notes.wav"
    bad.write_bytes(b"this is not audio at all" * 100)
    failed = wait_done(api, submit(api, bad))
    assert (
        failed["status"] == "failed" and "\n" not in failed["error"] and str(tmp_path) not in failed["error"]
    )
    good = wait_done(api, submit(api, wav_file(tmp_path, 1.0, seed=8)))
    assert good["status"] == "done"
    job_id = submit(api, wav_file(tmp_path, 30.0, seed=9))
    r = call(api, "DELETE", f"/v1/jobs/{job_id}")
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    assert wait_done(api, job_id)["status"] == "cancelled"
    assert call(api, "DELETE", "/v1/jobs/0123456789ab").status_code == 404


def test_hostile_requests_get_clear_errors_and_touch_no_file(api, tmp_path):
    for path in (
        "/v1/transcripts/..%2F..%2Fetc%2Fpasswd",
        "/v1/transcripts/%2E%2E",
        "/v1/transcripts/zzzz",
        "/v1/transcripts/0123456789ab/audio",
        "/v1/jobs/..%2Flibrary.sqlite3",
    ):
        r = call(api, "GET", path)
        assert r.status_code == 404, path
        error_of(r)
    assert call(api, "GET", "/v1/transcripts", headers={}).status_code == 401
    assert call(api, "GET", "/v1/transcripts", headers={**HEADERS, "Host": "evil.example"}).status_code == 421
    assert call(api, "GET", "/v1/transcripts", params={"limit": "-1"}).status_code == 400
    assert call(api, "GET", "/v1/transcripts", params={"limit": "x"}).status_code == 400
    assert call(api, "PATCH", "/v1/transcripts/0123456789ab", json={"title": "x"}).status_code == 404

    huge = "T" * 100_000
    tid = wait_done(api, submit(api, wav_file(tmp_path, 1.0, seed=10), title=huge))["transcript_id"]
    assert len(call(api, "GET", f"/v1/transcripts/{tid}").json()["title"]) <= 500
    for body in ([], {"segments": [{"id": "0", "text": "x"}]}, {"segments": [{"id": 0}]}, {"nope": 1}, {}):
        r = call(api, "PATCH", f"/v1/transcripts/{tid}", json=body)
        assert r.status_code == 400, body
        error_of(r)
    r = call(
        api,
        "PATCH",
        f"/v1/transcripts/{tid}",
        content=b"{not json",
        headers={**HEADERS, "Content-Type": "application/json"},
    )
    assert r.status_code == 400
    r = call(api, "PATCH", f"/v1/transcripts/{tid}", json={"title": "../../../tmp/owned"})
    assert r.status_code == 200 and not (tmp_path.parent / "owned").exists()
    files = {"file": ("x.wav", b"", "audio/wav")}
    assert call(api, "POST", "/v1/jobs", files=files).status_code == 400
    assert (
        call(api, "POST", "/v1/jobs", data={"title": "no file"}, files={"x": ("a", b"1")}).status_code == 400
    )
    r = call(api, "POST", "/v1/jobs", files={"file": ("a.wav", b"RIFF")}, data={"language": "Klingon"})
    assert r.status_code == 400 and error_of(r)["param"] == "language"
    r = call(api, "POST", "/v1/jobs", files={"file": ("a.wav", b"RIFF")}, data={"diarize": "true"})
    assert r.status_code == 400 and error_of(r)["param"] == "diarize"
    assert call(api, "DELETE", f"/v1/transcripts/{tid}").json()["deleted"] is True
    assert call(api, "GET", f"/v1/transcripts/{tid}").status_code == 404
    with sqlite3.connect(api.library.folder / "library.sqlite3") as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_concurrent_edits_and_reads_keep_the_database_whole(api, tmp_path):
    tid = wait_done(api, submit(api, wav_file(tmp_path, 1.0, seed=11), title="busy"))["transcript_id"]
    errors: list[str] = []

    def edit(i: int) -> None:
        for k in range(5):
            r = call(api, "PATCH", f"/v1/transcripts/{tid}", json={"title": f"t{i}-{k}"})
            if r.status_code != 200:
                errors.append(r.text)
            call(api, "GET", "/v1/transcripts", params={"q": "budget"})

    threads = [threading.Thread(target=edit, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert call(api, "GET", f"/v1/transcripts/{tid}").json()["revision"] == 21


def test_a_full_disk_refuses_a_job_with_507_and_fails_a_finishing_one_alone(api, monkeypatch, tmp_path):
    import errno

    import mlx_qwen3asr.library.jobs_table as jobs_table

    real = jobs_table.place_audio

    def full(source, folder, stem, *, move):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(jobs_table, "place_audio", full)
    wav = wav_file(tmp_path, 1.0, seed=12)
    with open(wav, "rb") as f:
        r = call(api, "POST", "/v1/jobs", files={"file": ("a.wav", f)})
    assert r.status_code == 507 and "\n" not in error_of(r)["message"]
    assert api.uploads() == []

    # Room for the job's audio, none for its transcript's: that job fails in one line, the next is done.
    def only_jobs(source, folder, stem, *, move):
        if folder == api.library.audio_folder:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(source, folder, stem, move=move)

    monkeypatch.setattr(jobs_table, "place_audio", only_jobs)
    failed = wait_done(api, submit(api, wav))
    assert (
        failed["status"] == "failed" and "\n" not in failed["error"] and str(tmp_path) not in failed["error"]
    )
    monkeypatch.setattr(jobs_table, "place_audio", real)
    assert wait_done(api, submit(api, wav))["status"] == "done"
    with sqlite3.connect(api.library.folder / "library.sqlite3") as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
