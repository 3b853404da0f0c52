/* cpu_ops.h: the CPU backend's ops, one file each, shared by its op table.
 *
 * Private to kernels/cpu/. Signatures follow kernels_backend.h; activations
 * are F32. Each op splits its work into tasks on the backend's thread pool. */
#ifndef SHOAL_KERNELS_CPU_OPS_H
#define SHOAL_KERNELS_CPU_OPS_H

#include "common/common_limits.h"
#include "common/common_pool.h"
#include "kernels/kernels_backend.h"

/* The CPU backend's state (be->impl). */
typedef struct cpu_state {
    common_pool *pool;
    bool avx512; /* AVX-512 F/BW/VL present: the matmul uses it */
} cpu_state;

static inline cpu_state *cpu_of(kernels_backend *be)
{
    return (cpu_state *)be->impl;
}

void cpu_embed(kernels_backend *be, void *out, const void *table, shoal_dtype wdtype,
               const int32_t *ids, int rows, int dim);
void cpu_rmsnorm(kernels_backend *be, void *out, void *x, const void *residual,
                 const float *weight, int rows, int dim, float eps);
void cpu_matmul(kernels_backend *be, void *out, shoal_dtype out_dtype, const void *in,
                const void *w, shoal_dtype wdtype, int rows, int n, int k);
void cpu_qk_norm_rope(kernels_backend *be, void *x, int rows, int heads, int head_dim,
                      int row_stride, const float *norm_weight, float eps,
                      const int32_t *positions, const float *inv_freq);
void cpu_kv_write(kernels_backend *be, void *arena, const kernels_kv_layout *layout,
                  const kernels_batch *batch, int layer, const void *k, const void *v);
void cpu_qk_norm_rope_kv_write(kernels_backend *be, void *q_out, const void *q, void *k,
                               const void *v, int stride, int heads,
                               const float *q_norm, const float *k_norm, float eps,
                               const float *inv_freq, void *arena,
                               const kernels_kv_layout *layout, const kernels_batch *batch,
                               int layer);
void cpu_attention(kernels_backend *be, void *out, const void *q, int heads, const void *arena,
                   const kernels_kv_layout *layout, const kernels_batch *batch, int layer,
                   float scale);
void cpu_attention_rope_kv(kernels_backend *be, void *out, void *q_out, const void *q, void *k,
                           const void *v, int stride, int heads, const float *q_norm,
                           const float *k_norm, float eps, const float *inv_freq, void *arena,
                           const kernels_kv_layout *layout, const kernels_batch *batch,
                           int layer, float scale);
void cpu_swiglu(kernels_backend *be, void *out, const void *gate, const void *up, int rows,
                int dim);
void cpu_matmul_swiglu(kernels_backend *be, void *out, void *up, const void *in, const void *wg,
                       const void *wu, shoal_dtype wdtype, int rows, int n, int k);
void cpu_moe_route(kernels_backend *be, int32_t *ids, float *weights, const float *logits,
                   int rows, int experts, int topk, bool renorm);
size_t cpu_moe_scratch_bytes(kernels_backend *be, int rows, int topk, int n, int k);
void cpu_moe_experts(kernels_backend *be, void *out, const void *in, const int32_t *ids,
                     const float *weights, int rows, int topk, const kernels_weight *wg,
                     const kernels_weight *wu, const kernels_weight *wd, void *scratch);
void cpu_deltanet_conv(kernels_backend *be, void *out, const void *in, int in_stride,
                       const float *w, int channels, int kernel, void *states,
                       size_t slot_stride, const int32_t *slots, const kernels_batch *batch);
void cpu_deltanet_rule(kernels_backend *be, void *out, const void *x, const void *b,
                       const void *a, int ba_stride, const float *decay, const float *dt_bias,
                       int k_heads, int v_heads, int k_dim, int v_dim, void *states,
                       size_t slot_stride, const int32_t *slots, const kernels_batch *batch);
void cpu_rmsnorm_gated(kernels_backend *be, void *out, const void *x, const void *z,
                       const float *w, int rows, int heads, int dim, float eps);
void cpu_mul_sigmoid(kernels_backend *be, void *x, const void *gate, int rows, int n,
                     int gate_stride, int gate_cols);
void cpu_add(kernels_backend *be, void *x, const void *y, int rows, int n);
void cpu_gather(kernels_backend *be, void *out, const void *in, const int32_t *idx, int rows,
                int dim);
void cpu_sample(kernels_backend *be, kernels_sample_result *results, const float *logits, int rows,
                int vocab, const kernels_sample_params *params, const int32_t *penalty_offsets,
                const int32_t *penalty_tokens, const int32_t *penalty_counts);
void cpu_fill_random(kernels_backend *be, void *dst, size_t n, uint64_t state, float base,
                     float scale);

/* arena.c: shared arenas (memfd), the kernels_backend.h contract. */
shoal_err cpu_arena_create(kernels_backend *be, size_t bytes, void **ptr, int *fd,
                           size_t *mapped_bytes);
shoal_err cpu_arena_import(kernels_backend *be, int fd, size_t bytes, void **ptr);
void cpu_arena_unmap(kernels_backend *be, void *ptr, size_t bytes);

/* Squared-sum of n floats, in a fixed lane order so results do not depend on
 * how a caller splits work. */
float cpu_sum_squares(const float *x, int n);

#endif
