/* The cluster with real worker processes over real nng sockets, on the CPU
 * backend: streams complete with the outputs of an in-process run; a
 * worker killed with SIGKILL mid-stream loses no stream and changes no
 * greedy output; cancelled streams return their pages; requests that can
 * never fit are refused; prefix routing sends a shared prefix where it is
 * cached. */
#include "coordinator/coordinator_cluster.h"
#include "tests/stream_test_util.h"
#include "tests/test.h"
#include "tests/test_model.h"
#include "worker/worker_engine.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#define MODEL test_model_dir("llama3-scaled-bf16")
#define VOCAB test_model_vocab("llama3-scaled-bf16")
enum { STREAMS = 16, OUT = 48 };

typedef ts_stream result;

static char runtime_dir[64];
static int kv_pages = 128;   /* 0: not passed; the workers size their arenas */
static int segment_pages = 0; /* 0: the coordinator's default */
static int restart_reset_ms = 60000;

static coordinator_cluster *start(const char *workers, coordinator_route route)
{
    coordinator_cluster_options o;
    coordinator_cluster_options_default(&o);
    o.model_dir = MODEL;
    o.workers = workers;
    o.runtime_dir = runtime_dir;
    o.worker_path = SHOAL_WORKER_BIN;
    o.route = route;
    o.threads = 1;
    o.parallel = 16;
    o.kv_pages = kv_pages;
    o.segment_pages = segment_pages;
    o.max_model_len = 1024;
    o.max_batch_tokens = 256;
    o.heartbeat_ms = 50;
    o.dead_after_ms = 3000; /* generous: CI shares two cores */
    o.start_timeout_ms = 60000;
    coordinator_cluster *c = NULL;
    shoal_diag diag = {{0}};
    CHECK_MSG(coordinator_cluster_open(&o, &c, &diag) == SHOAL_OK, "%s", diag.msg);
    return c;
}

static uint64_t rng = 4242;

static uint64_t next_rng(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return rng >> 33;
}

static int32_t prompts[STREAMS][300];
static int prompt_len[STREAMS];

static coordinator_stream_request request(int i, int max_tokens)
{
    coordinator_stream_request r;
    memset(&r, 0, sizeof r);
    r.prompt = prompts[i];
    r.prompt_len = prompt_len[i];
    r.max_tokens = max_tokens;
    r.sampling.top_p = 1.0f;
    r.sampling.repetition_penalty = 1.0f;
    r.ignore_eos = true;
    if (i % 2) { /* seeded sampling survives a failover too */
        r.sampling.temperature = 0.8f;
        r.sampling.seed = 77 + (uint64_t)i;
    }
    return r;
}

/* The reference: each stream alone in an in-process engine. */
static void reference(result *ref, int max_tokens)
{
    worker_engine_options eo = {.max_batch_tokens = 256, .parallel = 1, .max_queued = 16, .max_model_len = 1024};
    worker_model_options mo;
    worker_model_options_default(&mo);
    mo.model_dir = MODEL;
    mo.kv_pages = 64;
    mo.threads = 1;
    worker_engine_size_model(&eo, &mo);
    worker_model *m = NULL;
    shoal_diag diag = {{0}};
    CHECK_MSG(worker_model_open(&mo, &m, &diag) == SHOAL_OK, "%s", diag.msg);
    worker_event ev[64];
    for (int i = 0; i < STREAMS; i++) {
        worker_engine *e = NULL;
        CHECK(worker_engine_open(m, &eo, &e, &diag) == SHOAL_OK);
        coordinator_stream_request cr = request(i, max_tokens);
        worker_request wr = {.id = 1, .prompt = cr.prompt, .prompt_len = cr.prompt_len,
                             .max_tokens = max_tokens, .ignore_eos = true};
        wr.sampling.temperature = cr.sampling.temperature;
        wr.sampling.top_p = 1.0f;
        wr.sampling.repetition_penalty = 1.0f;
        wr.sampling.seed = cr.sampling.seed;
        CHECK(worker_engine_submit(e, &wr, &diag) == SHOAL_OK);
        ref[i].n = 0;
        while (worker_engine_busy(e)) {
            int n;
            CHECK(worker_engine_step(e, ev, &n, &diag) == SHOAL_OK);
            for (int k = 0; k < n; k++)
                if (ev[k].token >= 0)
                    ref[i].tokens[ref[i].n++] = ev[k].token;
        }
        worker_engine_close(e);
    }
    worker_model_close(m);
}

static bool wait_done(result *r, int n, int timeout_ms)
{
    for (int t = 0; t < timeout_ms; t += 10) {
        int done = 0;
        for (int i = 0; i < n; i++)
            done += atomic_load(&r[i].done);
        if (done == n)
            return true;
        usleep(10000);
    }
    return false;
}

static void init_results(result *r, int n)
{
    for (int i = 0; i < n; i++)
        ts_stream_init(&r[i]);
}

static result ref[STREAMS], got[STREAMS];

static void sixteen_streams_on_two_workers_match_in_process_runs(void)
{
    coordinator_cluster *c = start("cpu,cpu", COORDINATOR_ROUTE_LEAST_LOADED);
    if (!c)
        return;
    init_results(got, STREAMS);
    for (int i = 0; i < STREAMS; i++) {
        coordinator_stream_request r = request(i, 24);
        uint64_t id;
        shoal_diag diag = {{0}};
        CHECK_MSG(coordinator_cluster_submit(c, &r, ts_stream_event, &got[i], &id, &diag) ==
                      SHOAL_OK,
                  "%s", diag.msg);
    }
    CHECK(wait_done(got, STREAMS, 60000));
    int equal = 0;
    for (int i = 0; i < STREAMS; i++)
        equal += got[i].n == 24 && memcmp(got[i].tokens, ref[i].tokens, 24 * 4) == 0;
    CHECK_EQ_INT(equal, STREAMS);
    coordinator_cluster_stats st;
    coordinator_cluster_stats_get(c, &st);
    CHECK_EQ_INT(st.alive, 2);
    CHECK(st.worker[0].load.generated_tokens > 0 && st.worker[1].load.generated_tokens > 0);
    CHECK(coordinator_cluster_healthy(c));
    coordinator_cluster_close(c);
}

static void killed_worker_loses_no_stream(void)
{
    coordinator_cluster *c = start("cpu,cpu", COORDINATOR_ROUTE_LEAST_LOADED);
    if (!c)
        return;
    init_results(got, STREAMS);
    for (int i = 0; i < STREAMS; i++) {
        coordinator_stream_request r = request(i, OUT);
        uint64_t id;
        shoal_diag diag = {{0}};
        CHECK(coordinator_cluster_submit(c, &r, ts_stream_event, &got[i], &id, &diag) == SHOAL_OK);
    }
    /* once some tokens flowed, kill worker 0 */
    for (int t = 0; t < 20000; t += 5) {
        int n = 0;
        for (int i = 0; i < STREAMS; i++)
            n += ts_stream_tokens(&got[i]);
        if (n >= 40)
            break;
        usleep(5000);
    }
    coordinator_cluster_stats st;
    coordinator_cluster_stats_get(c, &st);
    CHECK(st.worker[0].pid > 0);
    kill(st.worker[0].pid, SIGKILL);
    CHECK(wait_done(got, STREAMS, 60000));
    int equal = 0;
    for (int i = 0; i < STREAMS; i++)
        equal += got[i].n == OUT && memcmp(got[i].tokens, ref[i].tokens, OUT * 4) == 0;
    CHECK_EQ_INT(equal, STREAMS);
    coordinator_cluster_stats_get(c, &st);
    printf("  %llu streams resumed on the other worker\n", (unsigned long long)st.resumed);
    CHECK(st.resumed > 0);
    CHECK(st.worker[0].restarts == 1);
    /* the survivor holds no page once idle; the killed worker comes back */
    bool back = false, idle = false;
    for (int t = 0; t < 30000 && !(back && idle); t += 20) {
        usleep(20000);
        coordinator_cluster_stats_get(c, &st);
        back = st.worker[0].alive;
        idle = st.worker[1].load.running == 0 && st.worker[1].load.pages_active == 0;
    }
    CHECK(back);
    CHECK(idle);
    coordinator_cluster_close(c);
}

static void stuck_worker_is_declared_dead(void)
{
    coordinator_cluster *c = start("cpu,cpu", COORDINATOR_ROUTE_ROUND_ROBIN);
    if (!c)
        return;
    CHECK(coordinator_cluster_healthy(c));
    coordinator_cluster_stats st;
    coordinator_cluster_stats_get(c, &st);
    kill(st.worker[1].pid, SIGSTOP); /* alive, but silent */
    bool unhealthy = false;
    for (int t = 0; t < 10000 && !unhealthy; t += 20) {
        usleep(20000);
        unhealthy = !coordinator_cluster_healthy(c);
    }
    CHECK(unhealthy);
    /* streams still complete on the other worker meanwhile */
    init_results(got, 4);
    for (int i = 0; i < 4; i++) {
        coordinator_stream_request r = request(i, 8);
        uint64_t id;
        shoal_diag diag = {{0}};
        CHECK(coordinator_cluster_submit(c, &r, ts_stream_event, &got[i], &id, &diag) == SHOAL_OK);
    }
    CHECK(wait_done(got, 4, 30000));
    for (int i = 0; i < 4; i++)
        CHECK(got[i].n == 8 && memcmp(got[i].tokens, ref[i].tokens, 8 * 4) == 0);
    /* the stuck one was replaced: healthy again once it said hello */
    bool healthy = false;
    for (int t = 0; t < 30000 && !healthy; t += 20) {
        usleep(20000);
        healthy = coordinator_cluster_healthy(c);
    }
    CHECK(healthy);
    coordinator_cluster_close(c);
}

static void cancel_and_reject(void)
{
    kv_pages = 32; /* 512 tokens */
    coordinator_cluster *c = start("cpu", COORDINATOR_ROUTE_PREFIX);
    kv_pages = 128;
    if (!c)
        return;
    init_results(got, 3);
    uint64_t id0, id1, id2;
    shoal_diag diag = {{0}};
    coordinator_stream_request r = request(0, 40);
    CHECK(coordinator_cluster_submit(c, &r, ts_stream_event, &got[0], &id0, &diag) == SHOAL_OK);
    while (ts_stream_tokens(&got[0]) < 3)
        usleep(1000);
    coordinator_cluster_cancel(c, id0);
    int n_at_cancel = ts_stream_tokens(&got[0]);
    /* the pool of 32 pages holds 512 tokens: the context is cut to it
     * (it was 1024, and a prompt that fit the context but not the pool
     * was accepted, then refused by the worker: an HTTP 503, and a 503
     * for every request without max_tokens) */
    CHECK_EQ_INT(coordinator_cluster_max_model_len(c), 512);
    static int32_t big[1000];
    coordinator_stream_request rb = request(1, 1);
    rb.prompt = big;
    rb.prompt_len = 490;
    rb.max_tokens = 22; /* 512: the whole pool */
    CHECK(coordinator_cluster_submit(c, &rb, ts_stream_event, &got[1], &id1, &diag) == SHOAL_OK);
    CHECK(wait_done(&got[1], 1, 30000));
    CHECK_EQ_INT(got[1].n, 22);
    /* over the context: refused at once */
    rb.prompt_len = 500;
    rb.max_tokens = 13;
    CHECK(coordinator_cluster_submit(c, &rb, ts_stream_event, &got[2], &id2, &diag) ==
          SHOAL_ERR_LIMIT);
    CHECK_HAS(diag.msg, "context length of 512");
    usleep(300000);
    CHECK_EQ_INT(got[0].n, n_at_cancel); /* nothing after cancel returned */
    CHECK(!atomic_load(&got[0].done));
    coordinator_cluster_stats st;
    coordinator_cluster_stats_get(c, &st);
    CHECK_EQ_INT(st.worker[0].load.pages_active, 0);
    CHECK_EQ_INT(st.streams, 0);
    coordinator_cluster_close(c);
}

static void prefix_routing_follows_the_cache(void)
{
    coordinator_cluster *c = start("cpu,cpu", COORDINATOR_ROUTE_PREFIX);
    if (!c)
        return;
    /* a 200-token prompt, then eight prompts sharing its first 192 tokens */
    init_results(got, 9);
    shoal_diag diag = {{0}};
    uint64_t id;
    static int32_t first[200], p[8][210];
    for (int k = 0; k < 200; k++)
        first[k] = (int32_t)(next_rng() % VOCAB);
    coordinator_stream_request r = request(0, 4);
    r.prompt = first;
    r.prompt_len = 200;
    r.sampling.temperature = 0.0f;
    CHECK(coordinator_cluster_submit(c, &r, ts_stream_event, &got[0], &id, &diag) == SHOAL_OK);
    CHECK(wait_done(got, 1, 20000));
    for (int i = 0; i < 8; i++) {
        memcpy(p[i], first, 192 * 4);
        for (int k = 192; k < 210; k++)
            p[i][k] = (int32_t)(next_rng() % VOCAB);
        coordinator_stream_request ri = r;
        ri.prompt = p[i];
        ri.prompt_len = 210;
        CHECK(coordinator_cluster_submit(c, &ri, ts_stream_event, &got[1 + i], &id, &diag) ==
              SHOAL_OK);
        CHECK(wait_done(&got[1 + i], 1, 20000));
    }
    int hits = 0;
    for (int i = 1; i <= 8; i++)
        hits += got[i].cached == 192;
    printf("  %d of 8 streams found the shared prefix cached\n", hits);
    CHECK_EQ_INT(hits, 8);
    coordinator_cluster_close(c);
}

/* One stream of max_tokens on c, run to its end into got[0]. */
static void run_one(coordinator_cluster *c, int max_tokens, int timeout_ms)
{
    init_results(got, 1);
    coordinator_stream_request r = request(0, max_tokens);
    uint64_t id;
    shoal_diag diag = {{0}};
    CHECK(coordinator_cluster_submit(c, &r, ts_stream_event, &got[0], &id, &diag) == SHOAL_OK);
    CHECK(wait_done(got, 1, timeout_ms));
}

/* One fake worker (the fake-worker script; with step_us, the slow-worker
 * script, each step taking SHOAL_TEST_STEP_US), dead after dead_after_ms
 * of silence, heartbeating through steps of up to step_timeout_s. */
static coordinator_cluster *start_fake(const char *step_us, int dead_after_ms, int step_timeout_s)
{
    if (step_us)
        setenv("SHOAL_TEST_STEP_US", step_us, 1);
    coordinator_cluster_options o;
    coordinator_cluster_options_default(&o);
    o.model_dir = MODEL;
    o.workers = "cpu";
    o.runtime_dir = runtime_dir;
    o.worker_path = step_us ? SHOAL_SLOW_WORKER : SHOAL_FAKE_WORKER;
    o.heartbeat_ms = 50;
    o.dead_after_ms = dead_after_ms;
    o.step_timeout_s = step_timeout_s;
    o.restart_reset_ms = restart_reset_ms;
    coordinator_cluster *c = NULL;
    shoal_diag diag = {{0}};
    CHECK_MSG(coordinator_cluster_open(&o, &c, &diag) == SHOAL_OK, "%s", diag.msg);
    unsetenv("SHOAL_TEST_STEP_US");
    return c;
}

static void fake_workers_stream_tokens(void)
{
    coordinator_cluster *c = start_fake(NULL, 3000, 300);
    if (!c)
        return;
    run_one(c, 30, 10000);
    CHECK_EQ_INT(got[0].n, 30);
    CHECK_EQ_INT(got[0].finish, 2);
    coordinator_cluster_close(c);
}

/* A worker inside one step longer than the coordinator's dead-after limit
 * (steps of 2.5 s, dead after 1 s of silence) heartbeats from a thread
 * through the step: its stream completes there, nothing is resumed and
 * nothing restarted, where it used to be taken for dead 1 s into each
 * step, restarted, and its stream resumed, over and over. Past
 * --step-timeout-s (1 s, steps of 6 s) it falls silent and is taken for
 * hung within the step. */
static void a_long_step_is_taken_for_hung_only_past_the_step_timeout(void)
{
    coordinator_cluster *c = start_fake("2500000", 1000, 300);
    if (!c)
        return;
    run_one(c, 2, 30000);
    CHECK_EQ_INT(got[0].n, 2);
    coordinator_cluster_stats st;
    coordinator_cluster_stats_get(c, &st);
    CHECK_MSG(st.resumed == 0 && st.worker[0].restarts == 0,
              "a worker in a 2.5 s step was taken for dead: %llu resumed, %d restarts",
              (unsigned long long)st.resumed, st.worker[0].restarts);
    coordinator_cluster_close(c);

    c = start_fake("6000000", 1000, 1);
    if (!c)
        return;
    init_results(got, 1);
    coordinator_stream_request r = request(0, 2);
    uint64_t id;
    shoal_diag diag = {{0}};
    CHECK(coordinator_cluster_submit(c, &r, ts_stream_event, &got[0], &id, &diag) == SHOAL_OK);
    bool hung = false;
    for (int t = 0; t < 5500 && !hung; t += 20) {
        usleep(20000);
        coordinator_cluster_stats_get(c, &st);
        hung = st.worker[0].restarts > 0 || !coordinator_cluster_healthy(c);
    }
    CHECK_MSG(hung, "a worker 5.5 s into a step, past its 1 s step timeout, still counts as alive");
    coordinator_cluster_close(c);
}

/* Worker 0's pid once it is ready with a pid other than `not` (0: any). */
static int ready_pid(coordinator_cluster *c, int not)
{
    coordinator_cluster_stats st;
    for (int t = 0; t < 30000; t += 10) {
        coordinator_cluster_stats_get(c, &st);
        if (st.worker[0].alive && st.worker[0].pid > 0 && st.worker[0].pid != not)
            return st.worker[0].pid;
        usleep(10000);
    }
    return -1;
}

/* The restart backoff counts deaths in a row (1 s, 2 s, ... 30 s), where
 * it counted every death of the process's life, so that a worker that had
 * died six times ever waited 30 s at each restart after: two deaths right
 * after their starts make a row of 2; a death after the worker was ready
 * for longer than restart_reset_ms (1.5 s here) starts the row again. */
static void restart_backoff_counts_deaths_in_a_row(void)
{
    restart_reset_ms = 1500;
    coordinator_cluster *c = start_fake(NULL, 3000, 300);
    restart_reset_ms = 60000;
    if (!c)
        return;
    int streak[3] = {0, 0, 0}, pid = 0;
    for (int k = 0; k < 3; k++) {
        pid = ready_pid(c, pid);
        if (pid <= 0)
            break;
        if (k == 2)
            usleep(2000000);
        kill(pid, SIGKILL);
        coordinator_cluster_stats st;
        for (int t = 0; t < 10000; t += 10) {
            coordinator_cluster_stats_get(c, &st);
            if (st.worker[0].restarts == k + 1)
                break;
            usleep(10000);
        }
        streak[k] = st.worker[0].streak;
    }
    CHECK_MSG(streak[0] == 1 && streak[1] == 2 && streak[2] == 1,
              "deaths in a row after each kill: %d, %d, %d (want 1, 2, 1)", streak[0], streak[1],
              streak[2]);
    coordinator_cluster_close(c);
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A worker the coordinator kills (here: stopped, so silent past dead-after)
 * may take seconds to end: a GPU worker's memory is freed as its process
 * goes. The coordinator used to wait for it under the cluster's lock, so
 * every request, stats call and token waited too. Now the supervisor reaps
 * it later and starts no new worker until it has. The time to end is a
 * test hook (SHOAL_TEST_REAP_HOLD_MS = 3 s: the process is reaped no
 * sooner); no stats call may take 1 s meanwhile, and the new worker starts
 * only after the hold. */
static void a_worker_slow_to_end_holds_nothing_up(void)
{
    if (!test_hooks(__func__))
        return;
    setenv("SHOAL_TEST_REAP_HOLD_MS", "3000", 1);
    coordinator_cluster *c = start_fake(NULL, 1000, 300);
    unsetenv("SHOAL_TEST_REAP_HOLD_MS");
    if (!c)
        return;
    int pid = ready_pid(c, 0);
    CHECK(pid > 0);
    if (pid <= 0) {
        coordinator_cluster_close(c);
        return;
    }
    kill(pid, SIGSTOP);
    coordinator_cluster_stats st;
    long long dead_at = 0, new_at = 0, slowest = 0;
    for (long long t0 = now_ms(); now_ms() - t0 < 12000 && !new_at;) {
        long long a = now_ms();
        coordinator_cluster_stats_get(c, &st);
        long long took = now_ms() - a;
        slowest = took > slowest ? took : slowest;
        if (!dead_at && st.worker[0].restarts > 0)
            dead_at = now_ms();
        if (dead_at && st.worker[0].pid > 0 && st.worker[0].pid != pid)
            new_at = now_ms();
        usleep(20000);
    }
    printf("  killed worker: stats calls took at most %lld ms; a new worker %lld ms after the "
           "death (the process ended after 3,000)\n",
           slowest, new_at && dead_at ? new_at - dead_at : -1);
    CHECK(dead_at > 0 && new_at > 0);
    CHECK_MSG(slowest < 1000, "a stats call waited %lld ms on a killed worker's end", slowest);
    CHECK_MSG(new_at - dead_at >= 2500,
              "a new worker started %lld ms after the death, before the old one ended",
              new_at - dead_at);
    CHECK(ready_pid(c, pid) > 0);
    coordinator_cluster_close(c);
}

/* A worker given no --kv-pages sizes its arena from free memory; it stays
 * within the rows the segment holds for it, where it used to ask for more
 * (a small model on a machine with memory to spare: up to its streams'
 * 1,024 pages here) and refuse to start. */
static void workers_sized_from_free_memory_fit_the_segment(void)
{
    enum { ROWS = 40 };
    kv_pages = 0;
    segment_pages = ROWS;
    coordinator_cluster *c = start("cpu", COORDINATOR_ROUTE_LEAST_LOADED);
    kv_pages = 128;
    segment_pages = 0;
    if (!c)
        return;
    run_one(c, 8, 30000);
    CHECK_EQ_INT(got[0].n, 8);
    coordinator_cluster_stats st;
    coordinator_cluster_stats_get(c, &st);
    CHECK_EQ_INT(st.worker[0].load.pages_total, ROWS);
    coordinator_cluster_close(c);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    snprintf(runtime_dir, sizeof runtime_dir, "/tmp/shoal-cluster-XXXXXX");
    if (!mkdtemp(runtime_dir))
        return 1;
    for (int i = 0; i < STREAMS; i++) {
        prompt_len[i] = 5 + (int)(next_rng() % 250);
        for (int k = 0; k < prompt_len[i]; k++)
            prompts[i][k] = (int32_t)(next_rng() % VOCAB);
    }
    reference(ref, OUT);
    TEST_RUN(sixteen_streams_on_two_workers_match_in_process_runs);
    TEST_RUN(killed_worker_loses_no_stream);
    TEST_RUN(stuck_worker_is_declared_dead);
    TEST_RUN(cancel_and_reject);
    TEST_RUN(prefix_routing_follows_the_cache);
    TEST_RUN(fake_workers_stream_tokens);
    TEST_RUN(a_long_step_is_taken_for_hung_only_past_the_step_timeout);
    TEST_RUN(restart_backoff_counts_deaths_in_a_row);
    TEST_RUN(a_worker_slow_to_end_holds_nothing_up);
    TEST_RUN(workers_sized_from_free_memory_fit_the_segment);
    rmdir(runtime_dir);
    return TEST_EXIT();
}
