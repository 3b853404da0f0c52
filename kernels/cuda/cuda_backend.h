/* cuda_backend.h: opening the CUDA backend on one GPU. */
#ifndef SHOAL_KERNELS_CUDA_BACKEND_H
#define SHOAL_KERNELS_CUDA_BACKEND_H

/* The C headers carry no linkage guards: CUDA sources include them here. */
#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/kernels_backend.h"

/* Opens the backend on GPU `device`. SHOAL_ERR_DEVICE when there is no such
 * GPU or the driver fails; diag names the CUDA error. */
shoal_err cuda_backend_open(int device, kernels_backend **out, shoal_diag *diag);

#ifdef __cplusplus
}
#endif

#endif
