#include "model_weights.h"

#include "common/common_file.h"
#include "common/common_limits.h"
#include "common/common_rng.h"
#include "model_safetensors.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Memory this object owns: dummy tensors and aligned copies. */
struct owned_block {
    struct owned_block *next;
    void *data;
};

struct model_weights {
    bool dummy;
    uint64_t seed;
    int shards;
    char (*shard_paths)[SHOAL_PATH_BYTES_MAX];
    model_safetensors *shard; /* [shards] */
    struct owned_block *owned;
};

static void *own(model_weights *w, size_t bytes)
{
    struct owned_block *b = calloc(1, sizeof *b);
    void *data = b ? aligned_alloc(64, (bytes + 63) & ~(size_t)63) : NULL;
    if (!data) {
        free(b);
        return NULL;
    }
    b->data = data;
    b->next = w->owned;
    w->owned = b;
    return data;
}

void model_weights_close(model_weights *w)
{
    if (!w)
        return;
    for (int i = 0; i < w->shards; i++)
        model_safetensors_close(&w->shard[i]);
    while (w->owned) {
        struct owned_block *b = w->owned;
        w->owned = b->next;
        free(b->data);
        free(b);
    }
    free(w->shard);
    free(w->shard_paths);
    free(w);
}

shoal_err model_weights_open_dummy(uint64_t seed, model_weights **out)
{
    model_weights *w = calloc(1, sizeof *w);
    if (!w)
        return SHOAL_ERR_NOMEM;
    w->dummy = true;
    w->seed = seed;
    *out = w;
    return SHOAL_OK;
}

/* Shard file names come from the index, which we do not trust: a name must
 * be a plain file name in the model directory. */
static bool plain_file_name(const char *s)
{
    return s[0] != '\0' && s[0] != '.' && strchr(s, '/') == NULL && strlen(s) < 256;
}

/* Reads the index and lists the distinct shard files, in first-seen order. */
static shoal_err read_index(model_weights *w, const char *dir, const char *index_path,
                            shoal_diag *diag)
{
    char *text = NULL;
    shoal_err err = common_file_read(index_path, SHOAL_JSON_FILE_BYTES_MAX, &text, NULL, diag);
    if (err)
        return err;
    cJSON *root = cJSON_Parse(text);
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(map)) {
        err = shoal_diag_set(diag, SHOAL_ERR_FORMAT, "%s: missing object 'weight_map'", index_path);
        goto out;
    }
    w->shard_paths = calloc(SHOAL_MODEL_SHARDS_MAX, sizeof *w->shard_paths);
    if (!w->shard_paths) {
        err = SHOAL_ERR_NOMEM;
        goto out;
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, map)
    {
        if (!cJSON_IsString(e) || !plain_file_name(e->valuestring)) {
            err = shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                                 "%s: tensor '%.200s' maps to something that is not a file name "
                                 "in the model directory",
                                 index_path, e->string);
            goto out;
        }
        char path[SHOAL_PATH_BYTES_MAX];
        if (common_path_join(path, sizeof path, dir, e->valuestring)) {
            err = shoal_diag_set(diag, SHOAL_ERR_LIMIT, "%s: path too long", dir);
            goto out;
        }
        int i = 0;
        while (i < w->shards && strcmp(w->shard_paths[i], path) != 0)
            i++;
        if (i < w->shards)
            continue;
        if (w->shards == SHOAL_MODEL_SHARDS_MAX) {
            err = shoal_diag_set(diag, SHOAL_ERR_LIMIT, "%s: more than %d shard files", index_path,
                                 SHOAL_MODEL_SHARDS_MAX);
            goto out;
        }
        snprintf(w->shard_paths[w->shards++], SHOAL_PATH_BYTES_MAX, "%s", path);
    }
    if (w->shards == 0)
        err =
            shoal_diag_set(diag, SHOAL_ERR_FORMAT, "%s: 'weight_map' lists no tensors", index_path);
out:
    cJSON_Delete(root);
    free(text);
    return err;
}

shoal_err model_weights_open(const char *dir, model_weights **out, shoal_diag *diag)
{
    shoal_err err;
    char single[SHOAL_PATH_BYTES_MAX], index[SHOAL_PATH_BYTES_MAX];
    *out = NULL;
    if (common_path_join(single, sizeof single, dir, "model.safetensors") ||
        common_path_join(index, sizeof index, dir, "model.safetensors.index.json"))
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT, "%s: path too long", dir);
    model_weights *w = calloc(1, sizeof *w);
    if (!w)
        return SHOAL_ERR_NOMEM;
    if (common_file_exists(index)) {
        if ((err = read_index(w, dir, index, diag)))
            goto out_close;
    } else if (common_file_exists(single)) {
        w->shard_paths = calloc(1, sizeof *w->shard_paths);
        if (!w->shard_paths) {
            err = SHOAL_ERR_NOMEM;
            goto out_close;
        }
        snprintf(w->shard_paths[0], SHOAL_PATH_BYTES_MAX, "%s", single);
        w->shards = 1;
    } else {
        err = shoal_diag_set(diag, SHOAL_ERR_NOT_FOUND,
                             "%s: neither model.safetensors nor model.safetensors.index.json "
                             "(use --load-format dummy to run without weights)",
                             dir);
        goto out_close;
    }
    w->shard = calloc((size_t)w->shards, sizeof *w->shard);
    if (!w->shard) {
        err = SHOAL_ERR_NOMEM;
        goto out_close;
    }
    int opened = w->shards;
    w->shards = 0; /* counts opened shards, so close() releases exactly those */
    for (int i = 0; i < opened; i++) {
        if ((err = model_safetensors_open(w->shard_paths[i], &w->shard[i], diag)))
            goto out_close;
        w->shards++;
    }
    *out = w;
    return SHOAL_OK;
out_close:
    model_weights_close(w);
    return err;
}

int model_weights_shards(const model_weights *w)
{
    return w->shards;
}

void model_weights_shard(const model_weights *w, int i, const void **data, size_t *bytes)
{
    *data = w->shard[i].map.data;
    *bytes = w->shard[i].map.bytes;
}

bool model_weights_is_dummy(const model_weights *w)
{
    return w->dummy;
}

bool model_weights_has(const model_weights *w, const char *name)
{
    for (int i = 0; i < w->shards; i++)
        if (model_safetensors_find(&w->shard[i], name))
            return true;
    return false;
}

static void shape_text(char *buf, size_t bytes, int dims, const int64_t *shape)
{
    size_t n = (size_t)snprintf(buf, bytes, "[");
    for (int i = 0; i < dims && n < bytes; i++)
        n += (size_t)snprintf(buf + n, bytes - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (n < bytes)
        snprintf(buf + n, bytes - n, "]");
}

void model_weights_dummy_recipe(const model_weights *w, const char *name, int dims, uint64_t *state,
                                float *base, float *scale)
{
    /* Seed from the name so a tensor's values do not depend on load order. */
    uint64_t st = w->seed;
    for (const char *c = name; *c; c++)
        st = st * 1099511628211ull ^ (unsigned char)*c;
    *state = st;
    /* Vectors are norm weights: near one. Matrices: uniform at a scale that
     * keeps activations finite through many layers. */
    *scale = dims == 1 ? 0.1f : 0.02f;
    *base = dims == 1 ? 1.0f : 0.0f;
}

static shoal_err get_dummy(model_weights *w, const char *name, int dims, const int64_t *shape,
                           model_tensor_ref *out)
{
    uint64_t n = 1;
    for (int i = 0; i < dims; i++)
        n *= (uint64_t)shape[i];
    uint16_t *data = own(w, n * 2);
    if (!data)
        return SHOAL_ERR_NOMEM;
    uint64_t state;
    float base, scale;
    model_weights_dummy_recipe(w, name, dims, &state, &base, &scale);
    for (uint64_t i = 0; i < n; i++)
        data[i] = shoal_f32_to_bf16(base + scale * common_rng_uniform(&state));
    out->data = data;
    out->dtype = SHOAL_DTYPE_BF16;
    out->bytes = n * 2;
    return SHOAL_OK;
}

shoal_err model_weights_get(model_weights *w, const char *name, int dims, const int64_t *shape,
                            model_tensor_ref *out, shoal_diag *diag)
{
    if (w->dummy)
        return get_dummy(w, name, dims, shape, out);
    const model_tensor_info *t = NULL;
    int s = 0;
    for (; s < w->shards && !t; s++)
        t = model_safetensors_find(&w->shard[s], name);
    if (!t)
        return shoal_diag_set(diag, SHOAL_ERR_NOT_FOUND, "tensor '%s' is in no file of the model",
                              name);
    const char *file = w->shard_paths[s - 1];
    bool shape_ok = t->dims == dims;
    for (int i = 0; shape_ok && i < dims; i++)
        shape_ok = t->shape[i] == shape[i];
    if (!shape_ok) {
        char want[128], got[128];
        shape_text(want, sizeof want, dims, shape);
        shape_text(got, sizeof got, t->dims, t->shape);
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                              "%s: tensor '%s' has shape %s, expected %s from config.json", file,
                              name, got, want);
    }
    if (t->dtype != SHOAL_DTYPE_BF16 && t->dtype != SHOAL_DTYPE_F16 && t->dtype != SHOAL_DTYPE_F32)
        return shoal_diag_set(diag, SHOAL_ERR_UNSUPPORTED,
                              "%s: tensor '%s' is %s; shoal loads BF16, F16 and F32", file, name,
                              shoal_dtype_name(t->dtype));
    const unsigned char *data = w->shard[s - 1].data + t->begin;
    uint64_t bytes = t->end - t->begin;
    size_t elem = shoal_dtype_bytes(t->dtype);
    if ((uintptr_t)data % elem != 0) {
        /* The format does not promise alignment; copy rather than read
         * misaligned elements on every step. */
        void *copy = own(w, bytes);
        if (!copy)
            return shoal_diag_set(diag, SHOAL_ERR_NOMEM, "%s: no memory to align tensor '%s'", file,
                                  name);
        memcpy(copy, data, bytes);
        data = copy;
    }
    out->data = data;
    out->dtype = t->dtype;
    out->bytes = bytes;
    return SHOAL_OK;
}
