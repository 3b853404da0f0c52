/* worker_checkpoints.h: the recurrent-state checkpoints of a hybrid model.
 *
 * A hybrid model's linear layers keep, per stream, a fixed-size state (the
 * conv window and the delta rule's matrix) that the KV pages do not hold:
 * a cached prefix is reusable only with the state at its end. A checkpoint
 * is that state, one model state slot, copied at the end of a block and
 * kept under the block's chain hash (which names every token before it).
 * A stream whose prefix chain reaches the block takes the pages of blocks
 * [0, b] and the checkpoint together, or neither.
 *
 * The slots [first_slot, first_slot + count) of the model are the table's;
 * when all hold checkpoints, adding one evicts the least recently used. A
 * checkpoint goes with its block's page: when the page is evicted, so is
 * the checkpoint (worker_checkpoints_evict).
 *
 * A checkpoint is kept (`keep`) when it is a turn's: at a prompt's last
 * full block or a stream's latest decode block, what a conversation's next
 * turn starts from. With --learn-conversations the state store takes a
 * kept checkpoint the store lacks as it leaves (the eviction hook); those
 * taken every checkpoint_interval tokens of a long prompt only serve
 * prompts that share a head, and are not worth a slot's bytes on disk
 * each. One thread (the engine's) uses the table. */
#ifndef SHOAL_WORKER_CHECKPOINTS_H
#define SHOAL_WORKER_CHECKPOINTS_H

#include "common/common_error.h"
#include "common/common_hash.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct worker_checkpoints worker_checkpoints;

typedef struct worker_checkpoints_stats {
    int capacity;       /* slots the table has */
    int held;           /* of which hold a checkpoint */
    uint64_t added;     /* checkpoints taken */
    uint64_t hits;      /* found by a stream's prefix */
    uint64_t evictions; /* dropped for room (least recently used) */
    uint64_t dropped;   /* dropped with their block's page */
} worker_checkpoints_stats;

/* A table over model state slots [first_slot, first_slot + count); count
 * may be 0 (no checkpoints: every prompt computes from its start). */
shoal_err worker_checkpoints_open(int first_slot, int count, worker_checkpoints **out);
void worker_checkpoints_close(worker_checkpoints *c);

/* The slot of the checkpoint under hash (marked used now), or -1. Counts a
 * hit when found and `count_hit`. */
int worker_checkpoints_find(worker_checkpoints *c, const common_hash *hash, bool count_hit);

/* A slot for a new checkpoint under hash, whose state the caller copies
 * in next: a free slot, else the least recently used one's (evicted). -1
 * when the hash has a checkpoint already or the table has no slots. */
int worker_checkpoints_add(worker_checkpoints *c, const common_hash *hash, bool keep);

/* Called with a kept checkpoint the store lacks as it leaves (for room,
 * or with its block's page), while its slot still holds its state. */
typedef void (*worker_checkpoints_evict_fn)(void *ctx, const common_hash *hash, int slot);
void worker_checkpoints_on_evict(worker_checkpoints *c, worker_checkpoints_evict_fn fn,
                                 void *ctx);

/* The checkpoint under hash, if any, leaves with its block's page (the
 * eviction hook sees it). */
void worker_checkpoints_evict(worker_checkpoints *c, const common_hash *hash);

/* Forgets the checkpoint under hash, if any, without the hook: a
 * stream's later block replaced it, or the copy into its slot failed. */
void worker_checkpoints_drop(worker_checkpoints *c, const common_hash *hash);

/* The store has the checkpoint under hash: its leaving writes nothing. */
void worker_checkpoints_mark_stored(worker_checkpoints *c, const common_hash *hash);

/* Calls fn for each kept checkpoint the store lacks, least recently used
 * first (a shutdown writes them); returns how many. */
int worker_checkpoints_each_unstored(worker_checkpoints *c, worker_checkpoints_evict_fn fn,
                                     void *ctx);

void worker_checkpoints_stats_get(const worker_checkpoints *c, worker_checkpoints_stats *out);

/* Checks the table's invariants (the hash chains, the LRU list, the
 * counts); the first broken one goes into diag. For tests. */
bool worker_checkpoints_check(const worker_checkpoints *c, shoal_diag *diag);

#endif
