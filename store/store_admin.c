#include "store_admin.h"

#include "common/common_limits.h"
#include "store/store_env.h"
#include "store/store_index.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Record bytes one read transaction of verify covers: a transaction pins
 * its snapshot's pages against reuse by writers, so a long check is cut
 * into transactions of about a quarter second of reading each. */
#define VERIFY_CHUNK_BYTES (256ull << 20)

enum { KEY_BYTES_MAX = 511 }; /* LMDB's default maximum key size */

struct store_admin {
    store_env *env;
};

shoal_err store_admin_open(const char *dir, store_admin **out, shoal_diag *diag)
{
    *out = NULL;
    store_admin *a = calloc(1, sizeof *a);
    if (!a)
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM, "out of memory");
    store_env_options o = {.dir = dir, .create = false};
    shoal_err err = store_env_open(&o, &a->env, diag);
    if (err != SHOAL_OK) {
        free(a);
        return err;
    }
    *out = a;
    return SHOAL_OK;
}

void store_admin_close(store_admin *a)
{
    if (!a)
        return;
    store_env_close(a->env);
    free(a);
}

static const store_index *ix_of(store_admin *a)
{
    return store_env_index(a->env);
}

static void key_of(uint8_t *key, const common_hash *fp, const common_hash *hash)
{
    store_record_key(key, fp, hash);
}

static void split_key(const uint8_t *key, common_hash *fp, common_hash *hash)
{
    memcpy(fp->bytes, key, COMMON_HASH_BYTES);
    memcpy(hash->bytes, key + COMMON_HASH_BYTES, COMMON_HASH_BYTES);
}

/* Whether block key (its entry b) is part 0 of a state checkpoint by the
 * index: a state part (0 tokens) whose parent is no state part (a KV page,
 * or not stored). The rule store_admin_chain's comment states. */
static int is_first_part(MDB_txn *txn, const store_index *ix, const uint8_t *key,
                         const store_block *b, bool *first)
{
    *first = false;
    if (b->tokens != 0)
        return 0;
    uint8_t pk[STORE_KEY_BYTES];
    memcpy(pk, key, COMMON_HASH_BYTES);
    memcpy(pk + COMMON_HASH_BYTES, b->parent.bytes, COMMON_HASH_BYTES);
    store_block p;
    int rc = store_index_block(txn, ix, pk, &p);
    if (rc == MDB_NOTFOUND || (rc == 0 && p.tokens > 0)) {
        *first = true;
        return 0;
    }
    return rc;
}

/* ---- stats ---- */

static int count_reader_line(const char *msg, void *ctx)
{
    int *n = ctx;
    /* a header line, then one line per reader, or "(no active readers)" */
    const char *p = msg;
    while (*p == ' ')
        p++;
    if (isdigit((unsigned char)*p))
        (*n)++;
    return 0;
}

/* KV pages, state parts and checkpoints of the `blocks` database. */
static int count_kinds(MDB_txn *txn, const store_index *ix, store_admin_stats *out)
{
    MDB_cursor *c;
    int rc = store_guard_cursor_open(txn, ix->blocks, &c);
    if (rc != 0)
        return rc;
    MDB_val k, v;
    for (rc = mdb_cursor_get(c, &k, &v, MDB_FIRST); rc == 0;
         rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
        store_block b;
        bool first;
        if (k.mv_size != STORE_KEY_BYTES || !store_block_decode(&v, &b))
            continue; /* verify reports it */
        if (b.tokens > 0) {
            out->kv_pages++;
            out->kv_page_bytes += b.bytes;
            continue;
        }
        out->state_parts++;
        out->state_part_bytes += b.bytes;
        if ((rc = is_first_part(txn, ix, k.mv_data, &b, &first)) != 0)
            break;
        out->checkpoints += first;
    }
    store_guard_cursor_close(c);
    return rc == MDB_NOTFOUND ? 0 : rc;
}

shoal_err store_admin_stats_get(store_admin *a, store_admin_stats *out, shoal_diag *diag)
{
    memset(out, 0, sizeof *out);
    MDB_txn *txn;
    store_guard g;
    shoal_err err = store_env_read_begin(a->env, &txn, &g, diag);
    if (err != SHOAL_OK)
        return err;
    if (sigsetjmp(g.jb, 1) != 0)
        return store_env_read_fault(a->env, &g, diag);
    g.armed = 1;
    uint64_t t[STORE_TOTALS];
    MDB_stat st;
    int rc = store_index_totals(txn, ix_of(a), t);
    if (rc == 0 && (rc = mdb_stat(txn, ix_of(a)->ends, &st)) == 0)
        out->chains = st.ms_entries;
    if (rc == 0 && (rc = mdb_stat(txn, ix_of(a)->records, &st)) == 0) {
        out->records = st.ms_entries;
        out->page_bytes = st.ms_psize;
    }
    if (rc == 0)
        rc = count_kinds(txn, ix_of(a), out);
    /* LMDB's free list is database 0: each value lists page numbers,
     * the first word being their count. */
    if (rc == 0) {
        MDB_cursor *c;
        if ((rc = store_guard_cursor_open(txn, 0, &c)) == 0) {
            MDB_val k, v;
            int r = mdb_cursor_get(c, &k, &v, MDB_FIRST);
            while (r == 0) {
                if (v.mv_size >= sizeof(size_t)) {
                    size_t n;
                    memcpy(&n, v.mv_data, sizeof n);
                    out->free_pages += n;
                }
                r = mdb_cursor_get(c, &k, &v, MDB_NEXT);
            }
            store_guard_cursor_close(c);
            if (r != MDB_NOTFOUND)
                rc = r;
        }
    }
    store_env_read_end(a->env, txn);
    if (rc != 0)
        return store_env_error(a->env, rc, "reading the totals", diag);
    out->format = STORE_FORMAT_VERSION;
    out->bytes = t[STORE_TOTAL_BYTES];
    out->writes = t[STORE_TOTAL_WRITES];
    out->duplicates = t[STORE_TOTAL_DUPLICATES];
    out->evictions = t[STORE_TOTAL_EVICTIONS];
    out->removed = t[STORE_TOTAL_REMOVED];
    out->drops = t[STORE_TOTAL_DROPS];
    out->hits = t[STORE_TOTAL_HITS];
    out->misses = t[STORE_TOTAL_MISSES];
    out->refused = t[STORE_TOTAL_REFUSED];
    out->map_full = t[STORE_TOTAL_MAP_FULL];
    out->write_errors = t[STORE_TOTAL_WRITE_ERRORS];
    MDB_envinfo info;
    if (mdb_env_info(store_env_mdb(a->env), &info) == 0) {
        out->map_bytes = info.me_mapsize;
        out->last_txn = info.me_last_txnid;
    }
    char path[SHOAL_PATH_BYTES_MAX];
    snprintf(path, sizeof path, "%s/%s", store_env_dir(a->env), STORE_ENV_DATA_FILE);
    FILE *f = fopen(path, "rb");
    if (f) {
        if (fseek(f, 0, SEEK_END) == 0)
            out->file_bytes = (uint64_t)ftell(f);
        fclose(f);
    }
    int readers = 0;
    mdb_reader_list(store_env_mdb(a->env), count_reader_line, &readers);
    out->readers = readers;
    return SHOAL_OK;
}

/* ---- chains ---- */

/* Walks from key to its root; fills c (fingerprint and end from key). */
static int walk_chain(MDB_txn *txn, const store_index *ix, const uint8_t *key, store_admin_chain *c)
{
    memset(c, 0, sizeof *c);
    split_key(key, &c->fingerprint, &c->end);
    uint8_t cur[STORE_KEY_BYTES];
    memcpy(cur, key, STORE_KEY_BYTES);
    for (long i = 0; i < SHOAL_STORE_CHAIN_BLOCKS_MAX; i++) {
        store_block b;
        int rc = store_index_block(txn, ix, cur, &b);
        if (rc == MDB_NOTFOUND)
            break;
        if (rc != 0)
            return rc;
        if (i == 0)
            c->used_ms = b.used_ms;
        c->bytes += b.bytes;
        if (b.tokens > 0) {
            c->blocks++;
            c->tokens += (uint64_t)b.tokens;
        } else {
            bool first;
            if ((rc = is_first_part(txn, ix, cur, &b, &first)) != 0)
                return rc;
            c->state_parts++;
            c->state_part_bytes += b.bytes;
            c->checkpoints += first;
        }
        memcpy(c->root.bytes, cur + COMMON_HASH_BYTES, COMMON_HASH_BYTES);
        memcpy(cur + COMMON_HASH_BYTES, b.parent.bytes, COMMON_HASH_BYTES);
    }
    return 0;
}

shoal_err store_admin_chains(store_admin *a, bool (*fn)(void *ctx, const store_admin_chain *c),
                             void *ctx, shoal_diag *diag)
{
    MDB_txn *txn;
    store_guard g;
    shoal_err err = store_env_read_begin(a->env, &txn, &g, diag);
    if (err != SHOAL_OK)
        return err;
    if (sigsetjmp(g.jb, 1) != 0)
        return store_env_read_fault(a->env, &g, diag);
    g.armed = 1;
    MDB_cursor *cur;
    int rc = store_guard_cursor_open(txn, ix_of(a)->ends, &cur);
    if (rc == 0) {
        MDB_val k, v;
        int r = mdb_cursor_get(cur, &k, &v, MDB_FIRST);
        while (r == 0) {
            if (k.mv_size == STORE_END_KEY_BYTES) {
                store_admin_chain c;
                if ((rc = walk_chain(txn, ix_of(a), (const uint8_t *)k.mv_data + 8, &c)) != 0)
                    break;
                if (c.blocks + c.state_parts > 0 && !fn(ctx, &c))
                    break;
            }
            r = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
        }
        if (rc == 0 && r != 0 && r != MDB_NOTFOUND)
            rc = r;
        store_guard_cursor_close(cur);
    }
    store_env_read_end(a->env, txn);
    return store_env_error(a->env, rc, "listing chains", diag);
}

shoal_err store_admin_find(store_admin *a, const char *hex, common_hash *fingerprint,
                           common_hash *hash, shoal_diag *diag)
{
    size_t len = strlen(hex);
    char want[2 * COMMON_HASH_BYTES + 1];
    if (len < 8 || len > 2 * COMMON_HASH_BYTES)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "'%s': give 8 to 64 hex digits of a block hash", hex);
    for (size_t i = 0; i < len; i++) {
        want[i] = (char)tolower((unsigned char)hex[i]);
        if (!isxdigit((unsigned char)want[i]))
            return shoal_diag_set(diag, SHOAL_ERR_INVALID, "'%s' is not hexadecimal", hex);
    }
    want[len] = '\0';
    MDB_txn *txn;
    store_guard g;
    shoal_err err = store_env_read_begin(a->env, &txn, &g, diag);
    if (err != SHOAL_OK)
        return err;
    if (sigsetjmp(g.jb, 1) != 0)
        return store_env_read_fault(a->env, &g, diag);
    g.armed = 1;
    MDB_cursor *cur;
    int matches = 0;
    int rc = store_guard_cursor_open(txn, ix_of(a)->blocks, &cur);
    if (rc == 0) {
        MDB_val k, v;
        int r = mdb_cursor_get(cur, &k, &v, MDB_FIRST);
        for (; r == 0; r = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
            if (k.mv_size != STORE_KEY_BYTES)
                continue;
            common_hash fp, h;
            split_key(k.mv_data, &fp, &h);
            char got[2 * COMMON_HASH_BYTES + 1];
            common_hash_hex(&h, got);
            if (strncmp(got, want, len) == 0) {
                if (matches++ == 0) {
                    *fingerprint = fp;
                    *hash = h;
                }
            }
        }
        if (r != MDB_NOTFOUND)
            rc = r;
        store_guard_cursor_close(cur);
    }
    store_env_read_end(a->env, txn);
    if (rc != 0)
        return store_env_error(a->env, rc, "searching blocks", diag);
    if (matches == 0)
        return shoal_diag_set(diag, SHOAL_ERR_NOT_FOUND,
                              "%s: no stored block's hash starts with %s (shoalctl states "
                              "list shows the chains)",
                              store_env_dir(a->env), want);
    if (matches > 1)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "%s matches %d stored blocks: give more digits", want, matches);
    return SHOAL_OK;
}

shoal_err store_admin_show(store_admin *a, const common_hash *fingerprint, const common_hash *hash,
                           bool (*fn)(void *ctx, const store_admin_block *b), void *ctx,
                           shoal_diag *diag)
{
    MDB_txn *txn;
    store_guard g;
    shoal_err err = store_env_read_begin(a->env, &txn, &g, diag);
    if (err != SHOAL_OK)
        return err;
    if (sigsetjmp(g.jb, 1) != 0)
        return store_env_read_fault(a->env, &g, diag);
    g.armed = 1;
    /* Collect the path end to root, then report it root first. */
    uint8_t *path = NULL;
    long n = 0, cap = 0;
    MDB_cursor *children = NULL;
    uint8_t cur[STORE_KEY_BYTES];
    key_of(cur, fingerprint, hash);
    int rc = store_guard_cursor_open(txn, ix_of(a)->children, &children);
    while (rc == 0 && n < SHOAL_STORE_CHAIN_BLOCKS_MAX) {
        store_block b;
        rc = store_index_block(txn, ix_of(a), cur, &b);
        if (rc == MDB_NOTFOUND) {
            rc = n == 0 ? MDB_NOTFOUND : 0;
            break;
        }
        if (rc != 0)
            break;
        if (n == cap) {
            long grown = cap ? 2 * cap : 64;
            uint8_t *p = realloc(path, (size_t)grown * STORE_KEY_BYTES);
            if (!p) {
                rc = ENOMEM;
                break;
            }
            path = p;
            cap = grown;
        }
        memcpy(path + (size_t)n++ * STORE_KEY_BYTES, cur, STORE_KEY_BYTES);
        memcpy(cur + COMMON_HASH_BYTES, b.parent.bytes, COMMON_HASH_BYTES);
    }
    for (long i = n - 1; rc == 0 && i >= 0; i--) {
        const uint8_t *key = path + (size_t)i * STORE_KEY_BYTES;
        store_block b;
        if ((rc = store_index_block(txn, ix_of(a), key, &b)) != 0)
            break;
        store_admin_block out = {0};
        common_hash fp;
        split_key(key, &fp, &out.hash);
        out.parent = b.parent;
        out.tokens = b.tokens;
        out.bytes = b.bytes;
        out.used_ms = b.used_ms;
        size_t kids = 0;
        if ((rc = store_index_children(children, key, &kids)) != 0)
            break;
        out.children = (int)kids;
        MDB_val k = {STORE_KEY_BYTES, (void *)key}, v;
        store_record_info info;
        out.kind = b.tokens == 0 ? STORE_RECORD_STATE_PART : STORE_RECORD_PAGE;
        if (mdb_get(txn, ix_of(a)->records, &k, &v) == 0 &&
            store_record_check(key, v.mv_data, v.mv_size, NULL, false, &info, NULL) == SHOAL_OK) {
            out.header_ok = true;
            out.kind = info.kind;
            out.part = info.part;
            out.layout = info.layout;
        }
        if (!fn(ctx, &out))
            break;
    }
    if (children)
        store_guard_cursor_close(children);
    store_env_read_end(a->env, txn);
    free(path);
    if (rc == MDB_NOTFOUND)
        return shoal_diag_set(diag, SHOAL_ERR_NOT_FOUND, "%s: block not stored",
                              store_env_dir(a->env));
    return store_env_error(a->env, rc, "walking a chain", diag);
}

/* ---- verify ---- */

/* Calls each(ctx, txn, key, value) for every record, in read transactions
 * of about VERIFY_CHUNK_BYTES each, resuming after the last key seen; txn
 * is the snapshot the record was read in. An LMDB error from each (never
 * MDB_NOTFOUND) ends the scan with it. */
static shoal_err scan_records(store_admin *a,
                              int (*each)(void *ctx, MDB_txn *txn, const MDB_val *k,
                                          const MDB_val *v),
                              void *ctx, shoal_diag *diag)
{
    uint8_t last[KEY_BYTES_MAX];
    volatile size_t last_bytes = 0; /* written after the guard's sigsetjmp */
    for (;;) {
        MDB_txn *txn;
        store_guard g;
        shoal_err err = store_env_read_begin(a->env, &txn, &g, diag);
        if (err != SHOAL_OK)
            return err;
        if (sigsetjmp(g.jb, 1) != 0)
            return store_env_read_fault(a->env, &g, diag);
        g.armed = 1;
        MDB_cursor *cur;
        int rc = store_guard_cursor_open(txn, ix_of(a)->records, &cur);
        MDB_val k, v;
        if (rc == 0) {
            if (last_bytes == 0) {
                rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST);
            } else {
                k.mv_size = last_bytes;
                k.mv_data = last;
                rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
                if (rc == 0 && k.mv_size == last_bytes && memcmp(k.mv_data, last, last_bytes) == 0)
                    rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
            }
            uint64_t chunk = 0;
            while (rc == 0) {
                if ((rc = each(ctx, txn, &k, &v)) != 0)
                    break;
                last_bytes = k.mv_size <= KEY_BYTES_MAX ? k.mv_size : KEY_BYTES_MAX;
                memcpy(last, k.mv_data, last_bytes);
                chunk += v.mv_size;
                if (chunk >= VERIFY_CHUNK_BYTES)
                    break;
                rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
            }
            store_guard_cursor_close(cur);
        }
        store_env_read_end(a->env, txn);
        if (rc == MDB_NOTFOUND)
            return SHOAL_OK;
        if (rc != 0)
            return store_env_error(a->env, rc, "reading records", diag);
    }
}

typedef struct fp_layout {
    common_hash fingerprint;
    store_page_layout layout;
} fp_layout;

typedef struct verify_ctx {
    const store_index *ix;
    void (*fn)(void *ctx, const store_admin_problem *p);
    void *fn_ctx;
    store_admin_verify_result *res;
    fp_layout *layouts;
    int n_layouts, cap_layouts;
    bool nomem;
    /* remove_corrupt collects keys here */
    uint8_t *bad;
    size_t n_bad, cap_bad;
} verify_ctx;

static void report(verify_ctx *c, bool record, const uint8_t *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void report(verify_ctx *c, bool record, const uint8_t *key, const char *fmt, ...)
{
    if (record)
        c->res->corrupt++;
    else
        c->res->index_problems++;
    if (record && c->bad != NULL && key) {
        if (c->n_bad == c->cap_bad) {
            size_t grown = c->cap_bad * 2;
            uint8_t *p = realloc(c->bad, grown * STORE_KEY_BYTES);
            if (!p) {
                c->nomem = true;
                return;
            }
            c->bad = p;
            c->cap_bad = grown;
        }
        memcpy(c->bad + c->n_bad++ * STORE_KEY_BYTES, key, STORE_KEY_BYTES);
    }
    if (!c->fn)
        return;
    store_admin_problem p = {.record = record};
    if (key)
        split_key(key, &p.fingerprint, &p.hash);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p.what, sizeof p.what, fmt, ap);
    va_end(ap);
    c->fn(c->fn_ctx, &p);
}

/* Every record of one model must share one layout: false (reported) when
 * info's differs from the first one seen of its fingerprint. */
static bool check_layout(verify_ctx *c, const uint8_t *key, const store_record_info *info)
{
    for (int i = 0; i < c->n_layouts; i++) {
        const store_page_layout *l = &c->layouts[i].layout;
        if (!common_hash_equal(&c->layouts[i].fingerprint, &info->fingerprint))
            continue;
        if (store_page_layout_equal(l, &info->layout))
            return true;
        report(c, true, key,
               "page layout %d x %d x %d x %d %s differs from its model's other "
               "records (%d x %d x %d x %d %s)",
               info->layout.page_tokens, info->layout.layers, info->layout.kv_heads,
               info->layout.head_dim, shoal_dtype_name(info->layout.dtype), l->page_tokens,
               l->layers, l->kv_heads, l->head_dim, shoal_dtype_name(l->dtype));
        return false;
    }
    if (c->n_layouts == c->cap_layouts) {
        int grown = c->cap_layouts ? 2 * c->cap_layouts : 8;
        fp_layout *p = realloc(c->layouts, (size_t)grown * sizeof *p);
        if (!p) {
            c->nomem = true;
            return true;
        }
        c->layouts = p;
        c->cap_layouts = grown;
    }
    c->layouts[c->n_layouts].fingerprint = info->fingerprint;
    c->layouts[c->n_layouts].layout = info->layout;
    c->n_layouts++;
    return true;
}

/* A state part against its place in the index, in the snapshot txn it was
 * read in: the index's parents of key lead through `above` state parts to
 * the block B the checkpoint follows (a KV page, or not stored); the part
 * must say it is part `above`, be keyed store_record_part_hash(B, above),
 * and name the index's parent as its own (what store_state_read_part
 * expects of it). The walk stops one part past what the header says, so
 * a checkpoint of n parts costs about n^2 / 2 lookups of the index (n is
 * at most SHOAL_STORE_QUEUE_SLOTS_MAX), little beside their checksums.
 * *ok false when it reported the part; a record missing from the index is
 * left to check_index. */
static int check_place(verify_ctx *c, MDB_txn *txn, const uint8_t *key,
                       const store_record_info *info, bool *ok)
{
    *ok = true;
    store_block b;
    int rc = store_index_block(txn, c->ix, key, &b);
    if (rc != 0)
        return rc == MDB_NOTFOUND ? 0 : rc;
    uint8_t cur[STORE_KEY_BYTES];
    memcpy(cur, key, COMMON_HASH_BYTES);
    memcpy(cur + COMMON_HASH_BYTES, b.parent.bytes, COMMON_HASH_BYTES);
    uint32_t above = 0;
    while (above <= info->part.index && above < SHOAL_STORE_CHAIN_BLOCKS_MAX) {
        store_block p;
        rc = store_index_block(txn, c->ix, cur, &p);
        if (rc == MDB_NOTFOUND || (rc == 0 && p.tokens > 0))
            break;
        if (rc != 0)
            return rc;
        above++;
        memcpy(cur + COMMON_HASH_BYTES, p.parent.bytes, COMMON_HASH_BYTES);
    }
    const uint32_t index = info->part.index, parts = info->part.parts;
    common_hash block, want;
    memcpy(block.bytes, cur + COMMON_HASH_BYTES, COMMON_HASH_BYTES);
    store_record_part_hash(&block, index, &want);
    *ok = false;
    if (above < index) {
        report(c, true, key, "header says state part %u of %u; its place in the index is part %u",
               index, parts, above);
    } else if (above > index) {
        report(c, true, key,
               "header says state part %u of %u; its place in the index is past part %u", index,
               parts, index);
    } else if (memcmp(want.bytes, key + COMMON_HASH_BYTES, COMMON_HASH_BYTES) != 0) {
        char bh[2 * COMMON_HASH_BYTES + 1];
        common_hash_hex(&block, bh);
        report(c, true, key, "state part %u of %u not keyed as part %u of block %.16s, its block",
               index, parts, index, bh);
    } else if (!common_hash_equal(&info->parent, &b.parent)) {
        report(c, true, key, "state part %u of %u names another parent than its index entry", index,
               parts);
    } else {
        *ok = true;
    }
    return 0;
}

static int check_record(void *ctx, MDB_txn *txn, const MDB_val *k, const MDB_val *v)
{
    verify_ctx *c = ctx;
    c->res->records++;
    c->res->bytes += v->mv_size;
    if (k->mv_size != STORE_KEY_BYTES) {
        report(c, false, NULL, "a record with a key of %zu bytes (not fingerprint + hash)",
               k->mv_size);
        return 0;
    }
    store_record_info info;
    shoal_diag why;
    if (store_record_check(k->mv_data, v->mv_data, v->mv_size, NULL, true, &info, &why) !=
        SHOAL_OK) {
        report(c, true, k->mv_data, "%s", why.msg);
        return 0;
    }
    if (!check_layout(c, k->mv_data, &info))
        return 0;
    bool ok = true;
    int rc = 0;
    if (info.kind == STORE_RECORD_STATE_PART)
        rc = check_place(c, txn, k->mv_data, &info, &ok);
    if (ok && info.kind == STORE_RECORD_STATE_PART)
        c->res->state_parts++;
    else if (ok)
        c->res->kv_pages++;
    return rc;
}

/* One `blocks` entry: its record, its end entry when it has no children,
 * and its entry among its parent's children. */
static int check_block(MDB_txn *txn, const store_index *ix, MDB_cursor *kids, verify_ctx *c,
                       const uint8_t *key, const store_block *b)
{
    MDB_val rk = {STORE_KEY_BYTES, (void *)key}, rv;
    int rc = mdb_get(txn, ix->records, &rk, &rv);
    if (rc == MDB_NOTFOUND)
        report(c, false, key, "indexed block without a record");
    else if (rc != 0)
        return rc;
    else if (rv.mv_size != b->bytes)
        report(c, false, key, "record of %zu bytes, indexed as %llu", rv.mv_size,
               (unsigned long long)b->bytes);
    size_t n;
    if ((rc = store_index_children(kids, key, &n)) != 0)
        return rc;
    uint8_t ek[STORE_END_KEY_BYTES];
    store_end_key(ek, b->stamp, key);
    MDB_val ekv = {sizeof ek, ek}, ev;
    rc = mdb_get(txn, ix->ends, &ekv, &ev);
    if (rc != 0 && rc != MDB_NOTFOUND)
        return rc;
    if (n == 0 && rc == MDB_NOTFOUND)
        report(c, false, key, "chain end missing from the eviction index");
    if (n > 0 && rc == 0)
        report(c, false, key, "block with %zu children listed as a chain end", n);
    uint8_t pk[STORE_KEY_BYTES];
    memcpy(pk, key, COMMON_HASH_BYTES);
    memcpy(pk + COMMON_HASH_BYTES, b->parent.bytes, COMMON_HASH_BYTES);
    MDB_val pkv = {STORE_KEY_BYTES, pk};
    MDB_val ch = {COMMON_HASH_BYTES, (void *)(key + COMMON_HASH_BYTES)};
    rc = mdb_cursor_get(kids, &pkv, &ch, MDB_GET_BOTH);
    if (rc == MDB_NOTFOUND)
        report(c, false, key, "block missing from its parent's children");
    else if (rc != 0)
        return rc;
    return 0;
}

/* The index against the records, in one snapshot. */
static int check_index(store_admin *a, MDB_txn *txn, verify_ctx *c)
{
    const store_index *ix = ix_of(a);
    MDB_cursor *cur = NULL, *kids = NULL;
    MDB_val k, v;
    uint64_t blocks = 0, bytes = 0;
    int rc = store_guard_cursor_open(txn, ix->children, &kids);
    if (rc != 0)
        return rc;

    if ((rc = store_guard_cursor_open(txn, ix->blocks, &cur)) != 0)
        goto out;
    for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
         rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        store_block b;
        if (k.mv_size != STORE_KEY_BYTES || !store_block_decode(&v, &b)) {
            report(c, false, NULL, "a blocks entry of %zu + %zu bytes", k.mv_size, v.mv_size);
            continue;
        }
        blocks++;
        bytes += b.bytes;
        if ((rc = check_block(txn, ix, kids, c, k.mv_data, &b)) != 0)
            goto out;
    }
    if (rc != MDB_NOTFOUND)
        goto out;
    store_guard_cursor_close(cur);
    cur = NULL;

    /* records: each indexed */
    if ((rc = store_guard_cursor_open(txn, ix->records, &cur)) != 0)
        goto out;
    for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
         rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        if (k.mv_size != STORE_KEY_BYTES)
            continue; /* reported by the record scan */
        store_block b;
        int r = store_index_block(txn, ix, k.mv_data, &b);
        if (r == MDB_NOTFOUND)
            report(c, false, k.mv_data, "record missing from the index");
        else if (r != 0 && r != MDB_CORRUPTED) {
            rc = r;
            goto out;
        }
    }
    if (rc != MDB_NOTFOUND)
        goto out;
    store_guard_cursor_close(cur);
    cur = NULL;

    /* ends: each a stored block, at its stamp, without children */
    if ((rc = store_guard_cursor_open(txn, ix->ends, &cur)) != 0)
        goto out;
    for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
         rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        if (k.mv_size != STORE_END_KEY_BYTES) {
            report(c, false, NULL, "an eviction entry of %zu bytes", k.mv_size);
            continue;
        }
        const uint8_t *key = (const uint8_t *)k.mv_data + 8;
        store_block b;
        int r = store_index_block(txn, ix, key, &b);
        if (r == MDB_NOTFOUND) {
            report(c, false, key, "eviction entry of a block not stored");
            continue;
        }
        if (r != 0) {
            rc = r;
            goto out;
        }
        uint8_t ek[STORE_END_KEY_BYTES];
        store_end_key(ek, b.stamp, key);
        if (memcmp(ek, k.mv_data, 8) != 0)
            report(c, false, key, "eviction entry at a stale last-use stamp");
    }
    if (rc != MDB_NOTFOUND)
        goto out;
    store_guard_cursor_close(cur);
    cur = NULL;

    /* children: each a stored block whose parent is the entry's key */
    for (rc = mdb_cursor_get(kids, &k, &v, MDB_FIRST); rc == 0;
         rc = mdb_cursor_get(kids, &k, &v, MDB_NEXT)) {
        if (k.mv_size != STORE_KEY_BYTES || v.mv_size != COMMON_HASH_BYTES) {
            report(c, false, NULL, "a children entry of %zu + %zu bytes", k.mv_size, v.mv_size);
            continue;
        }
        uint8_t ck[STORE_KEY_BYTES];
        memcpy(ck, k.mv_data, COMMON_HASH_BYTES);
        memcpy(ck + COMMON_HASH_BYTES, v.mv_data, COMMON_HASH_BYTES);
        store_block b;
        int r = store_index_block(txn, ix, ck, &b);
        if (r == MDB_NOTFOUND)
            report(c, false, ck, "children entry of a block not stored");
        else if (r != 0 && r != MDB_CORRUPTED) {
            rc = r;
            goto out;
        } else if (r == 0 && memcmp(b.parent.bytes, (const uint8_t *)k.mv_data + COMMON_HASH_BYTES,
                                    COMMON_HASH_BYTES) != 0)
            report(c, false, ck, "children entry under a block that is not its parent");
    }
    if (rc != MDB_NOTFOUND)
        goto out;

    uint64_t t[STORE_TOTALS];
    if ((rc = store_index_totals(txn, ix, t)) != 0)
        goto out;
    if (t[STORE_TOTAL_RECORDS] != blocks)
        report(c, false, NULL, "totals say %llu records, the index holds %llu",
               (unsigned long long)t[STORE_TOTAL_RECORDS], (unsigned long long)blocks);
    if (t[STORE_TOTAL_BYTES] != bytes)
        report(c, false, NULL, "totals say %llu bytes, the index holds %llu",
               (unsigned long long)t[STORE_TOTAL_BYTES], (unsigned long long)bytes);
    rc = 0;
out:
    if (cur)
        store_guard_cursor_close(cur);
    store_guard_cursor_close(kids);
    return rc;
}

static shoal_err verify_run(store_admin *a, verify_ctx *c, shoal_diag *diag)
{
    memset(c->res, 0, sizeof *c->res);
    shoal_err err = scan_records(a, check_record, c, diag);
    if (err != SHOAL_OK)
        return err;
    MDB_txn *txn;
    store_guard g;
    if ((err = store_env_read_begin(a->env, &txn, &g, diag)) != SHOAL_OK)
        return err;
    if (sigsetjmp(g.jb, 1) != 0)
        return store_env_read_fault(a->env, &g, diag);
    g.armed = 1;
    int rc = check_index(a, txn, c);
    store_env_read_end(a->env, txn);
    if (rc != 0)
        return store_env_error(a->env, rc, "checking the index", diag);
    if (c->nomem)
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM, "out of memory while verifying");
    return SHOAL_OK;
}

shoal_err store_admin_verify(store_admin *a, void (*fn)(void *ctx, const store_admin_problem *p),
                             void *ctx, store_admin_verify_result *res, shoal_diag *diag)
{
    verify_ctx c = {.ix = ix_of(a), .fn = fn, .fn_ctx = ctx, .res = res};
    shoal_err err = verify_run(a, &c, diag);
    free(c.layouts);
    return err;
}

/* ---- removal ---- */

typedef struct remove_ctx {
    const uint8_t *keys;
    size_t n;
    bool chain;
    bool all;
    uint64_t removed;
} remove_ctx;

static int remove_write(void *ctx, store_wtx *w)
{
    remove_ctx *r = ctx;
    r->removed = 0;
    if (r->all)
        return store_wtx_remove_all(w, &r->removed);
    for (size_t i = 0; i < r->n; i++) {
        const uint8_t *key = r->keys + i * STORE_KEY_BYTES;
        int rc = store_wtx_remove(w, key, r->chain, &r->removed);
        if (rc == MDB_NOTFOUND) {
            /* a record the index lost, or one removed with an earlier one */
            MDB_val k = {STORE_KEY_BYTES, (void *)key};
            rc = mdb_del(w->txn, w->ix->records, &k, NULL);
            if (rc == 0)
                r->removed++;
            else if (rc != MDB_NOTFOUND)
                return rc;
            continue;
        }
        if (rc != 0)
            return rc;
    }
    return 0;
}

shoal_err store_admin_remove(store_admin *a, const common_hash *fingerprint,
                             const common_hash *hash, uint64_t *removed, shoal_diag *diag)
{
    uint8_t key[STORE_KEY_BYTES];
    key_of(key, fingerprint, hash);
    MDB_txn *txn;
    store_guard g;
    shoal_err err = store_env_read_begin(a->env, &txn, &g, diag);
    if (err != SHOAL_OK)
        return err;
    if (sigsetjmp(g.jb, 1) != 0)
        return store_env_read_fault(a->env, &g, diag);
    g.armed = 1;
    store_block b;
    int rc = store_index_block(txn, ix_of(a), key, &b);
    store_env_read_end(a->env, txn);
    if (rc == MDB_NOTFOUND)
        return shoal_diag_set(diag, SHOAL_ERR_NOT_FOUND, "%s: block not stored",
                              store_env_dir(a->env));
    remove_ctx r = {.keys = key, .n = 1, .chain = true};
    err = store_env_write(a->env, remove_write, &r, 0, NULL, diag);
    *removed = r.removed;
    return err;
}

shoal_err store_admin_remove_corrupt(store_admin *a, uint64_t *removed, shoal_diag *diag)
{
    *removed = 0;
    store_admin_verify_result res;
    verify_ctx c = {.ix = ix_of(a), .res = &res, .cap_bad = 64};
    c.bad = malloc(c.cap_bad * STORE_KEY_BYTES);
    if (!c.bad)
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM, "out of memory");
    shoal_err err = scan_records(a, check_record, &c, diag);
    if (err == SHOAL_OK && c.nomem)
        err = shoal_diag_set(diag, SHOAL_ERR_NOMEM, "out of memory while verifying");
    if (err == SHOAL_OK && c.n_bad > 0) {
        remove_ctx r = {.keys = c.bad, .n = c.n_bad};
        err = store_env_write(a->env, remove_write, &r, 0, NULL, diag);
        *removed = r.removed;
    }
    free(c.bad);
    free(c.layouts);
    return err;
}

shoal_err store_admin_remove_all(store_admin *a, uint64_t *removed, shoal_diag *diag)
{
    remove_ctx r = {.all = true};
    shoal_err err = store_env_write(a->env, remove_write, &r, 0, NULL, diag);
    *removed = r.removed;
    return err;
}

shoal_err store_admin_reader_check(store_admin *a, int *cleared, shoal_diag *diag)
{
    return store_env_reader_check(a->env, cleared, diag);
}

shoal_err store_admin_compact(const char *dir, const char *to, uint64_t *before, uint64_t *after,
                              shoal_diag *diag)
{
    return store_env_compact(dir, to, before, after, diag);
}
