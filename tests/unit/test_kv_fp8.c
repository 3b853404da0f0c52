/* fp8 e4m3 KV on the CPU reference: the encoder against the format's
 * definition (every code, ties to even, saturation, subnormals), and
 * kv_write + attention over fp8 pages with per-layer, per-head scales
 * against the same over bf16 pages. */
#include "common/common_rng.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/kernels_fp8.h"
#include "tests/test.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

static void every_code_decodes_and_encodes_back_to_itself(void)
{
    for (int c = 0; c < 256; c++) {
        if ((c & 0x7f) == 0x7f) {
            CHECK(isnan(kernels_e4m3_to_f32((uint8_t)c)));
            continue;
        }
        float f = kernels_e4m3_to_f32((uint8_t)c);
        CHECK_MSG(kernels_f32_to_e4m3(f) == c, "code 0x%02x -> %g -> 0x%02x", c, f,
                  kernels_f32_to_e4m3(f));
    }
    CHECK(kernels_e4m3_to_f32(0x7e) == 448.0f);
    CHECK(kernels_e4m3_to_f32(0x01) == 0x1p-9f);
    CHECK(kernels_e4m3_to_f32(0x08) == 0x1p-6f);
}

static void encoding_rounds_to_nearest_even_and_saturates(void)
{
    CHECK_EQ_INT(kernels_f32_to_e4m3(1.0625f), 0x38);    /* 1 + 1/16: tie, to 1.0 */
    CHECK_EQ_INT(kernels_f32_to_e4m3(1.1875f), 0x3a);    /* 1.125 + 1/16: tie, to 1.25 */
    CHECK_EQ_INT(kernels_f32_to_e4m3(1.07f), 0x39);      /* past the tie: 1.125 */
    CHECK_EQ_INT(kernels_f32_to_e4m3(0x1p-10f), 0x00);   /* tie between 0 and 2^-9 */
    CHECK_EQ_INT(kernels_f32_to_e4m3(0x3p-10f), 0x02);   /* tie between 2^-9 and 2^-8 */
    CHECK_EQ_INT(kernels_f32_to_e4m3(0x1.ep-7f), 0x08);  /* rounds up into the normals */
    CHECK_EQ_INT(kernels_f32_to_e4m3(460.0f), 0x7e);
    CHECK_EQ_INT(kernels_f32_to_e4m3(1e9f), 0x7e);
    CHECK_EQ_INT(kernels_f32_to_e4m3(-INFINITY), 0xfe);
    CHECK_EQ_INT(kernels_f32_to_e4m3(NAN), 0x7f);
    CHECK_EQ_INT(kernels_f32_to_e4m3(-0.0f), 0x80);
    /* nearest: no code is closer than the one chosen */
    uint64_t seed = 7;
    for (int i = 0; i < 100000; i++) {
        float x = ldexpf(common_rng_uniform(&seed), (int)(common_rng_next(&seed) % 24) - 12);
        float y = kernels_e4m3_to_f32(kernels_f32_to_e4m3(x));
        float best = INFINITY;
        for (int c = 0; c < 256; c++)
            if ((c & 0x7f) != 0x7f)
                best = fminf(best, fabsf(kernels_e4m3_to_f32((uint8_t)c) - x));
        if (fabsf(y - x) != best) {
            CHECK_MSG(0, "%a encodes to %a, but a code is %a away", x, y, best);
            break;
        }
    }
}

/* kv_write then attention over one stream of `rows` prompt rows, in pages
 * given in reverse order, with KV of kv_dtype; out is [rows][heads * hd]. */
static void run_attention(kernels_backend *be, shoal_dtype kv_dtype, const float *scales,
                          const float *q, const float *k, const float *v, int rows, int heads,
                          int kv_heads, int hd, int layers, float *out)
{
    int pt = 16, pages = (rows + pt - 1) / pt;
    kernels_kv_layout L;
    kernels_kv_layout_init(&L, layers, kv_heads, hd, pt, kv_dtype);
    L.k_scale = scales;
    L.v_scale = scales ? scales + layers * kv_heads : NULL;
    void *arena = be->alloc(be, (size_t)pages * L.page_bytes);
    int32_t *table = malloc((size_t)pages * sizeof *table);
    int32_t *pos = malloc((size_t)rows * sizeof *pos);
    int32_t *stream = calloc((size_t)rows, sizeof *stream);
    for (int p = 0; p < pages; p++)
        table[p] = pages - 1 - p;
    for (int r = 0; r < rows; r++)
        pos[r] = r;
    kernels_batch B = {rows, 1, pages, stream, pos, table, false};
    int layer = layers - 1;
    be->kv_write(be, arena, &L, &B, layer, k, v);
    be->attention(be, out, q, heads, arena, &L, &B, layer, 1.0f / sqrtf((float)hd));
    be->free(be, arena);
    free(table);
    free(pos);
    free(stream);
}

static void fp8_pages_with_scales_attend_like_bf16_pages(void)
{
    kernels_backend *be;
    shoal_diag diag;
    if (cpu_backend_open(2, &be, &diag)) {
        CHECK_MSG(0, "%s", diag.msg);
        return;
    }
    enum { ROWS = 129, HEADS = 6, KVH = 2, HD = 32, LAYERS = 2 };
    size_t qn = (size_t)ROWS * HEADS * HD, kn = (size_t)ROWS * KVH * HD;
    float *q = malloc(qn * 4), *k = malloc(kn * 4), *v = malloc(kn * 4);
    float *o16 = malloc(qn * 4), *o8 = malloc(qn * 4), *o8s = malloc(qn * 4);
    uint64_t seed = 11;
    /* KV head 0 holds small values (0.01, deep in e4m3's subnormals at
     * scale 1), KV head 1 values of a few units, as real layers can */
    static const float mag[KVH] = {0.01f, 4.0f};
    for (size_t i = 0; i < qn; i++)
        q[i] = common_rng_uniform(&seed);
    for (size_t i = 0; i < kn; i++) {
        float m = mag[(i / HD) % KVH];
        k[i] = m * common_rng_uniform(&seed);
        v[i] = m * common_rng_uniform(&seed);
    }
    float scales[2 * LAYERS * KVH]; /* K then V, [layer][kv head]: max maps to 224 */
    for (int i = 0; i < 2 * LAYERS * KVH; i++)
        scales[i] = mag[i % KVH] / 224.0f;
    run_attention(be, SHOAL_DTYPE_BF16, NULL, q, k, v, ROWS, HEADS, KVH, HD, LAYERS, o16);
    run_attention(be, SHOAL_DTYPE_F8_E4M3, NULL, q, k, v, ROWS, HEADS, KVH, HD, LAYERS, o8);
    run_attention(be, SHOAL_DTYPE_F8_E4M3, scales, q, k, v, ROWS, HEADS, KVH, HD, LAYERS, o8s);
    for (int kvh = 0; kvh < KVH; kvh++) {
        double num = 0, nums = 0, den = 0;
        for (size_t i = 0; i < qn; i++) {
            int h = (int)(i / HD) % HEADS;
            if (h / (HEADS / KVH) != kvh)
                continue;
            num += (double)(o8[i] - o16[i]) * (o8[i] - o16[i]);
            nums += (double)(o8s[i] - o16[i]) * (o8s[i] - o16[i]);
            den += (double)o16[i] * o16[i];
        }
        double err = sqrt(num / den), errs = sqrt(nums / den);
        printf("  fp8 vs bf16 KV, values ~%g: relative error %.2e at scale 1, %.2e scaled\n",
               mag[kvh], err, errs);
        /* e4m3 keeps 3 mantissa bits: an rms relative error of about
         * 2^-3 / sqrt(12) = 3.6% per element, which the output keeps */
        CHECK_MSG(errs < 0.05, "KV head %d scaled: %.3e", kvh, errs);
        if (kvh == 0) /* the scale lifts small values out of the subnormals */
            CHECK_MSG(err > 2 * errs, "KV head 0: %.3e at scale 1, %.3e scaled", err, errs);
        else
            CHECK_MSG(err < 0.05, "KV head 1 at scale 1: %.3e", err);
    }
    free(q);
    free(k);
    free(v);
    free(o16);
    free(o8);
    free(o8s);
    kernels_backend_close(be);
}

int main(void)
{
    TEST_RUN(every_code_decodes_and_encodes_back_to_itself);
    TEST_RUN(encoding_rounds_to_nearest_even_and_saturates);
    TEST_RUN(fp8_pages_with_scales_attend_like_bf16_pages);
    return TEST_EXIT();
}
