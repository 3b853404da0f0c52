/* The whole model on the GPU against HF transformers and the CPU backend, on
 * the parity fixtures of tests/fixtures/parity (float64 HF references of
 * tiny random Qwen3 and Llama models), and fp8 KV measured against bf16 KV.
 *
 *   f32 activations: logits within the CPU backend's tolerance of HF, and
 *     greedy tokens equal to HF's and the CPU backend's, teacher-forced at
 *     every kept position and free-running for 8 tokens after 257.
 *   bf16 activations (the default): logits within a bf16 tolerance of HF;
 *     greedy agreement with HF measured, and required where HF's top-two
 *     margin is beyond bf16's reach.
 *   fp8 KV (scales 1.0): greedy agreement and logit error against bf16 KV,
 *     on this GPU in both activation dtypes and on the CPU backend; printed
 *     as the table in docs/BENCHMARKS.md.
 * With --sanitize: one forward pass of each KV dtype, for compute-sanitizer. */
#include "common/common_assert.h"
#include "tests/cuda/cuda_test.h"
#include "worker/worker_generate.h"
#include "model/model_safetensors.h"

#include <errno.h>
#include <unistd.h>

static const char *const models[] = {
    "qwen3-tied-bf16",
    "qwen3-untied-f16-sharded",
    "llama3-scaled-bf16",
    "llama-tied-f32",
    "qwen3moe-norm-bf16",
    "qwen3moe-nonorm-step2-f32",
    "qwen3moe-mlponly-topall-bf16",
};
enum { MODELS = 7 };

/* Models that pick top-k of more experts carry KV rounding into their
 * routing weights: twice the tolerances (tests/unit/test_parity.c says
 * why and what was measured). */
static float tol_scale(const char *name)
{
    return strcmp(name, "qwen3moe-norm-bf16") == 0 || strcmp(name, "qwen3moe-nonorm-step2-f32") == 0
               ? 2.0f
               : 1.0f;
}
static const int prompt_lens[] = {1, 16, 17, 128, 129, 257};
static const int hybrid_lens[] = {1, 17, 63, 64, 65, 129, 257};
enum { PROMPTS = 6, HYBRID_PROMPTS = 7, STEPS = 8, ROWS_MAX = 512 };

/* The hybrid fixtures (gated DeltaNet layers) and their prompts. */
static const char *const hybrids[] = {"qwen3next-bf16", "qwen3_5-f32", "qwen3_5moe-bf16"};
enum { HYBRIDS = 3 };

static bool is_hybrid(const char *name)
{
    return strncmp(name, "qwen3next", 9) == 0 || strncmp(name, "qwen3_5", 7) == 0;
}

/* The CPU backend's tolerance of HF (tests/unit/test_parity.c), and bf16's:
 * activations rounded to 2^-9 at every op boundary, through every layer. */
#define TOL_ABS 4e-3f
#define TOL_REL 4e-3f
#define BF16_TOL_ABS 4e-2f
#define BF16_TOL_REL 2e-2f
#define CLEAR_MARGIN 1e-2f      /* HF's top-two margin where greedy must agree (f32) */
#define BF16_CLEAR_MARGIN 5e-2f /* ... with bf16 activations */

typedef struct config {
    const char *device;
    shoal_dtype act, kv;
    int page_tokens, max_rows;
} config;

/* Logits of every compared row of one fixture, in a fixed order: each
 * prompt's kept positions, then its decode steps 1..7 (teacher-forced). */
typedef struct rowset {
    int rows, vocab;
    float *logits; /* [rows][vocab] */
    const float *ref[ROWS_MAX];
    int pos[ROWS_MAX], prompt[ROWS_MAX]; /* each row's position and prompt length */
} rowset;

static const void *tensor(model_safetensors *st, const char *name, int64_t *count)
{
    const model_tensor_info *t = model_safetensors_find(st, name);
    if (!t)
        return NULL;
    if (count)
        *count = (int64_t)model_tensor_elements(t);
    return st->data + t->begin;
}

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

static float margin(const float *x, int n)
{
    float a = -INFINITY, b = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (x[i] > a) {
            b = a;
            a = x[i];
        } else if (x[i] > b) {
            b = x[i];
        }
    }
    return a - b;
}

/* A model directory of its own: config.json alone, opened with dummy
 * weights (open_model_at). */
static char dummy_dir[64];

/* Opens the fixture `name`, or with name == dummy_dir that directory with
 * dummy weights. */
static worker_model *open_model(const char *name, const config *c, int kv_pages)
{
    char dir[512];
    bool dummy = name == dummy_dir;
    if (dummy)
        snprintf(dir, sizeof dir, "%s", name);
    else
        snprintf(dir, sizeof dir, "%s/parity/%s", SHOAL_FIXTURES, name);
    worker_model_options mo;
    worker_model_options_default(&mo);
    mo.model_dir = dir;
    mo.load_format = dummy ? WORKER_LOAD_DUMMY : WORKER_LOAD_AUTO;
    mo.device = c->device;
    mo.act_dtype = c->act;
    mo.kv_dtype = c->kv;
    mo.page_tokens = c->page_tokens;
    mo.max_rows = c->max_rows;
    mo.max_logit_rows = c->max_rows;
    mo.kv_pages = kv_pages;
    mo.max_pages_per_stream = kv_pages;
    worker_model *m = NULL;
    shoal_diag diag = {{0}};
    shoal_err err = worker_model_open(&mo, &m, &diag);
    CHECK_MSG(err == SHOAL_OK, "%s on %s: %s", name, c->device, diag.msg);
    return err ? NULL : m;
}

static bool run_fixture(const char *name, const config *c, model_safetensors *fx, rowset *out)
{
    int pt = c->page_tokens, pages = (257 + STEPS + pt - 1) / pt;
    worker_model *m = open_model(name, c, pages);
    if (!m)
        return false;
    int vocab = worker_model_config(m)->vocab;
    out->vocab = vocab;
    out->rows = 0;
    out->logits = xmalloc((size_t)ROWS_MAX * vocab * 4);
    float *buf = xmalloc((size_t)c->max_rows * vocab * 4);
    int32_t *table = xmalloc((size_t)pages * 4), *pos = xmalloc((size_t)c->max_rows * 4);
    int32_t *zero = calloc((size_t)c->max_rows, 4), *lrows = xmalloc((size_t)c->max_rows * 4);
    for (int p = 0; p < pages; p++)
        table[p] = pages - 1 - p;
    shoal_diag diag = {{0}};
    bool ok = true;
    bool hybrid = is_hybrid(name);
    for (int pi = 0; pi < (hybrid ? HYBRID_PROMPTS : PROMPTS) && ok; pi++) {
        int n = hybrid ? hybrid_lens[pi] : prompt_lens[pi];
        char key[64];
        int64_t kept = 0;
        snprintf(key, sizeof key, "prompt%d.ids", n);
        const int32_t *ids = tensor(fx, key, NULL);
        snprintf(key, sizeof key, "prompt%d.positions", n);
        const int32_t *keep = tensor(fx, key, &kept);
        snprintf(key, sizeof key, "prompt%d.logits", n);
        const float *ref = tensor(fx, key, NULL);
        snprintf(key, sizeof key, "prompt%d.greedy_ids", n);
        const int32_t *greedy = tensor(fx, key, NULL);
        snprintf(key, sizeof key, "prompt%d.greedy_logits", n);
        const float *greedy_ref = tensor(fx, key, NULL);
        /* the MoE fixtures have the prompts of 1, 17, 129 and 257 tokens */
        if (!ids && strncmp(name, "qwen3moe", 8) == 0 && (n == 16 || n == 128))
            continue;
        if (!ids || !keep || !ref || !greedy || !greedy_ref) {
            CHECK_MSG(0, "%s: fixture lacks prompt %d", name, n);
            ok = false;
            break;
        }
        int k = 0;
        for (int done = 0; done < n && ok;) {
            int rows = n - done < c->max_rows ? n - done : c->max_rows, lc = 0;
            for (int r = 0; r < rows; r++) {
                pos[r] = done + r;
                if (k + lc < kept && keep[k + lc] == done + r)
                    lrows[lc++] = r;
            }
            worker_forward f = {rows, ids + done, pos, zero, 1, pages, table, lc, lrows, NULL};
            ok = worker_model_forward(m, &f, buf, &diag) == SHOAL_OK;
            CHECK_MSG(ok, "%s: %s", name, diag.msg);
            for (int i = 0; ok && i < lc && out->rows < ROWS_MAX; i++, out->rows++) {
                memcpy(out->logits + (size_t)out->rows * vocab, buf + (size_t)i * vocab,
                       (size_t)vocab * 4);
                out->ref[out->rows] = ref + (size_t)(k + i) * vocab;
                out->pos[out->rows] = keep[k + i];
                out->prompt[out->rows] = n;
            }
            k += lc;
            done += rows;
        }
        for (int s = 1; s < STEPS && ok && out->rows < ROWS_MAX; s++, out->rows++) {
            int32_t tok = greedy[s - 1], p = n + s - 1, row0 = 0;
            worker_forward f = {1, &tok, &p, zero, 1, pages, table, 1, &row0, NULL};
            ok = worker_model_forward(m, &f, out->logits + (size_t)out->rows * vocab, &diag) ==
                 SHOAL_OK;
            CHECK_MSG(ok, "%s: %s", name, diag.msg);
            out->ref[out->rows] = greedy_ref + (size_t)s * vocab;
            out->pos[out->rows] = p;
            out->prompt[out->rows] = n;
        }
    }
    free(buf);
    free(table);
    free(pos);
    free(zero);
    free(lrows);
    worker_model_close(m);
    return ok;
}

typedef struct versus {
    float worst_norm; /* worst |a - b| / (abs + rel * scale(b)) */
    float max_abs;
    double rel_rms; /* ||a - b|| / ||b|| over all rows */
    int agree, compared;
} versus;

/* a against b, row by row; argmax compared where b's margin >= min_margin. */
static versus compare(const rowset *a, const rowset *b_or_null, float tol_abs, float tol_rel,
                      float min_margin)
{
    versus v = {0};
    double num = 0, den = 0;
    for (int r = 0; r < a->rows; r++) {
        const float *x = a->logits + (size_t)r * a->vocab;
        const float *y = b_or_null ? b_or_null->logits + (size_t)r * a->vocab : a->ref[r];
        float scale = 0;
        for (int i = 0; i < a->vocab; i++)
            scale = fabsf(y[i]) > scale ? fabsf(y[i]) : scale;
        for (int i = 0; i < a->vocab; i++) {
            float e = fabsf(x[i] - y[i]);
            if (isnan(x[i]))
                e = INFINITY;
            v.max_abs = e > v.max_abs ? e : v.max_abs;
            float nrm = e / (tol_abs + tol_rel * scale);
            v.worst_norm = nrm > v.worst_norm ? nrm : v.worst_norm;
            num += (double)e * e;
            den += (double)y[i] * y[i];
        }
        if (margin(y, a->vocab) >= min_margin) {
            v.compared++;
            v.agree += argmax(x, a->vocab) == argmax(y, a->vocab);
        }
    }
    v.rel_rms = sqrt(num / (den > 0 ? den : 1));
    return v;
}

static void free_rowset(rowset *r)
{
    free(r->logits);
    r->logits = NULL;
}

static bool keep_token(void *ctx, int index, int token, float logprob)
{
    ((int32_t *)ctx)[index] = token;
    return true;
}

/* Free-running greedy generation after the 257-token prompt. */
static bool generate(const char *name, const config *c, const int32_t *prompt, int32_t *toks)
{
    worker_model *m = open_model(name, c, (257 + STEPS + c->page_tokens - 1) / c->page_tokens);
    if (!m)
        return false;
    shoal_diag diag = {{0}};
    shoal_err err =
        worker_generate_greedy(m, prompt, 257, STEPS, false, keep_token, toks, NULL, &diag);
    CHECK_MSG(err == SHOAL_OK, "%s: %s", name, diag.msg);
    worker_model_close(m);
    return err == SHOAL_OK;
}

static void gpu_matches_hf_and_cpu_and_measures_fp8(void)
{
    config cpu_bf16kv = {"cpu", SHOAL_DTYPE_INVALID, SHOAL_DTYPE_BF16, 16, 64};
    config cpu_fp8kv = {"cpu", SHOAL_DTYPE_INVALID, SHOAL_DTYPE_F8_E4M3, 16, 64};
    /* chunks of 64 rows: the 257-row prompt takes five passes, 129 three */
    config g32 = {test_gpu, SHOAL_DTYPE_F32, SHOAL_DTYPE_BF16, 16, 64};
    config g32_fp8 = {test_gpu, SHOAL_DTYPE_F32, SHOAL_DTYPE_F8_E4M3, 16, 64};
    config g16 = {test_gpu, SHOAL_DTYPE_BF16, SHOAL_DTYPE_BF16, 16, 64};
    config g16_fp8 = {test_gpu, SHOAL_DTYPE_BF16, SHOAL_DTYPE_F8_E4M3, 16, 64};
    /* one pass of 512 rows with one-token pages: more slices, more pages */
    config g32_wide = {test_gpu, SHOAL_DTYPE_F32, SHOAL_DTYPE_BF16, 1, 512};
    printf("  %-26s %-22s %8s %9s %8s %9s\n", "model", "run", "vs HF", "max abs", "greedy",
           "vs CPU");
    int fp8_agree[3] = {0}, fp8_compared[3] = {0};
    float fp8_max_abs[3] = {0};
    double fp8_rms[3] = {0};
    for (int mi = 0; mi < MODELS; mi++) {
        char path[600];
        snprintf(path, sizeof path, "%s/parity/%s/expected.safetensors", SHOAL_FIXTURES,
                 models[mi]);
        model_safetensors fx;
        shoal_diag diag = {{0}};
        if (model_safetensors_open(path, &fx, &diag) != SHOAL_OK) {
            CHECK_MSG(0, "%s", diag.msg);
            continue;
        }
        rowset cpu = {0}, cpu8 = {0}, a = {0}, a8 = {0}, b = {0}, b8 = {0}, w = {0};
        bool ok =
            run_fixture(models[mi], &cpu_bf16kv, &fx, &cpu) &&
            run_fixture(models[mi], &cpu_fp8kv, &fx, &cpu8) &&
            run_fixture(models[mi], &g32, &fx, &a) && run_fixture(models[mi], &g32_fp8, &fx, &a8) &&
            run_fixture(models[mi], &g16, &fx, &b) && run_fixture(models[mi], &g16_fp8, &fx, &b8) &&
            run_fixture(models[mi], &g32_wide, &fx, &w);
        if (ok) {
            float ts = tol_scale(models[mi]);
            versus hf = compare(&a, NULL, ts * TOL_ABS, ts * TOL_REL, CLEAR_MARGIN);
            versus vc = compare(&a, &cpu, TOL_ABS, TOL_REL, 1e-4f);
            printf("  %-26s %-22s %8.3f %9.2e %4d/%-4d %4d/%-4d\n", models[mi],
                   "gpu f32 act, bf16 KV", hf.worst_norm, hf.max_abs, hf.agree, hf.compared,
                   vc.agree, vc.compared);
            CHECK_MSG(hf.worst_norm <= 1.0f, "%s f32: logits %.2fx the tolerance of HF", models[mi],
                      hf.worst_norm);
            CHECK_MSG(hf.agree == hf.compared, "%s f32: greedy differs from HF", models[mi]);
            CHECK_MSG(vc.agree == vc.compared, "%s f32: greedy differs from the CPU backend",
                      models[mi]);
            versus hw = compare(&w, NULL, ts * TOL_ABS, ts * TOL_REL, CLEAR_MARGIN);
            printf("  %-26s %-22s %8.3f %9.2e %4d/%-4d\n", "", "  1-token pages, 512 rows",
                   hw.worst_norm, hw.max_abs, hw.agree, hw.compared);
            CHECK_MSG(hw.worst_norm <= 1.0f && hw.agree == hw.compared,
                      "%s f32, one-token pages: off HF", models[mi]);

            /* bf16 activations move a routing weight further still: the
             * MoE models' bf16 scale is 3 (measured 2.2x of the dense
             * bf16 tolerance) */
            float tb = ts > 1.0f ? 3.0f : 1.0f;
            versus hb = compare(&b, NULL, tb * BF16_TOL_ABS, tb * BF16_TOL_REL, CLEAR_MARGIN);
            versus hb_clear =
                compare(&b, NULL, tb * BF16_TOL_ABS, tb * BF16_TOL_REL, BF16_CLEAR_MARGIN);
            printf("  %-26s %-22s %8.3f %9.2e %4d/%-4d (margin >= %.2f: %d/%d)\n", "",
                   "gpu bf16 act, bf16 KV", hb.worst_norm, hb.max_abs, hb.agree, hb.compared,
                   BF16_CLEAR_MARGIN, hb_clear.agree, hb_clear.compared);
            CHECK_MSG(hb.worst_norm <= 1.0f, "%s bf16: logits %.2fx the bf16 tolerance of HF",
                      models[mi], hb.worst_norm);
            CHECK_MSG(hb_clear.agree == hb_clear.compared,
                      "%s bf16: greedy differs from HF at margins >= %.2f", models[mi],
                      BF16_CLEAR_MARGIN);

            /* fp8 KV against bf16 KV on the same backend and activations */
            const rowset *pairs[3][2] = {{&cpu8, &cpu}, {&a8, &a}, {&b8, &b}};
            static const char *names[3] = {"cpu, fp8 KV", "gpu f32 act, fp8 KV",
                                           "gpu bf16 act, fp8 KV"};
            for (int p = 0; p < 3; p++) {
                versus vk = compare(pairs[p][0], pairs[p][1], TOL_ABS, TOL_REL, 0.0f);
                versus vh = compare(pairs[p][0], NULL, BF16_TOL_ABS, BF16_TOL_REL, CLEAR_MARGIN);
                printf("  %-26s %-22s %8.3f %9.2e %4d/%-4d vs bf16 KV: greedy %d/%d, max abs "
                       "%.2e, rel rms %.2e\n",
                       "", names[p], vh.worst_norm, vh.max_abs, vh.agree, vh.compared, vk.agree,
                       vk.compared, vk.max_abs, vk.rel_rms);
                fp8_agree[p] += vk.agree;
                fp8_compared[p] += vk.compared;
                fp8_max_abs[p] = vk.max_abs > fp8_max_abs[p] ? vk.max_abs : fp8_max_abs[p];
                fp8_rms[p] = vk.rel_rms > fp8_rms[p] ? vk.rel_rms : fp8_rms[p];
                CHECK_MSG(isfinite(vk.max_abs) && vk.rel_rms < 0.05f * ts,
                          "%s %s: logits off bf16 KV by %.3e rms", models[mi], names[p],
                          vk.rel_rms);
            }

            /* free-running: 8 greedy tokens after the 257-token prompt */
            const int32_t *prompt = tensor(&fx, "prompt257.ids", NULL);
            const int32_t *hf_ids = tensor(&fx, "prompt257.greedy_ids", NULL);
            int32_t gt[STEPS], ct[STEPS];
            if (generate(models[mi], &g32, prompt, gt) &&
                generate(models[mi], &cpu_bf16kv, prompt, ct)) {
                bool same = memcmp(gt, hf_ids, sizeof gt) == 0 && memcmp(ct, gt, sizeof gt) == 0;
                printf("  %-26s free-running greedy after 257 tokens: gpu %s HF and CPU\n", "",
                       same ? "equals" : "DIFFERS FROM");
                CHECK_MSG(same, "%s: free-running greedy differs", models[mi]);
            }
        }
        free_rowset(&cpu);
        free_rowset(&cpu8);
        free_rowset(&a);
        free_rowset(&a8);
        free_rowset(&b);
        free_rowset(&b8);
        free_rowset(&w);
        model_safetensors_close(&fx);
    }
    printf("fp8 KV (scales 1.0) against bf16 KV, all four fixture models, teacher-forced:\n");
    static const char *names[3] = {"cpu (f32 activations)", "gpu f32 activations",
                                   "gpu bf16 activations"};
    for (int p = 0; p < 3; p++)
        printf("  FP8 %-24s greedy agreement %d/%d (%.1f%%), max |logit diff| %.3e, worst rel "
               "rms %.3e\n",
               names[p], fp8_agree[p], fp8_compared[p],
               100.0 * fp8_agree[p] / (fp8_compared[p] ? fp8_compared[p] : 1), fp8_max_abs[p],
               fp8_rms[p]);
}

/* The hybrid fixtures on the GPU: f32 activations against the CPU backend
 * (the same bf16 KV: logits within the CPU's tolerance, greedy equal) and
 * Qwen3-Next against HF too, in chunks of 64 rows (the 65-row prompt
 * crosses a chunk) and in one pass of 512 rows (whole prompts in one
 * run); bf16 activations measured against HF and against the f32 run, by
 * prompt. The Qwen3.5 fixtures' random gated norms amplify the bf16 KV's
 * rounding (tests/unit/test_parity.c: 11x and 25x of the tolerance on the
 * CPU too), so they are held to the CPU backend's logits. Then 8
 * free-running greedy tokens after 257, equal to the CPU's. */
static void gpu_hybrids_match_hf_and_cpu(void)
{
    config cpu = {"cpu", SHOAL_DTYPE_INVALID, SHOAL_DTYPE_BF16, 16, 64};
    config g32 = {test_gpu, SHOAL_DTYPE_F32, SHOAL_DTYPE_BF16, 16, 64};
    config g32_wide = {test_gpu, SHOAL_DTYPE_F32, SHOAL_DTYPE_BF16, 16, 512};
    config g16 = {test_gpu, SHOAL_DTYPE_BF16, SHOAL_DTYPE_BF16, 16, 64};
    printf("  %-26s %-24s %8s %9s %9s %8s %9s\n", "model", "run", "vs HF", "max abs", "greedy",
           "vs CPU", "greedy");
    for (int mi = 0; mi < HYBRIDS; mi++) {
        const char *name = hybrids[mi];
        char path[600];
        snprintf(path, sizeof path, "%s/parity/%s/expected.safetensors", SHOAL_FIXTURES, name);
        model_safetensors fx;
        shoal_diag diag = {{0}};
        if (model_safetensors_open(path, &fx, &diag) != SHOAL_OK) {
            CHECK_MSG(0, "%s", diag.msg);
            continue;
        }
        rowset c = {0}, a = {0}, w = {0}, b = {0};
        bool ok = run_fixture(name, &cpu, &fx, &c) && run_fixture(name, &g32, &fx, &a) &&
                  run_fixture(name, &g32_wide, &fx, &w) && run_fixture(name, &g16, &fx, &b);
        bool held_to_hf = strcmp(name, "qwen3next-bf16") == 0;
        const rowset *runs[2] = {&a, &w};
        static const char *run_names[2] = {"gpu f32 act, 64 rows", "gpu f32 act, 512 rows"};
        for (int r = 0; ok && r < 2; r++) {
            versus hf = compare(runs[r], NULL, TOL_ABS, TOL_REL, CLEAR_MARGIN);
            versus vc = compare(runs[r], &c, TOL_ABS, TOL_REL, CLEAR_MARGIN);
            printf("  %-26s %-24s %8.3f %9.2e %4d/%-4d %8.3f %4d/%-4d\n", r ? "" : name,
                   run_names[r], hf.worst_norm, hf.max_abs, hf.agree, hf.compared, vc.worst_norm,
                   vc.agree, vc.compared);
            CHECK_MSG(vc.worst_norm <= 1.0f, "%s %s: logits %.2fx the tolerance of the CPU's",
                      name, run_names[r], vc.worst_norm);
            CHECK_MSG(vc.agree == vc.compared, "%s %s: greedy differs from the CPU's", name,
                      run_names[r]);
            if (held_to_hf) {
                CHECK_MSG(hf.worst_norm <= 1.0f, "%s %s: logits %.2fx the tolerance of HF", name,
                          run_names[r], hf.worst_norm);
                CHECK_MSG(hf.agree == hf.compared, "%s %s: greedy differs from HF", name,
                          run_names[r]);
            }
        }
        if (ok) {
            versus hb = compare(&b, NULL, BF16_TOL_ABS, BF16_TOL_REL, BF16_CLEAR_MARGIN);
            versus vb = compare(&b, &c, BF16_TOL_ABS, BF16_TOL_REL, BF16_CLEAR_MARGIN);
            printf("  %-26s %-24s %8.3f %9.2e %4d/%-4d %8.3f %4d/%-4d\n", "",
                   "gpu bf16 act, 64 rows", hb.worst_norm, hb.max_abs, hb.agree, hb.compared,
                   vb.worst_norm, vb.agree, vb.compared);
            /* where bf16 activations move the logits: against the f32 run
             * of the same GPU, by prompt and by position in it */
            float by_prompt[HYBRID_PROMPTS] = {0}, first_rows = 0, later_rows = 0;
            for (int row = 0; row < b.rows; row++) {
                rowset one = b, ref1 = a;
                one.rows = 1;
                one.logits = b.logits + (size_t)row * b.vocab;
                ref1.logits = a.logits + (size_t)row * a.vocab;
                versus e = compare(&one, &ref1, BF16_TOL_ABS, BF16_TOL_REL, 1e9f);
                for (int pi = 0; pi < HYBRID_PROMPTS; pi++)
                    if (b.prompt[row] == hybrid_lens[pi] && e.worst_norm > by_prompt[pi])
                        by_prompt[pi] = e.worst_norm;
                if (b.pos[row] < 4)
                    first_rows = e.worst_norm > first_rows ? e.worst_norm : first_rows;
                else
                    later_rows = e.worst_norm > later_rows ? e.worst_norm : later_rows;
            }
            printf("  %-26s bf16 act vs f32 act by prompt:", "");
            for (int pi = 0; pi < HYBRID_PROMPTS; pi++)
                printf(" %d: %.2f", hybrid_lens[pi], by_prompt[pi]);
            printf("; positions 0-3 %.2f, later %.2f\n", first_rows, later_rows);
            /* measured: 93 to 95% at margins >= 0.05 (the fixtures' routers
             * and gated norms amplify bf16's rounding, see above); a broken
             * bf16 path agrees by chance, under 1% */
            CHECK_MSG(hb.agree * 10 >= hb.compared * 9,
                      "%s bf16: greedy agrees with HF at %d of %d clear margins", name, hb.agree,
                      hb.compared);
            const int32_t *prompt = tensor(&fx, "prompt257.ids", NULL);
            const int32_t *hf_ids = tensor(&fx, "prompt257.greedy_ids", NULL);
            int32_t gt[STEPS], ct[STEPS];
            if (generate(name, &g32, prompt, gt) && generate(name, &cpu, prompt, ct)) {
                bool same = memcmp(gt, ct, sizeof gt) == 0;
                int hf_same = 0;
                for (int s = 0; s < STEPS; s++)
                    hf_same += gt[s] == hf_ids[s];
                printf("  %-26s free-running greedy after 257 tokens: gpu %s the CPU's, %d/%d "
                       "of HF's\n",
                       "", same ? "equals" : "DIFFERS FROM", hf_same, STEPS);
                CHECK_MSG(same, "%s: free-running greedy differs from the CPU's", name);
            }
        }
        free_rowset(&c);
        free_rowset(&a);
        free_rowset(&w);
        free_rowset(&b);
        model_safetensors_close(&fx);
    }
}

/* For compute-sanitizer: one model's prefill of 129 rows and two decode
 * steps with each KV dtype, bf16 activations, the default path. */
static void one_forward_pass_of_each_kv_dtype(void)
{
    static const shoal_dtype kvs[] = {SHOAL_DTYPE_BF16, SHOAL_DTYPE_F8_E4M3};
    for (int k = 0; k < 2; k++) {
        config c = {test_gpu, SHOAL_DTYPE_BF16, kvs[k], 16, 256};
        worker_model *m = open_model("qwen3-tied-bf16", &c, 16);
        if (!m)
            return;
        int vocab = worker_model_config(m)->vocab;
        int32_t ids[129], pos[129], zero[129] = {0}, table[16], last = 128;
        for (int i = 0; i < 129; i++) {
            ids[i] = (int32_t)rnd_below((uint32_t)vocab);
            pos[i] = i;
        }
        for (int p = 0; p < 16; p++)
            table[p] = 15 - p;
        float *logits = xmalloc((size_t)vocab * 4);
        shoal_diag diag = {{0}};
        worker_forward f = {129, ids, pos, zero, 1, 16, table, 1, &last, NULL};
        CHECK_MSG(worker_model_forward(m, &f, logits, &diag) == SHOAL_OK, "%s", diag.msg);
        for (int s = 0; s < 2; s++) {
            int32_t tok = argmax(logits, vocab), p = 129 + s, row0 = 0;
            worker_forward d = {1, &tok, &p, zero, 1, 16, table, 1, &row0, NULL};
            CHECK_MSG(worker_model_forward(m, &d, logits, &diag) == SHOAL_OK, "%s", diag.msg);
        }
        for (int i = 0; i < vocab; i++)
            CHECK(isfinite(logits[i]));
        free(logits);
        worker_model_close(m);
    }
}

/* Decode rounds replayed from a recorded graph (SHOAL_CUDA_GRAPHS=1, the
 * default) give the bits of the same rounds run op by op (=0): rounds of 1
 * and 3 streams of different lengths, whose page tables the graph path
 * lays out at the largest stride, through worker_model_forward and through
 * worker_model_step (sampled tokens and logprobs). Prompts of 40 and 17
 * rows take the prompt kernel, 5 the partials. */
static void graph_rounds_equal_op_by_op_rounds(void)
{
    enum { STREAMS = 3, PAGES = 8, ROUNDS = 6 };
    static const int lens[STREAMS] = {40, 17, 5};
    config c = {test_gpu, SHOAL_DTYPE_BF16, SHOAL_DTYPE_BF16, 16, 64};
    int32_t prompts[STREAMS][40], toks[ROUNDS][STREAMS];
    for (int s = 0; s < STREAMS; s++)
        for (int i = 0; i < lens[s]; i++)
            prompts[s][i] = (int32_t)rnd_below(100);
    for (int r = 0; r < ROUNDS; r++)
        for (int s = 0; s < STREAMS; s++)
            toks[r][s] = (int32_t)rnd_below(100);
    float *out[2] = {NULL, NULL};
    kernels_sample_result res[2][ROUNDS][STREAMS];
    int vocab = 0;
    for (int g = 0; g < 2; g++) {
        setenv("SHOAL_CUDA_GRAPHS", g ? "1" : "0", 1);
        worker_model *m = open_model("qwen3-untied-f16-sharded", &c, STREAMS * PAGES);
        unsetenv("SHOAL_CUDA_GRAPHS");
        if (!m)
            return;
        vocab = worker_model_config(m)->vocab;
        out[g] = calloc((size_t)(ROUNDS + 1) * STREAMS * (size_t)vocab, 4);
        if (!out[g]) {
            fprintf(stderr, "out of host memory\n");
            exit(1);
        }
        int32_t table[STREAMS * PAGES], pos[STREAMS], rs[STREAMS] = {0, 1, 2},
                                                      lr[STREAMS] = {0, 1, 2};
        for (int p = 0; p < STREAMS * PAGES; p++)
            table[p] = STREAMS * PAGES - 1 - p;
        shoal_diag diag = {{0}};
        for (int s = 0; s < STREAMS; s++) {
            int32_t ppos[40], zero[40] = {0}, last = lens[s] - 1;
            for (int i = 0; i < lens[s]; i++)
                ppos[i] = i;
            worker_forward f = {lens[s], prompts[s],        ppos, zero, 1,
                                PAGES,   table + s * PAGES, 1,    &last, NULL};
            CHECK_MSG(worker_model_forward(m, &f, out[g] + (size_t)s * vocab, &diag) == SHOAL_OK,
                      "%s", diag.msg);
            pos[s] = lens[s];
        }
        for (int r = 0; r < ROUNDS; r++) {
            int n = r < 2 ? 1 : STREAMS; /* two rounds of one stream, then all three */
            worker_forward f = {n, toks[r], pos, rs, n, PAGES, table, n, lr, NULL};
            float *dst = out[g] + (size_t)(r + 1) * STREAMS * vocab;
            if (r < 4) {
                CHECK_MSG(worker_model_forward(m, &f, dst, &diag) == SHOAL_OK, "%s", diag.msg);
            } else {
                kernels_sample_params sp[STREAMS];
                memset(sp, 0, sizeof sp);
                for (int s = 0; s < STREAMS; s++) {
                    sp[s].top_p = 1.0f;
                    sp[s].repetition_penalty = 1.0f;
                    sp[s].logprobs = 2;
                }
                CHECK_MSG(worker_model_step(m, &f, sp, NULL, res[g][r], &diag) == SHOAL_OK, "%s",
                          diag.msg);
            }
            for (int s = 0; s < n; s++)
                pos[s]++;
        }
        worker_model_close(m);
    }
    size_t differ = count_differing(out[0], out[1], (size_t)5 * STREAMS * vocab);
    int tokens_differ = 0;
    for (int r = 4; r < ROUNDS; r++)
        for (int s = 0; s < STREAMS; s++)
            tokens_differ += memcmp(&res[0][r][s], &res[1][r][s], sizeof res[0][r][s]) != 0;
    printf("  graph rounds vs op by op: %zu logits differ, %d sampled results differ\n", differ,
           tokens_differ);
    CHECK_MSG(differ == 0, "graph rounds: %zu logits differ from op-by-op rounds", differ);
    CHECK_MSG(tokens_differ == 0, "graph rounds: %d sampled results differ", tokens_differ);
    free(out[0]);
    free(out[1]);
}

/* A prompt of `prompt_len` rows and `rounds` decode rounds of one row
 * (the last of them of one row of each of `streams` streams, 2 to 16:
 * the others with prompts of their own) on each of the `n` models opened
 * with the switch
 * `env` at 0 and at `on_value` give the same logits, bit for bit. With one_row,
 * every pass is of one row (the prompts a row a pass, no round of three):
 * no cuBLAS kernel runs, for racecheck, which reports hazards inside
 * cuBLAS's own sm_90 kernels at some shapes. A tolerance above 0 asks
 * for the logits within it (||a - b|| / ||a||) instead of the same bits. */
static void rounds_keep_the_logits(const char *env, const char *on_value, const char *what,
                                   const char *const *names, int n, int prompt_len, int rounds,
                                   int streams, bool one_row, double tol)
{
    enum { PAGES = 8, STREAMS_MAX = 16, PROMPT_MAX = 64, ROUNDS_MAX = 96 };
    const int STREAMS = streams;
    SHOAL_ASSERT(streams >= 2 && streams <= STREAMS_MAX && prompt_len > STREAMS_MAX);
    SHOAL_ASSERT(prompt_len <= PROMPT_MAX && rounds <= ROUNDS_MAX && rounds >= 2);
    SHOAL_ASSERT(prompt_len + rounds <= PAGES * 16);
    config c = {test_gpu, SHOAL_DTYPE_BF16, SHOAL_DTYPE_BF16, 16, 64};
    for (int mi = 0; mi < n; mi++) {
        int32_t prompt[PROMPT_MAX], ppos[PROMPT_MAX], zero[PROMPT_MAX] = {0};
        int32_t toks[ROUNDS_MAX][STREAMS_MAX];
        for (int i = 0; i < prompt_len; i++) {
            prompt[i] = (int32_t)rnd_below(100);
            ppos[i] = i;
        }
        for (int r = 0; r < rounds; r++)
            for (int s = 0; s < STREAMS; s++)
                toks[r][s] = (int32_t)rnd_below(100);
        float *out[2] = {NULL, NULL};
        int vocab = 0;
        size_t logits = 0;
        for (int on = 0; on < 2; on++) {
            setenv(env, on ? on_value : "0", 1);
            worker_model *m = open_model(names[mi], &c, STREAMS * PAGES);
            unsetenv(env);
            if (!m)
                return;
            vocab = worker_model_config(m)->vocab;
            /* the prompts' last rows, rounds - 1 of one row, one of all */
            out[on] = xmalloc((size_t)(rounds - 1 + 2 * STREAMS) * vocab * 4);
            float *o = out[on];
            int32_t table[STREAMS_MAX * PAGES], last = prompt_len - 1, lr[STREAMS_MAX];
            int32_t rs[STREAMS_MAX], pos[STREAMS_MAX];
            for (int s = 0; s < STREAMS; s++)
                lr[s] = rs[s] = s;
            for (int p = 0; p < STREAMS * PAGES; p++)
                table[p] = (p * 7 + 3) % (STREAMS * PAGES); /* scattered */
            shoal_diag diag = {{0}};
            for (int s = 0; s < STREAMS; s++) { /* stream s's prompt: the first prompt_len - s */
                int len = prompt_len - s;
                int32_t slot = s; /* a hybrid's state: the slot stream s has in the rounds */
                last = len - 1;
                worker_forward f = {len, prompt, ppos, zero, 1, PAGES, table + s * PAGES, 1, &last,
                                    &slot};
                for (int i = 0; one_row && i < len; i++) { /* the last row's logits stay */
                    int32_t zero_row = 0;
                    worker_forward f1 = {1,     prompt + i,        ppos + i, zero,      1,
                                         PAGES, table + s * PAGES, 1,        &zero_row, &slot};
                    CHECK_MSG(worker_model_forward(m, &f1, o, &diag) == SHOAL_OK, "%s", diag.msg);
                }
                if (!one_row)
                    CHECK_MSG(worker_model_forward(m, &f, o, &diag) == SHOAL_OK, "%s", diag.msg);
                o += vocab;
                pos[s] = len;
            }
            for (int r = 0; r < rounds; r++) {
                int k = r == rounds - 1 && !one_row ? STREAMS : 1;
                worker_forward d = {k, toks[r], pos, rs, k, PAGES, table, k, lr, NULL};
                CHECK_MSG(worker_model_forward(m, &d, o, &diag) == SHOAL_OK, "%s", diag.msg);
                o += (size_t)k * vocab;
                for (int s = 0; s < k; s++)
                    pos[s]++;
            }
            logits = (size_t)(o - out[on]);
            worker_model_close(m);
        }
        size_t differ = count_differing(out[0], out[1], logits);
        const char *name = names[mi] == dummy_dir ? "dummy, head dim 128" : names[mi];
        if (tol > 0) {
            double e = rel_err(out[1], out[0], logits);
            printf("  %s: %s: %zu logits differ, error %.2e (at most %.0e)\n", name, what, differ,
                   e, tol);
            CHECK_MSG(e <= tol, "%s: decode rounds, %s: error %.2e over %.0e", name, what, e, tol);
            /* else the switch took no other path */
            CHECK_MSG(differ > 0, "%s: %s: the same bits both ways", name, what);
        } else {
            printf("  %s: %s: %zu logits differ\n", name, what, differ);
            CHECK_MSG(differ == 0, "%s: decode rounds, %s: %zu logits differ", name, what, differ);
        }
        free(out[0]);
        free(out[1]);
    }
}

/* Hybrids' decode rounds replayed from a recorded graph give the bits of
 * the same rounds op by op: the conv and delta-rule states move through
 * the graph as through the ops. */
static void hybrid_graph_rounds_equal_op_by_op_rounds(void)
{
    rounds_keep_the_logits("SHOAL_CUDA_GRAPHS", "1", "graph rounds vs op by op", hybrids, HYBRIDS,
                           40, 6, 3, false, 0.0);
}

static void one_row_switch_keeps_the_logits(const char *env, const char *what)
{
    static const char *const names[] = {"qwen3-tied-bf16", "llama3-scaled-bf16"};
    rounds_keep_the_logits(env, "1", what, names, 2, 17, 6, 3, false, 0.0);
}

/* Decode rounds of one row with SwiGLU formed in the gate/up GEMV
 * (SHOAL_CUDA_GEMV_SWIGLU=1, the default) give the same logits, bit for
 * bit, as with the projections written and the swiglu pass after (=0):
 * the GEMV sums each projection in the same order and rounds it to bf16
 * before the product, as the pass reads it. bf16 weights, so the GEMV
 * takes the rows (joined gate/up at one row); the prompt of 17 rows
 * takes the composition on both. */
static void one_row_swiglu_in_the_gemv_equals_the_swiglu_pass(void)
{
    one_row_switch_keeps_the_logits("SHOAL_CUDA_GEMV_SWIGLU", "swiglu in the GEMV vs the pass");
}

/* The same for q's and k's norm and rope with the KV write as one kernel
 * at one row (SHOAL_CUDA_ROPE_KV=1, the default) against the three
 * kernels (=0): the same per-head body, k converted into the pages from
 * its stored value. Qwen3 (q/k norms) and Llama 3 (none, scaled rope). */
static void one_row_rope_kv_kernel_equals_the_three_kernels(void)
{
    one_row_switch_keeps_the_logits("SHOAL_CUDA_ROPE_KV", "rope + KV write fused vs three kernels");
}

/* Makes dummy_dir a model directory of head dim 128 (the TMA partials';
 * the fixtures' heads are smaller) for dummy weights; false on failure. */
static bool make_dummy_model(void)
{
    snprintf(dummy_dir, sizeof dummy_dir, "/tmp/shoal-test-model-XXXXXX");
    if (!mkdtemp(dummy_dir)) {
        CHECK_MSG(false, "mkdtemp: %s", strerror(errno));
        return false;
    }
    char path[128];
    snprintf(path, sizeof path, "%s/config.json", dummy_dir);
    FILE *f = fopen(path, "w");
    CHECK_MSG(f != NULL, "%s: %s", path, strerror(errno));
    if (!f)
        return false;
    fputs("{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\",\n"
          " \"vocab_size\": 4096, \"hidden_size\": 512, \"intermediate_size\": 1536,\n"
          " \"num_hidden_layers\": 3, \"num_attention_heads\": 8, \"num_key_value_heads\": 2,\n"
          " \"head_dim\": 128, \"hidden_act\": \"silu\", \"max_position_embeddings\": 4096,\n"
          " \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000, \"rope_scaling\": null,\n"
          " \"tie_word_embeddings\": false, \"attention_bias\": false,\n"
          " \"torch_dtype\": \"bfloat16\"}\n",
          f);
    fclose(f);
    return true;
}

static void remove_dummy_model(void)
{
    char path[128];
    snprintf(path, sizeof path, "%s/config.json", dummy_dir);
    unlink(path);
    rmdir(dummy_dir);
}

/* On the head-dim-128 dummy model: one-row rounds at positions 30 to 95,
 * across the TMA partials' 32-token stages and their segments (one to 64
 * tokens, then two), then a round of three streams (under the sanitizers
 * the prompts a row a pass, no round of three), give the same logits bit
 * for bit with the switch `env` at 0 and at `on` (rounds_keep_the_logits). */
static void dummy_rounds_keep_the_logits(const char *env, const char *on, const char *what,
                                         double tol)
{
    if (!make_dummy_model())
        return;
    const char *const names[] = {dummy_dir};
    rounds_keep_the_logits(env, on, what, names, 1, 30, 66, 3, test_sanitize, tol);
    remove_dummy_model();
}

/* Decode attention's TMA partials launched early (SHOAL_CUDA_ATTN_EARLY=1,
 * the default: the KV before each row's position copied while the q/k/v
 * GEMV and rope with the KV write run) against a plain launch (=0). */
static void early_attention_keeps_the_logits(void)
{
    dummy_rounds_keep_the_logits("SHOAL_CUDA_ATTN_EARLY", "1", "attention launched early vs plain",
                                 0.0);
}

/* Rope and the KV write inside the TMA partials (SHOAL_CUDA_ATTN_ROPE=64:
 * attention_rope_kv as one kernel at every round, which norms and rotates
 * q as it stages it and stores each round's new k and v rows itself)
 * against the two ops (=0): the same logits, and so the same pages (every
 * later round reads the rows the kernel stored). */
static void attention_with_rope_keeps_the_logits(void)
{
    dummy_rounds_keep_the_logits("SHOAL_CUDA_ATTN_ROPE", "64",
                                 "rope in the attention kernel vs rope_kv", 0.0);
}

/* The RMSNorm and the residual add inside the one-row GEMV, the norms'
 * weights folded into the matmuls (SHOAL_CUDA_NORM_FUSED=1, the default)
 * against the norm pass and the weights as loaded (=0), on the dummy
 * model of head dim 128 (bf16 weights, so the fold is taken) and the
 * bf16 fixtures: one-row rounds whose logits stay within bf16's reach of
 * each other (the rounding of the folded weights against that of the
 * stored normed row, through every layer), the prompts' passes and the
 * round of three streams (the norm pass on the folded weights) too. The
 * fixtures' own check against HF holds the fused rounds to HF. */
static void fused_norm_keeps_the_logits_close(void)
{
    static const char *const names[] = {"qwen3-tied-bf16", "llama3-scaled-bf16"};
    const double tol = 3e-2;
    rounds_keep_the_logits("SHOAL_CUDA_NORM_FUSED", "1", "norm in the GEMV vs the norm pass", names,
                           2, 17, 6, 3, false, tol);
    dummy_rounds_keep_the_logits("SHOAL_CUDA_NORM_FUSED", "1", "norm in the GEMV vs the norm pass",
                                 tol);
}

/* matmul_add_rmsnorm's k split into f32 parts that the norm sums
 * (SHOAL_CUDA_GEMM_PARTS=1, the default) against matmul, then rmsnorm
 * with the product as its residual (=0), on the dummy model (hidden 512:
 * its o and down projections' k are 2 and 3 times n, so passes of 9 to
 * 64 rows take the split): 16 streams' prompts of 15 to 30 rows and a
 * decode round of all 16 keep the logits within bf16's reach, and differ
 * (the split ran). */
static void split_matmul_keeps_the_logits_close(void)
{
    if (!make_dummy_model())
        return;
    const char *const names[] = {dummy_dir};
    rounds_keep_the_logits("SHOAL_CUDA_GEMM_PARTS", "1", "k split into parts vs matmul, rmsnorm",
                           names, 1, 30, 4, 16, false, 3e-2);
    remove_dummy_model();
}

int main(int argc, char **argv)
{
    cuda_test_start("test_cuda_model", argc, argv);
    if (!test_sanitize) /* not a small case: every fixture model against HF and the CPU */
        TEST_RUN(gpu_matches_hf_and_cpu_and_measures_fp8);
    if (!test_sanitize || getenv("SHOAL_TEST_HYBRIDS"))
        TEST_RUN(gpu_hybrids_match_hf_and_cpu);
    TEST_RUN(one_forward_pass_of_each_kv_dtype);
    TEST_RUN(graph_rounds_equal_op_by_op_rounds);
    TEST_RUN(hybrid_graph_rounds_equal_op_by_op_rounds);
    TEST_RUN(one_row_swiglu_in_the_gemv_equals_the_swiglu_pass);
    TEST_RUN(one_row_rope_kv_kernel_equals_the_three_kernels);
    TEST_RUN(early_attention_keeps_the_logits);
    TEST_RUN(attention_with_rope_keeps_the_logits);
    TEST_RUN(fused_norm_keeps_the_logits_close);
    TEST_RUN(split_matmul_keeps_the_logits_close);
    return TEST_EXIT();
}
