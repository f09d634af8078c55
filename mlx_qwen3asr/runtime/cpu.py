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
- bfloat16 weights for those products: a decode step streams every weight matrix once, so its time is
  the bytes read. The published checkpoints hold bfloat16 weights, which float32 holds exactly; for a
  loaded model's decoder (shadow_bfloat16) the kernel for few rows streams a bfloat16 copy of each
  such matrix and widens it as it goes: the same values in the same sums, half the bytes (a 0.6b
  decode step takes about 30% less time here), at the cost of the copies' memory (1.2 GB for 0.6b,
  3.4 GB for 1.7b). Products of many rows (prefill, the encoder) still read float32. Set
  MLX_QWEN3ASR_NO_BF16_COPIES=1 to read float32 throughout.
- malloc: MLX's CPU allocator takes every array from malloc and has no cache of its own. glibc serves
  large blocks with fresh mmap pages, so every activation is page-faulted in again (~1.6 ns per float
  here, more than a fused elementwise kernel costs). Keeping freed blocks in the heap lets them be
  reused. Set MLX_QWEN3ASR_NO_MALLOC_TUNING=1 to leave malloc alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.machinery
import mmap
import os
import sys
import threading
import weakref
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
_forward: ctypes.CDLL | None = None
# float32 data address -> (the float32 array, its bfloat16 copy): both kept alive while registered, so
# the address cannot be reused by another array.
_copies: dict[int, tuple[object, object]] = {}
_copies_lock = threading.Lock()


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
    global _forward
    _forward = forward
    forward.gemv_forward_shadow.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_long)
    forward.gemv_forward_shadow.restype = ctypes.c_int
    forward.gemv_forward_unshadow.argtypes = (ctypes.c_void_p,)
    forward.gemv_forward_shadow_hits.restype = ctypes.c_long
    forward.gemv_forward_to_bf16.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long)
    forward.gemv_forward_to_bf16.restype = ctypes.c_int
    gemv_forward = True


def bfloat16_copies_on() -> bool:
    """Whether shadow_bfloat16 registers anything: the kernel for few rows is loaded, not opted out."""
    return _forward is not None and not _opted_out("MLX_QWEN3ASR_NO_BF16_COPIES")


def shadow_bfloat16(owner: object, arrays) -> int:
    """Give the kernel for few rows a bfloat16 copy of each 2-D float32 MLX array in `arrays` whose
    values are all bfloat16 (see the module doc); the copies are dropped when `owner` (the module that
    holds the arrays) is garbage-collected. Returns how many were registered (0 when off)."""
    if not bfloat16_copies_on():
        return 0
    import mlx.core as mx  # imported by the caller already: this module loads before mlx
    import numpy as np

    registered: list[int] = []
    try:
        for array in arrays:
            if not isinstance(array, mx.array) or array.ndim != 2 or array.dtype != mx.float32:
                continue
            view = np.asarray(memoryview(array))
            if not view.flags["C_CONTIGUOUS"] or view.size == 0:
                continue
            if np.any(view[0].view(np.uint32) & 0xFFFF):
                continue  # float32 weights (not widened bfloat16): no copy, and no pass over them
            # Its own private mapping, its pages made present in one call (MAP_POPULATE): far cheaper here
            # than a page fault for each 4 KiB as the copy is written.
            flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_ANONYMOUS", 0) | getattr(mmap, "MAP_POPULATE", 0)
            try:
                buffer = mmap.mmap(-1, view.size * 2, flags=flags)
            except OSError:  # no memory for it: this and the rest read float32
                break
            copy = np.frombuffer(buffer, dtype=np.uint16).reshape(view.shape)
            if not _forward.gemv_forward_to_bf16(view.ctypes.data, copy.ctypes.data, view.size):
                continue  # not every value is a bfloat16
            address = view.__array_interface__["data"][0]
            with _copies_lock:
                # Kept (and listed for the owner) before the kernel can read it, whatever interrupts.
                _copies[address] = (array, copy)
                registered.append(address)
                if not _forward.gemv_forward_shadow(address, copy.ctypes.data, view.shape[0], view.shape[1]):
                    del _copies[address]  # the table is full
                    registered.pop()
                    break
    finally:  # also when interrupted part way: what was registered goes with the owner
        if registered:
            weakref.finalize(owner, _unshadow, tuple(registered))
    return len(registered)


def _unshadow(addresses: tuple[int, ...]) -> None:
    with _copies_lock:
        for address in addresses:
            if address in _copies:
                _forward.gemv_forward_unshadow(address)  # returns once no product reads the copy
                del _copies[address]


def bfloat16_hits() -> int:
    """Products of few rows that have read a bfloat16 copy in this process so far."""
    return int(_forward.gemv_forward_shadow_hits()) if _forward is not None else 0


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
