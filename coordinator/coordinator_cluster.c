/* coordinator_cluster.c: the cluster's options, the --workers list, the
 * runtime directory, open and close, and the stats and health it reports
 * (shared types in coordinator_cluster_internal.h). */
#include "coordinator_cluster_internal.h"

#include "common/common_log.h"
#include "common/common_time.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Slots listened on with --workers none: workers started elsewhere (by
 * systemd's shoal-worker@N) dial worker-N.ipc for N below this. */
enum { NONE_SLOTS = 8 };

void coordinator_cluster_options_default(coordinator_cluster_options *o)
{
    memset(o, 0, sizeof *o);
    o->workers = "auto";
    o->runtime_dir = "/tmp/shoal";
    o->worker_path = "shoal-worker";
    o->route = COORDINATOR_ROUTE_PREFIX;
    o->state_checkpoints = o->checkpoint_interval = -1;
    o->heartbeat_ms = 200;
    o->dead_after_ms = 3000;
    o->step_timeout_s = SHOAL_STEP_TIMEOUT_S;
    o->start_timeout_ms = 600000;
    o->restart_reset_ms = 60000;
}

/* GPUs the NVIDIA driver shows, without touching them. */
static int count_gpus(void)
{
    int n = 0;
    char path[32];
    for (int i = 0; i < COORDINATOR_WORKERS_MAX; i++) {
        snprintf(path, sizeof path, "/dev/nvidia%d", i);
        if (access(path, F_OK) == 0)
            n++;
    }
    return n;
}

static shoal_err parse_workers(coordinator_cluster *c, shoal_diag *diag)
{
    const char *spec = c->o.workers;
    if (strcmp(spec, "none") == 0) {
        c->n = NONE_SLOTS;
        for (int i = 0; i < c->n; i++)
            snprintf(c->w[i].device, sizeof c->w[i].device, "?");
        return SHOAL_OK;
    }
    if (strcmp(spec, "auto") == 0) {
        int gpus = count_gpus();
        c->n = gpus ? gpus : 1;
        for (int i = 0; i < c->n; i++) {
            c->w[i].ours = true;
            if (gpus)
                snprintf(c->w[i].device, sizeof c->w[i].device, "%d", i);
            else
                snprintf(c->w[i].device, sizeof c->w[i].device, "cpu");
        }
        return SHOAL_OK;
    }
    const char *p = spec;
    while (*p) {
        size_t len = strcspn(p, ",");
        if (c->n == COORDINATOR_WORKERS_MAX)
            return shoal_diag_set(diag, SHOAL_ERR_LIMIT, "--workers: more than %d workers",
                                  COORDINATOR_WORKERS_MAX);
        bool ok = len > 0 && len < sizeof c->w[0].device;
        if (ok && !(len == 3 && strncmp(p, "cpu", 3) == 0))
            for (size_t i = 0; i < len; i++)
                ok = ok && p[i] >= '0' && p[i] <= '9';
        if (!ok)
            return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                                  "--workers '%s': expected auto, none, or a comma-separated list "
                                  "of GPU indices and 'cpu'",
                                  spec);
        c->w[c->n].ours = true;
        snprintf(c->w[c->n].device, sizeof c->w[c->n].device, "%.*s", (int)len, p);
        c->n++;
        p += len;
        if (*p == ',')
            p++;
    }
    if (c->n == 0)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID, "--workers: empty list");
    return SHOAL_OK;
}

static shoal_err make_runtime_dir(const char *dir, shoal_diag *diag)
{
    if (mkdir(dir, 0700) != 0 && errno != EEXIST)
        return shoal_diag_set(diag, SHOAL_ERR_IO, "%s: cannot create the runtime directory: %s",
                              dir, strerror(errno));
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid())
        return shoal_diag_set(diag, SHOAL_ERR_IO,
                              "%s: not a directory of this user; pick another --runtime-dir", dir);
    chmod(dir, 0700);
    return SHOAL_OK;
}

shoal_err coordinator_cluster_open(const coordinator_cluster_options *o, coordinator_cluster **out,
                                   shoal_diag *diag)
{
    shoal_err err;
    *out = NULL;
    coordinator_cluster *c = calloc(1, sizeof *c);
    if (!c)
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM, "cluster: no memory");
    c->o = *o;
    c->model_dir = strdup(o->model_dir ? o->model_dir : "");
    c->runtime_dir = strdup(o->runtime_dir);
    c->worker_path = strdup(o->worker_path);
    c->load_format = o->load_format ? strdup(o->load_format) : NULL;
    c->kv_dtype = o->kv_dtype ? strdup(o->kv_dtype) : NULL;
    c->state_dir = o->state_dir ? strdup(o->state_dir) : NULL;
    c->spill_gib = o->spill_gib ? strdup(o->spill_gib) : NULL;
    c->restore_mode = o->restore_mode ? strdup(o->restore_mode) : NULL;
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->changed, NULL);
    c->next_id = 1;
#ifdef SHOAL_TESTING /* a test's fault: test builds only */
    const char *hold = getenv("SHOAL_TEST_REAP_HOLD_MS");
    c->test_reap_hold_ms = hold ? atoi(hold) : 0;
#endif
    if (!c->model_dir || !c->runtime_dir || !c->worker_path) {
        err = shoal_diag_set(diag, SHOAL_ERR_NOMEM, "cluster: no memory");
        goto out_close;
    }
    if ((err = parse_workers(c, diag)) || (err = make_runtime_dir(c->runtime_dir, diag)))
        goto out_close;
    if (o->cluster)
        snprintf(c->cluster, sizeof c->cluster, "%s", o->cluster);
    else
        snprintf(c->cluster, sizeof c->cluster, "shoal-%d", (int)getpid());
    shm_segment_sizes sizes;
    shm_segment_sizes_default(c->n, &sizes);
    if (o->segment_pages > 0)
        sizes.pages = o->segment_pages;
    else if (o->kv_pages > 0)
        sizes.pages = o->kv_pages;
    if ((err = shm_segment_create(c->cluster, &sizes, &c->seg, diag)))
        goto out_close;
    atomic_store(&shm_segment_header_of(c->seg)->coordinator_pid, (int32_t)getpid());
    LOG_INFO("cluster '%s': segment /dev/shm/shoal.%s, %d worker slots of %d pages (%.1f MiB)",
             c->cluster, c->cluster, sizes.workers, sizes.pages,
             (double)shm_segment_bytes(&sizes) / 1048576.0);
    for (int i = 0; i < c->n; i++) {
        cworker *w = &c->w[i];
        w->c = c;
        w->index = i;
        /* shoalctl undrain says who brings a drained worker back */
        atomic_store(&shm_segment_worker(c->seg, i)->managed, w->ours);
        w->prefix = calloc(PREFIX_SLOTS, sizeof *w->prefix);
        if (!w->prefix) {
            err = shoal_diag_set(diag, SHOAL_ERR_NOMEM, "cluster: no memory");
            goto out_close;
        }
        if (snprintf(w->sock, sizeof w->sock, "%s/worker-%d.ipc", c->runtime_dir, i) >=
            (int)sizeof w->sock) {
            err = shoal_diag_set(diag, SHOAL_ERR_LIMIT, "%s: path too long", c->runtime_dir);
            goto out_close;
        }
        if ((err = shm_channel_listen(w->sock, &w->ch, diag)))
            goto out_close;
        if (pthread_create(&w->rx, NULL, cluster_rx_main, w) != 0) {
            err = shoal_diag_set(diag, SHOAL_ERR_NOMEM, "cluster: cannot start a thread");
            goto out_close;
        }
        w->rx_started = true;
    }
    pthread_mutex_lock(&c->lock);
    for (int i = 0; i < c->n; i++)
        if (c->w[i].ours)
            cluster_spawn(c, &c->w[i]);
    /* Wait for every worker we started (or, with none, for one) to load. */
    long long deadline = common_mono_ms() + o->start_timeout_ms;
    for (;;) {
        int ready = 0, expected = 0, failed = -1;
        for (int i = 0; i < c->n; i++) {
            cworker *w = &c->w[i];
            ready += w->state == W_ALIVE;
            expected += w->ours;
            int status;
            if (w->ours && w->state == W_STARTING && w->pid > 0 &&
                waitpid(w->pid, &status, WNOHANG) == w->pid) {
                w->pid = 0;
                w->state = W_DEAD;
                failed = i;
            }
        }
        if (failed >= 0) {
            err = shoal_diag_set(diag, SHOAL_ERR_BROKEN,
                                 "worker %d exited while starting (its messages are above); "
                                 "check --model and the worker flags",
                                 failed);
            break;
        }
        if ((expected && ready == expected) || (!expected && ready > 0)) {
            err = SHOAL_OK;
            break;
        }
        if (common_mono_ms() > deadline) {
            err = shoal_diag_set(diag, SHOAL_ERR_TIMEOUT,
                                 "%d of %d workers ready after %d ms; raise the start timeout or "
                                 "check the workers' messages",
                                 ready, expected ? expected : 1, o->start_timeout_ms);
            break;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&c->changed, &c->lock, &ts);
    }
    pthread_mutex_unlock(&c->lock);
    if (err)
        goto out_close;
    if (pthread_create(&c->supervisor, NULL, cluster_supervisor_main, c) != 0) {
        err = shoal_diag_set(diag, SHOAL_ERR_NOMEM, "cluster: cannot start a thread");
        goto out_close;
    }
    c->supervisor_started = true;
    atomic_store(&c->supervisor_ran_ms, common_mono_ms());
    *out = c;
    return SHOAL_OK;
out_close:
    coordinator_cluster_close(c);
    return err;
}

void coordinator_cluster_close(coordinator_cluster *c)
{
    if (!c)
        return;
    shm_header bye;
    shm_header_init(&bye, SHM_MSG_SHUTDOWN, sizeof bye, 0);
    pthread_mutex_lock(&c->lock);
    atomic_store(&c->stopping, true);
    while (c->supervisor_started && !c->supervisor_parked) /* no more restarts */
        pthread_cond_wait(&c->changed, &c->lock);
    pthread_mutex_unlock(&c->lock);
    for (int i = 0; i < c->n; i++)
        if (c->w[i].ch && c->w[i].state == W_ALIVE)
            shm_channel_send(c->w[i].ch, &bye, sizeof bye, 200);
    /* Give workers a moment to finish (learning ones write their states
     * first), then make sure they are gone. */
    long long deadline =
        common_mono_ms() + (c->state_dir ? SHOAL_STATES_SHUTDOWN_WRITE_MS + 5000 : 3000);
    for (int i = 0; i < c->n; i++) {
        cworker *w = &c->w[i];
        if (w->dying > 0) /* killed already: it ends */
            waitpid(w->dying, NULL, 0);
        w->dying = 0;
        if (!w->ours || w->pid <= 0)
            continue;
        while (waitpid(w->pid, NULL, WNOHANG) == 0) {
            if (common_mono_ms() > deadline) {
                kill(w->pid, SIGKILL);
                waitpid(w->pid, NULL, 0);
                break;
            }
            struct timespec ts = {0, 10 * 1000000L};
            nanosleep(&ts, NULL);
        }
        w->pid = 0;
    }
    pthread_mutex_lock(&c->lock);
    c->workers_gone = true;
    pthread_cond_broadcast(&c->changed);
    pthread_mutex_unlock(&c->lock);
    if (c->supervisor_started)
        pthread_join(c->supervisor, NULL);
    if (c->state_dir) /* one may have been killed above */
        cluster_states_reader_check(c);
    for (int i = 0; i < c->n; i++) {
        cworker *w = &c->w[i];
        if (w->rx_started)
            pthread_join(w->rx, NULL);
        shm_channel_close(w->ch);
        if (w->sock[0])
            unlink(w->sock);
        free(w->prefix);
    }
    for (int b = 0; b < BUCKETS; b++)
        while (c->buckets[b]) {
            cstream *s = c->buckets[b];
            c->buckets[b] = s->next;
            cluster_stream_free(s);
        }
    shm_segment_close(c->seg);
    pthread_cond_destroy(&c->changed);
    pthread_mutex_destroy(&c->lock);
    free(c->model_dir);
    free(c->runtime_dir);
    free(c->worker_path);
    free(c->load_format);
    free(c->kv_dtype);
    free(c->state_dir);
    free(c->spill_gib);
    free(c->restore_mode);
    free(c);
}

int coordinator_cluster_vocab(const coordinator_cluster *c)
{
    return c->vocab;
}

int coordinator_cluster_max_model_len(const coordinator_cluster *c)
{
    return c->max_model_len;
}

void coordinator_cluster_stats_get(coordinator_cluster *c, coordinator_cluster_stats *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&c->lock);
    out->workers = c->n;
    out->streams = c->live;
    out->resumed = c->resumed;
    for (int i = 0; i < c->n; i++) {
        const cworker *w = &c->w[i];
        coordinator_worker_stats *ws = &out->worker[i];
        ws->index = i;
        ws->pid = (int)w->pid;
        snprintf(ws->device, sizeof ws->device, "%s", w->device);
        ws->alive = w->state == W_ALIVE;
        ws->restarts = w->restarts;
        ws->streak = w->streak;
        ws->load = w->load;
        ws->inflight = w->inflight;
        ws->draining = w->draining;
        ws->drained = w->state == W_DRAINED;
        out->alive += ws->alive;
        if (c->seg) {
            shm_worker_row *row = shm_segment_worker(c->seg, i);
            ws->import_tokens = atomic_load(&row->import_tokens);
            ws->import_ns = atomic_load(&row->import_ns);
            ws->restore_tokens = atomic_load(&row->restore_tokens);
        }
    }
    pthread_mutex_unlock(&c->lock);
}

bool coordinator_cluster_alive(coordinator_cluster *c)
{
    return common_mono_ms() - atomic_load(&c->supervisor_ran_ms) < 5000;
}

bool coordinator_cluster_healthy(coordinator_cluster *c)
{
    bool ok = true;
    int alive = 0;
    pthread_mutex_lock(&c->lock);
    long long now = common_mono_ms();
    for (int i = 0; i < c->n; i++) {
        const cworker *w = &c->w[i];
        if (w->state == W_ALIVE) {
            alive++;
            /* one told to stop after its drain is silent while it writes */
            ok = ok && (w->bye_sent || now - w->last_seen_ms <= c->o.dead_after_ms);
        } else if (w->ours && w->state != W_DRAINED) { /* drained on purpose */
            ok = false;
        }
    }
    pthread_mutex_unlock(&c->lock);
    return ok && alive > 0;
}

void coordinator_cluster_health_get(coordinator_cluster *c, coordinator_cluster_health *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&c->lock);
    long long now = common_mono_ms();
    out->workers = c->n;
    for (int i = 0; i < c->n; i++) {
        const cworker *w = &c->w[i];
        coordinator_worker_health h;
        if (w->state == W_ALIVE) {
            /* one told to stop after its drain is silent while it writes */
            if (!w->bye_sent && now - w->last_seen_ms > c->o.dead_after_ms)
                h = COORDINATOR_WORKER_SILENT;
            else
                h = w->draining ? COORDINATOR_WORKER_DRAINING : COORDINATOR_WORKER_SERVING;
        } else if (w->state == W_DRAINED) {
            h = COORDINATOR_WORKER_DRAINED;
        } else if (w->state == W_STARTING) {
            h = COORDINATOR_WORKER_STARTING;
        } else {
            h = COORDINATOR_WORKER_DEAD;
        }
        out->worker[i] = h;
        out->serving += h == COORDINATOR_WORKER_SERVING;
    }
    pthread_mutex_unlock(&c->lock);
}

const char *coordinator_worker_health_name(coordinator_worker_health h)
{
    static const char *const names[] = {"serving",       "draining", "starting",
                                        "not answering", "dead",     "drained"};
    return (unsigned)h < sizeof names / sizeof names[0] ? names[h] : "?";
}
