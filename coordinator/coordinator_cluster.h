/* coordinator_cluster.h: the coordinator's side of its workers.
 *
 * Starts the worker processes (or waits for workers that start themselves),
 * talks to each over an nng pair socket in the runtime directory (the
 * messages of shm/shm_proto.h), places each stream on a worker (the router),
 * watches heartbeats, and when a worker dies resumes its streams on another
 * worker from their prompt plus the tokens already delivered, so the client
 * sees one uninterrupted stream. Restarts dead workers with backoff.
 * Drains a worker whose segment row has its drain flag set (`shoalctl
 * drain`): no new streams there, SHUTDOWN once its streams are done, no
 * restart until the flag is cleared.
 *
 * Threads: one internal thread receives from all workers and calls the
 * event callbacks; submit and cancel may be called from any thread. */
#ifndef SHOAL_COORDINATOR_CLUSTER_H
#define SHOAL_COORDINATOR_CLUSTER_H

#include "common/common_error.h"
#include "common/common_hash.h"
#include "shm/shm_proto.h"

#include <stdbool.h>
#include <stdint.h>

enum { COORDINATOR_WORKERS_MAX = 64 };

typedef enum coordinator_route {
    COORDINATOR_ROUTE_PREFIX = 0, /* longest cached prefix, weighed against load */
    COORDINATOR_ROUTE_LEAST_LOADED,
    COORDINATOR_ROUTE_ROUND_ROBIN,
} coordinator_route;

typedef struct coordinator_cluster_options {
    const char *model_dir;
    const char *workers;     /* "auto", "cpu,cpu", "0,1", or "none" */
    const char *runtime_dir; /* sockets live here (created 0700) */
    const char *cluster;     /* the shared segment's name; NULL: "shoal-<pid>" */
    int segment_pages;       /* page rows per worker in it; 0: --kv-pages or 65536 */
    const char *worker_path; /* the shoal-worker binary */
    coordinator_route route;
    /* passed to each worker as flags; 0 or NULL leaves the worker's default */
    const char *load_format;
    const char *kv_dtype; /* "bf16" or "fp8" */
    const char *warmup;   /* a static "auto", "on" or "off" */
    int threads;
    int page_tokens;
    int kv_pages;
    int parallel;
    int max_batch_tokens;
    int max_model_len;
    int state_checkpoints;   /* hybrids' state checkpoints; -1: the worker's default */
    int checkpoint_interval; /* tokens; -1: the worker's default */
    /* --learn-conversations: each worker keeps conversations in the state
     * store in state_dir (NULL: off), under spill_gib as given (NULL: the
     * worker's default). The coordinator clears the store's stale reader
     * slots when a worker exits, and gives workers time to write their
     * states when it stops them. */
    const char *state_dir;
    const char *spill_gib;
    const char *restore_mode; /* --restore-mode as given, or NULL: the worker's default */
    /* supervision */
    int heartbeat_ms;    /* a worker reports at least this often while idle */
    int dead_after_ms;   /* silence after which a worker is declared dead */
    int step_timeout_s;  /* a worker heartbeats through one step this long (0: any) */
    int start_timeout_ms; /* model loading included */
    /* A dead worker restarts after 1 s, doubling with each death in a
     * row up to 30 s; a worker that was ready this long before it died
     * starts the row again (default 60 s). */
    int restart_reset_ms;
} coordinator_cluster_options;

/* Defaults: auto workers, prefix routing, heartbeat 200 ms, dead after
 * 3 s, 10 minutes to start. */
void coordinator_cluster_options_default(coordinator_cluster_options *o);

typedef struct coordinator_cluster coordinator_cluster;

/* Starts the workers and waits until every one has said HELLO (loaded its
 * model), or the start timeout passes. */
shoal_err coordinator_cluster_open(const coordinator_cluster_options *o,
                                   coordinator_cluster **out, shoal_diag *diag);

/* Stops the workers (SHUTDOWN, then SIGTERM, then SIGKILL) and frees. */
void coordinator_cluster_close(coordinator_cluster *c);

/* One stream to run. */
typedef struct coordinator_stream_request {
    const int32_t *prompt;
    int prompt_len;
    int max_tokens;
    shm_sampling sampling;
    bool ignore_eos;
    int stop_count;
    int32_t stop_ids[SHM_STOP_IDS_MAX];
    bool has_salt;
    common_hash salt;
} coordinator_stream_request;

/* Called on the cluster's thread for each event of a stream: a token
 * (ev->token >= 0), and once with ev->finish != 0, after which the stream
 * is gone. A stream the workers refused ends with finish =
 * COORDINATOR_FINISH_ERROR and the message in `error`. Keep it short:
 * queue the event and return. */
enum { COORDINATOR_FINISH_ERROR = 100 };
typedef void (*coordinator_event_fn)(void *ctx, const shm_event *ev, const char *error);

/* Places a stream on a worker. *stream_id names it for cancel. Errors:
 * SHOAL_ERR_INVALID or SHOAL_ERR_LIMIT when it can never run (too long for
 * the context or the pool: the HTTP 400), SHOAL_ERR_BROKEN when no worker
 * is alive (503), with diag saying why. */
shoal_err coordinator_cluster_submit(coordinator_cluster *c, const coordinator_stream_request *r,
                                     coordinator_event_fn fn, void *ctx, uint64_t *stream_id,
                                     shoal_diag *diag);

/* Cancels a stream. When it returns, fn is never called again for it.
 * Unknown ids (already finished) are ignored. */
void coordinator_cluster_cancel(coordinator_cluster *c, uint64_t stream_id);

/* Model facts every worker agreed on at HELLO. */
int coordinator_cluster_vocab(const coordinator_cluster *c);
int coordinator_cluster_max_model_len(const coordinator_cluster *c);

typedef struct coordinator_worker_stats {
    int index;
    int pid;
    char device[16];
    bool alive;
    int restarts;
    int streak; /* deaths in a row, each soon after its start: the backoff's exponent */
    shm_load load;
    uint64_t import_tokens;  /* from the segment's worker row */
    uint64_t import_ns;      /* time its imports took */
    uint64_t restore_tokens;
    int pages_leased;
    int inflight;  /* streams placed there and not finished */
    bool draining; /* `shoalctl drain`: no new streams go there */
    bool drained;  /* exited after its drain; back after undrain */
} coordinator_worker_stats;

typedef struct coordinator_cluster_stats {
    int workers;
    int alive;
    int streams; /* live streams */
    uint64_t resumed; /* streams moved off a dead worker */
    coordinator_worker_stats worker[COORDINATOR_WORKERS_MAX];
} coordinator_cluster_stats;

void coordinator_cluster_stats_get(coordinator_cluster *c, coordinator_cluster_stats *out);

/* True while the cluster's own supervision runs (its thread went round in
 * the last 5 s): the coordinator's liveness, for systemd's watchdog. */
bool coordinator_cluster_alive(coordinator_cluster *c);

/* True when every worker answered within dead_after_ms. */
bool coordinator_cluster_healthy(coordinator_cluster *c);

/* A worker as a load balancer sees it. */
typedef enum coordinator_worker_health {
    COORDINATOR_WORKER_SERVING = 0, /* alive, answering, takes new streams */
    COORDINATOR_WORKER_DRAINING,    /* alive, finishing its streams, takes no new ones */
    COORDINATOR_WORKER_STARTING,    /* started, not yet said hello */
    COORDINATOR_WORKER_SILENT,      /* alive but silent past dead_after_ms */
    COORDINATOR_WORKER_DEAD,        /* exited; waits for its restart */
    COORDINATOR_WORKER_DRAINED,     /* exited after its drain, on purpose */
} coordinator_worker_health;

typedef struct coordinator_cluster_health {
    int workers;
    int serving; /* workers in COORDINATOR_WORKER_SERVING */
    coordinator_worker_health worker[COORDINATOR_WORKERS_MAX];
} coordinator_cluster_health;

/* Each worker's health, one consistent view. */
void coordinator_cluster_health_get(coordinator_cluster *c, coordinator_cluster_health *out);

/* "serving", "draining", "starting", "not answering", "dead", "drained". */
const char *coordinator_worker_health_name(coordinator_worker_health h);

#endif
