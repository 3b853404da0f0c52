/* worker_serve.h: a worker serving its coordinator.
 *
 * Dials the coordinator's socket, says HELLO (after the model loaded), then
 * loops: take every SUBMIT and CANCEL that arrived, run one engine step,
 * send one STEP message with every token of that step and the worker's
 * load; while idle, wait for a message and send a HEARTBEAT every
 * heartbeat_ms, and while one step runs longer, a thread sends them for
 * up to step_timeout_s. SHUTDOWN ends the loop once running streams finished;
 * worker_serve_stop (a SIGTERM handler may call it) ends it at the next
 * step, leaving running streams to the coordinator to resume elsewhere. */
#ifndef SHOAL_WORKER_SERVE_H
#define SHOAL_WORKER_SERVE_H

#include "worker/worker_cluster.h"
#include "worker/worker_engine.h"
#include "worker/worker_states.h"

typedef struct worker_serve_options {
    const char *socket_path; /* the coordinator's socket for this worker */
    int worker_index;
    int heartbeat_ms;
    /* while one engine step runs longer than heartbeat_ms, a thread sends
     * the heartbeats, up to this many seconds into the step (0: always);
     * past it the worker falls silent, to be restarted as hung */
    int step_timeout_s;
    int max_model_len; /* the context a stream gets (0: the model's pages a stream) */
    const char *device;
    worker_cluster *cluster; /* the shared segment's slot, or NULL */
    worker_states *states;   /* --learn-conversations: its counters go in the load */
    /* benchmark mode: no model; each step emits one token per stream at
     * once (token ids 0, 1, 2, ...), to measure the coordinator alone */
    bool fake_tokens;
    int fake_vocab;
    int fake_max_model_len;
    int fake_parallel;
    int fake_step_us; /* a step at most every this many us (0: as fast as the
                       * coordinator takes them), as a real engine's steps */
} worker_serve_options;

/* Serves until SHUTDOWN (SHOAL_OK) or a failure (the engine broke, the
 * channel failed). e may be NULL in fake mode; m gives the HELLO facts. */
shoal_err worker_serve_run(const worker_serve_options *o, worker_model *m, worker_engine *e,
                           shoal_diag *diag);

/* Asks worker_serve_run to return SHOAL_OK after the step it is in.
 * Async-signal-safe. */
void worker_serve_stop(void);

#endif
