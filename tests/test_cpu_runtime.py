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


def test_the_kernel_family_is_named_from_the_cpu_features(tmp_path):
    avx512 = {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}
    assert _cpu.openblas_coretype(frozenset(avx512 | {"avx2", "fma", "sse3"})) == "SkylakeX"
    assert _cpu.openblas_coretype(frozenset((avx512 - {"avx512vl"}) | {"avx2", "fma"})) == "Haswell"
    assert _cpu.openblas_coretype(frozenset({"avx2", "fma", "sse4_2"})) == "Haswell"
    assert _cpu.openblas_coretype(frozenset({"avx", "sse4_2"})) is None
    assert _cpu.openblas_coretype(frozenset()) is None
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu sse3 avx2 fma\n\nprocessor\t: 1\n"
    )
    assert _cpu.cpu_flags(str(cpuinfo)) == {"fpu", "sse3", "avx2", "fma"}
    assert _cpu.cpu_flags(str(tmp_path / "absent")) == frozenset()


def loaded_core(**env: str) -> tuple[str, str]:
    """(the loaded OpenBLAS's kernel family, OPENBLAS_CORETYPE after the import) in a new process."""
    probe = (
        "import os, mlx_qwen3asr\nfrom mlx_qwen3asr.runtime import cpu\n"
        "print(cpu.openblas_core(), os.environ.get('OPENBLAS_CORETYPE', '-'))"
    )
    environ = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    run = subprocess.run(
        [sys.executable, "-c", probe], env=dict(environ, **env), capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    core, variable = run.stdout.split()
    return core, variable


@linux_only
def test_openblas_runs_the_kernels_of_this_cpu_and_a_named_family_wins():
    """An OpenBLAS older than the CPU would run its generic kernels (Prescott): the family this CPU's
    features run is named for the load, the environment is left as it was, and the user's choice wins."""
    if not openblas_installed():
        pytest.fail("OpenBLAS is not installed: the suite needs it (see the README)")
    family = _cpu.openblas_coretype(_cpu.cpu_flags()) if platform.machine() == "x86_64" else None
    core, variable = loaded_core()
    assert variable == "-"
    if family is not None:
        assert core.lower() == family.lower()
        assert loaded_core(OPENBLAS_CORETYPE="Prescott") == ("Prescott", "Prescott")
    else:
        assert core != "None"


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
