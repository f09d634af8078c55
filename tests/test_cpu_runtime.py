"""The package's CPU setup on Linux: OpenBLAS loaded for MLX where installed, malloc tuned on glibc."""

from __future__ import annotations

import ctypes.util
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from mlx_qwen3asr import _cpu

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux-only process setup")


def openblas_installed() -> bool:
    if ctypes.util.find_library("openblas"):
        return True
    return any(Path(p).exists() for p in _cpu.CANDIDATES if p.startswith("/"))


@linux_only
def test_openblas_is_loaded_when_installed():
    assert _cpu.loaded is not None or not openblas_installed()
    if openblas_installed():
        ctypes.CDLL(_cpu.loaded).openblas_get_num_threads.restype = ctypes.c_int
        assert ctypes.CDLL(_cpu.loaded).openblas_get_num_threads() >= 1


@linux_only
@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt tuning is glibc's")
def test_malloc_is_tuned_on_glibc_and_can_be_turned_off():
    assert _cpu.malloc_tuned
    code = "import mlx_qwen3asr._cpu as c; import mlx_qwen3asr; print(c.malloc_tuned)"
    env = dict(os.environ, MLX_QWEN3ASR_NO_MALLOC_TUNING="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
