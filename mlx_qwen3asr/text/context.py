"""The context that biases recognition: checks of it against the tokenizer, and the bounded read of a
context file."""

from __future__ import annotations

import errno
import os
import select
import stat
import time
from typing import Protocol

__all__ = [
    "CONTEXT_READ_SECONDS",
    "MAX_CONTEXT_BYTES",
    "MAX_CONTEXT_TOKENS",
    "ContextControlTokenError",
    "ContextError",
    "ContextFileError",
    "ContextTooLongError",
    "TokenizerLike",
    "check_context",
    "read_context_file",
]


class TokenizerLike(Protocol):
    """What the prompt needs of a tokenizer: text to ids, and the id of a token."""

    def encode(self, text: str) -> list[int]: ...

    def token_to_id(self, token: str) -> int: ...


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


def _added_tokens(tokenizer: TokenizerLike) -> dict[int, str]:
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


def check_context(tokenizer: TokenizerLike, context: str) -> list[int]:
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
