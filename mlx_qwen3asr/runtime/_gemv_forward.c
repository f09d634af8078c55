/* cblas_sgemm that gives products of one to eight rows kernels which read the weights once.
 *
 * MLX's CPU backend computes every matrix product with cblas_sgemm. A decode step of a few
 * sequences is a chain of products of the weights with 1 to 8 rows, and OpenBLAS's sgemm (before
 * 0.3.27) packs the weights first: for one row it streams them at about 19 GB/s here, against about
 * 31 GB/s for its sgemv, and 2 to 8 rows cost about as much as 8. Loaded with RTLD_GLOBAL ahead of
 * OpenBLAS, this definition of cblas_sgemm wins the symbol lookup for MLX:
 *   - one row or one column: OpenBLAS's sgemv;
 *   - 2 to 8 rows (or columns) against a row-major matrix used transposed (x @ W.T, or W @ x.T):
 *     a kernel below that streams each weight row once and takes its dot products with all the
 *     rows, split across the cores with OpenMP (x86-64 with AVX2 and FMA);
 *   - anything else: OpenBLAS's sgemm unchanged.
 *
 * setuptools compiles this file on Linux when the package is installed; mlx_qwen3asr/_cpu.py loads
 * it with ctypes and hands it OpenBLAS's sgemm and sgemv.
 */

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

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

#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_FEW_ROWS 1
#define MAX_FEW_ROWS 8
#define AVX2 __attribute__((target("avx2,fma")))

typedef float v8 __attribute__((vector_size(32)));

AVX2 static inline v8 load8(const float *p) {
    v8 v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* out[i * rs + j * cs] = alpha * dot(w[i, :k], x[j, :k]) (+ beta * out) for i < m, j < N.
 * Two accumulators per x row keep enough multiply-adds in flight for N = 2. */
#define FEW_ROWS(N)                                                                                \
    AVX2 static void few_rows_##N(int m, int k, float alpha, const float *w, int ldw,            \
                                  const float *x, int ldx, float beta, float *out, ptrdiff_t rs, \
                                  ptrdiff_t cs) {                                                 \
        _Pragma("omp parallel for schedule(static) if ((ptrdiff_t)m * k >= 65536)")               \
        for (int i = 0; i < m; i++) {                                                             \
            const float *wi = w + (ptrdiff_t)i * ldw;                                             \
            v8 acc0[N], acc1[N];                                                                  \
            for (int j = 0; j < N; j++) acc0[j] = acc1[j] = (v8){0};                              \
            int p = 0;                                                                            \
            for (; p + 16 <= k; p += 16) {                                                        \
                v8 w0 = load8(wi + p), w1 = load8(wi + p + 8);                                    \
                for (int j = 0; j < N; j++) {                                                     \
                    acc0[j] += w0 * load8(x + (ptrdiff_t)j * ldx + p);                            \
                    acc1[j] += w1 * load8(x + (ptrdiff_t)j * ldx + p + 8);                        \
                }                                                                                 \
            }                                                                                     \
            for (int j = 0; j < N; j++) {                                                         \
                v8 t = acc0[j] + acc1[j];                                                         \
                float s = ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));      \
                for (int q = p; q < k; q++) s += wi[q] * x[(ptrdiff_t)j * ldx + q];               \
                float *o = out + (ptrdiff_t)i * rs + (ptrdiff_t)j * cs;                           \
                *o = beta == 0.0f ? alpha * s : alpha * s + beta * *o;                            \
            }                                                                                     \
        }                                                                                         \
    }

FEW_ROWS(1)
FEW_ROWS(2)
FEW_ROWS(3)
FEW_ROWS(4)
FEW_ROWS(5)
FEW_ROWS(6)
FEW_ROWS(7)
FEW_ROWS(8)

/* The products of the n rows of x0 (n <= 8) with the m rows of w. Returns 0 where it cannot run
 * (no AVX2/FMA, no memory), and the caller falls back to sgemm. */
static int few_rows(int n, int m, int k, float alpha, const float *w, int ldw, const float *x0,
                    int ldx0, float beta, float *out, ptrdiff_t rs, ptrdiff_t cs) {
    static int supported = -1;
    if (supported < 0) {
        __builtin_cpu_init();
        supported = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    if (!supported) return 0;
    /* The x rows packed side by side, offset from 4 KiB multiples so they do not share L1 sets. */
    int ldx = (k + 15) / 16 * 16 + 16;
    if (ldx % 1024 == 0) ldx += 16;
    float *x = malloc(sizeof(float) * (size_t)ldx * n);
    if (x == NULL) return 0;
    for (int j = 0; j < n; j++) memcpy(x + (ptrdiff_t)j * ldx, x0 + (ptrdiff_t)j * ldx0, sizeof(float) * k);
    switch (n) {
        case 1: few_rows_1(m, k, alpha, w, ldw, x, ldx, beta, out, rs, cs); break;
        case 2: few_rows_2(m, k, alpha, w, ldw, x, ldx, beta, out, rs, cs); break;
        case 3: few_rows_3(m, k, alpha, w, ldw, x, ldx, beta, out, rs, cs); break;
        case 4: few_rows_4(m, k, alpha, w, ldw, x, ldx, beta, out, rs, cs); break;
        case 5: few_rows_5(m, k, alpha, w, ldw, x, ldx, beta, out, rs, cs); break;
        case 6: few_rows_6(m, k, alpha, w, ldw, x, ldx, beta, out, rs, cs); break;
        case 7: few_rows_7(m, k, alpha, w, ldw, x, ldx, beta, out, rs, cs); break;
        default: few_rows_8(m, k, alpha, w, ldw, x, ldx, beta, out, rs, cs); break;
    }
    free(x);
    return 1;
}
#endif

/* C (m x n) = alpha * op(A) (m x k) * op(B) (k x n) + beta * C. */
void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                 const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc) {
#ifdef HAVE_FEW_ROWS
    if (order == ROW_MAJOR && k > 0 && trans_a == NO_TRANS && trans_b == TRANS && m > 1 && n > 0) {
        /* A's rows and B's rows (op(B) = B^T) are both rows of length k. */
        if (n <= MAX_FEW_ROWS && few_rows(n, m, k, alpha, a, lda, b, ldb, beta, c, ldc, 1)) {
            return; /* C[i, j] = A[i] . B[j]: A streamed, B's n rows reused */
        }
    }
    if (order == ROW_MAJOR && k > 0 && trans_a == NO_TRANS && trans_b == TRANS && n > MAX_FEW_ROWS) {
        if (m <= MAX_FEW_ROWS && few_rows(m, n, k, alpha, b, ldb, a, lda, beta, c, 1, ldc)) {
            return; /* C[i, j] = B[j] . A[i]: B streamed, A's m rows reused */
        }
    }
#endif
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
