/* model_arch.h: what one Hugging Face model class is, in shoal's blocks.
 *
 * An architecture is one small file (arch_llama.c, arch_qwen3.c,
 * arch_qwen3_moe.c, arch_qwen3_next.c, arch_qwen3_5.c, arch_qwen3_5_moe.c)
 * that gives
 *   - its hyperparameters: the fields of config.json beyond the common ones
 *     (model_config.c reads those), and the blocks of each layer;
 *   - its tensor table: the Hugging Face name of every weight by its role;
 *     the shape of a role is the same in every architecture
 *     (model_tensor_shape), so a table holds names alone;
 *   - its forward pass, as the list of blocks per layer (attention, then a
 *     dense or a mixture-of-experts MLP), which worker_model.c runs through
 *     the blocks of model_blocks.h. Fusion choices live in the blocks and
 *     behind the backend's ops, never here.
 *
 * A new architecture adds a file, its entry in model_arch_find's list and,
 * where it needs a block that does not exist yet, that block. */
#ifndef SHOAL_MODEL_ARCH_H
#define SHOAL_MODEL_ARCH_H

#include "common/common_error.h"
#include "model/model_config.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>

/* The role of a weight. Shapes ([rows][cols], or [n] for vectors):
 *   EMBED, LM_HEAD [vocab][hidden]; FINAL_NORM, ATTN_NORM, MLP_NORM [hidden]
 *   Q [heads * head_dim][hidden]; K, V [kv_heads * head_dim][hidden]
 *   O [hidden][heads * head_dim]; Q_NORM, K_NORM [head_dim]
 *   GATE, UP [intermediate][hidden]; DOWN [hidden][intermediate]
 *   ROUTER [experts][hidden]
 *   EXPERT_GATE, EXPERT_UP [moe_intermediate][hidden] and EXPERT_DOWN
 *   [hidden][moe_intermediate], one of each per expert
 *   SHARED_GATE, SHARED_UP [shared_intermediate][hidden], SHARED_DOWN
 *   [hidden][shared_intermediate], SHARED_EXPERT_GATE [1][hidden]
 * With attn_output_gate, Q is [heads * 2 * head_dim][hidden]: each head's
 * query rows, then its gate rows. A gated DeltaNet layer (kd = lin_k_heads
 * x lin_k_dim, vd = lin_v_heads x lin_v_dim, nv = lin_v_heads):
 *   LIN_QKV [2 kd + vd][hidden], LIN_Z [vd][hidden], LIN_B, LIN_A
 *   [nv][hidden] (Qwen3.5), or LIN_QKVZ [2 kd + 2 vd][hidden] and LIN_BA
 *   [2 nv][hidden] grouped by key head (Qwen3-Next);
 *   LIN_CONV [2 kd + vd][1][lin_conv]; LIN_A_LOG, LIN_DT_BIAS [nv];
 *   LIN_NORM [lin_v_dim]; LIN_OUT [hidden][vd]. */
typedef enum model_role {
    MODEL_ROLE_EMBED = 0,
    MODEL_ROLE_LM_HEAD,
    MODEL_ROLE_FINAL_NORM,
    MODEL_ROLE_ATTN_NORM,
    MODEL_ROLE_Q,
    MODEL_ROLE_K,
    MODEL_ROLE_V,
    MODEL_ROLE_O,
    MODEL_ROLE_Q_NORM,
    MODEL_ROLE_K_NORM,
    MODEL_ROLE_MLP_NORM,
    MODEL_ROLE_GATE,
    MODEL_ROLE_UP,
    MODEL_ROLE_DOWN,
    MODEL_ROLE_ROUTER,
    MODEL_ROLE_EXPERT_GATE,
    MODEL_ROLE_EXPERT_UP,
    MODEL_ROLE_EXPERT_DOWN,
    MODEL_ROLE_SHARED_GATE,
    MODEL_ROLE_SHARED_UP,
    MODEL_ROLE_SHARED_DOWN,
    MODEL_ROLE_SHARED_EXPERT_GATE,
    MODEL_ROLE_LIN_QKV,
    MODEL_ROLE_LIN_Z,
    MODEL_ROLE_LIN_B,
    MODEL_ROLE_LIN_A,
    MODEL_ROLE_LIN_QKVZ,
    MODEL_ROLE_LIN_BA,
    MODEL_ROLE_LIN_CONV,
    MODEL_ROLE_LIN_A_LOG,
    MODEL_ROLE_LIN_DT_BIAS,
    MODEL_ROLE_LIN_NORM,
    MODEL_ROLE_LIN_OUT,
    MODEL_ROLES
} model_role;

/* One row of a tensor table: a role and its Hugging Face name, a printf
 * format that takes the layer and then (expert roles) the expert index. */
typedef struct model_tensor_name {
    model_role role;
    const char *format;
} model_tensor_name;

/* The tensors of the Llama-style decoder that every architecture shares
 * (a table's first rows), its module path given ("model." for causal
 * LMs, "model.language_model." for multimodal checkpoints). */
#define MODEL_DECODER_TENSOR_NAMES_AT(at)                                                          \
    {MODEL_ROLE_EMBED, at "embed_tokens.weight"}, {MODEL_ROLE_LM_HEAD, "lm_head.weight"},          \
        {MODEL_ROLE_FINAL_NORM, at "norm.weight"},                                                 \
        {MODEL_ROLE_ATTN_NORM, at "layers.%d.input_layernorm.weight"},                             \
        {MODEL_ROLE_Q, at "layers.%d.self_attn.q_proj.weight"},                                    \
        {MODEL_ROLE_K, at "layers.%d.self_attn.k_proj.weight"},                                    \
        {MODEL_ROLE_V, at "layers.%d.self_attn.v_proj.weight"},                                    \
        {MODEL_ROLE_O, at "layers.%d.self_attn.o_proj.weight"},                                    \
        {MODEL_ROLE_MLP_NORM, at "layers.%d.post_attention_layernorm.weight"},                     \
        {MODEL_ROLE_GATE, at "layers.%d.mlp.gate_proj.weight"},                                    \
        {MODEL_ROLE_UP, at "layers.%d.mlp.up_proj.weight"},                                        \
        {MODEL_ROLE_DOWN, at "layers.%d.mlp.down_proj.weight"}
#define MODEL_DECODER_TENSOR_NAMES MODEL_DECODER_TENSOR_NAMES_AT("model.")

/* The mixture-of-experts block's tensors (router, experts, shared expert)
 * and the gated DeltaNet's common ones, under the same module path. */
#define MODEL_MOE_TENSOR_NAMES_AT(at)                                                              \
    {MODEL_ROLE_ROUTER, at "layers.%d.mlp.gate.weight"},                                           \
        {MODEL_ROLE_EXPERT_GATE, at "layers.%d.mlp.experts.%d.gate_proj.weight"},                  \
        {MODEL_ROLE_EXPERT_UP, at "layers.%d.mlp.experts.%d.up_proj.weight"},                      \
        {MODEL_ROLE_EXPERT_DOWN, at "layers.%d.mlp.experts.%d.down_proj.weight"}
#define MODEL_SHARED_EXPERT_TENSOR_NAMES_AT(at)                                                    \
    {MODEL_ROLE_SHARED_GATE, at "layers.%d.mlp.shared_expert.gate_proj.weight"},                   \
        {MODEL_ROLE_SHARED_UP, at "layers.%d.mlp.shared_expert.up_proj.weight"},                   \
        {MODEL_ROLE_SHARED_DOWN, at "layers.%d.mlp.shared_expert.down_proj.weight"},               \
        {MODEL_ROLE_SHARED_EXPERT_GATE, at "layers.%d.mlp.shared_expert_gate.weight"}
#define MODEL_LINEAR_TENSOR_NAMES_AT(at)                                                           \
    {MODEL_ROLE_Q_NORM, at "layers.%d.self_attn.q_norm.weight"},                                   \
        {MODEL_ROLE_K_NORM, at "layers.%d.self_attn.k_norm.weight"},                               \
        {MODEL_ROLE_LIN_CONV, at "layers.%d.linear_attn.conv1d.weight"},                           \
        {MODEL_ROLE_LIN_A_LOG, at "layers.%d.linear_attn.A_log"},                                  \
        {MODEL_ROLE_LIN_DT_BIAS, at "layers.%d.linear_attn.dt_bias"},                              \
        {MODEL_ROLE_LIN_NORM, at "layers.%d.linear_attn.norm.weight"},                             \
        {MODEL_ROLE_LIN_OUT, at "layers.%d.linear_attn.out_proj.weight"}

/* Qwen3.5's split DeltaNet projections (Qwen3-Next fuses them). */
#define MODEL_SPLIT_LINEAR_TENSOR_NAMES_AT(at)                                                     \
    {MODEL_ROLE_LIN_QKV, at "layers.%d.linear_attn.in_proj_qkv.weight"},                           \
        {MODEL_ROLE_LIN_Z, at "layers.%d.linear_attn.in_proj_z.weight"},                           \
        {MODEL_ROLE_LIN_B, at "layers.%d.linear_attn.in_proj_b.weight"},                           \
        {MODEL_ROLE_LIN_A, at "layers.%d.linear_attn.in_proj_a.weight"}

typedef struct model_arch {
    const char *hf_name; /* config.json's architectures[0] */
    model_arch_id id;
    bool qk_norm; /* RMSNorm of each q and k head before rope */
    /* the config.json object that holds the text model's fields (NULL:
     * the top level) */
    const char *text_config;
    /* Reads the architecture's own fields of config.json (the common ones
     * are in cfg already) and fills cfg->mlp_kind. Errors name the field. */
    shoal_err (*parse)(const cJSON *root, const char *label, model_config *cfg, shoal_diag *diag);
    const model_tensor_name *tensors;
    int tensor_count;
} model_arch;

/* The architecture of that Hugging Face name; NULL if shoal has none.
 * model_arch_names lists them all for messages ("A, B and C"). */
const model_arch *model_arch_find(const char *hf_name);
const model_arch *model_arch_of(model_arch_id id);
const char *model_arch_names(void);

/* The Hugging Face name of `role` in layer `layer` (and `expert`, for the
 * expert roles) of cfg's architecture, into buf; false when the
 * architecture has no tensor of that role. Layer and expert are ignored
 * for roles that have none. */
bool model_tensor_name_of(const model_config *cfg, model_role role, int layer, int expert,
                          char *buf, size_t bytes);

/* The shape of `role` in cfg: dims 1 to 3, and shape[dims]. */
void model_tensor_shape(const model_config *cfg, model_role role, int *dims, int64_t shape[3]);

/* A parse for architectures with no fields of their own: every layer a
 * dense MLP. */
shoal_err model_arch_parse_dense(const cJSON *root, const char *label, model_config *cfg,
                                 shoal_diag *diag);

/* The mixture-of-experts fields (Qwen3-MoE's: num_experts,
 * num_experts_per_tok, moe_intermediate_size, norm_topk_prob,
 * decoder_sparse_step, mlp_only_layers; shared_expert_intermediate_size
 * where present), setting each layer's mlp_kind. */
shoal_err model_arch_parse_moe(const cJSON *root, const char *label, model_config *cfg,
                               shoal_diag *diag);

/* The hybrid fields (Qwen3-Next's and Qwen3.5's): layer_types (or
 * full_attention_interval), the linear_* shapes, partial_rotary_factor;
 * sets each layer's mixer_kind, the (1 + w) norms and the gated
 * attention. */
shoal_err model_arch_parse_hybrid(const cJSON *root, const char *label, model_config *cfg,
                                  shoal_diag *diag);

/* The architectures; model_arch.c lists them. */
extern const model_arch model_arch_llama;
extern const model_arch model_arch_qwen3;
extern const model_arch model_arch_qwen3_moe;
extern const model_arch model_arch_qwen3_next;
extern const model_arch model_arch_qwen3_5;
extern const model_arch model_arch_qwen3_5_moe;

#endif
