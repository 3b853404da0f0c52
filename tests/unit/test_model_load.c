/* Loading a model directory: configs in both transformers spellings, and
 * every kind of broken directory refused with a message that names the
 * file, the tensor and what was expected. */
#include "common/common_file.h"
#include "common/common_rng.h"
#include "tests/test.h"
#include "model/model_cache.h"
#include "model/model_config.h"
#include "worker/worker_generate.h"
#include "model/model_safetensors.h"

#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#define SRC SHOAL_FIXTURES "/parity/qwen3-tied-bf16"

static char tmp_root[64];

static void write_file(const char *dir, const char *name, const char *text, size_t bytes)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (f) {
        CHECK(fwrite(text, 1, bytes, f) == bytes);
        fclose(f);
    }
}

/* A fresh directory holding the fixture's config.json. */
static void fresh_dir(char *dir, size_t size, const char *name)
{
    snprintf(dir, size, "%s/%s", tmp_root, name);
    mkdir(dir, 0755);
    char *text;
    size_t bytes;
    CHECK(common_file_read(SRC "/config.json", 1 << 20, &text, &bytes, NULL) == SHOAL_OK);
    write_file(dir, "config.json", text, bytes);
    free(text);
}

/* Writes dir/model.safetensors with the fixture's tensors, except that
 * `drop` is left out and `change` gets a wrong shape or dtype. */
static void write_weights(const char *dir, const char *file, const char *drop, const char *change,
                          shoal_dtype new_dtype)
{
    model_safetensors st;
    shoal_diag diag;
    CHECK(model_safetensors_open(SRC "/model.safetensors", &st, &diag) == SHOAL_OK);
    model_tensor_out *out = calloc((size_t)st.tensors, sizeof *out);
    int n = 0;
    for (int i = 0; i < st.tensors; i++) {
        const model_tensor_info *t = &st.info[i];
        if (drop && strcmp(t->name, drop) == 0)
            continue;
        model_tensor_out *o = &out[n++];
        o->name = t->name;
        o->dtype = t->dtype;
        o->dims = t->dims;
        memcpy(o->shape, t->shape, sizeof o->shape);
        o->data = st.data + t->begin;
        if (change && strcmp(t->name, change) == 0) {
            if (new_dtype != SHOAL_DTYPE_INVALID) {
                o->dtype = new_dtype; /* same bytes: BF16 -> I16 */
            } else {
                o->shape[0] /= 2; /* half the rows */
            }
        }
    }
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    CHECK(model_safetensors_write(path, out, n, &diag) == SHOAL_OK);
    free(out);
    model_safetensors_close(&st);
}

static shoal_err open_model(const char *dir, worker_load_format fmt, shoal_diag *diag,
                            worker_model **out)
{
    worker_model_options mo;
    worker_model_options_default(&mo);
    mo.model_dir = dir;
    mo.load_format = fmt;
    mo.kv_pages = 8;
    mo.max_rows = 32;
    mo.max_logit_rows = 4;
    mo.threads = 1;
    shoal_diag_clear(diag);
    worker_model *m = NULL;
    shoal_err err = worker_model_open(&mo, &m, diag);
    if (out)
        *out = m;
    else
        worker_model_close(m);
    return err;
}

static void missing_tensor_is_named(void)
{
    char dir[256];
    fresh_dir(dir, sizeof dir, "missing");
    write_weights(dir, "model.safetensors", "model.layers.1.mlp.up_proj.weight", NULL, 0);
    shoal_diag diag;
    CHECK(open_model(dir, WORKER_LOAD_AUTO, &diag, NULL) == SHOAL_ERR_NOT_FOUND);
    CHECK_HAS(diag.msg, "model.layers.1.mlp.up_proj.weight");
}

static void wrong_shape_names_file_tensor_and_expected_shape(void)
{
    char dir[256];
    fresh_dir(dir, sizeof dir, "shape");
    write_weights(dir, "model.safetensors", NULL, "model.layers.2.self_attn.k_proj.weight", 0);
    shoal_diag diag;
    CHECK(open_model(dir, WORKER_LOAD_AUTO, &diag, NULL) == SHOAL_ERR_FORMAT);
    CHECK_HAS(diag.msg, "model.safetensors");
    CHECK_HAS(diag.msg, "model.layers.2.self_attn.k_proj.weight");
    CHECK_HAS(diag.msg, "has shape [24, 80], expected [48, 80]");
}

static void unsupported_dtype_is_refused(void)
{
    char dir[256];
    fresh_dir(dir, sizeof dir, "dtype");
    write_weights(dir, "model.safetensors", NULL, "model.norm.weight", SHOAL_DTYPE_I16);
    shoal_diag diag;
    CHECK(open_model(dir, WORKER_LOAD_AUTO, &diag, NULL) == SHOAL_ERR_UNSUPPORTED);
    CHECK_HAS(diag.msg, "'model.norm.weight' is I16");
}

static void truncated_file_is_refused(void)
{
    char dir[256];
    fresh_dir(dir, sizeof dir, "truncated");
    char *text;
    size_t bytes;
    CHECK(common_file_read(SRC "/model.safetensors", 1 << 24, &text, &bytes, NULL) == SHOAL_OK);
    write_file(dir, "model.safetensors", text, bytes - 1000);
    free(text);
    shoal_diag diag;
    CHECK(open_model(dir, WORKER_LOAD_AUTO, &diag, NULL) == SHOAL_ERR_FORMAT);
    CHECK_HAS(diag.msg, "truncated");
    CHECK_HAS(diag.msg, "model.safetensors");
}

static void sharded_index_is_checked(void)
{
    char dir[256];
    shoal_diag diag;
    fresh_dir(dir, sizeof dir, "index-escape");
    const char *escape = "{\"weight_map\":{\"model.norm.weight\":\"../model.safetensors\"}}";
    write_file(dir, "model.safetensors.index.json", escape, strlen(escape));
    CHECK(open_model(dir, WORKER_LOAD_AUTO, &diag, NULL) == SHOAL_ERR_FORMAT);
    CHECK_HAS(diag.msg, "not a file name");

    fresh_dir(dir, sizeof dir, "index-missing");
    const char *missing =
        "{\"weight_map\":{\"model.norm.weight\":\"model-00002-of-00002.safetensors\"}}";
    write_file(dir, "model.safetensors.index.json", missing, strlen(missing));
    CHECK(open_model(dir, WORKER_LOAD_AUTO, &diag, NULL) == SHOAL_ERR_NOT_FOUND);
    CHECK_HAS(diag.msg, "model-00002-of-00002.safetensors");

    fresh_dir(dir, sizeof dir, "index-bad");
    write_file(dir, "model.safetensors.index.json", "{\"weight_map\":", 14);
    CHECK(open_model(dir, WORKER_LOAD_AUTO, &diag, NULL) == SHOAL_ERR_FORMAT);
    CHECK_HAS(diag.msg, "weight_map");

    fresh_dir(dir, sizeof dir, "no-weights");
    CHECK(open_model(dir, WORKER_LOAD_AUTO, &diag, NULL) == SHOAL_ERR_NOT_FOUND);
    CHECK_HAS(diag.msg, "--load-format dummy");
}

static void missing_or_bad_config_is_refused(void)
{
    char dir[256];
    shoal_diag diag;
    snprintf(dir, sizeof dir, "%s/empty", tmp_root);
    CHECK(open_model(dir, WORKER_LOAD_AUTO, &diag, NULL) == SHOAL_ERR_NOT_FOUND);
    CHECK_HAS(diag.msg, "no such directory"); /* not "no config.json" */
    write_file(tmp_root, "a-file", "x", 1);
    char file[300];
    snprintf(file, sizeof file, "%s/a-file", tmp_root);
    CHECK(open_model(file, WORKER_LOAD_AUTO, &diag, NULL) == SHOAL_ERR_NOT_FOUND);
    CHECK_HAS(diag.msg, "not a directory");
    mkdir(dir, 0755);
    CHECK(open_model(dir, WORKER_LOAD_AUTO, &diag, NULL) == SHOAL_ERR_NOT_FOUND);
    CHECK_HAS(diag.msg, "no config.json");
    write_file(dir, "config.json", "{\"architectures\":", 17);
    CHECK(open_model(dir, WORKER_LOAD_AUTO, &diag, NULL) == SHOAL_ERR_FORMAT);
    CHECK_HAS(diag.msg, "config.json: not a JSON object");
}

static void config_fields_are_validated(void)
{
    static const struct {
        const char *json;
        shoal_err err;
        const char *says;
    } cases[] = {
        {"{\"architectures\":[\"MistralForCausalLM\"]}", SHOAL_ERR_UNSUPPORTED,
         "architecture 'MistralForCausalLM' is not supported"},
        {"{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":10}", SHOAL_ERR_FORMAT,
         "missing field 'hidden_size'"},
        {"{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":10,\"hidden_size\":-3}",
         SHOAL_ERR_FORMAT, "'hidden_size' must be an integer"},
        {"{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":10,\"hidden_size\":8,"
         "\"intermediate_size\":8,\"num_hidden_layers\":1,\"num_attention_heads\":4,"
         "\"num_key_value_heads\":3}",
         SHOAL_ERR_FORMAT, "not a multiple"},
        {"{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":10,\"hidden_size\":8,"
         "\"intermediate_size\":8,\"num_hidden_layers\":1,\"num_attention_heads\":2,"
         "\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4}}",
         SHOAL_ERR_UNSUPPORTED, "rope type 'yarn'"},
        {"{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":10,\"hidden_size\":8,"
         "\"intermediate_size\":8,\"num_hidden_layers\":1,\"num_attention_heads\":2,"
         "\"hidden_act\":\"gelu\"}",
         SHOAL_ERR_UNSUPPORTED, "silu"},
        {"{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":10,\"hidden_size\":8,"
         "\"intermediate_size\":8,\"num_hidden_layers\":1,\"num_attention_heads\":2,"
         "\"eos_token_id\":[1,99]}",
         SHOAL_ERR_FORMAT, "eos_token_id"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        model_config cfg;
        shoal_diag diag = {{0}};
        shoal_err err = model_config_parse(cases[i].json, "c.json", &cfg, &diag);
        CHECK_MSG(err == cases[i].err, "case %zu: %s (%s)", i, shoal_strerror(err), diag.msg);
        CHECK_HAS(diag.msg, cases[i].says);
        CHECK_HAS(diag.msg, "c.json");
    }
}

#define MOE_BASE                                                                                   \
    "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"vocab_size\":300,\"hidden_size\":64,"          \
    "\"intermediate_size\":96,\"moe_intermediate_size\":32,\"num_hidden_layers\":6,"               \
    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":16,"

static void moe_config_reads_experts_and_sparse_layers(void)
{
    model_config cfg;
    shoal_diag diag = {{0}};
    /* transformers 5's num_local_experts; every third layer sparse, but 5 */
    const char *v5 = MOE_BASE "\"num_local_experts\":16,\"num_experts_per_tok\":4,"
                              "\"decoder_sparse_step\":3,\"mlp_only_layers\":[5],"
                              "\"norm_topk_prob\":true}";
    CHECK(model_config_parse(v5, "c.json", &cfg, &diag) == SHOAL_OK);
    CHECK_EQ_INT(cfg.experts, 16);
    CHECK_EQ_INT(cfg.experts_per_tok, 4);
    CHECK_EQ_INT(cfg.moe_intermediate, 32);
    CHECK(cfg.norm_topk_prob && cfg.qk_norm);
    static const uint8_t want[6] = {0, 0, MODEL_MLP_MOE, 0, 0, 0};
    for (int l = 0; l < 6; l++)
        CHECK_MSG(cfg.mlp_kind[l] == want[l], "layer %d: kind %d", l, cfg.mlp_kind[l]);
    /* the hub's num_experts; norm_topk_prob defaults to false as in HF */
    const char *hub = MOE_BASE "\"num_experts\":8,\"num_experts_per_tok\":8}";
    CHECK(model_config_parse(hub, "c.json", &cfg, &diag) == SHOAL_OK);
    CHECK(cfg.experts == 8 && cfg.experts_per_tok == 8 && !cfg.norm_topk_prob);
    CHECK(model_config_has_moe(&cfg));
    static const struct {
        const char *json;
        shoal_err err;
        const char *says;
    } bad[] = {
        {MOE_BASE "\"num_experts\":8}", SHOAL_ERR_FORMAT, "'num_experts_per_tok'"},
        {MOE_BASE "\"num_experts\":8,\"num_experts_per_tok\":9}", SHOAL_ERR_FORMAT,
         "must be an integer in [1, 8]"},
        {MOE_BASE "\"num_experts\":600,\"num_experts_per_tok\":2}", SHOAL_ERR_FORMAT,
         "'num_experts'"},
        {MOE_BASE "\"num_experts\":8,\"num_experts_per_tok\":2,\"mlp_only_layers\":[6]}",
         SHOAL_ERR_FORMAT, "not a layer index below 6"},
        {MOE_BASE "\"num_experts\":8,\"num_experts_per_tok\":2,\"mlp_only_layers\":3}",
         SHOAL_ERR_FORMAT, "must be a list"},
        {MOE_BASE "\"num_experts\":8,\"num_experts_per_tok\":2,\"use_sliding_window\":true}",
         SHOAL_ERR_UNSUPPORTED, "use_sliding_window"},
        {MOE_BASE "\"num_experts\":64,\"num_experts_per_tok\":33}", SHOAL_ERR_LIMIT,
         "over shoal's limit of 32"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        shoal_err err = model_config_parse(bad[i].json, "c.json", &cfg, &diag);
        CHECK_MSG(err == bad[i].err, "case %zu: %s (%s)", i, shoal_strerror(err), diag.msg);
        CHECK_HAS(diag.msg, bad[i].says);
        CHECK_HAS(diag.msg, "c.json");
    }
}

#define HYBRID_BASE                                                                                \
    "{\"architectures\":[\"Qwen3NextForCausalLM\"],\"vocab_size\":300,\"hidden_size\":64,"         \
    "\"intermediate_size\":96,\"moe_intermediate_size\":32,\"num_experts\":4,"                    \
    "\"num_experts_per_tok\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,"             \
    "\"head_dim\":16,\"linear_num_key_heads\":2,\"linear_num_value_heads\":4,"                   \
    "\"linear_key_head_dim\":8,\"linear_value_head_dim\":12,"

/* Hybrid configs: the layer kinds from layer_types or full_attention_interval,
 * the linear fields, partial rope, and each malformed field refused by
 * name; the shipped shapes of Qwen3.5-27B, Qwen3.5-35B-A3B and Qwen3-Next
 * give the state slots their papers' sizes. */
static void hybrid_configs_read_layer_kinds_and_linear_fields(void)
{
    model_config cfg;
    shoal_diag diag = {{0}};
    const char *interval = HYBRID_BASE "\"num_hidden_layers\":8,\"full_attention_interval\":4}";
    CHECK_MSG(model_config_parse(interval, "c.json", &cfg, &diag) == SHOAL_OK, "%s", diag.msg);
    for (int l = 0; l < 8; l++)
        CHECK_MSG(cfg.mixer_kind[l] == (l % 4 == 3 ? MODEL_MIXER_ATTENTION : MODEL_MIXER_LINEAR),
                  "layer %d: mixer %d", l, cfg.mixer_kind[l]);
    CHECK(cfg.norm_offset && cfg.attn_output_gate && model_config_has_linear(&cfg));
    CHECK_EQ_INT(cfg.rope_dim, 4); /* 16 x the default factor 0.25 */
    CHECK_EQ_INT(cfg.lin_conv, 4);
    CHECK_EQ_INT(model_config_lin_conv_dim(&cfg), 2 * 2 * 8 + 4 * 12);
    const char *types = HYBRID_BASE "\"num_hidden_layers\":3,\"partial_rotary_factor\":0.5,"
                                    "\"linear_conv_kernel_dim\":2,\"layer_types\":"
                                    "[\"full_attention\",\"linear_attention\",\"full_attention\"]}";
    CHECK_MSG(model_config_parse(types, "c.json", &cfg, &diag) == SHOAL_OK, "%s", diag.msg);
    CHECK(cfg.mixer_kind[0] == MODEL_MIXER_ATTENTION && cfg.mixer_kind[1] == MODEL_MIXER_LINEAR &&
          cfg.mixer_kind[2] == MODEL_MIXER_ATTENTION);
    CHECK_EQ_INT(cfg.rope_dim, 8);
    CHECK_EQ_INT(cfg.lin_conv, 2);
    static const struct {
        const char *json;
        const char *says;
    } bad[] = {
        {HYBRID_BASE "\"num_hidden_layers\":2,\"layer_types\":[\"linear_attention\"]}",
         "layer_types"},
        {HYBRID_BASE "\"num_hidden_layers\":2,\"layer_types\":[\"linear_attention\","
                     "\"sliding_attention\"]}",
         "layer_types"},
        {HYBRID_BASE "\"num_hidden_layers\":4,\"partial_rotary_factor\":0}",
         "partial_rotary_factor"},
        {HYBRID_BASE "\"num_hidden_layers\":4,\"partial_rotary_factor\":1.5}",
         "partial_rotary_factor"},
        {HYBRID_BASE "\"num_hidden_layers\":4,\"attn_output_gate\":false}", "attn_output_gate"},
        {HYBRID_BASE "\"num_hidden_layers\":4,\"linear_conv_kernel_dim\":9}",
         "linear_conv_kernel_dim"},
        {HYBRID_BASE "\"num_hidden_layers\":4,\"full_attention_interval\":0}",
         "full_attention_interval"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        shoal_err err = model_config_parse(bad[i].json, "c.json", &cfg, &diag);
        CHECK_MSG(err != SHOAL_OK, "case %zu parsed", i);
        CHECK_HAS(diag.msg, bad[i].says);
        CHECK_HAS(diag.msg, "c.json");
    }
    /* without a linear_num_value_heads multiple of the key heads */
    char odd[1024];
    snprintf(odd, sizeof odd, "%s", HYBRID_BASE "\"num_hidden_layers\":4}");
    char *at = strstr(odd, "\"linear_num_value_heads\":4");
    CHECK(at != NULL);
    if (at)
        at[strlen("\"linear_num_value_heads\":")] = '3';
    CHECK(model_config_parse(odd, "c.json", &cfg, &diag) == SHOAL_ERR_FORMAT);
    CHECK_HAS(diag.msg, "not a multiple");

    static const struct {
        const char *dir;
        int layers, linear;
        double slot_mib; /* one stream's state */
    } shipped[] = {
        {"qwen3.5-27b", 64, 48, 149.625},
        {"qwen3.5-35b-a3b", 40, 30, 62.8125},
        {"qwen3-next-80b-a3b", 48, 36, 75.375},
    };
    for (size_t i = 0; i < sizeof shipped / sizeof shipped[0]; i++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/../../tools/configs/%s", SHOAL_FIXTURES, shipped[i].dir);
        CHECK_MSG(model_config_load(dir, &cfg, &diag) == SHOAL_OK, "%s", diag.msg);
        int linear = 0;
        for (int l = 0; l < cfg.layers; l++)
            linear += cfg.mixer_kind[l] == MODEL_MIXER_LINEAR;
        model_cache_spec spec;
        model_cache_spec_of(&cfg, &spec);
        double mib = (double)model_cache_slot_bytes(&spec) / 1048576.0;
        printf("  %-20s %d layers, %d linear, rope on %d of %d dims: a state slot of %.1f MiB\n",
               shipped[i].dir, cfg.layers, linear, cfg.rope_dim, cfg.head_dim, mib);
        CHECK_EQ_INT(cfg.layers, shipped[i].layers);
        CHECK_EQ_INT(linear, shipped[i].linear);
        CHECK_EQ_INT(cfg.rope_dim, 64);
        CHECK(fabs(mib - shipped[i].slot_mib) < 1e-6);
    }
}

/* Dummy MoE weights route spread (benchmarks read the experts a real
 * model's round would): 32 tokens' 64 picks reach at least half of a
 * layer's 16 experts in every layer, and no expert takes a third of them
 * (measured: 16 of 16 in the first layer, 10 in the deepest of six, the
 * busiest 16 picks; all to one expert would be 32). */
static void dummy_moe_routing_is_spread(void)
{
    char dir[256];
    fresh_dir(dir, sizeof dir, "dummy-moe");
    const char *cfg = MOE_BASE "\"num_experts\":16,\"num_experts_per_tok\":2}";
    write_file(dir, "config.json", cfg, strlen(cfg));
    shoal_diag diag;
    worker_model *m = NULL;
    CHECK_MSG(open_model(dir, WORKER_LOAD_DUMMY, &diag, &m) == SHOAL_OK, "%s", diag.msg);
    if (!m)
        return;
    enum { N = 32 };
    int32_t ids[N], pos[N], rs[N] = {0}, table[8];
    uint64_t rng = 5;
    for (int i = 0; i < N; i++) {
        ids[i] = (int32_t)(common_rng_next(&rng) % 300);
        pos[i] = i;
    }
    for (int p = 0; p < 8; p++)
        table[p] = p;
    worker_forward f = {N, ids, pos, rs, 1, 8, table, 0, NULL, NULL};
    CHECK(worker_model_forward(m, &f, NULL, &diag) == SHOAL_OK);
    for (int l = 0; l < 6; l++) {
        int32_t route[N * 2];
        int count[16] = {0};
        CHECK(worker_model_routing(m, l, N, route, &diag) == SHOAL_OK);
        for (int i = 0; i < N * 2; i++)
            count[route[i]]++;
        int distinct = 0, most = 0;
        for (int e = 0; e < 16; e++) {
            distinct += count[e] > 0;
            most = count[e] > most ? count[e] : most;
        }
        CHECK_MSG(distinct >= 8 && most <= N * 2 / 3,
                  "layer %d: %d of 16 experts picked, the busiest %d of %d picks", l, distinct,
                  most, N * 2);
    }
    CHECK(worker_model_routing(m, 6, N, NULL, &diag) == SHOAL_ERR_INVALID);
    /* one attention group of every layer: the pages hold all six */
    const model_cache_spec *cs = worker_model_cache_spec(m);
    CHECK(cs->groups == 1 && cs->group[0].kind == MODEL_CACHE_ATTENTION &&
          cs->group[0].layers == 6 && cs->group[0].kv_heads == 2 && cs->group[0].head_dim == 16);
    for (int l = 0; l < 6; l++)
        CHECK(cs->layer_group[l] == 0 && cs->page_layer[l] == l);
    CHECK_EQ_INT(worker_model_kv_layout(m)->layers, 6);
    worker_model_close(m);
}

static void transformers_4_spelling_gives_the_same_rope(void)
{
    /* Llama 3.2's config as transformers 4 writes it. */
    const char *v4 =
        "{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":128256,\"hidden_size\":2048,"
        "\"intermediate_size\":8192,\"num_hidden_layers\":16,\"num_attention_heads\":32,"
        "\"num_key_value_heads\":8,\"head_dim\":64,\"rope_theta\":500000.0,\"rope_scaling\":{"
        "\"factor\":32.0,\"high_freq_factor\":4.0,\"low_freq_factor\":1.0,"
        "\"original_max_position_embeddings\":8192,\"rope_type\":\"llama3\"},"
        "\"torch_dtype\":\"bfloat16\",\"tie_word_embeddings\":true,"
        "\"eos_token_id\":[128001,128008,128009]}";
    const char *v5 =
        "{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":128256,\"hidden_size\":2048,"
        "\"intermediate_size\":8192,\"num_hidden_layers\":16,\"num_attention_heads\":32,"
        "\"num_key_value_heads\":8,\"head_dim\":64,\"rope_parameters\":{\"rope_theta\":500000.0,"
        "\"factor\":32.0,\"high_freq_factor\":4.0,\"low_freq_factor\":1.0,"
        "\"original_max_position_embeddings\":8192,\"rope_type\":\"llama3\"},"
        "\"dtype\":\"bfloat16\",\"tie_word_embeddings\":true,\"eos_token_id\":128001}";
    model_config a, b;
    shoal_diag diag = {{0}};
    CHECK(model_config_parse(v4, "v4", &a, &diag) == SHOAL_OK);
    CHECK(model_config_parse(v5, "v5", &b, &diag) == SHOAL_OK);
    CHECK(a.rope_llama3 && b.rope_llama3 && a.dtype == SHOAL_DTYPE_BF16 && b.dtype == a.dtype);
    CHECK(a.tie_embeddings && a.eos_count == 3 && a.eos_ids[2] == 128009 && b.eos_count == 1);
    float fa[32], fb[32];
    model_config_rope_inv_freq(&a, fa);
    model_config_rope_inv_freq(&b, fb);
    CHECK(memcmp(fa, fb, sizeof fa) == 0);
    /* the three bands: kept (highest), smoothed, and divided by the factor */
    CHECK(fa[0] == 1.0f);
    CHECK(fabsf(fa[31] - powf(500000.0f, -62.0f / 64.0f) / 32.0f) < 1e-12f);
    int smoothed = 0;
    for (int i = 0; i < 32; i++) {
        float raw = powf(500000.0f, -(float)(2 * i) / 64.0f);
        smoothed += fa[i] < raw && fa[i] > raw / 32.0f;
    }
    CHECK(smoothed > 0);
}

static void generation_config_overrides_eos(void)
{
    model_config cfg;
    shoal_diag diag = {{0}};
    CHECK(model_config_load(SHOAL_FIXTURES "/parity/qwen3-untied-f16-sharded", &cfg, &diag) ==
          SHOAL_OK);
    CHECK(cfg.eos_count == 2 && cfg.eos_ids[0] == 3 && cfg.eos_ids[1] == 7);
    CHECK(cfg.dtype == SHOAL_DTYPE_F16 && cfg.head_dim == 32 && !cfg.tie_embeddings);
}

static void dummy_weights_need_only_config(void)
{
    char dir[256];
    fresh_dir(dir, sizeof dir, "dummy");
    shoal_diag diag;
    worker_model *m = NULL;
    CHECK(open_model(dir, WORKER_LOAD_DUMMY, &diag, &m) == SHOAL_OK);
    if (!m)
        return;
    int32_t prompt[5] = {1, 2, 3, 4, 5};
    int tokens = 0;
    worker_generate_stats st;
    CHECK(worker_generate_greedy(m, prompt, 5, 4, false, NULL, NULL, &st, &diag) == SHOAL_OK);
    tokens = st.generated_tokens;
    CHECK_EQ_INT(tokens, 4);
    /* more tokens than the arena holds: a clear refusal, not an overrun */
    CHECK(worker_generate_greedy(m, prompt, 5, 500, false, NULL, NULL, &st, &diag) ==
          SHOAL_ERR_LIMIT);
    CHECK_HAS(diag.msg, "--kv-pages");
    worker_model_close(m);
}

static void forward_refuses_bad_rows(void)
{
    shoal_diag diag;
    worker_model *m = NULL;
    CHECK(open_model(SRC, WORKER_LOAD_AUTO, &diag, &m) == SHOAL_OK);
    if (!m)
        return;
    float logits[397];
    int32_t ids[2] = {1, 2}, pos[2] = {0, 1}, stream[2] = {0, 0}, table[2] = {0, 1}, lr = 1;
    worker_forward f = {2, ids, pos, stream, 1, 2, table, 1, &lr, NULL};
    CHECK(worker_model_forward(m, &f, logits, &diag) == SHOAL_OK);
    ids[1] = 397;
    CHECK(worker_model_forward(m, &f, logits, &diag) == SHOAL_ERR_INVALID);
    CHECK_HAS(diag.msg, "token id 397");
    ids[1] = 2;
    pos[1] = 32; /* past two pages of 16 */
    CHECK(worker_model_forward(m, &f, logits, &diag) == SHOAL_ERR_INVALID);
    CHECK_HAS(diag.msg, "position 32");
    pos[1] = 17;
    table[1] = 8; /* arena has pages 0..7 */
    CHECK(worker_model_forward(m, &f, logits, &diag) == SHOAL_ERR_INVALID);
    CHECK_HAS(diag.msg, "page 1 is 8");
    table[1] = 1;
    stream[0] = 1;
    CHECK(worker_model_forward(m, &f, logits, &diag) == SHOAL_ERR_INVALID);
    stream[0] = 0;
    lr = 2;
    CHECK(worker_model_forward(m, &f, logits, &diag) == SHOAL_ERR_INVALID);
    f.rows = 33;
    CHECK(worker_model_forward(m, &f, logits, &diag) == SHOAL_ERR_LIMIT);
    worker_model_close(m);
}

/* Every row's logits in row order skip the gather pass (worker_model.c):
 * the same logits as asking for them in another order or one at a time. */
static void logits_of_every_row_equal_the_gathered_ones(void)
{
    shoal_diag diag;
    worker_model *m = NULL;
    CHECK(open_model(SRC, WORKER_LOAD_AUTO, &diag, &m) == SHOAL_OK);
    if (!m)
        return;
    enum { V = 397 };
    static float all[2 * V], swapped[2 * V], one[V];
    int32_t ids[2] = {5, 9}, pos[2] = {0, 1}, stream[2] = {0, 0}, table[2] = {0, 1};
    int32_t in_order[2] = {0, 1}, reversed[2] = {1, 0}, second = 1;
    worker_forward f = {2, ids, pos, stream, 1, 2, table, 2, in_order, NULL};
    CHECK(worker_model_forward(m, &f, all, &diag) == SHOAL_OK);
    f.logit_rows = reversed;
    CHECK(worker_model_forward(m, &f, swapped, &diag) == SHOAL_OK);
    f.logit_rows = &second;
    f.logit_count = 1;
    CHECK(worker_model_forward(m, &f, one, &diag) == SHOAL_OK);
    CHECK(memcmp(all, swapped + V, sizeof one) == 0);
    CHECK(memcmp(all + V, swapped, sizeof one) == 0);
    CHECK(memcmp(all + V, one, sizeof one) == 0);
    CHECK(memcmp(all, all + V, sizeof one) != 0); /* the rows differ: the checks can fail */
    worker_model_close(m);
}

static void kv_pages_zero_sizes_the_arena_from_free_memory(void)
{
    worker_model_options mo;
    worker_model_options_default(&mo);
    mo.model_dir = SRC;
    mo.kv_pages = 0;
    mo.max_rows = 32;
    mo.max_logit_rows = 4;
    mo.max_streams = 4;
    mo.max_pages_per_stream = 10;
    mo.threads = 1;
    worker_model *m = NULL;
    shoal_diag diag = {{0}};
    CHECK_MSG(worker_model_open(&mo, &m, &diag) == SHOAL_OK, "%s", diag.msg);
    /* capped by what four streams of ten pages can use */
    CHECK(m && worker_model_kv_pages(m) == 40);
    worker_model_close(m);
    mo.kv_memory_fraction = 1e-12; /* too little for one page */
    CHECK(worker_model_open(&mo, &m, &diag) == SHOAL_ERR_NOMEM);
    CHECK_HAS(diag.msg, "no room for one KV page");
    mo.kv_memory_fraction = 1.5;
    CHECK(worker_model_open(&mo, &m, &diag) == SHOAL_ERR_INVALID);
}

int main(void)
{
    snprintf(tmp_root, sizeof tmp_root, "/tmp/shoal-load-XXXXXX");
    if (!mkdtemp(tmp_root))
        return 1;
    TEST_RUN(missing_tensor_is_named);
    TEST_RUN(wrong_shape_names_file_tensor_and_expected_shape);
    TEST_RUN(unsupported_dtype_is_refused);
    TEST_RUN(truncated_file_is_refused);
    TEST_RUN(sharded_index_is_checked);
    TEST_RUN(missing_or_bad_config_is_refused);
    TEST_RUN(config_fields_are_validated);
    TEST_RUN(moe_config_reads_experts_and_sparse_layers);
    TEST_RUN(hybrid_configs_read_layer_kinds_and_linear_fields);
    TEST_RUN(dummy_moe_routing_is_spread);
    TEST_RUN(transformers_4_spelling_gives_the_same_rope);
    TEST_RUN(generation_config_overrides_eos);
    TEST_RUN(dummy_weights_need_only_config);
    TEST_RUN(forward_refuses_bad_rows);
    TEST_RUN(logits_of_every_row_equal_the_gathered_ones);
    TEST_RUN(kv_pages_zero_sizes_the_arena_from_free_memory);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_root);
    if (system(cmd) != 0)
        return 1;
    return TEST_EXIT();
}
