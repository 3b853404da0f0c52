/* model_arch.h: what one Hugging Face model class is, in shoal's blocks.
 *
 * An architecture is one small file (arch_llama.c, arch_qwen3.c,
 * arch_qwen3_moe.c) that gives
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
 *   [hidden][moe_intermediate], one of each per expert. */
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
    MODEL_ROLES
} model_role;

/* One row of a tensor table: a role and its Hugging Face name, a printf
 * format that takes the layer and then (expert roles) the expert index. */
typedef struct model_tensor_name {
    model_role role;
    const char *format;
} model_tensor_name;

/* The tensors of the Llama-style decoder that Llama, Qwen3 and Qwen3-MoE
 * share (a table's first rows). */
#define MODEL_DECODER_TENSOR_NAMES                                                                 \
    {MODEL_ROLE_EMBED, "model.embed_tokens.weight"}, {MODEL_ROLE_LM_HEAD, "lm_head.weight"},       \
        {MODEL_ROLE_FINAL_NORM, "model.norm.weight"},                                              \
        {MODEL_ROLE_ATTN_NORM, "model.layers.%d.input_layernorm.weight"},                          \
        {MODEL_ROLE_Q, "model.layers.%d.self_attn.q_proj.weight"},                                 \
        {MODEL_ROLE_K, "model.layers.%d.self_attn.k_proj.weight"},                                 \
        {MODEL_ROLE_V, "model.layers.%d.self_attn.v_proj.weight"},                                 \
        {MODEL_ROLE_O, "model.layers.%d.self_attn.o_proj.weight"},                                 \
        {MODEL_ROLE_MLP_NORM, "model.layers.%d.post_attention_layernorm.weight"},                  \
        {MODEL_ROLE_GATE, "model.layers.%d.mlp.gate_proj.weight"},                                 \
        {MODEL_ROLE_UP, "model.layers.%d.mlp.up_proj.weight"},                                     \
    {                                                                                              \
        MODEL_ROLE_DOWN, "model.layers.%d.mlp.down_proj.weight"                                    \
    }

typedef struct model_arch {
    const char *hf_name; /* config.json's architectures[0] */
    model_arch_id id;
    bool qk_norm; /* RMSNorm of each q and k head before rope */
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

/* The shape of `role` in cfg: dims 1 or 2, and shape[dims]. */
void model_tensor_shape(const model_config *cfg, model_role role, int *dims, int64_t shape[2]);

/* A parse for architectures with no fields of their own: every layer a
 * dense MLP. */
shoal_err model_arch_parse_dense(const cJSON *root, const char *label, model_config *cfg,
                                 shoal_diag *diag);

/* The architectures; model_arch.c lists them. */
extern const model_arch model_arch_llama;
extern const model_arch model_arch_qwen3;
extern const model_arch model_arch_qwen3_moe;

#endif
