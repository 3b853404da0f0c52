/* store_admin.h: the state store as an administrator sees it (shoalctl
 * states): chains, checks, removal, compaction.
 *
 * Works on an existing store while the cluster runs or after it stopped:
 * reads are LMDB read transactions (a consistent snapshot, never waiting
 * for writers); removals are write transactions like the workers' own.
 * Knows nothing of models: it checks every record against itself (header,
 * key, checksum) and against the other records of its fingerprint. One
 * thread per handle; one handle per directory per process. */
#ifndef SHOAL_STORE_ADMIN_H
#define SHOAL_STORE_ADMIN_H

#include "common/common_error.h"
#include "common/common_hash.h"
#include "store/store_record.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct store_admin store_admin;

/* Opens the store in dir, which must exist (SHOAL_ERR_NOT_FOUND with what
 * to do otherwise; see store_env_open for the other errors). */
shoal_err store_admin_open(const char *dir, store_admin **out, shoal_diag *diag);
void store_admin_close(store_admin *a);

typedef struct store_admin_stats {
    uint32_t format;
    uint64_t records;
    uint64_t bytes; /* record bytes */
    /* records and bytes by kind, as the index knows them (a state part has
     * 0 tokens); checkpoints counted as store_admin_chain counts them */
    uint64_t kv_pages, kv_page_bytes;
    uint64_t state_parts, state_part_bytes;
    uint64_t checkpoints;
    uint64_t chains;
    /* lifetime totals of every process that wrote the store */
    uint64_t writes, duplicates, evictions, removed, drops, hits, misses, refused, map_full,
        write_errors;
    uint64_t file_bytes; /* data.mdb on disk */
    uint64_t map_bytes;
    uint64_t free_pages; /* LMDB pages free for reuse (what compact returns) */
    uint64_t page_bytes; /* LMDB's page size */
    uint64_t last_txn;
    int readers; /* read transactions running now, in every process */
} store_admin_stats;

/* One read transaction for the totals and the index; the kinds come from
 * a pass over the index (not the records), so stats stays quick. */
shoal_err store_admin_stats_get(store_admin *a, store_admin_stats *out, shoal_diag *diag);

/* A chain: the blocks from a root (a block whose parent is not stored) to
 * an end (a block nothing stored extends). A state checkpoint hangs off
 * its block as a chain of parts (store_record.h), so a chain that ends in
 * one ends at its last part; when the conversation went on past that
 * block, its blocks up to it are also in the chain of the later end.
 *
 * checkpoints counts the chain's parts whose parent is no state part (a
 * KV page, or not stored): part 0 of each checkpoint. That is exact for
 * complete checkpoints; one that lost its last parts (eviction takes them
 * last first) counts as well, with the parts it kept (show names them). */
typedef struct store_admin_chain {
    common_hash fingerprint;
    common_hash end;
    common_hash root;
    int blocks;      /* KV page blocks (state parts not included) */
    uint64_t tokens; /* in those blocks */
    uint64_t bytes;  /* record bytes of the chain: pages and state parts */
    int state_parts;
    uint64_t state_part_bytes; /* their record bytes (headers included) */
    int checkpoints;
    uint64_t used_ms; /* the end's last use, unix ms */
} store_admin_chain;

/* Calls fn for every chain, least recently used first (eviction order),
 * until fn returns false. One read transaction. */
shoal_err store_admin_chains(store_admin *a, bool (*fn)(void *ctx, const store_admin_chain *c),
                             void *ctx, shoal_diag *diag);

/* The stored block whose hash starts with hex (at least 8 hex digits; any
 * fingerprint). SHOAL_ERR_NOT_FOUND, or SHOAL_ERR_INVALID when the prefix
 * is malformed or names several blocks. */
shoal_err store_admin_find(store_admin *a, const char *hex, common_hash *fingerprint,
                           common_hash *hash, shoal_diag *diag);

typedef struct store_admin_block {
    common_hash hash;
    common_hash parent;
    int tokens; /* 0: a state part */
    uint64_t bytes;
    uint64_t used_ms;
    int children;             /* stored blocks extending it */
    bool header_ok;           /* the record's header decodes and matches its key */
    store_record_kind kind;   /* the header's; without header_ok, the index's (tokens 0: part) */
    store_record_part part;   /* a state part's index, parts and state bytes, when header_ok */
    store_page_layout layout; /* when header_ok */
} store_admin_block;

/* Calls fn for each block of the chain that ends at (fingerprint, hash),
 * root first. SHOAL_ERR_NOT_FOUND when the block is not stored. */
shoal_err store_admin_show(store_admin *a, const common_hash *fingerprint, const common_hash *hash,
                           bool (*fn)(void *ctx, const store_admin_block *b), void *ctx,
                           shoal_diag *diag);

/* One thing verify found wrong. */
typedef struct store_admin_problem {
    bool record; /* a record (fingerprint and hash set) or the index */
    common_hash fingerprint;
    common_hash hash;
    char what[256];
} store_admin_problem;

typedef struct store_admin_verify_result {
    uint64_t records; /* records checked */
    uint64_t bytes;
    uint64_t kv_pages; /* records that pass every record check, by kind */
    uint64_t state_parts;
    uint64_t corrupt; /* records that fail a check: a get refuses them */
    uint64_t index_problems;
} store_admin_verify_result;

/* Checks every record (header, key, layout against its fingerprint's
 * other records, SHA-256 checksum; a state part also against its place:
 * part i of the checkpoint at block B is keyed store_record_part_hash(B, i)
 * and names the index's parent as its own, which is B for part 0 and
 * otherwise part i - 1, as a reader expects), in read transactions of a
 * bounded size so a long check does not pin old pages, then the index in
 * one snapshot (totals, blocks, chain ends, children against the records).
 * fn (may be NULL) gets each problem. SHOAL_OK when the check ran,
 * whatever it found: look at *res. */
shoal_err store_admin_verify(store_admin *a, void (*fn)(void *ctx, const store_admin_problem *p),
                             void *ctx, store_admin_verify_result *res, shoal_diag *diag);

/* Removes the chain ending at (fingerprint, hash): the block, every stored
 * block after it, and its ancestors that no other chain uses. */
shoal_err store_admin_remove(store_admin *a, const common_hash *fingerprint,
                             const common_hash *hash, uint64_t *removed, shoal_diag *diag);

/* Removes every record that fails verify's record checks (a misplaced
 * state part included), and the blocks stored after each (they cannot be
 * restored without it). */
shoal_err store_admin_remove_corrupt(store_admin *a, uint64_t *removed, shoal_diag *diag);

/* Removes every record. */
shoal_err store_admin_remove_all(store_admin *a, uint64_t *removed, shoal_diag *diag);

/* mdb_reader_check: frees reader slots of dead processes. */
shoal_err store_admin_reader_check(store_admin *a, int *cleared, shoal_diag *diag);

/* Compacts the store in dir (not open in this process): see
 * store_env_compact. to: NULL to swap the compacted file in (refused while
 * any process has the store open), or a new directory for a copy. */
shoal_err store_admin_compact(const char *dir, const char *to, uint64_t *before, uint64_t *after,
                              shoal_diag *diag);

#endif
