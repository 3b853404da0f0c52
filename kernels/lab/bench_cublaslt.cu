/* shoal-lab-cublaslt: the decode matmuls at 16 to 128 rows (the 8B
 * shape's q/k/v, o, gate/up and down) by cuBLAS as the backend calls it
 * (cublasGemmEx, CUBLAS_GEMM_DEFAULT) against every algorithm cublasLt's
 * heuristic offers for the same problem, each timed on weights rotating
 * through 3 GiB (nothing served from L2) as graph replays. It says whether
 * choosing the algorithm per shape would pay (kernels/lab/README.md).
 *
 *   shoal-lab-cublaslt [--device N] [--algos N] [--lm-head | --split]
 *
 * --lm-head: the 8B shape's lm_head alone (151936 x 4096, f32 logits, as
 * the backend's head writes them) at 16 to 128 rows.
 *
 * --split: q/k/v, o and down at 32 and 64 rows as the backend calls them
 * against the same product split over k by hand: a strided-batched GEMM of
 * S batches (batch s reads columns [s k / S, (s + 1) k / S) of the weights
 * and of the input rows) writing S f32 parts, alone (a consumer that sums
 * the parts as it reads them, so no kernel of its own) and followed by a
 * kernel that sums them into bf16 (kernels/lab/README.md row 29.1). */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#define CK(x)                                                                                    \
    do {                                                                                         \
        cudaError_t e_ = (x);                                                                    \
        if (e_ != cudaSuccess) {                                                                 \
            fprintf(stderr, "shoal-lab-cublaslt: %s: %s\n", #x, cudaGetErrorString(e_));         \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)
#define CB(x)                                                                                    \
    do {                                                                                         \
        cublasStatus_t s_ = (x);                                                                 \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                       \
            fprintf(stderr, "shoal-lab-cublaslt: %s: status %d\n", #x, (int)s_);                 \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)

static const size_t POOL_BYTES = 3ull << 30, WS_BYTES = 32u << 20;
enum { CALLS = 20, REPS = 5 };

struct bench {
    cudaStream_t stream;
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    void *pool, *ws, *x, *out;
};

/* weights for call i: consecutive calls read different parts of the pool */
static const void *weight_at(const bench &b, size_t bytes, int i)
{
    size_t span = POOL_BYTES - bytes, step = (bytes + 4095) & ~(size_t)4095;
    return (const char *)b.pool + (((size_t)i * step) % span & ~(size_t)255);
}

/* Microseconds a call: CALLS calls recorded as a graph, replayed REPS
 * times, the median replay. run(i) issues call i. */
template <typename F> static double time_calls(bench &b, F run)
{
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(b.stream, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < CALLS; i++)
        if (!run(i)) {
            cudaStreamEndCapture(b.stream, &g);
            cudaGetLastError();
            if (g)
                cudaGraphDestroy(g);
            return -1.0;
        }
    CK(cudaStreamEndCapture(b.stream, &g));
    if (cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) {
        cudaGetLastError();
        cudaGraphDestroy(g);
        return -1.0;
    }
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaGraphLaunch(ge, b.stream)); /* warm */
    std::vector<float> t;
    for (int r = 0; r < REPS; r++) {
        CK(cudaEventRecord(e0, b.stream));
        CK(cudaGraphLaunch(ge, b.stream));
        CK(cudaEventRecord(e1, b.stream));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return t[REPS / 2] * 1e3 / CALLS;
}

/* out[i] = bf16(sum over s of parts[s][i]), s in order */
static __global__ void sum_parts(__nv_bfloat16 *out, const float *parts, int S, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = 0.0f;
        for (int p = 0; p < S; p++)
            v += parts[(size_t)p * n + i];
        out[i] = __float2bfloat16(v);
    }
}

/* --split: the decode matmuls split over k by hand (the file's comment) */
static void run_split(bench &b)
{
    struct shape {
        const char *what;
        int n, k;
    };
    static const shape shapes[] = {{"q+k+v 6144x4096", 6144, 4096},
                                   {"o 4096x4096", 4096, 4096},
                                   {"gate+up 24576x4096", 24576, 4096},
                                   {"down 4096x12288", 4096, 12288}};
    static const int splits[] = {2, 3, 4, 6, 8};
    printf("decode matmuls split over k by hand: cublasGemmEx (bf16 out, as the backend) against "
           "a strided-batched GEMM of S f32 parts, alone and + a sum kernel (us a call, GB/s of "
           "weights)\n");
    for (const auto &s : shapes)
        for (int rows : {32, 64}) {
            const size_t wbytes = (size_t)s.n * s.k * 2;
            const float alpha = 1.0f, beta = 0.0f;
            double dflt = time_calls(b, [&](int i) {
                return cublasGemmEx(b.blas, CUBLAS_OP_T, CUBLAS_OP_N, s.n, rows, s.k, &alpha,
                                    weight_at(b, wbytes, i), CUDA_R_16BF, s.k, b.x, CUDA_R_16BF,
                                    s.k, &beta, b.out, CUDA_R_16BF, s.n, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
            });
            printf("  %-18s %3d rows: default %7.2f us (%5.0f GB/s)\n", s.what, rows, dflt,
                   wbytes / dflt / 1e3);
            if (s.n == 24576) { /* as the backend: gate and up a batch of two, bf16 */
                const int h = s.n / 2;
                double two = time_calls(b, [&](int i) {
                    return cublasGemmStridedBatchedEx(
                               b.blas, CUBLAS_OP_T, CUBLAS_OP_N, h, rows, s.k, &alpha,
                               weight_at(b, wbytes, i), CUDA_R_16BF, s.k, (long long)h * s.k, b.x,
                               CUDA_R_16BF, s.k, 0, &beta, b.out, CUDA_R_16BF, h,
                               (long long)h * rows, 2, CUBLAS_COMPUTE_32F,
                               CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
                });
                printf("    gate and up a batch of two (the backend): %7.2f us (%5.0f GB/s)\n", two,
                       wbytes / two / 1e3);
            }
            for (int S : splits) {
                if (s.k % (S * 64))
                    continue;
                const int ks = s.k / S;
                const size_t n_out = (size_t)s.n * rows;
                float *parts = (float *)b.out;
                __nv_bfloat16 *sum = (__nv_bfloat16 *)((char *)b.out + (size_t)S * n_out * 4);
                auto gemm = [&](int i) {
                    return cublasGemmStridedBatchedEx(
                               b.blas, CUBLAS_OP_T, CUBLAS_OP_N, s.n, rows, ks, &alpha,
                               weight_at(b, wbytes, i), CUDA_R_16BF, s.k, ks, b.x, CUDA_R_16BF, s.k,
                               ks, &beta, parts, CUDA_R_32F, s.n, (long long)n_out, S,
                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
                };
                double alone = time_calls(b, gemm);
                double with_sum = time_calls(b, [&](int i) {
                    if (!gemm(i))
                        return false;
                    sum_parts<<<264, 256, 0, b.stream>>>(sum, parts, S, n_out);
                    return cudaGetLastError() == cudaSuccess;
                });
                printf("    S %d: parts %7.2f us (%5.0f GB/s, %.2fx); + sum %7.2f us (%.2fx)\n", S,
                       alone, wbytes / alone / 1e3, dflt / alone, with_sum, dflt / with_sum);
            }
            fflush(stdout);
        }
}

int main(int argc, char **argv)
{
    int device = 0, algos_max = 32;
    bool lm_head = false, split = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--lm-head") == 0)
            lm_head = true;
        else if (strcmp(argv[i], "--split") == 0)
            split = true;
        else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc)
            device = atoi(argv[++i]);
        else if (strcmp(argv[i], "--algos") == 0 && i + 1 < argc)
            algos_max = atoi(argv[++i]);
    }
    bench b;
    CK(cudaSetDevice(device));
    CK(cudaStreamCreateWithFlags(&b.stream, cudaStreamNonBlocking));
    CB(cublasCreate(&b.blas));
    CB(cublasSetStream(b.blas, b.stream));
    CB(cublasLtCreate(&b.lt));
    CK(cudaMalloc(&b.pool, POOL_BYTES));
    CK(cudaMalloc(&b.ws, WS_BYTES));
    CK(cudaMalloc(&b.x, 256 * 12288 * 2));
    CK(cudaMalloc(&b.out, (size_t)128 * 151936 * 4));
    CK(cudaMemset(b.pool, 0x3c, POOL_BYTES)); /* small bf16 values */
    CK(cudaMemset(b.x, 0x3c, 256 * 12288 * 2));
    CB(cublasSetWorkspace(b.blas, b.ws, WS_BYTES));
    if (split) {
        run_split(b);
        return 0;
    }
    struct shape {
        const char *what;
        int n, k;
        cudaDataType out_type;
    };
    static const shape layers[] = {{"q+k+v 6144x4096", 6144, 4096, CUDA_R_16BF},
                                   {"o 4096x4096", 4096, 4096, CUDA_R_16BF},
                                   {"gate+up 24576x4096", 24576, 4096, CUDA_R_16BF},
                                   {"down 4096x12288", 4096, 12288, CUDA_R_16BF}};
    static const shape head[] = {{"lm_head 151936x4096", 151936, 4096, CUDA_R_32F}};
    std::vector<shape> shapes(lm_head ? head : layers,
                              lm_head ? head + 1 : layers + sizeof layers / sizeof layers[0]);
    static const int rowss[] = {16, 32, 64, 128};
    printf("decode matmuls, bf16, cublasGemmEx default against cublasLt's heuristic "
           "algorithms (us a call, GB/s of weights)\n");
    for (const auto &s : shapes)
        for (int rows : rowss) {
            const size_t wbytes = (size_t)s.n * s.k * 2;
            const float alpha = 1.0f, beta = 0.0f;
            double dflt = time_calls(b, [&](int i) {
                return cublasGemmEx(b.blas, CUBLAS_OP_T, CUBLAS_OP_N, s.n, rows, s.k, &alpha,
                                    weight_at(b, wbytes, i), CUDA_R_16BF, s.k, b.x, CUDA_R_16BF,
                                    s.k, &beta, b.out, s.out_type, s.n, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
            });
            /* the same problem for cublasLt: column-major out^T (n x rows)
             * = W^T (op T of k x n) x X^T (k x rows) */
            cublasLtMatmulDesc_t op;
            cublasLtMatrixLayout_t la, lb, lc;
            cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
            CB(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
            CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
            CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
            CB(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, s.k, s.n, s.k));
            CB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, s.k, rows, s.k));
            CB(cublasLtMatrixLayoutCreate(&lc, s.out_type, s.n, rows, s.n));
            cublasLtMatmulPreference_t pref;
            CB(cublasLtMatmulPreferenceCreate(&pref));
            size_t ws = WS_BYTES;
            CB(cublasLtMatmulPreferenceSetAttribute(
                pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
            std::vector<cublasLtMatmulHeuristicResult_t> res(algos_max);
            int found = 0;
            CB(cublasLtMatmulAlgoGetHeuristic(b.lt, op, la, lb, lc, lc, pref, algos_max,
                                              res.data(), &found));
            double best = -1, first = -1;
            int best_i = -1;
            for (int a = 0; a < found; a++) {
                double t = time_calls(b, [&](int i) {
                    return cublasLtMatmul(b.lt, op, &alpha, weight_at(b, wbytes, i), la, b.x, lb,
                                          &beta, b.out, lc, b.out, lc, &res[a].algo, b.ws,
                                          WS_BYTES, b.stream) == CUBLAS_STATUS_SUCCESS;
                });
                if (a == 0)
                    first = t;
                if (t > 0 && (best < 0 || t < best)) {
                    best = t;
                    best_i = a;
                }
            }
            int tile = -1, splitk = -1, stages = -1;
            if (best_i >= 0) {
                size_t got;
                cublasLtMatmulAlgoConfigGetAttribute(&res[best_i].algo,
                                                     CUBLASLT_ALGO_CONFIG_TILE_ID, &tile,
                                                     sizeof tile, &got);
                cublasLtMatmulAlgoConfigGetAttribute(&res[best_i].algo,
                                                     CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                                     sizeof splitk, &got);
                cublasLtMatmulAlgoConfigGetAttribute(&res[best_i].algo,
                                                     CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages,
                                                     sizeof stages, &got);
            }
            printf("  %-20s %4d rows: default %7.2f us (%5.0f GB/s); lt first %7.2f; best of "
                   "%2d %7.2f us (%5.0f GB/s, #%d tile %d split-k %d stages %d): %.2fx\n",
                   s.what, rows, dflt, wbytes / dflt / 1e3, first, found, best,
                   wbytes / best / 1e3, best_i, tile, splitk, stages, dflt / best);
            fflush(stdout);
            cublasLtMatmulPreferenceDestroy(pref);
            cublasLtMatrixLayoutDestroy(la);
            cublasLtMatrixLayoutDestroy(lb);
            cublasLtMatrixLayoutDestroy(lc);
            cublasLtMatmulDescDestroy(op);
        }
    return 0;
}
