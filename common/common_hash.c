#include "common_hash.h"

#include "common_assert.h"

#include <openssl/evp.h>
#include <string.h>

void common_hash_parts(const common_hash_part *parts, int n, common_hash *out)
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned int len = 0;
    /* libcrypto fails here only when out of memory or misbuilt: there is no
     * hash to return then, and every caller relies on one. */
    SHOAL_ASSERT(ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1);
    for (int i = 0; i < n; i++)
        SHOAL_ASSERT(EVP_DigestUpdate(ctx, parts[i].data, parts[i].bytes) == 1);
    SHOAL_ASSERT(EVP_DigestFinal_ex(ctx, out->bytes, &len) == 1 && len == COMMON_HASH_BYTES);
    EVP_MD_CTX_free(ctx);
}

void common_hash_bytes(const void *data, size_t bytes, common_hash *out)
{
    common_hash_part p = {data, bytes};
    common_hash_parts(&p, 1, out);
}

bool common_hash_equal(const common_hash *a, const common_hash *b)
{
    return memcmp(a->bytes, b->bytes, COMMON_HASH_BYTES) == 0;
}

uint64_t common_hash_u64(const common_hash *h)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | h->bytes[i];
    return v;
}

void common_block_root(const common_hash *fingerprint, const common_hash *salt, common_hash *out)
{
    static const char tag[] = "shoal-blocks-v1";
    common_hash_part parts[3] = {{tag, sizeof tag},
                                 {fingerprint->bytes, COMMON_HASH_BYTES},
                                 {salt ? salt->bytes : NULL, salt ? COMMON_HASH_BYTES : 0}};
    common_hash_parts(parts, 3, out);
}

void common_block_hash(const common_hash *parent, const int32_t *tokens, int n, common_hash *out)
{
    uint8_t le[1024];
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned int len = 0;
    SHOAL_ASSERT(ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1);
    SHOAL_ASSERT(EVP_DigestUpdate(ctx, parent->bytes, COMMON_HASH_BYTES) == 1);
    /* little-endian on every host, in pieces of 256 tokens */
    for (int i = 0; i < n;) {
        int k = n - i < 256 ? n - i : 256;
        for (int t = 0; t < k; t++)
            for (int b = 0; b < 4; b++)
                le[4 * t + b] = (uint8_t)((uint32_t)tokens[i + t] >> (8 * b));
        SHOAL_ASSERT(EVP_DigestUpdate(ctx, le, (size_t)k * 4) == 1);
        i += k;
    }
    SHOAL_ASSERT(EVP_DigestFinal_ex(ctx, out->bytes, &len) == 1 && len == COMMON_HASH_BYTES);
    EVP_MD_CTX_free(ctx);
}

void common_hash_hex(const common_hash *h, char buf[2 * COMMON_HASH_BYTES + 1])
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < COMMON_HASH_BYTES; i++) {
        buf[2 * i] = digits[h->bytes[i] >> 4];
        buf[2 * i + 1] = digits[h->bytes[i] & 15];
    }
    buf[2 * COMMON_HASH_BYTES] = '\0';
}
