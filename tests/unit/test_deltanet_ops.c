/* The CPU backend's gated DeltaNet ops (kernels/cpu/deltanet.c) against
 * plain double-precision loops written from kernels_backend.h's contract:
 * the conv with its window and the delta rule with its state, for several
 * streams in one batch whose slots are permuted, runs of 1 to 65 rows, conv
 * kernels of 2 to 4, one to three value heads a key head; a stream at
 * position 0 starts from zeros whatever its slot holds, one past it from
 * its slot; a run split over two calls equals the run in one. Then the
 * gated norm, mul_sigmoid and add. Planted faults turn it red: a missing
 * reset (the slot's garbage kept), the decay left out of the state, the
 * key head of h taken as h % k_heads. */
#include "common/common_rng.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/test.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

static uint64_t seed = 99;

static float uni(void)
{
    return (float)common_rng_uniform(&seed);
}

typedef struct shape {
    int k_heads, v_heads, k_dim, v_dim, conv;
} shape;

static int conv_dim(const shape *s)
{
    return 2 * s->k_heads * s->k_dim + s->v_heads * s->v_dim;
}

static size_t conv_floats(const shape *s)
{
    return (size_t)conv_dim(s) * (size_t)(s->conv - 1);
}

static size_t slot_floats(const shape *s)
{
    return conv_floats(s) + (size_t)s->v_heads * s->k_dim * s->v_dim;
}

/* The reference of one stream's rows [0, n) at positions p0..: conv then
 * rule, on a double copy of its state (conv window, then matrices). */
static void reference(const shape *s, const float *x_in, const float *b, const float *a,
                      const float *w, const float *decay, const float *dt_bias, int n, int p0,
                      double *state, double *out)
{
    int cd = conv_dim(s), hist = s->conv - 1, kd = s->k_heads * s->k_dim;
    if (p0 == 0)
        memset(state, 0, slot_floats(s) * sizeof *state);
    double *win = state, *S = state + conv_floats(s);
    double *xc = malloc((size_t)cd * sizeof *xc);
    for (int r = 0; r < n; r++) {
        const float *x = x_in + (size_t)r * cd;
        for (int c = 0; c < cd; c++) {
            double acc = w[(size_t)c * s->conv + hist] * (double)x[c];
            for (int j = 0; j < hist; j++)
                acc += w[(size_t)c * s->conv + j] * win[(size_t)c * hist + j];
            xc[c] = acc / (1.0 + exp(-acc));
            for (int j = 0; j + 1 < hist; j++)
                win[(size_t)c * hist + j] = win[(size_t)c * hist + j + 1];
            if (hist > 0)
                win[(size_t)c * hist + hist - 1] = x[c];
        }
        for (int h = 0; h < s->v_heads; h++) {
            int kh = h / (s->v_heads / s->k_heads);
            const double *q0 = xc + (size_t)kh * s->k_dim, *k0 = xc + kd + (size_t)kh * s->k_dim;
            const double *v = xc + 2 * kd + (size_t)h * s->v_dim;
            double qn = 0, kn = 0;
            for (int i = 0; i < s->k_dim; i++)
                qn += q0[i] * q0[i], kn += k0[i] * k0[i];
            qn = 1.0 / sqrt(qn + 1e-6) / sqrt((double)s->k_dim);
            kn = 1.0 / sqrt(kn + 1e-6);
            double beta = 1.0 / (1.0 + exp(-(double)b[(size_t)r * s->v_heads + h]));
            double sp = (double)a[(size_t)r * s->v_heads + h] + dt_bias[h];
            sp = sp > 20 ? sp : log1p(exp(sp));
            double g = exp(decay[h] * sp);
            double *Sh = S + (size_t)h * s->k_dim * s->v_dim;
            for (int c = 0; c < s->v_dim; c++) {
                double u = 0;
                for (int i = 0; i < s->k_dim; i++) {
                    Sh[(size_t)i * s->v_dim + c] *= g;
                    u += Sh[(size_t)i * s->v_dim + c] * k0[i] * kn;
                }
                u = beta * (v[c] - u);
                double o = 0;
                for (int i = 0; i < s->k_dim; i++) {
                    Sh[(size_t)i * s->v_dim + c] += k0[i] * kn * u;
                    o += Sh[(size_t)i * s->v_dim + c] * q0[i] * qn;
                }
                out[(size_t)r * s->v_heads * s->v_dim + (size_t)h * s->v_dim + c] = o;
            }
        }
    }
    free(xc);
}

/* Streams of lens[i] rows each (in one batch, slots permuted), from
 * positions p0s[i], through the CPU ops; compared with the reference.
 * `split` runs each stream's rows as two calls at split rows. */
static double run_case(kernels_backend *be, const shape *s, const int *lens, const int *p0s,
                       int streams, int split)
{
    int cd = conv_dim(s), nv = s->v_heads, vd = nv * s->v_dim, rows = 0;
    for (int i = 0; i < streams; i++)
        rows += lens[i];
    size_t slot = slot_floats(s), slot_bytes = slot * sizeof(float);
    float *x = malloc((size_t)rows * cd * 4), *b = malloc((size_t)rows * nv * 4);
    float *a = malloc((size_t)rows * nv * 4), *w = malloc((size_t)cd * s->conv * 4);
    float *conv = malloc((size_t)rows * cd * 4), *out = malloc((size_t)rows * vd * 4);
    float *states = malloc((size_t)streams * slot_bytes);
    double *ref_state = malloc((size_t)streams * slot * sizeof(double));
    double *ref_out = malloc((size_t)rows * vd * sizeof(double));
    float decay[64], dt_bias[64];
    for (int i = 0; i < rows * cd; i++)
        x[i] = 2.0f * uni();
    for (int i = 0; i < rows * nv; i++)
        b[i] = 4.0f * uni(), a[i] = 4.0f * uni();
    for (int i = 0; i < cd * s->conv; i++)
        w[i] = uni();
    for (int h = 0; h < nv; h++)
        decay[h] = -(0.1f + 0.9f * (uni() + 0.5f)), dt_bias[h] = uni();
    int32_t slots[16];
    for (int i = 0; i < streams; i++) {
        slots[i] = streams - 1 - i;
        /* what the slot holds before: garbage where the stream starts at 0,
         * a state to continue from otherwise (the reference's too) */
        float *st = states + (size_t)slots[i] * slot;
        for (size_t j = 0; j < slot; j++) {
            st[j] = p0s[i] == 0 ? 1e3f : 0.3f * uni();
            ref_state[(size_t)i * slot + j] = st[j];
        }
    }
    /* the reference, stream by stream */
    for (int i = 0, r0 = 0; i < streams; r0 += lens[i], i++)
        reference(s, x + (size_t)r0 * cd, b + (size_t)r0 * nv, a + (size_t)r0 * nv, w, decay,
                  dt_bias, lens[i], p0s[i], ref_state + (size_t)i * slot,
                  ref_out + (size_t)r0 * vd);
    /* the ops: the batch as a whole, or each stream's run cut at `split` */
    int parts = split > 0 ? 2 : 1;
    for (int part = 0; part < parts; part++) {
        int32_t pos[1024], rs[1024];
        int n = 0, map[1024];
        for (int i = 0, r0 = 0; i < streams; r0 += lens[i], i++) {
            int lo = parts == 1 ? 0 : part == 0 ? 0 : (split < lens[i] ? split : lens[i]);
            int hi = parts == 1 ? lens[i] : part == 0 ? (split < lens[i] ? split : lens[i])
                                                      : lens[i];
            for (int r = lo; r < hi; r++) {
                pos[n] = p0s[i] + r;
                rs[n] = i;
                map[n++] = r0 + r;
            }
        }
        if (n == 0)
            continue;
        float *xp = malloc((size_t)n * cd * 4), *bp = malloc((size_t)n * nv * 4);
        float *ap = malloc((size_t)n * nv * 4), *cp = malloc((size_t)n * cd * 4);
        float *op = malloc((size_t)n * vd * 4);
        for (int r = 0; r < n; r++) {
            memcpy(xp + (size_t)r * cd, x + (size_t)map[r] * cd, (size_t)cd * 4);
            memcpy(bp + (size_t)r * nv, b + (size_t)map[r] * nv, (size_t)nv * 4);
            memcpy(ap + (size_t)r * nv, a + (size_t)map[r] * nv, (size_t)nv * 4);
        }
        kernels_batch kb = {n, streams, 1, rs, pos, NULL, false};
        be->deltanet_conv(be, cp, xp, cd, w, cd, s->conv, states, slot_bytes, slots, &kb);
        be->deltanet_rule(be, op, cp, bp, ap, nv, decay, dt_bias, s->k_heads, nv, s->k_dim,
                          s->v_dim, states + conv_floats(s), slot_bytes, slots, &kb);
        for (int r = 0; r < n; r++) {
            memcpy(conv + (size_t)map[r] * cd, cp + (size_t)r * cd, (size_t)cd * 4);
            memcpy(out + (size_t)map[r] * vd, op + (size_t)r * vd, (size_t)vd * 4);
        }
        free(xp), free(bp), free(ap), free(cp), free(op);
    }
    /* errors relative to the largest magnitude of each array (F32 sums
     * against double ones; a value near zero carries its neighbours'
     * rounding) */
    double out_scale = 1e-30, state_scale = 1e-30, worst = 0;
    for (int i = 0; i < rows * vd; i++)
        out_scale = fmax(out_scale, fabs(ref_out[i]));
    for (size_t j = 0; j < (size_t)streams * slot; j++)
        state_scale = fmax(state_scale, fabs(ref_state[j]));
    for (int i = 0; i < rows * vd; i++)
        worst = fmax(worst, fabs(out[i] - ref_out[i]) / out_scale);
    for (int i = 0; i < streams; i++)
        for (size_t j = 0; j < slot; j++)
            worst = fmax(worst, fabs(states[(size_t)slots[i] * slot + j] -
                                     ref_state[(size_t)i * slot + j]) /
                                    state_scale);
    free(x), free(b), free(a), free(w), free(conv), free(out), free(states);
    free(ref_state), free(ref_out);
    return worst;
}

static void conv_and_rule_match_the_double_reference(void)
{
    kernels_backend *be = NULL;
    shoal_diag diag = {{0}};
    CHECK(cpu_backend_open(2, &be, &diag) == SHOAL_OK);
    if (!be)
        return;
    static const shape shapes[] = {
        {2, 4, 16, 24, 4}, {1, 3, 16, 16, 4}, {2, 2, 12, 20, 3}, {1, 1, 8, 8, 2}};
    static const struct {
        int streams;
        int lens[4], p0s[4];
        int split;
    } cases[] = {
        {1, {1}, {0}, 0},            /* one token from zeros */
        {1, {1}, {37}, 0},           /* one decode row from the slot */
        {1, {65}, {0}, 0},           /* past the 64-row chunk */
        {1, {65}, {0}, 30},          /* the same in two calls */
        {3, {7, 1, 64}, {0, 50, 3}, 0},
        {4, {2, 17, 1, 63}, {5, 0, 0, 9}, 5},
    };
    double worst = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            double e = run_case(be, &shapes[si], cases[ci].lens, cases[ci].p0s,
                                cases[ci].streams, cases[ci].split);
            CHECK_MSG(e < 1e-5, "shape %zu case %zu: error %.3e of the largest value", si, ci, e);
            worst = e > worst ? e : worst;
        }
    printf("  conv and rule: worst error %.2e of the largest value, outputs and states\n", worst);
    kernels_backend_close(be);
}

static void gated_norm_sigmoid_and_add_match(void)
{
    kernels_backend *be = NULL;
    shoal_diag diag = {{0}};
    CHECK(cpu_backend_open(2, &be, &diag) == SHOAL_OK);
    if (!be)
        return;
    enum { ROWS = 5, HEADS = 3, DIM = 20, N = HEADS * DIM };
    float x[ROWS * N], z[ROWS * N], w[DIM], out[ROWS * N], y[ROWS * N], g[ROWS * 2 * N];
    for (int i = 0; i < ROWS * N; i++)
        x[i] = uni(), z[i] = 3 * uni(), y[i] = uni();
    for (int i = 0; i < ROWS * 2 * N; i++)
        g[i] = 4 * uni();
    for (int i = 0; i < DIM; i++)
        w[i] = 1 + uni();
    be->rmsnorm_gated(be, out, x, z, w, ROWS, HEADS, DIM, 1e-6f);
    double worst = 0;
    for (int r = 0; r < ROWS * HEADS; r++) {
        double ss = 0;
        for (int i = 0; i < DIM; i++)
            ss += (double)x[r * DIM + i] * x[r * DIM + i];
        double inv = 1 / sqrt(ss / DIM + 1e-6);
        for (int i = 0; i < DIM; i++) {
            double zz = z[r * DIM + i], want = x[r * DIM + i] * inv * w[i] * zz / (1 + exp(-zz));
            worst = fmax(worst, fabs(out[r * DIM + i] - want) / (1e-6 + fabs(want)));
        }
    }
    /* mul_sigmoid: a gate per element (stride 2N, the first N), then one a row */
    float m[ROWS * N];
    memcpy(m, x, sizeof m);
    be->mul_sigmoid(be, m, g, ROWS, N, 2 * N, N);
    for (int r = 0; r < ROWS; r++)
        for (int i = 0; i < N; i++) {
            double want = x[r * N + i] / (1 + exp(-(double)g[r * 2 * N + i]));
            worst = fmax(worst, fabs(m[r * N + i] - want) / (1e-6 + fabs(want)));
        }
    memcpy(m, x, sizeof m);
    be->mul_sigmoid(be, m, g, ROWS, N, 3, 1);
    for (int r = 0; r < ROWS; r++)
        for (int i = 0; i < N; i++) {
            double want = x[r * N + i] / (1 + exp(-(double)g[r * 3]));
            worst = fmax(worst, fabs(m[r * N + i] - want) / (1e-6 + fabs(want)));
        }
    memcpy(m, x, sizeof m);
    be->add(be, m, y, ROWS, N);
    for (int i = 0; i < ROWS * N; i++)
        worst = fmax(worst, fabs(m[i] - ((double)x[i] + y[i])) / (1e-6 + fabs(x[i] + y[i])));
    printf("  gated norm, mul_sigmoid, add: worst relative error %.2e\n", worst);
    CHECK(worst < 1e-4);
    kernels_backend_close(be);
}

int main(void)
{
    TEST_RUN(conv_and_rule_match_the_double_reference);
    TEST_RUN(gated_norm_sigmoid_and_add_match);
    return TEST_EXIT();
}
