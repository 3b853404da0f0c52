/* attention_o on the GPU: one decode row's rope, KV write, attention and
 * o projection as one op (clusters of a KV head, kernels/cuda/attention.cu),
 * at the 8B shape and the dummy model's, for contexts from one token (one
 * segment, fifteen blocks with none) to past 4k, ends anywhere in a page
 * and a 32-token stage:
 *   - the sum of its parts equals the CPU's attention_rope_kv then matmul
 *     within the bf16 tolerance, and the GPU's two ops too;
 *   - the pages it leaves equal those of the GPU's attention_rope_kv, byte
 *     for byte (the new row's k and v; every other byte untouched);
 *   - rmsnorm_parts equals rmsnorm with the parts' sum as its residual:
 *     x bit for bit, the output within a rounding;
 *   - a round of two rows is declined, leaving the parts as they were;
 *   - a planted fault (the merge leaves out its last segment) is red.
 * Every arena byte no token wrote is NaN, so a stale page tail that reaches
 * a result is red too. */
#include "tests/cuda/cuda_test.h"

static kernels_backend *cpu, *gpu;
static int cases_run, faults_seen;

typedef struct shape {
    int heads, kv_heads, n; /* head dim 128; n = o's rows (the hidden size) */
} shape;

enum { HD = 128, PT = 16, LAYERS = 2, LAYER = 1 };

static void run_case(shape sh, int ctx)
{
    const int pos = ctx - 1, pages = (ctx + PT - 1) / PT + 1;
    const int q_w = sh.heads * HD, kv_w = sh.kv_heads * HD, stride = q_w + 2 * kv_w;
    kernels_kv_layout L;
    kernels_kv_layout_init(&L, LAYERS, sh.kv_heads, HD, PT, SHOAL_DTYPE_BF16);
    const size_t arena_bytes = (size_t)pages * L.page_bytes;

    int32_t *table = xmalloc((size_t)pages * 4);
    for (int p = 0; p < pages; p++)
        table[p] = p;
    for (int p = pages - 1; p > 0; p--) {
        int j = (int)rnd_below((uint32_t)p + 1), t = table[p];
        table[p] = table[j];
        table[j] = t;
    }
    /* the context before the row, written by the CPU twin; NaN elsewhere */
    unsigned char *arena = xmalloc(arena_bytes);
    memset(arena, 0xff, arena_bytes);
    if (pos > 0) {
        float *k = xmalloc((size_t)pos * kv_w * 4), *v = xmalloc((size_t)pos * kv_w * 4);
        int32_t *zs = xmalloc((size_t)pos * 4), *ps = xmalloc((size_t)pos * 4);
        fill_uniform(k, (size_t)pos * kv_w, 2.0f, SHOAL_DTYPE_BF16);
        fill_uniform(v, (size_t)pos * kv_w, 2.0f, SHOAL_DTYPE_BF16);
        for (int t = 0; t < pos; t++) {
            zs[t] = 0;
            ps[t] = t;
        }
        kernels_batch kb = {pos, 1, pages, zs, ps, table, false};
        cpu->kv_write(cpu, arena, &L, &kb, LAYER, k, v);
        free(k);
        free(v);
        free(zs);
        free(ps);
    }
    /* the row's q, k and v side by side, as the joined GEMV writes them */
    float *qkv = xmalloc((size_t)stride * 4), *norms = xmalloc(2 * HD * 4);
    float *inv = xmalloc(HD / 2 * 4);
    fill_uniform(qkv, (size_t)stride, 2.0f, SHOAL_DTYPE_BF16);
    for (int i = 0; i < 2 * HD; i++)
        norms[i] = 0.5f + rnd_uniform();
    for (int i = 0; i < HD / 2; i++)
        inv[i] = powf(1e6f, -2.0f * (float)i / HD);
    const size_t wn = (size_t)sh.n * q_w;
    float *w = xmalloc(wn * 4);
    fill_uniform(w, wn, 1.0f / sqrtf((float)q_w), SHOAL_DTYPE_BF16);
    const float scale = 1.0f / sqrtf((float)HD), eps = 1e-6f;
    int32_t zero = 0;

    /* the CPU: attention_rope_kv, then the o matmul */
    unsigned char *carena = xmalloc(arena_bytes);
    memcpy(carena, arena, arena_bytes);
    float *cq = xmalloc((size_t)stride * 4), *cq_out = xmalloc((size_t)q_w * 4);
    float *catt = xmalloc((size_t)q_w * 4), *ref = xmalloc((size_t)sh.n * 4);
    memcpy(cq, qkv, (size_t)stride * 4);
    kernels_batch cb = {1, 1, pages, &zero, &pos, table, true};
    cpu->attention_rope_kv(cpu, catt, cq_out, cq, cq + q_w, cq + q_w + kv_w, stride, sh.heads,
                           norms, norms + HD, eps, inv, carena, &L, &cb, LAYER, scale);
    void *cw = dev_from_f32(cpu, w, wn, SHOAL_DTYPE_BF16);
    for (int i = 0; i < q_w; i++) /* the GPU's attention output is bf16 */
        catt[i] = round_to(catt[i], SHOAL_DTYPE_BF16);
    cpu->matmul(cpu, ref, SHOAL_DTYPE_F32, catt, cw, SHOAL_DTYPE_BF16, 1, sh.n, q_w);

    /* the GPU, both ways, on copies of the same arena */
    void *dqkv = dev_from_f32(gpu, qkv, (size_t)stride, SHOAL_DTYPE_BF16);
    void *dnorms = dev_from_f32(gpu, norms, 2 * HD, SHOAL_DTYPE_F32);
    void *dinv = dev_from_f32(gpu, inv, HD / 2, SHOAL_DTYPE_F32);
    void *dw = dev_from_f32(gpu, w, wn, SHOAL_DTYPE_BF16);
    void *dtable = dev_copy(gpu, table, (size_t)pages * 4);
    void *dzero = dev_copy(gpu, &zero, 4), *dpos = dev_copy(gpu, &pos, 4);
    void *darena = dev_copy(gpu, arena, arena_bytes), *darena2 = dev_copy(gpu, arena, arena_bytes);
    const size_t parts_n = (size_t)sh.kv_heads * sh.n;
    float *dparts = dev_alloc(gpu, parts_n * 4);
    void *dq_out = dev_alloc(gpu, (size_t)q_w * 2), *datt = dev_alloc(gpu, (size_t)q_w * 2);
    void *dout = dev_alloc(gpu, (size_t)sh.n * 2);
    unsigned char *dk = (unsigned char *)dqkv + (size_t)q_w * 2, *dv = dk + (size_t)kv_w * 2;
    kernels_batch gb = {1, 1, pages, dzero, dpos, dtable, true};

    /* a round of two rows is not taken, and nothing is written */
    kernels_batch two = gb;
    two.rows = 2;
    dev_poison(gpu, dparts, parts_n * 4);
    bool taken2 = gpu->attention_o(gpu, dparts, dqkv, dk, dv, stride, sh.heads, dnorms,
                                   (float *)dnorms + HD, eps, dinv, darena, &L, &two, LAYER,
                                   scale, dw, SHOAL_DTYPE_BF16, sh.n);
    CHECK_MSG(!taken2, "a round of two rows was taken");
    float *parts = xmalloc(parts_n * 4), *got = xmalloc((size_t)sh.n * 4);
    f32_from_dev(gpu, parts, dparts, parts_n, SHOAL_DTYPE_F32);
    size_t written = 0;
    for (size_t i = 0; i < parts_n; i++)
        written += !isnan(parts[i]);
    CHECK_MSG(written == 0, "a declined round wrote %zu parts", written);

    bool taken = gpu->attention_o(gpu, dparts, dqkv, dk, dv, stride, sh.heads, dnorms,
                                  (float *)dnorms + HD, eps, dinv, darena, &L, &gb, LAYER, scale,
                                  dw, SHOAL_DTYPE_BF16, sh.n);
    CHECK_MSG(taken, "n %d, context %d: not taken", sh.n, ctx);
    f32_from_dev(gpu, parts, dparts, parts_n, SHOAL_DTYPE_F32);
    for (int r = 0; r < sh.n; r++) {
        float s = 0.0f;
        for (int p = 0; p < sh.kv_heads; p++)
            s += parts[(size_t)p * sh.n + r];
        got[r] = s;
    }

    gpu->attention_rope_kv(gpu, datt, dq_out, dqkv, dk, dv, stride, sh.heads, dnorms,
                           (float *)dnorms + HD, eps, dinv, darena2, &L, &gb, LAYER, scale);
    gpu->matmul(gpu, dout, SHOAL_DTYPE_BF16, datt, dw, SHOAL_DTYPE_BF16, 1, sh.n, q_w);
    float *two_ops = xmalloc((size_t)sh.n * 4);
    f32_from_dev(gpu, two_ops, dout, (size_t)sh.n, SHOAL_DTYPE_BF16);
    unsigned char *pages_fused = xmalloc(arena_bytes), *pages_ops = xmalloc(arena_bytes);
    CHECK(gpu->download(gpu, pages_fused, darena, arena_bytes) == SHOAL_OK);
    CHECK(gpu->download(gpu, pages_ops, darena2, arena_bytes) == SHOAL_OK);
    size_t pages_differ = 0;
    for (size_t i = 0; i < arena_bytes; i++)
        pages_differ += pages_fused[i] != pages_ops[i];

    /* rmsnorm_parts against rmsnorm of the parts' sum, rounded as stored */
    float *x = xmalloc((size_t)sh.n * 4), *res = xmalloc((size_t)sh.n * 4);
    fill_uniform(x, (size_t)sh.n, 4.0f, SHOAL_DTYPE_BF16);
    for (int r = 0; r < sh.n; r++)
        res[r] = round_to(got[r], SHOAL_DTYPE_BF16);
    void *dx1 = dev_from_f32(gpu, x, (size_t)sh.n, SHOAL_DTYPE_BF16);
    void *dx2 = dev_from_f32(gpu, x, (size_t)sh.n, SHOAL_DTYPE_BF16);
    void *dres = dev_from_f32(gpu, res, (size_t)sh.n, SHOAL_DTYPE_BF16);
    void *dh1 = dev_alloc(gpu, (size_t)sh.n * 2), *dh2 = dev_alloc(gpu, (size_t)sh.n * 2);
    float *nweight = xmalloc((size_t)sh.n * 4);
    for (int i = 0; i < sh.n; i++)
        nweight[i] = 0.5f + rnd_uniform();
    void *dnw = dev_from_f32(gpu, nweight, (size_t)sh.n, SHOAL_DTYPE_F32);
    gpu->rmsnorm_parts(gpu, dh1, dx1, dparts, sh.kv_heads, dnw, 1, sh.n, eps);
    gpu->rmsnorm(gpu, dh2, dx2, dres, dnw, 1, sh.n, eps);
    float *h1 = xmalloc((size_t)sh.n * 4), *h2 = xmalloc((size_t)sh.n * 4);
    float *x1 = xmalloc((size_t)sh.n * 4), *x2 = xmalloc((size_t)sh.n * 4);
    f32_from_dev(gpu, h1, dh1, (size_t)sh.n, SHOAL_DTYPE_BF16);
    f32_from_dev(gpu, h2, dh2, (size_t)sh.n, SHOAL_DTYPE_BF16);
    f32_from_dev(gpu, x1, dx1, (size_t)sh.n, SHOAL_DTYPE_BF16);
    f32_from_dev(gpu, x2, dx2, (size_t)sh.n, SHOAL_DTYPE_BF16);
    /* x to the bit; the norm within a rounding (its sum of squares is
     * added in another order) */
    size_t norm_differ = count_differing(x1, x2, (size_t)sh.n);
    double norm_err = rel_err(h1, h2, (size_t)sh.n);

    /* the planted fault: the merge leaves out the last segment */
    cuda_backend_set_attention_o_fault(gpu, 1);
    CHECK(gpu->upload(gpu, darena, arena, arena_bytes) == SHOAL_OK);
    gpu->attention_o(gpu, dparts, dqkv, dk, dv, stride, sh.heads, dnorms, (float *)dnorms + HD,
                     eps, dinv, darena, &L, &gb, LAYER, scale, dw, SHOAL_DTYPE_BF16, sh.n);
    cuda_backend_set_attention_o_fault(gpu, 0);
    float *faulty = xmalloc((size_t)sh.n * 4);
    f32_from_dev(gpu, parts, dparts, parts_n, SHOAL_DTYPE_F32);
    for (int r = 0; r < sh.n; r++) {
        float s = 0.0f;
        for (int p = 0; p < sh.kv_heads; p++)
            s += parts[(size_t)p * sh.n + r];
        faulty[r] = s;
    }

    const double tol = tol_for(SHOAL_DTYPE_BF16);
    double err = rel_err(got, ref, (size_t)sh.n), err_ops = rel_err(got, two_ops, (size_t)sh.n);
    double err_fault = rel_err(faulty, ref, (size_t)sh.n);
    printf("  n %d, %d heads, context %5d: error %.2e, against the two ops %.2e, pages differ "
           "%zu, x differs %zu, norm %.1e, planted fault %.2e%s\n",
           sh.n, sh.heads, ctx, err, err_ops, pages_differ, norm_differ, norm_err, err_fault,
           err_fault > tol ? " (red)" : " (UNSEEN)");
    CHECK_MSG(err <= tol, "context %d: error %.3e over %.1e", ctx, err, tol);
    CHECK_MSG(err_ops <= tol, "context %d: against the two ops %.3e over %.1e", ctx, err_ops,
              tol);
    CHECK_MSG(pages_differ == 0, "context %d: %zu page bytes differ", ctx, pages_differ);
    CHECK_MSG(norm_differ == 0, "context %d: rmsnorm_parts: %zu elements of x differ", ctx,
              norm_differ);
    CHECK_MSG(norm_err <= 2e-3, "context %d: rmsnorm_parts: error %.3e over 2e-3", ctx,
              norm_err);
    CHECK_MSG(err_fault > tol, "context %d: the planted fault went unseen", ctx);
    cases_run++;
    faults_seen += err_fault > tol;

    void *dev[] = {dqkv, dnorms, dinv, dw, dtable, dzero, dpos, darena, darena2, dparts,
                   dq_out, datt, dout, dx1, dx2, dres, dh1, dh2, dnw};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        gpu->free(gpu, dev[i]);
    cpu->free(cpu, cw);
    void *host[] = {table, arena, qkv, norms, inv, w, carena, cq, cq_out, catt, ref, parts,
                    got, two_ops, pages_fused, pages_ops, x, res, nweight, h1, h2, x1, x2,
                    faulty};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
        free(host[i]);
}

/* The 8B shape (32 heads, 8 KV heads, hidden 4,096) and the dummy model's
 * (8 and 2, 512): one token, a stage's edges, a page's, segments of one
 * stage and of several, 4k and past it. */
static void parts_match_the_two_ops(void)
{
    static const shape shapes[] = {{32, 8, 4096}, {8, 2, 512}};
    static const int ctxs[] = {1, 2, 16, 17, 31, 32, 33, 100, 513, 1000, 4096, 5003};
    static const int small[] = {1, 33, 300};
    const int *c = test_sanitize ? small : ctxs;
    int nc = test_sanitize ? 3 : (int)(sizeof ctxs / sizeof ctxs[0]);
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < nc; i++)
            run_case(shapes[s], c[i]);
}

int main(int argc, char **argv)
{
    cuda_test_start("test_cuda_attention_o", argc, argv);
    cpu = open_backend("cpu", SHOAL_DTYPE_INVALID);
    gpu = open_backend(test_gpu, SHOAL_DTYPE_BF16);
    if (!gpu->attention_o || gpu->act_dtype != SHOAL_DTYPE_BF16) {
        printf("SKIP: this backend has no attention_o (a dry run: the CPU's)\n");
        kernels_backend_close(gpu);
        kernels_backend_close(cpu);
        return 77;
    }
    TEST_RUN(parts_match_the_two_ops);
    CHECK(gpu->sync(gpu) == SHOAL_OK);
    printf("%d cases; planted faults seen %d of %d\n", cases_run, faults_seen, cases_run);
    kernels_backend_close(gpu);
    kernels_backend_close(cpu);
    return TEST_EXIT();
}
