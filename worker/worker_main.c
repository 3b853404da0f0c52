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
#include "common/common_worker_flags.h"
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

/* Where --help's text starts on each line. */
enum { USAGE_COLUMN = 26 };

static void usage(FILE *f)
{
    fprintf(f,
            "usage: shoal-worker --model DIR (--prompt-ids 1,2,3 | --prompt-random N) [options]\n"
            "  --model DIR             Hugging Face model directory (config.json, safetensors)\n"
            "  --device DEV            cpu (default) or a GPU index\n"
            "  --prompt-ids LIST       the prompt, comma-separated token ids\n"
            "  --prompt-random N       a prompt of N random token ids (seeded, for benchmarks)\n"
            "  --max-tokens N          tokens to generate (default 16)\n"
            "  --ignore-eos            keep generating past an EOS token\n"
            "  --bench-streams N       engine benchmark: N streams of --prompt-random tokens\n"
            "                          and --max-tokens output each\n"
            "  --kv-memory-fraction F  serving: the share of free memory for KV pages\n"
            "                          (default 0.9 on a GPU, 0.25 on the CPU, whose arena\n"
            "                          is host memory)\n"
            "  --serve                 serve a coordinator (with --connect and --worker-index)\n"
            "  --connect SOCKET        the coordinator's socket file for this worker\n"
            "  --worker-index N        this worker's index in the cluster\n"
            "  --cluster NAME          join the shared segment /shoal.NAME (made by the\n"
            "                          coordinator): page state there, prefixes shared\n"
            "                          with the other workers\n"
            "  --fake-tokens           serving benchmark: no model, one token per stream per\n"
            "                          step, to measure the coordinator alone\n"
            "  --fake-step-us N        with --fake-tokens: a step at most every N us\n"
            "                          (default 0: as fast as the coordinator takes them)\n"
            "Also taken by shoal-coordinator, which passes them on to its workers:\n");
    common_worker_flags_usage(f, USAGE_COLUMN);
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

/* What the command line asks for, with the defaults of what it leaves
 * out. Its strings are argv's. */
typedef struct worker_options {
    worker_model_options model; /* --model, --device, --load-format, --threads, ... */
    const char *ids_text;       /* --prompt-ids as given; NULL: none */
    int random_len;             /* --prompt-random; 0: none */
    int max_tokens;
    bool ignore_eos;
    int bench_streams; /* 0: no benchmark */
    bool serve, fake;  /* --serve, --fake-tokens */
    const char *connect, *cluster;
    int worker_index, fake_step_us;
    int parallel, kv_pages, max_model_len; /* kv_pages, max_model_len 0: sized at start */
    int state_checkpoints;                 /* -1: twice --parallel */
    int checkpoint_interval;
    int heartbeat_ms, step_timeout_s;
    bool learn; /* --learn-conversations, into the store of `states` */
    worker_states_options states;
    worker_warmup_mode warmup;
    bool help;  /* --help: print the usage, nothing else */
    bool usage; /* with an error: the command line's shape was wrong, so the usage follows */
} worker_options;

static int state_checkpoints_for(const worker_options *o, int parallel)
{
    return o->state_checkpoints >= 0 ? o->state_checkpoints : 2 * parallel;
}

static int run_bench(const worker_options *o)
{
    shoal_diag diag = {{0}};
    worker_model_options mo = o->model;
    int streams = o->bench_streams, prompt_tokens = o->random_len, output_tokens = o->max_tokens;
    int parallel = o->parallel < streams ? o->parallel : streams;
    int per_stream = (prompt_tokens + output_tokens + mo.page_tokens - 1) / mo.page_tokens;
    worker_engine_options eo = {.max_batch_tokens = mo.max_rows,
                                .parallel = parallel,
                                .max_queued = streams,
                                .max_model_len = per_stream * mo.page_tokens,
                                .checkpoints = state_checkpoints_for(o, parallel),
                                .checkpoint_interval = o->checkpoint_interval};
    mo.kv_pages = o->kv_pages ? o->kv_pages : parallel * per_stream;
    worker_engine_size_model(&eo, &mo);
    LOG_INFO("loading %s (%s weights) on %s: %d KV pages", mo.model_dir,
             mo.load_format == WORKER_LOAD_DUMMY ? "dummy" : "real", mo.device, mo.kv_pages);
    worker_model *m = NULL;
    worker_engine *e = NULL;
    int rc = 1;
    if (worker_model_open(&mo, &m, &diag) || worker_engine_open(m, &eo, &e, &diag)) {
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
           streams, prompt_tokens, output_tokens, parallel, mo.max_rows);
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

static void on_sigterm(int sig)
{
    (void)sig;
    worker_serve_stop();
}

static int run_serve(const worker_options *o)
{
    worker_model_options mo = o->model;
    const char *cluster = o->fake ? NULL : o->cluster;
    const int index = o->worker_index, parallel = o->parallel, kv_pages = o->kv_pages;
    int max_model_len = o->max_model_len;
    bool learn = o->learn; /* off if the store turns out damaged */
    shoal_diag diag = {{0}};
    worker_serve_options so = {.socket_path = o->connect,
                               .worker_index = index,
                               .heartbeat_ms = o->heartbeat_ms,
                               .step_timeout_s = o->step_timeout_s,
                               .device = mo.device,
                               .fake_tokens = o->fake,
                               .fake_vocab = 1000,
                               .fake_max_model_len = max_model_len ? max_model_len : 32768,
                               .fake_parallel = parallel,
                               .fake_step_us = o->fake_step_us};
    signal(SIGPIPE, SIG_IGN);
    if (o->fake) {
        shoal_err err = worker_serve_run(&so, NULL, NULL, &diag);
        if (err)
            fprintf(stderr, "shoal-worker: %s\n", diag.msg);
        return err ? 1 : 0;
    }
    model_config cfg;
    if (model_config_load(mo.model_dir, &cfg, &diag)) {
        fprintf(stderr, "shoal-worker: %s\n", diag.msg);
        return 1;
    }
    if (!max_model_len)
        max_model_len = cfg.max_positions < 32768 ? cfg.max_positions : 32768;
    worker_engine_options eo = {.max_batch_tokens = mo.max_rows,
                                .parallel = parallel,
                                .max_queued = 4096,
                                .max_model_len = max_model_len,
                                .checkpoints = state_checkpoints_for(o, parallel),
                                .checkpoint_interval = o->checkpoint_interval};
    mo.kv_pages = kv_pages; /* 0: sized from free memory once the weights are in */
    worker_engine_size_model(&eo, &mo);
    LOG_INFO("worker %d: loading %s on %s, pages of %d tokens, parallel %d", index, mo.model_dir,
             mo.device, mo.page_tokens, parallel);
    worker_model *m = NULL;
    worker_engine *e = NULL;
    worker_cluster *cl = NULL;
    worker_states *states = NULL;
    int rc = 1;
    /* an arena sized from free memory fits the segment's rows: a small
     * model on a large machine would otherwise ask for more pages than the
     * coordinator made rows for, and the worker would refuse to start */
    if ((cluster && !kv_pages && worker_cluster_segment_pages(cluster, &mo.kv_pages_max, &diag)) ||
        worker_model_open(&mo, &m, &diag) ||
        (cluster && worker_cluster_join(cluster, index, mo.device, m, &cl, &diag))) {
        fprintf(stderr, "shoal-worker: %s\n", diag.msg);
        goto out;
    }
    /* a stream never holds more pages than the pool has: the context
     * (and with it the default max_tokens a client gets) is cut to the
     * pool, where it used to be refused at its first request */
    const int pool_tokens = worker_model_kv_pages(m) * mo.page_tokens;
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
    if (learn) { /* opened here, in the worker process, never across a fork */
        shoal_err serr = worker_states_open(&o->states, m, &states, &diag);
        if (serr == SHOAL_ERR_FORMAT) {
            /* a store damaged or of another format: serving goes on without
             * learned states (refusing to start would take the worker out,
             * and restarts would meet the same store) */
            LOG_ERROR("worker %d: learned states are off: %s", index, diag.msg);
            learn = false;
            states = NULL;
        } else if (serr) {
            fprintf(stderr, "shoal-worker: %s\n", diag.msg);
            goto out;
        }
    }
    if (learn) {
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
    if (worker_warmup_run(m, o->warmup, who, &ws, &diag)) {
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

/* getopt_long's vals: the worker's own flags, then the table's from
 * OPT_TABLE on. */
enum {
    OPT_MODEL = 1,
    OPT_DEVICE,
    OPT_IDS,
    OPT_RANDOM,
    OPT_MAX,
    OPT_EOS,
    OPT_BENCH,
    OPT_SERVE,
    OPT_CONNECT,
    OPT_INDEX,
    OPT_CLUSTER,
    OPT_FAKE,
    OPT_FAKE_STEP,
    OPT_KVFRAC,
    OPT_HELP,
    OPT_OWN_COUNT = OPT_HELP,
    OPT_TABLE = 256,
};

static const struct option own_opts[OPT_OWN_COUNT] = {
    {"model", required_argument, 0, OPT_MODEL},
    {"device", required_argument, 0, OPT_DEVICE},
    {"prompt-ids", required_argument, 0, OPT_IDS},
    {"prompt-random", required_argument, 0, OPT_RANDOM},
    {"max-tokens", required_argument, 0, OPT_MAX},
    {"ignore-eos", no_argument, 0, OPT_EOS},
    {"bench-streams", required_argument, 0, OPT_BENCH},
    {"serve", no_argument, 0, OPT_SERVE},
    {"connect", required_argument, 0, OPT_CONNECT},
    {"worker-index", required_argument, 0, OPT_INDEX},
    {"cluster", required_argument, 0, OPT_CLUSTER},
    {"fake-tokens", no_argument, 0, OPT_FAKE},
    {"fake-step-us", required_argument, 0, OPT_FAKE_STEP},
    {"kv-memory-fraction", required_argument, 0, OPT_KVFRAC},
    {"help", no_argument, 0, OPT_HELP},
};

/* The WORD flags' values, in the order of their words in the table. */
static const worker_load_format load_formats[] = {WORKER_LOAD_AUTO, WORKER_LOAD_DUMMY};
static const shoal_dtype kv_dtypes[] = {SHOAL_DTYPE_BF16, SHOAL_DTYPE_F8_E4M3, SHOAL_DTYPE_F32};
static const worker_warmup_mode warmups[] = {WORKER_WARMUP_AUTO, WORKER_WARMUP_ON,
                                             WORKER_WARMUP_OFF};
static const bool restore_reads_all[] = {false, true}; /* overlap, read */

/* The table's flags into o, over the defaults o holds. */
static void take_table_flags(const common_worker_args *w, worker_options *o)
{
    worker_model_options *mo = &o->model;
    mo->load_format = load_formats[common_worker_args_num(w, COMMON_WORKER_FLAG_LOAD_FORMAT, 0)];
    mo->kv_dtype = kv_dtypes[common_worker_args_num(w, COMMON_WORKER_FLAG_KV_DTYPE, 0)];
    o->warmup = warmups[common_worker_args_num(w, COMMON_WORKER_FLAG_WARMUP, 0)];
    mo->threads = (int)common_worker_args_num(w, COMMON_WORKER_FLAG_THREADS, mo->threads);
    mo->page_tokens =
        (int)common_worker_args_num(w, COMMON_WORKER_FLAG_PAGE_TOKENS, mo->page_tokens);
    /* serving's batches are smaller than a benchmark's: a step's latency
     * is every stream's */
    mo->max_rows = (int)common_worker_args_num(w, COMMON_WORKER_FLAG_MAX_BATCH_TOKENS,
                                               o->serve ? 512 : mo->max_rows);
    o->parallel = (int)common_worker_args_num(w, COMMON_WORKER_FLAG_PARALLEL, 64);
    o->kv_pages = (int)common_worker_args_num(w, COMMON_WORKER_FLAG_KV_PAGES, 0);
    o->max_model_len = (int)common_worker_args_num(w, COMMON_WORKER_FLAG_MAX_MODEL_LEN, 0);
    o->state_checkpoints = (int)common_worker_args_num(w, COMMON_WORKER_FLAG_STATE_CHECKPOINTS, -1);
    o->checkpoint_interval = (int)common_worker_args_num(w, COMMON_WORKER_FLAG_CHECKPOINT_INTERVAL,
                                                         WORKER_CHECKPOINT_INTERVAL);
    o->heartbeat_ms = (int)common_worker_args_num(w, COMMON_WORKER_FLAG_HEARTBEAT_MS, 200);
    o->step_timeout_s =
        (int)common_worker_args_num(w, COMMON_WORKER_FLAG_STEP_TIMEOUT_S, SHOAL_STEP_TIMEOUT_S);
    o->learn = common_worker_args_has(w, COMMON_WORKER_FLAG_LEARN_CONVERSATIONS);
    o->states.dir = common_worker_args_text(w, COMMON_WORKER_FLAG_STATE_DIR);
    o->states.spill_bytes =
        (uint64_t)common_worker_args_num(w, COMMON_WORKER_FLAG_SPILL_GIB, 16ll << 30);
    /* On the CPU backend the engine and the readers share the cores, and
     * computing is slow beside reading: overlap only on a GPU. */
    bool cpu = strcmp(mo->device, "cpu") == 0;
    o->states.read_all =
        restore_reads_all[common_worker_args_num(w, COMMON_WORKER_FLAG_RESTORE_MODE, cpu)];
}

/* One of the worker's own flags that takes text or none.
 * SHOAL_ERR_INVALID on a bad value, SHOAL_ERR_NOT_FOUND for a val that is
 * none of these. */
static shoal_err set_own_flag(worker_options *o, int c, const char *value, shoal_diag *diag)
{
    switch (c) {
    case OPT_MODEL:
        o->model.model_dir = value;
        return SHOAL_OK;
    case OPT_DEVICE:
        o->model.device = value;
        return SHOAL_OK;
    case OPT_IDS:
        o->ids_text = value;
        return SHOAL_OK;
    case OPT_EOS:
        o->ignore_eos = true;
        return SHOAL_OK;
    case OPT_SERVE:
        o->serve = true;
        return SHOAL_OK;
    case OPT_CONNECT:
        o->connect = value;
        return SHOAL_OK;
    case OPT_CLUSTER:
        o->cluster = value;
        return SHOAL_OK;
    case OPT_FAKE:
        o->fake = true;
        return SHOAL_OK;
    case OPT_KVFRAC: {
        char *end;
        double v = strtod(value, &end);
        if (*end != '\0' || !(v > 0.0 && v <= 1.0))
            return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                                  "--kv-memory-fraction '%s': expected a number in (0, 1]", value);
        o->model.kv_memory_fraction = v;
        return SHOAL_OK;
    }
    default:
        return SHOAL_ERR_NOT_FOUND;
    }
}

/* Parses argv into o. SHOAL_ERR_INVALID with diag on a bad value or a
 * bad combination (o->usage set where the usage should follow; diag empty
 * where getopt_long said it already). --help sets o->help and stops. */
static shoal_err worker_parse_args(int argc, char **argv, worker_options *o, shoal_diag *diag)
{
    memset(o, 0, sizeof *o);
    worker_model_options_default(&o->model);
    o->max_tokens = 16;
    common_worker_args w = {0};
    const common_args_int_flag ints[] = {
        {OPT_RANDOM, "--prompt-random", 1, 1 << 20, &o->random_len},
        {OPT_MAX, "--max-tokens", 0, 1 << 20, &o->max_tokens},
        {OPT_BENCH, "--bench-streams", 1, 65536, &o->bench_streams},
        {OPT_INDEX, "--worker-index", 0, 1023, &o->worker_index},
        {OPT_FAKE_STEP, "--fake-step-us", 0, 60000000, &o->fake_step_us},
    };
    struct option opts[OPT_OWN_COUNT + COMMON_WORKER_FLAG_COUNT + 1];
    memcpy(opts, own_opts, sizeof own_opts);
    common_worker_flags_getopt(opts + OPT_OWN_COUNT, OPT_TABLE);
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c == OPT_HELP) {
            o->help = true;
            return SHOAL_OK;
        }
        shoal_err err = SHOAL_ERR_NOT_FOUND;
        if (c >= OPT_TABLE && c < OPT_TABLE + COMMON_WORKER_FLAG_COUNT)
            err = common_worker_args_set(&w, c - OPT_TABLE, optarg, diag);
        if (err == SHOAL_ERR_NOT_FOUND)
            err = common_args_int_flags(ints, sizeof ints / sizeof ints[0], c, optarg, diag);
        if (err == SHOAL_ERR_NOT_FOUND)
            err = set_own_flag(o, c, optarg, diag);
        if (err == SHOAL_ERR_NOT_FOUND) { /* getopt_long said which */
            shoal_diag_clear(diag);
            o->usage = true;
            return SHOAL_ERR_INVALID;
        }
        if (err)
            return err;
    }
    if (common_worker_args_check(&w, diag))
        return SHOAL_ERR_INVALID;
    take_table_flags(&w, o);
    if (o->learn && (!o->serve || o->fake))
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "--learn-conversations works only when serving a model (--serve, "
                              "not --fake-tokens)");
    o->usage = true; /* the checks below are of the command line's shape */
    if (o->serve) {
        if (!o->connect || (!o->model.model_dir && !o->fake) || optind < argc)
            return shoal_diag_set(diag, SHOAL_ERR_INVALID, "--serve needs %s",
                                  !o->connect     ? "--connect ADDR"
                                  : optind < argc ? "no arguments past the options"
                                                  : "--model DIR");
    } else if (!o->model.model_dir || (!o->ids_text && !o->random_len) ||
               (o->ids_text && o->random_len) || optind < argc ||
               (o->bench_streams && !o->random_len)) {
        return shoal_diag_set(
            diag, SHOAL_ERR_INVALID, "%s",
            !o->model.model_dir              ? "--model DIR is missing"
            : !o->ids_text && !o->random_len ? "give the prompt: --prompt-ids or --prompt-random"
            : o->ids_text && o->random_len   ? "--prompt-ids and --prompt-random exclude each other"
            : optind < argc                  ? "unexpected arguments past the options"
                                             : "--bench-streams needs --prompt-random N");
    }
    o->usage = false;
    return SHOAL_OK;
}

/* One prompt, its greedy tokens printed as they come. */
static int run_prompt(const worker_options *o)
{
    worker_model_options mo = o->model;
    int32_t *prompt = NULL;
    int prompt_len = 0;
    if (o->ids_text && parse_ids(o->ids_text, &prompt, &prompt_len))
        return 2;
    shoal_diag diag = {{0}};
    model_config cfg;
    if (model_config_load(mo.model_dir, &cfg, &diag)) {
        fprintf(stderr, "shoal-worker: %s\n", diag.msg);
        free(prompt);
        return 1;
    }
    if (o->random_len) {
        prompt = malloc((size_t)o->random_len * sizeof *prompt);
        if (!prompt)
            return 1;
        uint64_t seed = 42;
        for (int i = 0; i < o->random_len; i++)
            prompt[i] = (int32_t)(common_rng_next(&seed) % (uint64_t)cfg.vocab);
        prompt_len = o->random_len;
    }
    /* Enough pages for this one stream, and logits for one row. */
    int64_t tokens = (int64_t)prompt_len + o->max_tokens;
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
    shoal_err err = worker_generate_greedy(m, prompt, prompt_len, o->max_tokens, !o->ignore_eos,
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

int main(int argc, char **argv)
{
    common_log_init("shoal-worker", COMMON_LOG_INFO);
    worker_options o;
    shoal_diag diag = {{0}};
    if (worker_parse_args(argc, argv, &o, &diag)) {
        if (diag.msg[0])
            fprintf(stderr, "shoal-worker: %s\n", diag.msg);
        if (o.usage)
            usage(stderr);
        return 2;
    }
    if (o.help) {
        usage(stdout);
        return 0;
    }
    if (o.serve)
        return run_serve(&o);
    if (o.bench_streams)
        return run_bench(&o);
    return run_prompt(&o);
}
