/* cuda_backend.h: opening the CUDA backend on one GPU. */
#ifndef SHOAL_KERNELS_CUDA_BACKEND_H
#define SHOAL_KERNELS_CUDA_BACKEND_H

/* The C headers carry no linkage guards: CUDA sources include them here. */
#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/kernels_attention_slices.h"
#include "kernels/kernels_backend.h"

/* Opens the backend on GPU `device` with activations of act_dtype (BF16 or
 * F32; INVALID reads SHOAL_CUDA_ACT_DTYPE, "bf16" or "f32", and else takes
 * BF16). SHOAL_ERR_DEVICE when there is no such GPU or the driver fails;
 * diag names the CUDA error. SHOAL_ERR_INVALID for another act_dtype. */
shoal_err cuda_backend_open(int device, shoal_dtype act_dtype, kernels_backend **out,
                            shoal_diag *diag);

/* GPUs this process can use; 0 without a driver or a GPU. */
int cuda_backend_device_count(void);

/* Tests only, on a backend with no model running: the rows of the
 * attention partial scratch (reallocated), so a test can compare a round
 * cut in slices with one launch; and a planted slicing fault. */
shoal_err cuda_backend_set_attention_slice_rows(kernels_backend *be, int rows);
void cuda_backend_set_attention_fault(kernels_backend *be, kernels_attn_fault fault);

/* Tests only: how many launches of gemm_rows.cu's kernels this backend has
 * made (matmul_swiglu's and matmul_add_rmsnorm's parts), so a test can tell
 * which path an op took where both give results within its tolerance. */
unsigned long cuda_backend_gemm_rows_launches(kernels_backend *be);

/* Tests only: how many launches of deltanet_rule's chunked kernel this
 * backend has made (SHOAL_CUDA_DELTANET_CHUNK), so a test can tell that a
 * batch's long runs took it. */
unsigned long cuda_backend_deltanet_chunk_launches(kernels_backend *be);

/* Tests only: the most items (tiles of rows) one block of the warp-
 * specialized prompt kernel has taken in any launch on this backend; 0
 * where that kernel has not run (no sm_90a, another prompt tile). */
int cuda_backend_prompt_ws_rounds(kernels_backend *be);

#ifdef __cplusplus
}
#endif

#endif
