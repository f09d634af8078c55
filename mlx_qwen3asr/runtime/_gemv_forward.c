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
 * Weights kept beside their float32 copy as bfloat16 (gemv_forward_shadow, from runtime/cpu.py for a
 * model loaded from bfloat16 weights): the kernel for 1 to 8 rows streams the bfloat16 copy instead,
 * half the bytes, and widens each value to float32 exactly (the float32 copy holds the same values:
 * only matrices whose every value is a bfloat16 are registered), so the products are the same sums
 * in the same order. Each call checks a few values of the float32 matrix against the copy.
 *
 * setuptools compiles this file on Linux when the package is installed; mlx_qwen3asr/runtime/cpu.py
 * loads it with ctypes and hands it OpenBLAS's sgemm and sgemv.
 */

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
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

/* bfloat16 copies of float32 weights, found by the float32 matrix's address. */
typedef struct {
    const float *f32;
    const uint16_t *bf16;
    long rows, cols;
} shadow_t;

enum { MAX_SHADOWS = 8192 };
static shadow_t shadows[MAX_SHADOWS];
static int n_shadows = 0;
static long shadow_hits = 0;
/* Products hold it to read (a copy stays mapped while one reads it); registering and dropping
 * copies hold it to write. */
static pthread_rwlock_t shadow_lock = PTHREAD_RWLOCK_INITIALIZER;

/* Register `bf16` (rows x cols, row-major, contiguous) as the copy of `f32`; the caller guarantees
 * that every float32 value is the widened bfloat16 and keeps both alive until gemv_forward_unshadow.
 * Returns 1, or 0 when the table is full. */
int gemv_forward_shadow(const float *f32, const uint16_t *bf16, long rows, long cols) {
    int done = 0;
    pthread_rwlock_wrlock(&shadow_lock);
    for (int i = 0; i < n_shadows && !done; i++) {
        if (shadows[i].f32 == f32) {
            shadows[i] = (shadow_t){f32, bf16, rows, cols};
            done = 1;
        }
    }
    if (!done && n_shadows < MAX_SHADOWS) {
        shadows[n_shadows++] = (shadow_t){f32, bf16, rows, cols};
        done = 1;
    }
    pthread_rwlock_unlock(&shadow_lock);
    return done;
}

/* Once it returns, no product reads the copy of `f32`: the caller may free it. */
void gemv_forward_unshadow(const float *f32) {
    pthread_rwlock_wrlock(&shadow_lock);
    for (int i = 0; i < n_shadows; i++) {
        if (shadows[i].f32 == f32) {
            shadows[i] = shadows[--n_shadows];
            break;
        }
    }
    pthread_rwlock_unlock(&shadow_lock);
}

/* dst[i] = the high half of src[i] for i < n; returns 1 when every src[i] is that bfloat16 widened
 * (its low half is zero), else 0 (dst then holds anything). */
int gemv_forward_to_bf16(const float *src, uint16_t *dst, long n) {
    const uint32_t *bits = (const uint32_t *)src;
    int exact = 1;
#pragma omp parallel for schedule(static) reduction(&& : exact) if (n >= 1 << 20)
    for (long i = 0; i < n; i++) {
        exact = exact && (bits[i] & 0xFFFFu) == 0;
        dst[i] = (uint16_t)(bits[i] >> 16);
    }
    return exact;
}

/* Products that read a bfloat16 copy so far (for tests). */
long gemv_forward_shadow_hits(void) { return __atomic_load_n(&shadow_hits, __ATOMIC_RELAXED); }

static inline uint32_t float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* The bfloat16 copy of the m x k matrix at w (leading dimension ldw), or NULL: registered with those
 * rows and columns, and nine values spread over it equal to the copy's. When it returns a copy, the
 * caller holds the read lock and calls shadow_done() after reading it. */
static const uint16_t *shadow_of(const float *w, int m, int k, int ldw) {
    const uint16_t *found = NULL;
    pthread_rwlock_rdlock(&shadow_lock);
    for (int i = 0; i < n_shadows; i++) {
        const shadow_t *s = &shadows[i];
        if (s->f32 == w && s->cols == k && ldw == k && m <= s->rows) {
            found = s->bf16;
            break;
        }
    }
    for (int a = 0; a < 3 && found != NULL; a++) {
        for (int b = 0; b < 3 && found != NULL; b++) {
            ptrdiff_t at = (ptrdiff_t)(a * (m - 1) / 2) * ldw + b * (k - 1) / 2;
            if (float_bits(w[at]) != (uint32_t)found[at] << 16) found = NULL;
        }
    }
    if (found == NULL) {
        pthread_rwlock_unlock(&shadow_lock);
        return NULL;
    }
    __atomic_fetch_add(&shadow_hits, 1, __ATOMIC_RELAXED);
    return found;
}

static void shadow_done(void) { pthread_rwlock_unlock(&shadow_lock); }

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

typedef uint16_t u16x8 __attribute__((vector_size(16)));
typedef uint32_t u32x8 __attribute__((vector_size(32)));

/* Eight bfloat16 values widened to float32 (exactly: a bfloat16 is a float32's high half). */
AVX2 static inline v8 load8_bf16(const uint16_t *p) {
    u16x8 h;
    memcpy(&h, p, sizeof h);
    u32x8 u = __builtin_convertvector(h, u32x8) << 16;
    v8 v;
    memcpy(&v, &u, sizeof v);
    return v;
}

AVX2 static inline float widen_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#define LOAD_F32(p) load8(p)
#define AT_F32(p) (*(p))
#define LOAD_BF16(p) load8_bf16(p)
#define AT_BF16(p) widen_bf16(*(p))

/* out[i * rs + j * cs] = alpha * dot(w[i, :k], x[j, :k]) (+ beta * out) for i < m, j < N, with w of
 * element type T read by LOAD (8 at a time) and AT (one). Two accumulators per x row keep enough
 * multiply-adds in flight for N = 2. */
#define FEW_ROWS(N, NAME, T, LOAD, AT)                                                             \
    AVX2 static void NAME##_##N(int m, int k, float alpha, const T *w, int ldw, const float *x,   \
                                int ldx, float beta, float *out, ptrdiff_t rs, ptrdiff_t cs) {    \
        _Pragma("omp parallel for schedule(static) if ((ptrdiff_t)m * k >= 65536)")               \
        for (int i = 0; i < m; i++) {                                                             \
            const T *wi = w + (ptrdiff_t)i * ldw;                                                 \
            v8 acc0[N], acc1[N];                                                                  \
            for (int j = 0; j < N; j++) acc0[j] = acc1[j] = (v8){0};                              \
            int p = 0;                                                                            \
            for (; p + 16 <= k; p += 16) {                                                        \
                v8 w0 = LOAD(wi + p), w1 = LOAD(wi + p + 8);                                      \
                for (int j = 0; j < N; j++) {                                                     \
                    acc0[j] += w0 * load8(x + (ptrdiff_t)j * ldx + p);                            \
                    acc1[j] += w1 * load8(x + (ptrdiff_t)j * ldx + p + 8);                        \
                }                                                                                 \
            }                                                                                     \
            for (int j = 0; j < N; j++) {                                                         \
                v8 t = acc0[j] + acc1[j];                                                         \
                float s = ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));      \
                for (int q = p; q < k; q++) s = __builtin_fmaf(AT(wi + q), x[(ptrdiff_t)j * ldx + q], s); \
                float *o = out + (ptrdiff_t)i * rs + (ptrdiff_t)j * cs;                           \
                *o = beta == 0.0f ? alpha * s : alpha * s + beta * *o;                            \
            }                                                                                     \
        }                                                                                         \
    }

#define BOTH_TYPES(N)                                          \
    FEW_ROWS(N, few_rows, float, LOAD_F32, AT_F32)             \
    FEW_ROWS(N, few_rows_bf16, uint16_t, LOAD_BF16, AT_BF16)

BOTH_TYPES(1)
BOTH_TYPES(2)
BOTH_TYPES(3)
BOTH_TYPES(4)
BOTH_TYPES(5)
BOTH_TYPES(6)
BOTH_TYPES(7)
BOTH_TYPES(8)

/* The bfloat16 kernel on AVX-512: one 16-wide accumulator per x row whose lanes 0-7 and 8-15 are
 * acc0 and acc1 above, reduced the same way, so the sums are the same as the 8-wide kernel's. */
#define AVX512 __attribute__((target("avx512f,avx2,fma")))
typedef float v16 __attribute__((vector_size(64)));
typedef uint16_t u16x16 __attribute__((vector_size(32)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));

AVX512 static inline v16 load16(const float *p) {
    v16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

AVX512 static inline v16 load16_bf16(const uint16_t *p) {
    u16x16 h;
    memcpy(&h, p, sizeof h);
    u32x16 u = __builtin_convertvector(h, u32x16) << 16;
    v16 v;
    memcpy(&v, &u, sizeof v);
    return v;
}

#define FEW_ROWS_512(N)                                                                            \
    AVX512 static void few_rows_bf16_512_##N(int m, int k, float alpha, const uint16_t *w,         \
                                             int ldw, const float *x, int ldx, float beta,         \
                                             float *out, ptrdiff_t rs, ptrdiff_t cs) {             \
        _Pragma("omp parallel for schedule(static) if ((ptrdiff_t)m * k >= 65536)")               \
        for (int i = 0; i < m; i++) {                                                             \
            const uint16_t *wi = w + (ptrdiff_t)i * ldw;                                          \
            v16 acc[N];                                                                           \
            for (int j = 0; j < N; j++) acc[j] = (v16){0};                                        \
            int p = 0;                                                                            \
            for (; p + 16 <= k; p += 16) {                                                        \
                v16 w0 = load16_bf16(wi + p);                                                     \
                for (int j = 0; j < N; j++) acc[j] += w0 * load16(x + (ptrdiff_t)j * ldx + p);    \
            }                                                                                     \
            for (int j = 0; j < N; j++) {                                                         \
                v16 a = acc[j];                                                                   \
                float t[8];                                                                       \
                for (int q = 0; q < 8; q++) t[q] = a[q] + a[q + 8];                               \
                float s = ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));      \
                for (int q = p; q < k; q++) s = __builtin_fmaf(widen_bf16(wi[q]), x[(ptrdiff_t)j * ldx + q], s); \
                float *o = out + (ptrdiff_t)i * rs + (ptrdiff_t)j * cs;                           \
                *o = beta == 0.0f ? alpha * s : alpha * s + beta * *o;                            \
            }                                                                                     \
        }                                                                                         \
    }

FEW_ROWS_512(1)
FEW_ROWS_512(2)
FEW_ROWS_512(3)
FEW_ROWS_512(4)
FEW_ROWS_512(5)
FEW_ROWS_512(6)
FEW_ROWS_512(7)
FEW_ROWS_512(8)


/* The products of the n rows of x0 (n <= 8) with the m rows of w. Returns 0 where it cannot run
 * (no AVX2/FMA, no memory), and the caller falls back to sgemm. */
static int few_rows(int n, int m, int k, float alpha, const float *w, int ldw, const float *x0,
                    int ldx0, float beta, float *out, ptrdiff_t rs, ptrdiff_t cs) {
    static int supported = -1;
    if (supported < 0) {
        __builtin_cpu_init();
        supported = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    if (!supported || n < 1 || n > MAX_FEW_ROWS) return 0;
    /* The x rows packed side by side, offset from 4 KiB multiples so they do not share L1 sets. */
    int ldx = (k + 15) / 16 * 16 + 16;
    if (ldx % 1024 == 0) ldx += 16;
    float *x = malloc(sizeof(float) * (size_t)ldx * n);
    if (x == NULL) return 0;
    for (int j = 0; j < n; j++) memcpy(x + (ptrdiff_t)j * ldx, x0 + (ptrdiff_t)j * ldx0, sizeof(float) * k);
    typedef void (*f32_kernel)(int, int, float, const float *, int, const float *, int, float, float *,
                               ptrdiff_t, ptrdiff_t);
    typedef void (*bf16_kernel)(int, int, float, const uint16_t *, int, const float *, int, float,
                                float *, ptrdiff_t, ptrdiff_t);
    static const f32_kernel f32_kernels[MAX_FEW_ROWS] = {few_rows_1, few_rows_2, few_rows_3, few_rows_4,
                                                         few_rows_5, few_rows_6, few_rows_7, few_rows_8};
    static const bf16_kernel bf16_kernels[MAX_FEW_ROWS] = {
        few_rows_bf16_1, few_rows_bf16_2, few_rows_bf16_3, few_rows_bf16_4,
        few_rows_bf16_5, few_rows_bf16_6, few_rows_bf16_7, few_rows_bf16_8};
    static const bf16_kernel bf16_512_kernels[MAX_FEW_ROWS] = {
        few_rows_bf16_512_1, few_rows_bf16_512_2, few_rows_bf16_512_3, few_rows_bf16_512_4,
        few_rows_bf16_512_5, few_rows_bf16_512_6, few_rows_bf16_512_7, few_rows_bf16_512_8};
    static int wide = -1;
    if (wide < 0) wide = __builtin_cpu_supports("avx512f");
    const uint16_t *h = shadow_of(w, m, k, ldw);
    if (h != NULL) {
        (wide ? bf16_512_kernels : bf16_kernels)[n - 1](m, k, alpha, h, ldw, x, ldx, beta, out, rs, cs);
        shadow_done();
    } else {
        f32_kernels[n - 1](m, k, alpha, w, ldw, x, ldx, beta, out, rs, cs);
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
