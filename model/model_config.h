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
    MODEL_ARCH_QWEN3_NEXT,
    MODEL_ARCH_QWEN3_5,
    MODEL_ARCH_QWEN3_5_MOE,
} model_arch_id;

/* The token mixer of a layer. */
typedef enum model_mixer_kind {
    MODEL_MIXER_ATTENTION = 0, /* softmax attention over the KV pages */
    MODEL_MIXER_LINEAR,        /* gated DeltaNet: a fixed-size state a stream */
} model_mixer_kind;

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
    /* A shared expert beside the routed ones (shared_intermediate rows,
     * 0 for none), its output scaled by sigmoid(shared_expert_gate x). */
    int shared_intermediate;

    /* Hybrid models (Qwen3-Next, Qwen3.5). */
    uint8_t mixer_kind[SHOAL_MODEL_LAYERS_MAX]; /* model_mixer_kind of each layer */
    /* RMSNorm weights stored as w - 1 (the norm scales by 1 + w), for every
     * norm but the gated one of the linear layers */
    bool norm_offset;
    /* q_proj gives each head's query and then a gate of head_dim; the
     * attention output is scaled by sigmoid(gate) before o_proj */
    bool attn_output_gate;
    int rope_dim; /* the leading dims of a head that rope rotates; head_dim unless partial */
    /* gated DeltaNet layers: key and value heads and dims, the depthwise
     * causal conv's kernel; linear_fused: Qwen3-Next's in_proj_qkvz and
     * in_proj_ba (grouped by key head) rather than Qwen3.5's four */
    int lin_k_heads, lin_v_heads, lin_k_dim, lin_v_dim, lin_conv;
    bool linear_fused;
} model_config;

/* For architecture files (model_arch.h): an integer field of root in
 * [lo, hi], def when absent (def -1: required); a bool field, def when
 * absent or not a bool. Errors name label and the field. */
struct cJSON;
shoal_err model_config_get_int(const struct cJSON *root, const char *key, int def, int lo, int hi,
                               const char *label, int *out, shoal_diag *diag);
bool model_config_get_bool(const struct cJSON *root, const char *key, bool def);

/* Whether any layer is a mixture of experts; any a linear-attention
 * (gated DeltaNet) layer; any a dense MLP. */
bool model_config_has_moe(const model_config *cfg);
bool model_config_has_linear(const model_config *cfg);
bool model_config_has_dense(const model_config *cfg);

/* The channels of a linear layer's conv: q, k and v (2 x k_heads x k_dim
 * + v_heads x v_dim). */
int model_config_lin_conv_dim(const model_config *cfg);

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
