"""Who may use the page and its API: the page's own files are served without the key (with their MIME
types, an ETag and a Content-Security-Policy that keeps the page on this server), everything else needs
it; in a real browser the page asks for the key once and keeps it for the tab, sends it on every call
and as OpenAI's subprotocol on the live WebSocket; a page of another origin cannot use the API."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import soundfile as sf
from browser import chromium, needs_browser, opened, ready, running
from reference import test_signal

from mlx_qwen3asr.serve.page import WEB

KEY = "page-key-7f3a"


@pytest.fixture(scope="module")
def served(checkpoints, tmp_path_factory):
    folder = tmp_path_factory.mktemp("web-access")
    with running(checkpoints, folder, "--no-vad", key=KEY) as server:
        yield server, folder


def test_the_page_files_need_no_key_and_carry_their_types_and_policy(served):
    server, _ = served
    index = httpx.get(server.url + "/", timeout=30)
    assert index.status_code == 200
    assert index.headers["content-type"] == "text/html; charset=utf-8"
    policy = index.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "script-src 'self'" in policy
    assert "connect-src 'self' ws://127.0.0.1:" in policy and "frame-ancestors 'none'" in policy
    assert index.headers["x-content-type-options"] == "nosniff"
    assert index.text == (WEB / "index.html").read_text(encoding="utf-8")
    types = {"app.js": "text/javascript", "app.css": "text/css", "pcm-worklet.js": "text/javascript"}
    for name, kind in types.items():
        r = httpx.get(f"{server.url}/static/{name}", timeout=30)
        assert r.status_code == 200 and r.headers["content-type"].startswith(kind), name
        assert r.content == (WEB / name).read_bytes()
        again = httpx.get(
            f"{server.url}/static/{name}", headers={"If-None-Match": r.headers["etag"]}, timeout=30
        )
        assert again.status_code == 304 and again.content == b""
    head = httpx.head(f"{server.url}/static/app.js", timeout=30)
    assert head.status_code == 200 and int(head.headers["content-length"]) == len(
        (WEB / "app.js").read_bytes()
    )
    # Only the page's own files: nothing else of the package, no way out of its folder.
    for path in ("/static/nothing.js", "/static/../page.py", "/static/%2e%2e/page.py", "/static/index.html"):
        r = httpx.get(server.url + path, timeout=30)
        assert r.status_code in (401, 404), path  # 401: a path outside the page's, which needs the key
        assert "import" not in r.text
    # The API still wants the key; the page's files do not give it away.
    assert httpx.get(server.url + "/health", timeout=30).status_code == 401
    assert KEY not in index.text
    # A name that is not the server's is refused before anything, as for the API (DNS rebinding).
    assert httpx.get(server.url + "/", headers={"Host": "evil.example"}, timeout=30).status_code == 421


@needs_browser
def test_the_page_asks_for_the_key_once_and_keeps_it_for_the_tab(served):
    server, folder = served
    mic = folder / "mic.wav"
    sf.write(mic, np.asarray(test_signal(6.0, seed=2)), 16000, subtype="PCM_16")
    args = (
        "--use-fake-device-for-media-stream",
        "--use-fake-ui-for-media-stream",
        f"--use-file-for-fake-audio-capture={mic}",
    )
    with chromium(*args) as browser:
        with opened(browser, server.url) as page:
            dialog = page.get_by_role("dialog")
            dialog.wait_for()
            page.get_by_label("API key", exact=True).fill("wrong-key")
            page.get_by_role("button", name="Use key").click()
            page.get_by_text("That key was refused").wait_for()
            page.get_by_label("API key", exact=True).fill(KEY)
            page.get_by_role("button", name="Use key").click()
            ready(page)
            assert page.evaluate("sessionStorage.getItem('mlxasr.key')") == KEY
            assert page.evaluate("localStorage.length") == 0  # kept for the tab only
            # Kept across a reload of the tab: no question.
            page.reload()
            ready(page)
            assert not page.get_by_role("dialog").is_visible()
            # The live WebSocket takes the key as its subprotocol.
            page.get_by_role("button", name="Live captions").click()
            page.get_by_role("button", name="Start live captions").click()
            page.wait_for_function(
                "() => /listening/.test(document.getElementById('live-state').textContent)"
            )
            page.get_by_role("button", name="Stop live captions").click()
            page.wait_for_function(
                "() => /saved to the library|stopped/.test(document.getElementById('live-state').textContent)",
                timeout=60_000,
            )
        # Another tab (a new context) is asked again.
        with opened(browser, server.url) as page:
            page.get_by_role("dialog").wait_for()
            assert page.evaluate("sessionStorage.getItem('mlxasr.key')") is None


@needs_browser
def test_a_page_of_another_origin_cannot_use_the_api(served):
    server, _ = served
    with chromium() as browser:
        context = browser.new_context()
        try:
            page = context.new_page()
            # A page from elsewhere (served here by the test, not the network) that holds the key too.
            html = "<!doctype html><title>elsewhere</title><p>elsewhere</p>"
            page.route(
                "http://elsewhere.test/",
                lambda route: route.fulfill(status=200, content_type="text/html", body=html),
            )
            page.goto("http://elsewhere.test/")
            outcome = page.evaluate(
                """async ([url, key]) => {
                    try {
                        const r = await fetch(url + '/v1/transcripts', {headers: {Authorization: 'Bearer ' + key}});
                        return 'read ' + r.status;
                    } catch (e) { return 'refused'; }
                }""",
                [server.url, KEY],
            )
            assert outcome == "refused"
            socket = page.evaluate(
                """([url, key]) => new Promise((resolve) => {
                    const ws = new WebSocket(url.replace('http', 'ws') + '/v1/realtime/transcription',
                                             ['realtime', 'openai-insecure-api-key.' + key]);
                    ws.onopen = () => resolve('open');
                    ws.onerror = () => resolve('refused');
                })""",
                [server.url, KEY],
            )
            assert socket == "refused"
        finally:
            context.close()


@needs_browser
def test_a_server_without_a_library_shows_live_captions_only(checkpoints, tmp_path):
    with running(checkpoints, tmp_path, "--no-vad", "--no-library") as server:
        with chromium() as browser, opened(browser, server.url) as page:
            ready(page)
            assert page.locator("#add").is_hidden() and page.locator("#library").is_hidden()
            assert "--no-library" in page.locator("#welcome").inner_text()
            page.get_by_role("button", name="Live captions").click()
            save = page.get_by_label("Save to the library when stopped")
            assert save.is_disabled() and not save.is_checked()
