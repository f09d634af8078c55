"""Screenshots of the web page for the docs (docs/images/web-*.png), taken in the system's Chromium.

    python tools/web_screenshots.py [--model PATH] [--out docs/images]

Files tools/demo_transcript.py's interview (timed words, two speakers, CJK lines) in a fresh library,
starts `mlxasr serve` on it (default model: the tiny random-weight preset, written by
tools/make_checkpoint.py), and photographs each view: the library with a queue, reading along,
correcting, searching, live captions (their events scripted on the page's WebSocket, since random
weights say nothing readable), dark mode and a narrow window. Needs Playwright for Python and
Chromium at /usr/lib/chromium/chromium (never `playwright install`).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tools.demo_transcript import LINES, interview, interview_audio  # noqa: E402

CHROMIUM = "/usr/lib/chromium/chromium"


def start_server(model: Path, library: Path, folder: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlx_qwen3asr.cli.main", "serve", "--model", str(model), "--no-aligner",
         "--no-vad", "--port", "0", "--library", str(library)],
        cwd=folder, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    for line in proc.stderr:
        found = re.match(r"listening on (http://\S+)", line)
        if found:
            threading.Thread(target=lambda: proc.stderr.read(), daemon=True).start()
            return proc, found.group(1)
    raise SystemExit(f"the server did not start (exit {proc.wait()})")


def live_script(ws) -> None:
    """The server's side of a live session, scripted: the interview's first lines as they are spoken."""
    words = " ".join(text for _, _, text in LINES[:4]).split()

    def on_message(message) -> None:
        if isinstance(message, str) and json.loads(message).get("type") == "transcription_session.update":
            ws.send(json.dumps({"type": "transcription_session.updated", "session": {}}))
            for n in range(6, len(words), 6):
                stable, unstable = " ".join(words[: n - 4]), " " + " ".join(words[n - 4 : n])
                ws.send(json.dumps({
                    "type": "conversation.item.input_audio_transcription.delta",
                    "stable": stable, "unstable": unstable, "text": stable + unstable,
                }))  # fmt: skip

    ws.on_message(on_message)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, help="the checkpoint to serve (default: the tiny random preset)")
    p.add_argument("--out", type=Path, default=REPO / "docs" / "images")
    args = p.parse_args()
    from playwright.sync_api import sync_playwright

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mlxasr-shots-") as tmp:
        folder = Path(tmp)
        model = args.model.resolve() if args.model else None
        if model is None:
            model = folder / "tiny"
            subprocess.run(
                [
                    sys.executable,
                    str(REPO / "tools" / "make_checkpoint.py"),
                    "--preset",
                    "tiny",
                    "-o",
                    str(model),
                ],
                check=True,
            )
        from mlx_qwen3asr.library.store import Library

        result = interview()
        with Library(folder / "library") as library:
            library.add(
                result.to_dict(),
                title="Morning at the bakery",
                audio=interview_audio(folder / "a.wav", result),
            )
            for k, title in enumerate(["Team meeting, 14 November", "Lecture 3: thermodynamics"]):
                short = interview()
                short.segments = short.segments[6 + k * 6 : 9 + k * 6]
                short.text = " ".join(seg.text for seg in short.segments)
                short.duration = short.segments[-1].end - short.segments[0].start + 1.0
                library.add(short.to_dict(), title=title, created=time.time() - 86400 * (k + 1))
        proc, url = start_server(model, folder / "library", folder)
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch(
                    executable_path=CHROMIUM, args=["--autoplay-policy=no-user-gesture-required"]
                )
                shots(browser, url, args.out, folder, result)
                browser.close()
        finally:
            proc.terminate()
            proc.wait(30)
    return 0


def shots(browser, url: str, out: Path, folder: Path, result) -> None:
    def page_at(width=1280, height=800, scheme="light"):
        context = browser.new_context(viewport={"width": width, "height": height}, color_scheme=scheme)
        page = context.new_page()
        page.goto(url)
        page.wait_for_selector("body[data-ready=true]")
        return page

    def open_interview(page, at: float):
        page.get_by_role("button", name="Morning at the bakery").first.click()
        page.wait_for_function("() => document.getElementById('audio').readyState >= 1")
        page.evaluate(f"document.getElementById('audio').currentTime = {at}")
        page.evaluate("document.getElementById('audio').play()")
        page.wait_for_timeout(700)
        page.evaluate("document.getElementById('audio').pause()")
        page.wait_for_timeout(300)

    # Reading along, a word highlighted, speakers named.
    page = page_at()
    open_interview(page, result.segments[3].words[6].start)
    page.screenshot(path=out / "web-reader.png")
    # Correcting a segment in place.
    page.get_by_label("Text of segment 8", exact=True).dblclick()
    page.keyboard.press("End")
    page.keyboard.type(" Two years in each.")
    page.screenshot(path=out / "web-edit.png")
    page.keyboard.press("Escape")
    # Searching the library as you type.
    page.get_by_label("Search transcripts", exact=True).fill("bread")
    page.wait_for_selector("#transcripts mark")
    page.screenshot(path=out / "web-search.png")
    page.context.close()

    # The queue: two recordings dropped while a transcript is open.
    page = page_at()
    open_interview(page, result.segments[6].start + 0.3)
    import numpy as np
    import soundfile as sf

    files = []
    for name, seconds in (("standup 28 Nov.wav", 8.0), ("customer call.wav", 90.0)):
        sf.write(folder / name, 0.05 * np.random.default_rng(1).standard_normal(int(seconds * 16000)), 16000)
        files.append(str(folder / name))
    page.get_by_label("Choose recordings", exact=True).set_input_files(files)
    page.wait_for_function(
        "() => /transcribing [1-9]/.test(document.getElementById('queue').textContent)", timeout=120_000
    )
    page.screenshot(path=out / "web-queue.png")
    for li in page.locator("#queue li:not([data-state])").all():
        li.get_by_role("button").click()
    page.context.close()

    # Live captions, the server's events scripted.
    page = page_at()
    page.context.grant_permissions(["microphone"])
    page.route_web_socket(re.compile(r".*/v1/realtime/transcription"), live_script)
    page.get_by_role("button", name="Live captions").click()
    page.evaluate(
        "navigator.mediaDevices.getUserMedia = async () => "
        "{ const c = new AudioContext(); const d = c.createMediaStreamDestination(); return d.stream; }"
    )
    page.get_by_role("button", name="Start live captions").click()
    page.wait_for_function("() => document.querySelector('#live-text .unstable').textContent.length > 0")
    page.wait_for_timeout(300)
    page.screenshot(path=out / "web-live.png")
    page.context.close()

    # Dark, and narrow.
    page = page_at(scheme="dark")
    open_interview(page, result.segments[9].start + 0.5)
    page.screenshot(path=out / "web-dark.png")
    page.context.close()
    page = page_at(width=390, height=844)
    open_interview(page, result.segments[11].start + 0.5)
    page.screenshot(path=out / "web-narrow.png", full_page=False)
    page.context.close()
    for shot in sorted(out.glob("web-*.png")):
        print(shot.relative_to(REPO) if shot.is_relative_to(REPO) else shot)


if __name__ == "__main__":
    sys.exit(main())
