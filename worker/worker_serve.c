#include "worker_serve.h"

#include "common/common_log.h"
#include "common/common_time.h"
#include "shm/shm_channel.h"
#include "shm/shm_proto.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The fake engine of the benchmark mode: streams that emit one token per
 * step until max_tokens, with no model behind them. */
typedef struct fake_stream {
    uint64_t id;
    int index;
    int end;
    int prompt_len;
} fake_stream;

/* The heartbeat during a step: a thread that speaks for the serve loop
 * while it is inside one engine step longer than a heartbeat (a long
 * prefill chunk on a slow device, a first kernel load), so that the
 * coordinator does not take a busy worker for a dead one and resume its
 * streams elsewhere, over and over. It stays silent once the step has run
 * for step_timeout_s: then the worker is hung, and the coordinator, hearing
 * nothing for its dead-after limit, restarts it. Every send of the serve
 * loop and of this thread holds `lock`, which keeps `load` (what the
 * coordinator last heard) and the order of the messages. */
typedef struct step_beat {
    pthread_t thread;
    bool running;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    bool stop;
    shm_load load;
    atomic_llong step_since_ms; /* the step's start (common_mono_ms), 0 between steps */
    long long warned_since;     /* the step past its timeout that was logged */
} step_beat;

typedef struct serve {
    const worker_serve_options *o;
    worker_model *m;
    worker_engine *e;
    shm_channel *ch;
    int parallel;
    int events_max;
    worker_event *events;
    unsigned char *step_msg; /* header, load, then up to events_max events */
    fake_stream *fake;
    int n_fake;
    bool shutdown;
    step_beat beat;
} serve;

/* Set by worker_serve_stop (a signal handler): the loop ends. */
static volatile sig_atomic_t stop_requested;

void worker_serve_stop(void)
{
    stop_requested = 1;
}

static void fill_load(const serve *sv, shm_load *load)
{
    memset(load, 0, sizeof *load);
    if (!sv->e) {
        load->running = sv->n_fake;
        return;
    }
    worker_engine_stats st;
    worker_engine_stats_get(sv->e, &st);
    load->running = st.running;
    load->waiting = st.waiting;
    load->pages_total = st.pages.total;
    load->pages_free = st.pages.free;
    load->pages_active = st.pages.active;
    load->pages_cached = st.pages.cached;
    load->steps = st.steps;
    load->computed_tokens = st.computed_tokens;
    load->cached_tokens = st.cached_tokens;
    load->generated_tokens = st.generated_tokens;
    load->preemptions = st.preemptions;
    load->restore_tokens = st.restore_tokens;
    if (sv->o->states) {
        worker_states_stats ws;
        worker_states_stats_get(sv->o->states, &ws);
        load->states_spilled = ws.spilled_pages;
        load->states_refused = ws.refused;
        load->states_dropped = ws.spill_drops;
        load->states_skipped = ws.spill_skipped;
        if (sv->o->cluster) /* shoalctl pages reads it there */
            atomic_store(&shm_segment_worker(worker_cluster_segment(sv->o->cluster),
                                             worker_cluster_index(sv->o->cluster))
                              ->spilled_pages,
                         ws.spilled_pages);
    }
}

/* Sends one message to the coordinator under the beat's lock; `load`,
 * where the message carries one, becomes what the beat repeats. */
static shoal_err serve_send(serve *sv, const void *msg, size_t bytes, const shm_load *load)
{
    pthread_mutex_lock(&sv->beat.lock);
    if (load)
        sv->beat.load = *load;
    shoal_err err = shm_channel_send(sv->ch, msg, bytes, -1);
    pthread_mutex_unlock(&sv->beat.lock);
    return err;
}

static void *beat_main(void *arg)
{
    serve *sv = arg;
    step_beat *b = &sv->beat;
    const long long every = sv->o->heartbeat_ms, limit = sv->o->step_timeout_s * 1000ll;
    pthread_mutex_lock(&b->lock);
    while (!b->stop) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += every / 1000;
        until.tv_nsec += every % 1000 * 1000000;
        if (until.tv_nsec >= 1000000000) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&b->wake, &b->lock, &until);
        long long since = atomic_load(&b->step_since_ms), now = common_mono_ms();
        if (b->stop || !since || now - since < every)
            continue;
        if (limit > 0 && now - since >= limit) {
            if (b->warned_since != since)
                LOG_ERROR("worker %d: one engine step has run for %lld s, past "
                          "--step-timeout-s %d: taken for hung, no more heartbeats; the "
                          "coordinator will restart this worker",
                          sv->o->worker_index, (now - since) / 1000, sv->o->step_timeout_s);
            b->warned_since = since;
            continue;
        }
        shm_heartbeat hb;
        shm_header_init(&hb.h, SHM_MSG_HEARTBEAT, sizeof hb, 0);
        hb.load = b->load;
        /* one that cannot go within a heartbeat is dropped: the thread
         * never waits on a coordinator that is gone */
        shoal_err err = shm_channel_send(sv->ch, &hb, sizeof hb, (int)every);
        if (err && err != SHOAL_ERR_TIMEOUT)
            break; /* the serve loop finds the channel failed too */
        if (sv->o->cluster)
            worker_cluster_beat(sv->o->cluster);
    }
    pthread_mutex_unlock(&b->lock);
    return NULL;
}

static void beat_stop(serve *sv)
{
    step_beat *b = &sv->beat;
    if (!b->running)
        return;
    pthread_mutex_lock(&b->lock);
    b->stop = true;
    pthread_cond_signal(&b->wake);
    pthread_mutex_unlock(&b->lock);
    pthread_join(b->thread, NULL);
    b->running = false;
}

static shoal_err send_reject(serve *sv, uint64_t id, shoal_err err, const char *text)
{
    shm_reject r;
    memset(&r, 0, sizeof r);
    shm_header_init(&r.h, SHM_MSG_REJECT, sizeof r, 0);
    r.stream_id = id;
    r.err = (int32_t)err;
    /* a longer text is cut to the message's field */
    snprintf(r.text, sizeof r.text, "%.*s", (int)sizeof r.text - 1, text);
    return serve_send(sv, &r, sizeof r, NULL);
}

static shoal_err on_submit(serve *sv, const shm_submit *s)
{
    const int32_t *prompt = (const int32_t *)(s + 1);
    if (!sv->e) {
        if (sv->n_fake == sv->parallel)
            return send_reject(sv, s->stream_id, SHOAL_ERR_LIMIT, "fake worker: full");
        sv->fake[sv->n_fake++] = (fake_stream){s->stream_id, s->index_base,
                                               s->index_base + s->max_tokens, (int)s->h.count};
        return SHOAL_OK;
    }
    worker_request r;
    memset(&r, 0, sizeof r);
    r.id = s->stream_id;
    r.prompt = prompt;
    r.prompt_len = (int)s->h.count;
    r.max_tokens = s->max_tokens;
    r.ignore_eos = s->ignore_eos != 0;
    r.stop_count = s->stop_count;
    memcpy(r.stop_ids, s->stop_ids, sizeof r.stop_ids);
    r.has_salt = s->has_salt != 0;
    r.salt = s->salt;
    r.index_base = s->index_base;
    kernels_sample_params *p = &r.sampling;
    p->temperature = s->sampling.temperature;
    p->top_k = s->sampling.top_k;
    p->top_p = s->sampling.top_p;
    p->min_p = s->sampling.min_p;
    p->repetition_penalty = s->sampling.repetition_penalty;
    p->presence_penalty = s->sampling.presence_penalty;
    p->frequency_penalty = s->sampling.frequency_penalty;
    p->logprobs = s->sampling.logprobs;
    p->seed = s->sampling.seed;
    shoal_diag diag = {{0}};
    shoal_err err = worker_engine_submit(sv->e, &r, &diag);
    return err ? send_reject(sv, s->stream_id, err, diag.msg) : SHOAL_OK;
}

static void on_cancel(serve *sv, uint64_t id)
{
    if (sv->e) {
        worker_engine_cancel(sv->e, id);
        return;
    }
    for (int i = 0; i < sv->n_fake; i++)
        if (sv->fake[i].id == id) {
            sv->fake[i] = sv->fake[--sv->n_fake];
            break;
        }
}

/* Handles one received message. A malformed one is logged and dropped:
 * the coordinator is trusted no more than any peer. */
static shoal_err handle(serve *sv, const void *msg, size_t bytes)
{
    shm_msg_type type;
    shoal_diag diag = {{0}};
    if (shm_proto_check(msg, bytes, &type, &diag)) {
        LOG_WARN("dropped a message: %s", diag.msg);
        return SHOAL_OK;
    }
    switch (type) {
    case SHM_MSG_SUBMIT:
        return on_submit(sv, msg);
    case SHM_MSG_CANCEL:
        on_cancel(sv, ((const shm_cancel *)msg)->stream_id);
        return SHOAL_OK;
    case SHM_MSG_SHUTDOWN:
        sv->shutdown = true;
        return SHOAL_OK;
    default:
        LOG_WARN("dropped a message of type %d meant for the coordinator", type);
    }
    return SHOAL_OK;
}

/* Fake mode's pace: waits until *next_ns, then sets the next step's time. */
static void fake_pace(long long *next_ns, int step_us)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    long long now = (long long)ts.tv_sec * 1000000000ll + ts.tv_nsec;
    if (*next_ns > now) {
        struct timespec wait = {(time_t)((*next_ns - now) / 1000000000ll),
                                (long)((*next_ns - now) % 1000000000ll)};
        nanosleep(&wait, NULL);
        now = *next_ns;
    }
    *next_ns = now + (long long)step_us * 1000;
}

static int fake_step(serve *sv)
{
    int n = 0;
    for (int i = 0; i < sv->n_fake;) {
        fake_stream *f = &sv->fake[i];
        worker_event *ev = &sv->events[n++];
        memset(ev, 0, sizeof *ev);
        ev->stream_id = f->id;
        ev->token = f->index % 1000;
        ev->index = f->index;
        ev->logprob = -0.5f;
        if (f->index == 0)
            ev->prompt_tokens = f->prompt_len;
        if (++f->index == f->end) {
            ev->finish = WORKER_FINISH_LENGTH;
            *f = sv->fake[--sv->n_fake];
            continue;
        }
        i++;
    }
    return n;
}

static shoal_err send_step(serve *sv, int n)
{
    shm_step *st = (shm_step *)sv->step_msg;
    size_t bytes = shm_msg_bytes(SHM_MSG_STEP, (uint32_t)n);
    shm_header_init(&st->h, SHM_MSG_STEP, bytes, (uint32_t)n);
    fill_load(sv, &st->load);
    shm_event *out = (shm_event *)(st + 1);
    for (int i = 0; i < n; i++) {
        const worker_event *ev = &sv->events[i];
        shm_event *w = &out[i];
        memset(w, 0, sizeof *w);
        w->stream_id = ev->stream_id;
        w->token = ev->token;
        w->index = ev->index;
        w->logprob = ev->logprob;
        w->finish = ev->finish;
        w->prompt_tokens = ev->prompt_tokens;
        w->cached_tokens = ev->cached_tokens;
        w->top_count = ev->top_count;
        memcpy(w->top_ids, ev->top_ids, sizeof w->top_ids);
        memcpy(w->top_logprobs, ev->top_logprobs, sizeof w->top_logprobs);
    }
    return serve_send(sv, st, bytes, &st->load);
}

static shoal_err send_hello(serve *sv)
{
    shm_hello h;
    memset(&h, 0, sizeof h);
    shm_header_init(&h.h, SHM_MSG_HELLO, sizeof h, 0);
    h.worker = sv->o->worker_index;
    h.pid = (int32_t)getpid();
    snprintf(h.device, sizeof h.device, "%s", sv->o->device);
    if (sv->m) {
        const model_config *c = worker_model_config(sv->m);
        h.vocab = c->vocab;
        h.page_tokens = worker_model_kv_layout(sv->m)->page_tokens;
        h.fingerprint = *worker_model_fingerprint(sv->m);
        h.max_model_len = sv->o->max_model_len > 0
                              ? sv->o->max_model_len
                              : worker_model_max_pages_per_stream(sv->m) * h.page_tokens;
    } else {
        h.vocab = sv->o->fake_vocab;
        h.page_tokens = 16;
        h.max_model_len = sv->o->fake_max_model_len;
    }
    h.parallel = sv->parallel;
    fill_load(sv, &h.load);
    return serve_send(sv, &h, sizeof h, &h.load);
}

static bool busy(const serve *sv)
{
    return sv->e ? worker_engine_busy(sv->e) : sv->n_fake > 0;
}

shoal_err worker_serve_run(const worker_serve_options *o, worker_model *m, worker_engine *e,
                           shoal_diag *diag)
{
    serve sv = {.o = o, .m = m, .e = e};
    pthread_mutex_init(&sv.beat.lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&sv.beat.wake, &ca);
    pthread_condattr_destroy(&ca);
    sv.parallel = e ? worker_model_max_streams(m) : o->fake_parallel;
    sv.events_max = e ? worker_engine_events_max(e) : o->fake_parallel;
    shoal_err err = SHOAL_ERR_NOMEM;
    sv.events = calloc((size_t)sv.events_max, sizeof *sv.events);
    sv.step_msg = malloc(shm_msg_bytes(SHM_MSG_STEP, (uint32_t)sv.events_max));
    sv.fake = calloc((size_t)(sv.parallel > 0 ? sv.parallel : 1), sizeof *sv.fake);
    if (!sv.events || !sv.step_msg || !sv.fake) {
        shoal_diag_set(diag, err, "serve: no memory");
        goto out;
    }
    if ((err = shm_channel_dial(o->socket_path, &sv.ch, diag)))
        goto out;
    if ((err = send_hello(&sv))) {
        shoal_diag_set(diag, err, "serve: cannot say hello to the coordinator");
        goto out;
    }
    LOG_INFO("worker %d serving on %s", o->worker_index, o->socket_path);
    int rc = pthread_create(&sv.beat.thread, NULL, beat_main, &sv);
    if (rc) {
        err = shoal_diag_set(diag, SHOAL_ERR_NOMEM, "serve: cannot start the step heartbeat: %s",
                             strerror(rc));
        goto out;
    }
    sv.beat.running = true;
    long long last_sent = common_mono_ms(), next_step_ns = 0;
    long long step_sleep_ms = 0;
#ifdef SHOAL_TESTING /* test builds: every engine step this much longer (a long step on demand) */
    const char *slow = getenv("SHOAL_TEST_STEP_SLEEP_MS");
    step_sleep_ms = slow ? atoll(slow) : 0;
#endif
    while (!(sv.shutdown && !busy(&sv)) && !stop_requested) {
        /* everything that arrived; wait for it only when idle */
        int wait = busy(&sv) ? 0 : o->heartbeat_ms;
        for (;;) {
            void *msg;
            size_t bytes;
            err = shm_channel_recv(sv.ch, wait, &msg, &bytes);
            if (err == SHOAL_ERR_TIMEOUT)
                break;
            if (err) {
                shoal_diag_set(diag, err, "serve: the channel failed: %s", shoal_strerror(err));
                goto out;
            }
            err = handle(&sv, msg, bytes);
            shm_channel_free(msg, bytes);
            if (err)
                goto out;
            wait = 0;
        }
        if (busy(&sv)) {
            int n = 0;
            err = SHOAL_OK;
            atomic_store(&sv.beat.step_since_ms, common_mono_ms());
            if (e) {
                err = worker_engine_step(e, sv.events, &n, diag);
                if (step_sleep_ms > 0)
                    nanosleep(&(struct timespec){(time_t)(step_sleep_ms / 1000),
                                                 (long)(step_sleep_ms % 1000 * 1000000)},
                              NULL);
            } else {
                if (o->fake_step_us > 0)
                    fake_pace(&next_step_ns, o->fake_step_us);
                n = fake_step(&sv);
            }
            atomic_store(&sv.beat.step_since_ms, 0);
            if (err)
                goto out;
            if (e && o->cluster)
                worker_cluster_report(o->cluster, e);
            if (n > 0 || common_mono_ms() - last_sent >= o->heartbeat_ms) {
                if ((err = send_step(&sv, n)))
                    goto out;
                last_sent = common_mono_ms();
            }
        } else if (common_mono_ms() - last_sent >= o->heartbeat_ms) {
            if (o->cluster && e) {
                worker_cluster_report(o->cluster, e);
                worker_cluster_idle(o->cluster);
            }
            shm_heartbeat hb;
            shm_header_init(&hb.h, SHM_MSG_HEARTBEAT, sizeof hb, 0);
            fill_load(&sv, &hb.load);
            if ((err = serve_send(&sv, &hb, sizeof hb, &hb.load)))
                goto out;
            last_sent = common_mono_ms();
        }
    }
    err = SHOAL_OK;
out:
    beat_stop(&sv);
    shm_channel_close(sv.ch);
    pthread_cond_destroy(&sv.beat.wake);
    pthread_mutex_destroy(&sv.beat.lock);
    free(sv.events);
    free(sv.step_msg);
    free(sv.fake);
    return err;
}
