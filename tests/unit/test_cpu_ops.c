/* The CPU reference ops against plain double-precision loops, at odd sizes,
 * and the properties the rest of shoal relies on: results independent of
 * the thread count, and the vector matmul equal to the portable one. */
#include "common/common_dtype.h"
#include "common/common_pool.h"
#include "common/common_rng.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/test.h"

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

static uint64_t seed = 12345;

static void fill(float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++)
        x[i] = scale * common_rng_uniform(&seed);
}

static void *make_weights(shoal_dtype dt, const float *src, size_t n)
{
    void *w = malloc(n * shoal_dtype_bytes(dt));
    for (size_t i = 0; i < n; i++) {
        if (dt == SHOAL_DTYPE_BF16)
            ((uint16_t *)w)[i] = shoal_f32_to_bf16(src[i]);
        else if (dt == SHOAL_DTYPE_F16)
            ((uint16_t *)w)[i] = shoal_f32_to_f16(src[i]);
        else
            ((float *)w)[i] = src[i];
    }
    return w;
}

static void matmul_matches_double_reference_at_odd_sizes(void)
{
    static const int sizes[][3] = {{1, 1, 1},     {1, 127, 129}, {3, 128, 128}, {5, 129, 257},
                                   {67, 65, 136}, {129, 257, 17}, {1, 300, 1000}};
    static const shoal_dtype dts[] = {SHOAL_DTYPE_BF16, SHOAL_DTYPE_F16, SHOAL_DTYPE_F32};
    kernels_backend *be[2];
    shoal_diag diag;
    CHECK(cpu_backend_open(2, &be[0], &diag) == SHOAL_OK);
    CHECK(cpu_backend_open_portable(1, &be[1], &diag) == SHOAL_OK);
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int rows = sizes[s][0], n = sizes[s][1], k = sizes[s][2];
        float *x = malloc((size_t)rows * (size_t)k * sizeof *x);
        float *wf = malloc((size_t)n * (size_t)k * sizeof *wf);
        float *out[2] = {malloc((size_t)rows * (size_t)n * sizeof(float)),
                         malloc((size_t)rows * (size_t)n * sizeof(float))};
        fill(x, (size_t)rows * (size_t)k, 1.0f);
        fill(wf, (size_t)n * (size_t)k, 0.5f);
        for (size_t d = 0; d < 3; d++) {
            void *w = make_weights(dts[d], wf, (size_t)n * (size_t)k);
            for (int b = 0; b < 2; b++)
                be[b]->matmul(be[b], out[b], SHOAL_DTYPE_F32, x, w, dts[d], rows, n, k);
            double worst = 0.0;
            for (int r = 0; r < rows; r++) {
                for (int c = 0; c < n; c++) {
                    double ref = 0.0;
                    for (int i = 0; i < k; i++)
                        ref += (double)x[(size_t)r * (size_t)k + (size_t)i] *
                               (double)shoal_load_f32(w, dts[d], (size_t)c * (size_t)k + (size_t)i);
                    for (int b = 0; b < 2; b++) {
                        double e = fabs(out[b][(size_t)r * (size_t)n + (size_t)c] - ref) /
                                   (1e-6 * sqrt((double)k) + 1e-6 * fabs(ref));
                        worst = e > worst ? e : worst;
                    }
                }
            }
            CHECK_MSG(worst <= 10.0, "%dx%dx%d %s: error %.1f units", rows, n, k,
                      shoal_dtype_name(dts[d]), worst);
            free(w);
        }
        free(x);
        free(wf);
        free(out[0]);
        free(out[1]);
    }
    kernels_backend_close(be[0]);
    kernels_backend_close(be[1]);
}

static void matmul_does_not_depend_on_thread_count(void)
{
    int rows = 70, n = 200, k = 96;
    kernels_backend *one, *two;
    CHECK(cpu_backend_open(1, &one, NULL) == SHOAL_OK);
    CHECK(cpu_backend_open(2, &two, NULL) == SHOAL_OK);
    float *x = malloc((size_t)rows * (size_t)k * 4), *wf = malloc((size_t)n * (size_t)k * 4);
    float *a = malloc((size_t)rows * (size_t)n * 4), *b = malloc((size_t)rows * (size_t)n * 4);
    fill(x, (size_t)rows * (size_t)k, 1.0f);
    fill(wf, (size_t)n * (size_t)k, 1.0f);
    void *w = make_weights(SHOAL_DTYPE_BF16, wf, (size_t)n * (size_t)k);
    one->matmul(one, a, SHOAL_DTYPE_F32, x, w, SHOAL_DTYPE_BF16, rows, n, k);
    two->matmul(two, b, SHOAL_DTYPE_F32, x, w, SHOAL_DTYPE_BF16, rows, n, k);
    CHECK(memcmp(a, b, (size_t)rows * (size_t)n * 4) == 0);
    /* one row alone gives the same bits as inside a batch */
    two->matmul(two, b, SHOAL_DTYPE_F32, x + 5 * k, w, SHOAL_DTYPE_BF16, 1, n, k);
    CHECK(memcmp(a + 5 * n, b, (size_t)n * 4) == 0);
    free(x), free(wf), free(a), free(b), free(w);
    kernels_backend_close(one);
    kernels_backend_close(two);
}

/* Attention over shuffled pages against dense softmax attention in double. */
static void paged_attention_matches_dense_reference(void)
{
    enum { HEADS = 6, KVH = 2, HD = 40, PT = 16, LAYERS = 2, LAYER = 1 };
    static const int ctx_lens[] = {1, 15, 16, 17, 129};
    kernels_backend *be;
    CHECK(cpu_backend_open(2, &be, NULL) == SHOAL_OK);
    kernels_kv_layout L;
    kernels_kv_layout_init(&L, LAYERS, KVH, HD, PT, SHOAL_DTYPE_BF16);
    for (size_t c = 0; c < sizeof ctx_lens / sizeof ctx_lens[0]; c++) {
        int n = ctx_lens[c];
        int pages = (n + PT - 1) / PT;
        unsigned char *arena = calloc((size_t)pages, L.page_bytes);
        int32_t *table = malloc((size_t)pages * 4), *pos = malloc((size_t)n * 4);
        int32_t *stream = calloc((size_t)n, 4);
        for (int p = 0; p < pages; p++)
            table[p] = (p * 7 + 3) % pages; /* a permutation for pages <= 9 */
        for (int i = 0; i < n; i++)
            pos[i] = i;
        float *k = malloc((size_t)n * KVH * HD * 4), *v = malloc((size_t)n * KVH * HD * 4);
        float *q = malloc((size_t)n * HEADS * HD * 4), *o = malloc((size_t)n * HEADS * HD * 4);
        fill(k, (size_t)n * KVH * HD, 2.0f);
        fill(v, (size_t)n * KVH * HD, 1.0f);
        fill(q, (size_t)n * HEADS * HD, 2.0f);
        kernels_batch B = {n, 1, pages, stream, pos, table, false};
        be->kv_write(be, arena, &L, &B, LAYER, k, v);
        float scale = 1.0f / sqrtf((float)HD);
        be->attention(be, o, q, HEADS, arena, &L, &B, LAYER, scale);
        double worst = 0.0;
        for (int r = 0; r < n; r++) {
            for (int h = 0; h < HEADS; h++) {
                int kh = h / (HEADS / KVH);
                double s[256], mx = -1e300, sum = 0.0;
                for (int t = 0; t <= r; t++) {
                    double d = 0.0;
                    for (int i = 0; i < HD; i++)
                        d += (double)q[((size_t)r * HEADS + (size_t)h) * HD + (size_t)i] *
                             (double)shoal_bf16_to_f32(shoal_f32_to_bf16(
                                 k[((size_t)t * KVH + (size_t)kh) * HD + (size_t)i]));
                    s[t] = d * scale;
                    mx = s[t] > mx ? s[t] : mx;
                }
                for (int t = 0; t <= r; t++)
                    sum += (s[t] = exp(s[t] - mx));
                for (int i = 0; i < HD; i++) {
                    double ref = 0.0;
                    for (int t = 0; t <= r; t++)
                        ref += s[t] / sum *
                               (double)shoal_bf16_to_f32(shoal_f32_to_bf16(
                                   v[((size_t)t * KVH + (size_t)kh) * HD + (size_t)i]));
                    double e = fabs(o[((size_t)r * HEADS + (size_t)h) * HD + (size_t)i] - ref);
                    worst = e > worst ? e : worst;
                }
            }
        }
        CHECK_MSG(worst < 1e-5, "context %d: error %.2e", n, worst);
        free(arena), free(table), free(pos), free(stream), free(k), free(v), free(q), free(o);
    }
    kernels_backend_close(be);
}

/* qk_norm_rope_kv_write on the rows of one joined [q | k | v] buffer
 * (stride) equals the op on packed q, k and v, bit for bit: q (into its
 * own buffer), k, and every byte of the pages; at 1 and 5 rows, bf16 and
 * fp8 pages. The contract's composition itself (qk_norm_rope twice, then
 * kv_write) is held to the CUDA kernels in test_cuda_ops. */
static void qk_norm_rope_kv_write_takes_joined_rows(void)
{
    enum { HEADS = 6, KVH = 2, HD = 40, PT = 16, LAYERS = 2, LAYER = 1 };
    enum { QW = HEADS * HD, KW = KVH * HD, W = QW + 2 * KW };
    static const int rowss[] = {1, 5};
    static const shoal_dtype kvdt[] = {SHOAL_DTYPE_BF16, SHOAL_DTYPE_F8_E4M3};
    kernels_backend *be;
    CHECK(cpu_backend_open(2, &be, NULL) == SHOAL_OK);
    float qn[HD], kn[HD], inv[HD / 2], scales[2 * LAYERS * KVH];
    fill(qn, HD, 1.0f);
    fill(kn, HD, 1.0f);
    for (int i = 0; i < HD / 2; i++)
        inv[i] = powf(10000.0f, -2.0f * (float)i / (float)HD);
    for (int i = 0; i < 2 * LAYERS * KVH; i++)
        scales[i] = 0.5f + (float)i * 0.25f;
    for (int ri = 0; ri < 2; ri++)
        for (int d = 0; d < 2; d++) {
            int rows = rowss[ri];
            kernels_kv_layout L;
            kernels_kv_layout_init(&L, LAYERS, KVH, HD, PT, kvdt[d]);
            if (kvdt[d] == SHOAL_DTYPE_F8_E4M3) {
                L.k_scale = scales;
                L.v_scale = scales + LAYERS * KVH;
            }
            int32_t table[2] = {1, 0}, stream[5] = {0}, pos[5];
            for (int r = 0; r < rows; r++)
                pos[r] = 11 + r; /* across the first page's end */
            kernels_batch B = {rows, 1, 2, stream, pos, table, false};
            float *q = malloc((size_t)rows * QW * 4), *k = malloc((size_t)rows * KW * 4);
            float *v = malloc((size_t)rows * KW * 4), *j = malloc((size_t)rows * W * 4);
            float *jq = malloc((size_t)rows * QW * 4);
            fill(q, (size_t)rows * QW, 2.0f);
            fill(k, (size_t)rows * KW, 2.0f);
            fill(v, (size_t)rows * KW, 2.0f);
            for (int r = 0; r < rows; r++) {
                memcpy(j + (size_t)r * W, q + (size_t)r * QW, QW * 4);
                memcpy(j + (size_t)r * W + QW, k + (size_t)r * KW, KW * 4);
                memcpy(j + (size_t)r * W + QW + KW, v + (size_t)r * KW, KW * 4);
            }
            unsigned char *pa = calloc(2, L.page_bytes), *ja = calloc(2, L.page_bytes);
            be->qk_norm_rope_kv_write(be, q, q, k, v, 0, HEADS, qn, kn, 1e-6f, inv, pa, &L, &B,
                                      LAYER);
            be->qk_norm_rope_kv_write(be, jq, j, j + QW, j + QW + KW, W, HEADS, qn, kn, 1e-6f,
                                      inv, ja, &L, &B, LAYER);
            CHECK_MSG(memcmp(q, jq, (size_t)rows * QW * 4) == 0, "rows %d %s: q differs", rows,
                      shoal_dtype_name(kvdt[d]));
            for (int r = 0; r < rows; r++)
                CHECK_MSG(memcmp(k + (size_t)r * KW, j + (size_t)r * W + QW, KW * 4) == 0,
                          "rows %d %s: k of row %d differs", rows, shoal_dtype_name(kvdt[d]),
                          r);
            CHECK_MSG(memcmp(pa, ja, 2 * L.page_bytes) == 0, "rows %d %s: the pages differ",
                      rows, shoal_dtype_name(kvdt[d]));
            /* and the op did something: q changed, the slots were written */
            CHECK(memcmp(q, j, QW * 4) != 0);
            size_t nonzero = 0;
            for (size_t i = 0; i < 2 * L.page_bytes; i++)
                nonzero += pa[i] != 0;
            CHECK(nonzero > 0);
            free(q), free(k), free(v), free(j), free(jq), free(pa), free(ja);
        }
    kernels_backend_close(be);
}

static atomic_int seen[1000];

static void count_task(void *ctx, int task, int thread)
{
    atomic_fetch_add(&seen[task], 1);
}

static void pool_runs_every_task_exactly_once(void)
{
    common_pool *pool;
    CHECK(common_pool_open(3, &pool) == SHOAL_OK);
    for (int round = 0; round < 200; round++) {
        int tasks = 1 + round * 5 % 997;
        for (int i = 0; i < tasks; i++)
            atomic_store(&seen[i], 0);
        common_pool_run(pool, tasks, count_task, NULL);
        for (int i = 0; i < tasks; i++)
            CHECK(atomic_load(&seen[i]) == 1);
    }
    common_pool_close(pool);
    common_pool_close(NULL);
}

static void half_precision_conversions_round_to_nearest_even(void)
{
    CHECK(shoal_f32_to_bf16(1.0f) == 0x3f80);
    CHECK(shoal_f32_to_bf16(1.00390625f) == 0x3f80); /* halfway: to even */
    CHECK(shoal_f32_to_bf16(1.01171875f) == 0x3f82); /* halfway: to even, upward */
    CHECK(shoal_bf16_to_f32(0xc040) == -3.0f);
    CHECK(isnan(shoal_bf16_to_f32(shoal_f32_to_bf16(NAN))));
    CHECK(shoal_f32_to_f16(1.0f) == 0x3c00);
    CHECK(shoal_f32_to_f16(65504.0f) == 0x7bff);
    CHECK(shoal_f32_to_f16(65520.0f) == 0x7c00); /* rounds to infinity */
    CHECK(shoal_f32_to_f16(5.9604645e-8f) == 0x0001); /* smallest subnormal */
    CHECK(shoal_f32_to_f16(2.98e-8f) == 0x0000);
    CHECK(shoal_f16_to_f32(0x0001) == 5.9604645e-8f);
    CHECK(shoal_f16_to_f32(0xfc00) == -INFINITY);
    /* every finite f16 survives the round trip */
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00)
            continue;
        bad += shoal_f32_to_f16(shoal_f16_to_f32((uint16_t)h)) != h;
    }
    CHECK_EQ_INT(bad, 0);
}

int main(void)
{
    TEST_RUN(matmul_matches_double_reference_at_odd_sizes);
    TEST_RUN(matmul_does_not_depend_on_thread_count);
    TEST_RUN(paged_attention_matches_dense_reference);
    TEST_RUN(qk_norm_rope_kv_write_takes_joined_rows);
    TEST_RUN(pool_runs_every_task_exactly_once);
    TEST_RUN(half_precision_conversions_round_to_nearest_even);
    return TEST_EXIT();
}
