"""The page against the real server in a real browser (tests/browser.py), on random-weight checkpoints:
recordings dropped (several at once) go through the queue into the library with the options chosen;
a failed file shows its one line; search finds a transcript and opens it at the hit; a segment is
corrected in place and re-timed; undo and redo; rename, delete; every export format downloaded and
read back; and the server killed during a job comes back, the page reloaded, to finish it."""

from __future__ import annotations

import json
import re
import socket

import httpx
import pytest
import soundfile as sf
from browser import needs_browser, opened, ready, running, serve, until
from reference import test_signal

pytestmark = needs_browser

EXPORTS = ("txt", "srt", "vtt", "json", "rttm", "csv", "md", "docx")


def wav(folder, name: str, seconds: float, seed: int = 0):
    path = folder / name
    sf.write(path, test_signal(seconds, seed=seed), 16000)
    return path


@pytest.fixture(scope="module")
def served(checkpoints, tmp_path_factory):
    folder = tmp_path_factory.mktemp("web-library")
    with running(checkpoints, folder, "--no-vad") as server:
        yield server, folder


@pytest.fixture(scope="module")
def browser():
    from browser import chromium

    with chromium() as b:
        yield b


def api(server, path: str, method: str = "GET", **kwargs):
    r = httpx.request(method, server.url + path, timeout=60, **kwargs)
    assert r.status_code < 400, r.text
    return r.json()


def transcripts(server) -> list[dict]:
    return api(server, "/v1/transcripts?limit=100")["data"]


def test_dropped_recordings_go_through_the_queue_into_the_library(served, browser):
    server, folder = served
    files = [wav(folder, "lecture one.wav", 6.0, 1), wav(folder, "lecture two.wav", 4.0, 2)]
    broken = folder / "broken.wav"
    broken.write_bytes(b"RIFF\x00\x00\x00\x00WAVEnot audio at all")
    before = {t["id"] for t in transcripts(server)}
    with opened(browser, server.url) as page:
        ready(page)
        page.locator("#job-options summary").click()
        page.get_by_label("Language", exact=True).select_option("English")
        page.get_by_label("Context", exact=True).fill("Physics lecture")
        page.get_by_label("Choose recordings", exact=True).set_input_files([*map(str, files), str(broken)])
        for name in ("lecture one.wav", "lecture two.wav"):
            page.wait_for_selector(f"#queue li[data-state=done]:has-text('{name}')", timeout=120_000)
        failed = page.locator("#queue li[data-state=failed]")
        failed.wait_for(timeout=60_000)
        reason = failed.locator(".state").inner_text()
        assert "could not be read as audio" in reason and "\n" not in reason
        assert "broken.wav" in failed.inner_text()
        # Both in the list, newest first, and in the library with the options chosen.
        for title in ("lecture one", "lecture two"):
            page.locator(f"#transcripts .t-title:text-is('{title}')").wait_for()
        added = [t for t in transcripts(server) if t["id"] not in before]
        assert sorted(t["title"] for t in added) == ["lecture one", "lecture two"]
        jobs = api(server, "/v1/jobs?limit=10")["data"]
        done = [j for j in jobs if j["status"] == "done" and j["title"].startswith("lecture")]
        assert len(done) == 2
        assert all(
            j["options"]["language"] == "English" and j["options"]["context"] == "Physics lecture"
            for j in done
        )
        # The first one done opened in the reader, with its audio.
        page.wait_for_selector("#reader:not([hidden])")
        assert page.locator("#audio").get_attribute("src").endswith("/audio")


def test_a_queued_recording_can_be_cancelled(served, browser):
    server, folder = served
    long = wav(folder, "long talk.wav", 120.0, 3)
    with opened(browser, server.url) as page:
        ready(page)
        page.get_by_label("Choose recordings", exact=True).set_input_files(str(long))
        item = page.locator("#queue li", has_text="long talk.wav")
        page.wait_for_function(
            "() => [...document.querySelectorAll('#queue li')].some(li => /queued|transcribing/.test(li.textContent))"
        )
        page.get_by_role("button", name="Cancel long talk.wav").click()
        page.wait_for_selector("#queue li[data-state=cancelled]", timeout=60_000)
        assert "cancelled" in item.inner_text()
    assert not any(t["title"] == "long talk" for t in transcripts(server))


def test_search_as_you_type_opens_the_hit_at_its_time(served, browser):
    server, folder = served
    if not transcripts(server):
        api(
            server,
            "/v1/jobs",
            "POST",
            files={"file": ("seed.wav", wav(folder, "seed.wav", 5.0, 4).read_bytes())},
        )
        until(lambda: bool(transcripts(server)), 120)
    target = transcripts(server)[0]
    doc = api(server, f"/v1/transcripts/{target['id']}")
    # A word of letters only (random weights also write punctuation, which the search syntax reads).
    words = re.findall(r"[A-Za-z]{3,}", doc["text"])
    assert words, doc["text"]
    word = max(words, key=len)[:12]
    with opened(browser, server.url) as page:
        ready(page)
        page.get_by_label("Search transcripts", exact=True).press_sequentially(word, delay=30)
        # As you type, each prefix finds its hits; the whole word's arrive last.
        page.wait_for_function(
            """(word) => [...document.querySelectorAll('#transcripts .t-snippet mark')]
                .some(m => m.textContent.toLowerCase().includes(word))""",
            arg=word.lower(),
            timeout=10_000,
        )
        page.locator("#transcripts button").first.click()
        page.wait_for_selector("#reader:not([hidden])")
        page.wait_for_function("() => document.getElementById('audio').readyState >= 1")
        at = page.evaluate("document.getElementById('audio').currentTime")
        hits = api(server, f"/v1/transcripts?q={word}")["data"]
        assert at == pytest.approx(hits[0]["start"], abs=0.05)
        # Clearing the search lists every transcript again.
        page.get_by_label("Search transcripts", exact=True).fill("")
        page.wait_for_function("() => document.querySelectorAll('#transcripts .t-snippet').length === 0")


def test_correct_retime_undo_redo_rename_export_and_delete(served, browser, tmp_path):
    server, folder = served
    job = api(
        server,
        "/v1/jobs",
        "POST",
        files={"file": ("edit me.wav", wav(folder, "e.wav", 5.0, 5).read_bytes())},
        data={"timestamp_granularities[]": "word", "language": "English"},
    )
    until(lambda: api(server, f"/v1/jobs/{job['id']}")["status"] == "done", 120)
    tid = api(server, f"/v1/jobs/{job['id']}")["transcript_id"]
    with opened(browser, server.url) as page:
        ready(page)
        page.locator(f"#transcripts button[data-id='{tid}']").click()
        page.wait_for_selector("#reader:not([hidden])")
        original = api(server, f"/v1/transcripts/{tid}")
        box = page.get_by_label("Text of segment 1", exact=True)
        box.dblclick()
        page.keyboard.press("Control+a")
        page.keyboard.type("A corrected first line")
        page.keyboard.press("Enter")
        until(lambda: api(server, f"/v1/transcripts/{tid}")["revision"] == 2)
        assert api(server, f"/v1/transcripts/{tid}")["segments"][0]["text"] == "A corrected first line"
        # Re-time: the edited segment goes to the aligner.
        page.get_by_role("button", name="Re-time edited segments").click()
        page.wait_for_function(
            "() => /re-timed|not re-timed/.test(document.getElementById('status').textContent)"
        )
        assert "re-timed 1" in page.locator("#status").inner_text()
        retimed = api(server, f"/v1/transcripts/{tid}")
        assert retimed["revision"] == 3 and retimed["segments"][0]["timing"] == "aligned"
        # Undo twice back to the original text, redo once.
        page.get_by_role("button", name="Undo").click()
        page.get_by_role("button", name="Undo").click()
        until(
            lambda: (
                api(server, f"/v1/transcripts/{tid}")["segments"][0]["text"]
                == original["segments"][0]["text"]
            )
        )
        page.get_by_role("button", name="Redo").click()
        until(
            lambda: api(server, f"/v1/transcripts/{tid}")["segments"][0]["text"] == "A corrected first line"
        )
        # Rename.
        page.get_by_role("button", name="Rename").click()
        page.get_by_label("Title", exact=True).fill("Renamed talk")
        page.keyboard.press("Enter")
        page.wait_for_selector("#transcripts .t-title:text-is('Renamed talk')")
        assert page.locator("#title").inner_text() == "Renamed talk"
        # Every export format, downloaded and read back: what the server renders.
        # RTTM says who spoke when: not offered for a transcript without speakers.
        assert page.locator("#export-format option[value=rttm]").is_disabled()
        for fmt in EXPORTS:
            if fmt == "rttm":
                continue
            page.get_by_label("Export format", exact=True).select_option(fmt)
            with page.expect_download() as download:
                page.get_by_role("button", name="Download").click()
            saved = tmp_path / f"out.{fmt}"
            download.value.save_as(saved)
            assert download.value.suggested_filename == f"Renamed talk.{fmt}"
            expected = httpx.get(f"{server.url}/v1/transcripts/{tid}/export?format={fmt}", timeout=60)
            if fmt == "docx":
                import docx

                assert "A corrected first line" in "\n".join(p.text for p in docx.Document(saved).paragraphs)
            else:
                assert saved.read_bytes() == expected.content
        # Delete, after saying yes.
        page.get_by_role("button", name="Delete").click()
        page.get_by_role("button", name="Delete for good").click()
        page.wait_for_selector("#welcome:not([hidden])")
        page.locator(f"#transcripts button[data-id='{tid}']").wait_for(state="detached")
    assert httpx.get(f"{server.url}/v1/transcripts/{tid}", timeout=30).status_code == 404


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_server_killed_during_a_job_finishes_it_after_a_restart_and_a_reload(
    checkpoints, browser, tmp_path
):
    port = free_port()
    server = serve(checkpoints, tmp_path, "--no-vad", port=port)
    try:
        with opened(browser, server.url) as page:
            ready(page)
            page.get_by_label("Choose recordings", exact=True).set_input_files(
                str(wav(tmp_path, "interview.wav", 40.0, 6))
            )
            page.wait_for_function(
                "() => /transcribing/.test(document.getElementById('queue').textContent)", timeout=120_000
            )
            server.kill()
            page.wait_for_function(
                "() => /waiting for the server/.test(document.getElementById('queue').textContent)",
                timeout=30_000,
            )
            server = serve(checkpoints, tmp_path, "--no-vad", port=port, library=server.library)
            page.reload()
            ready(page)
            page.wait_for_selector("#queue li[data-state=done]:has-text('interview')", timeout=180_000)
            page.wait_for_selector("#transcripts .t-title:text-is('interview')")
    finally:
        server.stop()


def test_a_change_made_elsewhere_meanwhile_is_not_overwritten(served, browser):
    """Two windows on one transcript: the page's edit, made on an older revision, is refused (409), the
    page says so in one line and shows the transcript as it now is."""
    server, folder = served
    job = api(
        server,
        "/v1/jobs",
        "POST",
        files={"file": ("two.wav", wav(folder, "two.wav", 4.0, 8).read_bytes())},
        data={"language": "English"},
    )
    until(lambda: api(server, f"/v1/jobs/{job['id']}")["status"] == "done", 120)
    tid = api(server, f"/v1/jobs/{job['id']}")["transcript_id"]
    with opened(browser, f"{server.url}/#{tid}") as page:
        ready(page)
        page.wait_for_selector("#reader:not([hidden])")
        first = api(server, f"/v1/transcripts/{tid}")["segments"][0]["id"]
        api(
            server,
            f"/v1/transcripts/{tid}",
            "PATCH",
            json={"segments": [{"id": first, "text": "Changed elsewhere"}]},
        )
        page.get_by_label("Text of segment 1", exact=True).dblclick()
        page.keyboard.press("Control+a")
        page.keyboard.type("Changed here")
        page.keyboard.press("Enter")
        page.wait_for_function("() => /not saved/.test(document.getElementById('status').textContent)")
        assert "\n" not in page.locator("#status").inner_text()
        page.wait_for_function(
            "() => document.querySelector('[aria-label=\"Text of segment 1\"]').textContent === 'Changed elsewhere'"
        )
    assert api(server, f"/v1/transcripts/{tid}")["segments"][0]["text"] == "Changed elsewhere"


def test_a_file_past_the_server_s_limit_or_empty_is_refused_before_its_upload(served, browser):
    server, folder = served
    big = wav(folder, "too big.wav", 3.0, 9)
    empty = folder / "empty.wav"
    empty.write_bytes(b"")
    health = api(server, "/health")
    assert health["max_job_upload_bytes"] == 2048 * 1024 * 1024  # mlxasr serve's default

    def smaller_limit(route):  # a server started with --max-job-upload-mb 0.05
        route.fulfill(
            status=200,
            content_type="application/json",
            body=json.dumps({**health, "max_job_upload_bytes": 50_000}),
        )

    with opened(browser, server.url) as page:
        page.route("**/health", smaller_limit)
        page.reload()
        ready(page)
        posted = []
        page.on("request", lambda r: r.method == "POST" and posted.append(r.url))
        page.get_by_label("Choose recordings", exact=True).set_input_files([str(big), str(empty)])
        refused = page.locator("#queue li[data-state=failed]")
        refused.nth(1).wait_for()
        lines = refused.locator(".state").all_inner_texts()
        assert "the file is empty" in lines
        kb = round(big.stat().st_size / 1024)
        assert f"{kb} KB is larger than this server takes (49 KB; mlxasr serve --max-job-upload-mb)" in lines
        assert posted == []


def test_the_speaker_options_go_with_the_recording(served, browser):
    """With a diarizing server (its /health answered here as one would), the speaker options are offered
    and sent with the job; the server's refusal comes back as the file's one line."""
    server, folder = served
    health = api(server, "/health")
    assert health["diarization"] is False
    clip = wav(folder, "panel.wav", 2.0, 10)
    with opened(browser, server.url) as page:
        ready(page)
        assert page.get_by_label("Find speakers").is_disabled()  # this server has no diarizer
        body = json.dumps({**health, "diarization": True})
        page.route(
            "**/health", lambda route: route.fulfill(status=200, content_type="application/json", body=body)
        )
        sent = []

        def refuse(route):
            if route.request.method != "POST":
                route.continue_()
                return
            sent.append(route.request.post_data_buffer)
            error = {
                "error": {
                    "message": "diarization is not available on this server",
                    "type": "invalid_request_error",
                }
            }
            route.fulfill(status=400, content_type="application/json", body=json.dumps(error))

        page.route("**/v1/jobs", refuse)
        page.reload()
        ready(page)
        page.locator("#job-options summary").click()
        page.get_by_label("Find speakers").check()
        page.get_by_label("Number of speakers", exact=True).fill("3")
        page.get_by_label("Speaker names", exact=True).fill("Ana, Bo")
        page.get_by_label("Choose recordings", exact=True).set_input_files(str(clip))
        failed = page.locator("#queue li[data-state=failed]")
        failed.wait_for()
        assert failed.locator(".state").inner_text() == "diarization is not available on this server"
    form = sent[0].decode("latin-1")
    for name, value in (("diarize", "true"), ("num_speakers", "3"), ("speaker_names", "Ana, Bo")):
        assert f'name="{name}"\r\n\r\n{value}\r\n' in form
    assert 'filename="panel.wav"' in form
