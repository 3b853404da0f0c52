/* The mixture-of-experts ops on the GPU against their CPU twins: routing
 * (ids exactly, weights to float rounding) and the experts at the edges: one
 * token, every token to one expert, experts that no token routes to (their
 * weights NaN on the GPU, so reading them shows), top-k of every expert, odd
 * row counts, and shapes that take the plain kernels (k not a multiple of
 * 8). A wrong expert planted into the GPU's routing must turn the check red. */
#include "tests/cuda/cuda_test.h"

static kernels_backend *cpu, *gpu;
static shoal_dtype act;

/* The experts' outputs pass through three bf16 roundings (g and u, the
 * hidden row, the expert's output) where the CPU keeps f32: twice the
 * one-op tolerance. */
static double moe_tol(void)
{
    return 2.0 * tol_for(act);
}

/* Logits with distinct values 0.01 apart (no ties) in a shuffled order. */
static void distinct_logits(float *l, int rows, int experts)
{
    for (int r = 0; r < rows; r++) {
        float *x = l + (size_t)r * experts;
        for (int e = 0; e < experts; e++)
            x[e] = 0.01f * (float)e - 1.0f;
        for (int e = experts - 1; e > 0; e--) {
            int j = (int)rnd_below((uint32_t)e + 1);
            float t = x[e];
            x[e] = x[j];
            x[j] = t;
        }
    }
}

static void route_matches_cpu(void)
{
    static const int cases[][3] = {/* rows, experts, topk */
                                   {1, 8, 2},    {127, 8, 8}, {129, 128, 8}, {257, 60, 4},
                                   {3, 512, 10}, {64, 1, 1},  {2, 33, 32}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int renorm = 0; renorm < 2; renorm++) {
            int rows = cases[c][0], experts = cases[c][1], topk = cases[c][2];
            size_t nl = (size_t)rows * experts, nk = (size_t)rows * topk;
            float *l = xmalloc(nl * 4), *w_ref = xmalloc(nk * 4), *w_got = xmalloc(nk * 4);
            int32_t *id_ref = xmalloc(nk * 4), *id_got = xmalloc(nk * 4);
            distinct_logits(l, rows, experts);
            cpu->moe_route(cpu, id_ref, w_ref, l, rows, experts, topk, renorm);
            void *dl = dev_copy(gpu, l, nl * 4);
            int32_t *dids = dev_alloc(gpu, nk * 4);
            float *dw = dev_alloc(gpu, nk * 4);
            gpu->moe_route(gpu, dids, dw, dl, rows, experts, topk, renorm);
            CHECK(gpu->download(gpu, id_got, dids, nk * 4) == SHOAL_OK);
            CHECK(gpu->download(gpu, w_got, dw, nk * 4) == SHOAL_OK);
            CHECK_MSG(memcmp(id_ref, id_got, nk * 4) == 0,
                      "moe_route rows %d experts %d topk %d: other experts", rows, experts, topk);
            CHECK_MSG(rel_err(w_got, w_ref, nk) <= 1e-5,
                      "moe_route rows %d experts %d topk %d renorm %d: weights off by %.2e", rows,
                      experts, topk, renorm, rel_err(w_got, w_ref, nk));
            gpu->free(gpu, dl);
            gpu->free(gpu, dids);
            gpu->free(gpu, dw);
            free(l);
            free(w_ref);
            free(w_got);
            free(id_ref);
            free(id_got);
        }
}

typedef enum route_mode {
    ROUTE_SPREAD = 0, /* distinct random experts a row */
    ROUTE_ONE,        /* every row's first slot to expert 0 */
    ROUTE_HALF,       /* only even experts: the odd ones get no row */
} route_mode;

typedef struct moe_case {
    int rows, topk, experts, n, k;
    route_mode mode;
} moe_case;

static void make_routing(const moe_case *c, int32_t *ids, float *w)
{
    for (int r = 0; r < c->rows; r++) {
        float sum = 0.0f;
        for (int j = 0; j < c->topk; j++) {
            int32_t *id = ids + (size_t)r * c->topk + j;
            bool again;
            do {
                *id = c->mode == ROUTE_HALF ? 2 * (int)rnd_below((uint32_t)(c->experts + 1) / 2)
                                            : (int)rnd_below((uint32_t)c->experts);
                if (c->mode == ROUTE_ONE && j == 0)
                    *id = 0;
                again = false;
                for (int i = 0; i < j; i++)
                    again |= ids[(size_t)r * c->topk + i] == *id;
            } while (again);
            w[(size_t)r * c->topk + j] = 0.1f + rnd_uniform() * rnd_uniform();
            sum += w[(size_t)r * c->topk + j];
        }
        for (int j = 0; j < c->topk; j++)
            w[(size_t)r * c->topk + j] /= sum;
    }
}

/* Runs one case on both backends; plant moves every row's first slot on the
 * GPU to another expert the row does not route to (a fault the check must
 * see). Returns the error. */
static double run_case(const moe_case *c, bool plant)
{
    size_t nin = (size_t)c->rows * c->k, nk = (size_t)c->rows * c->topk;
    size_t mat = (size_t)c->n * c->k, all = mat * (size_t)c->experts;
    float *in = xmalloc(nin * 4), *ref = xmalloc(nin * 4), *got = xmalloc(nin * 4);
    float *wg = xmalloc(all * 4), *wu = xmalloc(all * 4), *wd = xmalloc(all * 4);
    int32_t *ids = xmalloc(nk * 4);
    float *w = xmalloc(nk * 4);
    fill_uniform(in, nin, 1.0f, act);
    fill_uniform(wg, all, 0.2f, SHOAL_DTYPE_BF16);
    fill_uniform(wu, all, 0.2f, SHOAL_DTYPE_BF16);
    fill_uniform(wd, all, 0.2f, SHOAL_DTYPE_BF16);
    make_routing(c, ids, w);
    bool *used = calloc((size_t)c->experts, 1);
    for (size_t i = 0; i < nk; i++)
        used[ids[i]] = true;
    /* CPU: bf16 weights as the GPU gets them */
    uint16_t *hg = xmalloc(all * 2), *hu = xmalloc(all * 2), *hd = xmalloc(all * 2);
    for (size_t i = 0; i < all; i++) {
        hg[i] = shoal_f32_to_bf16(wg[i]);
        hu[i] = shoal_f32_to_bf16(wu[i]);
        hd[i] = shoal_f32_to_bf16(wd[i]);
    }
    kernels_weight kg = {
        .data = hg, .dtype = SHOAL_DTYPE_BF16, .rows = c->n, .cols = c->k, .experts = c->experts};
    kernels_weight ku = kg, kd = kg;
    ku.data = hu;
    kd.data = hd;
    kd.rows = c->k;
    kd.cols = c->n;
    void *cs = xmalloc(cpu->moe_scratch_bytes(cpu, c->rows, c->topk, c->n, c->k));
    cpu->moe_experts(cpu, ref, in, ids, w, c->rows, c->topk, &kg, &ku, &kd, cs);
    /* GPU: the unrouted experts' weights NaN */
    for (int e = 0; e < c->experts; e++)
        if (!used[e])
            for (size_t i = 0; i < mat; i++)
                hg[(size_t)e * mat + i] = hu[(size_t)e * mat + i] = hd[(size_t)e * mat + i] =
                    0x7fc0;
    if (plant) /* the first expert after slot 0's that the row does not route to */
        for (int r = 0; r < c->rows; r++) {
            int32_t *id = ids + (size_t)r * c->topk;
            for (int step = 1; step < c->experts; step++) {
                int e = (id[0] + step) % c->experts;
                bool dup = false;
                for (int j = 1; j < c->topk; j++)
                    dup |= id[j] == e;
                if (!dup) {
                    id[0] = e;
                    break;
                }
            }
        }
    kernels_weight gg = kg, gu = ku, gd = kd;
    gg.data = dev_copy(gpu, hg, all * 2);
    gu.data = dev_copy(gpu, hu, all * 2);
    gd.data = dev_copy(gpu, hd, all * 2);
    void *din = dev_from_f32(gpu, in, nin, act);
    void *dout = dev_alloc(gpu, nin * shoal_dtype_bytes(act));
    dev_poison(gpu, dout, nin * shoal_dtype_bytes(act));
    void *dids = dev_copy(gpu, ids, nk * 4), *dw = dev_copy(gpu, w, nk * 4);
    void *gs = dev_alloc(gpu, gpu->moe_scratch_bytes(gpu, c->rows, c->topk, c->n, c->k));
    gpu->moe_experts(gpu, dout, din, dids, dw, c->rows, c->topk, &gg, &gu, &gd, gs);
    f32_from_dev(gpu, got, dout, nin, act);
    double err = rel_err(got, ref, nin);
    gpu->free(gpu, (void *)gg.data);
    gpu->free(gpu, (void *)gu.data);
    gpu->free(gpu, (void *)gd.data);
    gpu->free(gpu, din);
    gpu->free(gpu, dout);
    gpu->free(gpu, dids);
    gpu->free(gpu, dw);
    gpu->free(gpu, gs);
    free(in);
    free(ref);
    free(got);
    free(wg);
    free(wu);
    free(wd);
    free(hg);
    free(hu);
    free(hd);
    free(ids);
    free(w);
    free(used);
    free(cs);
    return err;
}

static void experts_match_cpu_at_the_edges(void)
{
    static const moe_case cases[] = {
        {1, 2, 8, 64, 128, ROUTE_SPREAD},    /* one token */
        {1, 8, 8, 48, 64, ROUTE_SPREAD},     /* top-k of every expert */
        {8, 8, 8, 40, 96, ROUTE_SPREAD},     /* the GEMV's most rows, 8 pairs an expert */
        {5, 2, 16, 72, 2048, ROUTE_ONE},     /* GEMV: 5 pairs of expert 0, long rows */
        {2, 10, 16, 40, 64, ROUTE_SPREAD},   /* GEMV: more slots than go at a time */
        {127, 4, 8, 96, 128, ROUTE_ONE},     /* every row's first slot to expert 0 */
        {129, 2, 16, 136, 72, ROUTE_HALF},   /* half the experts get no row */
        {257, 8, 32, 64, 256, ROUTE_SPREAD}, /* tiles of many pairs */
        {64, 1, 4, 200, 64, ROUTE_ONE},      /* a 64-pair tile, n past a tile's edge */
        {17, 3, 6, 40, 36, ROUTE_SPREAD},    /* k not a multiple of 8: the plain kernels */
        {33, 2, 5, 30, 24, ROUTE_HALF},      /* n not a multiple of 8 */
    };
    int count = test_sanitize ? 3 : (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < count; i++) {
        const moe_case *c = &cases[i];
        double err = run_case(c, false);
        CHECK_MSG(err <= moe_tol(),
                  "moe_experts rows %d topk %d experts %d n %d k %d mode %d "
                  "(%s): error %.3e over %.1e",
                  c->rows, c->topk, c->experts, c->n, c->k, (int)c->mode, act_name(act), err,
                  moe_tol());
        if (c->mode == ROUTE_SPREAD && c->topk < c->experts) {
            double bad = run_case(c, true);
            CHECK_MSG(bad > moe_tol(),
                      "moe_experts rows %d: a planted wrong expert passed "
                      "(error %.3e)",
                      c->rows, bad);
        }
    }
}

int main(int argc, char **argv)
{
    cuda_test_start("test_cuda_moe", argc, argv);
    cpu = open_backend("cpu", SHOAL_DTYPE_INVALID);
    static const shoal_dtype acts[] = {SHOAL_DTYPE_BF16, SHOAL_DTYPE_F32};
    for (int a = 0; a < 2; a++) {
        act = acts[a];
        gpu = open_backend(test_gpu, act);
        if (gpu->act_dtype != act) { /* a dry run: the CPU computes in f32 alone */
            kernels_backend_close(gpu);
            continue;
        }
        printf("-- activations %s\n", act_name(act));
        if (a == 0)
            TEST_RUN(route_matches_cpu);
        TEST_RUN(experts_match_cpu_at_the_edges);
        CHECK(gpu->sync(gpu) == SHOAL_OK);
        kernels_backend_close(gpu);
    }
    kernels_backend_close(cpu);
    return TEST_EXIT();
}
