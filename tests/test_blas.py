"""The test process itself runs MLX on OpenBLAS where it is installed (Linux)."""

from __future__ import annotations

import ctypes.util
import sys
from pathlib import Path

import pytest

from mlx_qwen3asr import _blas


def openblas_installed() -> bool:
    if ctypes.util.find_library("openblas"):
        return True
    return any(Path(p).exists() for p in _blas.CANDIDATES if p.startswith("/"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="OpenBLAS is loaded on Linux only")
def test_openblas_is_loaded_when_installed():
    assert _blas.loaded is not None or not openblas_installed()
    if openblas_installed():
        ctypes.CDLL(_blas.loaded).openblas_get_num_threads.restype = ctypes.c_int
        assert ctypes.CDLL(_blas.loaded).openblas_get_num_threads() >= 1
