/* store_record.h: the bytes of one state record, and the page layout it
 * carries.
 *
 * A record is one KV page of one block of a chain: a fixed-layout
 * little-endian header of STORE_RECORD_HEADER_BYTES, then the page payload
 * (page_bytes, exactly as the page sits in the arena). Its key in LMDB is the
 * model fingerprint followed by the block hash (STORE_KEY_BYTES).
 *
 *   offset bytes field
 *        0     4 magic "SHSR"
 *        4     2 version (STORE_RECORD_VERSION)
 *        6     2 header bytes (STORE_RECORD_HEADER_BYTES)
 *        8    32 model fingerprint (equal to the key's)
 *       40    32 block hash (equal to the key's)
 *       72    32 parent block hash (the chain root for a first block)
 *      104    32 checksum: SHA-256 of the header with these 32 bytes zeroed,
 *                then the payload
 *      136     4 page_tokens
 *      140     4 layers
 *      144     4 kv_heads
 *      148     4 head_dim
 *      152     8 KV dtype name, NUL-padded ("BF16", "F8_E4M3")
 *      160     8 page_bytes (the payload's length)
 *      168     4 tokens held (1..page_tokens; 0 in a state part)
 *      172     2 kind: 0 a KV page, 1 a part of a state checkpoint
 *      174     2 zero
 *      176     4 part index (state parts; zero in a page)
 *      180     4 parts of the checkpoint (state parts; zero in a page)
 *      184     8 the checkpoint's bytes (state parts; zero in a page)
 *      192       payload
 *
 * A state checkpoint (the recurrent state of a hybrid model's stream at the
 * end of a block, worker_checkpoints.h) is `parts` records of the page
 * layout's payload size, the last one zero-padded: part i is keyed by
 * store_record_part_hash(block, i), and its parent is the block (part 0)
 * or part i - 1, so the index knows a checkpoint as a chain hanging off
 * its block: eviction takes its last part first, and a reader that finds
 * the last part finds the rest unless something failed. A reader of either
 * kind refuses the other. A build that knew only pages refuses parts (their
 * bytes past 172 were reserved zeros to it).
 *
 * The checksum covers the header too, so a flipped parent hash or layout
 * field is caught like a flipped payload byte. The dtype is stored by name,
 * not by its shoal_dtype number, so reordering that enum cannot change what
 * stored bytes mean. Pure functions; any thread may call. */
#ifndef SHOAL_STORE_RECORD_H
#define SHOAL_STORE_RECORD_H

#include "common/common_dtype.h"
#include "common/common_error.h"
#include "common/common_hash.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define STORE_RECORD_MAGIC 0x52534853u /* "SHSR" little-endian */
#define STORE_RECORD_VERSION 1

enum {
    STORE_RECORD_HEADER_BYTES = 192,
    STORE_KEY_BYTES = 2 * COMMON_HASH_BYTES, /* fingerprint, block hash */
    STORE_RECORD_OFF_FINGERPRINT = 8,
    STORE_RECORD_OFF_HASH = 40,
    STORE_RECORD_OFF_PARENT = 72,
    STORE_RECORD_OFF_CHECKSUM = 104,
    STORE_RECORD_OFF_LAYOUT = 136,
    STORE_RECORD_OFF_DTYPE = 152,
    STORE_RECORD_DTYPE_BYTES = 8,
    STORE_RECORD_OFF_PAGE_BYTES = 160,
    STORE_RECORD_OFF_TOKENS = 168,
    STORE_RECORD_OFF_KIND = 172,
    STORE_RECORD_OFF_PART = 176,
    STORE_RECORD_OFF_PARTS = 180,
    STORE_RECORD_OFF_STATE_BYTES = 184,
};

_Static_assert(STORE_RECORD_OFF_CHECKSUM + COMMON_HASH_BYTES == STORE_RECORD_OFF_LAYOUT,
               "checksum precedes the layout");
_Static_assert(STORE_RECORD_OFF_STATE_BYTES + 8 == STORE_RECORD_HEADER_BYTES,
               "the state part's fields end the header");

typedef enum store_record_kind {
    STORE_RECORD_PAGE = 0,       /* the KV page of a block */
    STORE_RECORD_STATE_PART = 1, /* a part of a block's state checkpoint */
} store_record_kind;

/* Where a state part sits in its checkpoint. */
typedef struct store_record_part {
    uint32_t index; /* [0, parts) */
    uint32_t parts;
    uint64_t state_bytes; /* of the whole checkpoint: in ((parts - 1), parts] x page_bytes */
} store_record_part;
_Static_assert(STORE_RECORD_HEADER_BYTES % 16 == 0, "the payload starts 16-byte aligned");

/* The page layout of a store: what kernels_kv_layout says of one page
 * (store/ may not include kernels/). page_bytes must equal
 * 2 x layers x kv_heads x page_tokens x head_dim x the dtype's bytes. */
typedef struct store_page_layout {
    int page_tokens;
    int layers;
    int kv_heads;
    int head_dim;
    shoal_dtype dtype; /* BF16, F8_E4M3 or F32 */
    size_t page_bytes;
} store_page_layout;

/* What a header says. */
typedef struct store_record_info {
    common_hash fingerprint;
    common_hash hash;
    common_hash parent;
    common_hash checksum;
    store_page_layout layout;
    int tokens; /* 0 in a state part */
    store_record_kind kind;
    store_record_part part; /* a state part's; zero in a page */
} store_record_info;

/* SHOAL_OK when every field is in range and page_bytes is what the other
 * fields make; else SHOAL_ERR_INVALID with the field in diag. */
shoal_err store_page_layout_check(const store_page_layout *l, shoal_diag *diag);

bool store_page_layout_equal(const store_page_layout *a, const store_page_layout *b);

/* Header plus payload of a record under layout l. */
static inline size_t store_record_bytes(const store_page_layout *l)
{
    return STORE_RECORD_HEADER_BYTES + l->page_bytes;
}

/* key[STORE_KEY_BYTES] = fingerprint, hash. */
void store_record_key(uint8_t *key, const common_hash *fingerprint, const common_hash *hash);

/* The key hash of part `index` of the state checkpoint at `block`:
 * SHA-256 of "shoal state part", the block hash and the index (be32). */
void store_record_part_hash(const common_hash *block, uint32_t index, common_hash *out);

/* Writes the header of a record (checksum included) into
 * header[STORE_RECORD_HEADER_BYTES]. payload holds layout->page_bytes.
 * part NULL: a page of `tokens` tokens; else a state part (tokens 0). */
void store_record_encode(uint8_t *header, const common_hash *fingerprint, const common_hash *hash,
                         const common_hash *parent, const store_page_layout *layout, int tokens,
                         const store_record_part *part, const void *payload);

/* Parses and checks the header of a record value of `bytes` bytes: magic,
 * version, header size, a known dtype, a self-consistent layout, a known
 * kind, tokens in range (a page) or a consistent part (a state part), the
 * unused fields zero, bytes == header + page_bytes. No checksum.
 * SHOAL_ERR_FORMAT with the reason in diag. */
shoal_err store_record_decode(const void *value, size_t bytes, store_record_info *out,
                              shoal_diag *diag);

/* True when the checksum in header matches header and payload (page_bytes
 * read from the decoded header). header and payload may lie apart, so a
 * caller can check a payload after copying it out of the map. */
bool store_record_checksum_ok(const void *header, const void *payload, size_t page_bytes);

/* Everything a reader must know before it uses a record: decode, the key's
 * fingerprint and hash equal the header's, the layout equals `expected`
 * (when not NULL), and, with verify_checksum, the checksum over the value as
 * it lies (a reader that copies the payload out first checks the copy with
 * store_record_checksum_ok instead). The first failure is written to diag;
 * SHOAL_ERR_FORMAT. */
shoal_err store_record_check(const uint8_t *key, const void *value, size_t bytes,
                             const store_page_layout *expected, bool verify_checksum,
                             store_record_info *out, shoal_diag *diag);

#endif
