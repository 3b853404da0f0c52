#include "model/model_cache.h"

#include <string.h>

void model_cache_spec_of(const model_config *cfg, model_cache_spec *spec)
{
    memset(spec, 0, sizeof *spec);
    int att = -1, state = -1;
    for (int l = 0; l < cfg->layers; l++) {
        bool linear = cfg->mixer_kind[l] == MODEL_MIXER_LINEAR;
        int *g = linear ? &state : &att;
        if (*g < 0) {
            *g = spec->groups++;
            model_cache_group *grp = &spec->group[*g];
            if (linear)
                *grp = (model_cache_group){.kind = MODEL_CACHE_STATE,
                                           .state_bytes = model_cache_state_bytes(cfg)};
            else
                *grp = (model_cache_group){.kind = MODEL_CACHE_ATTENTION,
                                           .kv_heads = cfg->kv_heads,
                                           .head_dim = cfg->head_dim};
        }
        spec->layer_group[l] = (uint8_t)*g;
        spec->page_layer[l] = linear ? -1 : (int16_t)spec->group[*g].layers;
        spec->group[*g].layers++;
    }
}

size_t model_cache_conv_bytes(const model_config *cfg)
{
    return (size_t)model_config_lin_conv_dim(cfg) * (size_t)(cfg->lin_conv - 1) * sizeof(float);
}

size_t model_cache_state_bytes(const model_config *cfg)
{
    return model_cache_conv_bytes(cfg) +
           (size_t)cfg->lin_v_heads * (size_t)cfg->lin_k_dim * (size_t)cfg->lin_v_dim * sizeof(float);
}

const model_cache_group *model_cache_state(const model_cache_spec *spec)
{
    for (int g = 0; g < spec->groups; g++)
        if (spec->group[g].kind == MODEL_CACHE_STATE)
            return &spec->group[g];
    return NULL;
}

size_t model_cache_slot_bytes(const model_cache_spec *spec)
{
    const model_cache_group *s = model_cache_state(spec);
    return s ? s->state_bytes * (size_t)s->layers : 0;
}

const model_cache_group *model_cache_attention(const model_cache_spec *spec)
{
    for (int g = 0; g < spec->groups; g++)
        if (spec->group[g].kind == MODEL_CACHE_ATTENTION)
            return &spec->group[g];
    return NULL;
}
