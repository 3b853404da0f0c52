/* The safetensors reader trusts nothing in a file: every malformed header
 * gets an error naming the file and the tensor, never a crash. */
#include "tests/test.h"
#include "model/model_safetensors.h"

#include <stdint.h>
#include <unistd.h>

/* An image: 8-byte length, the header text, then `data` bytes of zeros. */
static unsigned char *image(const char *header, size_t data, size_t *bytes)
{
    size_t h = strlen(header);
    *bytes = 8 + h + data;
    unsigned char *buf = calloc(1, *bytes ? *bytes : 1);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)((uint64_t)h >> (8 * i));
    memcpy(buf + 8, header, h);
    return buf;
}

/* Parses header + data; returns the error and leaves the message in diag. */
static shoal_err parse(const char *header, size_t data, shoal_diag *diag)
{
    size_t bytes;
    unsigned char *buf = image(header, data, &bytes);
    model_safetensors st;
    shoal_err err = model_safetensors_parse(buf, bytes, "t.safetensors", &st, diag);
    if (!err)
        model_safetensors_close(&st);
    free(buf);
    return err;
}

static void well_formed_header_is_indexed_by_name(void)
{
    const char *h = "{\"__metadata__\":{\"format\":\"pt\"},"
                    "\"b\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
                    "\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[12,24]},"
                    "\"empty\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[24,24]}}";
    size_t bytes;
    unsigned char *buf = image(h, 24, &bytes);
    model_safetensors st;
    shoal_diag diag = {{0}};
    CHECK(model_safetensors_parse(buf, bytes, "t", &st, &diag) == SHOAL_OK);
    CHECK_EQ_INT(st.tensors, 3);
    const model_tensor_info *a = model_safetensors_find(&st, "a");
    const model_tensor_info *b = model_safetensors_find(&st, "b");
    CHECK(a && a->dtype == SHOAL_DTYPE_F32 && a->begin == 12 && a->dims == 1);
    CHECK(b && b->dtype == SHOAL_DTYPE_BF16 && b->shape[1] == 3 && model_tensor_elements(b) == 6);
    CHECK(model_safetensors_find(&st, "c") == NULL);
    CHECK(model_safetensors_find(&st, "__metadata__") == NULL);
    model_safetensors_close(&st);
    model_safetensors_close(&st); /* idempotent */
    free(buf);
}

static void written_file_reads_back_aligned(void)
{
    char dir[] = "/tmp/shoal-test-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[256];
    snprintf(path, sizeof path, "%s/x.safetensors", dir);
    uint16_t h[5] = {1, 2, 3, 4, 5};
    float f[3] = {1.5f, -2.0f, 3.25f};
    model_tensor_out t[2] = {
        {.name = "h", .dtype = SHOAL_DTYPE_BF16, .dims = 1, .shape = {5}, .data = h},
        {.name = "f", .dtype = SHOAL_DTYPE_F32, .dims = 2, .shape = {1, 3}, .data = f},
    };
    shoal_diag diag = {{0}};
    CHECK(model_safetensors_write(path, t, 2, &diag) == SHOAL_OK);
    model_safetensors st;
    CHECK(model_safetensors_open(path, &st, &diag) == SHOAL_OK);
    CHECK(((uintptr_t)st.data % 8) == 0);
    const model_tensor_info *fi = model_safetensors_find(&st, "f");
    CHECK(fi && memcmp(st.data + fi->begin, f, sizeof f) == 0);
    const model_tensor_info *hi = model_safetensors_find(&st, "h");
    CHECK(hi && memcmp(st.data + hi->begin, h, sizeof h) == 0);
    model_safetensors_close(&st);
    unlink(path);
    rmdir(dir);
}

static void each_malformed_header_is_refused_with_a_reason(void)
{
    static const struct {
        const char *header;
        size_t data;
        shoal_err err;
        const char *says;
    } cases[] = {
        {"not json", 0, SHOAL_ERR_FORMAT, "not a JSON object"},
        {"[1,2]", 0, SHOAL_ERR_FORMAT, "not a JSON object"},
        {"{\"w\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
         SHOAL_ERR_UNSUPPORTED, "unknown dtype 'Q4'"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, SHOAL_ERR_FORMAT,
         "truncated"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,12]}}", 16, SHOAL_ERR_FORMAT,
         "needs 16 bytes"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,0]}}", 16, SHOAL_ERR_FORMAT,
         "run backwards"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[-4],\"data_offsets\":[0,16]}}", 16,
         SHOAL_ERR_FORMAT, "shape entry 0"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,16]}}", 16,
         SHOAL_ERR_FORMAT, "shape entry 0"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
         "\"data_offsets\":[0,16]}}",
         16, SHOAL_ERR_FORMAT, "needs more than"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
         SHOAL_ERR_LIMIT, "9 dimensions"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, SHOAL_ERR_FORMAT, "data_offsets"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, SHOAL_ERR_FORMAT,
         "two non-negative"},
        {"{\"w\":[1]}", 4, SHOAL_ERR_FORMAT, "not an object"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
         12, SHOAL_ERR_FORMAT, "overlap"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
         8, SHOAL_ERR_FORMAT, "named twice"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        shoal_diag diag = {{0}};
        shoal_err err = parse(cases[i].header, cases[i].data, &diag);
        CHECK_MSG(err == cases[i].err, "case %zu: got %s (%s)", i, shoal_strerror(err), diag.msg);
        CHECK_HAS(diag.msg, cases[i].says);
        CHECK_HAS(diag.msg, "t.safetensors");
    }
}

static void header_length_that_lies_is_refused(void)
{
    shoal_diag diag = {{0}};
    model_safetensors st;
    unsigned char short_file[4] = {0};
    CHECK(model_safetensors_parse(short_file, 4, "s", &st, &diag) == SHOAL_ERR_FORMAT);
    CHECK_HAS(diag.msg, "too short");
    size_t bytes;
    unsigned char *buf = image("{}", 0, &bytes);
    buf[0] = 200; /* claims 200 header bytes, has 2 */
    CHECK(model_safetensors_parse(buf, bytes, "s", &st, &diag) == SHOAL_ERR_FORMAT);
    CHECK_HAS(diag.msg, "header claims 200 bytes");
    memset(buf, 0xff, 8); /* 2^64 - 1 */
    CHECK(model_safetensors_parse(buf, bytes, "s", &st, &diag) == SHOAL_ERR_LIMIT);
    CHECK_HAS(diag.msg, "over the limit");
    free(buf);
    CHECK(model_safetensors_open("/nonexistent/x.safetensors", &st, &diag) ==
          SHOAL_ERR_NOT_FOUND);
    CHECK_HAS(diag.msg, "/nonexistent/x.safetensors");
}

static void tensor_name_over_the_limit_is_refused(void)
{
    char header[1024];
    char name[300];
    memset(name, 'n', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    snprintf(header, sizeof header,
             "{\"%s\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", name);
    shoal_diag diag = {{0}};
    CHECK(parse(header, 4, &diag) == SHOAL_ERR_LIMIT);
    CHECK_HAS(diag.msg, "tensor name");
}

int main(void)
{
    TEST_RUN(well_formed_header_is_indexed_by_name);
    TEST_RUN(written_file_reads_back_aligned);
    TEST_RUN(each_malformed_header_is_refused_with_a_reason);
    TEST_RUN(header_length_that_lies_is_refused);
    TEST_RUN(tensor_name_over_the_limit_is_refused);
    return TEST_EXIT();
}
