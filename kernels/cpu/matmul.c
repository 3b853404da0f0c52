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

AVX512 static inline __m512 load_w(const void *w, shoal_dtype dt, size_t i, __mmask16 m)
{
    if (dt == SHOAL_DTYPE_BF16) {
        __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)w + i);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    if (dt == SHOAL_DTYPE_F16)
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)w + i));
    return _mm512_maskz_loadu_ps(m, (const float *)w + i);
}

/* MR input rows x NR weight rows starting at (r, c); rows and columns past
 * the edge repeat the last valid one and are not stored. */
AVX512 static void tile_avx512(const struct matmul_job *j, int r, int rn, int c, int cn)
{
    __m512 acc[MR][NR];
    const float *x[MR];
    size_t wb[NR];
    for (int a = 0; a < MR; a++) {
        x[a] = j->in + (size_t)(r + (a < rn ? a : rn - 1)) * (size_t)j->k;
        for (int b = 0; b < NR; b++)
            acc[a][b] = _mm512_setzero_ps();
    }
    for (int b = 0; b < NR; b++)
        wb[b] = (size_t)(c + (b < cn ? b : cn - 1)) * (size_t)j->k;
    for (int i = 0; i < j->k; i += 16) {
        __mmask16 m = j->k - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (j->k - i)) - 1u);
        __m512 xv[MR];
        for (int a = 0; a < MR; a++)
            xv[a] = _mm512_maskz_loadu_ps(m, x[a] + i);
        for (int b = 0; b < NR; b++) {
            __m512 wv = load_w(j->w, j->wdtype, wb[b] + (size_t)i, m);
            for (int a = 0; a < MR; a++)
                acc[a][b] = _mm512_fmadd_ps(xv[a], wv, acc[a][b]);
        }
    }
    for (int a = 0; a < rn; a++)
        for (int b = 0; b < cn; b++)
            j->out[(size_t)(r + a) * (size_t)j->n + (size_t)(c + b)] =
                _mm512_reduce_add_ps(acc[a][b]);
}

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
    for (int c = n0; c < n1; c += NR)
        for (int r = r0; r < r1; r += MR)
            tile_avx512(j, r, r1 - r < MR ? r1 - r : MR, c, n1 - c < NR ? n1 - c : NR);
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
