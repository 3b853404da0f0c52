/* shoal-lab-deltanet: the CUDA backend's gated DeltaNet ops alone, at the
 * linear-attention layers of Qwen3.5-27B (16 key heads, 48 value heads of
 * 128) and Qwen3.5-35B-A3B (16 and 32), bf16 activations, F32 states.
 *
 *   shoal-lab-deltanet [--device N] [--prefill T]
 *
 * Prints, for each shape:
 *   prefill  deltanet_rule over one stream's T-token prompt (default 8,192)
 *            from position 0, with the recurrent kernel and with the chunked
 *            one (a second backend opened with SHOAL_CUDA_DELTANET_CHUNK=1;
 *            runs of 64 rows and more): the time, and the TFLOP/s of the chunked form's
 *            work (per value head and chunk of 64: k k^T, the WY solve, the
 *            state pass and the outputs; fla's count, tools/bench/fla_peer.py
 *            prints the same for its Triton kernel);
 *   decode   deltanet_rule and deltanet_conv of one row for 1 and 64
 *            streams: the time and the GB/s of the states read and written
 *            (each stream's [v_heads][128][128] F32 matrix once each way,
 *            and its conv window), against the copy bandwidth that
 *            shoal-gpu-membw measures in the same call.
 * Each figure is the median of 20 replays of a recorded graph. */
#include "kernels/kernels_backend.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what)
{
    fprintf(stderr, "shoal-lab-deltanet: %s\n", what);
    exit(1);
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

static uint64_t rng = 12345;

static float frand(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) & 0xffffff) / 16777216.0f - 0.5f;
}

typedef struct shape {
    const char *name;
    int k_heads, v_heads, dim, conv;
} shape;

typedef struct run {
    kernels_backend *be;
    const shape *sh;
    int rows, streams;
    kernels_batch batch;
    void *x, *b, *a, *out, *conv_out, *states;
    float *conv_w, *decay, *dt_bias;
    int32_t *slots;
    size_t slot_bytes, conv_bytes;
    bool conv_too;
} run;

static int conv_dim(const shape *sh)
{
    return 2 * sh->k_heads * sh->dim + sh->v_heads * sh->dim;
}

/* Buffers for `streams` streams of `rows_each` rows at position `pos0`. */
static void setup(run *r, kernels_backend *be, const shape *sh, int streams, int rows_each,
                  int pos0)
{
    memset(r, 0, sizeof *r);
    r->be = be;
    r->sh = sh;
    r->streams = streams;
    r->rows = streams * rows_each;
    int cd = conv_dim(sh), nv = sh->v_heads;
    size_t a = shoal_dtype_bytes(be->act_dtype), rows = (size_t)r->rows;
    r->conv_bytes = (size_t)cd * (size_t)(sh->conv - 1) * 4;
    r->slot_bytes = r->conv_bytes + (size_t)nv * sh->dim * sh->dim * 4;
    int32_t *pos = malloc(rows * 4), *rs = malloc(rows * 4), *sl = malloc((size_t)streams * 4);
    for (int s = 0; s < streams; s++) {
        sl[s] = streams - 1 - s; /* slots permuted, as the engine's are */
        for (int i = 0; i < rows_each; i++) {
            pos[s * rows_each + i] = pos0 + i;
            rs[s * rows_each + i] = s;
        }
    }
    r->batch.rows = r->rows;
    r->batch.streams = streams;
    r->batch.page_table_stride = 1;
    r->batch.positions = dupload(be, pos, rows * 4);
    r->batch.row_stream = dupload(be, rs, rows * 4);
    r->batch.one_row_per_stream = rows_each == 1;
    r->slots = dupload(be, sl, (size_t)streams * 4);
    free(pos), free(rs), free(sl);
    /* random inputs in the act dtype: x of [q | k | v], b, a */
    size_t xn = rows * (size_t)cd, bn = rows * (size_t)nv;
    float *h = malloc((xn > (size_t)cd * sh->conv ? xn : (size_t)cd * sh->conv) * 4);
    uint16_t *h16 = malloc(xn * 2);
    for (size_t i = 0; i < xn; i++)
        h[i] = frand();
    r->x = dalloc(be, xn * a);
    r->b = dalloc(be, bn * a);
    r->a = dalloc(be, bn * a);
    if (be->act_dtype == SHOAL_DTYPE_BF16) {
        for (size_t i = 0; i < xn; i++)
            h16[i] = shoal_f32_to_bf16(h[i]);
        be->upload(be, r->x, h16, xn * 2);
        be->upload(be, r->b, h16, bn * 2);
        be->upload(be, r->a, h16 + bn, bn * 2);
    } else {
        be->upload(be, r->x, h, xn * 4);
        be->upload(be, r->b, h, bn * 4);
        be->upload(be, r->a, h + bn, bn * 4);
    }
    for (int i = 0; i < cd * sh->conv; i++)
        h[i] = frand();
    r->conv_w = dupload(be, h, (size_t)cd * sh->conv * 4);
    float dec[256], dtb[256];
    for (int i = 0; i < nv; i++) {
        dec[i] = -expf(logf(0.05f + 0.45f * (frand() + 0.5f)));
        dtb[i] = frand();
    }
    r->decay = dupload(be, dec, (size_t)nv * 4);
    r->dt_bias = dupload(be, dtb, (size_t)nv * 4);
    r->out = dalloc(be, rows * (size_t)nv * sh->dim * a);
    r->conv_out = dalloc(be, xn * a);
    r->states = dalloc(be, (size_t)streams * r->slot_bytes);
    free(h), free(h16);
}

static void call(run *r)
{
    kernels_backend *be = r->be;
    const shape *sh = r->sh;
    int cd = conv_dim(sh);
    if (r->conv_too)
        be->deltanet_conv(be, r->conv_out, r->x, cd, r->conv_w, cd, sh->conv, r->states,
                          r->slot_bytes, r->slots, &r->batch);
    be->deltanet_rule(be, r->out, r->x, r->b, r->a, sh->v_heads, r->decay, r->dt_bias,
                      sh->k_heads, sh->v_heads, sh->dim, sh->dim,
                      (unsigned char *)r->states + r->conv_bytes, r->slot_bytes, r->slots,
                      &r->batch);
}

/* Median seconds of one call, from 20 replays of a graph of `n` calls. */
static double time_run(run *r, int n)
{
    kernels_backend *be = r->be;
    call(r); /* warm: modules load outside the graph */
    if (be->sync(be) != SHOAL_OK)
        die("the op failed");
    if (be->graph_begin(be) != SHOAL_OK)
        die("cannot record a graph");
    for (int i = 0; i < n; i++)
        call(r);
    if (be->graph_end(be, 0) != SHOAL_OK || be->graph_launch(be, 0) != SHOAL_OK ||
        be->sync(be) != SHOAL_OK)
        die("the recorded op failed");
    double t[20];
    for (int i = 0; i < 20; i++) {
        double t0 = now_s();
        be->graph_launch(be, 0);
        if (be->sync(be) != SHOAL_OK)
            die("the recorded op failed");
        t[i] = now_s() - t0;
    }
    for (int i = 1; i < 20; i++)
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            double x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    return t[10] / n;
}

static void release(run *r)
{
    kernels_backend *be = r->be;
    void *ptrs[] = {(void *)r->batch.positions, (void *)r->batch.row_stream, r->slots, r->x,
                    r->b, r->a, r->conv_w, r->decay, r->dt_bias, r->out, r->conv_out,
                    r->states};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
        be->free(be, ptrs[i]);
}

int main(int argc, char **argv)
{
    const char *device = "0";
    int prefill = 8192;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--device") == 0)
            device = argv[i + 1];
        else if (strcmp(argv[i], "--prefill") == 0)
            prefill = atoi(argv[i + 1]);
        else
            die("usage: shoal-lab-deltanet [--device N] [--prefill T]");
    }
    if (prefill < 1 || prefill > 32768)
        die("--prefill: 1 to 32768 tokens");
    kernels_backend_options opt = {.device = device, .act_dtype = SHOAL_DTYPE_BF16};
    kernels_backend *be = NULL;
    shoal_diag diag = {{0}};
    setenv("SHOAL_CUDA_DELTANET_CHUNK", "0", 1); /* the recurrent rule (bf16's default is chunked) */
    shoal_err opened = kernels_backend_open(&opt, &be, &diag);
    unsetenv("SHOAL_CUDA_DELTANET_CHUNK");
    if (opened != SHOAL_OK)
        die(diag.msg);
    if (!be->deltanet_rule || !be->deltanet_conv)
        die("this backend has no gated DeltaNet ops");
    /* the switch is read at open: a second backend for the chunked form */
    kernels_backend *be_chunk = NULL;
    setenv("SHOAL_CUDA_DELTANET_CHUNK", "1", 1);
    shoal_err e = kernels_backend_open(&opt, &be_chunk, &diag);
    unsetenv("SHOAL_CUDA_DELTANET_CHUNK");
    if (e != SHOAL_OK)
        die(diag.msg);
    static const shape shapes[] = {{"qwen3.5-27b", 16, 48, 128, 4},
                                   {"qwen3.5-35b-a3b", 16, 32, 128, 4}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const shape *sh = &shapes[si];
        run r;
        /* the chunked form's FLOPs a value head and chunk of C = 64, as fla
         * counts them: k k^T (C^2 K), the WY products (2 C^2 V + C^2 K),
         * the state pass (2 C K V for u - w S, 2 C K V for S += k^T u),
         * and the output (C K V + C^2 K + C^2 V), times 2 a multiply-add */
        double C = 64, K = sh->dim, V = sh->dim, chunks = ceil(prefill / C);
        double flops = 2.0 * sh->v_heads * chunks *
                       (C * C * K * 3 + C * C * V * 3 + 5 * C * K * V);
        for (int chunked = 0; chunked < 2; chunked++) {
            setup(&r, chunked ? be_chunk : be, sh, 1, prefill, 0);
            double t = time_run(&r, 2);
            printf("%-16s prefill (%s): %d tokens in %.3f ms, %.1f TFLOP/s (chunked-form "
                   "work), %.0f tokens/s\n",
                   sh->name, chunked ? "chunked" : "recurrent", prefill, t * 1e3,
                   flops / t / 1e12, prefill / t);
            release(&r);
        }
        static const int batches[] = {1, 64};
        for (int bi = 0; bi < 2; bi++) {
            int streams = batches[bi];
            setup(&r, be, sh, streams, 1, 100);
            double tr = time_run(&r, 20);
            r.conv_too = true;
            double tc = time_run(&r, 20) - tr;
            double state = (double)streams * (r.slot_bytes - r.conv_bytes) * 2;
            double window = (double)streams * r.conv_bytes * 2;
            printf("%-16s decode, %2d stream(s): rule %.2f us (%.0f GB/s of its states), conv "
                   "%.2f us (%.0f GB/s of its windows); a layer's state is %.2f MiB a stream\n",
                   sh->name, streams, tr * 1e6, state / tr / 1e9, tc * 1e6,
                   tc > 0 ? window / tc / 1e9 : 0.0, (double)r.slot_bytes / 1048576.0);
            release(&r);
        }
    }
    kernels_backend_close(be_chunk);
    kernels_backend_close(be);
    return 0;
}
