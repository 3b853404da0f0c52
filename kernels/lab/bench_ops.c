/* shoal-lab-ops: the CUDA backend's ops one by one at Qwen3-8B's shape
 * (hidden 4096, 32 query and 8 KV heads of 128, intermediate 12288, vocab
 * 151936, bf16 weights, activations and KV in 16-token pages), each variant
 * of a kernel beside the others, on the same buffers, in one process.
 *
 *   shoal-lab-ops [--device N] [--quick] [--prompt N] [--decode] [--gemm]
 *                 [--attention B C] [--swiglu R] [--matmul N K R] [--gate-up [R]]
 *
 * --prompt N times the prompt kernel alone at N tokens (16 to 4,096), the
 * variant the environment picks (for a profiler); --decode times decode
 * attention alone, "new" against "prev" (SHOAL_CUDA_ATTN_TMA=4
 * SHOAL_CUDA_ATTN_BLOCKS=4: four stages, segments for four blocks a
 * multiprocessor, the eleventh session's), "blocks4" (six stages,
 * SHOAL_CUDA_ATTN_BLOCKS=4), "cpasync" (SHOAL_CUDA_ATTN_TMA=0: the
 * cp.async partials) and "halves" (SHOAL_CUDA_ATTN_TMA_ROWS=0: a copy a
 * 64-column half); --gemm times the decode rounds' GEMMs, cuBLAS against
 * the split-K GEMM's shapes; --attention B C (decode attention at batch B,
 * context C), --swiglu R (swiglu of R rows) and --matmul N K R (a bf16
 * matmul of R rows) time one op alone, as the environment picks it (a
 * profiler's target). --gate-up times matmul_swiglu of the 8B shape at 9
 * to 64 rows: one kernel (gemm_rows.cu; SHOAL_CUDA_GEMM_SWIGLU 1 to 3,
 * SHOAL_CUDA_GEMM_ROWS_PRE 0 and 2) against cuBLAS's batched GEMM and the
 * swiglu pass (0); --gate-up R at R rows alone, as the environment picks
 * it.
 *
 * Variants are backends opened with the environment switches of
 * kernels/cuda (cuda_ops.h): "new" with the defaults, "v1" with
 * SHOAL_CUDA_LEGACY=1 (the first version's kernels: SIMT attention
 * partials for every round, cuBLAS for every matmul), for the GEMV
 * sweep "new" with SHOAL_CUDA_GEMV_ROWS=8, and for the sampling and
 * decode attention sweeps "prev" (the defaults before issue #5's sampler
 * and short segments: SHOAL_CUDA_SAMPLE=0 SHOAL_CUDA_ATTN_FILL=0, cp.async) and
 * "merge" (SHOAL_CUDA_ATTN_FILL=1: the wide merge alone), "cpasync"
 * (SHOAL_CUDA_ATTN_TMA=0: the partials staged by cp.async), "stages3"
 * (SHOAL_CUDA_ATTN_STAGES=3 with cpasync's: three K/V tile stages), "nowave"
 * (SHOAL_CUDA_ATTN_WAVE=0: the segment rule without raising the count to
 * fill the last wave), "blocks8" (SHOAL_CUDA_ATTN_BLOCKS=8: segments for 8
 * blocks a multiprocessor instead of 1), for the prompt kernel "wgmma"
 * (SHOAL_CUDA_PROMPT_TILE=4: the all-threads wgmma kernel), "mma64",
 * "rows32" and "warps8" (tiles 1, 2 and 3: mma.sync on 64-row tiles of 4
 * warps, 128-row tiles of 4 warps of 32 rows and of 8 warps of 16, where
 * the default is the warp-specialized wgmma kernel, tile 5), and for the
 * decode step's gate/up row and its q/k norm, rope and KV write row
 * "prev" (SHOAL_CUDA_GEMV_SWIGLU=0 SHOAL_CUDA_ROPE_KV=0: the joined GEMV,
 * then the swiglu kernel; qk_norm_rope twice, then kv_write). All run on
 * the same device memory.
 *
 * Timing: each measurement records `n` calls of one op as a CUDA graph and
 * replays it `reps` times; the figure is the median replay over n. Weights
 * rotate through a 3 GiB pool and KV through an 8.6 GiB arena of random
 * bf16, so nothing is served from the 60 MB L2 that a model's step would
 * not find there either. Bytes are the fewest each call must move (inputs
 * read once, outputs written once); GB/s and TFLOP/s are those over the
 * time.
 *
 * Prints, in order: the ops of one decode step at batch 1 (4k context),
 * at batch 64 (1k context) and of a 2,048-token prefill, with a per-layer and per-model sum; the
 * GEMV against cuBLAS at 1 to 8 rows; greedy sampling of 1 and 64 rows of
 * 151,936 logits; paged decode attention at batch 1/32/64 and 4k/8k/32k
 * context and batch 64 at 1k (effective read bandwidth); causal prompt
 * attention at 2,048 and 4,096 tokens (TFLOP/s). */
#include "common/common_assert.h"
#include "common/common_dtype.h"
#include "kernels/kernels_backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum {
    HID = 4096,
    HEADS = 32,
    KVH = 8,
    HD = 128,
    INTER = 12288,
    VOCAB = 151936,
    LAYERS = 36,
    ROWS_MAX = 4096,
    STREAMS_MAX = 64,
    CTX_MAX = 32768,
    LOGIT_ROWS = 64,
};

/* Tokens a KV page: 16, or SHOAL_LAB_PAGE_TOKENS (a power of two, 8 to
 * 1,024) for the decode sweep's page-size comparison. */
static int PT = 16;
#define PAGES_PER_STREAM (CTX_MAX / PT)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what)
{
    fprintf(stderr, "shoal-lab-ops: %s\n", what);
    exit(1);
}

/* Everything the ops read and write (device), allocated once. */
typedef struct bufs {
    uint16_t *pool; /* weights: bf16 */
    size_t pool_elems;
    void *x, *h, *q, *k, *v, *att, *pend, *gate, *up, *sel;
    float *logits, *norm_w, *qk_norm_w, *inv_freq;
    void *arena;
    kernels_kv_layout kv;
    int32_t *positions, *row_stream, *page_table, *logit_rows;
    kernels_sample_params *params;
    kernels_sample_result *results;
} bufs;

typedef enum op_kind {
    OP_RMSNORM,
    OP_MATMUL,
    OP_ROPE_Q,
    OP_ROPE_K,
    OP_KV_WRITE,
    OP_ROPE_KV,
    OP_ATTENTION,
    OP_ATTENTION_PROMPT,
    OP_SWIGLU,
    OP_MATMUL_SWIGLU,
    OP_GATHER,
    OP_SAMPLE,
    OP_MATMUL_RMS,        /* the norm inside the GEMV (kernels_backend.h: fused_norm_rows) */
    OP_MATMUL_SWIGLU_RMS, /* ... the gate/up GEMV's */
    OP_MATMUL_ADD,        /* the residual add inside it */
} op_kind;

typedef struct op {
    op_kind kind;
    kernels_backend *be;
    bufs *b;
    int rows;
    int n, k;          /* matmul: out [rows][n], weights [n][k] */
    bool logits_out;   /* matmul into the f32 logits */
    kernels_batch batch;
} op;

/* A weight matrix of n x k for call i: consecutive calls read different
 * parts of the pool. */
static const void *weight_at(const bufs *b, int n, int k, int i)
{
    size_t elems = (size_t)n * (size_t)k;
    size_t span = b->pool_elems - elems;
    size_t off = ((size_t)i * ((elems + 63) & ~(size_t)63)) % span;
    return b->pool + (off & ~(size_t)63);
}

static void call(op *o, int i)
{
    kernels_backend *be = o->be;
    bufs *b = o->b;
    float scale = 1.0f / sqrtf((float)HD);
    kernels_batch kb = o->batch;
    if (o->kind == OP_ATTENTION && kb.rows == kb.streams) /* a decode round: rotate */
        kb.row_stream += (size_t)i * (size_t)kb.rows % STREAMS_MAX;
    switch (o->kind) {
    case OP_RMSNORM: be->rmsnorm(be, b->h, b->x, b->pend, b->norm_w, o->rows, HID, 1e-6f); break;
    case OP_MATMUL:
        be->matmul(be, o->logits_out ? (void *)b->logits : b->gate,
                   o->logits_out ? SHOAL_DTYPE_F32 : SHOAL_DTYPE_BF16,
                   o->k == INTER ? b->up : b->h, weight_at(b, o->n, o->k, i), SHOAL_DTYPE_BF16,
                   o->rows, o->n, o->k);
        break;
    case OP_ROPE_Q:
        be->qk_norm_rope(be, b->q, o->rows, HEADS, HD, HEADS * HD, b->qk_norm_w, 1e-6f,
                         o->batch.positions, b->inv_freq);
        break;
    case OP_ROPE_K:
        be->qk_norm_rope(be, b->k, o->rows, KVH, HD, KVH * HD, b->qk_norm_w, 1e-6f,
                         o->batch.positions, b->inv_freq);
        break;
    case OP_KV_WRITE: be->kv_write(be, b->arena, &b->kv, &o->batch, 0, b->k, b->v); break;
    case OP_ROPE_KV:
        be->qk_norm_rope_kv_write(be, b->q, b->q, b->k, b->v, 0, HEADS, b->qk_norm_w,
                                  b->qk_norm_w, 1e-6f, b->inv_freq, b->arena, &b->kv, &o->batch,
                                  0);
        break;
    case OP_ATTENTION:
        be->attention(be, b->att, b->q, HEADS, b->arena, &b->kv, &kb, 0, scale);
        break;
    case OP_ATTENTION_PROMPT:
        be->attention_prompt(be, b->att, b->q, HEADS, b->arena, &b->kv, &o->batch, 0, scale);
        break;
    case OP_SWIGLU: be->swiglu(be, b->gate, b->gate, b->up, o->rows, INTER); break;
    case OP_MATMUL_SWIGLU: {
        /* as the model calls it: joined [gate | up] weights, and at one
         * row [out | up] in the gate buffer */
        const unsigned char *w = weight_at(b, 2 * INTER, HID, i);
        void *up = o->rows == 1 ? (unsigned char *)b->gate + (size_t)INTER * 2 : b->up;
        be->matmul_swiglu(be, b->gate, up, b->h, w, w + (size_t)INTER * HID * 2,
                          SHOAL_DTYPE_BF16, o->rows, INTER, HID);
        break;
    }
    case OP_MATMUL_RMS:
        be->matmul_rms(be, b->gate, o->k == INTER ? b->up : b->h, weight_at(b, o->n, o->k, i),
                       SHOAL_DTYPE_BF16, o->rows, o->n, o->k, 1e-6f);
        break;
    case OP_MATMUL_SWIGLU_RMS: {
        const unsigned char *w = weight_at(b, 2 * INTER, HID, i);
        be->matmul_swiglu_rms(be, b->gate, b->h, w, w + (size_t)INTER * HID * 2,
                              SHOAL_DTYPE_BF16, o->rows, INTER, HID, 1e-6f);
        break;
    }
    case OP_MATMUL_ADD:
        be->matmul_add(be, b->gate, o->k == INTER ? b->up : b->h, weight_at(b, o->n, o->k, i),
                       SHOAL_DTYPE_BF16, o->rows, o->n, o->k);
        break;
    case OP_GATHER: be->gather(be, b->sel, b->h, b->logit_rows, o->rows, HID); break;
    case OP_SAMPLE:
        be->sample(be, b->results, b->logits, o->rows, VOCAB, b->params, NULL, NULL, NULL);
        break;
    }
}

/* Seconds per call: n calls recorded once, the recording replayed. */
static double time_op(op *o, int n, int reps)
{
    kernels_backend *be = o->be;
    if (be->graph_begin(be) != SHOAL_OK)
        die("cannot record a graph (SHOAL_CUDA_GRAPHS=0?)");
    for (int i = 0; i < n; i++)
        call(o, i);
    if (be->graph_end(be, 0) != SHOAL_OK || be->graph_launch(be, 0) != SHOAL_OK ||
        be->sync(be) != SHOAL_OK)
        die("the recorded op failed");
    double t[32];
    if (reps > 32)
        reps = 32;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        be->graph_launch(be, 0);
        if (be->sync(be) != SHOAL_OK)
            die("the recorded op failed");
        t[r] = now_s() - t0;
    }
    for (int i = 1; i < reps; i++) /* median */
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            double x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    return t[reps / 2] / n;
}

/* A backend with the switches of a variant; `env` is NULL or a list of
 * NAME=VALUE strings ended by NULL. */
static kernels_backend *open_variant(int device, bool v1, int gemv_rows, const char *const *env)
{
    for (int i = 0; env && env[i]; i++)
        putenv((char *)env[i]);
    if (v1) {
        setenv("SHOAL_CUDA_LEGACY", "1", 1);
        setenv("SHOAL_CUDA_GRAPHS", "1", 1); /* for the timing itself */
    }
    if (gemv_rows > 0) {
        char v[8];
        snprintf(v, sizeof v, "%d", gemv_rows);
        setenv("SHOAL_CUDA_GEMV_ROWS", v, 1);
    }
    char dev[16];
    snprintf(dev, sizeof dev, "%d", device);
    kernels_backend_options opt = {.device = dev, .act_dtype = SHOAL_DTYPE_BF16};
    kernels_backend *be = NULL;
    shoal_diag diag = {{0}};
    if (kernels_backend_open(&opt, &be, &diag) != SHOAL_OK) {
        fprintf(stderr, "shoal-lab-ops: %s\n", diag.msg);
        exit(1);
    }
    unsetenv("SHOAL_CUDA_LEGACY");
    unsetenv("SHOAL_CUDA_GRAPHS");
    unsetenv("SHOAL_CUDA_GEMV_ROWS");
    for (int i = 0; env && env[i]; i++) {
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)strcspn(env[i], "="), env[i]);
        unsetenv(name);
    }
    return be;
}

static void *dalloc(kernels_backend *be, size_t bytes)
{
    void *p = be->alloc(be, bytes);
    if (!p)
        die("out of device memory");
    return p;
}

static void *dupload(kernels_backend *be, const void *src, size_t bytes)
{
    void *p = dalloc(be, bytes);
    if (be->upload(be, p, src, bytes) != SHOAL_OK)
        die("upload failed");
    return p;
}

/* Every buffer of the lab, on be's device (b is cleared first). */
static void setup(kernels_backend *be, bufs *b)
{
    memset(b, 0, sizeof *b);
    uint64_t seed = 1;
    b->pool_elems = (size_t)3 << 29; /* 3 GiB of bf16 */
    b->pool = dalloc(be, b->pool_elems * 2);
    be->fill_random(be, b->pool, b->pool_elems, seed++, 0.0f, 0.02f);
    size_t r = ROWS_MAX, a = 2;
    void **acts[] = {&b->x, &b->h, &b->q, &b->att, &b->pend};
    for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++) {
        *acts[i] = dalloc(be, r * HID * a);
        be->fill_random(be, *acts[i], r * HID, seed++, 0.0f, 1.0f);
    }
    b->k = dalloc(be, r * KVH * HD * a);
    b->v = dalloc(be, r * KVH * HD * a);
    b->gate = dalloc(be, r * INTER * a);
    b->up = dalloc(be, r * INTER * a);
    b->sel = dalloc(be, (size_t)LOGIT_ROWS * HID * a);
    be->fill_random(be, b->k, r * KVH * HD, seed++, 0.0f, 1.0f);
    be->fill_random(be, b->v, r * KVH * HD, seed++, 0.0f, 1.0f);
    be->fill_random(be, b->gate, r * INTER, seed++, 0.0f, 1.0f);
    be->fill_random(be, b->up, r * INTER, seed++, 0.0f, 1.0f);
    b->logits = dalloc(be, (size_t)LOGIT_ROWS * VOCAB * 4);

    float w[HID], inv[HD / 2];
    for (int i = 0; i < HID; i++)
        w[i] = 1.0f + 0.001f * (float)(i % 7);
    for (int i = 0; i < HD / 2; i++)
        inv[i] = powf(1e6f, -2.0f * (float)i / (float)HD);
    b->norm_w = dupload(be, w, sizeof w);
    b->qk_norm_w = dupload(be, w, HD * sizeof(float));
    b->inv_freq = dupload(be, inv, sizeof inv);

    kernels_kv_layout_init(&b->kv, 1, KVH, HD, PT, SHOAL_DTYPE_BF16);
    size_t pages = (size_t)STREAMS_MAX * PAGES_PER_STREAM;
    b->arena = dalloc(be, pages * b->kv.page_bytes);
    be->fill_random(be, b->arena, pages * b->kv.page_bytes / 2, seed++, 0.0f, 1.0f);
    /* every stream's pages, shuffled over the arena (SHOAL_LAB_PAGES=seq:
     * in order, a stream's pages one after another) */
    const char *order = getenv("SHOAL_LAB_PAGES");
    bool shuffle = !(order && strcmp(order, "seq") == 0);
    int32_t *table = malloc(pages * 4);
    if (!table)
        die("out of host memory");
    for (size_t p = 0; p < pages; p++)
        table[p] = (int32_t)p;
    uint64_t rng = 42;
    for (size_t p = pages - 1; shuffle && p > 0; p--) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        size_t q = (size_t)(rng >> 33) % (p + 1);
        int32_t t = table[p];
        table[p] = table[q];
        table[q] = t;
    }
    b->page_table = dupload(be, table, pages * 4);
    free(table);
    b->positions = dalloc(be, ROWS_MAX * 4);
    b->row_stream = dalloc(be, ROWS_MAX * 4);
    int32_t lr[LOGIT_ROWS];
    for (int i = 0; i < LOGIT_ROWS; i++)
        lr[i] = i;
    b->logit_rows = dupload(be, lr, sizeof lr);
    kernels_sample_params sp[LOGIT_ROWS];
    memset(sp, 0, sizeof sp);
    for (int i = 0; i < LOGIT_ROWS; i++) {
        sp[i].top_p = 1.0f;
        sp[i].repetition_penalty = 1.0f;
    }
    b->params = dupload(be, sp, sizeof sp);
    b->results = dalloc(be, LOGIT_ROWS * sizeof(kernels_sample_result));
    be->fill_random(be, b->logits, (size_t)LOGIT_ROWS * VOCAB * 2, seed++, 0.0f, 1.0f);
    if (be->sync(be) != SHOAL_OK)
        die("setup failed");
}

/* The round: `streams` streams of `rows_each` rows ending at context ctx.
 * A decode round (one row a stream) has its row table laid out over all
 * STREAMS_MAX streams and call i starts it at row i * streams (mod
 * STREAMS_MAX), so that repeats read other streams' KV, not the L2. */
static kernels_batch make_batch(kernels_backend *be, bufs *b, int streams, int rows_each, int ctx)
{
    static int32_t pos[ROWS_MAX], rs[ROWS_MAX];
    int rows = streams * rows_each;
    for (int s = 0, r = 0; s < streams; s++)
        for (int i = 0; i < rows_each; i++, r++) {
            rs[r] = s;
            pos[r] = ctx - rows_each + i;
        }
    int n = rows;
    if (rows_each == 1) {
        n = ROWS_MAX;
        for (int r = 0; r < n; r++) {
            rs[r] = r % STREAMS_MAX;
            pos[r] = ctx - 1;
        }
    }
    if (be->upload(be, b->positions, pos, (size_t)n * 4) ||
        be->upload(be, b->row_stream, rs, (size_t)n * 4) || be->sync(be))
        die("upload failed");
    kernels_batch kb = {rows, streams, PAGES_PER_STREAM, b->row_stream, b->positions,
                        b->page_table, rows_each == 1};
    return kb;
}

static void row(const char *what, const char *variant, int rows, double s, double bytes,
                double flops, int per_layer, double *layer_sum)
{
    printf("  %-26s %-4s %5d rows %10.2f us", what, variant, rows, s * 1e6);
    if (bytes > 0)
        printf("  %7.0f GB/s", bytes / s / 1e9);
    if (flops > 0)
        printf("  %6.1f TFLOP/s", flops / s / 1e12);
    if (per_layer && layer_sum)
        *layer_sum += s * per_layer;
    printf("\n");
}

/* One layer's ops and the head, both variants; returns the new variant's
 * model time (36 layers + head). */
/* pb: the defaults but SHOAL_CUDA_GEMV_SWIGLU=0 SHOAL_CUDA_ROPE_KV=0, for
 * the gate/up row and the rope + KV write row */
static double step_ops(kernels_backend *nb, kernels_backend *vb, kernels_backend *pb, bufs *b,
                       int streams, int rows_each, int ctx, int n, int reps)
{
    int rows = streams * rows_each;
    bool prefill = rows_each > 1;
    kernels_batch kb = make_batch(nb, b, streams, rows_each, ctx);
    double layer[2] = {0, 0}, head[2] = {0, 0};
    kernels_backend *bes[2] = {nb, vb};
    const char *names[2] = {"new", "v1"};
    /* gate, up and swiglu are timed alone but summed as the model calls
     * them, one matmul_swiglu (below) */
    struct {
        const char *what;
        int n, k, per_layer;
    } mms[] = {{"matmul q 4096x4096", HEADS * HD, HID, 0},   {"matmul k 1024x4096", KVH * HD, HID, 0},
               {"matmul v 1024x4096", KVH * HD, HID, 0},
               {"matmul q+k+v 6144x4096", (HEADS + 2 * KVH) * HD, HID, 1},
               {"matmul o 4096x4096", HID, HEADS * HD, 1},
               {"matmul gate 12288x4096", INTER, HID, 0}, {"matmul up 12288x4096", INTER, HID, 0},
               {"matmul down 4096x12288", HID, INTER, 1}};
    double act = 2.0, r = rows;
    for (int vi = 0; vi < 2; vi++) {
        kernels_backend *be = bes[vi];
        op o = {.be = be, .b = b, .rows = rows, .batch = kb};
        int nn = n, rr = reps;
        o.kind = OP_RMSNORM;
        row("rmsnorm + residual", names[vi], rows, time_op(&o, nn, rr), r * HID * act * 4, 0, 2,
            &layer[vi]);
        for (size_t i = 0; i < sizeof mms / sizeof mms[0]; i++) {
            o.kind = OP_MATMUL;
            o.n = mms[i].n;
            o.k = mms[i].k;
            o.logits_out = false;
            double w = (double)o.n * o.k * 2;
            row(mms[i].what, names[vi], rows, time_op(&o, nn, rr),
                w + r * (o.n + o.k) * act, 2.0 * r * o.n * o.k, mms[i].per_layer, &layer[vi]);
        }
        /* q's and k's rope and the KV write are timed alone but summed
         * as the model calls them, one qk_norm_rope_kv_write (below) */
        o.kind = OP_ROPE_Q;
        row("qk_norm_rope q", names[vi], rows, time_op(&o, nn, rr), r * HEADS * HD * act * 2, 0, 0,
            NULL);
        o.kind = OP_ROPE_K;
        row("qk_norm_rope k", names[vi], rows, time_op(&o, nn, rr), r * KVH * HD * act * 2, 0, 0,
            NULL);
        o.kind = OP_KV_WRITE;
        row("kv_write", names[vi], rows, time_op(&o, nn, rr), r * KVH * HD * act * 4, 0, 0, NULL);
        /* what the model runs: at one row one kernel (new; "prev" =
         * SHOAL_CUDA_ROPE_KV=0: the three above); at more rows those three */
        o.kind = OP_ROPE_KV;
        double rkv = r * (HEADS + 2 * KVH) * HD * act * 2;
        row("rope q+k, kv_write", names[vi], rows, time_op(&o, nn, rr), rkv, 0, 1, &layer[vi]);
        if (vi == 0 && !prefill) {
            o.be = pb;
            row("rope q+k, kv_write", "prev", rows, time_op(&o, nn, rr), rkv, 0, 0, NULL);
            o.be = be;
        }
        /* attention: the model's choice for the round (prompt op for
         * prompt runs, partials for decode rows) */
        o.kind = prefill ? OP_ATTENTION_PROMPT : OP_ATTENTION;
        double kv_bytes = (double)streams * ctx * KVH * HD * 2 * 2;
        double causal = prefill ? 2.0 * (double)rows * rows * HD * HEADS : 0;
        int an = prefill && vi == 1 ? 1 : nn, ar = prefill && vi == 1 ? 2 : rr;
        row(prefill ? "attention (prompt)" : "attention (decode)", names[vi], rows,
            time_op(&o, an, ar), kv_bytes + r * HEADS * HD * act * 2, causal, 1, &layer[vi]);
        o.kind = OP_SWIGLU;
        row("swiglu (in the next)", names[vi], rows, time_op(&o, nn, rr), r * INTER * act * 3, 0, 0,
            NULL);
        /* what the model runs: at one row the GEMV forming the product
         * (new; "prev" = SHOAL_CUDA_GEMV_SWIGLU=0: one GEMV of both, then
         * swiglu); at more rows two GEMMs and swiglu */
        o.kind = OP_MATMUL_SWIGLU;
        double gu = 2.0 * INTER * HID * 2 + r * (HID + INTER) * act;
        row("matmul gate+up, swiglu", names[vi], rows, time_op(&o, nn, rr), gu,
            2.0 * r * 2 * INTER * HID, 1, &layer[vi]);
        if (vi == 0 && !prefill) {
            o.be = pb;
            row("matmul gate+up, swiglu", "prev", rows, time_op(&o, nn, rr), gu,
                2.0 * r * 2 * INTER * HID, 0, NULL);
            o.be = be;
        }
        /* the head: final norm, gather, lm_head and (decode) sampling */
        int lrows = prefill ? 1 : rows;
        o.rows = lrows;
        o.kind = OP_GATHER;
        row("gather", names[vi], lrows, time_op(&o, nn, rr), lrows * HID * act * 2, 0, 1,
            &head[vi]);
        o.kind = OP_MATMUL;
        o.n = VOCAB;
        o.k = HID;
        o.logits_out = true;
        row("matmul lm_head (f32 out)", names[vi], lrows, time_op(&o, nn > 8 ? 8 : nn, rr),
            (double)VOCAB * HID * 2, 2.0 * lrows * VOCAB * HID, 1, &head[vi]);
        if (!prefill) {
            o.kind = OP_SAMPLE;
            row("sample (greedy)", names[vi], lrows, time_op(&o, nn, rr),
                (double)lrows * VOCAB * 4, 0, 1, &head[vi]);
        }
        o.rows = rows;
    }
    for (int vi = 0; vi < 2; vi++) {
        double model = layer[vi] * LAYERS + head[vi] + 1 * 0;
        printf("  => %-4s per layer %.1f us, model (36 layers + head) %.3f ms GPU time%s\n",
               names[vi], layer[vi] * 1e6, model * 1e3,
               prefill ? "" : " per step");
    }
    return layer[0] * LAYERS + head[0];
}

static void gemv_vs_cublas(kernels_backend *nb, kernels_backend *vb, bufs *b, int reps)
{
    static const int shapes[][2] = {
        {HEADS * HD, HID}, {KVH * HD, HID}, {INTER, HID}, {HID, INTER}, {VOCAB, HID}};
    static const int rowss[] = {1, 2, 4, 8};
    printf("\nGEMV (new) vs cuBLAS (v1), bf16 weights, GB/s of weights + activations\n");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t ri = 0; ri < sizeof rowss / sizeof rowss[0]; ri++) {
            int rows = rowss[ri], n = shapes[s][0], k = shapes[s][1];
            char what[64];
            snprintf(what, sizeof what, "matmul %dx%d", n, k);
            for (int vi = 0; vi < 2; vi++) {
                op o = {.kind = OP_MATMUL, .be = vi ? vb : nb, .b = b, .rows = rows, .n = n,
                        .k = k, .logits_out = n == VOCAB};
                double w = (double)n * k * 2 + (double)rows * (n + k) * 2;
                row(what, vi ? "v1" : "new", rows, time_op(&o, n == VOCAB ? 8 : 32, reps), w,
                    2.0 * rows * n * k, 0, NULL);
            }
        }
}

/* The decode round's GEMMs of the 8B shape (q/k/v joined, o, gate alone,
 * down) at 2 to 64 rows: cuBLAS (the default) against the split-K GEMM
 * (SHOAL_CUDA_GEMM_SPLITK=1) with its blocks a tile picked (auto) and
 * fixed at 2, 4 and 8; GB/s of weights + activations. */
static void gemm_sweep(kernels_backend *const *bes, const char *const *names, int nvar, bufs *b,
                       int reps)
{
    static const int shapes[][2] = {
        {(HEADS + 2 * KVH) * HD, HID}, {HID, HEADS * HD}, {INTER, HID}, {HID, INTER}};
    static const int rowss[] = {2, 8, 16, 32, 64};
    printf("\ndecode GEMMs, bf16: cuBLAS against the split-K GEMM, GB/s of weights + "
           "activations\n");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t ri = 0; ri < sizeof rowss / sizeof rowss[0]; ri++) {
            int rows = rowss[ri], n = shapes[s][0], k = shapes[s][1];
            char what[64];
            snprintf(what, sizeof what, "matmul %dx%d", n, k);
            for (int vi = 0; vi < nvar; vi++) {
                op o = {.kind = OP_MATMUL, .be = bes[vi], .b = b, .rows = rows, .n = n, .k = k};
                double w = (double)n * k * 2 + (double)rows * (n + k) * 2;
                row(what, names[vi], rows, time_op(&o, 32, reps), w, 2.0 * rows * n * k, 0,
                    NULL);
            }
        }
}

/* matmul_swiglu (gate and up, 24,576 x 4,096 joined, then silu(g) * u)
 * past the GEMV's rows: the passes (cuBLAS's batched GEMM, swiglu)
 * against gemm_rows.cu's shapes; GB/s of weights + activations. */
static void gate_up_sweep(kernels_backend *const *bes, const char *const *names, int nvar, bufs *b,
                          int reps)
{
    static const int rowss[] = {9, 16, 32, 48, 64};
    printf("\nmatmul_swiglu 2 x %dx%d, bf16: the passes against one kernel, GB/s of weights + "
           "activations\n",
           INTER, HID);
    for (size_t ri = 0; ri < sizeof rowss / sizeof rowss[0]; ri++)
        for (int vi = 0; vi < nvar; vi++) {
            op o = {.kind = OP_MATMUL_SWIGLU, .be = bes[vi], .b = b, .rows = rowss[ri]};
            double w = 2.0 * INTER * HID * 2 + (double)rowss[ri] * (HID + INTER) * 2;
            row("matmul gate+up, swiglu", names[vi], rowss[ri], time_op(&o, 32, reps), w,
                2.0 * rowss[ri] * 2 * INTER * HID, 0, NULL);
        }
}

typedef void sweep_fn(kernels_backend *const *bes, const char *const *names, int nvar, bufs *b,
                      int reps);

/* A backend for each variant (its environment: up to 3 variables,
 * NULL-ended), the sweep over them (7 repeats), the backends closed. */
static void variant_sweep(int device, const char *const *names, const char *const (*env)[4],
                          int nvar, sweep_fn *sweep)
{
    enum { MOST = 8 };
    SHOAL_ASSERT(nvar >= 1 && nvar <= MOST);
    kernels_backend *bes[MOST];
    for (int i = 0; i < nvar; i++)
        bes[i] = open_variant(device, false, 0, env[i]);
    bufs b;
    setup(bes[0], &b);
    sweep(bes, names, nvar, &b, 7);
    for (int i = nvar - 1; i >= 0; i--)
        kernels_backend_close(bes[i]);
}

static void sample_sweep(kernels_backend *nb, kernels_backend *pb, bufs *b, int reps)
{
    static const int rowss[] = {1, 64};
    printf("\ngreedy sampling, vocab %d (new: chunks by coalesced loads; prev: one block a row, "
           "SHOAL_CUDA_SAMPLE=0), GB/s of logits\n",
           VOCAB);
    for (int ri = 0; ri < 2; ri++)
        for (int vi = 0; vi < 2; vi++) {
            int rows = rowss[ri];
            op o = {.kind = OP_SAMPLE, .be = vi ? pb : nb, .b = b, .rows = rows};
            row("sample (greedy)", vi ? "prev" : "new", rows, time_op(&o, 20, reps),
                (double)rows * VOCAB * 4, 0, 0, NULL);
        }
}

/* Causal prompt attention, one stream: pbes/pnames the variants, new
 * first; vb (v1, the partials; slow) also where given. */
static void prompt_sweep(kernels_backend *const *pbes, const char *const *pnames, int npvar,
                         kernels_backend *vb, bufs *b, int reps, int only_n)
{
    printf("\ncausal prompt attention, one stream (32 q heads, 8 KV heads, 128 dims, bf16), "
           "FLOPs 2 n^2 d heads (causal half of 4 n^2 d)\n");
    static const int ns[] = {2048, 4096};
    for (int i = 0; i < 2; i++) {
        int n = only_n > 0 ? only_n : ns[i];
        if (only_n > 0 && i > 0)
            break;
        kernels_batch kb = make_batch(pbes[0], b, 1, n, n);
        char what[64];
        snprintf(what, sizeof what, "prompt %d tokens", n);
        for (int vi = 0; vi < npvar + (vb ? 1 : 0); vi++) {
            bool v1 = vi == npvar;
            op o = {.kind = OP_ATTENTION_PROMPT, .be = v1 ? vb : pbes[vi], .b = b, .rows = n,
                    .batch = kb};
            row(what, v1 ? "v1" : pnames[vi], n, time_op(&o, v1 ? 1 : 10, v1 ? 2 : reps), 0,
                2.0 * n * n * HD * HEADS, 0, NULL);
        }
    }
}

/* bes/names: the variants, new first; v1 (SIMT) is the last and slow;
 * pbes/pnames: the prompt kernel's variants (tiles), new first */
/* Paged decode attention at batch 1/32/64 and 4k/8k/32k context (and the
 * batch-64 step's 1k); bes/names: the variants, new first; with `v1` the
 * last is the first version (SIMT), slow, run fewer times. */
static void decode_sweep(kernels_backend *const *bes, const char *const *names, int nvar,
                         bool v1_last, bufs *b, int reps)
{
    static const int shapes[][2] = {{1, 4096},  {1, 8192},  {1, 32768}, {32, 4096}, {32, 8192},
                                    {32, 32768}, {64, 1024}, {64, 4096}, {64, 8192},
                                    {64, 32768}};
    printf("\npaged decode attention (32 q heads, 8 KV heads, 128 dims, bf16 KV in %d-token "
           "pages), effective KV read bandwidth\n",
           PT);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int B = shapes[si][0], C = shapes[si][1];
        kernels_batch kb = make_batch(bes[0], b, B, 1, C);
        double kv = (double)B * C * KVH * HD * 2 * 2;
        char what[64];
        snprintf(what, sizeof what, "decode b%d ctx%d", B, C);
        for (int vi = 0; vi < nvar; vi++) {
            bool v1 = v1_last && vi == nvar - 1;
            op o = {.kind = OP_ATTENTION, .be = bes[vi], .b = b, .rows = B, .batch = kb};
            int n = v1 ? 2 : (int)(4e8 / kv) + 2;
            if (n > 50)
                n = 50;
            row(what, names[vi], B, time_op(&o, n, v1 ? 3 : reps), kv, 0, 0, NULL);
        }
    }
}

static void attention_sweep(kernels_backend *const *bes, const char *const *names, int nvar,
                            kernels_backend *const *pbes, const char *const *pnames, int npvar,
                            bufs *b, int reps, bool quick)
{
    decode_sweep(bes, names, quick ? nvar - 1 : nvar, !quick, b, reps);
    prompt_sweep(pbes, pnames, npvar, quick ? NULL : bes[nvar - 1], b, reps, 0);
}

int main(int argc, char **argv)
{
    int device = 0;
    bool quick = false;
    int prompt_only = 0; /* tokens */
    bool decode_only = false, gemm_only = false;
    int one_b = 0, one_c = 0, one_r = 0; /* --attention B C, --swiglu R */
    int mm_n = 0, mm_k = 0, mm_r = 0;    /* --matmul N K R */
    int gate_up = -1;                    /* --gate-up [R]: 0 the sweep */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--device") == 0 && i + 1 < argc)
            device = atoi(argv[++i]);
        else if (strcmp(argv[i], "--quick") == 0)
            quick = true;
        else if (strcmp(argv[i], "--prompt") == 0 && i + 1 < argc)
            prompt_only = atoi(argv[++i]);
        else if (strcmp(argv[i], "--decode") == 0)
            decode_only = true;
        else if (strcmp(argv[i], "--gemm") == 0)
            gemm_only = true;
        else if (strcmp(argv[i], "--gate-up") == 0)
            gate_up = i + 1 < argc && argv[i + 1][0] != '-' ? atoi(argv[++i]) : 0;
        else if (strcmp(argv[i], "--attention") == 0 && i + 2 < argc) {
            one_b = atoi(argv[++i]);
            one_c = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--swiglu") == 0 && i + 1 < argc)
            one_r = atoi(argv[++i]);
        else if (strcmp(argv[i], "--matmul") == 0 && i + 3 < argc) {
            mm_n = atoi(argv[++i]);
            mm_k = atoi(argv[++i]);
            mm_r = atoi(argv[++i]);
        }
    }
    if (gate_up > 0) { /* matmul_swiglu alone, as the environment picks it (profiling) */
        if (gate_up > 64) {
            fprintf(stderr, "shoal-lab-ops: --gate-up takes 1 to 64 rows\n");
            return 2;
        }
        kernels_backend *be = open_variant(device, false, 0, NULL);
        bufs gbuf;
        setup(be, &gbuf);
        op o = {.kind = OP_MATMUL_SWIGLU, .be = be, .b = &gbuf, .rows = gate_up};
        row("matmul_swiglu", "env", gate_up, time_op(&o, 32, 3),
            2.0 * INTER * HID * 2 + (double)gate_up * (HID + INTER) * 2,
            2.0 * gate_up * 2 * INTER * HID, 0, NULL);
        kernels_backend_close(be);
        return 0;
    }
    if (gate_up == 0) {
        static const char *const names[] = {"passes",   "gemm96", "gemm64",
                                            "gemm96s4", "pre0",   "pre2"};
        static const char *const env[][4] = {
            {"SHOAL_CUDA_GEMM_SWIGLU=0", NULL},
            {"SHOAL_CUDA_GEMM_SWIGLU=1", NULL},
            {"SHOAL_CUDA_GEMM_SWIGLU=2", NULL},
            {"SHOAL_CUDA_GEMM_SWIGLU=3", NULL},
            {"SHOAL_CUDA_GEMM_SWIGLU=1", "SHOAL_CUDA_GEMM_ROWS_PRE=0", NULL},
            {"SHOAL_CUDA_GEMM_SWIGLU=1", "SHOAL_CUDA_GEMM_ROWS_PRE=2", NULL}};
        variant_sweep(device, names, env, sizeof names / sizeof names[0], gate_up_sweep);
        return 0;
    }
    if (mm_n || mm_k || mm_r) { /* one matmul alone, as the environment picks it (profiling) */
        if (mm_n < 1 || mm_n > INTER || mm_k < 1 || mm_k > INTER || mm_r < 1 || mm_r > 64) {
            fprintf(stderr, "shoal-lab-ops: --matmul takes n and k of 1 to %d and 1 to 64 rows\n",
                    INTER);
            return 2;
        }
        kernels_backend *be = open_variant(device, false, 0, NULL);
        bufs mbuf;
        setup(be, &mbuf);
        op o = {.kind = OP_MATMUL, .be = be, .b = &mbuf, .rows = mm_r, .n = mm_n, .k = mm_k};
        double w = (double)mm_n * mm_k * 2 + (double)mm_r * (mm_n + mm_k) * 2;
        row("matmul", "env", mm_r, time_op(&o, 32, 3), w, 2.0 * mm_r * mm_n * mm_k, 0, NULL);
        if (mm_r <= be->fused_norm_rows) { /* the same with the norm or the add inside */
            o.kind = OP_MATMUL_RMS;
            row("matmul_rms", "env", mm_r, time_op(&o, 32, 3), w, 2.0 * mm_r * mm_n * mm_k, 0,
                NULL);
            o.kind = OP_MATMUL_ADD;
            row("matmul_add", "env", mm_r, time_op(&o, 32, 3), w, 2.0 * mm_r * mm_n * mm_k, 0,
                NULL);
            double gu = (double)2 * INTER * HID * 2;
            o.kind = OP_MATMUL_SWIGLU;
            row("matmul_swiglu", "env", mm_r, time_op(&o, 32, 3), gu, 0, 0, NULL);
            o.kind = OP_MATMUL_SWIGLU_RMS;
            row("matmul_swiglu_rms", "env", mm_r, time_op(&o, 32, 3), gu, 0, 0, NULL);
        }
        kernels_backend_close(be);
        return 0;
    }
    if (one_b || one_c || one_r) { /* one op alone, as the environment picks it (profiling) */
        if ((one_b || one_c) &&
            (one_b < 1 || one_b > STREAMS_MAX || one_c < 16 || one_c > CTX_MAX)) {
            fprintf(stderr, "shoal-lab-ops: --attention takes a batch of 1 to %d and a context "
                            "of 16 to %d\n",
                    STREAMS_MAX, CTX_MAX);
            return 2;
        }
        if (one_r && (one_r < 1 || one_r > ROWS_MAX)) {
            fprintf(stderr, "shoal-lab-ops: --swiglu takes 1 to %d rows\n", ROWS_MAX);
            return 2;
        }
        kernels_backend *be = open_variant(device, false, 0, NULL);
        bufs obuf;
        setup(be, &obuf);
        op o = {.kind = one_r ? OP_SWIGLU : OP_ATTENTION, .be = be, .b = &obuf,
                .rows = one_r ? one_r : one_b};
        if (!one_r)
            o.batch = make_batch(be, &obuf, one_b, 1, one_c);
        double bytes = one_r ? (double)one_r * INTER * 2 * 3
                             : (double)one_b * one_c * KVH * HD * 2 * 2;
        row(one_r ? "swiglu" : "decode attention", "env", o.rows, time_op(&o, 4, 3), bytes, 0,
            0, NULL);
        kernels_backend_close(be);
        return 0;
    }
    if (prompt_only && (prompt_only < 16 || prompt_only > ROWS_MAX)) {
        fprintf(stderr, "shoal-lab-ops: --prompt takes 16 to %d tokens\n", ROWS_MAX);
        return 2;
    }
    if (prompt_only) { /* the prompt kernel alone, as the environment picks it (profiling) */
        kernels_backend *be = open_variant(device, false, 0, NULL);
        bufs pbuf;
        setup(be, &pbuf);
        const char *name = "env";
        prompt_sweep(&be, &name, 1, NULL, &pbuf, 3, prompt_only);
        kernels_backend_close(be);
        return 0;
    }
    static const char *const cpasync_env[] = {"SHOAL_CUDA_ATTN_TMA=0", NULL};
    static const char *const prev_tma_env[] = {"SHOAL_CUDA_ATTN_TMA=4",
                                               "SHOAL_CUDA_ATTN_BLOCKS=4", NULL};
    static const char *const halves_env[] = {"SHOAL_CUDA_ATTN_TMA_ROWS=0", NULL};
    static const char *const b4_env[] = {"SHOAL_CUDA_ATTN_BLOCKS=4", NULL};
    const char *pt_env = getenv("SHOAL_LAB_PAGE_TOKENS");
    if (pt_env) {
        PT = atoi(pt_env);
        if (PT < 8 || PT > 1024 || (PT & (PT - 1)) != 0) {
            fprintf(stderr, "shoal-lab-ops: SHOAL_LAB_PAGE_TOKENS takes a power of two, 8 to "
                            "1024\n");
            return 2;
        }
    }
    if (decode_only) { /* decode attention alone: the partials' staging variants */
        kernels_backend *bes[] = {open_variant(device, false, 0, NULL),
                                  open_variant(device, false, 0, prev_tma_env),
                                  open_variant(device, false, 0, b4_env),
                                  open_variant(device, false, 0, cpasync_env),
                                  open_variant(device, false, 0, halves_env)};
        const char *names[] = {"new", "prev", "blocks4", "cpasync", "halves"};
        enum { NV = sizeof bes / sizeof bes[0] };
        bufs dbuf;
        setup(bes[0], &dbuf);
        decode_sweep(bes, names, NV, false, &dbuf, 7);
        for (int i = NV - 1; i >= 0; i--)
            kernels_backend_close(bes[i]);
        return 0;
    }
    if (gemm_only) { /* the decode GEMMs alone: cuBLAS against the split-K GEMM */
        /* the split-K GEMM's blocks a tile (S) and stages fixed: sSxT */
        static const char *const names[] = {"cublas", "splitk", "s1x8", "s2x8",
                                            "s3x8",   "s4x4",   "s6x4"};
        static const char *const sk_env[][4] = {
            {NULL},
            {"SHOAL_CUDA_GEMM_SPLITK=1", NULL},
            {"SHOAL_CUDA_GEMM_SPLITK=1", "SHOAL_CUDA_GEMM_SPLITK_S=1",
             "SHOAL_CUDA_GEMM_SPLITK_STAGES=8", NULL},
            {"SHOAL_CUDA_GEMM_SPLITK=1", "SHOAL_CUDA_GEMM_SPLITK_S=2",
             "SHOAL_CUDA_GEMM_SPLITK_STAGES=8", NULL},
            {"SHOAL_CUDA_GEMM_SPLITK=1", "SHOAL_CUDA_GEMM_SPLITK_S=3",
             "SHOAL_CUDA_GEMM_SPLITK_STAGES=8", NULL},
            {"SHOAL_CUDA_GEMM_SPLITK=1", "SHOAL_CUDA_GEMM_SPLITK_S=4",
             "SHOAL_CUDA_GEMM_SPLITK_STAGES=4", NULL},
            {"SHOAL_CUDA_GEMM_SPLITK=1", "SHOAL_CUDA_GEMM_SPLITK_S=6",
             "SHOAL_CUDA_GEMM_SPLITK_STAGES=4", NULL}};
        variant_sweep(device, names, sk_env, sizeof names / sizeof names[0], gemm_sweep);
        return 0;
    }
    static const char *const prev_env[] = {"SHOAL_CUDA_SAMPLE=0", "SHOAL_CUDA_ATTN_FILL=0",
                                           "SHOAL_CUDA_ATTN_TMA=0", NULL};
    static const char *const merge_env[] = {"SHOAL_CUDA_ATTN_FILL=1", NULL};
    static const char *const stages_env[] = {"SHOAL_CUDA_ATTN_STAGES=3", "SHOAL_CUDA_ATTN_TMA=0",
                                             NULL};
    static const char *const blocks8_env[] = {"SHOAL_CUDA_ATTN_BLOCKS=8", NULL};
    static const char *const nowave_env[] = {"SHOAL_CUDA_ATTN_WAVE=0", NULL};
    static const char *const tile3_env[] = {"SHOAL_CUDA_PROMPT_TILE=3", NULL};
    static const char *const tile2_env[] = {"SHOAL_CUDA_PROMPT_TILE=2", NULL};
    static const char *const tile1_env[] = {"SHOAL_CUDA_PROMPT_TILE=1", NULL};
    static const char *const tile4_env[] = {"SHOAL_CUDA_PROMPT_TILE=4", NULL};
    static const char *const pass_env[] = {"SHOAL_CUDA_GEMV_SWIGLU=0", "SHOAL_CUDA_ROPE_KV=0",
                                           NULL};
    kernels_backend *nb = open_variant(device, false, 0, NULL);
    kernels_backend *vb = open_variant(device, true, 0, NULL);
    kernels_backend *gb = open_variant(device, false, 8, NULL); /* our GEMV up to 8 rows */
    kernels_backend *pb = open_variant(device, false, 0, prev_env);
    kernels_backend *mb = open_variant(device, false, 0, merge_env);
    kernels_backend *sb = open_variant(device, false, 0, pass_env);
    kernels_backend *tb = open_variant(device, false, 0, stages_env);
    kernels_backend *b8 = open_variant(device, false, 0, blocks8_env);
    kernels_backend *nw = open_variant(device, false, 0, nowave_env);
    kernels_backend *t3 = open_variant(device, false, 0, tile3_env);
    kernels_backend *t2 = open_variant(device, false, 0, tile2_env);
    kernels_backend *t1 = open_variant(device, false, 0, tile1_env);
    kernels_backend *t4 = open_variant(device, false, 0, tile4_env);
    bufs b;
    setup(nb, &b);
    int reps = 7;
    printf("decode step ops, batch 1, context 4096 (per call)\n");
    double dec = step_ops(nb, vb, sb, &b, 1, 1, 4096, 20, reps);
    double weights = 2.0 * ((double)VOCAB * HID +
                            LAYERS * ((double)HID * HEADS * HD * 2 + 2.0 * HID * KVH * HD +
                                      3.0 * HID * INTER));
    printf("  => new: %.1f tokens/s if the step were its ops' GPU time alone; %.2f GB of "
           "weights per step\n",
           1.0 / dec, weights / 1e9);
    printf("\ndecode step ops, batch 64, context 1024 (per call)\n");
    double dec64 = step_ops(nb, vb, sb, &b, 64, 1, 1024, 10, reps);
    printf("  => new: %.1f tokens/s if the step were its ops' GPU time alone\n", 64.0 / dec64);
    printf("\nprefill ops, 2048 tokens of one stream (per call)\n");
    step_ops(nb, vb, sb, &b, 1, 2048, 2048, 3, 5);
    gemv_vs_cublas(gb, vb, &b, reps);
    sample_sweep(nb, pb, &b, reps);
    kernels_backend *ca = open_variant(device, false, 0, cpasync_env);
    kernels_backend *attn_bes[] = {nb, ca, nw, b8, tb, mb, pb, vb};
    const char *attn_names[] = {"new",     "cpasync", "nowave", "blocks8",
                                "stages3", "merge",   "prev",   "v1"};
    kernels_backend *prompt_bes[] = {nb, t4, t1, t2, t3};
    const char *prompt_names[] = {"new", "wgmma", "mma64", "rows32", "warps8"};
    attention_sweep(attn_bes, attn_names, 8, prompt_bes, prompt_names, 5, &b, reps, quick);
    kernels_backend_close(ca);
    kernels_backend_close(t4);
    kernels_backend_close(t1);
    kernels_backend_close(t2);
    kernels_backend_close(t3);
    kernels_backend_close(nw);
    kernels_backend_close(b8);
    kernels_backend_close(tb);
    kernels_backend_close(sb);
    kernels_backend_close(mb);
    kernels_backend_close(pb);
    kernels_backend_close(gb);
    kernels_backend_close(vb);
    kernels_backend_close(nb);
    return 0;
}
