/* Qwen3NextForCausalLM (Qwen3-Next-80B-A3B): a hybrid of gated DeltaNet
 * layers and gated full-attention layers (model_arch_parse_hybrid), and
 * Qwen3-MoE's sparse MLP with a shared expert behind a sigmoid gate
 * (model_arch_parse_moe). Its DeltaNet projections are fused and grouped
 * by key head: in_proj_qkvz holds, for each key head, its q, k, and its
 * value heads' v and z rows; in_proj_ba each key head's value heads' b
 * and a rows. The model regroups them at load into Qwen3.5's layout. */
#include "model/model_arch.h"

#define AT "model."

static const model_tensor_name tensors[] = {
    MODEL_DECODER_TENSOR_NAMES_AT(AT),
    MODEL_MOE_TENSOR_NAMES_AT(AT),
    MODEL_SHARED_EXPERT_TENSOR_NAMES_AT(AT),
    MODEL_LINEAR_TENSOR_NAMES_AT(AT),
    {MODEL_ROLE_LIN_QKVZ, AT "layers.%d.linear_attn.in_proj_qkvz.weight"},
    {MODEL_ROLE_LIN_BA, AT "layers.%d.linear_attn.in_proj_ba.weight"},
};

static shoal_err parse(const cJSON *root, const char *label, model_config *cfg, shoal_diag *diag)
{
    shoal_err err;
    if ((err = model_arch_parse_hybrid(root, label, cfg, diag)) ||
        (err = model_arch_parse_moe(root, label, cfg, diag)))
        return err;
    cfg->linear_fused = true;
    return SHOAL_OK;
}

const model_arch model_arch_qwen3_next = {
    .hf_name = "Qwen3NextForCausalLM",
    .id = MODEL_ARCH_QWEN3_NEXT,
    .qk_norm = true,
    .parse = parse,
    .tensors = tensors,
    .tensor_count = sizeof tensors / sizeof tensors[0],
};
