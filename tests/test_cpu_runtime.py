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


# --------------------------------------------------------------------------------------------------
# bfloat16 copies of the weights for products of few rows


def shadow_library() -> ctypes.CDLL:
    library = forward_library()
    p, long_ = ctypes.c_void_p, ctypes.c_long
    library.gemv_forward_shadow.argtypes = [p, p, long_, long_]
    library.gemv_forward_shadow.restype = ctypes.c_int
    library.gemv_forward_unshadow.argtypes = [p]
    library.gemv_forward_shadow_hits.restype = long_
    library.gemv_forward_to_bf16.argtypes = [p, p, long_]
    library.gemv_forward_to_bf16.restype = ctypes.c_int
    return library


def bfloat16_valued(shape, rng) -> np.ndarray:
    """float32 values that are all bfloat16 (the low half of each float's bits zero)."""
    x = rng.standard_normal(shape, dtype=np.float32)
    return (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)


def sgemm_rows(library, w: np.ndarray, x: np.ndarray, weight_major: bool) -> np.ndarray:
    """x @ w.T through cblas_sgemm, as MLX calls it for x @ w.T or (w @ x.T).T."""
    m, k = w.shape
    n = x.shape[0]
    if weight_major:
        c = np.full((m, n), np.nan, dtype=np.float32)
        library.cblas_sgemm(
            ROW_MAJOR,
            NO_TRANS,
            TRANS,
            m,
            n,
            k,
            1.0,
            w.ctypes.data,
            k,
            x.ctypes.data,
            k,
            0.0,
            c.ctypes.data,
            n,
        )
        return c.T.copy()
    c = np.full((n, m), np.nan, dtype=np.float32)
    library.cblas_sgemm(
        ROW_MAJOR, NO_TRANS, TRANS, n, m, k, 1.0, x.ctypes.data, k, w.ctypes.data, k, 0.0, c.ctypes.data, m
    )
    return c


@linux_only
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("m,k", [(40, 64), (33, 100), (300, 256), (9, 7)])
@pytest.mark.parametrize("weight_major", [False, True])
def test_a_bfloat16_copy_gives_the_same_sums(rows, m, k, weight_major):
    """Products of 1 to 8 rows with a registered bfloat16 copy read the copy and equal, bit for bit,
    the products with the float32 matrix (same values, same order of sums), in either orientation."""
    library = shadow_library()
    rng = np.random.default_rng(rows * 1000 + m + k)
    w = bfloat16_valued((m, k), rng)
    x = rng.standard_normal((rows, k), dtype=np.float32)
    plain = sgemm_rows(library, w, x, weight_major)
    copy = np.empty((m, k), dtype=np.uint16)
    assert library.gemv_forward_to_bf16(w.ctypes.data, copy.ctypes.data, w.size) == 1
    np.testing.assert_array_equal(copy, (w.view(np.uint32) >> 16).astype(np.uint16))
    assert library.gemv_forward_shadow(w.ctypes.data, copy.ctypes.data, m, k) == 1
    try:
        hits = library.gemv_forward_shadow_hits()
        shadowed = sgemm_rows(library, w, x, weight_major)
        assert library.gemv_forward_shadow_hits() == hits + 1
        np.testing.assert_array_equal(shadowed, plain)
        np.testing.assert_allclose(
            shadowed, x.astype(np.float64) @ w.T.astype(np.float64), rtol=1e-4, atol=1e-4
        )
    finally:
        library.gemv_forward_unshadow(w.ctypes.data)
    hits = library.gemv_forward_shadow_hits()
    sgemm_rows(library, w, x, weight_major)
    assert library.gemv_forward_shadow_hits() == hits  # unregistered: float32 again


@linux_only
def test_a_copy_that_no_longer_matches_its_matrix_is_not_read():
    """Each product checks values of the float32 matrix against the copy: memory that changed under
    a registered address (or a copy of other values) is read as float32."""
    library = shadow_library()
    rng = np.random.default_rng(7)
    w = bfloat16_valued((64, 48), rng)
    x = rng.standard_normal((1, 48), dtype=np.float32)
    wrong = (bfloat16_valued((64, 48), rng).view(np.uint32) >> 16).astype(np.uint16)
    library.gemv_forward_shadow(w.ctypes.data, wrong.ctypes.data, 64, 48)
    try:
        hits = library.gemv_forward_shadow_hits()
        got = sgemm_rows(library, w, x, weight_major=False)
        assert library.gemv_forward_shadow_hits() == hits
        np.testing.assert_allclose(got, x.astype(np.float64) @ w.T.astype(np.float64), rtol=1e-4, atol=1e-4)
        # a matrix registered with other columns, or read with a leading dimension, is not the copy
        right = (w.view(np.uint32) >> 16).astype(np.uint16)
        library.gemv_forward_shadow(w.ctypes.data, right.ctypes.data, 64, 32)
        sgemm_rows(library, w, x, weight_major=False)
        assert library.gemv_forward_shadow_hits() == hits
    finally:
        library.gemv_forward_unshadow(w.ctypes.data)


@linux_only
def test_float32_values_that_are_not_bfloat16_get_no_copy():
    library = shadow_library()
    w = bfloat16_valued((16, 16), np.random.default_rng(1))
    w[5, 9] = np.float32(1.0) + np.float32(2.0**-20)
    copy = np.empty((16, 16), dtype=np.uint16)
    assert library.gemv_forward_to_bf16(w.ctypes.data, copy.ctypes.data, w.size) == 0


@linux_only
def test_shadow_bfloat16_registers_bfloat16_matrices_for_their_owner_s_lifetime():
    """The package's registration: 2-D float32 arrays whose values are bfloat16, nothing else; MLX's
    products of few rows then read the copies, with the same results; the copies go with the owner."""
    import gc

    import mlx.core as mx

    if not _cpu.bfloat16_copies_on():
        pytest.skip("the kernel for few rows is not loaded (no C compiler at install, or opted out)")

    class Owner:
        pass

    rng = np.random.default_rng(2)
    w = bfloat16_valued((48, 80), rng)
    arrays = [
        mx.array(w),
        mx.array(rng.standard_normal((48, 80), dtype=np.float32)),  # not bfloat16 values
        mx.array(w[0]),  # 1-D
        mx.array(w).astype(mx.bfloat16),  # not float32
    ]
    mx.eval(arrays)
    x = mx.array(rng.standard_normal((3, 80), dtype=np.float32))
    with mx.stream(mx.cpu):
        plain = np.array(x @ arrays[0].T)
    owner = Owner()
    before = len(_cpu._copies)
    assert _cpu.shadow_bfloat16(owner, arrays) == 1
    assert len(_cpu._copies) == before + 1
    hits = _cpu.bfloat16_hits()
    with mx.stream(mx.cpu):
        shadowed = np.array(x @ arrays[0].T)
    assert _cpu.bfloat16_hits() > hits
    np.testing.assert_array_equal(shadowed, plain)
    del owner
    gc.collect()
    assert len(_cpu._copies) == before


@linux_only
def test_bfloat16_copies_can_be_turned_off():
    code = "import mlx_qwen3asr, sys\nfrom mlx_qwen3asr.runtime import cpu\nprint(cpu.bfloat16_copies_on())"
    on = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert on.stdout.split() == [str(_cpu.gemv_forward)]
    env = dict(os.environ, MLX_QWEN3ASR_NO_BF16_COPIES="1")
    off = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert off.stdout.split() == ["False"]


def test_a_loaded_model_decodes_the_same_with_and_without_its_bfloat16_copies(checkpoints):
    """A model loaded from bfloat16 weights gets copies of its decoder's matrices (on the CPU, where the
    kernel is built) and decodes the same tokens with the same log-probabilities without them."""
    import mlx.core as mx

    import mlx_qwen3asr
    from mlx_qwen3asr.model.generate import greedy_generate

    model = mlx_qwen3asr.load(checkpoints("tiny"))
    net = model.net
    decoder = [id(a) for a in _flat(net.model.parameters()) if a.ndim == 2]
    registered = [a for a, _ in _cpu._copies.values() if id(a) in decoder]
    assert len(registered) == (len(decoder) if _cpu.bfloat16_copies_on() else 0)
    assert all(id(a) in decoder for a in registered)
    mx.random.seed(3)
    features = mx.random.normal((12, model.config.text_config.hidden_size))
    prompt = [151644, 8948] + [net.config.audio_token_id] * 12 + [151645, 198]
    hits = _cpu.bfloat16_hits()
    first = greedy_generate(net, prompt, features, 12, frozenset())
    assert (_cpu.bfloat16_hits() > hits) == bool(registered)
    _cpu._unshadow(tuple(a for a, (array, _) in _cpu._copies.items() if id(array) in decoder))
    hits = _cpu.bfloat16_hits()
    second = greedy_generate(net, prompt, features, 12, frozenset())
    assert _cpu.bfloat16_hits() == hits
    assert first.tokens == second.tokens and len(first.tokens) == 12
    assert first.logprobs == second.logprobs


def _flat(tree) -> list:
    from mlx.utils import tree_flatten

    return [a for _, a in tree_flatten(tree)]


@linux_only
def test_no_memory_for_the_copies_leaves_the_model_on_float32(checkpoints, monkeypatch):
    """Where the copies cannot be mapped, the model loads anyway and decodes on its float32 weights."""
    import mlx_qwen3asr

    if not _cpu.bfloat16_copies_on():
        pytest.skip("the kernel for few rows is not loaded (no C compiler at install, or opted out)")

    def no_memory(*args, **kwargs):
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(_cpu.mmap, "mmap", no_memory)
    before = len(_cpu._copies)
    model = mlx_qwen3asr.load(checkpoints("tiny"))
    assert len(_cpu._copies) == before
    assert model.net.model.layers[0].mlp.up_proj.weight.dtype.size == 4


@linux_only
def test_copies_registered_before_an_interrupt_go_with_their_owner(monkeypatch):
    """Ctrl-C part way through the registration: the copies made so far stay readable and are dropped
    with the owner, like the others."""
    import gc

    import mlx.core as mx

    if not _cpu.bfloat16_copies_on():
        pytest.skip("the kernel for few rows is not loaded (no C compiler at install, or opted out)")

    class Owner:
        pass

    rng = np.random.default_rng(4)
    arrays = [mx.array(bfloat16_valued((32, 64), rng)) for _ in range(4)]
    mx.eval(arrays)
    real = _cpu._forward.gemv_forward_to_bf16
    calls = []

    def interrupted(*args):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(_cpu._forward, "gemv_forward_to_bf16", interrupted)
    owner = Owner()
    before = len(_cpu._copies)
    with pytest.raises(KeyboardInterrupt):
        _cpu.shadow_bfloat16(owner, arrays)
    assert len(_cpu._copies) == before + 2
    x = mx.array(rng.standard_normal((1, 64), dtype=np.float32))
    hits = _cpu.bfloat16_hits()
    with mx.stream(mx.cpu):
        got = np.array(x @ arrays[1].T)
    assert _cpu.bfloat16_hits() == hits + 1
    np.testing.assert_allclose(got, np.array(x) @ np.array(arrays[1]).T, rtol=1e-5, atol=1e-5)
    del owner
    gc.collect()
    assert len(_cpu._copies) == before
    hits = _cpu.bfloat16_hits()
    with mx.stream(mx.cpu):
        np.array(x @ arrays[1].T)
    assert _cpu.bfloat16_hits() == hits
