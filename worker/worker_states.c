#include "worker_states.h"

#include "common/common_assert.h"
#include "common/common_limits.h"
#include "common/common_log.h"
#include "common/common_time.h"

#include <pthread.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* A block of a restore job. */
enum {
    BLOCK_OPEN,
    BLOCK_READING,
    BLOCK_READ,
    BLOCK_READY,   /* read, uploaded, published */
    BLOCK_COMPUTE, /* claimed by the engine */
    BLOCK_FAILED,  /* refused by the store: the engine computes it */
    BLOCK_MISSING, /* not stored: the engine computes it */
};

/* One stream's restore (worker_async_source's job). Readers take its
 * blocks from the top down; the engine takes them from the bottom up.
 * A hybrid model's job has `parts` more items above its k blocks: the
 * parts of the state checkpoint at its last block, read into ckpt; it is
 * all or nothing (the engine computes none of it while it runs). */
typedef struct restore_job {
    struct restore_job *next; /* st->jobs, oldest first */
    worker_pages *pages;
    int32_t *pages_out; /* the stream's page table at the job's first block */
    common_hash *chain; /* the parent, then the job's k blocks: block b is chain[b + 1] */
    uint8_t *state;      /* BLOCK_* of each block */
    /* restore_end's lists of the blocks the engine computed: [k] each */
    int *computed;
    common_hash *computed_keys;
    int k;         /* blocks of the job: every candidate */
    int parts;     /* hybrids: state parts, items [k, k + parts) */
    uint8_t *ckpt; /* hybrids: the checkpoint, slot_bytes */
    common_hash ckpt_block; /* whose checkpoint is read (the job's last block) */
    bool failed;   /* hybrids: an item is missing or refused: the job is computed */
    int top;       /* the next item a reader may take, counting down */
    int holds;     /* slots that still name the job */
    bool ended;    /* the engine let go: nothing more goes into its pages */
    uint64_t t0;
    int reads;            /* reads finished */
    uint64_t last_read_ns; /* when the last one finished */
    bool warm;            /* in the page cache: read whole */
} restore_job;

/* Restore faults a test plants (SHOAL_TEST_RESTORE_FAULT, test builds):
 * a hybrid's KV restored without its state, or with the state of an
 * earlier block. */
enum { FAULT_NONE, FAULT_NO_STATE, FAULT_WRONG_BLOCK };

/* A staging buffer of one page. */
enum { SLOT_FREE, SLOT_READING, SLOT_READ, SLOT_PLACING, SLOT_INFLIGHT };

typedef struct slot {
    int state;
    restore_job *job;
    int block;
    shoal_err err;
    int tokens;
    size_t payload_at; /* where in the slot's buffer the page starts */
} slot;

struct worker_states {
    worker_model *m;
    kernels_backend *be;
    uint8_t *arena; /* the model's KV arena (device) */
    size_t page_bytes;
    int page_tokens;
    uint64_t spill_bytes;
    bool read_all;
    store_state *store;
    /* Staging: `slots` host buffers of slot_bytes (a stored record, with
     * room to read it with O_DIRECT) that readers fill and the engine's
     * pump uploads, and one for spills (the eviction hook runs inside
     * worker_pages_alloc on the engine's thread). */
    int slots;
    size_t slot_bytes;
    uint8_t *staging;
    size_t staging_bytes;
    bool pinned; /* staging is pinned: uploads are async, sync before reuse */
    uint8_t *spill_buf;
    /* Hybrids: the model's state slot bytes (0: none), its parts in the
     * store, a host buffer for a checkpoint's spill, and the table whose
     * checkpoints it spills. */
    size_t state_bytes;
    int parts;
    uint8_t *ckpt_buf;
    worker_checkpoints *ckpts;
    int fault; /* test builds: a planted restore fault (SHOAL_TEST_RESTORE_FAULT) */
    /* readers; everything below is under mu */
    pthread_t *threads;
    int n_threads;
    pthread_mutex_t mu;
    pthread_cond_t work; /* readers: a block to read and a free slot, or quit */
    pthread_cond_t done; /* the pump: a read finished */
    bool quit;
    slot *slot;
    int *placing; /* the pump's list of slots it uploads (its own, no mu) */
    restore_job *jobs;
    double disk_bps; /* blocks a second the readers delivered from disk (EWMA of
                        cold jobs; 0: none yet) */
    worker_pages *evict_pages; /* the pool the spill hook serves */
    worker_states_stats stats;
};

static void *reader_main(void *arg);

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
    st->read_all = o->read_all;
    pthread_mutex_init(&st->mu, NULL);
    pthread_cond_init(&st->work, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&st->done, &ca);
    pthread_condattr_destroy(&ca);
    shoal_err err;
    int threads = o->read_threads;
    if (threads <= 0) { /* cold reads wait on the disk: many in flight */
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 32 ? 32 : n > 1 ? (int)n : 1;
    }
    if (threads > SHOAL_STATES_READ_THREADS_MAX)
        threads = SHOAL_STATES_READ_THREADS_MAX;
    store_state_options so = {
        .dir = o->dir, .spill_bytes = o->spill_bytes, .fingerprint = *worker_model_fingerprint(m)};
    st->state_bytes = worker_model_slot_bytes(m);
    so.state_bytes = st->state_bytes;
    so.layout = (store_page_layout){.page_tokens = kv->page_tokens,
                                    .layers = kv->layers,
                                    .kv_heads = kv->kv_heads,
                                    .head_dim = kv->head_dim,
                                    .dtype = kv->dtype,
                                    .page_bytes = kv->page_bytes};
    if ((err = store_state_open(&so, &st->store, diag)))
        goto out_close;
    st->parts = store_state_checkpoint_parts(st->store);
    if (st->state_bytes > 0 && !(st->ckpt_buf = malloc(st->state_bytes))) {
        err = shoal_diag_set(diag, SHOAL_ERR_NOMEM,
                             "state store: no memory for a state checkpoint of %zu bytes",
                             st->state_bytes);
        goto out_close;
    }
#ifdef SHOAL_TESTING /* a test's fault: test builds only */
    const char *fault = getenv("SHOAL_TEST_RESTORE_FAULT");
    st->fault = !fault                          ? FAULT_NONE
                : strcmp(fault, "no-state") == 0 ? FAULT_NO_STATE
                : strcmp(fault, "wrong-block") == 0 ? FAULT_WRONG_BLOCK
                                                    : FAULT_NONE;
#endif
    st->slot_bytes = (store_state_read_bytes(st->store) + 4095) / 4096 * 4096;
    size_t cap = SHOAL_STATES_STAGING_BYTES_MAX / st->slot_bytes;
    if (cap > SHOAL_STATES_STAGING_PAGES_MAX)
        cap = SHOAL_STATES_STAGING_PAGES_MAX;
    st->slots = cap < (size_t)threads ? threads : (int)cap;
    st->staging_bytes = (size_t)st->slots * st->slot_bytes;
    st->staging = aligned_alloc(4096, st->staging_bytes);
    st->spill_buf = aligned_alloc(4096, (st->page_bytes + 4095) / 4096 * 4096);
    st->slot = calloc((size_t)st->slots, sizeof *st->slot);
    st->placing = calloc((size_t)st->slots, sizeof *st->placing);
    st->threads = calloc((size_t)threads, sizeof *st->threads);
    if (!st->staging || !st->spill_buf || !st->slot || !st->placing || !st->threads) {
        err = shoal_diag_set(diag, SHOAL_ERR_NOMEM,
                             "state store: no memory for %d staging pages of %zu bytes", st->slots,
                             st->page_bytes);
        goto out_close;
    }
    /* pinned staging: uploads at the link's speed instead of through the
     * driver's bounce buffer */
    st->pinned = st->be->host_pin(st->be, st->staging, st->staging_bytes) == SHOAL_OK;
    for (; st->n_threads < threads; st->n_threads++)
        if (pthread_create(&st->threads[st->n_threads], NULL, reader_main, st) != 0) {
            err = shoal_diag_set(diag, SHOAL_ERR_NOMEM,
                                 "state store: cannot start %d reader threads", threads);
            goto out_close;
        }
    LOG_INFO("state store %s: learning conversations (spill limit %.2f GiB, pages of %zu "
             "bytes, %d reader threads, %d staging pages, restores %s)",
             o->dir, (double)o->spill_bytes / (1ull << 30), st->page_bytes, threads, st->slots,
             st->state_bytes ? "read every block and the state checkpoint at its end"
             : st->read_all  ? "read every stored block"
                             : "overlap with computing the head");
    if (st->state_bytes)
        LOG_INFO("state store %s: a turn's state checkpoint is %d records (%.1f MiB)", o->dir,
                 st->parts, (double)st->state_bytes / 1048576.0);
    *out = st;
    return SHOAL_OK;
out_close:
    worker_states_close(st);
    return err;
}

static void job_free(restore_job *j)
{
    if (j) {
        free(j->chain);
        free(j->state);
        free(j->computed);
        free(j->computed_keys);
        free(j->ckpt);
        free(j);
    }
}

/* Takes an ended job nobody holds off the list and frees it. Under mu. */
static void job_unlink_free(worker_states *st, restore_job *j)
{
    restore_job **p = &st->jobs;
    while (*p != j)
        p = &(*p)->next;
    *p = j->next;
    job_free(j);
}

void worker_states_close(worker_states *st)
{
    if (!st)
        return;
    pthread_mutex_lock(&st->mu);
    st->quit = true;
    pthread_cond_broadcast(&st->work);
    pthread_mutex_unlock(&st->mu);
    for (int i = 0; i < st->n_threads; i++)
        pthread_join(st->threads[i], NULL);
    while (st->jobs) {
        restore_job *j = st->jobs;
        st->jobs = j->next;
        job_free(j);
    }
    store_state_close(st->store);
    if (st->pinned) {
        st->be->sync(st->be); /* uploads from staging still in flight */
        st->be->host_unpin(st->be, st->staging);
    }
    free(st->staging);
    free(st->spill_buf);
    free(st->ckpt_buf);
    free(st->slot);
    free(st->placing);
    free(st->threads);
    pthread_cond_destroy(&st->work);
    pthread_cond_destroy(&st->done);
    pthread_mutex_destroy(&st->mu);
    free(st);
}

store_state *worker_states_store(worker_states *st)
{
    return st->store;
}

/* ---- restore ---- */

/* The next block to read and a free slot for it, or false. Under mu. */
static bool next_read(worker_states *st, restore_job **job, int *block, int *slot_index)
{
    int free_slot = -1;
    for (int i = 0; i < st->slots && free_slot < 0; i++)
        if (st->slot[i].state == SLOT_FREE)
            free_slot = i;
    if (free_slot < 0)
        return false;
    for (restore_job *j = st->jobs; j; j = j->next) {
        while (!j->ended && j->top >= 0 && j->state[j->top] != BLOCK_OPEN)
            j->top--; /* the engine claimed it */
        if (j->ended || j->top < 0 || j->failed)
            continue;
        *job = j;
        *block = j->top--;
        *slot_index = free_slot;
        return true;
    }
    return false;
}

static void *reader_main(void *arg)
{
    worker_states *st = arg;
    /* below the engine's thread, whose kernel launches the GPU waits for
     * while the readers check checksums on every core */
    if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), SHOAL_STATES_READER_NICE) != 0)
        LOG_DEBUG("state store: reader threads keep the default priority");
    pthread_mutex_lock(&st->mu);
    for (;;) {
        restore_job *j;
        int b, i;
        while (!st->quit && !next_read(st, &j, &b, &i))
            pthread_cond_wait(&st->work, &st->mu);
        if (st->quit)
            break;
        slot *sl = &st->slot[i];
        *sl = (slot){.state = SLOT_READING, .job = j, .block = b};
        j->state[b] = BLOCK_READING;
        j->holds++;
        pthread_mutex_unlock(&st->mu);
        /* A refusal's reason is logged (once) and counted by the store. */
        int tokens = 0;
        size_t payload_at = 0;
        uint8_t *buf = st->staging + (size_t)i * st->slot_bytes;
        shoal_err err =
            b < j->k ? store_state_read(st->store, &j->chain[b + 1], buf, st->slot_bytes,
                                        &payload_at, &tokens, NULL)
                     : store_state_read_part(st->store, &j->ckpt_block, b - j->k, buf,
                                             st->slot_bytes, &payload_at, NULL);
        pthread_mutex_lock(&st->mu);
        sl->err = err;
        sl->tokens = tokens;
        sl->payload_at = payload_at;
        sl->state = SLOT_READ;
        j->state[b] = BLOCK_READ;
        if (err != SHOAL_ERR_NOT_FOUND) { /* a miss is a quick B-tree walk: not a read */
            j->reads++;
            j->last_read_ns = common_mono_ns();
        }
        pthread_cond_signal(&st->done);
    }
    pthread_mutex_unlock(&st->mu);
    return NULL;
}

/* Drops a slot's hold on its job; frees an ended job nobody holds. Under mu. */
static void slot_release(worker_states *st, slot *sl)
{
    restore_job *j = sl->job;
    sl->state = SLOT_FREE;
    sl->job = NULL;
    if (j && --j->holds == 0 && j->ended)
        job_unlink_free(st, j);
}

/* Uploads the page read into slot i as block b of job j and publishes it:
 * false when the upload failed. Engine thread, without mu. */
static bool place(worker_states *st, restore_job *j, int i, int b)
{
    int page = j->pages_out[b];
    shoal_err err = st->be->upload(st->be, st->arena + (size_t)page * st->page_bytes,
                                   st->staging + (size_t)i * st->slot_bytes +
                                       st->slot[i].payload_at,
                                   st->page_bytes);
    if (err) {
        LOG_ERROR("state store: uploading a restored page failed: %s", shoal_strerror(err));
        return false;
    }
    /* Another page may hold the block already (a stream computed it
     * meanwhile): this one then stays the stream's own, unpublished. */
    if (worker_pages_publish(j->pages, page, &j->chain[b + 1], &j->chain[b]))
        worker_pages_mark_stored(j->pages, page, true);
    return true;
}

static void restore_pump(void *ctx, int wait_ms)
{
    worker_states *st = ctx;
    pthread_mutex_lock(&st->mu);
    bool inflight = false, ready = false;
    for (int i = 0; i < st->slots; i++) {
        inflight |= st->slot[i].state == SLOT_INFLIGHT;
        ready |= st->slot[i].state == SLOT_READ;
    }
    if (!ready && wait_ms > 0) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += (long)wait_ms * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&st->done, &st->mu, &ts);
    }
    /* Uploads of the last pump have run: the step in between ended with a
     * sync, and this one makes sure. */
    if (inflight) {
        pthread_mutex_unlock(&st->mu);
        st->be->sync(st->be);
        pthread_mutex_lock(&st->mu);
        for (int i = 0; i < st->slots; i++)
            if (st->slot[i].state == SLOT_INFLIGHT)
                slot_release(st, &st->slot[i]);
    }
    int placing = 0;
    for (int i = 0; i < st->slots; i++) {
        slot *sl = &st->slot[i];
        if (sl->state != SLOT_READ)
            continue;
        restore_job *j = sl->job;
        if (j->ended) {
            slot_release(st, sl);
        } else if (sl->err == SHOAL_ERR_NOT_FOUND) {
            j->state[sl->block] = BLOCK_MISSING;
            j->failed = j->parts > 0;
            slot_release(st, sl);
        } else if (sl->err != SHOAL_OK || (sl->block < j->k && sl->tokens != st->page_tokens)) {
            /* Refused (counted by the store), or a partial block: the
             * engine computes it. */
            st->stats.refused += sl->err == SHOAL_ERR_FORMAT;
            st->stats.restore_stops++;
            j->state[sl->block] = BLOCK_FAILED;
            j->failed = j->parts > 0;
            slot_release(st, sl);
        } else if (sl->block >= j->k) { /* a state part: into the job's checkpoint */
            size_t at = (size_t)(sl->block - j->k) * st->page_bytes;
            size_t n = st->state_bytes - at < st->page_bytes ? st->state_bytes - at : st->page_bytes;
            memcpy(j->ckpt + at, st->staging + (size_t)i * st->slot_bytes + sl->payload_at, n);
            j->state[sl->block] = BLOCK_READY;
            slot_release(st, sl);
        } else {
            sl->state = SLOT_PLACING; /* readers leave it alone now */
            st->placing[placing++] = i;
        }
    }
    pthread_mutex_unlock(&st->mu);
    /* Jobs end only on this thread, so those being placed stay alive. */
    for (int p = 0; p < placing; p++) {
        int i = st->placing[p];
        slot *sl = &st->slot[i];
        bool ok = place(st, sl->job, i, sl->block);
        pthread_mutex_lock(&st->mu);
        sl->job->state[sl->block] = ok ? BLOCK_READY : BLOCK_FAILED;
        if (ok) {
            st->stats.restored_pages++;
            st->stats.restore_bytes += st->page_bytes;
        }
        if (ok && st->pinned)
            sl->state = SLOT_INFLIGHT; /* the upload may still read it */
        else
            slot_release(st, sl);
        pthread_mutex_unlock(&st->mu);
    }
    pthread_cond_broadcast(&st->work);
}

/* Of `open` blocks that both could take, how many the engine should
 * compute so that it and the readers finish together: a chunk of x costs
 * the engine F + x / c (F its fixed cost of a step, c its speed), the
 * readers take (open - x) / r, so x = (open - F r) c / (c + r), rounded
 * down (a block the readers would nearly have reached is theirs), and
 * none when the readers finish sooner than a step costs.
 * read_all computes none; an engine that has not measured its own speed
 * all it reaches; a history in the page cache (its first block tells) is
 * read whole (see SHOAL_STATES_DISK_PRIOR_BPS). From disk, the read speed
 * is this job's once four reads are in, else that of earlier cold jobs,
 * else SHOAL_STATES_DISK_PRIOR_BPS. Under mu. */
static int engine_share(const worker_states *st, const restore_job *j, int open,
                        worker_speed speed)
{
    if (st->read_all)
        return 0;
    double c = speed.bps;
    if (c <= 0)
        return open;
    if (j->warm)
        return 0;
    double r = st->disk_bps > 0 ? st->disk_bps : SHOAL_STATES_DISK_PRIOR_BPS / st->page_bytes;
    if (j->reads >= 4 && j->last_read_ns > j->t0)
        r = j->reads / ((double)(j->last_read_ns - j->t0) / 1e9);
    double x = (open - speed.fixed_s * r) * c / (c + r);
    return x > 0 ? (int)x : 0;
}

static restore_job *job_alloc(int n, int parts, size_t state_bytes)
{
    restore_job *j = calloc(1, sizeof *j);
    if (j) {
        j->chain = malloc((size_t)(n + 1) * sizeof *j->chain);
        j->state = calloc((size_t)(n + parts), 1);
        j->computed = malloc((size_t)n * sizeof *j->computed);
        j->computed_keys = malloc((size_t)n * sizeof *j->computed_keys);
        j->ckpt = state_bytes ? malloc(state_bytes) : NULL;
    }
    if (!j || !j->chain || !j->state || !j->computed || !j->computed_keys ||
        (state_bytes && !j->ckpt)) {
        job_free(j);
        LOG_WARN("state store: no memory for a restore of up to %d blocks; computing them", n);
        return NULL;
    }
    return j;
}

static void job_queue(worker_states *st, restore_job *j)
{
    restore_job **p = &st->jobs;
    while (*p)
        p = &(*p)->next;
    *p = j;
    pthread_cond_broadcast(&st->work);
}

/* A hybrid's restore: the blocks up to the last one whose checkpoint the
 * store has, each from this worker's cache or the store, and that
 * checkpoint. The state at a block's end needs every token before it run
 * through every layer, so nothing of the job is computed while it is read
 * (an overlap as pages have would recompute it all): the stream waits for
 * the reads, which run on every reader thread, parts and pages alike. */
static int restore_start_hybrid(worker_states *st, worker_pages *pages, uint64_t stream,
                                const common_hash *hashes, const common_hash *parent, int n,
                                int32_t *pages_out, void **job)
{
    int last = -1;
    shoal_diag diag;
    if (store_state_checkpoint_last(st->store, hashes, n, &last, &diag) != SHOAL_OK) {
        LOG_WARN("state store: lookup failed: %s", diag.msg);
        return 0;
    }
    if (last < 0)
        return 0;
    int k = last + 1, ckpt_at = last;
    if (st->fault == FAULT_WRONG_BLOCK &&
        (store_state_checkpoint_last(st->store, hashes, last, &ckpt_at, &diag) != SHOAL_OK ||
         ckpt_at < 0))
        ckpt_at = last;
    restore_job *j = job_alloc(k, st->parts, st->state_bytes);
    if (!j)
        return 0;
    j->k = k;
    j->parts = st->parts;
    j->ckpt_block = hashes[ckpt_at];
    j->pages = pages;
    j->pages_out = pages_out;
    j->chain[0] = *parent;
    memcpy(j->chain + 1, hashes, (size_t)k * sizeof *hashes);
    for (int b = 0; b < k; b++) {
        int page = worker_pages_lookup(pages, &hashes[b]); /* cached here: no read */
        j->state[b] = page >= 0 ? BLOCK_READY : BLOCK_OPEN;
        if (page < 0 && (page = worker_pages_alloc(pages, stream)) < 0) {
            while (b > 0)
                worker_pages_unref(pages, pages_out[--b]);
            job_free(j);
            return 0;
        }
        pages_out[b] = page;
    }
    j->top = k + j->parts - 1;
    j->t0 = common_mono_ns();
    pthread_mutex_lock(&st->mu);
    job_queue(st, j);
    pthread_mutex_unlock(&st->mu);
    *job = j;
    return k;
}

static int restore_start(void *ctx, worker_pages *pages, uint64_t stream,
                         const common_hash *hashes, const common_hash *parent, int n,
                         int claim, worker_speed speed, int32_t *pages_out, void **job)
{
    worker_states *st = ctx;
    *job = NULL;
    if (st->state_bytes)
        return restore_start_hybrid(st, pages, stream, hashes, parent, n, pages_out, job);
    /* Only the first block here (a new conversation's miss is one B-tree
     * walk); the readers find out about the others as they get them (a
     * block not stored is a quick miss, and the engine computes it), so no
     * lookup of a cold B-tree delays the first read. */
    int first = 0;
    shoal_diag diag;
    if (store_state_lookup_keys(st->store, hashes, 1, &first, &diag) != SHOAL_OK) {
        LOG_WARN("state store: lookup failed: %s", diag.msg);
        return 0;
    }
    if (first == 0)
        return 0;
    restore_job *j = job_alloc(n, 0, 0);
    if (!j)
        return 0;
    /* the job's pages, taken now (evictions may spill other pages): every
     * candidate block's, whoever fills it */
    int k = 0;
    for (; k < n; k++) {
        int page = worker_pages_alloc(pages, stream);
        if (page < 0)
            break;
        pages_out[k] = page;
    }
    if (k == 0) {
        job_free(j);
        return 0;
    }
    j->pages = pages;
    j->pages_out = pages_out;
    j->chain[0] = *parent;
    memcpy(j->chain + 1, hashes, (size_t)k * sizeof *hashes);
    j->k = k;
    j->top = k - 1;
    /* in the page cache or not, as its first block is */
    uint64_t resident = 0, total = 0;
    j->warm = !st->read_all &&
              store_state_resident(st->store, hashes, 1, &resident, &total, &diag) == SHOAL_OK &&
              resident == 1;
    j->t0 = common_mono_ns();
    pthread_mutex_lock(&st->mu);
    /* the engine's first chunk: its share of the history, at most; a
     * history on disk that fits in that chunk is computed whole (the
     * chunk costs a step either way, and the disk's first reads alone
     * take about as long as a step) */
    int share = !st->read_all && !j->warm && k <= claim ? k : engine_share(st, j, k, speed);
    for (int b = 0; b < claim && b < share; b++)
        j->state[b] = BLOCK_COMPUTE;
    job_queue(st, j);
    pthread_mutex_unlock(&st->mu);
    *job = j;
    return k;
}

static worker_take restore_take(void *ctx, void *job, int block, int claimed,
                                worker_speed speed)
{
    worker_states *st = ctx;
    restore_job *j = job;
    SHOAL_ASSERT(block >= 0 && block < j->k);
    pthread_mutex_lock(&st->mu);
    worker_take t;
    if (j->parts > 0) { /* a hybrid's: all or nothing, none shared with the engine */
        bool ready = true;
        for (int b = 0; ready && b < j->k; b++)
            ready = j->state[b] == BLOCK_READY;
        t = j->failed ? WORKER_TAKE_COMPUTE : ready ? WORKER_TAKE_READY : WORKER_TAKE_WAIT;
        pthread_mutex_unlock(&st->mu);
        return t;
    }
    switch (j->state[block]) {
    case BLOCK_OPEN: {
        /* blocks between the engine and the readers, this chunk's claims
         * included: the engine computes its share of them */
        int open = claimed;
        for (int b = block; b <= j->top; b++)
            open += j->state[b] == BLOCK_OPEN;
        if (claimed < engine_share(st, j, open, speed)) {
            j->state[block] = BLOCK_COMPUTE; /* readers pass it by */
            t = WORKER_TAKE_COMPUTE;
        } else {
            t = WORKER_TAKE_WAIT; /* the readers get there first */
        }
        break;
    }
    case BLOCK_READY:
        t = WORKER_TAKE_READY;
        break;
    case BLOCK_COMPUTE:
    case BLOCK_FAILED:
    case BLOCK_MISSING:
        t = WORKER_TAKE_COMPUTE;
        break;
    default: /* being read, or read and not yet placed */
        t = WORKER_TAKE_WAIT;
        break;
    }
    pthread_mutex_unlock(&st->mu);
    return t;
}

/* Blocks the engine computed though the store has them (its share of a
 * cold history) need no spill: marked stored where the store has the key,
 * the keys looked up together (one read transaction for a run of them).
 * A refused block's page is not marked: its spill rewrites the bad record.
 * Once the stream is past the job no reader touches it, so its states are
 * read without mu. */
static void mark_computed_stored(worker_states *st, restore_job *j)
{
    int *blocks = j->computed;
    common_hash *keys = j->computed_keys;
    int n = 0;
    for (int b = 0; b < j->k; b++)
        if (j->state[b] == BLOCK_COMPUTE &&
            (atomic_load(&worker_pages_row(j->pages, j->pages_out[b])->flags) & SHM_PAGE_HASHED)) {
            blocks[n] = b;
            keys[n++] = j->chain[b + 1];
        }
    /* lookup_keys counts the keys that lead: past a missing one, go on
     * after it */
    for (int from = 0; from < n;) {
        int present = 0;
        shoal_diag diag = {{0}};
        if (store_state_lookup_keys(st->store, keys + from, n - from, &present, &diag) !=
            SHOAL_OK) {
            LOG_WARN("state store: %s; %d computed pages will be written again when evicted",
                     diag.msg, n - from);
            break;
        }
        for (int i = 0; i < present; i++)
            worker_pages_mark_stored(j->pages, j->pages_out[blocks[from + i]], true);
        from += present + 1;
    }
}

static void restore_end(void *ctx, void *job, bool passed)
{
    worker_states *st = ctx;
    restore_job *j = job;
    if (passed)
        mark_computed_stored(st, j);
    pthread_mutex_lock(&st->mu);
    j->ended = true;
    st->stats.restore_ns += common_mono_ns() - j->t0;
    if (!j->warm && j->reads >= 4 && j->last_read_ns > j->t0) {
        double r = j->reads / ((double)(j->last_read_ns - j->t0) / 1e9);
        st->disk_bps = st->disk_bps > 0 ? 0.5 * st->disk_bps + 0.5 * r : r;
    }
    if (j->holds == 0)
        job_unlink_free(st, j);
    pthread_mutex_unlock(&st->mu);
}

/* A hybrid job's blocks are all in their pages: its checkpoint goes into
 * the stream's state slot once every part is read. */
static worker_take restore_state(void *ctx, void *job, int state_slot)
{
    worker_states *st = ctx;
    restore_job *j = job;
    pthread_mutex_lock(&st->mu);
    bool ready = !j->failed;
    for (int i = 0; ready && i < j->parts; i++)
        ready = j->state[j->k + i] == BLOCK_READY;
    bool failed = j->failed;
    pthread_mutex_unlock(&st->mu);
    if (failed)
        return WORKER_TAKE_COMPUTE;
    if (!ready)
        return WORKER_TAKE_WAIT;
    if (st->fault == FAULT_NO_STATE)
        return WORKER_TAKE_READY;
    shoal_diag d = {{0}};
    if (worker_model_slot_write(st->m, state_slot, j->ckpt, &d) != SHOAL_OK) {
        LOG_ERROR("state store: restoring a state checkpoint failed: %s", d.msg);
        return WORKER_TAKE_COMPUTE;
    }
    st->stats.restored_checkpoints++;
    st->stats.restore_bytes += st->state_bytes;
    return WORKER_TAKE_READY;
}

worker_async_source worker_states_restore_source(worker_states *st)
{
    return (worker_async_source){.start = restore_start,
                                 .take = restore_take,
                                 .end = restore_end,
                                 .pump = restore_pump,
                                 .state = restore_state,
                                 .ctx = st};
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

/* Downloads the checkpoint in model slot `state_slot` and queues it as the
 * checkpoint at block hash. */
static shoal_err put_checkpoint(worker_states *st, int state_slot, const common_hash *hash)
{
    shoal_diag d = {{0}};
    if (worker_model_slot_read(st->m, state_slot, st->ckpt_buf, &d) != SHOAL_OK) {
        LOG_ERROR("state store: downloading a state checkpoint failed: %s", d.msg);
        return SHOAL_ERR_DEVICE;
    }
    return store_state_put_checkpoint_async(st->store, hash, st->ckpt_buf, st->state_bytes);
}

static void on_checkpoint_evict(void *ctx, const common_hash *hash, int state_slot)
{
    worker_states *st = ctx;
    shoal_err err = put_checkpoint(st, state_slot, hash);
    if (err == SHOAL_OK)
        st->stats.spilled_checkpoints++;
    else if (err == SHOAL_ERR_LIMIT)
        st->stats.checkpoint_drops++;
}

void worker_states_attach(worker_states *st, worker_pages *pages, worker_checkpoints *ckpts)
{
    st->evict_pages = pages;
    worker_pages_on_evict(pages, on_evict, st);
    if (st->state_bytes && ckpts) {
        st->ckpts = ckpts;
        worker_checkpoints_on_evict(ckpts, on_checkpoint_evict, st);
    }
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

typedef struct write_ckpt {
    worker_states *st;
    uint64_t deadline;
    shoal_err err;
    int done;
} write_ckpt;

static void write_one_checkpoint(void *ctx, const common_hash *hash, int state_slot)
{
    write_ckpt *w = ctx;
    while (w->err == SHOAL_OK) {
        shoal_err err = put_checkpoint(w->st, state_slot, hash);
        if (err == SHOAL_OK || err == SHOAL_ERR_UNSUPPORTED) { /* stored, or never storable */
            w->done += err == SHOAL_OK;
            return;
        }
        int ms = left_ms(w->deadline);
        if (err != SHOAL_ERR_LIMIT || ms == 0) {
            w->err = err == SHOAL_ERR_LIMIT ? SHOAL_ERR_TIMEOUT : err;
            return;
        }
        /* no room for its parts yet: at shutdown we wait for the disk */
        store_state_flush(w->st->store, ms < 0 || ms > 1000 ? 1000 : ms);
    }
}

/* The turns' checkpoints the store lacks, after their pages. */
static shoal_err write_checkpoints(worker_states *st, uint64_t deadline)
{
    write_ckpt w = {.st = st, .deadline = deadline};
    int n = worker_checkpoints_each_unstored(st->ckpts, write_one_checkpoint, &w);
    if (n > 0)
        LOG_INFO("state store: %d of %d state checkpoints (%.1f MiB each) queued", w.done, n,
                 (double)st->state_bytes / 1048576.0);
    st->stats.written_checkpoints += (uint64_t)w.done;
    return w.err;
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
    if (err == SHOAL_OK && st->ckpts && (err = write_checkpoints(st, deadline)) != SHOAL_OK &&
        err != SHOAL_ERR_TIMEOUT)
        return shoal_diag_set(diag, err, "state store: writing state checkpoints failed: %s",
                              shoal_strerror(err));
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
