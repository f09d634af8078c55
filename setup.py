"""Build configuration beyond pyproject.toml: one optional C file on Linux (see _gemv_forward.c)."""

import sys

from setuptools import Extension, setup

extensions = []
if sys.platform.startswith("linux"):
    # Loaded with ctypes, never imported. Optional: without a C compiler (with OpenMP) the package
    # installs and runs on OpenBLAS's sgemm alone.
    extensions.append(
        Extension(
            "mlx_qwen3asr.runtime._gemv_forward",
            ["mlx_qwen3asr/runtime/_gemv_forward.c"],
            extra_compile_args=["-O3", "-fopenmp"],
            extra_link_args=["-fopenmp"],
            optional=True,
        )
    )

setup(ext_modules=extensions)
