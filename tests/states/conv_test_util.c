#include "conv_test_util.h"

#include <stdio.h>
#include "worker/worker_engine.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

worker_model *cu_model;
common_hash cu_fingerprint;
store_page_layout cu_layout;
size_t cu_state_bytes;
int32_t cu_conv[CU_TURNS][CU_LEN_MAX];
int cu_conv_len[CU_TURNS];
int32_t cu_answer[CU_TURNS][CU_GEN];
int32_t cu_filler[4][CU_KV_PAGES * CU_PT];

static const worker_engine_options ref_options = {
    .max_batch_tokens = 256, .parallel = 1, .max_queued = 4, .max_model_len = 1024};

/* The reference answer of a prompt; exits when the engine fails (the
 * tests have nothing to compare with then). */
static void die(const char *what, const shoal_diag *diag)
{
    fprintf(stderr, "conv_test_util: %s: %s\n", what, diag->msg);
    exit(1);
}

static void reference(const int32_t *prompt, int len, int32_t *out)
{
    worker_engine *e = NULL;
    shoal_diag diag = {{0}};
    if (worker_engine_open(cu_model, &ref_options, &e, &diag) != SHOAL_OK)
        die("the reference engine", &diag);
    worker_request r = {
        .id = 1, .prompt = prompt, .prompt_len = len, .max_tokens = CU_GEN, .ignore_eos = true};
    r.sampling.top_p = 1.0f;
    r.sampling.repetition_penalty = 1.0f;
    if (worker_engine_submit(e, &r, &diag) != SHOAL_OK)
        die("a reference prompt", &diag);
    worker_event ev[8];
    int n = 0;
    while (worker_engine_busy(e)) {
        int k;
        if (worker_engine_step(e, ev, &k, &diag) != SHOAL_OK)
            die("a reference step", &diag);
        for (int i = 0; i < k; i++)
            if (ev[i].token >= 0 && n < CU_GEN)
                out[n++] = ev[i].token;
    }
    if (n != CU_GEN) {
        fprintf(stderr, "conv_test_util: the reference gave %d of %d tokens\n", n, CU_GEN);
        exit(1);
    }
    worker_engine_close(e);
}

static int32_t next_token(uint64_t *rng, int vocab)
{
    *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
    return (int32_t)((*rng >> 33) % (uint64_t)vocab);
}

void cu_open(const char *dir, uint64_t seed)
{
    worker_engine_options eo = ref_options;
    worker_model_options mo;
    worker_model_options_default(&mo);
    mo.model_dir = dir;
    mo.kv_pages = 64;
    mo.threads = 1;
    worker_engine_size_model(&eo, &mo);
    shoal_diag diag = {{0}};
    if (worker_model_open(&mo, &cu_model, &diag) != SHOAL_OK)
        die(dir, &diag);
    cu_fingerprint = *worker_model_fingerprint(cu_model);
    cu_state_bytes = worker_model_slot_bytes(cu_model);
    const kernels_kv_layout *kv = worker_model_kv_layout(cu_model);
    cu_layout = (store_page_layout){.page_tokens = kv->page_tokens,
                                    .layers = kv->layers,
                                    .kv_heads = kv->kv_heads,
                                    .head_dim = kv->head_dim,
                                    .dtype = kv->dtype,
                                    .page_bytes = kv->page_bytes};
    static const int user_len[CU_TURNS] = {100, 30, 25};
    int vocab = worker_model_config(cu_model)->vocab, len = 0;
    for (int t = 0; t < CU_TURNS; t++) {
        if (t > 0) {
            memcpy(cu_conv[t], cu_conv[t - 1], (size_t)cu_conv_len[t - 1] * 4);
            memcpy(cu_conv[t] + cu_conv_len[t - 1], cu_answer[t - 1], CU_GEN * 4);
            len = cu_conv_len[t - 1] + CU_GEN;
        }
        for (int k = 0; k < user_len[t]; k++)
            cu_conv[t][len++] = next_token(&seed, vocab);
        cu_conv_len[t] = len;
        reference(cu_conv[t], len, cu_answer[t]);
    }
    for (int f = 0; f < 4; f++)
        for (int k = 0; k < CU_KV_PAGES * CU_PT; k++)
            cu_filler[f][k] = next_token(&seed, vocab);
}

void cu_close(void)
{
    worker_model_close(cu_model);
    cu_model = NULL;
}

void cu_chain(const int32_t *tokens, int n, common_hash *out)
{
    common_hash root;
    common_block_root(&cu_fingerprint, NULL, &root);
    for (int b = 0; b < n; b++)
        common_block_hash(b == 0 ? &root : &out[b - 1], tokens + b * CU_PT, CU_PT, &out[b]);
}

bool cu_run(coordinator_cluster *c, const int32_t *prompt, int len, int max_tokens, ts_stream *r)
{
    ts_stream_init(r);
    coordinator_stream_request q;
    memset(&q, 0, sizeof q);
    q.prompt = prompt;
    q.prompt_len = len;
    q.max_tokens = max_tokens;
    q.ignore_eos = true;
    q.sampling.top_p = 1.0f;
    q.sampling.repetition_penalty = 1.0f;
    uint64_t id;
    shoal_diag diag = {{0}};
    if (coordinator_cluster_submit(c, &q, ts_stream_event, r, &id, &diag) != SHOAL_OK) {
        fprintf(stderr, "  submit: %s\n", diag.msg);
        return false;
    }
    for (int t = 0; t < 120000 && !atomic_load(&r->done); t += 5)
        usleep(5000);
    if (!atomic_load(&r->done) || r->finish == COORDINATOR_FINISH_ERROR) {
        fprintf(stderr, "  stream: %s\n", atomic_load(&r->done) ? r->error : "timed out");
        return false;
    }
    return true;
}

void cu_cluster_options(coordinator_cluster_options *o, const char *model, const char *worker_path,
                        const char *runtime_dir, const char *state_dir)
{
    coordinator_cluster_options_default(o);
    o->model_dir = model;
    o->workers = "cpu";
    o->runtime_dir = runtime_dir;
    o->worker_path = worker_path;
    o->threads = 1;
    o->parallel = 4;
    o->kv_pages = CU_KV_PAGES;
    o->max_model_len = 1024;
    o->max_batch_tokens = 256;
    o->heartbeat_ms = 50;
    o->dead_after_ms = 5000;
    o->start_timeout_ms = 60000;
    o->state_dir = state_dir;
    o->spill_gib = "0.25";
}

bool cu_turn(coordinator_cluster *c, int t, int *cached)
{
    ts_stream r;
    *cached = -1;
    if (!cu_run(c, cu_conv[t], cu_conv_len[t], CU_GEN, &r) || r.n != CU_GEN)
        return false;
    *cached = r.cached;
    return memcmp(r.tokens, cu_answer[t], sizeof cu_answer[t]) == 0;
}

bool cu_evict_all(coordinator_cluster *c, int f)
{
    ts_stream r;
    return cu_run(c, cu_filler[f], CU_KV_PAGES * CU_PT - 8, 1, &r);
}

shm_load cu_load(coordinator_cluster *c)
{
    coordinator_cluster_stats st;
    coordinator_cluster_stats_get(c, &st);
    return st.worker[0].load;
}

shm_load cu_settled_load(coordinator_cluster *c)
{
    usleep(200000); /* STEP and HEARTBEAT carry the load: the last step's comes next */
    return cu_load(c);
}
