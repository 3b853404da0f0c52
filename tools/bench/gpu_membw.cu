/* shoal-gpu-membw: the device copy bandwidth of a GPU, the ceiling of a
 * decode step (which reads every weight and the KV once).
 *
 *   shoal-gpu-membw [--device N] [--gib G]
 *
 * Copies a G GiB buffer (default 4) device to device ten times after three
 * warm-ups and prints the best as GB/s of bytes read plus written, the way
 * the project's other ceilings are counted. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check(cudaError_t e, const char *what)
{
    if (e != cudaSuccess) {
        fprintf(stderr, "shoal-gpu-membw: %s: %s\n", what, cudaGetErrorString(e));
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    int device = 0;
    double gib = 4.0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--device") == 0)
            device = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--gib") == 0)
            gib = atof(argv[i + 1]);
    }
    size_t bytes = (size_t)(gib * (1 << 30));
    void *a, *b;
    cudaEvent_t t0, t1;
    if (check(cudaSetDevice(device), "set device") || check(cudaMalloc(&a, bytes), "malloc") ||
        check(cudaMalloc(&b, bytes), "malloc") || check(cudaMemset(a, 1, bytes), "memset") ||
        check(cudaEventCreate(&t0), "event") || check(cudaEventCreate(&t1), "event"))
        return 1;
    float best = 1e30f;
    for (int i = 0; i < 13; i++) {
        cudaEventRecord(t0);
        cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
        cudaEventRecord(t1);
        if (check(cudaEventSynchronize(t1), "copy"))
            return 1;
        float ms;
        cudaEventElapsedTime(&ms, t0, t1);
        if (i >= 3 && ms < best)
            best = ms;
    }
    printf("device copy bandwidth: %.1f GB/s (read + write, %.1f GiB, best of 10)\n",
           2.0 * (double)bytes / (best * 1e-3) / 1e9, gib);
    return 0;
}
