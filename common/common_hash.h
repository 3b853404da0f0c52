/* common_hash.h: SHA-256, the one cryptographic hash of shoal.
 *
 * Block hashes of the prefix cache, model fingerprints and state-store keys
 * are SHA-256 digests: deterministic across processes, machines and
 * restarts, and collision-resistant, so a hash can stand for the KV it
 * names. Computed by OpenSSL's libcrypto. Any thread may call. */
#ifndef SHOAL_COMMON_HASH_H
#define SHOAL_COMMON_HASH_H

#include "common_error.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { COMMON_HASH_BYTES = 32 };

typedef struct common_hash {
    uint8_t bytes[COMMON_HASH_BYTES];
} common_hash;

/* out = SHA-256 of the concatenation of n parts. */
typedef struct common_hash_part {
    const void *data;
    size_t bytes;
} common_hash_part;

void common_hash_parts(const common_hash_part *parts, int n, common_hash *out);

/* out = SHA-256(data). */
void common_hash_bytes(const void *data, size_t bytes, common_hash *out);

bool common_hash_equal(const common_hash *a, const common_hash *b);

/* The first 8 bytes as a number (little-endian): for hash tables. */
uint64_t common_hash_u64(const common_hash *h);

/* The prefix cache's block hashes, shared by the engine, the router and the
 * store so that all name a block alike: the chain's root is
 * SHA-256("shoal-blocks-v1", fingerprint, salt) (salt only when given), and a
 * block's hash is SHA-256(parent hash, its token ids as little-endian int32). */
void common_block_root(const common_hash *fingerprint, const common_hash *salt, common_hash *out);
void common_block_hash(const common_hash *parent, const int32_t *tokens, int n, common_hash *out);

/* Lower-case hex, 64 characters and a NUL, into buf (65 bytes). */
void common_hash_hex(const common_hash *h, char buf[2 * COMMON_HASH_BYTES + 1]);

#endif
