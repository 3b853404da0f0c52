#include "coordinator_cluster.h"

#include "common/common_time.h"
#include "shm/shm_segment.h"

#include "common/common_assert.h"
#include "common/common_limits.h"
#include "common/common_log.h"
#include "shm/shm_channel.h"
#include "store/store_admin.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Slots listened on with --workers none: workers started elsewhere (by
 * systemd's shoal-worker@N) dial worker-N.ipc for N below this. */
enum { NONE_SLOTS = 8 };

/* Routing memory: per worker, a direct-mapped table of the block hashes of
 * prompts sent there (first 8 bytes). Bounded and approximate: a slot is
 * overwritten by a later block that maps to it. */
enum { PREFIX_SLOTS = 1 << 16 };

/* The router's weight of one stream in flight, in prompt tokens: placing a
 * stream on a worker with one more stream costs about as much as
 * prefilling this many more tokens there. */
enum { ROUTE_STREAM_TOKENS = 256 };

/* A block another worker holds is copied rather than computed: on an H200
 * a 4k-token prefix imports well over 20x faster than it prefills, so it
 * saves about 95% of its cost (docs/BENCHMARKS.md, issue #8). */
enum { ROUTE_IMPORT_SAVES = 95 };

enum { BUCKETS = 4096 };

/* W_DRAINED: exited after `shoalctl drain`; started again only after undrain. */
typedef enum wstate { W_OFF = 0, W_STARTING, W_ALIVE, W_DEAD, W_DRAINED } wstate;

typedef struct cstream {
    struct cstream *next; /* bucket chain */
    uint64_t id;
    int worker; /* -1: waits for a worker */
    coordinator_event_fn fn;
    void *ctx;
    int32_t *tokens; /* prompt, then delivered output */
    int prompt_len;
    int delivered;
    int max_tokens;
    shm_sampling sampling;
    bool ignore_eos;
    int stop_count;
    int32_t stop_ids[SHM_STOP_IDS_MAX];
    bool has_salt;
    common_hash salt;
} cstream;

typedef struct coordinator_cluster coordinator_cluster_t;

typedef struct cworker {
    coordinator_cluster_t *c;
    int index;
    char device[16];
    bool ours; /* we start and restart it */
    pid_t pid;
    wstate state;
    char sock[SHOAL_PATH_BYTES_MAX];
    shm_channel *ch;
    pthread_t rx;
    bool rx_started;
    long long last_seen_ms;
    long long restart_at_ms;
    int restarts;
    int streak;         /* deaths in a row (restart_reset_ms): the backoff */
    long long ready_ms; /* its last HELLO; 0 since its last start */
    int exit_code;      /* of its last process: status, -signal, or SHM_EXIT_* */
    bool draining;      /* its row's drain flag was seen: no new streams go there */
    bool bye_sent;      /* draining and idle: SHUTDOWN went out, its exit is awaited */
    long long bye_ms;   /* when */
    /* A process killed and not yet reaped (0: none), since when: the
     * supervisor reaps it, and starts no new one on its device until it
     * has (a GPU worker's memory is freed as its process ends, which can
     * take seconds) */
    pid_t dying;
    long long dying_ms;
    shm_load load;
    int inflight;
    uint64_t *prefix;
} cworker;

struct coordinator_cluster {
    coordinator_cluster_options o;
    char cluster[SHM_CLUSTER_NAME_MAX];
    shm_segment *seg;
    char *model_dir, *runtime_dir, *worker_path, *load_format, *kv_dtype;
    char *state_dir, *spill_gib, *restore_mode;
    bool reader_check_due; /* a worker exited since the last check (lock) */
    int test_reap_hold_ms; /* test builds: SHOAL_TEST_REAP_HOLD_MS, a killed worker takes that
                              long to end; 0 otherwise */
    pthread_mutex_t lock;
    pthread_cond_t changed;
    cworker w[COORDINATOR_WORKERS_MAX];
    int n;
    bool have_facts;
    int vocab, max_model_len, page_tokens;
    common_hash fingerprint;
    cstream *buckets[BUCKETS];
    int live;
    uint64_t next_id;
    uint64_t resumed;
    int rr_next;
    pthread_t supervisor;
    bool supervisor_started;
    /* close: the supervisor left its rounds, and waits (parked) until the
     * workers are gone (lock, `changed`) */
    bool supervisor_parked, workers_gone;
    _Atomic long long supervisor_ran_ms; /* the supervisor's last round */
    atomic_bool stopping;
};

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

/* ---- stream table (callers hold the lock) ---- */

static cstream **slot_of(coordinator_cluster *c, uint64_t id)
{
    cstream **p = &c->buckets[id % BUCKETS];
    while (*p && (*p)->id != id)
        p = &(*p)->next;
    return p;
}

static void stream_free(cstream *s)
{
    if (s)
        free(s->tokens);
    free(s);
}

/* Removes and returns the stream, or NULL. */
static cstream *stream_take(coordinator_cluster *c, uint64_t id)
{
    cstream **p = slot_of(c, id);
    cstream *s = *p;
    if (s) {
        *p = s->next;
        c->live--;
        if (s->worker >= 0)
            c->w[s->worker].inflight--;
    }
    return s;
}

/* ---- routing ---- */

/* Block hashes of a prompt's full blocks, as the engine computes them. */
static int prompt_blocks(const coordinator_cluster *c, const cstream *s, common_hash *out, int max)
{
    common_hash root;
    common_block_root(&c->fingerprint, s->has_salt ? &s->salt : NULL, &root);
    int blocks = (s->prompt_len - 1) / c->page_tokens;
    if (blocks > max)
        blocks = max;
    for (int b = 0; b < blocks; b++)
        common_block_hash(b == 0 ? &root : &out[b - 1], s->tokens + b * c->page_tokens,
                          c->page_tokens, &out[b]);
    return blocks;
}

/* Chooses an alive worker for s, other than `avoid`; -1 if none.
 * prefix: cost(w) = uncached prompt tokens on w + ROUTE_STREAM_TOKENS x
 * streams in flight on w; the lowest cost wins, ties to fewer streams,
 * then the lower index. */
static int route(coordinator_cluster *c, const common_hash *blocks, int n_blocks, int avoid)
{
    int best = -1;
    long long best_cost = 0;
    /* what the segment's index says each worker holds now, and the longest
     * prefix any worker holds (which another worker can import) */
    int32_t lead[SHM_SEGMENT_WORKERS_MAX] = {0};
    int any = 0;
    if (c->seg && c->o.route == COORDINATOR_ROUTE_PREFIX && n_blocks > 0)
        any = shm_index_leads(c->seg, blocks, n_blocks, lead);
    for (int k = 0; k < c->n; k++) {
        int i = c->o.route == COORDINATOR_ROUTE_ROUND_ROBIN ? (c->rr_next + k) % c->n : k;
        cworker *w = &c->w[i];
        if (w->state != W_ALIVE || w->draining || i == avoid)
            continue;
        long long cost = (long long)w->inflight;
        if (c->o.route == COORDINATOR_ROUTE_ROUND_ROBIN) {
            best = i;
            break;
        }
        if (c->o.route == COORDINATOR_ROUTE_PREFIX) {
            int hits = 0;
            while (hits < n_blocks && w->prefix[common_hash_u64(&blocks[hits]) % PREFIX_SLOTS] ==
                                          common_hash_u64(&blocks[hits]))
                hits++;
            if (lead[i] > hits)
                hits = lead[i];
            /* blocks held elsewhere are imported at a fraction of their
             * compute cost */
            long long imported = any > hits ? any - hits : 0;
            cost = (long long)ROUTE_STREAM_TOKENS * w->inflight - (long long)hits * c->page_tokens -
                   imported * c->page_tokens * ROUTE_IMPORT_SAVES / 100;
        }
        if (best < 0 || cost < best_cost ||
            (cost == best_cost && w->inflight < c->w[best].inflight)) {
            best = i;
            best_cost = cost;
        }
    }
    if (best >= 0 && c->o.route == COORDINATOR_ROUTE_ROUND_ROBIN)
        c->rr_next = (best + 1) % c->n;
    return best;
}

static void remember_prefix(coordinator_cluster *c, int worker, const common_hash *blocks, int n)
{
    for (int b = 0; b < n; b++)
        c->w[worker].prefix[common_hash_u64(&blocks[b]) % PREFIX_SLOTS] =
            common_hash_u64(&blocks[b]);
}

/* A SUBMIT for s as it stands: prompt plus what was delivered. */
static void *build_submit(const cstream *s, size_t *bytes)
{
    int n = s->prompt_len + s->delivered;
    *bytes = shm_msg_bytes(SHM_MSG_SUBMIT, (uint32_t)n);
    shm_submit *m = calloc(1, *bytes);
    if (!m)
        return NULL;
    shm_header_init(&m->h, SHM_MSG_SUBMIT, *bytes, (uint32_t)n);
    m->stream_id = s->id;
    m->max_tokens = s->max_tokens - s->delivered;
    m->stop_count = s->stop_count;
    m->sampling = s->sampling;
    memcpy(m->stop_ids, s->stop_ids, sizeof m->stop_ids);
    m->ignore_eos = s->ignore_eos;
    m->has_salt = s->has_salt;
    m->index_base = s->delivered;
    m->salt = s->salt;
    memcpy(m + 1, s->tokens, (size_t)n * 4);
    return m;
}

/* Places s (lock held) and returns the message to send after unlocking, or
 * NULL with s->worker = -1 when no worker is alive. */
static void *place(coordinator_cluster *c, cstream *s, int avoid, size_t *bytes)
{
    common_hash *blocks = NULL;
    int n_blocks = 0;
    if (c->o.route == COORDINATOR_ROUTE_PREFIX && c->have_facts && s->prompt_len > 1) {
        int max = (s->prompt_len - 1) / c->page_tokens;
        blocks = malloc((size_t)(max ? max : 1) * sizeof *blocks);
        if (blocks)
            n_blocks = prompt_blocks(c, s, blocks, max);
    }
    int w = route(c, blocks, n_blocks, avoid);
    s->worker = w;
    void *msg = NULL;
    if (w >= 0) {
        c->w[w].inflight++;
        remember_prefix(c, w, blocks, n_blocks);
        msg = build_submit(s, bytes);
    }
    free(blocks);
    return msg;
}

/* ---- workers ---- */

static void spawn(coordinator_cluster *c, cworker *w)
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
                void *msg = place(c, s, w->index, &bytes);
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

/* Places streams that wait for a worker (lock held). */
static void place_waiting(coordinator_cluster *c, void **out, size_t *out_bytes, int *out_worker,
                          int *n_out, int max_out)
{
    for (int b = 0; b < BUCKETS; b++)
        for (cstream *s = c->buckets[b]; s && *n_out < max_out; s = s->next) {
            if (s->worker >= 0)
                continue;
            size_t bytes = 0;
            void *msg = place(c, s, -1, &bytes);
            if (!msg)
                return;
            out[*n_out] = msg;
            out_bytes[*n_out] = bytes;
            out_worker[(*n_out)++] = s->worker;
            c->resumed++;
        }
}

static void send_all(coordinator_cluster *c, void **msgs, size_t *bytes, int *worker, int n)
{
    for (int i = 0; i < n; i++) {
        if (shm_channel_send(c->w[worker[i]].ch, msgs[i], bytes[i], 1000))
            LOG_WARN("worker %d: a resumed stream could not be sent", worker[i]);
        free(msgs[i]);
    }
}

enum { MOVE_MAX = 4096 };

static void on_hello(coordinator_cluster *c, cworker *w, const shm_hello *h)
{
    if (!c->have_facts) {
        c->have_facts = true;
        c->vocab = h->vocab;
        c->max_model_len = h->max_model_len;
        c->page_tokens = h->page_tokens;
        c->fingerprint = h->fingerprint;
    } else if (!common_hash_equal(&c->fingerprint, &h->fingerprint) || c->vocab != h->vocab ||
               c->page_tokens != h->page_tokens) {
        LOG_ERROR("worker %d runs another model or page layout than the cluster; not used "
                  "(start every worker with the same --model, --page-tokens and KV dtype)",
                  w->index);
        return;
    }
    if (h->max_model_len < c->max_model_len)
        c->max_model_len = h->max_model_len;
    if (!w->ours) {
        w->pid = h->pid;
        w->exit_code = SHM_EXIT_UNKNOWN; /* not our child: no status to read */
    }
    snprintf(w->device, sizeof w->device, "%s", h->device);
    w->state = W_ALIVE;
    w->ready_ms = common_mono_ms();
    w->draining = w->bye_sent = false; /* a drain flag still set drains it again */
    w->load = h->load;
    LOG_INFO("worker %d (pid %d, device %s) is ready", w->index, (int)h->pid, h->device);
    pthread_cond_broadcast(&c->changed);
}

static void deliver(coordinator_cluster *c, cworker *w, const shm_event *ev)
{
    cstream **p = slot_of(c, ev->stream_id);
    cstream *s = *p;
    /* Late events of a cancelled stream, or of a worker the stream has
     * left, are dropped; so are repeats of a delivered index. */
    if (!s || s->worker != w->index)
        return;
    if (ev->token >= 0) {
        if (ev->index != s->delivered)
            return;
        s->tokens[s->prompt_len + s->delivered++] = ev->token;
    }
    s->fn(s->ctx, ev, NULL);
    if (ev->finish) {
        stream_free(stream_take(c, s->id));
    }
}

static void on_reject(coordinator_cluster *c, cworker *w, const shm_reject *r)
{
    cstream *s = *slot_of(c, r->stream_id);
    if (!s || s->worker != w->index)
        return;
    shm_event ev;
    memset(&ev, 0, sizeof ev);
    ev.stream_id = s->id;
    ev.token = -1;
    ev.finish = COORDINATOR_FINISH_ERROR;
    s->fn(s->ctx, &ev, r->text);
    stream_free(stream_take(c, s->id));
}

static void *rx_main(void *arg)
{
    cworker *w = arg;
    coordinator_cluster *c = w->c;
    while (!atomic_load(&c->stopping)) {
        void *msg;
        size_t bytes;
        shoal_err err = shm_channel_recv(w->ch, 100, &msg, &bytes);
        if (err == SHOAL_ERR_TIMEOUT)
            continue;
        if (err)
            break;
        shm_msg_type type;
        shoal_diag diag = {{0}};
        if (shm_proto_check(msg, bytes, &type, &diag)) {
            LOG_WARN("worker %d: dropped a message: %s", w->index, diag.msg);
            shm_channel_free(msg, bytes);
            continue;
        }
        pthread_mutex_lock(&c->lock);
        w->last_seen_ms = common_mono_ms();
        void *out[MOVE_MAX];
        size_t out_bytes[MOVE_MAX];
        int out_worker[MOVE_MAX], n_out = 0;
        switch (type) {
        case SHM_MSG_HELLO:
            on_hello(c, w, msg);
            place_waiting(c, out, out_bytes, out_worker, &n_out, MOVE_MAX);
            break;
        case SHM_MSG_STEP: {
            const shm_step *st = msg;
            w->load = st->load;
            const shm_event *ev = (const shm_event *)(st + 1);
            if (w->state == W_ALIVE)
                for (uint32_t i = 0; i < st->h.count; i++)
                    deliver(c, w, &ev[i]);
            break;
        }
        case SHM_MSG_REJECT:
            on_reject(c, w, msg);
            break;
        case SHM_MSG_HEARTBEAT:
            w->load = ((const shm_heartbeat *)msg)->load;
            break;
        default:
            LOG_WARN("worker %d: sent message type %d, meant for workers", w->index, type);
        }
        pthread_mutex_unlock(&c->lock);
        send_all(c, out, out_bytes, out_worker, n_out);
        shm_channel_free(msg, bytes);
    }
    return NULL;
}

/* Frees the state store's reader slots that exited workers left (a worker
 * killed inside a read transaction keeps its slot until someone checks).
 * Called without the lock: opening the store may wait for a compaction. */
static void states_reader_check(coordinator_cluster *c)
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
        spawn(c, w);
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

static void *supervisor_main(void *arg)
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
                spawn(c, w);
            }
        }
        bool check = c->reader_check_due;
        c->reader_check_due = false;
        pthread_mutex_unlock(&c->lock);
        send_all(c, out, out_bytes, out_worker, n_out);
        send_bye(c, bye, n_bye);
        if (check)
            states_reader_check(c);
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

/* ---- open / close ---- */

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
        if (pthread_create(&w->rx, NULL, rx_main, w) != 0) {
            err = shoal_diag_set(diag, SHOAL_ERR_NOMEM, "cluster: cannot start a thread");
            goto out_close;
        }
        w->rx_started = true;
    }
    pthread_mutex_lock(&c->lock);
    for (int i = 0; i < c->n; i++)
        if (c->w[i].ours)
            spawn(c, &c->w[i]);
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
    if (pthread_create(&c->supervisor, NULL, supervisor_main, c) != 0) {
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
        states_reader_check(c);
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
            stream_free(s);
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

/* ---- streams ---- */

shoal_err coordinator_cluster_submit(coordinator_cluster *c, const coordinator_stream_request *r,
                                     coordinator_event_fn fn, void *ctx, uint64_t *stream_id,
                                     shoal_diag *diag)
{
    if (r->prompt_len < 1 || r->max_tokens < 1)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "the prompt must have a token and max_tokens must be at least 1");
    if (r->stop_count < 0 || r->stop_count > SHM_STOP_IDS_MAX)
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT, "at most %d stop token ids", SHM_STOP_IDS_MAX);
    if ((long long)r->prompt_len + r->max_tokens > c->max_model_len)
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT,
                              "%d prompt tokens + max_tokens %d is over the context length of "
                              "%d tokens",
                              r->prompt_len, r->max_tokens, c->max_model_len);
    cstream *s = calloc(1, sizeof *s);
    if (s)
        s->tokens = malloc(((size_t)r->prompt_len + (size_t)r->max_tokens) * 4);
    if (!s || !s->tokens) {
        stream_free(s);
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM, "cluster: no memory for a stream");
    }
    memcpy(s->tokens, r->prompt, (size_t)r->prompt_len * 4);
    s->prompt_len = r->prompt_len;
    s->max_tokens = r->max_tokens;
    s->sampling = r->sampling;
    s->ignore_eos = r->ignore_eos;
    s->stop_count = r->stop_count;
    memcpy(s->stop_ids, r->stop_ids, sizeof s->stop_ids);
    s->has_salt = r->has_salt;
    s->salt = r->salt;
    s->fn = fn;
    s->ctx = ctx;
    pthread_mutex_lock(&c->lock);
    s->id = c->next_id++;
    size_t bytes = 0;
    void *msg = place(c, s, -1, &bytes);
    int w = s->worker;
    if (!msg) {
        pthread_mutex_unlock(&c->lock);
        stream_free(s);
        return shoal_diag_set(diag, w >= 0 ? SHOAL_ERR_NOMEM : SHOAL_ERR_BROKEN,
                              w >= 0 ? "cluster: no memory" : "no worker is alive; retry later");
    }
    cstream **p = slot_of(c, s->id);
    *p = s;
    c->live++;
    *stream_id = s->id;
    pthread_mutex_unlock(&c->lock);
    /* Sent without the lock: a worker blocked sending its STEP to us must
     * not wait on a submit that waits on the lock. */
    shoal_err err = shm_channel_send(c->w[w].ch, msg, bytes, 5000);
    free(msg);
    if (err) {
        pthread_mutex_lock(&c->lock);
        stream_free(stream_take(c, *stream_id));
        pthread_mutex_unlock(&c->lock);
        return shoal_diag_set(diag, SHOAL_ERR_BROKEN, "worker %d did not take the stream: %s", w,
                              shoal_strerror(err));
    }
    return SHOAL_OK;
}

void coordinator_cluster_cancel(coordinator_cluster *c, uint64_t stream_id)
{
    pthread_mutex_lock(&c->lock);
    cstream *s = stream_take(c, stream_id);
    int w = s ? s->worker : -1;
    pthread_mutex_unlock(&c->lock);
    stream_free(s);
    if (w >= 0) {
        shm_cancel m;
        shm_header_init(&m.h, SHM_MSG_CANCEL, sizeof m, 0);
        m.stream_id = stream_id;
        shm_channel_send(c->w[w].ch, &m, sizeof m, 1000);
    }
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
