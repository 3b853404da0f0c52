/* LlamaForCausalLM: the Llama-style decoder, every layer attention and a
 * dense SwiGLU MLP; rope scaling of type llama3 (model_config.c). */
#include "model/model_arch.h"

static const model_tensor_name tensors[] = {MODEL_DECODER_TENSOR_NAMES};

static shoal_err parse(const cJSON *root, const char *label, model_config *cfg, shoal_diag *diag)
{
    (void)root, (void)label, (void)diag;
    for (int l = 0; l < cfg->layers; l++)
        cfg->mlp_kind[l] = MODEL_MLP_DENSE;
    return SHOAL_OK;
}

const model_arch model_arch_llama = {
    .hf_name = "LlamaForCausalLM",
    .id = MODEL_ARCH_LLAMA,
    .parse = parse,
    .tensors = tensors,
    .tensor_count = sizeof tensors / sizeof tensors[0],
};
