"""The package's CPU setup on Linux: OpenBLAS loaded for MLX where installed, malloc tuned on glibc."""

from __future__ import annotations

import ctypes.util
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from mlx_qwen3asr.runtime import cpu as _cpu

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
def test_parallel_test_processes_share_the_cores_between_their_blas_threads():
    """Under pytest -n N each test process's OpenBLAS runs cpu_count // N threads (tests/conftest.py)."""
    if not openblas_installed():
        pytest.fail("OpenBLAS is not installed: the suite needs it (see the README)")
    lib = ctypes.CDLL(_cpu.loaded)
    lib.openblas_get_num_threads.restype = ctypes.c_int
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    expected = int(os.environ["OPENBLAS_NUM_THREADS"]) if "OPENBLAS_NUM_THREADS" in os.environ else None
    if workers > 1:
        assert expected == max(1, (os.cpu_count() or 1) // workers)
        assert os.environ.get("MATMUL_NUM_THREADS") == str(expected)  # the diarizer's (speakrs) share
    if expected is not None:
        assert lib.openblas_get_num_threads() == expected


def test_the_processes_the_suite_starts_keep_their_bytecode(tmp_path):
    """Every Python process the suite starts reads and writes compiled bytecode (tests/conftest.py), in its
    own folder where PYTHONDONTWRITEBYTECODE was set: nothing is compiled from source twice, and nothing
    is written beside a source file."""
    module = tmp_path / "imported_here.py"
    module.write_text("VALUE = 1\n")
    probe = "import sys, imported_here; print(sys.dont_write_bytecode, sys.pycache_prefix)"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True
    )
    dont_write, prefix = done.stdout.split()
    assert dont_write == "False" and not sys.dont_write_bytecode
    if prefix == "None":
        assert (tmp_path / "__pycache__").is_dir()
    else:
        assert prefix == sys.pycache_prefix and not (tmp_path / "__pycache__").exists()
        assert list(Path(prefix).glob(f"{str(tmp_path).lstrip('/')}/imported_here.*.pyc"))


@linux_only
@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt tuning is glibc's")
def test_malloc_is_tuned_by_the_commands_not_by_an_import_and_can_be_turned_off():
    def tuned(code: str, **env: str) -> str:
        run = subprocess.run(
            [sys.executable, "-c", f"import mlx_qwen3asr.runtime.cpu as c\n{code}\nprint(c.malloc_tuned)"],
            env=dict(os.environ, **env),
            capture_output=True,
            text=True,
            check=True,
        )
        return run.stdout.split()[-1]

    assert tuned("import mlx_qwen3asr") == "False"
    for module in ("main", "convert"):
        call = f"from mlx_qwen3asr.cli.{module} import main\ntry:\n    main(['--version'])\nexcept SystemExit:\n    pass"
        assert tuned(call) == "True"
        assert tuned(call, MLX_QWEN3ASR_NO_MALLOC_TUNING="1") == "False"
    assert tuned("import mlx_qwen3asr; mlx_qwen3asr.tune_malloc()") == "True"


def test_the_sizes_and_dtype_follow_the_device():
    import mlx.core as mx

    from mlx_qwen3asr.runtime import device

    on_cpu = mx.default_device() == mx.cpu
    assert device.tuning() is (device.CPU if on_cpu else device.GPU)
    assert device.default_dtype_name() == ("float32" if on_cpu else "bfloat16")
    assert device.CPU.max_batch < device.GPU.max_batch
