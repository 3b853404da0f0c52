/* worker_pages.h: the page pool of one worker's KV arena.
 *
 * The arena is cut into pages once, at start. A page is free, active (held
 * by one or more streams: refs > 0) or cached (refs == 0, and it holds a
 * full block whose hash is published, so a later stream with the same
 * prefix can take it). Cached pages are evicted least recently used first,
 * only when no free page is left. Pages are named by ids in [0, count);
 * nothing here points into the arena. One thread (the engine's) uses it.
 *
 * The page state itself (state, refs, hash, owner, last use) lives in
 * shm_page_row rows: those of the worker's slot in the shared segment when
 * one is given, so that shoalctl and other workers read what the engine
 * uses, or private rows otherwise. Publishing and evicting also update the
 * segment's prefix index under its lock, and a page another worker has
 * leased is not evicted until the lease ends. The LRU links, the parent
 * hashes and a local hash table are private. */
#ifndef SHOAL_WORKER_PAGES_H
#define SHOAL_WORKER_PAGES_H

#include "common/common_error.h"
#include "common/common_hash.h"
#include "shm/shm_segment.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct worker_pages worker_pages;

typedef struct worker_pages_stats {
    int total;
    int free;    /* never filled, or released without a hash */
    int active;  /* refs > 0 */
    int cached;  /* refs == 0 with a published hash: reusable, evictable */
    uint64_t lookups;   /* prefix-cache block lookups */
    uint64_t hits;      /* of which found a page */
    uint64_t evictions; /* cached pages reused for new data */
    uint64_t lease_skips; /* evictions passed over a leased page */
} worker_pages_stats;

/* A pool of `count` pages, kept in the rows of worker slot `worker` of
 * segment `seg` (registered by the caller), or in private rows when seg is
 * NULL. SHOAL_ERR_NOMEM or SHOAL_ERR_INVALID. */
shoal_err worker_pages_open(int count, shm_segment *seg, int worker, worker_pages **out);
void worker_pages_close(worker_pages *p);

/* Called before a cached page is evicted (its content is about to be
 * overwritten), with the block's hash and its parent's: the state store
 * spills it here, and a hybrid model's checkpoint at that block goes with
 * it. Each call adds a hook, WORKER_PAGES_EVICT_HOOKS at most, called in
 * the order they were added. */
enum { WORKER_PAGES_EVICT_HOOKS = 2 };
typedef void (*worker_pages_evict_fn)(void *ctx, int page, const common_hash *hash,
                                      const common_hash *parent);
void worker_pages_on_evict(worker_pages *p, worker_pages_evict_fn fn, void *ctx);

/* Takes a page for new data (refs = 1, owner = the stream), evicting the
 * least recently used cached page that no other worker leases when no free
 * one is left. -1 when every page is active or leased. */
int worker_pages_alloc(worker_pages *p, uint64_t owner);

/* Pages alloc() can still hand out: free plus cached. */
int worker_pages_available(const worker_pages *p);

/* Adds a reference to an active or cached page. */
void worker_pages_ref(worker_pages *p, int page);

/* Drops a reference. At zero the page becomes cached if its hash is
 * published, else free. */
void worker_pages_unref(worker_pages *p, int page);

/* The page holding the block with this hash, with a reference taken for
 * the caller, or -1. Counts a lookup and, when found, a hit. */
int worker_pages_lookup(worker_pages *p, const common_hash *hash);

/* Publishes `hash` (whose parent block is `parent`, the chain root for a
 * first block) as the content of active page `page`, so lookups here and
 * in other workers find it. false (and nothing changes) when another page
 * already holds that hash, or this page already has one. */
bool worker_pages_publish(worker_pages *p, int page, const common_hash *hash,
                          const common_hash *parent);

/* The page's row (state, flags, hash), read-only. */
const shm_page_row *worker_pages_row(const worker_pages *p, int page);

/* Sets or clears SHM_PAGE_STORED (the block is in the state store). */
void worker_pages_mark_stored(worker_pages *p, int page, bool stored);

/* Calls fn for every cached or active page with a published hash (for
 * writing learned states at shutdown). */
void worker_pages_each_published(const worker_pages *p,
                                 void (*fn)(void *ctx, int page, const common_hash *hash,
                                            const common_hash *parent),
                                 void *ctx);

/* Refs of a page (for tests and accounting). */
int worker_pages_refs(const worker_pages *p, int page);

void worker_pages_stats_get(const worker_pages *p, worker_pages_stats *out);

/* Checks every internal invariant (lists, counts, hash table), and, when
 * expected_refs is not NULL, that each page's refs equal expected_refs[i].
 * Writes the first broken one into diag. For tests and debug builds. */
bool worker_pages_check(const worker_pages *p, const int32_t *expected_refs, shoal_diag *diag);

#endif
