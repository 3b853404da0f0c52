#include "worker_pages.h"

#include "common/common_assert.h"

#include <stdlib.h>
#include <string.h>

enum { NONE = -1 };

typedef struct link {
    int32_t prev, next; /* free list (next only) or LRU list of cached pages */
} link;

struct worker_pages {
    int count;
    shm_page_row *rows; /* the truth: segment rows or own_rows */
    shm_page_row *own_rows;
    shm_segment *seg; /* NULL without a cluster */
    int worker;
    link *links;
    common_hash *parents;
    int free_head;
    int free_count;
    int lru_head; /* oldest cached page */
    int lru_tail;
    int cached_count;
    uint64_t clock;
    /* open addressing, linear probing, backward-shift deletion: slot holds a
     * page id or NONE; at most half full */
    int32_t *table;
    uint32_t mask;
    uint64_t lookups, hits, evictions, lease_skips;
    worker_pages_evict_fn on_evict[WORKER_PAGES_EVICT_HOOKS];
    void *on_evict_ctx[WORKER_PAGES_EVICT_HOOKS];
    int n_on_evict;
};

static bool hashed(const worker_pages *p, int id)
{
    return atomic_load_explicit(&p->rows[id].flags, memory_order_relaxed) & SHM_PAGE_HASHED;
}

static int refs_of(const worker_pages *p, int id)
{
    return atomic_load_explicit(&p->rows[id].refs, memory_order_relaxed);
}

static void set_refs(worker_pages *p, int id, int refs)
{
    atomic_store_explicit(&p->rows[id].refs, refs, memory_order_relaxed);
}

static void set_state(worker_pages *p, int id, shm_page_state st)
{
    atomic_store_explicit(&p->rows[id].state, (uint32_t)st, memory_order_release);
}

static void touch(worker_pages *p, int id)
{
    atomic_store_explicit(&p->rows[id].last_use, ++p->clock, memory_order_relaxed);
}

static uint32_t slot_of(const worker_pages *p, const common_hash *h)
{
    return (uint32_t)common_hash_u64(h) & p->mask;
}

static int table_find(const worker_pages *p, const common_hash *h)
{
    for (uint32_t s = slot_of(p, h);; s = (s + 1) & p->mask) {
        int id = p->table[s];
        if (id == NONE)
            return NONE;
        if (common_hash_equal(&p->rows[id].hash, h))
            return id;
    }
}

static void table_insert(worker_pages *p, int id)
{
    uint32_t s = slot_of(p, &p->rows[id].hash);
    while (p->table[s] != NONE)
        s = (s + 1) & p->mask;
    p->table[s] = id;
}

static void table_remove(worker_pages *p, int id)
{
    uint32_t s = slot_of(p, &p->rows[id].hash);
    while (p->table[s] != id) {
        SHOAL_ASSERT(p->table[s] != NONE);
        s = (s + 1) & p->mask;
    }
    /* Shift later entries of the run back so no probe sequence breaks. */
    uint32_t hole = s;
    for (uint32_t t = (s + 1) & p->mask; p->table[t] != NONE; t = (t + 1) & p->mask) {
        uint32_t home = slot_of(p, &p->rows[p->table[t]].hash);
        /* t's entry may move to the hole if its home is not in (hole, t] */
        bool stays = hole <= t ? (home > hole && home <= t) : (home > hole || home <= t);
        if (!stays) {
            p->table[hole] = p->table[t];
            hole = t;
        }
    }
    p->table[hole] = NONE;
}

static void lru_unlink(worker_pages *p, int id)
{
    link *g = &p->links[id];
    if (g->prev != NONE)
        p->links[g->prev].next = g->next;
    else
        p->lru_head = g->next;
    if (g->next != NONE)
        p->links[g->next].prev = g->prev;
    else
        p->lru_tail = g->prev;
    g->prev = g->next = NONE;
    p->cached_count--;
}

static void lru_push(worker_pages *p, int id)
{
    link *g = &p->links[id];
    g->prev = p->lru_tail;
    g->next = NONE;
    if (p->lru_tail != NONE)
        p->links[p->lru_tail].next = id;
    else
        p->lru_head = id;
    p->lru_tail = id;
    p->cached_count++;
}

static void free_push(worker_pages *p, int id)
{
    p->links[id].next = p->free_head;
    p->links[id].prev = NONE;
    p->free_head = id;
    p->free_count++;
}

shoal_err worker_pages_open(int count, shm_segment *seg, int worker, worker_pages **out)
{
    *out = NULL;
    if (count < 1 || count > (1 << 28) ||
        (seg && (count > shm_segment_header_of(seg)->pages_max || worker < 0 ||
                 worker >= shm_segment_header_of(seg)->workers_max)))
        return SHOAL_ERR_INVALID;
    worker_pages *p = calloc(1, sizeof *p);
    if (!p)
        return SHOAL_ERR_NOMEM;
    uint32_t slots = 2;
    while (slots < 2u * (uint32_t)count)
        slots <<= 1;
    p->count = count;
    p->mask = slots - 1;
    p->seg = seg;
    p->worker = worker;
    if (seg)
        p->rows = shm_segment_pages(seg, worker);
    else
        p->rows = p->own_rows = calloc((size_t)count, sizeof *p->own_rows);
    p->links = calloc((size_t)count, sizeof *p->links);
    p->parents = calloc((size_t)count, sizeof *p->parents);
    p->table = malloc((size_t)slots * sizeof *p->table);
    if (!p->rows || !p->links || !p->parents || !p->table) {
        worker_pages_close(p);
        return SHOAL_ERR_NOMEM;
    }
    memset(p->table, 0xff, (size_t)slots * sizeof *p->table); /* NONE */
    p->free_head = p->lru_head = p->lru_tail = NONE;
    /* lowest ids first, so a fresh pool hands out 0, 1, 2, ... */
    for (int i = count - 1; i >= 0; i--) {
        set_refs(p, i, 0);
        set_state(p, i, SHM_PAGE_FREE);
        free_push(p, i);
    }
    *out = p;
    return SHOAL_OK;
}

void worker_pages_close(worker_pages *p)
{
    if (!p)
        return;
    free(p->own_rows);
    free(p->links);
    free(p->parents);
    free(p->table);
    free(p);
}

void worker_pages_on_evict(worker_pages *p, worker_pages_evict_fn fn, void *ctx)
{
    SHOAL_ASSERT(p->n_on_evict < WORKER_PAGES_EVICT_HOOKS);
    p->on_evict[p->n_on_evict] = fn;
    p->on_evict_ctx[p->n_on_evict++] = ctx;
}

/* Unpublishes cached page id: false when another worker leases it. */
static bool unpublish(worker_pages *p, int id)
{
    if (p->seg) {
        shm_segment_lock(p->seg);
        bool ok = shm_index_remove(p->seg, p->worker, id);
        shm_segment_unlock(p->seg);
        if (!ok)
            return false;
    } else {
        atomic_fetch_and(&p->rows[id].flags, ~(uint32_t)(SHM_PAGE_HASHED | SHM_PAGE_STORED));
    }
    return true;
}

/* The least recently used cached page that can go, unlinked and
 * unpublished, or NONE. Leased pages move to the young end. */
static int evict_one(worker_pages *p)
{
    for (int tries = p->cached_count; tries > 0 && p->lru_head != NONE; tries--) {
        int id = p->lru_head;
        if (atomic_load(&p->rows[id].leases) == 0)
            for (int h = 0; h < p->n_on_evict; h++)
                p->on_evict[h](p->on_evict_ctx[h], id, &p->rows[id].hash, &p->parents[id]);
        lru_unlink(p, id);
        if (!unpublish(p, id)) { /* the row keeps its hash: table_remove needs it */
            p->lease_skips++;
            lru_push(p, id);
            continue;
        }
        table_remove(p, id);
        p->evictions++;
        return id;
    }
    return NONE;
}

int worker_pages_alloc(worker_pages *p, uint64_t owner)
{
    int id;
    if (p->free_head != NONE) {
        id = p->free_head;
        p->free_head = p->links[id].next;
        p->free_count--;
    } else if ((id = evict_one(p)) == NONE) {
        return NONE;
    }
    p->links[id].prev = p->links[id].next = NONE;
    set_refs(p, id, 1);
    atomic_store_explicit(&p->rows[id].owner, owner, memory_order_relaxed);
    set_state(p, id, SHM_PAGE_ACTIVE);
    touch(p, id);
    return id;
}

int worker_pages_available(const worker_pages *p)
{
    return p->free_count + p->cached_count;
}

void worker_pages_ref(worker_pages *p, int id)
{
    SHOAL_ASSERT(id >= 0 && id < p->count);
    int refs = refs_of(p, id);
    if (refs == 0) {
        SHOAL_ASSERT(hashed(p, id)); /* a free page is never referenced */
        lru_unlink(p, id);
        set_state(p, id, SHM_PAGE_ACTIVE);
    }
    set_refs(p, id, refs + 1);
    touch(p, id);
}

void worker_pages_unref(worker_pages *p, int id)
{
    SHOAL_ASSERT(id >= 0 && id < p->count && refs_of(p, id) > 0);
    int refs = refs_of(p, id) - 1;
    set_refs(p, id, refs);
    if (refs > 0)
        return;
    touch(p, id);
    if (hashed(p, id)) {
        set_state(p, id, SHM_PAGE_CACHED);
        lru_push(p, id);
    } else {
        set_state(p, id, SHM_PAGE_FREE);
        free_push(p, id);
    }
}

int worker_pages_lookup(worker_pages *p, const common_hash *hash)
{
    p->lookups++;
    int id = table_find(p, hash);
    if (id == NONE)
        return NONE;
    p->hits++;
    atomic_fetch_add_explicit(&p->rows[id].uses, 1, memory_order_relaxed);
    worker_pages_ref(p, id);
    return id;
}

bool worker_pages_publish(worker_pages *p, int id, const common_hash *hash,
                          const common_hash *parent)
{
    SHOAL_ASSERT(id >= 0 && id < p->count && refs_of(p, id) > 0);
    if (hashed(p, id) || table_find(p, hash) != NONE)
        return false;
    p->parents[id] = *parent;
    atomic_store_explicit(&p->rows[id].parent_key, common_hash_u64(parent), memory_order_relaxed);
    if (p->seg) {
        shm_segment_lock(p->seg);
        shm_index_insert(p->seg, p->worker, id, hash);
        shm_segment_unlock(p->seg);
    } else {
        p->rows[id].hash = *hash;
        atomic_fetch_or(&p->rows[id].flags, SHM_PAGE_HASHED);
    }
    table_insert(p, id);
    return true;
}

const shm_page_row *worker_pages_row(const worker_pages *p, int id)
{
    SHOAL_ASSERT(id >= 0 && id < p->count);
    return &p->rows[id];
}

void worker_pages_mark_stored(worker_pages *p, int id, bool stored)
{
    SHOAL_ASSERT(id >= 0 && id < p->count);
    if (stored)
        atomic_fetch_or(&p->rows[id].flags, SHM_PAGE_STORED);
    else
        atomic_fetch_and(&p->rows[id].flags, ~(uint32_t)SHM_PAGE_STORED);
}

void worker_pages_each_published(const worker_pages *p,
                                 void (*fn)(void *ctx, int page, const common_hash *hash,
                                            const common_hash *parent),
                                 void *ctx)
{
    for (int id = 0; id < p->count; id++)
        if (hashed(p, id))
            fn(ctx, id, &p->rows[id].hash, &p->parents[id]);
}

int worker_pages_refs(const worker_pages *p, int id)
{
    return refs_of(p, id);
}

void worker_pages_stats_get(const worker_pages *p, worker_pages_stats *out)
{
    out->total = p->count;
    out->free = p->free_count;
    out->cached = p->cached_count;
    out->active = p->count - p->free_count - p->cached_count;
    out->lookups = p->lookups;
    out->hits = p->hits;
    out->evictions = p->evictions;
    out->lease_skips = p->lease_skips;
}

bool worker_pages_check(const worker_pages *p, const int32_t *expected_refs, shoal_diag *diag)
{
    int free_seen = 0, lru_seen = 0, n_hashed = 0, in_table = 0;
    char *mark = calloc((size_t)p->count, 1); /* 1 free list, 2 LRU */
    bool ok = mark != NULL;
    for (int id = p->free_head; ok && id != NONE; id = p->links[id].next) {
        if (mark[id] || refs_of(p, id) != 0 || hashed(p, id) ||
            atomic_load(&p->rows[id].state) != SHM_PAGE_FREE)
            ok = !shoal_diag_set(diag, SHOAL_ERR_BROKEN, "page %d on the free list is in use", id);
        mark[id] = 1;
        free_seen++;
    }
    int prev = NONE;
    for (int id = p->lru_head; ok && id != NONE; id = p->links[id].next) {
        if (mark[id] || refs_of(p, id) != 0 || !hashed(p, id) || p->links[id].prev != prev ||
            atomic_load(&p->rows[id].state) != SHM_PAGE_CACHED)
            ok = !shoal_diag_set(diag, SHOAL_ERR_BROKEN, "page %d on the LRU list is broken", id);
        mark[id] = 2;
        prev = id;
        lru_seen++;
    }
    for (int id = 0; ok && id < p->count; id++) {
        n_hashed += hashed(p, id);
        if (!mark[id] && refs_of(p, id) <= 0)
            ok = !shoal_diag_set(diag, SHOAL_ERR_BROKEN, "page %d has no refs and no list", id);
        else if (!mark[id] && atomic_load(&p->rows[id].state) != SHM_PAGE_ACTIVE)
            ok = !shoal_diag_set(diag, SHOAL_ERR_BROKEN, "page %d is held but not active", id);
        else if (hashed(p, id) && table_find(p, &p->rows[id].hash) != id)
            ok = !shoal_diag_set(diag, SHOAL_ERR_BROKEN, "page %d is hashed but not found", id);
        else if (expected_refs && refs_of(p, id) != expected_refs[id])
            ok = !shoal_diag_set(diag, SHOAL_ERR_BROKEN, "page %d has %d refs, expected %d", id,
                                 refs_of(p, id), expected_refs[id]);
    }
    for (uint32_t s = 0; s <= p->mask; s++)
        in_table += p->table[s] != NONE;
    if (ok && (free_seen != p->free_count || lru_seen != p->cached_count || in_table != n_hashed))
        ok = !shoal_diag_set(diag, SHOAL_ERR_BROKEN,
                             "counts disagree: free %d/%d, cached %d/%d, table %d/%d", free_seen,
                             p->free_count, lru_seen, p->cached_count, in_table, n_hashed);
    free(mark);
    return ok;
}
