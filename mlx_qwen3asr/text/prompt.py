"""Prompt construction and output parsing for Qwen3-ASR (pure Python), and the bounded read of a context file."""

from __future__ import annotations

import errno
import os
import select
import stat
import time
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "SUPPORTED_LANGUAGES",
    "LANGUAGE_CODES",
    "CJK_NO_SPACE_LANGUAGES",
    "PromptIds",
    "resolve_language",
    "build_prompt_ids",
    "prompt_prefix_ids",
    "prompt_suffix_ids",
    "ContextError",
    "ContextTooLongError",
    "ContextControlTokenError",
    "ContextFileError",
    "MAX_CONTEXT_TOKENS",
    "MAX_CONTEXT_BYTES",
    "check_context",
    "read_context_file",
    "fix_repetitions",
    "fix_repetitions_flag",
    "parse_output",
    "join_texts",
]

SUPPORTED_LANGUAGES: tuple[str, ...] = (
    "Chinese",
    "English",
    "Cantonese",
    "Arabic",
    "German",
    "French",
    "Spanish",
    "Portuguese",
    "Indonesian",
    "Italian",
    "Korean",
    "Russian",
    "Thai",
    "Vietnamese",
    "Japanese",
    "Turkish",
    "Hindi",
    "Malay",
    "Dutch",
    "Swedish",
    "Danish",
    "Finnish",
    "Polish",
    "Czech",
    "Filipino",
    "Persian",
    "Greek",
    "Romanian",
    "Hungarian",
    "Macedonian",
)

# Codes per language; the first one is shown in error messages.
_CODES: dict[str, tuple[str, ...]] = {
    "Chinese": ("zh", "zho", "chi", "cmn", "mandarin"),
    "English": ("en", "eng"),
    "Cantonese": ("yue", "zh-yue", "zh-hk", "zh-mo"),
    "Arabic": ("ar", "ara"),
    "German": ("de", "deu", "ger"),
    "French": ("fr", "fra", "fre"),
    "Spanish": ("es", "spa"),
    "Portuguese": ("pt", "por"),
    "Indonesian": ("id", "ind"),
    "Italian": ("it", "ita"),
    "Korean": ("ko", "kor"),
    "Russian": ("ru", "rus"),
    "Thai": ("th", "tha"),
    "Vietnamese": ("vi", "vie"),
    "Japanese": ("ja", "jpn"),
    "Turkish": ("tr", "tur"),
    "Hindi": ("hi", "hin"),
    "Malay": ("ms", "msa", "may", "zsm"),
    "Dutch": ("nl", "nld", "dut"),
    "Swedish": ("sv", "swe"),
    "Danish": ("da", "dan"),
    "Finnish": ("fi", "fin"),
    "Polish": ("pl", "pol"),
    "Czech": ("cs", "ces", "cze"),
    "Filipino": ("fil", "tl", "tgl", "tagalog"),
    "Persian": ("fa", "fas", "per", "farsi"),
    "Greek": ("el", "ell", "gre"),
    "Romanian": ("ro", "ron", "rum"),
    "Hungarian": ("hu", "hun"),
    "Macedonian": ("mk", "mkd", "mac"),
}

LANGUAGE_CODES: dict[str, str] = {code: name for name, codes in _CODES.items() for code in codes}
_BY_LOWER_NAME: dict[str, str] = {name.lower(): name for name in SUPPORTED_LANGUAGES}

CJK_NO_SPACE_LANGUAGES: frozenset[str] = frozenset({"Chinese", "Cantonese", "Japanese", "Thai"})


def _unsupported(language: str) -> ValueError:
    listing = ", ".join(f"{name} ({_CODES[name][0]})" for name in SUPPORTED_LANGUAGES)
    return ValueError(f"unsupported language {language!r}: use one of {listing}")


def resolve_language(language: str | None) -> str | None:
    """Canonical language name for a name or ISO 639 code (``"en"``, ``"pt_BR"``, ``"english"``);
    ``None`` for no language."""
    if language is None:
        return None
    text = str(language).strip()
    if not text:
        return None
    key = text.lower().replace("_", "-")
    if key in _BY_LOWER_NAME:
        return _BY_LOWER_NAME[key]
    if key in LANGUAGE_CODES:
        return LANGUAGE_CODES[key]
    # Region/script subtags ("zh-CN", "pt-BR", "zh-Hant-HK"): try the first and last subtag pairs,
    # then the base code.
    parts = key.split("-")
    if len(parts) > 1 and all(p.isalnum() for p in parts):
        for candidate in (f"{parts[0]}-{parts[-1]}", parts[0]):
            if candidate in LANGUAGE_CODES:
                return LANGUAGE_CODES[candidate]
    raise _unsupported(text)


class _TokenizerLike(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def token_to_id(self, token: str) -> int: ...


@dataclass(frozen=True)
class PromptIds:
    """Ids of the template's control tokens, read from the checkpoint's own tokenizer."""

    im_start: int
    im_end: int
    endoftext: int
    audio_start: int
    audio_end: int
    audio_pad: int
    asr_text: int

    @classmethod
    def from_tokenizer(cls, tokenizer: _TokenizerLike) -> PromptIds:
        return cls(
            im_start=tokenizer.token_to_id("<|im_start|>"),
            im_end=tokenizer.token_to_id("<|im_end|>"),
            endoftext=tokenizer.token_to_id("<|endoftext|>"),
            audio_start=tokenizer.token_to_id("<|audio_start|>"),
            audio_end=tokenizer.token_to_id("<|audio_end|>"),
            audio_pad=tokenizer.token_to_id("<|audio_pad|>"),
            asr_text=tokenizer.token_to_id("<asr_text>"),
        )


# Longest context accepted, in tokens. It is prefilled once per run and held for every batch: its keys
# and values take about 0.23 MB a token in float32 (0.6B and 1.7B alike: 28 layers x 8 heads x 128),
# 1.9 GB at the limit, and its prefill takes about 7 ms a token on a 2-core CPU (a minute at the limit).
MAX_CONTEXT_TOKENS = 8192


# The longest token of the Qwen vocabulary is 128 bytes (a run of spaces), so a text of more than
# MAX_CONTEXT_TOKENS x 128 bytes (1 MiB) has more tokens than the limit: a context file is read no further.
MAX_TOKEN_BYTES = 128
MAX_CONTEXT_BYTES = MAX_CONTEXT_TOKENS * MAX_TOKEN_BYTES
# A context file that is a pipe or a device must have ended by then.
CONTEXT_READ_SECONDS = 30.0
_READ_CHUNK = 1 << 16


class ContextError(ValueError):
    """A context the prompt cannot take (the message is one line, without the option's name)."""


class ContextTooLongError(ContextError):
    """The context has more tokens than MAX_CONTEXT_TOKENS."""


class ContextControlTokenError(ContextError):
    """The context holds a control token (``<|im_end|>``, ``<|audio_pad|>``, ...): written into the system
    prompt it would end the turn, or add audio placeholders, instead of reading as text."""


class ContextFileError(ContextError):
    """A context file that cannot be read, is not UTF-8 text, or is longer than any context can be."""


def _added_tokens(tokenizer: _TokenizerLike) -> dict[int, str]:
    """Id -> text of every token the tokenizer matches as a whole in text (its added tokens)."""
    added = getattr(tokenizer, "added_tokens", None)
    if isinstance(added, dict):
        return {i: t for t, i in added.items()}
    names = (
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<|audio_start|>",
        "<|audio_end|>",
        "<|audio_pad|>",
    )
    return {tokenizer.token_to_id(t): t for t in (*names, "<asr_text>")}


def check_context(tokenizer: _TokenizerLike, context: str) -> list[int]:
    """The context's ids in the system prompt (after ``system\\n``), or ContextError: a control token in
    it, or more than MAX_CONTEXT_TOKENS tokens. The CLI, the Python API and the server all go through here.
    """
    context = context or ""
    system = tokenizer.encode("system\n" + context)
    added = _added_tokens(tokenizer)
    control = list(dict.fromkeys(added[i] for i in system if i in added))
    if control:
        which = "the control token" if len(control) == 1 else "the control tokens"
        raise ContextControlTokenError(
            f"the context contains {which} {', '.join(control)}, which would change the prompt's "
            "structure; a context is plain text (names, terms, topic)"
        )
    context_tokens = len(system) - len(tokenizer.encode("system\n"))
    if context_tokens > MAX_CONTEXT_TOKENS:
        raise ContextTooLongError(
            f"the context has {context_tokens} tokens ({len(context)} characters); the limit is "
            f"{MAX_CONTEXT_TOKENS} tokens: keep names, terms and topic, not whole documents"
        )
    return system


def prompt_prefix_ids(tokenizer: _TokenizerLike, context: str = "") -> list[int]:
    """The prompt up to and including ``<|audio_start|>``: the same for every segment of a run.

    A context with a control token or over MAX_CONTEXT_TOKENS raises ContextError (see check_context).
    """
    ids = PromptIds.from_tokenizer(tokenizer)
    system = check_context(tokenizer, context)
    out = [ids.im_start, *system, ids.im_end, *tokenizer.encode("\n")]
    return out + [ids.im_start, *tokenizer.encode("user\n"), ids.audio_start]


def prompt_suffix_ids(
    tokenizer: _TokenizerLike, n_audio_tokens: int, language: str | None = None
) -> list[int]:
    """The prompt after ``<|audio_start|>``: the audio placeholders and the assistant's turn."""
    if n_audio_tokens < 0:
        raise ValueError(f"n_audio_tokens must be >= 0, got {n_audio_tokens}")
    ids = PromptIds.from_tokenizer(tokenizer)
    name = resolve_language(language)
    assistant = "assistant\n" + (f"language {name}" if name else "")
    out = [ids.audio_pad] * n_audio_tokens
    out += [ids.audio_end, ids.im_end, *tokenizer.encode("\n")]
    out += [ids.im_start, *tokenizer.encode(assistant)]
    if name:
        out.append(ids.asr_text)
    return out


def build_prompt_ids(
    tokenizer: _TokenizerLike, n_audio_tokens: int, context: str = "", language: str | None = None
) -> list[int]:
    """Ids of the official prompt

    ``<|im_start|>system\\n{context}<|im_end|>\\n<|im_start|>user\\n<|audio_start|>``
    ``<|audio_pad|>*n<|audio_end|><|im_end|>\\n<|im_start|>assistant\\n[language {L}<asr_text>]``.

    Text between two control tokens is encoded as one piece, as the reference tokenizer does when
    it splits the rendered prompt on added tokens. A context over MAX_CONTEXT_TOKENS raises
    ContextTooLongError.
    """
    if n_audio_tokens < 0:
        raise ValueError(f"n_audio_tokens must be >= 0, got {n_audio_tokens}")
    suffix = prompt_suffix_ids(tokenizer, n_audio_tokens, language)
    return prompt_prefix_ids(tokenizer, context) + suffix


def _read_at_most(path: str, size: int, timeout: float) -> bytes:
    """Up to `size` bytes of `path`. A regular file is read at once; a pipe, socket or device (which may
    never end, or never be opened by a writer) is read without blocking, until `timeout` seconds have
    passed."""
    # O_NONBLOCK: opening a FIFO that no writer has opened yet returns at once instead of waiting.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
        regular = stat.S_ISREG(mode)
        os.set_blocking(fd, regular)
        deadline = time.monotonic() + timeout
        chunks: list[bytes] = []
        got = 0
        while got < size:
            if not regular:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ContextFileError(
                        f"not ended after {timeout:g} s (a pipe or device that is never closed?); give a file"
                    )
                if not select.select([fd], [], [], left)[0]:
                    continue
            try:
                chunk = os.read(fd, min(size - got, _READ_CHUNK))
            except BlockingIOError:  # woken without data: wait again
                continue
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_context_file(path: str | os.PathLike, timeout: float | None = None) -> str:
    """The text of a context file (UTF-8, surrounding whitespace stripped), read no further than a
    context can reach: more than MAX_CONTEXT_BYTES is refused unread. A pipe or device must end within
    `timeout` seconds (CONTEXT_READ_SECONDS by default). Raises ContextFileError with a one-line reason
    (without the path); the context's tokens are checked later, against the model's tokenizer.
    """
    timeout = CONTEXT_READ_SECONDS if timeout is None else timeout
    try:
        data = _read_at_most(os.fspath(path), MAX_CONTEXT_BYTES + 1, timeout)
    except OSError as e:
        raise ContextFileError(e.strerror or str(e)) from None
    if len(data) > MAX_CONTEXT_BYTES:
        raise ContextFileError(
            f"more than {MAX_CONTEXT_BYTES} bytes, past what the context limit of {MAX_CONTEXT_TOKENS} "
            "tokens can hold: keep names, terms and topic, not whole documents"
        )
    try:
        return data.decode("utf-8").strip()
    except UnicodeDecodeError as e:
        raise ContextFileError(f"not UTF-8 text ({e.reason} at byte {e.start})") from None


def _collapse_char_runs(text: str, threshold: int) -> str:
    pieces: list[str] = []
    i, n = 0, len(text)
    while i < n:
        j = i + 1
        while j < n and text[j] == text[i]:
            j += 1
        pieces.append(text[i] if j - i > threshold else text[i:j])
        i = j
    return "".join(pieces)


def _collapse_patterns(text: str, threshold: int, max_period: int = 20) -> str:
    # A run may only start where 2 * threshold characters remain (the reference scans that far).
    n = len(text)
    last_start = n - 2 * threshold
    pieces: list[str] = []
    i = 0
    while i <= last_start:
        end = -1
        # Longest period whose threshold copies still fit in the text.
        longest = min(max_period, (n - i) // threshold)
        for period in range(1, longest + 1):
            pattern = text[i : i + period]
            if all(text[i + r * period : i + (r + 1) * period] == pattern for r in range(1, threshold)):
                end = i + threshold * period
                while end + period <= n and text[end : end + period] == pattern:
                    end += period
                break
        if end < 0:
            pieces.append(text[i])
            i += 1
        else:
            pieces.append(text[i : i + period])
            i = end
    pieces.append(text[i:])
    return "".join(pieces)


def fix_repetitions_flag(text: str, threshold: int = 20) -> tuple[str, bool]:
    """Collapse runaway repetitions; return the text and whether anything was collapsed.

    A character repeated more than ``threshold`` times in a row becomes one character; then a
    pattern of 1..20 characters repeated at least ``threshold`` times becomes one copy.
    """
    if threshold < 1:
        raise ValueError(f"threshold must be >= 1, got {threshold}")
    fixed = _collapse_patterns(_collapse_char_runs(text, threshold), threshold)
    # Collapsing only ever removes characters, so a change shows as a shorter string.
    return fixed, len(fixed) != len(text)


def fix_repetitions(text: str, threshold: int = 20) -> str:
    return fix_repetitions_flag(text, threshold)[0]


_ASR_TEXT_TAG = "<asr_text>"
_LANGUAGE_PREFIX = "language "


def _normalize_language_case(name: str) -> str:
    return name[:1].upper() + name[1:].lower()


def parse_output(raw: str | None, forced_language: str | None = None) -> tuple[str, str]:
    """Split decoded model output into ``(language, text)``.

    ``"language Chinese<asr_text>..."`` -> ``("Chinese", "...")``; ``"language None<asr_text>"``
    -> ``("", "")``; without the tag the whole output is text. A forced language is returned as
    is, with the whole output as text.
    """
    if raw is None:
        return "", ""
    s = str(raw).strip()
    if not s:
        return "", ""
    s = fix_repetitions(s)
    if forced_language:
        return forced_language, s
    if _ASR_TEXT_TAG not in s:
        return "", s.strip()
    meta, text = s.split(_ASR_TEXT_TAG, 1)
    text = text.strip()
    if "language none" in meta.lower():
        return "", text
    language = ""
    for line in meta.splitlines():
        line = line.strip()
        if line.lower().startswith(_LANGUAGE_PREFIX):
            value = line[len(_LANGUAGE_PREFIX) :].strip()
            if value:
                language = _normalize_language_case(value)
            break
    return language, text


def _is_unspaced_script(ch: str) -> bool:
    """Han, kana, Thai and CJK punctuation: scripts written without spaces between words."""
    cp = ord(ch)
    return (
        0x0E00 <= cp <= 0x0E7F  # Thai
        or 0x2E80 <= cp <= 0x2FDF  # CJK radicals, Kangxi radicals
        or 0x3000 <= cp <= 0x30FF  # CJK symbols and punctuation, hiragana, katakana
        or 0x3100 <= cp <= 0x312F  # bopomofo
        or 0x31A0 <= cp <= 0x31FF  # bopomofo extended, CJK strokes, katakana extensions
        or 0x3200 <= cp <= 0x9FFF  # enclosed CJK, compatibility, ext A, unified ideographs
        or 0xF900 <= cp <= 0xFAFF  # compatibility ideographs
        or 0xFE30 <= cp <= 0xFE4F  # CJK compatibility forms
        or 0xFF00 <= cp <= 0xFF9F  # fullwidth forms, halfwidth katakana
        or 0xFFE0 <= cp <= 0xFFEF  # fullwidth signs
        or 0x1B000 <= cp <= 0x1B16F  # kana supplement/extended
        or 0x20000 <= cp <= 0x323AF  # ideograph extensions B..H
    )


def join_texts(texts: list[str], language: str | None = "") -> str:
    """Join per-segment transcripts: no separator for Chinese, Cantonese, Japanese and Thai, a
    space otherwise; for an unknown language decide at each boundary from the characters there."""
    pieces = [t.strip() for t in texts if t and t.strip()]
    try:
        name = resolve_language(language)
    except ValueError:
        name = None
    if name is not None:
        return ("" if name in CJK_NO_SPACE_LANGUAGES else " ").join(pieces)
    if not pieces:
        return ""
    out = [pieces[0]]
    for left, right in zip(pieces, pieces[1:], strict=False):
        if not (_is_unspaced_script(left[-1]) or _is_unspaced_script(right[0])):
            out.append(" ")
        out.append(right)
    return "".join(out)
