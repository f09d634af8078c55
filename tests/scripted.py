"""Stand-ins for the scheduler's decoding batch, for tests: one that records what the real one does, and
one that 'says' given texts (random weights never finish a sentence themselves)."""

from __future__ import annotations

from collections.abc import Callable

from mlx_qwen3asr.model.generate import DecodeBatch, Generation
from mlx_qwen3asr.pipeline import scheduler


class Record:
    def __init__(self) -> None:
        self.adds: list[dict] = []  # per add(): prompts, budgets, the prefix, rows running before
        self.sizes: list[int] = []  # rows decoded together at each step
        self.kv_positions: list[int] = []  # after each join: rows x positions the cache holds room for


def spy_batches(monkeypatch) -> Record:
    """Let the real DecodeBatch run, recording every join and the rows of every step."""
    record = Record()

    class Spy(DecodeBatch):
        def add(self, prompts, audio_features, max_new_tokens, keys):
            record.adds.append(
                {
                    "prompts": list(prompts),
                    "budgets": list(max_new_tokens),
                    "prefix": self.prefix,
                    "running": len(self),
                }
            )
            done = super().add(prompts, audio_features, max_new_tokens, keys)
            if len(self):
                record.kv_positions.append(len(self) * self.cache[0].keys.shape[2])
            return done

        def step(self):
            record.sizes.append(len(self))
            return super().step()

    monkeypatch.setattr(scheduler, "DecodeBatch", Spy)
    return record


def script_batches(monkeypatch, say: Callable[[list[int]], list[int]]) -> Record:
    """Replace decoding: every row's tokens are say(prompt), all done in one step, ended by EOS."""
    record = Record()

    class Scripted:
        def __init__(self, net, eos_ids, *, prefix=None, keep_logits=False):
            self.prefix, self.pending = prefix, []

        def __len__(self) -> int:
            return len(self.pending)

        @property
        def keys(self):
            return [k for k, _ in self.pending]

        def add(self, prompts, audio_features, max_new_tokens, keys):
            record.adds.append(
                {"prompts": list(prompts), "budgets": list(max_new_tokens), "prefix": self.prefix}
            )
            self.pending += [(k, say(p)) for k, p in zip(keys, prompts)]
            return []

        def step(self):
            record.sizes.append(len(self))
            done, self.pending = self.pending, []
            return [(k, Generation(tokens, truncated=False, repetitive=False)) for k, tokens in done]

        def drop(self, keys):
            self.pending = [(k, t) for k, t in self.pending if k not in keys]

    monkeypatch.setattr(scheduler, "DecodeBatch", Scripted)
    return record
