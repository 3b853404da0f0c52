#include "store_index.h"

#include "common/common_limits.h"

#include <string.h>
#include <time.h>

const char *const store_total_names[STORE_TOTALS] = {
    [STORE_TOTAL_BYTES] = "bytes",
    [STORE_TOTAL_RECORDS] = "records",
    [STORE_TOTAL_CLOCK] = "clock",
    [STORE_TOTAL_WRITES] = "writes",
    [STORE_TOTAL_DUPLICATES] = "duplicates",
    [STORE_TOTAL_EVICTIONS] = "evictions",
    [STORE_TOTAL_REMOVED] = "removed",
    [STORE_TOTAL_DROPS] = "drops",
    [STORE_TOTAL_HITS] = "hits",
    [STORE_TOTAL_MISSES] = "misses",
    [STORE_TOTAL_REFUSED] = "refused",
    [STORE_TOTAL_MAP_FULL] = "map_full",
    [STORE_TOTAL_WRITE_ERRORS] = "write_errors",
};

static const char format_key[] = "format";
static const char totals_key[] = "totals";

static void put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

int store_index_open(MDB_txn *txn, bool create, store_index *ix, uint32_t *format)
{
    unsigned f = create ? MDB_CREATE : 0;
    int rc;
    *format = 0;
    if ((rc = mdb_dbi_open(txn, "records", f, &ix->records)) != 0 ||
        (rc = mdb_dbi_open(txn, "blocks", f, &ix->blocks)) != 0 ||
        (rc = mdb_dbi_open(txn, "children", f | MDB_DUPSORT | MDB_DUPFIXED, &ix->children)) != 0 ||
        (rc = mdb_dbi_open(txn, "ends", f, &ix->ends)) != 0 ||
        (rc = mdb_dbi_open(txn, "info", f, &ix->info)) != 0)
        return rc;
    MDB_val k = {sizeof format_key - 1, (void *)format_key}, v;
    rc = mdb_get(txn, ix->info, &k, &v);
    if (rc == MDB_NOTFOUND && create) {
        uint8_t b[4];
        put_le(b, STORE_FORMAT_VERSION, 4);
        v.mv_size = sizeof b;
        v.mv_data = b;
        *format = STORE_FORMAT_VERSION;
        return mdb_put(txn, ix->info, &k, &v, 0);
    }
    if (rc != 0)
        return rc;
    *format = v.mv_size == 4 ? (uint32_t)get_le(v.mv_data, 4) : 0;
    return *format == STORE_FORMAT_VERSION ? 0 : MDB_INCOMPATIBLE;
}

int store_index_totals(MDB_txn *txn, const store_index *ix, uint64_t totals[STORE_TOTALS])
{
    MDB_val k = {sizeof totals_key - 1, (void *)totals_key}, v;
    memset(totals, 0, sizeof(uint64_t) * STORE_TOTALS);
    int rc = mdb_get(txn, ix->info, &k, &v);
    if (rc == MDB_NOTFOUND)
        return 0;
    if (rc != 0)
        return rc;
    if (v.mv_size != 8 * STORE_TOTALS)
        return MDB_CORRUPTED;
    for (int i = 0; i < STORE_TOTALS; i++)
        totals[i] = get_le((const uint8_t *)v.mv_data + 8 * i, 8);
    return 0;
}

static int totals_write(MDB_txn *txn, const store_index *ix, const uint64_t totals[STORE_TOTALS])
{
    uint8_t b[8 * STORE_TOTALS];
    for (int i = 0; i < STORE_TOTALS; i++)
        put_le(b + 8 * i, totals[i], 8);
    MDB_val k = {sizeof totals_key - 1, (void *)totals_key}, v = {sizeof b, b};
    return mdb_put(txn, ix->info, &k, &v, 0);
}

/* ---- blocks entries ---- */

static void block_encode(uint8_t *b, const store_block *blk)
{
    put_le(b, blk->stamp, 8);
    put_le(b + 8, blk->used_ms, 8);
    put_le(b + 16, blk->bytes, 8);
    put_le(b + 24, (uint64_t)blk->tokens, 4);
    put_le(b + 28, 0, 4);
    memcpy(b + 32, blk->parent.bytes, COMMON_HASH_BYTES);
}

bool store_block_decode(const MDB_val *v, store_block *out)
{
    if (v->mv_size != STORE_BLOCK_BYTES)
        return false;
    const uint8_t *b = v->mv_data;
    out->stamp = get_le(b, 8);
    out->used_ms = get_le(b + 8, 8);
    out->bytes = get_le(b + 16, 8);
    out->tokens = (int)get_le(b + 24, 4);
    memcpy(out->parent.bytes, b + 32, COMMON_HASH_BYTES);
    return true;
}

int store_index_block(MDB_txn *txn, const store_index *ix, const uint8_t *key, store_block *out)
{
    MDB_val k = {STORE_KEY_BYTES, (void *)key}, v;
    int rc = mdb_get(txn, ix->blocks, &k, &v);
    if (rc != 0)
        return rc;
    return store_block_decode(&v, out) ? 0 : MDB_CORRUPTED;
}

static int block_write(store_wtx *w, const uint8_t *key, const store_block *blk)
{
    uint8_t b[STORE_BLOCK_BYTES];
    block_encode(b, blk);
    MDB_val k = {STORE_KEY_BYTES, (void *)key}, v = {sizeof b, b};
    return mdb_put(w->txn, w->ix->blocks, &k, &v, 0);
}

int store_index_children(MDB_cursor *c, const uint8_t *key, size_t *count)
{
    MDB_val k = {STORE_KEY_BYTES, (void *)key}, v;
    int rc = mdb_cursor_get(c, &k, &v, MDB_SET);
    if (rc == MDB_NOTFOUND) {
        *count = 0;
        return 0;
    }
    if (rc != 0)
        return rc;
    return mdb_cursor_count(c, count);
}

void store_end_key(uint8_t *out, uint64_t stamp, const uint8_t *key)
{
    for (int i = 0; i < 8; i++) /* big-endian, so byte order is age order */
        out[i] = (uint8_t)(stamp >> (56 - 8 * i));
    memcpy(out + 8, key, STORE_KEY_BYTES);
}

static int end_put(store_wtx *w, uint64_t stamp, const uint8_t *key)
{
    uint8_t ek[STORE_END_KEY_BYTES];
    store_end_key(ek, stamp, key);
    MDB_val k = {sizeof ek, ek}, v = {0, NULL};
    return mdb_put(w->txn, w->ix->ends, &k, &v, 0);
}

/* Deletes the ends entry of key at stamp; absent is not an error. */
static int end_del(store_wtx *w, uint64_t stamp, const uint8_t *key)
{
    uint8_t ek[STORE_END_KEY_BYTES];
    store_end_key(ek, stamp, key);
    MDB_val k = {sizeof ek, ek};
    int rc = mdb_del(w->txn, w->ix->ends, &k, NULL);
    return rc == MDB_NOTFOUND ? 0 : rc;
}

/* ---- transactions ---- */

int store_wtx_begin(store_wtx *w, MDB_txn *txn, const store_index *ix)
{
    memset(w, 0, sizeof *w);
    w->txn = txn;
    w->ix = ix;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    w->now_ms = (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
    int rc = store_index_totals(txn, ix, w->totals);
    if (rc == 0)
        rc = mdb_cursor_open(txn, ix->children, &w->children);
    if (rc == 0)
        rc = mdb_cursor_open(txn, ix->ends, &w->ends);
    if (rc != 0)
        store_wtx_discard(w);
    return rc;
}

void store_wtx_discard(store_wtx *w)
{
    if (w->children)
        mdb_cursor_close(w->children);
    if (w->ends)
        mdb_cursor_close(w->ends);
    w->children = w->ends = NULL;
}

int store_wtx_end(store_wtx *w)
{
    int rc = totals_write(w->txn, w->ix, w->totals);
    store_wtx_discard(w);
    return rc;
}

/* Removes one stored block that has no stored children: record, index
 * entries, its place among its parent's children; the parent becomes an end
 * when this was its last child. */
static int remove_end(store_wtx *w, const uint8_t *key)
{
    store_block blk;
    int rc = store_index_block(w->txn, w->ix, key, &blk);
    if (rc != 0)
        return rc;
    MDB_val k = {STORE_KEY_BYTES, (void *)key};
    rc = mdb_del(w->txn, w->ix->records, &k, NULL);
    if (rc != 0 && rc != MDB_NOTFOUND)
        return rc;
    if ((rc = mdb_del(w->txn, w->ix->blocks, &k, NULL)) != 0)
        return rc;
    if ((rc = end_del(w, blk.stamp, key)) != 0)
        return rc;
    uint8_t pkey[STORE_KEY_BYTES];
    memcpy(pkey, key, COMMON_HASH_BYTES); /* same fingerprint */
    memcpy(pkey + COMMON_HASH_BYTES, blk.parent.bytes, COMMON_HASH_BYTES);
    MDB_val pk = {STORE_KEY_BYTES, pkey},
            child = {COMMON_HASH_BYTES, (void *)(key + COMMON_HASH_BYTES)};
    rc = mdb_del(w->txn, w->ix->children, &pk, &child);
    if (rc != 0 && rc != MDB_NOTFOUND)
        return rc;
    w->totals[STORE_TOTAL_BYTES] -=
        blk.bytes < w->totals[STORE_TOTAL_BYTES] ? blk.bytes : w->totals[STORE_TOTAL_BYTES];
    if (w->totals[STORE_TOTAL_RECORDS] > 0)
        w->totals[STORE_TOTAL_RECORDS]--;
    store_block parent;
    rc = store_index_block(w->txn, w->ix, pkey, &parent);
    if (rc == MDB_NOTFOUND)
        return 0;
    if (rc != 0)
        return rc;
    size_t n;
    if ((rc = store_index_children(w->children, pkey, &n)) != 0)
        return rc;
    return n == 0 ? end_put(w, parent.stamp, pkey) : 0;
}

/* Evicts the oldest end. MDB_NOTFOUND when nothing is stored. Entries of
 * `ends` that name no stored block (only a damaged index has them; verify
 * reports it) are dropped on the way, so they never stall eviction. */
static int evict_one(store_wtx *w)
{
    for (;;) {
        MDB_val k, v;
        uint8_t key[STORE_KEY_BYTES];
        store_block blk;
        int rc = mdb_cursor_get(w->ends, &k, &v, MDB_FIRST);
        if (rc == 0) {
            if (k.mv_size == STORE_END_KEY_BYTES) {
                memcpy(key, (const uint8_t *)k.mv_data + 8, STORE_KEY_BYTES);
                rc = store_index_block(w->txn, w->ix, key, &blk);
            } else {
                rc = MDB_NOTFOUND;
            }
            if (rc == MDB_NOTFOUND) {
                if ((rc = mdb_cursor_del(w->ends, 0)) != 0)
                    return rc;
                continue;
            }
        } else if (rc == MDB_NOTFOUND) {
            /* No end while blocks remain means a damaged index; take any
             * block so that eviction still makes progress. */
            MDB_cursor *c;
            if ((rc = mdb_cursor_open(w->txn, w->ix->blocks, &c)) != 0)
                return rc;
            rc = mdb_cursor_get(c, &k, &v, MDB_FIRST);
            if (rc == 0 && k.mv_size == STORE_KEY_BYTES)
                memcpy(key, k.mv_data, STORE_KEY_BYTES);
            else if (rc == 0)
                rc = MDB_CORRUPTED;
            mdb_cursor_close(c);
            if (rc == 0 && !store_block_decode(&v, &blk))
                rc = MDB_CORRUPTED;
        }
        if (rc != 0)
            return rc;
        if ((rc = remove_end(w, key)) != 0)
            return rc;
        w->evicted++;
        w->evicted_bytes += blk.bytes;
        w->totals[STORE_TOTAL_EVICTIONS]++;
        return 0;
    }
}

int store_wtx_evict(store_wtx *w, uint64_t target_bytes)
{
    while (w->totals[STORE_TOTAL_BYTES] > target_bytes) {
        int rc = evict_one(w);
        if (rc == MDB_NOTFOUND)
            return 0;
        if (rc != 0)
            return rc;
    }
    return 0;
}

int store_wtx_touch(store_wtx *w, const uint8_t *key)
{
    store_block blk;
    int rc = store_index_block(w->txn, w->ix, key, &blk);
    if (rc != 0)
        return rc;
    size_t n;
    if ((rc = store_index_children(w->children, key, &n)) != 0)
        return rc;
    uint64_t old = blk.stamp;
    blk.stamp = ++w->totals[STORE_TOTAL_CLOCK];
    blk.used_ms = w->now_ms;
    if ((rc = block_write(w, key, &blk)) != 0)
        return rc;
    if (n == 0 && ((rc = end_del(w, old, key)) != 0 || (rc = end_put(w, blk.stamp, key)) != 0))
        return rc;
    return 0;
}

/* A block stored already whose record fails its checks (a flipped bit, a
 * header of another model under this key) is rewritten with the page just
 * computed for it: readers refuse and recompute it, and their spill heals
 * it. A good record stays. */
static int repair(store_wtx *w, const uint8_t *key, const uint8_t *header, const void *payload,
                  size_t page_bytes)
{
    MDB_val k = {STORE_KEY_BYTES, (void *)key}, v;
    int rc = mdb_get(w->txn, w->ix->records, &k, &v);
    if (rc != 0)
        return rc == MDB_NOTFOUND ? 0 : rc;
    uint64_t bytes = STORE_RECORD_HEADER_BYTES + (uint64_t)page_bytes;
    if (v.mv_size == bytes &&
        store_record_check(key, v.mv_data, v.mv_size, NULL, true, NULL, NULL) == SHOAL_OK)
        return 0;
    if (v.mv_size != bytes)
        return 0; /* another layout's size: left for shoalctl states verify */
    v.mv_data = NULL;
    if ((rc = mdb_put(w->txn, w->ix->records, &k, &v, MDB_RESERVE)) != 0)
        return rc;
    memcpy(v.mv_data, header, STORE_RECORD_HEADER_BYTES);
    memcpy((uint8_t *)v.mv_data + STORE_RECORD_HEADER_BYTES, payload, page_bytes);
    w->totals[STORE_TOTAL_WRITES]++; /* a record written again */
    return 0;
}

int store_wtx_put(store_wtx *w, const uint8_t *header, const void *payload, size_t page_bytes,
                  int tokens, uint64_t limit_bytes, bool *added)
{
    /* The header holds fingerprint and hash side by side: that is the key. */
    const uint8_t *key = header + STORE_RECORD_OFF_FINGERPRINT;
    _Static_assert(STORE_RECORD_OFF_HASH == STORE_RECORD_OFF_FINGERPRINT + COMMON_HASH_BYTES,
                   "fingerprint and hash are adjacent in the header");
    *added = false;
    store_block blk;
    int rc = store_index_block(w->txn, w->ix, key, &blk);
    if (rc == 0) {
        w->totals[STORE_TOTAL_DUPLICATES]++;
        if ((rc = repair(w, key, header, payload, page_bytes)) != 0)
            return rc;
        return store_wtx_touch(w, key);
    }
    if (rc != MDB_NOTFOUND)
        return rc;
    uint64_t bytes = STORE_RECORD_HEADER_BYTES + (uint64_t)page_bytes;
    uint64_t target = limit_bytes > bytes ? limit_bytes - bytes : 0;
    if ((rc = store_wtx_evict(w, target)) != 0)
        return rc;

    MDB_val k = {STORE_KEY_BYTES, (void *)key}, v = {(size_t)bytes, NULL};
    if ((rc = mdb_put(w->txn, w->ix->records, &k, &v, MDB_RESERVE)) != 0)
        return rc;
    memcpy(v.mv_data, header, STORE_RECORD_HEADER_BYTES);
    memcpy((uint8_t *)v.mv_data + STORE_RECORD_HEADER_BYTES, payload, page_bytes);

    memset(&blk, 0, sizeof blk);
    blk.stamp = ++w->totals[STORE_TOTAL_CLOCK];
    blk.used_ms = w->now_ms;
    blk.bytes = bytes;
    blk.tokens = tokens;
    memcpy(blk.parent.bytes, header + STORE_RECORD_OFF_PARENT, COMMON_HASH_BYTES);
    if ((rc = block_write(w, key, &blk)) != 0)
        return rc;

    /* The parent, when stored, stops being an end. */
    uint8_t pkey[STORE_KEY_BYTES];
    memcpy(pkey, key, COMMON_HASH_BYTES);
    memcpy(pkey + COMMON_HASH_BYTES, blk.parent.bytes, COMMON_HASH_BYTES);
    store_block parent;
    rc = store_index_block(w->txn, w->ix, pkey, &parent);
    if (rc != 0 && rc != MDB_NOTFOUND)
        return rc;
    if (rc == 0 && (rc = end_del(w, parent.stamp, pkey)) != 0)
        return rc;
    MDB_val pk = {STORE_KEY_BYTES, pkey},
            child = {COMMON_HASH_BYTES, (void *)(key + COMMON_HASH_BYTES)};
    rc = mdb_put(w->txn, w->ix->children, &pk, &child, MDB_NODUPDATA);
    if (rc != 0 && rc != MDB_KEYEXIST)
        return rc;
    /* The block is an end unless blocks stored before it extend it (a
     * child can be spilled before its parent). */
    size_t n;
    if ((rc = store_index_children(w->children, key, &n)) != 0)
        return rc;
    if (n == 0 && (rc = end_put(w, blk.stamp, key)) != 0)
        return rc;
    w->totals[STORE_TOTAL_BYTES] += bytes;
    w->totals[STORE_TOTAL_RECORDS]++;
    w->totals[STORE_TOTAL_WRITES]++;
    *added = true;
    return 0;
}

/* A stored descendant of key with no stored children (key itself when it
 * has none), found by following first children. A children entry that names
 * no stored block (a damaged index) is dropped on the way. */
static int find_leaf(store_wtx *w, const uint8_t *key, uint8_t *leaf)
{
    memcpy(leaf, key, STORE_KEY_BYTES);
    for (long depth = 0; depth <= SHOAL_STORE_CHAIN_BLOCKS_MAX;) {
        MDB_val k = {STORE_KEY_BYTES, leaf}, v;
        int rc = mdb_cursor_get(w->children, &k, &v, MDB_SET_KEY);
        if (rc == MDB_NOTFOUND)
            return 0;
        if (rc != 0)
            return rc;
        if (v.mv_size != COMMON_HASH_BYTES)
            return MDB_CORRUPTED;
        uint8_t child[STORE_KEY_BYTES];
        memcpy(child, leaf, COMMON_HASH_BYTES);
        memcpy(child + COMMON_HASH_BYTES, v.mv_data, COMMON_HASH_BYTES);
        store_block blk;
        rc = store_index_block(w->txn, w->ix, child, &blk);
        if (rc == MDB_NOTFOUND) {
            if ((rc = mdb_cursor_del(w->children, 0)) != 0)
                return rc;
            continue;
        }
        if (rc != 0)
            return rc;
        memcpy(leaf, child, STORE_KEY_BYTES);
        depth++;
    }
    return MDB_CORRUPTED; /* deeper than any chain: a loop */
}

int store_wtx_remove(store_wtx *w, const uint8_t *key, bool chain, uint64_t *removed)
{
    store_block blk;
    int rc = store_index_block(w->txn, w->ix, key, &blk);
    if (rc != 0)
        return rc;
    /* Descendants first, one end at a time, until key itself is an end. */
    for (;;) {
        uint8_t leaf[STORE_KEY_BYTES];
        if ((rc = find_leaf(w, key, leaf)) != 0)
            return rc;
        if ((rc = remove_end(w, leaf)) != 0)
            return rc;
        (*removed)++;
        w->totals[STORE_TOTAL_REMOVED]++;
        if (memcmp(leaf, key, STORE_KEY_BYTES) == 0)
            break;
    }
    if (!chain)
        return 0;
    /* Then the ancestors that nothing else extends. */
    uint8_t cur[STORE_KEY_BYTES];
    memcpy(cur, key, COMMON_HASH_BYTES);
    memcpy(cur + COMMON_HASH_BYTES, blk.parent.bytes, COMMON_HASH_BYTES);
    for (long depth = 0; depth < SHOAL_STORE_CHAIN_BLOCKS_MAX; depth++) {
        store_block pb;
        rc = store_index_block(w->txn, w->ix, cur, &pb);
        if (rc == MDB_NOTFOUND)
            return 0;
        if (rc != 0)
            return rc;
        size_t n;
        if ((rc = store_index_children(w->children, cur, &n)) != 0)
            return rc;
        if (n != 0)
            return 0;
        if ((rc = remove_end(w, cur)) != 0)
            return rc;
        (*removed)++;
        w->totals[STORE_TOTAL_REMOVED]++;
        memcpy(cur + COMMON_HASH_BYTES, pb.parent.bytes, COMMON_HASH_BYTES);
    }
    return 0;
}

int store_wtx_remove_all(store_wtx *w, uint64_t *removed)
{
    *removed = w->totals[STORE_TOTAL_RECORDS];
    MDB_dbi dbs[4] = {w->ix->records, w->ix->blocks, w->ix->children, w->ix->ends};
    /* mdb_drop invalidates cursors on the dropped databases */
    store_wtx_discard(w);
    for (int i = 0; i < 4; i++) {
        int rc = mdb_drop(w->txn, dbs[i], 0);
        if (rc != 0)
            return rc;
    }
    w->totals[STORE_TOTAL_REMOVED] += *removed;
    w->totals[STORE_TOTAL_BYTES] = 0;
    w->totals[STORE_TOTAL_RECORDS] = 0;
    int rc = mdb_cursor_open(w->txn, w->ix->children, &w->children);
    if (rc == 0)
        rc = mdb_cursor_open(w->txn, w->ix->ends, &w->ends);
    return rc;
}
