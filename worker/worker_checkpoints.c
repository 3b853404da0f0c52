#include "worker_checkpoints.h"

#include <stdlib.h>
#include <string.h>

enum { NONE = -1 };

typedef struct entry {
    common_hash hash;
    bool held;
    bool keep;   /* a turn's: the store keeps it when it leaves */
    bool stored; /* the store has it already */
    int prev, next; /* LRU list of held entries: head the oldest */
    int chain;      /* next held entry in the same bucket */
} entry;

struct worker_checkpoints {
    int first_slot, count;
    entry *e;
    int *buckets;
    uint32_t mask;
    int lru_head, lru_tail;
    int free_head; /* free entries, linked through chain */
    int held;
    uint64_t added, hits, evictions, dropped;
    worker_checkpoints_evict_fn on_evict;
    void *on_evict_ctx;
};

static uint32_t bucket_of(const worker_checkpoints *c, const common_hash *h)
{
    uint32_t x;
    memcpy(&x, h->bytes, sizeof x); /* a SHA-256 prefix: uniform already */
    return x & c->mask;
}

shoal_err worker_checkpoints_open(int first_slot, int count, worker_checkpoints **out)
{
    *out = NULL;
    if (first_slot < 0 || count < 0)
        return SHOAL_ERR_INVALID;
    worker_checkpoints *c = calloc(1, sizeof *c);
    if (!c)
        return SHOAL_ERR_NOMEM;
    uint32_t nb = 1;
    while (nb < 2u * (uint32_t)count)
        nb *= 2;
    c->first_slot = first_slot;
    c->count = count;
    c->mask = nb - 1;
    c->e = calloc((size_t)(count > 0 ? count : 1), sizeof *c->e);
    c->buckets = malloc((size_t)nb * sizeof *c->buckets);
    if (!c->e || !c->buckets) {
        worker_checkpoints_close(c);
        return SHOAL_ERR_NOMEM;
    }
    for (uint32_t i = 0; i < nb; i++)
        c->buckets[i] = NONE;
    c->lru_head = c->lru_tail = NONE;
    c->free_head = count > 0 ? 0 : NONE;
    for (int i = 0; i < count; i++)
        c->e[i].chain = i + 1 < count ? i + 1 : NONE;
    *out = c;
    return SHOAL_OK;
}

void worker_checkpoints_close(worker_checkpoints *c)
{
    if (!c)
        return;
    free(c->e);
    free(c->buckets);
    free(c);
}

static void lru_unlink(worker_checkpoints *c, int i)
{
    entry *x = &c->e[i];
    if (x->prev != NONE)
        c->e[x->prev].next = x->next;
    else
        c->lru_head = x->next;
    if (x->next != NONE)
        c->e[x->next].prev = x->prev;
    else
        c->lru_tail = x->prev;
    x->prev = x->next = NONE;
}

static void lru_push(worker_checkpoints *c, int i)
{
    entry *x = &c->e[i];
    x->prev = c->lru_tail;
    x->next = NONE;
    if (c->lru_tail != NONE)
        c->e[c->lru_tail].next = i;
    else
        c->lru_head = i;
    c->lru_tail = i;
}

static int find_entry(const worker_checkpoints *c, const common_hash *h)
{
    if (c->count == 0)
        return NONE;
    for (int i = c->buckets[bucket_of(c, h)]; i != NONE; i = c->e[i].chain)
        if (common_hash_equal(&c->e[i].hash, h))
            return i;
    return NONE;
}

/* Unlinks held entry i from its bucket and the LRU list, onto the free list. */
static void release(worker_checkpoints *c, int i)
{
    int *at = &c->buckets[bucket_of(c, &c->e[i].hash)];
    while (*at != i)
        at = &c->e[*at].chain;
    *at = c->e[i].chain;
    lru_unlink(c, i);
    c->e[i].held = false;
    c->e[i].chain = c->free_head;
    c->free_head = i;
    c->held--;
}

int worker_checkpoints_find(worker_checkpoints *c, const common_hash *hash, bool count_hit)
{
    int i = find_entry(c, hash);
    if (i == NONE)
        return -1;
    lru_unlink(c, i);
    lru_push(c, i);
    if (count_hit)
        c->hits++;
    return c->first_slot + i;
}

void worker_checkpoints_on_evict(worker_checkpoints *c, worker_checkpoints_evict_fn fn,
                                 void *ctx)
{
    c->on_evict = fn;
    c->on_evict_ctx = ctx;
}

/* Entry i leaves for room or with its page: the hook sees a kept one the
 * store lacks while its slot still holds it. */
static void evict(worker_checkpoints *c, int i)
{
    const entry *x = &c->e[i];
    if (c->on_evict && x->keep && !x->stored)
        c->on_evict(c->on_evict_ctx, &x->hash, c->first_slot + i);
    release(c, i);
}

int worker_checkpoints_add(worker_checkpoints *c, const common_hash *hash, bool keep)
{
    if (c->count == 0 || find_entry(c, hash) != NONE)
        return -1;
    if (c->free_head == NONE) {
        evict(c, c->lru_head);
        c->evictions++;
    }
    int i = c->free_head;
    c->free_head = c->e[i].chain;
    entry *x = &c->e[i];
    x->hash = *hash;
    x->held = true;
    x->keep = keep;
    x->stored = false;
    uint32_t b = bucket_of(c, hash);
    x->chain = c->buckets[b];
    c->buckets[b] = i;
    lru_push(c, i);
    c->held++;
    c->added++;
    return c->first_slot + i;
}

void worker_checkpoints_drop(worker_checkpoints *c, const common_hash *hash)
{
    int i = find_entry(c, hash);
    if (i != NONE) {
        release(c, i);
        c->dropped++;
    }
}

void worker_checkpoints_evict(worker_checkpoints *c, const common_hash *hash)
{
    int i = find_entry(c, hash);
    if (i != NONE) {
        evict(c, i);
        c->dropped++;
    }
}

void worker_checkpoints_mark_stored(worker_checkpoints *c, const common_hash *hash)
{
    int i = find_entry(c, hash);
    if (i != NONE)
        c->e[i].stored = true;
}

int worker_checkpoints_each_unstored(worker_checkpoints *c, worker_checkpoints_evict_fn fn,
                                     void *ctx)
{
    int n = 0;
    for (int i = c->lru_head; i != NONE; i = c->e[i].next)
        if (c->e[i].keep && !c->e[i].stored) {
            fn(ctx, &c->e[i].hash, c->first_slot + i);
            n++;
        }
    return n;
}

void worker_checkpoints_stats_get(const worker_checkpoints *c, worker_checkpoints_stats *out)
{
    out->capacity = c->count;
    out->held = c->held;
    out->added = c->added;
    out->hits = c->hits;
    out->evictions = c->evictions;
    out->dropped = c->dropped;
}

bool worker_checkpoints_check(const worker_checkpoints *c, shoal_diag *diag)
{
    int in_lru = 0, in_free = 0, in_buckets = 0;
    for (int i = c->lru_head, prev = NONE; i != NONE; prev = i, i = c->e[i].next) {
        if (!c->e[i].held || c->e[i].prev != prev || ++in_lru > c->count) {
            shoal_diag_set(diag, SHOAL_ERR_BROKEN, "checkpoints: LRU list broken at %d", i);
            return false;
        }
    }
    for (int i = c->free_head; i != NONE; i = c->e[i].chain)
        if (c->e[i].held || ++in_free > c->count) {
            shoal_diag_set(diag, SHOAL_ERR_BROKEN, "checkpoints: free list broken at %d", i);
            return false;
        }
    for (uint32_t b = 0; c->count > 0 && b <= c->mask; b++)
        for (int i = c->buckets[b]; i != NONE; i = c->e[i].chain)
            if (!c->e[i].held || bucket_of(c, &c->e[i].hash) != b ||
                find_entry(c, &c->e[i].hash) != i || ++in_buckets > c->count) {
                shoal_diag_set(diag, SHOAL_ERR_BROKEN, "checkpoints: bucket %u broken at entry %d",
                               b, i);
                return false;
            }
    if (in_lru != c->held || in_buckets != c->held || in_free != c->count - c->held) {
        shoal_diag_set(diag, SHOAL_ERR_BROKEN,
                       "checkpoints: %d held, but %d on the LRU list, %d in buckets, %d free of "
                       "%d",
                       c->held, in_lru, in_buckets, in_free, c->count);
        return false;
    }
    return true;
}
