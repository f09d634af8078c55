"""The ids of the official Qwen3-ASR prompt: system context, audio placeholders, the assistant's turn."""

from __future__ import annotations

from dataclasses import dataclass

from mlx_qwen3asr.text.context import TokenizerLike, check_context
from mlx_qwen3asr.text.languages import resolve_language

__all__ = [
    "PromptIds",
    "prompt_prefix_ids",
    "prompt_suffix_ids",
]


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
    def from_tokenizer(cls, tokenizer: TokenizerLike) -> PromptIds:
        return cls(
            im_start=tokenizer.token_to_id("<|im_start|>"),
            im_end=tokenizer.token_to_id("<|im_end|>"),
            endoftext=tokenizer.token_to_id("<|endoftext|>"),
            audio_start=tokenizer.token_to_id("<|audio_start|>"),
            audio_end=tokenizer.token_to_id("<|audio_end|>"),
            audio_pad=tokenizer.token_to_id("<|audio_pad|>"),
            asr_text=tokenizer.token_to_id("<asr_text>"),
        )

    @property
    def eos(self) -> frozenset[int]:
        """The tokens that end the model's answer."""
        return frozenset({self.endoftext, self.im_end})


def prompt_prefix_ids(tokenizer: TokenizerLike, context: str = "") -> list[int]:
    """The prompt up to and including ``<|audio_start|>``: the same for every segment of a run.

    A context with a control token or over MAX_CONTEXT_TOKENS raises ContextError (see check_context).
    """
    ids = PromptIds.from_tokenizer(tokenizer)
    system = check_context(tokenizer, context)
    out = [ids.im_start, *system, ids.im_end, *tokenizer.encode("\n")]
    return out + [ids.im_start, *tokenizer.encode("user\n"), ids.audio_start]


def prompt_suffix_ids(
    tokenizer: TokenizerLike, n_audio_tokens: int, language: str | None = None
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
