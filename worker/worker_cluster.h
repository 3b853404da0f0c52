/* worker_cluster.h: a worker's place in its cluster's shared segment.
 *
 * Joining takes the worker's slot in /shoal.<cluster> (shm_segment.h): the
 * slot's page rows become the engine's page state, the arena is served to
 * the other workers (shm_arena.h), and the worker row and stream table are
 * kept current after each step for the router and shoalctl.
 *
 * The import source: when a stream's prefix continues on another worker,
 * the longest published run there is leased in the segment (so its owner
 * cannot evict it), copied page by page from the owner's arena, mapped
 * here once per owner process, into pages of our own (a device-to-device
 * copy; a peer copy across GPUs), then the lease ends and the pages are
 * published here as if we had computed them. One thread (the engine's). */
#ifndef SHOAL_WORKER_CLUSTER_H
#define SHOAL_WORKER_CLUSTER_H

#include "shm/shm_segment.h"
#include "worker/worker_engine.h"
#include "worker/worker_model.h"

typedef struct worker_cluster worker_cluster;

/* The KV page rows the segment of `cluster` holds for each worker: what a
 * worker that sizes its arena from free memory may register. Waits for
 * the coordinator to make the segment, as worker_cluster_join does. */
shoal_err worker_cluster_segment_pages(const char *cluster, int *pages, shoal_diag *diag);

/* Attaches to the segment of `cluster`, registers slot `index` for the
 * model's KV pages on `device` ("cpu" or a GPU index) and serves its arena. */
shoal_err worker_cluster_join(const char *cluster, int index, const char *device, worker_model *m,
                              worker_cluster **out, shoal_diag *diag);

/* Stops serving the arena, unmaps imported arenas, detaches. NULL allowed.
 * The slot itself is cleared by the coordinator when it sees the exit. */
void worker_cluster_leave(worker_cluster *cl);

shm_segment *worker_cluster_segment(worker_cluster *cl);
int worker_cluster_index(const worker_cluster *cl);

/* The engine's import source (worker_engine_options.import). */
worker_prefix_source worker_cluster_import_source(worker_cluster *cl);

/* Writes the engine's counters, page counts and streams into the worker
 * row and stream table, with a heartbeat. After each step. */
void worker_cluster_report(worker_cluster *cl, worker_engine *e);

/* The row's heartbeat alone: from the thread that heartbeats while one
 * step runs long (worker_serve.c), so that shoalctl does not call a busy
 * worker "not answering" where its coordinator hears it. */
void worker_cluster_beat(worker_cluster *cl);

/* While idle: maps the arena of every ready peer not mapped yet (the first
 * mapping of a large GPU arena takes a while; an import should not pay
 * it). A peer whose mapping failed is not retried until it restarts. */
void worker_cluster_idle(worker_cluster *cl);


#endif
