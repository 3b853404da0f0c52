#include "worker_fingerprint.h"

#include "common/common_file.h"
#include "common/common_limits.h"
#include "common/common_pool.h"

#include <stdlib.h>
#include <string.h>

enum { CHUNK_BYTES = 64 << 20 };

struct chunk_job {
    const unsigned char *data;
    size_t bytes;
    common_hash *out;
};

static void chunk_task(void *ctx, int task, int thread)
{
    const struct chunk_job *j = ctx;
    size_t off = (size_t)task * CHUNK_BYTES;
    size_t n = j->bytes - off < CHUNK_BYTES ? j->bytes - off : CHUNK_BYTES;
    common_hash_bytes(j->data + off, n, &j->out[task]);
}

/* H(chunk hashes) of one file's bytes. */
static shoal_err hash_file_bytes(common_pool *pool, const void *data, size_t bytes,
                                 common_hash *out)
{
    int chunks = (int)((bytes + CHUNK_BYTES - 1) / CHUNK_BYTES);
    common_hash *h = malloc((size_t)(chunks ? chunks : 1) * sizeof *h);
    if (!h)
        return SHOAL_ERR_NOMEM;
    struct chunk_job j = {data, bytes, h};
    common_pool_run(pool, chunks, chunk_task, &j);
    common_hash_bytes(h, (size_t)chunks * sizeof *h, out);
    free(h);
    return SHOAL_OK;
}

/* Adds H(file) of dir/name, or H("absent"), to the parts. */
static shoal_err hash_optional_file(const char *dir, const char *name, common_hash *out,
                                    shoal_diag *diag)
{
    char path[SHOAL_PATH_BYTES_MAX];
    if (common_path_join(path, sizeof path, dir, name))
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT, "%s: path too long", dir);
    if (!common_file_exists(path)) {
        common_hash_bytes("absent", 6, out);
        return SHOAL_OK;
    }
    common_map map;
    shoal_err err = common_map_open(path, &map, diag);
    if (err)
        return err;
    common_hash_bytes(map.data, map.bytes, out);
    common_map_close(&map);
    return SHOAL_OK;
}

shoal_err worker_fingerprint_compute(const char *model_dir, const model_weights *w,
                                     uint64_t dummy_seed, shoal_dtype kv_dtype, int page_tokens,
                                     common_hash *out, shoal_diag *diag)
{
    shoal_err err;
    int shards = model_weights_shards(w);
    /* parts: tag, layout, config, tokenizer, template, kv dtype, page size,
     * dummy seed, then one per shard */
    int n_parts = 8 + shards;
    common_hash_part *parts = calloc((size_t)n_parts, sizeof *parts);
    common_hash *hashes = calloc((size_t)(3 + shards), sizeof *hashes);
    common_pool *pool = NULL;
    if (!parts || !hashes || common_pool_open(0, &pool) != SHOAL_OK) {
        err = shoal_diag_set(diag, SHOAL_ERR_NOMEM, "fingerprint: no memory");
        goto out;
    }
    if ((err = hash_optional_file(model_dir, "config.json", &hashes[0], diag)) ||
        (err = hash_optional_file(model_dir, "tokenizer.json", &hashes[1], diag)) ||
        (err = hash_optional_file(model_dir, "tokenizer_config.json", &hashes[2], diag)))
        goto out;
    for (int i = 0; i < shards; i++) {
        const void *data;
        size_t bytes;
        model_weights_shard(w, i, &data, &bytes);
        if ((err = hash_file_bytes(pool, data, bytes, &hashes[3 + i]))) {
            shoal_diag_set(diag, err, "fingerprint: no memory");
            goto out;
        }
    }
    static const char tag[] = "shoal-fingerprint-v1";
    uint32_t layout = WORKER_KV_LAYOUT_VERSION, dtype = (uint32_t)kv_dtype,
             page = (uint32_t)page_tokens;
    uint64_t seed = model_weights_is_dummy(w) ? dummy_seed : 0;
    uint8_t dummy = model_weights_is_dummy(w);
    parts[0] = (common_hash_part){tag, sizeof tag};
    parts[1] = (common_hash_part){&layout, sizeof layout};
    parts[2] = (common_hash_part){&hashes[0], sizeof hashes[0]};
    parts[3] = (common_hash_part){&hashes[1], sizeof hashes[1]};
    parts[4] = (common_hash_part){&hashes[2], sizeof hashes[2]};
    parts[5] = (common_hash_part){&dtype, sizeof dtype};
    parts[6] = (common_hash_part){&page, sizeof page};
    parts[7] = (common_hash_part){&seed, dummy ? sizeof seed : 0};
    for (int i = 0; i < shards; i++)
        parts[8 + i] = (common_hash_part){&hashes[3 + i], sizeof hashes[3 + i]};
    /* The integers above are hashed in host byte order; shoal runs on
     * little-endian hosts only (x86-64 and arm64). */
    common_hash_parts(parts, n_parts, out);
    err = SHOAL_OK;
out:
    common_pool_close(pool);
    free(parts);
    free(hashes);
    return err;
}
