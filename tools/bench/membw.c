/* shoal-membw: the memory read bandwidth of this machine, the ceiling of a
 * CPU decode step (which streams every weight once per token).
 *
 *   shoal-membw [--threads N] [--mib N]
 *
 * Reads a buffer far larger than the caches with N threads (default: all
 * processors) and prints the best of several passes in GB/s. */
#include "common/common_pool.h"

#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct read_job {
    const uint64_t *buf;
    size_t words;
    int tasks;
    uint64_t sums[256];
};

static void read_task(void *ctx, int task, int thread)
{
    struct read_job *j = ctx;
    size_t per = j->words / (size_t)j->tasks;
    const uint64_t *p = j->buf + per * (size_t)task;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i + 4 <= per; i += 4) {
        a += p[i];
        b ^= p[i + 1];
        c += p[i + 2];
        d ^= p[i + 3];
    }
    j->sums[task] = a + b + c + d;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    int threads = 0, mib = 1024, c;
    static const struct option opts[] = {
        {"threads", required_argument, 0, 't'}, {"mib", required_argument, 0, 'm'}, {0, 0, 0, 0}};
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c == 't')
            threads = atoi(optarg);
        else if (c == 'm')
            mib = atoi(optarg);
        else
            return 2;
    }
    if (mib < 64) {
        fprintf(stderr, "shoal-membw: --mib must be at least 64\n");
        return 2;
    }
    common_pool *pool;
    if (common_pool_open(threads, &pool) != SHOAL_OK)
        return 1;
    size_t bytes = (size_t)mib << 20;
    uint64_t *buf = aligned_alloc(64, bytes);
    if (!buf)
        return 1;
    memset(buf, 1, bytes);
    struct read_job j = {buf, bytes / 8, 64, {0}};
    double best = 1e30;
    for (int pass = 0; pass < 8; pass++) {
        double t0 = now_s();
        common_pool_run(pool, j.tasks, read_task, &j);
        double t = now_s() - t0;
        best = t < best ? t : best;
    }
    uint64_t sink = 0;
    for (int i = 0; i < j.tasks; i++)
        sink += j.sums[i];
    printf("read bandwidth: %.2f GB/s (%d threads, %d MiB, best of 8; checksum %llu)\n",
           (double)bytes / best / 1e9, common_pool_threads(pool), mib, (unsigned long long)sink);
    free(buf);
    common_pool_close(pool);
    return 0;
}
