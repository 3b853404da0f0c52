/* out[rows][n] = in[rows][k] x w[n][k]^T: the twin of kernels/cpu/matmul.c.
 *
 * bf16 by bf16 with at most gemv_rows_max rows (decode) takes our GEMV,
 * which streams the weights at the copy bandwidth. Otherwise, where cuBLAS takes the operands as they are (bf16 activations with bf16
 * weights, f32 with f32) it runs the GEMM, F32 accumulation. Mixed pairs
 * (bf16 or f32 activations with f16 weights, and the like) take a tiled
 * SIMT kernel of ours with F32 accumulation; checkpoints in the activation
 * dtype, the usual case, never do. */
#include "cuda_ops.h"

enum { MM_BM = 64, MM_BN = 64, MM_BK = 16, MM_THREADS = 256 };

/* A 64 x 64 tile of out per block, 4 x 4 per thread, k in steps of 16
 * through shared memory, summed in ascending k. */
template <typename A, typename W, typename O>
static __global__ void __launch_bounds__(MM_THREADS)
    matmul_simt(O *out, const A *in, const W *w, int rows, int n, int k)
{
    __shared__ float as[MM_BK][MM_BM + 4];
    __shared__ float ws[MM_BK][MM_BN + 4];
    int r0 = blockIdx.y * MM_BM, c0 = blockIdx.x * MM_BN;
    int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < k; k0 += MM_BK) {
        for (int e = threadIdx.x; e < MM_BM * MM_BK; e += MM_THREADS) {
            int rr = e / MM_BK, kk = e % MM_BK;
            int r = r0 + rr, c = c0 + rr, kx = k0 + kk;
            as[kk][rr] = r < rows && kx < k ? to_f32(in[(size_t)r * k + kx]) : 0.0f;
            ws[kk][rr] = c < n && kx < k ? to_f32(w[(size_t)c * k + kx]) : 0.0f;
        }
        __syncthreads();
        for (int kk = 0; kk < MM_BK; kk++) {
            float a[4], b[4];
            for (int i = 0; i < 4; i++) {
                a[i] = as[kk][ty * 4 + i];
                b[i] = ws[kk][tx * 4 + i];
            }
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++)
                    acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
    for (int i = 0; i < 4; i++) {
        int r = r0 + ty * 4 + i;
        for (int j = 0; j < 4; j++) {
            int c = c0 + tx * 4 + j;
            if (r < rows && c < n)
                out[(size_t)r * n + c] = from_f32<O>(acc[i][j]);
        }
    }
}

/* Few rows (decode): the GEMM is a stream over the weights, which cuBLAS
 * reads well below the copy bandwidth at one row. One warp per weight row
 * n reads it once in 16-byte loads, GEMV_UNROLL of them in flight per lane
 * (kept out of L1, so the inputs, read by every warp, stay there), and
 * takes the dot products with all R input rows; the k-sums go lane-local
 * then across the warp, the same order for every row count. */
enum { GEMV_WARPS = 4, GEMV_UNROLL = 8 };

static __device__ __forceinline__ uint4 ld_stream16(const void *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

static __device__ __forceinline__ float dot8_bf16(uint4 a, uint4 b)
{
    const __nv_bfloat162 *x = (const __nv_bfloat162 *)&a, *y = (const __nv_bfloat162 *)&b;
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 fx = __bfloat1622float2(x[i]), fy = __bfloat1622float2(y[i]);
        s = fmaf(fx.x, fy.x, s);
        s = fmaf(fx.y, fy.y, s);
    }
    return s;
}

/* Launched with programmatic serialization (pdl_wait in cuda_ops.h): the
 * first GEMV_UNROLL loads of each lane, weights only, are issued before
 * waiting for the kernel that writes the input, so the weight stream
 * starts while that kernel drains. */
template <int R, typename O>
static __global__ void __launch_bounds__(GEMV_WARPS * 32)
    matmul_gemv(O *out, const bf16 *in, const bf16 *w, int n, int k)
{
    pdl_trigger();
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    const int chunks = k / 8;
    const uint4 *wr = (const uint4 *)(w + (size_t)(row < n ? row : 0) * k);
    const uint4 *x = (const uint4 *)in;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        acc[r] = 0.0f;
    /* the first group of loads, before the wait; the loops after are
     * the plain ones (unpredicated full groups, then a tail) */
    uint4 wv[GEMV_UNROLL];
    int c = lane;
    const bool first = row < n && c + (GEMV_UNROLL - 1) * 32 < chunks;
    if (first)
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++)
            wv[u] = ld_stream16(wr + c + u * 32);
    pdl_wait();
    if (row >= n)
        return;
    if (first) {
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++)
#pragma unroll
            for (int r = 0; r < R; r++)
                acc[r] += dot8_bf16(wv[u], __ldg(x + (size_t)r * chunks + c + u * 32));
        c += GEMV_UNROLL * 32;
    }
    for (; c + (GEMV_UNROLL - 1) * 32 < chunks; c += GEMV_UNROLL * 32) {
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++)
            wv[u] = ld_stream16(wr + c + u * 32);
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++)
#pragma unroll
            for (int r = 0; r < R; r++)
                acc[r] += dot8_bf16(wv[u], __ldg(x + (size_t)r * chunks + c + u * 32));
    }
    for (; c < chunks; c += 32) {
        uint4 w1 = ld_stream16(wr + c);
#pragma unroll
        for (int r = 0; r < R; r++)
            acc[r] += dot8_bf16(w1, __ldg(x + (size_t)r * chunks + c));
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        float v = warp_reduce(acc[r], op_add());
        if (lane == 0)
            out[(size_t)r * n + row] = from_f32<O>(v);
    }
}

template <int R, typename O>
static void launch_gemv_r(cudaStream_t stream, unsigned blocks, O *out, const bf16 *in,
                          const bf16 *w, int n, int k)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(GEMV_WARPS * 32);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    cudaLaunchKernelEx(&cfg, matmul_gemv<R, O>, out, in, w, n, k);
}

template <typename O>
static void launch_gemv(cudaStream_t stream, O *out, const bf16 *in, const bf16 *w, int rows,
                        int n, int k)
{
    unsigned blocks = (unsigned)((n + GEMV_WARPS - 1) / GEMV_WARPS);
    switch (rows) {
#define GEMV_CASE(R)                                                                             \
    case R: launch_gemv_r<R, O>(stream, blocks, out, in, w, n, k); break;
        GEMV_CASE(1)
        GEMV_CASE(2)
        GEMV_CASE(3)
        GEMV_CASE(4)
        GEMV_CASE(5)
        GEMV_CASE(6)
        GEMV_CASE(7)
        GEMV_CASE(8)
#undef GEMV_CASE
    default: SHOAL_ASSERT(!"gemv: 1 to CUDA_GEMV_ROWS_MAX rows");
    }
}

static cudaDataType_t cuda_type(shoal_dtype dt)
{
    switch (dt) {
    case SHOAL_DTYPE_BF16: return CUDA_R_16BF;
    case SHOAL_DTYPE_F16: return CUDA_R_16F;
    default: return CUDA_R_32F;
    }
}

void cuda_matmul(kernels_backend *be, void *out, shoal_dtype out_dtype, const void *in,
                 const void *w, shoal_dtype wdtype, int rows, int n, int k)
{
    shoal_dtype act = be->act_dtype;
    SHOAL_ASSERT(out_dtype == act || out_dtype == SHOAL_DTYPE_F32);
    SHOAL_ASSERT(wdtype == SHOAL_DTYPE_BF16 || wdtype == SHOAL_DTYPE_F16 ||
                 wdtype == SHOAL_DTYPE_F32);
    SHOAL_ASSERT(rows >= 0 && n > 0 && k > 0);
    CUDA_ASSERT_ALIGNED(out, shoal_dtype_bytes(out_dtype));
    CUDA_ASSERT_ALIGNED(in, shoal_dtype_bytes(act));
    CUDA_ASSERT_ALIGNED(w, shoal_dtype_bytes(wdtype));
    if (rows == 0 || !cuda_usable(be))
        return;
    cuda_state *st = cuda_of(be);
    if (act == SHOAL_DTYPE_BF16 && wdtype == SHOAL_DTYPE_BF16 && rows <= st->gemv_rows_max &&
        k % 8 == 0 && (uintptr_t)in % 16 == 0 && (uintptr_t)w % 16 == 0) {
        if (out_dtype == SHOAL_DTYPE_F32)
            launch_gemv(st->stream, (float *)out, (const bf16 *)in, (const bf16 *)w, rows, n, k);
        else
            launch_gemv(st->stream, (bf16 *)out, (const bf16 *)in, (const bf16 *)w, rows, n, k);
        cuda_launched(be, "matmul (gemv)");
        return;
    }
    if (wdtype == act) {
        /* Row-major out = in w^T is column-major out^T = w^T(op T) in: the
         * weight is A (k x n, transposed), the input B (k x rows). */
        const float alpha = 1.0f, beta = 0.0f;
        cublasComputeType_t compute =
            act == SHOAL_DTYPE_F32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
        cublasStatus_t s = cublasGemmEx(st->cublas, CUBLAS_OP_T, CUBLAS_OP_N, n, rows, k, &alpha,
                                        w, cuda_type(wdtype), k, in, cuda_type(act), k, &beta,
                                        out, cuda_type(out_dtype), n, compute,
                                        CUBLAS_GEMM_DEFAULT);
        if (s != CUBLAS_STATUS_SUCCESS)
            cuda_fail_cublas(be, "matmul", s);
        cuda_launched(be, "matmul (cublas)");
        return;
    }
    dim3 grid((unsigned)((n + MM_BN - 1) / MM_BN), (unsigned)((rows + MM_BM - 1) / MM_BM));
    cuda_dispatch_act(act, [&](auto a_tag) {
        using A = decltype(a_tag);
        cuda_dispatch_weight(wdtype, [&](auto w_tag) {
            using W = decltype(w_tag);
            if (out_dtype == SHOAL_DTYPE_F32)
                matmul_simt<A, W, float><<<grid, MM_THREADS, 0, st->stream>>>(
                    (float *)out, (const A *)in, (const W *)w, rows, n, k);
            else
                matmul_simt<A, W, A><<<grid, MM_THREADS, 0, st->stream>>>(
                    (A *)out, (const A *)in, (const W *)w, rows, n, k);
        });
    });
    cuda_launched(be, "matmul (simt)");
}
