/* shoalctl states: the LMDB state store of --learn-conversations.
 *
 * Works while the cluster runs (reads are snapshots; rm is a transaction
 * like the workers' own) and after it stopped. compact swaps the file only
 * when no process has the store open; --to writes a copy at any time. */
#include "shoalctl.h"

#include "store/store_admin.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { PROBLEMS_SHOWN_MAX = 100 }; /* verify prints this many, then counts */

static void usage(FILE *f)
{
    fprintf(f, "usage: shoalctl states VERB --state-dir DIR [ARGS]\n"
               "\n"
               "  list                 chains (conversations), least recently used first, with\n"
               "                       their KV page blocks and state checkpoints\n"
               "  show HASH            the blocks of the chain ending at HASH (8+ hex digits)\n"
               "  rm HASH...           remove chains (their blocks that no other chain uses)\n"
               "  rm --corrupt         remove every record that fails verify\n"
               "  rm --all             remove every record\n"
               "  verify               check every record's checksum and the index;\n"
               "                       exit status 1 when anything is wrong\n"
               "  stats                records (KV pages, state parts), bytes, lifetime\n"
               "                       counters, file and map sizes\n"
               "  compact [--to NEW]   rewrite the file without free pages; in place only\n"
               "                       while no process has the store open, or into a new\n"
               "                       directory NEW at any time\n"
               "\n"
               "--state-dir defaults to $SHOAL_STATE_DIR. Exit status: 0 ok, 1 error, 2 usage.\n");
}

#define usage_error(...) shoalctl_usage_error("states", usage, __VA_ARGS__)

static int fail(const shoal_diag *d)
{
    fprintf(stderr, "shoalctl states: %s\n", d->msg);
    return SHOALCTL_ERROR;
}

static void format_bytes(char *buf, size_t n, uint64_t bytes)
{
    if (bytes >= (1ull << 30))
        snprintf(buf, n, "%.2f GiB", (double)bytes / (double)(1ull << 30));
    else if (bytes >= (1ull << 20))
        snprintf(buf, n, "%.1f MiB", (double)bytes / (double)(1ull << 20));
    else if (bytes >= 1024)
        snprintf(buf, n, "%.1f KiB", (double)bytes / 1024.0);
    else
        snprintf(buf, n, "%llu B", (unsigned long long)bytes);
}

static void format_time(char *buf, size_t n, uint64_t ms)
{
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    if (ms == 0 || !localtime_r(&t, &tm) || strftime(buf, n, "%Y-%m-%d %H:%M:%S", &tm) == 0)
        snprintf(buf, n, "-");
}

static void hex16(char *buf, const common_hash *h)
{
    char full[2 * COMMON_HASH_BYTES + 1];
    common_hash_hex(h, full);
    memcpy(buf, full, 16);
    buf[16] = '\0';
}

/* ---- list ---- */

typedef struct list_ctx {
    uint64_t chains, blocks, bytes, checkpoints, state_parts, state_part_bytes;
} list_ctx;

/* BYTES is every record of the chain; STATE BYTES the checkpoints' part. */
#define LIST_ROW "%-16s  %-8s  %6s  %8s  %10s  %11s  %5s  %11s  %s\n"

static bool print_chain(void *ctx, const store_admin_chain *c)
{
    list_ctx *l = ctx;
    char end[17], model[17], size[32], state[32], when[32];
    char blocks[16], tokens[24], checkpoints[16], parts[16];
    hex16(end, &c->end);
    hex16(model, &c->fingerprint);
    model[8] = '\0';
    format_bytes(size, sizeof size, c->bytes);
    format_bytes(state, sizeof state, c->state_part_bytes);
    format_time(when, sizeof when, c->used_ms);
    snprintf(blocks, sizeof blocks, "%d", c->blocks);
    snprintf(tokens, sizeof tokens, "%llu", (unsigned long long)c->tokens);
    snprintf(checkpoints, sizeof checkpoints, "%d", c->checkpoints);
    snprintf(parts, sizeof parts, "%d", c->state_parts);
    printf(LIST_ROW, end, model, blocks, tokens, size, checkpoints, parts, state, when);
    l->chains++;
    l->blocks += (uint64_t)c->blocks;
    l->bytes += c->bytes;
    l->checkpoints += (uint64_t)c->checkpoints;
    l->state_parts += (uint64_t)c->state_parts;
    l->state_part_bytes += c->state_part_bytes;
    return true;
}

static int cmd_list(store_admin *a)
{
    shoal_diag d;
    list_ctx l = {0};
    printf(LIST_ROW, "END", "MODEL", "BLOCKS", "TOKENS", "BYTES", "CHECKPOINTS", "PARTS",
           "STATE BYTES", "LAST USE (oldest first: evicted first)");
    if (store_admin_chains(a, print_chain, &l, &d) != SHOAL_OK)
        return fail(&d);
    char size[32], state[32];
    format_bytes(size, sizeof size, l.bytes);
    format_bytes(state, sizeof state, l.state_part_bytes);
    printf("%llu chain(s), %llu block(s) along them (a shared prefix counts once per chain), "
           "%s; %llu checkpoint(s) in %llu state part(s), %s\n",
           (unsigned long long)l.chains, (unsigned long long)l.blocks, size,
           (unsigned long long)l.checkpoints, (unsigned long long)l.state_parts, state);
    return SHOALCTL_OK;
}

/* ---- show ---- */

typedef struct show_ctx {
    int index;
} show_ctx;

static bool print_block(void *ctx, const store_admin_block *b)
{
    show_ctx *s = ctx;
    char full[2 * COMMON_HASH_BYTES + 1], size[32], when[32], layout[96], kind[32];
    common_hash_hex(&b->hash, full);
    if (b->kind == STORE_RECORD_PAGE)
        snprintf(kind, sizeof kind, "KV page");
    else if (b->header_ok)
        snprintf(kind, sizeof kind, "state %u/%u", b->part.index, b->part.parts);
    else
        snprintf(kind, sizeof kind, "state ?");
    format_bytes(size, sizeof size, b->bytes);
    format_time(when, sizeof when, b->used_ms);
    if (b->header_ok)
        snprintf(layout, sizeof layout, "%d tok x %d layers x %d kv x %d dim %s",
                 b->layout.page_tokens, b->layout.layers, b->layout.kv_heads, b->layout.head_dim,
                 shoal_dtype_name(b->layout.dtype));
    else
        snprintf(layout, sizeof layout, "BAD HEADER (run verify)");
    printf("%5d  %s  %3d  %10s  %-19s  %8d  %-11s  %s\n", s->index++, full, b->tokens, size, when,
           b->children, kind, layout);
    return true;
}

static int cmd_show(store_admin *a, const char *hex)
{
    shoal_diag d;
    common_hash fp, hash;
    if (store_admin_find(a, hex, &fp, &hash, &d) != SHOAL_OK)
        return fail(&d);
    char model[2 * COMMON_HASH_BYTES + 1];
    common_hash_hex(&fp, model);
    printf("model fingerprint %s\n", model);
    printf("%5s  %-64s  %3s  %10s  %-19s  %8s  %-11s  %s\n", "#", "BLOCK HASH", "TOK", "BYTES",
           "LAST USE", "CHILDREN", "KIND", "LAYOUT");
    show_ctx s = {0};
    if (store_admin_show(a, &fp, &hash, print_block, &s, &d) != SHOAL_OK)
        return fail(&d);
    return SHOALCTL_OK;
}

/* ---- rm ---- */

static int cmd_rm(store_admin *a, char **hashes, int n, bool corrupt, bool all)
{
    shoal_diag d;
    uint64_t removed = 0, total = 0;
    if (all) {
        if (store_admin_remove_all(a, &removed, &d) != SHOAL_OK)
            return fail(&d);
        total = removed;
    } else if (corrupt) {
        if (store_admin_remove_corrupt(a, &removed, &d) != SHOAL_OK)
            return fail(&d);
        total = removed;
    } else {
        /* resolve every prefix first, so a typo removes nothing */
        common_hash *fps = calloc((size_t)n, sizeof *fps);
        common_hash *hs = calloc((size_t)n, sizeof *hs);
        int status = SHOALCTL_OK;
        if (!fps || !hs) {
            fprintf(stderr, "shoalctl states: out of memory\n");
            status = SHOALCTL_ERROR;
        }
        for (int i = 0; status == SHOALCTL_OK && i < n; i++)
            if (store_admin_find(a, hashes[i], &fps[i], &hs[i], &d) != SHOAL_OK)
                status = fail(&d);
        for (int i = 0; status == SHOALCTL_OK && i < n; i++) {
            shoal_err err = store_admin_remove(a, &fps[i], &hs[i], &removed, &d);
            if (err == SHOAL_ERR_NOT_FOUND) {
                removed = 0; /* went with an earlier chain of this command */
            } else if (err != SHOAL_OK) {
                status = fail(&d);
            }
            total += removed;
        }
        free(fps);
        free(hs);
        if (status != SHOALCTL_OK)
            return status;
    }
    printf("removed %llu record(s)\n", (unsigned long long)total);
    return SHOALCTL_OK;
}

/* ---- verify ---- */

typedef struct verify_ctx {
    uint64_t shown, hidden;
} verify_ctx;

static void print_problem(void *ctx, const store_admin_problem *p)
{
    verify_ctx *v = ctx;
    if (v->shown >= PROBLEMS_SHOWN_MAX) {
        v->hidden++;
        return;
    }
    v->shown++;
    char model[17], block[2 * COMMON_HASH_BYTES + 1];
    hex16(model, &p->fingerprint);
    model[8] = '\0';
    common_hash_hex(&p->hash, block);
    printf("%s  %s  %s  %s\n", p->record ? "CORRUPT" : "INDEX  ", model, block, p->what);
}

static int cmd_verify(store_admin *a, const char *dir)
{
    shoal_diag d;
    verify_ctx v = {0};
    store_admin_verify_result r;
    if (store_admin_verify(a, print_problem, &v, &r, &d) != SHOAL_OK)
        return fail(&d);
    if (v.hidden)
        printf("... and %llu more\n", (unsigned long long)v.hidden);
    char size[32];
    format_bytes(size, sizeof size, r.bytes);
    printf("checked %llu record(s), %s: %llu KV page(s) and %llu state part(s) sound, "
           "%llu corrupt, %llu index problem(s)\n",
           (unsigned long long)r.records, size, (unsigned long long)r.kv_pages,
           (unsigned long long)r.state_parts, (unsigned long long)r.corrupt,
           (unsigned long long)r.index_problems);
    if (r.corrupt || r.index_problems) {
        /* the fix, named: workers never use a corrupt record, but it takes room */
        if (r.corrupt)
            fprintf(stderr,
                    "shoalctl states: %s holds %llu corrupt record(s); workers refuse them. "
                    "Remove them with: shoalctl states rm --corrupt --state-dir %s\n",
                    dir, (unsigned long long)r.corrupt, dir);
        if (r.index_problems)
            fprintf(stderr,
                    "shoalctl states: the index of %s disagrees with its records; clear the "
                    "store with: shoalctl states rm --all --state-dir %s\n",
                    dir, dir);
        return SHOALCTL_ERROR;
    }
    return SHOALCTL_OK;
}

/* ---- stats ---- */

static int cmd_stats(store_admin *a, const char *dir)
{
    shoal_diag d;
    store_admin_stats s;
    if (store_admin_stats_get(a, &s, &d) != SHOAL_OK)
        return fail(&d);
    char b1[32], b2[32], b3[32], b4[32], b5[32], b6[32];
    format_bytes(b1, sizeof b1, s.bytes);
    format_bytes(b5, sizeof b5, s.kv_page_bytes);
    format_bytes(b6, sizeof b6, s.state_part_bytes);
    format_bytes(b2, sizeof b2, s.file_bytes);
    format_bytes(b3, sizeof b3, s.map_bytes);
    format_bytes(b4, sizeof b4, s.free_pages * s.page_bytes);
    printf("state store  %s (format %u)\n", dir, s.format);
    printf("records      %llu (%s)\n", (unsigned long long)s.records, b1);
    printf("KV pages     %llu (%s)\n", (unsigned long long)s.kv_pages, b5);
    printf("state parts  %llu (%s) of %llu checkpoint(s)\n", (unsigned long long)s.state_parts, b6,
           (unsigned long long)s.checkpoints);
    printf("chains       %llu\n", (unsigned long long)s.chains);
    printf("file         %s on disk, %s free for reuse (compact returns it), map %s\n", b2, b4, b3);
    printf("readers      %d read transaction(s) running\n", s.readers);
    printf("last txn     %llu\n", (unsigned long long)s.last_txn);
    printf("lifetime     writes %llu, duplicates %llu, evictions %llu, removed %llu\n",
           (unsigned long long)s.writes, (unsigned long long)s.duplicates,
           (unsigned long long)s.evictions, (unsigned long long)s.removed);
    printf("             hits %llu, misses %llu, refused %llu\n", (unsigned long long)s.hits,
           (unsigned long long)s.misses, (unsigned long long)s.refused);
    printf("             drops %llu (queue full), map full %llu, write errors %llu\n",
           (unsigned long long)s.drops, (unsigned long long)s.map_full,
           (unsigned long long)s.write_errors);
    return SHOALCTL_OK;
}

/* ---- compact ---- */

static int cmd_compact(const char *dir, const char *to)
{
    shoal_diag d;
    uint64_t before = 0, after = 0;
    if (store_admin_compact(dir, to, &before, &after, &d) != SHOAL_OK)
        return fail(&d);
    char b1[32], b2[32];
    format_bytes(b1, sizeof b1, before);
    format_bytes(b2, sizeof b2, after);
    if (to)
        printf("compacted copy of %s written to %s: %s -> %s\n", dir, to, b1, b2);
    else
        printf("compacted %s: %s -> %s\n", dir, b1, b2);
    return SHOALCTL_OK;
}

int shoalctl_states(int argc, char **argv)
{
    const char *dir = getenv("SHOAL_STATE_DIR");
    const char *to = NULL;
    const char *verb = NULL;
    bool corrupt = false, all = false;
    char **args = calloc((size_t)argc + 1, sizeof *args);
    int n_args = 0;
    int status;
    if (!args) {
        fprintf(stderr, "shoalctl states: out of memory\n");
        return SHOALCTL_ERROR;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            status = SHOALCTL_OK;
            goto out;
        } else if (strcmp(a, "--state-dir") == 0 || strcmp(a, "--to") == 0) {
            if (i + 1 >= argc) {
                status = usage_error("%s needs a directory", a);
                goto out;
            }
            if (strcmp(a, "--to") == 0)
                to = argv[++i];
            else
                dir = argv[++i];
        } else if (strncmp(a, "--state-dir=", 12) == 0) {
            dir = a + 12;
        } else if (strncmp(a, "--to=", 5) == 0) {
            to = a + 5;
        } else if (strcmp(a, "--corrupt") == 0) {
            corrupt = true;
        } else if (strcmp(a, "--all") == 0) {
            all = true;
        } else if (a[0] == '-') {
            status = usage_error("unknown option '%s'", a);
            goto out;
        } else if (!verb) {
            verb = a;
        } else {
            args[n_args++] = argv[i];
        }
    }
    if (!verb) {
        status = usage_error("%s", "which verb?");
        goto out;
    }
    if (!dir || !dir[0]) {
        status = usage_error("%s", "no store named: give --state-dir DIR (or set SHOAL_STATE_DIR)");
        goto out;
    }
    bool is_rm = strcmp(verb, "rm") == 0, is_show = strcmp(verb, "show") == 0;
    bool is_compact = strcmp(verb, "compact") == 0;
    if (!is_rm && !is_show && !is_compact && strcmp(verb, "list") != 0 &&
        strcmp(verb, "verify") != 0 && strcmp(verb, "stats") != 0) {
        status = usage_error("unknown verb '%s'", verb);
        goto out;
    }
    if ((corrupt || all) && !is_rm) {
        status = usage_error("%s", "--corrupt and --all go with rm");
        goto out;
    }
    if (to && !is_compact) {
        status = usage_error("%s", "--to goes with compact");
        goto out;
    }
    if (is_rm && (corrupt + all + (n_args > 0)) != 1) {
        status = usage_error("%s", "rm takes block hashes, or --corrupt, or --all (one kind)");
        goto out;
    }
    if (is_show && n_args != 1) {
        status = usage_error("%s", "show takes one block hash");
        goto out;
    }
    if (!is_rm && !is_show && n_args > 0) {
        status = usage_error("unexpected argument '%s'", args[0]);
        goto out;
    }
    if (is_compact) {
        status = cmd_compact(dir, to);
        goto out;
    }

    shoal_diag d;
    store_admin *a;
    if (store_admin_open(dir, &a, &d) != SHOAL_OK) {
        status = fail(&d);
        goto out;
    }
    if (strcmp(verb, "list") == 0)
        status = cmd_list(a);
    else if (is_show)
        status = cmd_show(a, args[0]);
    else if (is_rm)
        status = cmd_rm(a, args, n_args, corrupt, all);
    else if (strcmp(verb, "verify") == 0)
        status = cmd_verify(a, dir);
    else
        status = cmd_stats(a, dir);
    store_admin_close(a);
out:
    free(args);
    return status;
}
