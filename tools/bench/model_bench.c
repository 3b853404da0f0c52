/* shoal-model-bench: the model's forward pass alone, warm, timed: what a
 * prefill chunk and a decode step cost on a device, without the engine's
 * scheduling or any client.
 *
 *   shoal-model-bench --model DIR [--device 0] [--load-format dummy|auto]
 *                     [--prefill N] [--batch B] [--context C] [--steps S]
 *                     [--kv-dtype bf16|fp8]
 *
 * Prefill: one stream's N-token prompt in one pass (logits of its last
 * row), once to warm up (module loading, cuBLAS heuristics), then five
 * times over the same pages; the median is printed.
 * Decode: B streams whose first C tokens are prefilled (in passes of at
 * most 2,048 rows, untimed), then S steps of one row per stream, each
 * sampled greedily on the device (worker_model_step, as the engine runs
 * them); the first step (which records the step's CUDA graph) is printed
 * apart, and the median of the rest.
 * Each figure comes with the bytes the step must read (every weight but
 * the embedding table, the KV of every stream, and a hybrid's recurrent
 * states, read and written), for a bound measured in the same run. */
#include "common/common_rng.h"
#include "worker/worker_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *t, int n)
{
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return t[n / 2];
}

int main(int argc, char **argv)
{
    worker_model_options mo;
    worker_model_options_default(&mo);
    mo.device = "0";
    mo.load_format = WORKER_LOAD_DUMMY;
    int prefill = 2048, batch = 1, context = 4096, steps = 64;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (strcmp(k, "--model") == 0)
            mo.model_dir = v;
        else if (strcmp(k, "--device") == 0)
            mo.device = v;
        else if (strcmp(k, "--load-format") == 0)
            mo.load_format = strcmp(v, "dummy") == 0 ? WORKER_LOAD_DUMMY : WORKER_LOAD_AUTO;
        else if (strcmp(k, "--prefill") == 0)
            prefill = atoi(v);
        else if (strcmp(k, "--batch") == 0)
            batch = atoi(v);
        else if (strcmp(k, "--context") == 0)
            context = atoi(v);
        else if (strcmp(k, "--steps") == 0)
            steps = atoi(v);
        else if (strcmp(k, "--kv-dtype") == 0)
            mo.kv_dtype = strcmp(v, "fp8") == 0 ? SHOAL_DTYPE_F8_E4M3 : SHOAL_DTYPE_BF16;
        else {
            fprintf(stderr, "shoal-model-bench: unknown option %s\n", k);
            return 2;
        }
    }
    if (!mo.model_dir || prefill < 1 || batch < 1 || batch > 512 || context < 1 || steps < 2) {
        fprintf(stderr, "usage: shoal-model-bench --model DIR [--prefill N] [--batch B] "
                        "[--context C] [--steps S]\n");
        return 2;
    }
    enum { CHUNK = 2048 };
    int pt = mo.page_tokens;
    int longest = (prefill > context + steps ? prefill : context + steps);
    int per_stream = (longest + pt - 1) / pt;
    mo.max_rows = prefill > CHUNK ? prefill : CHUNK;
    mo.max_streams = batch;
    mo.max_logit_rows = batch;
    mo.max_pages_per_stream = per_stream;
    mo.kv_pages = batch * per_stream;
    worker_model *m = NULL;
    shoal_diag diag = {{0}};
    if (worker_model_open(&mo, &m, &diag)) {
        fprintf(stderr, "shoal-model-bench: %s\n", diag.msg);
        return 1;
    }
    const model_config *c = worker_model_config(m);
    int rows_max = mo.max_rows;
    int32_t *ids = malloc((size_t)rows_max * 4), *pos = malloc((size_t)rows_max * 4);
    int32_t *rs = calloc((size_t)rows_max, 4), *lr = malloc((size_t)batch * 4);
    int32_t *table = malloc((size_t)batch * per_stream * 4);
    float *logits = malloc((size_t)c->vocab * 4);
    kernels_sample_params *sp = calloc((size_t)batch, sizeof *sp);
    kernels_sample_result *res = malloc((size_t)batch * sizeof *res);
    double *t = malloc((size_t)(steps > 8 ? steps : 8) * sizeof *t);
    if (!ids || !pos || !rs || !lr || !table || !logits || !sp || !res || !t) {
        fprintf(stderr, "shoal-model-bench: no memory\n");
        return 1;
    }
    uint64_t rng = 7;
    for (int p = 0; p < batch * per_stream; p++)
        table[p] = p;
    int rc = 1;

    /* one stream's prompt, warm */
    for (int i = 0; i < prefill; i++) {
        ids[i] = (int32_t)(common_rng_next(&rng) % (uint64_t)c->vocab);
        pos[i] = i;
    }
    int32_t last = prefill - 1;
    worker_forward f = {prefill, ids, pos, rs, 1, per_stream, table, 1, &last, NULL};
    for (int r = 0; r < 6; r++) {
        double t0 = now_s();
        if (worker_model_forward(m, &f, logits, &diag))
            goto fail;
        if (r > 0)
            t[r - 1] = now_s() - t0;
    }
    double pre = median(t, 5);
    printf("prefill: %d tokens in %.2f ms (median of 5, warm), %.0f tokens/s\n", prefill, pre * 1e3,
           prefill / pre);

    /* the streams' contexts, then decode steps */
    for (int s = 0; s < batch; s++)
        for (int done = 0; done < context;) {
            int n = context - done < CHUNK ? context - done : CHUNK;
            for (int i = 0; i < n; i++) {
                ids[i] = (int32_t)(common_rng_next(&rng) % (uint64_t)c->vocab);
                pos[i] = done + i;
                rs[i] = 0;
            }
            int32_t slot = s; /* a hybrid's state: stream s's slot in the steps */
            worker_forward pf = {n, ids, pos, rs, 1, per_stream, table + (size_t)s * per_stream,
                                 0, NULL, &slot};
            if (worker_model_forward(m, &pf, NULL, &diag))
                goto fail;
            done += n;
        }
    for (int s = 0; s < batch; s++) {
        rs[s] = s;
        lr[s] = s;
        pos[s] = context;
        ids[s] = (int32_t)(common_rng_next(&rng) % (uint64_t)c->vocab);
        sp[s].top_p = 1.0f;
        sp[s].repetition_penalty = 1.0f;
    }
    double first = 0.0;
    for (int i = 0; i < steps; i++) {
        worker_forward df = {batch, ids, pos, rs, batch, per_stream, table, batch, lr, NULL};
        double t0 = now_s();
        if (worker_model_step(m, &df, sp, NULL, res, &diag))
            goto fail;
        double dt = now_s() - t0;
        if (i == 0)
            first = dt;
        else
            t[i - 1] = dt;
        for (int s = 0; s < batch; s++) {
            ids[s] = res[s].token;
            pos[s]++;
        }
    }
    double step = median(t, steps - 1);
    /* The weights a step reads: every layer's attention, a dense layer's
     * MLP, a MoE layer's router and the experts that some row of the last
     * step routed to (their union, read back), the norms and the head. */
    double weights = 0.0, active = 0.0, touched = 0.0;
    int moe_layers = 0, attn_layers = 0;
    {
        /* an attention layer: q (and its gate), k, v, o; a gated DeltaNet
         * layer: [q | k | v], z, b and a, and out_proj */
        double q = (double)c->heads * c->head_dim, kv = (double)c->kv_heads * c->head_dim;
        double attn = (double)c->hidden * ((c->attn_output_gate ? 3 : 2) * q + 2 * kv) +
                      2.0 * c->hidden;
        double vd = (double)c->lin_v_heads * c->lin_v_dim;
        double linear = (double)c->hidden * (model_config_lin_conv_dim(c) + 2 * vd +
                                             2.0 * c->lin_v_heads) +
                        2.0 * c->hidden;
        double expert = 3.0 * c->hidden * c->moe_intermediate;
        double shared = c->shared_intermediate > 0
                            ? 3.0 * c->hidden * c->shared_intermediate + c->hidden
                            : 0.0;
        int32_t *route =
            malloc((size_t)batch * (c->experts_per_tok > 0 ? c->experts_per_tok : 1) * 4);
        bool *used = calloc((size_t)(c->experts > 0 ? c->experts : 1), 1);
        for (int l = 0; l < c->layers; l++) {
            bool is_attn = c->mixer_kind[l] == MODEL_MIXER_ATTENTION;
            attn_layers += is_attn;
            weights += is_attn ? attn : linear;
            active += is_attn ? attn : linear;
            if (c->mlp_kind[l] != MODEL_MLP_MOE) {
                weights += 3.0 * c->hidden * c->intermediate;
                active += 3.0 * c->hidden * c->intermediate;
                continue;
            }
            if (!route || !used || worker_model_routing(m, l, batch, route, &diag))
                goto fail;
            memset(used, 0, (size_t)c->experts);
            int n = 0;
            for (int i = 0; i < batch * c->experts_per_tok; i++)
                if (!used[route[i]])
                    used[route[i]] = true, n++;
            moe_layers++;
            touched += n;
            weights += (double)c->experts * c->hidden + n * expert + shared;
            active += (double)c->experts * c->hidden + c->experts_per_tok * expert + shared;
        }
        free(route);
        free(used);
        weights = 2.0 * (weights + (double)c->vocab * c->hidden);
        active += (double)c->vocab * c->hidden;
    }
    double kv_bytes = (double)batch * (context + steps / 2) * attn_layers * 2.0 * c->kv_heads *
                      c->head_dim * (mo.kv_dtype == SHOAL_DTYPE_F8_E4M3 ? 1 : 2);
    /* a hybrid's recurrent states: each stream's slot read and written */
    double state_bytes = 2.0 * batch * (double)worker_model_slot_bytes(m);
    printf("decode: batch %d at context %d: %.3f ms a step (median of %d), %.1f tokens/s; first "
           "step %.2f ms\n",
           batch, context, step * 1e3, steps - 1, batch / step, first * 1e3);
    printf("bytes a step: weights %.0f, KV %.0f, states %.0f\n", weights, kv_bytes, state_bytes);
    printf("active parameters a token: %.0f (prefill bound at 790 TFLOP/s: %.2f ms for %d "
           "tokens)\n",
           active, 2.0 * active * prefill / 790e12 * 1e3, prefill);
    if (moe_layers > 0)
        printf("experts: a step's rows touch %.1f of %d experts a layer (mean over %d layers; "
               "top-%d a row)\n",
               touched / moe_layers, c->experts, moe_layers, c->experts_per_tok);
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "shoal-model-bench: %s\n", diag.msg);
out:
    worker_model_close(m);
    free(ids), free(pos), free(rs), free(lr), free(table), free(logits), free(sp), free(res);
    free(t);
    return rc;
}
