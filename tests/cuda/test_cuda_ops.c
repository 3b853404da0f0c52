/* The contract: every CUDA op against its CPU twin on fresh random inputs at
 * odd sizes, with bf16 and with f32 activations. Inputs are representable
 * in the activation dtype, so both sides see the same numbers; outputs are
 * compared by ||gpu - cpu|| / ||cpu|| with a tolerance that fits the dtype,
 * or bit for bit where the op is exact (lookups, copies, KV bytes, dummy
 * weights, the sampled token). Attention has its own file. */
#include "tests/cuda/cuda_test.h"

#include "kernels/kernels_fp8.h"

static kernels_backend *cpu, *gpu;
static shoal_dtype act;

static const int row_sizes[] = {1, 127, 128, 129, 257};
enum { ROW_SIZES = sizeof row_sizes / sizeof row_sizes[0] };

static void report(const char *op, const char *shape, double err, double tol)
{
    CHECK_MSG(err <= tol, "%s %s (%s): error %.3e over %.1e", op, shape, act_name(act), err, tol);
}

static void embed_matches_cpu_exactly(void)
{
    static const shoal_dtype wdt[] = {SHOAL_DTYPE_BF16, SHOAL_DTYPE_F16, SHOAL_DTYPE_F32};
    /* bf16 rows of 8k elements or fewer, a multiple of 8, take 16-byte
     * loads (2,056: one thread's second load; 8,192: every thread's four) */
    static const int dims[] = {48, 257, 2056, 8192};
    int vocab = 1000;
    for (int w = 0; w < 3; w++)
        for (int di = 0; di < 4; di++)
            for (int ri = 0; ri < ROW_SIZES; ri++) {
                int rows = row_sizes[ri], dim = dims[di];
                float *table = xmalloc((size_t)vocab * dim * 4);
                for (size_t i = 0; i < (size_t)vocab * dim; i++)
                    table[i] = 3.0f * rnd_uniform();
                /* the table as the weight dtype stores it */
                void *ht = xmalloc((size_t)vocab * dim * 4);
                for (size_t i = 0; i < (size_t)vocab * dim; i++) {
                    if (wdt[w] == SHOAL_DTYPE_BF16)
                        ((uint16_t *)ht)[i] = shoal_f32_to_bf16(table[i]);
                    else if (wdt[w] == SHOAL_DTYPE_F16)
                        ((uint16_t *)ht)[i] = shoal_f32_to_f16(table[i]);
                    else
                        ((float *)ht)[i] = table[i];
                }
                int32_t *ids = xmalloc((size_t)rows * 4);
                for (int r = 0; r < rows; r++)
                    ids[r] = (int32_t)rnd_below((uint32_t)vocab);
                float *ref = xmalloc((size_t)rows * dim * 4), *got = xmalloc((size_t)rows * dim * 4);
                cpu->embed(cpu, ref, ht, wdt[w], ids, rows, dim);
                for (size_t i = 0; i < (size_t)rows * dim; i++)
                    ref[i] = round_to(ref[i], act);
                void *dt = dev_copy(gpu, ht, (size_t)vocab * dim * shoal_dtype_bytes(wdt[w]));
                void *di_ = dev_copy(gpu, ids, (size_t)rows * 4);
                void *dout = dev_alloc(gpu, (size_t)rows * dim * shoal_dtype_bytes(act));
                dev_poison(gpu, dout, (size_t)rows * dim * shoal_dtype_bytes(act));
                gpu->embed(gpu, dout, dt, wdt[w], di_, rows, dim);
                f32_from_dev(gpu, got, dout, (size_t)rows * dim, act);
                size_t bad = count_differing(got, ref, (size_t)rows * dim);
                CHECK_MSG(bad == 0, "embed %s rows %d dim %d: %zu elements differ",
                          shoal_dtype_name(wdt[w]), rows, dim, bad);
                gpu->free(gpu, dt);
                gpu->free(gpu, di_);
                gpu->free(gpu, dout);
                free(table);
                free(ht);
                free(ids);
                free(ref);
                free(got);
            }
}

static void rmsnorm_with_and_without_residual_matches_cpu(void)
{
    static const int dims[] = {48, 257, 4096};
    for (int di = 0; di < 3; di++)
        for (int ri = 0; ri < ROW_SIZES; ri++)
            for (int with_res = 0; with_res < 2; with_res++) {
                int rows = row_sizes[ri], dim = dims[di];
                size_t n = (size_t)rows * dim;
                float *x = xmalloc(n * 4), *res = xmalloc(n * 4), *w = xmalloc((size_t)dim * 4);
                float *ref = xmalloc(n * 4), *got = xmalloc(n * 4), *gx = xmalloc(n * 4);
                fill_uniform(x, n, 2.0f, act);
                fill_uniform(res, n, 2.0f, act);
                for (int i = 0; i < dim; i++)
                    w[i] = 1.0f + 0.5f * rnd_uniform();
                void *dx = dev_from_f32(gpu, x, n, act), *dr = dev_from_f32(gpu, res, n, act);
                void *dw = dev_from_f32(gpu, w, (size_t)dim, SHOAL_DTYPE_F32);
                void *dout = dev_alloc(gpu, n * shoal_dtype_bytes(act));
                dev_poison(gpu, dout, n * shoal_dtype_bytes(act));
                cpu->rmsnorm(cpu, ref, x, with_res ? res : NULL, w, rows, dim, 1e-6f);
                gpu->rmsnorm(gpu, dout, dx, with_res ? dr : NULL, dw, rows, dim, 1e-6f);
                f32_from_dev(gpu, got, dout, n, act);
                f32_from_dev(gpu, gx, dx, n, act);
                char shape[64];
                snprintf(shape, sizeof shape, "rows %d dim %d res %d", rows, dim, with_res);
                report("rmsnorm", shape, rel_err(got, ref, n), tol_for(act));
                /* the residual stream as stored: the same rounding on both */
                for (size_t i = 0; i < n; i++)
                    x[i] = round_to(x[i], act);
                size_t bad = count_differing(gx, x, n);
                CHECK_MSG(bad == 0, "rmsnorm %s: x + residual differs in %zu elements", shape,
                          bad);
                gpu->free(gpu, dx);
                gpu->free(gpu, dr);
                gpu->free(gpu, dw);
                gpu->free(gpu, dout);
                free(x);
                free(res);
                free(w);
                free(ref);
                free(got);
                free(gx);
            }
}

static void matmul_every_weight_dtype_matches_cpu(void)
{
    static const shoal_dtype wdt[] = {SHOAL_DTYPE_BF16, SHOAL_DTYPE_F16, SHOAL_DTYPE_F32};
    static const int nk[][2] = {{48, 96}, {129, 257}, {1024, 4096}};
    int shapes = test_sanitize ? 2 : 3;
    for (int s = 0; s < shapes; s++)
        for (int ri = 0; ri < ROW_SIZES; ri++)
            for (int w = 0; w < 3; w++)
                for (int logits = 0; logits < 2; logits++) {
                    int rows = row_sizes[ri], n = nk[s][0], k = nk[s][1];
                    shoal_dtype out_dt = logits ? SHOAL_DTYPE_F32 : act;
                    float *in = xmalloc((size_t)rows * k * 4), *wt = xmalloc((size_t)n * k * 4);
                    float *ref = xmalloc((size_t)rows * n * 4), *got = xmalloc((size_t)rows * n * 4);
                    fill_uniform(in, (size_t)rows * k, 1.0f, act);
                    fill_uniform(wt, (size_t)n * k, 0.1f, wdt[w]);
                    void *hw = xmalloc((size_t)n * k * 4);
                    for (size_t i = 0; i < (size_t)n * k; i++) {
                        if (wdt[w] == SHOAL_DTYPE_BF16)
                            ((uint16_t *)hw)[i] = shoal_f32_to_bf16(wt[i]);
                        else if (wdt[w] == SHOAL_DTYPE_F16)
                            ((uint16_t *)hw)[i] = shoal_f32_to_f16(wt[i]);
                        else
                            ((float *)hw)[i] = wt[i];
                    }
                    cpu->matmul(cpu, ref, SHOAL_DTYPE_F32, in, hw, wdt[w], rows, n, k);
                    void *din = dev_from_f32(gpu, in, (size_t)rows * k, act);
                    void *dw = dev_copy(gpu, hw, (size_t)n * k * shoal_dtype_bytes(wdt[w]));
                    void *dout = dev_alloc(gpu, (size_t)rows * n * shoal_dtype_bytes(out_dt));
                    dev_poison(gpu, dout, (size_t)rows * n * shoal_dtype_bytes(out_dt));
                    gpu->matmul(gpu, dout, out_dt, din, dw, wdt[w], rows, n, k);
                    f32_from_dev(gpu, got, dout, (size_t)rows * n, out_dt);
                    char shape[80];
                    snprintf(shape, sizeof shape, "%s rows %d n %d k %d out %s",
                             shoal_dtype_name(wdt[w]), rows, n, k, shoal_dtype_name(out_dt));
                    report("matmul", shape, rel_err(got, ref, (size_t)rows * n),
                           tol_for(out_dt == SHOAL_DTYPE_F32 ? SHOAL_DTYPE_F32 : act));
                    gpu->free(gpu, din);
                    gpu->free(gpu, dw);
                    gpu->free(gpu, dout);
                    free(in);
                    free(wt);
                    free(hw);
                    free(ref);
                    free(got);
                }
}

static void qk_norm_rope_matches_cpu_and_leaves_the_row_gap(void)
{
    static const int hds[] = {12, 24, 64, 128};
    static const int heads_of[] = {2, 8};
    for (int hi = 0; hi < 4; hi++)
        for (int h = 0; h < 2; h++)
            for (int ri = 0; ri < ROW_SIZES; ri += 2)
                for (int norm = 0; norm < 2; norm++) {
                    int rows = row_sizes[ri], hd = hds[hi], heads = heads_of[h];
                    int stride = heads * hd + 16; /* a gap the op must not touch */
                    size_t n = (size_t)rows * stride;
                    float *x = xmalloc(n * 4), *got = xmalloc(n * 4);
                    float *nw = xmalloc((size_t)hd * 4), *inv = xmalloc((size_t)hd / 2 * 4);
                    int32_t *pos = xmalloc((size_t)rows * 4);
                    fill_uniform(x, n, 2.0f, act);
                    for (int i = 0; i < hd; i++)
                        nw[i] = 1.0f + 0.3f * rnd_uniform();
                    for (int i = 0; i < hd / 2; i++)
                        inv[i] = powf(10000.0f, -2.0f * (float)i / (float)hd);
                    for (int r = 0; r < rows; r++)
                        pos[r] = (int32_t)rnd_below(40000);
                    void *dx = dev_from_f32(gpu, x, n, act);
                    void *dnw = dev_from_f32(gpu, nw, (size_t)hd, SHOAL_DTYPE_F32);
                    void *dinv = dev_from_f32(gpu, inv, (size_t)hd / 2, SHOAL_DTYPE_F32);
                    void *dpos = dev_copy(gpu, pos, (size_t)rows * 4);
                    cpu->qk_norm_rope(cpu, x, rows, heads, hd, stride, norm ? nw : NULL, 1e-6f,
                                      pos, inv);
                    gpu->qk_norm_rope(gpu, dx, rows, heads, hd, stride, norm ? dnw : NULL, 1e-6f,
                                      dpos, dinv);
                    f32_from_dev(gpu, got, dx, n, act);
                    char shape[80];
                    snprintf(shape, sizeof shape, "rows %d heads %d hd %d norm %d", rows, heads,
                             hd, norm);
                    /* cos and sin of positions up to 40000 differ in the last
                     * bits between libraries: allow a little more in f32 */
                    report("qk_norm_rope", shape, rel_err(got, x, n),
                           act == SHOAL_DTYPE_F32 ? 1e-5 : tol_for(act));
                    gpu->free(gpu, dx);
                    gpu->free(gpu, dnw);
                    gpu->free(gpu, dinv);
                    gpu->free(gpu, dpos);
                    free(x);
                    free(got);
                    free(nw);
                    free(inv);
                    free(pos);
                }
}

/* A round of rows from two streams at random positions, pages shuffled. */
typedef struct test_batch {
    int rows, streams, stride;
    int32_t *row_stream, *positions, *page_table;
} test_batch;

static void make_batch(test_batch *b, int rows, int pt, int pages_total)
{
    b->rows = rows;
    b->streams = 2;
    b->stride = pages_total / 2;
    b->row_stream = xmalloc((size_t)rows * 4);
    b->positions = xmalloc((size_t)rows * 4);
    b->page_table = xmalloc((size_t)pages_total * 4);
    for (int p = 0; p < pages_total; p++)
        b->page_table[p] = p;
    for (int p = pages_total - 1; p > 0; p--) { /* shuffle: pages in any order */
        int q = (int)rnd_below((uint32_t)p + 1), t = b->page_table[p];
        b->page_table[p] = b->page_table[q];
        b->page_table[q] = t;
    }
    /* distinct slots: stream s row i at position i (both streams from 0) */
    int half = rows / 2;
    for (int r = 0; r < rows; r++) {
        b->row_stream[r] = r < half ? 0 : 1;
        b->positions[r] = r < half ? r : r - half;
    }
}

static void free_batch(test_batch *b)
{
    free(b->row_stream);
    free(b->positions);
    free(b->page_table);
}

static void kv_write_bytes_equal_cpu_for_bf16_and_fp8(void)
{
    static const int hds[] = {12, 64, 128};
    static const int kvhs[] = {1, 4};
    static const int pts[] = {1, 16};
    static const shoal_dtype kvdt[] = {SHOAL_DTYPE_BF16, SHOAL_DTYPE_F8_E4M3};
    for (int d = 0; d < 2; d++)
        for (int hi = 0; hi < 3; hi++)
            for (int ki = 0; ki < 2; ki++)
                for (int pi = 0; pi < 2; pi++)
                    for (int ri = 0; ri < ROW_SIZES; ri += 2) {
                        int rows = row_sizes[ri], hd = hds[hi], kvh = kvhs[ki], pt = pts[pi];
                        int layers = 3, layer = 1;
                        int pages = 2 * ((rows + pt - 1) / pt + 1);
                        kernels_kv_layout L;
                        kernels_kv_layout_init(&L, layers, kvh, hd, pt, kvdt[d]);
                        float *scales = xmalloc((size_t)2 * layers * kvh * 4);
                        for (int i = 0; i < 2 * layers * kvh; i++)
                            scales[i] = ldexpf(1.0f + 0.5f * rnd_uniform(), (int)rnd_below(9) - 4);
                        test_batch b;
                        make_batch(&b, rows, pt, pages);
                        size_t w = (size_t)rows * kvh * hd;
                        float *k = xmalloc(w * 4), *v = xmalloc(w * 4);
                        /* magnitudes from 2^-14 to 2^10: subnormals, saturation */
                        for (size_t i = 0; i < w; i++) {
                            k[i] = round_to(ldexpf(rnd_uniform(), (int)rnd_below(25) - 14), act);
                            v[i] = round_to(ldexpf(rnd_uniform(), (int)rnd_below(25) - 14), act);
                        }
                        size_t bytes = (size_t)pages * L.page_bytes;
                        unsigned char *ha = calloc(1, bytes), *ga = xmalloc(bytes);
                        kernels_kv_layout Lc = L, Lg = L;
                        void *dscales = dev_from_f32(gpu, scales, (size_t)2 * layers * kvh,
                                                     SHOAL_DTYPE_F32);
                        if (kvdt[d] == SHOAL_DTYPE_F8_E4M3) {
                            Lc.k_scale = scales;
                            Lc.v_scale = scales + layers * kvh;
                            Lg.k_scale = dscales;
                            Lg.v_scale = (float *)dscales + layers * kvh;
                        }
                        kernels_batch bc = {rows, 2, b.stride, b.row_stream, b.positions,
                                            b.page_table, false};
                        cpu->kv_write(cpu, ha, &Lc, &bc, layer, k, v);
                        void *darena = dev_alloc(gpu, bytes);
                        void *dk = dev_from_f32(gpu, k, w, act), *dv = dev_from_f32(gpu, v, w, act);
                        void *drs = dev_copy(gpu, b.row_stream, (size_t)rows * 4);
                        void *dpos = dev_copy(gpu, b.positions, (size_t)rows * 4);
                        void *dpt = dev_copy(gpu, b.page_table, (size_t)pages * 4);
                        kernels_batch bg = {rows, 2, b.stride, drs, dpos, dpt, false};
                        gpu->kv_write(gpu, darena, &Lg, &bg, layer, dk, dv);
                        CHECK(gpu->download(gpu, ga, darena, bytes) == SHOAL_OK);
                        size_t bad = 0, first = 0;
                        for (size_t i = 0; i < bytes; i++)
                            if (ga[i] != ha[i] && bad++ == 0)
                                first = i;
                        CHECK_MSG(bad == 0,
                                  "kv_write %s rows %d hd %d kvh %d pt %d: %zu bytes differ, "
                                  "first at %zu (gpu 0x%02x, cpu 0x%02x)",
                                  shoal_dtype_name(kvdt[d]), rows, hd, kvh, pt, bad, first,
                                  ga[first], ha[first]);
                        gpu->free(gpu, darena);
                        gpu->free(gpu, dk);
                        gpu->free(gpu, dv);
                        gpu->free(gpu, drs);
                        gpu->free(gpu, dpos);
                        gpu->free(gpu, dpt);
                        gpu->free(gpu, dscales);
                        free(ha);
                        free(ga);
                        free(k);
                        free(v);
                        free(scales);
                        free_batch(&b);
                    }
}

static void swiglu_matches_cpu(void)
{
    static const int dims[] = {129, 4096};
    for (int di = 0; di < 2; di++)
        for (int ri = 0; ri < ROW_SIZES; ri++) {
            int rows = row_sizes[ri], dim = dims[di];
            size_t n = (size_t)rows * dim;
            float *g = xmalloc(n * 4), *u = xmalloc(n * 4), *ref = xmalloc(n * 4),
                  *got = xmalloc(n * 4);
            fill_uniform(g, n, 6.0f, act);
            fill_uniform(u, n, 2.0f, act);
            cpu->swiglu(cpu, ref, g, u, rows, dim);
            void *dg = dev_from_f32(gpu, g, n, act), *du = dev_from_f32(gpu, u, n, act);
            void *dout = dev_alloc(gpu, n * shoal_dtype_bytes(act));
            dev_poison(gpu, dout, n * shoal_dtype_bytes(act));
            gpu->swiglu(gpu, dout, dg, du, rows, dim);
            f32_from_dev(gpu, got, dout, n, act);
            char shape[64];
            snprintf(shape, sizeof shape, "rows %d dim %d", rows, dim);
            report("swiglu", shape, rel_err(got, ref, n), tol_for(act));
            gpu->free(gpu, dg);
            gpu->free(gpu, du);
            gpu->free(gpu, dout);
            free(g);
            free(u);
            free(ref);
            free(got);
        }
}

/* A backend opened with one environment switch set (NULL: none). */
static kernels_backend *open_gpu_with(const char *name, const char *value)
{
    return open_backend_with(test_gpu, act, name, value);
}

/* Whether the CUDA backend's matmul_add_rmsnorm takes these operands
 * (matmul.cu: gemm_parts, its default rule): bf16, 9 to 64 rows, k of
 * four parts of whole 16-byte chunks, a k of at least twice n or, at up
 * to 32 rows (at any where gemm_rows.cu makes the parts: `ours`, k of
 * four parts of whole 64-column stages), at least n. */
static bool parts_ours(int n, int k)
{
    return gpu_runs_sm90a() && k % 256 == 0 && n % 4 == 0;
}

static bool parts_take(int rows, int n, int k, bool ours)
{
    ours = ours && parts_ours(n, k);
    return act == SHOAL_DTYPE_BF16 && rows >= 9 && rows <= 64 && n % 8 == 0 && k % 32 == 0 &&
           (k >= 2 * n || (k >= n && (rows <= 32 || ours)));
}

/* matmul_add_rmsnorm (x += in w^T, then the norm; CUDA: k split into f32
 * parts that the norm sums) against the passes it stands for: x within
 * the dtype's tolerance of the CPU's x + the product rounded as stored,
 * and of the GPU's matmul then rmsnorm with the product as the residual;
 * the normed rows likewise; the parts by gemm_rows.cu's kernel (the
 * default; its launch count says it ran exactly where it takes the
 * operands) and by cuBLAS (SHOAL_CUDA_GEMM_ROWS_PARTS=0). Taken exactly
 * where the rule says (rows 8 and 65 are not a decode round's, k = n at
 * 33 rows does not pay on cuBLAS, k not a whole number of 32-element
 * chunks), false with nothing written elsewhere. A part left out would
 * move x by far more than the tolerance: checked on the host for each
 * shape. */
static void matmul_add_rmsnorm_matches_the_passes(void)
{
    /* {136, 2048}: a part of the kernel's tile past n, and more steps a
     * part than its stages (each slot taken twice), under the sanitizer */
    static const int nk[][2] = {{256, 1024}, {136, 2048}, {512, 512}, {264, 520}, {1024, 4096}};
    static const int rowss[] = {8, 9, 16, 33, 64, 65};
    const float eps = 1e-6f;
    /* the CPU backend, standing in on a dry run, has none */
    CHECK_MSG(gpu->matmul_add_rmsnorm != NULL || test_dry,
              "the CUDA backend has matmul_add_rmsnorm");
    if (!gpu->matmul_add_rmsnorm)
        return;
    size_t ab = shoal_dtype_bytes(act);
    /* the parts by gemm_rows.cu's kernel (the default), and by cuBLAS */
    kernels_backend *cublas_parts = open_gpu_with("SHOAL_CUDA_GEMM_ROWS_PARTS", "0");
    for (int bi = 0; bi < 2; bi++)
        for (int s = 0; s < (test_sanitize ? 2 : 5); s++)
            for (int ri = 0; ri < 6; ri++) {
                kernels_backend *g = bi ? cublas_parts : gpu;
                const int n = nk[s][0], k = nk[s][1], rows = rowss[ri];
                const size_t xn = (size_t)rows * n, inn = (size_t)rows * k, wn = (size_t)n * k;
                float *x0 = xmalloc(xn * 4), *in = xmalloc(inn * 4), *wt = xmalloc(wn * 4);
                float *nw = xmalloc((size_t)n * 4), *prod = xmalloc(xn * 4),
                      *part = xmalloc(xn * 4);
                float *x1 = xmalloc(xn * 4), *href = xmalloc(xn * 4), *xbad = xmalloc(xn * 4);
                float *gx = xmalloc(xn * 4), *gh = xmalloc(xn * 4), *px = xmalloc(xn * 4),
                      *ph = xmalloc(xn * 4);
                uint16_t *hw = xmalloc(wn * 2);
                fill_uniform(x0, xn, 2.0f, act);
                fill_uniform(in, inn, 1.0f, act);
                fill_uniform(wt, wn, 0.1f, SHOAL_DTYPE_BF16);
                for (size_t i = 0; i < wn; i++)
                    hw[i] = shoal_f32_to_bf16(wt[i]);
                for (int i = 0; i < n; i++)
                    nw[i] = 1.0f + 0.5f * rnd_uniform();
                /* the host: x1 = x0 + the product as stored, then the norm */
                cpu->matmul(cpu, prod, SHOAL_DTYPE_F32, in, hw, SHOAL_DTYPE_BF16, rows, n, k);
                for (size_t i = 0; i < xn; i++)
                    x1[i] = round_to(x0[i] + round_to(prod[i], act), act);
                cpu->rmsnorm(cpu, href, x1, NULL, nw, rows, n, eps);
                char shape[80];
                snprintf(shape, sizeof shape, "rows %d n %d k %d, %s", rows, n, k,
                         bi ? "cublas" : "gemm_rows");
                /* the product with its last quarter of k left out */
                if (k % 4 == 0) {
                    float *in3 = xmalloc(inn * 4);
                    for (int r = 0; r < rows; r++)
                        for (int j = 0; j < k; j++)
                            in3[(size_t)r * k + j] = j < 3 * k / 4 ? in[(size_t)r * k + j] : 0.0f;
                    cpu->matmul(cpu, part, SHOAL_DTYPE_F32, in3, hw, SHOAL_DTYPE_BF16, rows, n, k);
                    for (size_t i = 0; i < xn; i++)
                        xbad[i] = round_to(x0[i] + round_to(part[i], act), act);
                    CHECK_MSG(rel_err(xbad, x1, xn) > 10 * tol_for(act),
                              "matmul_add_rmsnorm %s: a part left out stays within the tolerance",
                              shape);
                    free(in3);
                }
                void *dx = dev_from_f32(g, x0, xn, act), *dx2 = dev_from_f32(g, x0, xn, act);
                void *din = dev_from_f32(g, in, inn, act);
                void *dw = dev_copy(g, hw, wn * 2);
                void *dnw = dev_from_f32(g, nw, (size_t)n, SHOAL_DTYPE_F32);
                void *dh = dev_alloc(g, xn * ab), *dh2 = dev_alloc(g, xn * ab),
                     *dp = dev_alloc(g, xn * ab);
                dev_poison(g, dh, xn * ab);
                const unsigned long launches = test_dry ? 0 : cuda_backend_gemm_rows_launches(g);
                bool took = g->matmul_add_rmsnorm(g, dh, dx, din, dw, SHOAL_DTYPE_BF16, dnw, rows,
                                                  n, k, eps);
                CHECK_MSG(took == parts_take(rows, n, k, bi == 0), "matmul_add_rmsnorm %s (%s): %s",
                          shape, act_name(act),
                          took ? "taken where the rule says not" : "not taken");
                /* which kernel made the parts: gemm_rows.cu's exactly where it takes them */
                const bool ours = !test_dry && cuda_backend_gemm_rows_launches(g) != launches;
                CHECK_MSG(ours == (took && bi == 0 && parts_ours(n, k)),
                          "matmul_add_rmsnorm %s: the parts %s gemm_rows.cu's kernel", shape,
                          ours ? "by" : "not by");
                f32_from_dev(g, gx, dx, xn, act);
                if (took) {
                    f32_from_dev(g, gh, dh, xn, act);
                    report("matmul_add_rmsnorm x", shape, rel_err(gx, x1, xn), tol_for(act));
                    report("matmul_add_rmsnorm out", shape, rel_err(gh, href, xn), tol_for(act));
                    /* the GPU's passes */
                    g->matmul(g, dp, act, din, dw, SHOAL_DTYPE_BF16, rows, n, k);
                    g->rmsnorm(g, dh2, dx2, dp, dnw, rows, n, eps);
                    f32_from_dev(g, px, dx2, xn, act);
                    f32_from_dev(g, ph, dh2, xn, act);
                    char vs[112];
                    snprintf(vs, sizeof vs, "%s vs matmul, rmsnorm", shape);
                    report("matmul_add_rmsnorm x", vs, rel_err(gx, px, xn), tol_for(act));
                    report("matmul_add_rmsnorm out", vs, rel_err(gh, ph, xn), tol_for(act));
                } else {
                    size_t bad = count_differing(gx, x0, xn);
                    CHECK_MSG(bad == 0, "matmul_add_rmsnorm %s: not taken, yet x changed in %zu",
                              shape, bad);
                }
                CHECK(g->sync(g) == SHOAL_OK);
                void *dev[] = {dx, dx2, din, dw, dnw, dh, dh2, dp};
                for (int i = 0; i < 8; i++)
                    g->free(g, dev[i]);
                void *host[] = {x0, in, wt, nw, prod, part, x1, href, xbad, gx, gh, px, ph, hw};
                for (int i = 0; i < 14; i++)
                    free(host[i]);
            }
    kernels_backend_close(cublas_parts);
}

/* The split-K GEMM (SHOAL_CUDA_GEMM_SPLITK=1, bf16, 2 to 64 rows) against
 * the CPU within bf16's tolerance, with its tile's k split over the
 * cluster's blocks and its stages as the GPU's size picks them, and fixed
 * (SHOAL_CUDA_GEMM_SPLITK_S 1, 2, 3 and 8 with _STAGES 8, 4, 4, 8); odd
 * rows, n not a multiple of the 128-row tile, k of one to 192 stages (the 8B model's q/k/v, o and down shapes
 * but under the sanitizer), and k not a multiple of 64 (cuBLAS serves).
 * The same call twice gives the same bits: the blocks' sums are added in
 * rank order, whatever the scheduling. */
static void matmul_split_k_matches_cpu(void)
{
    static const int nk[][2] = {{128, 64},    {200, 192},   {1024, 4096}, {6144, 4096},
                                {4096, 4096}, {4096, 12288}, {256, 96}};
    static const int rowss[] = {2, 7, 33, 64};
    static const char *splits[] = {"0", "1", "2", "3", "8"};
    static const char *stages[] = {"0", "8", "4", "4", "8"};
    if (act != SHOAL_DTYPE_BF16)
        return;
    setenv("SHOAL_CUDA_GEMM_SPLITK", "1", 1);
    for (int si = 0; si < 5; si++) {
        setenv("SHOAL_CUDA_GEMM_SPLITK_STAGES", stages[si], 1);
        kernels_backend *be = open_gpu_with("SHOAL_CUDA_GEMM_SPLITK_S", splits[si]);
        unsetenv("SHOAL_CUDA_GEMM_SPLITK_STAGES");
        for (int s = 0; s < 7; s++)
            for (int ri = 0; ri < 4; ri++) {
                int rows = rowss[ri], n = nk[s][0], k = nk[s][1];
                if ((test_sanitize || si > 0) && (size_t)n * k > (1u << 23))
                    continue; /* the 8B shapes: on the GPU's own split, not sanitized */
                size_t on = (size_t)rows * n, wn = (size_t)n * k;
                float *in = xmalloc((size_t)rows * k * 4), *wt = xmalloc(wn * 4);
                float *ref = xmalloc(on * 4), *got = xmalloc(on * 4), *again = xmalloc(on * 4);
                uint16_t *hw = xmalloc(wn * 2);
                fill_uniform(in, (size_t)rows * k, 1.0f, act);
                fill_uniform(wt, wn, 0.1f, SHOAL_DTYPE_BF16);
                for (size_t i = 0; i < wn; i++)
                    hw[i] = shoal_f32_to_bf16(wt[i]);
                cpu->matmul(cpu, ref, SHOAL_DTYPE_F32, in, hw, SHOAL_DTYPE_BF16, rows, n, k);
                void *din = dev_from_f32(be, in, (size_t)rows * k, act);
                void *dw = dev_copy(be, hw, wn * 2);
                void *dout = dev_alloc(be, on * 2);
                for (int run = 0; run < 2; run++) {
                    dev_poison(be, dout, on * 2);
                    be->matmul(be, dout, act, din, dw, SHOAL_DTYPE_BF16, rows, n, k);
                    f32_from_dev(be, run ? again : got, dout, on, act);
                }
                char shape[96];
                snprintf(shape, sizeof shape, "rows %d n %d k %d, splits %s, stages %s", rows, n,
                         k, splits[si], stages[si]);
                report("matmul (split-k)", shape, rel_err(got, ref, on), tol_for(act));
                size_t bad = count_differing(got, again, on);
                CHECK_MSG(bad == 0, "matmul (split-k) %s: %zu elements differ between two runs",
                          shape, bad);
                be->free(be, din);
                be->free(be, dw);
                be->free(be, dout);
                free(in);
                free(wt);
                free(ref);
                free(got);
                free(again);
                free(hw);
            }
        CHECK(be->sync(be) == SHOAL_OK);
        kernels_backend_close(be);
    }
    unsetenv("SHOAL_CUDA_GEMM_SPLITK");
}

/* The CPU's silu(g) * u with g and u rounded to the activations, as
 * every GPU path stores them before the product (the fused GEMV rounds
 * them; the unfused path stores them): against the CPU's f32 g and u,
 * two more roundings than a matmul's stand in a few outputs' error (seed
 * 1796181855176242627: 40 outputs 6.02e-3 from them, over the 6e-3
 * tolerance). scratch holds rows x n floats. */
static void swiglu_cpu_ref(float *ref, float *scratch, const float *in, const void *wg,
                           const void *wu, shoal_dtype wdt, int rows, int n, int k)
{
    cpu->matmul(cpu, ref, SHOAL_DTYPE_F32, in, wg, wdt, rows, n, k);
    cpu->matmul(cpu, scratch, SHOAL_DTYPE_F32, in, wu, wdt, rows, n, k);
    for (size_t i = 0; i < (size_t)rows * n; i++) {
        float g = round_to(ref[i], act), u = round_to(scratch[i], act);
        ref[i] = g / (1.0f + expf(-g)) * u;
    }
}

/* The one-row GEMV with 16 loads in flight a lane (SHOAL_CUDA_GEMV_LOADS
 * 16, the default) and with 8 gives the same bits, a lane summing its
 * chunks in ascending order whatever the depth, and both match the CPU
 * within the dtype's tolerance (so an output neither wrote fails). The
 * plain GEMV to bf16 and to f32 (the lm_head's), and matmul_swiglu; k of
 * 4,096 and 12,288 (the 8B model's: whole groups of 16 and of 8), 8,200
 * (groups of 16 before and after the wait, then a single load), 4,104 (a
 * group of 16 or two of 8, then a single load), 4,000 (a group of 16 in
 * 20 of the 32 lanes only), 2,056 (single loads at 16, a group at 8) and
 * 96 (single loads only); 77 rows leave warps without one. */
static void one_row_gemv_loads_keep_the_bits(void)
{
    static const int nk[][2] = {{1024, 4096}, {256, 12288}, {130, 8200}, {300, 4104},
                                {64, 4000},   {77, 2056},   {40, 96}};
    enum { SHAPES = sizeof nk / sizeof nk[0] };
    if (act != SHOAL_DTYPE_BF16)
        return;
    kernels_backend *bes[2] = {open_gpu_with("SHOAL_CUDA_GEMV_LOADS", "16"),
                               open_gpu_with("SHOAL_CUDA_GEMV_LOADS", "8")};
    for (int s = 0; s < SHAPES; s++)
        for (int op = 0; op < 3; op++) {
            const int n = nk[s][0], k = nk[s][1];
            const shoal_dtype out_dt = op == 1 ? SHOAL_DTYPE_F32 : act;
            const size_t outs = op == 2 ? 2 * (size_t)n : (size_t)n; /* [out | up] */
            const char *what = op == 2 ? "matmul_swiglu" : op == 1 ? "matmul to f32" : "matmul";
            float *in = xmalloc((size_t)k * 4), *wt = xmalloc((size_t)2 * n * k * 4);
            float *got[2] = {xmalloc((size_t)n * 4), xmalloc((size_t)n * 4)};
            float *ref = xmalloc((size_t)n * 4), *cup = xmalloc((size_t)n * 4);
            uint16_t *hw = xmalloc((size_t)2 * n * k * 2);
            fill_uniform(in, (size_t)k, 1.0f, act);
            fill_uniform(wt, (size_t)2 * n * k, 0.1f, SHOAL_DTYPE_BF16);
            for (size_t i = 0; i < (size_t)2 * n * k; i++)
                hw[i] = shoal_f32_to_bf16(wt[i]);
            if (op == 2)
                swiglu_cpu_ref(ref, cup, in, hw, hw + (size_t)n * k, SHOAL_DTYPE_BF16, 1, n, k);
            else
                cpu->matmul(cpu, ref, SHOAL_DTYPE_F32, in, hw, SHOAL_DTYPE_BF16, 1, n, k);
            for (int b = 0; b < 2; b++) {
                kernels_backend *be = bes[b];
                void *din = dev_from_f32(be, in, (size_t)k, act);
                unsigned char *dw = dev_copy(be, hw, (size_t)2 * n * k * 2);
                unsigned char *dout = dev_alloc(be, outs * shoal_dtype_bytes(out_dt));
                dev_poison(be, dout, outs * shoal_dtype_bytes(out_dt));
                if (op == 2)
                    be->matmul_swiglu(be, dout, dout + (size_t)n * 2, din, dw,
                                      dw + (size_t)n * k * 2, SHOAL_DTYPE_BF16, 1, n, k);
                else
                    be->matmul(be, dout, out_dt, din, dw, SHOAL_DTYPE_BF16, 1, n, k);
                f32_from_dev(be, got[b], dout, (size_t)n, out_dt);
                CHECK(be->sync(be) == SHOAL_OK);
                be->free(be, din);
                be->free(be, dw);
                be->free(be, dout);
                char shape[80];
                snprintf(shape, sizeof shape, "one row, n %d k %d, %d loads", n, k,
                         b ? 8 : 16);
                report(what, shape, rel_err(got[b], ref, (size_t)n),
                       tol_for(out_dt == SHOAL_DTYPE_F32 ? SHOAL_DTYPE_F32 : act));
            }
            size_t bad = count_differing(got[0], got[1], (size_t)n);
            CHECK_MSG(bad == 0, "one-row %s n %d k %d: %zu outputs differ between 16 and 8 loads",
                      what, n, k, bad);
            free(in);
            free(wt);
            free(got[0]);
            free(got[1]);
            free(ref);
            free(cup);
            free(hw);
        }
    kernels_backend_close(bes[0]);
    kernels_backend_close(bes[1]);
}

/* matmul_swiglu_rms's tolerance, bf16: g and u each rounded before silu
 * and the product, and the product rounded, where a matmul rounds once;
 * at a few outputs a flip of one of them moves the norm of the error.
 * A host model of the two paths (the norm in the GEMV, and the rounded
 * normed row then the GEMV), 100,000 draws at 40 outputs of k 96 (this
 * test's smallest shape): against the CPU's f32 at most 1.09e-2 (3.4%
 * over 6e-3), between the two paths at most 1.74e-2 (8.9% over 6e-3; a
 * GPU run failed so at 6.13e-3); at 300 outputs of k 4,104 at most
 * 5.0e-3 and 6.2e-3. A scale left out (the model again) misses by over
 * 1e-2 in 99.9% of draws at 40 outputs and by 0.3 or more at 1,024 of
 * k 4,096, this test's first shape. */
static const double swiglu_norm_tol_cpu = 2e-2, swiglu_norm_tol_pass = 3e-2;

/* The RMSNorm and the residual add inside the one-row GEMV (bf16,
 * kernels_backend.h: fused_norm_rows), each against the passes it
 * replaces:
 *   scale_columns: bf16(w * weight) bit for bit against the host;
 *   matmul_rms and matmul_swiglu_rms on the scaled weights: within the
 *     bf16 tolerance of the CPU's rmsnorm (with the weight), then matmul
 *     or matmul_swiglu on the weights as they were, and of the GPU's own
 *     norm pass (a weight of ones) then the GEMV on the scaled weights
 *     (matmul_swiglu_rms within swiglu_norm_tol_*: its g and u are rounded
 *     to bf16, each path's its own way, before silu and the product);
 *   matmul_add: bit for bit the GEMV into a buffer, then rmsnorm's
 *     residual add of it into x, and within the tolerance of the CPU's
 *     x + in w^T.
 * Shapes: a 4,096-column row (one group of 16 loads a lane), 4,104 and
 * 8,200 (groups and a tail), 2,056 and 96 (the tail alone); n not a
 * multiple of the block's rows. */
static void norm_and_residual_inside_the_gemv_match_the_passes(void)
{
    static const int nk[][2] = {{1024, 4096}, {300, 4104}, {130, 8200}, {77, 2056}, {40, 96}};
    enum { SHAPES = sizeof nk / sizeof nk[0] };
    const float eps = 1e-6f;
    if (act != SHOAL_DTYPE_BF16)
        return;
    CHECK_MSG(gpu->fused_norm_rows == 1 && gpu->matmul_rms && gpu->matmul_add,
              "the CUDA backend takes the norm inside its one-row GEMV at bf16");
    if (gpu->fused_norm_rows < 1)
        return;
    for (int s = 0; s < (test_sanitize ? 2 : SHAPES); s++) {
        const int n = nk[s][0], k = nk[s][1];
        const size_t wn = (size_t)n * k;
        float *x = xmalloc((size_t)k * 4), *nw = xmalloc((size_t)k * 4),
              *ones = xmalloc((size_t)k * 4);
        float *wt = xmalloc(2 * wn * 4), *h = xmalloc((size_t)k * 4);
        uint16_t *hw = xmalloc(2 * wn * 2), *hs = xmalloc(2 * wn * 2), *got_w = xmalloc(2 * wn * 2);
        float *ref = xmalloc((size_t)n * 4), *cup = xmalloc((size_t)n * 4);
        float *got = xmalloc((size_t)n * 4), *gref = xmalloc((size_t)n * 4);
        fill_uniform(x, (size_t)k, 2.0f, act);
        fill_uniform(wt, 2 * wn, 0.1f, SHOAL_DTYPE_BF16);
        for (int i = 0; i < k; i++) {
            nw[i] = 1.0f + 0.75f * rnd_uniform(); /* rnd_uniform: [-1, 1) */
            ones[i] = 1.0f;
        }
        for (size_t i = 0; i < 2 * wn; i++) {
            hw[i] = shoal_f32_to_bf16(wt[i]);
            hs[i] = shoal_f32_to_bf16(wt[i] * nw[i % (size_t)k]);
        }
        char shape[64];
        snprintf(shape, sizeof shape, "one row, n %d k %d", n, k);
        /* the weights scaled on the GPU: [gate | up] of n rows each */
        unsigned char *dw = dev_copy(gpu, hw, 2 * wn * 2);
        void *dnw = dev_from_f32(gpu, nw, (size_t)k, SHOAL_DTYPE_F32);
        void *dones = dev_from_f32(gpu, ones, (size_t)k, SHOAL_DTYPE_F32);
        gpu->scale_columns(gpu, dw, SHOAL_DTYPE_BF16, 2 * n, k, dnw);
        CHECK(gpu->download(gpu, got_w, dw, 2 * wn * 2) == SHOAL_OK);
        size_t bad = 0;
        for (size_t i = 0; i < 2 * wn; i++)
            bad += got_w[i] != hs[i];
        CHECK_MSG(bad == 0, "scale_columns %s: %zu of %zu weights differ from the host's", shape,
                  bad, 2 * wn);
        void *dx = dev_from_f32(gpu, x, (size_t)k, act);
        unsigned char *dout = dev_alloc(gpu, (size_t)2 * n * 2),
                      *dh = dev_alloc(gpu, (size_t)k * 2);
        for (int op = 0; op < 2; op++) { /* matmul_rms, matmul_swiglu_rms */
            const char *what = op ? "matmul_swiglu_rms" : "matmul_rms";
            cpu->rmsnorm(cpu, h, x, NULL, nw, 1, k, eps);
            if (op)
                cpu->matmul_swiglu(cpu, ref, cup, h, hw, hw + wn, SHOAL_DTYPE_BF16, 1, n, k);
            else
                cpu->matmul(cpu, ref, SHOAL_DTYPE_F32, h, hw, SHOAL_DTYPE_BF16, 1, n, k);
            dev_poison(gpu, dout, (size_t)2 * n * 2);
            if (op)
                gpu->matmul_swiglu_rms(gpu, dout, dx, dw, dw + wn * 2, SHOAL_DTYPE_BF16, 1, n, k,
                                       eps);
            else
                gpu->matmul_rms(gpu, dout, dx, dw, SHOAL_DTYPE_BF16, 1, n, k, eps);
            f32_from_dev(gpu, got, dout, (size_t)n, act);
            report(what, shape, rel_err(got, ref, (size_t)n),
                   op ? swiglu_norm_tol_cpu : tol_for(act));
            /* the GPU's passes: the norm (of weight ones), then the GEMV */
            gpu->rmsnorm(gpu, dh, dx, NULL, dones, 1, k, eps);
            if (op)
                gpu->matmul_swiglu(gpu, dout, dout + (size_t)n * 2, dh, dw, dw + wn * 2,
                                   SHOAL_DTYPE_BF16, 1, n, k);
            else
                gpu->matmul(gpu, dout, act, dh, dw, SHOAL_DTYPE_BF16, 1, n, k);
            f32_from_dev(gpu, gref, dout, (size_t)n, act);
            char vs[112];
            snprintf(vs, sizeof vs, "%s vs the norm pass", shape);
            report(what, vs, rel_err(got, gref, (size_t)n),
                   op ? swiglu_norm_tol_pass : tol_for(act));
        }
        /* matmul_add: x of n elements, the GEMV's input of k */
        float *x0 = xmalloc((size_t)n * 4), *gx = xmalloc((size_t)n * 4);
        fill_uniform(x0, (size_t)n, 2.0f, act);
        void *dres = dev_from_f32(gpu, x0, (size_t)n, act),
             *dres2 = dev_from_f32(gpu, x0, (size_t)n, act);
        gpu->matmul_add(gpu, dres, dx, dw, SHOAL_DTYPE_BF16, 1, n, k);
        gpu->matmul(gpu, dout, act, dx, dw, SHOAL_DTYPE_BF16, 1, n, k);
        gpu->rmsnorm(gpu, dout + (size_t)n * 2, dres2, dout, dones, 1, n, eps);
        f32_from_dev(gpu, got, dres, (size_t)n, act);
        f32_from_dev(gpu, gx, dres2, (size_t)n, act);
        bad = count_differing(got, gx, (size_t)n);
        CHECK_MSG(bad == 0,
                  "matmul_add %s: %zu of %d elements differ from the GEMV, then "
                  "rmsnorm's residual add",
                  shape, bad, n);
        cpu->matmul(cpu, ref, SHOAL_DTYPE_F32, x, hs, SHOAL_DTYPE_BF16, 1, n, k);
        for (int i = 0; i < n; i++)
            ref[i] += x0[i];
        report("matmul_add", shape, rel_err(got, ref, (size_t)n), tol_for(act));
        CHECK(gpu->sync(gpu) == SHOAL_OK);
        void *dev[] = {dw, dnw, dones, dx, dout, dh, dres, dres2};
        for (int i = 0; i < 8; i++)
            gpu->free(gpu, dev[i]);
        void *host[] = {x, nw, ones, wt, h, hw, hs, got_w, ref, cup, got, gref, x0, gx};
        for (int i = 0; i < 14; i++)
            free(host[i]);
    }
}

/* gate and up projections and their product on `be`, both ways: the op,
 * and matmul, matmul, swiglu; the op's result into got, the composition's
 * into ref (f32). Weights wg and wu (device) may be one allocation. */
static void swiglu_both_ways(kernels_backend *be, const void *din, const void *dwg,
                             const void *dwu, shoal_dtype wdt, int rows, int n, int k, bool joined,
                             float *got, float *ref)
{
    size_t ab = shoal_dtype_bytes(act), on = (size_t)rows * n;
    unsigned char *dout = dev_alloc(be, 2 * on * ab), *dref = dev_alloc(be, 2 * on * ab);
    dev_poison(be, dout, 2 * on * ab);
    /* at one row with joined weights, [out | up] as the model lays it */
    void *dup = joined && rows == 1 ? dout + (size_t)n * ab : dout + on * ab;
    be->matmul_swiglu(be, dout, dup, din, dwg, dwu, wdt, rows, n, k);
    be->matmul(be, dref, act, din, dwg, wdt, rows, n, k);
    be->matmul(be, dref + on * ab, act, din, dwu, wdt, rows, n, k);
    be->swiglu(be, dref, dref, dref + on * ab, rows, n);
    f32_from_dev(be, got, dout, on, act);
    f32_from_dev(be, ref, dref, on, act);
    be->free(be, dout);
    be->free(be, dref);
}

/* matmul_swiglu against the CPU's (the composition) within the dtype's
 * tolerance, and against the GPU's own matmul, matmul, swiglu bit for bit:
 * the GEMV that forms the product (one row, bf16) sums each projection as
 * the plain GEMV does and rounds it as the stored projection is rounded.
 * Odd sizes, joined and separate weights, the 8B model's gate/up shape
 * (12288 x 4096) at one row, rows 1 to 8 on a backend whose GEMV takes 8
 * rows, and the switch off (SHOAL_CUDA_GEMV_SWIGLU=0) bit for bit too;
 * joined weights past the GEMV's rows (one strided-batched GEMM) within
 * the tolerance of the composition. */
static void matmul_swiglu_matches_cpu_and_the_unfused_ops(void)
{
    static const int nk[][2] = {{48, 96}, {129, 256}, {100, 257}, {12288, 4096}};
    static const int rowss[] = {1, 2, 8, 129};
    static const shoal_dtype wdt[] = {SHOAL_DTYPE_BF16, SHOAL_DTYPE_F16};
    kernels_backend *wide = open_gpu_with("SHOAL_CUDA_GEMV_ROWS", "8");
    kernels_backend *off = open_gpu_with("SHOAL_CUDA_GEMV_SWIGLU", "0");
    kernels_backend *bes[] = {gpu, wide, off};
    const char *be_names[] = {"default", "gemv rows 8", "swiglu pass"};
    int shapes = test_sanitize ? 2 : 4;
    for (int s = 0; s < shapes; s++)
        for (int ri = 0; ri < 4; ri++)
            for (int w = 0; w < 2; w++)
                for (int joined = 0; joined < 2; joined++) {
                    int rows = rowss[ri], n = nk[s][0], k = nk[s][1];
                    bool big = n * k > 1 << 24;
                    if (big && (rows > 1 || w > 0))
                        continue; /* the 8B shape: the batch-1 step alone */
                    size_t wn = (size_t)n * k, wbytes = wn * shoal_dtype_bytes(wdt[w]);
                    float *in = xmalloc((size_t)rows * k * 4), *wt = xmalloc(wn * 4);
                    uint16_t *hw = xmalloc(2 * wn * 2); /* [gate | up] */
                    fill_uniform(in, (size_t)rows * k, 1.0f, act);
                    for (int half = 0; half < 2; half++) {
                        fill_uniform(wt, wn, 0.1f, wdt[w]);
                        for (size_t i = 0; i < wn; i++)
                            hw[half * wn + i] = wdt[w] == SHOAL_DTYPE_BF16
                                                    ? shoal_f32_to_bf16(wt[i])
                                                    : shoal_f32_to_f16(wt[i]);
                    }
                    size_t on = (size_t)rows * n;
                    float *ref = xmalloc(on * 4), *cup = xmalloc(on * 4);
                    float *got = xmalloc(on * 4), *gref = xmalloc(on * 4);
                    swiglu_cpu_ref(ref, cup, in, hw, hw + wn, wdt[w], rows, n, k);
                    for (int b = 0; b < 3; b++) {
                        kernels_backend *be = bes[b];
                        void *din = dev_from_f32(be, in, (size_t)rows * k, act);
                        unsigned char *dw;
                        const void *dwu;
                        if (joined) {
                            dw = dev_copy(be, hw, 2 * wbytes);
                            dwu = dw + wbytes;
                        } else {
                            dw = dev_copy(be, hw, wbytes);
                            dwu = dev_copy(be, hw + wn, wbytes);
                        }
                        swiglu_both_ways(be, din, dw, dwu, wdt[w], rows, n, k, joined, got,
                                         gref);
                        char shape[112];
                        snprintf(shape, sizeof shape, "%s rows %d n %d k %d %s, %s",
                                 shoal_dtype_name(wdt[w]), rows, n, k,
                                 joined ? "joined" : "apart", be_names[b]);
                        report("matmul_swiglu", shape, rel_err(got, ref, on), tol_for(act));
                        /* where the fused GEMV does not take them (past
                         * its rows, or k not a multiple of 8), joined
                         * weights at more than one row take one batched
                         * GEMM, whose kernel cuBLAS picks apart from the
                         * single GEMM's: within the tolerance (separate
                         * allocations may lie end to end) */
                        bool gemv = b != 2 && rows <= (b == 1 ? 8 : 1) && k % 8 == 0;
                        bool bf16s = act == SHOAL_DTYPE_BF16 && wdt[w] == SHOAL_DTYPE_BF16;
                        bool batched = dwu == dw + wbytes && rows > 1 && !gemv && bf16s;
                        /* past the GEMV, 2 to 64 rows: one kernel (gemm_rows.cu) */
                        bool gemm = rows > 1 && rows <= 64 && !gemv && bf16s && k % 8 == 0;
                        if (batched || gemm) {
                            report(gemm ? "matmul_swiglu (gemm) vs matmul, matmul, swiglu"
                                        : "matmul_swiglu (batched) vs matmul, matmul, swiglu",
                                   shape, rel_err(got, gref, on), tol_for(act));
                        } else {
                            size_t bad = count_differing(got, gref, on);
                            CHECK_MSG(bad == 0,
                                      "matmul_swiglu %s (%s): %zu elements differ from matmul, "
                                      "matmul, swiglu",
                                      shape, act_name(act), bad);
                        }
                        be->free(be, din);
                        be->free(be, dw);
                        if (!joined)
                            be->free(be, (void *)dwu);
                    }
                    free(in);
                    free(wt);
                    free(hw);
                    free(ref);
                    free(cup);
                    free(got);
                    free(gref);
                }
    CHECK(wide->sync(wide) == SHOAL_OK && off->sync(off) == SHOAL_OK);
    kernels_backend_close(wide);
    kernels_backend_close(off);
}

/* Whether matmul_swiglu takes gemm_rows.cu's kernel on a backend
 * whose GEMV takes one row: bf16, 2 to 64 rows, k a whole number of
 * 16-byte chunks (the tensor maps' row pitch). */
static bool gemm_swiglu_takes(int rows, int k)
{
    return act == SHOAL_DTYPE_BF16 && gpu_runs_sm90a() && rows >= 2 && rows <= 64 && k % 8 == 0;
}

/* matmul_swiglu past the GEMV's rows as one kernel (gemm_rows.cu;
 * SHOAL_CUDA_GEMM_SWIGLU 1 to 3: halves of 96 and 64 weight rows, six and
 * four stages; 0 and 1 stages copied before the wait)
 * against the CPU's composition and against the GPU's own passes
 * (SHOAL_CUDA_GEMM_SWIGLU=0: cuBLAS's batched GEMM, then swiglu), both
 * within the dtype's tolerance; the same bits on a second call. n not a
 * multiple of a block's rows and k not of a stage's 64 (boxes past them
 * land as zeros), joined and separate weights, the 8B model's gate/up at
 * 64 rows (against the passes alone). Taken exactly where the rule says:
 * the kernel never writes the up scratch, which the passes fill, so a
 * poisoned scratch left as it was is the kernel's mark (one row is the
 * GEMV's, which writes none either). A stage's k left out would miss by
 * far more than the tolerance: checked on the host. */
static void gemm_swiglu_matches_the_passes(void)
{
    /* {101, 128}: odd n, the stores one element at a time */
    static const int nk[][2] = {{96, 64},    {200, 200}, {101, 128},
                                {300, 1024}, {64, 100},  {12288, 4096}};
    static const int rowss[] = {1, 2, 9, 33, 64, 65};
    /* SHOAL_CUDA_GEMM_SWIGLU and SHOAL_CUDA_GEMM_ROWS_PRE (stages copied
     * before the wait) */
    static const char *variants[][2] = {{"1", "6"}, {"2", "6"}, {"3", "6"}, {"1", "0"}, {"1", "1"}};
    enum { NV = sizeof variants / sizeof variants[0] };
    if (act != SHOAL_DTYPE_BF16)
        return;
    kernels_backend *off = open_gpu_with("SHOAL_CUDA_GEMM_SWIGLU", "0");
    kernels_backend *bes[NV];
    for (int v = 0; v < NV; v++) {
        setenv("SHOAL_CUDA_GEMM_ROWS_PRE", variants[v][1], 1);
        bes[v] = open_gpu_with("SHOAL_CUDA_GEMM_SWIGLU", variants[v][0]);
        unsetenv("SHOAL_CUDA_GEMM_ROWS_PRE");
    }
    for (int s = 0; s < 6; s++)
        for (int ri = 0; ri < 6; ri++)
            for (int joined = 0; joined < 2; joined++) {
                const int rows = rowss[ri], n = nk[s][0], k = nk[s][1];
                const bool big = (size_t)n * k > (1u << 22);
                if (big && (test_sanitize || rows != 64 || !joined))
                    continue;
                const size_t wn = (size_t)n * k, on = (size_t)rows * n;
                float *in = xmalloc((size_t)rows * k * 4), *wt = xmalloc(wn * 4);
                uint16_t *hw = xmalloc(2 * wn * 2); /* [gate | up] */
                fill_uniform(in, (size_t)rows * k, 1.0f, act);
                for (int half = 0; half < 2; half++) {
                    fill_uniform(wt, wn, 0.1f, SHOAL_DTYPE_BF16);
                    for (size_t i = 0; i < wn; i++)
                        hw[half * wn + i] = shoal_f32_to_bf16(wt[i]);
                }
                float *ref = xmalloc(on * 4), *cup = xmalloc(on * 4), *bad = xmalloc(on * 4);
                float *got = xmalloc(on * 4), *again = xmalloc(on * 4), *pass = xmalloc(on * 4);
                float *scratch = xmalloc(on * 4);
                if (!big) /* the 8B shape against the passes alone: the host is slow */
                    swiglu_cpu_ref(ref, cup, in, hw, hw + wn, SHOAL_DTYPE_BF16, rows, n, k);
                char shape[96];
                snprintf(shape, sizeof shape, "rows %d n %d k %d %s", rows, n, k,
                         joined ? "joined" : "apart");
                if (k > 64 && !big) { /* the last stage's k left out */
                    float *in2 = xmalloc((size_t)rows * k * 4);
                    for (int r = 0; r < rows; r++)
                        for (int c = 0; c < k; c++)
                            in2[(size_t)r * k + c] =
                                c < (k - 1) / 64 * 64 ? in[(size_t)r * k + c] : 0.0f;
                    swiglu_cpu_ref(bad, cup, in2, hw, hw + wn, SHOAL_DTYPE_BF16, rows, n, k);
                    CHECK_MSG(rel_err(bad, ref, on) > 10 * tol_for(act),
                              "matmul_swiglu %s: a stage left out stays within the tolerance",
                              shape);
                    free(in2);
                }
                for (int v = -1; v < NV; v++) {
                    kernels_backend *be = v < 0 ? off : bes[v];
                    void *din = dev_from_f32(be, in, (size_t)rows * k, act);
                    unsigned char *dw = dev_copy(be, hw, joined ? 4 * wn : 2 * wn);
                    void *dwu = joined ? (void *)(dw + 2 * wn) : dev_copy(be, hw + wn, 2 * wn);
                    unsigned char *dout = dev_alloc(be, 2 * on * 2);
                    for (int run = 0; run < 2; run++) {
                        dev_poison(be, dout, 2 * on * 2);
                        be->matmul_swiglu(be, dout, dout + on * 2, din, dw, dwu, SHOAL_DTYPE_BF16,
                                          rows, n, k);
                        f32_from_dev(be, v < 0 ? pass : run ? again : got, dout, on, act);
                        if (v < 0)
                            break;
                    }
                    if (v >= 0) {
                        char what[128];
                        snprintf(what, sizeof what, "%s, variant %s, %s stages early", shape,
                                 variants[v][0], variants[v][1]);
                        /* the up scratch: poison (NaN) where the kernel ran */
                        f32_from_dev(be, scratch, dout + on * 2, on, act);
                        size_t kept = 0;
                        for (size_t i = 0; i < on; i++)
                            kept += isnan(scratch[i]);
                        const bool took = kept == on;
                        CHECK_MSG(took == gemm_swiglu_takes(rows, k) || rows == 1,
                                  "matmul_swiglu %s: %s", what,
                                  took ? "the kernel taken where the rule says not"
                                       : "the kernel not taken");
                        if (!big)
                            report("matmul_swiglu (gemm)", what, rel_err(got, ref, on),
                                   tol_for(act));
                        char vs[160];
                        snprintf(vs, sizeof vs, "%s vs the passes", what);
                        report("matmul_swiglu (gemm)", vs, rel_err(got, pass, on), tol_for(act));
                        size_t differ = count_differing(got, again, on);
                        CHECK_MSG(differ == 0,
                                  "matmul_swiglu %s: %zu elements differ between two calls", what,
                                  differ);
                    }
                    CHECK(be->sync(be) == SHOAL_OK);
                    be->free(be, din);
                    be->free(be, dw);
                    if (!joined)
                        be->free(be, dwu);
                    be->free(be, dout);
                }
                void *host[] = {in, wt, hw, ref, cup, bad, got, again, pass, scratch};
                for (int i = 0; i < 10; i++)
                    free(host[i]);
            }
    for (int v = 0; v < NV; v++)
        kernels_backend_close(bes[v]);
    kernels_backend_close(off);
}

/* One case of qk_norm_rope_kv_write on `be`, three ways: the op on packed
 * q, k and v; qk_norm_rope, qk_norm_rope, kv_write on fresh copies of the
 * same inputs; and the op on the rows of one joined [q | k | v] buffer
 * (stride), q into its own buffer. q, k (f32) and the arena bytes of
 * each. */
typedef struct rope_kv_out {
    float *q, *k;
    unsigned char *arena;
} rope_kv_out;

typedef struct rope_kv_case {
    int rows, heads, layer;
    const kernels_kv_layout *L; /* host scales; the device's are made here */
    const kernels_batch *B;     /* host arrays */
    size_t arena_bytes;
    const float *q, *k, *v, *q_norm, *k_norm, *inv_freq;
} rope_kv_case;

/* rows of [q | k | v] (f32, host) */
static float *joined_rows(const rope_kv_case *c)
{
    int hd = c->L->head_dim, qw = c->heads * hd, kw = c->L->kv_heads * hd, w = qw + 2 * kw;
    float *j = xmalloc((size_t)c->rows * w * 4);
    for (int r = 0; r < c->rows; r++) {
        memcpy(j + (size_t)r * w, c->q + (size_t)r * qw, (size_t)qw * 4);
        memcpy(j + (size_t)r * w + qw, c->k + (size_t)r * kw, (size_t)kw * 4);
        memcpy(j + (size_t)r * w + qw + kw, c->v + (size_t)r * kw, (size_t)kw * 4);
    }
    return j;
}

static void rope_kv_three_ways(kernels_backend *be, const rope_kv_case *c, rope_kv_out *fused,
                               rope_kv_out *plain, rope_kv_out *joined)
{
    const kernels_kv_layout *L = c->L;
    int hd = L->head_dim, kvh = L->kv_heads, rows = c->rows;
    size_t qn = (size_t)rows * c->heads * hd, kn = (size_t)rows * kvh * hd;
    size_t sn = (size_t)L->layers * kvh;
    void *dqn = dev_from_f32(be, c->q_norm, (size_t)hd, SHOAL_DTYPE_F32);
    void *dkn = dev_from_f32(be, c->k_norm, (size_t)hd, SHOAL_DTYPE_F32);
    void *dinv = dev_from_f32(be, c->inv_freq, (size_t)hd / 2, SHOAL_DTYPE_F32);
    void *drs = dev_copy(be, c->B->row_stream, (size_t)rows * 4);
    void *dpos = dev_copy(be, c->B->positions, (size_t)rows * 4);
    void *dpt = dev_copy(be, c->B->page_table, (size_t)c->B->streams * c->B->page_table_stride * 4);
    kernels_kv_layout Lg = *L;
    void *dks = NULL, *dvs = NULL;
    if (L->k_scale) {
        dks = dev_from_f32(be, L->k_scale, sn, SHOAL_DTYPE_F32);
        dvs = dev_from_f32(be, L->v_scale, sn, SHOAL_DTYPE_F32);
        Lg.k_scale = dks;
        Lg.v_scale = dvs;
    }
    kernels_batch bg = {rows, c->B->streams, c->B->page_table_stride, drs, dpos, dpt, false};
    {
        int qw = c->heads * hd, kw = kvh * hd, w = qw + 2 * kw;
        size_t ab = shoal_dtype_bytes(act);
        float *hj = joined_rows(c), *back = xmalloc((size_t)rows * w * 4);
        unsigned char *dj = dev_from_f32(be, hj, (size_t)rows * w, act);
        void *dq = dev_alloc(be, qn * ab), *darena = dev_alloc(be, c->arena_bytes);
        be->qk_norm_rope_kv_write(be, dq, dj, dj + qw * ab, dj + (size_t)(qw + kw) * ab, w,
                                  c->heads, dqn, dkn, 1e-6f, dinv, darena, &Lg, &bg, c->layer);
        f32_from_dev(be, joined->q, dq, qn, act);
        f32_from_dev(be, back, dj, (size_t)rows * w, act);
        for (int r = 0; r < rows; r++)
            memcpy(joined->k + (size_t)r * kw, back + (size_t)r * w + qw, (size_t)kw * 4);
        CHECK(be->download(be, joined->arena, darena, c->arena_bytes) == SHOAL_OK);
        be->free(be, dj);
        be->free(be, dq);
        be->free(be, darena);
        free(hj);
        free(back);
    }
    for (int way = 0; way < 2; way++) {
        rope_kv_out *o = way ? plain : fused;
        void *dq = dev_from_f32(be, c->q, qn, act), *dk = dev_from_f32(be, c->k, kn, act);
        void *dv = dev_from_f32(be, c->v, kn, act);
        void *darena = dev_alloc(be, c->arena_bytes);
        if (way == 0) {
            be->qk_norm_rope_kv_write(be, dq, dq, dk, dv, 0, c->heads, dqn, dkn, 1e-6f, dinv,
                                      darena, &Lg, &bg, c->layer);
        } else {
            be->qk_norm_rope(be, dq, rows, c->heads, hd, c->heads * hd, dqn, 1e-6f, dpos, dinv);
            be->qk_norm_rope(be, dk, rows, kvh, hd, kvh * hd, dkn, 1e-6f, dpos, dinv);
            be->kv_write(be, darena, &Lg, &bg, c->layer, dk, dv);
        }
        f32_from_dev(be, o->q, dq, qn, act);
        f32_from_dev(be, o->k, dk, kn, act);
        CHECK(be->download(be, o->arena, darena, c->arena_bytes) == SHOAL_OK);
        be->free(be, dq);
        be->free(be, dk);
        be->free(be, dv);
        be->free(be, darena);
    }
    void *frees[] = {dqn, dkn, dinv, drs, dpos, dpt, dks, dvs};
    for (int i = 0; i < 8; i++)
        if (frees[i])
            be->free(be, frees[i]);
}

/* q elements, k elements and arena bytes in which two results differ. */
static void rope_kv_differences(const rope_kv_out *a, const rope_kv_out *b, size_t qn, size_t kn,
                                size_t bytes, size_t bad[3])
{
    bad[0] = count_differing(a->q, b->q, qn);
    bad[1] = count_differing(a->k, b->k, kn);
    bad[2] = 0;
    for (size_t i = 0; i < bytes; i++)
        bad[2] += a->arena[i] != b->arena[i];
}

/* The pages as numbers (e4m3 before its scale, the same on both sides). */
static void pages_as_f32(float *out, const unsigned char *arena, size_t bytes, shoal_dtype kv)
{
    if (kv == SHOAL_DTYPE_F8_E4M3)
        for (size_t i = 0; i < bytes; i++)
            out[i] = kernels_e4m3_to_f32(arena[i]);
    else
        for (size_t i = 0; i < bytes / 2; i++)
            out[i] = shoal_load_f32(arena, SHOAL_DTYPE_BF16, i);
}

/* qk_norm_rope_kv_write against the CPU's (the composition) within the
 * dtype's tolerance, and on every GPU backend against its own
 * qk_norm_rope, qk_norm_rope, kv_write bit for bit: q, k and every byte
 * of the arena, and from the rows of one joined [q | k | v] buffer bit
 * for bit too. The 8B model's shape (32 q heads, 8 KV heads of 128) at
 * one row, small and odd shapes at 1, 2, 8 and 129 rows, bf16 and fp8
 * pages (fp8 with per-head scales), positions up to 40,000 (the rotation
 * far from identity), on the default backend (fused at one row), one
 * whose GEMV takes 8 rows (fused at up to 8) and one with the switch off
 * (SHOAL_CUDA_ROPE_KV=0). */
static void qk_norm_rope_kv_write_matches_cpu_and_the_unfused_ops(void)
{
    static const int shapes[][3] = {{2, 1, 12}, {8, 4, 24}, {6, 2, 64}, {32, 8, 128}};
    static const int rowss[] = {1, 2, 8, 129};
    static const shoal_dtype kvdt[] = {SHOAL_DTYPE_BF16, SHOAL_DTYPE_F8_E4M3};
    kernels_backend *wide = open_gpu_with("SHOAL_CUDA_GEMV_ROWS", "8");
    kernels_backend *off = open_gpu_with("SHOAL_CUDA_ROPE_KV", "0");
    kernels_backend *bes[] = {gpu, wide, off};
    const char *be_names[] = {"default", "gemv rows 8", "switch off"};
    for (int si = 0; si < 4; si++)
        for (int ri = 0; ri < 4; ri++)
            for (int d = 0; d < 2; d++) {
                int heads = shapes[si][0], kvh = shapes[si][1], hd = shapes[si][2];
                int rows = rowss[ri], layers = 2, layer = 1, pt = 16;
                if (heads == 32 && rows > 1)
                    continue; /* the 8B shape: the batch-1 step alone */
                /* two streams of `per` pages; each row its own slot */
                int per = (rows + 15) / pt + 2;
                kernels_kv_layout L;
                kernels_kv_layout_init(&L, layers, kvh, hd, pt, kvdt[d]);
                float *scales = xmalloc((size_t)2 * layers * kvh * 4);
                for (int i = 0; i < 2 * layers * kvh; i++)
                    scales[i] = 0.5f + 1.5f * fabsf(rnd_uniform());
                if (kvdt[d] == SHOAL_DTYPE_F8_E4M3) {
                    L.k_scale = scales;
                    L.v_scale = scales + layers * kvh;
                }
                test_batch b;
                make_batch(&b, rows, pt, 2 * per);
                /* the page table holds positions up to 40,000 + per * pt:
                 * stream s's row i at base_s + i, in the page of that */
                int32_t *pt_big = xmalloc((size_t)2 * 4096 * 4);
                int32_t base[2];
                for (int s = 0; s < 2; s++) {
                    base[s] = (int32_t)rnd_below(40000);
                    for (int p = 0; p < 4096; p++)
                        pt_big[s * 4096 + p] = -1;
                    for (int p = 0; p < per; p++) /* the shuffled pages, moved up */
                        pt_big[s * 4096 + base[s] / pt + p] = b.page_table[s * b.stride + p];
                    base[s] -= base[s] % pt; /* slot i of the first page */
                }
                for (int r = 0; r < rows; r++)
                    b.positions[r] += base[b.row_stream[r]];
                kernels_batch B = {rows, 2, 4096, b.row_stream, b.positions, pt_big, false};
                size_t qn = (size_t)rows * heads * hd, kn = (size_t)rows * kvh * hd;
                float *q = xmalloc(qn * 4), *k = xmalloc(kn * 4), *v = xmalloc(kn * 4);
                float *qnw = xmalloc((size_t)hd * 4), *knw = xmalloc((size_t)hd * 4);
                float *inv = xmalloc((size_t)hd / 2 * 4);
                fill_uniform(q, qn, 2.0f, act);
                fill_uniform(k, kn, 2.0f, act);
                fill_uniform(v, kn, 2.0f, act);
                for (int i = 0; i < hd; i++) {
                    qnw[i] = 1.0f + 0.3f * rnd_uniform();
                    knw[i] = 1.0f + 0.3f * rnd_uniform();
                }
                for (int i = 0; i < hd / 2; i++)
                    inv[i] = powf(1000000.0f, -2.0f * (float)i / (float)hd);
                size_t bytes = (size_t)2 * per * L.page_bytes;
                /* the CPU: the composition, f32 */
                float *cq = xmalloc(qn * 4), *ck = xmalloc(kn * 4);
                unsigned char *ca = calloc(1, bytes);
                memcpy(cq, q, qn * 4);
                memcpy(ck, k, kn * 4);
                cpu->qk_norm_rope_kv_write(cpu, cq, cq, ck, v, 0, heads, qnw, knw, 1e-6f, inv, ca,
                                           &L, &B, layer);
                float *cpages = xmalloc(bytes * 4), *gpages = xmalloc(bytes * 4);
                pages_as_f32(cpages, ca, bytes, kvdt[d]);
                rope_kv_case c = {rows, heads, layer, &L, &B, bytes, q, k, v, qnw, knw, inv};
                rope_kv_out f = {xmalloc(qn * 4), xmalloc(kn * 4), xmalloc(bytes)};
                rope_kv_out u = {xmalloc(qn * 4), xmalloc(kn * 4), xmalloc(bytes)};
                rope_kv_out jo = {xmalloc(qn * 4), xmalloc(kn * 4), xmalloc(bytes)};
                for (int bi = 0; bi < 3; bi++) {
                    rope_kv_three_ways(bes[bi], &c, &f, &u, &jo);
                    char shape[128];
                    snprintf(shape, sizeof shape, "rows %d heads %d kvh %d hd %d %s pages, %s",
                             rows, heads, kvh, hd, shoal_dtype_name(kvdt[d]), be_names[bi]);
                    /* cos and sin of positions up to 40000 differ in the
                     * last bits between libraries: as qk_norm_rope's test */
                    double tol = act == SHOAL_DTYPE_F32 ? 1e-5 : tol_for(act);
                    report("qk_norm_rope_kv_write q", shape, rel_err(f.q, cq, qn), tol);
                    report("qk_norm_rope_kv_write k", shape, rel_err(f.k, ck, kn), tol);
                    /* a page element may round the other way (one bf16 or
                     * e4m3 step) where the inputs differ in the last bits */
                    pages_as_f32(gpages, f.arena, bytes, kvdt[d]);
                    size_t pn = kvdt[d] == SHOAL_DTYPE_F8_E4M3 ? bytes : bytes / 2;
                    report("qk_norm_rope_kv_write pages", shape, rel_err(gpages, cpages, pn),
                           kvdt[d] == SHOAL_DTYPE_F8_E4M3 ? 0.06 : 6e-3);
                    size_t bad[3];
                    rope_kv_differences(&f, &u, qn, kn, bytes, bad);
                    CHECK_MSG(bad[0] == 0 && bad[1] == 0 && bad[2] == 0,
                              "qk_norm_rope_kv_write %s (%s): %zu q, %zu k elements and %zu "
                              "arena bytes differ from qk_norm_rope, qk_norm_rope, kv_write",
                              shape, act_name(act), bad[0], bad[1], bad[2]);
                    rope_kv_differences(&f, &jo, qn, kn, bytes, bad);
                    CHECK_MSG(bad[0] == 0 && bad[1] == 0 && bad[2] == 0,
                              "qk_norm_rope_kv_write %s (%s), joined rows: %zu q, %zu k "
                              "elements and %zu arena bytes differ from packed rows",
                              shape, act_name(act), bad[0], bad[1], bad[2]);
                }
                free(jo.q), free(jo.k), free(jo.arena);
                free(f.q), free(f.k), free(f.arena);
                free(u.q), free(u.k), free(u.arena);
                free(cq), free(ck), free(ca), free(cpages), free(gpages);
                free(q), free(k), free(v), free(qnw), free(knw), free(inv);
                free(pt_big);
                free(scales);
                free_batch(&b);
            }
    CHECK(wide->sync(wide) == SHOAL_OK && off->sync(off) == SHOAL_OK);
    kernels_backend_close(wide);
    kernels_backend_close(off);
}

static void gather_matches_cpu_exactly(void)
{
    for (int ri = 0; ri < ROW_SIZES; ri++) {
        int rows = row_sizes[ri], src_rows = 300, dim = 129;
        float *in = xmalloc((size_t)src_rows * dim * 4), *ref = xmalloc((size_t)rows * dim * 4);
        float *got = xmalloc((size_t)rows * dim * 4);
        int32_t *idx = xmalloc((size_t)rows * 4);
        fill_uniform(in, (size_t)src_rows * dim, 1.0f, act);
        for (int r = 0; r < rows; r++)
            idx[r] = (int32_t)rnd_below((uint32_t)src_rows);
        cpu->gather(cpu, ref, in, idx, rows, dim);
        void *din = dev_from_f32(gpu, in, (size_t)src_rows * dim, act);
        void *didx = dev_copy(gpu, idx, (size_t)rows * 4);
        void *dout = dev_alloc(gpu, (size_t)rows * dim * shoal_dtype_bytes(act));
        dev_poison(gpu, dout, (size_t)rows * dim * shoal_dtype_bytes(act));
        gpu->gather(gpu, dout, din, didx, rows, dim);
        f32_from_dev(gpu, got, dout, (size_t)rows * dim, act);
        CHECK_MSG(count_differing(got, ref, (size_t)rows * dim) == 0, "gather rows %d", rows);
        gpu->free(gpu, din);
        gpu->free(gpu, didx);
        gpu->free(gpu, dout);
        free(in);
        free(ref);
        free(got);
        free(idx);
    }
}

static void fill_random_makes_the_host_generators_bits(void)
{
    static const size_t ns[] = {1, 1000, (1u << 20) + 3};
    for (int i = 0; i < 3; i++) {
        uint64_t state = common_rng_next(&test_rng);
        float base = i == 1 ? 1.0f : 0.0f, scale = i == 1 ? 0.1f : 0.02f;
        uint16_t *ref = xmalloc(ns[i] * 2), *got = xmalloc(ns[i] * 2);
        uint64_t s = state;
        for (size_t j = 0; j < ns[i]; j++) /* what model_weights' dummy source does */
            ref[j] = shoal_f32_to_bf16(base + scale * common_rng_uniform(&s));
        void *d = dev_alloc(gpu, ns[i] * 2);
        dev_poison(gpu, d, ns[i] * 2);
        gpu->fill_random(gpu, d, ns[i], state, base, scale);
        CHECK(gpu->download(gpu, got, d, ns[i] * 2) == SHOAL_OK);
        CHECK_MSG(memcmp(got, ref, ns[i] * 2) == 0, "fill_random n %zu", ns[i]);
        uint16_t *cpu_got = xmalloc(ns[i] * 2);
        cpu->fill_random(cpu, cpu_got, ns[i], state, base, scale);
        CHECK_MSG(memcmp(cpu_got, ref, ns[i] * 2) == 0, "cpu fill_random n %zu", ns[i]);
        gpu->free(gpu, d);
        free(ref);
        free(got);
        free(cpu_got);
    }
}

/* Log-probabilities agree: equal (both -inf, or both NaN for a row masked
 * throughout), or within float rounding of a double computation. */
static bool lp_close(float a, float b)
{
    return a == b || (isnan(a) && isnan(b)) || fabsf(a - b) <= 1e-5f + 1e-6f * fabsf(b);
}

/* Rows of z through both backends; how many differ (token, logprob, top
 * list), the first few printed. got (may be NULL) receives the GPU's. */
static int sample_rows_differ(const char *label, const float *z, int rows, int vocab,
                              const kernels_sample_params *p, const int32_t *off,
                              const int32_t *tok, const int32_t *cnt,
                              kernels_sample_result *got_out)
{
    size_t n = (size_t)rows * vocab;
    int entries = off ? off[rows] : 0;
    kernels_sample_result *ref = xmalloc((size_t)rows * sizeof *ref);
    kernels_sample_result *got = xmalloc((size_t)rows * sizeof *got);
    cpu->sample(cpu, ref, z, rows, vocab, p, off, tok, cnt);
    void *dz = dev_copy(gpu, z, n * 4), *dp = dev_copy(gpu, p, (size_t)rows * sizeof *p);
    void *doff = off ? dev_copy(gpu, off, (size_t)(rows + 1) * 4) : NULL;
    void *dtok = off ? dev_copy(gpu, tok, (size_t)(entries ? entries : 1) * 4) : NULL;
    void *dcnt = off ? dev_copy(gpu, cnt, (size_t)(entries ? entries : 1) * 4) : NULL;
    void *dres = dev_alloc(gpu, (size_t)rows * sizeof *got);
    dev_poison(gpu, dres, (size_t)rows * sizeof *got);
    gpu->sample(gpu, dres, dz, rows, vocab, dp, doff, dtok, dcnt);
    CHECK(gpu->download(gpu, got, dres, (size_t)rows * sizeof *got) == SHOAL_OK);
    int differ = 0;
    for (int r = 0; r < rows; r++) {
        bool ok = got[r].token == ref[r].token && lp_close(got[r].logprob, ref[r].logprob);
        int nlp = p[r].logprobs < vocab ? p[r].logprobs : vocab;
        for (int i = 0; i < nlp; i++)
            ok = ok && got[r].top_ids[i] == ref[r].top_ids[i] &&
                 lp_close(got[r].top_logprobs[i], ref[r].top_logprobs[i]);
        if (!ok && differ++ < 5)
            fprintf(stderr,
                    "  %s, vocab %d row %d (T %.2f k %d p %.2f min_p %.2f): gpu %d (%g), cpu %d "
                    "(%g)\n",
                    label, vocab, r, p[r].temperature, p[r].top_k, p[r].top_p, p[r].min_p,
                    got[r].token, got[r].logprob, ref[r].token, ref[r].logprob);
    }
    gpu->free(gpu, dz);
    gpu->free(gpu, dp);
    if (off) {
        gpu->free(gpu, doff);
        gpu->free(gpu, dtok);
        gpu->free(gpu, dcnt);
    }
    gpu->free(gpu, dres);
    if (got_out)
        memcpy(got_out, got, (size_t)rows * sizeof *got);
    free(ref);
    free(got);
    return differ;
}

static void sample_picks_the_cpu_token_for_every_parameter_mix(void)
{
    static const int vocabs[] = {1, 2, 263, 151936};
    static const float temps[] = {0.0f, 0.3f, 0.7f, 1.0f, 1.5f};
    static const float top_ps[] = {1.0f, 0.95f, 0.5f, 0.05f};
    static const float min_ps[] = {0.0f, 0.05f, 0.3f};
    int nv = test_sanitize ? 3 : 4;
    for (int vi = 0; vi < nv; vi++) {
        int vocab = vocabs[vi], rows = test_sanitize ? 8 : 64;
        size_t n = (size_t)rows * vocab;
        float *z = xmalloc(n * 4);
        for (size_t i = 0; i < n; i++) {
            uint32_t kind = rnd_below(100);
            /* ties (a copied value), masked tokens, and the rest spread */
            z[i] = kind == 0 && i > 0 ? z[i - 1] : kind == 1 ? -INFINITY : 4.0f * rnd_uniform();
        }
        kernels_sample_params *p = xmalloc((size_t)rows * sizeof *p);
        int32_t *off = xmalloc((size_t)(rows + 1) * 4);
        int cap = rows * 200, entries = 0;
        int32_t *tok = xmalloc((size_t)cap * 4), *cnt = xmalloc((size_t)cap * 4);
        for (int r = 0; r < rows; r++) {
            kernels_sample_params q = {
                .temperature = temps[rnd_below(5)],
                .top_k = (int32_t[]){0, 1, 5, 50, vocab}[rnd_below(5)],
                .top_p = top_ps[rnd_below(4)],
                .min_p = min_ps[rnd_below(3)],
                .repetition_penalty = rnd_below(2) ? 1.3f : 1.0f,
                .presence_penalty = rnd_below(2) ? 0.5f : 0.0f,
                .frequency_penalty = rnd_below(2) ? 0.2f : 0.0f,
                .logprobs = (int32_t)rnd_below(21),
                .seed = common_rng_next(&test_rng),
                .step = rnd_below(1000),
            };
            p[r] = q;
            off[r] = entries;
            for (int t = 0; t < vocab && entries < cap && entries - off[r] < 200; t++)
                if (rnd_below(vocab > 200 ? (uint32_t)vocab / 50 : 3) == 0) {
                    tok[entries] = t;
                    cnt[entries++] = (int32_t)rnd_below(6);
                }
        }
        off[rows] = entries;
        kernels_sample_result *got = xmalloc((size_t)rows * sizeof *got);
        int differ = sample_rows_differ("mix", z, rows, vocab, p, off, tok, cnt, got);
        CHECK_MSG(differ == 0, "sample vocab %d: %d of %d rows differ", vocab, differ, rows);
        /* the same row alone gives the same token: nothing leaks across rows */
        if (rows > 1) {
            int r = rows / 2;
            int32_t off1[2] = {0, off[r + 1] - off[r]};
            kernels_sample_result one;
            (void)sample_rows_differ("row alone", z + (size_t)r * vocab, 1, vocab, p + r, off1,
                                     tok + off[r], cnt + off[r], &one);
            CHECK_MSG(one.token == got[r].token, "row %d alone: %d, in the batch %d", r,
                      one.token, got[r].token);
        }
        free(z);
        free(p);
        free(off);
        free(tok);
        free(cnt);
        free(got);
    }
}

/* The batch-1 step's sampling: one row of Qwen3's 151,936 logits, which
 * the default path reads in 64 chunks by as many blocks and merges, and a
 * few rows (fewer chunks each), one of them at an odd vocabulary so that
 * the second row is not 16-byte aligned (scalar loads). The row's maximum
 * is planted at three ids in different chunks:
 * greedy must take the lowest id (kernels_sample.h), with and without a
 * penalty that pushes it under the next; with logprobs, with sampling
 * (penalties read from the row's bitmap), a row masked to -inf but one
 * token, a row masked throughout (NaN log-probabilities on both), a NaN. */
static void sample_one_row_at_full_vocab_takes_the_lowest_id_of_a_tie(void)
{
    static const int vocabs[] = {151936, 151935};
    for (int vi = 0; vi < 2; vi++) {
        int vocab = vocabs[vi], rows_max = 8;
        float *z = xmalloc((size_t)rows_max * vocab * 4);
        for (size_t i = 0; i < (size_t)rows_max * vocab; i++)
            z[i] = 8.0f * rnd_uniform() - 4.0f;
        kernels_sample_params base = {.top_p = 1.0f, .repetition_penalty = 1.0f};
        kernels_sample_params p[8];
        int32_t off[9], tok[600], cnt[600];
        int entries = 0;
        for (int r = 0; r < rows_max; r++) {
            float *zr = z + (size_t)r * vocab;
            zr[150001] = zr[77777] = zr[5003] = 10.0f; /* the tie */
            zr[60000] = 9.5f;                          /* the next */
            p[r] = base;
            p[r].seed = 1000 + (uint64_t)r;
            p[r].step = 7;
            off[r] = entries;
            for (int t = r; t < vocab && entries - off[r] < 70; t += 2111 + r)
                if (t != 5003) {
                    tok[entries] = t;
                    cnt[entries++] = t % 4;
                }
        }
        off[rows_max] = entries;
        int differ = sample_rows_differ("one greedy row", z, 1, vocab, p, NULL, NULL, NULL, NULL);
        CHECK_MSG(differ == 0, "one greedy row of %d", vocab);
        /* the tie's lowest id, penalised below the others: 77777 next */
        int32_t off1[2] = {0, 1}, tok1[1] = {5003}, cnt1[1] = {2};
        p[0].repetition_penalty = 1.3f;
        differ = sample_rows_differ("one penalised row", z, 1, vocab, p, off1, tok1, cnt1, NULL);
        CHECK_MSG(differ == 0, "one penalised greedy row of %d", vocab);
        p[0].logprobs = 20;
        p[0].repetition_penalty = 1.0f;
        p[0].presence_penalty = 0.5f;
        differ =
            sample_rows_differ("one row with logprobs", z, 1, vocab, p, off1, tok1, cnt1, NULL);
        CHECK_MSG(differ == 0, "one greedy row with logprobs of %d", vocab);
        /* the batch: mixes of the above */
        p[0] = base;
        p[1].logprobs = 5;
        p[2].temperature = 0.8f, p[2].top_p = 0.9f, p[2].repetition_penalty = 1.2f;
        p[3].temperature = 1.0f, p[3].top_k = 40, p[3].frequency_penalty = 0.3f;
        p[4].temperature = 0.7f, p[4].min_p = 0.05f, p[4].logprobs = 3;
        for (int i = 0; i < vocab; i++) /* row 5 masked but one token */
            z[(size_t)5 * vocab + i] = i == 123456 ? 1.0f : -INFINITY;
        for (int i = 0; i < vocab; i++) /* row 6 masked throughout */
            z[(size_t)6 * vocab + i] = -INFINITY;
        p[6].logprobs = 2;
        z[(size_t)7 * vocab + 99999] = NAN;
        p[7].temperature = 0.5f;
        differ = sample_rows_differ("a mixed batch", z, rows_max, vocab, p, off, tok, cnt, NULL);
        CHECK_MSG(differ == 0, "%d of %d rows differ at vocab %d", differ, rows_max, vocab);
        free(z);
    }
}

int main(int argc, char **argv)
{
    cuda_test_start("test_cuda_ops", argc, argv);
    cpu = open_backend("cpu", SHOAL_DTYPE_INVALID);
    static const shoal_dtype acts[] = {SHOAL_DTYPE_BF16, SHOAL_DTYPE_F32};
    bool exact_ops_done = false;
    for (int a = 0; a < 2; a++) {
        act = acts[a];
        gpu = open_backend(test_gpu, act);
        if (gpu->act_dtype != act) { /* a dry run: the CPU computes in f32 alone */
            kernels_backend_close(gpu);
            continue;
        }
        printf("-- activations %s\n", act_name(act));
        if (!test_sanitize) {
            TEST_RUN(embed_matches_cpu_exactly);
            TEST_RUN(rmsnorm_with_and_without_residual_matches_cpu);
            TEST_RUN(qk_norm_rope_matches_cpu_and_leaves_the_row_gap);
            TEST_RUN(swiglu_matches_cpu);
            TEST_RUN(gather_matches_cpu_exactly);
            TEST_RUN(kv_write_bytes_equal_cpu_for_bf16_and_fp8);
            TEST_RUN(qk_norm_rope_kv_write_matches_cpu_and_the_unfused_ops);
        }
        TEST_RUN(matmul_every_weight_dtype_matches_cpu);
        TEST_RUN(one_row_gemv_loads_keep_the_bits);
        TEST_RUN(norm_and_residual_inside_the_gemv_match_the_passes);
        TEST_RUN(matmul_swiglu_matches_cpu_and_the_unfused_ops);
        TEST_RUN(matmul_split_k_matches_cpu);
        TEST_RUN(matmul_add_rmsnorm_matches_the_passes);
        TEST_RUN(gemm_swiglu_matches_the_passes);
        if (!exact_ops_done) { /* act-independent: once */
            exact_ops_done = true;
            TEST_RUN(fill_random_makes_the_host_generators_bits);
            TEST_RUN(sample_picks_the_cpu_token_for_every_parameter_mix);
            TEST_RUN(sample_one_row_at_full_vocab_takes_the_lowest_id_of_a_tie);
        }
        CHECK(gpu->sync(gpu) == SHOAL_OK);
        kernels_backend_close(gpu);
    }
    kernels_backend_close(cpu);
    return TEST_EXIT();
}
