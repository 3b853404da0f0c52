/* Qwen3_5ForConditionalGeneration (Qwen3.5-27B and the dense sizes), its
 * text model: Qwen3-Next's hybrid of gated DeltaNet and gated attention
 * layers (model_arch_parse_hybrid) with dense MLPs, the DeltaNet
 * projections split (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a), the
 * fields under text_config and the weights under model.language_model.
 * The vision tower (model.visual.*) is not loaded. */
#include "model/model_arch.h"

#define AT "model.language_model."

static const model_tensor_name tensors[] = {
    MODEL_DECODER_TENSOR_NAMES_AT(AT),
    MODEL_LINEAR_TENSOR_NAMES_AT(AT),
    MODEL_SPLIT_LINEAR_TENSOR_NAMES_AT(AT),
};

static shoal_err parse(const cJSON *root, const char *label, model_config *cfg, shoal_diag *diag)
{
    shoal_err err;
    if ((err = model_arch_parse_hybrid(root, label, cfg, diag)))
        return err;
    return model_arch_parse_dense(root, label, cfg, diag);
}

const model_arch model_arch_qwen3_5 = {
    .hf_name = "Qwen3_5ForConditionalGeneration",
    .id = MODEL_ARCH_QWEN3_5,
    .qk_norm = true,
    .text_config = "text_config",
    .parse = parse,
    .tensors = tensors,
    .tensor_count = sizeof tensors / sizeof tensors[0],
};
