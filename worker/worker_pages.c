#include "worker_pages.h"

#include "common/common_assert.h"

#include <stdlib.h>
#include <string.h>

enum { NONE = -1 };

typedef struct page {
    int32_t refs;
    bool hashed;
    int32_t prev, next; /* free list (next only) or LRU list of cached pages */
    uint64_t last_use;
    common_hash hash;
} page;

struct worker_pages {
    int count;
    page *pages;
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
    uint64_t lookups, hits, evictions;
};

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
        if (common_hash_equal(&p->pages[id].hash, h))
            return id;
    }
}

static void table_insert(worker_pages *p, int id)
{
    uint32_t s = slot_of(p, &p->pages[id].hash);
    while (p->table[s] != NONE)
        s = (s + 1) & p->mask;
    p->table[s] = id;
}

static void table_remove(worker_pages *p, int id)
{
    uint32_t s = slot_of(p, &p->pages[id].hash);
    while (p->table[s] != id) {
        SHOAL_ASSERT(p->table[s] != NONE);
        s = (s + 1) & p->mask;
    }
    /* Shift later entries of the run back so no probe sequence breaks. */
    uint32_t hole = s;
    for (uint32_t t = (s + 1) & p->mask; p->table[t] != NONE; t = (t + 1) & p->mask) {
        uint32_t home = slot_of(p, &p->pages[p->table[t]].hash);
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
    page *g = &p->pages[id];
    if (g->prev != NONE)
        p->pages[g->prev].next = g->next;
    else
        p->lru_head = g->next;
    if (g->next != NONE)
        p->pages[g->next].prev = g->prev;
    else
        p->lru_tail = g->prev;
    g->prev = g->next = NONE;
    p->cached_count--;
}

static void lru_push(worker_pages *p, int id)
{
    page *g = &p->pages[id];
    g->prev = p->lru_tail;
    g->next = NONE;
    if (p->lru_tail != NONE)
        p->pages[p->lru_tail].next = id;
    else
        p->lru_head = id;
    p->lru_tail = id;
    p->cached_count++;
}

static void free_push(worker_pages *p, int id)
{
    p->pages[id].next = p->free_head;
    p->pages[id].prev = NONE;
    p->free_head = id;
    p->free_count++;
}

shoal_err worker_pages_open(int count, worker_pages **out)
{
    *out = NULL;
    if (count < 1 || count > (1 << 28))
        return SHOAL_ERR_INVALID;
    worker_pages *p = calloc(1, sizeof *p);
    if (!p)
        return SHOAL_ERR_NOMEM;
    uint32_t slots = 2;
    while (slots < 2u * (uint32_t)count)
        slots <<= 1;
    p->count = count;
    p->mask = slots - 1;
    p->pages = calloc((size_t)count, sizeof *p->pages);
    p->table = malloc((size_t)slots * sizeof *p->table);
    if (!p->pages || !p->table) {
        worker_pages_close(p);
        return SHOAL_ERR_NOMEM;
    }
    memset(p->table, 0xff, (size_t)slots * sizeof *p->table); /* NONE */
    p->free_head = p->lru_head = p->lru_tail = NONE;
    /* lowest ids first, so a fresh pool hands out 0, 1, 2, ... */
    for (int i = count - 1; i >= 0; i--)
        free_push(p, i);
    *out = p;
    return SHOAL_OK;
}

void worker_pages_close(worker_pages *p)
{
    if (!p)
        return;
    free(p->pages);
    free(p->table);
    free(p);
}

int worker_pages_alloc(worker_pages *p)
{
    int id;
    if (p->free_head != NONE) {
        id = p->free_head;
        p->free_head = p->pages[id].next;
        p->free_count--;
    } else if (p->lru_head != NONE) {
        id = p->lru_head;
        lru_unlink(p, id);
        table_remove(p, id);
        p->pages[id].hashed = false;
        p->evictions++;
    } else {
        return NONE;
    }
    page *g = &p->pages[id];
    g->refs = 1;
    g->prev = g->next = NONE;
    g->last_use = ++p->clock;
    return id;
}

int worker_pages_available(const worker_pages *p)
{
    return p->free_count + p->cached_count;
}

void worker_pages_ref(worker_pages *p, int id)
{
    SHOAL_ASSERT(id >= 0 && id < p->count);
    page *g = &p->pages[id];
    if (g->refs == 0) {
        SHOAL_ASSERT(g->hashed); /* a free page is never referenced */
        lru_unlink(p, id);
    }
    g->refs++;
    g->last_use = ++p->clock;
}

void worker_pages_unref(worker_pages *p, int id)
{
    SHOAL_ASSERT(id >= 0 && id < p->count && p->pages[id].refs > 0);
    page *g = &p->pages[id];
    if (--g->refs > 0)
        return;
    g->last_use = ++p->clock;
    if (g->hashed)
        lru_push(p, id);
    else
        free_push(p, id);
}

int worker_pages_lookup(worker_pages *p, const common_hash *hash)
{
    p->lookups++;
    int id = table_find(p, hash);
    if (id == NONE)
        return NONE;
    p->hits++;
    worker_pages_ref(p, id);
    return id;
}

bool worker_pages_publish(worker_pages *p, int id, const common_hash *hash)
{
    SHOAL_ASSERT(id >= 0 && id < p->count && p->pages[id].refs > 0);
    page *g = &p->pages[id];
    if (g->hashed || table_find(p, hash) != NONE)
        return false;
    g->hash = *hash;
    g->hashed = true;
    table_insert(p, id);
    return true;
}

int worker_pages_refs(const worker_pages *p, int id)
{
    return p->pages[id].refs;
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
}

bool worker_pages_check(const worker_pages *p, const int32_t *expected_refs, shoal_diag *diag)
{
    int free_seen = 0, lru_seen = 0, hashed = 0, in_table = 0;
    char *mark = calloc((size_t)p->count, 1); /* 1 free list, 2 LRU */
    bool ok = mark != NULL;
    for (int id = p->free_head; ok && id != NONE; id = p->pages[id].next) {
        if (mark[id] || p->pages[id].refs != 0 || p->pages[id].hashed)
            ok = !shoal_diag_set(diag, SHOAL_ERR_BROKEN, "page %d on the free list is in use", id);
        mark[id] = 1;
        free_seen++;
    }
    int prev = NONE;
    for (int id = p->lru_head; ok && id != NONE; id = p->pages[id].next) {
        if (mark[id] || p->pages[id].refs != 0 || !p->pages[id].hashed || p->pages[id].prev != prev)
            ok = !shoal_diag_set(diag, SHOAL_ERR_BROKEN, "page %d on the LRU list is broken", id);
        mark[id] = 2;
        prev = id;
        lru_seen++;
    }
    for (int id = 0; ok && id < p->count; id++) {
        const page *g = &p->pages[id];
        hashed += g->hashed;
        if (!mark[id] && g->refs <= 0)
            ok = !shoal_diag_set(diag, SHOAL_ERR_BROKEN, "page %d has no refs and no list", id);
        else if (g->hashed && table_find(p, &g->hash) != id)
            ok = !shoal_diag_set(diag, SHOAL_ERR_BROKEN, "page %d is hashed but not found", id);
        else if (expected_refs && g->refs != expected_refs[id])
            ok = !shoal_diag_set(diag, SHOAL_ERR_BROKEN, "page %d has %d refs, expected %d", id,
                                 g->refs, expected_refs[id]);
    }
    for (uint32_t s = 0; s <= p->mask; s++)
        in_table += p->table[s] != NONE;
    if (ok && (free_seen != p->free_count || lru_seen != p->cached_count || in_table != hashed))
        ok = !shoal_diag_set(diag, SHOAL_ERR_BROKEN,
                             "counts disagree: free %d/%d, cached %d/%d, table %d/%d", free_seen,
                             p->free_count, lru_seen, p->cached_count, in_table, hashed);
    free(mark);
    return ok;
}
