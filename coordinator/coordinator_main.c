/* shoal-coordinator: the OpenAI-compatible HTTP front of a shoal cluster.
 *
 * Reads the model's tokenizer and chat template, starts the workers
 * (coordinator_cluster.h) and serves HTTP (coordinator_http.h) until
 * SIGTERM or SIGINT; then it drains: the listener closes, requests in
 * flight run to their end within --drain-timeout-s, what is left is
 * cancelled, the workers stop, and the process exits 0. A second signal
 * ends the drain at once. */
#include "common/common_file.h"
#include "common/common_limits.h"
#include "common/common_args.h"
#include "common/common_log.h"
#include "common/common_time.h"
#include "coordinator/coordinator_chat.h"
#include "coordinator/coordinator_cluster.h"
#include "coordinator/coordinator_http.h"
#include "coordinator/coordinator_limits.h"
#include "coordinator/coordinator_tokenizer.h"

#include <errno.h>
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#ifdef SHOAL_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: shoal-coordinator --model DIR [options]\n"
        "HTTP:\n"
        "  --host ADDR             address to listen on (default 127.0.0.1)\n"
        "  --port N                port (default 8000; 0: any free port)\n"
        "  --port-file PATH        write the port there once listening (for tests)\n"
        "  --api-key KEY           require \"Authorization: Bearer KEY\" on every route but\n"
        "                          /health (default: $SHOAL_API_KEY; none if unset)\n"
        "  --served-model-name S   the model's name in the API (default: --model as given)\n"
        "  --allowed-origin O      CORS: the origin browsers may call from (default *, any,\n"
        "                          as vLLM's; none: no CORS headers, OPTIONS is a 405)\n"
        "  --http-threads N        HTTP threads (default 2)\n"
        "  --max-body-bytes N      largest request body (default and most %u)\n"
        "  --max-body-memory-mib N all request bodies being read at once; past it a 503\n"
        "                          (default 1024)\n"
        "  --max-streams N         choices in flight before 429 (default %d)\n"
        "  --max-tokens-default N  max_tokens of a request that gives none (default: the\n"
        "                          rest of the context)\n"
        "  --drain-timeout-s N     on SIGTERM, how long requests in flight may run (default 30)\n"
        "Workers (passed on to each shoal-worker):\n"
        "  --model DIR             Hugging Face model directory (tokenizer.json too)\n"
        "  --workers LIST          auto (default), none, or GPU indices and 'cpu', e.g. cpu,cpu\n"
        "  --route R               prefix (default), least-loaded or round-robin\n"
        "  --load-format F         auto or dummy\n"
        "  --kv-dtype D            KV pages: bf16 (default) or fp8\n"
        "  --warmup M              auto (default: on a GPU), on or off: before a worker\n"
        "                          serves, prompt passes and a decode round of every\n"
        "                          batch size, so that first requests load no kernels\n"
        "  --page-tokens N, --kv-pages N, --parallel N, --max-batch-tokens N,\n"
        "  --max-model-len N, --threads N\n"
        "  --state-checkpoints N   hybrid models: recurrent-state checkpoints kept for\n"
        "                          prefix hits (default: twice --parallel)\n"
        "  --checkpoint-interval N hybrid models: a prompt keeps its state every N tokens\n"
        "                          (a multiple of --page-tokens; default 512; 0: only at\n"
        "                          its last full page and each turn's end)\n"
        "  --runtime-dir DIR       worker sockets (default: a new /tmp/shoal.XXXXXX)\n"
        "  --cluster NAME          the shared segment /dev/shm/shoal.NAME that workers\n"
        "                          and shoalctl attach to (default: shoal-<pid>)\n"
        "  --segment-pages N       KV page rows per worker in it (default: --kv-pages,\n"
        "                          else 65536)\n"
        "  --worker-path PATH      the shoal-worker binary (default: next to this one)\n"
        "  --learn-conversations   keep each conversation's KV pages; spill them to the\n"
        "                          state store when evicted, restore them on the next turn\n"
        "  --state-dir DIR         the store (LMDB, made 0700), shared by the workers and\n"
        "                          kept across restarts; shoalctl states inspects it\n"
        "  --spill-gib N           the store's size limit in GiB (default 16)\n"
        "  --restore-mode M        overlap (default on a GPU): a turn computes the head\n"
        "                          of its history while the store reads the tail; read\n"
        "                          (default on the CPU): it reads every stored block\n"
        "  --heartbeat-ms N, --dead-after-ms N, --start-timeout-s N\n"
        "  --step-timeout-s N      a worker whose one engine step runs longer is taken\n"
        "                          for hung and restarted (default 300; 0: never)\n",
        COORDINATOR_BODY_BYTES_MAX, COORDINATOR_STREAMS_MAX);
}

static int parse_int(const char *flag, const char *s, long lo, long hi, int *out)
{
    return common_parse_int("shoal-coordinator", flag, s, lo, hi, out);
}

/* shoal-worker next to this binary (installed), or in the build tree's
 * worker/ folder beside coordinator/; else from PATH. */
static void default_worker_path(char *out, size_t cap)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    snprintf(out, cap, "shoal-worker");
    if (n <= 0)
        return;
    self[n] = '\0';
    char *dir = dirname(self);
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/shoal-worker", dir);
    if (access(path, X_OK) == 0) {
        snprintf(out, cap, "%s", path);
        return;
    }
    snprintf(path, sizeof path, "%s/../worker/shoal-worker", dir);
    if (access(path, X_OK) == 0)
        snprintf(out, cap, "%s", path);
}

/* Writes the port to path through a rename, so a reader never sees half. */
static int write_port_file(const char *path, int port)
{
    char tmp[SHOAL_PATH_BYTES_MAX];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f || fprintf(f, "%d\n", port) < 0 || fclose(f) != 0 || rename(tmp, path) != 0) {
        fprintf(stderr, "shoal-coordinator: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* Removes the sockets and the directory we made for them. */
static void remove_runtime_dir(const char *dir)
{
    char path[SHOAL_PATH_BYTES_MAX];
    for (int i = 0; i < COORDINATOR_WORKERS_MAX; i++) {
        snprintf(path, sizeof path, "%s/worker-%d.ipc", dir, i);
        unlink(path);
    }
    rmdir(dir);
}

/* sd_notify where libsystemd is built in; nothing otherwise. */
static void coordinator_notify(const char *state)
{
#ifdef SHOAL_HAVE_SYSTEMD
    sd_notify(0, state);
#else
    (void)state;
#endif
}

/* The watchdog interval systemd asks for, in microseconds; 0 for none. */
static uint64_t coordinator_watchdog_us(void)
{
    uint64_t us = 0;
#ifdef SHOAL_HAVE_SYSTEMD
    if (sd_watchdog_enabled(0, &us) <= 0)
        us = 0;
#endif
    return us;
}

int main(int argc, char **argv)
{
    enum {
        OPT_HOST = 1,
        OPT_PORT,
        OPT_PORT_FILE,
        OPT_KEY,
        OPT_ORIGIN,
        OPT_NAME,
        OPT_HTTP_THREADS,
        OPT_BODY,
        OPT_BODIES,
        OPT_STREAMS,
        OPT_MAX_TOKENS,
        OPT_DRAIN,
        OPT_MODEL,
        OPT_WORKERS,
        OPT_ROUTE,
        OPT_LOAD,
        OPT_KV_DTYPE,
        OPT_PAGE,
        OPT_PAGES,
        OPT_PARALLEL,
        OPT_BATCH,
        OPT_LEN,
        OPT_THREADS,
        OPT_CHECKPOINTS,
        OPT_CHECKPOINT_INTERVAL,
        OPT_RUNTIME,
        OPT_CLUSTER,
        OPT_SEGMENT_PAGES,
        OPT_WORKER_PATH,
        OPT_HEARTBEAT,
        OPT_STEP_TIMEOUT,
        OPT_DEAD,
        OPT_START,
        OPT_LEARN,
        OPT_STATE_DIR,
        OPT_SPILL,
        OPT_RESTORE,
        OPT_WARMUP,
        OPT_HELP
    };
    static const struct option opts[] = {
        {"host", required_argument, 0, OPT_HOST},
        {"port", required_argument, 0, OPT_PORT},
        {"port-file", required_argument, 0, OPT_PORT_FILE},
        {"api-key", required_argument, 0, OPT_KEY},
        {"allowed-origin", required_argument, 0, OPT_ORIGIN},
        {"served-model-name", required_argument, 0, OPT_NAME},
        {"http-threads", required_argument, 0, OPT_HTTP_THREADS},
        {"max-body-bytes", required_argument, 0, OPT_BODY},
        {"max-body-memory-mib", required_argument, 0, OPT_BODIES},
        {"max-streams", required_argument, 0, OPT_STREAMS},
        {"max-tokens-default", required_argument, 0, OPT_MAX_TOKENS},
        {"drain-timeout-s", required_argument, 0, OPT_DRAIN},
        {"model", required_argument, 0, OPT_MODEL},
        {"workers", required_argument, 0, OPT_WORKERS},
        {"route", required_argument, 0, OPT_ROUTE},
        {"load-format", required_argument, 0, OPT_LOAD},
        {"kv-dtype", required_argument, 0, OPT_KV_DTYPE},
        {"page-tokens", required_argument, 0, OPT_PAGE},
        {"kv-pages", required_argument, 0, OPT_PAGES},
        {"parallel", required_argument, 0, OPT_PARALLEL},
        {"max-batch-tokens", required_argument, 0, OPT_BATCH},
        {"max-model-len", required_argument, 0, OPT_LEN},
        {"threads", required_argument, 0, OPT_THREADS},
        {"state-checkpoints", required_argument, 0, OPT_CHECKPOINTS},
        {"checkpoint-interval", required_argument, 0, OPT_CHECKPOINT_INTERVAL},
        {"runtime-dir", required_argument, 0, OPT_RUNTIME},
        {"cluster", required_argument, 0, OPT_CLUSTER},
        {"segment-pages", required_argument, 0, OPT_SEGMENT_PAGES},
        {"worker-path", required_argument, 0, OPT_WORKER_PATH},
        {"heartbeat-ms", required_argument, 0, OPT_HEARTBEAT},
        {"step-timeout-s", required_argument, 0, OPT_STEP_TIMEOUT},
        {"dead-after-ms", required_argument, 0, OPT_DEAD},
        {"start-timeout-s", required_argument, 0, OPT_START},
        {"learn-conversations", no_argument, 0, OPT_LEARN},
        {"state-dir", required_argument, 0, OPT_STATE_DIR},
        {"spill-gib", required_argument, 0, OPT_SPILL},
        {"restore-mode", required_argument, 0, OPT_RESTORE},
        {"warmup", required_argument, 0, OPT_WARMUP},
        {"help", no_argument, 0, OPT_HELP},
        {0, 0, 0, 0},
    };
    common_log_init("shoal-coordinator", COMMON_LOG_INFO);
    coordinator_cluster_options co;
    coordinator_cluster_options_default(&co);
    coordinator_http_options ho = {
        .host = "127.0.0.1", .port = 8000, .allowed_origin = "*", .listen_fd = -1};
    const char *port_file = NULL;
    int body_max = 0, bodies_mib = 0, drain_s = 30, start_s = 600;
    bool learn = false;
    const char *state_dir = NULL;
    char worker_path[PATH_MAX + 32];
    default_worker_path(worker_path, sizeof worker_path);
    co.worker_path = worker_path;
    co.runtime_dir = NULL;
    const struct {
        int id;
        const char *flag;
        long lo, hi;
        int *dst;
    } ints[] = {
        {OPT_PORT, "--port", 0, 65535, &ho.port},
        {OPT_HTTP_THREADS, "--http-threads", 1, COORDINATOR_HTTP_THREADS_MAX, &ho.threads},
        {OPT_BODY, "--max-body-bytes", 1024, COORDINATOR_BODY_BYTES_MAX, &body_max},
        {OPT_BODIES, "--max-body-memory-mib", 1, 1 << 20, &bodies_mib},
        {OPT_STREAMS, "--max-streams", 1, COORDINATOR_STREAMS_MAX, &ho.streams_max},
        {OPT_MAX_TOKENS, "--max-tokens-default", 1, SHOAL_CONTEXT_TOKENS_MAX,
         &ho.default_max_tokens},
        {OPT_DRAIN, "--drain-timeout-s", 0, 86400, &drain_s},
        {OPT_PAGE, "--page-tokens", SHOAL_PAGE_TOKENS_MIN, SHOAL_PAGE_TOKENS_MAX, &co.page_tokens},
        {OPT_PAGES, "--kv-pages", 1, 1 << 24, &co.kv_pages},
        {OPT_SEGMENT_PAGES, "--segment-pages", 1, 1 << 24, &co.segment_pages},
        {OPT_PARALLEL, "--parallel", 1, SHOAL_BATCH_STREAMS_MAX, &co.parallel},
        {OPT_BATCH, "--max-batch-tokens", 1, SHOAL_BATCH_ROWS_MAX, &co.max_batch_tokens},
        {OPT_LEN, "--max-model-len", 2, SHOAL_CONTEXT_TOKENS_MAX, &co.max_model_len},
        {OPT_THREADS, "--threads", 0, SHOAL_CPU_THREADS_MAX, &co.threads},
        {OPT_CHECKPOINTS, "--state-checkpoints", 0, SHOAL_STATE_SLOTS_MAX, &co.state_checkpoints},
        {OPT_CHECKPOINT_INTERVAL, "--checkpoint-interval", 0, SHOAL_CONTEXT_TOKENS_MAX,
         &co.checkpoint_interval},
        {OPT_HEARTBEAT, "--heartbeat-ms", 10, 60000, &co.heartbeat_ms},
        {OPT_STEP_TIMEOUT, "--step-timeout-s", 0, 86400, &co.step_timeout_s},
        {OPT_DEAD, "--dead-after-ms", 100, 600000, &co.dead_after_ms},
        {OPT_START, "--start-timeout-s", 1, 86400, &start_s},
    };
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        size_t k = 0;
        while (k < sizeof ints / sizeof ints[0] && ints[k].id != c)
            k++;
        if (k < sizeof ints / sizeof ints[0]) {
            if (parse_int(ints[k].flag, optarg, ints[k].lo, ints[k].hi, ints[k].dst))
                return 2;
            continue;
        }
        switch (c) {
        case OPT_HOST:
            ho.host = optarg;
            break;
        case OPT_PORT_FILE:
            port_file = optarg;
            break;
        case OPT_KEY:
            ho.api_key = optarg;
            break;
        case OPT_ORIGIN:
            if (!coordinator_http_origin_valid(optarg)) {
                fprintf(stderr,
                        "shoal-coordinator: --allowed-origin '%.64s': expected *, none or an "
                        "origin such as https://example.com (no spaces or control characters)\n",
                        optarg);
                return 2;
            }
            ho.allowed_origin = strcmp(optarg, "none") == 0 ? NULL : optarg;
            break;
        case OPT_NAME:
            ho.model_name = optarg;
            break;
        case OPT_MODEL:
            co.model_dir = optarg;
            break;
        case OPT_WORKERS:
            co.workers = optarg;
            break;
        case OPT_LOAD:
            co.load_format = optarg;
            break;
        case OPT_KV_DTYPE:
            co.kv_dtype = optarg;
            break;
        case OPT_RUNTIME:
            co.runtime_dir = optarg;
            break;
        case OPT_CLUSTER:
            co.cluster = optarg;
            break;
        case OPT_WORKER_PATH:
            co.worker_path = optarg;
            break;
        case OPT_LEARN:
            learn = true;
            break;
        case OPT_STATE_DIR:
            state_dir = optarg;
            break;
        case OPT_SPILL: {
            unsigned long long bytes; /* checked here, passed on as given */
            if (common_parse_gib("shoal-coordinator", "--spill-gib", optarg,
                                 (double)(SHOAL_STORE_SPILL_BYTES_MAX >> 30), &bytes))
                return 2;
            co.spill_gib = optarg;
            break;
        }
        case OPT_WARMUP: {
            static const char *const modes[] = {"auto", "on", "off"};
            co.warmup = NULL;
            for (int i = 0; i < 3; i++)
                if (strcmp(optarg, modes[i]) == 0)
                    co.warmup = modes[i];
            if (!co.warmup) {
                fprintf(stderr, "shoal-coordinator: --warmup '%s': expected auto, on or off\n",
                        optarg);
                return 2;
            }
            break;
        }
        case OPT_RESTORE:
            if (strcmp(optarg, "overlap") != 0 && strcmp(optarg, "read") != 0) {
                fprintf(stderr,
                        "shoal-coordinator: --restore-mode '%s': expected overlap or read\n",
                        optarg);
                return 2;
            }
            co.restore_mode = optarg;
            break;
        case OPT_ROUTE:
            if (strcmp(optarg, "prefix") == 0) {
                co.route = COORDINATOR_ROUTE_PREFIX;
            } else if (strcmp(optarg, "least-loaded") == 0) {
                co.route = COORDINATOR_ROUTE_LEAST_LOADED;
            } else if (strcmp(optarg, "round-robin") == 0) {
                co.route = COORDINATOR_ROUTE_ROUND_ROBIN;
            } else {
                fprintf(stderr,
                        "shoal-coordinator: --route '%s': expected prefix, "
                        "least-loaded or round-robin\n",
                        optarg);
                return 2;
            }
            break;
        case OPT_HELP:
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (!co.model_dir || optind < argc) {
        if (!co.model_dir)
            fprintf(stderr, "shoal-coordinator: --model DIR is missing (a Hugging Face model "
                            "directory)\n");
        else
            fprintf(stderr, "shoal-coordinator: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    if (!learn && (state_dir || co.spill_gib || co.restore_mode)) {
        fprintf(stderr, "shoal-coordinator: %s needs --learn-conversations\n",
                state_dir      ? "--state-dir"
                : co.spill_gib ? "--spill-gib"
                               : "--restore-mode");
        return 2;
    }
    if (learn && !state_dir) {
        fprintf(stderr, "shoal-coordinator: --learn-conversations needs --state-dir DIR (where "
                        "the workers keep the states)\n");
        return 2;
    }
    co.state_dir = learn ? state_dir : NULL;
    if (!ho.api_key)
        ho.api_key = getenv("SHOAL_API_KEY");
    if (!ho.model_name)
        ho.model_name = co.model_dir;
    ho.body_bytes_max = (size_t)body_max;
    ho.bodies_bytes_max = (size_t)bodies_mib << 20;
    size_t one_body = body_max ? (size_t)body_max : COORDINATOR_BODY_BYTES_MAX;
    if (bodies_mib && ho.bodies_bytes_max < one_body) {
        fprintf(stderr,
                "shoal-coordinator: --max-body-memory-mib %d cannot hold one body of "
                "--max-body-bytes (%zu bytes): raise it to %zu or lower --max-body-bytes\n",
                bodies_mib, one_body, (one_body + (1u << 20) - 1) >> 20);
        return 2;
    }
    co.start_timeout_ms = start_s * 1000;

    /* Signals are taken by sigtimedwait below, in this thread only: block
     * them before any thread starts, so every thread inherits the mask.
     * A write to a closed socket is an error return, never a signal. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    char made_dir[] = "/tmp/shoal.XXXXXX";
    bool own_dir = false;
    if (!co.runtime_dir) {
        if (strcmp(co.workers, "none") == 0) {
            fprintf(stderr, "shoal-coordinator: --workers none needs --runtime-dir (where the "
                            "workers find their sockets)\n");
            return 2;
        }
        if (!mkdtemp(made_dir)) {
            fprintf(stderr, "shoal-coordinator: cannot make a runtime directory: %s\n",
                    strerror(errno));
            return 1;
        }
        co.runtime_dir = made_dir;
        own_dir = true;
    }

    int rc = 1;
    shoal_diag diag = {{0}};
    coordinator_tokenizer *tok = NULL;
    coordinator_chat *chat = NULL;
    coordinator_cluster *cluster = NULL;
    coordinator_http *http = NULL;
    char path[SHOAL_PATH_BYTES_MAX];
    if (common_dir_check(co.model_dir, "--model", &diag)) {
        fprintf(stderr,
                "shoal-coordinator: %s (a Hugging Face model directory: config.json, "
                "tokenizer.json and the weights)\n",
                diag.msg);
        goto out;
    }
    if (common_path_join(path, sizeof path, co.model_dir, "tokenizer.json") ||
        coordinator_tokenizer_open(path, &tok, &diag)) {
        fprintf(stderr, "shoal-coordinator: %s\n", diag.msg[0] ? diag.msg : "path too long");
        goto out;
    }
    shoal_diag chat_diag = {{0}};
    if (common_path_join(path, sizeof path, co.model_dir, "tokenizer_config.json") == 0 &&
        coordinator_chat_open(path, &chat, &chat_diag) != SHOAL_OK)
        LOG_WARN("no chat template: %s; /v1/chat/completions answers 400, /v1/completions "
                 "serves",
                 chat_diag.msg);
    /* the port first: one that is taken is said before any model loads */
    if (coordinator_http_bind(ho.host, ho.port, &ho.listen_fd, &diag)) {
        fprintf(stderr, "shoal-coordinator: %s\n", diag.msg);
        goto out;
    }
    LOG_INFO("starting workers (%s) for %s", co.workers, co.model_dir);
    if (coordinator_cluster_open(&co, &cluster, &diag)) {
        fprintf(stderr, "shoal-coordinator: %s\n", diag.msg);
        goto out;
    }
    shoal_err http_err = coordinator_http_open(&ho, cluster, tok, chat, &http, &diag);
    ho.listen_fd = -1; /* the server's now, whatever the outcome */
    if (http_err) {
        fprintf(stderr, "shoal-coordinator: %s\n", diag.msg);
        goto out;
    }
    LOG_INFO("serving %s on http://%s:%d (context %d tokens%s)", ho.model_name, ho.host,
             coordinator_http_port(http), coordinator_cluster_max_model_len(cluster),
             ho.api_key && ho.api_key[0] ? ", API key required" : "");
    if (port_file && write_port_file(port_file, coordinator_http_port(http)))
        goto out;
    /* systemd (Type=notify): ready once the workers registered and HTTP
     * listens; the watchdog is fed only while the cluster's supervision
     * runs, so a hung coordinator is restarted. No-ops outside systemd. */
    coordinator_notify("READY=1\nSTATUS=serving");
    uint64_t watchdog_us = coordinator_watchdog_us();

    int sig;
    for (;;) {
        struct timespec wait = {0, 500 * 1000000L};
        if (watchdog_us) {
            wait.tv_sec = (time_t)(watchdog_us / 2 / 1000000);
            wait.tv_nsec = (long)(watchdog_us / 2 % 1000000) * 1000;
        }
        sig = sigtimedwait(&sigs, NULL, &wait);
        if (sig >= 0)
            break;
        if (errno == EAGAIN && watchdog_us && coordinator_cluster_alive(cluster))
            coordinator_notify("WATCHDOG=1");
    }
    coordinator_notify("STOPPING=1");
    LOG_INFO("signal %d: draining (%d requests in flight, up to %d s)", sig,
             coordinator_http_active(http), drain_s);
    coordinator_http_drain(http);
    long long deadline = common_mono_ms() + (long long)drain_s * 1000;
    while (coordinator_http_active(http) > 0 && common_mono_ms() < deadline) {
        struct timespec step = {0, 20 * 1000000L};
        if (sigtimedwait(&sigs, NULL, &step) >= 0) {
            LOG_WARN("second signal: stopping now");
            break;
        }
    }
    if (coordinator_http_active(http) > 0)
        LOG_WARN("%d requests still in flight: cancelled", coordinator_http_active(http));
    rc = 0;
out:
    coordinator_http_close(http);
    if (ho.listen_fd >= 0)
        close(ho.listen_fd);
    coordinator_cluster_close(cluster);
    coordinator_chat_close(chat);
    coordinator_tokenizer_close(tok);
    if (own_dir)
        remove_runtime_dir(made_dir);
    if (rc == 0)
        LOG_INFO("stopped");
    return rc;
}
