/* shoalctl drain N / undrain N: take worker N out of service and back.
 *
 * Both only store the worker row's drain flag (one atomic store into the
 * segment, mapped read-write; no lock) and then watch the row. The
 * coordinator's supervisor acts on the flag: it places no new stream on
 * the worker, tells it to SHUTDOWN once its streams have finished (it
 * writes its learned states and exits 0), marks the slot DRAINED and does
 * not restart it; when the flag is cleared it starts the worker again (a
 * worker it did not start, under systemd, is started by its unit). */
#include "shoalctl.h"
#include "shoalctl_cluster.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

enum { DEFAULT_TIMEOUT_S = 600, PROGRESS_EVERY_S = 5 };

static void usage(FILE *f)
{
    fprintf(f,
            "usage: shoalctl drain N [--cluster NAME] [--timeout SECONDS] [--no-wait]\n"
            "       shoalctl undrain N [--cluster NAME] [--timeout SECONDS] [--no-wait]\n"
            "\n"
            "drain: the coordinator places no new stream on worker N; its running streams\n"
            "finish, it writes its learned states and exits, and it is not restarted. Waits\n"
            "until the worker is drained (progress lines on the way), or --timeout passes\n"
            "(default %d s; the drain goes on).\n"
            "undrain: clears it; the coordinator starts the worker again and the command\n"
            "waits until it is ready. A worker started by systemd (shoal-worker@N) is\n"
            "started with systemctl instead.\n"
            "\n"
            "Exit status: 0 done, 1 not done (timeout, the worker failed, no cluster), 2 usage.\n",
            DEFAULT_TIMEOUT_S);
}

#define usage_error(cmd, ...) shoalctl_usage_error(cmd, usage, __VA_ARGS__)

typedef struct args {
    long index;
    const char *name;
    double timeout_s;
    bool wait;
} args;

static int parse(const char *cmd, int argc, char **argv, args *out)
{
    memset(out, 0, sizeof *out);
    out->index = -1;
    out->timeout_s = DEFAULT_TIMEOUT_S;
    out->wait = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return -1;
        } else if (strcmp(a, "--no-wait") == 0) {
            out->wait = false;
        } else if (strcmp(a, "--cluster") == 0 || strcmp(a, "--timeout") == 0) {
            if (i + 1 >= argc)
                return usage_error(cmd, "%s needs a value", a);
            const char *v = argv[++i];
            if (strcmp(a, "--cluster") == 0)
                out->name = v;
            else if (!shoalctl_parse_seconds(v, 0, 7 * 86400, &out->timeout_s))
                return usage_error(cmd, "--timeout '%s': give seconds", v);
        } else if ((a[0] != '-' || (a[1] >= '0' && a[1] <= '9')) && out->index < 0) {
            if (!shoalctl_parse_int(a, 0, SHM_SEGMENT_WORKERS_MAX - 1, &out->index))
                return usage_error(cmd, "'%s' is not a worker index (0 to %d)", a,
                                   SHM_SEGMENT_WORKERS_MAX - 1);
        } else {
            return usage_error(cmd, "unknown argument '%s'", a);
        }
    }
    if (out->index < 0)
        return usage_error(cmd, "which worker? give its index N");
    return SHOALCTL_OK;
}

/* Opens the cluster read-write and finds the worker; says what is wrong
 * otherwise. */
static int open_worker(const char *cmd, const args *a, shoalctl_cluster *c, shm_worker_row **row)
{
    int status = shoalctl_cluster_open(cmd, a->name, true, c);
    if (status != SHOALCTL_OK)
        return status;
    if (shoalctl_cluster_say_stale(cmd, c, stderr)) {
        fprintf(stderr, "shoalctl %s: no coordinator would act on it; nothing changed\n", cmd);
        shoalctl_cluster_close(c);
        return SHOALCTL_ERROR;
    }
    shoalctl_worker wv;
    if (a->index >= c->h->workers_max || !shoalctl_worker_read(c, (int)a->index, &wv)) {
        fprintf(stderr, "shoalctl %s: cluster '%s' has no worker %ld; workers:", cmd, c->name,
                a->index);
        for (int i = 0; i < c->h->workers_max; i++)
            if (shoalctl_worker_read(c, i, &wv))
                fprintf(stderr, " %d (%s)", i, wv.state_name);
        fprintf(stderr, "\n");
        shoalctl_cluster_close(c);
        return SHOALCTL_ERROR;
    }
    *row = shm_segment_worker(c->seg, (int)a->index);
    return SHOALCTL_OK;
}

static bool coordinator_gone(const char *cmd, shoalctl_cluster *c)
{
    if (shoalctl_pid_running(c->coordinator_pid))
        return false;
    fprintf(stderr, "shoalctl %s: the coordinator (pid %d) went away meanwhile\n", cmd,
            c->coordinator_pid);
    return true;
}

int shoalctl_drain(int argc, char **argv)
{
    args a;
    int status = parse("drain", argc, argv, &a);
    if (status)
        return status < 0 ? SHOALCTL_OK : status;
    shoalctl_cluster c;
    shm_worker_row *row;
    if ((status = open_worker("drain", &a, &c, &row)) != SHOALCTL_OK)
        return status;
    int w = (int)a.index;
    shoalctl_worker wv;
    shoalctl_worker_read(&c, w, &wv);
    if (wv.state == SHM_WORKER_DRAINED && atomic_load(&row->drain)) {
        printf("worker %d: already %s\n", w, wv.health);
        goto out;
    }
    /* The one write: the coordinator's supervisor reads the flag every 50 ms. */
    atomic_store(&row->drain, 1);
    printf("worker %d: drain requested (pid %d, %s, %d streams running, %d waiting)\n", w, wv.pid,
           wv.state_name, atomic_load(&row->running), atomic_load(&row->waiting));
    fflush(stdout);
    if (!a.wait)
        goto out;
    shoalctl_watch_signals();
    uint64_t start = shoalctl_now_ns();
    int last_running = -1;
    double last_said = 0;
    for (;;) {
        double t = (double)(shoalctl_now_ns() - start) / 1e9;
        shoalctl_worker_read(&c, w, &wv);
        if (wv.state == SHM_WORKER_DRAINED) {
            int code = atomic_load(&row->exit_code);
            char exit_text[96], took[32];
            shoalctl_exit_text(code, exit_text, sizeof exit_text);
            shoalctl_format_span(took, sizeof took, t);
            if (code == 0) {
                printf("worker %d: drained after %s: its streams finished and it exited cleanly "
                       "(%s); it stays stopped until `shoalctl undrain %d`\n",
                       w, took, exit_text, w);
            } else if (code == SHM_EXIT_UNKNOWN) { /* started by systemd, not the coordinator */
                printf("worker %d: drained after %s: its streams finished and it exited (its "
                       "status is its unit's: systemctl status shoal-worker@%d); it stays "
                       "stopped until `shoalctl undrain %d` and a start of its unit\n",
                       w, took, w, w);
            } else {
                printf("worker %d: stopped during its drain (%s); its streams, if any, moved to "
                       "other workers; it stays stopped until `shoalctl undrain %d`\n",
                       w, exit_text, w);
                status = SHOALCTL_ERROR;
            }
            break;
        }
        if (!atomic_load(&row->drain)) {
            fprintf(stderr, "shoalctl drain: the drain of worker %d was cancelled (undrain)\n", w);
            status = SHOALCTL_ERROR;
            break;
        }
        if (coordinator_gone("drain", &c)) {
            status = SHOALCTL_ERROR;
            break;
        }
        int running = atomic_load(&row->running) + atomic_load(&row->waiting);
        if (running != last_running || t - last_said >= PROGRESS_EVERY_S) {
            if (wv.state == SHM_WORKER_DRAINING && running == 0)
                printf("worker %d: %s, no streams left; waiting for it to exit (%.0f s)\n", w,
                       wv.state_name, t);
            else
                printf("worker %d: %s, %d stream(s) to finish (%.0f s)\n", w, wv.state_name,
                       running, t);
            fflush(stdout);
            last_running = running;
            last_said = t;
        }
        if (t >= a.timeout_s) {
            fprintf(stderr,
                    "shoalctl drain: worker %d still %s after %.0f s with %d stream(s); the drain "
                    "goes on (it stops once they finish); `shoalctl undrain %d` cancels it\n",
                    w, wv.state_name, t, running, w);
            status = SHOALCTL_ERROR;
            break;
        }
        if (!shoalctl_sleep(0.1)) {
            fprintf(stderr,
                    "shoalctl drain: stopped waiting; the drain of worker %d goes on "
                    "(`shoalctl undrain %d` cancels it)\n",
                    w, w);
            status = SHOALCTL_ERROR;
            break;
        }
    }
out:
    shoalctl_cluster_close(&c);
    return status;
}

int shoalctl_undrain(int argc, char **argv)
{
    args a;
    int status = parse("undrain", argc, argv, &a);
    if (status)
        return status < 0 ? SHOALCTL_OK : status;
    shoalctl_cluster c;
    shm_worker_row *row;
    if ((status = open_worker("undrain", &a, &c, &row)) != SHOALCTL_OK)
        return status;
    int w = (int)a.index;
    shoalctl_worker wv;
    shoalctl_worker_read(&c, w, &wv);
    bool was_drained = wv.state == SHM_WORKER_DRAINED;
    uint64_t epoch = atomic_load(&row->epoch);
    if (!atomic_exchange(&row->drain, 0) && !was_drained && wv.state != SHM_WORKER_DRAINING) {
        printf("worker %d: not drained (%s)\n", w, wv.state_name);
        goto out;
    }
    if (was_drained && !atomic_load(&row->managed)) {
        printf("worker %d: undrained; the coordinator did not start it, so start it yourself, "
               "e.g. systemctl start shoal-worker@%d\n",
               w, w);
        goto out;
    }
    printf("worker %d: undrained; %s\n", w,
           was_drained ? "the coordinator starts it again" : "it takes streams again");
    fflush(stdout);
    if (!a.wait)
        goto out;
    shoalctl_watch_signals();
    uint64_t start = shoalctl_now_ns();
    double last_said = 0;
    for (;;) {
        double t = (double)(shoalctl_now_ns() - start) / 1e9;
        shoalctl_worker_read(&c, w, &wv);
        bool back = wv.state == SHM_WORKER_READY && wv.pid_alive &&
                    (!was_drained || atomic_load(&row->epoch) != epoch);
        if (back) {
            printf("worker %d: ready (pid %d) after %.1f s\n", w, wv.pid, t);
            break;
        }
        if (coordinator_gone("undrain", &c)) {
            status = SHOALCTL_ERROR;
            break;
        }
        if (t - last_said >= PROGRESS_EVERY_S) {
            printf("worker %d: %s (%.0f s)\n", w, wv.state_name, t);
            fflush(stdout);
            last_said = t;
        }
        if (t >= a.timeout_s) {
            fprintf(stderr, "shoalctl undrain: worker %d not ready after %.0f s (%s: %s)\n", w, t,
                    wv.state_name, wv.health);
            status = SHOALCTL_ERROR;
            break;
        }
        if (!shoalctl_sleep(0.1)) {
            status = SHOALCTL_ERROR;
            break;
        }
    }
out:
    shoalctl_cluster_close(&c);
    return status;
}
