/* cpu_backend.c: the CPU backend's memory and op table. Device memory is
 * host memory; upload and download are copies. */
#include "cpu_ops.h"
#include "kernels/cpu/cpu_backend.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *cpu_alloc(kernels_backend *be, size_t bytes)
{
    /* 64-byte aligned for vector loads; zero-filled as the contract says. */
    size_t rounded = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (p)
        memset(p, 0, rounded ? rounded : 64);
    return p;
}

static void cpu_free(kernels_backend *be, void *ptr)
{
    free(ptr);
}

static shoal_err cpu_copy(kernels_backend *be, void *dst, const void *src, size_t bytes)
{
    if (bytes)
        memmove(dst, src, bytes);
    return SHOAL_OK;
}

static shoal_err cpu_sync(kernels_backend *be)
{
    return SHOAL_OK;
}

static shoal_err cpu_mem_info(kernels_backend *be, size_t *free_bytes, size_t *total_bytes)
{
    long page = sysconf(_SC_PAGESIZE), avail = sysconf(_SC_AVPHYS_PAGES),
         total = sysconf(_SC_PHYS_PAGES);
    if (page <= 0 || avail < 0 || total <= 0)
        return SHOAL_ERR_IO;
    *free_bytes = (size_t)avail * (size_t)page;
    *total_bytes = (size_t)total * (size_t)page;
    return SHOAL_OK;
}

static shoal_err cpu_host_pin(kernels_backend *be, void *ptr, size_t bytes)
{
    return SHOAL_OK; /* host memory is the device's */
}

static void cpu_host_unpin(kernels_backend *be, void *ptr)
{
}

static void cpu_close(kernels_backend *be)
{
    cpu_state *st = cpu_of(be);
    if (st)
        common_pool_close(st->pool);
    free(st);
    free(be);
}

static shoal_err open_backend(int threads, bool avx512_allowed, kernels_backend **out,
                              shoal_diag *diag)
{
    *out = NULL;
    kernels_backend *be = calloc(1, sizeof *be);
    cpu_state *st = calloc(1, sizeof *st);
    if (!be || !st) {
        free(be);
        free(st);
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM, "cpu backend: no memory");
    }
    be->impl = st;
    shoal_err err = common_pool_open(threads, &st->pool);
    if (err) {
        cpu_close(be);
        return shoal_diag_set(diag, err, "cpu backend: cannot start %d threads: %s", threads,
                              shoal_strerror(err));
    }
    __builtin_cpu_init();
    st->avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl");
    if (!avx512_allowed)
        st->avx512 = false;
    be->name = "cpu";
    be->act_dtype = SHOAL_DTYPE_F32;
    be->host_memory = true;
    be->kv_f32 = true;
    be->close = cpu_close;
    be->alloc = cpu_alloc;
    be->free = cpu_free;
    be->upload = cpu_copy;
    be->download = cpu_copy;
    be->sync = cpu_sync;
    be->mem_info = cpu_mem_info;
    be->host_pin = cpu_host_pin;
    be->host_unpin = cpu_host_unpin;
    be->arena_create = cpu_arena_create;
    be->arena_import = cpu_arena_import;
    be->arena_unmap = cpu_arena_unmap;
    be->copy = cpu_copy;
    be->embed = cpu_embed;
    be->rmsnorm = cpu_rmsnorm;
    be->matmul = cpu_matmul;
    be->qk_norm_rope = cpu_qk_norm_rope;
    be->kv_write = cpu_kv_write;
    be->qk_norm_rope_kv_write = cpu_qk_norm_rope_kv_write;
    be->attention = cpu_attention;
    be->attention_prompt = cpu_attention; /* the same function; no tiles to pick */
    be->attention_rope_kv = cpu_attention_rope_kv;
    be->swiglu = cpu_swiglu;
    be->matmul_swiglu = cpu_matmul_swiglu;
    be->gather = cpu_gather;
    be->moe_route = cpu_moe_route;
    be->moe_scratch_bytes = cpu_moe_scratch_bytes;
    be->moe_experts = cpu_moe_experts;
    be->deltanet_conv = cpu_deltanet_conv;
    be->deltanet_rule = cpu_deltanet_rule;
    be->rmsnorm_gated = cpu_rmsnorm_gated;
    be->mul_sigmoid = cpu_mul_sigmoid;
    be->add = cpu_add;
    be->sample = cpu_sample;
    be->fill_random = cpu_fill_random;
    *out = be;
    return SHOAL_OK;
}

shoal_err cpu_backend_open(int threads, kernels_backend **out, shoal_diag *diag)
{
    return open_backend(threads, true, out, diag);
}

shoal_err cpu_backend_open_portable(int threads, kernels_backend **out, shoal_diag *diag)
{
    return open_backend(threads, false, out, diag);
}

int cpu_backend_threads(kernels_backend *be)
{
    return common_pool_threads(cpu_of(be)->pool);
}
