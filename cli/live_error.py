"""The error that ends `mlxasr live`: one line and an exit status."""

from __future__ import annotations

from mlx_qwen3asr.cli.options import EXIT_USAGE


class LiveError(Exception):
    """A problem that stops the command: one line, and the exit status it ends with."""

    def __init__(self, message: str, status: int = EXIT_USAGE, *, label: str = "error: ") -> None:
        super().__init__(message)
        self.status = status
        self.label = label


__all__ = ["LiveError"]
