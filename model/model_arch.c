#include "model/model_arch.h"

#include "common/common_assert.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const model_arch *const archs[] = {
    &model_arch_qwen3,      &model_arch_llama,   &model_arch_qwen3_moe,
    &model_arch_qwen3_next, &model_arch_qwen3_5, &model_arch_qwen3_5_moe};
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

shoal_err model_arch_parse_moe(const cJSON *root, const char *label, model_config *cfg,
                               shoal_diag *diag)
{
    shoal_err err;
    int step = 1;
    /* transformers 5 writes num_local_experts, the hub's configs num_experts */
    const char *experts_key =
        cJSON_GetObjectItemCaseSensitive(root, "num_experts") ? "num_experts" : "num_local_experts";
    if ((err = model_config_get_int(root, experts_key, -1, 1, SHOAL_MODEL_EXPERTS_MAX, label,
                                    &cfg->experts, diag)) ||
        (err = model_config_get_int(root, "num_experts_per_tok", -1, 1, cfg->experts, label,
                                    &cfg->experts_per_tok, diag)) ||
        (err = model_config_get_int(root, "moe_intermediate_size", -1, 1,
                                    SHOAL_MODEL_INTERMEDIATE_MAX, label, &cfg->moe_intermediate,
                                    diag)) ||
        (err = model_config_get_int(root, "shared_expert_intermediate_size", 0, 0,
                                    SHOAL_MODEL_INTERMEDIATE_MAX, label, &cfg->shared_intermediate,
                                    diag)) ||
        (err = model_config_get_int(root, "decoder_sparse_step", 1, 1, SHOAL_MODEL_LAYERS_MAX,
                                    label, &step, diag)))
        return err;
    if (cfg->experts_per_tok > SHOAL_MODEL_EXPERTS_PER_TOK_MAX)
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT,
                              "%s: num_experts_per_tok %d is over shoal's limit of %d", label,
                              cfg->experts_per_tok, SHOAL_MODEL_EXPERTS_PER_TOK_MAX);
    /* Qwen3MoeConfig's default, which Qwen3's MoE checkpoints override */
    cfg->norm_topk_prob = model_config_get_bool(root, "norm_topk_prob", false);
    for (int l = 0; l < cfg->layers; l++)
        cfg->mlp_kind[l] = (l + 1) % step == 0 ? MODEL_MLP_MOE : MODEL_MLP_DENSE;
    const cJSON *dense = cJSON_GetObjectItemCaseSensitive(root, "mlp_only_layers");
    if (dense && !cJSON_IsNull(dense) && !cJSON_IsArray(dense))
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                              "%s: 'mlp_only_layers' must be a list of layer indices", label);
    const cJSON *e;
    cJSON_ArrayForEach(e, dense)
    {
        if (!cJSON_IsNumber(e) || e->valuedouble != (int)e->valuedouble || e->valuedouble < 0 ||
            e->valuedouble >= cfg->layers)
            return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                                  "%s: 'mlp_only_layers' holds %g, not a layer index below %d",
                                  label, cJSON_IsNumber(e) ? e->valuedouble : -1.0, cfg->layers);
        cfg->mlp_kind[(int)e->valuedouble] = MODEL_MLP_DENSE;
    }
    return SHOAL_OK;
}

/* partial_rotary_factor, in rope_parameters (transformers 5) or at the top
 * (the hub's configs); 0.25 where absent, Qwen3NextConfig's default. */
static shoal_err parse_rope_dim(const cJSON *root, const char *label, model_config *cfg,
                                shoal_diag *diag)
{
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    const cJSON *f = cJSON_IsObject(params)
                         ? cJSON_GetObjectItemCaseSensitive(params, "partial_rotary_factor")
                         : NULL;
    if (!f)
        f = cJSON_GetObjectItemCaseSensitive(root, "partial_rotary_factor");
    double factor = 0.25;
    if (f && !cJSON_IsNull(f)) {
        if (!cJSON_IsNumber(f) || !(f->valuedouble > 0.0 && f->valuedouble <= 1.0))
            return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                                  "%s: 'partial_rotary_factor' must be a number in (0, 1]", label);
        factor = f->valuedouble;
    }
    /* transformers: int(head_dim * partial_rotary_factor) */
    cfg->rope_dim = (int)floor(cfg->head_dim * factor + 1e-9);
    if (cfg->rope_dim < 2 || cfg->rope_dim % 2 != 0)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                              "%s: head_dim %d x partial_rotary_factor %g gives %d rotated dims; "
                              "they must be even and at least 2",
                              label, cfg->head_dim, factor, cfg->rope_dim);
    return SHOAL_OK;
}

shoal_err model_arch_parse_hybrid(const cJSON *root, const char *label, model_config *cfg,
                                  shoal_diag *diag)
{
    shoal_err err;
    int interval = 4;
    const cJSON *types = cJSON_GetObjectItemCaseSensitive(root, "layer_types");
    if (types && !cJSON_IsNull(types)) {
        if (!cJSON_IsArray(types) || cJSON_GetArraySize(types) != cfg->layers)
            return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                                  "%s: 'layer_types' must be a list of %d layer types", label,
                                  cfg->layers);
        int l = 0;
        const cJSON *t;
        cJSON_ArrayForEach(t, types)
        {
            const char *s = cJSON_IsString(t) ? t->valuestring : "";
            if (strcmp(s, "linear_attention") == 0)
                cfg->mixer_kind[l] = MODEL_MIXER_LINEAR;
            else if (strcmp(s, "full_attention") == 0)
                cfg->mixer_kind[l] = MODEL_MIXER_ATTENTION;
            else
                return shoal_diag_set(diag, SHOAL_ERR_UNSUPPORTED,
                                      "%s: layer_types[%d] is '%.32s'; shoal runs "
                                      "'linear_attention' and 'full_attention'",
                                      label, l, s);
            l++;
        }
    } else {
        if ((err = model_config_get_int(root, "full_attention_interval", 4, 1,
                                        SHOAL_MODEL_LAYERS_MAX, label, &interval, diag)))
            return err;
        for (int l = 0; l < cfg->layers; l++)
            cfg->mixer_kind[l] = (l + 1) % interval == 0 ? MODEL_MIXER_ATTENTION
                                                         : MODEL_MIXER_LINEAR;
    }
    if ((err = model_config_get_int(root, "linear_num_key_heads", -1, 1, SHOAL_MODEL_HEADS_MAX,
                                    label, &cfg->lin_k_heads, diag)) ||
        (err = model_config_get_int(root, "linear_num_value_heads", -1, 1, SHOAL_MODEL_HEADS_MAX,
                                    label, &cfg->lin_v_heads, diag)) ||
        (err = model_config_get_int(root, "linear_key_head_dim", -1, 1, SHOAL_MODEL_HEAD_DIM_MAX,
                                    label, &cfg->lin_k_dim, diag)) ||
        (err = model_config_get_int(root, "linear_value_head_dim", -1, 1,
                                    SHOAL_MODEL_HEAD_DIM_MAX, label, &cfg->lin_v_dim, diag)) ||
        (err = model_config_get_int(root, "linear_conv_kernel_dim", 4, 1,
                                    SHOAL_MODEL_CONV_KERNEL_MAX, label, &cfg->lin_conv, diag)) ||
        (err = parse_rope_dim(root, label, cfg, diag)))
        return err;
    if (cfg->lin_v_heads % cfg->lin_k_heads != 0)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                              "%s: linear_num_value_heads %d is not a multiple of "
                              "linear_num_key_heads %d",
                              label, cfg->lin_v_heads, cfg->lin_k_heads);
    if (!model_config_get_bool(root, "attn_output_gate", true))
        return shoal_diag_set(diag, SHOAL_ERR_UNSUPPORTED,
                              "%s: attn_output_gate false is not supported (transformers' "
                              "Qwen3-Next and Qwen3.5 always gate)",
                              label);
    cfg->attn_output_gate = true;
    cfg->norm_offset = true;
    return SHOAL_OK;
}

void model_tensor_shape(const model_config *cfg, model_role role, int *dims, int64_t shape[3])
{
    int64_t hid = cfg->hidden, q = (int64_t)cfg->heads * cfg->head_dim,
            kv = (int64_t)cfg->kv_heads * cfg->head_dim;
    int64_t kd = (int64_t)cfg->lin_k_heads * cfg->lin_k_dim,
            vd = (int64_t)cfg->lin_v_heads * cfg->lin_v_dim, nv = cfg->lin_v_heads;
    int64_t r = 0, c = 0; /* c 0: a vector of r */
    *dims = 0;
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
        r = cfg->attn_output_gate ? 2 * q : q, c = hid;
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
    case MODEL_ROLE_SHARED_GATE:
    case MODEL_ROLE_SHARED_UP:
        r = cfg->shared_intermediate, c = hid;
        break;
    case MODEL_ROLE_SHARED_DOWN:
        r = hid, c = cfg->shared_intermediate;
        break;
    case MODEL_ROLE_SHARED_EXPERT_GATE:
        r = 1, c = hid;
        break;
    case MODEL_ROLE_LIN_QKV:
        r = 2 * kd + vd, c = hid;
        break;
    case MODEL_ROLE_LIN_Z:
        r = vd, c = hid;
        break;
    case MODEL_ROLE_LIN_B:
    case MODEL_ROLE_LIN_A:
        r = nv, c = hid;
        break;
    case MODEL_ROLE_LIN_QKVZ:
        r = 2 * kd + 2 * vd, c = hid;
        break;
    case MODEL_ROLE_LIN_BA:
        r = 2 * nv, c = hid;
        break;
    case MODEL_ROLE_LIN_CONV:
        *dims = 3;
        shape[0] = 2 * kd + vd, shape[1] = 1, shape[2] = cfg->lin_conv;
        return;
    case MODEL_ROLE_LIN_A_LOG:
    case MODEL_ROLE_LIN_DT_BIAS:
        r = nv;
        break;
    case MODEL_ROLE_LIN_NORM:
        r = cfg->lin_v_dim;
        break;
    case MODEL_ROLE_LIN_OUT:
        r = hid, c = vd;
        break;
    case MODEL_ROLES:
        SHOAL_ASSERT(!"no such role");
    }
    shape[0] = r;
    shape[1] = c;
    shape[2] = 0;
    *dims = c ? 2 : 1;
}
