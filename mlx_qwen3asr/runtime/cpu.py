"""Process setup that makes MLX's CPU backend fast on Linux.

- OpenBLAS: the mlx[cpu] wheel links a bundled reference BLAS that is ~50x slower than OpenBLAS for
  float32 matmul. Loading OpenBLAS with RTLD_GLOBAL before mlx makes its symbols win the lookup.
  Set MLX_QWEN3ASR_NO_OPENBLAS=1 to keep the bundled BLAS.
- malloc: MLX's CPU allocator takes every array from malloc and has no cache of its own. glibc serves
  large blocks with fresh mmap pages, so every activation is page-faulted in again (~1.6 ns per float
  here, more than a fused elementwise kernel costs). Keeping freed blocks in the heap lets them be
  reused. Set MLX_QWEN3ASR_NO_MALLOC_TUNING=1 to leave malloc alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
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

loaded: str | None = None
malloc_tuned = False


def _opted_out(variable: str) -> bool:
    return os.environ.get(variable, "") not in ("", "0")


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
            ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
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
