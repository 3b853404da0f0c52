/* shoalctl pages: the KV pages of every worker, as the engine keeps them.
 *
 * The numbers come from one pass over each worker's page rows in the
 * segment (the engine's own page state), not from the counts the worker
 * reports after each step; those are shown beside them as "reported".
 * Cached prefixes are grouped into chains: each published page row holds
 * its block hash and its parent's key, so a chain runs from a block whose
 * parent is not resident to one that nothing resident extends. A chain
 * end is a cached conversation or prompt; "most reused" lists the longest
 * prefixes hit that many times (a block whose children were used less).
 *
 * Never takes the segment's lock and maps it read-only: the engine never
 * waits for shoalctl. */
#include "shoalctl.h"
#include "shoalctl_cluster.h"

#include "common/common_limits.h"
#include "store/store_admin.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { BAR_WIDTH = 48 };

static void usage(FILE *f)
{
    fprintf(f,
            "usage: shoalctl pages [--cluster NAME] [--json] [--watch SECONDS] [--state-dir DIR]\n"
            "                      [--page-map]\n"
            "\n"
            "Per worker: total, free, active (held by a stream), cached (a published prefix no\n"
            "stream holds) and leased (being read by another worker) pages and bytes; pages\n"
            "spilled to the state store; the prefix-cache hit rate; the largest and most\n"
            "reused cached prefixes; conversations (chains) resident, and on disk with\n"
            "--state-dir. Reads the segment /dev/shm/shoal.NAME read-only, without its lock.\n"
            "\n"
            "  --cluster NAME     default $SHOAL_CLUSTER, else the one cluster there is\n"
            "  --json             one JSON object (one per line with --watch)\n"
            "  --watch SECONDS    show again every SECONDS until Ctrl-C\n"
            "  --state-dir DIR    also count the conversations in the LMDB store (default\n"
            "                     $SHOAL_STATE_DIR)\n"
            "  --page-map         (JSON) every page's state, one letter per page: '.' free,\n"
            "                     'a' active, 'c' cached\n"
            "\n"
            "Exit status: 0 ok, 1 no cluster running (or only its stale segment), 2 usage.\n");
}

#define usage_error(...) shoalctl_usage_error("pages", usage, __VA_ARGS__)

/* ---- one worker's pages ---- */

typedef struct prefix {
    int page;   /* its last block's page */
    int blocks; /* from the chain's first resident block */
    uint64_t uses;
} prefix;

typedef struct scan {
    int total, free, active, cached, other, leased, hashed, stored;
    int chains, chain_pages, chains_stored;
    prefix largest[SHOALCTL_PREFIXES_SHOWN];
    int n_largest;
    prefix reused[SHOALCTL_PREFIXES_SHOWN];
    int n_reused;
    char *map; /* with --page-map: one letter per page */
} scan;

typedef struct page_view {
    uint32_t state, flags;
    int leases;
    uint64_t key, parent_key, uses;
} page_view;

/* Keeps the SHOALCTL_PREFIXES_SHOWN best of list by (a, b) descending. */
static void keep_best(prefix *list, int *n, prefix p, bool by_uses)
{
    int i = *n;
    for (; i > 0; i--) {
        const prefix *q = &list[i - 1];
        bool better = by_uses
                          ? (p.uses > q->uses || (p.uses == q->uses && p.blocks > q->blocks))
                          : (p.blocks > q->blocks || (p.blocks == q->blocks && p.uses > q->uses));
        if (!better)
            break;
        if (i < SHOALCTL_PREFIXES_SHOWN)
            list[i] = list[i - 1];
    }
    if (i < SHOALCTL_PREFIXES_SHOWN) {
        list[i] = p;
        if (*n < SHOALCTL_PREFIXES_SHOWN)
            (*n)++;
    }
}

/* Links published pages by parent key: parent[i] = the resident page of
 * i's parent block or -1. Open addressing over the keys, 2x the pages. */
static void link_chains(const page_view *v, int n, int32_t *parent)
{
    uint32_t slots = 64;
    while (slots < 2u * (uint32_t)n)
        slots <<= 1;
    int32_t *table = malloc(slots * sizeof *table);
    if (!table) {
        for (int i = 0; i < n; i++)
            parent[i] = -1;
        return;
    }
    for (uint32_t i = 0; i < slots; i++)
        table[i] = -1;
    for (int i = 0; i < n; i++)
        if (v[i].flags & SHM_PAGE_HASHED) {
            uint32_t s = (uint32_t)v[i].key & (slots - 1);
            while (table[s] >= 0)
                s = (s + 1) & (slots - 1);
            table[s] = i;
        }
    for (int i = 0; i < n; i++) {
        parent[i] = -1;
        if (!(v[i].flags & SHM_PAGE_HASHED))
            continue;
        for (uint32_t s = (uint32_t)v[i].parent_key & (slots - 1); table[s] >= 0;
             s = (s + 1) & (slots - 1))
            if (v[table[s]].key == v[i].parent_key && table[s] != i) {
                parent[i] = table[s];
                break;
            }
    }
    free(table);
}

static bool scan_worker(shm_segment *seg, int w, bool want_map, scan *out)
{
    memset(out, 0, sizeof *out);
    shm_worker_row *row = shm_segment_worker(seg, w);
    int n = atomic_load(&row->pages_total);
    int max = shm_segment_header_of(seg)->pages_max;
    if (n < 0 || n > max)
        n = max; /* a torn read; the rows are there either way */
    out->total = n;
    if (want_map) {
        out->map = malloc((size_t)n + 1);
        if (!out->map)
            return false;
        out->map[n] = '\0';
    }
    if (n == 0)
        return true;
    page_view *v = calloc((size_t)n, sizeof *v);
    int32_t *parent = malloc((size_t)n * sizeof *parent);
    int32_t *depth = malloc((size_t)n * sizeof *depth);
    uint64_t *child_uses = calloc((size_t)n, sizeof *child_uses);
    int32_t *children = calloc((size_t)n, sizeof *children);
    int32_t *path = malloc((size_t)n * sizeof *path);
    bool ok = v && parent && depth && child_uses && children && path;
    if (!ok)
        goto out;
    const shm_page_row *rows = shm_segment_pages(seg, w);
    for (int p = 0; p < n; p++) {
        /* relaxed loads: a row may change under us, never tear a word */
        page_view *pv = &v[p];
        pv->state = atomic_load_explicit(&rows[p].state, memory_order_relaxed);
        pv->flags = atomic_load_explicit(&rows[p].flags, memory_order_relaxed);
        pv->leases = atomic_load_explicit(&rows[p].leases, memory_order_relaxed);
        pv->uses = atomic_load_explicit(&rows[p].uses, memory_order_relaxed);
        pv->parent_key = atomic_load_explicit(&rows[p].parent_key, memory_order_relaxed);
        common_hash h = rows[p].hash;
        pv->key = common_hash_u64(&h);
        char letter = '?';
        switch (pv->state) {
        case SHM_PAGE_FREE:
            out->free++;
            letter = '.';
            break;
        case SHM_PAGE_ACTIVE:
            out->active++;
            letter = 'a';
            break;
        case SHM_PAGE_CACHED:
            out->cached++;
            letter = 'c';
            break;
        default:
            out->other++;
        }
        if (out->map)
            out->map[p] = letter;
        out->leased += pv->leases > 0;
        if (pv->state != SHM_PAGE_FREE && (pv->flags & SHM_PAGE_HASHED)) {
            out->hashed++;
            out->stored += (pv->flags & SHM_PAGE_STORED) != 0;
        } else {
            pv->flags = 0; /* not part of any chain */
        }
    }
    link_chains(v, n, parent);
    /* depth of each published page along its chain, iteratively; a loop
     * (a row caught mid-change) ends where it closes */
    for (int i = 0; i < n; i++)
        depth[i] = v[i].flags ? 0 : -1;
    for (int i = 0; i < n; i++) {
        if (depth[i] != 0)
            continue;
        int len = 0;
        for (int p = i; p >= 0 && depth[p] == 0 && len < n; p = parent[p]) {
            depth[p] = -2; /* on the path */
            path[len++] = p;
        }
        int last = path[len - 1];
        int base = parent[last] >= 0 && depth[parent[last]] > 0 ? depth[parent[last]] : 0;
        for (int k = len - 1; k >= 0; k--)
            depth[path[k]] = base + (len - k);
    }
    for (int i = 0; i < n; i++)
        if (v[i].flags && parent[i] >= 0) {
            children[parent[i]]++;
            if (v[i].uses > child_uses[parent[i]])
                child_uses[parent[i]] = v[i].uses;
        }
    for (int i = 0; i < n; i++) {
        if (!v[i].flags)
            continue;
        prefix p = {i, depth[i], v[i].uses};
        if (children[i] == 0) { /* a chain end */
            out->chains++;
            out->chain_pages += depth[i];
            out->chains_stored += (v[i].flags & SHM_PAGE_STORED) != 0;
            keep_best(out->largest, &out->n_largest, p, false);
        }
        if (v[i].uses > 0 && v[i].uses > child_uses[i])
            keep_best(out->reused, &out->n_reused, p, true);
    }
out:
    free(v);
    free(parent);
    free(depth);
    free(child_uses);
    free(children);
    free(path);
    return ok;
}

/* ---- the store ---- */

typedef struct store_view {
    const char *dir;
    bool ok;
    char error[SHOAL_DIAG_BYTES];
    store_admin_stats st;
} store_view;

static void read_store(const char *dir, store_view *out)
{
    memset(out, 0, sizeof *out);
    out->dir = dir;
    if (!dir)
        return;
    store_admin *a = NULL;
    shoal_diag d = {{0}};
    shoal_err err = store_admin_open(dir, &a, &d);
    if (!err)
        err = store_admin_stats_get(a, &out->st, &d);
    store_admin_close(a);
    out->ok = err == SHOAL_OK;
    if (err)
        snprintf(out->error, sizeof out->error, "%s", d.msg);
}

/* ---- output ---- */

static void hash_hex(shm_segment *seg, int w, int page, char out[2 * COMMON_HASH_BYTES + 1])
{
    common_hash h = shm_segment_pages(seg, w)[page].hash;
    common_hash_hex(&h, out);
}

static cJSON *json_prefixes(shm_segment *seg, int w, const prefix *list, int n, int page_tokens,
                            uint64_t page_bytes)
{
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        char hex[2 * COMMON_HASH_BYTES + 1];
        hash_hex(seg, w, list[i].page, hex);
        cJSON_AddStringToObject(o, "end", hex);
        cJSON_AddNumberToObject(o, "pages", list[i].blocks);
        if (page_tokens > 0)
            cJSON_AddNumberToObject(o, "tokens", (double)list[i].blocks * page_tokens);
        cJSON_AddNumberToObject(o, "bytes", (double)list[i].blocks * (double)page_bytes);
        cJSON_AddNumberToObject(o, "uses", (double)list[i].uses);
        cJSON_AddItemToArray(arr, o);
    }
    return arr;
}

static void add_counts(cJSON *o, const char *name, const scan *s, double unit)
{
    cJSON *c = cJSON_AddObjectToObject(o, name);
    cJSON_AddNumberToObject(c, "total", s->total * unit);
    cJSON_AddNumberToObject(c, "free", s->free * unit);
    cJSON_AddNumberToObject(c, "active", s->active * unit);
    cJSON_AddNumberToObject(c, "cached", s->cached * unit);
    cJSON_AddNumberToObject(c, "leased", s->leased * unit);
    cJSON_AddNumberToObject(c, "hashed", s->hashed * unit);
    cJSON_AddNumberToObject(c, "stored", s->stored * unit);
}

static cJSON *json_worker(shoalctl_cluster *c, const shoalctl_worker *wv, const scan *s,
                          bool with_map)
{
    shm_worker_row *row = shm_segment_worker(c->seg, wv->index);
    uint64_t page_bytes = atomic_load(&row->page_bytes);
    int page_tokens = atomic_load(&row->page_tokens);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "index", wv->index);
    cJSON_AddNumberToObject(o, "pid", wv->pid);
    cJSON_AddStringToObject(o, "device", row->device);
    cJSON_AddStringToObject(o, "state", wv->state_name);
    cJSON_AddStringToObject(o, "health", wv->health);
    cJSON_AddBoolToObject(o, "drain", atomic_load(&row->drain) != 0);
    cJSON_AddNumberToObject(o, "exits", atomic_load(&row->exits));
    if (wv->last_exit[0])
        cJSON_AddStringToObject(o, "last_exit", wv->last_exit);
    cJSON_AddNumberToObject(o, "page_bytes", (double)page_bytes);
    cJSON_AddNumberToObject(o, "page_tokens", page_tokens);
    add_counts(o, "pages", s, 1.0);
    add_counts(o, "bytes", s, (double)page_bytes);
    cJSON *rep = cJSON_AddObjectToObject(o, "reported");
    cJSON_AddNumberToObject(rep, "total", atomic_load(&row->pages_total));
    cJSON_AddNumberToObject(rep, "free", atomic_load(&row->pages_free));
    cJSON_AddNumberToObject(rep, "active", atomic_load(&row->pages_active));
    cJSON_AddNumberToObject(rep, "cached", atomic_load(&row->pages_cached));
    uint64_t spilled = atomic_load(&row->spilled_pages);
    cJSON_AddNumberToObject(o, "spilled_pages", (double)spilled);
    cJSON_AddNumberToObject(o, "spilled_bytes", (double)spilled * (double)page_bytes);
    uint64_t lookups = atomic_load(&row->prefix_lookups), hits = atomic_load(&row->prefix_hits);
    cJSON *px = cJSON_AddObjectToObject(o, "prefix_cache");
    cJSON_AddNumberToObject(px, "lookups", (double)lookups);
    cJSON_AddNumberToObject(px, "hits", (double)hits);
    if (lookups)
        cJSON_AddNumberToObject(px, "hit_rate", (double)hits / (double)lookups);
    else
        cJSON_AddNullToObject(px, "hit_rate");
    uint64_t slot_bytes = atomic_load(&row->slot_bytes);
    cJSON *st = cJSON_AddObjectToObject(o, "state_slots");
    int slots = atomic_load(&row->state_slots), ck_max = atomic_load(&row->checkpoints_max);
    int ck_held = atomic_load(&row->checkpoints_held);
    cJSON_AddNumberToObject(st, "slot_bytes", (double)slot_bytes);
    cJSON_AddNumberToObject(st, "streams", slots);
    cJSON_AddNumberToObject(st, "streams_running", atomic_load(&row->states_running));
    cJSON_AddNumberToObject(st, "checkpoints", ck_max);
    cJSON_AddNumberToObject(st, "checkpoints_held", ck_held);
    cJSON_AddNumberToObject(st, "checkpoint_hits", (double)atomic_load(&row->checkpoint_hits));
    cJSON_AddNumberToObject(st, "bytes", (double)(slots + ck_max) * (double)slot_bytes);
    cJSON_AddNumberToObject(st, "checkpoint_bytes_held", (double)ck_held * (double)slot_bytes);
    cJSON *ch = cJSON_AddObjectToObject(o, "chains");
    cJSON_AddNumberToObject(ch, "resident", s->chains);
    cJSON_AddNumberToObject(ch, "pages", s->hashed);
    cJSON_AddNumberToObject(ch, "ends_stored", s->chains_stored);
    cJSON_AddItemToObject(
        o, "largest_prefixes",
        json_prefixes(c->seg, wv->index, s->largest, s->n_largest, page_tokens, page_bytes));
    cJSON_AddItemToObject(
        o, "most_reused_prefixes",
        json_prefixes(c->seg, wv->index, s->reused, s->n_reused, page_tokens, page_bytes));
    if (with_map && s->map)
        cJSON_AddStringToObject(o, "page_map", s->map);
    return o;
}

/* "[####======.....]": active, cached, free in proportion. */
static void bar(char *out, const scan *s)
{
    int total = s->total > 0 ? s->total : 1;
    int a = (int)((long long)s->active * BAR_WIDTH / total);
    int ac = (int)((long long)(s->active + s->cached) * BAR_WIDTH / total);
    if (s->active > 0 && a == 0)
        a = 1; /* anything held shows */
    if (s->cached > 0 && ac <= a)
        ac = a + 1;
    if (ac > BAR_WIDTH)
        ac = BAR_WIDTH;
    if (a > ac)
        a = ac;
    int k = 0;
    out[k++] = '[';
    for (int i = 0; i < BAR_WIDTH; i++)
        out[k++] = i < a ? '#' : i < ac ? '=' : '.';
    out[k++] = ']';
    out[k] = '\0';
}

static void print_prefixes(shm_segment *seg, int w, const char *title, const prefix *list, int n,
                           int page_tokens, uint64_t page_bytes, bool uses)
{
    if (n == 0)
        return;
    printf("    %s:\n", title);
    for (int i = 0; i < n; i++) {
        char hex[2 * COMMON_HASH_BYTES + 1], size[32];
        hash_hex(seg, w, list[i].page, hex);
        hex[16] = '\0';
        shoalctl_format_bytes(size, sizeof size, (uint64_t)list[i].blocks * page_bytes);
        printf("      %s  %5d pages %7lld tokens %10s", hex, list[i].blocks,
               (long long)list[i].blocks * page_tokens, size);
        if (uses)
            printf("  reused %llu times", (unsigned long long)list[i].uses);
        printf("\n");
    }
}

static void print_worker(shoalctl_cluster *c, const shoalctl_worker *wv, const scan *s)
{
    shm_worker_row *row = shm_segment_worker(c->seg, wv->index);
    uint64_t pb = atomic_load(&row->page_bytes);
    int pt = atomic_load(&row->page_tokens);
    char up[32], b_total[32], b_act[32], b_cache[32], b_free[32], b_spill[32];
    shoalctl_format_span(up, sizeof up, wv->up_s);
    printf("\nworker %d  %s  pid %d  %s", wv->index, row->device, wv->pid, wv->state_name);
    if (wv->state == SHM_WORKER_READY || wv->state == SHM_WORKER_DRAINING)
        printf("  up %s", up);
    if (strcmp(wv->health, "ok") != 0)
        printf("  (%s)", wv->health);
    printf("\n");
    if (wv->last_exit[0] && (wv->state == SHM_WORKER_READY || wv->state == SHM_WORKER_DRAINING))
        printf("  restarted: %d exit(s), the last %s\n", atomic_load(&row->exits), wv->last_exit);
    if (s->total == 0) {
        printf("  no pages (no process holds this slot)\n");
        return;
    }
    shoalctl_format_bytes(b_total, sizeof b_total, (uint64_t)s->total * pb);
    shoalctl_format_bytes(b_act, sizeof b_act, (uint64_t)s->active * pb);
    shoalctl_format_bytes(b_cache, sizeof b_cache, (uint64_t)s->cached * pb);
    shoalctl_format_bytes(b_free, sizeof b_free, (uint64_t)s->free * pb);
    char one[32];
    shoalctl_format_bytes(one, sizeof one, pb);
    printf("  pages   %d of %s (%d tokens each) = %s\n", s->total, one, pt, b_total);
    printf("          active %d (%s)  cached %d (%s)  free %d (%s)  leased %d\n", s->active, b_act,
           s->cached, b_cache, s->free, b_free, s->leased);
    uint64_t spilled = atomic_load(&row->spilled_pages);
    shoalctl_format_bytes(b_spill, sizeof b_spill, spilled * pb);
    printf("          spilled to the store %llu (%s); on disk too now %d\n",
           (unsigned long long)spilled, b_spill, s->stored);
    uint64_t lookups = atomic_load(&row->prefix_lookups), hits = atomic_load(&row->prefix_hits);
    if (lookups)
        printf("  prefix cache  %llu of %llu block lookups hit (%.1f%%)\n",
               (unsigned long long)hits, (unsigned long long)lookups,
               100.0 * (double)hits / (double)lookups);
    else
        printf("  prefix cache  no lookups yet\n");
    uint64_t slot_bytes = atomic_load(&row->slot_bytes);
    if (slot_bytes) {
        int slots = atomic_load(&row->state_slots), ck_max = atomic_load(&row->checkpoints_max);
        int ck_held = atomic_load(&row->checkpoints_held);
        char b_slot[32], b_states[32], b_held[32];
        shoalctl_format_bytes(b_slot, sizeof b_slot, slot_bytes);
        shoalctl_format_bytes(b_states, sizeof b_states, (uint64_t)(slots + ck_max) * slot_bytes);
        shoalctl_format_bytes(b_held, sizeof b_held, (uint64_t)ck_held * slot_bytes);
        printf("  states  %d stream slots + %d checkpoint slots of %s = %s\n", slots, ck_max,
               b_slot, b_states);
        printf("          streams holding one %d; checkpoints held %d (%s), prefix hits from "
               "one %llu\n",
               atomic_load(&row->states_running), ck_held, b_held,
               (unsigned long long)atomic_load(&row->checkpoint_hits));
    }
    printf("  chains  %d resident (conversations or prompts, %d pages; %d ends also on disk)\n",
           s->chains, s->hashed, s->chains_stored);
    print_prefixes(c->seg, wv->index, "largest cached prefixes (end hash, size)", s->largest,
                   s->n_largest, pt, pb, false);
    print_prefixes(c->seg, wv->index, "most reused prefixes", s->reused, s->n_reused, pt, pb, true);
}

/* One look at the cluster. Returns the exit status. */
static int show(const char *name, bool json, bool with_map, const char *state_dir, bool watching)
{
    shoalctl_cluster c;
    int status = shoalctl_cluster_open("pages", name, false, &c);
    if (status != SHOALCTL_OK)
        return status;
    bool stale = shoalctl_cluster_say_stale("pages", &c, stderr);
    store_view store;
    read_store(state_dir, &store);
    int workers = c.h->workers_max;
    shoalctl_worker *wv = calloc((size_t)workers, sizeof *wv);
    scan *sc = calloc((size_t)workers, sizeof *sc);
    bool *used = calloc((size_t)workers, sizeof *used);
    if (!wv || !sc || !used) {
        fprintf(stderr, "shoalctl pages: out of memory\n");
        status = SHOALCTL_ERROR;
        goto out;
    }
    int shown = 0;
    for (int i = 0; i < workers; i++) {
        used[i] = shoalctl_worker_read(&c, i, &wv[i]);
        if (used[i] && !scan_worker(c.seg, i, with_map, &sc[i])) {
            fprintf(stderr, "shoalctl pages: out of memory\n");
            status = SHOALCTL_ERROR;
            goto out;
        }
        shown += used[i];
    }
    if (json) {
        cJSON *root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "cluster", c.name);
        cJSON *co = cJSON_AddObjectToObject(root, "coordinator");
        cJSON_AddNumberToObject(co, "pid", c.coordinator_pid);
        cJSON_AddBoolToObject(co, "running", c.running);
        cJSON_AddNumberToObject(co, "quiet_s", c.quiet_s);
        cJSON *arr = cJSON_AddArrayToObject(root, "workers");
        for (int i = 0; i < workers; i++)
            if (used[i])
                cJSON_AddItemToArray(arr, json_worker(&c, &wv[i], &sc[i], with_map));
        cJSON *st = cJSON_AddObjectToObject(root, "store");
        if (!state_dir) {
            cJSON_AddNullToObject(st, "dir");
        } else {
            cJSON_AddStringToObject(st, "dir", state_dir);
            if (store.ok) {
                cJSON_AddNumberToObject(st, "chains", (double)store.st.chains);
                cJSON_AddNumberToObject(st, "records", (double)store.st.records);
                cJSON_AddNumberToObject(st, "bytes", (double)store.st.bytes);
            } else {
                cJSON_AddStringToObject(st, "error", store.error);
            }
        }
        char *text = watching ? cJSON_PrintUnformatted(root) : cJSON_Print(root);
        if (text)
            printf("%s\n", text);
        free(text);
        cJSON_Delete(root);
    } else {
        char since[32];
        shoalctl_format_span(since, sizeof since,
                             (double)(shoalctl_now_ns() - c.h->created_ns) / 1e9);
        printf("cluster '%s'  coordinator pid %d %s  segment made %s ago  %d worker(s)\n", c.name,
               c.coordinator_pid, c.running ? "running" : "GONE (stale segment)", since, shown);
        printf("%-3s %-6s %-9s %7s  %-*s %6s %6s\n", "w", "device", "state", "pages", BAR_WIDTH + 2,
               "#=active  ==cached  .=free", "hit", "chains");
        for (int i = 0; i < workers; i++) {
            if (!used[i])
                continue;
            shm_worker_row *row = shm_segment_worker(c.seg, i);
            char b[BAR_WIDTH + 3], hit[16];
            uint64_t lookups = atomic_load(&row->prefix_lookups);
            if (lookups)
                snprintf(hit, sizeof hit, "%.0f%%",
                         100.0 * (double)atomic_load(&row->prefix_hits) / (double)lookups);
            else
                snprintf(hit, sizeof hit, "-");
            if (sc[i].total > 0) {
                bar(b, &sc[i]);
                printf("%-3d %-6.6s %-9s %7d  %s %6s %6d%s\n", i, row->device, wv[i].state_name,
                       sc[i].total, b, hit, sc[i].chains,
                       wv[i].gone   ? "  GONE"
                       : wv[i].late ? "  LATE"
                                    : "");
            } else {
                printf("%-3d %-6.6s %-9s %7s  %s\n", i, row->device, wv[i].state_name, "-",
                       wv[i].health);
            }
        }
        for (int i = 0; i < workers; i++)
            if (used[i])
                print_worker(&c, &wv[i], &sc[i]);
        if (!state_dir)
            printf("\nconversations on disk: n/a (give --state-dir)\n");
        else if (store.ok) {
            char size[32];
            shoalctl_format_bytes(size, sizeof size, store.st.bytes);
            printf("\nconversations on disk (%s): %llu chains, %llu pages, %s\n", state_dir,
                   (unsigned long long)store.st.chains, (unsigned long long)store.st.records, size);
        } else
            printf("\nconversations on disk: cannot read %s: %s\n", state_dir, store.error);
    }
    if (shown == 0 && !json)
        printf("no worker has joined this cluster yet\n");
    status = stale || (state_dir && !store.ok) ? SHOALCTL_ERROR : SHOALCTL_OK;
out:
    for (int i = 0; sc && i < workers; i++)
        free(sc[i].map);
    free(wv);
    free(sc);
    free(used);
    shoalctl_cluster_close(&c);
    return status;
}

int shoalctl_pages(int argc, char **argv)
{
    const char *name = NULL, *state_dir = getenv("SHOAL_STATE_DIR");
    bool json = false, with_map = false;
    double watch = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return SHOALCTL_OK;
        } else if (strcmp(a, "--json") == 0) {
            json = true;
        } else if (strcmp(a, "--page-map") == 0) {
            with_map = true;
        } else if (strcmp(a, "--cluster") == 0 || strcmp(a, "--state-dir") == 0 ||
                   strcmp(a, "--watch") == 0) {
            if (i + 1 >= argc)
                return usage_error("%s needs a value", a);
            const char *v = argv[++i];
            if (strcmp(a, "--cluster") == 0)
                name = v;
            else if (strcmp(a, "--state-dir") == 0)
                state_dir = v;
            else if (!shoalctl_parse_seconds(v, 0.1, 86400, &watch))
                return usage_error("--watch '%s': give seconds between 0.1 and 86400", v);
        } else {
            return usage_error("unknown argument '%s'", a);
        }
    }
    if (state_dir && !*state_dir)
        state_dir = NULL;
    if (watch <= 0)
        return show(name, json, with_map, state_dir, false);
    shoalctl_watch_signals();
    bool tty = !json && isatty(STDOUT_FILENO);
    int status = SHOALCTL_OK;
    do {
        if (tty)
            printf("\033[H\033[2J"); /* home, clear */
        status = show(name, json, with_map, state_dir, true);
        if (!json)
            printf("\n(every %g s; Ctrl-C stops)\n", watch);
        fflush(stdout);
        if (status == SHOALCTL_USAGE)
            return status;
    } while (shoalctl_sleep(watch));
    return SHOALCTL_OK;
}
