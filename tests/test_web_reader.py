"""Reading along in a real browser (tests/browser.py): the word being spoken highlighted on every frame,
a click on a word plays from it, the view follows the audio until the person scrolls, the player's keys,
speakers (rename once, reassign a segment, hear a sample, a colour each), low confidence marked, CJK
text, a narrow window, light and dark, and the keyboard alone. Random weights time no words worth
reading, so the transcript here is tools/demo_transcript.py's interview, filed in the server's library
with its audio; re-timing's answer comes from a fixture response (page.route)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from browser import needs_browser, opened, ready, running, until

from mlx_qwen3asr.library.store import Library
from tools.demo_transcript import interview, interview_audio

pytestmark = needs_browser


@pytest.fixture(scope="module")
def served(checkpoints, tmp_path_factory):
    folder = tmp_path_factory.mktemp("web-reader")
    result = interview()
    wav = interview_audio(folder / "interview.wav", result)
    hostile = interview()
    hostile.segments = hostile.segments[:1]
    hostile.segments[0].text = hostile.text = '<img src="/x" onerror="alert(1)"> <script>alert(2)</script>'
    hostile.segments[0].words = []
    with Library(folder / "library") as library:
        library.add(hostile.to_dict(), title='<b onclick="alert(3)">bold</b>', created=1.0)
        tid = library.add(result.to_dict(), title="Bakery interview", audio=wav)
    with running(checkpoints, folder, "--no-vad", library=folder / "library") as server:
        yield server, tid, result


@pytest.fixture(scope="module")
def browser():
    from browser import chromium

    with chromium("--autoplay-policy=no-user-gesture-required") as b:
        yield b


# The segment being spoken (there is none in the pauses between them) is inside the window.
SPOKEN_IN_VIEW = """() => { const li = document.querySelector('#segments li.now');
    if (!li) return false;
    const r = li.getBoundingClientRect();
    return r.top >= 0 && r.bottom <= innerHeight; }"""


def open_transcript(page, tid: str) -> None:
    ready(page)
    page.get_by_role("button", name="Bakery interview").first.click()
    page.wait_for_function("() => document.querySelectorAll('#segments .w').length > 100")
    page.wait_for_function("() => document.getElementById('audio').readyState >= 1")


def doc(server, tid: str) -> dict:
    return httpx.get(f"{server.url}/v1/transcripts/{tid}", timeout=30).json()


def test_the_spoken_word_is_highlighted_on_every_frame_and_a_click_plays_from_a_word(served, browser):
    server, tid, result = served
    words = [w for s in result.segments for w in s.words]
    with opened(browser, server.url) as page:
        open_transcript(page, tid)
        target = result.segments[3].words[2]
        page.locator("#segments .w", has_text=target.text).first.click()
        page.wait_for_function("() => !document.getElementById('audio').paused")
        at = page.evaluate("document.getElementById('audio').currentTime")
        assert target.start - 0.05 <= at <= target.start + 1.0
        # Sample the highlight on animation frames for 1.5 s: it must name the word at the audio's time
        # each frame (a timeupdate handler, 4 times a second, would lag behind words 0.2 s long).
        samples = page.evaluate(
            """() => new Promise((resolve) => {
                const audio = document.getElementById('audio');
                const out = [];
                const t0 = performance.now();
                const tick = () => {
                  const now = document.querySelector('#segments .w.now');
                  out.push([audio.currentTime, now ? now.textContent : null]);
                  if (performance.now() - t0 < 1500) requestAnimationFrame(tick); else resolve(out);
                };
                requestAnimationFrame(tick);
            })"""
        )
        assert len(samples) > 20
        right = 0
        for t, shown in samples:
            spoken = next((w for w in words if w.start <= t < w.end), None)
            near_edge = any(abs(t - w.start) < 0.06 or abs(t - w.end) < 0.06 for w in words)
            if near_edge:
                continue
            assert shown == (spoken.text if spoken else None) or spoken is None and shown is None, (t, shown)
            right += 1
        assert right > 10


def test_the_view_follows_the_audio_and_stops_while_the_person_scrolls(served, browser):
    server, tid, result = served
    with opened(browser, server.url, height=600) as page:
        open_transcript(page, tid)
        late = result.segments[17]
        page.evaluate(f"document.getElementById('audio').currentTime = {late.start + 0.1}")
        page.keyboard.press("k")  # play
        page.wait_for_function("() => document.querySelector('#segments li.now') !== null")
        # Followed: the spoken segment is in view.
        page.wait_for_function(SPOKEN_IN_VIEW)
        page.wait_for_timeout(1000)  # the view's own smooth scroll ends
        page.mouse.move(700, 400)
        page.mouse.wheel(0, -3000)
        page.wait_for_selector("#follow", state="visible")
        top = page.evaluate("document.getElementById('main').scrollTop")
        page.wait_for_timeout(1200)  # still playing: the view stays where the person put it
        assert page.evaluate("document.getElementById('main').scrollTop") == top
        assert not page.evaluate("document.getElementById('audio').paused")
        page.get_by_role("button", name="Follow the audio").click()
        page.wait_for_function(SPOKEN_IN_VIEW)
        assert page.locator("#follow").is_hidden()


def test_the_player_keys_work_and_are_listed_on_the_page(served, browser):
    server, tid, _ = served
    with opened(browser, server.url) as page:
        open_transcript(page, tid)
        page.locator("main").focus()
        audio = "document.getElementById('audio')"
        page.keyboard.press("Space")
        page.wait_for_function(f"() => !{audio}.paused")
        page.keyboard.press("Space")
        page.wait_for_function(f"() => {audio}.paused")
        page.evaluate(f"{audio}.currentTime = 20")
        page.keyboard.press("l")
        assert page.evaluate(f"{audio}.currentTime") == pytest.approx(25, abs=0.3)
        page.keyboard.press("ArrowLeft")
        page.keyboard.press("j")
        assert page.evaluate(f"{audio}.currentTime") == pytest.approx(15, abs=0.3)
        page.keyboard.press(".")
        page.keyboard.press(".")
        assert page.evaluate(f"{audio}.playbackRate") == 1.5
        for _ in range(8):
            page.keyboard.press(",")
        assert page.evaluate(f"{audio}.playbackRate") == 0.5
        # The menu follows on the audio's "ratechange" event, a task of its own.
        page.wait_for_function(
            "() => document.querySelector('[aria-label=\"Playback speed\"]').value === '0.5'"
        )
        for _ in range(8):
            page.keyboard.press(".")
        assert page.evaluate(f"{audio}.playbackRate") == 2
        keys = page.locator("#keys")
        keys.locator("summary").click()
        listed = keys.inner_text()
        for said in (
            "play or pause",
            "back 5 seconds",
            "forward 5 seconds",
            "slower and faster",
            "undo, redo",
        ):
            assert said in listed


def test_speakers_are_renamed_once_reassigned_heard_and_coloured(served, browser):
    server, tid, result = served
    with opened(browser, server.url) as page:
        open_transcript(page, tid)
        colours = page.evaluate(
            "[...document.querySelectorAll('#segments > li')].map(li => li.style.getPropertyValue('--c'))"
        )
        assert colours[0] != colours[1] and colours[0] == colours[2]  # Speaker 1, 2, 1
        name = page.get_by_label("Name of speaker Speaker 2", exact=True)
        name.fill("Marta")
        name.press("Enter")
        page.wait_for_function(
            "() => document.querySelector('[aria-label=\"Name of speaker Marta\"]') !== null"
        )
        stored = doc(server, tid)
        assert "Speaker 2" not in json.dumps(stored["segments"])
        assert sum(s.get("speaker") == "Marta" for s in stored["segments"]) == sum(
            s.speaker == "Speaker 2" for s in result.segments
        )
        assert page.get_by_label("Speaker of segment 2", exact=True).input_value() == "Marta"
        # The colour stays with the renamed speaker.
        assert (
            page.evaluate("document.querySelectorAll('#segments > li')[1].style.getPropertyValue('--c')")
            == colours[1]
        )
        # One segment given to the other speaker.
        page.get_by_label("Speaker of segment 3", exact=True).select_option("Marta")
        until(lambda: doc(server, tid)["segments"][2]["speaker"] == "Marta")
        # A sample of each speaker plays from that speaker's longest segment and stops after a few seconds.
        page.get_by_role("button", name="Play a sample of Speaker 1").click()
        page.wait_for_function("() => !document.getElementById('audio').paused")
        start = page.evaluate("document.getElementById('audio').currentTime")
        ones = [s for s in result.segments if s.speaker == "Speaker 1" and s is not result.segments[2]]
        longest = max(ones, key=lambda s: s.end - s.start)
        assert longest.start - 0.05 <= start <= longest.start + 0.5
        page.wait_for_function("() => document.getElementById('audio').paused", timeout=15_000)
        stop = page.evaluate("document.getElementById('audio').currentTime")
        assert stop <= min(longest.end, longest.start + 4) + 0.3
        # Who spoke when, as RTTM: the download is the server's export, with the new name.
        with page.expect_download() as download:
            page.get_by_label("Export format", exact=True).select_option("rttm")
            page.get_by_role("button", name="Download").click()
        rttm = Path(download.value.path()).read_text()
        assert rttm == httpx.get(f"{server.url}/v1/transcripts/{tid}/export?format=rttm", timeout=30).text
        assert " Marta " in rttm and rttm.startswith("SPEAKER ")
        # Undo twice: the reassignment, then the rename.
        page.get_by_role("button", name="Undo").click()
        page.get_by_role("button", name="Undo").click()
        page.wait_for_function(
            "() => document.querySelector('[aria-label=\"Name of speaker Speaker 2\"]') !== null"
        )
        assert doc(server, tid)["segments"][1]["speaker"] == "Speaker 2"


def test_low_confidence_and_cjk_text_show_and_wrap_in_a_narrow_window(served, browser):
    server, tid, result = served
    with opened(browser, server.url, width=380, height=800) as page:
        open_transcript(page, tid)
        low = page.locator("#segments > li.low")
        assert low.count() == 1
        assert "low confidence" in low.inner_text()
        for n, segment in enumerate(result.segments):
            if segment.language in ("Chinese", "Japanese", "Korean"):
                box = page.get_by_label(f"Text of segment {n + 1}", exact=True)
                assert box.inner_text().replace("\n", "") == segment.text.replace(" ", " ")
                wraps = box.evaluate("e => e.scrollWidth <= e.clientWidth + 1 && e.clientHeight > 30")
                assert wraps, segment.text
        # Nothing runs off the side of a narrow window.
        assert page.evaluate("document.documentElement.scrollWidth") <= 381
        # The library sits above the transcript.
        side = page.locator("#side").bounding_box()
        main = page.locator("main").bounding_box()
        assert side["y"] + side["height"] <= main["y"] + 1


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_light_and_dark_follow_the_system(served, browser, scheme):
    server, _, _ = served
    with opened(browser, server.url, color_scheme=scheme) as page:
        ready(page)
        rgb = page.evaluate(
            "getComputedStyle(document.body).backgroundColor.match(/\\d+/g).slice(0, 3).map(Number)"
        )
        light = sum(rgb) / 3 > 128
        assert light == (scheme == "light"), rgb


def test_every_control_has_a_label_and_the_keyboard_alone_opens_and_corrects(served, browser):
    server, tid, result = served
    with opened(browser, server.url) as page:
        ready(page)
        unlabelled = page.evaluate(
            """() => [...document.querySelectorAll('button, input, select, textarea, audio')]
                 .filter(e => !e.closest('[hidden]') && !e.closest('dialog'))
                 .filter(e => !(e.getAttribute('aria-label') || e.labels?.length || e.textContent.trim()))
                 .map(e => e.outerHTML.slice(0, 80))"""
        )
        assert unlabelled == []
        # Tab from the top to the transcript, open it with Enter, edit a segment, save with Enter.
        for _ in range(30):
            page.keyboard.press("Tab")
            if page.evaluate("document.activeElement.dataset.id") == tid:
                break
        else:
            raise AssertionError("the transcript was never reached with Tab")
        page.keyboard.press("Enter")
        page.wait_for_function("() => document.querySelectorAll('#segments .w').length > 100")
        for _ in range(40):
            page.keyboard.press("Tab")
            if page.evaluate("document.activeElement.getAttribute('aria-label')") == "Text of segment 1":
                break
        else:
            raise AssertionError("no segment was reached with Tab")
        before = doc(server, tid)["revision"]
        page.keyboard.press("Enter")
        page.keyboard.press("End")
        page.keyboard.type(" Indeed.")
        page.keyboard.press("Enter")
        until(lambda: doc(server, tid)["revision"] > before)
        edited = doc(server, tid)["segments"][0]
        assert edited["text"].endswith("every morning. Indeed.")
        # The words that did not change keep their times; the page shows them timed.
        old = result.segments[0].words
        assert [(w["text"], w["start"], w["end"]) for w in edited["words"][: len(old)]] == [
            (w.text, pytest.approx(w.start, abs=1e-3), pytest.approx(w.end, abs=1e-3)) for w in old
        ]
        timed = page.get_by_label("Text of segment 1", exact=True).locator(".w")
        assert timed.count() >= len(old)
        page.keyboard.press("Control+z")
        until(lambda: not doc(server, tid)["segments"][0]["text"].endswith("Indeed."))


def test_retimed_words_from_the_aligner_are_shown_timed(served, browser):
    """The page asks for the edited segments to be re-timed and shows the answer's words as timed words
    (the answer is a fixture: random weights time nothing worth reading)."""
    server, tid, result = served
    with opened(browser, server.url) as page:
        open_transcript(page, tid)
        box = page.get_by_label("Text of segment 6", exact=True)
        box.dblclick()
        page.keyboard.press("Control+a")
        page.keyboard.type("Four hundred loaves, by hand?")
        page.keyboard.press("Enter")
        page.wait_for_function("() => document.getElementById('retime').disabled === false")
        asked = []

        def answer(route):
            asked.append(json.loads(route.request.post_data))
            current = doc(server, tid)
            seg = current["segments"][5]
            seg["words"] = [
                {"text": w, "start": seg["start"] + 0.3 * k, "end": seg["start"] + 0.3 * k + 0.25}
                for k, w in enumerate(["Four", "hundred", "loaves", "by", "hand"])
            ]
            current["retimed"], current["not_retimed"] = [seg["id"]], {}
            route.fulfill(status=200, content_type="application/json", body=json.dumps(current))

        page.route(f"**/v1/transcripts/{tid}/retime", answer)
        page.get_by_role("button", name="Re-time edited segments").click()
        page.wait_for_function(
            "() => document.querySelectorAll('[aria-label=\"Text of segment 6\"] .w').length === 5"
        )
        assert asked == [{"segments": [doc(server, tid)["segments"][5]["id"]]}]
        assert page.get_by_role("button", name="Re-time edited segments").is_disabled()
        page.get_by_role("button", name="Undo").click()
        page.wait_for_function(
            "() => document.querySelector('[aria-label=\"Text of segment 6\"]').textContent === 'Four hundred, by hand?'"
        )


def test_markup_in_titles_and_text_is_shown_as_text(served, browser):
    server, _, _ = served
    title = '<b onclick="alert(3)">bold</b>'
    with opened(browser, server.url) as page:
        ready(page)
        page.get_by_role("button", name=title).click()
        page.wait_for_selector("#reader:not([hidden])")
        assert page.locator("#title").inner_text() == title
        text = page.get_by_label("Text of segment 1", exact=True).inner_text()
        assert text == '<img src="/x" onerror="alert(1)"> <script>alert(2)</script>'
        page.get_by_label("Search transcripts", exact=True).fill("onerror")
        page.locator("#transcripts mark").first.wait_for()
        assert page.locator("main img, #side img, script:not([type=module])").count() == 0
        assert page.locator("#transcripts b").count() == 0
