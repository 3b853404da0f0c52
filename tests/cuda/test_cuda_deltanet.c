/* The gated DeltaNet ops on the GPU against their CPU twins
 * (kernels/cpu/deltanet.c), with bf16 and with f32 activations.
 *
 * The conv and the delta rule run batches of runs of 1, 2, 7, 63, 64, 65,
 * 127, 128, 257 and 1000 rows; several streams a batch, of different run lengths, in an
 * order that is not their stream ids', with slots that are not their ids;
 * runs from position 0 beside runs that continue a state; a batch cut in
 * two calls (inside a run) against the CPU's one call; at the small shapes
 * and at Qwen3.5-27B's layer. Both the outputs and the states are checked:
 * the conv's states bit for bit (they are copies of inputs), the rule's
 * written parts by tolerance, and every other byte of the states (the
 * conv or rule part the op does not own, the padding after a slot, the
 * slots no stream uses) bit for bit. A slot whose stream starts at
 * position 0 holds NaN, so a kernel that reads it instead of starting
 * from zeros turns its outputs NaN, which rel_err reports as infinite.
 *
 * Planted faults, run on every pass, must each turn the check red: the
 * next head's decay (rule), a run from position 0 told it continues (the
 * kernel's reset skipped: it reads the NaN), two streams' slots swapped (a
 * state read from and written to the wrong slot, as a kernel that took the
 * stream's index for its slot would). Tried on the dry run
 * (SHOAL_TEST_ON_CPU=1, seeds 1 to 40): the wrong decay moved the rule's
 * outputs by 0.34 at the least (the bf16 tolerance is 6e-3), the skipped
 * reset and the swapped slots made outputs NaN (an infinite error) and
 * states differ; all red. The rule's tests run again on a backend opened
 * with SHOAL_CUDA_DELTANET_CHUNK=1, where runs of 64 rows and more take the
 * chunked kernel and the shorter ones in the same call the recurrent one
 * (the chunked kernel's launches counted; the short runs held to the
 * recurrent kernel's tolerance), within chunk_tol; a second plant case
 * puts the skipped reset and the swapped slots on long runs. Then the
 * gated norm, the sigmoid gate and the add. */
#include "tests/cuda/cuda_test.h"

#include "common/common_assert.h"

static kernels_backend *cpu, *gpu;
static shoal_dtype act;
/* gpu opened with SHOAL_CUDA_DELTANET_CHUNK=1: the rule's runs of 64 rows
 * and more take the chunked kernel, the shorter the recurrent one */
static bool chunk;
enum { CHUNK_ROWS_MIN = 64 };

typedef struct dn_shape {
    int k_heads, v_heads, k_dim, v_dim, kernel;
} dn_shape;

static const dn_shape shapes[] = {
    {2, 4, 16, 24, 4},
    {1, 3, 16, 16, 4},
    {2, 2, 12, 20, 3},
    {16, 48, 128, 128, 4}, /* Qwen3.5-27B's linear-attention layer */
};
enum { SHAPES = sizeof shapes / sizeof shapes[0] };

enum {
    RUNS_MAX = 5,
    SLOT_PAD = 5,   /* floats after a slot's two parts (another layer's), never written */
    SPARE_SLOTS = 2 /* slots no stream of the batch uses, never written */
};

typedef struct dn_run {
    int rows;
    bool fresh; /* from position 0; else from a position past 0 */
} dn_run;

typedef struct dn_case {
    const char *name;
    int runs;
    dn_run run[RUNS_MAX];
    /* the GPU takes rows [0, split) and [split, rows) as two calls (0: one
     * call); the CPU always one */
    int split;
    bool slots; /* a slot table; false: NULL (stream s in slot s) */
} dn_case;

/* Where the ops find their runs (cuda_ops.h, CUDA_DELTANET_WALK_ROWS): up
 * to 16 rows past one a stream each block walks its own; more are listed
 * first. Both ways are here (1 to 10 rows of 1 to 5 streams walk; the
 * rest are listed), and runs longer than a conv item (16 rows). */
static const dn_case cases[] = {
    {"one row from position 0", 1, {{1, true}}, 0, false},
    {"one row continuing", 1, {{1, false}}, 0, true},
    {"2 rows", 1, {{2, false}}, 0, true},
    {"7 rows from position 0", 1, {{7, true}}, 0, false},
    {"63 rows", 1, {{63, false}}, 0, true},
    {"64 rows from position 0", 1, {{64, true}}, 0, true},
    {"65 rows", 1, {{65, false}}, 0, false},
    {"257 rows", 1, {{257, false}}, 0, true},
    {"a decode round", 5, {{1, false}, {1, true}, {1, false}, {1, false}, {1, true}}, 0, true},
    {"short runs of three streams", 3, {{7, false}, {1, false}, {2, true}}, 0, true},
    {"long and short runs",
     5,
     {{7, false}, {1, true}, {64, false}, {2, false}, {65, true}},
     0,
     true},
    {"257 rows in two calls", 1, {{257, false}}, 100, true},
    {"65 rows from position 0 in two calls", 1, {{65, true}}, 64, false},
    {"long and short runs in two calls",
     5,
     {{7, false}, {1, true}, {64, false}, {2, false}, {65, true}},
     40,
     true},
    /* the chunked rule's edges: a partial last chunk, whole chunks, many */
    {"127 rows", 1, {{127, false}}, 0, true},
    {"128 rows from position 0", 1, {{128, true}}, 0, false},
    {"1000 rows", 1, {{1000, false}}, 0, true},
    {"long runs first, beside short ones",
     4,
     {{65, false}, {128, true}, {7, false}, {1, true}},
     0,
     true},
    {"long runs of 127 and 257 in two calls",
     3,
     {{127, false}, {2, true}, {257, false}},
     150,
     true},
};
enum {
    CASES = sizeof cases / sizeof cases[0],
    PLANT_CASE = 10,     /* long and short runs */
    PLANT_LONG_CASE = 17 /* long runs first: the reset and slot plants hit chunked runs */
};

typedef enum plant {
    PLANT_NONE = 0,
    PLANT_DECAY, /* the GPU gets head h + 1's decay for head h */
    PLANT_RESET, /* the GPU is told the first run from position 0 starts at 1 */
    PLANT_SLOT,  /* the GPU gets the first two runs' slots swapped */
} plant;

/* A batch on the host: rows of the case's runs in order, run j of stream
 * stream_of[j] (a shuffle of 0 .. runs - 1), stream s in slot
 * slot_of[s] (a rotation that moves every stream). */
typedef struct dn_batch {
    int rows, streams, nslots;
    int32_t *row_stream, *positions;
    int32_t stream_of[RUNS_MAX], slot_of[RUNS_MAX];
    int run_row0[RUNS_MAX];
    bool use_slots;
} dn_batch;

static void batch_make(const dn_case *c, dn_batch *b)
{
    b->streams = c->runs;
    b->nslots = c->runs + SPARE_SLOTS;
    b->use_slots = c->slots;
    b->rows = 0;
    for (int j = 0; j < c->runs; j++)
        b->rows += c->run[j].rows;
    b->row_stream = xmalloc((size_t)b->rows * 4);
    b->positions = xmalloc((size_t)b->rows * 4);
    for (int j = 0; j < c->runs; j++)
        b->stream_of[j] = j;
    for (int j = c->runs - 1; j > 0; j--) {
        int k = (int)rnd_below((uint32_t)j + 1);
        int t = b->stream_of[j];
        b->stream_of[j] = b->stream_of[k];
        b->stream_of[k] = t;
    }
    /* 1 + offset is in [1, nslots - 1]: no stream in its own slot */
    int offset = (int)rnd_below(SPARE_SLOTS);
    for (int s = 0; s < c->runs; s++)
        b->slot_of[s] = (s + 1 + offset) % b->nslots;
    int r = 0;
    for (int j = 0; j < c->runs; j++) {
        int pos0 = c->run[j].fresh ? 0 : 1 + (int)rnd_below(1000);
        b->run_row0[j] = r;
        for (int i = 0; i < c->run[j].rows; i++, r++) {
            b->row_stream[r] = b->stream_of[j];
            b->positions[r] = pos0 + i;
        }
    }
}

static void batch_free(dn_batch *b)
{
    free(b->row_stream);
    free(b->positions);
}

static int slot_of_run(const dn_batch *b, int j)
{
    int s = b->stream_of[j];
    return b->use_slots ? b->slot_of[s] : s;
}

/* A slot's floats: the conv part, the rule part, the padding. */
typedef struct dn_slot {
    size_t conv, rule, all;
} dn_slot;

static dn_slot slot_floats(const dn_shape *sh)
{
    int channels = 2 * sh->k_heads * sh->k_dim + sh->v_heads * sh->v_dim;
    dn_slot s;
    s.conv = (size_t)channels * (size_t)(sh->kernel - 1);
    s.rule = (size_t)sh->v_heads * (size_t)sh->k_dim * (size_t)sh->v_dim;
    s.all = s.conv + s.rule + SLOT_PAD;
    return s;
}

/* NaN everywhere (0xff bytes), then the slots of runs that continue get a
 * state: conv inputs in [-1, 1), rule entries in [-0.5, 0.5). */
static float *states_make(const dn_case *c, const dn_batch *b, dn_slot sl)
{
    size_t n = sl.all * (size_t)b->nslots;
    float *st = xmalloc(n * 4);
    memset(st, 0xff, n * 4);
    for (int j = 0; j < c->runs; j++)
        if (!c->run[j].fresh) {
            float *p = st + (size_t)slot_of_run(b, j) * sl.all;
            for (size_t i = 0; i < sl.conv; i++)
                p[i] = rnd_uniform();
            for (size_t i = 0; i < sl.rule; i++)
                p[sl.conv + i] = 0.5f * rnd_uniform();
        }
    return st;
}

/* The GPU's copies of the positions and the slots, with a plant. */
static void plant_batch(const dn_case *c, const dn_batch *b, plant p, int32_t *pos, int32_t *slots)
{
    memcpy(pos, b->positions, (size_t)b->rows * 4);
    memcpy(slots, b->slot_of, sizeof b->slot_of);
    if (p == PLANT_RESET) {
        int j = 0;
        while (j < c->runs && !c->run[j].fresh)
            j++;
        SHOAL_ASSERT(j < c->runs);
        for (int i = 0; i < c->run[j].rows; i++)
            pos[b->run_row0[j] + i] += 1;
    } else if (p == PLANT_SLOT) {
        SHOAL_ASSERT(b->use_slots && c->runs >= 2);
        int s0 = b->stream_of[0], s1 = b->stream_of[1];
        int32_t t = slots[s0];
        slots[s0] = slots[s1];
        slots[s1] = t;
    }
}

typedef struct dn_result {
    double out_err;    /* ||gpu - cpu|| / ||cpu|| of the outputs */
    double short_err;  /* the largest of it over the runs shorter than CHUNK_ROWS_MIN */
    int long_rows;     /* the most rows of one run in one GPU call */
    bool chunk_ran;    /* the chunked kernel launched (false on a dry run) */
    double state_err;  /* the largest of it over the used slots' rule parts */
    size_t other_diff; /* floats of the states that differ elsewhere */
} dn_result;

static double max_d(double a, double b)
{
    return a > b ? a : b;
}

/* The states compared: a used slot's part [off, off + n) within rel_err
 * (n 0: none), all the rest bit for bit. Clobbers both buffers. */
static void states_compare(float *got, float *ref, const dn_case *c, const dn_batch *b, dn_slot sl,
                           size_t off, size_t n, dn_result *res)
{
    res->state_err = 0.0;
    for (int j = 0; j < c->runs && n > 0; j++) {
        size_t at = (size_t)slot_of_run(b, j) * sl.all + off;
        res->state_err = max_d(res->state_err, rel_err(got + at, ref + at, n));
        memset(got + at, 0, n * 4);
        memset(ref + at, 0, n * 4);
    }
    res->other_diff = count_differing(got, ref, sl.all * (size_t)b->nslots);
}

/* A GPU call's batch: rows [r0, r1) of b, its tables in device memory. */
static kernels_batch gpu_batch(const dn_batch *b, const int32_t *d_rs, const int32_t *d_pos, int r0,
                               int r1)
{
    kernels_batch kb = {
        .rows = r1 - r0, .streams = b->streams, .row_stream = d_rs + r0, .positions = d_pos + r0};
    return kb;
}

/* The GPU's calls: one, or two at the split. */
static int calls_of(const dn_case *c, int rows, int *bounds)
{
    bounds[0] = 0;
    if (c->split > 0 && c->split < rows) {
        bounds[1] = c->split;
        bounds[2] = rows;
        return 2;
    }
    bounds[1] = rows;
    return 1;
}

static dn_result run_conv(const dn_shape *sh, const dn_case *c, plant p)
{
    dn_batch b;
    batch_make(c, &b);
    dn_slot sl = slot_floats(sh);
    int channels = 2 * sh->k_heads * sh->k_dim + sh->v_heads * sh->v_dim;
    int in_stride = channels + 3; /* the columns past the channels are NaN */
    size_t rows = (size_t)b.rows, nin = rows * (size_t)in_stride, nout = rows * (size_t)channels;
    size_t nw = (size_t)channels * (size_t)sh->kernel, ns = sl.all * (size_t)b.nslots;
    size_t ab = shoal_dtype_bytes(act);
    float *in = xmalloc(nin * 4), *w = xmalloc(nw * 4);
    float *ref = xmalloc(nout * 4), *got = xmalloc(nout * 4);
    for (size_t r = 0; r < rows; r++)
        for (int i = 0; i < in_stride; i++)
            in[r * (size_t)in_stride + (size_t)i] =
                i < channels ? round_to(rnd_uniform(), act) : NAN;
    for (size_t i = 0; i < nw; i++)
        w[i] = 0.5f * rnd_uniform();
    float *st0 = states_make(c, &b, sl), *st_ref = xmalloc(ns * 4), *st_got = xmalloc(ns * 4);
    memcpy(st_ref, st0, ns * 4);

    kernels_batch hb = {
        .rows = b.rows, .streams = b.streams, .row_stream = b.row_stream, .positions = b.positions};
    cpu->deltanet_conv(cpu, ref, in, in_stride, w, channels, sh->kernel, st_ref, sl.all * 4,
                       b.use_slots ? b.slot_of : NULL, &hb);

    int32_t *pos = xmalloc(rows * 4), slots[RUNS_MAX];
    plant_batch(c, &b, p, pos, slots);
    unsigned char *din = dev_from_f32(gpu, in, nin, act), *dout = dev_alloc(gpu, nout * ab);
    dev_poison(gpu, dout, nout * ab);
    float *dw = dev_copy(gpu, w, nw * 4), *dst = dev_copy(gpu, st0, ns * 4);
    int32_t *drs = dev_copy(gpu, b.row_stream, rows * 4), *dpos = dev_copy(gpu, pos, rows * 4);
    int32_t *dslots = b.use_slots ? dev_copy(gpu, slots, sizeof slots) : NULL;
    int bounds[3];
    int calls = calls_of(c, b.rows, bounds);
    for (int k = 0; k < calls; k++) {
        kernels_batch gb = gpu_batch(&b, drs, dpos, bounds[k], bounds[k + 1]);
        size_t r0 = (size_t)bounds[k];
        gpu->deltanet_conv(gpu, dout + r0 * (size_t)channels * ab,
                           din + r0 * (size_t)in_stride * ab, in_stride, dw, channels, sh->kernel,
                           dst, sl.all * 4, dslots, &gb);
    }
    f32_from_dev(gpu, got, dout, nout, act);
    CHECK(gpu->download(gpu, st_got, dst, ns * 4) == SHOAL_OK);

    dn_result res = {.out_err = rel_err(got, ref, nout)};
    /* the conv's state is the last inputs, copied: every byte exact */
    states_compare(st_got, st_ref, c, &b, sl, 0, 0, &res);

    gpu->free(gpu, din);
    gpu->free(gpu, dout);
    gpu->free(gpu, dw);
    gpu->free(gpu, dst);
    gpu->free(gpu, drs);
    gpu->free(gpu, dpos);
    if (dslots)
        gpu->free(gpu, dslots);
    free(in);
    free(w);
    free(ref);
    free(got);
    free(st0);
    free(st_ref);
    free(st_got);
    free(pos);
    batch_free(&b);
    return res;
}

static dn_result run_rule(const dn_shape *sh, const dn_case *c, plant p)
{
    dn_batch b;
    batch_make(c, &b);
    dn_slot sl = slot_floats(sh);
    int vh = sh->v_heads, kd = sh->k_heads * sh->k_dim, vd = vh * sh->v_dim;
    int x_stride = 2 * kd + vd, ba_stride = 2 * vh; /* b and a side by side in a row */
    size_t rows = (size_t)b.rows, nx = rows * (size_t)x_stride, nba = rows * (size_t)ba_stride;
    size_t nout = rows * (size_t)vd, ns = sl.all * (size_t)b.nslots, ab = shoal_dtype_bytes(act);
    float *x = xmalloc(nx * 4), *ba = xmalloc(nba * 4);
    float *decay = xmalloc((size_t)vh * 4), *dt_bias = xmalloc((size_t)vh * 4);
    float *ref = xmalloc(nout * 4), *got = xmalloc(nout * 4);
    fill_uniform(x, nx, 1.0f, act);
    fill_uniform(ba, nba, 3.0f, act);
    /* decay = -exp(A_log), the heads' A_log spread over [-3, 0.5) in a
     * shuffled order, each in the middle 70% of its own bin of 3.5 /
     * v_heads: no head's decay is close to the next head's (the plant). A
     * row's decay exp(g) then runs from under 1e-2 to above 0.999, a
     * head's memory (1 / mean -g) up to about 30 rows. */
    int *bin = xmalloc((size_t)vh * sizeof *bin);
    for (int h = 0; h < vh; h++)
        bin[h] = h;
    for (int h = vh - 1; h > 0; h--) {
        int k = (int)rnd_below((uint32_t)h + 1), t = bin[h];
        bin[h] = bin[k];
        bin[k] = t;
    }
    for (int h = 0; h < vh; h++) {
        float a_log = -3.0f + 3.5f * ((float)bin[h] + 0.5f + 0.35f * rnd_uniform()) / (float)vh;
        decay[h] = -expf(a_log);
        dt_bias[h] = rnd_uniform();
    }
    free(bin);
    float *st0 = states_make(c, &b, sl), *st_ref = xmalloc(ns * 4), *st_got = xmalloc(ns * 4);
    memcpy(st_ref, st0, ns * 4);

    kernels_batch hb = {
        .rows = b.rows, .streams = b.streams, .row_stream = b.row_stream, .positions = b.positions};
    cpu->deltanet_rule(cpu, ref, x, ba, ba + vh, ba_stride, decay, dt_bias, sh->k_heads, vh,
                       sh->k_dim, sh->v_dim, st_ref + sl.conv, sl.all * 4,
                       b.use_slots ? b.slot_of : NULL, &hb);

    int32_t *pos = xmalloc(rows * 4), slots[RUNS_MAX];
    plant_batch(c, &b, p, pos, slots);
    float *gdecay = xmalloc((size_t)vh * 4);
    for (int h = 0; h < vh; h++)
        gdecay[h] = decay[p == PLANT_DECAY ? (h + 1) % vh : h];
    unsigned char *dx = dev_from_f32(gpu, x, nx, act), *dba = dev_from_f32(gpu, ba, nba, act);
    unsigned char *dout = dev_alloc(gpu, nout * ab);
    dev_poison(gpu, dout, nout * ab);
    float *ddecay = dev_copy(gpu, gdecay, (size_t)vh * 4);
    float *ddt = dev_copy(gpu, dt_bias, (size_t)vh * 4), *dst = dev_copy(gpu, st0, ns * 4);
    int32_t *drs = dev_copy(gpu, b.row_stream, rows * 4), *dpos = dev_copy(gpu, pos, rows * 4);
    int32_t *dslots = b.use_slots ? dev_copy(gpu, slots, sizeof slots) : NULL;
    int bounds[3];
    int calls = calls_of(c, b.rows, bounds);
    int long_rows = 0;
    for (int k = 0; k < calls; k++)
        for (int j = 0; j < c->runs; j++) {
            int lo = b.run_row0[j], hi = lo + c->run[j].rows;
            lo = lo > bounds[k] ? lo : bounds[k];
            hi = hi < bounds[k + 1] ? hi : bounds[k + 1];
            long_rows = hi - lo > long_rows ? hi - lo : long_rows;
        }
    const unsigned long launches = test_dry ? 0 : cuda_backend_deltanet_chunk_launches(gpu);
    for (int k = 0; k < calls; k++) {
        kernels_batch gb = gpu_batch(&b, drs, dpos, bounds[k], bounds[k + 1]);
        size_t r0 = (size_t)bounds[k];
        unsigned char *brow = dba + r0 * (size_t)ba_stride * ab;
        gpu->deltanet_rule(gpu, dout + r0 * (size_t)vd * ab, dx + r0 * (size_t)x_stride * ab, brow,
                           brow + (size_t)vh * ab, ba_stride, ddecay, ddt, sh->k_heads, vh,
                           sh->k_dim, sh->v_dim, dst + sl.conv, sl.all * 4, dslots, &gb);
    }
    f32_from_dev(gpu, got, dout, nout, act);
    CHECK(gpu->download(gpu, st_got, dst, ns * 4) == SHOAL_OK);

    dn_result res = {.out_err = rel_err(got, ref, nout), .long_rows = long_rows};
    res.chunk_ran = !test_dry && cuda_backend_deltanet_chunk_launches(gpu) != launches;
    for (int j = 0; j < c->runs; j++)
        if (c->run[j].rows < CHUNK_ROWS_MIN) {
            size_t at = (size_t)b.run_row0[j] * (size_t)vd, n = (size_t)c->run[j].rows * vd;
            res.short_err = max_d(res.short_err, rel_err(got + at, ref + at, n));
        }
    states_compare(st_got, st_ref, c, &b, sl, sl.conv, sl.rule, &res);

    gpu->free(gpu, dx);
    gpu->free(gpu, dba);
    gpu->free(gpu, dout);
    gpu->free(gpu, ddecay);
    gpu->free(gpu, ddt);
    gpu->free(gpu, dst);
    gpu->free(gpu, drs);
    gpu->free(gpu, dpos);
    if (dslots)
        gpu->free(gpu, dslots);
    free(x);
    free(ba);
    free(decay);
    free(gdecay);
    free(dt_bias);
    free(ref);
    free(got);
    free(st0);
    free(st_ref);
    free(st_got);
    free(pos);
    batch_free(&b);
    return res;
}

/* The rule's outputs and states are f32 sums in another order, with the
 * GPU's expf and log1pf (within 2 ulp of glibc's) in every row's decay:
 * over a run the state's error grows with its memory (30 rows at the
 * longest here) to under 1e-5 relative; 2e-4 leaves a margin of ten and
 * more. bf16 outputs carry their rounding on top (one
 * op's, tol_for); the states stay f32 from the same inputs. The plants move
 * the outputs by 1e-1 and more (the dry run shows it: SHOAL_TEST_ON_CPU=1)
 * or make them NaN. */
static double recurrent_tol(void)
{
    return act == SHOAL_DTYPE_BF16 ? tol_for(act) : 2e-4;
}

/* The chunked rule (chunk) rounds its products' operands to bf16 whatever
 * the activations: the normed q and k, the state and V' (each within 2^-9
 * relative), with f32 sums; the solve and the state stay f32, and the
 * decay forgets old rounding (a head's memory 30 rows at the longest), so
 * the error does not grow along a run: a few 1e-3 relative, outputs and
 * states alike. 2e-2 leaves a margin of four and more and still catches
 * a wrong decay: the next head's moved the outputs by 0.34 at the least,
 * over ten times the tolerance (rule_planted_faults_fail checks that). */
static const double chunk_tol = 2e-2;

static double rule_tol(void)
{
    return chunk ? chunk_tol : recurrent_tol();
}
static double rule_state_tol(void)
{
    return chunk ? chunk_tol : 2e-4;
}

static int shapes_to_run(void)
{
    return test_sanitize ? 3 : SHAPES; /* the 27B layer is slow under the sanitizer */
}

static void shape_name(const dn_shape *sh, char *buf, size_t n)
{
    snprintf(buf, n, "k_heads %d v_heads %d k_dim %d v_dim %d conv %d", sh->k_heads, sh->v_heads,
             sh->k_dim, sh->v_dim, sh->kernel);
}

static void conv_matches_cpu_at_run_edges(void)
{
    for (int s = 0; s < shapes_to_run(); s++)
        for (int i = 0; i < CASES; i++) {
            char name[96];
            shape_name(&shapes[s], name, sizeof name);
            dn_result r = run_conv(&shapes[s], &cases[i], PLANT_NONE);
            CHECK_MSG(r.out_err <= tol_for(act) && r.other_diff == 0,
                      "deltanet_conv %s, %s (%s): output error %.3e over %.1e, %zu state "
                      "floats differ",
                      name, cases[i].name, act_name(act), r.out_err, tol_for(act), r.other_diff);
        }
}

static void conv_planted_faults_fail(void)
{
    static const plant plants[] = {PLANT_RESET, PLANT_SLOT};
    for (int s = 0; s < shapes_to_run(); s++)
        for (int k = 0; k < 2; k++) {
            dn_result r = run_conv(&shapes[s], &cases[PLANT_CASE], plants[k]);
            CHECK_MSG(r.out_err > tol_for(act) || r.other_diff > 0,
                      "deltanet_conv shape %d: planted fault %d passed (output error %.3e, "
                      "%zu state floats differ)",
                      s, (int)plants[k], r.out_err, r.other_diff);
        }
}

static void rule_matches_cpu_at_run_edges(void)
{
    for (int s = 0; s < shapes_to_run(); s++)
        for (int i = 0; i < CASES; i++) {
            char name[96];
            shape_name(&shapes[s], name, sizeof name);
            dn_result r = run_rule(&shapes[s], &cases[i], PLANT_NONE);
            CHECK_MSG(r.out_err <= rule_tol() && r.state_err <= rule_state_tol() &&
                          r.other_diff == 0,
                      "deltanet_rule%s %s, %s (%s): output error %.3e over %.1e, state error "
                      "%.3e over %.1e, %zu floats differ outside the rule's states",
                      chunk ? " (chunked)" : "", name, cases[i].name, act_name(act), r.out_err,
                      rule_tol(), r.state_err, rule_state_tol(), r.other_diff);
            if (!chunk || test_dry)
                continue;
            /* the long runs took the chunked kernel, and the short ones
             * the recurrent: with f32 activations only the recurrent
             * kernel is within its tolerance (the chunked one rounds its
             * operands to bf16) */
            bool want = r.long_rows >= CHUNK_ROWS_MIN;
            CHECK_MSG(r.chunk_ran == want,
                      "deltanet_rule (chunked) %s, %s (%s): the chunked kernel %s (the longest "
                      "run of a call %d rows)",
                      name, cases[i].name, act_name(act), r.chunk_ran ? "ran" : "did not run",
                      r.long_rows);
            CHECK_MSG(r.short_err <= recurrent_tol(),
                      "deltanet_rule (chunked) %s, %s (%s): the short runs' output error %.3e "
                      "over the recurrent kernel's %.1e",
                      name, cases[i].name, act_name(act), r.short_err, recurrent_tol());
        }
}

static void rule_planted_faults_fail(void)
{
    static const plant plants[] = {PLANT_DECAY, PLANT_RESET, PLANT_SLOT};
    for (int s = 0; s < shapes_to_run(); s++)
        for (int k = 0; k < 6; k++) {
            /* the first case's reset and slot plants hit short runs, the
             * second's long ones (the chunked kernel's where it is on) */
            int ci = k < 3 ? PLANT_CASE : PLANT_LONG_CASE;
            dn_result r = run_rule(&shapes[s], &cases[ci], plants[k % 3]);
            bool red = r.out_err > rule_tol() || r.state_err > rule_state_tol() || r.other_diff > 0;
            CHECK_MSG(red,
                      "deltanet_rule%s shape %d, %s: planted fault %d passed (output error "
                      "%.3e, state error %.3e, %zu floats differ)",
                      chunk ? " (chunked)" : "", s, cases[ci].name, (int)plants[k % 3], r.out_err,
                      r.state_err, r.other_diff);
            /* a plant in the decay must show in the outputs themselves:
             * the tolerance is tight enough for a wrong decay */
            if (k == 0)
                CHECK_MSG(r.out_err > 10 * rule_tol(),
                          "deltanet_rule shape %d: the next head's decay moved the outputs by "
                          "only %.3e",
                          s, r.out_err);
        }
}

static void rmsnorm_gated_matches_cpu(void)
{
    static const int sizes[][3] = {/* rows, heads, dim */
                                   {1, 48, 128},
                                   {7, 4, 24},
                                   {64, 3, 20},
                                   {257, 2, 16},
                                   {65, 1, 300}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        for (int in_place = 0; in_place < 2; in_place++) {
            int rows = sizes[i][0], heads = sizes[i][1], dim = sizes[i][2];
            size_t n = (size_t)rows * heads * dim, ab = shoal_dtype_bytes(act);
            float *x = xmalloc(n * 4), *z = xmalloc(n * 4), *w = xmalloc((size_t)dim * 4);
            float *ref = xmalloc(n * 4), *got = xmalloc(n * 4);
            fill_uniform(x, n, 2.0f, act);
            fill_uniform(z, n, 3.0f, act);
            for (int d = 0; d < dim; d++)
                w[d] = 1.0f + 0.5f * rnd_uniform();
            cpu->rmsnorm_gated(cpu, ref, x, z, w, rows, heads, dim, 1e-6f);
            void *dx = dev_from_f32(gpu, x, n, act), *dz = dev_from_f32(gpu, z, n, act);
            float *dw = dev_copy(gpu, w, (size_t)dim * 4);
            void *dout = in_place ? dx : dev_alloc(gpu, n * ab);
            if (!in_place)
                dev_poison(gpu, dout, n * ab);
            gpu->rmsnorm_gated(gpu, dout, dx, dz, dw, rows, heads, dim, 1e-6f);
            f32_from_dev(gpu, got, dout, n, act);
            double err = rel_err(got, ref, n);
            CHECK_MSG(err <= tol_for(act),
                      "rmsnorm_gated rows %d heads %d dim %d%s (%s): error %.3e over %.1e", rows,
                      heads, dim, in_place ? " in place" : "", act_name(act), err, tol_for(act));
            gpu->free(gpu, dx);
            gpu->free(gpu, dz);
            gpu->free(gpu, dw);
            if (!in_place)
                gpu->free(gpu, dout);
            free(x);
            free(z);
            free(w);
            free(ref);
            free(got);
        }
}

static void mul_sigmoid_matches_cpu(void)
{
    static const int sizes[][4] = {                     /* rows, n, gate_stride, gate_cols */
                                   {7, 5120, 1, 1},     /* the shared expert's gate: a column */
                                   {65, 200, 200, 200}, /* attention's output gate: a row */
                                   {3, 48, 61, 48},     /* rows of a wider buffer */
                                   {257, 33, 40, 1}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        int rows = sizes[i][0], n = sizes[i][1], gs = sizes[i][2], gc = sizes[i][3];
        size_t nx = (size_t)rows * n, ng = (size_t)rows * gs;
        float *x = xmalloc(nx * 4), *g = xmalloc(ng * 4), *ref = xmalloc(nx * 4);
        float *got = xmalloc(nx * 4);
        fill_uniform(x, nx, 2.0f, act);
        fill_uniform(g, ng, 4.0f, act);
        memcpy(ref, x, nx * 4);
        cpu->mul_sigmoid(cpu, ref, g, rows, n, gs, gc);
        void *dx = dev_from_f32(gpu, x, nx, act), *dg = dev_from_f32(gpu, g, ng, act);
        gpu->mul_sigmoid(gpu, dx, dg, rows, n, gs, gc);
        f32_from_dev(gpu, got, dx, nx, act);
        double err = rel_err(got, ref, nx);
        CHECK_MSG(err <= tol_for(act),
                  "mul_sigmoid rows %d n %d gate_stride %d gate_cols %d (%s): error %.3e over "
                  "%.1e",
                  rows, n, gs, gc, act_name(act), err, tol_for(act));
        gpu->free(gpu, dx);
        gpu->free(gpu, dg);
        free(x);
        free(g);
        free(ref);
        free(got);
    }
}

static void add_matches_cpu(void)
{
    static const int sizes[][2] = {{1, 5120}, {65, 33}, {257, 1000}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        int rows = sizes[i][0], n = sizes[i][1];
        size_t nx = (size_t)rows * n;
        float *x = xmalloc(nx * 4), *y = xmalloc(nx * 4), *ref = xmalloc(nx * 4);
        float *got = xmalloc(nx * 4);
        fill_uniform(x, nx, 2.0f, act);
        fill_uniform(y, nx, 2.0f, act);
        memcpy(ref, x, nx * 4);
        cpu->add(cpu, ref, y, rows, n);
        void *dx = dev_from_f32(gpu, x, nx, act), *dy = dev_from_f32(gpu, y, nx, act);
        gpu->add(gpu, dx, dy, rows, n);
        f32_from_dev(gpu, got, dx, nx, act);
        double err = rel_err(got, ref, nx);
        CHECK_MSG(err <= tol_for(act), "add rows %d n %d (%s): error %.3e over %.1e", rows, n,
                  act_name(act), err, tol_for(act));
        gpu->free(gpu, dx);
        gpu->free(gpu, dy);
        free(x);
        free(y);
        free(ref);
        free(got);
    }
}

int main(int argc, char **argv)
{
    cuda_test_start("test_cuda_deltanet", argc, argv);
    cpu = open_backend("cpu", SHOAL_DTYPE_INVALID);
    static const shoal_dtype acts[] = {SHOAL_DTYPE_BF16, SHOAL_DTYPE_F32};
    for (int a = 0; a < 2; a++) {
        act = acts[a];
        /* the recurrent rule first (bf16 activations take the chunked one
         * by default) */
        gpu = open_backend_with(test_gpu, act, "SHOAL_CUDA_DELTANET_CHUNK", "0");
        if (gpu->act_dtype != act) { /* a dry run: the CPU computes in f32 alone */
            kernels_backend_close(gpu);
            continue;
        }
        bool has_ops = gpu->deltanet_conv && gpu->deltanet_rule && gpu->rmsnorm_gated &&
                       gpu->mul_sigmoid && gpu->add;
        CHECK_MSG(has_ops, "the backend lacks the gated DeltaNet ops");
        if (!has_ops) {
            kernels_backend_close(gpu);
            continue;
        }
        printf("-- activations %s\n", act_name(act));
        TEST_RUN(conv_matches_cpu_at_run_edges);
        TEST_RUN(conv_planted_faults_fail);
        TEST_RUN(rule_matches_cpu_at_run_edges);
        TEST_RUN(rule_planted_faults_fail);
        if (!test_dry) {
            /* the same rule tests with the chunked form on */
            kernels_backend *recurrent = gpu;
            gpu = open_backend_with(test_gpu, act, "SHOAL_CUDA_DELTANET_CHUNK", "1");
            chunk = true;
            printf("-- activations %s, the chunked rule\n", act_name(act));
            TEST_RUN(rule_matches_cpu_at_run_edges);
            TEST_RUN(rule_planted_faults_fail);
            CHECK(gpu->sync(gpu) == SHOAL_OK);
            kernels_backend_close(gpu);
            chunk = false;
            gpu = recurrent;
        }
        TEST_RUN(rmsnorm_gated_matches_cpu);
        TEST_RUN(mul_sigmoid_matches_cpu);
        TEST_RUN(add_matches_cpu);
        CHECK(gpu->sync(gpu) == SHOAL_OK);
        kernels_backend_close(gpu);
    }
    kernels_backend_close(cpu);
    return TEST_EXIT();
}
