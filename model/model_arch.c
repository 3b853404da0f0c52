#include "model/model_arch.h"

#include "common/common_assert.h"

#include <stdio.h>
#include <string.h>

static const model_arch *const archs[] = {&model_arch_qwen3, &model_arch_llama,
                                          &model_arch_qwen3_moe};
enum { ARCHS = sizeof archs / sizeof archs[0] };

const model_arch *model_arch_find(const char *hf_name)
{
    for (int i = 0; i < ARCHS; i++)
        if (strcmp(archs[i]->hf_name, hf_name) == 0)
            return archs[i];
    return NULL;
}

const model_arch *model_arch_of(model_arch_id id)
{
    for (int i = 0; i < ARCHS; i++)
        if (archs[i]->id == id)
            return archs[i];
    return NULL;
}

const char *model_arch_names(void)
{
    static char names[256];
    if (!names[0]) {
        size_t at = 0;
        for (int i = 0; i < ARCHS; i++)
            at += (size_t)snprintf(names + at, sizeof names - at, "%s%s",
                                   i == 0           ? ""
                                   : i + 1 == ARCHS ? " and "
                                                    : ", ",
                                   archs[i]->hf_name);
    }
    return names;
}

bool model_tensor_name_of(const model_config *cfg, model_role role, int layer, int expert,
                          char *buf, size_t bytes)
{
    const model_arch *a = model_arch_of(cfg->arch);
    SHOAL_ASSERT(a);
    for (int i = 0; i < a->tensor_count; i++) {
        if (a->tensors[i].role != role)
            continue;
        int n = snprintf(buf, bytes, a->tensors[i].format, layer, expert);
        SHOAL_ASSERT(n > 0 && (size_t)n < bytes);
        return true;
    }
    return false;
}

shoal_err model_arch_parse_dense(const cJSON *root, const char *label, model_config *cfg,
                                 shoal_diag *diag)
{
    (void)root, (void)label, (void)diag;
    for (int l = 0; l < cfg->layers; l++)
        cfg->mlp_kind[l] = MODEL_MLP_DENSE;
    return SHOAL_OK;
}

void model_tensor_shape(const model_config *cfg, model_role role, int *dims, int64_t shape[2])
{
    int64_t hid = cfg->hidden, q = (int64_t)cfg->heads * cfg->head_dim,
            kv = (int64_t)cfg->kv_heads * cfg->head_dim;
    int64_t r = 0, c = 0; /* c 0: a vector of r */
    switch (role) {
    case MODEL_ROLE_EMBED:
    case MODEL_ROLE_LM_HEAD:
        r = cfg->vocab, c = hid;
        break;
    case MODEL_ROLE_FINAL_NORM:
    case MODEL_ROLE_ATTN_NORM:
    case MODEL_ROLE_MLP_NORM:
        r = hid;
        break;
    case MODEL_ROLE_Q:
        r = q, c = hid;
        break;
    case MODEL_ROLE_K:
    case MODEL_ROLE_V:
        r = kv, c = hid;
        break;
    case MODEL_ROLE_O:
        r = hid, c = q;
        break;
    case MODEL_ROLE_Q_NORM:
    case MODEL_ROLE_K_NORM:
        r = cfg->head_dim;
        break;
    case MODEL_ROLE_GATE:
    case MODEL_ROLE_UP:
        r = cfg->intermediate, c = hid;
        break;
    case MODEL_ROLE_DOWN:
        r = hid, c = cfg->intermediate;
        break;
    case MODEL_ROLE_ROUTER:
        r = cfg->experts, c = hid;
        break;
    case MODEL_ROLE_EXPERT_GATE:
    case MODEL_ROLE_EXPERT_UP:
        r = cfg->moe_intermediate, c = hid;
        break;
    case MODEL_ROLE_EXPERT_DOWN:
        r = hid, c = cfg->moe_intermediate;
        break;
    case MODEL_ROLES:
        SHOAL_ASSERT(!"no such role");
    }
    shape[0] = r;
    shape[1] = c;
    *dims = c ? 2 : 1;
}
