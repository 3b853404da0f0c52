/* shoal-bench-share: time to first token of a stream whose prefix another
 * worker computed (imported through the shared segment) against the same
 * stream computed from nothing (issue #8).
 *
 *   shoal-bench-share --model DIR [--load-format dummy] --devices 0,0
 *       [--prefix 4096,16384] [--kv-pages N] [--worker-path PATH]
 *
 * Two workers (on one device or two). For each prefix length P: stream A
 * (P + 32 tokens) runs on worker 0 and publishes its blocks; stream B (the
 * same P tokens, another 32-token tail, one output token) goes to worker 1,
 * which imports the prefix; stream C (B's prompt under a salt of its own,
 * so no cache serves it) is recomputed on worker 1; then B runs on worker
 * 0, where the prefix is a local hit (the floor that reading another
 * worker's pages in place could reach). TTFT is submit to first
 * token, measured here through the coordinator's cluster API. */
#include "common/common_log.h"
#include "coordinator/coordinator_cluster.h"

#include <getopt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { TAIL = 32 };

typedef struct result {
    atomic_int done;
    atomic_llong first_ns;
    int cached;
} result;

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

static void on_event(void *ctx, const shm_event *ev, const char *error)
{
    result *r = ctx;
    if (ev->token >= 0 && ev->index == 0) {
        atomic_store(&r->first_ns, now_ns());
        r->cached = ev->cached_tokens;
    }
    if (ev->finish) {
        if (error)
            fprintf(stderr, "shoal-bench-share: stream failed: %s\n", error);
        atomic_store(&r->done, 1);
    }
}

/* Runs one stream on the worker round-robin picks next; returns TTFT in
 * seconds (negative on failure). */
static double run(coordinator_cluster *c, const int32_t *prompt, int len, bool salted, int *cached)
{
    result r = {0};
    coordinator_stream_request q;
    memset(&q, 0, sizeof q);
    q.prompt = prompt;
    q.prompt_len = len;
    q.max_tokens = 1;
    q.sampling.top_p = 1.0f;
    q.sampling.repetition_penalty = 1.0f;
    q.ignore_eos = true;
    if (salted) {
        q.has_salt = true;
        long long t = now_ns();
        common_hash_bytes(&t, sizeof t, &q.salt);
    }
    uint64_t id;
    shoal_diag diag = {{0}};
    long long t0 = now_ns();
    if (coordinator_cluster_submit(c, &q, on_event, &r, &id, &diag)) {
        fprintf(stderr, "shoal-bench-share: %s\n", diag.msg);
        return -1;
    }
    while (!atomic_load(&r.done))
        usleep(200);
    *cached = r.cached;
    return atomic_load(&r.first_ns) ? (double)(atomic_load(&r.first_ns) - t0) / 1e9 : -1;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *load = NULL, *devices = "0,0", *prefixes = "4096,16384";
    const char *worker = NULL;
    int kv_pages = 8192;
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},      {"load-format", required_argument, 0, 'l'},
        {"devices", required_argument, 0, 'd'},    {"prefix", required_argument, 0, 'p'},
        {"kv-pages", required_argument, 0, 'k'},   {"worker-path", required_argument, 0, 'w'},
        {0, 0, 0, 0},
    };
    int ch;
    while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (ch) {
        case 'm': model = optarg; break;
        case 'l': load = optarg; break;
        case 'd': devices = optarg; break;
        case 'p': prefixes = optarg; break;
        case 'k': kv_pages = atoi(optarg); break;
        case 'w': worker = optarg; break;
        default:
            fprintf(stderr, "usage: shoal-bench-share --model DIR [--load-format dummy] "
                            "[--devices 0,0] [--prefix 4096,16384] [--kv-pages N] "
                            "[--worker-path PATH]\n");
            return 2;
        }
    }
    if (!model || kv_pages < 1) {
        fprintf(stderr, "shoal-bench-share: --model is required (and --kv-pages > 0)\n");
        return 2;
    }
    common_log_init("shoal-bench-share", COMMON_LOG_WARN);
    char self[4096], wpath[4200], rt[64];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    self[n > 0 ? n : 0] = 0;
    char *slash = strrchr(self, '/');
    if (slash)
        *slash = 0;
    snprintf(wpath, sizeof wpath, "%s/../worker/shoal-worker", self);
    snprintf(rt, sizeof rt, "/tmp/shoal-bench-share-XXXXXX");
    if (!mkdtemp(rt))
        return 1;
    int max_prefix = 0;
    for (const char *p = prefixes; *p;) {
        int v = atoi(p);
        max_prefix = v > max_prefix ? v : max_prefix;
        p = strchr(p, ',') ? strchr(p, ',') + 1 : p + strlen(p);
    }
    coordinator_cluster_options o;
    coordinator_cluster_options_default(&o);
    o.model_dir = model;
    o.workers = devices;
    o.runtime_dir = rt;
    o.worker_path = worker ? worker : wpath;
    o.route = COORDINATOR_ROUTE_ROUND_ROBIN;
    o.load_format = load;
    o.kv_pages = kv_pages;
    o.parallel = 4;
    o.max_model_len = max_prefix + 2 * TAIL + 16;
    o.max_batch_tokens = 2048;
    o.start_timeout_ms = 600000;
    o.dead_after_ms = 60000;
    char name[32];
    snprintf(name, sizeof name, "bench-share-%d", (int)getpid());
    o.cluster = name;
    coordinator_cluster *c = NULL;
    shoal_diag diag = {{0}};
    if (coordinator_cluster_open(&o, &c, &diag)) {
        fprintf(stderr, "shoal-bench-share: %s\n", diag.msg);
        return 1;
    }
    printf("shoal-bench-share: %s, workers on devices %s\n", model, devices);
    int rc = 0;
    uint32_t vocab = (uint32_t)coordinator_cluster_vocab(c);
    {
        /* warm both workers (first forward passes, graph captures, library
         * set-up) with a salted 2k prompt each, so no figure pays them */
        int wn = 2048 + TAIL, cached;
        int32_t *w = malloc((size_t)wn * 4);
        for (int i = 0; i < wn; i++)
            w[i] = (int32_t)((uint32_t)i * 2654435761u % vocab);
        run(c, w, wn, true, &cached);
        run(c, w, wn, true, &cached);
        free(w);
    }
    for (const char *p = prefixes; *p && rc == 0;) {
        int P = atoi(p);
        p = strchr(p, ',') ? strchr(p, ',') + 1 : p + strlen(p);
        int32_t *a = malloc((size_t)(P + TAIL) * 4), *b = malloc((size_t)(P + TAIL) * 4);
        uint64_t x = (uint64_t)P * 7919u;
        for (int i = 0; i < P + TAIL; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            a[i] = b[i] = (int32_t)((x >> 33) % vocab);
        }
        for (int i = P; i < P + TAIL; i++)
            b[i] = (int32_t)(((uint32_t)a[i] + 1) % vocab);
        int cached_a, cached_b, cached_c, cached_w, cached_l;
        /* round robin: a -> 0, b -> 1 (imports a's prefix), warm-up -> 0,
         * c -> 1 (recomputes), then b again -> 0, where a's prefix is a
         * local hit: what reading the pages in place could at best give */
        double ta = run(c, a, P + TAIL, false, &cached_a);
        coordinator_cluster_stats s0, s1;
        coordinator_cluster_stats_get(c, &s0);
        double tb = run(c, b, P + TAIL, false, &cached_b);
        usleep(300000); /* the worker reports its counters after its step */
        coordinator_cluster_stats_get(c, &s1);
        double imp_s = (double)(s1.worker[1].import_ns - s0.worker[1].import_ns) / 1e9;
        uint64_t imp_tokens = s1.worker[1].import_tokens - s0.worker[1].import_tokens;
        double tw = run(c, b, P + TAIL, true, &cached_w);
        double tc = run(c, b, P + TAIL, true, &cached_c);
        double tl = run(c, b, P + TAIL, false, &cached_l);
        run(c, b, 16, true, &cached_w); /* to worker 1: the next length starts on worker 0 */
        (void)tw;
        if (ta < 0 || tb < 0 || tc < 0 || tl < 0) {
            fprintf(stderr, "shoal-bench-share: prefix %d: a stream failed\n", P);
            rc = 1;
        } else {
            printf("prefix %6d tokens: TTFT imported %.4f s (%d tokens cached), recomputed %.4f s "
                   "(%d cached): import %.1fx faster; local hit %.4f s (%d cached); first "
                   "compute on worker 0 %.4f s\n",
                   P, tb, cached_b, tc, cached_c, tc / tb, tl, cached_l, ta);
            if (imp_s > 0)
                printf("prefix %6d tokens: the import itself (lease, copy, publish) took %.2f ms "
                       "for %llu tokens: %.0fx faster than recomputing them\n",
                       P, imp_s * 1e3, (unsigned long long)imp_tokens, tc / imp_s);
        }
        free(a);
        free(b);
    }
    coordinator_cluster_stats st;
    coordinator_cluster_stats_get(c, &st);
    printf("worker 1: %llu tokens imported in all\n", (unsigned long long)st.worker[1].import_tokens);
    coordinator_cluster_close(c);
    rmdir(rt);
    return rc;
}
