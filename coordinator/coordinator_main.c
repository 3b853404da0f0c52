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
#include "common/common_worker_flags.h"
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

/* Where --help's text starts on each line. */
enum { USAGE_COLUMN = 26 };

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
        "  --ignore-unknown-fields a request field this server does not read is ignored\n"
        "                          with a warning in the log (vLLM's behaviour), not a 400\n"
        "  --drain-timeout-s N     on SIGTERM, how long requests in flight may run (default 30)\n"
        "Workers:\n"
        "  --model DIR             Hugging Face model directory (tokenizer.json too)\n"
        "  --workers LIST          auto (default), none, or GPU indices and 'cpu', e.g. cpu,cpu\n"
        "  --route R               prefix (default), least-loaded or round-robin\n"
        "  --runtime-dir DIR       worker sockets (default: a new /tmp/shoal.XXXXXX)\n"
        "  --cluster NAME          the shared segment /dev/shm/shoal.NAME that workers\n"
        "                          and shoalctl attach to (default: shoal-<pid>)\n"
        "  --segment-pages N       KV page rows per worker in it (default: --kv-pages,\n"
        "                          else 65536)\n"
        "  --worker-path PATH      the shoal-worker binary (default: next to this one)\n"
        "  --dead-after-ms N       a worker silent this long is taken for dead and\n"
        "                          restarted (default 3000)\n"
        "  --start-timeout-s N     how long the workers may take to load the model and\n"
        "                          say they are ready (default 600)\n"
        "Passed on to each shoal-worker (--heartbeat-ms and --step-timeout-s also set\n"
        "how the coordinator watches its workers):\n",
        COORDINATOR_BODY_BYTES_MAX, COORDINATOR_STREAMS_MAX);
    common_worker_flags_usage(f, USAGE_COLUMN);
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

/* What the command line asks for, with the defaults of what it leaves
 * out. Its strings are argv's or worker_path. */
typedef struct coordinator_options {
    coordinator_cluster_options cluster;
    coordinator_http_options http;
    const char *port_file;
    int drain_s;
    bool help;  /* --help: print the usage, nothing else */
    bool usage; /* with an error: the command line's shape was wrong, so the usage follows */
    char worker_path[PATH_MAX + 32]; /* the default of cluster.worker_path */
} coordinator_options;

/* getopt_long's vals: the coordinator's own flags, then the table's from
 * OPT_TABLE on. */
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
    OPT_IGNORE_UNKNOWN,
    OPT_DRAIN,
    OPT_MODEL,
    OPT_WORKERS,
    OPT_ROUTE,
    OPT_RUNTIME,
    OPT_CLUSTER,
    OPT_SEGMENT_PAGES,
    OPT_WORKER_PATH,
    OPT_DEAD,
    OPT_START,
    OPT_HELP,
    OPT_OWN_COUNT = OPT_HELP,
    OPT_TABLE = 256,
};

static const struct option own_opts[OPT_OWN_COUNT] = {
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
    {"ignore-unknown-fields", no_argument, 0, OPT_IGNORE_UNKNOWN},
    {"drain-timeout-s", required_argument, 0, OPT_DRAIN},
    {"model", required_argument, 0, OPT_MODEL},
    {"workers", required_argument, 0, OPT_WORKERS},
    {"route", required_argument, 0, OPT_ROUTE},
    {"runtime-dir", required_argument, 0, OPT_RUNTIME},
    {"cluster", required_argument, 0, OPT_CLUSTER},
    {"segment-pages", required_argument, 0, OPT_SEGMENT_PAGES},
    {"worker-path", required_argument, 0, OPT_WORKER_PATH},
    {"dead-after-ms", required_argument, 0, OPT_DEAD},
    {"start-timeout-s", required_argument, 0, OPT_START},
    {"help", no_argument, 0, OPT_HELP},
};

/* The table's flags into the cluster's options, over their defaults:
 * what the cluster passes on to each worker, as given. */
static void take_table_flags(const common_worker_args *w, coordinator_cluster_options *co)
{
    co->load_format = common_worker_args_text(w, COMMON_WORKER_FLAG_LOAD_FORMAT);
    co->kv_dtype = common_worker_args_text(w, COMMON_WORKER_FLAG_KV_DTYPE);
    co->warmup = common_worker_args_text(w, COMMON_WORKER_FLAG_WARMUP);
    co->threads = (int)common_worker_args_num(w, COMMON_WORKER_FLAG_THREADS, 0);
    co->page_tokens = (int)common_worker_args_num(w, COMMON_WORKER_FLAG_PAGE_TOKENS, 0);
    co->kv_pages = (int)common_worker_args_num(w, COMMON_WORKER_FLAG_KV_PAGES, 0);
    co->parallel = (int)common_worker_args_num(w, COMMON_WORKER_FLAG_PARALLEL, 0);
    co->max_batch_tokens = (int)common_worker_args_num(w, COMMON_WORKER_FLAG_MAX_BATCH_TOKENS, 0);
    co->max_model_len = (int)common_worker_args_num(w, COMMON_WORKER_FLAG_MAX_MODEL_LEN, 0);
    co->state_checkpoints = (int)common_worker_args_num(w, COMMON_WORKER_FLAG_STATE_CHECKPOINTS,
                                                        co->state_checkpoints);
    co->checkpoint_interval = (int)common_worker_args_num(
        w, COMMON_WORKER_FLAG_CHECKPOINT_INTERVAL, co->checkpoint_interval);
    co->heartbeat_ms =
        (int)common_worker_args_num(w, COMMON_WORKER_FLAG_HEARTBEAT_MS, co->heartbeat_ms);
    co->step_timeout_s =
        (int)common_worker_args_num(w, COMMON_WORKER_FLAG_STEP_TIMEOUT_S, co->step_timeout_s);
    /* common_worker_args_check made --state-dir and --learn-conversations
     * go together */
    co->state_dir = common_worker_args_text(w, COMMON_WORKER_FLAG_STATE_DIR);
    co->spill_gib = common_worker_args_text(w, COMMON_WORKER_FLAG_SPILL_GIB);
    co->restore_mode = common_worker_args_text(w, COMMON_WORKER_FLAG_RESTORE_MODE);
}

/* The flags that are not values of one flag alone. */
static shoal_err check_options(coordinator_options *o, int body_max, int bodies_mib,
                               shoal_diag *diag)
{
    coordinator_http_options *ho = &o->http;
    ho->body_bytes_max = (size_t)body_max;
    ho->bodies_bytes_max = (size_t)bodies_mib << 20;
    size_t one_body = body_max ? (size_t)body_max : COORDINATOR_BODY_BYTES_MAX;
    if (bodies_mib && ho->bodies_bytes_max < one_body)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "--max-body-memory-mib %d cannot hold one body of "
                              "--max-body-bytes (%zu bytes): raise it to %zu or lower "
                              "--max-body-bytes",
                              bodies_mib, one_body, (one_body + (1u << 20) - 1) >> 20);
    if (!o->cluster.runtime_dir && strcmp(o->cluster.workers, "none") == 0)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "--workers none needs --runtime-dir (where the workers find their "
                              "sockets)");
    if (!ho->api_key)
        ho->api_key = getenv("SHOAL_API_KEY");
    if (!ho->model_name)
        ho->model_name = o->cluster.model_dir;
    return SHOAL_OK;
}

/* One of the coordinator's own flags that takes text. SHOAL_ERR_INVALID
 * on a bad value, SHOAL_ERR_NOT_FOUND for a val that is none of these. */
static shoal_err set_text_flag(coordinator_options *o, int c, const char *value, shoal_diag *diag)
{
    coordinator_cluster_options *co = &o->cluster;
    coordinator_http_options *ho = &o->http;
    static const char *const routes[] = {"prefix", "least-loaded", "round-robin"};
    switch (c) {
    case OPT_HOST:
        ho->host = value;
        return SHOAL_OK;
    case OPT_PORT_FILE:
        o->port_file = value;
        return SHOAL_OK;
    case OPT_KEY:
        ho->api_key = value;
        return SHOAL_OK;
    case OPT_ORIGIN:
        if (!coordinator_http_origin_valid(value))
            return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                                  "--allowed-origin '%.64s': expected *, none or an origin such "
                                  "as https://example.com (no spaces or control characters)",
                                  value);
        ho->allowed_origin = strcmp(value, "none") == 0 ? NULL : value;
        return SHOAL_OK;
    case OPT_NAME:
        ho->model_name = value;
        return SHOAL_OK;
    case OPT_MODEL:
        co->model_dir = value;
        return SHOAL_OK;
    case OPT_WORKERS:
        co->workers = value;
        return SHOAL_OK;
    case OPT_RUNTIME:
        co->runtime_dir = value;
        return SHOAL_OK;
    case OPT_CLUSTER:
        co->cluster = value;
        return SHOAL_OK;
    case OPT_WORKER_PATH:
        co->worker_path = value;
        return SHOAL_OK;
    case OPT_ROUTE: /* routes[] in coordinator_route's order */
        for (int i = 0; i < (int)(sizeof routes / sizeof routes[0]); i++)
            if (strcmp(value, routes[i]) == 0) {
                co->route = (coordinator_route)i;
                return SHOAL_OK;
            }
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "--route '%s': expected prefix, least-loaded or round-robin", value);
    default:
        return SHOAL_ERR_NOT_FOUND;
    }
}

/* Parses argv into o. SHOAL_ERR_INVALID with diag on a bad value or a
 * bad combination (o->usage set where the usage should follow; diag empty
 * where getopt_long said it already). --help sets o->help and stops. */
static shoal_err coordinator_parse_args(int argc, char **argv, coordinator_options *o,
                                        shoal_diag *diag)
{
    memset(o, 0, sizeof *o);
    coordinator_cluster_options *co = &o->cluster;
    coordinator_http_options *ho = &o->http;
    coordinator_cluster_options_default(co);
    *ho = (coordinator_http_options){
        .host = "127.0.0.1", .port = 8000, .allowed_origin = "*", .listen_fd = -1};
    o->drain_s = 30;
    default_worker_path(o->worker_path, sizeof o->worker_path);
    co->worker_path = o->worker_path;
    co->runtime_dir = NULL;
    int body_max = 0, bodies_mib = 0, start_s = 600;
    const common_args_int_flag ints[] = {
        {OPT_PORT, "--port", 0, 65535, &ho->port},
        {OPT_HTTP_THREADS, "--http-threads", 1, COORDINATOR_HTTP_THREADS_MAX, &ho->threads},
        {OPT_BODY, "--max-body-bytes", 1024, COORDINATOR_BODY_BYTES_MAX, &body_max},
        {OPT_BODIES, "--max-body-memory-mib", 1, 1 << 20, &bodies_mib},
        {OPT_STREAMS, "--max-streams", 1, COORDINATOR_STREAMS_MAX, &ho->streams_max},
        {OPT_MAX_TOKENS, "--max-tokens-default", 1, SHOAL_CONTEXT_TOKENS_MAX,
         &ho->default_max_tokens},
        {OPT_DRAIN, "--drain-timeout-s", 0, 86400, &o->drain_s},
        {OPT_SEGMENT_PAGES, "--segment-pages", 1, 1 << 24, &co->segment_pages},
        {OPT_DEAD, "--dead-after-ms", 100, 600000, &co->dead_after_ms},
        {OPT_START, "--start-timeout-s", 1, 86400, &start_s},
    };
    common_worker_args w = {0};
    struct option opts[OPT_OWN_COUNT + COMMON_WORKER_FLAG_COUNT + 1];
    memcpy(opts, own_opts, sizeof own_opts);
    common_worker_flags_getopt(opts + OPT_OWN_COUNT, OPT_TABLE);
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c == OPT_HELP) {
            o->help = true;
            return SHOAL_OK;
        }
        if (c == OPT_IGNORE_UNKNOWN) { /* the one switch among the own flags */
            o->http.ignore_unknown_fields = true;
            continue;
        }
        shoal_err err = SHOAL_ERR_NOT_FOUND;
        if (c >= OPT_TABLE && c < OPT_TABLE + COMMON_WORKER_FLAG_COUNT)
            err = common_worker_args_set(&w, c - OPT_TABLE, optarg, diag);
        if (err == SHOAL_ERR_NOT_FOUND)
            err = common_args_int_flags(ints, sizeof ints / sizeof ints[0], c, optarg, diag);
        if (err == SHOAL_ERR_NOT_FOUND)
            err = set_text_flag(o, c, optarg, diag);
        if (err == SHOAL_ERR_NOT_FOUND) { /* getopt_long said which */
            shoal_diag_clear(diag);
            o->usage = true;
            return SHOAL_ERR_INVALID;
        }
        if (err)
            return err;
    }
    if (!co->model_dir || optind < argc) {
        o->usage = true;
        if (!co->model_dir)
            return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                                  "--model DIR is missing (a Hugging Face model directory)");
        return shoal_diag_set(diag, SHOAL_ERR_INVALID, "unexpected argument '%s'", argv[optind]);
    }
    if (common_worker_args_check(&w, diag))
        return SHOAL_ERR_INVALID;
    take_table_flags(&w, co);
    co->start_timeout_ms = start_s * 1000;
    return check_options(o, body_max, bodies_mib, diag);
}

/* Waits for SIGTERM or SIGINT (in sigs, blocked), feeding systemd's
 * watchdog while the cluster is alive; then drains: requests in flight
 * get up to drain_s to end, a second signal ends the wait at once. */
static void serve_until_signal(coordinator_http *http, coordinator_cluster *cluster,
                               const sigset_t *sigs, int drain_s)
{
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
        sig = sigtimedwait(sigs, NULL, &wait);
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
        if (sigtimedwait(sigs, NULL, &step) >= 0) {
            LOG_WARN("second signal: stopping now");
            break;
        }
    }
    if (coordinator_http_active(http) > 0)
        LOG_WARN("%d requests still in flight: cancelled", coordinator_http_active(http));
}

/* Reads the model's tokenizer and chat template, binds the port, starts
 * the workers and serves until a signal; the process's exit status. */
static int coordinator_run(coordinator_options *o)
{
    coordinator_cluster_options *co = &o->cluster;
    coordinator_http_options *ho = &o->http;
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
    if (!co->runtime_dir) {
        if (!mkdtemp(made_dir)) {
            fprintf(stderr, "shoal-coordinator: cannot make a runtime directory: %s\n",
                    strerror(errno));
            return 1;
        }
        co->runtime_dir = made_dir;
        own_dir = true;
    }

    int rc = 1;
    shoal_diag diag = {{0}};
    coordinator_tokenizer *tok = NULL;
    coordinator_chat *chat = NULL;
    coordinator_cluster *cluster = NULL;
    coordinator_http *http = NULL;
    char path[SHOAL_PATH_BYTES_MAX];
    if (common_dir_check(co->model_dir, "--model", &diag)) {
        fprintf(stderr,
                "shoal-coordinator: %s (a Hugging Face model directory: config.json, "
                "tokenizer.json and the weights)\n",
                diag.msg);
        goto out;
    }
    if (common_path_join(path, sizeof path, co->model_dir, "tokenizer.json") ||
        coordinator_tokenizer_open(path, &tok, &diag)) {
        fprintf(stderr, "shoal-coordinator: %s\n", diag.msg[0] ? diag.msg : "path too long");
        goto out;
    }
    shoal_diag chat_diag = {{0}};
    if (common_path_join(path, sizeof path, co->model_dir, "tokenizer_config.json") == 0 &&
        coordinator_chat_open(path, &chat, &chat_diag) != SHOAL_OK)
        LOG_WARN("no chat template: %s; /v1/chat/completions answers 400, /v1/completions "
                 "serves",
                 chat_diag.msg);
    /* the port first: one that is taken is said before any model loads */
    if (coordinator_http_bind(ho->host, ho->port, &ho->listen_fd, &diag)) {
        fprintf(stderr, "shoal-coordinator: %s\n", diag.msg);
        goto out;
    }
    LOG_INFO("starting workers (%s) for %s", co->workers, co->model_dir);
    if (coordinator_cluster_open(co, &cluster, &diag)) {
        fprintf(stderr, "shoal-coordinator: %s\n", diag.msg);
        goto out;
    }
    shoal_err http_err = coordinator_http_open(ho, cluster, tok, chat, &http, &diag);
    ho->listen_fd = -1; /* the server's now, whatever the outcome */
    if (http_err) {
        fprintf(stderr, "shoal-coordinator: %s\n", diag.msg);
        goto out;
    }
    LOG_INFO("serving %s on http://%s:%d (context %d tokens%s)", ho->model_name, ho->host,
             coordinator_http_port(http), coordinator_cluster_max_model_len(cluster),
             ho->api_key && ho->api_key[0] ? ", API key required" : "");
    if (o->port_file && write_port_file(o->port_file, coordinator_http_port(http)))
        goto out;
    serve_until_signal(http, cluster, &sigs, o->drain_s);
    rc = 0;
out:
    coordinator_http_close(http);
    if (ho->listen_fd >= 0)
        close(ho->listen_fd);
    coordinator_cluster_close(cluster);
    coordinator_chat_close(chat);
    coordinator_tokenizer_close(tok);
    if (own_dir)
        remove_runtime_dir(made_dir);
    if (rc == 0)
        LOG_INFO("stopped");
    return rc;
}

int main(int argc, char **argv)
{
    common_log_init("shoal-coordinator", COMMON_LOG_INFO);
    coordinator_options o;
    shoal_diag diag = {{0}};
    if (coordinator_parse_args(argc, argv, &o, &diag)) {
        if (diag.msg[0])
            fprintf(stderr, "shoal-coordinator: %s\n", diag.msg);
        if (o.usage)
            usage(stderr);
        return 2;
    }
    if (o.help) {
        usage(stdout);
        return 0;
    }
    return coordinator_run(&o);
}
