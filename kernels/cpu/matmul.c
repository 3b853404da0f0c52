/* out[rows][n] = in[rows][k] x w[n][k]^T with F32, F16 or BF16 weights and
 * F32 accumulation.
 *
 * Work is cut into tasks of ROW_BLOCK input rows x N_BLOCK weight rows, so a
 * task's inputs (64 rows x k floats) stay in L2 while its weight rows stream
 * past them; inside a task, tiles of 4 x 4 dot products share every load.
 * Decode (one row) is then a pass over the weights split across threads,
 * which is all the bandwidth can give. Each output element is one dot
 * product in a fixed order, so results do not depend on the thread count. */
#include "cpu_ops.h"

#include "common/common_assert.h"

#include <immintrin.h>

enum { ROW_BLOCK = 64, N_BLOCK = 64, MR = 4, NR = 4 };

struct matmul_job {
    float *out;
    const float *in;
    const void *w;
    shoal_dtype wdtype;
    int rows, n, k;
    int n_blocks;
};

/* ---- portable path ---- */

static void tile_portable(const struct matmul_job *j, int r0, int r1, int n0, int n1)
{
    for (int r = r0; r < r1; r++) {
        const float *x = j->in + (size_t)r * (size_t)j->k;
        for (int c = n0; c < n1; c++) {
            size_t base = (size_t)c * (size_t)j->k;
            float lane[16] = {0};
            int i = 0;
            for (; i + 16 <= j->k; i += 16)
                for (int l = 0; l < 16; l++)
                    lane[l] += x[i + l] * shoal_load_f32(j->w, j->wdtype, base + (size_t)(i + l));
            for (int l = 0; i < j->k; i++, l++)
                lane[l] += x[i] * shoal_load_f32(j->w, j->wdtype, base + (size_t)i);
            for (int wdt = 8; wdt >= 1; wdt /= 2)
                for (int l = 0; l < wdt; l++)
                    lane[l] += lane[l + wdt];
            j->out[(size_t)r * (size_t)j->n + (size_t)c] = lane[0];
        }
    }
}

/* ---- AVX-512 path ---- */

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c")))

AVX512 static inline __m512 load_bf16(const void *w, size_t i, __mmask16 m)
{
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)w + i);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

AVX512 static inline __m512 load_f16(const void *w, size_t i, __mmask16 m)
{
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)w + i));
}

AVX512 static inline __m512 load_f32(const void *w, size_t i, __mmask16 m)
{
    return _mm512_maskz_loadu_ps(m, (const float *)w + i);
}

AVX512 static inline __m512 load_w(const void *w, shoal_dtype dt, size_t i, __mmask16 m)
{
    return dt == SHOAL_DTYPE_BF16 ? load_bf16(w, i, m)
           : dt == SHOAL_DTYPE_F16 ? load_f16(w, i, m)
                                   : load_f32(w, i, m);
}

/* MR input rows x NR weight rows starting at (r, c); rows and columns past
 * the edge repeat the last valid one and are not stored. One function per
 * weight dtype, so the sixteen accumulators stay in registers. */
#define DEFINE_TILE(NAME, LOAD)                                                                \
    AVX512 static void NAME(const struct matmul_job *j, int r, int rn, int c, int cn)          \
    {                                                                                          \
        const float *x0 = j->in + (size_t)r * (size_t)j->k;                                    \
        const float *x1 = j->in + (size_t)(r + (1 < rn ? 1 : rn - 1)) * (size_t)j->k;          \
        const float *x2 = j->in + (size_t)(r + (2 < rn ? 2 : rn - 1)) * (size_t)j->k;          \
        const float *x3 = j->in + (size_t)(r + (3 < rn ? 3 : rn - 1)) * (size_t)j->k;          \
        size_t w0 = (size_t)c * (size_t)j->k;                                                  \
        size_t w1 = (size_t)(c + (1 < cn ? 1 : cn - 1)) * (size_t)j->k;                        \
        size_t w2 = (size_t)(c + (2 < cn ? 2 : cn - 1)) * (size_t)j->k;                        \
        size_t w3 = (size_t)(c + (3 < cn ? 3 : cn - 1)) * (size_t)j->k;                        \
        __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;                      \
        __m512 a10 = a00, a11 = a00, a12 = a00, a13 = a00;                                      \
        __m512 a20 = a00, a21 = a00, a22 = a00, a23 = a00;                                      \
        __m512 a30 = a00, a31 = a00, a32 = a00, a33 = a00;                                      \
        /* Only the first row tile reads these weights from memory; later    \
         * ones find them in cache. */                                                         \
        bool prefetch = r % ROW_BLOCK == 0;                                                    \
        size_t esize = shoal_dtype_bytes(j->wdtype);                                           \
        const char *pf = (const char *)j->w + (size_t)NR * (size_t)j->k * esize;               \
        for (int i = 0; i < j->k; i += 16) {                                                   \
            __mmask16 m =                                                                      \
                j->k - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (j->k - i)) - 1u);     \
            __m512 v0 = _mm512_maskz_loadu_ps(m, x0 + i), v1 = _mm512_maskz_loadu_ps(m, x1 + i); \
            __m512 v2 = _mm512_maskz_loadu_ps(m, x2 + i), v3 = _mm512_maskz_loadu_ps(m, x3 + i); \
            if (prefetch) {                                                                    \
                /* the next tile's weight rows: see row_avx512 */                              \
                _mm_prefetch(pf + (w0 + i) * esize, _MM_HINT_T0);                              \
                _mm_prefetch(pf + (w1 + i) * esize, _MM_HINT_T0);                              \
                _mm_prefetch(pf + (w2 + i) * esize, _MM_HINT_T0);                              \
                _mm_prefetch(pf + (w3 + i) * esize, _MM_HINT_T0);                              \
            }                                                                                  \
            __m512 w = LOAD(j->w, w0 + (size_t)i, m);                                          \
            a00 = _mm512_fmadd_ps(v0, w, a00), a10 = _mm512_fmadd_ps(v1, w, a10);              \
            a20 = _mm512_fmadd_ps(v2, w, a20), a30 = _mm512_fmadd_ps(v3, w, a30);              \
            w = LOAD(j->w, w1 + (size_t)i, m);                                                 \
            a01 = _mm512_fmadd_ps(v0, w, a01), a11 = _mm512_fmadd_ps(v1, w, a11);              \
            a21 = _mm512_fmadd_ps(v2, w, a21), a31 = _mm512_fmadd_ps(v3, w, a31);              \
            w = LOAD(j->w, w2 + (size_t)i, m);                                                 \
            a02 = _mm512_fmadd_ps(v0, w, a02), a12 = _mm512_fmadd_ps(v1, w, a12);              \
            a22 = _mm512_fmadd_ps(v2, w, a22), a32 = _mm512_fmadd_ps(v3, w, a32);              \
            w = LOAD(j->w, w3 + (size_t)i, m);                                                 \
            a03 = _mm512_fmadd_ps(v0, w, a03), a13 = _mm512_fmadd_ps(v1, w, a13);              \
            a23 = _mm512_fmadd_ps(v2, w, a23), a33 = _mm512_fmadd_ps(v3, w, a33);              \
        }                                                                                      \
        __m512 acc[MR][NR] = {{a00, a01, a02, a03},                                            \
                              {a10, a11, a12, a13},                                            \
                              {a20, a21, a22, a23},                                            \
                              {a30, a31, a32, a33}};                                           \
        for (int a = 0; a < rn; a++)                                                           \
            for (int b = 0; b < cn; b++)                                                       \
                j->out[(size_t)(r + a) * (size_t)j->n + (size_t)(c + b)] =                     \
                    _mm512_reduce_add_ps(acc[a][b]);                                           \
    }

DEFINE_TILE(tile_bf16, load_bf16)
DEFINE_TILE(tile_f16, load_f16)
DEFINE_TILE(tile_f32, load_f32)

/* One input row: the decode case. Weight rows are read one after another,
 * so memory is read in one linear stream the prefetcher follows; the dot
 * product keeps the lane order of the 4 x 4 tile, so a row gives the same
 * bits here as inside a batch. */
enum { PREFETCH_BYTES = 1024 };

AVX512 static void row_avx512(const struct matmul_job *j, int r, int c0, int c1)
{
    const float *x = j->in + (size_t)r * (size_t)j->k;
    size_t esize = shoal_dtype_bytes(j->wdtype);
    for (int c = c0; c < c1; c++) {
        size_t wb = (size_t)c * (size_t)j->k;
        const char *row = (const char *)j->w + wb * esize;
        __m512 acc = _mm512_setzero_ps();
        for (int i = 0; i < j->k; i += 16) {
            __mmask16 m =
                j->k - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (j->k - i)) - 1u);
            _mm_prefetch(row + (size_t)i * esize + PREFETCH_BYTES, _MM_HINT_T0);
            acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + i),
                                  load_w(j->w, j->wdtype, wb + (size_t)i, m), acc);
        }
        j->out[(size_t)r * (size_t)j->n + (size_t)c] = _mm512_reduce_add_ps(acc);
    }
}

AVX512 static void block_avx512(const struct matmul_job *j, int r0, int r1, int n0, int n1)
{
    if (r1 - r0 == 1) {
        row_avx512(j, r0, n0, n1);
        return;
    }
    void (*tile)(const struct matmul_job *, int, int, int, int) =
        j->wdtype == SHOAL_DTYPE_BF16  ? tile_bf16
        : j->wdtype == SHOAL_DTYPE_F16 ? tile_f16
                                       : tile_f32;
    for (int c = n0; c < n1; c += NR)
        for (int r = r0; r < r1; r += MR)
            tile(j, r, r1 - r < MR ? r1 - r : MR, c, n1 - c < NR ? n1 - c : NR);
}

static void matmul_task_avx512(void *ctx, int task, int thread)
{
    const struct matmul_job *j = ctx;
    int rb = task / j->n_blocks, nb = task % j->n_blocks;
    int r0 = rb * ROW_BLOCK, n0 = nb * N_BLOCK;
    int r1 = r0 + ROW_BLOCK < j->rows ? r0 + ROW_BLOCK : j->rows;
    int n1 = n0 + N_BLOCK < j->n ? n0 + N_BLOCK : j->n;
    block_avx512(j, r0, r1, n0, n1);
}

static void matmul_task_portable(void *ctx, int task, int thread)
{
    const struct matmul_job *j = ctx;
    int rb = task / j->n_blocks, nb = task % j->n_blocks;
    int r0 = rb * ROW_BLOCK, n0 = nb * N_BLOCK;
    int r1 = r0 + ROW_BLOCK < j->rows ? r0 + ROW_BLOCK : j->rows;
    int n1 = n0 + N_BLOCK < j->n ? n0 + N_BLOCK : j->n;
    tile_portable(j, r0, r1, n0, n1);
}

void cpu_matmul(kernels_backend *be, void *out, shoal_dtype out_dtype, const void *in,
                const void *w, shoal_dtype wdtype, int rows, int n, int k)
{
    SHOAL_ASSERT(out_dtype == SHOAL_DTYPE_F32);
    SHOAL_ASSERT(wdtype == SHOAL_DTYPE_BF16 || wdtype == SHOAL_DTYPE_F16 ||
                 wdtype == SHOAL_DTYPE_F32);
    if (rows <= 0 || n <= 0)
        return;
    struct matmul_job j = {out, in, w, wdtype, rows, n, k, (n + N_BLOCK - 1) / N_BLOCK};
    int tasks = ((rows + ROW_BLOCK - 1) / ROW_BLOCK) * j.n_blocks;
    cpu_state *st = cpu_of(be);
    common_pool_run(st->pool, tasks, st->avx512 ? matmul_task_avx512 : matmul_task_portable, &j);
}
