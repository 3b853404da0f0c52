#include "store_state.h"

#include "common/common_assert.h"
#include "common/common_limits.h"
#include "common/common_log.h"
#include "store/store_env.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* How long the writer lets last-use updates gather when no page is
 * waiting: a restore gets many pages in a burst, and one transaction (one
 * sync) for the burst beats one per page. Eviction order tolerates the
 * delay. */
enum { TOUCH_GATHER_MS = 100 };

#define MAP_SLACK_BYTES (64ull << 20)

/* Counters the writer adds to the store's totals (see store_index.h) with
 * its next batch, so `shoalctl states stats` sees every process's. */
static const store_total persisted_totals[] = {
    STORE_TOTAL_DROPS,   STORE_TOTAL_HITS,         STORE_TOTAL_MISSES,
    STORE_TOTAL_REFUSED, STORE_TOTAL_WRITE_ERRORS,
};
enum { PERSISTED = sizeof persisted_totals / sizeof persisted_totals[0] };

typedef struct slot {
    common_hash hash;
    common_hash parent;
    int tokens;
    bool is_part; /* a part of a state checkpoint (part says which) */
    store_record_part part;
    uint64_t seq;                              /* queue order, for flush */
    uint8_t header[STORE_RECORD_HEADER_BYTES]; /* encoded by the writer */
} slot;

struct store_state {
    store_env *env;
    common_hash fingerprint;
    store_page_layout layout;
    uint64_t spill_bytes;
    size_t state_bytes; /* a state checkpoint's (0: none) */
    int state_parts;    /* its records */

    /* The queue. Puts append at head + count; the writer takes slots from
     * head and works on them without the lock: producers never touch slots
     * in [head, head + count), and the writer frees its slots (head += n)
     * only after their transaction ended. */
    pthread_mutex_t mu;
    pthread_cond_t work; /* to the writer: something queued, or stop */
    pthread_cond_t done; /* to flushers: done_seq advanced */
    bool sync_init;
    slot *slots;
    uint8_t *pages; /* cap x page_bytes, the slots' payloads */
    int cap;
    int head;
    int count;
    common_hash *touches; /* ring of SHOAL_STORE_TOUCH_QUEUE_MAX */
    int touch_head;
    int touch_count;
    common_hash *touch_batch; /* the writer's copy of the touches it took */
    uint64_t enqueued_seq;    /* last sequence number handed out */
    uint64_t done_seq;        /* everything up to here is written or dropped */
    int flushers;             /* flush() calls waiting: no gathering delay */
    bool stopping;
    bool thread_started;
    pthread_t thread;

    /* Counters (stats); any thread. */
    atomic_uint_fast64_t puts, drops, writes, duplicates, evictions, hits, misses, refused,
        map_full, map_grows, write_errors, touch_drops, direct_reads;
    atomic_bool refusal_logged;
    /* Writer only: the counters' values already added to the totals. */
    uint64_t persisted[PERSISTED];
};

static uint64_t counter_of(store_state *s, store_total t)
{
    switch (t) {
    case STORE_TOTAL_DROPS:
        return atomic_load(&s->drops);
    case STORE_TOTAL_HITS:
        return atomic_load(&s->hits);
    case STORE_TOTAL_MISSES:
        return atomic_load(&s->misses);
    case STORE_TOTAL_REFUSED:
        return atomic_load(&s->refused);
    case STORE_TOTAL_WRITE_ERRORS:
        return atomic_load(&s->write_errors);
    default:
        SHOAL_ASSERT(!"not a persisted counter");
        return 0;
    }
}

/* A handle used in another process than the one that opened it. */
static shoal_err foreign(shoal_diag *diag)
{
    return shoal_diag_set(diag, SHOAL_ERR_BROKEN,
                          "state store handle used in a process that did not open it (open it "
                          "after fork)");
}

/* ---- the writer ---- */

typedef struct batch {
    store_state *s;
    int first; /* slot index */
    int n;     /* slots */
    int touches;
    uint64_t deltas[PERSISTED];
    uint64_t added, duplicates; /* by the last attempt */
} batch;

/* The body of one batch's transaction. store_env_write may run it more
 * than once (after a full map): it recounts from zero each time. */
static int batch_write(void *ctx, store_wtx *w)
{
    batch *b = ctx;
    store_state *s = b->s;
    b->added = b->duplicates = 0;
    for (int i = 0; i < b->n; i++) {
        int k = (b->first + i) % s->cap;
        const slot *sl = &s->slots[k];
        bool added;
        int rc = store_wtx_put(w, sl->header, s->pages + (size_t)k * s->layout.page_bytes,
                               s->layout.page_bytes, sl->tokens, s->spill_bytes, &added);
        if (rc != 0)
            return rc;
        if (added)
            b->added++;
        else
            b->duplicates++;
    }
    for (int i = 0; i < b->touches; i++) {
        uint8_t key[STORE_KEY_BYTES];
        store_record_key(key, &s->fingerprint, &s->touch_batch[i]);
        int rc = store_wtx_touch(w, key);
        if (rc != 0 && rc != MDB_NOTFOUND) /* evicted meanwhile: nothing to mark */
            return rc;
    }
    for (int i = 0; i < PERSISTED; i++)
        w->totals[persisted_totals[i]] += b->deltas[i];
    return 0;
}

static void write_batch(store_state *s, int first, int n, int touches)
{
    batch b = {.s = s, .first = first, .n = n, .touches = touches};
    uint64_t now[PERSISTED];
    for (int i = 0; i < PERSISTED; i++) {
        now[i] = counter_of(s, persisted_totals[i]);
        b.deltas[i] = now[i] - s->persisted[i];
    }
    /* Checksums before the transaction: the write lock is the cluster's. */
    for (int i = 0; i < n; i++) {
        int k = (first + i) % s->cap;
        slot *sl = &s->slots[k];
        store_record_encode(sl->header, &s->fingerprint, &sl->hash, &sl->parent, &s->layout,
                            sl->tokens, sl->is_part ? &sl->part : NULL, s->pages + (size_t)k * s->layout.page_bytes);
    }
    store_env_write_report rep;
    shoal_diag diag;
    uint64_t room = (uint64_t)n * store_record_bytes(&s->layout);
    shoal_err err = store_env_write(s->env, batch_write, &b, room, &rep, &diag);
    atomic_fetch_add(&s->map_full, (uint64_t)rep.map_full);
    atomic_fetch_add(&s->map_grows, (uint64_t)rep.grows);
    atomic_fetch_add(&s->evictions, rep.evicted);
    if (err == SHOAL_OK) {
        atomic_fetch_add(&s->writes, b.added);
        atomic_fetch_add(&s->duplicates, b.duplicates);
        for (int i = 0; i < PERSISTED; i++)
            s->persisted[i] = now[i];
        return;
    }
    uint64_t errors = atomic_fetch_add(&s->write_errors, 1) + 1;
    /* The first and then every 1024th, so a failing disk cannot flood the log. */
    if (errors == 1 || errors % 1024 == 0)
        LOG_WARN("state store: %d page(s) not written (%llu such batches so far): %s", n,
                 (unsigned long long)errors, diag.msg);
}

static void deadline_after(struct timespec *ts, int ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

static void *writer_main(void *arg)
{
    store_state *s = arg;
    const uint64_t record = store_record_bytes(&s->layout);
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->count == 0 && s->touch_count == 0 && !s->stopping)
            pthread_cond_wait(&s->work, &s->mu);
        if (s->count == 0 && s->touch_count == 0)
            break; /* stopping, and everything is written */
        if (s->count == 0 && !s->stopping && s->flushers == 0) {
            struct timespec until;
            deadline_after(&until, TOUCH_GATHER_MS);
            while (s->count == 0 && !s->stopping && s->flushers == 0 &&
                   pthread_cond_timedwait(&s->work, &s->mu, &until) != ETIMEDOUT)
                ;
        }
        int n = 0;
        uint64_t bytes = 0;
        while (n < s->count && (n == 0 || bytes + record <= SHOAL_STORE_BATCH_BYTES_MAX)) {
            bytes += record;
            n++;
        }
        int touches = s->touch_count;
        for (int i = 0; i < touches; i++)
            s->touch_batch[i] = s->touches[(s->touch_head + i) % SHOAL_STORE_TOUCH_QUEUE_MAX];
        s->touch_head = (s->touch_head + touches) % SHOAL_STORE_TOUCH_QUEUE_MAX;
        s->touch_count = 0;
        /* Done up to the first put left for the next batch. */
        uint64_t batch_seq =
            n == s->count ? s->enqueued_seq : s->slots[(s->head + n) % s->cap].seq - 1;
        int first = s->head;
        pthread_mutex_unlock(&s->mu);

        write_batch(s, first, n, touches);

        pthread_mutex_lock(&s->mu);
        s->head = (s->head + n) % s->cap;
        s->count -= n;
        if (batch_seq > s->done_seq)
            s->done_seq = batch_seq;
        pthread_cond_broadcast(&s->done);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---- open and close ---- */

shoal_err store_state_open(const store_state_options *opt, store_state **out, shoal_diag *diag)
{
    *out = NULL;
    shoal_diag why;
    if (store_page_layout_check(&opt->layout, &why) != SHOAL_OK)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID, "state store %s: page layout: %s",
                              opt->dir ? opt->dir : "(none)", why.msg);
    uint64_t record = store_record_bytes(&opt->layout);
    if (opt->spill_bytes < record || opt->spill_bytes > SHOAL_STORE_SPILL_BYTES_MAX)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "state store %s: --spill-gib of %llu bytes is outside [one "
                              "record of %llu bytes, SHOAL_STORE_SPILL_BYTES_MAX]",
                              opt->dir ? opt->dir : "(none)", (unsigned long long)opt->spill_bytes,
                              (unsigned long long)record);
    if (opt->queue_slots < 0 || opt->queue_slots > SHOAL_STORE_QUEUE_SLOTS_MAX)
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT,
                              "state store queue of %d slots is outside [1, %d] "
                              "(SHOAL_STORE_QUEUE_SLOTS_MAX)",
                              opt->queue_slots, SHOAL_STORE_QUEUE_SLOTS_MAX);

    store_state *s = calloc(1, sizeof *s);
    if (!s)
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM, "out of memory");
    s->fingerprint = opt->fingerprint;
    s->layout = opt->layout;
    s->spill_bytes = opt->spill_bytes;
    s->state_bytes = opt->state_bytes;
    s->state_parts =
        (int)((opt->state_bytes + opt->layout.page_bytes - 1) / opt->layout.page_bytes);
    shoal_err err;

    store_env_options eo = {
        .dir = opt->dir,
        .create = true,
        .map_bytes = opt->map_bytes ? opt->map_bytes : 2 * opt->spill_bytes + MAP_SLACK_BYTES,
        .map_bytes_max = opt->map_bytes_max,
        .random_reads = true,
    };
    if ((err = store_env_open(&eo, &s->env, diag)) != SHOAL_OK)
        goto fail;

    if (opt->queue_slots > 0) {
        s->cap = opt->queue_slots;
    } else {
        uint64_t by_bytes = SHOAL_STORE_QUEUE_BYTES_MAX / opt->layout.page_bytes;
        s->cap =
            by_bytes < SHOAL_STORE_QUEUE_SLOTS_MAX ? (int)by_bytes : SHOAL_STORE_QUEUE_SLOTS_MAX;
        if (s->cap < 1)
            s->cap = 1;
    }
    if (s->state_parts > s->cap)
        LOG_WARN("state store %s: a state checkpoint is %d records, more than the write queue's "
                 "%d: checkpoints are not stored (a larger --page-tokens makes fewer parts)",
                 opt->dir, s->state_parts, s->cap);
    s->slots = calloc((size_t)s->cap, sizeof *s->slots);
    s->pages = malloc((size_t)s->cap * opt->layout.page_bytes);
    s->touches = calloc(SHOAL_STORE_TOUCH_QUEUE_MAX, sizeof *s->touches);
    s->touch_batch = calloc(SHOAL_STORE_TOUCH_QUEUE_MAX, sizeof *s->touch_batch);
    if (!s->slots || !s->pages || !s->touches || !s->touch_batch) {
        err = shoal_diag_set(diag, SHOAL_ERR_NOMEM,
                             "state store %s: out of memory for a queue of %d pages of %zu "
                             "bytes",
                             opt->dir, s->cap, opt->layout.page_bytes);
        goto fail;
    }

    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int rc = pthread_mutex_init(&s->mu, NULL);
    if (rc == 0 && (rc = pthread_cond_init(&s->work, &ca)) != 0)
        pthread_mutex_destroy(&s->mu);
    if (rc == 0 && (rc = pthread_cond_init(&s->done, &ca)) != 0) {
        pthread_cond_destroy(&s->work);
        pthread_mutex_destroy(&s->mu);
    }
    pthread_condattr_destroy(&ca);
    if (rc != 0) {
        err = shoal_diag_set(diag, SHOAL_ERR_NOMEM, "state store: %s", strerror(rc));
        goto fail;
    }
    s->sync_init = true;
    if ((rc = pthread_create(&s->thread, NULL, writer_main, s)) != 0) {
        err = shoal_diag_set(diag, SHOAL_ERR_NOMEM, "state store: cannot start the writer: %s",
                             strerror(rc));
        goto fail;
    }
    s->thread_started = true;
    *out = s;
    return SHOAL_OK;
fail:
    store_state_close(s);
    return err;
}

static int persist_counters(void *ctx, store_wtx *w)
{
    batch *b = ctx;
    for (int i = 0; i < PERSISTED; i++)
        w->totals[persisted_totals[i]] += b->deltas[i];
    return 0;
}

void store_state_close(store_state *s)
{
    if (!s)
        return;
    if (s->env && !store_env_owned(s->env))
        return; /* a forked child: the writer thread and the store are the parent's */
    if (s->thread_started) {
        pthread_mutex_lock(&s->mu);
        s->stopping = true;
        pthread_cond_signal(&s->work);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    if (s->env && s->thread_started) {
        /* counters changed since the last batch (misses need no batch) */
        batch b = {.s = s};
        bool any = false;
        for (int i = 0; i < PERSISTED; i++) {
            b.deltas[i] = counter_of(s, persisted_totals[i]) - s->persisted[i];
            any |= b.deltas[i] != 0;
        }
        if (any)
            (void)store_env_write(s->env, persist_counters, &b, 0, NULL, NULL);
    }
    if (s->sync_init) {
        pthread_cond_destroy(&s->done);
        pthread_cond_destroy(&s->work);
        pthread_mutex_destroy(&s->mu);
    }
    free(s->slots);
    free(s->pages);
    free(s->touches);
    free(s->touch_batch);
    store_env_close(s->env);
    free(s);
}

/* ---- puts ---- */

shoal_err store_state_put_async(store_state *s, const common_hash *hash, const common_hash *parent,
                                int tokens, const void *page, size_t page_bytes)
{
    if (!store_env_owned(s->env))
        return SHOAL_ERR_BROKEN;
    if (tokens < 1 || tokens > s->layout.page_tokens || page_bytes != s->layout.page_bytes || !page)
        return SHOAL_ERR_INVALID;
    shoal_err err = SHOAL_OK;
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        err = SHOAL_ERR_CLOSED;
    } else if (s->count == s->cap) {
        atomic_fetch_add(&s->drops, 1);
        err = SHOAL_ERR_LIMIT;
    } else {
        int k = (s->head + s->count) % s->cap;
        slot *sl = &s->slots[k];
        sl->hash = *hash;
        sl->parent = *parent;
        sl->tokens = tokens;
        sl->is_part = false; /* the slot may have held a state part */
        sl->seq = ++s->enqueued_seq;
        memcpy(s->pages + (size_t)k * page_bytes, page, page_bytes);
        s->count++;
        atomic_fetch_add(&s->puts, 1);
        pthread_cond_signal(&s->work);
    }
    pthread_mutex_unlock(&s->mu);
    return err;
}

static void touch(store_state *s, const common_hash *hash)
{
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        /* closing: nothing to mark */
    } else if (s->touch_count == SHOAL_STORE_TOUCH_QUEUE_MAX) {
        atomic_fetch_add(&s->touch_drops, 1);
    } else {
        s->touches[(s->touch_head + s->touch_count) % SHOAL_STORE_TOUCH_QUEUE_MAX] = *hash;
        s->touch_count++;
        s->enqueued_seq++;
        pthread_cond_signal(&s->work);
    }
    pthread_mutex_unlock(&s->mu);
}

/* ---- reads ---- */

/* Where a get puts what it finds: the page into `page` (the header kept
 * aside), or the whole record into `buf`, read past the page cache when
 * it is not there. */
typedef struct get_dst {
    uint8_t *page;
    uint8_t *buf;
    size_t buf_bytes;
    size_t record_at; /* out: where in buf the record starts */
    bool direct;      /* out: read with O_DIRECT */
} get_dst;

/* A value is in the page cache: its first and last pages are (records
 * are read and written whole; the first alone may have come in with the
 * readahead of a B-tree page next to it). */
static bool value_resident(const void *value, size_t bytes)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t first = (uintptr_t)value / page * page;
    uintptr_t last = ((uintptr_t)value + bytes - 1) / page * page;
    unsigned char in = 0, in_last = 0;
    return mincore((void *)first, page, &in) == 0 && (in & 1) &&
           mincore((void *)last, page, &in_last) == 0 && (in_last & 1);
}

/* Before copying a value that is not in the page cache out of the map:
 * one readahead of its whole span (the map faults a page at a time:
 * MDB_NORDAHEAD, store_env.h). */
static void will_need(const void *value, size_t bytes)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t first = (uintptr_t)value / page * page;
    (void)madvise((void *)first, (uintptr_t)value + bytes - first, MADV_WILLNEED);
}

static const char *kind_name(store_record_kind k)
{
    return k == STORE_RECORD_PAGE ? "KV page" : "state part";
}

/* Reads the record of hash, which must be of kind `want`; *out (may be
 * NULL) gets its header's fields. */
static shoal_err get(store_state *s, const common_hash *hash, get_dst *dst,
                     store_record_kind want, store_record_info *out, shoal_diag *diag)
{
    if (!store_env_owned(s->env))
        return foreign(diag);
    uint8_t key[STORE_KEY_BYTES];
    store_record_key(key, &s->fingerprint, hash);
    MDB_txn *txn;
    store_guard g;
    shoal_err err = store_env_read_begin(s->env, &txn, &g, diag);
    if (err != SHOAL_OK)
        return err;
    if (sigsetjmp(g.jb, 1) != 0)
        return store_env_read_fault(s->env, &g, diag);
    g.armed = 1;
    MDB_val k = {STORE_KEY_BYTES, key}, v;
    uint8_t kept[STORE_RECORD_HEADER_BYTES];
    const uint8_t *header = kept, *payload = dst->page;
    store_record_info info;
    shoal_diag why;
    int rc = mdb_get(txn, store_env_index(s->env)->records, &k, &v);
    if (rc == 0 && dst->page) {
        if (!value_resident(v.mv_data, v.mv_size))
            will_need(v.mv_data, v.mv_size);
        err = store_record_check(key, v.mv_data, v.mv_size, &s->layout, false, &info, &why);
        if (err == SHOAL_OK) {
            memcpy(kept, v.mv_data, STORE_RECORD_HEADER_BYTES);
            memcpy(dst->page, (const uint8_t *)v.mv_data + STORE_RECORD_HEADER_BYTES,
                   s->layout.page_bytes);
        }
    } else if (rc == 0 && v.mv_size > dst->buf_bytes) {
        /* longer than a record of this layout: the check says so */
        err = store_record_check(key, v.mv_data, v.mv_size, &s->layout, false, &info, &why);
    } else if (rc == 0) {
        bool resident = value_resident(v.mv_data, v.mv_size);
        ssize_t at = resident ? -1
                              : store_env_read_direct(s->env, v.mv_data, v.mv_size, dst->buf,
                                                      dst->buf_bytes);
        dst->direct = at >= 0;
        dst->record_at = at >= 0 ? (size_t)at : 0;
        if (at < 0) {
            if (!resident)
                will_need(v.mv_data, v.mv_size);
            memcpy(dst->buf, v.mv_data, v.mv_size);
        }
        header = dst->buf + dst->record_at;
        payload = header + STORE_RECORD_HEADER_BYTES;
        /* the copy's header: what is checked is what is returned */
        err = store_record_check(key, header, v.mv_size, &s->layout, false, &info, &why);
    }
    store_env_read_end(s->env, txn);
    if (rc == MDB_NOTFOUND) {
        atomic_fetch_add(&s->misses, 1);
        return shoal_diag_set(diag, SHOAL_ERR_NOT_FOUND, "block not stored");
    }
    if (rc != 0)
        return store_env_error(s->env, rc, "reading a state", diag);
    /* The checksum is checked on the copy, outside the transaction: what
     * is returned is exactly what was checked. */
    if (err == SHOAL_OK && !store_record_checksum_ok(header, payload, s->layout.page_bytes)) {
        err = SHOAL_ERR_FORMAT;
        snprintf(why.msg, sizeof why.msg, "checksum mismatch");
    }
    if (err == SHOAL_OK && info.kind != want) {
        err = SHOAL_ERR_FORMAT;
        snprintf(why.msg, sizeof why.msg, "a %s where a %s belongs", kind_name(info.kind),
                 kind_name(want));
    }
    if (err != SHOAL_OK) {
        atomic_fetch_add(&s->refused, 1);
        if (!atomic_exchange(&s->refusal_logged, true)) {
            char hex[2 * COMMON_HASH_BYTES + 1];
            common_hash_hex(hash, hex);
            LOG_WARN("%s: refused the stored state of block %.16s: %s (later refusals are "
                     "only counted; shoalctl states verify --state-dir %s lists them all)",
                     store_env_dir(s->env), hex, why.msg, store_env_dir(s->env));
        }
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT, "stored state refused: %s", why.msg);
    }
    atomic_fetch_add(&s->hits, 1);
    if (dst->direct)
        atomic_fetch_add(&s->direct_reads, 1);
    touch(s, hash);
    if (out)
        *out = info;
    return SHOAL_OK;
}

/* get's result for a page: its tokens. */
static shoal_err get_page(store_state *s, const common_hash *hash, get_dst *dst, int *tokens,
                          shoal_diag *diag)
{
    store_record_info info;
    shoal_err err = get(s, hash, dst, STORE_RECORD_PAGE, &info, diag);
    if (err == SHOAL_OK && tokens)
        *tokens = info.tokens;
    return err;
}

shoal_err store_state_get(store_state *s, const common_hash *hash, void *out, size_t out_bytes,
                          int *tokens, shoal_diag *diag)
{
    if (out_bytes < s->layout.page_bytes)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID, "buffer of %zu bytes for a page of %zu",
                              out_bytes, s->layout.page_bytes);
    get_dst dst = {.page = out};
    return get_page(s, hash, &dst, tokens, diag);
}

size_t store_state_read_bytes(const store_state *s)
{
    return store_env_direct_bytes(store_record_bytes(&s->layout));
}

shoal_err store_state_read(store_state *s, const common_hash *hash, void *buf, size_t buf_bytes,
                           size_t *payload_at, int *tokens, shoal_diag *diag)
{
    if (buf_bytes < store_record_bytes(&s->layout))
        return shoal_diag_set(diag, SHOAL_ERR_INVALID, "buffer of %zu bytes for a record of %zu",
                              buf_bytes, store_record_bytes(&s->layout));
    get_dst dst = {.buf = buf, .buf_bytes = buf_bytes};
    shoal_err err = get_page(s, hash, &dst, tokens, diag);
    *payload_at = dst.record_at + STORE_RECORD_HEADER_BYTES;
    return err;
}

/* ---- state checkpoints ---- */

int store_state_checkpoint_parts(const store_state *s)
{
    return s->state_parts;
}

shoal_err store_state_put_checkpoint_async(store_state *s, const common_hash *block,
                                           const void *state, size_t state_bytes)
{
    if (!store_env_owned(s->env))
        return SHOAL_ERR_BROKEN;
    if (s->state_bytes == 0 || state_bytes != s->state_bytes || !state)
        return SHOAL_ERR_INVALID;
    if (s->state_parts > s->cap) /* never fits: said at open */
        return SHOAL_ERR_UNSUPPORTED;
    const size_t pb = s->layout.page_bytes;
    const int parts = s->state_parts;
    shoal_err err = SHOAL_OK;
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        err = SHOAL_ERR_CLOSED;
    } else if (s->cap - s->count < parts) {
        atomic_fetch_add(&s->drops, 1);
        err = SHOAL_ERR_LIMIT;
    } else {
        common_hash parent = *block;
        for (int i = 0; i < parts; i++) {
            int k = (s->head + s->count) % s->cap;
            slot *sl = &s->slots[k];
            store_record_part_hash(block, (uint32_t)i, &sl->hash);
            sl->parent = parent;
            parent = sl->hash;
            sl->tokens = 0;
            sl->is_part = true;
            sl->part = (store_record_part){
                .index = (uint32_t)i, .parts = (uint32_t)parts, .state_bytes = state_bytes};
            sl->seq = ++s->enqueued_seq;
            uint8_t *dst = s->pages + (size_t)k * pb;
            size_t at = (size_t)i * pb, n = state_bytes - at < pb ? state_bytes - at : pb;
            memcpy(dst, (const uint8_t *)state + at, n);
            memset(dst + n, 0, pb - n);
            s->count++;
        }
        atomic_fetch_add(&s->puts, (uint64_t)parts);
        pthread_cond_signal(&s->work);
    }
    pthread_mutex_unlock(&s->mu);
    return err;
}

/* A part read is the part its key names: index, count, size and parent. */
static shoal_err check_part(const store_state *s, const common_hash *block, int index,
                            const store_record_info *info, shoal_diag *diag)
{
    common_hash parent = *block;
    if (index > 0)
        store_record_part_hash(block, (uint32_t)index - 1, &parent);
    if (info->part.index != (uint32_t)index || info->part.parts != (uint32_t)s->state_parts ||
        info->part.state_bytes != s->state_bytes)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                              "state part %u of %u (%llu bytes) where part %d of %d (%zu bytes) "
                              "belongs",
                              info->part.index, info->part.parts,
                              (unsigned long long)info->part.state_bytes, index, s->state_parts,
                              s->state_bytes);
    if (!common_hash_equal(&info->parent, &parent))
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                              "state part %d names another block or part as its parent", index);
    return SHOAL_OK;
}

/* Part `index` of the checkpoint at block into dst, checked as the part
 * its key names (a part that is not is refused and counted). */
static shoal_err get_part(store_state *s, const common_hash *block, int index, get_dst *dst,
                          shoal_diag *diag)
{
    common_hash h;
    store_record_part_hash(block, (uint32_t)index, &h);
    store_record_info info;
    shoal_err err = get(s, &h, dst, STORE_RECORD_STATE_PART, &info, diag);
    if (err == SHOAL_OK && (err = check_part(s, block, index, &info, diag)) != SHOAL_OK)
        atomic_fetch_add(&s->refused, 1);
    return err;
}

shoal_err store_state_read_part(store_state *s, const common_hash *block, int index, void *buf,
                                size_t buf_bytes, size_t *payload_at, shoal_diag *diag)
{
    if (index < 0 || index >= s->state_parts)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID, "state part %d of %d", index,
                              s->state_parts);
    if (buf_bytes < store_record_bytes(&s->layout))
        return shoal_diag_set(diag, SHOAL_ERR_INVALID, "buffer of %zu bytes for a record of %zu",
                              buf_bytes, store_record_bytes(&s->layout));
    get_dst dst = {.buf = buf, .buf_bytes = buf_bytes};
    shoal_err err = get_part(s, block, index, &dst, diag);
    *payload_at = dst.record_at + STORE_RECORD_HEADER_BYTES;
    return err;
}

shoal_err store_state_get_checkpoint(store_state *s, const common_hash *block, void *out,
                                     size_t out_bytes, shoal_diag *diag)
{
    if (s->state_bytes == 0 || out_bytes < s->state_bytes)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "buffer of %zu bytes for a state checkpoint of %zu", out_bytes,
                              s->state_bytes);
    const size_t pb = s->layout.page_bytes;
    uint8_t *page = malloc(pb);
    if (!page)
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM, "no memory for a state part");
    shoal_err err = SHOAL_OK;
    for (int i = 0; i < s->state_parts && err == SHOAL_OK; i++) {
        get_dst dst = {.page = page};
        err = get_part(s, block, i, &dst, diag);
        if (err == SHOAL_OK) {
            size_t at = (size_t)i * pb;
            memcpy((uint8_t *)out + at, page, s->state_bytes - at < pb ? s->state_bytes - at : pb);
        }
    }
    free(page);
    return err;
}

shoal_err store_state_checkpoint_last(store_state *s, const common_hash *blocks, int n, int *last,
                                      shoal_diag *diag)
{
    *last = -1;
    if (s->state_parts == 0)
        return SHOAL_OK;
    if (!store_env_owned(s->env))
        return foreign(diag);
    MDB_txn *txn;
    store_guard g;
    shoal_err err = store_env_read_begin(s->env, &txn, &g, diag);
    if (err != SHOAL_OK)
        return err;
    if (sigsetjmp(g.jb, 1) != 0)
        return store_env_read_fault(s->env, &g, diag);
    g.armed = 1;
    MDB_dbi records = store_env_index(s->env)->records;
    int rc = MDB_NOTFOUND;
    for (int i = n - 1; i >= 0 && rc == MDB_NOTFOUND; i--) {
        common_hash h;
        store_record_part_hash(&blocks[i], (uint32_t)s->state_parts - 1, &h);
        uint8_t key[STORE_KEY_BYTES];
        store_record_key(key, &s->fingerprint, &h);
        MDB_val k = {STORE_KEY_BYTES, key}, v;
        if ((rc = mdb_get(txn, records, &k, &v)) == 0)
            *last = i;
    }
    store_env_read_end(s->env, txn);
    if (rc != 0 && rc != MDB_NOTFOUND)
        return store_env_error(s->env, rc, "looking up state checkpoints", diag);
    return SHOAL_OK;
}

/* The leading hashes with a record, checking headers or not. */
static shoal_err lookup(store_state *s, const common_hash *hashes, int n, bool headers, int *stored,
                        shoal_diag *diag)
{
    *stored = 0;
    if (!store_env_owned(s->env))
        return foreign(diag);
    MDB_txn *txn;
    store_guard g;
    shoal_err err = store_env_read_begin(s->env, &txn, &g, diag);
    if (err != SHOAL_OK)
        return err;
    if (sigsetjmp(g.jb, 1) != 0)
        return store_env_read_fault(s->env, &g, diag);
    g.armed = 1;
    MDB_dbi records = store_env_index(s->env)->records;
    int i = 0, rc = 0;
    for (; i < n; i++) {
        uint8_t key[STORE_KEY_BYTES];
        store_record_key(key, &s->fingerprint, &hashes[i]);
        MDB_val k = {STORE_KEY_BYTES, key}, v;
        if ((rc = mdb_get(txn, records, &k, &v)) != 0)
            break;
        if (headers &&
            store_record_check(key, v.mv_data, v.mv_size, &s->layout, false, NULL, NULL) !=
                SHOAL_OK)
            break;
    }
    store_env_read_end(s->env, txn);
    *stored = i;
    if (rc != 0 && rc != MDB_NOTFOUND)
        return store_env_error(s->env, rc, "looking up states", diag);
    return SHOAL_OK;
}

shoal_err store_state_lookup(store_state *s, const common_hash *hashes, int n, int *stored,
                             shoal_diag *diag)
{
    return lookup(s, hashes, n, true, stored, diag);
}

shoal_err store_state_resident(store_state *s, const common_hash *hashes, int n,
                               uint64_t *resident, uint64_t *total, shoal_diag *diag)
{
    *resident = *total = 0;
    MDB_txn *txn;
    store_guard g;
    shoal_err err = store_env_read_begin(s->env, &txn, &g, diag);
    if (err != SHOAL_OK)
        return err;
    if (sigsetjmp(g.jb, 1) != 0)
        return store_env_read_fault(s->env, &g, diag);
    g.armed = 1;
    MDB_dbi records = store_env_index(s->env)->records;
    for (int i = 0; i < n; i++) {
        uint8_t key[STORE_KEY_BYTES];
        store_record_key(key, &s->fingerprint, &hashes[i]);
        MDB_val k = {STORE_KEY_BYTES, key}, v;
        if (mdb_get(txn, records, &k, &v) != 0)
            continue;
        *resident += value_resident(v.mv_data, v.mv_size);
        *total += 1;
    }
    store_env_read_end(s->env, txn);
    return SHOAL_OK;
}

shoal_err store_state_lookup_keys(store_state *s, const common_hash *hashes, int n, int *present,
                                  shoal_diag *diag)
{
    return lookup(s, hashes, n, false, present, diag);
}

/* ---- flush, stats ---- */

shoal_err store_state_flush(store_state *s, int timeout_ms)
{
    struct timespec until;
    if (timeout_ms >= 0)
        deadline_after(&until, timeout_ms);
    shoal_err err = SHOAL_OK;
    pthread_mutex_lock(&s->mu);
    uint64_t target = s->enqueued_seq;
    s->flushers++;
    pthread_cond_signal(&s->work); /* cut a gathering delay short */
    while (s->done_seq < target) {
        int rc = timeout_ms < 0 ? pthread_cond_wait(&s->done, &s->mu)
                                : pthread_cond_timedwait(&s->done, &s->mu, &until);
        if (rc == ETIMEDOUT && s->done_seq < target) {
            err = SHOAL_ERR_TIMEOUT;
            break;
        }
    }
    s->flushers--;
    pthread_mutex_unlock(&s->mu);
    return err;
}

shoal_err store_state_stats_get(store_state *s, store_state_stats *out, shoal_diag *diag)
{
    memset(out, 0, sizeof *out);
    out->spill_bytes = s->spill_bytes;
    out->puts = atomic_load(&s->puts);
    out->drops = atomic_load(&s->drops);
    out->writes = atomic_load(&s->writes);
    out->duplicates = atomic_load(&s->duplicates);
    out->evictions = atomic_load(&s->evictions);
    out->hits = atomic_load(&s->hits);
    out->misses = atomic_load(&s->misses);
    out->refused = atomic_load(&s->refused);
    out->direct_reads = atomic_load(&s->direct_reads);
    out->map_full = atomic_load(&s->map_full);
    out->map_grows = atomic_load(&s->map_grows);
    out->write_errors = atomic_load(&s->write_errors);
    out->touch_drops = atomic_load(&s->touch_drops);
    pthread_mutex_lock(&s->mu);
    out->queued = s->count;
    out->queue_slots = s->cap;
    pthread_mutex_unlock(&s->mu);
    if (!store_env_owned(s->env))
        return foreign(diag);
    out->map_bytes = store_env_map_bytes(s->env);
    MDB_txn *txn;
    store_guard g;
    shoal_err err = store_env_read_begin(s->env, &txn, &g, diag);
    if (err != SHOAL_OK)
        return err;
    if (sigsetjmp(g.jb, 1) != 0)
        return store_env_read_fault(s->env, &g, diag);
    g.armed = 1;
    uint64_t totals[STORE_TOTALS];
    int rc = store_index_totals(txn, store_env_index(s->env), totals);
    store_env_read_end(s->env, txn);
    if (rc != 0)
        return store_env_error(s->env, rc, "reading the totals", diag);
    out->records = totals[STORE_TOTAL_RECORDS];
    out->bytes = totals[STORE_TOTAL_BYTES];
    return SHOAL_OK;
}

shoal_err store_state_reader_check(store_state *s, int *cleared, shoal_diag *diag)
{
    if (!store_env_owned(s->env))
        return foreign(diag);
    return store_env_reader_check(s->env, cleared, diag);
}
