/* cuda_test.h: what the device tests share. Each test binary runs where the
 * CUDA backend was built; without a GPU it prints why and exits 77, which
 * CTest counts as skipped (CI compiles CUDA but has no GPU).
 *
 * Inputs are drawn fresh on every run from a seed printed at the start
 * (SHOAL_TEST_SEED=N repeats a run). Outputs on the device are poisoned with
 * NaN bytes before each op, so an element an op forgets to write fails. */
#ifndef SHOAL_TESTS_CUDA_TEST_H
#define SHOAL_TESTS_CUDA_TEST_H

#include "common/common_rng.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "tests/test.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t test_rng;
static bool test_sanitize; /* --sanitize: the small cases, for compute-sanitizer */
/* --race: fewer still, where a test has such a list (racecheck, which
 * checks every shared-memory access, is the slowest tool); implies
 * --sanitize */
static bool test_race;
/* The device under test: GPU 0, or with SHOAL_TEST_ON_CPU=1 the CPU backend
 * in its place, a dry run of the test code itself where no GPU is. */
static const char *test_gpu = "0";
static bool test_dry;

static inline void cuda_test_start(const char *name, int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--sanitize") == 0)
            test_sanitize = true;
        else if (strcmp(argv[i], "--race") == 0)
            test_sanitize = test_race = true;
    test_dry = getenv("SHOAL_TEST_ON_CPU") != NULL;
    if (test_dry)
        test_gpu = "cpu";
    if (!test_dry && cuda_backend_device_count() == 0) {
        printf("SKIP %s: no GPU (the CUDA backend was built; nothing to run it on)\n", name);
        exit(77);
    }
    const char *env = getenv("SHOAL_TEST_SEED");
    if (env) {
        test_rng = strtoull(env, NULL, 10);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        test_rng = (uint64_t)ts.tv_sec * 1000000007ull + (uint64_t)ts.tv_nsec;
    }
    printf("%s: seed %llu (SHOAL_TEST_SEED=%llu repeats it)%s\n", name,
           (unsigned long long)test_rng, (unsigned long long)test_rng,
           test_race       ? ", racecheck cases"
           : test_sanitize ? ", sanitizer cases"
                           : "");
    fflush(stdout);
}

static inline kernels_backend *open_backend(const char *device, shoal_dtype act)
{
    kernels_backend_options o = {.device = device, .threads = 0, .act_dtype = act};
    kernels_backend *be = NULL;
    shoal_diag diag = {{0}};
    if (kernels_backend_open(&o, &be, &diag) != SHOAL_OK) {
        fprintf(stderr, "cannot open backend %s: %s\n", device, diag.msg);
        exit(1);
    }
    return be;
}

/* Whether the GPU runs the sm_90a kernels (gemm_rows.cu's GEMMs, the
 * warp-specialized prompt kernel): a device of compute capability 9.0,
 * and on a dry run never. */
static inline bool gpu_runs_sm90a(void)
{
    struct cudaDeviceProp p;
    return !test_dry && cudaGetDeviceProperties(&p, 0) == cudaSuccess && p.major == 9 &&
           p.minor == 0;
}

/* open_backend with one variable of the environment set while it opens
 * (a backend's switches are read then; name NULL sets none). */
static inline kernels_backend *open_backend_with(const char *device, shoal_dtype act,
                                                 const char *name, const char *value)
{
    if (name)
        setenv(name, value, 1);
    kernels_backend *be = open_backend(device, act);
    if (name)
        unsetenv(name);
    return be;
}

static inline float rnd_uniform(void)
{
    return common_rng_uniform(&test_rng);
}

static inline uint32_t rnd_below(uint32_t n)
{
    return (uint32_t)(common_rng_next(&test_rng) % n);
}

static inline float round_to(float x, shoal_dtype act)
{
    return act == SHOAL_DTYPE_BF16 ? shoal_bf16_to_f32(shoal_f32_to_bf16(x)) : x;
}

/* x[i] uniform in [-scale, scale), representable in act. */
static inline void fill_uniform(float *x, size_t n, float scale, shoal_dtype act)
{
    for (size_t i = 0; i < n; i++)
        x[i] = round_to(scale * rnd_uniform(), act);
}

static inline void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "out of host memory\n");
        exit(1);
    }
    return p;
}

static inline void *dev_alloc(kernels_backend *g, size_t bytes)
{
    void *p = g->alloc(g, bytes);
    if (!p) {
        fprintf(stderr, "out of device memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

/* NaN in every float, bf16 and f16 element: 0xff bytes. */
static inline void dev_poison(kernels_backend *g, void *p, size_t bytes)
{
    g->sync(g);
    if (test_dry) {
        memset(p, 0xff, bytes);
        return;
    }
    if (cudaMemset(p, 0xff, bytes) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
        fprintf(stderr, "cudaMemset failed\n");
        exit(1);
    }
}

/* Uploads n floats as `dtype` (F32, BF16 or F16) into fresh device memory. */
static inline void *dev_from_f32(kernels_backend *g, const float *x, size_t n, shoal_dtype dtype)
{
    size_t eb = shoal_dtype_bytes(dtype);
    void *host = xmalloc(n * eb);
    for (size_t i = 0; i < n; i++) {
        if (dtype == SHOAL_DTYPE_BF16)
            ((uint16_t *)host)[i] = shoal_f32_to_bf16(x[i]);
        else if (dtype == SHOAL_DTYPE_F16)
            ((uint16_t *)host)[i] = shoal_f32_to_f16(x[i]);
        else
            ((float *)host)[i] = x[i];
    }
    void *d = dev_alloc(g, n * eb);
    CHECK(g->upload(g, d, host, n * eb) == SHOAL_OK);
    free(host);
    return d;
}

static inline void *dev_copy(kernels_backend *g, const void *x, size_t bytes)
{
    void *d = dev_alloc(g, bytes);
    CHECK(g->upload(g, d, x, bytes) == SHOAL_OK);
    return d;
}

/* Downloads n elements of `dtype` as floats. */
static inline void f32_from_dev(kernels_backend *g, float *out, const void *d, size_t n,
                         shoal_dtype dtype)
{
    size_t eb = shoal_dtype_bytes(dtype);
    void *host = xmalloc(n * eb);
    shoal_err err = g->download(g, host, d, n * eb);
    CHECK_MSG(err == SHOAL_OK, "download: %s", shoal_strerror(err));
    for (size_t i = 0; i < n; i++)
        out[i] = shoal_load_f32(host, dtype, i);
    free(host);
}

/* ||got - ref|| / ||ref||; infinite when got has a NaN (an unwritten
 * element) where ref has none. */
static inline double rel_err(const float *got, const float *ref, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i]) && !isnan(ref[i]))
            return INFINITY;
        double d = (double)got[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static inline size_t count_differing(const float *a, const float *b, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return c;
}

/* The tolerance of ||gpu - cpu|| / ||cpu|| for one op's output: F32
 * arithmetic in another order lands far under 1e-5; bf16 outputs carry a
 * rounding of 2^-9 relative (rms about 2^-9 / sqrt(3)) on top. */
static inline double tol_for(shoal_dtype act)
{
    return act == SHOAL_DTYPE_BF16 ? 6e-3 : 2e-5;
}

static inline const char *act_name(shoal_dtype act)
{
    return act == SHOAL_DTYPE_BF16 ? "bf16" : "f32";
}

#endif
