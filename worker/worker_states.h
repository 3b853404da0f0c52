/* worker_states.h: the bridge between a worker's KV pages and the state
 * store (--learn-conversations).
 *
 * Three paths:
 *   restore  the engine's restore source (worker_engine_options.restore):
 *            when the store holds the first block after a stream's local
 *            and imported hits, every following block of the prompt gets a
 *            page at admission; reader threads get them, the last block
 *            first, into pinned host staging (a block not stored is a quick
 *            miss), and the engine's thread uploads what was read at its
 *            next step, publishes it and marks it stored. Meanwhile the
 *            engine computes the prefix's head itself, upward, until the
 *            two meet (with read_all it waits for every read instead). A
 *            block the store refuses (checksum, fingerprint, layout) or
 *            lost is computed;
 *   spill    the pool's eviction hook, on the engine's thread: a cached
 *            page about to be reused is downloaded and queued for the store
 *            (store_state_put_async, which never waits for the disk)
 *            unless it is stored already;
 *   write    at a clean shutdown, every published page not yet stored is
 *            written (newest last, at most --spill-gib of them), then the
 *            store is flushed, so conversations survive a restart of the
 *            whole cluster.
 *
 * Hybrid models (worker_checkpoints.h): a turn's state checkpoint goes to
 * the store when it leaves the table (for room, or with its block's page)
 * and at the shutdown write, as records of its own kind (store_record.h).
 * Their restore is all or nothing: the blocks up to the last one whose
 * checkpoint is stored, each from this worker's cache or the store, and
 * that checkpoint, all read before the stream goes on (the state at a
 * block's end is the whole history run through every layer: there is no
 * head to compute meanwhile); when any of it is missing or refused, the
 * stream computes those blocks instead.
 *
 * The store is opened in the worker process (never across a fork), for the
 * model's fingerprint, KV page layout and state slot bytes. */
#ifndef SHOAL_WORKER_STATES_H
#define SHOAL_WORKER_STATES_H

#include "common/common_error.h"
#include "store/store_state.h"
#include "worker/worker_engine.h"
#include "worker/worker_model.h"
#include "worker/worker_pages.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct worker_states worker_states;

typedef struct worker_states_options {
    const char *dir;      /* --state-dir */
    uint64_t spill_bytes; /* --spill-gib in bytes */
    int read_threads;     /* blocks read at once on restore (each checks its
                             page's SHA-256); 0: one a processor, at most 32 */
    bool read_all;        /* restores read every stored block; else the
                             engine computes the head while the tail is read
                             (--restore-mode read | overlap) */
} worker_states_options;

/* What the bridge did since open (store counters are store_state's). */
typedef struct worker_states_stats {
    uint64_t restored_pages; /* uploaded from the store */
    uint64_t restore_bytes;  /* their payload bytes */
    uint64_t restore_ns;     /* restores' time, start to end, summed */
    uint64_t restore_stops;  /* blocks refused (or partial), computed instead */
    uint64_t spilled_pages;  /* evicted pages queued for the store */
    uint64_t spill_skipped;  /* evicted pages the store already held */
    uint64_t spill_drops;    /* evicted pages the full queue refused */
    uint64_t written_pages;  /* queued by worker_states_write_all */
    uint64_t refused;        /* records refused on restore (checksum, fingerprint,
                                layout; logged once by the store) */
    /* hybrids */
    uint64_t restored_checkpoints; /* state checkpoints restored into a stream's slot */
    uint64_t spilled_checkpoints;  /* queued as they left the table */
    uint64_t checkpoint_drops;     /* refused by a queue without room for their parts */
    uint64_t written_checkpoints;  /* queued by worker_states_write_all */
} worker_states_stats;

/* Opens the store in o->dir for model m (its fingerprint, KV layout,
 * arena and backend; m must outlive the handle) and allocates the staging
 * buffers (read_threads pages for spills and restores, up to
 * SHOAL_STATES_STAGING_BYTES_MAX). Errors are store_state_open's, with
 * diag naming the directory, or SHOAL_ERR_NOMEM. *out is the caller's
 * until worker_states_close. */
shoal_err worker_states_open(const worker_states_options *o, worker_model *m, worker_states **out,
                             shoal_diag *diag);

/* Writes what is queued and closes the store. NULL allowed. */
void worker_states_close(worker_states *st);

/* The engine's restore source. */
worker_async_source worker_states_restore_source(worker_states *st);

/* Registers the spill hooks on the engine's pool (worker_pages_on_evict)
 * and, for hybrids, its checkpoint table (NULL: none). */
void worker_states_attach(worker_states *st, worker_pages *pages, worker_checkpoints *ckpts);

/* Queues every published page of `pages` that the store lacks, oldest use
 * first and at most spill_bytes of them (the newest), then the kept state
 * checkpoints it lacks, waiting for room in the queue, then waits until
 * the store wrote them, within timeout_ms in
 * all (< 0: no limit). Logs progress every two seconds. *written (may be
 * NULL) gets how many pages were queued. SHOAL_ERR_TIMEOUT when time ran
 * out (what was queued is still written by close). Engine thread, with no
 * stream running. */
shoal_err worker_states_write_all(worker_states *st, worker_pages *pages, int timeout_ms,
                                  int *written, shoal_diag *diag);

/* The bridge's counters and the store's refusals. Engine thread. */
void worker_states_stats_get(worker_states *st, worker_states_stats *out);

/* The store handle (for tests, benchmarks and stats). */
store_state *worker_states_store(worker_states *st);

#endif
