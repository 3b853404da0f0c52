/* Paged attention on the GPU: split-K partials plus merge, in slices of the
 * scratch's 128 rows. For one stream of 127 to 4,096 prompt rows, two-stream
 * rounds whose slices cross from one stream to the next, and a decode round
 * of more streams than the scratch has rows, with bf16 and fp8 pages:
 *   - the sliced launches equal one unsliced launch (scratch for every row)
 *     byte for byte;
 *   - both equal the CPU reference within the tolerance of the dtype;
 *   - a planted fault (slices that leave the row tables at row 0) is red;
 *   - one decode row alone (segments shortened to fill the GPU) as well,
 *     and a decode round of 64 rows at an 8B layer's shape (the
 *     partials staged by TMA there, SHOAL_CUDA_ATTN_TMA);
 *   - the prompt op (tensor-core tiles over the page table with bf16
 *     activations) equals the CPU reference within the same tolerance on
 *     the same round, tiles of several streams included, at an 8B layer's
 *     shape over pages of 8 to 256 tokens too;
 *   - every arena byte no token wrote is NaN, so a kernel that lets a stale
 *     page tail reach a result (even times a zero weight) is red. */
#include "tests/cuda/cuda_test.h"

static kernels_backend *cpu, *gpu;
static shoal_dtype act;
static int cases_run, faults_seen, faults_planted, prompt_cases;
/* run_case plants the persistent prompt kernel's stale Q and wants red */
static bool prompt_stale_q;

typedef struct shape {
    int heads, kv_heads, head_dim, page_tokens;
} shape;

enum { LAYERS = 2, LAYER = 1, STREAMS_MAX = 512 };

/* One round: stream s has rows[s] consecutive rows ending its context, at
 * positions past[s] .. past[s] + rows[s] - 1, streams one after another. */
static void run_case(const char *label, shape sh, shoal_dtype kv_dtype, int streams,
                     const int *rows_of, const int *past)
{
    int rows = 0, max_ctx = 0;
    for (int s = 0; s < streams; s++) {
        rows += rows_of[s];
        max_ctx = past[s] + rows_of[s] > max_ctx ? past[s] + rows_of[s] : max_ctx;
    }
    int pt = sh.page_tokens, stride = (max_ctx + pt - 1) / pt;
    int pages = stride * streams;
    kernels_kv_layout L;
    kernels_kv_layout_init(&L, LAYERS, sh.kv_heads, sh.head_dim, pt, kv_dtype);
    size_t arena_bytes = (size_t)pages * L.page_bytes;

    /* every stream's pages, shuffled over the arena */
    int32_t *table = xmalloc((size_t)pages * 4);
    for (int p = 0; p < pages; p++)
        table[p] = p;
    for (int p = pages - 1; p > 0; p--) {
        int q = (int)rnd_below((uint32_t)p + 1), t = table[p];
        table[p] = table[q];
        table[q] = t;
    }
    float scales[2 * LAYERS * 64];
    for (int i = 0; i < 2 * LAYERS * sh.kv_heads; i++)
        scales[i] = 1.0f + 0.5f * rnd_uniform();
    kernels_kv_layout Lc = L;
    if (kv_dtype == SHOAL_DTYPE_F8_E4M3) {
        Lc.k_scale = scales;
        Lc.v_scale = scales + LAYERS * sh.kv_heads;
    }

    /* the whole context's K and V, written by the CPU twin */
    int kv_rows = 0;
    for (int s = 0; s < streams; s++)
        kv_rows += past[s] + rows_of[s];
    int32_t *kv_stream = xmalloc((size_t)kv_rows * 4), *kv_pos = xmalloc((size_t)kv_rows * 4);
    for (int s = 0, i = 0; s < streams; s++)
        for (int t = 0; t < past[s] + rows_of[s]; t++, i++) {
            kv_stream[i] = s;
            kv_pos[i] = t;
        }
    size_t kvw = (size_t)kv_rows * sh.kv_heads * sh.head_dim;
    float *k = xmalloc(kvw * 4), *v = xmalloc(kvw * 4);
    fill_uniform(k, kvw, 2.0f, act);
    fill_uniform(v, kvw, 2.0f, act);
    /* every byte no token wrote is NaN (bf16 and fp8 alike): a page's
     * tail past its stream and pages no stream holds; a kernel must not
     * let one reach a result, even times a zero weight */
    unsigned char *arena = xmalloc(arena_bytes);
    memset(arena, 0xff, arena_bytes);
    kernels_batch kb = {kv_rows, streams, stride, kv_stream, kv_pos, table, false};
    cpu->kv_write(cpu, arena, &Lc, &kb, LAYER, k, v);

    /* the round */
    int32_t *row_stream = xmalloc((size_t)rows * 4), *positions = xmalloc((size_t)rows * 4);
    for (int s = 0, r = 0; s < streams; s++)
        for (int i = 0; i < rows_of[s]; i++, r++) {
            row_stream[r] = s;
            positions[r] = past[s] + i;
        }
    size_t qn = (size_t)rows * sh.heads * sh.head_dim;
    float *q = xmalloc(qn * 4), *ref = xmalloc(qn * 4), *got = xmalloc(qn * 4);
    float *unsliced = xmalloc(qn * 4), *faulty = xmalloc(qn * 4);
    fill_uniform(q, qn, 1.0f, act);
    /* one row a stream: the GPU's TMA partials launch early (nothing
     * before them here writes, so this is the launch's own correctness) */
    bool one_row = true;
    for (int s = 0; s < streams; s++)
        one_row = one_row && rows_of[s] <= 1;
    kernels_batch cb = {rows, streams, stride, row_stream, positions, table, one_row};
    float scale = 1.0f / sqrtf((float)sh.head_dim);
    cpu->attention(cpu, ref, q, sh.heads, arena, &Lc, &cb, LAYER, scale);

    void *darena = dev_copy(gpu, arena, arena_bytes);
    void *dscales = dev_from_f32(gpu, scales, (size_t)2 * LAYERS * sh.kv_heads, SHOAL_DTYPE_F32);
    kernels_kv_layout Lg = L;
    if (kv_dtype == SHOAL_DTYPE_F8_E4M3) {
        Lg.k_scale = dscales;
        Lg.v_scale = (float *)dscales + LAYERS * sh.kv_heads;
    }
    void *dq = dev_from_f32(gpu, q, qn, act);
    void *drs = dev_copy(gpu, row_stream, (size_t)rows * 4);
    void *dpos = dev_copy(gpu, positions, (size_t)rows * 4);
    void *dtable = dev_copy(gpu, table, (size_t)pages * 4);
    size_t out_bytes = qn * shoal_dtype_bytes(act);
    void *dout = dev_alloc(gpu, out_bytes);
    kernels_batch gb = {rows, streams, stride, drs, dpos, dtable, one_row};

    dev_poison(gpu, dout, out_bytes);
    gpu->attention(gpu, dout, dq, sh.heads, darena, &Lg, &gb, LAYER, scale);
    f32_from_dev(gpu, got, dout, qn, act);

    if (test_dry) { /* the CPU backend has no slices to compare */
        memcpy(unsliced, got, qn * 4);
        memcpy(faulty, got, qn * 4);
    } else {
        /* one launch over every row, with scratch for all of them */
        CHECK(cuda_backend_set_attention_slice_rows(gpu, rows) == SHOAL_OK);
        dev_poison(gpu, dout, out_bytes);
        gpu->attention(gpu, dout, dq, sh.heads, darena, &Lg, &gb, LAYER, scale);
        f32_from_dev(gpu, unsliced, dout, qn, act);
        CHECK(cuda_backend_set_attention_slice_rows(gpu, KERNELS_ATTN_SLICE_ROWS) == SHOAL_OK);

        /* the planted fault: slices that leave the row tables at row 0 */
        cuda_backend_set_attention_fault(gpu, KERNELS_ATTN_FAULT_ROW_TABLES_AT_ROW_0);
        dev_poison(gpu, dout, out_bytes);
        gpu->attention(gpu, dout, dq, sh.heads, darena, &Lg, &gb, LAYER, scale);
        f32_from_dev(gpu, faulty, dout, qn, act);
        cuda_backend_set_attention_fault(gpu, KERNELS_ATTN_FAULT_NONE);
    }

    /* the prompt op on the same round */
    float *prompt = xmalloc(qn * 4);
    dev_poison(gpu, dout, out_bytes);
    if (prompt_stale_q)
        cuda_backend_set_attention_fault(gpu, KERNELS_ATTN_FAULT_STALE_Q);
    gpu->attention_prompt(gpu, dout, dq, sh.heads, darena, &Lg, &gb, LAYER, scale);
    if (prompt_stale_q)
        cuda_backend_set_attention_fault(gpu, KERNELS_ATTN_FAULT_NONE);
    f32_from_dev(gpu, prompt, dout, qn, act);

    double tol = act == SHOAL_DTYPE_BF16 ? 6e-3 : 1e-5;
    if (prompt_stale_q) { /* the planted fault alone: the rest was checked */
        const double e = rel_err(prompt, ref, qn);
        printf("  %-34s planted stale Q: prompt op %.2e%s\n", label, e,
               e > tol ? " (red)" : " (UNSEEN)");
        faults_planted++;
        faults_seen += e > tol;
        CHECK_MSG(e > tol, "%s: the planted stale Q went unseen", label);
        free(prompt);
        goto done;
    }
    double err = rel_err(got, ref, qn), err_fault = rel_err(faulty, ref, qn);
    double err_prompt = rel_err(prompt, ref, qn);
    size_t differ = count_differing(got, unsliced, qn);
    printf("  %-34s %-7s %5d rows, %3d streams: error %.2e, prompt op %.2e, sliced vs one "
           "launch %zu differ, planted fault %.2e%s\n",
           label, shoal_dtype_name(kv_dtype), rows, streams, err, err_prompt, differ, err_fault,
           test_dry                         ? " (dry run: no slices)"
           : rows > KERNELS_ATTN_SLICE_ROWS ? (err_fault > tol ? " (red)" : " (UNSEEN)")
                                            : "");
    CHECK_MSG(err <= tol, "%s: error %.3e over %.1e", label, err, tol);
    CHECK_MSG(err_prompt <= tol, "%s: prompt op error %.3e over %.1e", label, err_prompt, tol);
    prompt_cases++;
    free(prompt);
    CHECK_MSG(differ == 0, "%s: sliced and unsliced differ in %zu elements", label, differ);
    if (rows > KERNELS_ATTN_SLICE_ROWS && !test_dry) {
        faults_planted++;
        faults_seen += err_fault > tol;
        CHECK_MSG(err_fault > tol, "%s: the planted fault went unseen", label);
    } else {
        CHECK_MSG(count_differing(faulty, got, qn) == 0, "%s: one slice has nothing to shift",
                  label);
    }
    cases_run++;

done:
    gpu->free(gpu, darena);
    gpu->free(gpu, dscales);
    gpu->free(gpu, dq);
    gpu->free(gpu, drs);
    gpu->free(gpu, dpos);
    gpu->free(gpu, dtable);
    gpu->free(gpu, dout);
    free(table);
    free(kv_stream);
    free(kv_pos);
    free(k);
    free(v);
    free(arena);
    free(row_stream);
    free(positions);
    free(q);
    free(ref);
    free(got);
    free(unsliced);
    free(faulty);
}

static const shape main_shape = {8, 2, 64, 16};  /* GQA 4 */
static const shape odd_shape = {6, 3, 24, 1};    /* GQA 2, one-token pages */
static const shape wide_shape = {32, 8, 128, 16}; /* an 8B model's layer */
static const shape small_pages = {4, 4, 32, 4};   /* no GQA, 4-token pages */
static const shape hybrid_shape = {24, 4, 256, 16}; /* Qwen3.5-27B's full attention */

static void one_stream_at_every_slice_edge(shoal_dtype kvdt)
{
    static const int lens[] = {127, 128, 129, 255, 256, 257, 4096};
    int n = test_sanitize ? 2 : 7;
    for (int i = 0; i < n; i++) {
        int len = test_sanitize ? (i ? 257 : 129) : lens[i];
        int past = 0;
        char label[64];
        snprintf(label, sizeof label, "one stream, %d prompt rows", len);
        run_case(label, main_shape, kvdt, 1, &len, &past);
        if (len <= 257 && !test_sanitize) {
            snprintf(label, sizeof label, "one stream, %d rows, odd shape", len);
            run_case(label, odd_shape, kvdt, 1, &len, &past);
        }
    }
    int len = test_sanitize ? 129 : 257, past = test_sanitize ? 70 : 700;
    run_case(test_sanitize ? "one stream, 129 rows after 70" : "one stream, 257 rows after 700",
             wide_shape, kvdt, 1, &len, &past);
    len = 200, past = 33;
    run_case("one stream, 200 rows after 33, small pages", small_pages, kvdt, 1, &len, &past);
    /* head dim 256: the prompt kernel's widest instance */
    len = test_sanitize ? 129 : 1000, past = test_sanitize ? 0 : 300;
    run_case(test_sanitize ? "one stream, 129 rows, head dim 256"
                           : "one stream, 1000 rows after 300, head dim 256",
             hybrid_shape, kvdt, 1, &len, &past);
    int one = 1, ctx = test_sanitize ? 200 : 4095;
    run_case("decode, head dim 256", hybrid_shape, kvdt, 1, &one, &ctx);
}

/* Decode rows of one 8B layer at long context: segments of whole tiles
 * over many pages, the shape the partials run most. */
static void decode_rows_at_long_context(shoal_dtype kvdt)
{
    int rows[3] = {1, 1, 1}, past[3] = {4095, 1000, 8191};
    int n = test_sanitize ? 1 : 3;
    if (test_sanitize)
        past[0] = 700;
    char label[64];
    snprintf(label, sizeof label, "decode, %d streams to %d context", n, past[n - 1] + 1);
    run_case(label, wide_shape, kvdt, n, rows, past);
}

/* One decode row alone, the batch-1 step: its segments are shortened to
 * fill the GPU once (SHOAL_CUDA_ATTN_FILL=2, tensor-core partials), down
 * to one 64-token tile, and at 4k and up a row has more segments (32, 32,
 * 33 on 132 multiprocessors: one wave) than a single row's 512 KiB of
 * scratch held (31), so the records use the default slice's shared
 * budget. */
static void one_decode_row_in_short_segments(shoal_dtype kvdt)
{
    static const int ctxs[] = {301, 4096, 8192, 32768};
    int n = test_sanitize ? 2 : 4;
    for (int i = 0; i < n; i++) {
        int rows = 1, past = ctxs[i] - 1;
        char label[64];
        snprintf(label, sizeof label, "decode, one stream at %d context", ctxs[i]);
        run_case(label, wide_shape, kvdt, 1, &rows, &past);
    }
}

static void two_streams_whose_slices_cross(shoal_dtype kvdt)
{
    static const int pairs[][4] = {
        /* rows0, rows1, past0, past1 */
        {100, 27, 0, 37}, {127, 2, 5, 300}, {60, 197, 0, 0}, {200, 56, 17, 1},
        {1000, 1000, 0, 333}, {3000, 1096, 0, 0},
    };
    int n = test_sanitize ? 1 : 6;
    for (int i = 0; i < n; i++) {
        const int *p = pairs[test_sanitize ? 2 : i];
        int rows[2] = {p[0], p[1]}, past[2] = {p[2], p[3]};
        char label[64];
        snprintf(label, sizeof label, "two streams, %d + %d rows", rows[0], rows[1]);
        run_case(label, main_shape, kvdt, 2, rows, past);
    }
}

/* Prompt rows at an 8B layer's shape (head dim 128, groups of 4 query
 * heads): the shape the wgmma kernel takes, whose blocks hold 32 tokens of
 * the 4 query heads of one KV head, so a block's tokens straddle streams
 * and tile edges at 31, 32, 33 and 129. */
static void prompt_rows_at_the_8b_shape(shoal_dtype kvdt)
{
    static const int cases[][6] = {
        /* streams, rows0, rows1, rows2, past0, past1 (past2 = 1000) */
        {1, 1, 0, 0, 0, 0},   {1, 31, 0, 0, 0, 0},     {1, 33, 0, 0, 40, 0},
        {1, 129, 0, 0, 0, 0}, {1, 600, 0, 0, 130, 0}, {2, 31, 33, 0, 0, 500},
        {2, 100, 27, 0, 0, 37}, {3, 5, 300, 40, 0, 12},
    };
    int n = test_sanitize ? 2 : 8;
    for (int i = 0; i < n; i++) {
        const int *c = cases[test_sanitize ? 3 + 2 * i : i];
        int rows[3] = {c[1], c[2], c[3]}, past[3] = {c[4], c[5], 1000};
        char label[64];
        snprintf(label, sizeof label, "8B shape, %d stream(s), %d + %d + %d rows", c[0], rows[0],
                 c[0] > 1 ? rows[1] : 0, c[0] > 2 ? rows[2] : 0);
        run_case(label, wide_shape, kvdt, c[0], rows, past);
    }
}

/* The same shape over pages of 8, 64 and 256 tokens: the warp-specialized
 * kernel copies a page at a time up to a tile's 128 tokens, and a tile's
 * part of a larger page; tiles end mid-page and streams straddle them. */
static void prompt_rows_over_other_page_sizes(shoal_dtype kvdt)
{
    static const int pts[] = {256, 8, 64};
    int n = test_sanitize ? 1 : 3;
    for (int i = 0; i < n; i++) {
        shape sh = wide_shape;
        sh.page_tokens = pts[i];
        int rows[2] = {100, 300}, past[2] = {0, 37};
        char label[64];
        snprintf(label, sizeof label, "8B shape, %d-token pages, 2 streams", pts[i]);
        run_case(label, sh, kvdt, 2, rows, past);
    }
}

static void a_decode_round_of_more_streams_than_scratch_rows(shoal_dtype kvdt)
{
    int streams = test_sanitize ? 130 : 300;
    int rows[STREAMS_MAX], past[STREAMS_MAX];
    for (int s = 0; s < streams; s++) {
        rows[s] = 1;
        past[s] = (int)rnd_below(test_sanitize ? 300 : 2000);
    }
    char label[64];
    snprintf(label, sizeof label, "decode round, %d streams", streams);
    run_case(label, main_shape, kvdt, streams, rows, past);
}

/* A decode round at the 8B shape, the batch-64 step's: contexts from one
 * token (a lone key, warps with none) to past 2k, ends anywhere in a page
 * and a stage of 32 tokens (the TMA partials' stale tails). */
static void a_decode_round_at_the_8b_shape(shoal_dtype kvdt)
{
    int streams = test_sanitize ? 8 : 64;
    int rows[STREAMS_MAX], past[STREAMS_MAX];
    for (int s = 0; s < streams; s++) {
        rows[s] = 1;
        past[s] = s < 4 ? s * 17 : (int)rnd_below(test_sanitize ? 300 : 2100);
    }
    char label[64];
    snprintf(label, sizeof label, "decode round, 8B shape, %d streams", streams);
    run_case(label, wide_shape, kvdt, streams, rows, past);
}

/* run_case on a backend whose warp-specialized prompt kernel runs on at
 * most 3 blocks (SHOAL_CUDA_PROMPT_BLOCKS), each taking 20 to 60 items in
 * turn (unless SHOAL_CUDA_PROMPT_PERSIST=0 gives a block an item), then
 * the same with each block's first item's Q kept for the rest (a planted
 * fault), which must be red. */
static void prompt_items_case(const char *label, shape sh, int streams, const int *rows,
                              const int *past)
{
    kernels_backend *keep = gpu;
    gpu = open_backend_with(test_gpu, act, "SHOAL_CUDA_PROMPT_BLOCKS", "3");
    run_case(label, sh, SHOAL_DTYPE_BF16, streams, rows, past);
    const char *persist = getenv("SHOAL_CUDA_PROMPT_PERSIST");
    /* the kernel runs with bf16 activations alone */
    const bool many =
        act == SHOAL_DTYPE_BF16 && gpu_runs_sm90a() && !(persist && strcmp(persist, "0") == 0);
    const int rounds = test_dry ? 0 : cuda_backend_prompt_ws_rounds(gpu);
    CHECK_MSG(many ? rounds >= 20 : rounds <= 1, "%s: %d items a block", label, rounds);
    if (many) {
        prompt_stale_q = true;
        run_case(label, sh, SHOAL_DTYPE_BF16, streams, rows, past);
        prompt_stale_q = false;
    }
    kernels_backend_close(gpu);
    gpu = keep;
}

/* The persistent prompt kernel's items at the 8B shape (a block 32 tokens
 * of 4 query heads: both computing warpgroups see the same keys) and at
 * 40 query heads over 8 KV heads (a group of 5: a block 128 tokens of one
 * head, so each warpgroup's 64 tokens end at its own key tile, and a
 * stream can lie in one warpgroup's rows alone); items of several
 * streams and items whose last rows are past the last token, over pages
 * of 16 and 8 tokens. (The default grid, a block a multiprocessor, gives
 * a block more than one item from 513 rows at the 8B shape on 132.) */
static void prompt_items_over_few_blocks(void)
{
    const int rows3[3] = {5, 300, 40}, past3[3] = {0, 12, 1000};
    prompt_items_case("8B shape, 3 blocks, 3 streams, 5 + 300 + 40 rows", wide_shape, 3, rows3,
                      past3);
    const shape group5 = {40, 8, 128, 16};
    const int rows_u[3] = {70, 200, 3}, past_u[3] = {0, 60, 7};
    prompt_items_case("group of 5, 3 blocks, 3 streams, 70 + 200 + 3 rows", group5, 3, rows_u,
                      past_u);
    if (!test_sanitize) {
        const int rows1[1] = {600}, past1[1] = {130};
        prompt_items_case("8B shape, 3 blocks, 600 rows", wide_shape, 1, rows1, past1);
        shape sh = wide_shape;
        sh.page_tokens = 8;
        const int rows2[2] = {100, 300}, past2[2] = {0, 37};
        prompt_items_case("8B shape, 3 blocks, 8-token pages, 2 streams", sh, 2, rows2, past2);
    }
}

static void bf16_pages(void)
{
    one_stream_at_every_slice_edge(SHOAL_DTYPE_BF16);
    two_streams_whose_slices_cross(SHOAL_DTYPE_BF16);
    prompt_rows_at_the_8b_shape(SHOAL_DTYPE_BF16);
    prompt_rows_over_other_page_sizes(SHOAL_DTYPE_BF16);
    prompt_items_over_few_blocks();
    a_decode_round_of_more_streams_than_scratch_rows(SHOAL_DTYPE_BF16);
    a_decode_round_at_the_8b_shape(SHOAL_DTYPE_BF16);
    decode_rows_at_long_context(SHOAL_DTYPE_BF16);
    one_decode_row_in_short_segments(SHOAL_DTYPE_BF16);
}

static void fp8_pages_with_scales(void)
{
    one_stream_at_every_slice_edge(SHOAL_DTYPE_F8_E4M3);
    two_streams_whose_slices_cross(SHOAL_DTYPE_F8_E4M3);
    prompt_rows_at_the_8b_shape(SHOAL_DTYPE_F8_E4M3);
    prompt_rows_over_other_page_sizes(SHOAL_DTYPE_F8_E4M3);
    a_decode_round_of_more_streams_than_scratch_rows(SHOAL_DTYPE_F8_E4M3);
    a_decode_round_at_the_8b_shape(SHOAL_DTYPE_F8_E4M3);
    decode_rows_at_long_context(SHOAL_DTYPE_F8_E4M3);
    one_decode_row_in_short_segments(SHOAL_DTYPE_F8_E4M3);
}

/* A --race case: its name first, so a run that racecheck's time limit
 * cuts shows how far it got. */
static void race_case(const char *label, shape sh, shoal_dtype kvdt, int streams, const int *rows,
                      const int *past)
{
    printf("  %s\n", label);
    fflush(stdout);
    run_case(label, sh, kvdt, streams, rows, past);
}

/* --race (racecheck): one case for each kernel that shares memory
 * between a block's threads, bf16 activations alone (the tensor-core
 * kernels; f32 takes the SIMT partials, which --sanitize's memcheck
 * covers). Under --sanitize racecheck did not reach them: the f32 pass
 * ran first and took the step's whole 300 s (kernels/lab README). */
static void every_shared_memory_kernel_once(void)
{
    /* a decode round of 8 streams, two prompts, one row at 4k */
    const int ones[8] = {1, 1, 1, 1, 1, 1, 1, 1}, past[8] = {0, 17, 114, 151, 188, 225, 262, 299};
    const int prompt[2] = {100, 29}, prompt_past[2] = {0, 37}, at_4k = 4095;
    /* the TMA partials, persistent over a round's items, and the merge */
    race_case("race: decode round, 8B shape, 8 streams", wide_shape, SHOAL_DTYPE_BF16, 8, ones,
              past);
    /* the warp-specialized wgmma prompt kernel (tile 5) */
    race_case("race: prompt rows, 8B shape, 2 streams", wide_shape, SHOAL_DTYPE_BF16, 2, prompt,
              prompt_past);
    /* the same kernel persistent: items after items in 3 blocks */
    printf("  race: prompt items over 3 persistent blocks\n");
    fflush(stdout);
    prompt_items_over_few_blocks();
    /* one row at 4k: short segments, the merge holding them in registers */
    race_case("race: decode, one stream at 4,096 context", wide_shape, SHOAL_DTYPE_BF16, 1, ones,
              &at_4k);
    /* fp8 pages: the cp.async tensor-core partials and the mma.sync
     * prompt tiles (the TMA kernels take bf16 pages alone) */
    race_case("race: decode round, fp8 pages", wide_shape, SHOAL_DTYPE_F8_E4M3, 8, ones, past);
    race_case("race: prompt rows, fp8 pages", wide_shape, SHOAL_DTYPE_F8_E4M3, 2, prompt,
              prompt_past);
    /* head dim 64: the cp.async partials and prompt tiles of other shapes */
    race_case("race: two streams, head dim 64", main_shape, SHOAL_DTYPE_BF16, 2, prompt,
              prompt_past);
}

int main(int argc, char **argv)
{
    cuda_test_start("test_cuda_attention", argc, argv);
    cpu = open_backend("cpu", SHOAL_DTYPE_INVALID);
    static const shoal_dtype acts[] = {SHOAL_DTYPE_F32, SHOAL_DTYPE_BF16};
    /* both activation dtypes under the sanitizer too: bf16 runs the
     * tensor-core kernels */
    for (int a = test_race ? 1 : 0; a < 2; a++) {
        act = acts[a];
        gpu = open_backend(test_gpu, act);
        if (gpu->act_dtype != act) { /* a dry run: the CPU computes in f32 alone */
            kernels_backend_close(gpu);
            continue;
        }
        printf("-- activations %s\n", act_name(act));
        if (test_race) {
            TEST_RUN(every_shared_memory_kernel_once);
        } else {
            TEST_RUN(bf16_pages);
            TEST_RUN(fp8_pages_with_scales);
        }
        CHECK(gpu->sync(gpu) == SHOAL_OK);
        kernels_backend_close(gpu);
    }
    printf("%d cases (%d of the prompt op); planted faults seen %d of %d\n", cases_run,
           prompt_cases, faults_seen, faults_planted);
    kernels_backend_close(cpu);
    return TEST_EXIT();
}
