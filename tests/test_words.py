"""mlx_qwen3asr.text.words against the official aligner's text processing (qwen_asr.inference.qwen3_forced_aligner).

The item texts must be the official word list for every input, the timestamp repair must give the
official output for every input, and the Korean dictionary shipped with the package must be the
official file, found without the network.
"""

from __future__ import annotations

import hashlib
import importlib.util
import random
import socket
import sys
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from official import official_aligner_module

from mlx_qwen3asr.text import korean_dictionary, words
from mlx_qwen3asr.text.korean_dictionary import (
    KOREAN_DICT_SHA256,
    KoreanDictionaryError,
    korean_dictionary_bytes,
)
from mlx_qwen3asr.text.words import Item, display_spans, fix_timestamps, split_items, word_times

HAVE_NAGISA = importlib.util.find_spec("nagisa") is not None
HAVE_SOYNLP = importlib.util.find_spec("soynlp") is not None
NEEDS_NAGISA = pytest.mark.skipif(
    not HAVE_NAGISA, reason="nagisa is not installed (pip install nagisa==0.2.11)"
)
NEEDS_SOYNLP = pytest.mark.skipif(
    not HAVE_SOYNLP, reason="soynlp is not installed (pip install soynlp==0.0.493)"
)


@pytest.fixture(scope="module")
def official():
    return official_aligner_module().Qwen3ForceAlignProcessor()


@pytest.fixture(autouse=True)
def fresh_tokenizers():
    """Each test looks the optional tokenizers and the dictionary up anew (some hide them)."""
    words._clear_caches()
    yield
    words._clear_caches()


def official_words(official, text: str, language: str | None) -> list[str]:
    return official.encode_timestamp(text, language or "English")[0]


# --- what the spans must satisfy ------------------------------------------------------------------


def nagisa_form(text: str) -> str:
    """nagisa's input normalisation (NFKC, dotted capital I, spaces), written independently here."""
    return unicodedata.normalize("NFKC", text).replace("\u0130", "I").replace(" ", "\u3000")


def is_subsequence(needle: str, haystack: str) -> bool:
    rest = iter(haystack)
    return all(ch in rest for ch in needle)


def check_item_spans(text: str, items: list[Item], language: str | None) -> None:
    """Each item's characters come, in order, from its span, and the span is no wider than that."""
    japanese = (language or "").lower() == "japanese" and words.official_split_available("Japanese")
    form = nagisa_form if japanese else str
    previous_end = 0
    for item in items:
        assert item.text, item
        assert 0 <= item.start < item.end <= len(text), item
        assert item.start >= previous_end or japanese, f"{item} overlaps the item before it"
        previous_end = item.end
        source = form(text[item.start : item.end])
        assert is_subsequence(item.text, source), f"{item}: {item.text!r} not in {source!r}"
        assert not is_subsequence(item.text, form(text[item.start + 1 : item.end])), f"{item} starts early"
        assert not is_subsequence(item.text, form(text[item.start : item.end - 1])), f"{item} ends late"
        if not japanese:
            assert source[0] == item.text[0] and source[-1] == item.text[-1], f"{item} vs {source!r}"


def check_display_spans(text: str, items: list[Item]) -> list[tuple[int, int]]:
    spans = display_spans(text, items)
    assert len(spans) == len(items)
    if not items:
        return spans
    previous_end = 0
    previous_item_end = 0
    for (start, end), item in zip(spans, items):
        assert previous_end <= start <= end <= len(text), (spans, items)
        if item.start >= previous_item_end:  # an item of its own source characters keeps them
            assert start <= item.start and item.end <= end, (item, (start, end))
        previous_end = end
        previous_item_end = max(previous_item_end, item.end)
    covered = [False] * len(text)
    for start, end in spans:
        for position in range(start, end):
            covered[position] = True
    uncovered = [text[p] for p in range(len(text)) if not covered[p] and not text[p].isspace()]
    assert not uncovered, f"{text!r}: {uncovered} is in no span ({spans})"
    return spans


# --- split_items against the official word list --------------------------------------------------

TEXTS = [
    ("English", "Hello, world! It's 3:45 p.m. and I've got $1,234.56 — don't worry."),
    ("English", "Rock 'n' roll, the '90s and O'Neil's cat... \"quoted\" (parenthesised) e-mail a/b 5km 2nd"),
    ("English", ""),
    ("English", "   \t\n "),
    ("English", "!!! ... — ???"),
    ("English", "I love it 👍🏽😀 so much 🎉!"),
    ("Chinese", "我用iPhone拍了3张照片。"),
    ("Chinese", "他说：“你好，世界！”然后走了。2024年1月1日，GPT-4发布了。"),
    ("Chinese", "豈𠀀㐀中文 混合 English单词和数字123。"),
    ("Cantonese", "佢哋今日去咗旺角食嘢。"),
    ("German", "Größe, Maß und Übermäßigkeit — „Anführungszeichen“ sind schön. Straße Nr. 5"),
    ("French", "L'homme d'aujourd'hui n'a qu'un « souhait » : c'est l'été ! Jusqu'à 20 h."),
    ("Spanish", "¿Qué tal? ¡Muy bien! El niño comió 3 piñas, ¿verdad?"),
    ("Russian", "Привет, мир! Это тест №1 — ёлка, «кавычки»."),
    ("Arabic", "مرحبا بالعالم، كيف حالك؟ ١٢٣ رقم."),
    ("Hindi", "नमस्ते दुनिया, यह एक परीक्षण है।"),
    ("Thai", "สวัสดีครับ ผมชื่อสมชาย"),
    ("Vietnamese", "Tiếng Việt có dấu: người, được, những."),
    ("Greek", "Γειά σου κόσμε; Ελληνικά!"),
    (None, "e\u0301te\u0301 cafe\u0301, ﬁne ½ Ⅻ ² ＡＢＣ１２３ ｶﾞｷﾞ"),
    (None, "tabs\tand\u3000ideographic\xa0spaces\u2028line\x1cseparators"),
    ("English", "under_score hy-phen dot.ted at@sign hash#tag 50% 3×4=12"),
    ("Japanese", "今日は良い天気ですね。散歩に行きましょう！"),
    ("Japanese", "「こんにちは」と彼は言った。ＡＢＣ abc　テスト、ｶﾀｶﾅ半角。"),
    ("Japanese", "2024年1月1日、東京タワーでiPhoneを買いました。"),
    ("Japanese", "㍻ ™ ½ İstanbul ｶﾞｷﾞ ガ"),
    ("Japanese", "東ﾟ ⅒と ﷵ です ﬁ。"),
    ("Japanese", ""),
    ("Japanese", "　 "),
    ("Korean", "안녕하세요, 저는 학생입니다."),
    ("Korean", "대한민국의 수도는 서울입니다! 오늘 날씨가 좋네요 😀"),
    ("Korean", "2024년에 iPhone을 샀어요. 韓國語와 한자(漢字)도 씁니다."),
    ("Korean", ""),
    ("Korean", "  ..  "),
]


def _needs(language: str | None) -> list[pytest.MarkDecorator]:
    key = (language or "").lower()
    return [NEEDS_NAGISA] if key == "japanese" else [NEEDS_SOYNLP] if key == "korean" else []


@pytest.mark.parametrize(
    ("language", "text"),
    [
        pytest.param(language, text, marks=_needs(language), id=f"{language}-{i}")
        for i, (language, text) in enumerate(TEXTS)
    ],
)
def test_split_items_matches_official(official, language, text):
    assert words.official_split_available(language), words.split_fallback_reason(language)
    items = split_items(text, language)
    assert [item.text for item in items] == official_words(official, text, language)
    check_item_spans(text, items, language)
    check_display_spans(text, items)


def random_text(rng: random.Random, alphabet: list[str], length: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(length))


SPACE_ALPHABET = list(
    "abcXYZéßжЖمحनमस्ते'0123我你好中豈,.!?¿¡«»“”\"-—:;()「」，。、_/@#% \t\n\u3000\xa0\u2028\x1c"
) + ["𠀀", "😀", "👍🏽", "\u0301", "\u200d", "ｶﾞ", "ＡＢ１", "²", "Ⅻ", "½", "ﬁ", "  ", "don't"]


def test_split_items_matches_official_on_random_texts(official):
    rng = random.Random(1234)
    for case in range(400):
        text = random_text(rng, SPACE_ALPHABET, rng.randint(0, 40))
        language = ("English", "Chinese", "German", None)[case % 4]
        items = split_items(text, language)
        assert [item.text for item in items] == official_words(official, text, language), repr(text)
        check_item_spans(text, items, language)
        check_display_spans(text, items)


@NEEDS_NAGISA
def test_split_items_matches_official_on_random_japanese(official):
    alphabet = list(
        "あいうえおかきくけこがぎんっーアイウエオカキクケコガギンッ日本語東京今天気学生、。！？「」・（）"
    )
    alphabet += list("abcXYZ0123ＡＢＣ１２３ｱｲｳｶﾞﾟ　 '.,-") + ["㍻", "½", "™", "😀", "İ", "e\u0301"]
    rng = random.Random(99)
    for _ in range(60):
        text = random_text(rng, alphabet, rng.randint(0, 30))
        items = split_items(text, "Japanese")
        assert [item.text for item in items] == official_words(official, text, "Japanese"), repr(text)
        check_item_spans(text, items, "Japanese")
        check_display_spans(text, items)


@NEEDS_SOYNLP
def test_split_items_matches_official_on_random_korean(official):
    pieces = [
        "안녕",
        "하세요",
        "저는",
        "학생",
        "입니다",
        "대한민국",
        "의",
        "서울",
        "에서",
        "사람",
        "들이",
        "했다",
    ]
    pieces += list(" ,.!?'\"()-—0123abcXYZ漢字😀") + ["  ", "\u3000"]
    rng = random.Random(7)
    for _ in range(200):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        items = split_items(text, "Korean")
        assert [item.text for item in items] == official_words(official, text, "Korean"), repr(text)
        check_item_spans(text, items, "Korean")
        check_display_spans(text, items)


def test_language_names_are_compared_without_case(official):
    text = "東京タワー"
    assert [i.text for i in split_items(text, "chinese")] == ["東", "京", "タワー"]
    if HAVE_NAGISA:
        assert [i.text for i in split_items(text, "JAPANESE")] == official_words(official, text, "Japanese")
        assert [i.text for i in split_items(text, "JAPANESE")] != ["東", "京", "タワー"]


def test_item_spans_point_into_the_original_text():
    text = "  «Hello», said the man — it's 10:30. 我们走吧！"
    items = split_items(text, "English")
    assert [(i.text, text[i.start : i.end]) for i in items] == [
        ("Hello", "Hello"),
        ("said", "said"),
        ("the", "the"),
        ("man", "man"),
        ("it's", "it's"),
        ("1030", "10:30"),
        ("我", "我"),
        ("们", "们"),
        ("走", "走"),
        ("吧", "吧"),
    ]


@NEEDS_NAGISA
def test_japanese_spans_follow_normalisation():
    text = "ＡＢＣを ｶﾞｷﾞ で㍻"
    items = split_items(text, "Japanese")
    sources = {item.text: text[item.start : item.end] for item in items}
    assert sources["ABC"] == "ＡＢＣ"
    assert "ガギ" in sources and sources["ガギ"] == "ｶﾞｷﾞ"
    assert any(source == "㍻" for source in sources.values())


# --- fallbacks -------------------------------------------------------------------------------------


def test_japanese_falls_back_to_script_runs_without_nagisa(monkeypatch):
    monkeypatch.setitem(sys.modules, "nagisa", None)  # import nagisa now raises ImportError
    assert not words.official_split_available("Japanese")
    assert "nagisa" in words.split_fallback_reason("Japanese")
    text = "日本語のテキストです。ABCと123、ｶﾀｶﾅ！ it's"
    items = split_items(text, "Japanese")
    assert [i.text for i in items] == ["日本語", "の", "テキスト", "です", "ABC", "と", "123", "ｶﾀｶﾅ", "it's"]
    assert all(text[i.start : i.end] == i.text for i in items)
    check_display_spans(text, items)
    assert words.official_split_available("English")


def test_korean_falls_back_to_whitespace_words_without_soynlp(monkeypatch):
    monkeypatch.setitem(sys.modules, "soynlp", None)
    monkeypatch.setitem(sys.modules, "soynlp.tokenizer", None)
    assert not words.official_split_available("Korean")
    assert "soynlp" in words.split_fallback_reason("Korean")
    text = "안녕하세요, 저는 학생입니다. (漢字)"
    items = split_items(text, "Korean")
    assert [i.text for i in items] == ["안녕하세요", "저는", "학생입니다", "漢字"]
    check_item_spans(text, items, "Korean")


@NEEDS_SOYNLP
def test_korean_fallback_is_soynlp_without_a_dictionary():
    from soynlp.tokenizer import LTokenizer

    text = "대한민국의 수도는 서울입니다! 오늘, 날씨가 좋네요 ab'c 12"
    expected = [official_clean(t) for t in LTokenizer().tokenize(text) if official_clean(t)]
    assert [i.text for i in words._split_korean_fallback(text)] == expected


def official_clean(token: str) -> str:
    return "".join(ch for ch in token if ch == "'" or unicodedata.category(ch)[0] in "LN")


# --- display_spans --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "language", "expected"),
    [
        ("Hello, world!", "English", ["Hello,", "world!"]),
        ("¿Qué tal? ¡Muy bien!", "Spanish", ["¿Qué", "tal?", "¡Muy", "bien!"]),
        ("Hola,¿qué tal? Bien ¡ gracias", "Spanish", ["Hola,¿qué", "tal?", "Bien", "¡ gracias"]),
        ("好,¿你", "Chinese", ["好,", "¿你"]),
        ("我用iPhone拍了3张照片。", "Chinese", ["我", "用", "iPhone", "拍", "了", "3", "张", "照", "片。"]),
        ("他说：「你好」。", "Chinese", ["他", "说：", "「你", "好」。"]),
        ('"Hello," she said — "fine."', "English", ['"Hello,"', "she", "said —", '"fine."']),
        ("Il dit : « Bonjour » !", "French", ["Il", "dit :", "« Bonjour » !"]),
        ("— Hello (there) ...", "English", ["— Hello", "(there) ..."]),
        ("a.b.c (x)y", "English", ["a.b.c", "(x)y"]),
        ("one,(two)", "English", ["one,(two)"]),
        ("好，(你)", "Chinese", ["好，", "(你)"]),
        ("  spaced   out  ", "English", ["spaced", "out"]),
    ],
)
def test_display_spans_examples(text, language, expected):
    items = split_items(text, language)
    spans = check_display_spans(text, items)
    assert [text[start:end] for start, end in spans] == expected


def test_display_spans_share_one_source_character():
    text = "x ½ y"
    items = [Item("x", 0, 1), Item("1", 2, 3), Item("2", 2, 3), Item("y", 4, 5)]
    assert display_spans(text, items) == [(0, 1), (2, 3), (3, 3), (4, 5)]
    text = "x ⅒, y"
    items = [Item("x", 0, 1), Item("1", 2, 3), Item("1", 2, 3), Item("0", 2, 3), Item("y", 5, 6)]
    assert display_spans(text, items) == [(0, 1), (2, 3), (3, 3), (3, 4), (5, 6)]


def test_display_spans_refuse_bad_items():
    with pytest.raises(ValueError, match="outside the text"):
        display_spans("abc", [Item("abcd", 0, 4)])
    with pytest.raises(ValueError, match="before the item before it"):
        display_spans("ab cd", [Item("cd", 3, 5), Item("ab", 0, 2)])
    assert display_spans("...", []) == []


# --- the Korean dictionary --------------------------------------------------------------------------


def official_dictionary_bytes() -> bytes:
    """The dictionary of the installed official package, located here independently of words."""
    spec = importlib.util.find_spec("qwen_asr")
    assert spec is not None and spec.submodule_search_locations, (
        "the official qwen-asr package is not installed"
    )
    path = Path(list(spec.submodule_search_locations)[0]) / "inference" / "assets" / "korean_dict_jieba.dict"
    return path.read_bytes()


SHIPPED = Path(korean_dictionary.__file__).parent / "data" / "korean_dict_jieba.dict"


def test_shipped_dictionary_is_the_pinned_official_file():
    shipped = SHIPPED.read_bytes()
    assert hashlib.sha256(shipped).hexdigest() == KOREAN_DICT_SHA256
    assert shipped == official_dictionary_bytes()
    assert korean_dictionary_bytes() == shipped
    notice = SHIPPED.with_name("NOTICE.korean_dict_jieba").read_text(encoding="utf-8")
    assert "Apache" in notice and KOREAN_DICT_SHA256 in notice
    assert "Apache License" in SHIPPED.with_name("LICENSE.korean_dict_jieba").read_text(encoding="utf-8")


def test_shipped_dictionary_is_package_data():
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text(encoding="utf-8")
    data = pyproject.split("[tool.setuptools.package-data]", 1)[1].split("\n[", 1)[0]
    assert '"mlx_qwen3asr.text"' in data and "data/" in data


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No network, no official package to find, and an empty cache folder."""

    def refuse(*args, **kwargs):
        raise AssertionError("the network was used")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setitem(sys.modules, "qwen_asr", None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


@NEEDS_SOYNLP
def test_korean_is_split_officially_offline_from_the_shipped_dictionary(offline, official):
    assert words.official_split_available("Korean")
    text = "대한민국의 수도는 서울입니다! 오늘 날씨가 좋네요"
    items = split_items(text, "Korean")
    assert [i.text for i in items][:4] == ["대한민국", "의", "수도", "는"]
    assert [i.text for i in items] == official_words(official, text, "Korean")


def test_a_damaged_shipped_dictionary_is_named_and_korean_falls_back(monkeypatch):
    monkeypatch.setattr(korean_dictionary, "KOREAN_DICT_SHA256", "0" * 64)
    with pytest.raises(KoreanDictionaryError, match="korean_dict_jieba.dict .*expected 0{64}; reinstall"):
        korean_dictionary_bytes()
    assert not words.official_split_available("Korean")
    reason = words.split_fallback_reason("Korean")
    assert "split at whitespace" in reason
    if HAVE_SOYNLP:
        assert "Korean dictionary is unavailable" in reason and "reinstall mlx-qwen3asr" in reason
    text = "대한민국의 수도는 서울입니다!"
    assert [i.text for i in split_items(text, "Korean")] == ["대한민국의", "수도는", "서울입니다"]


def test_korean_scores_are_the_first_field_of_each_line():
    assert words.read_korean_scores("서울 3 NNP\n\n수도 1 x\r\n") == {"서울": 1.0, "수도": 1.0}


# --- timestamps -----------------------------------------------------------------------------------


def random_timestamps(rng: random.Random) -> list[float]:
    length = rng.choice([0, 1, 2, 3, rng.randint(0, 12), rng.randint(0, 60), rng.randint(0, 300)])
    shape = rng.random()
    if shape < 0.4:  # few distinct values: ties everywhere
        top = rng.choice([1, 2, 3, 5, 10])
        return [float(rng.randrange(top)) for _ in range(length)]
    if shape < 0.8:  # rising like real predictions, with outliers
        values, now = [], 0
        for _ in range(length):
            now += rng.choice([0, 0, 1, 2, 3])
            values.append(float(now if rng.random() > 0.2 else rng.randrange(now + 20)))
        return values
    return [rng.randrange(100) * 80.0 + rng.choice([0.0, 0.5, 0.25]) for _ in range(length)]


def test_fix_timestamps_is_the_official_repair(official):
    rng = random.Random(2024)
    for _ in range(600):
        values = random_timestamps(rng)
        if not values:
            continue
        assert fix_timestamps(values) == official.fix_timestamp(np.array(values)), values


def test_fix_timestamps_examples(official):
    cases = {
        (5, 1, 6, 2, 7): [5, 5, 6, 6, 7],
        (3, 1, 2): [1, 1, 2],
        (2, 2, 1, 1): [2, 2, 2, 2],  # the first longest run, not the equally long later one
        (0, 9, 9, 9, 9, 1, 2, 3, 4, 5): [0, 0, 0, 0, 0, 1, 2, 3, 4, 5],
        (0, 90, 80, 70, 20, 30, 40): [0, 5, 10, 15, 20, 30, 40],
        (10, 0, 0, 0, 0, 50): [0, 0, 0, 0, 0, 50],
        (7,): [7],
        (1.9, 2.7): [1, 2],
    }
    for values, expected in cases.items():
        assert official.fix_timestamp(np.array(values)) == expected, values
        assert fix_timestamps(values) == expected, values
        assert fix_timestamps(np.array(values, dtype=np.float32)) == expected, values


def test_fix_timestamps_edge_inputs(official):
    assert fix_timestamps([]) == []
    with pytest.raises(ValueError):  # the official function has no answer for no timestamps
        official.fix_timestamp(np.array([]))
    with pytest.raises(ValueError, match="NaN"):
        fix_timestamps([1.0, float("nan"), 2.0])


def _lines_run(function, *args) -> int:
    """How many lines of Python the call runs (a count of work that does not depend on the machine's load)."""
    count = 0

    def trace(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
        return trace

    sys.settrace(trace)
    try:
        function(*args)
    finally:
        sys.settrace(None)
    return count


def test_fix_timestamps_grows_as_n_log_n_not_n_squared():
    """Four times the timestamps cost about four times the work (n log n: 4.6x at most here), never the
    sixteen times of a quadratic repair, for inputs that go backwards everywhere, always, or in steps."""
    rng = random.Random(5)
    makers = [
        lambda n: [float(rng.randrange(50)) for _ in range(n)],
        lambda n: [float(n - i) for i in range(n)],
        lambda n: [float(i // 3) for i in range(n)],
    ]
    for make in makers:
        small, large = make(250), make(1000)
        fixed = fix_timestamps(large)
        assert len(fixed) == 1000 and fixed == sorted(fixed)
        ratio = _lines_run(fix_timestamps, large) / _lines_run(fix_timestamps, small)
        assert ratio < 6.0, f"4x the timestamps ran {ratio:.1f}x the lines"


def official_word_times(official, classes: list[int], segment_time: float, n_items: int):
    import torch

    milliseconds = (torch.tensor(classes, dtype=torch.int64) * segment_time).numpy()
    parsed = official.parse_timestamp([f"w{i}" for i in range(n_items)], milliseconds)
    return [(round(p["start_time"] / 1000.0, 3), round(p["end_time"] / 1000.0, 3)) for p in parsed]


def test_word_times_match_the_official_parse(official):
    rng = random.Random(11)
    for case in range(300):
        n_items = rng.randint(1, 40)
        segment_time = (80.0, 33.3, 40.0, 12.5)[case % 4]
        now, classes = 0, []
        for _ in range(2 * n_items):
            now += rng.choice([0, 1, 1, 2, 5])
            classes.append(now if rng.random() > 0.15 else rng.randrange(now + 30))
        if case % 10 == 0:
            classes = [rng.randrange(4) for _ in classes]
        expected = official_word_times(official, classes, segment_time, n_items)
        assert word_times(classes, segment_time, n_items) == expected, (classes, segment_time)
        assert word_times(np.array(classes), segment_time, n_items) == expected


def test_word_times_example():
    assert word_times([0, 3, 3, 7, 6, 9], 80.0, 3) == [(0.0, 0.24), (0.24, 0.56), (0.56, 0.72)]


def test_word_times_checks_the_count():
    with pytest.raises(ValueError, match=r"3 items need 2 \* 3 = 6 timestamp classes, got 5"):
        word_times([1, 2, 3, 4, 5], 80.0, 3)
    with pytest.raises(ValueError, match="without items has 2 timestamp classes, got 3"):
        word_times([1, 2, 3], 80.0, 0)
    with pytest.raises(ValueError, match=">= 0"):
        word_times([], 80.0, -1)
    assert word_times([4, 5], 80.0, 0) == []
    assert word_times([], 80.0, 0) == []


def test_items_and_times_line_up(official):
    text = "Hello, world! 我们走吧。"
    items = split_items(text, "English")
    classes = list(range(2 * len(items)))
    times = word_times(classes, 80.0, len(items))
    assert len(times) == len(items) == len(official_words(official, text, "English")) == 6
    assert times[1] == (0.16, 0.24)
