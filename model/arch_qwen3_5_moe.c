/* Qwen3_5MoeForConditionalGeneration (Qwen3.5-35B-A3B, -122B-A10B,
 * -397B-A17B), its text model: Qwen3.5's hybrid layers with every MLP a
 * mixture of experts and a shared expert. Its router always renormalizes
 * the top-k weights (transformers' Qwen3_5MoeTopKRouter has no
 * norm_topk_prob). */
#include "model/model_arch.h"

#define AT "model.language_model."

static const model_tensor_name tensors[] = {
    MODEL_DECODER_TENSOR_NAMES_AT(AT),
    MODEL_MOE_TENSOR_NAMES_AT(AT),
    MODEL_SHARED_EXPERT_TENSOR_NAMES_AT(AT),
    MODEL_LINEAR_TENSOR_NAMES_AT(AT),
    MODEL_SPLIT_LINEAR_TENSOR_NAMES_AT(AT),
};

static shoal_err parse(const cJSON *root, const char *label, model_config *cfg, shoal_diag *diag)
{
    shoal_err err;
    if ((err = model_arch_parse_hybrid(root, label, cfg, diag)) ||
        (err = model_arch_parse_moe(root, label, cfg, diag)))
        return err;
    cfg->norm_topk_prob = true;
    return SHOAL_OK;
}

const model_arch model_arch_qwen3_5_moe = {
    .hf_name = "Qwen3_5MoeForConditionalGeneration",
    .id = MODEL_ARCH_QWEN3_5_MOE,
    .qk_norm = true,
    .text_config = "text_config",
    .parse = parse,
    .tensors = tensors,
    .tensor_count = sizeof tensors / sizeof tensors[0],
};
