/* store_state.h: the state store as the engine uses it: KV pages of
 * conversations spilled to LMDB and restored from it.
 *
 * One handle per worker process, on a state directory that every worker of
 * the cluster shares (store_env.h says how the directory, its locks and its
 * durability work). A record is one page of one block, keyed by the model
 * fingerprint and the block's chained hash, and carries its parent's hash,
 * so the store knows each conversation as a chain of blocks.
 *
 * Writes run off the engine's step: store_state_put_async copies the page
 * into a queue of fixed capacity (SHOAL_STORE_QUEUE_BYTES_MAX and _SLOTS_MAX)
 * and returns at once; a writer thread writes the queue in batches, one
 * transaction each (data and index together). A put that finds the queue
 * full is dropped and counted, never waited on. Reads (lookup, get) are
 * synchronous read transactions from any thread; they never wait for the
 * writer.
 *
 * Room: the records stay under spill_bytes. A put evicts first, least
 * recently used first, by chain end: a chain loses its tail first and a
 * prefix that several chains share goes last. Puts and gets are uses.
 * A full LMDB map is handled by growing it or evicting, and the write is
 * retried (store_env_write).
 *
 * Trust: a record is returned only when its fingerprint (header and key),
 * page layout and SHA-256 checksum match. One that does not is refused:
 * counted, logged once per handle, left in place for `shoalctl states
 * verify` to report. */
#ifndef SHOAL_STORE_STATE_H
#define SHOAL_STORE_STATE_H

#include "common/common_error.h"
#include "common/common_hash.h"
#include "store/store_record.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct store_state store_state;

typedef struct store_state_options {
    const char *dir;         /* created 0700 when missing */
    uint64_t spill_bytes;    /* --spill-gib in bytes: records stay under it */
    common_hash fingerprint; /* the model's (worker_fingerprint_compute) */
    store_page_layout layout;
    size_t state_bytes; /* a state checkpoint's (hybrid models' slot bytes; 0: none) */
    /* Tuning and tests; 0 picks the default. */
    uint64_t map_bytes;     /* initial LMDB map: 2 x spill_bytes + 64 MiB */
    uint64_t map_bytes_max; /* its growth limit: 4 x the initial map */
    int queue_slots;        /* pages the queue holds: the limits' bound */
} store_state_options;

/* What the writer and readers of one handle did since open. */
typedef struct store_state_stats {
    uint64_t records; /* in the whole store (every process, every model) */
    uint64_t bytes;   /* record bytes in the whole store */
    uint64_t spill_bytes;
    uint64_t map_bytes;
    uint64_t puts;       /* accepted into the queue */
    uint64_t drops;      /* refused: queue full */
    uint64_t writes;     /* records written */
    uint64_t duplicates; /* puts of a block already stored */
    uint64_t evictions;  /* records this handle evicted */
    uint64_t hits;       /* gets that returned a page */
    uint64_t misses;     /* gets of a block not stored */
    uint64_t refused;    /* gets of a record that failed a check */
    uint64_t direct_reads; /* reads (store_state_read) past the page cache */
    uint64_t map_full;   /* write attempts that found the map full */
    uint64_t map_grows;
    uint64_t write_errors; /* batches lost to an error (logged) */
    uint64_t touch_drops;  /* last-use updates dropped on a full queue */
    int queued;            /* puts waiting now */
    int queue_slots;       /* the queue's capacity */
} store_state_stats;

/* Opens the store in opt->dir (creating it) for one model and layout, and
 * starts the writer thread. Call it in the process that will use it, after
 * any fork; one handle per directory per process. Allocates the queue
 * (queue_slots x page_bytes) here, nothing later. Errors: SHOAL_ERR_INVALID
 * (layout, spill_bytes below one record, directory permissions, open
 * twice), SHOAL_ERR_LIMIT, SHOAL_ERR_FORMAT, SHOAL_ERR_TIMEOUT,
 * SHOAL_ERR_IO, SHOAL_ERR_NOMEM; diag names the directory and what to do.
 * *out is the caller's until store_state_close. */
shoal_err store_state_open(const store_state_options *opt, store_state **out, shoal_diag *diag);

/* Writes what is queued, stops the writer, syncs and closes. NULL is
 * allowed; so is a handle whose open failed halfway. No call may be in
 * flight on other threads. */
void store_state_close(store_state *s);

/* Queues the page of block `hash` (its parent's hash, `tokens` tokens in
 * 1..page_tokens, `page` of layout.page_bytes bytes, copied before the
 * call returns) for writing. Never blocks on the disk: SHOAL_OK queued;
 * SHOAL_ERR_LIMIT dropped, the queue being full (counted in drops);
 * SHOAL_ERR_INVALID bad tokens or bytes; SHOAL_ERR_CLOSED while closing;
 * SHOAL_ERR_BROKEN a handle used in another process than the one that
 * opened it. Any thread; the copy is made under the queue's lock (a page
 * copy is well under a millisecond). A block already stored is only marked
 * used, unless its record fails its checks: then this page replaces it. */
shoal_err store_state_put_async(store_state *s, const common_hash *hash, const common_hash *parent,
                                int tokens, const void *page, size_t page_bytes);

/* Copies the page of block `hash` into out (out_bytes >= page_bytes) and
 * sets *tokens (may be NULL). SHOAL_OK found (counted in hits, and the block
 * is marked used); SHOAL_ERR_NOT_FOUND not stored (misses);
 * SHOAL_ERR_FORMAT refused, the record failed a check (refused; the reason
 * in diag; out's contents are then undefined); SHOAL_ERR_INVALID out too
 * small; SHOAL_ERR_IO. Synchronous; any thread, several at once. */
shoal_err store_state_get(store_state *s, const common_hash *hash, void *out, size_t out_bytes,
                          int *tokens, shoal_diag *diag);

/* store_state_get for a restore's readers, reading a record not in the
 * page cache from the disk with O_DIRECT (large requests, full disk
 * speed; a record in the page cache, or a file system without O_DIRECT,
 * is copied from the map). The record goes into buf, which needs
 * store_state_read_bytes and 4096-byte alignment for O_DIRECT (a short or
 * unaligned buf is copied into); the page starts at buf + *payload_at.
 * Results and counters as store_state_get's, plus direct_reads. */
size_t store_state_read_bytes(const store_state *s);
shoal_err store_state_read(store_state *s, const common_hash *hash, void *buf, size_t buf_bytes,
                           size_t *payload_at, int *tokens, shoal_diag *diag);

/* State checkpoints of hybrid models (store_record.h): state_bytes kept
 * as store_state_checkpoint_parts records of the page layout's size,
 * keyed by the block they follow. They count against spill_bytes and are
 * evicted like pages (their last part first). */
int store_state_checkpoint_parts(const store_state *s);

/* Queues the checkpoint at `block` (state_bytes, copied before the call
 * returns): every part or none. SHOAL_ERR_LIMIT: the queue has no room
 * for all its parts (counted once in drops); SHOAL_ERR_UNSUPPORTED: its
 * parts outnumber the queue's slots, so it never fits (open warns);
 * SHOAL_ERR_INVALID: the size is not the store's state_bytes; else as
 * store_state_put_async. */
shoal_err store_state_put_checkpoint_async(store_state *s, const common_hash *block,
                                           const void *state, size_t state_bytes);

/* Reads part `index` of the checkpoint at `block` as store_state_read
 * reads a page (buf of store_state_read_bytes; the part's payload at
 * buf + *payload_at, the last part's tail zero padding). Refuses
 * (SHOAL_ERR_FORMAT, counted in refused) a record that is no state part,
 * fails its checks, or is not the part its key names: its index, the
 * part count and state bytes of this store, and its parent (the block for
 * part 0, else part index - 1). SHOAL_ERR_NOT_FOUND when missing. */
shoal_err store_state_read_part(store_state *s, const common_hash *block, int index, void *buf,
                                size_t buf_bytes, size_t *payload_at, shoal_diag *diag);

/* The whole checkpoint at block into out (out_bytes >= state_bytes): every
 * part as store_state_read_part checks it, or the first failure. */
shoal_err store_state_get_checkpoint(store_state *s, const common_hash *block, void *out,
                                     size_t out_bytes, shoal_diag *diag);

/* The highest i in [0, n) whose checkpoint at blocks[i] has its last part
 * stored (eviction takes that part first), in *last; -1 when none. One read
 * transaction; counts nothing. */
shoal_err store_state_checkpoint_last(store_state *s, const common_hash *blocks, int n, int *last,
                                      shoal_diag *diag);

/* How many of hashes[0..n) lead the list and are stored (as records of this
 * model and layout whose headers check; the checksums are checked by get),
 * in *stored. One read transaction; counts nothing. Any thread. A later
 * get may still miss (another process evicted meanwhile) or refuse. */
shoal_err store_state_lookup(store_state *s, const common_hash *hashes, int n, int *stored,
                             shoal_diag *diag);

/* How many of hashes[0..n) lead the list and have a record under this
 * model's key, in *present, without reading the records: on a cold page
 * cache lookup's header checks cost a disk read per record, one after
 * another, where this touches only the B-tree (get checks each record in
 * full). One read transaction; counts nothing. Any thread. */
shoal_err store_state_lookup_keys(store_state *s, const common_hash *hashes, int n, int *present,
                                  shoal_diag *diag);

/* Of the records of hashes[0..n), how many are in the page cache, judged
 * by the first and last page of each (mincore over the map, no read), in
 * *resident, of *total found: whether a restore will read memory or the
 * disk. One read transaction. */
shoal_err store_state_resident(store_state *s, const common_hash *hashes, int n,
                               uint64_t *resident, uint64_t *total, shoal_diag *diag);

/* Waits until everything queued before the call is written (or dropped
 * after an error), at most timeout_ms (< 0: no limit). SHOAL_OK or
 * SHOAL_ERR_TIMEOUT. For tests and shutdown; any thread. */
shoal_err store_state_flush(store_state *s, int timeout_ms);

/* Counters of this handle plus the store's records and bytes (one read
 * transaction). Any thread. */
shoal_err store_state_stats_get(store_state *s, store_state_stats *out, shoal_diag *diag);

/* Clears reader slots of processes that died in a read transaction
 * (mdb_reader_check), as open does: call it when a worker process of the
 * cluster exits (the coordinator, which holds no store_state, uses
 * store_admin_reader_check). *cleared may be NULL. Any thread. */
shoal_err store_state_reader_check(store_state *s, int *cleared, shoal_diag *diag);

#endif
