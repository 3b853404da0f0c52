/* bench_stats.h: samples and their percentiles, for shoal-bench. */
#ifndef SHOAL_BENCH_STATS_H
#define SHOAL_BENCH_STATS_H

#include <stddef.h>

typedef struct bench_samples {
    double *v;
    size_t n, cap;
} bench_samples;

/* Appends x; false when out of memory (the sample is dropped). */
int bench_samples_add(bench_samples *s, double x);

/* The p-th percentile (0..100), nearest-rank on sorted samples; 0 when
 * empty. Sorts s in place. */
double bench_percentile(bench_samples *s, double p);

double bench_mean(const bench_samples *s);

void bench_samples_free(bench_samples *s);

#endif
