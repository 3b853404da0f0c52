/* shoal-worker: owns one device and runs the model on it.
 *
 * Today it runs one prompt given as token ids and prints the greedy tokens
 * with their log-probabilities (one line each: index, token id, logprob),
 * then prefill and decode speed on stderr. */
#include "common/common_log.h"
#include "common/common_rng.h"
#include "worker/worker_generate.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: shoal-worker --model DIR (--prompt-ids 1,2,3 | --prompt-random N) [options]\n"
            "  --model DIR            Hugging Face model directory (config.json, safetensors)\n"
            "  --load-format FMT      auto (read the weights) or dummy (random weights at the\n"
            "                         shapes of config.json; for benchmarks)\n"
            "  --device DEV           cpu (default) or a GPU index\n"
            "  --threads N            CPU backend threads (default: one per processor)\n"
            "  --prompt-ids LIST      the prompt, comma-separated token ids\n"
            "  --prompt-random N      a prompt of N random token ids (seeded, for benchmarks)\n"
            "  --max-tokens N         tokens to generate (default 16)\n"
            "  --ignore-eos           keep generating past an EOS token\n"
            "  --page-tokens N        tokens per KV page (default 16)\n"
            "  --max-batch-tokens N   rows of one forward pass; prompts longer go in chunks\n"
            "                         (default 2048)\n");
}

static int parse_int(const char *flag, const char *s, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *s == '\0' || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "shoal-worker: %s '%s': expected an integer in [%ld, %ld]\n", flag, s, lo,
                hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* Parses "1,2,3" into a new array. */
static int parse_ids(const char *s, int32_t **out, int *count)
{
    int cap = 1;
    for (const char *p = s; *p; p++)
        cap += *p == ',';
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    if (!ids)
        return -1;
    int n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v > INT32_MAX || (*end != ',' && *end != '\0')) {
            fprintf(stderr, "shoal-worker: --prompt-ids: '%s' is not a list of token ids\n", s);
            free(ids);
            return -1;
        }
        ids[n++] = (int32_t)v;
        p = *end == ',' ? end + 1 : end;
    }
    if (n == 0) {
        fprintf(stderr, "shoal-worker: --prompt-ids: empty list\n");
        free(ids);
        return -1;
    }
    *out = ids;
    *count = n;
    return 0;
}

static bool print_token(void *ctx, int index, int token, float logprob)
{
    printf("%d\t%d\t%.6f\n", index, token, logprob);
    fflush(stdout);
    return true;
}

int main(int argc, char **argv)
{
    enum { OPT_MODEL = 1, OPT_LOAD, OPT_DEVICE, OPT_THREADS, OPT_IDS, OPT_RANDOM, OPT_MAX,
           OPT_EOS, OPT_PAGE, OPT_BATCH, OPT_HELP };
    static const struct option opts[] = {
        {"model", required_argument, 0, OPT_MODEL},
        {"load-format", required_argument, 0, OPT_LOAD},
        {"device", required_argument, 0, OPT_DEVICE},
        {"threads", required_argument, 0, OPT_THREADS},
        {"prompt-ids", required_argument, 0, OPT_IDS},
        {"prompt-random", required_argument, 0, OPT_RANDOM},
        {"max-tokens", required_argument, 0, OPT_MAX},
        {"ignore-eos", no_argument, 0, OPT_EOS},
        {"page-tokens", required_argument, 0, OPT_PAGE},
        {"max-batch-tokens", required_argument, 0, OPT_BATCH},
        {"help", no_argument, 0, OPT_HELP},
        {0, 0, 0, 0},
    };
    common_log_init("shoal-worker", COMMON_LOG_INFO);
    worker_model_options mo;
    worker_model_options_default(&mo);
    const char *ids_text = NULL;
    int random_len = 0, max_tokens = 16;
    bool ignore_eos = false;
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case OPT_MODEL: mo.model_dir = optarg; break;
        case OPT_LOAD:
            if (strcmp(optarg, "dummy") == 0) {
                mo.load_format = WORKER_LOAD_DUMMY;
            } else if (strcmp(optarg, "auto") != 0) {
                fprintf(stderr, "shoal-worker: --load-format '%s': expected auto or dummy\n",
                        optarg);
                return 2;
            }
            break;
        case OPT_DEVICE: mo.device = optarg; break;
        case OPT_THREADS:
            if (parse_int("--threads", optarg, 0, 256, &mo.threads))
                return 2;
            break;
        case OPT_IDS: ids_text = optarg; break;
        case OPT_RANDOM:
            if (parse_int("--prompt-random", optarg, 1, 1 << 20, &random_len))
                return 2;
            break;
        case OPT_MAX:
            if (parse_int("--max-tokens", optarg, 0, 1 << 20, &max_tokens))
                return 2;
            break;
        case OPT_EOS: ignore_eos = true; break;
        case OPT_PAGE:
            if (parse_int("--page-tokens", optarg, 1, 256, &mo.page_tokens))
                return 2;
            break;
        case OPT_BATCH:
            if (parse_int("--max-batch-tokens", optarg, 1, 8192, &mo.max_rows))
                return 2;
            break;
        case OPT_HELP: usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!mo.model_dir || (!ids_text && !random_len) || (ids_text && random_len) || optind < argc) {
        usage(stderr);
        return 2;
    }
    int32_t *prompt = NULL;
    int prompt_len = 0;
    if (ids_text && parse_ids(ids_text, &prompt, &prompt_len))
        return 2;
    shoal_diag diag = {{0}};
    worker_config cfg;
    if (worker_config_load(mo.model_dir, &cfg, &diag)) {
        fprintf(stderr, "shoal-worker: %s\n", diag.msg);
        free(prompt);
        return 1;
    }
    if (random_len) {
        prompt = malloc((size_t)random_len * sizeof *prompt);
        if (!prompt)
            return 1;
        uint64_t seed = 42;
        for (int i = 0; i < random_len; i++)
            prompt[i] = (int32_t)(common_rng_next(&seed) % (uint64_t)cfg.vocab);
        prompt_len = random_len;
    }
    /* Enough pages for this one stream, and logits for one row. */
    int64_t tokens = (int64_t)prompt_len + max_tokens;
    mo.kv_pages = (int)((tokens + mo.page_tokens - 1) / mo.page_tokens);
    mo.max_pages_per_stream = mo.kv_pages;
    mo.max_streams = 1;
    mo.max_logit_rows = 1;
    if (mo.max_rows > prompt_len)
        mo.max_rows = prompt_len;
    LOG_INFO("loading %s (%s weights) on %s", mo.model_dir,
             mo.load_format == WORKER_LOAD_DUMMY ? "dummy" : "real", mo.device);
    worker_model *m = NULL;
    if (worker_model_open(&mo, &m, &diag)) {
        fprintf(stderr, "shoal-worker: %s\n", diag.msg);
        free(prompt);
        return 1;
    }
    worker_generate_stats st;
    shoal_err err = worker_generate_greedy(m, prompt, prompt_len, max_tokens, !ignore_eos,
                                           print_token, NULL, &st, &diag);
    if (err) {
        fprintf(stderr, "shoal-worker: %s\n", diag.msg);
    } else {
        LOG_INFO("prefill: %d tokens in %.3f s (%.1f tokens/s)", st.prompt_tokens, st.prefill_s,
                 st.prompt_tokens / (st.prefill_s > 0 ? st.prefill_s : 1e-9));
        if (st.generated_tokens > 1)
            LOG_INFO("decode: %d tokens in %.3f s (%.2f tokens/s)", st.generated_tokens - 1,
                     st.decode_s, (st.generated_tokens - 1) / (st.decode_s > 0 ? st.decode_s : 1e-9));
    }
    worker_model_close(m);
    free(prompt);
    return err ? 1 : 0;
}
