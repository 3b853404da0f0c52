/* worker_warmup.c: see worker_warmup.h. */
#include "worker/worker_warmup.h"

#include "common/common_log.h"
#include "common/common_time.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool worker_warmup_mode_parse(const char *s, worker_warmup_mode *out)
{
    static const char *names[] = {"auto", "on", "off"};
    for (int i = 0; i < 3; i++)
        if (strcmp(s, names[i]) == 0) {
            *out = (worker_warmup_mode)i;
            return true;
        }
    return false;
}

/* The inputs of one pass, sized for the largest. */
typedef struct warm {
    worker_model *m;
    int page_tokens, kv_pages, vocab;
    int32_t *ids, *pos, *row_stream, *table, *logit_rows;
    int32_t *pen_offsets; /* [max_logit_rows + 1] zeros: penalty lists, all empty */
    kernels_sample_params *params;
    kernels_sample_result *results;
} warm;

static int min_int(int a, int b)
{
    return a < b ? a : b;
}

static int32_t token_of(const warm *w, int r)
{
    return (int32_t)(((int64_t)r * 7919 + 11) % w->vocab);
}

static shoal_err step(warm *w, const worker_forward *f, const worker_penalties *pen,
                      const char *what, shoal_diag *diag)
{
    shoal_err err = worker_model_step(w->m, f, w->params, pen, w->results, diag);
    if (err) {
        char inner[sizeof diag->msg];
        snprintf(inner, sizeof inner, "%s", diag->msg);
        shoal_diag_set(diag, err, "warm-up: %s of %d rows: %s", what, f->rows, inner);
    }
    return err;
}

/* One stream's prompt of `rows` tokens from position 0, into pages
 * 0, 1, ...; only its last row samples. */
static shoal_err prompt_pass(warm *w, int rows, shoal_diag *diag)
{
    int pages = (rows + w->page_tokens - 1) / w->page_tokens;
    for (int r = 0; r < rows; r++) {
        w->ids[r] = token_of(w, r);
        w->pos[r] = r;
        w->row_stream[r] = 0;
    }
    for (int p = 0; p < pages; p++)
        w->table[p] = p;
    w->logit_rows[0] = rows - 1;
    worker_forward f = {rows, w->ids, w->pos, w->row_stream, 1, pages, w->table, 1, w->logit_rows, NULL};
    return step(w, &f, NULL, "prompt pass", diag);
}

/* `rows` streams of one token each at position 0, a page each (shared
 * round the pool where it has fewer): the shape of a decode round, with
 * penalty lists (empty) or without, the two kinds a round is recorded as. */
static shoal_err decode_round(warm *w, int rows, bool penalties, shoal_diag *diag)
{
    for (int r = 0; r < rows; r++) {
        w->ids[r] = token_of(w, r);
        w->pos[r] = 0;
        w->row_stream[r] = r;
        w->table[r] = r % w->kv_pages;
        w->logit_rows[r] = r;
    }
    worker_forward f = {rows,    w->ids, w->pos, w->row_stream, rows, 1,
                        w->table, rows,  w->logit_rows, NULL};
    worker_penalties pen = {w->pen_offsets, w->ids, w->ids, 0};
    return step(w, &f, penalties ? &pen : NULL,
                penalties ? "decode round with penalties" : "decode round", diag);
}

/* The decode sizes after `rows`: every size up to the graph rows, or the
 * next power of two (then the largest) where there are no graphs. The
 * graph rows are asked each time: a backend whose graphs are turned off
 * says so at the first recording, and the model stops asking for them. */
static int next_decode(const warm *w, int rows, int largest)
{
    int graphs = min_int(worker_model_graph_rows(w->m), largest);
    if (rows < graphs)
        return rows + 1;
    if (rows >= largest)
        return 0;
    return min_int(rows * 2, largest);
}

static shoal_err run(warm *w, const char *who, worker_warmup_stats *st, shoal_diag *diag)
{
    worker_model *m = w->m;
    int max_rows = worker_model_max_rows(m);
    int prompt = min_int(max_rows, min_int(w->kv_pages, worker_model_max_pages_per_stream(m)) *
                                       w->page_tokens);
    int largest = min_int(min_int(worker_model_max_logit_rows(m), worker_model_max_streams(m)),
                          max_rows);
    int graphs = min_int(worker_model_graph_rows(m), largest);
    LOG_INFO("%s: warming up: prompt passes of %d rows and down, decode rounds up to %d rows "
             "with and without penalties%s",
             who, prompt, largest, graphs ? " (each recorded as a graph)" : "");
    st->largest_prompt = prompt;
    shoal_err err;
    /* down to the fewest rows that take the prompt kernel */
    for (int rows = prompt; rows >= WORKER_ATTN_PROMPT_ROWS || rows == prompt; rows /= 2) {
        if ((err = prompt_pass(w, rows, diag)))
            return err;
        st->prompt_passes++;
    }
    double t_last = common_mono_ns() / 1e9;
    for (int rows = 1; rows > 0; rows = next_decode(w, rows, largest)) {
        for (int pen = 0; pen < 2; pen++) {
            if ((err = decode_round(w, rows, pen, diag)))
                return err;
            st->decode_rounds++;
        }
        double t = common_mono_ns() / 1e9;
        if (t - t_last > 2.0) { /* progress on a slow start */
            LOG_INFO("%s: warm-up: decode rounds up to %d of %d rows done", who, rows, largest);
            t_last = t;
        }
    }
    return SHOAL_OK;
}

shoal_err worker_warmup_run(worker_model *m, worker_warmup_mode mode, const char *who,
                            worker_warmup_stats *out, shoal_diag *diag)
{
    memset(out, 0, sizeof *out);
    if (mode == WORKER_WARMUP_OFF ||
        (mode == WORKER_WARMUP_AUTO && worker_model_backend(m)->host_memory))
        return SHOAL_OK;
    uint64_t t0 = common_mono_ns();
    warm w = {.m = m,
              .page_tokens = worker_model_kv_layout(m)->page_tokens,
              .kv_pages = worker_model_kv_pages(m),
              .vocab = worker_model_config(m)->vocab};
    size_t rows = (size_t)worker_model_max_rows(m);
    size_t streams = (size_t)worker_model_max_streams(m);
    size_t table = streams > rows ? streams : rows;
    size_t logits = (size_t)worker_model_max_logit_rows(m);
    w.ids = malloc(rows * 4);
    w.pos = malloc(rows * 4);
    w.row_stream = malloc(rows * 4);
    w.table = malloc(table * 4);
    w.logit_rows = malloc(logits * 4);
    w.pen_offsets = calloc(logits + 1, sizeof *w.pen_offsets);
    w.params = calloc(logits, sizeof *w.params);
    w.results = malloc(logits * sizeof *w.results);
    shoal_err err = SHOAL_OK;
    if (!w.ids || !w.pos || !w.row_stream || !w.table || !w.logit_rows || !w.pen_offsets ||
        !w.params || !w.results)
        err = shoal_diag_set(diag, SHOAL_ERR_NOMEM, "warm-up: no host memory for %zu rows", rows);
    for (size_t i = 0; !err && i < logits; i++) /* sampled as most requests are */
        w.params[i] = (kernels_sample_params){
            .temperature = 0.7f, .top_p = 0.9f, .repetition_penalty = 1.0f, .seed = i};
    if (!err && w.kv_pages > 0)
        err = run(&w, who, out, diag);
    free(w.ids);
    free(w.pos);
    free(w.row_stream);
    free(w.table);
    free(w.logit_rows);
    free(w.pen_offsets);
    free(w.params);
    free(w.results);
    if (err)
        return err;
    out->ran = true;
    out->seconds = (double)(common_mono_ns() - t0) / 1e9;
    LOG_INFO("%s: warmed up in %.2f s (%d prompt passes, %d decode rounds)", who, out->seconds,
             out->prompt_passes, out->decode_rounds);
    return SHOAL_OK;
}
