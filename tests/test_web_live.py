"""Live captions end to end in a real browser: Chromium's fake microphone plays a WAV into getUserMedia,
the page's AudioWorklet sends it as 16 kHz 16-bit PCM over the realtime WebSocket of the real server,
the text shows as it comes (the unstable tail dimmed), and the stopped session is saved to the library
with its audio, then opens in the reader."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import soundfile as sf
from browser import chromium, needs_browser, opened, ready, running, until
from reference import test_signal

pytestmark = needs_browser


@pytest.fixture(scope="module")
def served(checkpoints, tmp_path_factory):
    folder = tmp_path_factory.mktemp("web-live")
    # Speech detection off: random weights find no speech in a test signal, and every chunk is decoded.
    with running(checkpoints, folder, "--no-vad") as server:
        yield server, folder


def test_live_captions_from_the_microphone_are_shown_and_saved(served):
    server, folder = served
    mic = folder / "mic.wav"
    # 48 kHz stereo, as a microphone gives it: the page asks for 16 kHz mono.
    signal = test_signal(12.0, seed=7, sample_rate=48000)
    sf.write(mic, np.stack([signal, signal], axis=1), 48000, subtype="PCM_16")
    args = (
        "--use-fake-device-for-media-stream",
        "--use-fake-ui-for-media-stream",
        f"--use-file-for-fake-audio-capture={mic}",
    )
    with chromium(*args) as browser, opened(browser, server.url) as page:
        ready(page)
        page.get_by_role("button", name="Live captions").click()
        assert page.get_by_label("Save to the library when stopped").is_checked()
        page.get_by_role("button", name="Start live captions").click()
        page.wait_for_function("() => /listening/.test(document.getElementById('live-state').textContent)")
        # Text as it comes: a step every 2 s of audio.
        page.wait_for_function(
            "() => document.querySelector('#live-text').textContent.trim().length > 0", timeout=60_000
        )
        opacity = page.evaluate("getComputedStyle(document.querySelector('#live-text .unstable')).opacity")
        assert float(opacity) < 1  # the tail the next step may rewrite is dimmed
        page.wait_for_timeout(2500)
        page.get_by_role("button", name="Stop live captions").click()
        page.wait_for_function(
            "() => /saved to the library/.test(document.getElementById('live-state').textContent)",
            timeout=120_000,
        )
        shown = page.locator("#live-text").inner_text().strip()
        listed = httpx.get(f"{server.url}/v1/transcripts", timeout=30).json()["data"]
        live = [t for t in listed if t["title"].startswith("Live captions ")]
        assert len(live) == 1
        doc = httpx.get(f"{server.url}/v1/transcripts/{live[0]['id']}", timeout=30).json()
        assert doc["audio"] is True and doc["duration"] >= 4.0
        assert doc["text"].strip() == shown
        audio = httpx.get(f"{server.url}/v1/transcripts/{live[0]['id']}/audio", timeout=30)
        assert audio.status_code == 200 and audio.content[:4] == b"RIFF"
        assert len(audio.content) == pytest.approx(44 + 2 * 16000 * doc["duration"], rel=0.01)
        # The saved session opens in the reader.
        page.get_by_role("button", name="open the transcript").click()
        page.wait_for_selector("#reader:not([hidden])")
        until(lambda: page.locator("#title").inner_text().startswith("Live captions "))
