/* kernels_backend.h: the one interface between the model and a compute device.
 *
 * A backend is an op table plus its state. The CPU backend (kernels/cpu/) is
 * the reference: every op of the CUDA backend (kernels/cuda/) has a CPU twin
 * with the same signature, and contract tests compare the two.
 *
 * Memory: pointers marked (device) come from be->alloc and live on the
 * backend's device (host memory for the CPU backend). Activations are of
 * be->act_dtype (F32 on the CPU backend; BF16 by default on the CUDA
 * backend, or F32 there for exact work); logits are always F32. Weights
 * are F32, F16 or BF16 as the model file has them.
 *
 * Ops are asynchronous on devices that queue work: results are visible to
 * the host after download() or sync(). One thread drives a backend. */
#ifndef SHOAL_KERNELS_BACKEND_H
#define SHOAL_KERNELS_BACKEND_H

#include "common/common_dtype.h"
#include "common/common_error.h"
#include "kernels/kernels_sample.h"
#include "kernels/kernels_weight.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Where the KV of (page, layer, k|v, kv_head, token-in-page, dim) sits in the
 * arena. A page holds page_tokens tokens of every layer, contiguously, so a
 * page moves (peer copy, spill, restore) as one block:
 *   page * page_bytes + ((((layer * 2 + kv) * kv_heads + head) * page_tokens
 *                        + token) * head_dim + dim) * elem_bytes
 *
 * dtype is BF16 or F8_E4M3. An fp8 element holds e4m3(x / scale), rounded
 * to nearest even and saturated to +-448, and reads back as e4m3 * scale,
 * with one scale per (layer, KV head) for K and one for V. Without
 * calibration every scale is 1.0, as in vLLM: e4m3 then keeps about two
 * significant decimal digits of values in [2^-6, 448] and flushes
 * magnitudes under 2^-10 to zero, which post-norm K and V of real models
 * stay well inside. */
typedef struct kernels_kv_layout {
    int layers;
    int kv_heads;
    int head_dim;
    int page_tokens;
    shoal_dtype dtype; /* BF16 or F8_E4M3 */
    size_t page_bytes;
    /* F8_E4M3 only: scales [layers][kv_heads] (device) of K and of V; NULL
     * means 1.0 for every layer and head. Ignored for BF16. */
    const float *k_scale;
    const float *v_scale;
} kernels_kv_layout;

/* Fills page_bytes from the other fields and sets no scales (1.0). dtype
 * must be BF16 or F8_E4M3. */
void kernels_kv_layout_init(kernels_kv_layout *layout, int layers, int kv_heads, int head_dim,
                            int page_tokens, shoal_dtype dtype);

/* One forward pass's rows: ragged token rows of several streams. Row r
 * belongs to stream row_stream[r] at absolute position positions[r]; it
 * attends to positions [0, positions[r]] of its stream (causal), whose KV
 * sits in pages page_table[stream * page_table_stride + pos / page_tokens].
 * All arrays are (device).
 *
 * one_row_per_stream: every row is the only row of its stream in this
 * pass, so the KV a row attends to before its own position was written
 * by earlier passes; attention may then start reading it before this
 * pass's KV writes land (the CUDA decode attention copies it while the
 * kernels before it run). false (zero-initialized) asks for nothing. */
typedef struct kernels_batch {
    int rows;
    int streams;
    int page_table_stride;
    const int32_t *row_stream; /* [rows] */
    const int32_t *positions;  /* [rows] */
    const int32_t *page_table; /* [streams * page_table_stride] */
    bool one_row_per_stream;
} kernels_batch;

typedef struct kernels_backend kernels_backend;
struct cuda_options; /* kernels/cuda/cuda_backend.h */

struct kernels_backend {
    const char *name;
    shoal_dtype act_dtype;
    bool host_memory; /* device pointers are host pointers (the CPU backend):
                         weights can be used where they are mapped */
    bool kv_f32;      /* F32 KV pages, beside BF16 and F8_E4M3 (the CPU backend:
                         its parity runs keep the KV as exact as the reference) */
    void *impl; /* the backend's own state */

    /* Frees the backend and everything its alloc() returned that is still
     * held. Idempotent through kernels_backend_close. */
    void (*close)(kernels_backend *be);

    /* Device memory, zero-filled; NULL when out of memory. */
    void *(*alloc)(kernels_backend *be, size_t bytes);
    void (*free)(kernels_backend *be, void *ptr);
    shoal_err (*upload)(kernels_backend *be, void *dst, const void *src, size_t bytes);
    shoal_err (*download)(kernels_backend *be, void *dst, const void *src, size_t bytes);
    shoal_err (*sync)(kernels_backend *be);
    /* Memory of the device now free for allocation, and its total: for
     * sizing the KV arena from what is left after the weights. */
    shoal_err (*mem_info)(kernels_backend *be, size_t *free_bytes, size_t *total_bytes);

    /* Pins host memory the caller owns for fast upload and download (CUDA:
     * cudaHostRegister; the CPU backend: nothing to do). An upload from
     * pinned memory is truly asynchronous: the caller must sync() before
     * it writes that memory again. host_unpin before freeing it. A failure
     * to pin leaves the memory usable as pageable memory (SHOAL_ERR_DEVICE,
     * nothing else changes). */
    shoal_err (*host_pin)(kernels_backend *be, void *ptr, size_t bytes);
    void (*host_unpin)(kernels_backend *be, void *ptr);

    /* Arenas: device memory that other processes map (the KV page arena,
     * which other workers read pages from; DESIGN.md "KV pages"). A failure
     * logs one line that says why and what to do; an out-of-memory or a
     * refused import leaves the backend usable.
     *
     * arena_create: zero-filled device memory of at least `bytes`, rounded
     * up to the device's mapping granularity (a host page on the CPU, 2 MiB
     * on current GPUs); *mapped_bytes gets the rounded size, *ptr (device)
     * the mapping and *fd a file descriptor (close-on-exec) that names the
     * memory for another process (over SCM_RIGHTS; shm/shm_arena.h). The
     * caller owns both: arena_unmap(ptr, *mapped_bytes), then close(fd).
     * The memory lives until the last mapping of it, here or in any
     * process that imported it, is gone and the fd is closed. CPU: a memfd,
     * reserved in full now (so a short memory fails here, not with SIGBUS
     * later) and sealed against resizing; CUDA: a VMM allocation
     * (cuMemCreate) exported as a POSIX fd. SHOAL_ERR_NOMEM when the
     * device lacks the memory; SHOAL_ERR_UNSUPPORTED when it cannot share
     * memory this way; SHOAL_ERR_IO or SHOAL_ERR_DEVICE for other failures.
     *
     * arena_import: maps `bytes` of the arena that fd names (another
     * process's arena_create; the same bytes as its *mapped_bytes) into
     * this backend's address space, readable and writable by this
     * backend's device and its ops (copy reads it; on CUDA the memory may
     * sit on another GPU, reached peer to peer). fd stays the caller's.
     * The mapping keeps the memory alive after its creator exits or is
     * killed. SHOAL_ERR_INVALID when fd names no arena of that size.
     *
     * arena_unmap: ends a mapping of arena_create or arena_import, after
     * every op queued before it that reads or writes it has finished; ptr
     * and bytes as they were mapped. NULL ptr is allowed. Every arena is
     * unmapped before the backend is closed. */
    shoal_err (*arena_create)(kernels_backend *be, size_t bytes, void **ptr, int *fd,
                              size_t *mapped_bytes);
    shoal_err (*arena_import)(kernels_backend *be, int fd, size_t bytes, void **ptr);
    void (*arena_unmap)(kernels_backend *be, void *ptr, size_t bytes);

    /* Copies bytes from src to dst (device), queued in order with the other
     * ops: between buffers of alloc, own arenas and imported ones (a page
     * of a peer's arena into our own). Ranges must not overlap. Errors
     * (CUDA) leave the backend unusable, as upload's do. */
    shoal_err (*copy)(kernels_backend *be, void *dst, const void *src, size_t bytes);

    /* out[r] = table[ids[r]] for r < rows; table is [vocab][dim] of wdtype. */
    void (*embed)(kernels_backend *be, void *out, const void *table, shoal_dtype wdtype,
                  const int32_t *ids, int rows, int dim);

    /* With residual: x += residual first (x is updated in place). Then
     * out = x / rms(x) * weight, per row of dim. weight is F32. */
    void (*rmsnorm)(kernels_backend *be, void *out, void *x, const void *residual,
                    const float *weight, int rows, int dim, float eps);

    /* out[rows][n] = in[rows][k] x w[n][k]^T (an nn.Linear without bias).
     * out_dtype is F32 for logits, else act_dtype. */
    void (*matmul)(kernels_backend *be, void *out, shoal_dtype out_dtype, const void *in,
                   const void *w, shoal_dtype wdtype, int rows, int n, int k);

    /* For each row and each of `heads` heads of head_dim at x + row*row_stride:
     * optional RMSNorm over the head (norm_weight F32 [head_dim], NULL for
     * none), then rotary embedding (halves rotated, as HF's rotate_half) at
     * positions[row] with inv_freq [head_dim / 2]. In place. */
    void (*qk_norm_rope)(kernels_backend *be, void *x, int rows, int heads, int head_dim,
                         int row_stride, const float *norm_weight, float eps,
                         const int32_t *positions, const float *inv_freq);

    /* Writes each row's K and V ([rows][kv_heads * head_dim], act_dtype) of
     * `layer` into its page slot. */
    void (*kv_write)(kernels_backend *be, void *arena, const kernels_kv_layout *layout,
                     const kernels_batch *batch, int layer, const void *k, const void *v);

    /* The attention block's steps between the q/k/v projections and
     * attention, as one op: the same function as
     *   q_out's rows = q's rows (unless q_out is q)
     *   qk_norm_rope(q_out, rows, heads, hd, heads * hd, q_norm, eps, pos, inv_freq)
     *   qk_norm_rope(k, rows, kvh, hd, k's stride, k_norm, eps, pos, inv_freq)
     *   kv_write(arena, layout, batch, layer, k, v)
     * with rows, positions (pos), kv_heads (kvh) and head_dim (hd) from
     * batch and layout, and the same bits: q_out gets q normed and
     * rotated, k is updated in place and reaches the pages as the stored
     * (rounded) k. Rows of q, k and v are `stride` elements apart: 0 for
     * packed rows (q [rows][heads * hd], k and v [rows][kvh * hd]); the
     * joined projection's row length for q, k and v sitting side by side
     * in one [rows][stride] buffer (one GEMM instead of three). q_out is
     * packed [rows][heads * hd]; it may be q only with stride 0. All in
     * act_dtype, on the device; q_out, k and v do not overlap. A backend
     * may do it in one pass (CUDA at the rows its GEMV takes: one launch
     * and one round trip to memory instead of three). */
    void (*qk_norm_rope_kv_write)(kernels_backend *be, void *q_out, const void *q, void *k,
                                  const void *v, int stride, int heads, const float *q_norm,
                                  const float *k_norm, float eps, const float *inv_freq,
                                  void *arena, const kernels_kv_layout *layout,
                                  const kernels_batch *batch, int layer);

    /* out[rows][heads * head_dim] = softmax(q k^T * scale) v over each row's
     * causal context in the pages of `layer`. GQA: query head h reads KV
     * head h / (heads / kv_heads). */
    void (*attention)(kernels_backend *be, void *out, const void *q, int heads,
                      const void *arena, const kernels_kv_layout *layout,
                      const kernels_batch *batch, int layer, float scale);

    /* The same function as attention, for prompt chunks: a backend may
     * run it on tensor-core tiles over the page table (flash attention).
     * Correct for any rows; fast when rows come in runs of one stream at
     * consecutive positions, as a prompt chunk does, where attention's
     * partials would read the context once per row. The CPU backend's is
     * its attention. */
    void (*attention_prompt)(kernels_backend *be, void *out, const void *q, int heads,
                             const void *arena, const kernels_kv_layout *layout,
                             const kernels_batch *batch, int layer, float scale);

    /* A decode round's rope, KV write and attention as one op, for rounds
     * of one row a stream (batch->one_row_per_stream), q, k, v and stride
     * as qk_norm_rope_kv_write takes them: the same function as
     *   qk_norm_rope_kv_write(q_out, q, k, v, stride, heads, ...)
     *   attention(out, q_out, heads, arena, layout, batch, layer, scale)
     * and the same bits in out and in the pages, except that q_out and k
     * may be left as they were (a backend may rotate the rows as it reads
     * them and never store them). NULL: the caller makes the two calls;
     * the CPU backend's is the composition. */
    void (*attention_rope_kv)(kernels_backend *be, void *out, void *q_out, const void *q,
                              void *k, const void *v, int stride, int heads,
                              const float *q_norm, const float *k_norm, float eps,
                              const float *inv_freq, void *arena,
                              const kernels_kv_layout *layout, const kernels_batch *batch,
                              int layer, float scale);

    /* out[r][i] = silu(gate[r][i]) * up[r][i], rows of dim. */
    void (*swiglu)(kernels_backend *be, void *out, const void *gate, const void *up, int rows,
                   int dim);

    /* out[rows][n] = silu(in x wg^T) * (in x wu^T): a SwiGLU MLP's gate and
     * up projections and their product, the same function as
     * matmul(out, wg), matmul(up, wu), swiglu(out, out, up), each result
     * rounded to act_dtype where those ops store it. wg and wu are [n][k]
     * of wdtype. up [rows][n] (act_dtype, device) is the op's scratch, its
     * contents undefined afterwards; out and up do not overlap. Where wu
     * follows wg (wu == wg + n * k elements) and, at one row, up follows
     * out (up == out + n), a backend may take both projections as one
     * matmul of 2n weight rows; one may also form the product in its
     * matmul's last step and write no projection (the CUDA GEMV at one
     * row, its TMA GEMM at 2 to 64: no swiglu pass). */
    void (*matmul_swiglu)(kernels_backend *be, void *out, void *up, const void *in,
                          const void *wg, const void *wu, shoal_dtype wdtype, int rows, int n,
                          int k);

    /* Optional (NULL, and fused_norm_rows 0, where a backend lacks them):
     * a pre-norm layer's RMSNorm and residual add taken inside its
     * matmuls, at up to fused_norm_rows rows with act_dtype BF16, BF16
     * weights, k a multiple of 8 and operands 16-byte aligned, so that no
     * norm pass runs between them (CUDA: the one-row GEMV, which reads
     * the whole input row in every warp anyway).
     *
     * scale_columns: w[r][c] *= scale[c] (rounded to wdtype), for rows x
     * cols of wdtype; scale F32 [cols]. The model folds each RMSNorm's
     * weight into the matmuls after it once, at load, so that
     *   matmul_rms(out, x, w', ...) = matmul(out, x / rms(x), w')
     * equals matmul(out, rmsnorm(x) * weight, w) up to rounding: the
     * normed row is never stored or rounded, w' = w * weight is.
     * rms(x) = sqrt(mean(x^2) + eps) over each row's k elements.
     *
     * matmul_swiglu_rms: matmul_swiglu of x / rms(x), no scratch (wg and
     * wu with the norm's weight folded in, [n][k] each).
     *
     * matmul_add: x[rows][n] += in[rows][k] x w[n][k]^T, the product
     * rounded to act_dtype first and then the sum, as rmsnorm's residual
     * add of a stored matmul output gives it (the same bits). */
    int fused_norm_rows;
    void (*scale_columns)(kernels_backend *be, void *w, shoal_dtype wdtype, int rows, int cols,
                          const float *scale);
    void (*matmul_rms)(kernels_backend *be, void *out, const void *x, const void *w,
                       shoal_dtype wdtype, int rows, int n, int k, float eps);
    void (*matmul_swiglu_rms)(kernels_backend *be, void *out, const void *x, const void *wg,
                              const void *wu, shoal_dtype wdtype, int rows, int n, int k,
                              float eps);
    void (*matmul_add)(kernels_backend *be, void *x, const void *in, const void *w,
                       shoal_dtype wdtype, int rows, int n, int k);

    /* Optional (NULL where a backend lacks it): a matmul's residual add
     * and the RMSNorm after it as one op,
     *   x[rows][n] += in[rows][k] x w[n][k]^T (the product rounded to
     *   act_dtype first, as rmsnorm's residual add of a stored matmul
     *   output), then out = x / rms(x) * weight (F32 [n]),
     * where the backend takes the operands (true); false where it does
     * not, with nothing queued: the caller runs matmul, then rmsnorm with
     * the product as its residual. The product's sum may be taken in
     * another order than matmul's (within its rounding). CUDA takes
     * passes of 9 to 64 rows (past its GEMV's; a decode round's sizes),
     * BF16, where splitting k pays (a k of at least twice n, or k >= n at
     * up to 32 rows): cuBLAS writes the split's f32 parts and the norm
     * sums them, so no split-K reduction pass runs between
     * (SHOAL_CUDA_GEMM_PARTS). */
    bool (*matmul_add_rmsnorm)(kernels_backend *be, void *out, void *x, const void *in,
                               const void *w, shoal_dtype wdtype, const float *weight, int rows,
                               int n, int k, float eps);

    /* Mixture of experts (NULL where a backend lacks them).
     *
     * moe_route: for each of `rows` rows of router logits (F32
     * [rows][experts], device) the softmax over the experts in F32, then
     * the topk experts of highest probability, highest first (ties to the
     * lower index): ids [rows][topk] (I32) and their probabilities weights
     * [rows][topk] (F32), divided by their sum when renorm, as HF
     * transformers routes Qwen3-MoE and Mixtral.
     *
     * moe_experts: out[r] = the sum over j < topk, in that order, of
     * weights[r][j] x down_e(silu(gate_e in[r]) * up_e in[r]), e =
     * ids[r][j]: each expert's SwiGLU MLP as matmul_swiglu and matmul
     * compute it, its output rounded to act_dtype, the weighted sum in F32
     * rounded once. in and out [rows][k] act_dtype (they may not overlap);
     * wg and wu stacked [experts][n][k], wd [experts][k][n], DENSE of one
     * dtype. ids in [0, experts). scratch (device) of moe_scratch_bytes
     * for these rows, topk, n and k; its contents are undefined after.
     * A backend reads only the experts some row routes to, and keeps the
     * routing on the device (no host synchronisation: a decode round that
     * routes can be recorded as a graph). */
    void (*moe_route)(kernels_backend *be, int32_t *ids, float *weights, const float *logits,
                      int rows, int experts, int topk, bool renorm);
    size_t (*moe_scratch_bytes)(kernels_backend *be, int rows, int topk, int n, int k);
    void (*moe_experts)(kernels_backend *be, void *out, const void *in, const int32_t *ids,
                        const float *weights, int rows, int topk, const kernels_weight *wg,
                        const kernels_weight *wu, const kernels_weight *wd, void *scratch);

    /* Gated DeltaNet, the linear-attention layers of Qwen3-Next and Qwen3.5
     * (NULL where a backend lacks them).
     *
     * States live in slots (model_cache.h): a layer's state of slot s is at
     * states + s x slot_stride bytes, its conv part F32 [channels][kernel -
     * 1] (the last inputs, oldest first), then the delta rule's F32
     * [v_heads][k_dim][v_dim] (deltanet_rule's states point there).
     * slots[stream] is each stream's slot (NULL: stream s has slot s). A
     * stream's rows in a batch are consecutive positions in row order; a
     * stream whose first row is at position 0 starts from a zero state,
     * any other from its slot's. Each op leaves the state after the
     * stream's last row in its slot.
     *
     * deltanet_conv: the depthwise causal conv and SiLU: out[r][c] =
     * silu(sum_j w[c][j] x_{t-kernel+1+j}[c]), x_t the stream's inputs
     * (in's rows, in_stride elements apart, their first `channels`), the
     * state's before them. w F32 [channels][kernel]; out packed [rows]
     * [channels].
     *
     * deltanet_rule: for each row and value head h, its key head kh = h /
     * (v_heads / k_heads): q and k the kh-th heads of x's q and k parts (x
     * packed [rows][2 k_heads k_dim + v_heads v_dim]: q, k, v), each
     * L2-normalized (x / sqrt(sum x^2 + 1e-6)), q times 1 / sqrt(k_dim);
     * beta = sigmoid(b[r][h]), g = decay[h] softplus(a[r][h] + dt_bias[h])
     * (decay = -exp(A_log)); then S = exp(g) S, u = beta (v - S^T k), S +=
     * k u^T, out[r][h] = S^T q. b and a rows are ba_stride elements apart;
     * out packed [rows][v_heads v_dim]. State and sums in F32.
     *
     * rmsnorm_gated: for each row and each of `heads` heads of dim:
     * out = x / rms(x) * w * silu(z), w F32 [dim]; out may be x.
     *
     * mul_sigmoid: x[r][i] *= sigmoid(gate[r * gate_stride + (gate_cols ==
     * 1 ? 0 : i)]) for rows of n.
     *
     * add: x[r][i] += y[r][i] for rows of n.
     *
     * All activations act_dtype, on the device. */
    void (*deltanet_conv)(kernels_backend *be, void *out, const void *in, int in_stride,
                          const float *w, int channels, int kernel, void *states,
                          size_t slot_stride, const int32_t *slots, const kernels_batch *batch);
    void (*deltanet_rule)(kernels_backend *be, void *out, const void *x, const void *b,
                          const void *a, int ba_stride, const float *decay,
                          const float *dt_bias, int k_heads, int v_heads, int k_dim, int v_dim,
                          void *states, size_t slot_stride, const int32_t *slots,
                          const kernels_batch *batch);
    void (*rmsnorm_gated)(kernels_backend *be, void *out, const void *x, const void *z,
                          const float *w, int rows, int heads, int dim, float eps);
    void (*mul_sigmoid)(kernels_backend *be, void *x, const void *gate, int rows, int n,
                        int gate_stride, int gate_cols);
    void (*add)(kernels_backend *be, void *x, const void *y, int rows, int n);

    /* out[i] = in[idx[i]] for rows of dim (act_dtype). */
    void (*gather)(kernels_backend *be, void *out, const void *in, const int32_t *idx, int rows,
                   int dim);

    /* Samples one token per row of logits ([rows][vocab] F32, device), with
     * params[rows], the penalty lists and results[rows] also (device). The
     * semantics, the same on every backend to the bit for the chosen token,
     * are in kernels_sample.h. Row r's penalty entries are
     * penalty_tokens/penalty_counts[penalty_offsets[r] .. penalty_offsets[r + 1])
     * (CSR: offsets has rows + 1 entries; all three NULL for no penalties),
     * tokens in [0, vocab), strictly ascending within a row. */
    void (*sample)(kernels_backend *be, kernels_sample_result *results, const float *logits,
                   int rows, int vocab, const kernels_sample_params *params,
                   const int32_t *penalty_offsets, const int32_t *penalty_tokens,
                   const int32_t *penalty_counts);

    /* Optional (NULL where a backend lacks it). Fills n BF16 elements at
     * dst (device) with the numbers of the host generator of dummy
     * weights: element i is bf16(base + scale * u_i), where u_i is what
     * common_rng_uniform returns on its (i + 1)-th call from `state`. So a
     * dummy model is the same on every backend, and made where it lives. */
    void (*fill_random)(kernels_backend *be, void *dst, size_t n, uint64_t state, float base,
                        float scale);

    /* Optional (NULL where a backend lacks them): recorded op sequences
     * (CUDA graphs), so that a decode step is one launch. Between
     * graph_begin and graph_end the ops are recorded, not run; no upload,
     * download or sync may come between. graph_end keeps the recording in
     * slot [0, graph_slots) (replacing what was there); graph_launch runs
     * it again, with the pointers, sizes and scalars it was recorded with
     * and whatever the device buffers hold when it runs. graph_begin
     * answers SHOAL_ERR_UNSUPPORTED when graphs are turned off; other
     * errors leave the backend unusable. */
    int graph_slots;
    shoal_err (*graph_begin)(kernels_backend *be);
    shoal_err (*graph_end)(kernels_backend *be, int slot);
    shoal_err (*graph_launch)(kernels_backend *be, int slot);
};

typedef struct kernels_backend_options {
    const char *device; /* "cpu", or a CUDA device index "0", "1", ... */
    int threads;        /* CPU backend: threads (0 = one per processor) */
    /* CUDA backend: activation dtype, BF16 or F32; INVALID (0) takes the
     * settings' (cuda_options.act_dtype). The CPU backend always computes
     * in F32. */
    shoal_dtype act_dtype;
    /* CUDA backend: its settings (kernels/cuda/cuda_backend.h), read at
     * open; NULL takes cuda_options_default's. */
    const struct cuda_options *cuda;
} kernels_backend_options;

/* Opens the backend that opt->device names. *out is the caller's until
 * kernels_backend_close. SHOAL_ERR_UNSUPPORTED when the backend was not
 * built; diag says which and why. */
shoal_err kernels_backend_open(const kernels_backend_options *opt, kernels_backend **out,
                               shoal_diag *diag);

/* Closes be; NULL is allowed. */
void kernels_backend_close(kernels_backend *be);

/* Bytes of one activation element. */
size_t kernels_act_bytes(const kernels_backend *be);

#endif
