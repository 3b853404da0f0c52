#include "worker_states.h"

#include "common/common_limits.h"
#include "common/common_log.h"
#include "common/common_pool.h"
#include "common/common_time.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct worker_states {
    worker_model *m;
    kernels_backend *be;
    uint8_t *arena; /* the model's KV arena (device) */
    size_t page_bytes;
    int page_tokens;
    uint64_t spill_bytes;
    store_state *store;
    common_pool *pool; /* reads of one restore run, in parallel */
    /* Staging: `slots` host buffers of page_bytes for the reads of a
     * restore run, and one for spills (the eviction hook runs inside
     * worker_pages_alloc, which a restore calls between its reads'
     * uploads, so the two never share a buffer). */
    int slots;
    uint8_t *staging;
    size_t staging_bytes;
    bool pinned; /* staging is pinned: uploads are async, sync before reuse */
    uint8_t *spill_buf;
    /* One restore chunk: what each slot's read gave. */
    const common_hash *chunk_hashes;
    shoal_err *chunk_err;
    int *chunk_tokens;
    worker_pages *evict_pages; /* the pool the spill hook serves */
    worker_states_stats stats;
};

shoal_err worker_states_open(const worker_states_options *o, worker_model *m, worker_states **out,
                             shoal_diag *diag)
{
    *out = NULL;
    worker_states *st = calloc(1, sizeof *st);
    if (!st)
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM, "state store: no memory");
    const kernels_kv_layout *kv = worker_model_kv_layout(m);
    st->m = m;
    st->be = worker_model_backend(m);
    st->arena = worker_model_arena(m);
    st->page_bytes = kv->page_bytes;
    st->page_tokens = kv->page_tokens;
    st->spill_bytes = o->spill_bytes;
    shoal_err err;
    int threads = o->read_threads;
    if (threads <= 0) { /* reads run while the engine waits for them: use the cores */
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 32 ? 32 : n > 1 ? (int)n : 1;
    }
    if (threads > SHOAL_STATES_READ_THREADS_MAX)
        threads = SHOAL_STATES_READ_THREADS_MAX;
    /* A chunk of reads: at least one page a thread, as many as the staging
     * bound allows beyond that (more pages in flight per wake-up). */
    size_t cap = SHOAL_STATES_STAGING_BYTES_MAX / st->page_bytes;
    st->slots = cap < (size_t)threads ? threads : (int)(cap < 64 ? cap : 64);
    store_state_options so = {
        .dir = o->dir, .spill_bytes = o->spill_bytes, .fingerprint = *worker_model_fingerprint(m)};
    so.layout = (store_page_layout){.page_tokens = kv->page_tokens,
                                    .layers = kv->layers,
                                    .kv_heads = kv->kv_heads,
                                    .head_dim = kv->head_dim,
                                    .dtype = kv->dtype,
                                    .page_bytes = kv->page_bytes};
    if ((err = store_state_open(&so, &st->store, diag)))
        goto out_close;
    st->staging_bytes = ((size_t)st->slots * st->page_bytes + 4095) / 4096 * 4096;
    st->staging = aligned_alloc(4096, st->staging_bytes);
    st->spill_buf = aligned_alloc(4096, (st->page_bytes + 4095) / 4096 * 4096);
    st->chunk_err = calloc((size_t)st->slots, sizeof *st->chunk_err);
    st->chunk_tokens = calloc((size_t)st->slots, sizeof *st->chunk_tokens);
    if (!st->staging || !st->spill_buf || !st->chunk_err || !st->chunk_tokens) {
        err = shoal_diag_set(diag, SHOAL_ERR_NOMEM,
                             "state store: no memory for %d staging pages of %zu bytes", st->slots,
                             st->page_bytes);
        goto out_close;
    }
    /* pinned staging: uploads at the link's speed instead of through the
     * driver's bounce buffer */
    st->pinned = st->be->host_pin(st->be, st->staging, st->staging_bytes) == SHOAL_OK;
    if ((err = common_pool_open(threads, &st->pool))) {
        shoal_diag_set(diag, err, "state store: cannot start %d reader threads", threads);
        goto out_close;
    }
    LOG_INFO("state store %s: learning conversations (spill limit %.2f GiB, pages of %zu "
             "bytes, %d reader threads)",
             o->dir, (double)o->spill_bytes / (1ull << 30), st->page_bytes, threads);
    *out = st;
    return SHOAL_OK;
out_close:
    worker_states_close(st);
    return err;
}

void worker_states_close(worker_states *st)
{
    if (!st)
        return;
    common_pool_close(st->pool);
    store_state_close(st->store);
    if (st->pinned)
        st->be->host_unpin(st->be, st->staging);
    free(st->staging);
    free(st->spill_buf);
    free(st->chunk_err);
    free(st->chunk_tokens);
    free(st);
}

store_state *worker_states_store(worker_states *st)
{
    return st->store;
}

/* ---- restore ---- */

static void read_one(void *ctx, int task, int thread)
{
    (void)thread;
    worker_states *st = ctx;
    /* The reason of a refusal is logged (once) and counted by the store. */
    st->chunk_err[task] = store_state_get(st->store, &st->chunk_hashes[task],
                                          st->staging + (size_t)task * st->page_bytes,
                                          st->page_bytes, &st->chunk_tokens[task], NULL);
}

/* Puts the read page of slot `slot` into a new page of the pool as block
 * `hash`: -1 when no page is left or the upload failed. */
static int place(worker_states *st, worker_pages *pages, uint64_t stream, int slot,
                 const common_hash *hash, const common_hash *parent)
{
    int page = worker_pages_alloc(pages, stream);
    if (page < 0)
        return -1;
    shoal_err err = st->be->upload(st->be, st->arena + (size_t)page * st->page_bytes,
                                   st->staging + (size_t)slot * st->page_bytes, st->page_bytes);
    if (err) {
        LOG_ERROR("state store: uploading a restored page failed: %s", shoal_strerror(err));
        worker_pages_unref(pages, page); /* no hash: it goes back to the free list */
        return -1;
    }
    if (!worker_pages_publish(pages, page, hash, parent)) {
        /* Already cached here (a later block survived an eviction that took
         * an earlier one): take that page instead of a second copy. */
        worker_pages_unref(pages, page);
        return worker_pages_lookup(pages, hash);
    }
    worker_pages_mark_stored(pages, page, true);
    return page;
}

static int restore_fill(void *ctx, worker_pages *pages, uint64_t stream, const common_hash *hashes,
                        const common_hash *parent, int n, int32_t *pages_out)
{
    worker_states *st = ctx;
    uint64_t t0 = common_mono_ns();
    int stored = 0, done = 0;
    shoal_diag diag;
    if (store_state_lookup(st->store, hashes, n, &stored, &diag) != SHOAL_OK) {
        LOG_WARN("state store: lookup failed: %s", diag.msg);
        stored = 0;
    }
    bool stop = false;
    while (done < stored && !stop) {
        int c = stored - done < st->slots ? stored - done : st->slots;
        st->chunk_hashes = hashes + done;
        common_pool_run(st->pool, c, read_one, st);
        for (int j = 0; j < c; j++)
            st->stats.refused += st->chunk_err[j] == SHOAL_ERR_FORMAT;
        for (int j = 0; j < c; j++) {
            if (st->chunk_err[j] != SHOAL_OK || st->chunk_tokens[j] != st->page_tokens) {
                /* Refused (counted by the store), evicted since the lookup,
                 * or a partial block: the engine computes from here. */
                st->stats.restore_stops++;
                stop = true;
                break;
            }
            const common_hash *par = done == 0 ? parent : &hashes[done - 1];
            int page = place(st, pages, stream, j, &hashes[done], par);
            if (page < 0) {
                stop = true;
                break;
            }
            pages_out[done++] = page;
            st->stats.restored_pages++;
            st->stats.restore_bytes += st->page_bytes;
        }
        /* the next chunk's reads overwrite the staging that pinned uploads
         * may still read */
        if (st->pinned)
            st->be->sync(st->be);
    }
    if (!stop && stored < n) {
        /* lookup stops silently at a record whose header is another
         * model's or layout's; a get of it counts and logs the refusal
         * (and is a quick miss when the chain simply ends here). */
        st->chunk_hashes = hashes + stored;
        read_one(st, 0, 0);
        if (st->chunk_err[0] == SHOAL_ERR_FORMAT) {
            st->stats.refused++;
            st->stats.restore_stops++;
        }
    }
    st->stats.restore_ns += common_mono_ns() - t0;
    return done;
}

worker_prefix_source worker_states_restore_source(worker_states *st)
{
    return (worker_prefix_source){.fill = restore_fill, .ctx = st};
}

/* ---- spill ---- */

/* Queues page `page` as block `hash`. SHOAL_ERR_LIMIT: the queue is full. */
static shoal_err put_page(worker_states *st, worker_pages *pages, int page, const common_hash *hash,
                          const common_hash *parent)
{
    shoal_err err = st->be->download(st->be, st->spill_buf,
                                     st->arena + (size_t)page * st->page_bytes, st->page_bytes);
    if (err) {
        LOG_ERROR("state store: downloading a page failed: %s", shoal_strerror(err));
        return err;
    }
    err = store_state_put_async(st->store, hash, parent, st->page_tokens, st->spill_buf,
                                st->page_bytes);
    if (err == SHOAL_OK)
        worker_pages_mark_stored(pages, page, true);
    return err;
}

static void on_evict(void *ctx, int page, const common_hash *hash, const common_hash *parent)
{
    worker_states *st = ctx;
    worker_pages *pages = st->evict_pages;
    if (atomic_load(&worker_pages_row(pages, page)->flags) & SHM_PAGE_STORED) {
        st->stats.spill_skipped++;
        return;
    }
    shoal_err err = put_page(st, pages, page, hash, parent);
    if (err == SHOAL_OK)
        st->stats.spilled_pages++;
    else if (err == SHOAL_ERR_LIMIT)
        st->stats.spill_drops++; /* the store counts it too; the page is recomputed later */
}

void worker_states_attach(worker_states *st, worker_pages *pages)
{
    st->evict_pages = pages;
    worker_pages_on_evict(pages, on_evict, st);
}

/* ---- write at shutdown ---- */

typedef struct unstored {
    int page;
    uint64_t last_use;
    common_hash hash, parent;
} unstored;

typedef struct collect {
    worker_pages *pages;
    unstored *list;
    int n;
} collect;

static void collect_one(void *ctx, int page, const common_hash *hash, const common_hash *parent)
{
    collect *c = ctx;
    const shm_page_row *row = worker_pages_row(c->pages, page);
    if (atomic_load(&row->flags) & SHM_PAGE_STORED)
        return;
    c->list[c->n++] = (unstored){page, atomic_load(&row->last_use), *hash, *parent};
}

static int by_last_use(const void *a, const void *b)
{
    uint64_t x = ((const unstored *)a)->last_use, y = ((const unstored *)b)->last_use;
    return (x > y) - (x < y);
}

/* The remaining milliseconds before deadline_ns (-1: none). */
static int left_ms(uint64_t deadline_ns)
{
    if (!deadline_ns)
        return -1;
    uint64_t now = common_mono_ns();
    return now >= deadline_ns ? 0 : (int)((deadline_ns - now) / 1000000);
}

shoal_err worker_states_write_all(worker_states *st, worker_pages *pages, int timeout_ms,
                                  int *written, shoal_diag *diag)
{
    if (written)
        *written = 0;
    worker_pages_stats ps;
    worker_pages_stats_get(pages, &ps);
    collect c = {.pages = pages,
                 .list = malloc((size_t)(ps.total > 0 ? ps.total : 1) * sizeof *c.list)};
    if (!c.list)
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM, "state store: no memory to list pages");
    worker_pages_each_published(pages, collect_one, &c);
    qsort(c.list, (size_t)c.n, sizeof *c.list, by_last_use);
    /* Past spill_bytes the store would evict what this very call wrote:
     * keep the newest. */
    int first = 0;
    uint64_t room = st->spill_bytes / st->page_bytes;
    if ((uint64_t)c.n > room)
        first = c.n - (int)room;
    uint64_t t0 = common_mono_ns(), last_log = t0;
    uint64_t deadline = timeout_ms < 0 ? 0 : t0 + (uint64_t)timeout_ms * 1000000ull;
    shoal_err err = SHOAL_OK;
    int done = 0, total = c.n - first;
    if (total > 0)
        LOG_INFO("state store: writing %d learned pages (%.1f MiB)%s", total,
                 (double)total * (double)st->page_bytes / 1048576.0,
                 first ? ", the newest that fit under --spill-gib" : "");
    for (int i = first; i < c.n; i++) {
        const unstored *u = &c.list[i];
        for (;;) {
            err = put_page(st, pages, u->page, &u->hash, &u->parent);
            if (err != SHOAL_ERR_LIMIT)
                break;
            /* The queue is full: at shutdown we wait for the disk. */
            int ms = left_ms(deadline);
            if (ms == 0) {
                err = SHOAL_ERR_TIMEOUT;
                break;
            }
            store_state_flush(st->store, ms < 0 || ms > 1000 ? 1000 : ms);
        }
        if (err == SHOAL_ERR_TIMEOUT)
            break;
        if (err != SHOAL_OK) { /* the device or the store broke: logged */
            free(c.list);
            return shoal_diag_set(diag, err,
                                  "state store: writing learned pages failed after "
                                  "%d of %d: %s",
                                  done, total, shoal_strerror(err));
        }
        done++;
        uint64_t now = common_mono_ns();
        if (now - last_log > 2000000000ull) {
            LOG_INFO("state store: %d of %d pages written", done, total);
            last_log = now;
        }
    }
    free(c.list);
    st->stats.written_pages += (uint64_t)done;
    if (written)
        *written = done;
    if (err != SHOAL_ERR_TIMEOUT) {
        int ms = left_ms(deadline);
        err = ms == 0 ? SHOAL_ERR_TIMEOUT : store_state_flush(st->store, ms);
    }
    if (err == SHOAL_ERR_TIMEOUT)
        return shoal_diag_set(diag, err,
                              "state store: %d of %d learned pages queued when %d ms ran out; "
                              "the rest are recomputed after the restart",
                              done, total, timeout_ms);
    if (total > 0)
        LOG_INFO("state store: %d learned pages written in %.1f s", done,
                 (double)(common_mono_ns() - t0) / 1e9);
    return SHOAL_OK;
}

void worker_states_stats_get(worker_states *st, worker_states_stats *out)
{
    *out = st->stats;
}
