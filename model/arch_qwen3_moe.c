/* Qwen3MoeForCausalLM (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention,
 * and in the sparse layers a router over `num_experts` SwiGLU experts of
 * moe_intermediate_size, experts_per_tok of them a token. A layer is sparse
 * unless it is in mlp_only_layers, when its index + 1 is a multiple of
 * decoder_sparse_step (transformers' rule); the others are dense MLPs of
 * intermediate_size (model_arch_parse_moe). Checkpoints store each expert
 * as its own tensors; the model loads them into one stacked array a layer. */
#include "model/model_arch.h"

static const model_tensor_name tensors[] = {
    MODEL_DECODER_TENSOR_NAMES,
    {MODEL_ROLE_Q_NORM, "model.layers.%d.self_attn.q_norm.weight"},
    {MODEL_ROLE_K_NORM, "model.layers.%d.self_attn.k_norm.weight"},
    MODEL_MOE_TENSOR_NAMES_AT("model."),
};

static shoal_err parse(const cJSON *root, const char *label, model_config *cfg, shoal_diag *diag)
{
    if (model_config_get_bool(root, "use_sliding_window", false))
        return shoal_diag_set(diag, SHOAL_ERR_UNSUPPORTED,
                              "%s: use_sliding_window is not supported", label);
    return model_arch_parse_moe(root, label, cfg, diag);
}

const model_arch model_arch_qwen3_moe = {
    .hf_name = "Qwen3MoeForCausalLM",
    .id = MODEL_ARCH_QWEN3_MOE,
    .qk_norm = true,
    .parse = parse,
    .tensors = tensors,
    .tensor_count = sizeof tensors / sizeof tensors[0],
};
