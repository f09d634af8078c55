"""Process setup that makes MLX's CPU backend fast on Linux.

- OpenBLAS: the mlx[cpu] wheel links a bundled reference BLAS that is ~50x slower than OpenBLAS for
  float32 matmul. Loading OpenBLAS with RTLD_GLOBAL before mlx makes its symbols win the lookup.
  Set MLX_QWEN3ASR_NO_OPENBLAS=1 to keep the bundled BLAS.
- Products of a few rows: MLX computes every product with sgemm, which OpenBLAS (before 0.3.27)
  runs by packing the weights first, even for one row. Where the package was built with its small C
  file (_gemv_forward.c, compiled on Linux at install), that file's cblas_sgemm goes ahead of
  OpenBLAS's and runs products of 1 to 8 rows in a kernel that streams the weights once (or sends
  them to sgemv); decode steps of 1 to 8 sequences take a third to two thirds of the time. Set
  MLX_QWEN3ASR_NO_GEMV_FORWARD=1 to call OpenBLAS's sgemm throughout.
- malloc: MLX's CPU allocator takes every array from malloc and has no cache of its own. glibc serves
  large blocks with fresh mmap pages, so every activation is page-faulted in again (~1.6 ns per float
  here, more than a fused elementwise kernel costs). Keeping freed blocks in the heap lets them be
  reused. Set MLX_QWEN3ASR_NO_MALLOC_TUNING=1 to leave malloc alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.machinery
import os
import sys
from pathlib import Path

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
gemv_forward = False
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
            # Local first: _gemv_forward.c's sgemm must enter the global scope ahead of OpenBLAS's.
            library = ctypes.CDLL(name, mode=ctypes.RTLD_LOCAL)
        except OSError:
            continue
        _load_gemv_forward(library)
        ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
        loaded = name
        return loaded
    return None


def gemv_forward_library() -> Path | None:
    """The compiled _gemv_forward.c beside this file, if the install built it."""
    here = Path(__file__).parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = here / f"_gemv_forward{suffix}"
        if path.exists():
            return path
    return None


def _load_gemv_forward(openblas: ctypes.CDLL) -> None:
    """Put _gemv_forward.c's cblas_sgemm in the global scope, wired to this OpenBLAS (see the module doc)."""
    global gemv_forward
    path = gemv_forward_library()
    if path is None or _opted_out("MLX_QWEN3ASR_NO_GEMV_FORWARD"):
        return
    try:
        sgemm, sgemv = openblas.cblas_sgemm, openblas.cblas_sgemv
        forward = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    except (OSError, AttributeError):
        return
    forward.gemv_forward_init(ctypes.cast(sgemm, ctypes.c_void_p), ctypes.cast(sgemv, ctypes.c_void_p))
    gemv_forward = True


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
