/* Fuzzes the tokenizer.json reader: any bytes give a tokenizer or an error
 * with a message, never a crash. A tokenizer that loads must encode and
 * decode a fixed text without failing. */
#include "common/common_assert.h"
#include "coordinator/coordinator_tokenizer.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    coordinator_tokenizer *tok = NULL;
    shoal_diag diag = {{0}};
    shoal_err err = coordinator_tokenizer_parse((const char *)data, size, "fuzz", &tok, &diag);
    if (err != SHOAL_OK) {
        SHOAL_ASSERT(tok == NULL && diag.msg[0] != '\0');
        return 0;
    }
    coordinator_tokenizer_work *work = NULL;
    SHOAL_ASSERT(coordinator_tokenizer_work_open(tok, &work, &diag) == SHOAL_OK);
    static const char text[] = "ab ab\n<|end|> 12 e\xcc\x81 \xe4\xbd\xa0";
    int32_t ids[256];
    size_t n = 0;
    err = coordinator_tokenizer_encode(tok, work, text, sizeof text - 1,
                                       COORDINATOR_ENCODE_ADD_SPECIAL, ids, 256, &n, &diag);
    /* Only the regex engine's limits may refuse this short text. */
    SHOAL_ASSERT(err == SHOAL_OK || err == SHOAL_ERR_LIMIT);
    char out[4096];
    size_t len;
    if (err == SHOAL_OK)
        SHOAL_ASSERT(coordinator_tokenizer_decode(tok, ids, n, 0, out, sizeof out, &len) ==
                     SHOAL_OK);
    coordinator_tokenizer_work_close(work);
    coordinator_tokenizer_close(tok);
    return 0;
}
