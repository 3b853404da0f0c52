/* model_cache.h: what a model keeps per stream between passes, layer by
 * layer (the cache spec).
 *
 * Layers fall into groups of one kind. An ATTENTION group's layers keep
 * K and V in the shared pages (kernels_kv_layout: a page holds
 * page_tokens tokens of every layer of the group, so it moves as one
 * block); a STATE group's layers keep one fixed-size state a stream (the
 * recurrent state of a linear-attention layer), which hybrid models add.
 * Dense and MoE models have one ATTENTION group of every layer; hybrids
 * (Qwen3-Next, Qwen3.5) an ATTENTION group of their full-attention layers
 * and a STATE group of their gated DeltaNet layers. The KV layout, the
 * pages and what the store and peers move are made from the ATTENTION
 * group: its layers are the pages' layers, in order (page_layer).
 *
 * A STATE layer's state of one stream is its conv's last lin_conv - 1
 * inputs, F32 [conv_dim][lin_conv - 1], then the delta rule's matrix, F32
 * [lin_v_heads][lin_k_dim][lin_v_dim]; a stream's slot holds those of
 * every STATE layer in order (model_cache_slot_bytes), so a slot moves as
 * one block. F32 whatever the backend, so a slot means the same bytes on
 * the CPU and the GPU. */
#ifndef SHOAL_MODEL_CACHE_H
#define SHOAL_MODEL_CACHE_H

#include "common/common_limits.h"
#include "model/model_config.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum model_cache_kind {
    MODEL_CACHE_ATTENTION = 1, /* K and V of every token, in pages */
    MODEL_CACHE_STATE,         /* a fixed-size state a stream */
} model_cache_kind;

enum { MODEL_CACHE_GROUPS_MAX = 4 };

typedef struct model_cache_group {
    model_cache_kind kind;
    int layers; /* how many layers are in the group */
    /* ATTENTION: the shape of a layer's K (and V) of one token */
    int kv_heads, head_dim;
    /* STATE: bytes of one layer's state of one stream */
    size_t state_bytes;
} model_cache_group;

typedef struct model_cache_spec {
    int groups;
    model_cache_group group[MODEL_CACHE_GROUPS_MAX];
    uint8_t layer_group[SHOAL_MODEL_LAYERS_MAX]; /* each layer's group */
    /* an ATTENTION layer's index among its group's layers (its layer in
     * a page); -1 for other layers */
    int16_t page_layer[SHOAL_MODEL_LAYERS_MAX];
} model_cache_spec;

/* The spec of cfg's architecture. */
void model_cache_spec_of(const model_config *cfg, model_cache_spec *spec);

/* The ATTENTION group (NULL when the model has none); the STATE group
 * (NULL for models without linear layers). */
const model_cache_group *model_cache_attention(const model_cache_spec *spec);
const model_cache_group *model_cache_state(const model_cache_spec *spec);

/* Bytes of one STATE layer's state of a stream, and of its conv part
 * (the first bytes); bytes of a stream's slot (0 without STATE layers). */
size_t model_cache_state_bytes(const model_config *cfg);
size_t model_cache_conv_bytes(const model_config *cfg);
size_t model_cache_slot_bytes(const model_cache_spec *spec);

#endif
