/* coordinator_cluster_internal.h: what the files of the cluster share.
 *
 * The cluster (coordinator_cluster.h) is one module in five files:
 *   coordinator_cluster.c            options, the --workers list, open and
 *                                    close, stats and health
 *   coordinator_cluster_streams.c    the stream table, submit and cancel
 *   coordinator_cluster_route.c      the router: which worker a stream goes
 *                                    to, and the SUBMIT that places it there
 *   coordinator_cluster_supervise.c  worker processes: spawn, death and
 *                                    restart, drain, the supervisor thread
 *   coordinator_cluster_recv.c       the receiving threads: HELLO, STEP,
 *                                    REJECT and HEARTBEAT from each worker
 * Nothing here is for use outside coordinator/coordinator_cluster*.c.
 * Functions shared between those files carry the prefix cluster_. */
#ifndef SHOAL_COORDINATOR_CLUSTER_INTERNAL_H
#define SHOAL_COORDINATOR_CLUSTER_INTERNAL_H

#include "coordinator_cluster.h"

#include "common/common_limits.h"
#include "shm/shm_channel.h"
#include "shm/shm_segment.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Routing memory: per worker, a direct-mapped table of the block hashes of
 * prompts sent there (first 8 bytes). Bounded and approximate: a slot is
 * overwritten by a later block that maps to it. */
enum { PREFIX_SLOTS = 1 << 16 };

/* The stream table's hash chains: a stream sits in bucket id % BUCKETS. */
enum { BUCKETS = 4096 };

/* The most streams one pass places and sends once it has unlocked; the
 * rest keep waiting for a worker (worker -1). */
enum { MOVE_MAX = 4096 };

/* W_DRAINED: exited after `shoalctl drain`; started again only after undrain. */
typedef enum wstate { W_OFF = 0, W_STARTING, W_ALIVE, W_DEAD, W_DRAINED } wstate;

typedef struct cstream {
    struct cstream *next; /* bucket chain */
    uint64_t id;
    int worker; /* -1: waits for a worker */
    coordinator_event_fn fn;
    void *ctx;
    int32_t *tokens; /* prompt, then delivered output */
    int prompt_len;
    int delivered;
    int max_tokens;
    shm_sampling sampling;
    bool ignore_eos;
    int stop_count;
    int32_t stop_ids[SHM_STOP_IDS_MAX];
    bool has_salt;
    common_hash salt;
} cstream;

typedef struct cworker {
    coordinator_cluster *c;
    int index;
    char device[16];
    bool ours; /* we start and restart it */
    pid_t pid;
    wstate state;
    char sock[SHOAL_PATH_BYTES_MAX];
    shm_channel *ch;
    pthread_t rx;
    bool rx_started;
    long long last_seen_ms;
    long long restart_at_ms;
    int restarts;
    int streak;         /* deaths in a row (restart_reset_ms): the backoff */
    long long ready_ms; /* its last HELLO; 0 since its last start */
    int exit_code;      /* of its last process: status, -signal, or SHM_EXIT_* */
    bool draining;      /* its row's drain flag was seen: no new streams go there */
    bool bye_sent;      /* draining and idle: SHUTDOWN went out, its exit is awaited */
    long long bye_ms;   /* when */
    /* A process killed and not yet reaped (0: none), since when: the
     * supervisor reaps it, and starts no new one on its device until it
     * has (a GPU worker's memory is freed as its process ends, which can
     * take seconds) */
    pid_t dying;
    long long dying_ms;
    shm_load load;
    int inflight;
    uint64_t *prefix;
} cworker;

struct coordinator_cluster {
    coordinator_cluster_options o;
    char cluster[SHM_CLUSTER_NAME_MAX];
    shm_segment *seg;
    char *model_dir, *runtime_dir, *worker_path, *load_format, *kv_dtype;
    char *state_dir, *spill_gib, *restore_mode;
    bool reader_check_due; /* a worker exited since the last check (lock) */
    int test_reap_hold_ms; /* test builds: SHOAL_TEST_REAP_HOLD_MS, a killed worker takes that
                              long to end; 0 otherwise */
    pthread_mutex_t lock;
    pthread_cond_t changed;
    cworker w[COORDINATOR_WORKERS_MAX];
    int n;
    bool have_facts;
    int vocab, max_model_len, page_tokens;
    common_hash fingerprint;
    cstream *buckets[BUCKETS];
    int live;
    uint64_t next_id;
    uint64_t resumed;
    int rr_next;
    pthread_t supervisor;
    bool supervisor_started;
    /* close: the supervisor left its rounds, and waits (parked) until the
     * workers are gone (lock, `changed`) */
    bool supervisor_parked, workers_gone;
    _Atomic long long supervisor_ran_ms; /* the supervisor's last round */
    atomic_bool stopping;
};

/* ---- coordinator_cluster_streams.c: the stream table (callers hold the lock) ---- */

/* Where stream id is, or would go, in its bucket chain. */
cstream **cluster_slot_of(coordinator_cluster *c, uint64_t id);
/* Frees a stream taken out of the table (NULL is fine). */
void cluster_stream_free(cstream *s);
/* Removes and returns the stream, or NULL. */
cstream *cluster_stream_take(coordinator_cluster *c, uint64_t id);

/* ---- coordinator_cluster_route.c ---- */

/* Places s (lock held) and returns the message to send after unlocking, or
 * NULL with s->worker = -1 when no worker is alive. */
void *cluster_place(coordinator_cluster *c, cstream *s, int avoid, size_t *bytes);
/* Places streams that wait for a worker (lock held). */
void cluster_place_waiting(coordinator_cluster *c, void **out, size_t *out_bytes, int *out_worker,
                           int *n_out, int max_out);
/* Sends and frees the SUBMITs placed above, without the lock. */
void cluster_send_all(coordinator_cluster *c, void **msgs, size_t *bytes, int *worker, int n);

/* ---- coordinator_cluster_supervise.c ---- */

/* Starts w's process (lock held); a failed fork leaves w dead, to restart. */
void cluster_spawn(coordinator_cluster *c, cworker *w);
/* Frees the state store's reader slots exited workers left (no lock). */
void cluster_states_reader_check(coordinator_cluster *c);
/* The supervisor thread (arg: the cluster): reaps, declares dead,
 * restarts, drains; parks at close until the workers are gone. */
void *cluster_supervisor_main(void *arg);

/* ---- coordinator_cluster_recv.c ---- */

/* A worker's receiving thread (arg: its cworker), until the cluster stops. */
void *cluster_rx_main(void *arg);

#endif
