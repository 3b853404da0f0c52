/* shoalctl workers: pid, device, state, uptime, streams and speed of every
 * worker, read from the segment's worker rows (read-only, no lock).
 *
 * tokens/s is measured: generated_tokens is read twice, --sample seconds
 * apart (default 1), so it is the speed now; "avg" is the count since the
 * process started over its uptime. */
#include "shoalctl.h"
#include "shoalctl_cluster.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: shoalctl workers [--cluster NAME] [--json] [--sample SECONDS]\n"
               "\n"
               "Each worker: pid, device, state, uptime, streams running and waiting, tokens/s\n"
               "over --sample SECONDS (default 1; 0 shows only the average since it started),\n"
               "exits so far, and what is wrong when something is (dead since when, with its\n"
               "exit status; not answering for how long).\n"
               "\n"
               "Exit status: 0 ok, 1 no cluster running (or only its stale segment), 2 usage.\n");
}

#define usage_error(...) shoalctl_usage_error("workers", usage, __VA_ARGS__)

typedef struct sample {
    uint64_t epoch, tokens, ns;
} sample;

static void take(shoalctl_cluster *c, sample *out)
{
    for (int i = 0; i < c->h->workers_max; i++) {
        shm_worker_row *w = shm_segment_worker(c->seg, i);
        out[i].epoch = atomic_load(&w->epoch);
        out[i].tokens = atomic_load(&w->generated_tokens);
        out[i].ns = shoalctl_now_ns();
    }
}

int shoalctl_workers(int argc, char **argv)
{
    const char *name = NULL;
    bool json = false;
    double every = 1.0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return SHOALCTL_OK;
        } else if (strcmp(a, "--json") == 0) {
            json = true;
        } else if (strcmp(a, "--cluster") == 0 || strcmp(a, "--sample") == 0) {
            if (i + 1 >= argc)
                return usage_error("%s needs a value", a);
            const char *v = argv[++i];
            if (strcmp(a, "--cluster") == 0)
                name = v;
            else if (!shoalctl_parse_seconds(v, 0, 3600, &every))
                return usage_error("--sample '%s': give seconds between 0 and 3600", v);
        } else {
            return usage_error("unknown argument '%s'", a);
        }
    }
    shoalctl_cluster c;
    int status = shoalctl_cluster_open("workers", name, false, &c);
    if (status != SHOALCTL_OK)
        return status;
    bool stale = shoalctl_cluster_say_stale("workers", &c, stderr);
    int n = c.h->workers_max;
    sample *a = calloc((size_t)n, sizeof *a), *b = calloc((size_t)n, sizeof *b);
    if (!a || !b) {
        fprintf(stderr, "shoalctl workers: out of memory\n");
        status = SHOALCTL_ERROR;
        goto out;
    }
    take(&c, a);
    if (every > 0 && !stale) {
        shoalctl_watch_signals();
        shoalctl_sleep(every);
    }
    take(&c, b);
    cJSON *root = json ? cJSON_CreateObject() : NULL, *arr = NULL;
    if (json) {
        cJSON_AddStringToObject(root, "cluster", c.name);
        cJSON *co = cJSON_AddObjectToObject(root, "coordinator");
        cJSON_AddNumberToObject(co, "pid", c.coordinator_pid);
        cJSON_AddBoolToObject(co, "running", c.running);
        cJSON_AddNumberToObject(co, "quiet_s", c.quiet_s);
        cJSON_AddNumberToObject(root, "sample_s", every);
        arr = cJSON_AddArrayToObject(root, "workers");
    } else {
        printf("cluster '%s'  coordinator pid %d %s\n", c.name, c.coordinator_pid,
               c.running ? "running" : "GONE (stale segment)");
        printf("%-3s %8s %-6s %-9s %12s %7s %7s %9s %9s %5s  %s\n", "w", "pid", "device", "state",
               "up", "running", "waiting", "tok/s", "avg tok/s", "exits", "health");
    }
    for (int i = 0; i < n; i++) {
        shoalctl_worker wv;
        if (!shoalctl_worker_read(&c, i, &wv))
            continue;
        shm_worker_row *w = shm_segment_worker(c.seg, i);
        bool live = wv.state == SHM_WORKER_READY || wv.state == SHM_WORKER_DRAINING;
        bool measured =
            every > 0 && live && !stale && a[i].epoch == b[i].epoch && b[i].ns > a[i].ns;
        double rate =
            measured ? (double)(b[i].tokens - a[i].tokens) * 1e9 / (double)(b[i].ns - a[i].ns) : 0;
        double avg = live && wv.up_s > 0 ? (double)b[i].tokens / wv.up_s : 0;
        int running = live ? atomic_load(&w->running) : 0,
            waiting = live ? atomic_load(&w->waiting) : 0;
        int exits = atomic_load(&w->exits);
        if (json) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "index", i);
            cJSON_AddNumberToObject(o, "pid", wv.pid);
            cJSON_AddStringToObject(o, "device", w->device);
            cJSON_AddStringToObject(o, "state", wv.state_name);
            cJSON_AddStringToObject(o, "health", wv.health);
            cJSON_AddBoolToObject(o, "pid_alive", wv.pid_alive);
            cJSON_AddNumberToObject(o, "up_s", wv.up_s);
            cJSON_AddNumberToObject(o, "quiet_s", wv.quiet_s);
            cJSON_AddNumberToObject(o, "running", running);
            cJSON_AddNumberToObject(o, "waiting", waiting);
            cJSON_AddNumberToObject(o, "generated_tokens", (double)b[i].tokens);
            if (measured)
                cJSON_AddNumberToObject(o, "tokens_per_s", rate);
            else
                cJSON_AddNullToObject(o, "tokens_per_s");
            cJSON_AddNumberToObject(o, "tokens_per_s_avg", avg);
            cJSON_AddNumberToObject(o, "prompt_tokens", (double)atomic_load(&w->prompt_tokens));
            cJSON_AddNumberToObject(o, "cached_tokens", (double)atomic_load(&w->cached_tokens));
            cJSON_AddNumberToObject(o, "import_tokens", (double)atomic_load(&w->import_tokens));
            cJSON_AddNumberToObject(o, "restore_tokens", (double)atomic_load(&w->restore_tokens));
            cJSON_AddNumberToObject(o, "exits", exits);
            if (wv.last_exit[0])
                cJSON_AddStringToObject(o, "last_exit", wv.last_exit);
            if (wv.state == SHM_WORKER_DEAD || wv.state == SHM_WORKER_DRAINED) {
                cJSON_AddNumberToObject(o, "exit_code", atomic_load(&w->exit_code));
                cJSON_AddNumberToObject(o, "down_s", wv.down_s);
            }
            cJSON_AddBoolToObject(o, "drain", atomic_load(&w->drain) != 0);
            cJSON_AddBoolToObject(o, "managed", atomic_load(&w->managed) != 0);
            cJSON_AddItemToArray(arr, o);
        } else {
            char up[32] = "-", r[16] = "-", g[16] = "-";
            if (live)
                shoalctl_format_span(up, sizeof up, wv.up_s);
            if (measured)
                snprintf(r, sizeof r, "%.1f", rate);
            if (live)
                snprintf(g, sizeof g, "%.1f", avg);
            printf("%-3d %8d %-6.6s %-9s %12s %7d %7d %9s %9s %5d  %s\n", i, wv.pid, w->device,
                   wv.state_name, up, running, waiting, r, g, exits, wv.health);
            if (live && wv.last_exit[0])
                printf("    last exit: %s\n", wv.last_exit);
        }
    }
    if (json) {
        char *text = cJSON_Print(root);
        if (text)
            printf("%s\n", text);
        free(text);
        cJSON_Delete(root);
    }
    status = stale ? SHOALCTL_ERROR : SHOALCTL_OK;
out:
    free(a);
    free(b);
    shoalctl_cluster_close(&c);
    return status;
}
