/* shoal-make-demo: writes a small Qwen3-shaped model directory with random
 * weights and the real Qwen3 tokenizer files, so shoal can start with no
 * model given. Its output is noise: the weights are random.
 *
 *   shoal-make-demo --out DIR --tokenizer-dir DIR_WITH_TOKENIZER_JSON */
#include "common/common_file.h"
#include "common/common_limits.h"
#include "model/model_safetensors.h"
#include "model/model_weights.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The shape: Qwen3's vocabulary and tokens, a tiny body. */
enum { VOCAB = 151936, HIDDEN = 256, INTER = 768, LAYERS = 4, HEADS = 4, KV_HEADS = 2,
       HEAD_DIM = 64 };

static int write_text(const char *dir, const char *name, const char *text)
{
    char path[SHOAL_PATH_BYTES_MAX];
    if (common_path_join(path, sizeof path, dir, name))
        return -1;
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) == EOF || fclose(f) != 0) {
        fprintf(stderr, "shoal-make-demo: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

static int copy_file(const char *from_dir, const char *to_dir, const char *name)
{
    char from[SHOAL_PATH_BYTES_MAX];
    char *text = NULL;
    size_t bytes;
    shoal_diag diag;
    if (common_path_join(from, sizeof from, from_dir, name) ||
        common_file_read(from, 64u << 20, &text, &bytes, &diag)) {
        fprintf(stderr,
                "shoal-make-demo: cannot read %s/%s (run tools/setup, which installs the "
                "Qwen3 tokenizer files)\n",
                from_dir, name);
        return -1;
    }
    int rc = write_text(to_dir, name, text);
    free(text);
    return rc;
}

static const char config_json[] =
    "{\n"
    "  \"architectures\": [\"Qwen3ForCausalLM\"],\n"
    "  \"model_type\": \"qwen3\",\n"
    "  \"vocab_size\": 151936,\n"
    "  \"hidden_size\": 256,\n"
    "  \"intermediate_size\": 768,\n"
    "  \"num_hidden_layers\": 4,\n"
    "  \"num_attention_heads\": 4,\n"
    "  \"num_key_value_heads\": 2,\n"
    "  \"head_dim\": 64,\n"
    "  \"hidden_act\": \"silu\",\n"
    "  \"max_position_embeddings\": 40960,\n"
    "  \"rms_norm_eps\": 1e-06,\n"
    "  \"rope_theta\": 1000000,\n"
    "  \"rope_scaling\": null,\n"
    "  \"tie_word_embeddings\": true,\n"
    "  \"attention_bias\": false,\n"
    "  \"torch_dtype\": \"bfloat16\",\n"
    "  \"bos_token_id\": 151643,\n"
    "  \"eos_token_id\": 151645\n"
    "}\n";

static const char generation_json[] =
    "{\n  \"bos_token_id\": 151643,\n  \"eos_token_id\": [151645, 151643]\n}\n";

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"out", required_argument, 0, 'o'},
        {"tokenizer-dir", required_argument, 0, 't'},
        {"seed", required_argument, 0, 's'},
        {0, 0, 0, 0},
    };
    const char *out = NULL, *tok_dir = NULL;
    unsigned long long seed = 7;
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c == 'o')
            out = optarg;
        else if (c == 't')
            tok_dir = optarg;
        else if (c == 's')
            seed = strtoull(optarg, NULL, 10);
        else
            return 2;
    }
    if (!out || !tok_dir) {
        fprintf(stderr, "usage: shoal-make-demo --out DIR --tokenizer-dir DIR [--seed N]\n");
        return 2;
    }
    if (mkdir(out, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "shoal-make-demo: cannot create %s: %s\n", out, strerror(errno));
        return 1;
    }
    if (write_text(out, "config.json", config_json) ||
        write_text(out, "generation_config.json", generation_json) ||
        copy_file(tok_dir, out, "tokenizer.json") ||
        copy_file(tok_dir, out, "tokenizer_config.json"))
        return 1;

    /* The tensors a tied Qwen3 has, filled by the dummy weight source. */
    enum { PER_LAYER = 11 };
    int count = 2 + LAYERS * PER_LAYER;
    model_tensor_out *t = calloc((size_t)count, sizeof *t);
    char (*names)[SHOAL_TENSOR_NAME_BYTES_MAX] = calloc((size_t)count, sizeof *names);
    model_weights *w = NULL;
    if (!t || !names || model_weights_open_dummy(seed, &w))
        return 1;
    static const struct {
        const char *suffix;
        int rows, cols;
    } layer[PER_LAYER] = {
        {"input_layernorm.weight", HIDDEN, 0},
        {"post_attention_layernorm.weight", HIDDEN, 0},
        {"self_attn.q_proj.weight", HEADS * HEAD_DIM, HIDDEN},
        {"self_attn.k_proj.weight", KV_HEADS * HEAD_DIM, HIDDEN},
        {"self_attn.v_proj.weight", KV_HEADS * HEAD_DIM, HIDDEN},
        {"self_attn.o_proj.weight", HIDDEN, HEADS * HEAD_DIM},
        {"self_attn.q_norm.weight", HEAD_DIM, 0},
        {"self_attn.k_norm.weight", HEAD_DIM, 0},
        {"mlp.gate_proj.weight", INTER, HIDDEN},
        {"mlp.up_proj.weight", INTER, HIDDEN},
        {"mlp.down_proj.weight", HIDDEN, INTER},
    };
    int n = 0;
    snprintf(names[n], sizeof names[n], "model.embed_tokens.weight");
    t[n++] = (model_tensor_out){.dims = 2, .shape = {VOCAB, HIDDEN}};
    snprintf(names[n], sizeof names[n], "model.norm.weight");
    t[n++] = (model_tensor_out){.dims = 1, .shape = {HIDDEN}};
    for (int l = 0; l < LAYERS; l++) {
        for (int i = 0; i < PER_LAYER; i++) {
            snprintf(names[n], sizeof names[n], "model.layers.%d.%s", l, layer[i].suffix);
            t[n] = (model_tensor_out){.dims = layer[i].cols ? 2 : 1,
                                       .shape = {layer[i].rows, layer[i].cols}};
            n++;
        }
    }
    shoal_diag diag = {{0}};
    for (int i = 0; i < n; i++) {
        model_tensor_ref ref;
        if (model_weights_get(w, names[i], t[i].dims, t[i].shape, &ref, &diag))
            return 1;
        t[i].name = names[i];
        t[i].dtype = ref.dtype;
        t[i].data = ref.data;
    }
    char path[SHOAL_PATH_BYTES_MAX];
    if (common_path_join(path, sizeof path, out, "model.safetensors") ||
        model_safetensors_write(path, t, n, &diag)) {
        fprintf(stderr, "shoal-make-demo: %s\n", diag.msg);
        return 1;
    }
    model_weights_close(w);
    free(t);
    free(names);
    printf("shoal-make-demo: wrote a Qwen3-shaped demo model with random weights to %s "
           "(its output is noise)\n",
           out);
    return 0;
}
