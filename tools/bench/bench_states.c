/* shoal-bench-states: time to first token of a turn whose history is
 * restored from the state store (LMDB) against the same turn recomputed,
 * and the restore bandwidth beside the disk's read bandwidth measured in
 * the same run (issue #9).
 *
 *   shoal-bench-states --model DIR [--load-format dummy] [--device cpu|N]
 *       [--history 1024,4096,16384] [--tail 32] [--state-dir DIR]
 *       [--max-batch-tokens N] [--threads N] [--read-threads N]
 *       [--probe-mib N] [--keep]
 *
 * One model, in this process (no coordinator: the figures are the
 * engine's). For each history length H (whole pages):
 *   recompute  a fresh engine, no store: a prompt of H history tokens and
 *              a 32-token new message, one output token; TTFT is submit to
 *              the first token;
 *   learn      the history runs once with the store attached; its pages
 *              are written (worker_states_write_all, as at shutdown) and
 *              the store is closed and dropped from the page cache
 *              (posix_fadvise DONTNEED on data.mdb);
 *   restore    a fresh engine with the store: the same prompt, in each
 *              --restore-mode: read (every history block from the store)
 *              and overlap (the engine computes the head while the store
 *              reads the tail); each from disk (cold), then once more from
 *              the page cache (warm). The first token is compared with the
 *              recomputed one; --same-tokens makes a difference fatal (the
 *              CPU, or f32 activations on the GPU: bf16 prefill on the GPU
 *              is not invariant to how a prompt is cut into chunks, and a
 *              dummy model's top two logits are close).
 * Restore bandwidth (read mode) is the payload bytes over the restore's
 * time, start to the last block in place. The disk's read
 * bandwidth is measured in the same directory: a probe file written,
 * synced, dropped from the page cache and read back with O_DIRECT in 4 MiB
 * requests (buffered after DONTNEED where O_DIRECT is refused, e.g. on
 * tmpfs). The state directory is a new one under /var/tmp unless given,
 * and is removed at the end unless --keep. */
#include "common/common_args.h"
#include "common/common_log.h"
#include "common/common_rng.h"
#include "worker/worker_engine.h"
#include "worker/worker_states.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { HISTORIES_MAX = 16 };

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

typedef struct run_result {
    double ttft_s;
    int32_t first;
    int cached;
} run_result;

/* Runs the engine until it is idle; -1 on an error. */
static int drain(worker_engine *e, worker_event *ev, run_result *out, double t0)
{
    shoal_diag diag = {{0}};
    while (worker_engine_busy(e)) {
        int n;
        if (worker_engine_step(e, ev, &n, &diag)) {
            fprintf(stderr, "shoal-bench-states: %s\n", diag.msg);
            return -1;
        }
        for (int i = 0; out && i < n; i++)
            if (ev[i].token >= 0 && ev[i].index == 0) {
                out->ttft_s = now_s() - t0;
                out->first = ev[i].token;
                out->cached = ev[i].cached_tokens;
            }
    }
    return 0;
}

/* One stream of `len` tokens and one output token through a fresh engine
 * (with the store when st is not NULL), after a warm-up stream of 256
 * other tokens and 4 outputs: the engine has measured its speed, as a
 * serving engine has. */
static int run_turn(worker_model *m, const worker_engine_options *eo_in, worker_states *st,
                    const int32_t *prompt, int len, int max_tokens, run_result *out, bool write)
{
    worker_engine_options eo = *eo_in;
    if (st)
        eo.restore = worker_states_restore_source(st);
    worker_engine *e = NULL;
    shoal_diag diag = {{0}};
    int rc = -1;
    if (worker_engine_open(m, &eo, &e, &diag)) {
        fprintf(stderr, "shoal-bench-states: %s\n", diag.msg);
        return -1;
    }
    if (st)
        worker_states_attach(st, worker_engine_pages_mut(e), worker_engine_checkpoints(e));
    worker_request r = {
        .id = 1, .prompt = prompt, .prompt_len = len, .max_tokens = max_tokens, .ignore_eos = true};
    r.sampling.top_p = 1.0f;
    r.sampling.repetition_penalty = 1.0f;
    worker_event *ev = calloc((size_t)worker_engine_events_max(e), sizeof *ev);
    if (!ev)
        goto out;
    static uint64_t warm_seed = 7; /* a new warm-up prompt each time: never a cache hit */
    int32_t warm[256];
    int vocab = worker_model_config(m)->vocab;
    for (int i = 0; i < 256; i++)
        warm[i] = (int32_t)(common_rng_next(&warm_seed) % (uint64_t)vocab);
    worker_request w = r;
    w.id = 2;
    w.prompt = warm;
    w.prompt_len = 256;
    w.max_tokens = 4; /* and three small steps */
    if (worker_engine_submit(e, &w, &diag) || drain(e, ev, NULL, 0)) {
        fprintf(stderr, "shoal-bench-states: warm-up: %s\n", diag.msg);
        goto out;
    }
    out->ttft_s = -1;
    double t0 = now_s();
    if (worker_engine_submit(e, &r, &diag)) {
        fprintf(stderr, "shoal-bench-states: %s\n", diag.msg);
        goto out;
    }
    if (drain(e, ev, out, t0))
        goto out;
    if (write && worker_states_write_all(st, worker_engine_pages_mut(e), -1, NULL, &diag)) {
        fprintf(stderr, "shoal-bench-states: %s\n", diag.msg);
        goto out;
    }
    rc = out->ttft_s >= 0 ? 0 : -1;
out:
    free(ev);
    worker_engine_close(e);
    return rc;
}

/* Drops a file's pages from the page cache (it must not be mapped). */
static void drop_cache(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
}

/* Reads a whole file, so that its pages are in the page cache. */
static void fill_cache(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    static char buf[1 << 20];
    while (read(fd, buf, sizeof buf) > 0)
        ;
    close(fd);
}

/* Reads `mib` MiB of a probe file in dir from the disk: GB/s, and whether
 * O_DIRECT was used. */
static double disk_read_gbps(const char *dir, int mib, bool *direct)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/read-probe", dir);
    size_t chunk = 4u << 20;
    void *buf = NULL;
    if (posix_memalign(&buf, 4096, chunk))
        return -1;
    uint64_t seed = 7;
    for (size_t i = 0; i < chunk / 8; i++)
        ((uint64_t *)buf)[i] = common_rng_next(&seed);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    double gbps = -1;
    if (fd < 0)
        goto out;
    for (int i = 0; i < mib / 4; i++)
        if (write(fd, buf, chunk) != (ssize_t)chunk) {
            close(fd);
            goto out;
        }
    fsync(fd);
    close(fd);
    drop_cache(path);
    *direct = true;
    fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (fd < 0) {
        *direct = false;
        fd = open(path, O_RDONLY | O_CLOEXEC);
    }
    if (fd < 0)
        goto out;
    double t0 = now_s();
    size_t total = 0;
    ssize_t k;
    while ((k = read(fd, buf, chunk)) > 0)
        total += (size_t)k;
    double s = now_s() - t0;
    close(fd);
    gbps = (double)total / s / 1e9;
out:
    unlink(path);
    free(buf);
    return gbps;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: shoal-bench-states --model DIR [--load-format dummy] [--device cpu|N]\n"
               "  [--history 1024,4096,16384] [--tail 32] [--state-dir DIR]\n"
               "  [--max-batch-tokens N] [--threads N] [--read-threads N] [--probe-mib N] "
               "[--keep]\n  [--same-tokens]  fail when a restored turn's first token differs "
               "from the recomputed one\n");
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},
        {"load-format", required_argument, 0, 'l'},
        {"device", required_argument, 0, 'd'},
        {"history", required_argument, 0, 'H'},
        {"tail", required_argument, 0, 't'},
        {"state-dir", required_argument, 0, 's'},
        {"max-batch-tokens", required_argument, 0, 'b'},
        {"threads", required_argument, 0, 'T'},
        {"read-threads", required_argument, 0, 'r'},
        {"probe-mib", required_argument, 0, 'p'},
        {"keep", no_argument, 0, 'k'},
        {"same-tokens", no_argument, 0, 'S'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    worker_model_options mo;
    worker_model_options_default(&mo);
    const char *histories = "1024,4096,16384", *state_dir = NULL;
    int tail = 32, batch = 2048, read_threads = 0, probe_mib = 1024;
    bool keep = false, same_tokens = false;
    int ch;
    while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int bad = 0;
        switch (ch) {
        case 'm':
            mo.model_dir = optarg;
            break;
        case 'l':
            if (strcmp(optarg, "dummy") == 0)
                mo.load_format = WORKER_LOAD_DUMMY;
            else if (strcmp(optarg, "auto") != 0)
                bad = 1;
            break;
        case 'd':
            mo.device = optarg;
            break;
        case 'H':
            histories = optarg;
            break;
        case 't':
            bad = common_parse_int("shoal-bench-states", "--tail", optarg, 1, 4096, &tail);
            break;
        case 's':
            state_dir = optarg;
            break;
        case 'b':
            bad = common_parse_int("shoal-bench-states", "--max-batch-tokens", optarg, 16, 8192,
                                   &batch);
            break;
        case 'T':
            bad = common_parse_int("shoal-bench-states", "--threads", optarg, 0, 256, &mo.threads);
            break;
        case 'r':
            bad = common_parse_int("shoal-bench-states", "--read-threads", optarg, 0, 64,
                                   &read_threads);
            break;
        case 'p':
            bad = common_parse_int("shoal-bench-states", "--probe-mib", optarg, 4, 1 << 16,
                                   &probe_mib);
            break;
        case 'S':
            same_tokens = true;
            break;
        case 'k':
            keep = true;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
        if (bad) {
            if (ch == 'l')
                fprintf(stderr, "shoal-bench-states: --load-format '%s': expected auto or dummy\n",
                        optarg);
            return 2;
        }
    }
    if (!mo.model_dir || optind < argc) {
        usage(stderr);
        return 2;
    }
    common_log_init("shoal-bench-states", COMMON_LOG_WARN);
    int hist[HISTORIES_MAX], n_hist = 0, max_hist = 0;
    for (const char *p = histories; *p && n_hist < HISTORIES_MAX;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 16 || v > (1 << 20) || v % 16 || (*end && *end != ',')) {
            fprintf(stderr,
                    "shoal-bench-states: --history '%s': expected token counts, each a "
                    "multiple of 16 in [16, 1048576]\n",
                    histories);
            return 2;
        }
        hist[n_hist++] = (int)v;
        max_hist = v > max_hist ? (int)v : max_hist;
        p = *end ? end + 1 : end;
    }
    char made[64];
    if (state_dir && mkdir(state_dir, 0700) != 0 && errno != EEXIST) {
        fprintf(stderr, "shoal-bench-states: --state-dir %s: %s\n", state_dir, strerror(errno));
        return 1;
    }
    if (!state_dir) {
        snprintf(made, sizeof made, "/var/tmp/shoal-bench-states-XXXXXX");
        if (!mkdtemp(made)) {
            fprintf(stderr, "shoal-bench-states: cannot make a directory: %s\n", strerror(errno));
            return 1;
        }
        state_dir = made;
    }

    int max_len = max_hist + tail + 16;
    /* hybrids keep the turn's checkpoints only (interval 0): the recompute
     * then runs chunks of the whole batch, as fast as it can */
    worker_engine_options eo = {.max_batch_tokens = batch,
                                .parallel = 1,
                                .max_queued = 4,
                                .max_model_len = max_len,
                                .checkpoints = 2,
                                .checkpoint_interval = 0};
    mo.max_rows = batch;
    mo.kv_pages = max_len / 16 + 4 + 17; /* page_tokens 16; the warm-up keeps 17 */
    worker_engine_size_model(&eo, &mo);
    worker_model *m = NULL;
    int32_t *prompt = NULL;
    shoal_diag diag = {{0}};
    int rc = 1;
    double t_load = now_s();
    if (worker_model_open(&mo, &m, &diag)) {
        fprintf(stderr, "shoal-bench-states: %s\n", diag.msg);
        goto out;
    }
    const kernels_kv_layout *kv = worker_model_kv_layout(m);
    int vocab = worker_model_config(m)->vocab;
    size_t state_bytes = worker_model_slot_bytes(m); /* hybrids: the checkpoint a restore reads */
    printf("shoal-bench-states: %s (%s weights) on %s, loaded in %.1f s; KV pages of %d tokens, "
           "%zu bytes (%s); state dir %s\n",
           mo.model_dir, mo.load_format == WORKER_LOAD_DUMMY ? "dummy" : "real", mo.device,
           now_s() - t_load, kv->page_tokens, kv->page_bytes, shoal_dtype_name(kv->dtype),
           state_dir);
    if (state_bytes)
        printf("hybrid model: a restore reads the history's pages and a %.1f MiB state "
               "checkpoint, all before the turn goes on (read and overlap are one mode)\n",
               (double)state_bytes / 1048576.0);
    bool direct = false;
    double disk = disk_read_gbps(state_dir, probe_mib, &direct);
    printf("disk read bandwidth (%d MiB, %s, same directory): %.2f GB/s\n", probe_mib,
           direct ? "O_DIRECT" : "buffered after DONTNEED", disk);
    prompt = malloc((size_t)max_len * sizeof *prompt);
    if (!prompt)
        goto out;
    /* A warm-up, so the first figure pays no first-use costs. */
    {
        uint64_t seed = 1;
        for (int i = 0; i < 64; i++)
            prompt[i] = (int32_t)(common_rng_next(&seed) % (uint64_t)vocab);
        run_result w;
        if (run_turn(m, &eo, NULL, prompt, 64, 1, &w, false))
            goto out;
    }
    for (int h = 0; h < n_hist; h++) {
        int H = hist[h], len = H + tail;
        uint64_t seed = 1000 + (uint64_t)H;
        for (int i = 0; i < len; i++)
            prompt[i] = (int32_t)(common_rng_next(&seed) % (uint64_t)vocab);
        run_result rec, learn;
        if (run_turn(m, &eo, NULL, prompt, len, 1, &rec, false))
            goto out;
        /* learn: the history alone (it publishes H / 16 full blocks), written */
        char sub[4300];
        snprintf(sub, sizeof sub, "%s/h%d", state_dir, H);
        worker_states_options so = {
            .dir = sub, .spill_bytes = 64ull << 30, .read_threads = read_threads};
        worker_states *st = NULL;
        if (worker_states_open(&so, m, &st, &diag)) {
            fprintf(stderr, "shoal-bench-states: %s\n", diag.msg);
            goto out;
        }
        int learn_rc = run_turn(m, &eo, st, prompt, H + 1, 1, &learn, true);
        worker_states_close(st);
        st = NULL;
        if (learn_rc)
            goto out;
        char data[4400];
        snprintf(data, sizeof data, "%s/data.mdb", sub);
        /* read: every block from the store; overlap: the head computed
         * while the tail is read. Each cold (page cache dropped), then warm
         * (the whole file read into the page cache first: a cold overlap
         * run leaves the blocks it computed on disk). */
        run_result res[2][2];
        double bw[2][2] = {{0, 0}, {0, 0}};
        uint64_t direct_reads = 0; /* the cold read pass's reads with O_DIRECT */
        bool same = true;
        for (int mode = 0; mode < 2; mode++) {
            so.read_all = mode == 0;
            drop_cache(data);
            for (int pass = 0; pass < 2; pass++) {
                if (pass == 1)
                    fill_cache(data);
                if (worker_states_open(&so, m, &st, &diag)) {
                    fprintf(stderr, "shoal-bench-states: %s\n", diag.msg);
                    goto out;
                }
                run_result *r = &res[mode][pass];
                int e = run_turn(m, &eo, st, prompt, len, 1, r, false);
                worker_states_stats ws;
                worker_states_stats_get(st, &ws);
                store_state_stats ss;
                if (mode == 0 && pass == 0 &&
                    store_state_stats_get(worker_states_store(st), &ss, NULL) == SHOAL_OK)
                    direct_reads = ss.direct_reads;
                worker_states_close(st);
                if (e)
                    goto out;
                bw[mode][pass] =
                    ws.restore_ns ? (double)ws.restore_bytes / (double)ws.restore_ns : 0;
                same &= r->first == rec.first;
                if (mode == 0 && r->cached != H) {
                    fprintf(stderr,
                            "shoal-bench-states: history %d: %d tokens restored, expected %d\n",
                            H, r->cached, H);
                    goto out;
                }
            }
        }
        printf("history %6d: TTFT recompute %.4f s; read %.4f s cold (%.2fx), %.4f s warm "
               "(%.2fx), %.2f / %.2f GB/s, %llu read with O_DIRECT; overlap %.4f s cold "
               "(%.2fx, %d of %d blocks read), %.4f s warm (%.2fx, %d read); disk %.2f GB/s, %d MiB stored; first token %s\n",
               H, rec.ttft_s, res[0][0].ttft_s, rec.ttft_s / res[0][0].ttft_s, res[0][1].ttft_s,
               rec.ttft_s / res[0][1].ttft_s, bw[0][0], bw[0][1], (unsigned long long)direct_reads,
               res[1][0].ttft_s,
               rec.ttft_s / res[1][0].ttft_s, res[1][0].cached / 16, H / 16, res[1][1].ttft_s,
               rec.ttft_s / res[1][1].ttft_s, res[1][1].cached / 16, disk,
               (int)(((size_t)(H / 16) * kv->page_bytes + state_bytes) >> 20),
               same ? "equal" : "differs");
        fflush(stdout);
        if (!same && same_tokens)
            goto out;
        if (!keep)
            nftw(sub, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    }
    rc = 0;
out:
    free(prompt);
    worker_model_close(m);
    if (!keep && state_dir == made)
        nftw(made, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return rc;
}
