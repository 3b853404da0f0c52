/* cuda_backend.h: opening the CUDA backend on one GPU. */
#ifndef SHOAL_KERNELS_CUDA_BACKEND_H
#define SHOAL_KERNELS_CUDA_BACKEND_H

/* The C headers carry no linkage guards: CUDA sources include them here. */
#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/kernels_attention_slices.h"
#include "kernels/kernels_backend.h"

#include <stdbool.h>

/* The CUDA backend's settings, fixed at open. cuda_options_default gives
 * the product's: the fast path wherever the GPU and the build run it, and
 * the three user-facing settings from the environment. */
typedef struct cuda_options {
    /* Activations: BF16 (default) or F32, the exact mode that parity runs
     * use (SHOAL_CUDA_ACT_DTYPE=bf16 or f32). */
    shoal_dtype act_dtype;
    /* Decode rounds recorded once and replayed as CUDA graphs (default
     * true; SHOAL_CUDA_GRAPHS=0 runs them op by op, for debugging and
     * profiling). */
    bool graphs;
    /* The delta rule's chunked form on tensor cores for runs of 64 rows
     * and more: 1 on, 0 off, -1 (default) on with BF16 activations and
     * off with F32, whose parity the bf16 products would loosen
     * (SHOAL_CUDA_DELTANET_CHUNK=0 or 1). */
    int deltanet_chunk;
    /* true: only the portable kernels, which every GPU runs (mma.sync,
     * cp.async, cuBLAS), as on a GPU or build without sm_90a code; false
     * (default): the sm_90a ones (wgmma, TMA) wherever the build holds
     * sm_90a code for the GPU. Tests and the kernel lab compare the two. */
    bool portable;
    /* The persistent prompt kernel's blocks at most: 0 (default) one a
     * multiprocessor; tests set a few, so that each block takes many
     * items. */
    int prompt_blocks;
} cuda_options;

/* The product's settings into *opt, reading SHOAL_CUDA_ACT_DTYPE,
 * SHOAL_CUDA_GRAPHS and SHOAL_CUDA_DELTANET_CHUNK (unset: the defaults
 * above). SHOAL_ERR_INVALID, with diag naming the variable, for a value
 * it does not take. Any thread; reads the environment. */
shoal_err cuda_options_default(cuda_options *opt, shoal_diag *diag);

/* Opens the backend on GPU `device` with the settings *opt (copied).
 * SHOAL_ERR_DEVICE when there is no such GPU or the driver fails; diag
 * names the CUDA error. SHOAL_ERR_INVALID for activations other than BF16
 * and F32. *out is the caller's until kernels_backend_close. */
shoal_err cuda_backend_open_with(int device, const cuda_options *opt, kernels_backend **out,
                                 shoal_diag *diag);

/* cuda_backend_open_with on cuda_options_default's settings, with
 * activations of act_dtype where it is not INVALID. */
shoal_err cuda_backend_open(int device, shoal_dtype act_dtype, kernels_backend **out,
                            shoal_diag *diag);

/* GPUs this process can use; 0 without a driver or a GPU. */
int cuda_backend_device_count(void);

/* Tests only, on a backend with no model running: the rows of the
 * attention partial scratch (reallocated), so a test can compare a round
 * cut in slices with one launch. */
shoal_err cuda_backend_set_attention_slice_rows(kernels_backend *be, int rows);

#ifdef SHOAL_TESTING
/* Test builds only: a planted slicing or prompt-kernel fault. */
void cuda_backend_set_attention_fault(kernels_backend *be, kernels_attn_fault fault);

/* Test builds only: how many launches of gemm_rows.cu's kernels this
 * backend has made (matmul_swiglu's and matmul_add_rmsnorm's parts), so a
 * test can tell which path an op took where both give results within its
 * tolerance. */
unsigned long cuda_backend_gemm_rows_launches(kernels_backend *be);

/* Test builds only: how many launches of deltanet_rule's chunked kernel
 * this backend has made, so a test can tell that a batch's long runs
 * took it. */
unsigned long cuda_backend_deltanet_chunk_launches(kernels_backend *be);

/* Test builds only: the most items (tiles of rows) one block of the
 * warp-specialized prompt kernel has taken in any launch on this backend;
 * 0 where that kernel has not run (portable kernels, no sm_90a). */
int cuda_backend_prompt_ws_rounds(kernels_backend *be);
#endif

#ifdef __cplusplus
}
#endif

#endif
