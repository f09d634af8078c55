"""The transcript library's store (mlx_qwen3asr.library.store), its search and its edit helpers, on real
SQLite databases in temporary folders: transcripts and their audio, revisions, edits, search in every
script, schema migrations, crash safety (a writer killed with SIGKILL), concurrent writers, and jobs."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from mlx_qwen3asr.library import store
from mlx_qwen3asr.library.edits import retext, retext_words
from mlx_qwen3asr.library.search import SearchError, count, search
from mlx_qwen3asr.library.store import (
    MIGRATIONS,
    Conflict,
    Library,
    LibraryError,
    NotFound,
    UnknownSegment,
    clean_title,
    default_folder,
)

ROOT = Path(__file__).resolve().parent.parent
META = ("id", "title", "created", "updated", "revision", "audio", "model", "options")


def _words(
    text: str, start: float, speaker: str | None = None, *, unspaced: bool = False
) -> list[dict[str, Any]]:
    """Words as the aligner gives them: whitespace words (or one per character), 0.3 s apart."""
    spans = (
        [(k, k + 1) for k, ch in enumerate(text) if not ch.isspace()]
        if unspaced
        else [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]
    )
    return [
        {
            "text": text[a:b],
            "start": round(start + 0.3 * k, 3),
            "end": round(start + 0.3 * k + 0.25, 3),
            "char_start": a,
            "char_end": b,
            "speaker": speaker,
            "overlap": False,
        }
        for k, (a, b) in enumerate(spans)
    ]


def _segment(
    text: str, start: float, language: str = "English", speaker: str | None = None
) -> dict[str, Any]:
    unspaced = language in ("Chinese", "Japanese")
    return {
        "start": start,
        "end": start + 5.0,
        "text": text,
        "language": language,
        "truncated": False,
        "repetitive": False,
        "timing": "aligned",
        "words": _words(text, start, speaker, unspaced=unspaced),
        "avg_logprob": -0.2,
        "no_speech_prob": 0.01,
        "speaker": speaker,
        "overlap": False,
    }


def _content(
    texts: list[tuple[str, str]] | list[str], *, speakers: list[str] | None = None
) -> dict[str, Any]:
    """A Transcription.to_dict() of these segment texts (optionally (text, language) pairs)."""
    pairs = [(t, "English") if isinstance(t, str) else t for t in texts]
    segs = [
        _segment(text, 5.0 * k, language, speakers[k % len(speakers)] if speakers else None)
        for k, (text, language) in enumerate(pairs)
    ]
    return {
        "text": " ".join(t for t, _ in pairs),
        "language": pairs[0][1] if pairs else "English",
        "segments": segs,
        "duration": 5.0 * len(segs),
        "source": "/recordings/talk.wav",
        "warnings": [],
        "header_duration": None,
        "speech": [[0.0, 5.0 * len(segs)]],
        "speakers": list(dict.fromkeys(speakers or [])),
    }


def _strip(stored: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in stored.items() if k not in META}


def _ids_dropped(content: dict[str, Any]) -> dict[str, Any]:
    doc = json.loads(json.dumps(content))
    for seg in doc["segments"]:
        seg.pop("id", None)
    return doc


@pytest.fixture
def lib(tmp_path):
    with Library(tmp_path / "lib") as library:
        yield library


@pytest.fixture
def wav(tmp_path):
    path = tmp_path / "talk.wav"
    path.write_bytes(b"RIFF" + os.urandom(4096))
    return path


# --- transcripts --------------------------------------------------------------------------------------


def test_add_get_list_round_trip(lib, wav):
    content = _content(["Hello there, my friend.", "How are you today?"], speakers=["SPEAKER_00"])
    tid = lib.add(
        content, title="Monday call", audio=wav, model="Qwen/Qwen3-ASR-0.6B", options={"language": None}
    )
    assert re.fullmatch(r"[0-9a-f]{12}", tid)
    stored = lib.get(tid)
    assert stored["id"] == tid and stored["title"] == "Monday call" and stored["revision"] == 1
    assert stored["audio"] is True and stored["model"] == "Qwen/Qwen3-ASR-0.6B"
    assert stored["options"] == {"language": None}
    assert _ids_dropped(_strip(stored)) == json.loads(json.dumps(content))
    assert [s["id"] for s in stored["segments"]] == [0, 1]
    items, total = lib.list()
    assert total == 1
    assert items[0]["id"] == tid and items[0]["segments"] == 2 and items[0]["duration"] == 10.0
    assert items[0]["preview"] == content["text"][:200] and items[0]["language"] == "English"
    assert lib.get("nope") is None and lib.get("../../etc") is None


def test_list_is_newest_first_and_paged(lib):
    ids = [lib.add(_content([f"number {k}"]), title=f"t{k}", created=1000.0 + k) for k in range(5)]
    items, total = lib.list(limit=2, offset=1)
    assert total == 5
    assert [i["id"] for i in items] == [ids[3], ids[2]]


def test_segment_ids_are_assigned_and_kept(lib):
    content = _content(["one two three", "four five six", "seven eight nine"])
    content["segments"][1]["id"] = 7
    tid = lib.add(content, title="ids")
    assert [s["id"] for s in lib.get(tid)["segments"]] == [8, 7, 9]
    lib.update(tid, segments={7: {"text": "four five six seven"}})
    assert [s["id"] for s in lib.get(tid)["segments"]] == [8, 7, 9]
    bad = _content(["a", "b"])
    bad["segments"][0]["id"] = bad["segments"][1]["id"] = 3
    with pytest.raises(LibraryError, match="id"):
        lib.add(bad, title="dup")


def test_audio_is_copied_whole_with_a_safe_name(lib, wav, tmp_path):
    data = wav.read_bytes()
    tid = lib.add(_content(["hello world"]), title="../../etc/passwd\x00\n\x1b[31m", audio=wav)
    path = lib.audio_path(tid)
    assert path == lib.audio_folder / f"{tid}.wav"
    assert path.read_bytes() == data and wav.read_bytes() == data  # copied, the source left alone
    assert sorted(os.listdir(lib.audio_folder)) == [f"{tid}.wav"]  # no temporary file left
    assert lib.get(tid)["title"] == "../../etc/passwd [31m"
    assert not (tmp_path / "etc").exists()

    odd = tmp_path / "x.mp3;rm -rf ~"
    odd.write_bytes(b"abc")
    tid2 = lib.add(_content(["odd"]), title="", audio=odd)
    assert lib.audio_path(tid2).name == f"{tid2}.audio"
    assert lib.get(tid2)["title"] == "x"  # the file's stem, as a title only
    upper = tmp_path / "LOUD.WAV"
    upper.write_bytes(b"abc")
    assert lib.audio_path(lib.add(_content(["x"]), title="x", audio=upper)).suffix == ".wav"


def test_moved_audio_leaves_its_old_place(lib, wav):
    data = wav.read_bytes()
    tid = lib.add(_content(["moved"]), title="m", audio=wav, move_audio=True)
    assert not wav.exists()
    assert lib.audio_path(tid).read_bytes() == data


def test_a_failed_insert_removes_the_copied_audio(lib, wav, monkeypatch):
    def broken(*args: Any, **kwargs: Any) -> None:
        raise sqlite3.IntegrityError("simulated")

    monkeypatch.setattr(Library, "_insert", broken)
    with pytest.raises(LibraryError, match="simulated"):
        lib.add(_content(["x"]), title="x", audio=wav, move_audio=True)
    assert os.listdir(lib.audio_folder) == []
    assert wav.exists()  # a move that failed leaves the file where it was
    assert lib.list() == ([], 0)


def test_titles_are_cleaned_and_capped(lib):
    assert clean_title("  a\tb\r\nc\u202e  ") == "a b c"
    huge = "x" * 1_000_000
    t0 = time.perf_counter()
    tid = lib.add(_content(["big title"]), title=huge)
    assert time.perf_counter() - t0 < 2.0
    assert lib.get(tid)["title"] == "x" * 500
    assert lib.get(lib.add(_content(["no title"]), title=" \n "))["title"] == "talk"  # the source's stem
    doc = _content(["none"])
    doc["source"] = None
    assert lib.get(lib.add(doc, title=""))["title"] == "Untitled"


def test_sql_in_titles_and_queries_is_inert(lib):
    evil = "x'); DROP TABLE transcripts; --"
    tid = lib.add(_content(["robert tables here"]), title=evil)
    assert lib.get(tid)["title"] == evil
    for q in ["'; DROP TABLE segments; --", "robert') OR 1=1 --", '" OR 1=1 --']:
        try:
            assert search(lib, q) == []
        except SearchError:
            pass
    assert [h["transcript_id"] for h in search(lib, "robert")] == [tid]
    assert lib.list()[1] == 1


def test_delete_removes_everything(lib, wav):
    tid = lib.add(_content(["unique zebra words"]), title="d", audio=wav)
    lib.update(tid, title="d2")
    path = lib.audio_path(tid)
    assert lib.delete(tid) is True
    assert not path.exists() and lib.get(tid) is None and search(lib, "zebra") == []
    with lib.reading() as conn:
        for table in ("revisions", "segments"):
            assert (
                conn.execute(f"SELECT count(*) FROM {table} WHERE transcript_id = ?", (tid,)).fetchone()[0]
                == 0
            )
    assert lib.delete(tid) is False


# --- edits and revisions -------------------------------------------------------------------------------


def test_every_edit_is_a_revision_and_restore_adds_one(lib):
    content = _content(["the quick brown fox", "jumps over the dog"], speakers=["SPEAKER_00", "SPEAKER_01"])
    tid = lib.add(content, title="fox")
    first = lib.get(tid)
    lib.update(tid, title="Fox story")
    lib.update(tid, segments={1: {"text": "jumps over the lazy dog"}})
    lib.update(tid, speaker_names={"SPEAKER_00": "Ana"})
    after = lib.get(tid)
    assert after["revision"] == 4
    summaries = [r["summary"] for r in lib.revisions(tid)]
    assert summaries == ["added", "title", "segment 1 text", "speaker SPEAKER_00 -> Ana"]
    assert after["text"] == "the quick brown fox jumps over the lazy dog"

    restored = lib.restore(tid, 1)
    assert restored["revision"] == 5 and lib.revisions(tid)[-1]["summary"] == "restored revision 1"
    assert _strip(restored) == _strip(first) and restored["title"] == "fox"
    assert lib.revision(tid, 4)["text"] == after["text"] and lib.revision(tid, 4)["title"] == "Fox story"
    assert search(lib, "lazy") == [] and len(search(lib, "quick")) == 1  # the index follows the restore
    again = lib.restore(tid, 4)
    assert _strip(again) == _strip(after) and again["revision"] == 6
    assert lib.revision(tid, 99) is None and lib.revision("nope", 1) is None
    with pytest.raises(NotFound):
        lib.restore(tid, 99)
    with pytest.raises(NotFound):
        lib.revisions("nope")


def test_a_change_that_changes_nothing_makes_no_revision(lib):
    tid = lib.add(_content(["same text"]), title="same")
    assert lib.update(tid, title="same", segments={0: {"text": "same text"}})["revision"] == 1
    assert len(lib.revisions(tid)) == 1


def test_speaker_rename_applies_everywhere(lib):
    content = _content(["one two", "three four", "five six"], speakers=["SPEAKER_00", "SPEAKER_01"])
    tid = lib.add(content, title="who")
    stored = lib.update(tid, speaker_names={"SPEAKER_00": "Ana", "SPEAKER_01": "Ben", "SPEAKER_09": "Nobody"})
    assert stored["speakers"] == ["Ana", "Ben"]
    assert [s["speaker"] for s in stored["segments"]] == ["Ana", "Ben", "Ana"]
    assert {w["speaker"] for s in stored["segments"] for w in s["words"]} == {"Ana", "Ben"}
    assert lib.revisions(tid)[-1]["summary"] == "speaker SPEAKER_00 -> Ana, speaker SPEAKER_01 -> Ben"
    with lib.reading() as conn:
        rows = conn.execute(
            "SELECT speaker FROM segments WHERE transcript_id = ? ORDER BY segment_id", (tid,)
        )
        assert [r[0] for r in rows] == ["Ana", "Ben", "Ana"]
    moved = lib.update(tid, segments={1: {"speaker": "Ana"}})
    assert moved["speakers"] == ["Ana"] and {w["speaker"] for w in moved["segments"][1]["words"]} == {"Ana"}


def test_a_text_edit_keeps_unchanged_words_times(lib):
    tid = lib.add(_content(["we met in the park on monday"]), title="park")
    before = lib.get(tid)["segments"][0]["words"]
    stored = lib.update(tid, segments={0: {"text": "we met in the big park on Monday"}})
    seg = stored["segments"][0]
    words = {w["text"]: w for w in seg["words"]}
    for kept in ("we", "met", "in", "the", "park", "on"):
        old = next(w for w in before if w["text"] == kept)
        assert (words[kept]["start"], words[kept]["end"]) == (old["start"], old["end"])
    assert words["Monday"]["start"] == next(w for w in before if w["text"] == "monday")["start"]
    assert words["the"]["end"] <= words["big"]["start"] <= words["big"]["end"] <= words["park"]["start"]
    assert all(seg["text"][w["char_start"] : w["char_end"]] == w["text"] for w in seg["words"])
    assert seg["timing"] == "estimated"  # one word's time is a guess now
    assert stored["text"] == "we met in the big park on Monday"


def test_words_from_retiming_replace_a_segments_words(lib):
    tid = lib.add(_content(["alpha beta"]), title="w")
    lib.update(tid, segments={0: {"text": "alpha beta gamma"}})
    timed = [
        {"text": "alpha", "start": 0.1, "end": 0.4},
        {"text": "beta", "start": 0.5, "end": 0.9},
        {"text": "gamma", "start": 1.0, "end": 1.5},
    ]
    stored = lib.update(tid, words={0: timed})
    seg = stored["segments"][0]
    assert seg["timing"] == "aligned"
    assert [(w["char_start"], w["char_end"]) for w in seg["words"]] == [(0, 5), (6, 10), (11, 16)]
    assert lib.revisions(tid)[-1]["summary"] == "segment 0 words"
    with pytest.raises(LibraryError):
        lib.update(tid, words={0: [{"text": "x", "start": None, "end": 1.0}]})


def test_edit_errors(lib):
    tid = lib.add(_content(["a b c"]), title="e")
    with pytest.raises(UnknownSegment) as info:
        lib.update(tid, segments={5: {"text": "x"}})
    assert isinstance(info.value, KeyError) and isinstance(info.value, LibraryError)
    assert str(info.value) == f"no segment 5 in transcript {tid}"
    with pytest.raises(NotFound):
        lib.update("missing", title="x")
    lib.update(tid, title="one", expected_revision=1)
    with pytest.raises(Conflict, match="revision 2"):
        lib.update(tid, title="two", expected_revision=1)
    with pytest.raises(Conflict):
        lib.restore(tid, 1, expected_revision=1)
    with pytest.raises(LibraryError):
        lib.update(tid, segments={0: {"words": []}})
    assert lib.get(tid)["revision"] == 2 and lib.get(tid)["title"] == "one"


# --- retext_words --------------------------------------------------------------------------------------


def test_retext_keeps_unchanged_words_and_interpolates_new_ones():
    old = "Hello there, my friend."
    words = _words(old, 10.0, "A")
    new = retext_words(old, words, "Hello there, my dear friend.")
    assert [w["text"] for w in new] == ["Hello", "there,", "my", "dear", "friend."]
    assert [(w["start"], w["end"]) for w in new[:3]] == [(w["start"], w["end"]) for w in words[:3]]
    assert (new[4]["start"], new[4]["end"]) == (words[3]["start"], words[3]["end"])
    assert words[2]["end"] <= new[3]["start"] < new[3]["end"] <= words[3]["start"]
    assert all(w["speaker"] == "A" for w in new)
    assert all("Hello there, my dear friend."[w["char_start"] : w["char_end"]] == w["text"] for w in new)


def test_retext_one_for_one_replacement_keeps_the_time():
    old = "the cat sat down"
    words = _words(old, 0.0)
    result = retext(old, words, "the dog sat down")
    assert result.estimated == 0 and result.kept == 4
    assert [(w["text"], w["start"]) for w in result.words] == [
        ("the", 0.0),
        ("dog", 0.3),
        ("sat", 0.6),
        ("down", 0.9),
    ]


def test_retext_unspaced_text_by_character():
    old = "我们今天去东京塔"
    words = _words(old, 0.0, unspaced=True)
    new_text = "我们明天去东京塔吗"
    new = retext_words(old, words, new_text)
    assert [w["text"] for w in new] == list(new_text)
    assert new[0]["start"] == 0.0 and new[7]["start"] == words[7]["start"]
    assert new[2]["start"] == words[2]["start"]  # 今 -> 明, one for one
    assert new[8]["start"] == new[8]["end"] == words[-1]["end"]  # appended: no time left, zero length
    assert all(new_text[w["char_start"] : w["char_end"]] == w["text"] for w in new)


def test_retext_keeps_multi_character_japanese_words():
    old = "東京タワーに行きました"
    cut = ["東京", "タワー", "に", "行き", "ました"]
    words, at = [], 0
    for k, piece in enumerate(cut):
        words.append(
            {"text": piece, "start": float(k), "end": k + 0.9, "char_start": at, "char_end": at + len(piece)}
        )
        at += len(piece)
    new = retext_words(old, words, "東京タワーへ行きました。")
    assert [w["text"] for w in new] == ["東京", "タワー", "へ", "行き", "ました。"]
    assert [w["start"] for w in new] == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_retext_edge_cases():
    assert retext_words("a b", [], "a b c") == []
    assert retext_words("a b", _words("a b", 0.0), "   ") == []
    replaced = retext_words("one two", _words("one two", 1.0), "completely different words here")
    assert len(replaced) == 4 and replaced[0]["start"] == 1.0 and replaced[-1]["end"] == 1.55
    assert all(w["start"] is not None and w["end"] >= w["start"] for w in replaced)


# --- search ----------------------------------------------------------------------------------------------


@pytest.fixture
def corpus(lib):
    ids = {
        "en": lib.add(
            _content(
                [
                    "The weather in Paris was lovely",
                    "We had coffee at the Café de Flore",
                    "don't stop",
                    "Été à Nice",
                ]
            ),
            title="<b>Paris</b> trip",
        ),
        "zh": lib.add(_content([("我们今天去东京塔看看", "Chinese"), ("猫在睡觉", "Chinese")]), title="中文"),
        "ja": lib.add(_content([("東京タワーに行きました", "Japanese")]), title="日本語"),
        "ko": lib.add(_content([("안녕하세요 서울입니다", "Korean")]), title="한국어"),
        "mix": lib.add(
            _content([("我们用 Python 写代码 <script>alert(1)</script>", "Chinese")]), title="mixed"
        ),
    }
    return lib, ids


def _found(lib: Library, q: str, **kwargs: Any) -> list[tuple[str, int]]:
    return [(h["transcript_id"], h["segment_id"]) for h in search(lib, q, **kwargs)]


def test_search_english_and_accents(corpus):
    lib, ids = corpus
    hits = search(lib, "weather")
    assert [(h["transcript_id"], h["segment_id"]) for h in hits] == [(ids["en"], 0)]
    hit = hits[0]
    assert hit["title"] == "<b>Paris</b> trip" and hit["start"] == 0.0 and hit["end"] == 5.0
    assert hit["snippet"] == "The <mark>weather</mark> in Paris was lovely" and hit["score"] > 0
    for q in ("café", "CAFÉ", "Café", "cAfÉ"):
        assert _found(lib, q) == [(ids["en"], 1)], q
    assert _found(lib, "cafe") == []
    for q in ("ét", "ÉT", "Ét"):  # shorter than a trigram: scanned, still case-insensitive
        assert _found(lib, q) == [(ids["en"], 3)], q
    assert search(lib, "ét")[0]["snippet"] == "<mark>Ét</mark>é à Nice"
    assert _found(lib, "PARIS lovely") == [(ids["en"], 0)]
    assert _found(lib, '"in paris"') == [(ids["en"], 0)]
    assert _found(lib, "don't") == [(ids["en"], 2)]
    assert sorted(_found(lib, "weather OR coffee")) == [(ids["en"], 0), (ids["en"], 1)]
    assert _found(lib, "the NOT coffee") == [(ids["en"], 0)]
    assert _found(lib, "lovel*") == [(ids["en"], 0)]
    assert count(lib, "the") == 2


def test_search_chinese_japanese_korean_and_mixed(corpus):
    lib, ids = corpus
    assert _found(lib, "猫") == [(ids["zh"], 1)]  # one character: scanned
    assert sorted(_found(lib, "东京")) == [(ids["zh"], 0)]  # simplified, two characters
    assert _found(lib, "東京") == [(ids["ja"], 0)]  # traditional/Japanese form
    assert _found(lib, "东京塔") == [(ids["zh"], 0)]  # three: the index
    assert _found(lib, "タワー") == [(ids["ja"], 0)]
    assert _found(lib, "行きました") == [(ids["ja"], 0)]
    assert _found(lib, "서울") == [(ids["ko"], 0)]
    assert _found(lib, "안녕하세요") == [(ids["ko"], 0)]
    assert _found(lib, "python 代码") == [(ids["mix"], 0)]  # long term by the index, short by scan
    assert _found(lib, "我们") == sorted([(ids["mix"], 0), (ids["zh"], 0)], key=lambda h: h[0] != ids["mix"])
    hit = search(lib, "代码")[0]
    assert hit["snippet"] == "我们用 Python 写<mark>代码</mark> &lt;script&gt;alert(1)&lt;/script&gt;"
    assert search(lib, "script")[0]["snippet"].count("<mark>") == 2
    assert "<script>" not in search(lib, "alert")[0]["snippet"]
    assert count(lib, "我们") == 2 and count(lib, "东京塔") == 1


def test_search_in_one_transcript_and_paging(corpus):
    lib, ids = corpus
    assert _found(lib, "我们", transcript_id=ids["zh"]) == [(ids["zh"], 0)]
    assert _found(lib, "the", transcript_id=ids["zh"]) == []
    assert count(lib, "我们", transcript_id=ids["zh"]) == 1
    assert len(search(lib, "the", limit=1)) == 1 and len(search(lib, "the", limit=1, offset=1)) == 1
    assert search(lib, "the", limit=1) != search(lib, "the", limit=1, offset=1)


def test_many_hits_come_most_recent_first(lib, monkeypatch):
    from mlx_qwen3asr.library import search as search_module

    for k in range(5):
        lib.add(_content([f"pears and plums number {k}"]), title="other")
    short = lib.add(_content(["apple"]), title="short")
    long = lib.add(_content(["apple " + " ".join(f"filler{k}" for k in range(40))]), title="long")
    third = lib.add(_content(["an apple a day keeps many many doctors away"]), title="third")
    ranked = search(lib, "apple")
    assert [h["transcript_id"] for h in ranked] == [short, third, long]  # the shortest text first
    assert ranked[0]["score"] > ranked[1]["score"] > ranked[2]["score"] > 0
    monkeypatch.setattr(search_module, "RANKED_HITS", 2)
    recent = search(lib, "apple")
    assert [h["transcript_id"] for h in recent] == [third, long, short]
    assert [h["transcript_id"] for h in search(lib, "apple", limit=1, offset=1)] == [long]
    assert all(h["score"] == 0 for h in recent) and count(lib, "apple") == 3  # unranked


def test_search_in_one_transcript_reads_only_its_segments(lib):
    first = lib.add(_content(["shared words one", "shared words two"]), title="a")
    second = lib.add(_content(["shared words three"]), title="b")
    lib.restore(first, 1)
    assert sorted(_found(lib, "shared", transcript_id=first)) == [(first, 0), (first, 1)]
    assert _found(lib, "shared", transcript_id=second) == [(second, 0)]
    assert (
        search(lib, "shared", transcript_id="missing") == []
        and count(lib, "shared", transcript_id=second) == 1
    )


@pytest.mark.parametrize("q", ['"unclosed', "AND", "foo NOT", "*", "(a OR", "NEAR(", "a OR"])
def test_invalid_search_syntax_names_the_query(corpus, q):
    lib, _ = corpus
    with pytest.raises(SearchError) as info:
        search(lib, q)
    assert repr(q) in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(SearchError):
        count(lib, q)


@pytest.mark.parametrize("q", ["", "   ", '""', "x" * 1001])
def test_empty_or_huge_search_is_refused(corpus, q):
    lib, _ = corpus
    with pytest.raises(SearchError):
        search(lib, q)


def test_search_snippets_are_cut_around_the_hit(lib):
    long = " ".join(f"word{k}" for k in range(100)) + " needle " + " ".join(f"tail{k}" for k in range(100))
    lib.add(_content([long]), title="long")
    snippet = search(lib, "needle")[0]["snippet"]
    assert snippet.startswith("…") and snippet.endswith("…") and "<mark>needle</mark>" in snippet
    assert len(snippet) < 260


def test_an_edit_is_searchable_at_once(lib):
    tid = lib.add(_content(["the old wording"]), title="edit")
    lib.update(tid, segments={0: {"text": "the new phrasing"}})
    assert search(lib, "wording") == [] and _found(lib, "phrasing") == [(tid, 0)]
    with lib.reading() as conn:
        conn.execute("INSERT INTO segments_fts (segments_fts) VALUES ('integrity-check')")


# --- folders, schema, migrations ---------------------------------------------------------------------------


def test_default_folder(monkeypatch, tmp_path):
    monkeypatch.setenv(store.DEFAULT_FOLDER_ENV, str(tmp_path / "here"))
    assert default_folder() == tmp_path / "here"
    monkeypatch.delenv(store.DEFAULT_FOLDER_ENV)
    assert default_folder().name == "mlx-qwen3asr"


def test_layout_and_settings(lib):
    assert (
        (lib.folder / "library.sqlite3").is_file() and lib.audio_folder.is_dir() and lib.jobs_folder.is_dir()
    )
    with lib.reading() as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS) >= 3
    assert lib.schema_version == len(MIGRATIONS)


def test_what_is_not_a_library_is_refused(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(LibraryError, match="a file is in the way"):
        Library(blocker)
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "library.sqlite3").write_bytes(b"this is not a database" * 100)
    with pytest.raises(LibraryError, match="library.sqlite3") as info:
        Library(garbage)
    assert "\n" not in str(info.value)
    other = tmp_path / "other"
    other.mkdir()
    with sqlite3.connect(other / "library.sqlite3") as conn:
        conn.execute("CREATE TABLE notes (x)")
    with pytest.raises(LibraryError, match="other tables"):
        Library(other)


def test_a_newer_schema_is_refused(tmp_path):
    Library(tmp_path / "lib").close()
    conn = sqlite3.connect(tmp_path / "lib" / "library.sqlite3")
    conn.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    conn.close()
    with pytest.raises(LibraryError, match="newer version") as info:
        Library(tmp_path / "lib")
    assert str(tmp_path / "lib" / "library.sqlite3") in str(info.value)


def test_a_schema_1_library_opens_with_its_data_searchable(tmp_path, wav):
    folder = tmp_path / "old"
    (folder / "audio").mkdir(parents=True)
    (folder / "audio" / "abc123def456.wav").write_bytes(wav.read_bytes())
    content = _content(["an old transcript about elephants", "and 东京 too"])
    for k, seg in enumerate(content["segments"]):
        seg["id"] = k
    conn = sqlite3.connect(folder / "library.sqlite3")
    conn.executescript(MIGRATIONS[0] + "\nPRAGMA user_version = 1;")
    conn.execute(
        "INSERT INTO transcripts VALUES ('abc123def456', 'Old one', 100.0, 100.0, 1, 'abc123def456.wav',"
        " '/recordings/talk.wav', 10.0, 'English', NULL, '{}', 2, 'an old transcript')"
    )
    conn.execute(
        "INSERT INTO revisions VALUES ('abc123def456', 1, 100.0, 'Old one', 'added', ?)",
        (json.dumps(content),),
    )
    for seg in content["segments"]:
        conn.execute(
            'INSERT INTO segments (transcript_id, segment_id, start, "end", speaker, text) VALUES (?, ?, ?, ?, ?, ?)',
            ("abc123def456", seg["id"], seg["start"], seg["end"], None, seg["text"]),
        )
    conn.commit()
    conn.close()

    with Library(folder) as lib:
        assert lib.schema_version == len(MIGRATIONS)
        stored = lib.get("abc123def456")
        assert stored["title"] == "Old one" and stored["audio"] is True
        assert _strip(stored) == json.loads(json.dumps(content))
        assert _found(lib, "elephants") == [("abc123def456", 0)]
        assert _found(lib, "东京") == [("abc123def456", 1)]
        lib.update("abc123def456", segments={0: {"text": "an old transcript about giraffes"}})
        assert _found(lib, "giraffes") == [("abc123def456", 0)] and search(lib, "elephants") == []
        assert lib.job(lib.add_job(title="j", options={}, audio=wav, move_audio=False))["status"] == "queued"


def test_migrations_run_in_order_each_in_one_transaction(tmp_path, monkeypatch):
    Library(tmp_path / "lib").close()

    def add_notes(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE notes (transcript_id TEXT, note TEXT)")

    def broken(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE half_done (x)")
        conn.execute("THIS IS NOT SQL")

    monkeypatch.setattr(store, "MIGRATIONS", [*MIGRATIONS, add_notes, broken])
    with pytest.raises(LibraryError, match=f"migration {len(MIGRATIONS) + 2}"):
        Library(tmp_path / "lib")
    conn = sqlite3.connect(tmp_path / "lib" / "library.sqlite3")
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS) + 1
    conn.close()
    assert "notes" in tables and "half_done" not in tables


# --- crash safety and concurrency --------------------------------------------------------------------------

_WRITER = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {root!r})
    from mlx_qwen3asr.library.store import Library
    folder, audio, name, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    lib = Library(folder)
    for k in range(n):
        segs = [dict(start=float(i), end=float(i) + 1, text=f"{{name}} line {{k}} segment {{i}} words", language="English")
                for i in range(150)]
        tid = lib.add(dict(text="x", language="English", segments=segs, duration=150.0), title=f"{{name}} {{k}}", audio=audio)
        lib.update(tid, title=f"{{name}} {{k}} edited")
        print(k, flush=True)
    """
)


def _writer(tmp_path: Path, folder: Path, audio: Path, name: str, n: int) -> subprocess.Popen[str]:
    script = tmp_path / "writer.py"
    script.write_text(_WRITER.format(root=str(ROOT)))
    return subprocess.Popen(
        [sys.executable, str(script), str(folder), str(audio), name, str(n)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _check_whole(folder: Path) -> int:
    """Open the library and check every transcript is complete; returns how many there are."""
    with Library(folder) as lib:
        with lib.reading() as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            conn.execute("INSERT INTO segments_fts (segments_fts) VALUES ('integrity-check')")
        items, total = lib.list(limit=1000)
        for item in items:
            stored = lib.get(item["id"])
            assert stored is not None and len(stored["segments"]) == item["segments"] == 150
            assert stored["audio"] is True and lib.audio_path(item["id"]).is_file()
            assert [r["revision"] for r in lib.revisions(item["id"])] == list(
                range(1, stored["revision"] + 1)
            )
            with lib.reading() as conn:
                rows = conn.execute("SELECT count(*) FROM segments WHERE transcript_id = ?", (item["id"],))
                assert rows.fetchone()[0] == 150
        return total


def test_a_writer_killed_mid_write_leaves_every_transcript_whole(tmp_path, wav):
    folder = tmp_path / "lib"
    Library(folder).close()
    proc = _writer(tmp_path, folder, wav, "killed", 1000)
    done = 0
    try:
        while done < 4:
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
            done += 1
        time.sleep(0.013)  # somewhere inside a later add or update
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert _check_whole(folder) >= 4


def test_a_transaction_cut_by_sigkill_leaves_nothing(tmp_path):
    folder = tmp_path / "lib"
    Library(folder).close()
    script = tmp_path / "half.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys, time
            sys.path.insert(0, {str(ROOT)!r})
            from mlx_qwen3asr.library.store import Library
            lib = Library(sys.argv[1])
            with lib.transaction() as conn:
                conn.execute("INSERT INTO transcripts (id, title, created, updated, revision) VALUES ('half', 'h', 0, 0, 1)")
                print("inside", flush=True)
                time.sleep(60)
            """
        )
    )
    proc = subprocess.Popen([sys.executable, str(script), str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "inside"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    with Library(folder) as lib:
        assert lib.list() == ([], 0) and lib.get("half") is None


def test_two_processes_write_at_once(tmp_path, wav):
    folder = tmp_path / "lib"
    Library(folder).close()
    procs = [_writer(tmp_path, folder, wav, name, 6) for name in ("left", "right")]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert out.split() == [str(k) for k in range(6)]
    assert _check_whole(folder) == 12


def test_threads_share_one_library(lib):
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for i in range(5):
                tid = lib.add(_content([f"thread{k} item{i} text"]), title=f"{k}-{i}")
                lib.update(tid, segments={0: {"text": f"thread{k} item{i} edited"}})
                search(lib, f"thread{k}")
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert lib.list()[1] == 20 and count(lib, "edited") == 20


# --- jobs -------------------------------------------------------------------------------------------------


def test_jobs_live_until_finished(lib, wav):
    data = wav.read_bytes()
    jid = lib.add_job(title="Upload", options={"language": "English"}, audio=wav)
    assert not wav.exists()
    job = lib.job(jid)
    assert job["status"] == "queued" and job["options"] == {"language": "English"} and job["audio"] is True
    assert lib.job_audio(jid) == lib.jobs_folder / f"{jid}.wav" and lib.job_audio(jid).read_bytes() == data
    assert lib.set_job(jid, status="running", progress=0.25)["progress"] == 0.25
    assert [j["id"] for j in lib.unfinished_jobs()] == [jid]
    with pytest.raises(Conflict):
        lib.delete_job(jid)
    with pytest.raises(TypeError):
        lib.set_job(jid, audio="../../x")
    with pytest.raises(LibraryError):
        lib.set_job(jid, status="exploded")
    with pytest.raises(NotFound):
        lib.set_job("nope", progress=0.5)

    tid = lib.finish_job(jid, _content(["the finished words"]), title="")
    job = lib.job(jid)
    assert job["status"] == "done" and job["transcript_id"] == tid and job["progress"] == 1
    assert job["audio"] is False and lib.job_audio(jid) is None and os.listdir(lib.jobs_folder) == []
    stored = lib.get(tid)
    assert stored["title"] == "Upload" and stored["options"] == {"language": "English"}
    assert lib.audio_path(tid).read_bytes() == data
    assert lib.unfinished_jobs() == [] and _found(lib, "finished") == [(tid, 0)]
    with pytest.raises(Conflict):
        lib.finish_job(jid, _content(["again"]), title="again")
    assert lib.delete_job(jid) is True and lib.job(jid) is None and lib.delete_job(jid) is False
    assert lib.get(tid) is not None  # the transcript outlives its job


def test_jobs_are_listed_newest_first_and_survive_reopening(tmp_path, wav):
    folder = tmp_path / "lib"
    with Library(folder) as lib:
        first = lib.add_job(title="a", options={}, audio=wav, move_audio=False)
        second = lib.add_job(title="b", options={}, audio=wav, move_audio=False)
        lib.set_job(first, status="running")
        failed = lib.add_job(title="c", options={}, audio=wav, move_audio=False)
        lib.set_job(failed, status="failed", error="boom\nbad file")
    assert wav.exists()
    with Library(folder) as lib:
        jobs, total = lib.jobs()
        assert total == 3 and [j["id"] for j in jobs] == [failed, second, first]
        assert lib.job(failed)["error"] == "boom bad file"
        assert [j["id"] for j in lib.unfinished_jobs()] == [first, second]
        assert lib.delete_job(failed) is True and len(os.listdir(lib.jobs_folder)) == 2


def test_a_job_finish_that_fails_keeps_the_job_and_its_audio(lib, wav, monkeypatch):
    jid = lib.add_job(title="j", options={}, audio=wav)

    def broken(*args: Any, **kwargs: Any) -> None:
        raise sqlite3.OperationalError("disk I/O error (simulated)")

    monkeypatch.setattr(Library, "_insert", broken)
    with pytest.raises(LibraryError, match="simulated"):
        lib.finish_job(jid, _content(["x"]), title="x")
    assert lib.job(jid)["status"] == "queued" and lib.job_audio(jid).is_file()
    assert os.listdir(lib.audio_folder) == [] and lib.list()[1] == 0


def test_orphan_files_are_removed_once_old(lib, wav):
    tid = lib.add(_content(["kept"]), title="k", audio=wav)
    jid = lib.add_job(title="j", options={}, audio=wav, move_audio=False)
    # What a process killed after placing a file and before committing its row leaves behind.
    (lib.audio_folder / "0123456789ab.wav").write_bytes(b"orphan")
    (lib.jobs_folder / ".x.wav.mlxasr-1-abcd.tmp").write_bytes(b"orphan")
    assert lib.cleanup() == []  # fresh: maybe another process's, about to be committed
    removed = lib.cleanup(now=time.time() + 120)
    assert sorted(p.name for p in removed) == [".x.wav.mlxasr-1-abcd.tmp", "0123456789ab.wav"]
    assert lib.audio_path(tid).is_file() and lib.job_audio(jid).is_file()
