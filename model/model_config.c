#include "model_config.h"

#include "common/common_file.h"
#include "model/model_arch.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An integer field in [lo, hi]; absent gives def (or an error if def < 0
 * means required). */
shoal_err model_config_get_int(const cJSON *root, const char *key, int def, int lo, int hi,
                               const char *label, int *out, shoal_diag *diag)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) {
        if (def == -1)
            return shoal_diag_set(diag, SHOAL_ERR_FORMAT, "%s: missing field '%s'", label, key);
        *out = def;
        return SHOAL_OK;
    }
    if (!cJSON_IsNumber(v) || floor(v->valuedouble) != v->valuedouble || v->valuedouble < lo ||
        v->valuedouble > hi)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                              "%s: field '%s' must be an integer in [%d, %d]", label, key, lo, hi);
    *out = (int)v->valuedouble;
    return SHOAL_OK;
}

static shoal_err get_double(const cJSON *root, const char *key, double def, double lo, double hi,
                            const char *label, double *out, shoal_diag *diag)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) {
        if (isnan(def))
            return shoal_diag_set(diag, SHOAL_ERR_FORMAT, "%s: missing field '%s'", label, key);
        *out = def;
        return SHOAL_OK;
    }
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi))
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT, "%s: field '%s' must be a number in [%g, %g]",
                              label, key, lo, hi);
    *out = v->valuedouble;
    return SHOAL_OK;
}

bool model_config_get_bool(const cJSON *root, const char *key, bool def)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : def;
}

/* eos_token_id is a number or a list of numbers. */
static shoal_err get_eos(const cJSON *root, const char *label, model_config *cfg, shoal_diag *diag)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "eos_token_id");
    if (!v || cJSON_IsNull(v))
        return SHOAL_OK;
    int n = 0;
    int ids[SHOAL_MODEL_EOS_IDS_MAX];
    if (cJSON_IsNumber(v)) {
        ids[n++] = (int)v->valuedouble;
        if (v->valuedouble != ids[0])
            n = -1;
    } else if (cJSON_IsArray(v)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, v)
        {
            if (n == SHOAL_MODEL_EOS_IDS_MAX)
                return shoal_diag_set(diag, SHOAL_ERR_LIMIT,
                                      "%s: more than %d ids in 'eos_token_id'", label,
                                      SHOAL_MODEL_EOS_IDS_MAX);
            if (!cJSON_IsNumber(e) || e->valuedouble != (int)e->valuedouble) {
                n = -1;
                break;
            }
            ids[n++] = (int)e->valuedouble;
        }
    } else {
        n = -1;
    }
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= cfg->vocab)
            n = -1;
    if (n < 0)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                              "%s: 'eos_token_id' must be a token id or a list of token ids "
                              "below the vocabulary size %d",
                              label, cfg->vocab);
    cfg->eos_count = n;
    memcpy(cfg->eos_ids, ids, (size_t)n * sizeof ids[0]);
    return SHOAL_OK;
}

/* Rope settings: transformers 5 nests them in rope_parameters, 4 has
 * rope_theta and rope_scaling at the top. */
static shoal_err parse_rope(const cJSON *root, const char *label, model_config *cfg,
                            shoal_diag *diag)
{
    shoal_err err;
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    const cJSON *scaling = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    const cJSON *theta_src = root;
    if (cJSON_IsObject(params)) {
        scaling = params;
        if (cJSON_GetObjectItemCaseSensitive(params, "rope_theta"))
            theta_src = params;
    }
    err = get_double(theta_src, "rope_theta", 10000.0, 1.0, 1e12, label, &cfg->rope_theta, diag);
    if (err)
        return err;
    if (!scaling || cJSON_IsNull(scaling))
        return SHOAL_OK;
    if (!cJSON_IsObject(scaling))
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT, "%s: 'rope_scaling' must be an object",
                              label);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(scaling, "rope_type");
    if (!type)
        type = cJSON_GetObjectItemCaseSensitive(scaling, "type");
    const char *t = cJSON_IsString(type) ? type->valuestring : "default";
    if (strcmp(t, "default") == 0)
        return SHOAL_OK;
    if (strcmp(t, "llama3") != 0)
        return shoal_diag_set(diag, SHOAL_ERR_UNSUPPORTED,
                              "%s: rope type '%.32s' is not supported (shoal runs 'default' "
                              "and 'llama3')",
                              label, t);
    cfg->rope_llama3 = true;
    const double nan_required = NAN;
    if ((err = get_double(scaling, "factor", nan_required, 1.0, 1e6, label, &cfg->rope_factor,
                          diag)) ||
        (err = get_double(scaling, "low_freq_factor", nan_required, 1e-6, 1e6, label,
                          &cfg->rope_low_freq_factor, diag)) ||
        (err = get_double(scaling, "high_freq_factor", nan_required, 1e-6, 1e6, label,
                          &cfg->rope_high_freq_factor, diag)) ||
        (err = model_config_get_int(scaling, "original_max_position_embeddings", -1, 1,
                                    SHOAL_CONTEXT_TOKENS_MAX, label,
                                    &cfg->rope_original_max_positions, diag)))
        return err;
    if (cfg->rope_high_freq_factor <= cfg->rope_low_freq_factor)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                              "%s: rope 'high_freq_factor' must be above 'low_freq_factor'", label);
    return SHOAL_OK;
}

shoal_err model_config_parse(const char *json, const char *label, model_config *cfg,
                             shoal_diag *diag)
{
    shoal_err err;
    memset(cfg, 0, sizeof *cfg);
    const cJSON *root = NULL;
    cJSON *doc = cJSON_Parse(json);
    if (!cJSON_IsObject(doc)) {
        err = shoal_diag_set(diag, SHOAL_ERR_FORMAT, "%s: not a JSON object", label);
        goto out;
    }
    root = doc;
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    const cJSON *arch = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
    if (!cJSON_IsString(arch)) {
        err = shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                             "%s: missing 'architectures' (a list naming the model class)", label);
        goto out;
    }
    snprintf(cfg->arch_name, sizeof cfg->arch_name, "%s", arch->valuestring);
    const model_arch *a = model_arch_find(arch->valuestring);
    if (!a) {
        err = shoal_diag_set(diag, SHOAL_ERR_UNSUPPORTED,
                             "%s: architecture '%.64s' is not supported (shoal runs %s)", label,
                             arch->valuestring, model_arch_names());
        goto out;
    }
    cfg->arch = a->id;
    cfg->qk_norm = a->qk_norm;
    /* A multimodal checkpoint (Qwen3.5) keeps its language model's fields
     * under text_config; the outer config says the dtype and the tying. */
    const cJSON *outer = root;
    if (a->text_config) {
        root = cJSON_GetObjectItemCaseSensitive(outer, a->text_config);
        if (!cJSON_IsObject(root)) {
            err = shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                                 "%s: %s keeps its text model's fields in '%s', which is missing",
                                 label, a->hf_name, a->text_config);
            goto out;
        }
    }
    if ((err = model_config_get_int(root, "vocab_size", -1, 1, SHOAL_MODEL_VOCAB_MAX, label,
                                    &cfg->vocab, diag)) ||
        (err = model_config_get_int(root, "hidden_size", -1, 1, SHOAL_MODEL_HIDDEN_MAX, label,
                                    &cfg->hidden, diag)) ||
        /* checked below when a layer has a dense MLP */
        (err = model_config_get_int(root, "intermediate_size", 0, 1, SHOAL_MODEL_INTERMEDIATE_MAX,
                                    label, &cfg->intermediate, diag)) ||
        (err = model_config_get_int(root, "num_hidden_layers", -1, 1, SHOAL_MODEL_LAYERS_MAX, label,
                                    &cfg->layers, diag)) ||
        (err = model_config_get_int(root, "num_attention_heads", -1, 1, SHOAL_MODEL_HEADS_MAX,
                                    label, &cfg->heads, diag)) ||
        (err = model_config_get_int(root, "num_key_value_heads", cfg->heads, 1,
                                    SHOAL_MODEL_HEADS_MAX, label, &cfg->kv_heads, diag)) ||
        (err = model_config_get_int(root, "max_position_embeddings", 2048, 1,
                                    SHOAL_CONTEXT_TOKENS_MAX, label, &cfg->max_positions, diag)))
        goto out;
    if (cfg->heads % cfg->kv_heads != 0) {
        err = shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                             "%s: num_attention_heads %d is not a multiple of "
                             "num_key_value_heads %d",
                             label, cfg->heads, cfg->kv_heads);
        goto out;
    }
    int head_dim_default = cfg->hidden % cfg->heads == 0 ? cfg->hidden / cfg->heads : -1;
    if ((err = model_config_get_int(root, "head_dim", head_dim_default, 2, SHOAL_MODEL_HEAD_DIM_MAX,
                                    label, &cfg->head_dim, diag)))
        goto out;
    if (cfg->head_dim % 2 != 0) {
        err = shoal_diag_set(diag, SHOAL_ERR_FORMAT, "%s: head_dim %d must be even (rotary halves)",
                             label, cfg->head_dim);
        goto out;
    }
    double eps = 0.0;
    if ((err = get_double(root, "rms_norm_eps", 1e-6, 0.0, 1.0, label, &eps, diag)))
        goto out;
    cfg->rms_eps = (float)eps;
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
    if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu") != 0)) {
        err = shoal_diag_set(diag, SHOAL_ERR_UNSUPPORTED,
                             "%s: hidden_act must be 'silu' (SwiGLU MLP)", label);
        goto out;
    }
    if (model_config_get_bool(root, "attention_bias", false) ||
        model_config_get_bool(root, "mlp_bias", false)) {
        err = shoal_diag_set(diag, SHOAL_ERR_UNSUPPORTED,
                             "%s: attention_bias and mlp_bias are not supported", label);
        goto out;
    }
    /* Qwen3 and Llama both default to untied embeddings in transformers. */
    cfg->tie_embeddings = model_config_get_bool(
        outer, "tie_word_embeddings", model_config_get_bool(root, "tie_word_embeddings", false));
    if ((err = parse_rope(root, label, cfg, diag)))
        goto out;
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(outer, "dtype");
    if (!cJSON_IsString(dt))
        dt = cJSON_GetObjectItemCaseSensitive(outer, "torch_dtype");
    if (!cJSON_IsString(dt))
        dt = cJSON_GetObjectItemCaseSensitive(root, "dtype");
    if (cJSON_IsString(dt)) {
        const char *s = dt->valuestring;
        cfg->dtype = strcmp(s, "bfloat16") == 0  ? SHOAL_DTYPE_BF16
                     : strcmp(s, "float16") == 0 ? SHOAL_DTYPE_F16
                     : strcmp(s, "float32") == 0 ? SHOAL_DTYPE_F32
                                                 : SHOAL_DTYPE_INVALID;
    }
    if ((err = model_config_get_int(root, "bos_token_id", -2, -2, cfg->vocab - 1, label,
                                    &cfg->bos_id, diag)))
        goto out;
    if (cfg->bos_id == -2)
        cfg->bos_id = -1;
    if ((err = get_eos(root, label, cfg, diag)))
        goto out;
    cfg->rope_dim = cfg->head_dim;
    if ((err = a->parse(root, label, cfg, diag)))
        goto out;
    if (cfg->intermediate == 0 && model_config_has_dense(cfg))
        err = shoal_diag_set(diag, SHOAL_ERR_FORMAT, "%s: missing field 'intermediate_size'",
                             label);
out:
    cJSON_Delete(doc);
    return err;
}

shoal_err model_config_parse_generation(const char *json, const char *label, model_config *cfg,
                                        shoal_diag *diag)
{
    cJSON *root = cJSON_Parse(json);
    shoal_err err;
    if (!cJSON_IsObject(root)) {
        err = shoal_diag_set(diag, SHOAL_ERR_FORMAT, "%s: not a JSON object", label);
        goto out;
    }
    if ((err = get_eos(root, label, cfg, diag)))
        goto out;
    int bos = -2;
    if ((err =
             model_config_get_int(root, "bos_token_id", -2, -2, cfg->vocab - 1, label, &bos, diag)))
        goto out;
    if (bos != -2)
        cfg->bos_id = bos;
out:
    cJSON_Delete(root);
    return err;
}

shoal_err model_config_load(const char *dir, model_config *cfg, shoal_diag *diag)
{
    char path[SHOAL_PATH_BYTES_MAX];
    char *text = NULL;
    shoal_err err = common_dir_check(dir, "model directory", diag);
    if (err)
        return err;
    err = common_path_join(path, sizeof path, dir, "config.json");
    if (err)
        return shoal_diag_set(diag, err, "%s: model path too long", dir);
    err = common_file_read(path, SHOAL_JSON_FILE_BYTES_MAX, &text, NULL, diag);
    if (err == SHOAL_ERR_NOT_FOUND)
        return shoal_diag_set(diag, err,
                              "%s: no config.json (is this a Hugging Face model directory?)", dir);
    if (err)
        return err;
    err = model_config_parse(text, path, cfg, diag);
    free(text);
    text = NULL;
    if (err)
        return err;
    if (common_path_join(path, sizeof path, dir, "generation_config.json") != SHOAL_OK ||
        !common_file_exists(path))
        return SHOAL_OK;
    err = common_file_read(path, SHOAL_JSON_FILE_BYTES_MAX, &text, NULL, diag);
    if (err)
        return err;
    err = model_config_parse_generation(text, path, cfg, diag);
    free(text);
    return err;
}

void model_config_rope_inv_freq(const model_config *cfg, float *inv_freq)
{
    int half = cfg->head_dim / 2;
    for (int i = 0; i < half; i++) {
        if (2 * i >= cfg->rope_dim) { /* not rotated: cos 1, sin 0 */
            inv_freq[i] = 0.0f;
            continue;
        }
        /* transformers: 1 / base ** (arange(0, dim, 2).float() / dim), in
         * float32, dim the rotated dims */
        float expo = (float)(2 * i) / (float)cfg->rope_dim;
        float f = 1.0f / powf((float)cfg->rope_theta, expo);
        if (cfg->rope_llama3) {
            /* transformers' _compute_llama3_parameters */
            double low_wavelen = cfg->rope_original_max_positions / cfg->rope_low_freq_factor;
            double high_wavelen = cfg->rope_original_max_positions / cfg->rope_high_freq_factor;
            double wavelen = 2.0 * M_PI / f;
            if (wavelen > low_wavelen) {
                f = (float)(f / cfg->rope_factor);
            } else if (wavelen >= high_wavelen) {
                double smooth =
                    (cfg->rope_original_max_positions / wavelen - cfg->rope_low_freq_factor) /
                    (cfg->rope_high_freq_factor - cfg->rope_low_freq_factor);
                f = (float)((1.0 - smooth) * f / cfg->rope_factor + smooth * f);
            }
        }
        inv_freq[i] = f;
    }
}

bool model_config_has_moe(const model_config *cfg)
{
    for (int l = 0; l < cfg->layers; l++)
        if (cfg->mlp_kind[l] == MODEL_MLP_MOE)
            return true;
    return false;
}

bool model_config_has_dense(const model_config *cfg)
{
    for (int l = 0; l < cfg->layers; l++)
        if (cfg->mlp_kind[l] == MODEL_MLP_DENSE)
            return true;
    return false;
}

bool model_config_has_linear(const model_config *cfg)
{
    for (int l = 0; l < cfg->layers; l++)
        if (cfg->mixer_kind[l] == MODEL_MIXER_LINEAR)
            return true;
    return false;
}

int model_config_lin_conv_dim(const model_config *cfg)
{
    return 2 * cfg->lin_k_heads * cfg->lin_k_dim + cfg->lin_v_heads * cfg->lin_v_dim;
}
