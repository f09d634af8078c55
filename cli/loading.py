"""The order in which every command loads what it runs: the diarizer first (a diarization library that
cannot run stops the command before any model loads), then the speech recognition model, then the
forced aligner. Each says what it loads, and what went wrong on one line, as mlx_qwen3asr.cli.models
and mlx_qwen3asr.cli.diarizing word it."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from mlx_qwen3asr.cli.diarizing import Diarization, load_diarizer
from mlx_qwen3asr.cli.models import Aligner, Messages, load_aligner, load_model

__all__ = ["Loaded", "load_in_order", "untimed"]


@dataclass(frozen=True)
class Loaded:
    """What was loaded; None for what was not asked for."""

    diarizer: Any | None = None
    model: Any | None = None
    aligner: Aligner | None = None  # its model is None where the default one was out of reach


def untimed(formats: Collection[str]) -> str:
    """What a command writing `formats` does without the default aligner, and the options to do better."""
    done = "cue times estimated" if {"srt", "vtt"} & set(formats) else "words not timed"
    return f"{done}; use --aligner PATH or --no-word-timestamps"


def load_in_order(
    args: argparse.Namespace,
    say: Messages,
    *,
    diarization: Diarization | None = None,
    isolated: bool = False,
    model: bool = True,
    aligner: str | None = None,
    required: bool = False,
    diarizer_loaded: Callable[[Any], None] | None = None,
    model_loaded: Callable[[Any], bool] | None = None,
) -> Loaded | None:
    """The diarizer (where diarization is asked for; isolated: in a worker process), the model of
    --model (model=True) and the aligner of --aligner (where `aligner` is given: what is done without
    the default one, see load_aligner; required: the default one must load too), in that order.

    None once the error is said: the command stops with status 2. diarizer_loaded(diarizer) runs as
    soon as the diarizer is there (its work may start while the models load); model_loaded(model)
    checks the model before the aligner loads, False stopping the command (its error said)."""
    diarizer = None
    if diarization is not None:
        diarizer = load_diarizer(diarization, args.diarizer, say, isolated=isolated)
        if diarizer is None:
            return None
        if diarizer_loaded is not None:
            diarizer_loaded(diarizer)
    loaded_model = None
    if model:
        loaded_model = load_model(args.model, args.dtype, say)
        if loaded_model is None:  # missing, unreadable, mismatched or wrong-kind checkpoints stop here
            return None
        if model_loaded is not None and not model_loaded(loaded_model):
            return None
    loaded_aligner = None
    if aligner is not None or required:
        loaded_aligner = load_aligner(args.aligner, args.dtype, say, instead=aligner or "", required=required)
        if loaded_aligner.stop:
            return None
    return Loaded(diarizer, loaded_model, loaded_aligner)
