/* Fuzzes shm_proto_check, the coordinator-worker trust boundary: any bytes
 * must be refused with a message, or accepted with everything the check
 * promises (shm_proto.h) true of them, so that the code that reads an
 * accepted message after it reads inside it. The input is copied into an
 * aligned buffer, as an nng message is. */
#include "common/common_assert.h"
#include "shm/shm_proto.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void load_ok(const shm_load *l)
{
    SHOAL_ASSERT(l->running >= 0 && l->waiting >= 0 && l->pages_total >= 0 && l->pages_free >= 0 &&
                 l->pages_active >= 0 && l->pages_cached >= 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > SHM_MSG_BYTES_MAX + 64)
        return 0;
    void *msg = aligned_alloc(64, (size + 63) & ~(size_t)63);
    if (!msg)
        return 0;
    memcpy(msg, data, size);
    shm_msg_type type;
    shoal_diag diag = {{0}};
    shoal_err err = shm_proto_check(msg, size, &type, &diag);
    if (err != SHOAL_OK) {
        SHOAL_ASSERT(err == SHOAL_ERR_FORMAT && diag.msg[0] != '\0');
        free(msg);
        return 0;
    }
    const shm_header *h = msg;
    SHOAL_ASSERT(type >= SHM_MSG_HELLO && type <= SHM_MSG_SHUTDOWN && h->type == type);
    size_t want = type == SHM_MSG_SUBMIT
                      ? shm_submit_bytes(h->count, ((const shm_submit *)msg)->bias_count,
                                         ((const shm_submit *)msg)->grammar_bytes)
                      : shm_msg_bytes(type, h->count);
    SHOAL_ASSERT(h->bytes == size && size == want && size <= SHM_MSG_BYTES_MAX);
    /* touch the last byte: ASan sees a size past the buffer */
    volatile uint8_t last = ((const uint8_t *)msg)[size - 1];
    (void)last;
    switch (type) {
    case SHM_MSG_HELLO:
        load_ok(&((const shm_hello *)msg)->load);
        SHOAL_ASSERT(memchr(((const shm_hello *)msg)->device, 0, 16));
        break;
    case SHM_MSG_SUBMIT: {
        const shm_submit *s = msg;
        SHOAL_ASSERT(h->count >= 1 && h->count <= SHM_PROMPT_TOKENS_MAX);
        SHOAL_ASSERT(s->stop_count >= 0 && s->stop_count <= SHM_STOP_IDS_MAX && s->max_tokens >= 1 &&
                     s->min_tokens >= 0);
        SHOAL_ASSERT(s->bias_count <= SHM_LOGIT_BIAS_MAX &&
                     s->grammar_bytes <= SHM_GRAMMAR_BYTES_MAX);
        for (uint32_t i = 0; i < s->bias_count; i++) {
            shm_bias b;
            memcpy(&b, shm_submit_bias(s) + i, sizeof b);
            SHOAL_ASSERT(b.token >= 0 && b.bias <= 100.0f &&
                         (b.bias >= -100.0f || b.bias == -INFINITY));
        }
        SHOAL_ASSERT(shm_submit_grammar(s) + s->grammar_bytes == (const char *)msg + size);
        break;
    }
    case SHM_MSG_STEP:
        SHOAL_ASSERT(h->count <= SHM_STEP_EVENTS_MAX);
        load_ok(&((const shm_step *)msg)->load);
        break;
    case SHM_MSG_HEARTBEAT:
        load_ok(&((const shm_heartbeat *)msg)->load);
        break;
    case SHM_MSG_REJECT:
        SHOAL_ASSERT(memchr(((const shm_reject *)msg)->text, 0, SHM_REJECT_TEXT_BYTES));
        break;
    default:
        SHOAL_ASSERT(h->count == 0);
    }
    free(msg);
    return 0;
}
