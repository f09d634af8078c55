"""Process setup that makes MLX's CPU backend fast on Linux.

- OpenBLAS: the mlx[cpu] wheel links a bundled reference BLAS that is ~50x slower than OpenBLAS for
  float32 matmul. Loading OpenBLAS with RTLD_GLOBAL before mlx makes its symbols win the lookup.
  Set MLX_QWEN3ASR_NO_OPENBLAS=1 to keep the bundled BLAS.
- OpenBLAS's kernels: a build older than the CPU does not know its model and runs its generic SSE3
  kernels (Debian 12's OpenBLAS 0.3.21 on a 2023 Xeon: about 6x slower in float32 than its AVX-512
  ones; docs/performance.md). Unless OPENBLAS_CORETYPE is set, the kernel family is named from the
  CPU's features for the load (the environment is left as it was).
- malloc: MLX's CPU allocator takes every array from malloc and has no cache of its own. glibc serves
  large blocks with fresh mmap pages, so every activation is page-faulted in again (~1.6 ns per float
  here, more than a fused elementwise kernel costs). Keeping freed blocks in the heap lets them be
  reused. Set MLX_QWEN3ASR_NO_MALLOC_TUNING=1 to leave malloc alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import sys

CANDIDATES = (
    "libopenblas.so.0",
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "libopenblas.so",
)

# glibc mallopt parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4

# OpenBLAS's x86-64 kernel families, best first, with the CPU features each needs.
CORETYPES = (
    ("SkylakeX", frozenset({"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"})),
    ("Haswell", frozenset({"avx2", "fma"})),
)

loaded: str | None = None
malloc_tuned = False


def _opted_out(variable: str) -> bool:
    return os.environ.get(variable, "") not in ("", "0")


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The features the kernel reports for this CPU (x86's "flags" line), empty where none is read."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def openblas_coretype(flags: frozenset[str]) -> str | None:
    """The best OpenBLAS kernel family that CPU features `flags` run, or None (not x86-64, or older)."""
    for name, needs in CORETYPES:
        if needs <= flags:
            return name
    return None


def openblas_core() -> str | None:
    """The kernel family the loaded OpenBLAS runs (its own name for it), or None if none is loaded."""
    if not loaded:
        return None
    try:
        corename = ctypes.CDLL(loaded).openblas_get_corename
    except (OSError, AttributeError):  # a library by that name without OpenBLAS's own calls
        return None
    corename.restype = ctypes.c_char_p
    return corename().decode()


def _load(name: str) -> None:
    """Load one OpenBLAS globally, with the kernels of this CPU unless the user named them."""
    coretype = None
    if "OPENBLAS_CORETYPE" not in os.environ and platform.machine().lower() in ("x86_64", "amd64"):
        coretype = openblas_coretype(cpu_flags())
    if coretype:
        os.environ["OPENBLAS_CORETYPE"] = coretype  # read once, by the library's constructor
    try:
        ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
    finally:
        if coretype:
            del os.environ["OPENBLAS_CORETYPE"]


def preload_openblas() -> str | None:
    """Load OpenBLAS globally if this is Linux, mlx is not imported yet, and the user did not opt out."""
    global loaded
    if loaded or not sys.platform.startswith("linux") or "mlx.core" in sys.modules:
        return loaded
    if _opted_out("MLX_QWEN3ASR_NO_OPENBLAS"):
        return None
    found = ctypes.util.find_library("openblas")
    for name in ((found,) if found else ()) + CANDIDATES:
        try:
            _load(name)
        except OSError:
            continue
        loaded = name
        return loaded
    return None


def tune_malloc() -> bool:
    """On glibc, serve large blocks from the heap and keep freed memory for reuse. Returns whether set."""
    global malloc_tuned
    if malloc_tuned or not sys.platform.startswith("linux") or _opted_out("MLX_QWEN3ASR_NO_MALLOC_TUNING"):
        return malloc_tuned
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl has no mallopt)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # mallopt returns 1 on success.
    malloc_tuned = bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 1 << 30))
    return malloc_tuned
