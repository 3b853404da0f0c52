/* shoalctl against a real cluster (issue #10): two CPU worker processes on
 * the qwen3 fixture, the real shoalctl binary.
 *
 * pages: with 16 streams running, `shoalctl pages --json --page-map`
 * agrees page for page with the page rows the engine keeps and with the
 * counts each worker reports; the workers are held where those two agree
 * (SHOAL_TEST_PAUSE=reported stops a worker right after its report; a
 * thread here lets them go on, except while a check runs). The same after
 * the streams end (free + cached == total), after worker 1 is SIGKILLed
 * (shoalctl says it is dead, or restarted with its last exit), and after
 * the cluster stops (no cluster running, exit 1). A stale segment, several
 * segments without --cluster, and usage errors each say what they found.
 *
 * drain: 8 streams on 2 workers, `shoalctl drain 1` while worker 1 still
 * holds 4 of them: every stream completes in full on the worker it
 * started on (none resumed elsewhere), no new stream lands on worker 1,
 * worker 1 exits 0 and stays DRAINED; `shoalctl undrain 1` brings it back
 * and it takes streams again.
 *
 * CTest runs it over a Qwen3-MoE and a hybrid (Qwen3-Next) model too: the
 * hybrid's state slots and checkpoints show in `shoalctl pages` as its
 * worker reports them. */
#include "common/common_time.h"
#include "coordinator/coordinator_cluster.h"
#include "shm/shm_segment.h"
#include "tests/stream_test_util.h"
#include "tests/test.h"
#include "tests/test_model.h"

#include <cjson/cJSON.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MODEL test_model_dir("qwen3-tied-bf16")
#define VOCAB test_model_vocab("qwen3-tied-bf16")
enum { STREAMS = 16, PROMPT = 90, SHARED = 48, OUT_MAX = 256, PAGES = 256 };

extern char **environ;

static char runtime_dir[64], name[32];

/* ---- running shoalctl ---- */

typedef struct ctl_out {
    int status; /* exit status, or -1 */
    char *out;  /* stdout (malloc'd) */
    char err[4096];
} ctl_out;

static void ctl_free(ctl_out *r)
{
    free(r->out);
    r->out = NULL;
}

/* Starts shoalctl with argv (NULL-terminated, without the program), its
 * stdout and stderr into files; returns the pid. */
static pid_t ctl_start(const char *const *args, const char *out_path, const char *err_path)
{
    const char *argv[32];
    int n = 0;
    argv[n++] = SHOALCTL_BIN;
    for (int i = 0; args[i] && n < 31; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&fa, 2, err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    pid_t pid = -1;
    int rc = posix_spawn(&pid, SHOALCTL_BIN, &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    CHECK_MSG(rc == 0, "cannot start %s: %s", SHOALCTL_BIN, strerror(rc));
    return rc == 0 ? pid : -1;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return calloc(1, 1);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    size_t got = buf ? fread(buf, 1, (size_t)n, f) : 0;
    if (buf)
        buf[got] = '\0';
    fclose(f);
    return buf;
}

static ctl_out ctl_wait(pid_t pid, const char *out_path, const char *err_path)
{
    ctl_out r = {-1, NULL, {0}};
    int st;
    if (pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st))
        r.status = WEXITSTATUS(st);
    r.out = slurp(out_path);
    char *e = slurp(err_path);
    snprintf(r.err, sizeof r.err, "%s", e ? e : "");
    free(e);
    unlink(out_path);
    unlink(err_path);
    return r;
}

static ctl_out ctl(const char *const *args)
{
    char out_path[96], err_path[96];
    snprintf(out_path, sizeof out_path, "%s/ctl.out", runtime_dir);
    snprintf(err_path, sizeof err_path, "%s/ctl.err", runtime_dir);
    return ctl_wait(ctl_start(args, out_path, err_path), out_path, err_path);
}

static cJSON *ctl_json(const char *const *args)
{
    ctl_out r = ctl(args);
    CHECK_MSG(r.status == 0, "shoalctl %s: exit %d: %s", args[0], r.status, r.err);
    cJSON *j = r.out ? cJSON_Parse(r.out) : NULL;
    CHECK_MSG(j != NULL, "shoalctl %s: not JSON: %.200s", args[0], r.out ? r.out : "");
    ctl_free(&r);
    return j;
}

/* A number at "key" or "object.key" (one level is all the checks need). */
static double num(const cJSON *o, const char *path)
{
    const char *dot = strchr(path, '.');
    if (dot) {
        char key[64];
        snprintf(key, sizeof key, "%.*s", (int)(dot - path), path);
        o = cJSON_GetObjectItemCaseSensitive(o, key);
        path = dot + 1;
    }
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, path);
    return cJSON_IsNumber(v) ? v->valuedouble : -1e300;
}

static const char *str(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static const cJSON *worker_json(const cJSON *root, int index)
{
    const cJSON *w;
    cJSON_ArrayForEach(w, cJSON_GetObjectItemCaseSensitive(
                              root, "workers")) if ((int)num(w, "index") == index) return w;
    return NULL;
}

/* ---- holding the workers where their counts and rows agree ---- */

static atomic_int hold;     /* 1: leave stopped workers stopped */
static atomic_int stepping; /* the stepper thread runs */
static pthread_t stepper;

static char proc_state(int pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' ? p[2] : 0;
}

static void *stepper_main(void *arg)
{
    (void)arg;
    shm_segment *s = NULL;
    while (atomic_load(&stepping)) {
        if (!s && shm_segment_attach(name, true, &s, NULL) != SHOAL_OK)
            s = NULL;
        if (s && !atomic_load(&hold))
            for (int w = 0; w < 2; w++) {
                int pid = shm_segment_worker(s, w)->pid;
                if (pid > 0 && proc_state(pid) == 'T')
                    kill(pid, SIGCONT);
            }
        usleep(500);
    }
    shm_segment_close(s);
    return NULL;
}

static bool live_worker(shm_segment *s, int w)
{
    uint32_t st = atomic_load(&shm_segment_worker(s, w)->state);
    int pid = shm_segment_worker(s, w)->pid;
    return (st == SHM_WORKER_READY || st == SHM_WORKER_DRAINING) && pid > 0 &&
           proc_state(pid) != 0 && proc_state(pid) != 'Z';
}

/* Holds every live worker at its pause point. */
static bool hold_workers(shm_segment *s)
{
    atomic_store(&hold, 1);
    for (int t = 0; t < 2000; t++) {
        int held = 0, live = 0;
        for (int w = 0; w < 2; w++)
            if (live_worker(s, w)) {
                live++;
                held += proc_state(shm_segment_worker(s, w)->pid) == 'T';
            }
        if (held == live)
            return true;
        usleep(2000);
    }
    return false;
}

static void release_workers(void)
{
    atomic_store(&hold, 0);
}

/* ---- streams ---- */

typedef ts_stream result;

static int32_t prompts[64][PROMPT];

static void make_prompts(void)
{
    uint64_t x = 12345;
    for (int i = 0; i < 64; i++)
        for (int t = 0; t < PROMPT; t++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            /* the first SHARED tokens are the same in every prompt: cached
             * prefix pages, shared between streams */
            prompts[i][t] = t < SHARED ? 3 + t : (int32_t)(3 + (x >> 33) % (VOCAB - 3));
        }
}

static uint64_t submit(coordinator_cluster *c, int i, int out, result *r)
{
    ts_stream_init(r);
    coordinator_stream_request q;
    memset(&q, 0, sizeof q);
    q.prompt = prompts[i % 64];
    q.prompt_len = PROMPT;
    q.max_tokens = out;
    q.sampling.top_p = 1.0f;
    q.sampling.repetition_penalty = 1.0f;
    q.ignore_eos = true;
    uint64_t id = 0;
    shoal_diag diag = {{0}};
    CHECK_MSG(coordinator_cluster_submit(c, &q, ts_stream_event, r, &id, &diag) == SHOAL_OK, "%s",
              diag.msg);
    return id;
}

/* Every stream ended with all its tokens, in order. */
static void check_complete(const char *when, result *r, int n, int out)
{
    int full = 0;
    for (int t = 0; t < 120000 / 10; t++) {
        int done = 0;
        for (int i = 0; i < n; i++)
            done += atomic_load(&r[i].done);
        if (done == n)
            break;
        usleep(10000);
    }
    for (int i = 0; i < n; i++)
        full += atomic_load(&r[i].done) && r[i].n == out && !r[i].gap &&
                r[i].finish != COORDINATOR_FINISH_ERROR;
    CHECK_MSG(full == n, "%s: %d of %d streams complete with %d tokens", when, full, n, out);
}

static coordinator_cluster *start(coordinator_route route, int dead_after_ms,
                                  const char *state_dir)
{
    coordinator_cluster_options o;
    coordinator_cluster_options_default(&o);
    o.model_dir = MODEL;
    o.workers = "cpu,cpu";
    o.runtime_dir = runtime_dir;
    o.cluster = name;
    o.worker_path = SHOAL_WORKER_BIN;
    o.route = route;
    o.threads = 1;
    o.parallel = 16;
    o.kv_pages = PAGES;
    o.max_model_len = 1024;
    o.max_batch_tokens = 512;
    o.heartbeat_ms = 50;
    o.dead_after_ms = dead_after_ms;
    o.start_timeout_ms = 60000;
    o.state_dir = state_dir; /* --learn-conversations */
    coordinator_cluster *c = NULL;
    shoal_diag diag = {{0}};
    CHECK_MSG(coordinator_cluster_open(&o, &c, &diag) == SHOAL_OK, "%s", diag.msg);
    return c;
}

static int running_streams(shm_segment *s)
{
    int n = 0;
    for (int w = 0; w < 2; w++)
        if (live_worker(s, w))
            n += atomic_load(&shm_segment_worker(s, w)->running);
    return n;
}

/* ---- the pages check ---- */

/* With the workers held: shoalctl pages, workers and streams against the
 * page rows, worker rows and stream rows. Returns the streams seen. */
static int check_pages(shm_segment *s, const char *when)
{
    CHECK_MSG(hold_workers(s), "%s: the workers did not stop at their report", when);
    /* a slot that changes hands meanwhile (a restart) is not compared */
    uint64_t epoch[2];
    for (int w = 0; w < 2; w++)
        epoch[w] = atomic_load(&shm_segment_worker(s, w)->epoch);
    const char *pages_args[] = {"pages", "--json", "--page-map", "--cluster", name, NULL};
    cJSON *pages = ctl_json(pages_args);
    const char *streams_args[] = {"streams", "--json", "--cluster", name, NULL};
    cJSON *streams = ctl_json(streams_args);
    const char *workers_args[] = {"workers", "--json", "--sample", "0", "--cluster", name, NULL};
    cJSON *workers = ctl_json(workers_args);
    int stream_rows = 0;
    for (int w = 0; w < 2 && pages && streams && workers; w++) {
        shm_worker_row *row = shm_segment_worker(s, w);
        const cJSON *jw = worker_json(pages, w), *jk = worker_json(workers, w);
        CHECK_MSG(jw && jk, "%s: worker %d missing from shoalctl's output", when, w);
        if (!jw || !jk)
            continue;
        if (atomic_load(&row->epoch) != epoch[w] || (int)num(jw, "pid") != row->pid) {
            printf("  %s: worker %d changed hands during the check; not compared\n", when, w);
            continue;
        }
        bool live = live_worker(s, w);
        /* the engine's page rows, counted here */
        int total = atomic_load(&row->pages_total), n[3] = {0}, leased = 0, hashed = 0,
            mismatched = 0;
        const shm_page_row *rows = shm_segment_pages(s, w);
        const char *map = str(jw, "page_map");
        CHECK_MSG((int)strlen(map) == total, "%s: worker %d: page map of %zu pages, %d rows", when,
                  w, strlen(map), total);
        for (int p = 0; p < total; p++) {
            uint32_t st = atomic_load(&rows[p].state);
            if (st <= SHM_PAGE_CACHED)
                n[st]++;
            leased += atomic_load(&rows[p].leases) > 0;
            hashed += st != SHM_PAGE_FREE && (atomic_load(&rows[p].flags) & SHM_PAGE_HASHED);
            char want = st == SHM_PAGE_FREE ? '.' : st == SHM_PAGE_ACTIVE ? 'a' : 'c';
            if (p < (int)strlen(map) && map[p] != want)
                mismatched++;
        }
        CHECK_MSG(mismatched == 0, "%s: worker %d: %d pages differ from shoalctl's map", when, w,
                  mismatched);
        CHECK_MSG(num(jw, "pages.total") == total && num(jw, "pages.free") == n[0] &&
                      num(jw, "pages.active") == n[1] && num(jw, "pages.cached") == n[2] &&
                      num(jw, "pages.leased") == leased && num(jw, "pages.hashed") == hashed,
                  "%s: worker %d: shoalctl total %g free %g active %g cached %g leased %g "
                  "hashed %g; rows %d %d %d %d %d %d",
                  when, w, num(jw, "pages.total"), num(jw, "pages.free"), num(jw, "pages.active"),
                  num(jw, "pages.cached"), num(jw, "pages.leased"), num(jw, "pages.hashed"), total,
                  n[0], n[1], n[2], leased, hashed);
        CHECK_EQ_INT(n[0] + n[1] + n[2], total);
        uint64_t pb = atomic_load(&row->page_bytes);
        CHECK_MSG(num(jw, "bytes.cached") == (double)n[2] * (double)pb &&
                      num(jw, "bytes.total") == (double)total * (double)pb,
                  "%s: worker %d: bytes disagree", when, w);
        if (live) { /* the worker's own counts, as of its report */
            CHECK_MSG(
                atomic_load(&row->pages_free) == n[0] && atomic_load(&row->pages_active) == n[1] &&
                    atomic_load(&row->pages_cached) == n[2] && num(jw, "reported.free") == n[0] &&
                    num(jw, "reported.active") == n[1] && num(jw, "reported.cached") == n[2],
                "%s: worker %d reports free %d active %d cached %d, rows %d %d %d", when, w,
                atomic_load(&row->pages_free), atomic_load(&row->pages_active),
                atomic_load(&row->pages_cached), n[0], n[1], n[2]);
            CHECK_EQ_INT((int)num(jk, "pid"), row->pid);
            CHECK_EQ_INT((int)num(jk, "running"), atomic_load(&row->running));
            /* hybrid models: the state slots as the worker reports them,
             * one a running stream, the checkpoints' bytes in the total */
            uint64_t sb = atomic_load(&row->slot_bytes);
            int slots = atomic_load(&row->state_slots), ck = atomic_load(&row->checkpoints_max);
            CHECK_MSG(num(jw, "state_slots.slot_bytes") == (double)sb &&
                          num(jw, "state_slots.streams") == slots &&
                          num(jw, "state_slots.checkpoints") == ck &&
                          num(jw, "state_slots.checkpoints_held") ==
                              atomic_load(&row->checkpoints_held) &&
                          num(jw, "state_slots.bytes") == (double)(slots + ck) * (double)sb,
                      "%s: worker %d: state slots disagree with the worker's row", when, w);
            if (sb > 0) {
                CHECK_EQ_INT(slots, 16); /* --parallel */
                CHECK_EQ_INT(ck, 32);    /* twice --parallel, the default */
                CHECK_EQ_INT(atomic_load(&row->states_running), atomic_load(&row->running));
                CHECK(atomic_load(&row->checkpoints_held) <= ck);
            } else {
                CHECK(slots == 0 && ck == 0);
            }
            CHECK_MSG(strcmp(str(jk, "health"), "ok") == 0, "%s: worker %d: %s", when, w,
                      str(jk, "health"));
        }
        /* streams: each row once, with its pages and tokens */
        const shm_stream_row *sr = shm_segment_streams(s, w);
        for (int i = 0; live && i < shm_segment_header_of(s)->streams_max; i++) {
            uint64_t id = atomic_load(&sr[i].id);
            if (id == 0 || atomic_load(&sr[i].state) == SHM_STREAM_NONE)
                continue;
            stream_rows++;
            const cJSON *js, *found = NULL;
            cJSON_ArrayForEach(js, cJSON_GetObjectItemCaseSensitive(
                                       streams, "streams")) if ((uint64_t)num(js, "id") == id)
                found = js;
            CHECK_MSG(found && (int)num(found, "worker") == w &&
                          (int)num(found, "pages") == atomic_load(&sr[i].pages) &&
                          (int)num(found, "generated") == atomic_load(&sr[i].generated),
                      "%s: stream %llu on worker %d: shoalctl does not show it as the row has it",
                      when, (unsigned long long)id, w);
        }
    }
    if (streams)
        CHECK_EQ_INT(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(streams, "streams")),
                     stream_rows);
    cJSON_Delete(pages);
    cJSON_Delete(streams);
    cJSON_Delete(workers);
    release_workers();
    return stream_rows;
}

static result res[64];

static void pages_agree_with_the_engine_while_running_after_a_kill_and_after_stop(void)
{
    if (!test_hooks(__func__))
        return;
    snprintf(name, sizeof name, "ctl-pages-%d", (int)getpid());
    atomic_store(&stepping, 1);
    pthread_create(&stepper, NULL, stepper_main, NULL);
    /* kept while the cluster runs: a restarted worker pauses too */
    setenv("SHOAL_TEST_PAUSE", "reported", 1);
    coordinator_cluster *c = start(COORDINATOR_ROUTE_LEAST_LOADED, 10000, NULL);
    shm_segment *s = NULL;
    if (c)
        CHECK(shm_segment_attach(name, true, &s, NULL) == SHOAL_OK);
    if (!c || !s)
        goto out;

    /* 16 streams running */
    for (int i = 0; i < STREAMS; i++)
        submit(c, i, OUT_MAX, &res[i]);
    int seen = 0;
    for (int t = 0; t < 3000 && seen < STREAMS; t++) {
        if (running_streams(s) == STREAMS) {
            CHECK(hold_workers(s));
            seen = running_streams(s) == STREAMS ? check_pages(s, "16 streams running") : 0;
            release_workers();
        }
        usleep(10000);
    }
    CHECK_MSG(seen == STREAMS, "shoalctl streams saw %d of %d streams running", seen, STREAMS);
    const char *text_args[] = {"pages", "--cluster", name, NULL};
    ctl_out text = ctl(text_args); /* what a person reads */
    CHECK_MSG(text.status == 0 && strstr(text.out, "worker 1  cpu") &&
                  strstr(text.out, "prefix cache") && strstr(text.out, "[#"),
              "pages as text: exit %d, '%s'", text.status, text.out);
    ctl_free(&text);
    check_complete("first 16", res, STREAMS, OUT_MAX);
    usleep(300000); /* a report after the last step */
    check_pages(s, "after the streams ended");
    for (int w = 0; w < 2; w++) {
        CHECK_EQ_INT(atomic_load(&shm_segment_worker(s, w)->pages_active), 0);
        CHECK(atomic_load(&shm_segment_worker(s, w)->pages_cached) > 0); /* prefixes stay */
    }
    /* chains: each stream left one, of its known tokens' whole blocks
     * (prompt + output but the last token), all sharing the first
     * SHARED / 16 blocks, which later streams reused */
    const char *chain_args[] = {"pages", "--json", "--cluster", name, NULL};
    cJSON *chains = ctl_json(chain_args);
    int resident = 0, whole_shared = 0;
    for (int w = 0; w < 2 && chains; w++) {
        const cJSON *jw = worker_json(chains, w);
        const cJSON *largest =
            cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(jw, "largest_prefixes"), 0);
        const cJSON *reused =
            cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(jw, "most_reused_prefixes"), 0);
        resident += (int)num(jw, "chains.resident");
        CHECK_MSG(largest && (int)num(largest, "pages") == (PROMPT + OUT_MAX - 1) / 16 &&
                      (int)num(largest, "tokens") == (PROMPT + OUT_MAX - 1) / 16 * 16,
                  "worker %d: largest cached prefix %g pages", w,
                  largest ? num(largest, "pages") : -1);
        /* Within the shared part on each worker. Usually all of it, but
         * a worker that imports the peer's first block while the peer has
         * published no more (the peer mid-prefill) publishes that block at
         * once: the streams admitted with it hit that one block and
         * compute the next ones themselves, so it is the most reused. */
        int rp = reused ? (int)num(reused, "pages") : -1;
        CHECK_MSG(reused && rp >= 1 && rp <= SHARED / 16 && num(reused, "uses") >= 1,
                  "worker %d: most reused prefix %d pages, %g uses", w, rp,
                  reused ? num(reused, "uses") : -1);
        whole_shared += rp == SHARED / 16;
    }
    CHECK_MSG(whole_shared >= 1, "no worker's most reused prefix is the whole shared prompt");
    CHECK_MSG(resident == STREAMS, "%d chains resident after %d streams", resident, STREAMS);
    cJSON_Delete(chains);

    /* SIGKILL worker 1 with streams running */
    for (int i = 0; i < STREAMS; i++)
        submit(c, STREAMS + i, OUT_MAX / 2, &res[i]);
    for (int t = 0; t < 3000 && atomic_load(&shm_segment_worker(s, 1)->running) == 0; t++)
        usleep(10000);
    int victim = shm_segment_worker(s, 1)->pid;
    kill(victim, SIGKILL);
    bool dead_seen = false, restarted_seen = false;
    for (int t = 0; t < 600 && !restarted_seen; t++) {
        const char *args[] = {"workers", "--json", "--sample", "0", "--cluster", name, NULL};
        cJSON *j = ctl_json(args);
        const cJSON *w1 = j ? worker_json(j, 1) : NULL;
        if (w1 && strcmp(str(w1, "state"), "dead") == 0 && !dead_seen) {
            dead_seen = true;
            CHECK_MSG(strstr(str(w1, "health"), "dead since") &&
                          strstr(str(w1, "health"), "killed by signal 9") &&
                          (int)num(w1, "exit_code") == -9,
                      "dead worker 1: '%s'", str(w1, "health"));
            check_pages(s, "worker 1 dead");
        } else if (w1 && strcmp(str(w1, "state"), "ready") == 0 && (int)num(w1, "pid") != victim &&
                   (int)num(w1, "exits") >= 1) {
            restarted_seen = true;
            CHECK_MSG(strstr(str(w1, "last_exit"), "killed by signal 9"),
                      "restarted worker 1's last exit: '%s'", str(w1, "last_exit"));
        }
        cJSON_Delete(j);
        usleep(20000);
    }
    printf("  after SIGKILL: dead seen %d, restarted seen %d\n", dead_seen, restarted_seen);
    CHECK(dead_seen || restarted_seen);
    CHECK(restarted_seen);
    check_pages(s, "worker 1 restarted");
    check_complete("16 with a kill", res, STREAMS, OUT_MAX / 2);
    usleep(300000);
    check_pages(s, "after the kill, idle");

out:
    shm_segment_close(s);
    coordinator_cluster_close(c);
    atomic_store(&stepping, 0);
    pthread_join(stepper, NULL);
    unsetenv("SHOAL_TEST_PAUSE");
    /* the cluster stopped: each command says so */
    const char *verbs[] = {"pages", "workers", "streams"};
    for (int i = 0; i < 3; i++) {
        const char *args[] = {verbs[i], "--cluster", name, NULL};
        ctl_out r = ctl(args);
        char want[96];
        snprintf(want, sizeof want, "no cluster '%s' is running", name);
        CHECK_MSG(r.status == 1 && strstr(r.err, want), "%s after stop: exit %d, '%s'", verbs[i],
                  r.status, r.err);
        ctl_free(&r);
    }
}

/* A segment whose coordinator was killed: shoalctl says whose and since
 * when, shows what it held, and exits 1; drain refuses. */
static void stale_segment_is_named_as_such(void)
{
    char stale[32];
    snprintf(stale, sizeof stale, "ctl-stale-%d", (int)getpid());
    bool checked = false;
    /* another test's coordinator start sweeps stale segments: retry */
    for (int attempt = 0; attempt < 5 && !checked; attempt++) {
        pid_t child = fork();
        if (child == 0) {
            shm_segment_sizes z;
            shm_segment_sizes_default(2, &z);
            z.pages = 64;
            shm_segment *s = NULL;
            _exit(shm_segment_create(stale, &z, &s, NULL) == SHOAL_OK ? 0 : 1);
        }
        int st;
        waitpid(child, &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        const char *args[] = {"pages", "--cluster", stale, NULL};
        ctl_out r = ctl(args);
        if (strstr(r.err, "no cluster")) { /* swept meanwhile */
            ctl_free(&r);
            continue;
        }
        char want[96];
        snprintf(want, sizeof want, "stale segment left by coordinator pid %d, gone since",
                 (int)child);
        CHECK_MSG(r.status == 1 && strstr(r.err, want), "stale: exit %d, '%s'", r.status, r.err);
        CHECK_HAS(r.out, "GONE (stale segment)");
        ctl_free(&r);
        const char *drain[] = {"drain", "0", "--cluster", stale, NULL};
        r = ctl(drain);
        if (!strstr(r.err, "no cluster")) {
            CHECK_MSG(r.status == 1 && strstr(r.err, "no coordinator would act on it"),
                      "drain on a stale segment: exit %d, '%s'", r.status, r.err);
            checked = true;
        }
        ctl_free(&r);
    }
    CHECK_MSG(checked, "the stale segment was swept away five times in a row");
    char path[64];
    snprintf(path, sizeof path, "/shoal.%s", stale);
    shm_unlink(path);
}

/* Without --cluster and with several segments, the command lists them and
 * asks (exit 2); usage errors exit 2; a worker that does not exist is 1. */
static void several_clusters_and_bad_arguments(void)
{
    char a[32], b[32];
    snprintf(a, sizeof a, "ctl-a-%d", (int)getpid());
    snprintf(b, sizeof b, "ctl-b-%d", (int)getpid());
    shm_segment_sizes z;
    shm_segment_sizes_default(1, &z);
    z.pages = 16;
    shm_segment *sa = NULL, *sb = NULL;
    CHECK(shm_segment_create(a, &z, &sa, NULL) == SHOAL_OK);
    CHECK(shm_segment_create(b, &z, &sb, NULL) == SHOAL_OK);
    unsetenv("SHOAL_CLUSTER");
    const char *none[] = {"pages", NULL};
    ctl_out r = ctl(none);
    CHECK_MSG(r.status == 2 && strstr(r.err, "--cluster NAME") && strstr(r.err, a) &&
                  strstr(r.err, b),
              "several: exit %d, '%s'", r.status, r.err);
    ctl_free(&r);
    const char *no_worker[] = {"drain", "1", "--cluster", a, NULL};
    r = ctl(no_worker);
    CHECK_MSG(r.status == 1 && strstr(r.err, "has no worker 1"), "drain 1: exit %d, '%s'", r.status,
              r.err);
    ctl_free(&r);
    const char *empty[] = {"pages", "--cluster", a, NULL};
    r = ctl(empty);
    CHECK_MSG(r.status == 0 && strstr(r.out, "no worker has joined"), "empty: exit %d, '%s'",
              r.status, r.out);
    ctl_free(&r);
    shm_segment_close(sa);
    shm_segment_close(sb);
    const char *bad[][6] = {{"pages", "--watch", "x", NULL},
                            {"pages", "--bogus", NULL},
                            {"drain", NULL},
                            {"drain", "abc", NULL},
                            {"undrain", "1", "--timeout", NULL},
                            {"workers", "--sample", "-1", NULL}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        r = ctl(bad[i]);
        CHECK_MSG(r.status == 2, "%s %s: exit %d, not 2", bad[i][0], bad[i][1] ? bad[i][1] : "",
                  r.status);
        ctl_free(&r);
    }
    /* a negative index is named as an index, not as an unknown option */
    const char *negative[] = {"drain", "-1", NULL};
    r = ctl(negative);
    CHECK_MSG(r.status == 2 && strstr(r.err, "'-1' is not a worker index (0 to"),
              "drain -1: exit %d, '%s'", r.status, r.err);
    ctl_free(&r);
    /* a name no cluster can have: the rule is named */
    const char *odd[] = {"pages", "--cluster", "a/b", NULL};
    r = ctl(odd);
    CHECK_MSG(r.status != 0 && strstr(r.err, "'a/b' is not valid: 1 to 31 letters"),
              "--cluster a/b: exit %d, '%s'", r.status, r.err);
    ctl_free(&r);
}

/* ---- drain ---- */

static void stream_ids(shm_segment *s, int w, uint64_t *ids, int *n)
{
    const shm_stream_row *sr = shm_segment_streams(s, w);
    *n = 0;
    for (int i = 0; i < shm_segment_header_of(s)->streams_max && *n < 64; i++) {
        uint64_t id = atomic_load(&sr[i].id);
        if (id && atomic_load(&sr[i].state) != SHM_STREAM_NONE)
            ids[(*n)++] = id;
    }
}

/* Stops worker w (SIGSTOP) with `want` streams both in its running count
 * and in its stream rows, their ids into ids. A report writes the count
 * first and the rows after: a stop that lands between the two shows one
 * stream fewer in the rows, so the worker is let go and stopped again. */
static bool stop_with_streams(shm_segment *s, int w, int want, uint64_t *ids, int *n)
{
    shm_worker_row *row = shm_segment_worker(s, w);
    int pid = row->pid;
    for (int t = 0; t < 500; t++) {
        kill(pid, SIGSTOP);
        for (int k = 0; k < 1000 && proc_state(pid) != 'T'; k++)
            usleep(1000);
        stream_ids(s, w, ids, n);
        if (*n == want && atomic_load(&row->running) == want)
            return true;
        kill(pid, SIGCONT);
        usleep(2000);
    }
    return false;
}

static coordinator_worker_stats worker_stats(coordinator_cluster *c, int w, uint64_t *resumed)
{
    coordinator_cluster_stats st;
    coordinator_cluster_stats_get(c, &st);
    if (resumed)
        *resumed = st.resumed;
    return st.worker[w];
}

static void drain_loses_no_stream_and_places_none_on_the_drained_worker(void)
{
    snprintf(name, sizeof name, "ctl-drain-%d", (int)getpid());
    /* learning: the drained worker writes its conversations at its stop */
    char states[96];
    snprintf(states, sizeof states, "%s/states", runtime_dir);
    coordinator_cluster *c = start(COORDINATOR_ROUTE_LEAST_LOADED, 10000, states);
    shm_segment *s = NULL;
    if (c)
        CHECK(shm_segment_attach(name, true, &s, NULL) == SHOAL_OK);
    if (!c || !s) {
        coordinator_cluster_close(c);
        return;
    }
    shm_worker_row *row = shm_segment_worker(s, 1);
    for (int i = 0; i < 8; i++)
        submit(c, i, OUT_MAX / 2, &res[i]);
    for (int t = 0; t < 3000 && atomic_load(&row->running) < 4; t++)
        usleep(5000);
    /* hold worker 1 so its 4 streams are surely running when the drain
     * starts */
    int pid1 = row->pid;
    uint64_t before[64];
    int n_before = 0;
    CHECK(stop_with_streams(s, 1, 4, before, &n_before));
    CHECK_MSG(n_before == 4 && worker_stats(c, 1, NULL).inflight == 4,
              "worker 1 holds %d streams (%d in flight) when the drain starts", n_before,
              worker_stats(c, 1, NULL).inflight);
    char out_path[96], err_path[96];
    snprintf(out_path, sizeof out_path, "%s/drain.out", runtime_dir);
    snprintf(err_path, sizeof err_path, "%s/drain.err", runtime_dir);
    const char *args[] = {"drain", "1", "--cluster", name, "--timeout", "120", NULL};
    pid_t drain = ctl_start(args, out_path, err_path);
    for (int t = 0; t < 1000 && !worker_stats(c, 1, NULL).draining; t++)
        usleep(5000);
    CHECK(worker_stats(c, 1, NULL).draining);
    CHECK_EQ_INT(atomic_load(&row->state), SHM_WORKER_DRAINING);
    /* new streams while it drains: all go to worker 0, though worker 1
     * has fewer in flight */
    for (int i = 8; i < 16; i++) {
        submit(c, i, OUT_MAX / 4, &res[i]);
        CHECK_MSG(worker_stats(c, 1, NULL).inflight <= 4, "a new stream went to worker 1");
    }
    kill(pid1, SIGCONT);
    int stray = 0, last_inflight = 4;
    for (int t = 0;
         t < 60000 / 5 && row->pid == pid1 && atomic_load(&row->state) != SHM_WORKER_DRAINED; t++) {
        uint64_t now[64];
        int n_now = 0;
        stream_ids(s, 1, now, &n_now);
        for (int i = 0; i < n_now; i++) {
            bool known = false;
            for (int k = 0; k < n_before; k++)
                known = known || now[i] == before[k];
            stray += !known;
        }
        int inflight = worker_stats(c, 1, NULL).inflight;
        CHECK_MSG(inflight <= last_inflight, "worker 1's streams in flight rose from %d to %d",
                  last_inflight, inflight);
        last_inflight = inflight;
        usleep(5000);
    }
    CHECK_MSG(stray == 0, "%d sightings of a new stream on the draining worker", stray);
    ctl_out r = ctl_wait(drain, out_path, err_path);
    printf("  drain said:\n%s", r.out);
    CHECK_MSG(r.status == 0 && strstr(r.out, "drained after") && strstr(r.out, "exit status 0"),
              "drain: exit %d, out '%s', err '%s'", r.status, r.out, r.err);
    ctl_free(&r);
    check_complete("8 before and 8 during the drain", res, 8, OUT_MAX / 2);
    check_complete("8 during the drain", res + 8, 8, OUT_MAX / 4);
    uint64_t resumed = 0;
    coordinator_worker_stats w1 = worker_stats(c, 1, &resumed);
    CHECK_MSG(resumed == 0, "%llu streams were resumed elsewhere: the drain lost them",
              (unsigned long long)resumed);
    CHECK(w1.drained && w1.inflight == 0);
    CHECK_EQ_INT(atomic_load(&row->state), SHM_WORKER_DRAINED);
    CHECK_EQ_INT(atomic_load(&row->exit_code), 0);
    CHECK_EQ_INT(atomic_load(&row->drain), 1);
    CHECK(!shm_pid_alive(pid1));
    /* it stays down: no process takes the slot again, past the restart
     * backoff and with new streams */
    uint64_t drained_epoch = atomic_load(&row->epoch);
    usleep(2500000);
    for (int i = 0; i < 4; i++)
        submit(c, 16 + i, 16, &res[16 + i]);
    check_complete("4 while drained", res + 16, 4, 16);
    CHECK_EQ_INT(atomic_load(&row->state), SHM_WORKER_DRAINED);
    CHECK_MSG(atomic_load(&row->epoch) == drained_epoch && atomic_load(&row->exits) == 1,
              "the drained worker was started again (epoch %llu -> %llu, %d exits)",
              (unsigned long long)drained_epoch, (unsigned long long)atomic_load(&row->epoch),
              atomic_load(&row->exits));
    CHECK_EQ_INT(worker_stats(c, 1, NULL).inflight, 0);
    const char *ws[] = {"workers", "--json", "--sample", "0", "--cluster", name, NULL};
    cJSON *j = ctl_json(ws);
    const cJSON *jw = j ? worker_json(j, 1) : NULL;
    CHECK_MSG(jw && strcmp(str(jw, "state"), "drained") == 0 &&
                  strstr(str(jw, "health"), "exit status 0"),
              "workers shows worker 1 as '%s': '%s'", jw ? str(jw, "state") : "?",
              jw ? str(jw, "health") : "?");
    cJSON_Delete(j);
    CHECK(coordinator_cluster_healthy(c)); /* drained on purpose is healthy */
    /* its 4 conversations went to the store when it stopped (no page was
     * evicted before: the pools are far from full); a hybrid model's also
     * have their turns' state checkpoints, each a chain end of its own */
    model_config mc;
    shoal_diag md = {{0}};
    CHECK_MSG(model_config_load(MODEL, &mc, &md) == SHOAL_OK, "%s", md.msg);
    bool hybrid = model_config_has_linear(&mc);
    {
        const char *on_disk[] = {"pages", "--json", "--state-dir", states, "--cluster", name,
                                 NULL};
        j = ctl_json(on_disk);
        const cJSON *store = j ? cJSON_GetObjectItemCaseSensitive(j, "store") : NULL;
        double chains = store ? num(store, "chains") : -1;
        CHECK_MSG(store && (hybrid ? chains >= 4 : chains == 4) && num(store, "records") >= 4,
                  "the store after the drain: %g chains, %g records (%s)", chains,
                  store ? num(store, "records") : -1, store ? str(store, "error") : "?");
        cJSON_Delete(j);
    }

    /* undrain: started again, takes streams */
    uint64_t epoch = atomic_load(&row->epoch);
    const char *un[] = {"undrain", "1", "--cluster", name, "--timeout", "120", NULL};
    r = ctl(un);
    CHECK_MSG(r.status == 0 && strstr(r.out, "ready"), "undrain: exit %d, '%s' '%s'", r.status,
              r.out, r.err);
    ctl_free(&r);
    CHECK_EQ_INT(atomic_load(&row->state), SHM_WORKER_READY);
    CHECK(atomic_load(&row->epoch) != epoch && shm_pid_alive(row->pid) && row->pid != pid1);
    for (int t = 0; t < 2000 && !worker_stats(c, 1, NULL).alive; t++)
        usleep(5000); /* the coordinator saw its HELLO */
    int took = 0;
    for (int i = 0; i < 8; i++) {
        submit(c, 20 + i, 32, &res[20 + i]);
        took = worker_stats(c, 1, NULL).inflight > took ? worker_stats(c, 1, NULL).inflight : took;
    }
    CHECK_MSG(took > 0, "the undrained worker took no stream");
    check_complete("8 after undrain", res + 20, 8, 32);
    shm_segment_close(s);
    coordinator_cluster_close(c);
    char rm[160];
    snprintf(rm, sizeof rm, "rm -rf '%s'", states);
    CHECK(system(rm) == 0);
}

/* A worker inside one step longer than SHOAL_REPORT_LATE_MS (every step
 * made 3 s longer by SHOAL_TEST_STEP_SLEEP_MS) answers its coordinator
 * from the step's heartbeat thread; shoalctl says so too, where it called
 * the worker "not answering" 2 s into each such step. */
static void a_worker_in_a_long_step_is_not_called_silent(void)
{
    if (!test_hooks(__func__))
        return;
    snprintf(name, sizeof name, "ctl-slow-%d", (int)getpid());
    setenv("SHOAL_TEST_STEP_SLEEP_MS", "3000", 1);
    coordinator_cluster *c = start(COORDINATOR_ROUTE_LEAST_LOADED, 10000, NULL);
    unsetenv("SHOAL_TEST_STEP_SLEEP_MS");
    if (!c)
        return;
    submit(c, 0, 2, &res[0]);
    int samples = 0, silent = 0;
    char said[160] = "";
    for (long long t0 = common_mono_ms(); common_mono_ms() - t0 < 5000;) {
        const char *args[] = {"workers", "--json", "--sample", "0", "--cluster", name, NULL};
        cJSON *j = ctl_json(args);
        for (int w = 0; j && w < 2; w++) {
            const char *health = str(worker_json(j, w), "health");
            samples++;
            if (strstr(health, "not answering")) {
                silent++;
                snprintf(said, sizeof said, "worker %d: %s", w, health);
            }
        }
        cJSON_Delete(j);
        usleep(100000);
    }
    CHECK_MSG(samples > 0 && silent == 0, "%d of %d samples say a worker in a step is silent (%s)",
              silent, samples, said);
    check_complete("one stream in 3 s steps", res, 1, 2);
    coordinator_cluster_close(c);
}

int main(void)
{
    snprintf(runtime_dir, sizeof runtime_dir, "/tmp/shoal-ctl-%d", (int)getpid());
    mkdir(runtime_dir, 0700);
    make_prompts();
    TEST_RUN(pages_agree_with_the_engine_while_running_after_a_kill_and_after_stop);
    TEST_RUN(stale_segment_is_named_as_such);
    TEST_RUN(several_clusters_and_bad_arguments);
    TEST_RUN(drain_loses_no_stream_and_places_none_on_the_drained_worker);
    TEST_RUN(a_worker_in_a_long_step_is_not_called_silent);
    rmdir(runtime_dir);
    return TEST_EXIT();
}
