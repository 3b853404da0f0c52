/* cuda_backend.cu: the CUDA backend's device, memory and op table.
 *
 * One stream carries every op, upload and download, so ops run in the order
 * they are called and a download sees every op before it. Everything the
 * backend itself needs (cuBLAS workspace, attention scratch) is allocated
 * here at open; ops never allocate. */
#include "cuda_ops.h"

extern "C" {
#include "common/common_limits.h"
#include "common/common_log.h"
}

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cuda_fail(kernels_backend *be, const char *what, cudaError_t e)
{
    cuda_state *st = cuda_of(be);
    if (st->err != SHOAL_OK)
        return;
    st->err = SHOAL_ERR_DEVICE;
    snprintf(st->err_msg, sizeof st->err_msg, "cuda: %s: %s (%s)", what, cudaGetErrorString(e),
             cudaGetErrorName(e));
    LOG_ERROR("%s; the GPU backend is unusable from here on", st->err_msg);
}

void cuda_fail_cublas(kernels_backend *be, const char *what, cublasStatus_t s)
{
    cuda_state *st = cuda_of(be);
    if (st->err != SHOAL_OK)
        return;
    st->err = SHOAL_ERR_DEVICE;
    snprintf(st->err_msg, sizeof st->err_msg, "cublas: %s: %s", what, cublasGetStatusString(s));
    LOG_ERROR("%s; the GPU backend is unusable from here on", st->err_msg);
}

static bool check(kernels_backend *be, const char *what, cudaError_t e)
{
    if (e != cudaSuccess)
        cuda_fail(be, what, e);
    return cuda_of(be)->err == SHOAL_OK;
}

static void *cuda_alloc(kernels_backend *be, size_t bytes)
{
    cuda_state *st = cuda_of(be);
    if (st->err)
        return NULL;
    cuda_alloc_list *l = &st->allocs;
    if (l->count == l->cap) {
        int cap = l->cap ? l->cap * 2 : 256;
        void **p = (void **)realloc(l->ptr, (size_t)cap * sizeof *p);
        if (!p)
            return NULL;
        l->ptr = p;
        l->cap = cap;
    }
    void *ptr = NULL;
    /* An out-of-memory answer is the caller's to report; it does not
     * poison the context, so it is not recorded as a device error. */
    if (cudaMalloc(&ptr, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    /* zero-filled, as the contract says; done before anything can use it */
    if (!check(be, "cudaMemsetAsync", cudaMemsetAsync(ptr, 0, bytes, st->stream)) ||
        !check(be, "cudaStreamSynchronize", cudaStreamSynchronize(st->stream))) {
        cudaFree(ptr);
        return NULL;
    }
    l->ptr[l->count++] = ptr;
    return ptr;
}

static void cuda_free(kernels_backend *be, void *ptr)
{
    if (!ptr)
        return;
    cuda_alloc_list *l = &cuda_of(be)->allocs;
    for (int i = l->count - 1; i >= 0; i--) {
        if (l->ptr[i] == ptr) {
            l->ptr[i] = l->ptr[--l->count];
            cudaFree(ptr);
            return;
        }
    }
    SHOAL_ASSERT(!"cuda free: pointer not from this backend's alloc");
}

static shoal_err cuda_upload(kernels_backend *be, void *dst, const void *src, size_t bytes)
{
    cuda_state *st = cuda_of(be);
    SHOAL_ASSERT(!st->capturing);
    if (st->err || bytes == 0)
        return st->err;
    /* From pageable memory the call returns once src has been staged, so
     * the caller may reuse src at once. */
    check(be, "upload", cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st->stream));
    return st->err;
}

static shoal_err cuda_download(kernels_backend *be, void *dst, const void *src, size_t bytes)
{
    cuda_state *st = cuda_of(be);
    SHOAL_ASSERT(!st->capturing);
    if (st->err)
        return st->err;
    if (bytes)
        check(be, "download",
              cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, st->stream));
    if (!st->err)
        check(be, "download: synchronize", cudaStreamSynchronize(st->stream));
    return st->err;
}

static shoal_err cuda_copy(kernels_backend *be, void *dst, const void *src, size_t bytes)
{
    cuda_state *st = cuda_of(be);
    if (st->err || bytes == 0)
        return st->err;
    /* cudaMemcpyDefault: the pointers say where they are (unified
     * addressing), so one call covers our buffers, our arena and a peer's
     * arena mapped here, wherever its memory sits. */
    check(be, "copy", cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, st->stream));
    return st->err;
}

static shoal_err cuda_sync(kernels_backend *be)
{
    cuda_state *st = cuda_of(be);
    SHOAL_ASSERT(!st->capturing);
    if (!st->err)
        check(be, "synchronize", cudaStreamSynchronize(st->stream));
    return st->err;
}

/* ---- graphs: a decode step recorded once, then one launch ---- */

static shoal_err cuda_graph_begin(kernels_backend *be)
{
    cuda_state *st = cuda_of(be);
    SHOAL_ASSERT(!st->capturing);
    if (st->err)
        return st->err;
    if (!st->opt.graphs)
        return SHOAL_ERR_UNSUPPORTED;
    /* thread-local: only this thread's calls are recorded, and another
     * thread's unrelated CUDA work does not break the recording */
    if (check(be, "graph: begin capture",
              cudaStreamBeginCapture(st->stream, cudaStreamCaptureModeThreadLocal)))
        st->capturing = true;
    return st->err;
}

static shoal_err cuda_graph_end(kernels_backend *be, int slot)
{
    cuda_state *st = cuda_of(be);
    SHOAL_ASSERT(st->capturing && slot >= 0 && slot < CUDA_GRAPH_SLOTS);
    st->capturing = false;
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(st->stream, &g);
    if (e == cudaSuccess && st->err == SHOAL_OK) {
        if (st->graph[slot]) {
            cudaGraphExecDestroy(st->graph[slot]);
            st->graph[slot] = NULL;
        }
        e = cudaGraphInstantiate(&st->graph[slot], g, 0);
    }
    if (g)
        cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        st->graph[slot] = NULL;
        cuda_fail(be, "graph: end capture and instantiate", e);
    }
    return st->err;
}

static shoal_err cuda_graph_launch(kernels_backend *be, int slot)
{
    cuda_state *st = cuda_of(be);
    SHOAL_ASSERT(!st->capturing && slot >= 0 && slot < CUDA_GRAPH_SLOTS && st->graph[slot]);
    if (!st->err)
        check(be, "graph: launch", cudaGraphLaunch(st->graph[slot], st->stream));
    return st->err;
}

static void cuda_close(kernels_backend *be)
{
    cuda_state *st = cuda_of(be);
    if (st) {
        if (st->capturing) {
            cudaGraph_t g = NULL;
            cudaStreamEndCapture(st->stream, &g);
            if (g)
                cudaGraphDestroy(g);
        }
        if (st->stream)
            cudaStreamSynchronize(st->stream);
        for (int i = 0; i < CUDA_GRAPH_SLOTS; i++)
            if (st->graph[i])
                cudaGraphExecDestroy(st->graph[i]);
        for (int i = 0; i < st->allocs.count; i++)
            cudaFree(st->allocs.ptr[i]);
        free(st->allocs.ptr);
        cudaFree(st->attn_scratch);
        cudaFree(st->sample_parts);
        cudaFree(st->cublas_workspace);
        cudaFree(st->gemm_parts_buf);
        cudaFree(st->deltanet_runs);
        if (st->cublas)
            cublasDestroy(st->cublas);
        if (st->stream)
            cudaStreamDestroy(st->stream);
        free(st);
    }
    free(be);
}

extern "C" int cuda_backend_device_count(void)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return count;
}

static shoal_err alloc_attn_scratch(kernels_backend *be, int rows, shoal_diag *diag)
{
    cuda_state *st = cuda_of(be);
    cudaFree(st->attn_scratch);
    st->attn_scratch = NULL;
    size_t bytes = (size_t)(rows > KERNELS_ATTN_SLICE_ROWS ? rows : KERNELS_ATTN_SLICE_ROWS) *
                   CUDA_ATTN_ROW_SCRATCH_BYTES;
    if (cudaMalloc(&st->attn_scratch, bytes) != cudaSuccess) {
        cudaGetLastError();
        st->attn_scratch = NULL;
        st->attn_slice_rows = 0;
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM,
                              "cuda: no memory for %zu bytes of attention scratch", bytes);
    }
    st->attn_slice_rows = rows;
    return SHOAL_OK;
}

extern "C" shoal_err cuda_backend_set_attention_slice_rows(kernels_backend *be, int rows)
{
    SHOAL_ASSERT(rows > 0);
    cudaStreamSynchronize(cuda_of(be)->stream);
    return alloc_attn_scratch(be, rows, NULL);
}

#ifdef SHOAL_TESTING
extern "C" void cuda_backend_set_attention_fault(kernels_backend *be, kernels_attn_fault fault)
{
    cuda_of(be)->attn_fault = fault;
}

extern "C" unsigned long cuda_backend_gemm_rows_launches(kernels_backend *be)
{
    return cuda_of(be)->gemm_rows_launches;
}

extern "C" unsigned long cuda_backend_deltanet_chunk_launches(kernels_backend *be)
{
    return cuda_of(be)->deltanet_chunk_launches;
}

extern "C" int cuda_backend_prompt_ws_rounds(kernels_backend *be)
{
    return cuda_of(be)->prompt_ws_rounds;
}
#endif

/* A setting of 0 or 1 from the environment into *out (unset or empty:
 * *out stays); SHOAL_ERR_INVALID for another value. */
static shoal_err env_flag(const char *name, int *out, shoal_diag *diag)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return SHOAL_OK;
    if (strcmp(v, "0") != 0 && strcmp(v, "1") != 0)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID, "%s '%s': expected 0 or 1", name, v);
    *out = v[0] == '1';
    return SHOAL_OK;
}

extern "C" shoal_err cuda_options_default(cuda_options *opt, shoal_diag *diag)
{
    memset(opt, 0, sizeof *opt);
    opt->act_dtype = SHOAL_DTYPE_BF16;
    opt->graphs = true;
    opt->deltanet_chunk = -1;
    opt->portable = false;
    opt->prompt_blocks = 0;
    const char *env = getenv("SHOAL_CUDA_ACT_DTYPE");
    if (env && *env && strcmp(env, "bf16") != 0) {
        if (strcmp(env, "f32") != 0)
            return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                                  "SHOAL_CUDA_ACT_DTYPE '%s': expected bf16 or f32", env);
        opt->act_dtype = SHOAL_DTYPE_F32;
    }
    int graphs = 1;
    shoal_err err = env_flag("SHOAL_CUDA_GRAPHS", &graphs, diag);
    if (!err)
        err = env_flag("SHOAL_CUDA_DELTANET_CHUNK", &opt->deltanet_chunk, diag);
    opt->graphs = graphs != 0;
    return err;
}

static void pick_kernels(cuda_state *st)
{
    st->attn_tc = true;
    st->gemv_rows_max = CUDA_GEMV_ROWS_DEFAULT;
    st->attn_fill = 2;
    st->attn_stages = 2;
    st->attn_blocks = 0;
    st->attn_wave = true;
    st->attn_tma_rows = true;
    st->attn_depth = 4;
    st->attn_tma_l2 = 128;
    st->attn_early = true;
    st->attn_rope = 2;
    st->norm_early = 2;
    st->gemv_loads = 16;
    st->norm_fused = true;
    st->prompt_tile = 5;
    st->prompt_persist = true;
    st->sample_split = true;
    st->gemv_swiglu = true;
    st->rope_kv_fused = true;
    st->gate_up_batched = true;
    st->gemm_parts = 1;
    st->gemm_swiglu = 1;
    st->gemm_rows_parts = true;
    st->gemm_rows_pre = 6;
}

static shoal_err cuda_mem_info(kernels_backend *be, size_t *free_bytes, size_t *total_bytes)
{
    return cudaMemGetInfo(free_bytes, total_bytes) == cudaSuccess ? SHOAL_OK : SHOAL_ERR_DEVICE;
}

static shoal_err cuda_host_pin(kernels_backend *be, void *ptr, size_t bytes)
{
    /* not check(): a refusal leaves pageable memory, not a broken backend */
    cudaError_t e = cudaHostRegister(ptr, bytes, cudaHostRegisterDefault);
    if (e != cudaSuccess) {
        cudaGetLastError();
        LOG_WARN("cuda: cannot pin %zu bytes of host memory (%s); they stay pageable", bytes,
                 cudaGetErrorString(e));
        return SHOAL_ERR_DEVICE;
    }
    return SHOAL_OK;
}

static void cuda_host_unpin(kernels_backend *be, void *ptr)
{
    cudaHostUnregister(ptr);
}

extern "C" shoal_err cuda_backend_open(int device, shoal_dtype act_dtype, kernels_backend **out,
                                       shoal_diag *diag)
{
    *out = NULL;
    cuda_options opt;
    shoal_err err = cuda_options_default(&opt, diag);
    if (err)
        return err;
    if (act_dtype != SHOAL_DTYPE_INVALID)
        opt.act_dtype = act_dtype;
    return cuda_backend_open_with(device, &opt, out, diag);
}

extern "C" shoal_err cuda_backend_open_with(int device, const cuda_options *opt,
                                            kernels_backend **out, shoal_diag *diag)
{
    *out = NULL;
    shoal_dtype act = opt->act_dtype;
    shoal_err err = SHOAL_OK;
    if (act != SHOAL_DTYPE_BF16 && act != SHOAL_DTYPE_F32)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "cuda: activations must be BF16 or F32, not %s",
                              shoal_dtype_name(act));
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess)
        return shoal_diag_set(diag, SHOAL_ERR_DEVICE, "cuda: no usable GPU: %s",
                              cudaGetErrorString(e));
    if (device >= count)
        return shoal_diag_set(diag, SHOAL_ERR_DEVICE, "cuda: GPU %d requested, %d present", device,
                              count);
    kernels_backend *be = (kernels_backend *)calloc(1, sizeof *be);
    cuda_state *st = (cuda_state *)calloc(1, sizeof *st);
    if (!be || !st) {
        free(be);
        free(st);
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM, "cuda backend: no memory");
    }
    be->impl = st;
    st->device = device;
    st->opt = *opt;
    pick_kernels(st);
    cublasStatus_t cs;
    if ((e = cudaSetDevice(device)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        err = shoal_diag_set(diag, SHOAL_ERR_DEVICE, "cuda: GPU %d: %s", device,
                             cudaGetErrorString(e));
        goto out_close;
    }
    if ((e = cudaDeviceGetAttribute(&st->sm_count, cudaDevAttrMultiProcessorCount, device)) !=
        cudaSuccess) {
        err = shoal_diag_set(diag, SHOAL_ERR_DEVICE, "cuda: GPU %d: %s", device,
                             cudaGetErrorString(e));
        goto out_close;
    }
    /* a round of r rows reads each row in at most max(1, 4 sm / r)
     * chunks (sample.cu): r + 4 sm summaries at most */
    st->sample_parts_max = SHOAL_BATCH_ROWS_MAX + 4 * st->sm_count;
    if ((e = cudaMalloc(&st->sample_parts,
                        (size_t)st->sample_parts_max * CUDA_SAMPLE_PART_BYTES)) != cudaSuccess) {
        err = shoal_diag_set(diag, SHOAL_ERR_NOMEM,
                             "cuda: GPU %d: no memory for the sampler's scratch: %s", device,
                             cudaGetErrorString(e));
        goto out_close;
    }
    if ((e = cudaMalloc(&st->cublas_workspace, CUDA_CUBLAS_WORKSPACE_BYTES)) != cudaSuccess) {
        err = shoal_diag_set(diag, SHOAL_ERR_NOMEM, "cuda: GPU %d: no memory for cuBLAS: %s",
                             device, cudaGetErrorString(e));
        goto out_close;
    }
    if (st->gemm_parts &&
        (e = cudaMalloc(&st->gemm_parts_buf, CUDA_GEMM_PARTS_BYTES)) != cudaSuccess) {
        err = shoal_diag_set(diag, SHOAL_ERR_NOMEM,
                             "cuda: GPU %d: no memory for the split matmul's parts: %s", device,
                             cudaGetErrorString(e));
        goto out_close;
    }
    if ((e = cudaMalloc(&st->deltanet_runs, CUDA_DELTANET_RUNS_INTS * sizeof(int32_t))) !=
        cudaSuccess) {
        err = shoal_diag_set(diag, SHOAL_ERR_NOMEM,
                             "cuda: GPU %d: no memory for the DeltaNet run list: %s", device,
                             cudaGetErrorString(e));
        goto out_close;
    }
    if ((cs = cublasCreate(&st->cublas)) != CUBLAS_STATUS_SUCCESS ||
        (cs = cublasSetStream(st->cublas, st->stream)) != CUBLAS_STATUS_SUCCESS ||
        (cs = cublasSetWorkspace(st->cublas, st->cublas_workspace,
                                 CUDA_CUBLAS_WORKSPACE_BYTES)) != CUBLAS_STATUS_SUCCESS) {
        err = shoal_diag_set(diag, SHOAL_ERR_DEVICE, "cublas: GPU %d: %s", device,
                             cublasGetStatusString(cs));
        goto out_close;
    }
    /* The chunked delta rule multiplies bf16 operands on tensor cores: by
     * default it serves bf16 activations, and f32 ones (the exact parity
     * runs) keep the recurrent rule. */
    st->deltanet_chunk =
        opt->deltanet_chunk < 0 ? act == SHOAL_DTYPE_BF16 : opt->deltanet_chunk != 0;
    if ((err = alloc_attn_scratch(be, KERNELS_ATTN_SLICE_ROWS, diag)) ||
        (err = cuda_attention_init(be)) || (err = cuda_attention_prompt_init(be)) ||
        (err = cuda_gemm_rows_init(be)) ||
        (err = cuda_deltanet_init(be))) {
        if (err == SHOAL_ERR_DEVICE)
            shoal_diag_set(diag, err, "%s", st->err_msg);
        goto out_close;
    }
    be->name = "cuda";
    be->act_dtype = act;
    be->host_memory = false;
    be->close = cuda_close;
    be->alloc = cuda_alloc;
    be->free = cuda_free;
    be->upload = cuda_upload;
    be->download = cuda_download;
    be->sync = cuda_sync;
    be->mem_info = cuda_mem_info;
    be->host_pin = cuda_host_pin;
    be->host_unpin = cuda_host_unpin;
    be->arena_create = cuda_arena_create;
    be->arena_import = cuda_arena_import;
    be->arena_unmap = cuda_arena_unmap;
    be->copy = cuda_copy;
    be->embed = cuda_embed;
    be->rmsnorm = cuda_rmsnorm;
    be->matmul = cuda_matmul;
    be->qk_norm_rope = cuda_qk_norm_rope;
    be->kv_write = cuda_kv_write;
    be->qk_norm_rope_kv_write = cuda_qk_norm_rope_kv_write;
    be->attention_rope_kv = cuda_attention_rope_kv;
    be->attention = cuda_attention;
    be->attention_prompt = cuda_attention_prompt;
    be->swiglu = cuda_swiglu;
    be->matmul_swiglu = cuda_matmul_swiglu;
    be->gather = cuda_gather;
    be->moe_route = cuda_moe_route;
    be->moe_scratch_bytes = cuda_moe_scratch_bytes;
    be->moe_experts = cuda_moe_experts;
    be->deltanet_conv = cuda_deltanet_conv;
    be->deltanet_rule = cuda_deltanet_rule;
    be->rmsnorm_gated = cuda_rmsnorm_gated;
    be->mul_sigmoid = cuda_mul_sigmoid;
    be->add = cuda_add;
    /* the fused norm where the one-row GEMV takes bf16 matmuls */
    be->fused_norm_rows = st->norm_fused && act == SHOAL_DTYPE_BF16 && st->gemv_rows_max >= 1;
    be->scale_columns = cuda_scale_columns;
    be->matmul_rms = cuda_matmul_rms;
    be->matmul_swiglu_rms = cuda_matmul_swiglu_rms;
    be->matmul_add = cuda_matmul_add;
    be->matmul_add_rmsnorm = cuda_matmul_add_rmsnorm;
    be->sample = cuda_sample;
    be->fill_random = cuda_fill_random;
    be->graph_slots = CUDA_GRAPH_SLOTS;
    be->graph_begin = cuda_graph_begin;
    be->graph_end = cuda_graph_end;
    be->graph_launch = cuda_graph_launch;
    *out = be;
    return SHOAL_OK;
out_close:
    cuda_close(be);
    return err;
}
