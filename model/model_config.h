/* model_config.h: a model's shape, read from its Hugging Face config.json.
 *
 * The fields every architecture shares are read here; the architecture named
 * by `architectures` (model_arch.h: Qwen3ForCausalLM, LlamaForCausalLM,
 * Qwen3MoeForCausalLM) reads its own and says which blocks each layer has.
 * Both the transformers 4 spelling (rope_theta, rope_scaling, torch_dtype)
 * and the transformers 5 one (rope_parameters, dtype) are read.
 * generation_config.json, when present, supplies the EOS ids. */
#ifndef SHOAL_MODEL_CONFIG_H
#define SHOAL_MODEL_CONFIG_H

#include "common/common_dtype.h"
#include "common/common_error.h"
#include "common/common_limits.h"

#include <stdbool.h>
#include <stdint.h>

typedef enum model_arch_id {
    MODEL_ARCH_QWEN3 = 1,
    MODEL_ARCH_LLAMA,
    MODEL_ARCH_QWEN3_MOE,
} model_arch_id;

/* The MLP block of a layer. */
typedef enum model_mlp_kind {
    MODEL_MLP_DENSE = 0, /* SwiGLU of intermediate rows */
    MODEL_MLP_MOE,       /* a router and experts of moe_intermediate rows */
} model_mlp_kind;

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
    /* Mixture of experts (experts 0 for none): each token goes to the
     * experts_per_tok experts of highest router softmax, weighted by their
     * probabilities, renormalized to sum to one when norm_topk_prob. */
    int experts;
    int experts_per_tok;
    int moe_intermediate;
    bool norm_topk_prob;
    uint8_t mlp_kind[SHOAL_MODEL_LAYERS_MAX]; /* model_mlp_kind of each layer */
} model_config;

/* For architecture files (model_arch.h): an integer field of root in
 * [lo, hi], def when absent (def -1: required); a bool field, def when
 * absent or not a bool. Errors name label and the field. */
struct cJSON;
shoal_err model_config_get_int(const struct cJSON *root, const char *key, int def, int lo, int hi,
                               const char *label, int *out, shoal_diag *diag);
bool model_config_get_bool(const struct cJSON *root, const char *key, bool def);

/* Whether any layer is a mixture of experts. */
bool model_config_has_moe(const model_config *cfg);

/* Parses config.json text. label names the file in messages. Unknown
 * architectures, activations other than silu, biases and rope types other
 * than default/llama3 are refused with SHOAL_ERR_UNSUPPORTED; missing or
 * out-of-range fields with SHOAL_ERR_FORMAT naming the field. */
shoal_err model_config_parse(const char *json, const char *label, model_config *cfg,
                             shoal_diag *diag);

/* Reads eos_token_id (a number or a list) and bos_token_id from
 * generation_config.json text, replacing what config.json said. */
shoal_err model_config_parse_generation(const char *json, const char *label, model_config *cfg,
                                        shoal_diag *diag);

/* Reads dir/config.json and, if present, dir/generation_config.json. */
shoal_err model_config_load(const char *dir, model_config *cfg, shoal_diag *diag);

/* Fills inv_freq[head_dim / 2] with the rotary inverse frequencies of cfg,
 * llama3 scaling applied, in float32 as transformers computes them. */
void model_config_rope_inv_freq(const model_config *cfg, float *inv_freq);

#endif
