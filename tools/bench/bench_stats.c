#include "bench_stats.h"

#include <math.h>
#include <stdlib.h>

int bench_samples_add(bench_samples *s, double x)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 256;
        double *v = realloc(s->v, cap * sizeof *v);
        if (!v)
            return 0;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = x;
    return 1;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_percentile(bench_samples *s, double p)
{
    if (s->n == 0)
        return 0.0;
    qsort(s->v, s->n, sizeof *s->v, cmp_double);
    size_t rank = (size_t)ceil(p / 100.0 * (double)s->n);
    if (rank < 1)
        rank = 1;
    if (rank > s->n)
        rank = s->n;
    return s->v[rank - 1];
}

double bench_mean(const bench_samples *s)
{
    double sum = 0.0;
    for (size_t i = 0; i < s->n; i++)
        sum += s->v[i];
    return s->n ? sum / (double)s->n : 0.0;
}

void bench_samples_free(bench_samples *s)
{
    free(s->v);
    s->v = NULL;
    s->n = s->cap = 0;
}
