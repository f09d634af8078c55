from __future__ import annotations

import importlib.util
import json
import random
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from language_samples import LANGUAGE_SAMPLES
from official import official_module

from mlx_qwen3asr.checkpoints.tokenizer import (
    MISTRAL_FIX_SPLIT_PATTERN,
    QWEN2_SPLIT_PATTERN,
    Tokenizer,
    official_loader_patches_regex,
)
from mlx_qwen3asr.text.languages import CJK_NO_SPACE_LANGUAGES, SUPPORTED_LANGUAGES, resolve_language
from mlx_qwen3asr.text.output import fix_repetitions, fix_repetitions_flag, join_texts, parse_output
from mlx_qwen3asr.text.prompt import PromptIds
from tools.prompts import build_prompt_ids

SR = 16000


@pytest.fixture(scope="module")
def published(checkpoints) -> Path:
    """A checkpoint with the release's own config (transformers 4.57.6), tokenizer and template files."""
    return checkpoints("tiny")


@pytest.fixture(scope="module")
def processor(published):
    """The official processor as the official loader builds it, less fix_mistral_regex (see below)."""
    backend = official_module("core.transformers_backend")
    return backend.Qwen3ASRProcessor.from_pretrained(str(published), fix_mistral_regex=False)


@pytest.fixture(scope="module")
def loader_processor(published):
    """Exactly as qwen_asr's Qwen3ASRModel.from_pretrained loads a local checkpoint folder."""
    backend = official_module("core.transformers_backend")
    return backend.Qwen3ASRProcessor.from_pretrained(str(published), fix_mistral_regex=True)


@pytest.fixture(scope="module")
def tok(published) -> Tokenizer:
    return Tokenizer.from_dir(published)


@pytest.fixture(scope="module")
def official_utils() -> types.ModuleType:
    """qwen_asr/inference/utils.py executed without its unused librosa import."""
    spec = importlib.util.find_spec("qwen_asr")
    assert spec is not None and spec.submodule_search_locations
    path = Path(list(spec.submodule_search_locations)[0]) / "inference" / "utils.py"
    source = path.read_text(encoding="utf-8")
    assert "\nimport librosa\n" in source
    module = types.ModuleType("official_inference_utils")
    module.__file__ = str(path)
    # dataclasses resolve the defining module through sys.modules while the class is created.
    sys.modules[module.__name__] = module
    try:
        exec(compile(source.replace("\nimport librosa\n", "\n"), str(path), "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    return module


def official_prompt(processor, context: str, force_language: str | None) -> str:
    """The string Qwen3ASRModel._build_text_prompt renders."""
    messages = [
        {"role": "system", "content": context or ""},
        {"role": "user", "content": [{"type": "audio", "audio": ""}]},
    ]
    base = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    if force_language:
        base = base + f"language {force_language}<asr_text>"
    return base


def official_ids(processor, context: str, language: str | None, seconds: float) -> list[int]:
    rng = np.random.default_rng(int(seconds * 10))
    wav = (0.1 * rng.standard_normal(int(seconds * SR))).astype(np.float32)
    out = processor(text=[official_prompt(processor, context, language)], audio=[wav], return_tensors="np")
    return out["input_ids"][0].tolist()


# (a) prompt ids ------------------------------------------------------------------------------------

PROMPT_CASES = [
    ("", None),
    ("Speakers: 王小明, Anna.\nTopic: 语音识别", None),
    (" leading space 前导空格", None),
    ("\nstarts with a newline", None),
    ("\n\n  two newlines then spaces", None),
    ("", "English"),
    ("", "Chinese"),
    ("会议纪要\nQ3 results", "English"),
    ("Glossary: iPhone, JavaScript, don't, café", "Japanese"),
]


@pytest.mark.parametrize("seconds", [1.0, 7.9, 8.1, 20.0])
@pytest.mark.parametrize("context,language", PROMPT_CASES)
def test_prompt_ids_match_official_processor(processor, tok, context, language, seconds):
    expected = official_ids(processor, context, language, seconds)
    pad = tok.token_to_id("<|audio_pad|>")
    n = expected.count(pad)
    assert n > 0
    assert build_prompt_ids(tok, n, context, language) == expected


def test_audio_pad_counts_differ_by_length(processor, tok):
    pad = tok.token_to_id("<|audio_pad|>")
    counts = [official_ids(processor, "", None, s).count(pad) for s in (1.0, 7.9, 8.1, 20.0)]
    assert counts == sorted(counts) and len(set(counts)) == 4


# Languages whose sample context the official loader's Mistral split cuts differently from the Qwen
# pre-tokenizer the model ships with (English: "McDonald" -> "Mc"+"Donald"; Turkish: "'da" -> "'"+"da"
# instead of "'d"+"a"; Thai: whole words, where the Qwen split breaks at every combining vowel mark).
MISTRAL_SPLIT_DIFFERS = {"English", "Thai", "Turkish"}


def test_official_loader_patches_a_published_checkpoint(published, processor, loader_processor):
    """A local folder whose config says transformers 4.57.6 (as the release's does) gets the Mistral split
    under the official loader's fix_mistral_regex=True; the model's own tokenizer has the Qwen split."""
    assert official_loader_patches_regex(published)
    patterns = []
    for p in (processor, loader_processor):
        state = json.loads(p.tokenizer.backend_tokenizer.pre_tokenizer.__getstate__())
        patterns.append(state["pretokenizers"][0]["pattern"]["Regex"])
    assert patterns == [QWEN2_SPLIT_PATTERN, MISTRAL_FIX_SPLIT_PATTERN]


@pytest.mark.parametrize("language", SUPPORTED_LANGUAGES)
def test_prompt_ids_on_published_metadata(processor, loader_processor, tok, checkpoints, language):
    """Prompt ids against the official processor on the release's own files, for each language's script."""
    sample = LANGUAGE_SAMPLES[language]
    # No context: identical to the official loader's, whatever split it uses.
    expected = official_ids(loader_processor, "", language, 3.0)
    n = expected.count(tok.token_to_id("<|audio_pad|>"))
    assert build_prompt_ids(tok, n, "", language) == expected
    # A context: identical to the model's own tokenizer (Qwen split), and to the official loader's
    # wherever its Mistral split agrees.
    ours = build_prompt_ids(tok, n, sample, None)
    assert ours == official_ids(processor, sample, None, 3.0)
    assert (ours != official_ids(loader_processor, sample, None, 3.0)) == (language in MISTRAL_SPLIT_DIFFERS)
    # The -hf repositories' tokenizer.json gives the same prompt.
    hf_tok = Tokenizer.from_dir(checkpoints("tiny", "hf"))
    assert build_prompt_ids(hf_tok, n, sample, None) == ours


def test_fix_mistral_regex_reproduces_the_official_loader(published, loader_processor):
    context = "Glossary: iPhone, JavaScript, McDonald's, İstanbul'da, " + LANGUAGE_SAMPLES["Thai"]
    expected = official_ids(loader_processor, context, "English", 3.0)
    n = expected.count(151676)
    patched = Tokenizer.from_dir(published, fix_mistral_regex=True)
    plain = Tokenizer.from_dir(published)
    assert build_prompt_ids(patched, n, context, "English") == expected
    assert build_prompt_ids(plain, n, context, "English") != expected


def test_prompt_layout(tok):
    ids = build_prompt_ids(tok, 3, "", None)
    assert ids == [
        151644, 8948, 198, 151645, 198,
        151644, 872, 198, 151669, 151676, 151676, 151676, 151670, 151645, 198,
        151644, 77091, 198,
    ]  # fmt: skip
    forced = build_prompt_ids(tok, 0, "", "English")
    assert forced[-4:] == [198, 11528, 6364, 151704]


def test_prompt_language_is_resolved(tok):
    assert build_prompt_ids(tok, 2, "x", "en") == build_prompt_ids(tok, 2, "x", "English")
    assert build_prompt_ids(tok, 2, "x", "") == build_prompt_ids(tok, 2, "x", None)
    with pytest.raises(ValueError, match="unsupported language"):
        build_prompt_ids(tok, 2, "x", "Klingon")


def test_prompt_rejects_bad_input(tok):
    with pytest.raises(ValueError, match="audio_pad"):
        build_prompt_ids(tok, 2, "oops <|audio_pad|>", None)
    with pytest.raises(ValueError, match="n_audio_tokens"):
        build_prompt_ids(tok, -1)


def test_prompt_ids_come_from_the_tokenizer(tok):
    class Shifted:
        """A tokenizer whose control tokens have other ids."""

        def encode(self, text: str) -> list[int]:
            return tok.encode(text)

        def token_to_id(self, token: str) -> int:
            return tok.token_to_id(token) + 1000

    ids = PromptIds.from_tokenizer(Shifted())
    assert ids.audio_pad == 151676 + 1000 and ids.asr_text == 151704 + 1000
    prompt = build_prompt_ids(Shifted(), 2, "", "English")
    assert prompt.count(151676 + 1000) == 2 and prompt[-1] == 151704 + 1000


# (b) languages ------------------------------------------------------------------------------------


def test_supported_languages_match_official(official_utils):
    assert list(SUPPORTED_LANGUAGES) == official_utils.SUPPORTED_LANGUAGES
    assert CJK_NO_SPACE_LANGUAGES == {"Chinese", "Cantonese", "Japanese", "Thai"}


@pytest.mark.parametrize(
    "given,expected",
    [
        (None, None),
        ("", None),
        ("   ", None),
        ("English", "English"),
        ("english", "English"),
        ("ENGLISH", "English"),
        (" French ", "French"),
        ("en", "English"),
        ("EN", "English"),
        ("eng", "English"),
        ("en-US", "English"),
        ("en_GB", "English"),
        ("zh", "Chinese"),
        ("zho", "Chinese"),
        ("cmn", "Chinese"),
        ("zh-CN", "Chinese"),
        ("zh_TW", "Chinese"),
        ("zh-Hans", "Chinese"),
        ("yue", "Cantonese"),
        ("zh-HK", "Cantonese"),
        ("zh-yue", "Cantonese"),
        ("pt_BR", "Portuguese"),
        ("pt-PT", "Portuguese"),
        ("es-419", "Spanish"),
        ("ja", "Japanese"),
        ("ko", "Korean"),
        ("fil", "Filipino"),
        ("tl", "Filipino"),
        ("fa", "Persian"),
        ("el", "Greek"),
        ("mk", "Macedonian"),
        ("ms", "Malay"),
        ("id", "Indonesian"),
        ("cs", "Czech"),
        ("ar", "Arabic"),
        ("hi", "Hindi"),
        ("vi", "Vietnamese"),
    ],
)
def test_resolve_language(given, expected):
    assert resolve_language(given) == expected


def test_every_language_resolves_by_name_and_code():
    for name in SUPPORTED_LANGUAGES:
        assert resolve_language(name) == name
        assert resolve_language(name.upper()) == name
        assert resolve_language(name.lower()) == name
    codes = {
        "zh", "en", "yue", "ar", "de", "fr", "es", "pt", "id", "it", "ko", "ru", "th", "vi", "ja",
        "tr", "hi", "ms", "nl", "sv", "da", "fi", "pl", "cs", "fil", "fa", "el", "ro", "hu", "mk",
    }  # fmt: skip
    assert {resolve_language(c) for c in codes} == set(SUPPORTED_LANGUAGES)


@pytest.mark.parametrize("bad", ["xx", "Klingon", "en-", "zz-CN", "Englishh"])
def test_resolve_language_error(bad):
    with pytest.raises(ValueError) as info:
        resolve_language(bad)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"unsupported language '{bad}': use one of Chinese (zh), English (en), ")
    for name in SUPPORTED_LANGUAGES:
        assert f"{name} (" in message
    assert "Cantonese (yue)" in message and "Filipino (fil)" in message and "Macedonian (mk)" in message


# (c) repetitions ----------------------------------------------------------------------------------


def repetition_cases(count: int, seed: int = 99) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    alphabet = "abcab 的了是。！ ,.xyz"
    cases = []
    for _ in range(count):
        threshold = rng.choice([20, 20, 20, 5, 3, 2, 1])
        parts = []
        for _ in range(rng.randint(1, 4)):
            parts.append("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 15))))
            kind = rng.random()
            if kind < 0.4:
                unit = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 22)))
                parts.append(unit * rng.randint(max(1, threshold - 3), threshold + 4))
            elif kind < 0.7:
                parts.append(rng.choice(alphabet) * rng.randint(max(1, threshold - 2), threshold + 3))
        text = "".join(parts)
        if threshold <= 2:
            text = text[:300]  # the reference recurses once per collapse
        cases.append((text, threshold))
    hand = [
        ("", 20),
        ("a", 20),
        ("a" * 20, 20),
        ("a" * 21, 20),
        ("a" * 40, 20),
        ("x" + "a" * 20 + "b" * 19, 20),
        ("ab" * 20, 20),
        ("ab" * 20 + "c" * 40, 20),
        ("哈" * 100 + "好的", 20),
        ("谢谢大家。" * 25, 20),
        ("the end " * 19, 20),
        ("the end " * 20, 20),
        ("abcdefghijklmnopqrstu" * 25, 20),
        ("abcdefghijklmnopqrst" * 25, 20),
        ("hello " + "la " * 30 + "world", 20),
    ]
    return hand + cases


REPETITION_CASES = repetition_cases(600)


def test_fix_repetitions_matches_official(official_utils):
    mismatches = []
    changed = 0
    for text, threshold in REPETITION_CASES:
        expected = official_utils.detect_and_fix_repetitions(text, threshold=threshold)
        got, flag = fix_repetitions_flag(text, threshold)
        if got != expected or flag != (expected != text):
            mismatches.append((text, threshold, got, expected))
        changed += expected != text
    assert not mismatches, mismatches[:3]
    assert changed > len(REPETITION_CASES) // 4  # the corpus really exercises collapsing


def test_fix_repetitions_long_inputs():
    # 1000 alternating 20-char runs: 999 collapses, one recursion level each in the reference.
    text = ("a" * 20 + "b" * 20) * 500
    assert len(text) == 20000
    # A run may only start 40 characters before the end, so the last block stays.
    assert fix_repetitions(text) == "ab" * 499 + "a" + "b" * 20
    assert fix_repetitions("abc" * 6667) == "abc"
    assert fix_repetitions("x" * 20000) == "x"
    assert fix_repetitions_flag("no repeats here") == ("no repeats here", False)
    assert fix_repetitions_flag("ha" * 20) == ("ha", True)


def test_fix_repetitions_threshold_must_be_positive():
    with pytest.raises(ValueError):
        fix_repetitions("aaa", threshold=0)


# (d) output parsing -------------------------------------------------------------------------------

RAW_OUTPUTS = [
    None,
    "",
    "   \n ",
    "language Chinese<asr_text>你好，世界。",
    "language English<asr_text> Hello there. ",
    "language english<asr_text>lower case",
    "LANGUAGE FRENCH<asr_text>Bonjour",
    "language None<asr_text>",
    "language None<asr_text>  something anyway ",
    "language none<asr_text>",
    "Hello without a tag",
    "  padded without a tag  ",
    "language Chinese\nextra line\n<asr_text>text after newline",
    "\n\nlanguage Japanese<asr_text>こんにちは",
    "language <asr_text>empty name",
    "meta only<asr_text>text",
    "\nnot first\nlanguage German<asr_text>Hallo",
    "language Chinese<asr_text>a<asr_text>b",
    "language English<asr_text>" + "ha" * 30,
    "language English<asr_text>" + "a" * 50 + " done",
    "language Cantonese<asr_text>",
    "language   Korean  <asr_text>안녕",
    "<asr_text>no meta",
]


@pytest.mark.parametrize("forced", [None, "", "English", "Chinese"])
def test_parse_output_matches_official(official_utils, forced):
    for raw in RAW_OUTPUTS:
        assert parse_output(raw, forced) == official_utils.parse_asr_output(raw, user_language=forced), raw


def test_parse_output_examples():
    assert parse_output("language Chinese<asr_text>你好", None) == ("Chinese", "你好")
    assert parse_output("language None<asr_text>", None) == ("", "")
    assert parse_output("just text", None) == ("", "just text")
    assert parse_output("language English<asr_text>x", "German") == ("German", "language English<asr_text>x")
    assert parse_output("language ENGLISH<asr_text>" + "la" * 40, None) == ("English", "la")
    assert parse_output("noise\nlanguage german\n<asr_text>Hallo", None) == ("German", "Hallo")


# (e) joining --------------------------------------------------------------------------------------


def test_join_texts_known_languages():
    assert join_texts([" Hello world. ", "", "  ", "How are you?"], "English") == "Hello world. How are you?"
    assert join_texts(["你好。", " 世界 "], "Chinese") == "你好。世界"
    assert join_texts(["こんにちは", "世界"], "ja") == "こんにちは世界"
    assert join_texts(["สวัสดี", "ครับ"], "Thai") == "สวัสดีครับ"
    assert join_texts(["早晨", "你好"], "Cantonese") == "早晨你好"
    assert join_texts(["안녕하세요", "반갑습니다"], "Korean") == "안녕하세요 반갑습니다"
    assert join_texts(["Bonjour", "le monde"], "fr") == "Bonjour le monde"
    assert join_texts([], "English") == ""
    assert join_texts(["only"], "Chinese") == "only"


def test_join_texts_unknown_language_decides_per_boundary():
    texts = ["Hello", "你好", "world", "안녕", "하세요", "カタカナ", "ไทย", "end."]
    assert join_texts(texts, "") == "Hello你好world 안녕 하세요カタカナไทยend."
    assert join_texts(texts, None) == join_texts(texts, "")
    # Merged multi-language labels are not a single language.
    assert join_texts(["one", "two"], "Chinese,English") == "one two"
    assert join_texts(["句子。", "Next"], "Klingon") == "句子。Next"
