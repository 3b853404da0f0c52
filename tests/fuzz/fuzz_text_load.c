/* Fuzzes the tokenizer.json reader: any input gives a tokenizer or an
 * error with a message, never a crash or a hang; a tokenizer that loads
 * encodes and decodes a fixed text.
 *
 * Raw bytes rarely stay JSON under mutation, so most inputs are read as
 * edits of a small valid tokenizer.json instead: each edit picks a place
 * (a vocabulary id, a merge, an added token's field, the regex, a step's
 * type, ...) and puts there a value drawn from the input (a number that may
 * be negative, huge or fractional, a string of input bytes, null, a bool,
 * an empty array or object, or nothing at all). Inputs whose first byte is
 * odd are parsed as they are. */
#include "common/common_assert.h"
#include "coordinator/coordinator_tokenizer.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char base[] =
    "{\"added_tokens\":[{\"id\":5,\"content\":\"<|end|>\",\"special\":true,\"normalized\":false},"
    "{\"id\":7,\"content\":\"cd\",\"special\":false}],"
    "\"normalizer\":{\"type\":\"NFC\"},"
    "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
    "{\"Regex\":\"\\\\s+(?!\\\\S)|\\\\s+|\\\\p{L}+|\\\\p{N}|[^\\\\s\\\\p{L}\\\\p{N}]+\"},"
    "\"behavior\":"
    "\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
    "\"use_regex\":false}]},"
    "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":"
    "\"<|end|>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"special_tokens\":"
    "{\"<|end|>\":{\"id\":\"<|end|>\",\"ids\":[5],\"tokens\":[\"<|end|>\"]}}},"
    "\"decoder\":{\"type\":\"ByteLevel\"},"
    "\"model\":{\"type\":\"BPE\",\"unk_token\":null,\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,"
    "\"\\u0120\":3,"
    "\"\\u0120ab\":4,\"1\":6},\"merges\":[\"a b\",[\"\\u0120\",\"ab\"]],\"ignore_merges\":false}}";

/* Places an edit can touch, as paths of keys and array indexes. */
static const char *const places[][6] = {
    {"model", "vocab", "a"},
    {"model", "vocab", "ab"},
    {"model", "merges", "0"},
    {"model", "merges", "1", "1"},
    {"model", "merges"},
    {"model", "type"},
    {"model", "unk_token"},
    {"model", "ignore_merges"},
    {"model", "dropout"},
    {"model", "vocab"},
    {"model"},
    {"added_tokens", "0", "id"},
    {"added_tokens", "0", "content"},
    {"added_tokens", "1", "normalized"},
    {"added_tokens", "1", "lstrip"},
    {"added_tokens"},
    {"normalizer", "type"},
    {"pre_tokenizer", "pretokenizers", "0", "pattern", "Regex"},
    {"pre_tokenizer", "pretokenizers", "0", "behavior"},
    {"pre_tokenizer", "pretokenizers", "1", "use_regex"},
    {"pre_tokenizer", "type"},
    {"post_processor", "special_tokens", "<|end|>", "ids", "0"},
    {"post_processor", "single", "1"},
    {"post_processor", "type"},
    {"decoder", "type"},
    {"decoder"},
};

static cJSON *value(const uint8_t *d, size_t n, uint8_t kind)
{
    int32_t v = 0;
    memcpy(&v, d, n < 4 ? n : 4);
    switch (kind % 9) {
    case 0:
        return cJSON_CreateNumber(v);
    case 1:
        return cJSON_CreateNumber(v / 7.0);
    case 2:
        return cJSON_CreateNumber((double)v * 1e12);
    case 3: {
        char s[32];
        size_t k = n < sizeof s - 1 ? n : sizeof s - 1;
        memcpy(s, d, k);
        s[k] = '\0';
        return cJSON_CreateString(s);
    }
    case 4:
        return cJSON_CreateNull();
    case 5:
        return cJSON_CreateBool(v & 1);
    case 6:
        return cJSON_CreateArray();
    case 7:
        return cJSON_CreateObject();
    default:
        return NULL; /* delete */
    }
}

static void edit(cJSON *root, const uint8_t *d, size_t n)
{
    const char *const *path = places[d[0] % (sizeof places / sizeof places[0])];
    cJSON *parent = NULL, *at = root;
    const char *key = NULL;
    for (int i = 0; i < 6 && path[i] && at; i++) {
        parent = at;
        key = path[i];
        at = cJSON_IsArray(at) ? cJSON_GetArrayItem(at, atoi(key))
                               : cJSON_GetObjectItemCaseSensitive(at, key);
    }
    if (!parent || !key)
        return;
    cJSON *v = value(d + 2, n - 2, d[1]);
    if (cJSON_IsArray(parent)) {
        int i = atoi(key);
        if (!v)
            cJSON_DeleteItemFromArray(parent, i);
        else if (i < cJSON_GetArraySize(parent))
            cJSON_ReplaceItemInArray(parent, i, v);
        else
            cJSON_AddItemToArray(parent, v);
    } else if (cJSON_IsObject(parent)) {
        cJSON_DeleteItemFromObjectCaseSensitive(parent, key);
        if (v)
            cJSON_AddItemToObject(parent, key, v);
    } else {
        cJSON_Delete(v);
    }
}

static void load(const char *json, size_t bytes)
{
    coordinator_tokenizer *tok = NULL;
    shoal_diag diag = {{0}};
    shoal_err err = coordinator_tokenizer_parse(json, bytes, "fuzz", &tok, &diag);
    if (err != SHOAL_OK) {
        SHOAL_ASSERT(tok == NULL && diag.msg[0] != '\0');
        return;
    }
    coordinator_tokenizer_work *work = NULL;
    SHOAL_ASSERT(coordinator_tokenizer_work_open(tok, &work, &diag) == SHOAL_OK);
    static const char text[] = "ab ab\n<|end|> 12 cd e\xcc\x81 \xe4\xbd\xa0";
    int32_t ids[256];
    size_t n = 0;
    err = coordinator_tokenizer_encode(tok, work, text, sizeof text - 1,
                                       COORDINATOR_ENCODE_ADD_SPECIAL, ids, 256, &n, &diag);
    /* Only the regex engine's limits may refuse this short text. */
    SHOAL_ASSERT(err == SHOAL_OK || err == SHOAL_ERR_LIMIT);
    if (err == SHOAL_OK) {
        /* sized as the server sizes it (a token may be 1,024 bytes, three
         * times that once invalid UTF-8 becomes U+FFFD): ask, then decode */
        size_t need = 0, len = 0;
        coordinator_tokenizer_decode(tok, ids, n, 0, NULL, 0, &need);
        char *out = malloc(need + 1);
        SHOAL_ASSERT(out != NULL);
        SHOAL_ASSERT(coordinator_tokenizer_decode(tok, ids, n, 0, out, need + 1, &len) ==
                         SHOAL_OK &&
                     len == need);
        free(out);
    }
    coordinator_tokenizer_work_close(work);
    coordinator_tokenizer_close(tok);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 0 && (data[0] & 1)) {
        load((const char *)data + 1, size - 1);
        return 0;
    }
    cJSON *root = cJSON_Parse(base);
    SHOAL_ASSERT(root != NULL);
    /* Edits of 8 bytes each: place, kind, then the value's bytes. */
    for (size_t at = 1; at + 8 <= size; at += 8)
        edit(root, data + at, 8);
    char *json = cJSON_PrintUnformatted(root);
    load(json, strlen(json));
    free(json);
    cJSON_Delete(root);
    return 0;
}
