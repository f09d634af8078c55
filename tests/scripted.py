"""Stand-ins for the scheduler's stages, for tests: a decoding batch that records what the real one does,
one that 'says' given texts (random weights never finish a sentence themselves), parts whose stages a
test may swap under an Engine that outlives it, and mlxasr run in-process with given parts.

Each is handed to the code under test as `Parts` (mlx_qwen3asr.pipeline.parts), never patched in."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import fields, replace

from mlx_qwen3asr.model.generate import DecodeBatch, Generation
from mlx_qwen3asr.pipeline.parts import Parts
from mlx_qwen3asr.pipeline.transcribe import transcribe_stream


class Record:
    """What a stand-in batch saw; `batch` is its class, `parts()` the Parts that use it."""

    def __init__(self) -> None:
        self.adds: list[dict] = []  # per add(): prompts, budgets, the prefix, rows running before
        self.sizes: list[int] = []  # rows decoded together at each step
        self.kv_positions: list[int] = []  # after each join: rows x positions the cache holds room for
        self.batch: type | None = None

    def parts(self, **changes) -> Parts:
        return Parts(batch=self.batch, **changes)


def short_budgets(**changes) -> Parts:
    """Parts whose token budgets still differ with segment length (rows finish apart) but keep decoding
    short: random weights never end a segment themselves and decode every row to its budget."""
    return Parts(budget=lambda seconds: 8 + math.ceil(seconds), **changes)


def spy_batches(base: type = DecodeBatch) -> Record:
    """Let the real DecodeBatch (or `base`) run, recording every join and the rows of every step."""
    record = Record()

    class Spy(base):
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

    record.batch = Spy
    return record


def script_batches(say: Callable[[list[int]], list[int]], *, to_budget: bool = False) -> Record:
    """Decoding replaced: every row's tokens are say(prompt), all done in one step, ended by EOS; with
    to_budget, every row is instead reported as having run to its token budget (truncated)."""
    record = Record()

    class Scripted:
        def __init__(self, net, eos_ids, *, prefix=None, keep_logits=False, header=None):
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
            return [(k, Generation(tokens, truncated=to_budget, repetitive=False)) for k, tokens in done]

        def drop(self, keys):
            self.pending = [(k, t) for k, t in self.pending if k not in keys]

    record.batch = Scripted
    return record


class Swappable:
    """Stages for an Engine that outlives a test (a module's server): `parts` calls, at each stage, the
    attribute of the same name here (the real stage unless a test set it, e.g.
    monkeypatch.setattr(swappable, "budget", ...), undone after the test)."""

    def __init__(self) -> None:
        real = Parts()
        for f in fields(Parts):
            setattr(self, f.name, getattr(real, f.name))
        self.parts = Parts(**{f.name: self._forward(f.name) for f in fields(Parts)})

    def _forward(self, name: str) -> Callable:
        def stage(*args, **kwargs):
            return getattr(self, name)(*args, **kwargs)

        return stage


def through_cli(monkeypatch, parts: Parts | None = None, **changes) -> Parts:
    """mlxasr's main(), run in this process, transcribes with `parts` (default: those an earlier call in
    the same test gave, or the real ones), with `changes` made to them; returns the Parts it uses."""
    import mlx_qwen3asr.cli.run as cli_run

    if parts is None:
        current = cli_run.transcribe_stream
        parts = current.keywords["parts"] if isinstance(current, functools.partial) else Parts()
    parts = replace(parts, **changes)
    monkeypatch.setattr(cli_run, "transcribe_stream", functools.partial(transcribe_stream, parts=parts))
    return parts
