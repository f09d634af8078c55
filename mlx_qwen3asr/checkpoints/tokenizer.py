"""Qwen2/Qwen3 byte-level BPE tokenizer on top of the `tokenizers` library.

A checkpoint either ships a serialized ``tokenizer.json`` or only the "slow" files
(``vocab.json``, ``merges.txt``, ``tokenizer_config.json``). In the second case the fast
tokenizer is assembled here the same way transformers' ``Qwen2TokenizerFast`` assembles it,
so that token ids match the reference implementation exactly.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as _Backend
from tokenizers.models import BPE

__all__ = ["Tokenizer", "QWEN2_SPLIT_PATTERN", "MISTRAL_FIX_SPLIT_PATTERN", "official_loader_patches_regex"]

# Pre-tokenization split used by Qwen2/2.5/3 (must match the reference byte for byte).
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Split that transformers 4.57.x substitutes when a tokenizer is loaded with
# ``fix_mistral_regex=True`` (the official qwen-asr loader passes that flag).
MISTRAL_FIX_SPLIT_PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen2TokenizerFast constructor defaults, used when tokenizer_config.json omits the key.
_QWEN2_DEFAULT_SPECIALS = {
    "unk_token": "<|endoftext|>",
    "eos_token": "<|endoftext|>",
    "pad_token": "<|endoftext|>",
}
_SINGLE_SPECIAL_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)

_MISTRAL_MODEL_TYPES = ("mistral", "mistral3", "voxtral", "ministral", "pixtral")


def _read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _require(directory: Path, name: str) -> Path:
    path = directory / name
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer directory {directory} has no {name}")
    return path


def _token_content(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "content" in value:
        return str(value["content"])
    if isinstance(value, AddedToken):
        return value.content
    raise ValueError(f"unexpected special token entry in tokenizer_config.json: {value!r}")


def _as_special_added_token(value: Any) -> AddedToken:
    if isinstance(value, dict):
        return AddedToken(
            value["content"],
            single_word=bool(value.get("single_word", False)),
            lstrip=bool(value.get("lstrip", False)),
            rstrip=bool(value.get("rstrip", False)),
            normalized=bool(value.get("normalized", False)),
            special=True,
        )
    return AddedToken(str(value), lstrip=False, rstrip=False, normalized=False, special=True)


def _special_token_entries(config: dict[str, Any]) -> list[Any]:
    """Special-token values from tokenizer_config.json in the order transformers visits them."""
    entries: list[Any] = []
    for key in _SINGLE_SPECIAL_KEYS:
        value = config[key] if key in config else _QWEN2_DEFAULT_SPECIALS.get(key)
        if value is not None:
            entries.append(value)
    entries.extend(config.get("additional_special_tokens") or [])
    extra = config.get("extra_special_tokens") or {}
    entries.extend(extra.values() if isinstance(extra, dict) else extra)
    return entries


def _version_key(text: str) -> tuple[int, ...]:
    # Pre-releases ("5.0.0rc1", "4.58.0.dev0") sort just below the release, as in packaging.
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)(.*)", text)
    if match is None:
        return (0,)
    parts = [int(p) for p in match.group(1).split(".")]
    parts += [0] * (3 - len(parts))
    suffix = match.group(2).strip().lstrip(".-_").lower()
    pre = bool(suffix) and not suffix.startswith(("post", "+"))
    return (*parts[:3], 0 if pre else 1)


def official_loader_patches_regex(model_dir: str | Path) -> bool:
    """Whether transformers 4.57.x, loading ``model_dir`` with ``fix_mistral_regex=True`` (as the
    official qwen-asr loader does), swaps in ``MISTRAL_FIX_SPLIT_PATTERN``.

    That happens when the directory has a ``config.json`` whose ``transformers_version`` is absent
    or newer than 4.57.2 (and older than 5.0.0), or is older with a Mistral/absent ``model_type``.
    """
    config_path = Path(model_dir) / "config.json"
    if not config_path.is_file():
        return False
    config = _read_json(config_path)
    version = config.get("transformers_version")
    model_type = config.get("model_type")
    if version:
        key = _version_key(str(version))
        if key <= (4, 57, 2, 1):
            return model_type is None or model_type in _MISTRAL_MODEL_TYPES
        if key >= (5, 0, 0, 1):
            return False
    return True


# Tokenizers built in this process, by the content of the files they were built from (most recent
# last), and the BPE tables of vocab.json and merges.txt, which tokenizers with other added tokens share.
_BUILT: OrderedDict[str, Tokenizer] = OrderedDict()
_BPE_MODELS: OrderedDict[str, BPE] = OrderedDict()
_BUILT_LOCK = threading.Lock()
_BUILT_KEPT = 4
_TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json")


def _files_key(directory: Path, fix_mistral_regex: bool, names: tuple[str, ...] = _TOKENIZER_FILES) -> str:
    """A hash of these files where present in `directory` (names and bytes) and of the regex fix."""
    h = hashlib.sha256(b"fix" if fix_mistral_regex else b"plain")
    for name in names:
        path = directory / name
        if path.is_file():
            h.update(b"\0" + name.encode() + b"\0")
            h.update(path.read_bytes())
    return h.hexdigest()


def _remember(kept: OrderedDict, key: str, value) -> None:
    """Keep value under key, the least recently used entries beyond _BUILT_KEPT dropped."""
    with _BUILT_LOCK:
        kept[key] = value
        kept.move_to_end(key)
        while len(kept) > _BUILT_KEPT:
            kept.popitem(last=False)


def _build_backend(directory: Path, config: dict[str, Any]) -> _Backend:
    vocab_path = _require(directory, "vocab.json")
    merges_path = _require(directory, "merges.txt")
    key = _files_key(directory, False, ("vocab.json", "merges.txt"))
    with _BUILT_LOCK:
        model = _BPE_MODELS.get(key)
    if model is None:
        model = _bpe_model(vocab_path, merges_path)
        _remember(_BPE_MODELS, key, model)
    # The model's tables are only read: tokenizers with other added tokens share them.
    backend = _Backend(model)
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated", invert=False),
            # The slow Qwen2Tokenizer never sets add_prefix_space, so the converter always uses False.
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    return backend


def _bpe_model(vocab_path: Path, merges_path: Path) -> BPE:
    vocab = _read_json(vocab_path)
    merges: list[tuple[str, str]] = []
    with open(merges_path, encoding="utf-8") as f:
        for index, line in enumerate(f):
            line = line.strip()
            if not line or (index == 0 and line.startswith("#version:")):
                continue
            pair = line.split()
            if len(pair) != 2:
                raise ValueError(f"{merges_path}:{index + 1}: expected two symbols, got {line!r}")
            merges.append((pair[0], pair[1]))

    return BPE(
        vocab=vocab,
        merges=merges,
        dropout=None,
        unk_token=None,
        continuing_subword_prefix="",
        end_of_word_suffix="",
        fuse_unk=False,
        byte_fallback=False,
    )


def _register_added_tokens(backend: _Backend, config: dict[str, Any]) -> None:
    """Add the tokens of ``added_tokens_decoder`` plus any special token strings not yet known,
    in transformers' order, and check that the declared ids came out."""
    special_entries = _special_token_entries(config)
    special_contents = {_token_content(v) for v in special_entries}

    existing = {tok.content for tok in backend.get_added_tokens_decoder().values()}
    declared: dict[int, AddedToken] = {}
    for key, entry in (config.get("added_tokens_decoder") or {}).items():
        content = entry["content"]
        flagged_special = bool(entry.get("special", False))
        declared[int(key)] = AddedToken(
            content,
            single_word=bool(entry.get("single_word", False)),
            lstrip=bool(entry.get("lstrip", False)),
            rstrip=bool(entry.get("rstrip", False)),
            normalized=bool(entry.get("normalized", not flagged_special)),
            special=flagged_special or content in special_contents,
        )

    to_add = [tok for _, tok in sorted(declared.items()) if tok.content not in existing]
    seen = existing | {tok.content for tok in to_add}
    for entry in special_entries:
        content = _token_content(entry)
        if content is not None and content not in seen:
            to_add.append(_as_special_added_token(entry))
            seen.add(content)
    if to_add:
        backend.add_tokens(to_add)

    for token_id, tok in declared.items():
        got = backend.token_to_id(tok.content)
        if got != token_id:
            raise ValueError(
                f"added token {tok.content!r} is declared with id {token_id} in tokenizer_config.json "
                f"but the vocabulary gives it id {got}"
            )


class Tokenizer:
    """Encode/decode text with the exact ids of transformers' ``Qwen2TokenizerFast``."""

    def __init__(self, backend: _Backend) -> None:
        self._backend = backend
        added = backend.get_added_tokens_decoder()
        self.special_ids: frozenset[int] = frozenset(i for i, tok in added.items() if tok.special)
        self.added_tokens: dict[str, int] = {tok.content: i for i, tok in added.items()}

    @classmethod
    def from_dir(cls, path: str | Path, *, fix_mistral_regex: bool = False) -> Tokenizer:
        """Load from a checkpoint directory.

        ``fix_mistral_regex=True`` reproduces what transformers 4.57.x does to the split regex when
        the official loader's flag takes effect (see ``official_loader_patches_regex``).

        Building the BPE tables takes most of a second, so a tokenizer is built once per process for
        the same files (by content, wherever they are): a speech model and its aligner share the Qwen3
        vocabulary, and a server or a test loads the same checkpoint again. A Tokenizer is never
        changed after it is built, so one object serves them all.
        """
        directory = Path(path)
        if not directory.is_dir():
            raise FileNotFoundError(f"tokenizer directory {directory} does not exist")
        key = _files_key(directory, fix_mistral_regex)
        with _BUILT_LOCK:
            built = _BUILT.get(key)
            if built is not None:
                _BUILT.move_to_end(key)
                return built
        built = cls._build(directory, fix_mistral_regex)
        _remember(_BUILT, key, built)
        return built

    @classmethod
    def _build(cls, directory: Path, fix_mistral_regex: bool) -> Tokenizer:
        config_path = directory / "tokenizer_config.json"
        tokenizer_json = directory / "tokenizer.json"
        if tokenizer_json.is_file():
            config = _read_json(config_path) if config_path.is_file() else {}
            backend = _Backend.from_file(str(tokenizer_json))
        else:
            _require(directory, "vocab.json")
            _require(directory, "merges.txt")
            config = _read_json(_require(directory, "tokenizer_config.json"))
            backend = _build_backend(directory, config)
        _register_added_tokens(backend, config)
        backend.encode_special_tokens = bool(config.get("split_special_tokens", False))
        if fix_mistral_regex:
            pre = backend.pre_tokenizer
            if not isinstance(pre, pre_tokenizers.Sequence):
                raise ValueError("fix_mistral_regex needs a Sequence pre-tokenizer")
            pre[0] = pre_tokenizers.Split(Regex(MISTRAL_FIX_SPLIT_PATTERN), behavior="isolated")
        return cls(backend)

    @property
    def backend(self) -> _Backend:
        """The underlying ``tokenizers.Tokenizer``."""
        return self._backend

    @property
    def vocab_size(self) -> int:
        """Number of token ids including added tokens (``len(hf_tokenizer)``)."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    def __len__(self) -> int:
        return self.vocab_size

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; added tokens written in the text map to their single id."""
        return self._backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids`` (no clean-up of tokenization spaces)."""
        return self._backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int:
        token_id = self._backend.token_to_id(token)
        if token_id is None:
            raise KeyError(f"token {token!r} is not in the vocabulary")
        return token_id

    def id_to_token(self, token_id: int) -> str:
        token = self._backend.id_to_token(int(token_id))
        if token is None:
            raise KeyError(f"token id {token_id} is out of range (vocabulary size {self.vocab_size})")
        return token
