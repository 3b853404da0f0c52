/* The bytes of a state record: what the header holds, and that any damage
 * to header or payload is caught before a page is used. */
#include "store/store_record.h"
#include "store_test_util.h"
#include "tests/test.h"

#include <stdlib.h>

static uint8_t *make_record(const store_page_layout *l, const common_hash *fp,
                            const common_hash *hash, const common_hash *parent, int tokens)
{
    uint8_t *rec = malloc(store_record_bytes(l));
    tu_page(rec + STORE_RECORD_HEADER_BYTES, l->page_bytes, 7, 1);
    store_record_encode(rec, fp, hash, parent, l, tokens, NULL, rec + STORE_RECORD_HEADER_BYTES);
    return rec;
}

static uint8_t *make_part(const store_page_layout *l, const common_hash *fp,
                          const common_hash *hash, const common_hash *parent,
                          const store_record_part *part)
{
    uint8_t *rec = malloc(store_record_bytes(l));
    tu_page(rec + STORE_RECORD_HEADER_BYTES, l->page_bytes, 7, 2);
    store_record_encode(rec, fp, hash, parent, l, 0, part, rec + STORE_RECORD_HEADER_BYTES);
    return rec;
}

/* A state part says its kind, index, count and checkpoint size; a page
 * says kind 0; each decodes as what it is. */
static void test_state_parts_round_trip_and_pages_stay_pages(void)
{
    store_page_layout l = tu_layout(2, 2, 8, 4);
    common_hash fp = tu_hash(5, 0), block = tu_hash(5, 1), h, parent;
    store_record_part_hash(&block, 2, &h);
    store_record_part_hash(&block, 1, &parent);
    store_record_part p = {.index = 2, .parts = 3, .state_bytes = 2 * l.page_bytes + 7};
    uint8_t *rec = make_part(&l, &fp, &h, &parent, &p);
    uint8_t key[STORE_KEY_BYTES];
    store_record_key(key, &fp, &h);
    store_record_info info;
    shoal_diag d = {{0}};
    size_t bytes = store_record_bytes(&l);
    CHECK_EQ_INT(store_record_check(key, rec, bytes, &l, true, &info, &d), SHOAL_OK);
    CHECK_EQ_INT(info.kind, STORE_RECORD_STATE_PART);
    CHECK_EQ_INT(info.tokens, 0);
    CHECK_EQ_INT(info.part.index, 2);
    CHECK_EQ_INT(info.part.parts, 3);
    CHECK(info.part.state_bytes == 2 * l.page_bytes + 7);
    CHECK_EQ_INT(rec[STORE_RECORD_OFF_KIND], 1);
    /* every flipped bit is still caught */
    int missed = 0;
    for (size_t at = 0; at < STORE_RECORD_HEADER_BYTES; at++) {
        rec[at] ^= 4;
        missed += store_record_check(key, rec, bytes, &l, true, NULL, NULL) == SHOAL_OK;
        rec[at] ^= 4;
    }
    CHECK_EQ_INT(missed, 0);
    free(rec);
    /* part fields that cannot be: each refused by name */
    store_record_part bad[] = {
        {.index = 3, .parts = 3, .state_bytes = 3 * l.page_bytes}, /* index past the count */
        {.index = 0, .parts = 0, .state_bytes = 1},                /* no parts */
        {.index = 0, .parts = 3, .state_bytes = 2 * l.page_bytes}, /* two pages' bytes in 3 */
        {.index = 0, .parts = 1, .state_bytes = l.page_bytes + 1}, /* more than its pages hold */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rec = make_part(&l, &fp, &h, &parent, &bad[i]);
        CHECK_EQ_INT(store_record_check(key, rec, bytes, &l, true, NULL, &d), SHOAL_ERR_FORMAT);
        CHECK_HAS(d.msg, "state part");
        free(rec);
    }
    /* a page's part fields must be zero: one set is refused */
    rec = make_record(&l, &fp, &h, &parent, 4);
    CHECK_EQ_INT(store_record_check(key, rec, bytes, &l, true, &info, &d), SHOAL_OK);
    CHECK_EQ_INT(info.kind, STORE_RECORD_PAGE);
    rec[STORE_RECORD_OFF_PARTS] = 1;
    CHECK_EQ_INT(store_record_check(key, rec, bytes, &l, false, NULL, &d), SHOAL_ERR_FORMAT);
    CHECK_HAS(d.msg, "unused header byte");
    rec[STORE_RECORD_OFF_PARTS] = 0;
    rec[STORE_RECORD_OFF_KIND] = 2;
    CHECK_EQ_INT(store_record_check(key, rec, bytes, &l, false, NULL, &d), SHOAL_ERR_FORMAT);
    CHECK_HAS(d.msg, "record kind 2");
    free(rec);
    /* part keys: distinct by block and by index */
    common_hash a, b, c;
    store_record_part_hash(&block, 0, &a);
    store_record_part_hash(&block, 1, &b);
    store_record_part_hash(&fp, 0, &c);
    CHECK(!common_hash_equal(&a, &b) && !common_hash_equal(&a, &c) &&
          !common_hash_equal(&a, &block));
}

static void test_record_round_trips_every_header_field(void)
{
    store_page_layout l = tu_layout(3, 2, 16, 8);
    l.dtype = SHOAL_DTYPE_F8_E4M3;
    l.page_bytes /= 2;
    CHECK_EQ_INT(store_page_layout_check(&l, NULL), SHOAL_OK);
    common_hash fp = tu_hash(1, 0), h = tu_hash(1, 1), parent = tu_hash(1, 2);
    uint8_t *rec = make_record(&l, &fp, &h, &parent, 5);
    uint8_t key[STORE_KEY_BYTES];
    store_record_key(key, &fp, &h);
    store_record_info info;
    shoal_diag d = {{0}};
    CHECK_EQ_INT(store_record_check(key, rec, store_record_bytes(&l), &l, true, &info, &d),
                 SHOAL_OK);
    CHECK(common_hash_equal(&info.fingerprint, &fp));
    CHECK(common_hash_equal(&info.hash, &h));
    CHECK(common_hash_equal(&info.parent, &parent));
    CHECK(store_page_layout_equal(&info.layout, &l));
    CHECK_EQ_INT(info.tokens, 5);
    /* fixed little-endian offsets, whatever the host */
    CHECK_EQ_INT(rec[0], 'S');
    CHECK_EQ_INT(rec[3], 'R');
    CHECK_EQ_INT(rec[STORE_RECORD_OFF_LAYOUT], 8);
    CHECK_EQ_INT(rec[STORE_RECORD_OFF_LAYOUT + 4], 3);
    CHECK(memcmp(rec + STORE_RECORD_OFF_DTYPE, "F8_E4M3", 8) == 0);
    free(rec);
}

static void test_any_flipped_bit_is_refused(void)
{
    store_page_layout l = tu_layout(2, 2, 8, 4);
    common_hash fp = tu_hash(2, 0), h = tu_hash(2, 1), parent = tu_hash(2, 2);
    uint8_t *rec = make_record(&l, &fp, &h, &parent, 4);
    uint8_t key[STORE_KEY_BYTES];
    store_record_key(key, &fp, &h);
    size_t bytes = store_record_bytes(&l);
    int missed = 0;
    for (size_t at = 0; at < bytes; at++) {
        for (int bit = 0; bit < 8; bit += 3) {
            rec[at] ^= (uint8_t)(1u << bit);
            if (store_record_check(key, rec, bytes, &l, true, NULL, NULL) == SHOAL_OK)
                missed++;
            rec[at] ^= (uint8_t)(1u << bit);
        }
    }
    CHECK_EQ_INT(missed, 0);
    CHECK_EQ_INT(store_record_check(key, rec, bytes, &l, true, NULL, NULL), SHOAL_OK);
    /* a flipped payload byte passes every check but the checksum */
    rec[bytes - 1] ^= 1;
    CHECK_EQ_INT(store_record_check(key, rec, bytes, &l, false, NULL, NULL), SHOAL_OK);
    shoal_diag d = {{0}};
    CHECK_EQ_INT(store_record_check(key, rec, bytes, &l, true, NULL, &d), SHOAL_ERR_FORMAT);
    CHECK_HAS(d.msg, "checksum");
    free(rec);
}

static void test_key_and_layout_must_match(void)
{
    store_page_layout l = tu_layout(2, 1, 8, 4);
    common_hash fp = tu_hash(3, 0), other = tu_hash(4, 0), h = tu_hash(3, 1);
    uint8_t *rec = make_record(&l, &fp, &h, &h, 1);
    size_t bytes = store_record_bytes(&l);
    uint8_t key[STORE_KEY_BYTES];
    shoal_diag d = {{0}};
    store_record_key(key, &other, &h);
    CHECK_EQ_INT(store_record_check(key, rec, bytes, &l, true, NULL, &d), SHOAL_ERR_FORMAT);
    CHECK_HAS(d.msg, "fingerprint");
    store_record_key(key, &fp, &other);
    CHECK_EQ_INT(store_record_check(key, rec, bytes, &l, true, NULL, &d), SHOAL_ERR_FORMAT);
    CHECK_HAS(d.msg, "block hash");
    store_record_key(key, &fp, &h);
    store_page_layout l2 = tu_layout(2, 1, 16, 2); /* same bytes, other shape */
    CHECK_EQ_INT(l2.page_bytes, l.page_bytes);
    CHECK_EQ_INT(store_record_check(key, rec, bytes, &l2, true, NULL, &d), SHOAL_ERR_FORMAT);
    CHECK_HAS(d.msg, "page layout");
    /* truncated or extended values */
    CHECK_EQ_INT(store_record_check(key, rec, bytes - 1, &l, true, NULL, NULL), SHOAL_ERR_FORMAT);
    CHECK_EQ_INT(store_record_check(key, rec, 10, &l, true, NULL, NULL), SHOAL_ERR_FORMAT);
    free(rec);
}

static void test_layout_check_names_the_field(void)
{
    shoal_diag d = {{0}};
    store_page_layout l = tu_layout(2, 2, 64, 16);
    l.page_tokens = 12;
    CHECK_EQ_INT(store_page_layout_check(&l, &d), SHOAL_ERR_INVALID);
    CHECK_HAS(d.msg, "page_tokens");
    l = tu_layout(2, 2, 64, 16);
    l.page_bytes += 2;
    CHECK_EQ_INT(store_page_layout_check(&l, &d), SHOAL_ERR_INVALID);
    CHECK_HAS(d.msg, "page_bytes");
    l = tu_layout(2, 2, 64, 16);
    l.dtype = SHOAL_DTYPE_F32; /* the CPU's exact pages: twice bf16's bytes */
    CHECK_EQ_INT(store_page_layout_check(&l, &d), SHOAL_ERR_INVALID);
    CHECK_HAS(d.msg, "page_bytes");
    l.page_bytes *= 2;
    CHECK_EQ_INT(store_page_layout_check(&l, &d), SHOAL_OK);
    l.dtype = SHOAL_DTYPE_I32;
    CHECK_EQ_INT(store_page_layout_check(&l, &d), SHOAL_ERR_INVALID);
    CHECK_HAS(d.msg, "F32");
    l = tu_layout(512, 256, 512, 256); /* bounded, but one page passes the record limit */
    CHECK_EQ_INT(store_page_layout_check(&l, &d), SHOAL_ERR_LIMIT);
}

int main(void)
{
    TEST_RUN(test_record_round_trips_every_header_field);
    TEST_RUN(test_any_flipped_bit_is_refused);
    TEST_RUN(test_key_and_layout_must_match);
    TEST_RUN(test_layout_check_names_the_field);
    TEST_RUN(test_state_parts_round_trip_and_pages_stay_pages);
    return TEST_EXIT();
}
