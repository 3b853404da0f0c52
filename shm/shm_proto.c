#include "shm_proto.h"

#include <math.h>
#include <string.h>

void shm_header_init(shm_header *h, shm_msg_type type, size_t bytes, uint32_t count)
{
    h->magic = SHM_PROTO_MAGIC;
    h->version = SHM_PROTO_VERSION;
    h->type = (uint16_t)type;
    h->bytes = (uint32_t)bytes;
    h->count = count;
}

size_t shm_msg_bytes(shm_msg_type type, uint32_t count)
{
    switch (type) {
    case SHM_MSG_HELLO: return sizeof(shm_hello);
    case SHM_MSG_SUBMIT: return sizeof(shm_submit) + (size_t)count * 4;
    case SHM_MSG_CANCEL: return sizeof(shm_cancel);
    case SHM_MSG_STEP: return sizeof(shm_step) + (size_t)count * sizeof(shm_event);
    case SHM_MSG_REJECT: return sizeof(shm_reject);
    case SHM_MSG_HEARTBEAT: return sizeof(shm_heartbeat);
    case SHM_MSG_SHUTDOWN: return sizeof(shm_header);
    }
    return 0;
}

size_t shm_submit_bytes(uint32_t prompt_tokens, uint32_t bias_count, uint32_t grammar_bytes)
{
    return sizeof(shm_submit) + (size_t)prompt_tokens * 4 + (size_t)bias_count * sizeof(shm_bias) +
           grammar_bytes;
}

shoal_err shm_proto_check(const void *msg, size_t bytes, shm_msg_type *type, shoal_diag *diag)
{
    shm_header h;
    if (bytes < sizeof h)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT, "message of %zu bytes has no header", bytes);
    memcpy(&h, msg, sizeof h);
    if (h.magic != SHM_PROTO_MAGIC)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT, "message magic %08x is not shoal's",
                              h.magic);
    if (h.version != SHM_PROTO_VERSION)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                              "message version %u, this build speaks %u (restart the cluster "
                              "with one build)",
                              h.version, SHM_PROTO_VERSION);
    if (h.type < SHM_MSG_HELLO || h.type > SHM_MSG_SHUTDOWN)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT, "unknown message type %u", h.type);
    if ((h.type == SHM_MSG_SUBMIT && (h.count < 1 || h.count > SHM_PROMPT_TOKENS_MAX)) ||
        (h.type == SHM_MSG_STEP && h.count > SHM_STEP_EVENTS_MAX) ||
        (h.type != SHM_MSG_SUBMIT && h.type != SHM_MSG_STEP && h.count != 0))
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT, "message type %u with count %u", h.type,
                              h.count);
    size_t want = shm_msg_bytes((shm_msg_type)h.type, h.count);
    if (h.type == SHM_MSG_SUBMIT && bytes >= want) {
        const shm_submit *s = msg;
        if (s->bias_count > SHM_LOGIT_BIAS_MAX || s->grammar_bytes > SHM_GRAMMAR_BYTES_MAX)
            return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                                  "submit: %u logit_bias entries (at most %d), a grammar of %u "
                                  "bytes (at most %u)",
                                  s->bias_count, SHM_LOGIT_BIAS_MAX, s->grammar_bytes,
                                  SHM_GRAMMAR_BYTES_MAX);
        want = shm_submit_bytes(h.count, s->bias_count, s->grammar_bytes);
    }
    if (h.bytes != bytes || bytes != want)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                              "message type %u: %zu bytes received, header says %u, expected %zu",
                              h.type, bytes, h.bytes, want);
    if (h.type == SHM_MSG_SUBMIT) {
        const shm_submit *s = msg;
        if (s->stop_count < 0 || s->stop_count > SHM_STOP_IDS_MAX || s->max_tokens < 1 ||
            s->min_tokens < 0)
            return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                                  "submit: stop_count %d, max_tokens %d, min_tokens %d",
                                  s->stop_count, s->max_tokens, s->min_tokens);
        const shm_bias *b = shm_submit_bias(s);
        for (uint32_t i = 0; i < s->bias_count; i++) {
            shm_bias e;
            memcpy(&e, b + i, sizeof e);
            if (e.token < 0 || e.bias != e.bias || e.bias > 100.0f ||
                (e.bias < -100.0f && e.bias != -INFINITY))
                return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                                      "submit: logit_bias entry %u (token %d, bias %g)", i,
                                      e.token, (double)e.bias);
        }
    }
    const shm_load *load = h.type == SHM_MSG_HELLO  ? &((const shm_hello *)msg)->load
                           : h.type == SHM_MSG_STEP  ? &((const shm_step *)msg)->load
                           : h.type == SHM_MSG_HEARTBEAT ? &((const shm_heartbeat *)msg)->load
                                                          : NULL;
    if (load && (load->running < 0 || load->waiting < 0 || load->pages_total < 0 ||
                 load->pages_free < 0 || load->pages_active < 0 || load->pages_cached < 0))
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                              "message type %u: negative load (running %d, waiting %d, pages "
                              "%d/%d/%d/%d)",
                              h.type, load->running, load->waiting, load->pages_total,
                              load->pages_free, load->pages_active, load->pages_cached);
    if (h.type == SHM_MSG_HELLO && memchr(((const shm_hello *)msg)->device, 0, 16) == NULL)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT, "hello: device name not terminated");
    if (h.type == SHM_MSG_REJECT &&
        memchr(((const shm_reject *)msg)->text, 0, SHM_REJECT_TEXT_BYTES) == NULL)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT, "reject: text not terminated");
    *type = (shm_msg_type)h.type;
    return SHOAL_OK;
}
