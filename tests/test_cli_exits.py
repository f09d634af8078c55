"""One ladder from the exception that stops a command to its exit status (mlx_qwen3asr.cli.exits),
used by every command's main()."""

from __future__ import annotations

import sys

import pytest

from mlx_qwen3asr.cli import align, convert, live
from mlx_qwen3asr.cli.exits import stopped
from mlx_qwen3asr.cli.signals import Terminated


class _Own(Exception):
    pass


def _raise(e: BaseException):
    def body() -> int:
        raise e

    return body


@pytest.mark.parametrize(
    ("exception", "status", "line"),
    [
        (KeyboardInterrupt(), 130, "prog: interrupted; nothing was written\n"),
        (Terminated(), 143, "prog: terminated; nothing was written\n"),
        (SystemExit(2), 2, ""),
        (SystemExit(None), 0, ""),
        (SystemExit("message"), 2, ""),
        (_Own("bad"), 7, "own: bad\n"),
    ],
)
def test_each_stop_gives_its_status_and_line(exception, status, line, capsys):
    def own(e: Exception) -> int:
        print(f"own: {e}", file=sys.stderr)
        return 7

    got = stopped("prog", _raise(exception), after="; nothing was written", errors=_Own, on_error=own)
    assert (got, capsys.readouterr().err) == (status, line)


def test_the_body_status_and_other_errors_pass_through():
    assert stopped("prog", lambda: 5) == 5
    with pytest.raises(ValueError):
        stopped("prog", _raise(ValueError("x")), errors=_Own, on_error=lambda e: 1)


@pytest.mark.parametrize(
    ("main", "line"),
    [
        (align.main, "mlxasr align: interrupted; nothing was written\n"),
        (live.main, "mlxasr live: interrupted\n"),
        (convert.main, "mlxasr-convert: interrupted; nothing was written\n"),
    ],
)
def test_each_command_says_its_interruption(main, line, monkeypatch, capsys):
    """A Ctrl-C while the arguments are read ends each command as a Ctrl-C later would."""
    monkeypatch.setattr(
        main.__module__ and __import__(main.__module__, fromlist=["x"]), "build_parser", _broken
    )
    assert main(["x"]) == 130
    assert capsys.readouterr().err == line


def _broken(*args, **kwargs):
    raise KeyboardInterrupt
