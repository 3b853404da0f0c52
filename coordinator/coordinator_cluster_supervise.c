/* coordinator_cluster_supervise.c: worker processes: spawn, death (its
 * streams resumed elsewhere), reaping and restart with backoff, drain, the
 * state store's reader check, and the supervisor thread that runs them. */
#include "coordinator_cluster_internal.h"

#include "common/common_assert.h"
#include "common/common_log.h"
#include "common/common_time.h"
#include "store/store_admin.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

void cluster_spawn(coordinator_cluster *c, cworker *w)
{
    char index[16], heartbeat[16], step_timeout[16], num[6][16], ckpt[2][16];
    w->exit_code = SHM_EXIT_UNKNOWN;
    w->draining = w->bye_sent = false;
    snprintf(index, sizeof index, "%d", w->index);
    snprintf(heartbeat, sizeof heartbeat, "%d", c->o.heartbeat_ms);
    snprintf(step_timeout, sizeof step_timeout, "%d", c->o.step_timeout_s);
    const char *argv[52]; /* at most 45 arguments (those below), then the NULL */
    int a = 0;
    argv[a++] = c->worker_path;
    argv[a++] = "--serve";
    argv[a++] = "--connect";
    argv[a++] = w->sock;
    argv[a++] = "--worker-index";
    argv[a++] = index;
    argv[a++] = "--heartbeat-ms";
    argv[a++] = heartbeat;
    argv[a++] = "--step-timeout-s";
    argv[a++] = step_timeout;
    argv[a++] = "--model";
    argv[a++] = c->model_dir;
    argv[a++] = "--device";
    argv[a++] = w->device;
    if (c->seg) {
        argv[a++] = "--cluster";
        argv[a++] = c->cluster;
    }
    if (c->load_format) {
        argv[a++] = "--load-format";
        argv[a++] = c->load_format;
    }
    if (c->kv_dtype) {
        argv[a++] = "--kv-dtype";
        argv[a++] = c->kv_dtype;
    }
    if (c->o.warmup) {
        argv[a++] = "--warmup";
        argv[a++] = c->o.warmup;
    }
    if (c->state_dir) {
        argv[a++] = "--learn-conversations";
        argv[a++] = "--state-dir";
        argv[a++] = c->state_dir;
        if (c->spill_gib) {
            argv[a++] = "--spill-gib";
            argv[a++] = c->spill_gib;
        }
        if (c->restore_mode) {
            argv[a++] = "--restore-mode";
            argv[a++] = c->restore_mode;
        }
    }
    static const char *const flags[6] = {"--threads",  "--page-tokens",      "--kv-pages",
                                         "--parallel", "--max-batch-tokens", "--max-model-len"};
    int values[6] = {c->o.threads,  c->o.page_tokens,      c->o.kv_pages,
                     c->o.parallel, c->o.max_batch_tokens, c->o.max_model_len};
    for (int i = 0; i < 6; i++) {
        if (values[i] <= 0)
            continue;
        snprintf(num[i], sizeof num[i], "%d", values[i]);
        argv[a++] = flags[i];
        argv[a++] = num[i];
    }
    static const char *const ckpt_flags[2] = {"--state-checkpoints", "--checkpoint-interval"};
    int ckpt_values[2] = {c->o.state_checkpoints, c->o.checkpoint_interval};
    for (int i = 0; i < 2; i++) {
        if (ckpt_values[i] < 0)
            continue;
        snprintf(ckpt[i], sizeof ckpt[i], "%d", ckpt_values[i]);
        argv[a++] = ckpt_flags[i];
        argv[a++] = ckpt[i];
    }
    SHOAL_ASSERT(a < (int)(sizeof argv / sizeof argv[0]));
    argv[a] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        /* a worker must not outlive its coordinator */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execvp(argv[0], (char *const *)argv);
        fprintf(stderr, "shoal-coordinator: cannot start %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    if (pid < 0) {
        LOG_ERROR("worker %d: fork failed: %s", w->index, strerror(errno));
        w->state = W_DEAD;
        w->restart_at_ms = common_mono_ms() + 1000;
        return;
    }
    w->pid = pid;
    w->ready_ms = 0;
    w->state = W_STARTING;
    w->last_seen_ms = common_mono_ms();
    LOG_INFO("worker %d: started pid %d on device %s", w->index, (int)pid, w->device);
}

/* Marks w dead and moves its streams (lock held). Messages to send go into
 * out (count in *n_out). A worker that was draining while its drain flag
 * is still set ends DRAINED instead: not restarted until undrain. */
static void declare_dead(coordinator_cluster *c, cworker *w, const char *why, void **out,
                         size_t *out_bytes, int *out_worker, int *n_out, int max_out)
{
    bool drained =
        w->draining && c->seg && atomic_load(&shm_segment_worker(c->seg, w->index)->drain);
    if (drained && w->inflight == 0)
        LOG_INFO("worker %d: drained (%s)", w->index, why);
    else
        LOG_WARN("worker %d: %s; resuming its streams elsewhere", w->index, why);
    if (w->ours && w->pid > 0) { /* reaped by the supervisor, not here under the lock */
        kill(w->pid, SIGKILL);
        w->dying = w->pid;
        w->dying_ms = common_mono_ms();
    }
    w->pid = 0;
    w->state = drained ? W_DRAINED : W_DEAD;
    w->draining = w->bye_sent = false;
    w->restarts += !drained;
    if (!drained) { /* the backoff grows with deaths in a row, not for ever */
        long long now = common_mono_ms();
        if (w->ready_ms && now - w->ready_ms >= c->o.restart_reset_ms)
            w->streak = 0;
        w->streak++;
    }
    c->reader_check_due = c->state_dir != NULL;
    if (c->seg) /* its pages leave the index; leases on them end */
        shm_worker_forget(c->seg, w->index, drained ? SHM_WORKER_DRAINED : SHM_WORKER_DEAD,
                          w->exit_code);
    int backoff = 500 << (w->streak < 6 ? w->streak : 6);
    w->restart_at_ms = common_mono_ms() + (backoff > 30000 ? 30000 : backoff);
    memset(w->prefix, 0, PREFIX_SLOTS * sizeof *w->prefix);
    for (int b = 0; b < BUCKETS; b++)
        for (cstream *s = c->buckets[b]; s; s = s->next) {
            if (s->worker != w->index)
                continue;
            w->inflight--;
            s->worker = -1;
            if (*n_out < max_out) {
                size_t bytes = 0;
                void *msg = cluster_place(c, s, w->index, &bytes);
                if (msg) {
                    out[*n_out] = msg;
                    out_bytes[*n_out] = bytes;
                    out_worker[(*n_out)++] = s->worker;
                    c->resumed++;
                }
            }
        }
}

/* Reaps w's killed process once it has ended (lock held; never waits). */
static void reap_dying(coordinator_cluster *c, cworker *w, long long now)
{
    if (!w->dying || now - w->dying_ms < c->test_reap_hold_ms)
        return;
    pid_t r = waitpid(w->dying, NULL, WNOHANG);
    if (r == 0)
        return;
    if (now - w->dying_ms > 1000)
        LOG_INFO("worker %d: its killed process %d took %lld ms to end", w->index, (int)w->dying,
                 now - w->dying_ms);
    w->dying = 0;
}

/* Frees the state store's reader slots that exited workers left (a worker
 * killed inside a read transaction keeps its slot until someone checks).
 * Called without the lock: opening the store may wait for a compaction. */
void cluster_states_reader_check(coordinator_cluster *c)
{
    store_admin *a = NULL;
    shoal_diag diag = {{0}};
    int cleared = 0;
    shoal_err err = store_admin_open(c->state_dir, &a, &diag);
    if (err == SHOAL_OK)
        err = store_admin_reader_check(a, &cleared, &diag);
    store_admin_close(a);
    if (err && err != SHOAL_ERR_NOT_FOUND) /* NOT_FOUND: no worker made the store yet */
        LOG_WARN("state store %s: reader check failed: %s", c->state_dir, diag.msg);
    else if (cleared)
        LOG_INFO("state store %s: cleared %d reader slots of exited workers", c->state_dir,
                 cleared);
}

/* Follows the drain flag of w's row, which `shoalctl drain N` sets and
 * `undrain` clears (lock held). Set: no new stream goes to w (route skips
 * it), and once its streams are done it is told to SHUTDOWN (it finishes,
 * writes its learned states and exits 0; declare_dead then marks the slot
 * DRAINED). Cleared: a drained worker of ours starts again, and one still
 * draining takes streams again if it was not told to stop yet. Returns
 * true when w is to be sent SHUTDOWN now. */
static bool drain_watch(coordinator_cluster *c, cworker *w)
{
    shm_worker_row *row = shm_segment_worker(c->seg, w->index);
    bool drain = atomic_load(&row->drain) != 0;
    if (drain && w->state == W_ALIVE && !w->draining) {
        w->draining = true;
        atomic_store(&row->state, SHM_WORKER_DRAINING);
        LOG_INFO("worker %d: draining: no new streams; %d to finish", w->index, w->inflight);
    } else if (!drain && w->draining && !w->bye_sent) {
        w->draining = false;
        atomic_store(&row->state, SHM_WORKER_READY);
        LOG_INFO("worker %d: undrained before it stopped; it takes streams again", w->index);
    } else if (drain && w->state == W_DEAD) {
        w->state = W_DRAINED; /* it died before its drain ended: leave it stopped */
        atomic_store(&row->state, SHM_WORKER_DRAINED);
    } else if (!drain && w->state == W_DRAINED && w->ours && !w->dying) {
        LOG_INFO("worker %d: undrained; starting it again", w->index);
        w->restarts = w->streak = 0;
        cluster_spawn(c, w);
    }
    if (w->draining && !w->bye_sent && w->inflight == 0 && w->state == W_ALIVE) {
        w->bye_sent = true;
        w->bye_ms = common_mono_ms();
        return true;
    }
    return false;
}

static void send_bye(coordinator_cluster *c, const int *workers, int n)
{
    shm_header bye;
    shm_header_init(&bye, SHM_MSG_SHUTDOWN, sizeof bye, 0);
    for (int i = 0; i < n; i++) {
        LOG_INFO("worker %d: drained of streams; telling it to stop", workers[i]);
        if (shm_channel_send(c->w[workers[i]].ch, &bye, sizeof bye, 1000)) {
            LOG_WARN("worker %d: SHUTDOWN could not be sent; trying again", workers[i]);
            pthread_mutex_lock(&c->lock);
            c->w[workers[i]].bye_sent = false;
            pthread_mutex_unlock(&c->lock);
        }
    }
}

void *cluster_supervisor_main(void *arg)
{
    coordinator_cluster *c = arg;
    while (!atomic_load(&c->stopping)) {
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
        atomic_store(&c->supervisor_ran_ms, common_mono_ms());
        if (c->seg) { /* wall clock: shoalctl says since when a dead cluster is gone */
            struct timespec wall;
            clock_gettime(CLOCK_REALTIME, &wall);
            atomic_store(&shm_segment_header_of(c->seg)->coordinator_heartbeat_ns,
                         (uint64_t)wall.tv_sec * 1000000000ull + (uint64_t)wall.tv_nsec);
        }
        int bye[COORDINATOR_WORKERS_MAX], n_bye = 0;
        void *out[MOVE_MAX];
        size_t out_bytes[MOVE_MAX];
        int out_worker[MOVE_MAX], n_out = 0;
        pthread_mutex_lock(&c->lock);
        long long now = common_mono_ms();
        for (int i = 0; i < c->n; i++) {
            cworker *w = &c->w[i];
            reap_dying(c, w, now);
            if (w->ours && w->pid > 0 && (w->state == W_ALIVE || w->state == W_STARTING)) {
                int status;
                if (waitpid(w->pid, &status, WNOHANG) == w->pid) {
                    char why[64];
                    snprintf(why, sizeof why, "pid %d exited (%s %d)", (int)w->pid,
                             WIFSIGNALED(status) ? "signal" : "status",
                             WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
                    w->pid = 0;
                    w->exit_code = WIFEXITED(status)     ? WEXITSTATUS(status)
                                   : WIFSIGNALED(status) ? -WTERMSIG(status)
                                                         : SHM_EXIT_UNKNOWN;
                    declare_dead(c, w, why, out, out_bytes, out_worker, &n_out, MOVE_MAX);
                    continue;
                }
            }
            if (c->seg && drain_watch(c, w))
                bye[n_bye++] = i;
            if (w->state == W_ALIVE && w->bye_sent && !w->ours && !shm_pid_alive(w->pid)) {
                declare_dead(c, w, "exited after its drain", out, out_bytes, out_worker, &n_out,
                             MOVE_MAX);
            } else if (w->state == W_ALIVE && w->bye_sent) {
                /* told to stop: it sends no heartbeat while it writes its
                 * learned states, so only a bound applies */
                if (now - w->bye_ms > SHOAL_DRAIN_EXIT_MS) {
                    w->exit_code = SHM_EXIT_SILENT;
                    declare_dead(c, w, "did not exit after its drain", out, out_bytes, out_worker,
                                 &n_out, MOVE_MAX);
                }
            } else if (w->state == W_ALIVE && now - w->last_seen_ms > c->o.dead_after_ms) {
                w->exit_code = SHM_EXIT_SILENT;
                declare_dead(c, w, "stopped answering (no heartbeat)", out, out_bytes, out_worker,
                             &n_out, MOVE_MAX);
            } else if (w->state == W_DEAD && w->ours && now >= w->restart_at_ms && !w->dying) {
                cluster_spawn(c, w);
            }
        }
        bool check = c->reader_check_due;
        c->reader_check_due = false;
        pthread_mutex_unlock(&c->lock);
        cluster_send_all(c, out, out_bytes, out_worker, n_out);
        send_bye(c, bye, n_bye);
        if (check)
            cluster_states_reader_check(c);
    }
    /* The workers this thread restarted die with it (PR_SET_PDEATHSIG
     * follows the thread that forked, not the process): it stays until
     * close has let them finish, a learning one writing its states. */
    pthread_mutex_lock(&c->lock);
    c->supervisor_parked = true;
    pthread_cond_broadcast(&c->changed);
    while (!c->workers_gone)
        pthread_cond_wait(&c->changed, &c->lock);
    pthread_mutex_unlock(&c->lock);
    return NULL;
}
