/* worker_generate.h: greedy generation of one stream, for people and tests.
 *
 * The engine (continuous batching) drives worker_model for real serving;
 * this runs one prompt alone: prefill in chunks of the model's row limit,
 * then one decode step per token, in pages 0, 1, 2, ... of the arena. */
#ifndef SHOAL_WORKER_GENERATE_H
#define SHOAL_WORKER_GENERATE_H

#include "worker/worker_model.h"

#include <stdbool.h>

/* The greedy token of one row of logits (the lowest id among equal maxima,
 * as torch.argmax) and its log-probability under softmax(logits). */
int worker_greedy(const float *logits, int vocab, float *logprob);

/* Log-probability of `token` under softmax(logits). */
float worker_logprob(const float *logits, int vocab, int token);

typedef struct worker_generate_stats {
    double prefill_s;
    double decode_s;
    int prompt_tokens;
    int generated_tokens;
} worker_generate_stats;

/* Called after each generated token; return false to stop. */
typedef bool (*worker_token_fn)(void *ctx, int index, int token, float logprob);

/* Generates up to max_tokens greedy tokens after prompt, stopping after an
 * EOS id of the model when stop_at_eos. Each token goes to on_token (NULL
 * allowed). Fails with SHOAL_ERR_LIMIT when prompt + max_tokens needs more
 * pages than the arena has or more than the stream's page table holds. */
shoal_err worker_generate_greedy(worker_model *m, const int32_t *prompt, int prompt_len,
                                 int max_tokens, bool stop_at_eos, worker_token_fn on_token,
                                 void *ctx, worker_generate_stats *stats, shoal_diag *diag);

#endif
