/* shoalctl streams: every stream the workers hold now (waiting, in
 * prefill, decoding), from the stream tables each worker rewrites after
 * every step (read-only, no lock). */
#include "shoalctl.h"
#include "shoalctl_cluster.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: shoalctl streams [--cluster NAME] [--json]\n"
               "\n"
               "Each stream on each worker: its id (the coordinator's), state (waiting,\n"
               "prefill, decode), prompt tokens, tokens generated so far, KV pages held,\n"
               "and prompt tokens served from cache.\n"
               "\n"
               "Exit status: 0 ok, 1 no cluster running (or only its stale segment), 2 usage.\n");
}

#define usage_error(...) shoalctl_usage_error("streams", usage, __VA_ARGS__)

static const char *stream_state(uint32_t st)
{
    switch (st) {
    case SHM_STREAM_WAITING:
        return "waiting";
    case SHM_STREAM_PREFILL:
        return "prefill";
    case SHM_STREAM_DECODE:
        return "decode";
    }
    return "?";
}

int shoalctl_streams(int argc, char **argv)
{
    const char *name = NULL;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return SHOALCTL_OK;
        } else if (strcmp(a, "--json") == 0) {
            json = true;
        } else if (strcmp(a, "--cluster") == 0) {
            if (i + 1 >= argc)
                return usage_error("%s needs a value", a);
            name = argv[++i];
        } else {
            return usage_error("unknown argument '%s'", a);
        }
    }
    shoalctl_cluster c;
    int status = shoalctl_cluster_open("streams", name, false, &c);
    if (status != SHOALCTL_OK)
        return status;
    bool stale = shoalctl_cluster_say_stale("streams", &c, stderr);
    cJSON *root = NULL, *arr = NULL;
    if (json) {
        root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "cluster", c.name);
        cJSON_AddBoolToObject(root, "running", c.running);
        arr = cJSON_AddArrayToObject(root, "streams");
    } else {
        printf("%-3s %12s %-8s %8s %9s %8s %6s %8s\n", "w", "stream", "state", "prompt",
               "generated", "tokens", "pages", "cached");
    }
    int count = 0;
    for (int w = 0; w < c.h->workers_max; w++) {
        shoalctl_worker wv;
        if (!shoalctl_worker_read(&c, w, &wv))
            continue;
        if (wv.state != SHM_WORKER_READY && wv.state != SHM_WORKER_DRAINING)
            continue; /* a dead worker's table was cleared when it was forgotten */
        const shm_stream_row *rows = shm_segment_streams(c.seg, w);
        for (int i = 0; i < c.h->streams_max; i++) {
            uint64_t id = atomic_load_explicit(&rows[i].id, memory_order_relaxed);
            uint32_t st = atomic_load_explicit(&rows[i].state, memory_order_relaxed);
            if (id == 0 || st == SHM_STREAM_NONE)
                continue;
            int prompt = atomic_load(&rows[i].prompt_tokens), gen = atomic_load(&rows[i].generated);
            int tokens = atomic_load(&rows[i].tokens), pages = atomic_load(&rows[i].pages);
            int cached = atomic_load(&rows[i].cached_tokens);
            count++;
            if (json) {
                cJSON *o = cJSON_CreateObject();
                cJSON_AddNumberToObject(o, "worker", w);
                cJSON_AddNumberToObject(o, "id", (double)id);
                cJSON_AddStringToObject(o, "state", stream_state(st));
                cJSON_AddNumberToObject(o, "prompt_tokens", prompt);
                cJSON_AddNumberToObject(o, "generated", gen);
                cJSON_AddNumberToObject(o, "tokens", tokens);
                cJSON_AddNumberToObject(o, "pages", pages);
                cJSON_AddNumberToObject(o, "cached_tokens", cached);
                cJSON_AddItemToArray(arr, o);
            } else {
                printf("%-3d %12llu %-8s %8d %9d %8d %6d %8d\n", w, (unsigned long long)id,
                       stream_state(st), prompt, gen, tokens, pages, cached);
            }
        }
    }
    if (json) {
        char *text = cJSON_Print(root);
        if (text)
            printf("%s\n", text);
        free(text);
        cJSON_Delete(root);
    } else {
        printf("%d stream(s)\n", count);
    }
    status = stale ? SHOALCTL_ERROR : SHOALCTL_OK;
    shoalctl_cluster_close(&c);
    return status;
}
