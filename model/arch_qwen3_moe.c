/* Qwen3MoeForCausalLM (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention,
 * and in the sparse layers a router over `num_experts` SwiGLU experts of
 * moe_intermediate_size, experts_per_tok of them a token. A layer is sparse
 * unless it is in mlp_only_layers, when its index + 1 is a multiple of
 * decoder_sparse_step (transformers' rule); the others are dense MLPs of
 * intermediate_size. Checkpoints store each expert as its own tensors;
 * the model loads them into one stacked array a layer (model_blocks.c). */
#include "model/model_arch.h"

#include <stdio.h>

static const model_tensor_name tensors[] = {
    MODEL_DECODER_TENSOR_NAMES,
    {MODEL_ROLE_Q_NORM, "model.layers.%d.self_attn.q_norm.weight"},
    {MODEL_ROLE_K_NORM, "model.layers.%d.self_attn.k_norm.weight"},
    {MODEL_ROLE_ROUTER, "model.layers.%d.mlp.gate.weight"},
    {MODEL_ROLE_EXPERT_GATE, "model.layers.%d.mlp.experts.%d.gate_proj.weight"},
    {MODEL_ROLE_EXPERT_UP, "model.layers.%d.mlp.experts.%d.up_proj.weight"},
    {MODEL_ROLE_EXPERT_DOWN, "model.layers.%d.mlp.experts.%d.down_proj.weight"},
};

static shoal_err parse(const cJSON *root, const char *label, model_config *cfg, shoal_diag *diag)
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
        (err = model_config_get_int(root, "decoder_sparse_step", 1, 1, SHOAL_MODEL_LAYERS_MAX,
                                    label, &step, diag)))
        return err;
    if (cfg->experts_per_tok > SHOAL_MODEL_EXPERTS_PER_TOK_MAX)
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT,
                              "%s: num_experts_per_tok %d is over shoal's limit of %d", label,
                              cfg->experts_per_tok, SHOAL_MODEL_EXPERTS_PER_TOK_MAX);
    if (model_config_get_bool(root, "use_sliding_window", false))
        return shoal_diag_set(diag, SHOAL_ERR_UNSUPPORTED,
                              "%s: use_sliding_window is not supported", label);
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

const model_arch model_arch_qwen3_moe = {
    .hf_name = "Qwen3MoeForCausalLM",
    .id = MODEL_ARCH_QWEN3_MOE,
    .qk_norm = true,
    .parse = parse,
    .tensors = tensors,
    .tensor_count = sizeof tensors / sizeof tensors[0],
};
