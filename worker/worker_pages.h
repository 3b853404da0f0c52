/* worker_pages.h: the page pool of one worker's KV arena.
 *
 * The arena is cut into pages once, at start. A page is free, active (held
 * by one or more streams: refs > 0) or cached (refs == 0, and it holds a
 * full block whose hash is published, so a later stream with the same
 * prefix can take it). Cached pages are evicted least recently used first,
 * only when no free page is left. Pages are named by ids in [0, count);
 * nothing here points into the arena. One thread (the engine's) uses it. */
#ifndef SHOAL_WORKER_PAGES_H
#define SHOAL_WORKER_PAGES_H

#include "common/common_error.h"
#include "common/common_hash.h"

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
} worker_pages_stats;

/* A pool of `count` pages. SHOAL_ERR_NOMEM or SHOAL_ERR_INVALID. */
shoal_err worker_pages_open(int count, worker_pages **out);
void worker_pages_close(worker_pages *p);

/* Takes a page for new data (refs = 1), evicting the least recently used
 * cached page when no free one is left. -1 when every page is active. */
int worker_pages_alloc(worker_pages *p);

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

/* Publishes `hash` as the content of active page `page`, so lookups find
 * it. false (and nothing changes) when another page already holds that
 * hash, or this page already has one. */
bool worker_pages_publish(worker_pages *p, int page, const common_hash *hash);

/* Refs of a page (for tests and accounting). */
int worker_pages_refs(const worker_pages *p, int page);

void worker_pages_stats_get(const worker_pages *p, worker_pages_stats *out);

/* Checks every internal invariant (lists, counts, hash table), and, when
 * expected_refs is not NULL, that each page's refs equal expected_refs[i].
 * Writes the first broken one into diag. For tests and debug builds. */
bool worker_pages_check(const worker_pages *p, const int32_t *expected_refs, shoal_diag *diag);

#endif
