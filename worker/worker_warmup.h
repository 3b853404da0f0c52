/* worker_warmup.h: a model's first passes, run before the worker serves.
 *
 * A GPU backend loads a kernel's code the first time it is launched
 * (cuBLAS too, for each tile it picks), and the model records a decode
 * round's graph the first time its batch size comes. Without a warm-up the
 * first requests after a start pay for that: on an H200 the first
 * 1k-token prompt took 118 ms to its first token against 25 for the next.
 *
 * The warm-up runs prompt passes of max_rows, max_rows / 2, ... rows (down
 * to WORKER_ATTN_PROMPT_ROWS) and, without and with penalty lists (the two
 * kinds of recorded round), a decode round of every size a graph is
 * recorded for (1 .. the model's graph rows; powers of two up to
 * max_logit_rows where the backend records none). Their KV goes into
 * pages nobody holds and is never published, so it runs before an engine
 * is opened on the model; nothing it leaves changes a later output. */
#ifndef SHOAL_WORKER_WARMUP_H
#define SHOAL_WORKER_WARMUP_H

#include "common/common_error.h"
#include "worker/worker_model.h"

#include <stdbool.h>

typedef enum worker_warmup_mode {
    WORKER_WARMUP_AUTO = 0, /* on a device backend (code loaded on first use), not on the CPU */
    WORKER_WARMUP_ON,
    WORKER_WARMUP_OFF,
} worker_warmup_mode;

/* "auto", "on" or "off". */
bool worker_warmup_mode_parse(const char *s, worker_warmup_mode *out);

typedef struct worker_warmup_stats {
    bool ran;
    int prompt_passes;
    int decode_rounds; /* of both kinds */
    int largest_prompt; /* rows of the first prompt pass */
    double seconds;
} worker_warmup_stats;

/* Runs the warm-up (or nothing, for OFF and for AUTO on the CPU), logging
 * its progress under `who` ("worker 0"). Errors are the passes' own
 * (worker_model_step's), with diag saying which pass failed. */
shoal_err worker_warmup_run(worker_model *m, worker_warmup_mode mode, const char *who,
                            worker_warmup_stats *out, shoal_diag *diag);

#endif
