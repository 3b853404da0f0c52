/* Crash safety of the state store: a writer process is killed with SIGKILL
 * at random points while it writes; after each kill the environment must
 * open, verify must find no corrupt record and no index problem, and every
 * state the writer acknowledged (sent down a pipe after the flush that
 * committed it returned) must be present with its exact bytes.
 *
 * SHOAL_STORE_CRASH_TRIALS sets the number of trials (default 200, about
 * ten seconds on an idle machine); the whole run is bounded by
 * CRASH_SECONDS_MAX. The kill comes at a uniformly random time within how
 * long one writer takes to finish, measured by a writer left to run to the
 * end before the trials and every 50 trials after (so the kills land while
 * it writes however loaded the machine is). Each trial
 * writes chains of a fresh seed, alternating between two models of
 * different page sizes (8 KiB and 128 KiB, so records of one and of many
 * LMDB pages), under a spill limit that older trials' records overflow, so
 * eviction runs while the writer dies too. */
#include "store/store_admin.h"
#include "store/store_state.h"
#include "store_test_util.h"
#include "tests/test.h"

#include "common/common_rng.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum {
    TRIALS_DEFAULT = 200,
    CRASH_SECONDS_MAX = 240, /* a failsafe: the ctest timeout is 300 */
    CALIBRATE_EVERY = 50,
    DONE = -1, /* the writer's last word, after its last acknowledgement */
    READY_WAIT_MS = 20000,
};

#define SPILL_BYTES (2ull << 20)

static store_page_layout model_layout(int model)
{
    return model == 0 ? tu_layout(2, 2, 32, 16) : tu_layout(8, 4, 64, 16);
}

/* Puts per trial: all of them fit under the spill limit, so nothing a
 * trial acknowledges is evicted by the same trial (older trials' records
 * are older, and go first). */
static int puts_max(int model)
{
    store_page_layout l = model_layout(model);
    int n = (int)(SPILL_BYTES / store_record_bytes(&l)) - 2;
    return n < 16 ? n : 16;
}

static store_state_options trial_options(const char *dir, int model)
{
    store_state_options o = tu_options(dir, SPILL_BYTES, 100 + (uint64_t)model,
                                       model_layout(model));
    o.queue_slots = 32; /* a writer flushes every 1-3 puts: no drops, and a
                           small queue keeps each process's start cheap */
    return o;
}

static void write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            _exit(5);
        p += w;
        n -= (size_t)w;
    }
}

/* The writer: puts chains of this trial's seed, flushes every one to three
 * puts, and acknowledges a put's index once the flush after it returned
 * with no batch lost. Runs until killed. */
static void child_main(const char *dir, int model, uint64_t seed, int fd)
{
    store_state_options o = trial_options(dir, model);
    const store_page_layout *l = &o.layout;
    store_state *s = NULL;
    if (store_state_open(&o, &s, NULL) != SHOAL_OK)
        _exit(3);
    write_all(fd, "R", 1);
    uint8_t *page = malloc(l->page_bytes);
    uint64_t rng = seed;
    uint32_t pending[64];
    int n_pending = 0, since_flush = 0, flush_every = 1;
    long chain_tail = -1;
    store_state_stats st;
    store_state_stats_get(s, &st, NULL);
    uint64_t errors = st.write_errors;
    int n = puts_max(model);
    for (int i = 0; i < n; i++) {
        common_hash h = tu_hash(seed, (uint64_t)i);
        common_hash parent;
        if (chain_tail >= 0 && common_rng_next(&rng) % 10 < 7)
            parent = tu_hash(seed, (uint64_t)chain_tail);
        else
            parent = tu_hash(seed ^ 0xabcdefull, (uint64_t)i); /* a new chain */
        chain_tail = i;
        tu_page(page, l->page_bytes, seed, (uint64_t)i);
        int tokens = 1 + (int)(common_rng_next(&rng) % (uint64_t)l->page_tokens);
        if (store_state_put_async(s, &h, &parent, tokens, page, l->page_bytes) == SHOAL_OK)
            pending[n_pending++] = (uint32_t)i;
        if (i > 0 && common_rng_next(&rng) % 5 == 0) { /* a use: a touch to write */
            common_hash g = tu_hash(seed, common_rng_next(&rng) % (uint64_t)i);
            (void)store_state_get(s, &g, page, l->page_bytes, NULL, NULL);
        }
        if (++since_flush >= flush_every || i == n - 1) {
            if (store_state_flush(s, -1) != SHOAL_OK)
                _exit(6);
            store_state_stats_get(s, &st, NULL);
            if (st.write_errors == errors) /* nothing lost: acknowledge */
                write_all(fd, pending, sizeof pending[0] * (size_t)n_pending);
            errors = st.write_errors;
            n_pending = 0;
            since_flush = 0;
            flush_every = 1 + (int)(common_rng_next(&rng) % 3);
        }
    }
    uint32_t done = (uint32_t)DONE;
    write_all(fd, &done, sizeof done);
    for (;;)
        pause(); /* wait for the kill */
}

typedef struct totals {
    int early_kills; /* before the store was open */
    int mid_kills;   /* some puts not yet acknowledged */
    int late_kills;  /* after the last acknowledgement */
    long acked;
    long checked_records;
} totals;

static bool wait_ready(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    char c;
    return poll(&p, 1, READY_WAIT_MS) == 1 && read(fd, &c, 1) == 1 && c == 'R';
}

static void sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* Reads what the writer sent until it died: acknowledged put indices into
 * acked (up to 64), and whether it sent DONE. The 'R' of a writer killed
 * early may lead the stream. */
static size_t read_acks(int fd, bool skip_ready, uint32_t *acked, bool *done)
{
    uint8_t buf[4 * 64];
    size_t have = 0, got = 0;
    bool ready_seen = !skip_ready;
    *done = false;
    for (;;) {
        ssize_t r = read(fd, buf + have, sizeof buf - have);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        have += (size_t)r;
        size_t off = 0;
        if (!ready_seen) {
            ready_seen = true;
            off = 1;
        }
        size_t whole = (have - off) / 4 * 4;
        for (size_t k = 0; k < whole; k += 4) {
            uint32_t v;
            memcpy(&v, buf + off + k, 4);
            if (v == (uint32_t)DONE)
                *done = true;
            else if (got < 64)
                acked[got++] = v;
        }
        memmove(buf, buf + off + whole, have - off - whole);
        have -= off + whole;
    }
    return got;
}

/* Runs a writer to its end and returns how long it wrote, in us: the
 * window the kills of the next trials fall in. */
static long calibrate(const char *dir, int t)
{
    int p[2];
    if (pipe(p) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        close(p[0]);
        child_main(dir, t % 2, 0xca1b0000ull + (uint64_t)t, p[1]);
        _exit(0);
    }
    close(p[1]);
    long us = -1;
    if (wait_ready(p[0])) {
        double t0 = tu_now_ms();
        struct pollfd pf = {.fd = p[0], .events = POLLIN};
        uint32_t v = 0;
        size_t have = 0;
        while (poll(&pf, 1, READY_WAIT_MS) == 1) {
            uint8_t *vb = (uint8_t *)&v;
            ssize_t r = read(p[0], vb + have, 4 - have);
            if (r <= 0)
                break;
            have += (size_t)r;
            if (have == 4) {
                if (v == (uint32_t)DONE) {
                    us = (long)((tu_now_ms() - t0) * 1000.0);
                    break;
                }
                have = 0;
            }
        }
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    close(p[0]);
    return us;
}

/* One trial: fork, let it write, kill it at a random time in window_us,
 * check. false when it failed. */
static bool trial(const char *dir, int t, long window_us, uint64_t *rng, totals *tot)
{
    int model = t % 2;
    uint64_t seed = 0x5eed0000ull + (uint64_t)t;
    int p[2];
    if (pipe(p) != 0)
        return false;
    pid_t pid = fork();
    if (pid < 0)
        return false;
    if (pid == 0) {
        close(p[0]);
        child_main(dir, model, seed, p[1]);
        _exit(0);
    }
    close(p[1]);
    /* one in eight dies while it opens the store */
    bool early = common_rng_next(rng) % 8 == 0;
    if (early) {
        sleep_us((long)(common_rng_next(rng) % 3000));
    } else if (!wait_ready(p[0])) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        close(p[0]);
        CHECK_MSG(false, "trial %d: the writer did not open the store", t);
        return false;
    } else {
        sleep_us((long)(common_rng_next(rng) % (uint64_t)window_us));
    }
    kill(pid, SIGKILL);
    uint32_t acked[64];
    bool done;
    size_t got = read_acks(p[0], early, acked, &done);
    close(p[0]);
    int status;
    waitpid(pid, &status, 0);
    bool ok = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
    CHECK_MSG(ok, "trial %d: the writer ended before the kill (status %d)", t, status);
    if (early && got == 0)
        tot->early_kills++;
    else if (!done)
        tot->mid_kills++;
    else
        tot->late_kills++;
    tot->acked += (long)got;

    /* the environment opens, verify is clean */
    shoal_diag d = {{0}};
    store_admin *a = NULL;
    shoal_err err = store_admin_open(dir, &a, &d);
    CHECK_MSG(err == SHOAL_OK, "trial %d: %s", t, d.msg);
    if (err != SHOAL_OK)
        return false;
    store_admin_verify_result r;
    err = store_admin_verify(a, NULL, NULL, &r, &d);
    store_admin_close(a);
    CHECK_MSG(err == SHOAL_OK, "trial %d: %s", t, d.msg);
    CHECK_MSG(r.corrupt == 0 && r.index_problems == 0,
              "trial %d: %llu corrupt, %llu index problems after the kill", t,
              (unsigned long long)r.corrupt, (unsigned long long)r.index_problems);
    ok = ok && err == SHOAL_OK && r.corrupt == 0 && r.index_problems == 0;
    tot->checked_records += (long)r.records;

    /* every acknowledged state is there, byte for byte */
    store_state_options o = trial_options(dir, model);
    store_state *s = NULL;
    err = store_state_open(&o, &s, &d);
    CHECK_MSG(err == SHOAL_OK, "trial %d: %s", t, d.msg);
    if (err == SHOAL_OK) {
        uint8_t *page = malloc(o.layout.page_bytes), *want = malloc(o.layout.page_bytes);
        for (size_t k = 0; k < got; k++) {
            common_hash h = tu_hash(seed, acked[k]);
            err = store_state_get(s, &h, page, o.layout.page_bytes, NULL, &d);
            tu_page(want, o.layout.page_bytes, seed, acked[k]);
            bool same = err == SHOAL_OK && memcmp(page, want, o.layout.page_bytes) == 0;
            CHECK_MSG(same, "trial %d: acknowledged put %u: %s", t, acked[k],
                      err == SHOAL_OK ? "wrong bytes" : d.msg);
            ok = ok && same;
        }
        free(page);
        free(want);
        store_state_close(s);
    }
    return ok;
}

static void test_sigkill_at_random_points_loses_nothing_acknowledged(void)
{
    int trials = TRIALS_DEFAULT;
    const char *env = getenv("SHOAL_STORE_CRASH_TRIALS");
    if (env && atoi(env) > 0)
        trials = atoi(env);
    char dir[128];
    tu_tempdir(dir, sizeof dir, "crash");
    uint64_t rng = (uint64_t)time(NULL);
    printf("crash: seed %llu (set SHOAL_STORE_CRASH_TRIALS for more than %d trials)\n",
           (unsigned long long)rng, TRIALS_DEFAULT);
    totals tot = {0};
    /* the store exists before the first writer can die creating it */
    store_state_options o = trial_options(dir, 0);
    store_state *s = NULL;
    CHECK_EQ_INT(store_state_open(&o, &s, NULL), SHOAL_OK);
    store_state_close(s);
    double t0 = tu_now_ms();
    int done = 0;
    long window_us = 0;
    for (int t = 0; t < trials; t++) {
        if (t % CALIBRATE_EVERY == 0) {
            window_us = calibrate(dir, t);
            CHECK_MSG(window_us > 0, "a writer left alone did not finish");
            if (window_us <= 0)
                break;
            printf("crash: a writer runs %.1f ms from open to its last acknowledgement\n",
                   (double)window_us / 1000.0);
        }
        if (!trial(dir, t, window_us, &rng, &tot))
            break;
        done++;
        if (tu_now_ms() - t0 > CRASH_SECONDS_MAX * 1000.0) {
            CHECK_MSG(false, "%d of %d trials in %d s: too slow", done, trials, CRASH_SECONDS_MAX);
            break;
        }
    }
    double secs = (tu_now_ms() - t0) / 1000.0;
    printf("crash: %d trials in %.1f s (%d killed while opening, %d mid-write, %d after the "
           "last ack); %ld acknowledged states checked; %ld records verified in all\n",
           done, secs, tot.early_kills, tot.mid_kills, tot.late_kills, tot.acked,
           tot.checked_records);
    CHECK_EQ_INT(done, trials);
    CHECK(tot.mid_kills > trials / 4); /* the kills did land while it wrote */

    /* and shoalctl agrees */
    char out[8192];
    const char *args[] = {"states", "verify", "--state-dir", dir, NULL};
    int rc = tu_shoalctl(out, sizeof out, args);
    CHECK_MSG(rc == 0, "shoalctl states verify: %d: %s", rc, out);
    tu_rmtree(dir);
}

int main(void)
{
    TEST_RUN(test_sigkill_at_random_points_loses_nothing_acknowledged);
    return TEST_EXIT();
}
