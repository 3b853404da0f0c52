#include "model_safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Largest integer a JSON number (a double) holds exactly. */
#define JSON_INT_MAX 9007199254740992.0

static bool json_u64(const cJSON *item, uint64_t *out)
{
    if (!cJSON_IsNumber(item))
        return false;
    double d = item->valuedouble;
    if (!(d >= 0.0) || d > JSON_INT_MAX || floor(d) != d)
        return false;
    *out = (uint64_t)d;
    return true;
}

static int info_by_name(const void *a, const void *b)
{
    return strcmp(((const model_tensor_info *)a)->name, ((const model_tensor_info *)b)->name);
}

static int info_by_begin(const void *a, const void *b)
{
    const model_tensor_info *x = *(const model_tensor_info *const *)a;
    const model_tensor_info *y = *(const model_tensor_info *const *)b;
    return x->begin < y->begin   ? -1
           : x->begin > y->begin ? 1
                                 : (x->end > y->end) - (x->end < y->end);
}

uint64_t model_tensor_elements(const model_tensor_info *t)
{
    uint64_t n = 1;
    for (int i = 0; i < t->dims; i++)
        n *= (uint64_t)t->shape[i];
    return n;
}

/* Fills one entry from its JSON object and checks it against the data. */
static shoal_err parse_entry(const cJSON *obj, const char *label, uint64_t data_bytes,
                             model_tensor_info *t, shoal_diag *diag)
{
    const char *name = obj->string;
    if (strlen(name) >= sizeof t->name)
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT,
                              "%s: a tensor name of %zu bytes is over the limit of %d", label,
                              strlen(name), SHOAL_TENSOR_NAME_BYTES_MAX - 1);
    snprintf(t->name, sizeof t->name, "%s", name);
    if (!cJSON_IsObject(obj))
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT, "%s: tensor '%s': entry is not an object",
                              label, name);
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(obj, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(obj, "shape");
    const cJSON *offsets = cJSON_GetObjectItemCaseSensitive(obj, "data_offsets");
    if (!cJSON_IsString(dtype) || !cJSON_IsArray(shape) || !cJSON_IsArray(offsets))
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                              "%s: tensor '%s': expected string 'dtype', array 'shape' and "
                              "array 'data_offsets'",
                              label, name);
    t->dtype = shoal_dtype_parse(dtype->valuestring);
    if (t->dtype == SHOAL_DTYPE_INVALID)
        return shoal_diag_set(diag, SHOAL_ERR_UNSUPPORTED, "%s: tensor '%s': unknown dtype '%.32s'",
                              label, name, dtype->valuestring);
    int dims = cJSON_GetArraySize(shape);
    if (dims > SHOAL_TENSOR_DIMS_MAX)
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT,
                              "%s: tensor '%s': %d dimensions, over the limit of %d", label, name,
                              dims, SHOAL_TENSOR_DIMS_MAX);
    t->dims = dims;
    /* Bytes = elem * prod(shape), refused as soon as it passes the data. */
    uint64_t bytes = shoal_dtype_bytes(t->dtype);
    bool over = false;
    int i = 0;
    const cJSON *dim;
    cJSON_ArrayForEach(dim, shape)
    {
        uint64_t v;
        if (!json_u64(dim, &v))
            return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                                  "%s: tensor '%s': shape entry %d is not a non-negative integer",
                                  label, name, i);
        t->shape[i++] = (int64_t)v;
        if (v != 0 && bytes > data_bytes / v)
            over = true;
        bytes = over && v != 0 ? bytes : bytes * v;
    }
    if (bytes == 0) /* a zero dimension: an empty tensor, however large the others */
        over = false;
    if (cJSON_GetArraySize(offsets) != 2 || !json_u64(cJSON_GetArrayItem(offsets, 0), &t->begin) ||
        !json_u64(cJSON_GetArrayItem(offsets, 1), &t->end))
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                              "%s: tensor '%s': data_offsets must be two non-negative integers",
                              label, name);
    if (t->begin > t->end)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                              "%s: tensor '%s': data_offsets [%llu, %llu] run backwards", label,
                              name, (unsigned long long)t->begin, (unsigned long long)t->end);
    if (t->end > data_bytes)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                              "%s: tensor '%s' ends at byte %llu of the data, but the file holds "
                              "only %llu bytes of data (truncated file?)",
                              label, name, (unsigned long long)t->end,
                              (unsigned long long)data_bytes);
    if (over || bytes != t->end - t->begin)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                              "%s: tensor '%s': %s with its shape needs %s%llu bytes, but "
                              "data_offsets span %llu",
                              label, name, shoal_dtype_name(t->dtype), over ? "more than " : "",
                              (unsigned long long)(over ? data_bytes : bytes),
                              (unsigned long long)(t->end - t->begin));
    return SHOAL_OK;
}

shoal_err model_safetensors_parse(const unsigned char *buf, size_t bytes, const char *label,
                                  model_safetensors *st, shoal_diag *diag)
{
    shoal_err err;
    model_tensor_info **order = NULL;
    memset(st, 0, sizeof *st);
    if (bytes < 8)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                              "%s: %zu bytes is too short for a safetensors file (needs an "
                              "8-byte header length)",
                              label, bytes);
    uint64_t header_bytes = 0;
    for (int i = 7; i >= 0; i--)
        header_bytes = header_bytes << 8 | buf[i];
    if (header_bytes > SHOAL_SAFETENSORS_HEADER_BYTES_MAX)
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT,
                              "%s: header of %llu bytes is over the limit of %u (not a "
                              "safetensors file?)",
                              label, (unsigned long long)header_bytes,
                              SHOAL_SAFETENSORS_HEADER_BYTES_MAX);
    if (header_bytes > bytes - 8)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                              "%s: header claims %llu bytes but the file has %zu after the "
                              "length (truncated file?)",
                              label, (unsigned long long)header_bytes, bytes - 8);
    cJSON *root = cJSON_ParseWithLength((const char *)buf + 8, (size_t)header_bytes);
    if (!cJSON_IsObject(root)) {
        err = shoal_diag_set(diag, SHOAL_ERR_FORMAT, "%s: header is not a JSON object", label);
        goto out_free_json;
    }
    st->data = buf + 8 + header_bytes;
    st->data_bytes = bytes - 8 - header_bytes;

    int count = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, root)
    {
        if (strcmp(item->string, "__metadata__") != 0)
            count++;
    }
    if (count > SHOAL_SAFETENSORS_TENSORS_MAX) {
        err = shoal_diag_set(diag, SHOAL_ERR_LIMIT, "%s: %d tensors, over the limit of %d", label,
                             count, SHOAL_SAFETENSORS_TENSORS_MAX);
        goto out_free_json;
    }
    st->info = calloc(count ? (size_t)count : 1, sizeof *st->info);
    order = calloc(count ? (size_t)count : 1, sizeof *order);
    if (!st->info || !order) {
        err = shoal_diag_set(diag, SHOAL_ERR_NOMEM, "%s: no memory for %d tensors", label, count);
        goto out_free_json;
    }
    cJSON_ArrayForEach(item, root)
    {
        if (strcmp(item->string, "__metadata__") == 0)
            continue;
        err = parse_entry(item, label, st->data_bytes, &st->info[st->tensors], diag);
        if (err)
            goto out_free_json;
        order[st->tensors] = &st->info[st->tensors];
        st->tensors++;
    }
    qsort(st->info, (size_t)count, sizeof *st->info, info_by_name);
    for (int i = 1; i < count; i++) {
        if (strcmp(st->info[i - 1].name, st->info[i].name) == 0) {
            err = shoal_diag_set(diag, SHOAL_ERR_FORMAT, "%s: tensor '%s' is named twice", label,
                                 st->info[i].name);
            goto out_free_json;
        }
    }
    /* No two tensors may share bytes (empty tensors take none). */
    for (int i = 0; i < count; i++)
        order[i] = &st->info[i];
    qsort(order, (size_t)count, sizeof *order, info_by_begin);
    for (int i = 1; i < count; i++) {
        const model_tensor_info *a = order[i - 1], *b = order[i];
        if (a->end > b->begin && a->end > a->begin && b->end > b->begin) {
            err = shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                                 "%s: tensors '%s' and '%s' overlap in the data", label, a->name,
                                 b->name);
            goto out_free_json;
        }
    }
    err = SHOAL_OK;
out_free_json:
    free(order);
    cJSON_Delete(root);
    if (err)
        model_safetensors_close(st);
    return err;
}

shoal_err model_safetensors_open(const char *path, model_safetensors *st, shoal_diag *diag)
{
    common_map map;
    memset(st, 0, sizeof *st);
    shoal_err err = common_map_open(path, &map, diag);
    if (err)
        return err;
    err = model_safetensors_parse(map.data, map.bytes, path, st, diag);
    if (err) {
        common_map_close(&map);
        return err;
    }
    st->map = map;
    return SHOAL_OK;
}

void model_safetensors_close(model_safetensors *st)
{
    free(st->info);
    common_map_close(&st->map);
    memset(st, 0, sizeof *st);
}

const model_tensor_info *model_safetensors_find(const model_safetensors *st, const char *name)
{
    model_tensor_info key;
    if (strlen(name) >= sizeof key.name)
        return NULL;
    snprintf(key.name, sizeof key.name, "%s", name);
    return bsearch(&key, st->info, (size_t)st->tensors, sizeof *st->info, info_by_name);
}

static uint64_t out_bytes(const model_tensor_out *t)
{
    uint64_t n = shoal_dtype_bytes(t->dtype);
    for (int i = 0; i < t->dims; i++)
        n *= (uint64_t)t->shape[i];
    return n;
}

shoal_err model_safetensors_write(const char *path, const model_tensor_out *tensors, int count,
                                  shoal_diag *diag)
{
    shoal_err err = SHOAL_ERR_NOMEM;
    char tmp[SHOAL_PATH_BYTES_MAX];
    char *header = NULL;
    FILE *f = NULL;
    cJSON *root = cJSON_CreateObject();
    if (!root)
        goto out;
    uint64_t offset = 0;
    for (int i = 0; i < count; i++) {
        const model_tensor_out *t = &tensors[i];
        cJSON *entry = cJSON_AddObjectToObject(root, t->name);
        cJSON *shape = entry ? cJSON_AddArrayToObject(entry, "shape") : NULL;
        cJSON *offs = entry ? cJSON_AddArrayToObject(entry, "data_offsets") : NULL;
        if (!offs || !cJSON_AddStringToObject(entry, "dtype", shoal_dtype_name(t->dtype)))
            goto out;
        for (int d = 0; d < t->dims; d++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)offset));
        offset += out_bytes(t);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)offset));
    }
    header = cJSON_PrintUnformatted(root);
    if (!header)
        goto out;
    size_t hlen = strlen(header);
    size_t padded = (hlen + 7) & ~(size_t)7;
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        err = shoal_diag_set(diag, SHOAL_ERR_LIMIT, "%s: path too long", path);
        goto out;
    }
    f = fopen(tmp, "wb");
    if (!f) {
        err = shoal_diag_set(diag, SHOAL_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        goto out;
    }
    unsigned char len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    bool ok = fwrite(len, 1, 8, f) == 8 && fwrite(header, 1, hlen, f) == hlen;
    for (size_t i = hlen; ok && i < padded; i++)
        ok = fputc(' ', f) != EOF;
    for (int i = 0; ok && i < count; i++) {
        size_t n = (size_t)out_bytes(&tensors[i]);
        ok = n == 0 || fwrite(tensors[i].data, 1, n, f) == n;
    }
    if (fclose(f) != 0)
        ok = false;
    f = NULL;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        err = shoal_diag_set(diag, SHOAL_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        goto out;
    }
    err = SHOAL_OK;
out:
    if (err == SHOAL_ERR_NOMEM)
        shoal_diag_set(diag, err, "%s: no memory to build the header", path);
    if (f)
        fclose(f);
    free(header);
    cJSON_Delete(root);
    return err;
}
