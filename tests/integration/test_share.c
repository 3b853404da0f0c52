/* Cross-worker prefix sharing through the shared segment (issue #8), with
 * real worker processes on the CPU backend: a stream on worker 1 whose
 * 1,000-token prefix was computed on worker 0 copies those pages out of
 * worker 0's arena, prefills only its tail, and answers what a cold run
 * answers. Killing the owner during the lease, killing the lessee during
 * it, and killing the lessee inside the segment lock (SHOAL_TEST_PAUSE
 * stops it there) each leave a segment that works: the stream completes
 * correctly and every page row agrees with its worker's accounting, with
 * no lease left behind. A worker that comes up while its peer is stopped
 * keeps reporting, and imports from it once it runs again.
 *
 * SHOAL_TEST_DEVICES picks the workers' devices (default "cpu,cpu"; "0,0"
 * is two workers on one GPU, "0,1" one per GPU: tools/gpu-run runs those
 * with f32 activations, so a cold run and an import agree exactly). The
 * page-byte comparison maps the arenas, which only the CPU's memfd allows;
 * on a GPU the outputs and the counts carry the test. */
#include "common/common_limits.h"
#include "common/common_time.h"
#include "coordinator/coordinator_cluster.h"
#include "shm/shm_arena.h"
#include "shm/shm_segment.h"
#include "tests/stream_test_util.h"
#include "tests/test.h"
#include "tests/test_model.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MODEL test_model_dir("qwen3-tied-bf16")
#define VOCAB test_model_vocab("qwen3-tied-bf16")
enum { PREFIX = 1000, TAIL = 40, OUT = 16, PAGE = 16, PAGES = 256 };

typedef ts_stream result;

static char runtime_dir[64], name[32];
static const char *devices = "cpu,cpu";
static int32_t prompt_a[PREFIX + TAIL], prompt_b[PREFIX + TAIL];

static coordinator_cluster *start_with(int dead_after_ms)
{
    coordinator_cluster_options o;
    coordinator_cluster_options_default(&o);
    o.model_dir = MODEL;
    o.workers = devices;
    o.runtime_dir = runtime_dir;
    o.cluster = name;
    o.worker_path = SHOAL_WORKER_BIN;
    o.route = COORDINATOR_ROUTE_ROUND_ROBIN; /* stream 1 on worker 0, stream 2 on worker 1 */
    o.threads = 1;
    o.parallel = 4;
    o.kv_pages = PAGES;
    o.max_model_len = 2048;
    o.max_batch_tokens = 512;
    o.heartbeat_ms = 50;
    o.dead_after_ms = dead_after_ms;
    o.start_timeout_ms = 60000;
    coordinator_cluster *c = NULL;
    shoal_diag diag = {{0}};
    CHECK_MSG(coordinator_cluster_open(&o, &c, &diag) == SHOAL_OK, "%s", diag.msg);
    return c;
}

static coordinator_cluster *start(void)
{
    return start_with(3000);
}

static bool wait_done(result *r, int ms)
{
    for (int t = 0; t < ms / 10; t++) {
        if (atomic_load(&r->done))
            return true;
        usleep(10000);
    }
    return false;
}

static uint64_t submit(coordinator_cluster *c, const int32_t *prompt, bool cold, result *r)
{
    ts_stream_init(r);
    coordinator_stream_request q;
    memset(&q, 0, sizeof q);
    q.prompt = prompt;
    q.prompt_len = PREFIX + TAIL;
    q.max_tokens = OUT;
    q.sampling.top_p = 1.0f;
    q.sampling.repetition_penalty = 1.0f;
    q.ignore_eos = true;
    if (cold) { /* a salt of its own: no cache anywhere can serve it */
        q.has_salt = true;
        common_hash_bytes("cold", 4, &q.salt);
    }
    uint64_t id = 0;
    shoal_diag diag = {{0}};
    CHECK_MSG(coordinator_cluster_submit(c, &q, ts_stream_event, r, &id, &diag) == SHOAL_OK, "%s",
              diag.msg);
    return id;
}

/* Every page row of every live worker agrees with the worker's own counts
 * (engine accounting), no page is held, and no lease is left. */
static void check_segment(const char *when)
{
    shm_segment *s = NULL;
    shoal_diag diag = {{0}};
    CHECK_MSG(shm_segment_attach(name, true, &s, &diag) == SHOAL_OK, "%s", diag.msg);
    if (!s)
        return;
    shm_segment_header *h = shm_segment_header_of(s);
    for (int w = 0; w < 2; w++) {
        shm_worker_row *row = shm_segment_worker(s, w);
        int total = atomic_load(&row->pages_total), n[3] = {0}, held = 0, leased = 0;
        const shm_page_row *pages = shm_segment_pages(s, w);
        for (int p = 0; p < total; p++) {
            uint32_t st = atomic_load(&pages[p].state);
            if (st <= SHM_PAGE_CACHED)
                n[st]++;
            held += atomic_load(&pages[p].refs) != 0;
            leased += atomic_load(&pages[p].leases) != 0;
        }
        CHECK_MSG(total == PAGES, "%s: worker %d has %d pages", when, w, total);
        CHECK_MSG(n[SHM_PAGE_FREE] == atomic_load(&row->pages_free) &&
                      n[SHM_PAGE_CACHED] == atomic_load(&row->pages_cached) &&
                      n[SHM_PAGE_ACTIVE] == 0 && held == 0 && leased == 0,
                  "%s: worker %d rows free %d cached %d active %d held %d leased %d; its counts "
                  "free %d cached %d",
                  when, w, n[0], n[2], n[1], held, leased, atomic_load(&row->pages_free),
                  atomic_load(&row->pages_cached));
        CHECK_EQ_INT(n[0] + n[1] + n[2], total);
    }
    int slots = 0;
    for (int i = 0; i < h->leases_max; i++)
        slots += shm_segment_leases(s)[i].pid != 0;
    CHECK_MSG(slots == 0, "%s: %d lease slots still taken", when, slots);
    shm_segment_close(s);
}

static uint64_t import_tokens(coordinator_cluster *c, int w)
{
    coordinator_cluster_stats st;
    coordinator_cluster_stats_get(c, &st);
    return st.worker[w].import_tokens;
}

static uint64_t computed_tokens(coordinator_cluster *c, int w)
{
    coordinator_cluster_stats st;
    coordinator_cluster_stats_get(c, &st);
    return st.worker[w].load.computed_tokens;
}

static int worker_pid(coordinator_cluster *c, int w)
{
    coordinator_cluster_stats st;
    coordinator_cluster_stats_get(c, &st);
    return st.worker[w].pid;
}

/* Waits until pid stopped itself (SIGSTOP at a SHOAL_TEST_PAUSE point). */
static bool wait_stopped(int pid, int ms)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    for (int t = 0; t < ms / 10; t++) {
        FILE *f = fopen(path, "r");
        if (f) {
            size_t n = fread(buf, 1, sizeof buf - 1, f);
            fclose(f);
            buf[n] = 0;
            const char *p = strrchr(buf, ')');
            if (p && p[1] == ' ' && p[2] == 'T')
                return true;
        }
        usleep(10000);
    }
    return false;
}

static void wait_idle(coordinator_cluster *c)
{
    for (int t = 0; t < 500; t++) {
        coordinator_cluster_stats st;
        coordinator_cluster_stats_get(c, &st);
        if (st.alive == 2 && st.worker[0].load.running == 0 && st.worker[1].load.running == 0 &&
            st.streams == 0)
            return;
        usleep(10000);
    }
}

/* Maps worker w's arena read-only, as the test's own check (the CPU
 * backend's arena is a memfd). */
static const unsigned char *map_arena(int w, size_t *bytes, size_t *page_bytes)
{
    shm_arena_info info;
    int fd = -1;
    shoal_diag diag = {{0}};
    CHECK_MSG(shm_arena_fetch(name, w, 2000, &info, &fd, &diag) == SHOAL_OK, "%s", diag.msg);
    if (fd < 0)
        return NULL;
    void *p = mmap(NULL, info.arena_bytes, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    CHECK(p != MAP_FAILED);
    *bytes = info.arena_bytes;
    *page_bytes = info.page_bytes;
    return p == MAP_FAILED ? NULL : p;
}

/* Every page worker 1 holds under a hash that worker 0 also holds has the
 * same bytes as worker 0's: the import copied the right pages. Returns
 * how many pages were compared. */
static int same_pages_on_both_workers(void)
{
    shm_segment *s = NULL;
    shoal_diag diag = {{0}};
    CHECK(shm_segment_attach(name, true, &s, &diag) == SHOAL_OK);
    if (!s)
        return 0;
    size_t b0, b1, pb = 0;
    const unsigned char *a0 = map_arena(0, &b0, &pb), *a1 = map_arena(1, &b1, &pb);
    int compared = 0, differ = 0;
    const shm_page_row *r0 = shm_segment_pages(s, 0), *r1 = shm_segment_pages(s, 1);
    for (int p = 0; a0 && a1 && p < PAGES; p++) {
        if (!(atomic_load(&r1[p].flags) & SHM_PAGE_HASHED))
            continue;
        for (int q = 0; q < PAGES; q++)
            if ((atomic_load(&r0[q].flags) & SHM_PAGE_HASHED) &&
                common_hash_equal(&r0[q].hash, &r1[p].hash)) {
                compared++;
                differ += memcmp(a0 + (size_t)q * pb, a1 + (size_t)p * pb, pb) != 0;
            }
    }
    CHECK_MSG(differ == 0, "%d of %d imported pages differ from their owner's", differ, compared);
    if (a0)
        munmap((void *)a0, b0);
    if (a1)
        munmap((void *)a1, b1);
    shm_segment_close(s);
    return compared;
}

static result cold;

/* The reference: stream B computed from nothing. */
static void cold_reference(void)
{
    coordinator_cluster *c = start();
    if (!c)
        return;
    submit(c, prompt_b, true, &cold);
    CHECK(wait_done(&cold, 60000));
    CHECK_EQ_INT(cold.n, OUT);
    CHECK_EQ_INT(cold.cached, 0);
    coordinator_cluster_close(c);
}

static void prefix_from_worker_0_serves_worker_1(void)
{
    coordinator_cluster *c = start();
    if (!c)
        return;
    result a, b;
    submit(c, prompt_a, false, &a); /* worker 0 computes the prefix */
    CHECK(wait_done(&a, 60000));
    uint64_t before = computed_tokens(c, 1);
    submit(c, prompt_b, false, &b); /* worker 1 imports it */
    CHECK(wait_done(&b, 60000));
    uint64_t computed = computed_tokens(c, 1) - before;
    int shared = PREFIX / PAGE * PAGE; /* whole blocks of the shared prefix */
    printf("  worker 1: %d cached prompt tokens, %llu imported, %llu rows computed\n", b.cached,
           (unsigned long long)import_tokens(c, 1), (unsigned long long)computed);
    CHECK_EQ_INT(b.cached, shared);
    CHECK_EQ_INT((int)import_tokens(c, 1), shared);
    /* the tail and the output only (the last output token is not fed back) */
    CHECK_EQ_INT((int)computed, PREFIX + TAIL - shared + OUT - 1);
    CHECK(b.n == OUT && memcmp(b.tokens, cold.tokens, OUT * 4) == 0);
    wait_idle(c);
    if (strcmp(devices, "cpu,cpu") == 0)
        CHECK_EQ_INT(same_pages_on_both_workers(), shared / PAGE);
    check_segment("after an import");
    coordinator_cluster_close(c);
}

typedef enum fault { KILL_OWNER, KILL_LESSEE, KILL_IN_LOCK } fault;

static void import_with_a_fault(fault f)
{
    if (!test_hooks(__func__))
        return;
    setenv("SHOAL_TEST_PAUSE", f == KILL_IN_LOCK ? "lease-locked" : "leased", 1);
    coordinator_cluster *c = start();
    unsetenv("SHOAL_TEST_PAUSE");
    if (!c)
        return;
    result a, b;
    submit(c, prompt_a, false, &a);
    CHECK(wait_done(&a, 60000));
    submit(c, prompt_b, false, &b);
    int lessee = worker_pid(c, 1), owner = worker_pid(c, 0);
    CHECK_MSG(wait_stopped(lessee, 30000), "worker 1 (pid %d) never paused in its lease",
              lessee);
    if (f == KILL_OWNER) {
        kill(owner, SIGKILL);
        for (int t = 0; t < 500 && worker_pid(c, 0) == owner; t++)
            usleep(10000); /* the coordinator saw it go */
        kill(lessee, SIGCONT); /* its copy reads the dead owner's memory, still mapped */
    } else {
        kill(lessee, SIGKILL); /* the stream moves to worker 0 */
    }
    CHECK(wait_done(&b, 60000));
    CHECK_MSG(b.n == OUT && memcmp(b.tokens, cold.tokens, OUT * 4) == 0,
              "fault %d: the stream's output differs from the cold run", (int)f);
    wait_idle(c);
    shm_segment *s = NULL;
    shoal_diag diag = {{0}};
    if (shm_segment_attach(name, true, &s, &diag) == SHOAL_OK) {
        if (f == KILL_IN_LOCK)
            CHECK_MSG(shm_segment_header_of(s)->repairs >= 1, "no repair after a holder died");
        shm_segment_close(s);
    }
    check_segment(f == KILL_OWNER ? "owner killed" : f == KILL_LESSEE ? "lessee killed"
                                                                       : "killed in the lock");
    /* the segment still works: a new stream imports or hits as before */
    result d;
    submit(c, prompt_a, false, &d);
    CHECK(wait_done(&d, 60000));
    wait_idle(c);
    check_segment("afterwards");
    coordinator_cluster_close(c);
}

static void owner_killed_during_a_lease(void)
{
    import_with_a_fault(KILL_OWNER);
}

static void lessee_killed_during_a_lease(void)
{
    import_with_a_fault(KILL_LESSEE);
}

static void lessee_killed_inside_the_segment_lock(void)
{
    import_with_a_fault(KILL_IN_LOCK);
}

/* A worker that comes up while its peer is stopped (a debugger, a paused
 * test): its import of the peer's arena gives up after
 * SHOAL_ARENA_FETCH_TIMEOUT_MS and its reports go on, where a 2-second
 * wait left it "not answering" (SHOAL_REPORT_LATE_MS) and late on its
 * heartbeats; once the peer runs again, the import is asked for again
 * (SHOAL_ARENA_FETCH_RETRY_MS) and serves the next stream. */
static void a_stopped_peer_does_not_stall_a_worker_coming_up(void)
{
    /* the coordinator must not give up on the stopped worker meanwhile */
    coordinator_cluster *c = start_with(30000);
    shm_segment *s = NULL;
    shoal_diag diag = {{0}};
    if (c)
        CHECK_MSG(shm_segment_attach(name, true, &s, &diag) == SHOAL_OK, "%s", diag.msg);
    if (!c || !s)
        goto out;
    wait_idle(c);
    int peer = worker_pid(c, 1), old = worker_pid(c, 0);
    kill(peer, SIGSTOP);
    kill(old, SIGKILL);
    shm_worker_row *row = shm_segment_worker(s, 0);
    bool up = false;
    for (int t = 0; t < 6000 && !up; t++) {
        int pid = worker_pid(c, 0);
        up = atomic_load(&row->state) == SHM_WORKER_READY && pid != old && pid > 0;
        if (!up)
            usleep(5000);
    }
    CHECK_MSG(up, "worker 0 did not come back while worker 1 was stopped");
    /* its first idle rounds try worker 1's arena: the reports go on */
    uint64_t worst = 0, t0 = common_mono_ns();
    while (up && common_mono_ns() - t0 < 1500000000ull) {
        uint64_t now = common_wall_ns(), last = atomic_load(&row->heartbeat_ns);
        if (now > last && now - last > worst)
            worst = now - last;
        usleep(2000);
    }
    kill(peer, SIGCONT);
    printf("  worker 0's longest silence while worker 1 was stopped: %.0f ms\n",
           (double)worst / 1e6);
    CHECK_MSG(worst < (uint64_t)SHOAL_REPORT_LATE_MS * 1000000ull / 2,
              "worker 0 sent no report for %.0f ms while it waited for a stopped peer",
              (double)worst / 1e6);
    /* past the retry, worker 0 imports from worker 1 again: a cold stream
     * on worker 0 (round robin), the prefix computed on worker 1, and
     * worker 0 taking it */
    usleep((SHOAL_ARENA_FETCH_RETRY_MS + 500) * 1000);
    result cold_a, a, b;
    submit(c, prompt_a, true, &cold_a);
    CHECK(wait_done(&cold_a, 60000));
    submit(c, prompt_a, false, &a);
    CHECK(wait_done(&a, 60000));
    uint64_t before = import_tokens(c, 0);
    submit(c, prompt_b, false, &b);
    CHECK(wait_done(&b, 60000));
    int shared = PREFIX / PAGE * PAGE;
    CHECK_MSG((int)(import_tokens(c, 0) - before) == shared,
              "worker 0 imported %d tokens of worker 1's prefix after it resumed, want %d",
              (int)(import_tokens(c, 0) - before), shared);
    CHECK(b.n == OUT && memcmp(b.tokens, cold.tokens, OUT * 4) == 0);
    wait_idle(c);
    check_segment("after a stopped peer");
out:
    shm_segment_close(s);
    coordinator_cluster_close(c);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    snprintf(runtime_dir, sizeof runtime_dir, "/tmp/shoal-share-XXXXXX");
    if (!mkdtemp(runtime_dir))
        return 1;
    snprintf(name, sizeof name, "test-share-%d", (int)getpid());
    if (getenv("SHOAL_TEST_DEVICES"))
        devices = getenv("SHOAL_TEST_DEVICES");
    printf("workers on %s\n", devices);
    uint64_t x = 99;
    for (int i = 0; i < PREFIX + TAIL; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        prompt_a[i] = prompt_b[i] = (int32_t)((x >> 33) % VOCAB);
    }
    for (int i = PREFIX; i < PREFIX + TAIL; i++)
        prompt_b[i] = (prompt_a[i] + 1) % VOCAB;
    cold_reference();
    TEST_RUN(prefix_from_worker_0_serves_worker_1);
    TEST_RUN(owner_killed_during_a_lease);
    TEST_RUN(lessee_killed_during_a_lease);
    TEST_RUN(lessee_killed_inside_the_segment_lock);
    TEST_RUN(a_stopped_peer_does_not_stall_a_worker_coming_up);
    rmdir(runtime_dir);
    return TEST_EXIT();
}
