#include "worker_cluster.h"

#include "common/common_limits.h"
#include "common/common_log.h"
#include "common/common_time.h"
#include "shm/shm_arena.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Another worker's arena, mapped once per owner process. */
typedef struct peer {
    uint64_t epoch;        /* 0: not mapped */
    uint64_t failed_epoch; /* the epoch whose mapping failed last */
    uint64_t retry_ns;     /* ... asked for again from then (UINT64_MAX: never: no fit) */
    void *base;
    size_t bytes;
    uint64_t page_bytes;
    int page_count;
} peer;

struct worker_cluster {
    shm_segment *seg;
    int index;
    uint64_t epoch;
    worker_model *m;
    kernels_backend *be;
    shm_arena_exporter *exporter;
    peer peers[SHM_SEGMENT_WORKERS_MAX];
    int lease_max;
    int32_t *lease_pages, *lease_slots;
    uint64_t import_ns; /* time in import_fill that found something to lease */
    void *scratch;      /* one page (device): a peer mapping's first copy lands here */
    worker_stream_info *streams;
    int streams_max;
    int streams_written;
};

/* Attaches to the cluster's segment once its coordinator has made it. A
 * worker started on its own (systemd starts the worker and coordinator
 * units together) may come first, catch the segment half made (still
 * empty: IO, cannot map; no magic yet: FORMAT), or find the segment of a
 * killed cluster that its new coordinator has yet to replace: it waits for
 * a whole segment of a live coordinator, up to SHOAL_JOIN_WAIT_MS, then
 * gives the last reason. */
static shoal_err attach_when_up(const char *cluster, shm_segment **out, shoal_diag *diag)
{
    bool said = false;
    for (int waited_ms = 0;; waited_ms += 200) {
        shoal_err err = shm_segment_attach(cluster, false, out, diag);
        pid_t creator = err ? 0 : shm_segment_header_of(*out)->creator_pid;
        if (!err && shm_pid_alive(creator))
            return SHOAL_OK;
        if (err == SHOAL_ERR_INVALID || err == SHOAL_ERR_NOMEM)
            return err; /* a bad name: waiting changes nothing */
        if (!err) {
            shm_segment_close(*out);
            *out = NULL;
        }
        if (waited_ms >= SHOAL_JOIN_WAIT_MS && err && err != SHOAL_ERR_NOT_FOUND)
            return err; /* diag says what is wrong with the segment */
        if (waited_ms >= SHOAL_JOIN_WAIT_MS)
            return shoal_diag_set(diag, SHOAL_ERR_NOT_FOUND,
                                  "cluster '%s': %s after %d s; start shoal-coordinator with "
                                  "--cluster %s",
                                  cluster,
                                  err ? "no segment /dev/shm/shoal.<cluster>"
                                      : "only a segment left by a coordinator that is gone",
                                  SHOAL_JOIN_WAIT_MS / 1000, cluster);
        if (!said)
            LOG_INFO("waiting for the coordinator of cluster '%s' to create its segment", cluster);
        said = true;
        struct timespec ts = {0, 200 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

shoal_err worker_cluster_segment_pages(const char *cluster, int *pages, shoal_diag *diag)
{
    shm_segment *seg = NULL;
    shoal_err err = attach_when_up(cluster, &seg, diag);
    if (err)
        return err;
    *pages = shm_segment_header_of(seg)->pages_max;
    shm_segment_close(seg);
    return SHOAL_OK;
}

shoal_err worker_cluster_join(const char *cluster, int index, const char *device, worker_model *m,
                              worker_cluster **out, shoal_diag *diag)
{
    *out = NULL;
    worker_cluster *cl = calloc(1, sizeof *cl);
    if (!cl)
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM, "cluster: no memory");
    cl->index = index;
    cl->m = m;
    cl->be = worker_model_backend(m);
    shoal_err err = attach_when_up(cluster, &cl->seg, diag);
    if (err)
        goto fail;
    const kernels_kv_layout *kv = worker_model_kv_layout(m);
    err = shm_worker_register(cl->seg, index, getpid(), device, worker_model_kv_pages(m),
                              kv->page_bytes, &cl->epoch, diag);
    if (err)
        goto fail;
    atomic_store(&shm_segment_worker(cl->seg, index)->page_tokens, kv->page_tokens);
    cl->lease_max = worker_model_max_pages_per_stream(m);
    cl->streams_max = shm_segment_header_of(cl->seg)->streams_max;
    cl->lease_pages = malloc((size_t)cl->lease_max * sizeof *cl->lease_pages);
    cl->lease_slots = malloc((size_t)cl->lease_max * sizeof *cl->lease_slots);
    cl->streams = malloc((size_t)cl->streams_max * sizeof *cl->streams);
    cl->scratch = cl->be->alloc(cl->be, kv->page_bytes); /* NULL: imports only pay it later */
    if (!cl->lease_pages || !cl->lease_slots || !cl->streams) {
        err = shoal_diag_set(diag, SHOAL_ERR_NOMEM, "cluster: no memory");
        goto fail;
    }
    shm_arena_info info;
    memset(&info, 0, sizeof info);
    info.epoch = cl->epoch;
    info.arena_bytes = worker_model_arena_bytes(m);
    info.page_bytes = kv->page_bytes;
    info.page_count = worker_model_kv_pages(m);
    info.device = cl->be->host_memory ? -1 : atoi(device);
    snprintf(info.backend, sizeof info.backend, "%s", cl->be->name);
    err = shm_arena_export_start(cluster, index, worker_model_arena_fd(m), &info, &cl->exporter,
                                 diag);
    if (err)
        goto fail;
    LOG_INFO("worker %d: joined cluster '%s' (epoch %llu), serving %d pages of %zu bytes", index,
             cluster, (unsigned long long)cl->epoch, info.page_count, kv->page_bytes);
    *out = cl;
    return SHOAL_OK;
fail:
    worker_cluster_leave(cl);
    return err;
}

void worker_cluster_leave(worker_cluster *cl)
{
    if (!cl)
        return;
    shm_arena_export_stop(cl->exporter);
    for (int i = 0; i < SHM_SEGMENT_WORKERS_MAX; i++)
        if (cl->peers[i].base)
            cl->be->arena_unmap(cl->be, cl->peers[i].base, cl->peers[i].bytes);
    if (cl->scratch)
        cl->be->free(cl->be, cl->scratch);
    shm_segment_close(cl->seg);
    free(cl->lease_pages);
    free(cl->lease_slots);
    free(cl->streams);
    free(cl);
}

shm_segment *worker_cluster_segment(worker_cluster *cl)
{
    return cl->seg;
}

int worker_cluster_index(const worker_cluster *cl)
{
    return cl->index;
}

/* The fetch blocks the step loop, and so the worker's reports. */
_Static_assert(SHOAL_ARENA_FETCH_TIMEOUT_MS * 4 <= SHOAL_REPORT_LATE_MS,
               "a peer's arena fetch stays well inside the report window");

/* The owner's arena as of `epoch`, mapped here, or NULL (also, without
 * asking, while a failed fetch of that epoch waits for its retry). */
static peer *peer_map(worker_cluster *cl, int owner, uint64_t epoch)
{
    peer *p = &cl->peers[owner];
    if (p->base && p->epoch == epoch)
        return p;
    if (p->base) { /* the owner restarted: its old arena is of no use */
        cl->be->arena_unmap(cl->be, p->base, p->bytes);
        memset(p, 0, sizeof *p);
    }
    if (p->failed_epoch == epoch && common_mono_ns() < p->retry_ns)
        return NULL;
    shm_arena_info info;
    int fd = -1;
    shoal_diag diag = {{0}};
    if (shm_arena_fetch(shm_segment_name(cl->seg), owner, SHOAL_ARENA_FETCH_TIMEOUT_MS, &info, &fd,
                        &diag)) {
        LOG_WARN("worker %d: cannot import worker %d's pages: %s; computing them here, asking "
                 "again in %d ms",
                 cl->index, owner, diag.msg, SHOAL_ARENA_FETCH_RETRY_MS);
        p->failed_epoch = epoch;
        p->retry_ns = common_mono_ns() + (uint64_t)SHOAL_ARENA_FETCH_RETRY_MS * 1000000ull;
        return NULL;
    }
    const kernels_kv_layout *kv = worker_model_kv_layout(cl->m);
    void *base = NULL;
    if (info.epoch != epoch || info.page_bytes != kv->page_bytes ||
        strcmp(info.backend, cl->be->name) != 0 ||
        cl->be->arena_import(cl->be, fd, info.arena_bytes, &base)) {
        LOG_WARN("worker %d: worker %d's arena does not fit (epoch %llu/%llu, page %llu/%zu "
                 "bytes, backend %s/%s)",
                 cl->index, owner, (unsigned long long)info.epoch, (unsigned long long)epoch,
                 (unsigned long long)info.page_bytes, kv->page_bytes, info.backend, cl->be->name);
        close(fd);
        p->failed_epoch = epoch;
        p->retry_ns = UINT64_MAX;
        return NULL;
    }
    close(fd);
    *p = (peer){epoch, 0, 0, base, info.arena_bytes, info.page_bytes, info.page_count};
    /* The first copy through a new mapping sets up the path between the
     * devices (about 10 ms across two H200s): do it now, while idle. */
    if (cl->scratch && (cl->be->copy(cl->be, cl->scratch, base, kv->page_bytes) ||
                        cl->be->sync(cl->be)))
        LOG_WARN("worker %d: a first copy from worker %d's arena failed", cl->index, owner);
    LOG_INFO("worker %d: mapped worker %d's arena (%.1f GiB)", cl->index, owner,
             (double)info.arena_bytes / (1ull << 30));
    return p;
}

void worker_cluster_idle(worker_cluster *cl)
{
    int workers = shm_segment_header_of(cl->seg)->workers_max;
    for (int w = 0; w < workers; w++) {
        if (w == cl->index)
            continue;
        shm_worker_row *row = shm_segment_worker(cl->seg, w);
        uint64_t epoch = atomic_load(&row->epoch);
        if (atomic_load(&row->state) == SHM_WORKER_READY && epoch != cl->peers[w].epoch)
            peer_map(cl, w, epoch); /* NULL at once while a failed fetch waits to retry */
    }
}

static int import_fill(void *ctx, worker_pages *pages, uint64_t stream, const common_hash *hashes,
                       const common_hash *parent, int n, int32_t *out)
{
    worker_cluster *cl = ctx;
    if (n > cl->lease_max)
        n = cl->lease_max;
    shm_lease lease = {.pages = cl->lease_pages, .slots = cl->lease_slots};
    uint64_t t0 = common_mono_ns();
    shm_lease_chain(cl->seg, cl->index, hashes, n, n, &lease);
    if (lease.count == 0)
        return 0;
    peer *p = peer_map(cl, lease.worker, lease.epoch);
    int k = 0;
    if (p) {
        shm_test_pause("leased"); /* tests kill the owner or us here */
        size_t pb = worker_model_kv_layout(cl->m)->page_bytes;
        unsigned char *dst = worker_model_arena(cl->m);
        const unsigned char *src = p->base;
        for (; k < lease.count; k++) {
            if (lease.pages[k] >= p->page_count)
                break;
            int pg = worker_pages_alloc(pages, stream);
            if (pg < 0)
                break;
            out[k] = pg;
        }
        /* one copy per run of pages consecutive on both sides */
        shoal_err err = SHOAL_OK;
        for (int i = 0; i < k && !err;) {
            int j = i + 1;
            while (j < k && out[j] == out[j - 1] + 1 && lease.pages[j] == lease.pages[j - 1] + 1)
                j++;
            err = cl->be->copy(cl->be, dst + (size_t)out[i] * pb,
                               src + (size_t)lease.pages[i] * pb, (size_t)(j - i) * pb);
            i = j;
        }
        if (!err)
            err = cl->be->sync(cl->be); /* done reading before the lease ends */
        if (err) {
            LOG_WARN("worker %d: copying pages from worker %d failed: %s", cl->index,
                     lease.worker, shoal_strerror(err));
            for (int i = 0; i < k; i++)
                worker_pages_unref(pages, out[i]);
            k = 0;
        }
    }
    shm_lease_release(cl->seg, &lease);
    for (int i = 0; i < k; i++)
        worker_pages_publish(pages, out[i], &hashes[i], i == 0 ? parent : &hashes[i - 1]);
    cl->import_ns += common_mono_ns() - t0;
    return k;
}

worker_prefix_source worker_cluster_import_source(worker_cluster *cl)
{
    return (worker_prefix_source){import_fill, cl};
}

void worker_cluster_beat(worker_cluster *cl)
{
    atomic_store(&shm_segment_worker(cl->seg, cl->index)->heartbeat_ns, common_wall_ns());
}

void worker_cluster_report(worker_cluster *cl, worker_engine *e)
{
    shm_worker_row *w = shm_segment_worker(cl->seg, cl->index);
    worker_engine_stats st;
    worker_engine_stats_get(e, &st);
    atomic_store(&w->running, st.running);
    atomic_store(&w->waiting, st.waiting);
    atomic_store(&w->pages_total, st.pages.total);
    atomic_store(&w->pages_free, st.pages.free);
    atomic_store(&w->pages_active, st.pages.active);
    atomic_store(&w->pages_cached, st.pages.cached);
    atomic_store(&w->generated_tokens, st.generated_tokens);
    atomic_store(&w->prefix_lookups, st.pages.lookups);
    atomic_store(&w->prefix_hits, st.pages.hits);
    atomic_store(&w->import_tokens, st.import_tokens);
    atomic_store(&w->import_ns, cl->import_ns);
    atomic_store(&w->restore_tokens, st.restore_tokens);
    atomic_store(&w->cached_tokens, st.cached_tokens - st.import_tokens - st.restore_tokens);
    atomic_store(&w->prompt_tokens, st.prompt_tokens);
    atomic_store(&w->state_slots, st.state_slots);
    atomic_store(&w->states_running, st.state_slots ? st.running : 0);
    atomic_store(&w->slot_bytes, st.slot_bytes);
    atomic_store(&w->checkpoints_max, st.checkpoints.capacity);
    atomic_store(&w->checkpoints_held, st.checkpoints.held);
    atomic_store(&w->checkpoint_hits, st.checkpoints.hits);
    atomic_store(&w->heartbeat_ns, common_wall_ns());
    int n = worker_engine_streams(e, cl->streams, cl->streams_max);
    shm_stream_row *rows = shm_segment_streams(cl->seg, cl->index);
    for (int i = 0; i < n; i++) {
        const worker_stream_info *s = &cl->streams[i];
        shm_stream_row *r = &rows[i];
        if (atomic_load(&r->id) != s->id) {
            atomic_store(&r->id, s->id);
            atomic_store(&r->started_ns, common_wall_ns());
        }
        atomic_store(&r->state, !s->running     ? SHM_STREAM_WAITING
                                : s->prefilling ? SHM_STREAM_PREFILL
                                                : SHM_STREAM_DECODE);
        atomic_store(&r->prompt_tokens, s->prompt_tokens);
        atomic_store(&r->tokens, s->tokens);
        atomic_store(&r->generated, s->generated);
        atomic_store(&r->pages, s->pages);
        atomic_store(&r->cached_tokens, s->cached_tokens);
    }
    for (int i = n; i < cl->streams_written; i++) {
        atomic_store(&rows[i].state, SHM_STREAM_NONE);
        atomic_store(&rows[i].id, 0);
    }
    cl->streams_written = n;
    /* Here the row's counts and the page rows agree (one thread writes
     * both): a test stops us here to compare shoalctl with them. */
    shm_test_pause("reported");
}
