/* shoal-worker: owns one device and runs the model on it.
 *
 * Two offline modes today:
 *   one prompt (--prompt-ids or --prompt-random): prints the greedy tokens
 *     with their log-probabilities (one line each: index, token id,
 *     logprob), then prefill and decode speed on stderr;
 *   --bench-streams N: N streams of --prompt-random tokens through the
 *     engine (continuous batching, --parallel at once) and its throughput.
 * and the serving mode, started by the coordinator (or systemd):
 *   --serve --connect SOCKET --worker-index N: the engine loop, driven over
 *     the coordinator's socket (worker_serve.h). */
#include "common/common_args.h"
#include "common/common_limits.h"
#include "common/common_log.h"
#include "common/common_rng.h"
#include "worker/worker_bench.h"
#include "worker/worker_generate.h"
#include "worker/worker_cluster.h"
#include "worker/worker_serve.h"
#include "worker/worker_warmup.h"

#include <signal.h>

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: shoal-worker --model DIR (--prompt-ids 1,2,3 | --prompt-random N) [options]\n"
            "  --model DIR            Hugging Face model directory (config.json, safetensors)\n"
            "  --load-format FMT      auto (read the weights) or dummy (random weights at the\n"
            "                         shapes of config.json; for benchmarks)\n"
            "  --device DEV           cpu (default) or a GPU index\n"
            "  --threads N            CPU backend threads (default: one per processor)\n"
            "  --prompt-ids LIST      the prompt, comma-separated token ids\n"
            "  --prompt-random N      a prompt of N random token ids (seeded, for benchmarks)\n"
            "  --max-tokens N         tokens to generate (default 16)\n"
            "  --ignore-eos           keep generating past an EOS token\n"
            "  --page-tokens N        tokens per KV page (default 16)\n"
            "  --max-batch-tokens N   rows of one forward pass; prompts longer go in chunks\n"
            "                         (default 2048)\n"
            "  --bench-streams N      engine benchmark: N streams of --prompt-random tokens\n"
            "                         and --max-tokens output each\n"
            "  --parallel N           engine: streams running at once (default 64)\n"
            "  --kv-pages N           engine: KV pages (default: enough for --parallel\n"
            "                         streams of the benchmark's length; serving: a share of\n"
            "                         the memory free once the weights are in, at most what\n"
            "                         --parallel streams of --max-model-len need)\n"
            "  --kv-memory-fraction F serving: that share (default 0.9 on a GPU, 0.25 on the\n"
            "                         CPU, whose arena is host memory)\n"
            "  --kv-dtype D           KV pages: bf16 (default), fp8 (e4m3, scales 1.0)\n"
            "                         or f32 (CPU backend only)\n"
            "  --state-checkpoints N  hybrid models: recurrent-state checkpoints kept for\n"
            "                         prefix hits (default: twice --parallel)\n"
            "  --checkpoint-interval N hybrid models: a prompt keeps its state every N\n"
            "                         tokens (a multiple of --page-tokens; default 512; 0:\n"
            "                         only at its last full page and each turn's end)\n"
            "  --max-model-len N      serving: context of one stream (default: the model's,\n"
            "                         at most 32768)\n"
            "  --serve                serve a coordinator (with --connect and --worker-index)\n"
            "  --connect SOCKET       the coordinator's socket file for this worker\n"
            "  --worker-index N       this worker's index in the cluster\n"
            "  --cluster NAME         join the shared segment /shoal.NAME (made by the\n"
            "                         coordinator): page state there, prefixes shared\n"
            "                         with the other workers\n"
            "  --heartbeat-ms N       report at least this often while idle (default 200)\n"
            "  --step-timeout-s N     report while one step runs for up to N s (default 300;\n"
            "                         0: always); past it, fall silent to be restarted\n"
            "  --learn-conversations  serving: keep conversations' KV pages, spill them to\n"
            "                         the state store when evicted and restore them on the\n"
            "                         next turn; SIGTERM then writes the rest before exiting\n"
            "                         (hybrid models: with each turn's state checkpoint)\n"
            "  --state-dir DIR        the store (an LMDB directory, made 0700; shared by the\n"
            "                         cluster's workers)\n"
            "  --spill-gib N          the store's size limit in GiB (default 16; fractions\n"
            "                         allowed); least recently used states go first\n"
            "  --restore-mode M       overlap (default on a GPU): a turn computes the head\n"
            "                         of its history while the store reads the tail, the\n"
            "                         two meeting; read (default on the CPU): it reads\n"
            "                         every stored block (hybrid models always read)\n"
            "  --warmup M             serving: auto (default: on a GPU, not on the CPU), on\n"
            "                         or off: before serving, prompt passes and a decode\n"
            "                         round of every batch size, so that the first requests\n"
            "                         do not pay for loading kernels and recording graphs\n"
            "  --fake-tokens          serving benchmark: no model, one token per stream per\n"
            "                         step, to measure the coordinator alone\n"
            "  --fake-step-us N       with --fake-tokens: a step at most every N us (default 0:\n"
            "                         as fast as the coordinator takes them)\n");
}

static int parse_int(const char *flag, const char *s, long lo, long hi, int *out)
{
    return common_parse_int("shoal-worker", flag, s, lo, hi, out);
}

/* Parses "1,2,3" into a new array. */
static int parse_ids(const char *s, int32_t **out, int *count)
{
    int cap = 1;
    for (const char *p = s; *p; p++)
        cap += *p == ',';
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    if (!ids)
        return -1;
    int n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v > INT32_MAX || (*end != ',' && *end != '\0')) {
            fprintf(stderr, "shoal-worker: --prompt-ids: '%s' is not a list of token ids\n", s);
            free(ids);
            return -1;
        }
        ids[n++] = (int32_t)v;
        p = *end == ',' ? end + 1 : end;
    }
    if (n == 0) {
        fprintf(stderr, "shoal-worker: --prompt-ids: empty list\n");
        free(ids);
        return -1;
    }
    *out = ids;
    *count = n;
    return 0;
}

static bool print_token(void *ctx, int index, int token, float logprob)
{
    printf("%d\t%d\t%.6f\n", index, token, logprob);
    fflush(stdout);
    return true;
}

static int state_checkpoints = -1; /* -1: twice --parallel */
static int checkpoint_interval = WORKER_CHECKPOINT_INTERVAL;

static int state_checkpoints_for(int parallel)
{
    return state_checkpoints >= 0 ? state_checkpoints : 2 * parallel;
}

static int run_bench(worker_model_options *mo, int streams, int prompt_tokens, int output_tokens,
                     int parallel, int kv_pages)
{
    shoal_diag diag = {{0}};
    if (parallel > streams)
        parallel = streams;
    int per_stream = (prompt_tokens + output_tokens + mo->page_tokens - 1) / mo->page_tokens;
    worker_engine_options eo = {.max_batch_tokens = mo->max_rows,
                                .parallel = parallel,
                                .max_queued = streams,
                                .max_model_len = per_stream * mo->page_tokens,
                                .checkpoints = state_checkpoints_for(parallel),
                                .checkpoint_interval = checkpoint_interval};
    mo->kv_pages = kv_pages ? kv_pages : parallel * per_stream;
    worker_engine_size_model(&eo, mo);
    LOG_INFO("loading %s (%s weights) on %s: %d KV pages", mo->model_dir,
             mo->load_format == WORKER_LOAD_DUMMY ? "dummy" : "real", mo->device, mo->kv_pages);
    worker_model *m = NULL;
    worker_engine *e = NULL;
    int rc = 1;
    if (worker_model_open(mo, &m, &diag) || worker_engine_open(m, &eo, &e, &diag)) {
        fprintf(stderr, "shoal-worker: %s\n", diag.msg);
        goto out;
    }
    worker_bench_options bo = {streams, prompt_tokens, output_tokens, 42};
    worker_bench_result r;
    if (worker_bench_run(e, worker_model_config(m)->vocab, &bo, &r, &diag)) {
        fprintf(stderr, "shoal-worker: %s\n", diag.msg);
        goto out;
    }
    printf("engine: %d streams of %d prompt + %d output tokens, parallel %d, batch %d rows\n",
           streams, prompt_tokens, output_tokens, parallel, mo->max_rows);
    printf("  %.2f s, %llu steps, %llu preemptions\n", r.seconds, (unsigned long long)r.steps,
           (unsigned long long)r.preemptions);
    printf("  output %.1f tokens/s, total (prompt + output) %.1f tokens/s, mean time to first "
           "token %.3f s\n",
           (double)r.output_tokens / r.seconds,
           (double)(r.output_tokens + r.prompt_tokens) / r.seconds, r.first_token_s_mean);
    if (r.decode_s > 0)
        printf("  decode phase (every stream past its first token): %llu tokens in %.2f s, "
               "%.1f tokens/s\n",
               (unsigned long long)r.decode_tokens, r.decode_s,
               (double)r.decode_tokens / r.decode_s);
    rc = 0;
out:
    worker_engine_close(e);
    worker_model_close(m);
    return rc;
}

/* --learn-conversations: the store's options, set by main. */
static struct {
    bool on;
    worker_states_options o;
} learn;

/* --warmup, set by main. */
static worker_warmup_mode warmup_mode = WORKER_WARMUP_AUTO;
static int step_timeout_s = SHOAL_STEP_TIMEOUT_S;

static void on_sigterm(int sig)
{
    (void)sig;
    worker_serve_stop();
}

static int run_serve(worker_model_options *mo, const char *connect, const char *cluster, int index,
                     int heartbeat_ms, bool fake, int fake_step_us, int parallel, int kv_pages,
                     int max_model_len)
{
    shoal_diag diag = {{0}};
    worker_serve_options so = {.socket_path = connect,
                               .worker_index = index,
                               .heartbeat_ms = heartbeat_ms,
                               .step_timeout_s = step_timeout_s,
                               .device = mo->device,
                               .fake_tokens = fake,
                               .fake_vocab = 1000,
                               .fake_max_model_len = max_model_len ? max_model_len : 32768,
                               .fake_parallel = parallel,
                               .fake_step_us = fake_step_us};
    signal(SIGPIPE, SIG_IGN);
    if (fake) {
        shoal_err err = worker_serve_run(&so, NULL, NULL, &diag);
        if (err)
            fprintf(stderr, "shoal-worker: %s\n", diag.msg);
        return err ? 1 : 0;
    }
    model_config cfg;
    if (model_config_load(mo->model_dir, &cfg, &diag)) {
        fprintf(stderr, "shoal-worker: %s\n", diag.msg);
        return 1;
    }
    if (!max_model_len)
        max_model_len = cfg.max_positions < 32768 ? cfg.max_positions : 32768;
    worker_engine_options eo = {.max_batch_tokens = mo->max_rows,
                                .parallel = parallel,
                                .max_queued = 4096,
                                .max_model_len = max_model_len,
                                .checkpoints = state_checkpoints_for(parallel),
                                .checkpoint_interval = checkpoint_interval};
    mo->kv_pages = kv_pages; /* 0: sized from free memory once the weights are in */
    worker_engine_size_model(&eo, mo);
    LOG_INFO("worker %d: loading %s on %s, pages of %d tokens, parallel %d", index, mo->model_dir,
             mo->device, mo->page_tokens, parallel);
    worker_model *m = NULL;
    worker_engine *e = NULL;
    worker_cluster *cl = NULL;
    worker_states *states = NULL;
    int rc = 1;
    /* an arena sized from free memory fits the segment's rows: a small
     * model on a large machine would otherwise ask for more pages than the
     * coordinator made rows for, and the worker would refuse to start */
    if ((cluster && !kv_pages && worker_cluster_segment_pages(cluster, &mo->kv_pages_max, &diag)) ||
        worker_model_open(mo, &m, &diag) ||
        (cluster && worker_cluster_join(cluster, index, mo->device, m, &cl, &diag))) {
        fprintf(stderr, "shoal-worker: %s\n", diag.msg);
        goto out;
    }
    /* a stream never holds more pages than the pool has: the context
     * (and with it the default max_tokens a client gets) is cut to the
     * pool, where it used to be refused at its first request */
    const int pool_tokens = worker_model_kv_pages(m) * mo->page_tokens;
    if (max_model_len > pool_tokens) {
        LOG_WARN("worker %d: %d KV pages hold %d tokens, less than the context of %d: a "
                 "stream's context is cut to %d tokens (give more --kv-pages, or a "
                 "--max-model-len of at most %d)",
                 index, worker_model_kv_pages(m), pool_tokens, max_model_len, pool_tokens,
                 pool_tokens);
        max_model_len = eo.max_model_len = pool_tokens;
    }
    so.max_model_len = max_model_len;
    if (cl) {
        eo.segment = worker_cluster_segment(cl);
        eo.worker_index = index;
        eo.import = worker_cluster_import_source(cl);
        so.cluster = cl;
    }
    if (learn.on) { /* opened here, in the worker process, never across a fork */
        shoal_err serr = worker_states_open(&learn.o, m, &states, &diag);
        if (serr == SHOAL_ERR_FORMAT) {
            /* a store damaged or of another format: serving goes on without
             * learned states (refusing to start would take the worker out,
             * and restarts would meet the same store) */
            LOG_ERROR("worker %d: learned states are off: %s", index, diag.msg);
            learn.on = false;
            states = NULL;
        } else if (serr) {
            fprintf(stderr, "shoal-worker: %s\n", diag.msg);
            goto out;
        }
    }
    if (learn.on) {
        eo.restore = worker_states_restore_source(states);
        so.states = states;
        /* SIGTERM ends serving at the next step; the learned pages are
         * written below before the process exits. */
        struct sigaction sa = {.sa_handler = on_sigterm, .sa_flags = SA_RESTART};
        sigemptyset(&sa.sa_mask);
        sigaction(SIGTERM, &sa, NULL);
    }
    /* Before the engine holds a page (its KV goes into pages nobody
     * holds) and before the hello (the coordinator sends nothing until
     * it is done). */
    char who[32];
    snprintf(who, sizeof who, "worker %d", index);
    worker_warmup_stats ws;
    if (worker_warmup_run(m, warmup_mode, who, &ws, &diag)) {
        fprintf(stderr, "shoal-worker: %s (--warmup off skips the warm-up)\n", diag.msg);
        goto out;
    }
    if (worker_engine_open(m, &eo, &e, &diag)) {
        fprintf(stderr, "shoal-worker: %s\n", diag.msg);
        goto out;
    }
    if (states)
        worker_states_attach(states, worker_engine_pages_mut(e), worker_engine_checkpoints(e));
    LOG_INFO("worker %d: %d KV pages (%s), context %d tokens", index, worker_model_kv_pages(m),
             shoal_dtype_name(worker_model_kv_layout(m)->dtype), max_model_len);
    if (worker_serve_run(&so, m, e, &diag)) {
        fprintf(stderr, "shoal-worker: %s\n", diag.msg);
        goto out;
    }
    /* A clean stop (not a broken engine): keep what was learned. */
    if (states && worker_states_write_all(states, worker_engine_pages_mut(e),
                                          SHOAL_STATES_SHUTDOWN_WRITE_MS, NULL, &diag))
        LOG_WARN("%s", diag.msg);
    rc = 0;
out:
    worker_engine_close(e);
    worker_states_close(states);
    worker_cluster_leave(cl);
    worker_model_close(m);
    return rc;
}

int main(int argc, char **argv)
{
    enum {
        OPT_MODEL = 1,
        OPT_LOAD,
        OPT_DEVICE,
        OPT_THREADS,
        OPT_IDS,
        OPT_RANDOM,
        OPT_MAX,
        OPT_EOS,
        OPT_PAGE,
        OPT_BATCH,
        OPT_BENCH,
        OPT_PARALLEL,
        OPT_PAGES,
        OPT_LEN,
        OPT_SERVE,
        OPT_CONNECT,
        OPT_INDEX,
        OPT_HEARTBEAT,
        OPT_FAKE,
        OPT_FAKE_STEP,
        OPT_KVDTYPE,
        OPT_KVFRAC,
        OPT_CLUSTER,
        OPT_LEARN,
        OPT_STATE_DIR,
        OPT_SPILL,
        OPT_RESTORE,
        OPT_WARMUP,
        OPT_STEP_TIMEOUT,
        OPT_CHECKPOINTS,
        OPT_CHECKPOINT_INTERVAL,
        OPT_HELP
    };
    static const struct option opts[] = {
        {"model", required_argument, 0, OPT_MODEL},
        {"load-format", required_argument, 0, OPT_LOAD},
        {"device", required_argument, 0, OPT_DEVICE},
        {"threads", required_argument, 0, OPT_THREADS},
        {"prompt-ids", required_argument, 0, OPT_IDS},
        {"prompt-random", required_argument, 0, OPT_RANDOM},
        {"max-tokens", required_argument, 0, OPT_MAX},
        {"ignore-eos", no_argument, 0, OPT_EOS},
        {"page-tokens", required_argument, 0, OPT_PAGE},
        {"max-batch-tokens", required_argument, 0, OPT_BATCH},
        {"bench-streams", required_argument, 0, OPT_BENCH},
        {"parallel", required_argument, 0, OPT_PARALLEL},
        {"kv-pages", required_argument, 0, OPT_PAGES},
        {"max-model-len", required_argument, 0, OPT_LEN},
        {"serve", no_argument, 0, OPT_SERVE},
        {"connect", required_argument, 0, OPT_CONNECT},
        {"worker-index", required_argument, 0, OPT_INDEX},
        {"heartbeat-ms", required_argument, 0, OPT_HEARTBEAT},
        {"step-timeout-s", required_argument, 0, OPT_STEP_TIMEOUT},
        {"fake-tokens", no_argument, 0, OPT_FAKE},
        {"fake-step-us", required_argument, 0, OPT_FAKE_STEP},
        {"kv-dtype", required_argument, 0, OPT_KVDTYPE},
        {"kv-memory-fraction", required_argument, 0, OPT_KVFRAC},
        {"cluster", required_argument, 0, OPT_CLUSTER},
        {"learn-conversations", no_argument, 0, OPT_LEARN},
        {"state-dir", required_argument, 0, OPT_STATE_DIR},
        {"spill-gib", required_argument, 0, OPT_SPILL},
        {"restore-mode", required_argument, 0, OPT_RESTORE},
        {"warmup", required_argument, 0, OPT_WARMUP},
        {"state-checkpoints", required_argument, 0, OPT_CHECKPOINTS},
        {"checkpoint-interval", required_argument, 0, OPT_CHECKPOINT_INTERVAL},
        {"help", no_argument, 0, OPT_HELP},
        {0, 0, 0, 0},
    };
    common_log_init("shoal-worker", COMMON_LOG_INFO);
    worker_model_options mo;
    worker_model_options_default(&mo);
    const char *ids_text = NULL;
    int random_len = 0, max_tokens = 16, bench_streams = 0, parallel = 64, kv_pages = 0;
    int max_model_len = 0, worker_index = 0, heartbeat_ms = 200, fake_step_us = 0;
    bool serve = false, fake = false, batch_given = false, restore_given = false;
    const char *connect = NULL, *cluster = NULL;
    bool ignore_eos = false;
    /* flags that take an integer: one table, one parse */
    const struct {
        int id;
        const char *flag;
        long lo, hi;
        int *dst;
    } ints[] = {
        {OPT_THREADS, "--threads", 0, 256, &mo.threads},
        {OPT_RANDOM, "--prompt-random", 1, 1 << 20, &random_len},
        {OPT_MAX, "--max-tokens", 0, 1 << 20, &max_tokens},
        {OPT_PAGE, "--page-tokens", 1, 256, &mo.page_tokens},
        {OPT_BATCH, "--max-batch-tokens", 1, 8192, &mo.max_rows},
        {OPT_BENCH, "--bench-streams", 1, 65536, &bench_streams},
        {OPT_PARALLEL, "--parallel", 1, 512, &parallel},
        {OPT_PAGES, "--kv-pages", 1, 1 << 24, &kv_pages},
        {OPT_LEN, "--max-model-len", 2, 1 << 20, &max_model_len},
        {OPT_INDEX, "--worker-index", 0, 1023, &worker_index},
        {OPT_HEARTBEAT, "--heartbeat-ms", 10, 60000, &heartbeat_ms},
        {OPT_STEP_TIMEOUT, "--step-timeout-s", 0, 86400, &step_timeout_s},
        {OPT_FAKE_STEP, "--fake-step-us", 0, 60000000, &fake_step_us},
        {OPT_CHECKPOINTS, "--state-checkpoints", 0, SHOAL_STATE_SLOTS_MAX, &state_checkpoints},
        {OPT_CHECKPOINT_INTERVAL, "--checkpoint-interval", 0, SHOAL_CONTEXT_TOKENS_MAX,
         &checkpoint_interval},
    };
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        size_t k = 0;
        while (k < sizeof ints / sizeof ints[0] && ints[k].id != c)
            k++;
        if (k < sizeof ints / sizeof ints[0]) {
            if (parse_int(ints[k].flag, optarg, ints[k].lo, ints[k].hi, ints[k].dst))
                return 2;
            batch_given |= c == OPT_BATCH;
            continue;
        }
        switch (c) {
        case OPT_MODEL:
            mo.model_dir = optarg;
            break;
        case OPT_LOAD:
            if (strcmp(optarg, "dummy") == 0) {
                mo.load_format = WORKER_LOAD_DUMMY;
            } else if (strcmp(optarg, "auto") != 0) {
                fprintf(stderr, "shoal-worker: --load-format '%s': expected auto or dummy\n",
                        optarg);
                return 2;
            }
            break;
        case OPT_DEVICE:
            mo.device = optarg;
            break;
        case OPT_IDS:
            ids_text = optarg;
            break;
        case OPT_EOS:
            ignore_eos = true;
            break;
        case OPT_SERVE:
            serve = true;
            break;
        case OPT_CONNECT:
            connect = optarg;
            break;
        case OPT_CLUSTER:
            cluster = optarg;
            break;
        case OPT_LEARN:
            learn.on = true;
            break;
        case OPT_STATE_DIR:
            learn.o.dir = optarg;
            break;
        case OPT_SPILL: {
            unsigned long long bytes;
            if (common_parse_gib("shoal-worker", "--spill-gib", optarg,
                                 (double)(SHOAL_STORE_SPILL_BYTES_MAX >> 30), &bytes))
                return 2;
            learn.o.spill_bytes = bytes;
            break;
        }
        case OPT_RESTORE:
            if (strcmp(optarg, "overlap") != 0 && strcmp(optarg, "read") != 0) {
                fprintf(stderr, "shoal-worker: --restore-mode '%s': expected overlap or read\n",
                        optarg);
                return 2;
            }
            learn.o.read_all = strcmp(optarg, "read") == 0;
            restore_given = true;
            break;
        case OPT_WARMUP:
            if (!worker_warmup_mode_parse(optarg, &warmup_mode)) {
                fprintf(stderr, "shoal-worker: --warmup '%s': expected auto, on or off\n", optarg);
                return 2;
            }
            break;
        case OPT_FAKE:
            fake = true;
            break;
        case OPT_KVDTYPE:
            if (strcmp(optarg, "bf16") == 0) {
                mo.kv_dtype = SHOAL_DTYPE_BF16;
            } else if (strcmp(optarg, "fp8") == 0) {
                mo.kv_dtype = SHOAL_DTYPE_F8_E4M3;
            } else if (strcmp(optarg, "f32") == 0) {
                mo.kv_dtype = SHOAL_DTYPE_F32;
            } else {
                fprintf(stderr, "shoal-worker: --kv-dtype '%s': expected bf16, fp8 or f32\n",
                        optarg);
                return 2;
            }
            break;
        case OPT_KVFRAC: {
            char *end;
            mo.kv_memory_fraction = strtod(optarg, &end);
            if (*end != '\0' || !(mo.kv_memory_fraction > 0.0 && mo.kv_memory_fraction <= 1.0)) {
                fprintf(stderr,
                        "shoal-worker: --kv-memory-fraction '%s': expected a number in "
                        "(0, 1]\n",
                        optarg);
                return 2;
            }
            break;
        }
        case OPT_HELP:
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (!learn.on && (learn.o.dir || learn.o.spill_bytes || restore_given)) {
        fprintf(stderr, "shoal-worker: %s needs --learn-conversations\n",
                learn.o.dir           ? "--state-dir"
                : learn.o.spill_bytes ? "--spill-gib"
                                      : "--restore-mode");
        return 2;
    }
    if (learn.on && (!serve || fake || !learn.o.dir)) {
        fprintf(stderr, "shoal-worker: --learn-conversations %s\n",
                !learn.o.dir ? "needs --state-dir DIR (where the states are kept)"
                             : "works only when serving a model (--serve, not --fake-tokens)");
        return 2;
    }
    if (learn.on && !learn.o.spill_bytes)
        learn.o.spill_bytes = 16ull << 30;
    /* On the CPU backend the engine and the readers share the cores, and
     * computing is slow beside reading: overlap only on a GPU. */
    if (learn.on && !restore_given)
        learn.o.read_all = strcmp(mo.device, "cpu") == 0;
    if (serve) {
        if (!connect || (!mo.model_dir && !fake) || optind < argc) {
            fprintf(stderr, "shoal-worker: --serve needs %s\n",
                    !connect        ? "--connect ADDR"
                    : optind < argc ? "no arguments past the options"
                                    : "--model DIR");
            usage(stderr);
            return 2;
        }
        if (!batch_given)
            mo.max_rows = 512;
        return run_serve(&mo, connect, fake ? NULL : cluster, worker_index, heartbeat_ms, fake,
                         fake_step_us, parallel, kv_pages, max_model_len);
    }
    if (!mo.model_dir || (!ids_text && !random_len) || (ids_text && random_len) || optind < argc ||
        (bench_streams && !random_len)) {
        fprintf(stderr, "shoal-worker: %s\n",
                !mo.model_dir              ? "--model DIR is missing"
                : !ids_text && !random_len ? "give the prompt: --prompt-ids or --prompt-random"
                : ids_text && random_len   ? "--prompt-ids and --prompt-random exclude each other"
                : optind < argc            ? "unexpected arguments past the options"
                                           : "--bench-streams needs --prompt-random N");
        usage(stderr);
        return 2;
    }
    if (bench_streams)
        return run_bench(&mo, bench_streams, random_len, max_tokens, parallel, kv_pages);
    int32_t *prompt = NULL;
    int prompt_len = 0;
    if (ids_text && parse_ids(ids_text, &prompt, &prompt_len))
        return 2;
    shoal_diag diag = {{0}};
    model_config cfg;
    if (model_config_load(mo.model_dir, &cfg, &diag)) {
        fprintf(stderr, "shoal-worker: %s\n", diag.msg);
        free(prompt);
        return 1;
    }
    if (random_len) {
        prompt = malloc((size_t)random_len * sizeof *prompt);
        if (!prompt)
            return 1;
        uint64_t seed = 42;
        for (int i = 0; i < random_len; i++)
            prompt[i] = (int32_t)(common_rng_next(&seed) % (uint64_t)cfg.vocab);
        prompt_len = random_len;
    }
    /* Enough pages for this one stream, and logits for one row. */
    int64_t tokens = (int64_t)prompt_len + max_tokens;
    mo.kv_pages = (int)((tokens + mo.page_tokens - 1) / mo.page_tokens);
    mo.max_pages_per_stream = mo.kv_pages;
    mo.max_streams = 1;
    mo.max_logit_rows = 1;
    if (mo.max_rows > prompt_len)
        mo.max_rows = prompt_len;
    LOG_INFO("loading %s (%s weights) on %s", mo.model_dir,
             mo.load_format == WORKER_LOAD_DUMMY ? "dummy" : "real", mo.device);
    worker_model *m = NULL;
    if (worker_model_open(&mo, &m, &diag)) {
        fprintf(stderr, "shoal-worker: %s\n", diag.msg);
        free(prompt);
        return 1;
    }
    worker_generate_stats st;
    shoal_err err = worker_generate_greedy(m, prompt, prompt_len, max_tokens, !ignore_eos,
                                           print_token, NULL, &st, &diag);
    if (err) {
        fprintf(stderr, "shoal-worker: %s\n", diag.msg);
    } else {
        LOG_INFO("prefill: %d tokens in %.3f s (%.1f tokens/s)", st.prompt_tokens, st.prefill_s,
                 st.prompt_tokens / (st.prefill_s > 0 ? st.prefill_s : 1e-9));
        if (st.generated_tokens > 1)
            LOG_INFO("decode: %d tokens in %.3f s (%.2f tokens/s)", st.generated_tokens - 1,
                     st.decode_s,
                     (st.generated_tokens - 1) / (st.decode_s > 0 ? st.decode_s : 1e-9));
    }
    worker_model_close(m);
    free(prompt);
    return err ? 1 : 0;
}
