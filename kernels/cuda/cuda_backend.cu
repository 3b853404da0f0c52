/* cuda_backend.cu: the CUDA backend's device, memory and op table.
 *
 * The ops themselves (one per file, each the twin of kernels/cpu/<op>.c)
 * are not written yet; until they are, opening the backend reports that
 * plainly rather than running a model half on the GPU. */
#include "cuda_backend.h"

#include <cuda_runtime.h>

extern "C" shoal_err cuda_backend_open(int device, kernels_backend **out, shoal_diag *diag)
{
    *out = NULL;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess)
        return shoal_diag_set(diag, SHOAL_ERR_DEVICE, "cuda: no usable GPU: %s",
                              cudaGetErrorString(e));
    if (device >= count)
        return shoal_diag_set(diag, SHOAL_ERR_DEVICE, "cuda: GPU %d requested, %d present", device,
                              count);
    return shoal_diag_set(diag, SHOAL_ERR_UNSUPPORTED,
                          "cuda: the CUDA ops are not built yet; use --device cpu");
}
