#include "shm_segment.h"

#include "common/common_assert.h"
#include "common/common_log.h"
#include "common/common_time.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct shm_segment {
    char path[SHM_CLUSTER_NAME_MAX + 8];
    void *base;
    size_t bytes;
    bool creator;
};

bool shm_pid_alive(pid_t pid)
{
    return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM);
}

bool shm_cluster_name_ok(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n >= SHM_CLUSTER_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_'))
            return false;
    }
    return true;
}

static size_t align_up(size_t x, size_t a)
{
    return (x + a - 1) & ~(a - 1);
}

static uint32_t index_slots_for(const shm_segment_sizes *z)
{
    uint64_t want = 2ull * (uint64_t)z->workers * (uint64_t)z->pages;
    uint32_t slots = 64;
    while (slots < want)
        slots <<= 1;
    return slots;
}

/* The layout, carved in one pass; offsets go into h when not NULL. */
static size_t layout(const shm_segment_sizes *z, shm_segment_header *h)
{
    size_t off = align_up(sizeof(shm_segment_header), 64);
    size_t workers = off;
    off = align_up(off + (size_t)z->workers * sizeof(shm_worker_row), 64);
    size_t pages = off;
    off = align_up(off + (size_t)z->workers * (size_t)z->pages * sizeof(shm_page_row), 64);
    size_t index = off;
    uint32_t slots = index_slots_for(z);
    off = align_up(off + (size_t)slots * sizeof(uint64_t), 64);
    size_t leases = off;
    off = align_up(off + (size_t)z->leases * sizeof(shm_lease_slot), 64);
    size_t streams = off;
    off += (size_t)z->workers * (size_t)z->streams * sizeof(shm_stream_row);
    if (h) {
        h->workers_max = z->workers;
        h->pages_max = z->pages;
        h->streams_max = z->streams;
        h->leases_max = z->leases;
        h->index_slots = slots;
        h->workers_offset = workers;
        h->pages_offset = pages;
        h->index_offset = index;
        h->leases_offset = leases;
        h->streams_offset = streams;
    }
    return align_up(off, 4096);
}

void shm_segment_sizes_default(int workers, shm_segment_sizes *out)
{
    out->workers = workers;
    out->pages = 65536;
    out->streams = 512;
    out->leases = 65536;
}

size_t shm_segment_bytes(const shm_segment_sizes *sizes)
{
    return layout(sizes, NULL);
}

static bool good_sizes(const shm_segment_sizes *z)
{
    return z->workers >= 1 && z->workers <= SHM_SEGMENT_WORKERS_MAX && z->pages >= 1 &&
           z->pages <= (1 << 24) && z->streams >= 1 && z->streams <= 65536 && z->leases >= 1 &&
           z->leases <= (1 << 24);
}

/* Checks a mapped header; diag says what to do when it is not ours. */
static shoal_err check_header(const shm_segment_header *h, size_t bytes, const char *path,
                              shoal_diag *diag)
{
    if (bytes < sizeof *h || h->magic != SHM_SEGMENT_MAGIC)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                              "/dev/shm%s is not a shoal segment; remove it or pick another "
                              "--cluster name",
                              path);
    if (h->version != SHM_SEGMENT_VERSION)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                              "/dev/shm%s has layout version %u, this build uses %u: stop the "
                              "cluster that made it and start one build throughout",
                              path, h->version, SHM_SEGMENT_VERSION);
    shm_segment_sizes z = {h->workers_max, h->pages_max, h->streams_max, h->leases_max};
    shm_segment_header want;
    if (!good_sizes(&z) || h->total_bytes != bytes || h->header_bytes != sizeof *h ||
        layout(&z, &want) != bytes || want.index_slots != h->index_slots ||
        want.workers_offset != h->workers_offset || want.pages_offset != h->pages_offset ||
        want.index_offset != h->index_offset || want.leases_offset != h->leases_offset ||
        want.streams_offset != h->streams_offset)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                              "/dev/shm%s: header says %llu bytes, the object has %zu", path,
                              (unsigned long long)h->total_bytes, bytes);
    return SHOAL_OK;
}

static shoal_err map_fd(int fd, size_t bytes, bool read_only, shm_segment *s, shoal_diag *diag)
{
    void *p = mmap(NULL, bytes, read_only ? PROT_READ : PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return shoal_diag_set(diag, SHOAL_ERR_IO, "/dev/shm%s: cannot map: %s", s->path,
                              strerror(errno));
    s->base = p;
    s->bytes = bytes;
    return SHOAL_OK;
}

int shm_segment_sweep_stale(void)
{
    DIR *d = opendir("/dev/shm");
    if (!d)
        return 0;
    int removed = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strncmp(de->d_name, "shoal.", 6) != 0 || !shm_cluster_name_ok(de->d_name + 6))
            continue;
        shm_segment *old = NULL;
        if (shm_segment_attach(de->d_name + 6, true, &old, NULL) != SHOAL_OK)
            continue; /* not ours, or of another layout: left alone */
        pid_t creator = shm_segment_header_of(old)->creator_pid;
        shm_segment_close(old);
        if (shm_pid_alive(creator))
            continue;
        char path[sizeof de->d_name + 1];
        snprintf(path, sizeof path, "/%s", de->d_name);
        if (shm_unlink(path) == 0) {
            LOG_WARN("removed /dev/shm/%s, left by a coordinator (pid %d) that is gone", de->d_name,
                     (int)creator);
            removed++;
        }
    }
    closedir(d);
    return removed;
}

shoal_err shm_segment_create(const char *name, const shm_segment_sizes *sizes, shm_segment **out,
                             shoal_diag *diag)
{
    shoal_err err;
    *out = NULL;
    if (!shm_cluster_name_ok(name))
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "cluster name '%s': use 1 to %d letters, digits, '-' or '_'", name,
                              SHM_CLUSTER_NAME_MAX - 1);
    shm_segment *s = calloc(1, sizeof *s);
    if (!s)
        return SHOAL_ERR_NOMEM;
    if (!good_sizes(sizes)) {
        free(s);
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "segment sizes: %d workers (1..%d), %d pages, %d streams, %d leases "
                              "per segment must be positive and at most 2^24",
                              sizes->workers, SHM_SEGMENT_WORKERS_MAX, sizes->pages, sizes->streams,
                              sizes->leases);
    }
    snprintf(s->path, sizeof s->path, "/shoal.%s", name);
    size_t bytes = layout(sizes, NULL);
    shm_segment_sweep_stale(); /* other names' leftovers: a killed cluster's */
    int fd = shm_open(s->path, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 && errno == EEXIST) {
        /* A segment is there: refuse a live cluster's, replace a dead one's. */
        shm_segment *old = NULL;
        shoal_diag why = {{0}};
        err = shm_segment_attach(name, true, &old, &why);
        if (!err) {
            pid_t creator = shm_segment_header_of(old)->creator_pid;
            shm_segment_close(old);
            if (shm_pid_alive(creator)) {
                err = shoal_diag_set(diag, SHOAL_ERR_INVALID,
                                     "cluster '%s' already runs (coordinator pid %d); stop it or "
                                     "pick another --cluster name",
                                     name, (int)creator);
                goto out_free;
            }
            LOG_WARN("replacing /dev/shm%s left by a coordinator (pid %d) that is gone", s->path,
                     (int)creator);
        } else if (err == SHOAL_ERR_FORMAT) {
            shoal_diag_set(diag, err, "%s", why.msg);
            goto out_free;
        }
        shm_unlink(s->path);
        fd = shm_open(s->path, O_CREAT | O_EXCL | O_RDWR, 0600);
    }
    if (fd < 0) {
        err = shoal_diag_set(diag, SHOAL_ERR_IO, "/dev/shm%s: cannot create: %s", s->path,
                             strerror(errno));
        goto out_free;
    }
    s->creator = true;
    /* Reserve every byte now: a full tmpfs fails here, not with SIGBUS in
     * the middle of a run. */
    int rc = posix_fallocate(fd, 0, (off_t)bytes);
    if (rc != 0) {
        err = shoal_diag_set(diag, SHOAL_ERR_NOMEM,
                             "/dev/shm%s: cannot reserve %zu bytes: %s (is /dev/shm full? free "
                             "room there or lower --segment-pages)",
                             s->path, bytes, strerror(rc));
        goto out_close_fd;
    }
    if ((err = map_fd(fd, bytes, false, s, diag)))
        goto out_close_fd;
    close(fd);
    shm_segment_header *h = s->base;
    memset(h, 0, bytes);
    h->version = SHM_SEGMENT_VERSION;
    h->header_bytes = sizeof *h;
    h->total_bytes = bytes;
    h->created_ns = common_wall_ns();
    h->creator_pid = (int32_t)getpid();
    layout(sizes, h);
    snprintf(h->cluster, sizeof h->cluster, "%s", name);
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&h->lock, &attr);
    pthread_mutexattr_destroy(&attr);
    /* the magic last: an attacher never sees a half-made header as ours */
    atomic_thread_fence(memory_order_release);
    h->magic = SHM_SEGMENT_MAGIC;
    *out = s;
    return SHOAL_OK;
out_close_fd:
    close(fd);
    shm_unlink(s->path);
out_free:
    free(s);
    return err;
}

shoal_err shm_segment_attach(const char *name, bool read_only, shm_segment **out, shoal_diag *diag)
{
    shoal_err err;
    *out = NULL;
    if (!shm_cluster_name_ok(name))
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "cluster name '%.64s' is not valid: 1 to %d letters, digits, '-' "
                              "or '_'",
                              name, SHM_CLUSTER_NAME_MAX - 1);
    shm_segment *s = calloc(1, sizeof *s);
    if (!s)
        return SHOAL_ERR_NOMEM;
    snprintf(s->path, sizeof s->path, "/shoal.%s", name);
    /* O_NONBLOCK: a FIFO that someone left under the name must not hang
     * the open (/dev/shm is writable by every local user) */
    int fd = shm_open(s->path, (read_only ? O_RDONLY : O_RDWR) | O_NONBLOCK, 0);
    if (fd < 0) {
        err = shoal_diag_set(diag, errno == ENOENT ? SHOAL_ERR_NOT_FOUND : SHOAL_ERR_IO,
                             "/dev/shm%s: %s (is the cluster '%s' running?)", s->path,
                             strerror(errno), name);
        goto out_free;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        err = shoal_diag_set(diag, SHOAL_ERR_IO, "/dev/shm%s: %s", s->path, strerror(errno));
        goto out_close_fd;
    }
    if (!S_ISREG(st.st_mode) || (size_t)st.st_size < sizeof(shm_segment_header)) {
        err = shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                             "/dev/shm%s is not a shoal segment (%s of %lld bytes); remove it "
                             "if nothing of yours uses it",
                             s->path, S_ISREG(st.st_mode) ? "a file" : "not a plain file",
                             (long long)st.st_size);
        goto out_close_fd;
    }
    if ((err = map_fd(fd, (size_t)st.st_size, read_only, s, diag)))
        goto out_close_fd;
    close(fd);
    if ((err = check_header(s->base, s->bytes, s->path, diag))) {
        munmap(s->base, s->bytes);
        goto out_free;
    }
    *out = s;
    return SHOAL_OK;
out_close_fd:
    close(fd);
out_free:
    free(s);
    return err;
}

void shm_segment_close(shm_segment *s)
{
    if (!s)
        return;
    if (s->base)
        munmap(s->base, s->bytes);
    if (s->creator)
        shm_unlink(s->path);
    free(s);
}

shm_segment_header *shm_segment_header_of(shm_segment *s)
{
    return s->base;
}

const char *shm_segment_name(const shm_segment *s)
{
    return s->path + 7; /* after "/shoal." */
}

shm_worker_row *shm_segment_worker(shm_segment *s, int index)
{
    shm_segment_header *h = s->base;
    SHOAL_ASSERT(index >= 0 && index < h->workers_max);
    return (shm_worker_row *)((char *)s->base + h->workers_offset) + index;
}

shm_page_row *shm_segment_pages(shm_segment *s, int worker)
{
    shm_segment_header *h = s->base;
    SHOAL_ASSERT(worker >= 0 && worker < h->workers_max);
    return (shm_page_row *)((char *)s->base + h->pages_offset) +
           (size_t)worker * (size_t)h->pages_max;
}

shm_stream_row *shm_segment_streams(shm_segment *s, int worker)
{
    shm_segment_header *h = s->base;
    SHOAL_ASSERT(worker >= 0 && worker < h->workers_max);
    return (shm_stream_row *)((char *)s->base + h->streams_offset) +
           (size_t)worker * (size_t)h->streams_max;
}

shm_lease_slot *shm_segment_leases(shm_segment *s)
{
    shm_segment_header *h = s->base;
    return (shm_lease_slot *)((char *)s->base + h->leases_offset);
}

static uint64_t *index_of(shm_segment *s)
{
    shm_segment_header *h = s->base;
    return (uint64_t *)((char *)s->base + h->index_offset);
}

/* ---- prefix index: linear probing over the page rows' hashes ---- */

static uint64_t entry_of(int worker, int page)
{
    return ((uint64_t)(worker + 1) << 32) | (uint32_t)page;
}

static shm_page_row *row_of_entry(shm_segment *s, uint64_t e)
{
    return shm_segment_pages(s, (int)(e >> 32) - 1) + (uint32_t)e;
}

static uint32_t home_of(const shm_segment_header *h, const common_hash *hash)
{
    return (uint32_t)common_hash_u64(hash) & (h->index_slots - 1);
}

void shm_index_insert(shm_segment *s, int worker, int page, const common_hash *hash)
{
    shm_segment_header *h = s->base;
    uint64_t *ix = index_of(s);
    shm_page_row *r = shm_segment_pages(s, worker) + page;
    r->hash = *hash;
    atomic_fetch_or(&r->flags, SHM_PAGE_HASHED);
    uint32_t mask = h->index_slots - 1;
    uint32_t i = home_of(h, hash);
    while (atomic_load_explicit((_Atomic uint64_t *)&ix[i], memory_order_relaxed) != 0)
        i = (i + 1) & mask;
    atomic_store_explicit((_Atomic uint64_t *)&ix[i], entry_of(worker, page), memory_order_release);
    h->generation++;
}

/* Removes entry e at its slot, shifting later entries of the run back. */
static void index_delete(shm_segment *s, uint64_t e)
{
    shm_segment_header *h = s->base;
    uint64_t *ix = index_of(s);
    uint32_t mask = h->index_slots - 1;
    uint32_t i = home_of(h, &row_of_entry(s, e)->hash);
    while (ix[i] != e) {
        if (ix[i] == 0)
            return; /* not there (a repair rebuilt without it) */
        i = (i + 1) & mask;
    }
    uint32_t hole = i;
    for (uint32_t t = (i + 1) & mask; ix[t] != 0; t = (t + 1) & mask) {
        uint32_t home = home_of(h, &row_of_entry(s, ix[t])->hash);
        bool stays = hole <= t ? (home > hole && home <= t) : (home > hole || home <= t);
        if (!stays) {
            atomic_store_explicit((_Atomic uint64_t *)&ix[hole], ix[t], memory_order_release);
            hole = t;
        }
    }
    atomic_store_explicit((_Atomic uint64_t *)&ix[hole], 0, memory_order_release);
}

bool shm_index_remove(shm_segment *s, int worker, int page)
{
    shm_page_row *r = shm_segment_pages(s, worker) + page;
    if (atomic_load(&r->leases) > 0)
        return false;
    if (atomic_load(&r->flags) & SHM_PAGE_HASHED)
        index_delete(s, entry_of(worker, page));
    atomic_fetch_and(&r->flags, ~(uint32_t)(SHM_PAGE_HASHED | SHM_PAGE_STORED));
    ((shm_segment_header *)s->base)->generation++;
    return true;
}

/* Calls fn for every published page of `hash` (any worker). Stops when fn
 * returns false. */
static void index_each(shm_segment *s, const common_hash *hash,
                       bool (*fn)(void *ctx, int worker, int page), void *ctx)
{
    shm_segment_header *h = s->base;
    uint64_t *ix = index_of(s);
    uint32_t mask = h->index_slots - 1;
    for (uint32_t i = home_of(h, hash), n = 0; n <= mask; i = (i + 1) & mask, n++) {
        uint64_t e = atomic_load_explicit((_Atomic uint64_t *)&ix[i], memory_order_acquire);
        if (e == 0)
            return;
        int w = (int)(e >> 32) - 1, page = (int)(uint32_t)e;
        if (w < 0 || w >= h->workers_max || page >= h->pages_max)
            continue; /* a torn read by a lock-free reader */
        shm_page_row *r = shm_segment_pages(s, w) + page;
        if ((atomic_load(&r->flags) & SHM_PAGE_HASHED) && common_hash_equal(&r->hash, hash) &&
            !fn(ctx, w, page))
            return;
    }
}

/* The chain walk behind leads and leases: lead[w] = how many of
 * hashes[0..n) lead the chain and are published on w, for every worker but
 * `self` (-1: none) and, with live_only, only ready or draining ones.
 * Stops at the first block no counted worker extends. Returns the longest. */
typedef struct leads_walk {
    shm_segment *s;
    int32_t *lead;
    int block;
    int best;
    int self;
    bool live_only;
} leads_walk;

static bool extend_lead(void *ctx, int worker, int page)
{
    (void)page;
    leads_walk *w = ctx;
    if (worker == w->self || w->lead[worker] != w->block)
        return true;
    if (w->live_only) {
        uint32_t st = atomic_load(&shm_segment_worker(w->s, worker)->state);
        if (st != SHM_WORKER_READY && st != SHM_WORKER_DRAINING)
            return true;
    }
    w->lead[worker]++;
    if (w->lead[worker] > w->best)
        w->best = w->lead[worker];
    return true;
}

static int walk_leads(shm_segment *s, const common_hash *hashes, int n, int self, bool live_only,
                      int32_t *lead)
{
    shm_segment_header *h = s->base;
    for (int w = 0; w < h->workers_max; w++)
        lead[w] = 0;
    leads_walk walk = {s, lead, 0, 0, self, live_only};
    for (int b = 0; b < n && walk.best == b; b++) {
        walk.block = b;
        index_each(s, &hashes[b], extend_lead, &walk);
    }
    return walk.best;
}

int shm_index_leads(shm_segment *s, const common_hash *hashes, int n, int32_t *lead)
{
    return walk_leads(s, hashes, n, -1, false, lead);
}

/* ---- leases ---- */

static int lease_slot_take(shm_segment *s, int worker, int page, uint64_t epoch)
{
    shm_segment_header *h = s->base;
    shm_lease_slot *slots = shm_segment_leases(s);
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < h->leases_max; i++)
            if (slots[i].pid == 0) {
                slots[i].worker = worker;
                slots[i].page = page;
                slots[i].epoch = (uint32_t)epoch;
                slots[i].pid = (int32_t)getpid(); /* last: the slot is whole */
                return i;
            }
        if (pass == 0 && shm_lease_reclaim_locked(s) == 0)
            break;
    }
    return -1;
}

/* Drops lease slots of dead lessees and recounts every page's leases
 * from the slots that remain: the one way lease counts get repaired. A
 * slot half-written by a dead holder has pid 0 (written last): ignored.
 * Returns the slots dropped; with `always`, recounts even when none was. */
static int reclaim_and_recount(shm_segment *s, bool always)
{
    shm_segment_header *h = s->base;
    shm_lease_slot *slots = shm_segment_leases(s);
    int dropped = 0;
    for (int i = 0; i < h->leases_max; i++)
        if (slots[i].pid != 0 && !shm_pid_alive(slots[i].pid)) {
            memset(&slots[i], 0, sizeof slots[i]);
            dropped++;
        }
    if (dropped == 0 && !always)
        return 0;
    for (int w = 0; w < h->workers_max; w++) {
        shm_page_row *rows = shm_segment_pages(s, w);
        for (int p = 0; p < h->pages_max; p++)
            atomic_store(&rows[p].leases, 0);
    }
    for (int i = 0; i < h->leases_max; i++) {
        shm_lease_slot *l = &slots[i];
        if (l->pid != 0 && l->worker >= 0 && l->worker < h->workers_max && l->page >= 0 &&
            l->page < h->pages_max &&
            /* a lease on a process that is gone holds nothing */
            (uint32_t)atomic_load(&shm_segment_worker(s, l->worker)->epoch) == l->epoch)
            atomic_fetch_add(&shm_segment_pages(s, l->worker)[l->page].leases, 1);
    }
    atomic_fetch_add(&h->leases_reclaimed, (uint64_t)dropped);
    h->generation++;
    return dropped;
}

int shm_lease_reclaim_locked(shm_segment *s)
{
    return reclaim_and_recount(s, false);
}

/* index_each's callback: the page of one worker. */
typedef struct page_of_worker {
    int worker;
    int page;
} page_of_worker;

static bool find_on_worker(void *ctx, int worker, int page)
{
    page_of_worker *f = ctx;
    if (worker != f->worker)
        return true;
    f->page = page;
    return false;
}

void shm_lease_chain(shm_segment *s, int self, const common_hash *hashes, int n, int max,
                     shm_lease *lease)
{
    shm_segment_header *h = s->base;
    lease->count = 0;
    lease->worker = -1;
    if (n > max)
        n = max;
    if (n <= 0)
        return;
    int32_t lead[SHM_SEGMENT_WORKERS_MAX];
    shm_segment_lock(s);
    int best = walk_leads(s, hashes, n, self, true, lead), owner = -1;
    for (int w = 0; best > 0 && owner < 0; w++)
        if (lead[w] == best)
            owner = w;
    if (owner < 0) {
        shm_segment_unlock(s);
        return;
    }
    uint64_t epoch = atomic_load(&shm_segment_worker(s, owner)->epoch);
    shm_page_row *rows = shm_segment_pages(s, owner);
    for (int b = 0; b < best; b++) {
        page_of_worker f = {owner, -1};
        index_each(s, &hashes[b], find_on_worker, &f);
        if (f.page < 0)
            break;
        int slot = lease_slot_take(s, owner, f.page, epoch);
        if (slot < 0)
            break;
        atomic_fetch_add(&rows[f.page].leases, 1);
        atomic_fetch_add(&rows[f.page].uses, 1);
        lease->pages[lease->count] = f.page;
        lease->slots[lease->count] = slot;
        lease->count++;
        shm_test_pause("lease-locked"); /* a test kills us here, lock held */
    }
    lease->worker = owner;
    lease->epoch = epoch;
    atomic_fetch_add(&h->leases_taken, (uint64_t)lease->count);
    h->generation++;
    shm_segment_unlock(s);
}

void shm_lease_release(shm_segment *s, const shm_lease *lease)
{
    if (lease->count == 0)
        return;
    shm_segment_lock(s);
    shm_lease_slot *slots = shm_segment_leases(s);
    bool same = atomic_load(&shm_segment_worker(s, lease->worker)->epoch) == lease->epoch;
    shm_page_row *rows = shm_segment_pages(s, lease->worker);
    for (int i = 0; i < lease->count; i++) {
        shm_lease_slot *l = &slots[lease->slots[i]];
        if (l->pid != (int32_t)getpid() || l->worker != lease->worker || l->page != lease->pages[i])
            continue; /* reclaimed by a repair meanwhile */
        memset(l, 0, sizeof *l);
        if (same && atomic_load(&rows[lease->pages[i]].leases) > 0)
            atomic_fetch_sub(&rows[lease->pages[i]].leases, 1);
    }
    ((shm_segment_header *)s->base)->generation++;
    shm_segment_unlock(s);
}

/* ---- workers ---- */

/* Drops the slot's index entries and the leases on its pages. Lock held. */
static void worker_clear_locked(shm_segment *s, int index)
{
    shm_segment_header *h = s->base;
    shm_page_row *rows = shm_segment_pages(s, index);
    for (int p = 0; p < h->pages_max; p++) {
        if (atomic_load(&rows[p].flags) & SHM_PAGE_HASHED)
            index_delete(s, entry_of(index, p));
        memset(&rows[p], 0, sizeof rows[p]);
    }
    shm_lease_slot *slots = shm_segment_leases(s);
    for (int i = 0; i < h->leases_max; i++)
        if (slots[i].pid != 0 && slots[i].worker == index && slots[i].pid != (int32_t)getpid() &&
            !shm_pid_alive(slots[i].pid))
            memset(&slots[i], 0, sizeof slots[i]);
    memset(shm_segment_streams(s, index), 0, (size_t)h->streams_max * sizeof(shm_stream_row));
    h->generation++;
}

shoal_err shm_worker_register(shm_segment *s, int index, pid_t pid, const char *device, int pages,
                              uint64_t page_bytes, uint64_t *epoch, shoal_diag *diag)
{
    shm_segment_header *h = s->base;
    if (index < 0 || index >= h->workers_max)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "worker index %d: the segment of cluster '%s' has %d worker slots",
                              index, h->cluster, h->workers_max);
    if (pages < 1 || pages > h->pages_max)
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT,
                              "worker %d: %d KV pages, the segment of cluster '%s' has rows for "
                              "%d; start the coordinator with --segment-pages %d or lower "
                              "--kv-pages",
                              index, pages, h->cluster, h->pages_max, pages);
    shm_segment_lock(s);
    worker_clear_locked(s, index);
    shm_worker_row *w = shm_segment_worker(s, index);
    /* the slot's own facts outlive its processes */
    uint32_t drain = atomic_load(&w->drain), managed = atomic_load(&w->managed);
    int32_t exits = atomic_load(&w->exits), exit_code = atomic_load(&w->exit_code);
    uint64_t dead_ns = atomic_load(&w->dead_ns);
    uint64_t next = atomic_load(&w->epoch) + 1;
    memset((char *)w + sizeof w->state, 0, sizeof *w - sizeof w->state);
    atomic_store(&w->epoch, next);
    atomic_store(&w->drain, drain);
    atomic_store(&w->managed, managed);
    atomic_store(&w->exits, exits);
    atomic_store(&w->exit_code, exit_code);
    atomic_store(&w->dead_ns, dead_ns);
    w->pid = (int32_t)pid;
    snprintf(w->device, sizeof w->device, "%s", device);
    atomic_store(&w->pages_total, pages);
    atomic_store(&w->pages_free, pages);
    atomic_store(&w->page_bytes, page_bytes);
    atomic_store(&w->started_ns, common_wall_ns());
    atomic_store(&w->heartbeat_ns, common_wall_ns());
    atomic_store(&w->state, SHM_WORKER_READY);
    shm_segment_unlock(s);
    *epoch = next;
    return SHOAL_OK;
}

void shm_worker_forget(shm_segment *s, int index, shm_worker_state state, int exit_code)
{
    shm_segment_header *h = s->base;
    if (index < 0 || index >= h->workers_max)
        return;
    shm_segment_lock(s);
    worker_clear_locked(s, index);
    shm_lease_reclaim_locked(s);
    shm_worker_row *w = shm_segment_worker(s, index);
    atomic_store(&w->running, 0);
    atomic_store(&w->waiting, 0);
    atomic_store(&w->pages_active, 0);
    atomic_store(&w->pages_cached, 0);
    atomic_store(&w->pages_free, 0);
    atomic_store(&w->pages_total, 0);
    atomic_store(&w->exit_code, exit_code);
    atomic_store(&w->dead_ns, common_wall_ns());
    atomic_fetch_add(&w->exits, 1);
    atomic_store(&w->epoch, atomic_load(&w->epoch) + 1); /* old leases hold nothing now */
    atomic_store(&w->state, state);
    shm_segment_unlock(s);
}

/* ---- the lock ---- */

/* The last holder died inside its critical section: drop dead lessees'
 * slots, recount leases, and rebuild the index from live page rows. */
static void repair_locked(shm_segment *s)
{
    shm_segment_header *h = s->base;
    reclaim_and_recount(s, true);
    memset(index_of(s), 0, (size_t)h->index_slots * sizeof(uint64_t));
    uint64_t *ix = index_of(s);
    uint32_t mask = h->index_slots - 1;
    for (int w = 0; w < h->workers_max; w++) {
        shm_worker_row *row = shm_segment_worker(s, w);
        uint32_t st = atomic_load(&row->state);
        bool live =
            (st == SHM_WORKER_READY || st == SHM_WORKER_DRAINING) && shm_pid_alive(row->pid);
        shm_page_row *rows = shm_segment_pages(s, w);
        for (int p = 0; p < h->pages_max; p++) {
            if (!(atomic_load(&rows[p].flags) & SHM_PAGE_HASHED))
                continue;
            if (!live) {
                atomic_fetch_and(&rows[p].flags, ~(uint32_t)SHM_PAGE_HASHED);
                continue;
            }
            uint32_t i = home_of(h, &rows[p].hash);
            while (ix[i] != 0)
                i = (i + 1) & mask;
            ix[i] = entry_of(w, p);
        }
    }
    h->repairs++;
    h->generation++;
}

void shm_segment_lock(shm_segment *s)
{
    shm_segment_header *h = s->base;
    int rc = pthread_mutex_lock(&h->lock);
    if (rc == EOWNERDEAD) {
        repair_locked(s);
        pthread_mutex_consistent(&h->lock);
        rc = 0;
    }
    SHOAL_ASSERT(rc == 0);
}

void shm_segment_unlock(shm_segment *s)
{
    shm_segment_header *h = s->base;
    pthread_mutex_unlock(&h->lock);
}

void shm_test_pause(const char *point)
{
#ifdef SHOAL_TESTING
    const char *want = getenv("SHOAL_TEST_PAUSE");
    if (want && strcmp(want, point) == 0)
        raise(SIGSTOP);
#else
    (void)point;
#endif
}
