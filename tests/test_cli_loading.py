"""One order for what the commands load (mlx_qwen3asr.cli.loading): the diarizer, the model, the aligner."""

from __future__ import annotations

from argparse import Namespace

import pytest

import mlx_qwen3asr.cli.loading as loading
import mlx_qwen3asr.cli.models as models
from mlx_qwen3asr.cli.models import Aligner


class Say:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, line: str) -> None:
        self.lines.append(f"info: {line}")

    def warning(self, line: str) -> None:
        self.lines.append(f"warning: {line}")

    def error(self, line: str) -> None:
        self.lines.append(f"error: {line}")


ARGS = Namespace(diarizer=None, model="m", aligner=None, dtype=None)


@pytest.fixture
def loads(monkeypatch):
    order: list[str] = []
    fail: set[str] = set()

    def diarizer(diarization, flag, say, isolated=False):
        order.append(f"diarizer{' isolated' if isolated else ''}")
        return None if "diarizer" in fail else "D"

    def model(source, dtype, say):
        order.append("model")
        return None if "model" in fail else "M"

    def aligner(flag, dtype, say, *, instead="", required=False):
        order.append(f"aligner{' required' if required else ''} {instead}".strip())
        return Aligner("a", stop=True) if "aligner" in fail else Aligner("a", "A")

    monkeypatch.setattr(loading, "load_diarizer", diarizer)
    monkeypatch.setattr(loading, "load_model", model)
    monkeypatch.setattr(loading, "load_aligner", aligner)
    return order, fail


def test_the_order_and_what_each_command_asks_for(loads):
    order, _ = loads
    seen = []
    got = loading.load_in_order(
        ARGS,
        Say(),
        diarization=object(),
        aligner="words not timed",
        diarizer_loaded=lambda d: seen.append(("diarizer", list(order))),
        model_loaded=lambda m: seen.append(("model", list(order))) or True,
    )
    assert order == ["diarizer", "model", "aligner words not timed"]
    assert seen == [("diarizer", ["diarizer"]), ("model", ["diarizer", "model"])]
    assert (got.diarizer, got.model, got.aligner.model) == ("D", "M", "A")
    order.clear()
    got = loading.load_in_order(ARGS, Say(), model=False, required=True)  # mlxasr align without --diarize
    assert order == ["aligner required"] and got.model is None and got.diarizer is None


@pytest.mark.parametrize("failing", ["diarizer", "model", "aligner"])
def test_what_fails_stops_what_comes_after(loads, failing):
    order, fail = loads
    fail.add(failing)
    assert loading.load_in_order(ARGS, Say(), diarization=object(), aligner="x") is None
    assert [o.split()[0] for o in order] == ["diarizer", "model", "aligner"][
        : ["diarizer", "model", "aligner"].index(failing) + 1
    ]


def test_a_model_check_that_fails_stops_before_the_aligner(loads):
    order, _ = loads
    assert loading.load_in_order(ARGS, Say(), aligner="x", model_loaded=lambda m: False) is None
    assert order == ["model"]


def test_a_required_default_aligner_that_cannot_load_is_an_error(monkeypatch):
    def broken(source, dtype=None):
        raise FileNotFoundError(f"{source}: no such checkpoint")

    monkeypatch.setattr(models, "load", broken)
    monkeypatch.delenv(models.ALIGNER_ENV, raising=False)
    say = Say()
    got = models.load_aligner(None, None, say, required=True)
    assert got.stop and say.lines[-1] == f"error: aligner {models.DEFAULT_ALIGNER}: no such checkpoint"
    say = Say()
    got = models.load_aligner(None, None, say, instead="words not timed")
    assert not got.stop and got.model is None and say.lines[-1].startswith("warning: default aligner")


def test_untimed_says_what_is_done_without_the_default_aligner():
    assert (
        loading.untimed(["srt", "json"]) == "cue times estimated; use --aligner PATH or --no-word-timestamps"
    )
    assert loading.untimed({"txt": 1}) == "words not timed; use --aligner PATH or --no-word-timestamps"
