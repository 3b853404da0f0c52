/* LlamaForCausalLM: the Llama-style decoder, every layer attention and a
 * dense SwiGLU MLP; rope scaling of type llama3 (model_config.c). */
#include "model/model_arch.h"

static const model_tensor_name tensors[] = {MODEL_DECODER_TENSOR_NAMES};

const model_arch model_arch_llama = {
    .hf_name = "LlamaForCausalLM",
    .id = MODEL_ARCH_LLAMA,
    .parse = model_arch_parse_dense,
    .tensors = tensors,
    .tensor_count = sizeof tensors / sizeof tensors[0],
};
