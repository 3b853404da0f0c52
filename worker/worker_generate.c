#include "worker_generate.h"

#include <math.h>
#include <stdlib.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double log_sum_exp(const float *logits, int vocab, float mx)
{
    double sum = 0.0;
    for (int i = 0; i < vocab; i++)
        sum += exp((double)(logits[i] - mx));
    return (double)mx + log(sum);
}

int worker_greedy(const float *logits, int vocab, float *logprob)
{
    int best = 0;
    for (int i = 1; i < vocab; i++)
        if (logits[i] > logits[best])
            best = i;
    if (logprob)
        *logprob = (float)((double)logits[best] - log_sum_exp(logits, vocab, logits[best]));
    return best;
}

float worker_logprob(const float *logits, int vocab, int token)
{
    float mx = logits[0];
    for (int i = 1; i < vocab; i++)
        mx = logits[i] > mx ? logits[i] : mx;
    return (float)((double)logits[token] - log_sum_exp(logits, vocab, mx));
}

static bool is_eos(const model_config *c, int token)
{
    for (int i = 0; i < c->eos_count; i++)
        if (c->eos_ids[i] == token)
            return true;
    return false;
}

shoal_err worker_generate_greedy(worker_model *m, const int32_t *prompt, int prompt_len,
                                 int max_tokens, bool stop_at_eos, worker_token_fn on_token,
                                 void *ctx, worker_generate_stats *stats, shoal_diag *diag)
{
    const model_config *c = worker_model_config(m);
    int pt = worker_model_kv_layout(m)->page_tokens;
    shoal_err err = SHOAL_OK;
    worker_generate_stats st = {0};
    if (prompt_len < 1 || max_tokens < 0)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "generate: need at least one prompt token and max_tokens >= 0");
    /* The last generated token is never fed back, so it needs no slot. */
    int64_t total = (int64_t)prompt_len + (max_tokens > 0 ? max_tokens - 1 : 0);
    int64_t pages = (total + pt - 1) / pt;
    if (pages > worker_model_kv_pages(m))
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT,
                              "generate: %lld tokens need %lld KV pages of %d tokens, the arena "
                              "has %d; raise --kv-pages",
                              (long long)total, (long long)pages, pt, worker_model_kv_pages(m));
    int32_t *table = malloc((size_t)pages * sizeof *table);
    int32_t *rows_stream = NULL, *positions = NULL, *ids = NULL;
    float *logits = malloc((size_t)c->vocab * sizeof *logits);
    int chunk = worker_model_max_rows(m);
    rows_stream = calloc((size_t)chunk, sizeof *rows_stream);
    positions = malloc((size_t)chunk * sizeof *positions);
    ids = malloc((size_t)chunk * sizeof *ids);
    if (!table || !logits || !rows_stream || !positions || !ids) {
        err = shoal_diag_set(diag, SHOAL_ERR_NOMEM, "generate: no memory");
        goto out;
    }
    for (int64_t p = 0; p < pages; p++)
        table[p] = (int32_t)p;
    worker_forward f = {
        .row_stream = rows_stream,
        .positions = positions,
        .token_ids = ids,
        .streams = 1,
        .page_table_stride = pages > 0 ? (int)pages : 1,
        .page_table = table,
        .logit_count = 1,
    };
    double t0 = now_s();
    for (int done = 0; done < prompt_len;) {
        int n = prompt_len - done < chunk ? prompt_len - done : chunk;
        for (int i = 0; i < n; i++) {
            positions[i] = done + i;
            ids[i] = prompt[done + i];
        }
        int32_t last = n - 1;
        f.rows = n;
        f.logit_rows = &last;
        f.logit_count = done + n == prompt_len ? 1 : 0;
        if ((err = worker_model_forward(m, &f, logits, diag)))
            goto out;
        done += n;
    }
    st.prompt_tokens = prompt_len;
    double t1 = now_s();
    st.prefill_s = t1 - t0;
    for (int i = 0; i < max_tokens; i++) {
        float lp;
        int tok = worker_greedy(logits, c->vocab, &lp);
        st.generated_tokens++;
        if (on_token && !on_token(ctx, i, tok, lp))
            break;
        if ((stop_at_eos && is_eos(c, tok)) || i + 1 == max_tokens)
            break;
        int32_t zero = 0;
        positions[0] = prompt_len + i;
        ids[0] = tok;
        f.rows = 1;
        f.logit_rows = &zero;
        f.logit_count = 1;
        if ((err = worker_model_forward(m, &f, logits, diag)))
            goto out;
    }
    st.decode_s = now_s() - t1;
out:
    if (stats)
        *stats = st;
    free(table);
    free(logits);
    free(rows_stream);
    free(positions);
    free(ids);
    return err;
}
