/* store_index.h: the databases of a state store and the changes made to
 * them inside one write transaction (internal to store/).
 *
 * One LMDB environment holds five named databases:
 *
 *   records   fingerprint|hash -> the record (store_record.h)
 *   blocks    fingerprint|hash -> STORE_BLOCK_BYTES: last-use stamp, last use
 *             (unix ms), record bytes, tokens, parent hash
 *   children  fingerprint|parent -> child hashes (sorted 32-byte duplicates)
 *   ends      be64(stamp)|fingerprint|hash -> nothing
 *   info      "format" -> u32; "totals" -> u64[STORE_TOTALS]
 *
 * A chain is the path of parent links from a root (a block whose parent is
 * not stored) to an end (a block no stored block extends). `ends` lists
 * every end by its last-use stamp, oldest first: it is the chain index (an
 * end names its chain; walking parents in `blocks` gives its blocks in
 * order, each with its bytes and last use) and the LRU index together.
 * Eviction takes the oldest end, so a chain shrinks from its tail (its
 * prefix, the part a later turn restores, goes last) and a shared prefix
 * goes only after every chain that extends it. A block becomes an end again
 * with its own, older stamp when its last child goes, so a chain not used
 * for a while keeps shrinking before a fresher one is touched.
 *
 * Every change to data and index happens in one transaction (a store_wtx),
 * so a crash leaves both as they were at the last commit. Stamps come from
 * a clock in `totals` that every writer of the environment advances, so
 * they order uses across processes. Functions return LMDB codes (0,
 * MDB_NOTFOUND, MDB_MAP_FULL, ...): store_env.c translates them. */
#ifndef SHOAL_STORE_INDEX_H
#define SHOAL_STORE_INDEX_H

#include "store/store_record.h"

#include <lmdb.h>
#include <stdbool.h>
#include <stdint.h>

/* Version of the databases' layout; written at creation, checked at open. */
#define STORE_FORMAT_VERSION 1

enum {
    STORE_BLOCK_BYTES = 64,
    STORE_END_KEY_BYTES = 8 + STORE_KEY_BYTES,
};

typedef struct store_index {
    MDB_dbi records, blocks, children, ends, info;
} store_index;

/* Totals and lifetime counters of the whole store, kept in `info` and
 * changed in the same transactions as the data they count. */
typedef enum store_total {
    STORE_TOTAL_BYTES = 0,    /* record bytes stored (headers included) */
    STORE_TOTAL_RECORDS,      /* records stored */
    STORE_TOTAL_CLOCK,        /* last stamp handed out */
    STORE_TOTAL_WRITES,       /* records written */
    STORE_TOTAL_DUPLICATES,   /* puts of a block already stored (touched instead) */
    STORE_TOTAL_EVICTIONS,    /* records evicted for room */
    STORE_TOTAL_REMOVED,      /* records removed by shoalctl */
    STORE_TOTAL_DROPS,        /* puts dropped on a full queue */
    STORE_TOTAL_HITS,         /* gets that returned a page */
    STORE_TOTAL_MISSES,       /* gets of a block not stored */
    STORE_TOTAL_REFUSED,      /* gets of a record that failed a check */
    STORE_TOTAL_MAP_FULL,     /* write attempts that found the map full */
    STORE_TOTAL_WRITE_ERRORS, /* batches dropped after an error */
    STORE_TOTALS
} store_total;

/* Names of the totals, for stats output. */
extern const char *const store_total_names[STORE_TOTALS];

/* One entry of `blocks`. */
typedef struct store_block {
    uint64_t stamp;
    uint64_t used_ms; /* unix time of the last put or use, ms */
    uint64_t bytes;   /* the record's bytes */
    int tokens;
    common_hash parent;
} store_block;

/* Opens the five databases in txn (creating them, and the format entry,
 * with `create` in a write transaction). MDB_NOTFOUND when a database is
 * missing; MDB_INCOMPATIBLE when the format is not STORE_FORMAT_VERSION
 * (*format gets what was found, 0 when missing). */
int store_index_open(MDB_txn *txn, bool create, store_index *ix, uint32_t *format);

/* Reads the totals (zeros in a fresh store). */
int store_index_totals(MDB_txn *txn, const store_index *ix, uint64_t totals[STORE_TOTALS]);

/* The `blocks` entry of key (fingerprint|hash); MDB_NOTFOUND. */
int store_index_block(MDB_txn *txn, const store_index *ix, const uint8_t *key, store_block *out);

/* Decodes a `blocks` value; false when its size is wrong. */
bool store_block_decode(const MDB_val *v, store_block *out);

/* Children of key in `children`, through cursor c on that database. */
int store_index_children(MDB_cursor *c, const uint8_t *key, size_t *count);

/* ends key = be64(stamp), fingerprint|hash. */
void store_end_key(uint8_t *out, uint64_t stamp, const uint8_t *key);

/* One write transaction's changes. Begin loads the totals; end writes them
 * back; the caller commits or aborts txn. */
typedef struct store_wtx {
    MDB_txn *txn;
    const store_index *ix;
    MDB_cursor *children; /* on `children` */
    MDB_cursor *ends;     /* on `ends` */
    uint64_t totals[STORE_TOTALS];
    uint64_t now_ms;
    uint64_t evicted; /* records evicted by this transaction */
    uint64_t evicted_bytes;
} store_wtx;

int store_wtx_begin(store_wtx *w, MDB_txn *txn, const store_index *ix);
int store_wtx_end(store_wtx *w);
/* Closes the cursors without writing (before an abort). */
void store_wtx_discard(store_wtx *w);

/* Stores a record: header (store_record_encode, already checksummed) and
 * payload of layout->page_bytes, with the index entries, first evicting
 * the oldest ends while bytes + the record would pass limit_bytes. A block
 * already stored is touched instead (*added = false), and its record
 * rewritten with this one when it fails its checks (counted in writes). */
int store_wtx_put(store_wtx *w, const uint8_t *header, const void *payload, size_t page_bytes,
                  int tokens, uint64_t limit_bytes, bool *added);

/* Marks a stored block used now; MDB_NOTFOUND when it is not stored. */
int store_wtx_touch(store_wtx *w, const uint8_t *key);

/* Evicts the oldest ends until bytes <= target_bytes or nothing is left. */
int store_wtx_evict(store_wtx *w, uint64_t target_bytes);

/* Removes block key and every stored block after it; with `chain`, also
 * its ancestors that no other stored block extends (the whole chain, up to
 * where it shares a prefix). *removed counts records. MDB_NOTFOUND when key
 * is not stored. */
int store_wtx_remove(store_wtx *w, const uint8_t *key, bool chain, uint64_t *removed);

/* Empties every database but the format; counters are kept. */
int store_wtx_remove_all(store_wtx *w, uint64_t *removed);

#endif
