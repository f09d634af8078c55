"""Use OpenBLAS for MLX's CPU backend on Linux when it is installed.

The mlx[cpu] wheel links a bundled reference BLAS that is ~50x slower than OpenBLAS for float32 matmul.
Loading OpenBLAS with RTLD_GLOBAL before mlx makes its symbols win the lookup. Set
MLX_QWEN3ASR_NO_OPENBLAS=1 to keep the bundled BLAS.
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

loaded: str | None = None


def preload_openblas() -> str | None:
    """Load OpenBLAS globally if this is Linux, mlx is not imported yet, and the user did not opt out."""
    global loaded
    if loaded or not sys.platform.startswith("linux") or "mlx.core" in sys.modules:
        return loaded
    if os.environ.get("MLX_QWEN3ASR_NO_OPENBLAS", "") not in ("", "0"):
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
