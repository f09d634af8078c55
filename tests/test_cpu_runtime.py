"""The package's CPU setup on Linux: OpenBLAS loaded for MLX where installed, malloc tuned on glibc."""

from __future__ import annotations

import ctypes.util
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
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


# --------------------------------------------------------------------------------------------------
# Products of 1 to 8 rows (_gemv_forward.c)
# --------------------------------------------------------------------------------------------------

ROW_MAJOR, COL_MAJOR, NO_TRANS, TRANS = 101, 102, 111, 112


def forward_library() -> ctypes.CDLL:
    path = _cpu.gemv_forward_library()
    if path is None:
        pytest.skip("the package was installed without its C file built (no C compiler at install)")
    if not openblas_installed():
        pytest.skip("OpenBLAS is not installed")
    library = ctypes.CDLL(str(path), mode=ctypes.RTLD_LOCAL)
    openblas = ctypes.CDLL(_cpu.loaded or "libopenblas.so.0", mode=ctypes.RTLD_LOCAL)
    library.gemv_forward_init(
        ctypes.cast(openblas.cblas_sgemm, ctypes.c_void_p), ctypes.cast(openblas.cblas_sgemv, ctypes.c_void_p)
    )
    p, i, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    library.cblas_sgemm.argtypes = [i, i, i, i, i, i, f, p, i, p, i, f, p, i]
    return library


def stored(rows: int, cols: int, ld: int, rng) -> np.ndarray:
    """A rows x cols matrix inside a rows x ld row-major buffer (ld >= cols), the spare columns NaN."""
    buffer = np.full((rows, ld), np.nan, dtype=np.float32)
    buffer[:, :cols] = rng.standard_normal((rows, cols), dtype=np.float32)
    return buffer


@linux_only
@pytest.mark.parametrize("trans_a", [NO_TRANS, TRANS])
@pytest.mark.parametrize("trans_b", [NO_TRANS, TRANS])
@pytest.mark.parametrize(
    "m,n,k",
    [
        (1, 9, 7),
        (9, 1, 7),
        (1, 1, 7),
        (4, 3, 7),
        (1, 9, 1),
        (9, 1, 1),
        (33, 1, 100),  # one to eight rows against many, k past the 16-wide steps
        (1, 33, 100),
        (40, 5, 37),
        (6, 40, 37),
        (20, 8, 48),
        (9, 9, 20),  # nine each way: sgemm
        (300, 4, 256),  # large enough to split across threads
        (3, 300, 256),
    ],
)
@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_forwarded_sgemm_matches_the_product(trans_a, trans_b, m, n, k, beta):
    """cblas_sgemm's row-major contract for every shape it forwards (and some it does not), with
    leading dimensions wider than the matrices, and with beta 0 over a C holding NaN."""
    library = forward_library()
    rng = np.random.default_rng(m * 100 + n * 10 + k)
    a_shape = (m, k) if trans_a == NO_TRANS else (k, m)
    b_shape = (k, n) if trans_b == NO_TRANS else (n, k)
    lda, ldb, ldc = a_shape[1] + 3, b_shape[1] + 2, n + 4
    a, b = stored(*a_shape, lda, rng), stored(*b_shape, ldb, rng)
    c = np.full((m, ldc), np.nan, dtype=np.float32)
    c[:, :n] = np.nan if beta == 0 else rng.standard_normal((m, n), dtype=np.float32)
    c_before = c[:, :n].astype(np.float64)
    op_a = a[:, : a_shape[1]].astype(np.float64)
    op_b = b[:, : b_shape[1]].astype(np.float64)
    op_a = op_a if trans_a == NO_TRANS else op_a.T
    op_b = op_b if trans_b == NO_TRANS else op_b.T
    expected = 1.5 * op_a @ op_b + (beta * c_before if beta else 0.0)

    library.cblas_sgemm(
        ROW_MAJOR,
        trans_a,
        trans_b,
        m,
        n,
        k,
        1.5,
        a.ctypes.data,
        lda,
        b.ctypes.data,
        ldb,
        beta,
        c.ctypes.data,
        ldc,
    )
    # float32 summation error bound for k terms, against the float64 product
    magnitude = 1.5 * np.abs(op_a) @ np.abs(op_b) + (beta * np.abs(c_before) if beta else 0.0)
    bound = (k + 2) * 2.0**-24 * magnitude + 1e-7
    assert not np.isnan(c[:, :n]).any()
    assert (np.abs(c[:, :n] - expected) <= bound).all(), np.abs(c[:, :n] - expected).max()
    assert np.isnan(c[:, n:]).all()  # nothing written past each row of C


@linux_only
def test_column_major_products_pass_through_unchanged():
    library = forward_library()
    rng = np.random.default_rng(3)
    a = rng.standard_normal((5, 4), dtype=np.float32)  # column-major 4 x 5 read as its transpose
    b = rng.standard_normal(5, dtype=np.float32)
    c = np.full(4, np.nan, dtype=np.float32)
    library.cblas_sgemm(
        COL_MAJOR, NO_TRANS, NO_TRANS, 4, 1, 5, 1.0, a.ctypes.data, 4, b.ctypes.data, 5, 0.0, c.ctypes.data, 4
    )
    np.testing.assert_allclose(c, a.T.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


@linux_only
def test_forwarding_is_on_where_built_and_can_be_turned_off():
    built = _cpu.gemv_forward_library() is not None
    opted_out = _cpu._opted_out("MLX_QWEN3ASR_NO_GEMV_FORWARD")
    assert _cpu.gemv_forward == (built and _cpu.loaded is not None and not opted_out)
    code = "import mlx_qwen3asr.runtime.cpu as c; import mlx_qwen3asr; print(c.loaded is not None, c.gemv_forward)"
    env = dict(os.environ, MLX_QWEN3ASR_NO_GEMV_FORWARD="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(_cpu.loaded is not None), "False"]


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 9])
def test_mlx_products_of_few_rows(rows):
    """The products a decode step makes, through MLX's CPU backend (on the forwarding sgemm where it is
    on): rows times transposed weights, weights times transposed rows, batched, sliced, and addmm."""
    import mlx.core as mx

    rng = np.random.default_rng(rows)
    w = rng.standard_normal((40, 72), dtype=np.float32)
    x = rng.standard_normal((rows, 72), dtype=np.float32)
    w64, x64 = w.astype(np.float64), x.astype(np.float64)
    mw, mxx = mx.array(w), mx.array(x)
    with mx.stream(mx.cpu):
        cases = {
            "x @ w.T": (mxx @ mw.T, x64 @ w64.T),
            "w @ x.T": (mw @ mxx.T, w64 @ x64.T),
            "sliced": (mxx[:, 4:60] @ mw[:, 4:60].T, x64[:, 4:60] @ w64[:, 4:60].T),
            "batched": (mx.stack([mxx, 2 * mxx]) @ mw.T, np.stack([x64, 2 * x64]) @ w64.T),
            "addmm": (
                mx.addmm(mx.ones((rows, 40)), mxx, mw.T, alpha=1.5, beta=0.5),
                0.5 + 1.5 * x64 @ w64.T,
            ),
        }
        for name, (got, expected) in cases.items():
            np.testing.assert_allclose(np.array(got), expected, rtol=1e-5, atol=1e-4, err_msg=name)


def test_the_code_path_follows_the_environment_and_use_path():
    def chosen(env: str | None) -> subprocess.CompletedProcess:
        environment = {k: v for k, v in os.environ.items() if k != "MLX_QWEN3ASR_PATH"}
        if env is not None:
            environment["MLX_QWEN3ASR_PATH"] = env
        code = (
            "from mlx_qwen3asr.runtime import backend as b\n"
            "before = (b.path(), b.tuning().dtype, b.tuning().inline_prefix_tokens)\n"
            "with b.use_path('cpu' if before[0] == 'gpu' else 'gpu'):\n"
            "    inside = b.path()\n"
            "print(*before, inside, b.path())"
        )
        return subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True)

    assert chosen(None).stdout.split() == ["cpu", "float32", "0", "gpu", "cpu"]
    assert chosen("auto").stdout.split() == ["cpu", "float32", "0", "gpu", "cpu"]
    assert chosen("GPU").stdout.split() == ["gpu", "bfloat16", "128", "cpu", "gpu"]
    wrong = chosen("metal")
    assert wrong.returncode != 0 and "MLX_QWEN3ASR_PATH='metal': must be cpu, gpu or auto" in wrong.stderr
