/* worker_bench.h: the engine under load, offline (no coordinator).
 *
 * Runs `streams` streams of distinct random prompts through the engine at
 * once and reports throughput, as vLLM's offline throughput benchmark does:
 * what the engine step can do on this device, before any HTTP or IPC. */
#ifndef SHOAL_WORKER_BENCH_H
#define SHOAL_WORKER_BENCH_H

#include "worker/worker_engine.h"

typedef struct worker_bench_options {
    int streams;
    int prompt_tokens;
    int output_tokens;
    uint64_t seed;
} worker_bench_options;

typedef struct worker_bench_result {
    double seconds;
    double first_token_s_mean; /* time from start to each stream's first token */
    double decode_s;           /* from the last first token to the end */
    uint64_t decode_tokens;    /* tokens produced in that time */
    uint64_t prompt_tokens;
    uint64_t output_tokens;
    uint64_t steps;
    uint64_t preemptions;
} worker_bench_result;

/* Runs the load to the end. Streams that do not fit at once queue. */
shoal_err worker_bench_run(worker_engine *e, int vocab, const worker_bench_options *o,
                           worker_bench_result *out, shoal_diag *diag);

#endif
