#include "model/model_cache.h"

#include <string.h>

void model_cache_spec_of(const model_config *cfg, model_cache_spec *spec)
{
    /* every architecture of today: one group of attention layers */
    memset(spec, 0, sizeof *spec);
    spec->groups = 1;
    spec->group[0] = (model_cache_group){.kind = MODEL_CACHE_ATTENTION,
                                         .layers = cfg->layers,
                                         .kv_heads = cfg->kv_heads,
                                         .head_dim = cfg->head_dim};
    for (int l = 0; l < cfg->layers; l++) {
        spec->layer_group[l] = 0;
        spec->page_layer[l] = (int16_t)l;
    }
}

const model_cache_group *model_cache_attention(const model_cache_spec *spec)
{
    for (int g = 0; g < spec->groups; g++)
        if (spec->group[g].kind == MODEL_CACHE_ATTENTION)
            return &spec->group[g];
    return NULL;
}
