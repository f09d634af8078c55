"""Prompt starts shared by the rows of a batch: the system prompt and context, prefilled once per context.

Every segment's prompt begins with the same tokens for a given context. Their keys and values are
computed once, when a batch of that context first starts, and kept for the few contexts used last, so
that a server alternating between a handful of contexts does not prefill them again and again.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from mlx_qwen3asr.checkpoints.loading import ASRModel
from mlx_qwen3asr.model.generate import Prefix, prefill_prefix
from mlx_qwen3asr.text.prompt import prompt_prefix_ids

# Prompt starts (contexts) whose keys and values are kept for later batches.
PREFIXES_KEPT = 4


class PromptStarts:
    """The prompt start of each context: its ids (checked as soon as a context is seen), and its keys
    and values (computed by `prefill` when a batch first needs them, kept for the last `kept` contexts)."""

    def __init__(
        self,
        model: ASRModel,
        prefill: Callable[[Any, Sequence[int]], Prefix] = prefill_prefix,
        kept: int = PREFIXES_KEPT,
    ) -> None:
        self.model, self.prefill, self.kept = model, prefill, kept
        self._starts: OrderedDict[str, tuple[list[int], Prefix | None]] = OrderedDict()

    def ids(self, context: str) -> list[int]:
        """The token ids of the prompt start; raises for a context the prompt cannot take (too long,
        control tokens)."""
        if context not in self._starts:
            self._starts[context] = (prompt_prefix_ids(self.model.tokenizer, context), None)
        return self._starts[context][0]

    def prefix(self, context: str) -> Prefix:
        """The prompt start with its keys and values, prefilled now unless it was kept."""
        ids = self.ids(context)
        prefix = self._starts[context][1]
        if prefix is None:
            prefix = self.prefill(self.model.net, ids)
        self._starts[context] = (ids, prefix)
        self._starts.move_to_end(context)
        while len(self._starts) > self.kept:
            self._starts.popitem(last=False)
        return prefix


__all__ = ["PREFIXES_KEPT", "PromptStarts"]
