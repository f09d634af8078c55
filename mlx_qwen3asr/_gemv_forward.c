/* cblas_sgemm that sends one-row and one-column products to cblas_sgemv.
 *
 * MLX's CPU backend computes every matrix product with cblas_sgemm. A decode step of one sequence
 * is a chain of matrix-vector products, and OpenBLAS's sgemm (before 0.3.27) packs the weights
 * first: it streams them at about 19 GB/s here, against about 31 GB/s for its sgemv. Loaded with
 * RTLD_GLOBAL ahead of OpenBLAS, this definition of cblas_sgemm wins the symbol lookup for MLX;
 * every other product goes to OpenBLAS's own sgemm unchanged.
 *
 * mlx_qwen3asr/_cpu.py builds nothing at run time: setuptools compiles this file on Linux when the
 * package is installed, and _cpu.py loads it with ctypes and hands it OpenBLAS's two functions.
 */

#include <stddef.h>

typedef void (*sgemm_fn)(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                         const float *a, int lda, const float *b, int ldb, float beta, float *c,
                         int ldc);
typedef void (*sgemv_fn)(int order, int trans, int m, int n, float alpha, const float *a, int lda,
                         const float *x, int incx, float beta, float *y, int incy);

enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };

static sgemm_fn real_sgemm = NULL;
static sgemv_fn real_sgemv = NULL;

/* Called once, before anything can call cblas_sgemm, with OpenBLAS's functions. */
void gemv_forward_init(sgemm_fn sgemm, sgemv_fn sgemv) {
    real_sgemm = sgemm;
    real_sgemv = sgemv;
}

/* y = alpha * op(A) x + beta * y; with beta 0, y may hold anything (BLAS semantics), so clear it
 * rather than rely on the library never scaling garbage. */
static void gemv(int trans, int rows, int cols, float alpha, const float *a, int lda,
                 const float *x, int incx, float beta, float *y, int incy, int len_y) {
    if (beta == 0.0f) {
        for (int i = 0; i < len_y; i++) y[(ptrdiff_t)i * incy] = 0.0f;
    }
    real_sgemv(ROW_MAJOR, trans, rows, cols, alpha, a, lda, x, incx, beta, y, incy);
}

/* C (m x n) = alpha * op(A) (m x k) * op(B) (k x n) + beta * C. */
void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                 const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc) {
    if (order == ROW_MAJOR && k > 0 && n == 1 && m > 1) {
        /* One column: c = op(A) b, where b is column 0 of op(B) and c has stride ldc. */
        int inc_b = trans_b == NO_TRANS ? ldb : 1;
        if (trans_a == NO_TRANS) {
            gemv(NO_TRANS, m, k, alpha, a, lda, b, inc_b, beta, c, ldc, m);
        } else {
            gemv(TRANS, k, m, alpha, a, lda, b, inc_b, beta, c, ldc, m);
        }
        return;
    }
    if (order == ROW_MAJOR && k > 0 && m == 1 && n > 1) {
        /* One row: c^T = op(B)^T a^T, where a is row 0 of op(A). */
        int inc_a = trans_a == NO_TRANS ? 1 : lda;
        if (trans_b == NO_TRANS) {
            gemv(TRANS, k, n, alpha, b, ldb, a, inc_a, beta, c, 1, n);
        } else {
            gemv(NO_TRANS, n, k, alpha, b, ldb, a, inc_a, beta, c, 1, n);
        }
        return;
    }
    real_sgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
