/* Qwen3ForCausalLM: Llama's decoder with an RMSNorm on each q and k head
 * before rope (QK-norm) and a head_dim of its own. */
#include "model/model_arch.h"

static const model_tensor_name tensors[] = {
    MODEL_DECODER_TENSOR_NAMES,
    {MODEL_ROLE_Q_NORM, "model.layers.%d.self_attn.q_norm.weight"},
    {MODEL_ROLE_K_NORM, "model.layers.%d.self_attn.k_norm.weight"},
};

const model_arch model_arch_qwen3 = {
    .hf_name = "Qwen3ForCausalLM",
    .id = MODEL_ARCH_QWEN3,
    .qk_norm = true,
    .parse = model_arch_parse_dense,
    .tensors = tensors,
    .tensor_count = sizeof tensors / sizeof tensors[0],
};
