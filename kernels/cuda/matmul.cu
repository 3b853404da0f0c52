/* out[rows][n] = in[rows][k] x w[n][k]^T: the twin of kernels/cpu/matmul.c.
 *
 * bf16 by bf16 with at most gemv_rows_max rows (decode) takes our GEMV,
 * which streams the weights at the copy bandwidth. Otherwise, where cuBLAS takes the operands as they are (bf16 activations with bf16
 * weights, f32 with f32) it runs the GEMM, F32 accumulation. Mixed pairs
 * (bf16 or f32 activations with f16 weights, and the like) take a tiled
 * SIMT kernel of ours with F32 accumulation; checkpoints in the activation
 * dtype, the usual case, never do. */
#include "cuda_ops.h"
#include "gemv.cuh"

#include <atomic>

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

/* out[R][n] = in[R][k] x w[n][k]^T, one warp a weight row. With SWIGLU
 * (matmul_swiglu) out[r][j] = silu(g) * u instead, where g and u are the
 * dot products with rows j of w (the gate) and w2 (the up projection):
 * the block's first half of warps takes gate rows, the second half the
 * same up rows, so the weights stream exactly as in the plain GEMV of
 * 2n rows; the block swaps the sums through shared memory and forms the
 * product. g and u are rounded to O first, as the projections would be
 * stored, and silu is the swiglu kernel's expression, so the result is
 * bit for bit that of the GEMV, then swiglu.
 *
 * EPI: GEMV_RMS scales each sum by 1 / rms of its input row (matmul_rms:
 * every warp reads the whole row, so each takes its sum of squares too,
 * in one order, and no norm pass runs before); GEMV_ADD adds the sum,
 * rounded to O, into out, which holds the residual stream (matmul_add:
 * no residual pass after). */
enum gemv_epi { GEMV_PLAIN, GEMV_RMS, GEMV_ADD };

template <int R, typename O, bool SWIGLU, int U = gemv_unroll<R>(), gemv_epi EPI = GEMV_PLAIN>
static __global__ void __launch_bounds__(GEMV_WARPS * 32)
    matmul_gemv(O *out, const bf16 *in, const bf16 *w, const bf16 *w2, int n, int k, float eps)
{
    static_assert(EPI != GEMV_ADD || !SWIGLU, "the residual add is the plain GEMV's");
    pdl_trigger();
    constexpr int ROWS = SWIGLU ? GEMV_WARPS / 2 : GEMV_WARPS; /* output columns a block */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row = blockIdx.x * ROWS + warp % ROWS;
    const bool valid = row < n;
    const bf16 *wm = SWIGLU && warp >= ROWS ? w2 : w;
    float acc[R], scale[R];
    /* the residual's elements, asked for with the input (after the wait)
     * and kept as loaded: their first use, the add at the end, is where
     * the warp waits for them, not before its dot products' loads */
    O resid[R];
    auto wait = [&] {
        pdl_wait();
        if constexpr (EPI == GEMV_ADD)
#pragma unroll
            for (int r = 0; r < R; r++)
                if (valid && lane == 0)
                    resid[r] = out[(size_t)r * n + row];
    };
    gemv_dot<R, false, U, EPI == GEMV_RMS>(acc, (const uint4 *)(wm + (size_t)(valid ? row : 0) * k),
                                           (const uint4 *)in, k / 8, lane, valid, wait, scale);
#pragma unroll
    for (int r = 0; r < R; r++) { /* the sum of squares into 1 / rms (rmsnorm's expression) */
        if constexpr (EPI == GEMV_RMS)
            scale[r] = 1.0f / sqrtf(warp_reduce(scale[r], op_add()) / (float)k + eps);
        else
            scale[r] = 1.0f;
    }
    if constexpr (!SWIGLU) {
        if (!valid)
            return;
#pragma unroll
        for (int r = 0; r < R; r++) {
            float v = warp_reduce(acc[r], op_add()) * scale[r];
            if constexpr (EPI == GEMV_ADD)
                v = to_f32(resid[r]) + to_f32(from_f32<O>(v));
            if (lane == 0)
                out[(size_t)r * n + row] = from_f32<O>(v);
        }
    } else {
        __shared__ float part[GEMV_WARPS][R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            float v = warp_reduce(acc[r], op_add()) * scale[r];
            if (lane == 0)
                part[warp][r] = v;
        }
        __syncthreads(); /* every warp reaches it: invalid ones added nothing */
        if (threadIdx.x < ROWS * R) {
            const int p = threadIdx.x % ROWS, r = threadIdx.x / ROWS, j = blockIdx.x * ROWS + p;
            if (j < n) {
                float g = to_f32(from_f32<O>(part[p][r]));
                float u = to_f32(from_f32<O>(part[ROWS + p][r]));
                out[(size_t)r * n + j] = from_f32<O>(g / (1.0f + expf(-g)) * u);
            }
        }
    }
}

template <int R, typename O, bool SWIGLU, int U = gemv_unroll<R>(), gemv_epi EPI = GEMV_PLAIN>
static void launch_gemv_r(cudaStream_t stream, unsigned blocks, O *out, const bf16 *in,
                          const bf16 *w, const bf16 *w2, int n, int k, float eps)
{
    auto kernel = matmul_gemv<R, O, SWIGLU, U, EPI>;
    /* The most L1 a multiprocessor has: the loads in flight land there (96
     * KB a multiprocessor at one row), and without the ask the blocks may
     * run where the TMA partials' shared memory left L1 little. Asked once
     * an instance (the attribute is the process's); a hint, whose failure
     * costs speed alone. */
    static std::atomic<bool> asked{false};
    if (!asked.exchange(true))
        (void)cudaFuncSetAttribute((const void *)kernel,
                                   cudaFuncAttributePreferredSharedMemoryCarveout,
                                   (int)cudaSharedmemCarveoutMaxL1);
    cuda_launch_pdl(stream, blocks, GEMV_WARPS * 32, kernel, out, in, w, w2, n, k, eps);
}

/* w2 is the up projection with SWIGLU, else unused; loads: a lane's loads
 * in flight at one row (SHOAL_CUDA_GEMV_LOADS). The norm and the add
 * (EPI) at one row only (fused_norm_rows); eps is GEMV_RMS's. */
template <typename O, bool SWIGLU, gemv_epi EPI = GEMV_PLAIN>
static void launch_gemv(cudaStream_t stream, O *out, const bf16 *in, const bf16 *w,
                        const bf16 *w2, int rows, int n, int k, int loads, float eps = 0.0f)
{
    const int per_block = SWIGLU ? GEMV_WARPS / 2 : GEMV_WARPS;
    unsigned blocks = (unsigned)((n + per_block - 1) / per_block);
    if (rows == 1) { /* the loads a lane as asked; the norm and the add here only */
        if (loads == GEMV_LOADS_ROWS)
            launch_gemv_r<1, O, SWIGLU, GEMV_LOADS_ROWS, EPI>(stream, blocks, out, in, w, w2, n,
                                                               k, eps);
        else
            launch_gemv_r<1, O, SWIGLU, GEMV_LOADS_ONE_ROW, EPI>(stream, blocks, out, in, w, w2,
                                                                  n, k, eps);
        return;
    }
    if constexpr (EPI != GEMV_PLAIN) {
        SHOAL_ASSERT(!"gemv: the norm and the add at one row only");
    } else {
        switch (rows) {
#define GEMV_CASE(R)                                                                             \
    case R: launch_gemv_r<R, O, SWIGLU>(stream, blocks, out, in, w, w2, n, k, eps); break;
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
}

/* Whether a matmul of these operands takes our GEMV. */
static bool gemv_takes(kernels_backend *be, shoal_dtype wdtype, int rows, int k, const void *in,
                       const void *w)
{
    return be->act_dtype == SHOAL_DTYPE_BF16 && wdtype == SHOAL_DTYPE_BF16 &&
           rows <= cuda_of(be)->gemv_rows_max && k % 8 == 0 && (uintptr_t)in % 16 == 0 &&
           (uintptr_t)w % 16 == 0;
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
    if (gemv_takes(be, wdtype, rows, k, in, w)) {
        if (out_dtype == SHOAL_DTYPE_F32)
            launch_gemv<float, false>(st->stream, (float *)out, (const bf16 *)in,
                                      (const bf16 *)w, NULL, rows, n, k, st->gemv_loads);
        else
            launch_gemv<bf16, false>(st->stream, (bf16 *)out, (const bf16 *)in, (const bf16 *)w,
                                     NULL, rows, n, k, st->gemv_loads);
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

/* The GEMV with SwiGLU in its last step where it takes the matmul (one
 * row by default; SHOAL_CUDA_GEMV_SWIGLU=0 turns it off): the swiglu
 * kernel, its launch and the round trip of the projections through memory
 * go. Past its rows, up to 64, gemm_rows.cu's kernel does the same
 * (SHOAL_CUDA_GEMM_SWIGLU=0 turns it off; up is left unwritten).
 * Elsewhere the composition, with joined weights and outputs as one
 * matmul of 2n rows, as the model ran it before. */
void cuda_matmul_swiglu(kernels_backend *be, void *out, void *up, const void *in, const void *wg,
                        const void *wu, shoal_dtype wdtype, int rows, int n, int k)
{
    shoal_dtype act = be->act_dtype;
    size_t ab = shoal_dtype_bytes(act), wb = shoal_dtype_bytes(wdtype);
    SHOAL_ASSERT(rows >= 0 && n > 0 && k > 0);
    CUDA_ASSERT_ALIGNED(out, ab);
    CUDA_ASSERT_ALIGNED(up, ab);
    /* out and up do not overlap */
    SHOAL_ASSERT((const char *)out + (size_t)rows * n * ab <= (const char *)up ||
                 (const char *)up + (size_t)rows * n * ab <= (const char *)out || rows == 0);
    if (rows == 0 || !cuda_usable(be))
        return;
    cuda_state *st = cuda_of(be);
    if (st->gemv_swiglu && gemv_takes(be, wdtype, rows, k, in, wg) && (uintptr_t)wu % 16 == 0) {
        CUDA_ASSERT_ALIGNED(in, ab);
        launch_gemv<bf16, true>(st->stream, (bf16 *)out, (const bf16 *)in, (const bf16 *)wg,
                                (const bf16 *)wu, rows, n, k, st->gemv_loads);
        cuda_launched(be, "matmul_swiglu (gemv)");
        return;
    }
    if (wdtype == SHOAL_DTYPE_BF16 && act == SHOAL_DTYPE_BF16 && rows > 1 &&
        cuda_gemm_swiglu(be, out, in, wg, wu, rows, n, k))
        return;
    bool joined_w = (const char *)wu == (const char *)wg + (size_t)n * k * wb;
    bool joined = rows == 1 && joined_w && (char *)up == (char *)out + (size_t)n * ab;
    if (joined) {
        cuda_matmul(be, out, act, in, wg, wdtype, 1, 2 * n, k);
    } else if (rows > 1 && joined_w && wdtype == act && act == SHOAL_DTYPE_BF16 &&
               st->gate_up_batched && (char *)up > (char *)out &&
               (size_t)((char *)up - (char *)out) % ab == 0) {
        /* one launch for both: a batch of two GEMMs, the weights n * k
         * apart, the input shared, the outputs as far apart as up is
         * from out (at 64 rows on the H200 51.9 us against 2 x 29) */
        const float alpha = 1.0f, beta = 0.0f;
        long long c_stride = (long long)(((char *)up - (char *)out) / ab);
        cublasStatus_t s = cublasGemmStridedBatchedEx(
            st->cublas, CUBLAS_OP_T, CUBLAS_OP_N, n, rows, k, &alpha, wg, CUDA_R_16BF, k,
            (long long)n * k, in, CUDA_R_16BF, k, 0, &beta, out, CUDA_R_16BF, n, c_stride, 2,
            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (s != CUBLAS_STATUS_SUCCESS) {
            cuda_fail_cublas(be, "matmul_swiglu", s);
            return;
        }
        cuda_launched(be, "matmul_swiglu (batched)");
    } else {
        cuda_matmul(be, out, act, in, wg, wdtype, rows, n, k);
        cuda_matmul(be, up, act, in, wu, wdtype, rows, n, k);
    }
    cuda_swiglu(be, out, out, up, rows, n);
}

/* The parts matmul_add_rmsnorm splits k into for these operands, 0 where
 * it does not take them. Passes of 9 to 64 rows (decode rounds, and
 * prompts that short; past any GEMV's rows), four parts where k is at
 * least twice n or, at up to 32 rows, at least n: H200,
 * cuBLAS against four f32 parts of a strided-batched GEMM (kernels/lab
 * row 29.1), down (4096 x 12288) at 64 rows 30.6 against 27.8 us, at 32
 * 28.6 against 26.6; o (4096 x 4096) at 32 rows 12.8 against 10.7, at 64
 * 11.4 against 11.3 (not taken: the norm's wider reads would eat it);
 * q/k/v and gate/up not faster split. Where gemm_rows.cu's kernel makes
 * the parts (k a multiple of 256, n of 4) o takes them at 33 to 64 rows
 * too: batch 64 at 1k +0.5% (kernels/lab row 30.5). SHOAL_CUDA_GEMM_PARTS:
 * 0 never, N > 1 N parts wherever they fit. */
static int gemm_parts(kernels_backend *be, shoal_dtype wdtype, int rows, int n, int k,
                      const void *in, const void *w, const void *out, const void *x,
                      const float *weight)
{
    const cuda_state *st = cuda_of(be);
    int parts = st->gemm_parts;
    if (parts == 1) {
        /* gemm_rows.cu's parts kernel takes o (k = n) at 64 rows too */
        const bool ours = st->gemm_rows_parts && k % (64 * 4) == 0 && n % 4 == 0;
        parts = k >= 2 * n || (k >= n && (rows <= 32 || ours)) ? 4 : 0;
    }
    if (parts < 2 || parts > 8 || rows <= CUDA_GEMV_ROWS_MAX || rows > 64 ||
        be->act_dtype != SHOAL_DTYPE_BF16 || wdtype != SHOAL_DTYPE_BF16 || n % 8 != 0 ||
        k % (8 * parts) != 0 || (size_t)parts * rows * n * 4 > CUDA_GEMM_PARTS_BYTES ||
        ((uintptr_t)in | (uintptr_t)w | (uintptr_t)out | (uintptr_t)x | (uintptr_t)weight) % 16)
        return 0;
    return parts;
}

bool cuda_matmul_add_rmsnorm(kernels_backend *be, void *out, void *x, const void *in, const void *w,
                             shoal_dtype wdtype, const float *weight, int rows, int n, int k,
                             float eps)
{
    SHOAL_ASSERT(rows >= 0 && n > 0 && k > 0);
    const int parts = gemm_parts(be, wdtype, rows, n, k, in, w, out, x, weight);
    if (!parts)
        return false;
    if (!cuda_usable(be))
        return true; /* taken: the backend's error stands for it */
    cuda_state *st = cuda_of(be);
    /* part p = in[:, p k / parts ...] x w[:, the same columns]^T, f32:
     * column-major out^T of n x rows, batch p a k / parts further along
     * both operands' rows */
    const long long stride = (long long)n * rows;
    if (!cuda_gemm_parts(be, st->gemm_parts_buf, in, w, rows, n, k, parts)) {
        const int ks = k / parts;
        const float alpha = 1.0f, beta = 0.0f;
        cublasStatus_t s = cublasGemmStridedBatchedEx(
            st->cublas, CUBLAS_OP_T, CUBLAS_OP_N, n, rows, ks, &alpha, w, CUDA_R_16BF, k, ks, in,
            CUDA_R_16BF, k, ks, &beta, st->gemm_parts_buf, CUDA_R_32F, n, stride, parts,
            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (s != CUBLAS_STATUS_SUCCESS) {
            cuda_fail_cublas(be, "matmul_add_rmsnorm", s);
            return true;
        }
        cuda_launched(be, "matmul_add_rmsnorm (parts)");
    }
    cuda_rmsnorm_parts(be, out, x, st->gemm_parts_buf, parts, (size_t)stride, weight, rows, n, eps);
    return true;
}

/* The RMSNorm before a matmul and the residual add after one, inside the
 * one-row GEMV (kernels_backend.h: fused_norm_rows). The model calls them
 * only where the GEMV takes the matmul; false where there is nothing to
 * launch. */
static bool fused_launches(kernels_backend *be, shoal_dtype wdtype, int rows, int k,
                           const void *in, const void *w, const void *out)
{
    SHOAL_ASSERT(rows >= 0 && rows <= be->fused_norm_rows && k > 0);
    SHOAL_ASSERT(gemv_takes(be, wdtype, rows, k, in, w));
    CUDA_ASSERT_ALIGNED(out, 2);
    return rows > 0 && cuda_usable(be);
}

void cuda_matmul_rms(kernels_backend *be, void *out, const void *x, const void *w,
                     shoal_dtype wdtype, int rows, int n, int k, float eps)
{
    if (!fused_launches(be, wdtype, rows, k, x, w, out))
        return;
    cuda_state *st = cuda_of(be);
    launch_gemv<bf16, false, GEMV_RMS>(st->stream, (bf16 *)out, (const bf16 *)x, (const bf16 *)w,
                                       NULL, rows, n, k, st->gemv_loads, eps);
    cuda_launched(be, "matmul_rms (gemv)");
}

void cuda_matmul_swiglu_rms(kernels_backend *be, void *out, const void *x, const void *wg,
                            const void *wu, shoal_dtype wdtype, int rows, int n, int k, float eps)
{
    SHOAL_ASSERT((uintptr_t)wu % 16 == 0);
    if (!fused_launches(be, wdtype, rows, k, x, wg, out))
        return;
    cuda_state *st = cuda_of(be);
    launch_gemv<bf16, true, GEMV_RMS>(st->stream, (bf16 *)out, (const bf16 *)x, (const bf16 *)wg,
                                      (const bf16 *)wu, rows, n, k, st->gemv_loads, eps);
    cuda_launched(be, "matmul_swiglu_rms (gemv)");
}

void cuda_matmul_add(kernels_backend *be, void *x, const void *in, const void *w,
                     shoal_dtype wdtype, int rows, int n, int k)
{
    if (!fused_launches(be, wdtype, rows, k, in, w, x))
        return;
    cuda_state *st = cuda_of(be);
    launch_gemv<bf16, false, GEMV_ADD>(st->stream, (bf16 *)x, (const bf16 *)in, (const bf16 *)w,
                                       NULL, rows, n, k, st->gemv_loads, 0.0f);
    cuda_launched(be, "matmul_add (gemv)");
}

/* w[r][c] = bf16(w[r][c] * scale[c]): a norm's weight folded into the
 * matmul after it, once at load. */
static __global__ void scale_columns_bf16(bf16 *w, size_t elems, int cols, const float *scale)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < elems;
         i += (size_t)gridDim.x * blockDim.x)
        w[i] = __float2bfloat16_rn(__bfloat162float(w[i]) * scale[i % (size_t)cols]);
}

void cuda_scale_columns(kernels_backend *be, void *w, shoal_dtype wdtype, int rows, int cols,
                        const float *scale)
{
    SHOAL_ASSERT(wdtype == SHOAL_DTYPE_BF16 && rows >= 0 && cols > 0);
    CUDA_ASSERT_ALIGNED(w, 2);
    CUDA_ASSERT_ALIGNED(scale, 4);
    size_t elems = (size_t)rows * (size_t)cols;
    if (elems == 0 || !cuda_usable(be))
        return;
    size_t blocks = (elems + 255) / 256;
    scale_columns_bf16<<<(unsigned)(blocks < 65536 ? blocks : 65536), 256, 0,
                         cuda_of(be)->stream>>>((bf16 *)w, elems, cols, scale);
    cuda_launched(be, "scale_columns");
}
