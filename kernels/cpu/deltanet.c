/* Gated DeltaNet ops (kernels_backend.h): the causal conv with its state,
 * the gated delta rule token by token, the gated RMSNorm, and the sigmoid
 * gate and add that the hybrid models' attention and shared expert take.
 * Each stream's rows run in order in one task (its state is a chain), so
 * results do not depend on how a batch is made. */
#include "cpu_ops.h"

#include "common/common_assert.h"

#include <math.h>
#include <string.h>

/* The runs of rows of one stream in a batch: [start[i], start[i + 1]). */
typedef struct stream_runs {
    int count;
    int start[SHOAL_BATCH_ROWS_MAX + 1];
} stream_runs;

static void runs_of(const kernels_batch *b, stream_runs *out)
{
    SHOAL_ASSERT(b->rows >= 1 && b->rows <= SHOAL_BATCH_ROWS_MAX);
    out->count = 0;
    for (int r = 0; r < b->rows; r++)
        if (r == 0 || b->row_stream[r] != b->row_stream[r - 1])
            out->start[out->count++] = r;
    out->start[out->count] = b->rows;
}

static float *slot_state(float *states, size_t slot_stride, const int32_t *slots, int stream)
{
    int slot = slots ? slots[stream] : stream;
    return (float *)((unsigned char *)states + (size_t)slot * slot_stride);
}

static float silu(float x)
{
    return x / (1.0f + expf(-x));
}

struct conv_job {
    float *out;
    const float *in;
    int in_stride, channels, kernel;
    const float *w;
    float *states;
    size_t slot_stride;
    const int32_t *slots;
    const kernels_batch *batch;
    const stream_runs *runs;
};

static void conv_task(void *ctx, int run, int thread)
{
    (void)thread;
    const struct conv_job *j = ctx;
    int r0 = j->runs->start[run], r1 = j->runs->start[run + 1];
    int c_n = j->channels, k_n = j->kernel, hist = k_n - 1;
    float *st = slot_state(j->states, j->slot_stride, j->slots, j->batch->row_stream[r0]);
    if (j->batch->positions[r0] == 0)
        memset(st, 0, (size_t)c_n * (size_t)hist * sizeof *st);
    for (int c = 0; c < c_n; c++) {
        float *h = st + (size_t)c * (size_t)hist; /* oldest first */
        const float *w = j->w + (size_t)c * (size_t)k_n;
        for (int r = r0; r < r1; r++) {
            float x = j->in[(size_t)r * (size_t)j->in_stride + (size_t)c];
            float acc = 0.0f;
            for (int t = 0; t < hist; t++)
                acc += w[t] * h[t];
            acc += w[hist] * x;
            j->out[(size_t)r * (size_t)c_n + (size_t)c] = silu(acc);
            if (hist > 0) {
                memmove(h, h + 1, (size_t)(hist - 1) * sizeof *h);
                h[hist - 1] = x;
            }
        }
    }
}

void cpu_deltanet_conv(kernels_backend *be, void *out, const void *in, int in_stride,
                       const float *w, int channels, int kernel, void *states, size_t slot_stride,
                       const int32_t *slots, const kernels_batch *batch)
{
    static _Thread_local stream_runs runs;
    runs_of(batch, &runs);
    struct conv_job j = {out,    in,          in_stride, channels, kernel, w,
                         states, slot_stride, slots,     batch,    &runs};
    common_pool_run(cpu_of(be)->pool, runs.count, conv_task, &j);
}

struct rule_job {
    float *out;
    const float *x;
    const float *b, *a;
    int ba_stride;
    const float *decay, *dt_bias;
    int k_heads, v_heads, k_dim, v_dim;
    float *states;
    size_t slot_stride;
    const int32_t *slots;
    const kernels_batch *batch;
    const stream_runs *runs;
};

static void l2_normalize(float *x, int n)
{
    float inv = 1.0f / sqrtf(cpu_sum_squares(x, n) + 1e-6f);
    for (int i = 0; i < n; i++)
        x[i] *= inv;
}

/* transformers' softplus: x past 20 is itself */
static float softplus(float x)
{
    return x > 20.0f ? x : log1pf(expf(x));
}

static void rule_task(void *ctx, int task, int thread)
{
    (void)thread;
    const struct rule_job *j = ctx;
    int run = task / j->v_heads, h = task % j->v_heads;
    int r0 = j->runs->start[run], r1 = j->runs->start[run + 1];
    int dk = j->k_dim, dv = j->v_dim, kh = h / (j->v_heads / j->k_heads);
    int kd = j->k_heads * dk, x_stride = 2 * kd + j->v_heads * dv;
    float *s = slot_state(j->states, j->slot_stride, j->slots, j->batch->row_stream[r0]) +
               (size_t)h * (size_t)dk * (size_t)dv;
    if (j->batch->positions[r0] == 0)
        memset(s, 0, (size_t)dk * (size_t)dv * sizeof *s);
    float q[SHOAL_MODEL_HEAD_DIM_MAX], k[SHOAL_MODEL_HEAD_DIM_MAX], u[SHOAL_MODEL_HEAD_DIM_MAX];
    float qscale = 1.0f / sqrtf((float)dk);
    for (int r = r0; r < r1; r++) {
        const float *row = j->x + (size_t)r * (size_t)x_stride;
        memcpy(q, row + (size_t)kh * (size_t)dk, (size_t)dk * sizeof *q);
        memcpy(k, row + (size_t)kd + (size_t)kh * (size_t)dk, (size_t)dk * sizeof *k);
        const float *v = row + (size_t)(2 * kd) + (size_t)h * (size_t)dv;
        l2_normalize(q, dk);
        l2_normalize(k, dk);
        for (int i = 0; i < dk; i++)
            q[i] *= qscale;
        float braw = j->b[(size_t)r * (size_t)j->ba_stride + (size_t)h];
        float araw = j->a[(size_t)r * (size_t)j->ba_stride + (size_t)h];
        float beta = 1.0f / (1.0f + expf(-braw));
        float decay = expf(j->decay[h] * softplus(araw + j->dt_bias[h]));
        /* S = decay S; u = S^T k; delta = beta (v - u); S += k delta^T;
         * out = S^T q */
        for (int c = 0; c < dv; c++)
            u[c] = 0.0f;
        for (int i = 0; i < dk; i++) {
            float *si = s + (size_t)i * (size_t)dv;
            for (int c = 0; c < dv; c++) {
                si[c] *= decay;
                u[c] += si[c] * k[i];
            }
        }
        for (int c = 0; c < dv; c++)
            u[c] = (v[c] - u[c]) * beta;
        float *o = j->out + (size_t)r * (size_t)(j->v_heads * dv) + (size_t)h * (size_t)dv;
        for (int c = 0; c < dv; c++)
            o[c] = 0.0f;
        for (int i = 0; i < dk; i++) {
            float *si = s + (size_t)i * (size_t)dv;
            for (int c = 0; c < dv; c++) {
                si[c] += k[i] * u[c];
                o[c] += si[c] * q[i];
            }
        }
    }
}

void cpu_deltanet_rule(kernels_backend *be, void *out, const void *x, const void *b, const void *a,
                       int ba_stride, const float *decay, const float *dt_bias, int k_heads,
                       int v_heads, int k_dim, int v_dim, void *states, size_t slot_stride,
                       const int32_t *slots, const kernels_batch *batch)
{
    static _Thread_local stream_runs runs;
    runs_of(batch, &runs);
    struct rule_job j = {out,     x,     b,     a,      ba_stride,   decay, dt_bias, k_heads,
                         v_heads, k_dim, v_dim, states, slot_stride, slots, batch,   &runs};
    common_pool_run(cpu_of(be)->pool, runs.count * v_heads, rule_task, &j);
}

struct gated_job {
    float *out;
    const float *x, *z, *w;
    int heads, dim;
    float eps;
};

static void gated_task(void *ctx, int r, int thread)
{
    (void)thread;
    const struct gated_job *j = ctx;
    for (int h = 0; h < j->heads; h++) {
        size_t off = ((size_t)r * (size_t)j->heads + (size_t)h) * (size_t)j->dim;
        const float *x = j->x + off, *z = j->z + off;
        float inv = 1.0f / sqrtf(cpu_sum_squares(x, j->dim) / (float)j->dim + j->eps);
        for (int i = 0; i < j->dim; i++)
            j->out[off + (size_t)i] = x[i] * inv * j->w[i] * silu(z[i]);
    }
}

void cpu_rmsnorm_gated(kernels_backend *be, void *out, const void *x, const void *z, const float *w,
                       int rows, int heads, int dim, float eps)
{
    struct gated_job j = {out, x, z, w, heads, dim, eps};
    common_pool_run(cpu_of(be)->pool, rows, gated_task, &j);
}

struct sig_job {
    float *x;
    const float *gate;
    int n, gate_stride, gate_cols;
};

static void sig_task(void *ctx, int r, int thread)
{
    (void)thread;
    const struct sig_job *j = ctx;
    float *x = j->x + (size_t)r * (size_t)j->n;
    const float *g = j->gate + (size_t)r * (size_t)j->gate_stride;
    for (int i = 0; i < j->n; i++)
        x[i] *= 1.0f / (1.0f + expf(-g[j->gate_cols == 1 ? 0 : i]));
}

void cpu_mul_sigmoid(kernels_backend *be, void *x, const void *gate, int rows, int n,
                     int gate_stride, int gate_cols)
{
    struct sig_job j = {x, gate, n, gate_stride, gate_cols};
    common_pool_run(cpu_of(be)->pool, rows, sig_task, &j);
}

struct add_job {
    float *x;
    const float *y;
    int n;
};

static void add_task(void *ctx, int r, int thread)
{
    (void)thread;
    const struct add_job *j = ctx;
    for (int i = 0; i < j->n; i++)
        j->x[(size_t)r * (size_t)j->n + (size_t)i] += j->y[(size_t)r * (size_t)j->n + (size_t)i];
}

void cpu_add(kernels_backend *be, void *x, const void *y, int rows, int n)
{
    struct add_job j = {x, y, n};
    common_pool_run(cpu_of(be)->pool, rows, add_task, &j);
}
