/* model_config.h: a model's shape, read from its Hugging Face config.json.
 *
 * Two architectures: Qwen3ForCausalLM (QK-norm) and LlamaForCausalLM (with
 * llama3 rope scaling or none). Both the transformers 4 spelling (rope_theta,
 * rope_scaling, torch_dtype) and the transformers 5 one (rope_parameters,
 * dtype) are read. generation_config.json, when present, supplies the EOS ids. */
#ifndef SHOAL_MODEL_CONFIG_H
#define SHOAL_MODEL_CONFIG_H

#include "common/common_dtype.h"
#include "common/common_error.h"
#include "common/common_limits.h"

#include <stdbool.h>

typedef enum model_arch_id {
    MODEL_ARCH_QWEN3 = 1,
    MODEL_ARCH_LLAMA,
} model_arch_id;

typedef struct model_config {
    model_arch_id arch;
    char arch_name[64];
    int vocab;
    int hidden;
    int intermediate;
    int layers;
    int heads;
    int kv_heads;
    int head_dim;
    int max_positions;
    float rms_eps;
    double rope_theta;
    bool qk_norm;
    bool tie_embeddings;
    /* llama3 rope scaling (rope_type "llama3"); off when rope_llama3 is false */
    bool rope_llama3;
    double rope_factor;
    double rope_low_freq_factor;
    double rope_high_freq_factor;
    int rope_original_max_positions;
    shoal_dtype dtype; /* what the config says the weights are; INVALID if unsaid */
    int bos_id;        /* -1 when unknown */
    int eos_count;
    int eos_ids[SHOAL_MODEL_EOS_IDS_MAX];
} model_config;

/* Parses config.json text. label names the file in messages. Unknown
 * architectures, activations other than silu, biases and rope types other
 * than default/llama3 are refused with SHOAL_ERR_UNSUPPORTED; missing or
 * out-of-range fields with SHOAL_ERR_FORMAT naming the field. */
shoal_err model_config_parse(const char *json, const char *label, model_config *cfg,
                              shoal_diag *diag);

/* Reads eos_token_id (a number or a list) and bos_token_id from
 * generation_config.json text, replacing what config.json said. */
shoal_err model_config_parse_generation(const char *json, const char *label,
                                         model_config *cfg, shoal_diag *diag);

/* Reads dir/config.json and, if present, dir/generation_config.json. */
shoal_err model_config_load(const char *dir, model_config *cfg, shoal_diag *diag);

/* Fills inv_freq[head_dim / 2] with the rotary inverse frequencies of cfg,
 * llama3 scaling applied, in float32 as transformers computes them. */
void model_config_rope_inv_freq(const model_config *cfg, float *inv_freq);

#endif
