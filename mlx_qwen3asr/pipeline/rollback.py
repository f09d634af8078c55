"""The text a live step continues from: the official rollback of the last output, the prompt ids after
the shared start, the draft the last output offers, and the text a commit carries into the next window.

The official streaming prompt is *text* (the rendered template plus the prefix) that vLLM tokenizes as
a whole. Here the same ids are built directly: the template's control tokens and audio placeholders
as ``prompt_prefix_ids`` / ``prompt_suffix_ids`` give them, and everything after the assistant's
``<|im_start|>`` (``assistant\\n``, the forced ``language X<asr_text>``, the prefix) encoded as one
text, as the official tokenizer splits the rendered prompt on its added tokens.
"""

from __future__ import annotations

import os

from mlx_qwen3asr.text.prompt import prompt_suffix_ids

# Longest draft a decode checks before decoding (the last output's tokens after the prefix).
MAX_DRAFT_TOKENS = 32

_BROKEN = "\ufffd"
_TRAILING = " \t\n.,!?;:\u3002\uff0c\uff01\uff1f\u3001\uff1b\uff1a"


def rollback_prefix(tokenizer, raw: str, unfixed_tokens: int) -> str:
    """The prefix of a chunk step: `raw` re-encoded, less its last `unfixed_tokens` tokens, decoded;
    one more token is dropped while the text holds U+FFFD (a character cut in the middle)."""
    ids = tokenizer.encode(raw)
    k = int(unfixed_tokens)
    while True:
        end = max(0, len(ids) - k)
        prefix = tokenizer.decode(ids[:end], skip_special_tokens=False) if end > 0 else ""
        if _BROKEN not in prefix:
            return prefix
        if end == 0:
            return ""
        k += 1


def tail_rollback_prefix(tokenizer, raw: str, unfixed_tokens: int) -> str:
    """The prefix of the final (tail) step, as the official ``finish_streaming_transcribe`` builds it:
    at least the first token is kept (``max(1, len - unfixed_tokens)``) and a broken character is not
    looked for."""
    ids = tokenizer.encode(raw)
    end = max(1, len(ids) - int(unfixed_tokens))
    return tokenizer.decode(ids[:end], skip_special_tokens=False)


def window_suffix_ids(tokenizer, n_audio_tokens: int, language: str | None, prefix: str) -> list[int]:
    """The prompt ids after the shared prompt start (system prompt and context) of a window decode with
    `n_audio_tokens` audio placeholders, a forced `language` (canonical name, or None) and a text
    `prefix`: what the official tokenizer makes of that part of the rendered prompt + prefix."""
    suffix = prompt_suffix_ids(tokenizer, n_audio_tokens, language)
    if not prefix:
        return suffix
    im_start = tokenizer.token_to_id("<|im_start|>")
    at = len(suffix) - 1 - suffix[::-1].index(im_start)
    assistant = "assistant\n" + (f"language {language}<asr_text>" if language else "")
    return suffix[: at + 1] + tokenizer.encode(assistant + prefix)


def draft_ids(tokenizer, raw: str, prefix: str) -> list[int]:
    """What the decode after `prefix` will likely write: the tokens of the last output `raw` after the
    prefix (the ones the rollback took back), at most MAX_DRAFT_TOKENS; [] when `raw` does not start
    with the prefix's tokens."""
    if not raw:
        return []
    ids = tokenizer.encode(raw)
    head = tokenizer.encode(prefix) if prefix else []
    if ids[: len(head)] != head:
        return []
    return ids[len(head) : len(head) + MAX_DRAFT_TOKENS]


def header(raw: str) -> str:
    """The ``language X<asr_text>`` header that starts a raw output, or ''."""
    at = raw.find("<asr_text>")
    return raw[: at + len("<asr_text>")] if at >= 0 else ""


def carried_text(window_raw: str, prefix: str, head_written: str) -> str:
    """What the window wrote for the audio after a commit's cut: its raw output after `prefix` less
    the text the head's decode wrote after the same prefix, when the window's text starts with the
    head's (punctuation and spaces at the head's end aside, as an utterance that stops there ends with
    a full stop). '' when they disagree or nothing is left."""
    if not window_raw.startswith(prefix):
        return ""
    rest = window_raw[len(prefix) :]
    shared = len(os.path.commonprefix([rest, head_written]))
    if head_written[shared:].strip(_TRAILING):
        return ""
    return rest[shared:].lstrip(_TRAILING)


__all__ = [
    "MAX_DRAFT_TOKENS",
    "carried_text",
    "draft_ids",
    "header",
    "rollback_prefix",
    "tail_rollback_prefix",
    "window_suffix_ids",
]
