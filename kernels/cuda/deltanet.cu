/* Gated DeltaNet ops: the twins of kernels/cpu/deltanet.c (contracts in
 * kernels_backend.h). The causal conv with its state, the gated delta rule
 * row by row with its state, the gated RMSNorm, the sigmoid gate and the
 * add.
 *
 * A stream's rows are a chain through its state, so the conv and the rule
 * work on runs (a stream's consecutive rows in the batch), each run's
 * state read once and written once by the block that owns it. Where the
 * runs come from: CUDA_DELTANET_WALK_ROWS in cuda_ops.h. */
#include "attention_mma.cuh"
#include "cuda_ops.h"

#include <limits.h>

/* ---- a batch's runs ---- */

/* Rows of one run a conv thread takes for its channel (an item). At
 * least the longest conv's history, so that only a run's first item reads
 * the state from before the run, and that item's thread alone writes it. */
enum { CONV_ITEM_ROWS = 16 };
static_assert(CONV_ITEM_ROWS >= SHOAL_MODEL_CONV_KERNEL_MAX - 1,
              "a run's later items must find their history in the run's rows");

enum { LIST_THREADS = 1024, LIST_ROWS_PER_THREAD = (SHOAL_BATCH_ROWS_MAX + 1023) / 1024 };

/* The listing pass's scratch (cuda_state.deltanet_runs): [0] the run count,
 * [1] the conv's item count, then the run starts (count + 1: the last is
 * rows), then each run's first item (count + 1: the last is the total). */
static __device__ __forceinline__ const int32_t *list_starts(const int32_t *list)
{
    return list + 2;
}
static __device__ __forceinline__ const int32_t *list_items(const int32_t *list)
{
    return list + 2 + (SHOAL_BATCH_ROWS_MAX + 1);
}

/* Exclusive prefix sum of every thread's v over the block; *total gets the
 * sum. shared holds 32 ints. */
static __device__ int block_exclusive_scan(int v, int *shared, int *total)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    int incl = v;
    for (int o = 1; o < 32; o <<= 1) {
        int t = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o)
            incl += t;
    }
    __syncthreads(); /* shared may still be read from a previous scan */
    if (lane == 31)
        shared[warp] = incl;
    __syncthreads();
    int before = 0, sum = 0;
    for (int w = 0; w < warps; w++) {
        sum += shared[w];
        if (w < warp)
            before += shared[w];
    }
    *total = sum;
    return before + incl - v;
}

static __device__ __forceinline__ bool starts_run(const int32_t *row_stream, int r)
{
    return r == 0 || row_stream[r] != row_stream[r - 1];
}

/* One block of LIST_THREADS: the runs of rows, and the conv's items. */
static __global__ void list_runs_kernel(int32_t *list, const int32_t *row_stream, int rows)
{
    __shared__ int scan[32];
    int32_t *starts = list + 2, *items = list + 2 + (SHOAL_BATCH_ROWS_MAX + 1);
    int first = (int)threadIdx.x * LIST_ROWS_PER_THREAD;
    int mine = 0;
    for (int i = 0; i < LIST_ROWS_PER_THREAD; i++)
        mine += first + i < rows && starts_run(row_stream, first + i);
    int count;
    int at = block_exclusive_scan(mine, scan, &count);
    for (int i = 0; i < LIST_ROWS_PER_THREAD; i++)
        if (first + i < rows && starts_run(row_stream, first + i))
            starts[at++] = first + i;
    if (threadIdx.x == 0) {
        starts[count] = rows;
        list[0] = count;
    }
    __syncthreads(); /* the block's writes of starts are visible to it after this */
    mine = 0;
    for (int i = 0; i < LIST_ROWS_PER_THREAD; i++)
        if (first + i < count)
            mine +=
                (starts[first + i + 1] - starts[first + i] + CONV_ITEM_ROWS - 1) / CONV_ITEM_ROWS;
    int total;
    at = block_exclusive_scan(mine, scan, &total);
    for (int i = 0; i < LIST_ROWS_PER_THREAD; i++)
        if (first + i < count) {
            items[first + i] = at;
            at += (starts[first + i + 1] - starts[first + i] + CONV_ITEM_ROWS - 1) / CONV_ITEM_ROWS;
        }
    if (threadIdx.x == 0) {
        items[count] = total;
        list[1] = total;
    }
}

/* Where a kernel finds run z: in the list, or (list NULL) at row z, which
 * the unit skips unless it starts a run. */
struct dn_runs {
    const int32_t *list;
    const int32_t *row_stream;
    int rows;
};

/* A run: rows [r0, r1) of the batch's stream `stream`. */
struct dn_run {
    int r0, r1, stream;
};

/* Run z; false where there is none (z past the listed count, or row z
 * inside a run). Every thread of a block gets the same answer. */
static __device__ bool run_at(const dn_runs &R, int z, dn_run *run)
{
    const int32_t *rs = R.row_stream;
    if (R.list) {
        if (z >= R.list[0])
            return false;
        run->r0 = list_starts(R.list)[z];
        run->r1 = list_starts(R.list)[z + 1];
        run->stream = rs[run->r0];
        return true;
    }
    /* the row before, the row and the row after in one round trip: at
     * one row a stream that settles the run, and the slot's lookup (and
     * then the state's) follows at once */
    int before = rs[max(z - 1, 0)], stream = rs[z], after = rs[min(z + 1, R.rows - 1)];
    if (z > 0 && before == stream)
        return false;
    int end = z + 1;
    if (end < R.rows && after == stream) {
        end++;
        while (end < R.rows && rs[end] == stream)
            end++;
    }
    run->r0 = z;
    run->r1 = end;
    run->stream = stream;
    return true;
}

/* Units past the listed count or rows: none (the loops over them end). */
static __device__ __forceinline__ int units_of(const dn_runs &R, bool conv_items)
{
    return R.list ? R.list[conv_items ? 1 : 0] : R.rows;
}

static __device__ __forceinline__ float *slot_state(float *states, size_t slot_stride,
                                                    const int32_t *slots, int stream)
{
    int slot = slots ? slots[stream] : stream;
    return (float *)((unsigned char *)states + (size_t)slot * slot_stride);
}

/* The runs of a batch for the ops' kernels: listed first where the batch
 * has more than CUDA_DELTANET_WALK_ROWS rows past one a stream. *units
 * gets the grid's size for them: a bound on the runs (or rows) that the
 * kernels' loops cover past. */
static dn_runs runs_for(kernels_backend *be, const kernels_batch *B, int *units)
{
    cuda_state *st = cuda_of(be);
    dn_runs R = {NULL, B->row_stream, B->rows};
    if (B->rows <= B->streams + CUDA_DELTANET_WALK_ROWS) {
        *units = B->rows;
        return R;
    }
    list_runs_kernel<<<1, LIST_THREADS, 0, st->stream>>>(st->deltanet_runs, B->row_stream, B->rows);
    cuda_launched(be, "deltanet: list runs");
    R.list = st->deltanet_runs;
    /* every stream's rows are one run (kernels_backend.h); a batch that
     * broke that would still be covered, by the loops, only slower */
    *units = B->streams > 0 && B->streams < B->rows ? B->streams : B->rows;
    return R;
}

static __device__ __forceinline__ float silu(float x)
{
    return x / (1.0f + expf(-x));
}

static __device__ __forceinline__ float sigmoid(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

/* transformers' softplus, as the CPU twin: x past 20 is itself */
static __device__ __forceinline__ float softplus(float x)
{
    return x > 20.0f ? x : log1pf(expf(x));
}

/* ---- deltanet_conv ---- */

enum { CONV_THREADS = 128, CONV_K = SHOAL_MODEL_CONV_KERNEL_MAX };

/* A thread a channel of an item: CONV_ITEM_ROWS rows of a run (listed), or
 * a whole run (walked). Its weights sit right-aligned in CONV_K registers
 * (zeros before) and its window holds the CONV_K - 1 inputs before the
 * row, so every index is known at compile time. A run's first item reads
 * the state before the run (or zeros at position 0) and writes the state
 * after it; later items read their history from the run's rows. */
template <typename T>
static __global__ void conv_kernel(T *out, const T *in, int in_stride, const float *w, int channels,
                                   int kernel, float *states, size_t slot_stride,
                                   const int32_t *slots, const kernels_batch B, const dn_runs R)
{
    pdl_trigger(); /* a GEMV after may start fetching its weights */
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= channels)
        return; /* no barriers below */
    const int hist = kernel - 1;
    float wt[CONV_K];
#pragma unroll
    for (int j = 0; j < CONV_K; j++) {
        int t = j - (CONV_K - kernel);
        wt[j] = t >= 0 ? w[(size_t)c * (size_t)kernel + (size_t)t] : 0.0f;
    }
    const int units = units_of(R, true);
    for (int y = blockIdx.y; y < units; y += gridDim.y) {
        dn_run run;
        int ra, rb;
        if (R.list) {
            /* the run whose items hold y: the last with items[k] <= y */
            const int32_t *items = list_items(R.list);
            int lo = 0, hi = R.list[0] - 1;
            while (lo < hi) {
                int mid = (lo + hi + 1) / 2;
                if (items[mid] <= y)
                    lo = mid;
                else
                    hi = mid - 1;
            }
            run.r0 = list_starts(R.list)[lo];
            run.r1 = list_starts(R.list)[lo + 1];
            run.stream = B.row_stream[run.r0];
            ra = run.r0 + (y - items[lo]) * CONV_ITEM_ROWS;
            rb = min(run.r1, ra + CONV_ITEM_ROWS);
        } else {
            if (!run_at(R, y, &run))
                continue;
            ra = run.r0;
            rb = run.r1;
        }
        const int r0 = run.r0, r1 = run.r1;
        const bool first = ra == r0;
        float *st = slot_state(states, slot_stride, slots, run.stream) + (size_t)c * (size_t)hist;
        /* win[j]: the input CONV_K - 1 - j rows before ra */
        float win[CONV_K - 1];
        const bool zero = B.positions[r0] == 0;
#pragma unroll
        for (int j = 0; j < CONV_K - 1; j++) {
            int back = CONV_K - 1 - j; /* 1 .. CONV_K - 1 */
            float v = 0.0f;
            if (back <= hist) {
                if (!first)
                    v = to_f32(in[(size_t)(ra - back) * (size_t)in_stride + (size_t)c]);
                else if (!zero)
                    v = st[hist - back]; /* oldest first */
            }
            win[j] = v;
        }
        for (int r = ra; r < rb; r++) {
            float x = to_f32(in[(size_t)r * (size_t)in_stride + (size_t)c]);
            float acc = 0.0f;
#pragma unroll
            for (int j = 0; j < CONV_K - 1; j++)
                acc += wt[j] * win[j];
            acc += wt[CONV_K - 1] * x;
            out[(size_t)r * (size_t)channels + (size_t)c] = from_f32<T>(silu(acc));
#pragma unroll
            for (int j = 0; j < CONV_K - 2; j++)
                win[j] = win[j + 1];
            win[CONV_K - 2] = x;
        }
        if (!first || hist == 0)
            continue;
        if (rb == r1) {
            /* the window is the tail of [state, the run's inputs] */
#pragma unroll
            for (int j = 0; j < CONV_K - 1; j++) {
                int back = CONV_K - 1 - j;
                if (back <= hist)
                    st[hist - back] = win[j];
            }
        } else {
            /* a run longer than an item: its last inputs are rows of in */
            for (int t = 0; t < hist; t++)
                st[t] = to_f32(in[(size_t)(r1 - hist + t) * (size_t)in_stride + (size_t)c]);
        }
    }
}

void cuda_deltanet_conv(kernels_backend *be, void *out, const void *in, int in_stride,
                        const float *w, int channels, int kernel, void *states, size_t slot_stride,
                        const int32_t *slots, const kernels_batch *batch)
{
    SHOAL_ASSERT(batch->rows >= 1 && batch->rows <= SHOAL_BATCH_ROWS_MAX);
    SHOAL_ASSERT(channels > 0 && in_stride >= channels && kernel >= 1 &&
                 kernel <= SHOAL_MODEL_CONV_KERNEL_MAX);
    size_t a = shoal_dtype_bytes(be->act_dtype);
    CUDA_ASSERT_ALIGNED(out, a);
    CUDA_ASSERT_ALIGNED(in, a);
    CUDA_ASSERT_ALIGNED(w, 4);
    CUDA_ASSERT_ALIGNED(states, 4);
    SHOAL_ASSERT(slot_stride % 4 == 0);
    if (!cuda_usable(be))
        return;
    int units;
    dn_runs R = runs_for(be, batch, &units);
    if (R.list)
        units = (batch->rows + CONV_ITEM_ROWS - 1) / CONV_ITEM_ROWS + units; /* items' bound */
    dim3 grid((unsigned)((channels + CONV_THREADS - 1) / CONV_THREADS), (unsigned)units);
    cuda_dispatch_act(be->act_dtype, [&](auto act) {
        using T = decltype(act);
        conv_kernel<T><<<grid, CONV_THREADS, 0, cuda_of(be)->stream>>>(
            (T *)out, (const T *)in, in_stride, w, channels, kernel, (float *)states, slot_stride,
            slots, *batch, R);
    });
    cuda_launched(be, "deltanet_conv");
}

/* ---- deltanet_rule ---- */

/* A warp takes RULE_COLS columns of a value head's state, its lanes
 * RULE_GROUPS groups of rows: lane l holds column l % 8 of rows l / 8 + 4 j,
 * j < KPT, in registers for the whole run. A row of the state's reads for
 * the warp's columns is one 32-byte sector; the sums over k_dim are the
 * lane's own and two shuffles, no barrier. A block of W warps takes 8 W
 * adjacent columns and stages RULE_STAGE_ROWS rows at a time in shared
 * memory: q and k normed once a row for the block (a warp a row), the
 * block's columns of v, beta, the decay and k.q. */
enum { RULE_COLS = 8, RULE_GROUPS = 4, RULE_STAGE_ROWS = 16, RULE_WARPS_MAX = 4 };
enum { RULE_KPT_MAX = 64, RULE_K_MAX = RULE_GROUPS * RULE_KPT_MAX };

/* A staged row of q or k: a group's KPT values (rows g + 4 j) contiguous
 * for 16-byte reads, 4 floats apart between groups so that the four
 * groups' reads fall in different banks. */
template <int KPT> struct rule_stage {
    static constexpr int group = KPT + 4;
    static constexpr int row = RULE_GROUPS * group;
    static __device__ __forceinline__ int at(int i)
    {
        return (i % RULE_GROUPS) * group + i / RULE_GROUPS;
    }
};

static size_t rule_smem_bytes(int kpt, int warps)
{
    size_t row = (size_t)RULE_GROUPS * (size_t)(kpt + 4);
    return (size_t)RULE_STAGE_ROWS * (2 * row + (size_t)(RULE_COLS * warps) + 3) * sizeof(float);
}

template <typename T, int KPT>
static __global__ void
rule_kernel(T *out, const T *x, const T *b, const T *a, int ba_stride, const float *decay,
            const float *dt_bias, int k_heads, int v_heads, int k_dim, int v_dim, float *states,
            size_t slot_stride, const int32_t *slots, const kernels_batch B, const dn_runs R,
            int long_rows)
{
    using S = rule_stage<KPT>;
    extern __shared__ float4 rule_smem4[];
    float *qs = (float *)rule_smem4;           /* [RULE_STAGE_ROWS][S::row] */
    float *ks = qs + RULE_STAGE_ROWS * S::row; /* [RULE_STAGE_ROWS][S::row] */
    const int warps = blockDim.x >> 5, cols = RULE_COLS * warps;
    float *vs = ks + RULE_STAGE_ROWS * S::row; /* [RULE_STAGE_ROWS][cols] */
    float *betas = vs + RULE_STAGE_ROWS * cols, *gammas = betas + RULE_STAGE_ROWS,
          *kqs = gammas + RULE_STAGE_ROWS;
    pdl_trigger(); /* a GEMV after may start fetching its weights */

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane / RULE_COLS, h = blockIdx.y, kh = h / (v_heads / k_heads);
    const int c0 = blockIdx.x * cols, cc = warp * RULE_COLS + lane % RULE_COLS, col = c0 + cc;
    const bool col_ok = col < v_dim;
    const int kd = k_heads * k_dim, vd = v_heads * v_dim, x_stride = 2 * kd + vd;
    const float qscale = 1.0f / sqrtf((float)k_dim);
    const float decay_h = decay[h], dt_bias_h = dt_bias[h];

    const int units = units_of(R, false);
    for (int z = blockIdx.z; z < units; z += gridDim.z) {
        dn_run run;
        if (!run_at(R, z, &run) || run.r1 - run.r0 >= long_rows)
            continue; /* the same for the whole block; long runs: rule_chunk_kernel */
        const int r0 = run.r0, r1 = run.r1;
        float *sp = slot_state(states, slot_stride, slots, run.stream) +
                    (size_t)h * (size_t)k_dim * (size_t)v_dim + (size_t)col;
        /* issued before the staging below, so the state's round trip runs
         * under it; a run from position 0 starts from zeros, whatever the
         * slot holds */
        const bool zero = B.positions[r0] == 0;
        float s[KPT];
#pragma unroll
        for (int j = 0; j < KPT; j++) {
            int i = g + RULE_GROUPS * j;
            s[j] = !zero && col_ok && i < k_dim ? sp[(size_t)i * (size_t)v_dim] : 0.0f;
        }
        for (int rs = r0; rs < r1; rs += RULE_STAGE_ROWS) {
            const int n = min(RULE_STAGE_ROWS, r1 - rs);
            __syncthreads(); /* the last rows' reads of the stage are done */
            for (int rr = warp; rr < n; rr += warps) {
                const T *row = x + (size_t)(rs + rr) * (size_t)x_stride;
                const T *qp = row + (size_t)kh * (size_t)k_dim, *kp = qp + kd;
                float *qd = qs + rr * S::row, *kdst = ks + rr * S::row;
                /* the padding rows past k_dim are zeros: no masks below */
                float sq = 0.0f, sk = 0.0f;
                for (int i = lane; i < RULE_GROUPS * KPT; i += 32) {
                    float qv = i < k_dim ? to_f32(qp[i]) : 0.0f;
                    float kv = i < k_dim ? to_f32(kp[i]) : 0.0f;
                    qd[S::at(i)] = qv;
                    kdst[S::at(i)] = kv;
                    sq += qv * qv;
                    sk += kv * kv;
                }
                sq = warp_reduce(sq, op_add());
                sk = warp_reduce(sk, op_add());
                const float iq = 1.0f / sqrtf(sq + 1e-6f), ik = 1.0f / sqrtf(sk + 1e-6f);
                float kq = 0.0f;
                /* each lane reads back only what it wrote above */
                for (int i = lane; i < RULE_GROUPS * KPT; i += 32) {
                    float qn = qd[S::at(i)] * iq * qscale, kn = kdst[S::at(i)] * ik;
                    qd[S::at(i)] = qn;
                    kdst[S::at(i)] = kn;
                    kq += qn * kn;
                }
                kq = warp_reduce(kq, op_add());
                if (lane == 0) {
                    size_t ba = (size_t)(rs + rr) * (size_t)ba_stride + (size_t)h;
                    betas[rr] = sigmoid(to_f32(b[ba]));
                    gammas[rr] = expf(decay_h * softplus(to_f32(a[ba]) + dt_bias_h));
                    kqs[rr] = kq;
                }
            }
            for (int i = threadIdx.x; i < n * cols; i += blockDim.x) {
                int rr = i / cols, vc = c0 + i % cols;
                vs[i] = vc < v_dim ? to_f32(x[(size_t)(rs + rr) * (size_t)x_stride +
                                              (size_t)(2 * kd + h * v_dim + vc)])
                                   : 0.0f;
            }
            __syncthreads();
            for (int rr = 0; rr < n; rr++) {
                const float4 *k4 = (const float4 *)(ks + rr * S::row + g * S::group);
                const float4 *q4 = (const float4 *)(qs + rr * S::row + g * S::group);
                /* with S the state before the row and gamma its decay:
                 * u = gamma S^T k, delta = beta (v - u), S' = gamma S + k
                 * delta^T, out = S'^T q = gamma S^T q + delta (k.q): one
                 * pass over S for both sums */
                float sk = 0.0f, sq = 0.0f;
#pragma unroll
                for (int j = 0; j < KPT / 4; j++) {
                    float4 kv = k4[j], qv = q4[j];
                    sk += s[4 * j] * kv.x + s[4 * j + 1] * kv.y + s[4 * j + 2] * kv.z +
                          s[4 * j + 3] * kv.w;
                    sq += s[4 * j] * qv.x + s[4 * j + 1] * qv.y + s[4 * j + 2] * qv.z +
                          s[4 * j + 3] * qv.w;
                }
                /* the four groups of the column: lanes l, l ^ 8, l ^ 16,
                 * l ^ 24, each getting the same bits */
                sk += __shfl_xor_sync(0xffffffffu, sk, 8);
                sq += __shfl_xor_sync(0xffffffffu, sq, 8);
                sk += __shfl_xor_sync(0xffffffffu, sk, 16);
                sq += __shfl_xor_sync(0xffffffffu, sq, 16);
                const float gamma = gammas[rr];
                const float delta = betas[rr] * (vs[rr * cols + cc] - gamma * sk);
                const float o = gamma * sq + delta * kqs[rr];
#pragma unroll
                for (int j = 0; j < KPT / 4; j++) {
                    float4 kv = k4[j];
                    s[4 * j] = gamma * s[4 * j] + kv.x * delta;
                    s[4 * j + 1] = gamma * s[4 * j + 1] + kv.y * delta;
                    s[4 * j + 2] = gamma * s[4 * j + 2] + kv.z * delta;
                    s[4 * j + 3] = gamma * s[4 * j + 3] + kv.w * delta;
                }
                if (g == 0 && col_ok)
                    out[(size_t)(rs + rr) * (size_t)vd + (size_t)(h * v_dim + col)] =
                        from_f32<T>(o);
            }
        }
        if (col_ok) {
#pragma unroll
            for (int j = 0; j < KPT; j++) {
                int i = g + RULE_GROUPS * j;
                if (i < k_dim)
                    sp[(size_t)i * (size_t)v_dim] = s[j];
            }
        }
    }
}

/* ---- deltanet_rule, chunked ---- */

/* Runs of at least CHUNK_ROWS rows, where cuda_state.deltanet_chunk says
 * so, take the chunked (WY) form of the same rule, as flash-linear-
 * attention's chunk_gated_delta_rule: with S the state before a chunk of
 * C rows, G_i = sum_{s <= i} g_s the cumulative log decay within it, the
 * recurrence unrolled gives
 *   S_i = e^{G_i} S + sum_{j <= i} e^{G_i - G_j} k_j u_j^T,
 *   u_i + sum_{j < i} beta_i e^{G_i - G_j} (k_i . k_j) u_j
 *       = beta_i (v_i - e^{G_i} S^T k_i),
 * so the chunk's u (V') is the solve of (I + A) V' = X with A strictly
 * lower (A_ij = beta_i e^{G_i - G_j} k_i . k_j) and X_i = beta_i (v_i -
 * e^{G_i} S^T k_i): the same as fla's T (beta V) - T (beta e^G K) S with
 * T = (I + A)^-1, solved here on X directly in f32 (no T product). Then
 * out_i = e^{G_i} S^T q_i + sum_{j <= i} e^{G_i - G_j} (q_i . k_j) V'_j and
 * the next chunk's S = e^{G_C} S + sum_j e^{G_C - G_j} k_j V'_j^T. Every
 * exponent there is <= 0 (g <= 0 and j <= i), so nothing overflows.
 *
 * A block of CHUNK_WARPS warps takes CHUNK_VT columns of a value head for
 * a whole run, chunk after chunk; its state tile (k_dim, padded to
 * CHUNK_KD, x CHUNK_VT) stays in f32 in the warps' mma accumulators (warp
 * w: k rows 32 w .. 32 w + 31) and is copied to shared memory in bf16 once
 * a chunk for the products with k and q. The products are mma.sync bf16
 * with f32 accumulation (q, k and v are bf16 activations; V' and the
 * state are rounded to bf16 only as operands); the solve, the decays and
 * the state stay in f32. For the products over the chunk's rows warp w
 * takes rows 16 w .. 16 w + 15.
 *
 * First version, not yet measured: the solve is a thread a column (half
 * the block), and each chunk's k.k^T, q.k^T and solve, which do not
 * depend on the state, still run in the chain of chunks (fla runs them
 * for all chunks at once, at the price of scratch for them). */
enum { CHUNK_ROWS = 64, CHUNK_KD = 128, CHUNK_VT = 64, CHUNK_WARPS = 4 };
enum { CK_LD = CHUNK_KD + 8, CV_LD = CHUNK_ROWS + 8, CX_LD = CHUNK_VT + 4, CA_LD = CHUNK_ROWS + 4 };
static_assert(CHUNK_ROWS == 16 * CHUNK_WARPS && CHUNK_KD == 32 * CHUNK_WARPS,
              "a warp 16 of the chunk's rows and 32 of the state's");
static_assert(CHUNK_VT <= CHUNK_WARPS * 32, "the solve: a thread a column");

/* Row strides padded by 16 bytes so that a fragment's eight rows fall in
 * different banks (and a's rows stay 16-byte aligned for the solve's
 * float4 reads). */
struct chunk_smem {
    bf16 k[CHUNK_ROWS][CK_LD];  /* normalized k, zeros past k_dim and the run */
    bf16 q[CHUNK_ROWS][CK_LD];  /* normalized q times 1 / sqrt(k_dim) */
    bf16 s[CHUNK_VT][CK_LD];    /* the state before the chunk, transposed */
    bf16 vt[CHUNK_VT][CV_LD];   /* V', transposed */
    float x[CHUNK_ROWS][CX_LD]; /* v, then X */
    float a[CHUNK_ROWS][CA_LD]; /* A */
    float beta[CHUNK_ROWS], g[CHUNK_ROWS]; /* g: the log decays, then G */
};

static __device__ __forceinline__ uint32_t ld_pair(const bf16 *p)
{
    return *(const uint32_t *)p;
}

/* The A fragment (m16n8k16) of rows r0.., columns k0.. of a row-major
 * bf16 matrix. */
static __device__ __forceinline__ void frag_a(uint32_t (&a)[4], const bf16 *m, int ld, int r0,
                                              int k0, int lane)
{
    const bf16 *p = m + (r0 + (lane >> 2)) * ld + k0 + 2 * (lane & 3);
    a[0] = ld_pair(p);
    a[1] = ld_pair(p + 8 * ld);
    a[2] = ld_pair(p + 8);
    a[3] = ld_pair(p + 8 * ld + 8);
}

/* The B fragment of columns n0.. (n0 + 7), rows k0.. (k0 + 15) of B, from
 * B stored transposed (m[n][k]). */
static __device__ __forceinline__ void frag_b(uint32_t &b0, uint32_t &b1, const bf16 *m, int ld,
                                              int n0, int k0, int lane)
{
    const bf16 *p = m + (n0 + (lane >> 2)) * ld + k0 + 2 * (lane & 3);
    b0 = ld_pair(p);
    b1 = ld_pair(p + 8);
}

/* acc[nt] (C fragments, 16 rows x 8 nt..) += m1 rows r0.. times m2^T, both
 * row-major over CHUNK_KD, for the n-tiles below nts (the rest untouched). */
template <int NT>
static __device__ __forceinline__ void chunk_mm_kd(float (&acc)[NT][4], const bf16 *m1, int r0,
                                                   const bf16 *m2, int nts, int lane)
{
#pragma unroll
    for (int kk = 0; kk < CHUNK_KD / 16; kk++) {
        uint32_t af[4];
        frag_a(af, m1, CK_LD, r0, 16 * kk, lane);
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            if (nt < nts) {
                uint32_t b0, b1;
                frag_b(b0, b1, m2, CK_LD, 8 * nt, 16 * kk, lane);
                mma::mma_bf16(acc[nt], af, b0, b1);
            }
    }
}

template <typename T>
static __global__ void __launch_bounds__(CHUNK_WARPS * 32)
    rule_chunk_kernel(T *out, const T *x, const T *b, const T *a, int ba_stride,
                      const float *decay, const float *dt_bias, int k_heads, int v_heads,
                      int k_dim, int v_dim, float *states, size_t slot_stride,
                      const int32_t *slots, const kernels_batch B, const dn_runs R)
{
    extern __shared__ float4 chunk_smem4[];
    chunk_smem &sm = *(chunk_smem *)chunk_smem4;
    pdl_trigger(); /* a GEMV after may start fetching its weights */

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gr = lane >> 2, tc = 2 * (lane & 3); /* a fragment's row and column pair */
    const int h = blockIdx.y, kh = h / (v_heads / k_heads), c0 = blockIdx.x * CHUNK_VT;
    const int kd = k_heads * k_dim, vd = v_heads * v_dim, x_stride = 2 * kd + vd;
    const float qscale = 1.0f / sqrtf((float)k_dim);
    const float decay_h = decay[h], dt_bias_h = dt_bias[h];
    const int i0 = 16 * warp, m0 = 32 * warp; /* the warp's chunk rows, state rows */

    const int units = units_of(R, false);
    for (int z = blockIdx.z; z < units; z += gridDim.z) {
        dn_run run;
        if (!run_at(R, z, &run) || run.r1 - run.r0 < CHUNK_ROWS)
            continue; /* the same for the whole block; short runs: rule_kernel */
        const int r0 = run.r0, r1 = run.r1;
        float *sp = slot_state(states, slot_stride, slots, run.stream) +
                    (size_t)h * (size_t)k_dim * (size_t)v_dim;
        const bool zero = B.positions[r0] == 0;
        /* s[mt][nt]: state rows m0 + 16 mt.., columns c0 + 8 nt.. */
        float s[2][CHUNK_VT / 8][4];
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int nt = 0; nt < CHUNK_VT / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int m = m0 + 16 * mt + gr + (e >= 2 ? 8 : 0), c = c0 + 8 * nt + tc + (e & 1);
                    s[mt][nt][e] = !zero && m < k_dim && c < v_dim
                                       ? sp[(size_t)m * (size_t)v_dim + (size_t)c]
                                       : 0.0f;
                }

        for (int rc = r0; rc < r1; rc += CHUNK_ROWS) {
            const int n = min(CHUNK_ROWS, r1 - rc);
            __syncthreads(); /* the last chunk's reads of the shared tiles are done */
            /* The chunk's loads in three round trips, not one a row: v,
             * beta and g issued together, then q and k eight rows a warp
             * at a time. */
            float vv[CHUNK_ROWS * CHUNK_VT / (CHUNK_WARPS * 32)];
#pragma unroll
            for (int u = 0; u < CHUNK_ROWS * CHUNK_VT / (CHUNK_WARPS * 32); u++) {
                int i = tid + u * CHUNK_WARPS * 32, rr = i / CHUNK_VT, c = c0 + i % CHUNK_VT;
                vv[u] = rr < n && c < v_dim ? to_f32(x[(size_t)(rc + rr) * (size_t)x_stride +
                                                       (size_t)(2 * kd + h * v_dim + c)])
                                            : 0.0f;
            }
            if (tid < CHUNK_ROWS) {
                /* rows past the run: beta 0 and g 0, so that their V' is
                 * zero and G there is the last row's */
                float bt = 0.0f, gl = 0.0f;
                if (tid < n) {
                    size_t ba = (size_t)(rc + tid) * (size_t)ba_stride + (size_t)h;
                    bt = sigmoid(to_f32(b[ba]));
                    gl = decay_h * softplus(to_f32(a[ba]) + dt_bias_h);
                }
                sm.beta[tid] = bt;
                sm.g[tid] = gl;
            }
#pragma unroll
            for (int u = 0; u < CHUNK_ROWS * CHUNK_VT / (CHUNK_WARPS * 32); u++) {
                int i = tid + u * CHUNK_WARPS * 32;
                sm.x[i / CHUNK_VT][i % CHUNK_VT] = vv[u];
            }
            enum { QK_ROWS = 8 }; /* a warp's rows of q and k in flight at once */
            for (int rr0 = i0; rr0 < i0 + 16; rr0 += QK_ROWS) {
                float qv[QK_ROWS][CHUNK_KD / 32], kv[QK_ROWS][CHUNK_KD / 32];
#pragma unroll
                for (int u = 0; u < QK_ROWS; u++) {
                    const int rr = rr0 + u;
                    const T *qp = x + (size_t)(rc + rr) * (size_t)x_stride + (size_t)kh * k_dim;
#pragma unroll
                    for (int e = 0; e < CHUNK_KD / 32; e++) {
                        int i = lane + 32 * e;
                        bool ok = rr < n && i < k_dim;
                        qv[u][e] = ok ? to_f32(qp[i]) : 0.0f;
                        kv[u][e] = ok ? to_f32(qp[kd + i]) : 0.0f;
                    }
                }
#pragma unroll
                for (int u = 0; u < QK_ROWS; u++) {
                    const int rr = rr0 + u;
                    float sq = 0.0f, sk = 0.0f;
#pragma unroll
                    for (int e = 0; e < CHUNK_KD / 32; e++) {
                        sq += qv[u][e] * qv[u][e];
                        sk += kv[u][e] * kv[u][e];
                    }
                    sq = warp_reduce(sq, op_add());
                    sk = warp_reduce(sk, op_add());
                    const float iq = qscale / sqrtf(sq + 1e-6f), ik = 1.0f / sqrtf(sk + 1e-6f);
#pragma unroll
                    for (int e = 0; e < CHUNK_KD / 32; e++) {
                        sm.q[rr][lane + 32 * e] = __float2bfloat16_rn(qv[u][e] * iq);
                        sm.k[rr][lane + 32 * e] = __float2bfloat16_rn(kv[u][e] * ik);
                    }
                }
            }
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int nt = 0; nt < CHUNK_VT / 8; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        sm.s[8 * nt + tc + (e & 1)][m0 + 16 * mt + gr + (e >= 2 ? 8 : 0)] =
                            __float2bfloat16_rn(s[mt][nt][e]);
            __syncthreads();
            if (warp == 0) {
                /* G: the inclusive sum of g, a lane two rows */
                float g0 = sm.g[2 * lane], g1 = sm.g[2 * lane + 1], incl = g0 + g1;
#pragma unroll
                for (int o = 1; o < 32; o <<= 1) {
                    float t = __shfl_up_sync(0xffffffffu, incl, o);
                    if (lane >= o)
                        incl += t;
                }
                __syncwarp();
                sm.g[2 * lane] = incl - g1;
                sm.g[2 * lane + 1] = incl;
            }
            __syncthreads();

            /* X = beta (v - e^G K S), and A, for the warp's rows */
            {
                float acc[CHUNK_VT / 8][4] = {};
                chunk_mm_kd(acc, &sm.k[0][0], i0, &sm.s[0][0], CHUNK_VT / 8, lane);
#pragma unroll
                for (int nt = 0; nt < CHUNK_VT / 8; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int i = i0 + gr + (e >= 2 ? 8 : 0), c = 8 * nt + tc + (e & 1);
                        sm.x[i][c] = sm.beta[i] * (sm.x[i][c] - expf(sm.g[i]) * acc[nt][e]);
                    }
            }
            {
                float acc[CHUNK_ROWS / 8][4] = {};
                chunk_mm_kd(acc, &sm.k[0][0], i0, &sm.k[0][0], 2 * warp + 2, lane);
#pragma unroll
                for (int nt = 0; nt < CHUNK_ROWS / 8; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int i = i0 + gr + (e >= 2 ? 8 : 0), j = 8 * nt + tc + (e & 1);
                        sm.a[i][j] =
                            j < i ? sm.beta[i] * expf(sm.g[i] - sm.g[j]) * acc[nt][e] : 0.0f;
                    }
            }
            __syncthreads();

            /* (I + A) V' = X, a thread a column: V'_i = X_i - sum_{j < i}
             * A_ij V'_j, in f32. Unrolled whole, so the column stays in
             * registers and only A is read (float4 broadcasts); four sums
             * a row, so that the chain of dependent adds is a quarter of
             * the row. */
            if (tid < CHUNK_VT) {
                float v[CHUNK_ROWS];
#pragma unroll
                for (int i = 0; i < CHUNK_ROWS; i++)
                    v[i] = sm.x[i][tid];
#pragma unroll
                for (int i = 1; i < CHUNK_ROWS; i++) {
                    float acc[4] = {v[i], 0.0f, 0.0f, 0.0f};
#pragma unroll
                    for (int j = 0; j + 4 <= i; j += 4) {
                        const float4 aq = *(const float4 *)&sm.a[i][j];
                        acc[0] -= aq.x * v[j];
                        acc[1] -= aq.y * v[j + 1];
                        acc[2] -= aq.z * v[j + 2];
                        acc[3] -= aq.w * v[j + 3];
                    }
#pragma unroll
                    for (int j = i & ~3; j < i; j++)
                        acc[j & 3] -= sm.a[i][j] * v[j];
                    v[i] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
                }
#pragma unroll
                for (int i = 0; i < CHUNK_ROWS; i++)
                    sm.vt[tid][i] = __float2bfloat16_rn(v[i]);
            }
            __syncthreads();

            /* out = e^G Q S + (decayed, causal Q K^T) V' */
            {
                float o[CHUNK_VT / 8][4] = {};
                chunk_mm_kd(o, &sm.q[0][0], i0, &sm.s[0][0], CHUNK_VT / 8, lane);
                float p[CHUNK_ROWS / 8][4] = {};
                chunk_mm_kd(p, &sm.q[0][0], i0, &sm.k[0][0], 2 * warp + 2, lane);
                const int ia = i0 + gr, ib = ia + 8;
                const float ea = expf(sm.g[ia]), eb = expf(sm.g[ib]);
#pragma unroll
                for (int nt = 0; nt < CHUNK_VT / 8; nt++) {
                    o[nt][0] *= ea;
                    o[nt][1] *= ea;
                    o[nt][2] *= eb;
                    o[nt][3] *= eb;
                }
#pragma unroll
                for (int nt = 0; nt < CHUNK_ROWS / 8; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int i = e >= 2 ? ib : ia, j = 8 * nt + tc + (e & 1);
                        p[nt][e] = j <= i ? expf(sm.g[i] - sm.g[j]) * p[nt][e] : 0.0f;
                    }
#pragma unroll
                for (int kk = 0; kk < CHUNK_ROWS / 16; kk++)
                    if (kk <= warp) {
                        uint32_t af[4];
                        mma::p_fragment<CHUNK_ROWS / 8>(af, p, kk);
#pragma unroll
                        for (int nt = 0; nt < CHUNK_VT / 8; nt++) {
                            uint32_t b0, b1;
                            frag_b(b0, b1, &sm.vt[0][0], CV_LD, 8 * nt, 16 * kk, lane);
                            mma::mma_bf16(o[nt], af, b0, b1);
                        }
                    }
#pragma unroll
                for (int nt = 0; nt < CHUNK_VT / 8; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int i = e >= 2 ? ib : ia, c = c0 + 8 * nt + tc + (e & 1);
                        if (i < n && c < v_dim)
                            out[(size_t)(rc + i) * (size_t)vd + (size_t)(h * v_dim + c)] =
                                from_f32<T>(o[nt][e]);
                    }
            }

            /* S = e^{G_C} S + K^T diag(e^{G_C - G}) V' (rows past the run
             * have V' = 0) */
            {
                const float gc = sm.g[CHUNK_ROWS - 1], ec = expf(gc);
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
#pragma unroll
                    for (int nt = 0; nt < CHUNK_VT / 8; nt++)
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            s[mt][nt][e] *= ec;
#pragma unroll
                for (int kk = 0; kk < CHUNK_ROWS / 16; kk++) {
                    const int j = 16 * kk + tc;
                    const float d0 = expf(gc - sm.g[j]), d1 = expf(gc - sm.g[j + 1]),
                                d8 = expf(gc - sm.g[j + 8]), d9 = expf(gc - sm.g[j + 9]);
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) {
                        const int m = m0 + 16 * mt + gr;
                        /* A[m][j] = e^{G_C - G_j} k_j[m]: k read across its rows */
                        uint32_t af[4] = {
                            mma::pack_bf16(d0 * __bfloat162float(sm.k[j][m]),
                                           d1 * __bfloat162float(sm.k[j + 1][m])),
                            mma::pack_bf16(d0 * __bfloat162float(sm.k[j][m + 8]),
                                           d1 * __bfloat162float(sm.k[j + 1][m + 8])),
                            mma::pack_bf16(d8 * __bfloat162float(sm.k[j + 8][m]),
                                           d9 * __bfloat162float(sm.k[j + 9][m])),
                            mma::pack_bf16(d8 * __bfloat162float(sm.k[j + 8][m + 8]),
                                           d9 * __bfloat162float(sm.k[j + 9][m + 8]))};
#pragma unroll
                        for (int nt = 0; nt < CHUNK_VT / 8; nt++) {
                            uint32_t b0, b1;
                            frag_b(b0, b1, &sm.vt[0][0], CV_LD, 8 * nt, 16 * kk, lane);
                            mma::mma_bf16(s[mt][nt], af, b0, b1);
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int nt = 0; nt < CHUNK_VT / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int m = m0 + 16 * mt + gr + (e >= 2 ? 8 : 0), c = c0 + 8 * nt + tc + (e & 1);
                    if (m < k_dim && c < v_dim)
                        sp[(size_t)m * (size_t)v_dim + (size_t)c] = s[mt][nt][e];
                }
    }
}

void cuda_deltanet_rule(kernels_backend *be, void *out, const void *x, const void *b, const void *a,
                        int ba_stride, const float *decay, const float *dt_bias, int k_heads,
                        int v_heads, int k_dim, int v_dim, void *states, size_t slot_stride,
                        const int32_t *slots, const kernels_batch *batch)
{
    SHOAL_ASSERT(batch->rows >= 1 && batch->rows <= SHOAL_BATCH_ROWS_MAX);
    SHOAL_ASSERT(k_heads > 0 && v_heads > 0 && v_heads % k_heads == 0 && v_heads <= 65535);
    SHOAL_ASSERT(k_dim > 0 && k_dim <= RULE_K_MAX && v_dim > 0 && ba_stride >= v_heads);
    size_t ab = shoal_dtype_bytes(be->act_dtype);
    CUDA_ASSERT_ALIGNED(out, ab);
    CUDA_ASSERT_ALIGNED(x, ab);
    CUDA_ASSERT_ALIGNED(b, ab);
    CUDA_ASSERT_ALIGNED(a, ab);
    CUDA_ASSERT_ALIGNED(decay, 4);
    CUDA_ASSERT_ALIGNED(dt_bias, 4);
    CUDA_ASSERT_ALIGNED(states, 4);
    SHOAL_ASSERT(slot_stride % 4 == 0);
    if (!cuda_usable(be))
        return;
    /* runs of CHUNK_ROWS or more take the chunked form where it is on;
     * both kernels skip the other's runs, so one batch may mix them */
    const bool chunked =
        cuda_of(be)->deltanet_chunk && k_dim <= CHUNK_KD && batch->rows >= CHUNK_ROWS;
    const int long_rows = chunked ? CHUNK_ROWS : INT_MAX;
    int units;
    dn_runs R = runs_for(be, batch, &units);
    /* the widest block (fewest q and k norms per row) that still gives
     * two blocks a multiprocessor: a decode round's state is read once,
     * so its speed is the memory's only where enough of it is in flight */
    int warps = RULE_WARPS_MAX;
    while (warps > 1 && RULE_COLS * (warps / 2) >= v_dim)
        warps /= 2;
    int sms = cuda_of(be)->sm_count;
    while (warps > 1 &&
           (long)((v_dim + RULE_COLS * warps - 1) / (RULE_COLS * warps)) * v_heads * units <
               2L * sms)
        warps /= 2;
    dim3 grid((unsigned)((v_dim + RULE_COLS * warps - 1) / (RULE_COLS * warps)), (unsigned)v_heads,
              (unsigned)units);
    /* rows a lane holds: k_dim / 4 rounded up to a template's */
    int need = (k_dim + RULE_GROUPS - 1) / RULE_GROUPS;
    int kpt = need <= 4 ? 4 : need <= 8 ? 8 : need <= 16 ? 16 : need <= 32 ? 32 : 64;
    cuda_dispatch_act(be->act_dtype, [&](auto act) {
        using T = decltype(act);
        auto kernel = kpt == 4    ? rule_kernel<T, 4>
                      : kpt == 8  ? rule_kernel<T, 8>
                      : kpt == 16 ? rule_kernel<T, 16>
                      : kpt == 32 ? rule_kernel<T, 32>
                                  : rule_kernel<T, 64>;
        kernel<<<grid, (unsigned)(32 * warps), rule_smem_bytes(kpt, warps), cuda_of(be)->stream>>>(
            (T *)out, (const T *)x, (const T *)b, (const T *)a, ba_stride, decay, dt_bias, k_heads,
            v_heads, k_dim, v_dim, (float *)states, slot_stride, slots, *batch, R, long_rows);
    });
    cuda_launched(be, "deltanet_rule");
    if (!chunked)
        return;
    dim3 cgrid((unsigned)((v_dim + CHUNK_VT - 1) / CHUNK_VT), (unsigned)v_heads, (unsigned)units);
    cuda_dispatch_act(be->act_dtype, [&](auto act) {
        using T = decltype(act);
        rule_chunk_kernel<T><<<cgrid, CHUNK_WARPS * 32, sizeof(chunk_smem), cuda_of(be)->stream>>>(
            (T *)out, (const T *)x, (const T *)b, (const T *)a, ba_stride, decay, dt_bias, k_heads,
            v_heads, k_dim, v_dim, (float *)states, slot_stride, slots, *batch, R);
    });
    cuda_launched(be, "deltanet_rule: chunked");
    cuda_of(be)->deltanet_chunk_launches++;
}

shoal_err cuda_deltanet_init(kernels_backend *be)
{
    if (!cuda_of(be)->deltanet_chunk)
        return SHOAL_OK;
    /* past the default 48 KiB: two blocks a multiprocessor still fit */
    static_assert(2 * sizeof(chunk_smem) <= 227 * 1024, "two chunked blocks a multiprocessor");
    cudaError_t e = cudaFuncSetAttribute(rule_chunk_kernel<bf16>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)sizeof(chunk_smem));
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(rule_chunk_kernel<float>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)sizeof(chunk_smem));
    if (e != cudaSuccess) {
        cuda_fail(be, "deltanet_rule: raise the chunked kernel's shared-memory limit", e);
        return cuda_of(be)->err;
    }
    return SHOAL_OK;
}

/* ---- rmsnorm_gated, mul_sigmoid, add ---- */

/* A warp a (row, head). out may be x: a lane reads its elements of x
 * before it writes them. */
template <typename T>
static __global__ void rmsnorm_gated_kernel(T *out, const T *x, const T *z, const float *w,
                                            int units, int dim, float eps)
{
    pdl_trigger(); /* a GEMV after may start fetching its weights */
    const int unit = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    if (unit >= units)
        return; /* the whole warp: no barriers */
    const size_t off = (size_t)unit * (size_t)dim;
    float ss = 0.0f;
    for (int i = lane; i < dim; i += 32) {
        float v = to_f32(x[off + i]);
        ss += v * v;
    }
    ss = warp_reduce(ss, op_add());
    const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    for (int i = lane; i < dim; i += 32)
        out[off + i] = from_f32<T>(to_f32(x[off + i]) * inv * w[i] * silu(to_f32(z[off + i])));
}

void cuda_rmsnorm_gated(kernels_backend *be, void *out, const void *x, const void *z,
                        const float *w, int rows, int heads, int dim, float eps)
{
    SHOAL_ASSERT(rows >= 0 && heads > 0 && dim > 0);
    size_t a = shoal_dtype_bytes(be->act_dtype);
    CUDA_ASSERT_ALIGNED(out, a);
    CUDA_ASSERT_ALIGNED(x, a);
    CUDA_ASSERT_ALIGNED(z, a);
    CUDA_ASSERT_ALIGNED(w, 4);
    long units = (long)rows * heads;
    if (units == 0 || !cuda_usable(be))
        return;
    SHOAL_ASSERT(units <= INT32_MAX / 32);
    unsigned blocks = (unsigned)((units + 7) / 8);
    cuda_dispatch_act(be->act_dtype, [&](auto act) {
        using T = decltype(act);
        rmsnorm_gated_kernel<T><<<blocks, 256, 0, cuda_of(be)->stream>>>(
            (T *)out, (const T *)x, (const T *)z, w, (int)units, dim, eps);
    });
    cuda_launched(be, "rmsnorm_gated");
}

template <typename T>
static __global__ void mul_sigmoid_kernel(T *x, const T *gate, int n, int gate_stride,
                                          int gate_cols, size_t total)
{
    pdl_trigger(); /* a GEMV after may start fetching its weights */
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        size_t r = e / (size_t)n, i = e % (size_t)n;
        float gv = to_f32(gate[r * (size_t)gate_stride + (gate_cols == 1 ? 0 : i)]);
        x[e] = from_f32<T>(to_f32(x[e]) * sigmoid(gv));
    }
}

void cuda_mul_sigmoid(kernels_backend *be, void *x, const void *gate, int rows, int n,
                      int gate_stride, int gate_cols)
{
    SHOAL_ASSERT(rows >= 0 && n > 0 && gate_cols >= 1 && gate_stride >= 0);
    size_t a = shoal_dtype_bytes(be->act_dtype);
    CUDA_ASSERT_ALIGNED(x, a);
    CUDA_ASSERT_ALIGNED(gate, a);
    size_t total = (size_t)rows * (size_t)n;
    if (total == 0 || !cuda_usable(be))
        return;
    size_t blocks = (total + 255) / 256;
    if (blocks > 65536)
        blocks = 65536;
    cuda_dispatch_act(be->act_dtype, [&](auto act) {
        using T = decltype(act);
        mul_sigmoid_kernel<T><<<(unsigned)blocks, 256, 0, cuda_of(be)->stream>>>(
            (T *)x, (const T *)gate, n, gate_stride, gate_cols, total);
    });
    cuda_launched(be, "mul_sigmoid");
}

template <typename T> static __global__ void add_kernel(T *x, const T *y, size_t total)
{
    pdl_trigger(); /* a GEMV after may start fetching its weights */
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x)
        x[e] = from_f32<T>(to_f32(x[e]) + to_f32(y[e]));
}

void cuda_add(kernels_backend *be, void *x, const void *y, int rows, int n)
{
    SHOAL_ASSERT(rows >= 0 && n > 0);
    size_t a = shoal_dtype_bytes(be->act_dtype);
    CUDA_ASSERT_ALIGNED(x, a);
    CUDA_ASSERT_ALIGNED(y, a);
    size_t total = (size_t)rows * (size_t)n;
    if (total == 0 || !cuda_usable(be))
        return;
    size_t blocks = (total + 255) / 256;
    if (blocks > 65536)
        blocks = 65536;
    cuda_dispatch_act(be->act_dtype, [&](auto act) {
        using T = decltype(act);
        add_kernel<T>
            <<<(unsigned)blocks, 256, 0, cuda_of(be)->stream>>>((T *)x, (const T *)y, total);
    });
    cuda_launched(be, "add");
}
