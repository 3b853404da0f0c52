#include "common_worker_flags.h"

#include "common/common_args.h"
#include "common/common_assert.h"
#include "common/common_limits.h"

#include <getopt.h>
#include <string.h>

/* Where a value's range is a bound of common_limits.h, the worker refuses
 * to start past it, so both programs take exactly that range. */
const common_worker_flag common_worker_flags[COMMON_WORKER_FLAG_COUNT] = {
    [COMMON_WORKER_FLAG_LOAD_FORMAT] = {"--load-format", "FMT", COMMON_WORKER_TYPE_WORD, 0, 0,
                                        {"auto", "dummy"},
                                        "auto (read the weights) or dummy (random weights\n"
                                        "at the shapes of config.json; for benchmarks)"},
    [COMMON_WORKER_FLAG_THREADS] = {"--threads", "N", COMMON_WORKER_TYPE_INT, 0,
                                    SHOAL_CPU_THREADS_MAX, {0},
                                    "CPU backend threads (default: one per processor)"},
    [COMMON_WORKER_FLAG_PAGE_TOKENS] = {"--page-tokens", "N", COMMON_WORKER_TYPE_INT,
                                        SHOAL_PAGE_TOKENS_MIN, SHOAL_PAGE_TOKENS_MAX, {0},
                                        "tokens per KV page (default 16)"},
    [COMMON_WORKER_FLAG_MAX_BATCH_TOKENS] = {"--max-batch-tokens", "N", COMMON_WORKER_TYPE_INT, 1,
                                             SHOAL_BATCH_ROWS_MAX, {0},
                                             "rows of one forward pass; prompts longer go in\n"
                                             "chunks (default 2048; serving: 512)"},
    [COMMON_WORKER_FLAG_PARALLEL] = {"--parallel", "N", COMMON_WORKER_TYPE_INT, 1,
                                     SHOAL_BATCH_STREAMS_MAX, {0},
                                     "engine: streams running at once (default 64)"},
    [COMMON_WORKER_FLAG_KV_PAGES] = {"--kv-pages", "N", COMMON_WORKER_TYPE_INT, 1, 1 << 24, {0},
                                     "engine: KV pages (default: enough for --parallel\n"
                                     "streams of the benchmark's length; serving: a share\n"
                                     "of the memory free once the weights are in, at most\n"
                                     "what --parallel streams of --max-model-len need)"},
    [COMMON_WORKER_FLAG_KV_DTYPE] = {"--kv-dtype", "D", COMMON_WORKER_TYPE_WORD, 0, 0,
                                     {"bf16", "fp8", "f32"},
                                     "KV pages: bf16 (default), fp8 (e4m3, scales 1.0)\n"
                                     "or f32 (CPU backend only)"},
    [COMMON_WORKER_FLAG_STATE_CHECKPOINTS] = {"--state-checkpoints", "N", COMMON_WORKER_TYPE_INT, 0,
                                              SHOAL_STATE_SLOTS_MAX, {0},
                                              "hybrid models: recurrent-state checkpoints kept\n"
                                              "for prefix hits (default: twice --parallel)"},
    [COMMON_WORKER_FLAG_CHECKPOINT_INTERVAL] = {"--checkpoint-interval", "N",
                                                COMMON_WORKER_TYPE_INT, 0,
                                                SHOAL_CONTEXT_TOKENS_MAX, {0},
                                                "hybrid models: a prompt keeps its state every N\n"
                                                "tokens (a multiple of --page-tokens; default\n"
                                                "512; 0: only at its last full page and each\n"
                                                "turn's end)"},
    [COMMON_WORKER_FLAG_MAX_MODEL_LEN] = {"--max-model-len", "N", COMMON_WORKER_TYPE_INT, 2,
                                          SHOAL_CONTEXT_TOKENS_MAX, {0},
                                          "serving: context of one stream (default: the\n"
                                          "model's, at most 32768)"},
    [COMMON_WORKER_FLAG_HEARTBEAT_MS] = {"--heartbeat-ms", "N", COMMON_WORKER_TYPE_INT, 10, 60000,
                                         {0},
                                         "a serving worker reports at least this often while\n"
                                         "idle (default 200)"},
    [COMMON_WORKER_FLAG_STEP_TIMEOUT_S] = {"--step-timeout-s", "N", COMMON_WORKER_TYPE_INT, 0, 86400,
                                           {0},
                                           "a serving worker reports while one engine step runs\n"
                                           "for up to N s; past it, it falls silent and is\n"
                                           "restarted as hung (default 300; 0: never)"},
    [COMMON_WORKER_FLAG_LEARN_CONVERSATIONS] = {"--learn-conversations", NULL,
                                                COMMON_WORKER_TYPE_SWITCH, 0, 0, {0},
                                                "serving: keep conversations' KV pages, spill\n"
                                                "them to the state store when evicted and\n"
                                                "restore them on the next turn; SIGTERM then\n"
                                                "writes the rest before exiting (hybrid models:\n"
                                                "with each turn's state checkpoint)"},
    [COMMON_WORKER_FLAG_STATE_DIR] = {"--state-dir", "DIR", COMMON_WORKER_TYPE_PATH, 0, 0, {0},
                                      "the store (an LMDB directory, made 0700; shared by\n"
                                      "the cluster's workers and kept across restarts;\n"
                                      "shoalctl states inspects it)"},
    [COMMON_WORKER_FLAG_SPILL_GIB] = {"--spill-gib", "N", COMMON_WORKER_TYPE_GIB, 0,
                                      (long long)(SHOAL_STORE_SPILL_BYTES_MAX >> 30), {0},
                                      "the store's size limit in GiB (default 16; fractions\n"
                                      "allowed); least recently used states go first"},
    [COMMON_WORKER_FLAG_RESTORE_MODE] = {"--restore-mode", "M", COMMON_WORKER_TYPE_WORD, 0, 0,
                                         {"overlap", "read"},
                                         "overlap (default on a GPU): a turn computes the\n"
                                         "head of its history while the store reads the tail,\n"
                                         "the two meeting; read (default on the CPU): it\n"
                                         "reads every stored block (hybrid models always read)"},
    [COMMON_WORKER_FLAG_WARMUP] = {"--warmup", "M", COMMON_WORKER_TYPE_WORD, 0, 0,
                                   {"auto", "on", "off"},
                                   "serving: auto (default: on a GPU, not on the CPU),\n"
                                   "on or off: before serving, prompt passes and a decode\n"
                                   "round of every batch size, so that the first requests\n"
                                   "do not pay for loading kernels and recording graphs"},
};

/* "auto, on or off" */
static void words_list(const common_worker_flag *f, char *out, size_t cap)
{
    int n = 0;
    while (n < COMMON_WORKER_WORDS_MAX && f->words[n])
        n++;
    size_t len = 0;
    out[0] = '\0';
    for (int i = 0; i < n && len < cap; i++)
        len += (size_t)snprintf(out + len, cap - len, "%s%s",
                                i == 0 ? "" : i == n - 1 ? " or " : ", ", f->words[i]);
}

shoal_err common_worker_args_set(common_worker_args *a, common_worker_flag_id id, const char *value,
                                 shoal_diag *diag)
{
    SHOAL_ASSERT(id >= 0 && id < COMMON_WORKER_FLAG_COUNT);
    const common_worker_flag *f = &common_worker_flags[id];
    SHOAL_ASSERT((f->type == COMMON_WORKER_TYPE_SWITCH) == (value == NULL));
    long long num = 0;
    const char *text = NULL;
    switch (f->type) {
    case COMMON_WORKER_TYPE_SWITCH:
        break;
    case COMMON_WORKER_TYPE_INT:
        if (common_args_int(f->flag, value, f->lo, f->hi, &num, diag))
            return SHOAL_ERR_INVALID;
        break;
    case COMMON_WORKER_TYPE_GIB: {
        unsigned long long bytes;
        if (common_args_gib(f->flag, value, (double)f->hi, &bytes, diag))
            return SHOAL_ERR_INVALID;
        num = (long long)bytes;
        text = value;
        break;
    }
    case COMMON_WORKER_TYPE_WORD: {
        int k = 0;
        while (k < COMMON_WORKER_WORDS_MAX && f->words[k] && strcmp(value, f->words[k]) != 0)
            k++;
        if (k == COMMON_WORKER_WORDS_MAX || !f->words[k]) {
            char list[64];
            words_list(f, list, sizeof list);
            return shoal_diag_set(diag, SHOAL_ERR_INVALID, "%s '%s': expected %s", f->flag, value,
                                  list);
        }
        num = k;
        text = f->words[k];
        break;
    }
    case COMMON_WORKER_TYPE_PATH:
        text = value;
        break;
    }
    a->given[id] = true;
    a->num[id] = num;
    a->text[id] = text;
    return SHOAL_OK;
}

bool common_worker_args_has(const common_worker_args *a, common_worker_flag_id id)
{
    SHOAL_ASSERT(id >= 0 && id < COMMON_WORKER_FLAG_COUNT);
    return a->given[id];
}

long long common_worker_args_num(const common_worker_args *a, common_worker_flag_id id,
                                 long long dflt)
{
    return common_worker_args_has(a, id) ? a->num[id] : dflt;
}

const char *common_worker_args_text(const common_worker_args *a, common_worker_flag_id id)
{
    return common_worker_args_has(a, id) ? a->text[id] : NULL;
}

shoal_err common_worker_args_check(const common_worker_args *a, shoal_diag *diag)
{
    bool learn = a->given[COMMON_WORKER_FLAG_LEARN_CONVERSATIONS];
    static const common_worker_flag_id needs_learn[] = {
        COMMON_WORKER_FLAG_STATE_DIR, COMMON_WORKER_FLAG_SPILL_GIB, COMMON_WORKER_FLAG_RESTORE_MODE};
    for (size_t i = 0; !learn && i < sizeof needs_learn / sizeof needs_learn[0]; i++)
        if (a->given[needs_learn[i]])
            return shoal_diag_set(diag, SHOAL_ERR_INVALID, "%s needs --learn-conversations",
                                  common_worker_flags[needs_learn[i]].flag);
    if (learn && !a->given[COMMON_WORKER_FLAG_STATE_DIR])
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "--learn-conversations needs --state-dir DIR (where the states are "
                              "kept)");
    return SHOAL_OK;
}

int common_worker_args_argv(const common_worker_args *a,
                            char num[COMMON_WORKER_FLAG_COUNT][COMMON_WORKER_NUM_BYTES],
                            const char *argv[COMMON_WORKER_ARGV_MAX])
{
    int n = 0;
    for (int i = 0; i < COMMON_WORKER_FLAG_COUNT; i++) {
        if (!a->given[i])
            continue;
        const common_worker_flag *f = &common_worker_flags[i];
        argv[n++] = f->flag;
        switch (f->type) {
        case COMMON_WORKER_TYPE_SWITCH:
            break;
        case COMMON_WORKER_TYPE_INT:
            snprintf(num[i], COMMON_WORKER_NUM_BYTES, "%lld", a->num[i]);
            argv[n++] = num[i];
            break;
        case COMMON_WORKER_TYPE_GIB: /* as given: "0.5" stays "0.5" */
        case COMMON_WORKER_TYPE_WORD:
        case COMMON_WORKER_TYPE_PATH:
            argv[n++] = a->text[i];
            break;
        }
    }
    SHOAL_ASSERT(n <= COMMON_WORKER_ARGV_MAX);
    return n;
}

void common_worker_flags_usage(FILE *f, int column)
{
    for (int i = 0; i < COMMON_WORKER_FLAG_COUNT; i++) {
        const common_worker_flag *w = &common_worker_flags[i];
        int at = fprintf(f, "  %s%s%s", w->flag, w->arg ? " " : "", w->arg ? w->arg : "");
        const char *line = w->help;
        for (;;) {
            const char *nl = strchr(line, '\n');
            int len = nl ? (int)(nl - line) : (int)strlen(line);
            fprintf(f, "%*s%.*s\n", at < column ? column - at : 1, "", len, line);
            if (!nl)
                break;
            line = nl + 1;
            at = 0;
        }
    }
}

void common_worker_flags_getopt(struct option *out, int val_base)
{
    for (int i = 0; i < COMMON_WORKER_FLAG_COUNT; i++) {
        const common_worker_flag *w = &common_worker_flags[i];
        out[i] = (struct option){
            .name = w->flag + 2, /* getopt_long's names go without the "--" */
            .has_arg = w->type == COMMON_WORKER_TYPE_SWITCH ? no_argument : required_argument,
            .flag = NULL,
            .val = val_base + i,
        };
    }
    out[COMMON_WORKER_FLAG_COUNT] = (struct option){0};
}
