#include "store_record.h"

#include "common/common_limits.h"

#include <string.h>

static void put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

shoal_err store_page_layout_check(const store_page_layout *l, shoal_diag *diag)
{
    if (l->page_tokens < SHOAL_PAGE_TOKENS_MIN || l->page_tokens > SHOAL_PAGE_TOKENS_MAX ||
        (l->page_tokens & (l->page_tokens - 1)) != 0)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "page_tokens %d is not a power of two in [%d, %d]", l->page_tokens,
                              SHOAL_PAGE_TOKENS_MIN, SHOAL_PAGE_TOKENS_MAX);
    if (l->layers < 1 || l->layers > SHOAL_MODEL_LAYERS_MAX)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID, "layers %d outside [1, %d]", l->layers,
                              SHOAL_MODEL_LAYERS_MAX);
    if (l->kv_heads < 1 || l->kv_heads > SHOAL_MODEL_HEADS_MAX)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID, "kv_heads %d outside [1, %d]", l->kv_heads,
                              SHOAL_MODEL_HEADS_MAX);
    if (l->head_dim < 1 || l->head_dim > SHOAL_MODEL_HEAD_DIM_MAX)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID, "head_dim %d outside [1, %d]", l->head_dim,
                              SHOAL_MODEL_HEAD_DIM_MAX);
    if (l->dtype != SHOAL_DTYPE_BF16 && l->dtype != SHOAL_DTYPE_F8_E4M3 &&
        l->dtype != SHOAL_DTYPE_F32)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "KV dtype %s is not BF16, F8_E4M3 or F32",
                              shoal_dtype_name(l->dtype));
    /* Each factor is bounded above, so the product fits 64 bits. */
    uint64_t want = 2ull * (uint64_t)l->layers * (uint64_t)l->kv_heads * (uint64_t)l->page_tokens *
                    (uint64_t)l->head_dim * shoal_dtype_bytes(l->dtype);
    if ((uint64_t)l->page_bytes != want)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "page_bytes %zu is not 2 x layers x kv_heads x page_tokens x "
                              "head_dim x %zu = %llu",
                              l->page_bytes, shoal_dtype_bytes(l->dtype), (unsigned long long)want);
    if (want + STORE_RECORD_HEADER_BYTES > SHOAL_STORE_RECORD_BYTES_MAX)
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT,
                              "a page of %llu bytes passes SHOAL_STORE_RECORD_BYTES_MAX (%llu)",
                              (unsigned long long)want,
                              (unsigned long long)SHOAL_STORE_RECORD_BYTES_MAX);
    return SHOAL_OK;
}

bool store_page_layout_equal(const store_page_layout *a, const store_page_layout *b)
{
    return a->page_tokens == b->page_tokens && a->layers == b->layers &&
           a->kv_heads == b->kv_heads && a->head_dim == b->head_dim && a->dtype == b->dtype &&
           a->page_bytes == b->page_bytes;
}

void store_record_key(uint8_t *key, const common_hash *fingerprint, const common_hash *hash)
{
    memcpy(key, fingerprint->bytes, COMMON_HASH_BYTES);
    memcpy(key + COMMON_HASH_BYTES, hash->bytes, COMMON_HASH_BYTES);
}

void store_record_part_hash(const common_hash *block, uint32_t index, common_hash *out)
{
    static const char tag[] = "shoal state part";
    uint8_t be[4] = {(uint8_t)(index >> 24), (uint8_t)(index >> 16), (uint8_t)(index >> 8),
                     (uint8_t)index};
    common_hash_part parts[3] = {
        {tag, sizeof tag - 1}, {block->bytes, COMMON_HASH_BYTES}, {be, sizeof be}};
    common_hash_parts(parts, 3, out);
}

static void checksum(const uint8_t *header, const void *payload, size_t page_bytes,
                     common_hash *out)
{
    static const uint8_t zeros[COMMON_HASH_BYTES];
    common_hash_part parts[4] = {
        {header, STORE_RECORD_OFF_CHECKSUM},
        {zeros, COMMON_HASH_BYTES},
        {header + STORE_RECORD_OFF_LAYOUT, STORE_RECORD_HEADER_BYTES - STORE_RECORD_OFF_LAYOUT},
        {payload, page_bytes},
    };
    common_hash_parts(parts, 4, out);
}

void store_record_encode(uint8_t *header, const common_hash *fingerprint, const common_hash *hash,
                         const common_hash *parent, const store_page_layout *layout, int tokens,
                         const store_record_part *part, const void *payload)
{
    memset(header, 0, STORE_RECORD_HEADER_BYTES);
    put_u32(header, STORE_RECORD_MAGIC);
    put_u16(header + 4, STORE_RECORD_VERSION);
    put_u16(header + 6, STORE_RECORD_HEADER_BYTES);
    memcpy(header + STORE_RECORD_OFF_FINGERPRINT, fingerprint->bytes, COMMON_HASH_BYTES);
    memcpy(header + STORE_RECORD_OFF_HASH, hash->bytes, COMMON_HASH_BYTES);
    memcpy(header + STORE_RECORD_OFF_PARENT, parent->bytes, COMMON_HASH_BYTES);
    put_u32(header + STORE_RECORD_OFF_LAYOUT + 0, (uint32_t)layout->page_tokens);
    put_u32(header + STORE_RECORD_OFF_LAYOUT + 4, (uint32_t)layout->layers);
    put_u32(header + STORE_RECORD_OFF_LAYOUT + 8, (uint32_t)layout->kv_heads);
    put_u32(header + STORE_RECORD_OFF_LAYOUT + 12, (uint32_t)layout->head_dim);
    const char *name = shoal_dtype_name(layout->dtype);
    memcpy(header + STORE_RECORD_OFF_DTYPE, name, strnlen(name, STORE_RECORD_DTYPE_BYTES));
    put_u64(header + STORE_RECORD_OFF_PAGE_BYTES, (uint64_t)layout->page_bytes);
    if (part) {
        put_u16(header + STORE_RECORD_OFF_KIND, STORE_RECORD_STATE_PART);
        put_u32(header + STORE_RECORD_OFF_PART, part->index);
        put_u32(header + STORE_RECORD_OFF_PARTS, part->parts);
        put_u64(header + STORE_RECORD_OFF_STATE_BYTES, part->state_bytes);
    } else {
        put_u32(header + STORE_RECORD_OFF_TOKENS, (uint32_t)tokens);
    }
    common_hash sum;
    checksum(header, payload, layout->page_bytes, &sum);
    memcpy(header + STORE_RECORD_OFF_CHECKSUM, sum.bytes, COMMON_HASH_BYTES);
}

shoal_err store_record_decode(const void *value, size_t bytes, store_record_info *out,
                              shoal_diag *diag)
{
    const uint8_t *h = value;
    if (bytes < STORE_RECORD_HEADER_BYTES)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                              "record of %zu bytes is shorter than its "
                              "%d-byte header",
                              bytes, STORE_RECORD_HEADER_BYTES);
    if (get_u32(h) != STORE_RECORD_MAGIC)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT, "bad magic 0x%08x", get_u32(h));
    if (get_u16(h + 4) != STORE_RECORD_VERSION)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT, "record version %u, this build reads %d",
                              get_u16(h + 4), STORE_RECORD_VERSION);
    if (get_u16(h + 6) != STORE_RECORD_HEADER_BYTES)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT, "header of %u bytes, expected %d",
                              get_u16(h + 6), STORE_RECORD_HEADER_BYTES);
    uint16_t kind = get_u16(h + STORE_RECORD_OFF_KIND);
    if (kind != STORE_RECORD_PAGE && kind != STORE_RECORD_STATE_PART)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT, "record kind %u is not a page (0) or a "
                              "state part (1)", kind);
    /* a page has zeros past its kind; a part past its kind's two bytes */
    int zero_to = kind == STORE_RECORD_PAGE ? STORE_RECORD_HEADER_BYTES : STORE_RECORD_OFF_PART;
    for (int i = STORE_RECORD_OFF_KIND + 2; i < zero_to; i++)
        if (h[i] != 0)
            return shoal_diag_set(diag, SHOAL_ERR_FORMAT, "unused header byte %d is not zero", i);
    char name[STORE_RECORD_DTYPE_BYTES + 1];
    memcpy(name, h + STORE_RECORD_OFF_DTYPE, STORE_RECORD_DTYPE_BYTES);
    name[STORE_RECORD_DTYPE_BYTES] = '\0';
    store_record_info r;
    memcpy(r.fingerprint.bytes, h + STORE_RECORD_OFF_FINGERPRINT, COMMON_HASH_BYTES);
    memcpy(r.hash.bytes, h + STORE_RECORD_OFF_HASH, COMMON_HASH_BYTES);
    memcpy(r.parent.bytes, h + STORE_RECORD_OFF_PARENT, COMMON_HASH_BYTES);
    memcpy(r.checksum.bytes, h + STORE_RECORD_OFF_CHECKSUM, COMMON_HASH_BYTES);
    uint32_t f[4];
    for (int i = 0; i < 4; i++) {
        f[i] = get_u32(h + STORE_RECORD_OFF_LAYOUT + 4 * i);
        if (f[i] > (uint32_t)SHOAL_MODEL_HIDDEN_MAX) /* far above every bound: not a layout */
            return shoal_diag_set(diag, SHOAL_ERR_FORMAT, "layout field %d is %u", i, f[i]);
    }
    r.layout.page_tokens = (int)f[0];
    r.layout.layers = (int)f[1];
    r.layout.kv_heads = (int)f[2];
    r.layout.head_dim = (int)f[3];
    r.layout.dtype = shoal_dtype_parse(name);
    uint64_t page_bytes = get_u64(h + STORE_RECORD_OFF_PAGE_BYTES);
    if (page_bytes > SHOAL_STORE_RECORD_BYTES_MAX)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT, "page_bytes %llu passes the record limit",
                              (unsigned long long)page_bytes);
    r.layout.page_bytes = (size_t)page_bytes;
    shoal_diag why;
    if (store_page_layout_check(&r.layout, &why) != SHOAL_OK)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT, "bad layout: %s", why.msg);
    uint32_t tokens = get_u32(h + STORE_RECORD_OFF_TOKENS);
    r.kind = (store_record_kind)kind;
    r.part = (store_record_part){0};
    if (kind == STORE_RECORD_PAGE) {
        if (tokens < 1 || tokens > (uint32_t)r.layout.page_tokens)
            return shoal_diag_set(diag, SHOAL_ERR_FORMAT, "tokens %u outside [1, page_tokens %d]",
                                  tokens, r.layout.page_tokens);
    } else {
        store_record_part p = {.index = get_u32(h + STORE_RECORD_OFF_PART),
                               .parts = get_u32(h + STORE_RECORD_OFF_PARTS),
                               .state_bytes = get_u64(h + STORE_RECORD_OFF_STATE_BYTES)};
        if (tokens != 0)
            return shoal_diag_set(diag, SHOAL_ERR_FORMAT, "a state part holds %u tokens, not 0",
                                  tokens);
        if (p.parts < 1 || p.index >= p.parts ||
            p.state_bytes <= (uint64_t)(p.parts - 1) * r.layout.page_bytes ||
            p.state_bytes > (uint64_t)p.parts * r.layout.page_bytes)
            return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                                  "state part %u of %u of a %llu-byte checkpoint does not fit "
                                  "pages of %zu bytes",
                                  p.index, p.parts, (unsigned long long)p.state_bytes,
                                  r.layout.page_bytes);
        r.part = p;
    }
    r.tokens = (int)tokens;
    if (bytes != STORE_RECORD_HEADER_BYTES + r.layout.page_bytes)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                              "record of %zu bytes, its header says %d + %zu", bytes,
                              STORE_RECORD_HEADER_BYTES, r.layout.page_bytes);
    if (out)
        *out = r;
    return SHOAL_OK;
}

bool store_record_checksum_ok(const void *header, const void *payload, size_t page_bytes)
{
    common_hash sum;
    checksum(header, payload, page_bytes, &sum);
    return memcmp(sum.bytes, (const uint8_t *)header + STORE_RECORD_OFF_CHECKSUM,
                  COMMON_HASH_BYTES) == 0;
}

shoal_err store_record_check(const uint8_t *key, const void *value, size_t bytes,
                             const store_page_layout *expected, bool verify_checksum,
                             store_record_info *out, shoal_diag *diag)
{
    store_record_info r;
    shoal_err err = store_record_decode(value, bytes, &r, diag);
    if (err != SHOAL_OK)
        return err;
    if (memcmp(key, r.fingerprint.bytes, COMMON_HASH_BYTES) != 0)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                              "the header's model fingerprint differs from its key's");
    if (memcmp(key + COMMON_HASH_BYTES, r.hash.bytes, COMMON_HASH_BYTES) != 0)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                              "the header's block hash differs from its key's");
    if (expected && !store_page_layout_equal(&r.layout, expected))
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                              "page layout %d tokens x %d layers x %d kv heads x %d dims %s, "
                              "this model's is %d x %d x %d x %d %s",
                              r.layout.page_tokens, r.layout.layers, r.layout.kv_heads,
                              r.layout.head_dim, shoal_dtype_name(r.layout.dtype),
                              expected->page_tokens, expected->layers, expected->kv_heads,
                              expected->head_dim, shoal_dtype_name(expected->dtype));
    const uint8_t *v = value;
    if (verify_checksum &&
        !store_record_checksum_ok(v, v + STORE_RECORD_HEADER_BYTES, r.layout.page_bytes))
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT, "checksum mismatch");
    if (out)
        *out = r;
    return SHOAL_OK;
}
