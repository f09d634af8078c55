"""The checkpoints the commands run, loaded with a one-line reason for what goes wrong: the speech
recognition model (--model) and the forced aligner that times words (--aligner)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from mlx_qwen3asr.checkpoints.hub import LOCAL_FOLDER, HubError
from mlx_qwen3asr.checkpoints.loading import load, require_kind
from mlx_qwen3asr.cli.options import ALIGNER_ENV, DEFAULT_ALIGNER
from mlx_qwen3asr.runtime.messages import one_line

__all__ = ["Aligner", "Messages", "hub_error", "load_aligner", "load_model", "load_reason"]


class Messages(Protocol):
    """Where a command says what it loads and what went wrong."""

    def info(self, line: str) -> None: ...

    def error(self, line: str) -> None: ...

    def warning(self, line: str) -> None: ...


def hub_error(e: BaseException | None) -> HubError | None:
    """The HubError behind a loading error (the checkpoint was not cached and could not be fetched)."""
    seen = []
    while e is not None and e not in seen:
        if isinstance(e, HubError):
            return e
        seen.append(e)
        e = e.__cause__ or e.__context__
    return None


def load_reason(source: str, e: BaseException, option: str | None = None) -> str:
    """Why source did not load, on one line, without the source that the message may start with.

    option: the command's option that names a checkpoint (`--model`): where the hub could not give it,
    the message says to give a local checkpoint folder with that option."""
    reason = one_line(e) or type(e).__name__
    for prefix in (source, str(Path(source).expanduser()), str(Path(source).expanduser().resolve())):
        if reason.startswith(prefix + ": "):
            reason = reason[len(prefix) + 2 :]
    if option and hub_error(e) is not None:
        reason = reason.replace(LOCAL_FOLDER, f"{LOCAL_FOLDER} with {option} PATH")
    return reason


def load_model(source: str, dtype: str | None, say: Messages) -> Any | None:
    """The speech recognition model at source, or None once the error is said: a checkpoint missing,
    unreadable or mismatched, or a forced aligner (which would read its timestamp classes as words)."""
    say.info(f"loading model {source}")
    try:
        model = load(source, dtype=dtype)
        require_kind(model, "asr")
    except Exception as e:
        say.error(f"model {source}: {load_reason(source, e, '--model')}")
        return None
    return model


@dataclass(frozen=True)
class Aligner:
    """What became of loading the forced aligner."""

    source: str  # the checkpoint loaded, or tried
    model: Any | None = None  # None: it could not be loaded
    stop: bool = False  # it was named and could not be loaded: a usage error, as a bad --model is


def load_aligner(
    flag: str | None, dtype: str | None, say: Messages, *, instead: str = "", required: bool = False
) -> Aligner:
    """The forced aligner named by --aligner (flag), else $MLXASR_ALIGNER, else the default one.

    A named one must load (the default one too where it is required): if it does not, the error is said
    and stop is set. Otherwise the default one may be out of reach (not cached, the hub unreachable): a
    short warning says why and what is done `instead` (a few words, then the options to use), and the
    command goes on without it.
    """
    named = flag or os.environ.get(ALIGNER_ENV)
    source = named or DEFAULT_ALIGNER
    say.info(f"loading aligner {source}")
    try:
        aligner = load(source, dtype=dtype)
        require_kind(aligner, "aligner")
    except Exception as e:
        if named or required:
            say.error(f"aligner {source}: {load_reason(source, e, '--aligner')}")
            return Aligner(source, stop=True)
        # The default one out of reach: the reason in a few words, then what is done and how to do
        # better (`instead`), on one short line without the hub's advice (nor the repo id it tried).
        hub = hub_error(e)
        if hub is not None:
            say.warning(f"default aligner {hub.short}: {instead}")
        else:
            say.warning(f"default aligner {source}: {load_reason(source, e)}; {instead}")
        return Aligner(source)
    return Aligner(source, aligner)
