#include "kernels_backend.h"

#include "kernels/cpu/cpu_backend.h"
#ifdef SHOAL_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

#include "common/common_assert.h"

#include <stdlib.h>
#include <string.h>

void kernels_kv_layout_init(kernels_kv_layout *layout, int layers, int kv_heads, int head_dim,
                            int page_tokens, shoal_dtype dtype)
{
    SHOAL_ASSERT(dtype == SHOAL_DTYPE_BF16 || dtype == SHOAL_DTYPE_F8_E4M3 ||
                 dtype == SHOAL_DTYPE_F32);
    layout->layers = layers;
    layout->kv_heads = kv_heads;
    layout->head_dim = head_dim;
    layout->page_tokens = page_tokens;
    layout->dtype = dtype;
    layout->k_scale = NULL;
    layout->v_scale = NULL;
    layout->page_bytes = (size_t)layers * 2 * (size_t)kv_heads * (size_t)page_tokens *
                         (size_t)head_dim * shoal_dtype_bytes(dtype);
}

shoal_err kernels_backend_open(const kernels_backend_options *opt, kernels_backend **out,
                               shoal_diag *diag)
{
    *out = NULL;
    if (strcmp(opt->device, "cpu") == 0)
        return cpu_backend_open(opt->threads, out, diag);
    char *end;
    long index = strtol(opt->device, &end, 10);
    if (*opt->device == '\0' || *end != '\0' || index < 0 || index > 1023)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "device '%s': expected 'cpu' or a GPU index such as 0", opt->device);
#ifdef SHOAL_HAVE_CUDA
    cuda_options co;
    if (opt->cuda) {
        co = *opt->cuda;
    } else {
        shoal_err err = cuda_options_default(&co, diag);
        if (err)
            return err;
    }
    if (opt->act_dtype != SHOAL_DTYPE_INVALID)
        co.act_dtype = opt->act_dtype;
    return cuda_backend_open_with((int)index, &co, out, diag);
#else
    return shoal_diag_set(diag, SHOAL_ERR_UNSUPPORTED,
                          "device '%s': this build of shoal has no CUDA backend (rebuild with "
                          "nvcc on the PATH and -DSHOAL_CUDA=ON)",
                          opt->device);
#endif
}

void kernels_backend_close(kernels_backend *be)
{
    if (be)
        be->close(be);
}

size_t kernels_act_bytes(const kernels_backend *be)
{
    return shoal_dtype_bytes(be->act_dtype);
}
