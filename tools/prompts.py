"""The whole prompt of one segment at once, for the parity checks and the benchmarks: the package builds
it in two parts (text/prompt.py: the start shared by every segment, then the rest)."""

from __future__ import annotations

from mlx_qwen3asr.text.context import TokenizerLike
from mlx_qwen3asr.text.prompt import prompt_prefix_ids, prompt_suffix_ids


def build_prompt_ids(
    tokenizer: TokenizerLike, n_audio_tokens: int, context: str = "", language: str | None = None
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
