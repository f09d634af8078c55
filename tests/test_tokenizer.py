from __future__ import annotations

import json
import random
import shutil
import unicodedata
from pathlib import Path

import pytest
from language_samples import LANGUAGE_SAMPLES

from mlx_qwen3asr.checkpoints.tokenizer import (
    MISTRAL_FIX_SPLIT_PATTERN,
    QWEN2_SPLIT_PATTERN,
    Tokenizer,
    official_loader_patches_regex,
)
from mlx_qwen3asr.text.languages import SUPPORTED_LANGUAGES

PIECES = [
    # CJK
    "你好，世界！",
    "今天天气很好，我们去公园散步吧。",
    "語音辨識系統",
    "粤语：你食咗饭未呀？",
    "日本語の文章を書きます。",
    "カタカナとひらがな",
    "ｶﾀｶﾅ半角",
    "한국어 음성 인식",
    "안녕하세요, 반갑습니다!",
    # RTL and Indic, Thai
    "مرحبا بالعالم",
    "اللغة العربية جميلة.",
    "שלום עולם",
    "नमस्ते दुनिया",
    "हिन्दी में लिखा गया वाक्य।",
    "สวัสดีครับ ยินดีที่ได้รู้จัก",
    "ภาษาไทยไม่มีช่องว่างระหว่างคำ",
    # Cyrillic, Greek, Vietnamese, Turkish
    "Привет, мир! Как дела?",
    "Македонски јазик",
    "Γειά σου Κόσμε",
    "Tiếng Việt có dấu",
    "İstanbul'da güzel bir gün",
    # emoji
    "😀",
    "I ❤️ NY",
    "👨‍👩‍👧‍👦 family",
    "🏳️‍🌈 flag",
    "🇯🇵🇺🇸🇨🇳",
    "👍🏽👍🏿",
    # accents, combining characters
    "café naïve résumé",
    "Zoë Saldaña",
    "ångström",
    "e\u0301",
    "a\u0308o\u0308u\u0308",
    "\u1e9b\u0323",
    "Å Å",
    "ｆｕｌｌｗｉｄｔｈ　ｓｐａｃｅ",
    # code
    "def f(x):\n    return x ** 2\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    '{"key": [1, 2, 3], "nested": {"a": null}}',
    "if x != y && z >= 0:\n\tprint('ok')\r\n",
    "SELECT * FROM users WHERE id = 42;",
    "https://example.com/path?q=1&r=two#frag",
    "camelCaseIdentifier snake_case_name CONSTANT_NAME iPhone JavaScript",
    # whitespace
    "   ",
    "a  b   c    d",
    "\t\ttabs\tinside\t",
    "\n\nnewlines\n\n\n",
    "  leading",
    "trailing   ",
    "\r\n\r\nwindows\r\n",
    " \n \n ",
    "\u00a0non-breaking\u00a0space",
    "\u3000ideographic space",
    # contractions
    "it's we're they've I'm you'll he'd don't",
    "IT'S WE'RE THEY'VE I'M",
    "'s 're 've 'm 'll 'd 't",
    "rock'n'roll o'clock",
    # digits
    "0123456789",
    "3.14159265358979323846",
    "1,000,000 and 12345678901234567890",
    "Call 555-0199 at 10:30pm on 2024-01-31.",
    "٠١٢٣٤٥٦٧٨٩",
    # punctuation, symbols
    "Hello, World!",
    "Wait... what?!",
    "«quotes» „German“ 'single' \"double\"",
    "em—dash – en-dash - hyphen",
    "€100 £50 ¥1000 $5",
    "∑∫√∞≠≤≥",
    # added tokens embedded in text
    "<|im_start|>user\nhello<|im_end|>",
    "<|audio_start|><|audio_pad|><|audio_pad|><|audio_end|>",
    "language English<asr_text>Hello there.",
    "text<asr_text>more<asr_text>",
    " <|endoftext|> spaced ",
    "<|im_start|><|im_start|>",
    "<|im_start|",
    "<asr_text",
    "< asr_text >",
    "<think>reasoning</think>",
    "<non_speech>",
]


def language_cases() -> list[str]:
    return [name for name in SUPPORTED_LANGUAGES] + [" " + name for name in SUPPORTED_LANGUAGES]


def random_cases(count: int, seed: int = 1234) -> list[str]:
    rng = random.Random(seed)
    joiners = ["", " ", "  ", "\n", "\t", " \n", "\n\n", ", ", "。"]
    specials = ["<|im_start|>", "<|im_end|>", "<|audio_pad|>", "<asr_text>", "<|endoftext|>"]
    out = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(2, 5)):
            kind = rng.random()
            if kind < 0.15:
                parts.append(rng.choice(specials))
            elif kind < 0.3:
                parts.append(rng.choice(SUPPORTED_LANGUAGES))
            elif kind < 0.4:
                parts.append("".join(rng.choice("0123456789") for _ in range(rng.randint(1, 25))))
            else:
                piece = rng.choice(PIECES)
                if rng.random() < 0.3:
                    piece = unicodedata.normalize(rng.choice(["NFD", "NFKD", "NFC"]), piece)
                if rng.random() < 0.3:
                    start = rng.randint(0, len(piece))
                    piece = piece[start : start + rng.randint(1, 12)]
                parts.append(piece)
            parts.append(rng.choice(joiners))
        if rng.random() < 0.3:
            parts.insert(0, rng.choice([" ", "  ", "\n", "\t"]))
        out.append("".join(parts))
    return out


def build_cases() -> list[str]:
    fixed = (
        PIECES
        + list(LANGUAGE_SAMPLES.values())
        + [unicodedata.normalize("NFD", p) for p in PIECES[30:36]]
        + language_cases()
        + [""]
    )
    cases = list(dict.fromkeys(fixed + random_cases(160)))
    return cases


CASES = build_cases()


@pytest.fixture(scope="module")
def published(checkpoints) -> Path:
    """A checkpoint with the release's own tokenizer files (tokenizer_config.json as published)."""
    return checkpoints("tiny")


@pytest.fixture(scope="module")
def tok(published: Path) -> Tokenizer:
    return Tokenizer.from_dir(published)


@pytest.fixture(scope="module")
def hf(published: Path):
    from transformers import AutoTokenizer

    # As the official loader would, but without fix_mistral_regex (see test_official_regex_patch_decision).
    return AutoTokenizer.from_pretrained(str(published))


def test_case_count():
    assert len(CASES) >= 200
    assert len(set(CASES)) == len(CASES)


def test_reference_is_qwen2_fast(hf):
    assert type(hf).__name__ == "Qwen2TokenizerFast"


def test_backend_serialization_matches_transformers(tok, hf):
    ours = json.loads(tok.backend.to_str())
    ref = json.loads(hf.backend_tokenizer.to_str())
    assert ours == ref


@pytest.mark.parametrize("index", range(len(CASES)))
def test_encode_decode_match_transformers(tok, hf, index):
    text = CASES[index]
    ids = tok.encode(text)
    assert ids == hf.encode(text), repr(text)
    assert ids == hf(text, add_special_tokens=False)["input_ids"]
    for skip in (True, False):
        assert tok.decode(ids, skip_special_tokens=skip) == hf.decode(
            ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False
        )


def test_decode_random_ids_matches_transformers(tok, hf):
    # Random ids include lone UTF-8 continuation bytes and special tokens.
    rng = random.Random(7)
    special = sorted(tok.special_ids) + [tok.token_to_id("<asr_text>")]
    for _ in range(200):
        ids = [
            rng.choice(special) if rng.random() < 0.15 else rng.randrange(0, 151643)
            for _ in range(rng.randint(0, 12))
        ]
        for skip in (True, False):
            assert tok.decode(ids, skip_special_tokens=skip) == hf.decode(
                ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False
            ), ids


def test_nfd_input_encodes_like_nfc(tok):
    for text in ["café", "ångström", "Tiếng Việt", "한국어"]:
        nfd = unicodedata.normalize("NFD", text)
        assert nfd != text
        assert tok.encode(nfd) == tok.encode(text)


KNOWN_IDS = {
    "system": 8948,
    "user": 872,
    "assistant": 77091,
    "\n": 198,
    "language": 11528,
    " English": 6364,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<|endoftext|>": 151643,
    "<|audio_start|>": 151669,
    "<|audio_end|>": 151670,
    "<|audio_pad|>": 151676,
    "<asr_text>": 151704,
}


@pytest.mark.parametrize("text,expected", list(KNOWN_IDS.items()))
def test_known_ids(tok, text, expected):
    assert tok.encode(text) == [expected]
    assert tok.decode([expected], skip_special_tokens=False) == text


def test_token_lookup(tok):
    assert tok.token_to_id("<|audio_pad|>") == 151676
    assert tok.token_to_id("Ġ") == 220
    assert tok.id_to_token(151704) == "<asr_text>"
    assert tok.id_to_token(6364) == "ĠEnglish"
    with pytest.raises(KeyError, match="not in the vocabulary"):
        tok.token_to_id("<|no_such_token|>")
    with pytest.raises(KeyError, match="out of range"):
        tok.id_to_token(10**7)


def test_sizes_and_special_ids(tok, hf):
    assert tok.vocab_size == len(hf) == 151705
    assert len(tok) == tok.vocab_size
    assert tok.special_ids == frozenset(hf.all_special_ids) | frozenset(
        i for i, t in hf.added_tokens_decoder.items() if t.special
    )
    assert 151644 in tok.special_ids and 151676 in tok.special_ids
    assert 151704 not in tok.special_ids
    assert tok.added_tokens["<asr_text>"] == 151704


def test_decode_skips_special_but_keeps_asr_text(tok):
    ids = [151644, 77091, 198, 11528, 6364, 151704, 9707, 151645, 151643]
    assert tok.decode(ids, skip_special_tokens=True) == "assistant\nlanguage English<asr_text>Hello"
    assert (
        tok.decode(ids, skip_special_tokens=False)
        == "<|im_start|>assistant\nlanguage English<asr_text>Hello<|im_end|><|endoftext|>"
    )
    assert tok.decode([]) == ""


def test_decode_accepts_non_list_ids(tok):
    import numpy as np

    ids = tok.encode("Hello world")
    assert tok.decode(np.array(ids, dtype=np.int64)) == "Hello world"
    assert tok.decode(iter(ids)) == "Hello world"


@pytest.mark.parametrize("missing", ["vocab.json", "merges.txt", "tokenizer_config.json"])
def test_missing_file_error(tokenizer_dir, tmp_path, missing):
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        if name != missing:
            shutil.copy(tokenizer_dir / name, tmp_path / name)
    with pytest.raises(FileNotFoundError) as info:
        Tokenizer.from_dir(tmp_path)
    assert str(tmp_path) in str(info.value) and missing in str(info.value)


def test_missing_directory_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Tokenizer.from_dir(tmp_path / "nope")


def copy_tokenizer(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        shutil.copy(src / name, dst / name)
    return dst


def test_the_same_files_give_one_tokenizer_a_process_and_changed_files_a_new_one(published, tmp_path):
    first = Tokenizer.from_dir(copy_tokenizer(published, tmp_path / "a"))
    assert Tokenizer.from_dir(copy_tokenizer(published, tmp_path / "b")) is first  # by content, not path

    # Other added tokens over the same vocabulary: a tokenizer of their own.
    variant = copy_tokenizer(published, tmp_path / "variant")
    config = json.loads((variant / "tokenizer_config.json").read_text())
    config["additional_special_tokens"] = config["additional_special_tokens"] + ["<|extra_one|>"]
    (variant / "tokenizer_config.json").write_text(json.dumps(config))
    other = Tokenizer.from_dir(variant)
    assert other is not first and "<|extra_one|>" in other.added_tokens
    assert "<|extra_one|>" not in first.added_tokens and first.encode(" in") == other.encode(" in")

    # A file changed where it is: read again (here a merge less, so " in" is no longer one token).
    merges = (variant / "merges.txt").read_text(encoding="utf-8").splitlines()
    (variant / "merges.txt").write_text("\n".join(m for m in merges if m != "i n") + "\n", encoding="utf-8")
    changed = Tokenizer.from_dir(variant)
    assert changed is not other and len(changed.encode(" in")) > len(first.encode(" in")) == 1


def test_tokenizer_json_is_preferred(published, tmp_path, hf, tok):
    directory = copy_tokenizer(published, tmp_path / "tj")
    hf.backend_tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "vocab.json").write_text("{}")  # would break the slow path if it were used
    from_json = Tokenizer.from_dir(directory)
    assert from_json.special_ids == tok.special_ids
    for text in CASES[:80]:
        assert from_json.encode(text) == tok.encode(text)


def test_config_variants_match_transformers(published, tmp_path):
    """Special tokens outside added_tokens_decoder, and split_special_tokens, as transformers does."""
    from transformers import AutoTokenizer

    directory = copy_tokenizer(published, tmp_path / "variant")
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config["eos_token"] = "<|my_eos|>"
    config["additional_special_tokens"] = config["additional_special_tokens"] + ["<|extra_one|>"]
    config["split_special_tokens"] = True
    (directory / "tokenizer_config.json").write_text(json.dumps(config))

    ours = Tokenizer.from_dir(directory)
    ref = AutoTokenizer.from_pretrained(str(directory))
    assert json.loads(ours.backend.to_str()) == json.loads(ref.backend_tokenizer.to_str())
    assert ours.token_to_id("<|my_eos|>") == 151705
    assert ours.token_to_id("<|extra_one|>") == 151706
    text = "<|im_start|>hi <|my_eos|>"
    assert ours.encode(text) == ref.encode(text)
    assert len(ours.encode(text)) > 3  # split_special_tokens: markers are spelled out


def test_declared_id_mismatch_is_an_error(published, tmp_path):
    directory = copy_tokenizer(published, tmp_path / "bad")
    config = json.loads((directory / "tokenizer_config.json").read_text())
    decoder = config["added_tokens_decoder"]
    decoder["151800"] = decoder.pop("151704")
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="<asr_text>"):
        Tokenizer.from_dir(directory)


def test_split_patterns_are_the_reference_ones():
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    assert QWEN2_SPLIT_PATTERN == PRETOKENIZE_REGEX
    assert MISTRAL_FIX_SPLIT_PATTERN != QWEN2_SPLIT_PATTERN


@pytest.fixture(scope="module")
def tokenizer_json(hf, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("serialized") / "tokenizer.json"
    hf.backend_tokenizer.save(str(path))
    return path


def pre_tokenizer_state(backend) -> dict:
    return json.loads(backend.pre_tokenizer.__getstate__())


@pytest.mark.parametrize(
    "config",
    [
        None,
        {"model_type": "qwen3_asr", "transformers_version": "4.57.6"},
        {"model_type": "qwen3_asr", "transformers_version": "4.57.1"},
        {"model_type": "qwen3_asr"},
        {"model_type": "qwen3_asr", "transformers_version": "5.0.0"},
        {"model_type": "qwen3_asr", "transformers_version": "5.0.0.dev0"},
        {"transformers_version": "4.50.0"},
    ],
)
def test_official_regex_patch_decision(published, tmp_path, tokenizer_json, config):
    """Loading with fix_mistral_regex=True (as qwen-asr does) changes the split regex exactly when
    official_loader_patches_regex says so, and then our tokenizer matches the patched one."""
    from transformers import AutoTokenizer

    directory = copy_tokenizer(published, tmp_path / "model")
    shutil.copy(tokenizer_json, directory / "tokenizer.json")  # fast load
    if config is not None:
        (directory / "config.json").write_text(json.dumps(config))
    ref = AutoTokenizer.from_pretrained(str(directory), fix_mistral_regex=True)
    ref_pre = pre_tokenizer_state(ref.backend_tokenizer)
    assert ref_pre["pretokenizers"][0]["pattern"]["Regex"] in (QWEN2_SPLIT_PATTERN, MISTRAL_FIX_SPLIT_PATTERN)
    patched = ref_pre["pretokenizers"][0]["pattern"]["Regex"] == MISTRAL_FIX_SPLIT_PATTERN
    assert official_loader_patches_regex(directory) == patched

    ours = Tokenizer.from_dir(directory, fix_mistral_regex=official_loader_patches_regex(directory))
    assert pre_tokenizer_state(ours.backend) == ref_pre
    text = "iPhone JavaScript macOS McDonald's don't"
    assert ours.encode(text) == ref.encode(text)
    plain = Tokenizer.from_dir(directory)
    assert (plain.encode(text) != ours.encode(text)) == patched


@pytest.mark.parametrize("preset", ["tiny", "aligner-tiny"])
def test_hf_layout_tokenizer_is_the_releases(checkpoints, preset):
    """The -hf repositories ship only a transformers-v5 tokenizer.json: the same ids as the release's."""
    release = Tokenizer.from_dir(checkpoints(preset))
    hf_layout = Tokenizer.from_dir(checkpoints(preset, "hf"))
    assert hf_layout.vocab_size == release.vocab_size
    assert hf_layout.special_ids == release.special_ids
    assert hf_layout.added_tokens == release.added_tokens
    for text in CASES:
        ids = release.encode(text)
        assert hf_layout.encode(text) == ids, repr(text)
        assert hf_layout.decode(ids, skip_special_tokens=False) == release.decode(
            ids, skip_special_tokens=False
        )
    if preset == "aligner-tiny":
        assert release.token_to_id("<timestamp>") == hf_layout.token_to_id("<timestamp>") == 151705
        assert 151705 not in release.special_ids  # as its tokenizer_config declares it
        assert release.encode("word<timestamp><timestamp>")[-2:] == [151705, 151705]
