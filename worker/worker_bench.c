#include "worker_bench.h"

#include "common/common_rng.h"

#include <stdlib.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

shoal_err worker_bench_run(worker_engine *e, int vocab, const worker_bench_options *o,
                           worker_bench_result *out, shoal_diag *diag)
{
    shoal_err err = SHOAL_OK;
    *out = (worker_bench_result){0};
    int32_t *prompt = malloc((size_t)o->prompt_tokens * sizeof *prompt);
    worker_event *ev = malloc((size_t)worker_engine_events_max(e) * sizeof *ev);
    if (!prompt || !ev) {
        err = shoal_diag_set(diag, SHOAL_ERR_NOMEM, "bench: no memory");
        goto out;
    }
    uint64_t rng = o->seed;
    double t0 = now_s(), first_sum = 0.0, last_first = 0.0;
    uint64_t tokens_at_last_first = 0;
    for (int s = 0; s < o->streams; s++) {
        for (int i = 0; i < o->prompt_tokens; i++)
            prompt[i] = (int32_t)(common_rng_next(&rng) % (uint64_t)vocab);
        worker_request r = {.id = (uint64_t)s, .prompt = prompt,
                            .prompt_len = o->prompt_tokens, .max_tokens = o->output_tokens,
                            .ignore_eos = true};
        r.sampling.top_p = 1.0f;
        r.sampling.repetition_penalty = 1.0f;
        if ((err = worker_engine_submit(e, &r, diag)))
            goto out;
    }
    worker_engine_stats before;
    worker_engine_stats_get(e, &before);
    while (worker_engine_busy(e)) {
        int n;
        if ((err = worker_engine_step(e, ev, &n, diag)))
            goto out;
        double t = now_s() - t0;
        for (int i = 0; i < n; i++) {
            if (ev[i].token < 0)
                continue;
            out->output_tokens++;
            if (ev[i].index == 0) {
                first_sum += t;
                last_first = t;
                tokens_at_last_first = out->output_tokens;
            }
        }
    }
    worker_engine_stats after;
    worker_engine_stats_get(e, &after);
    out->seconds = now_s() - t0;
    out->first_token_s_mean = first_sum / o->streams;
    /* Once every stream has its first token, every step is pure decode. */
    out->decode_s = out->seconds - last_first;
    out->decode_tokens = out->output_tokens - tokens_at_last_first;
    out->prompt_tokens = (uint64_t)o->streams * (uint64_t)o->prompt_tokens;
    out->steps = after.steps - before.steps;
    out->preemptions = after.preemptions - before.preemptions;
out:
    free(prompt);
    free(ev);
    return err;
}
