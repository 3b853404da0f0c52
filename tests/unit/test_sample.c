/* The sample op's semantics (kernels_sample.h) on the CPU reference: greedy
 * and its ties, each penalty, each cut, temperature, the draw's
 * distribution, reproducibility per (seed, step) whatever the batch, and
 * the raw log-probabilities. The CUDA twin is held to these bits by
 * tests/cuda. */
#include "kernels/cpu/cpu_backend.h"
#include "tests/test.h"

#include <math.h>
#include <stdint.h>

static kernels_backend *be;

static kernels_sample_params params_default(void)
{
    kernels_sample_params p = {
        .temperature = 1.0f,
        .top_k = 0,
        .top_p = 1.0f,
        .min_p = 0.0f,
        .repetition_penalty = 1.0f,
        .seed = 1,
    };
    return p;
}

static kernels_sample_result sample1(const float *logits, int vocab,
                                     const kernels_sample_params *p, const int32_t *tokens,
                                     const int32_t *counts, int entries)
{
    kernels_sample_result r;
    memset(&r, 0xff, sizeof r);
    int32_t offsets[2] = {0, entries};
    be->sample(be, &r, logits, 1, vocab, p, entries ? offsets : NULL, entries ? tokens : NULL,
               entries ? counts : NULL);
    return r;
}

/* Frequencies of each token over `draws` steps. */
static void histogram(const float *logits, int vocab, kernels_sample_params p, int draws,
                      int *hist)
{
    memset(hist, 0, (size_t)vocab * sizeof *hist);
    for (int s = 0; s < draws; s++) {
        p.step = (uint64_t)s;
        kernels_sample_result r = sample1(logits, vocab, &p, NULL, NULL, 0);
        CHECK(r.token >= 0 && r.token < vocab);
        if (r.token >= 0 && r.token < vocab)
            hist[r.token]++;
    }
}

/* probabilities 0.5, 0.3, 0.15, 0.05 */
static void four_tokens(float *z)
{
    z[0] = logf(0.5f);
    z[1] = logf(0.3f);
    z[2] = logf(0.15f);
    z[3] = logf(0.05f);
}

static void greedy_takes_the_largest_logit_and_the_lowest_id_of_a_tie(void)
{
    float z[6] = {0.5f, 3.0f, -1.0f, 3.0f, 2.9f, -INFINITY};
    kernels_sample_params p = params_default();
    p.temperature = 0.0f;
    CHECK_EQ_INT(sample1(z, 6, &p, NULL, NULL, 0).token, 1);
    z[1] = 2.0f;
    CHECK_EQ_INT(sample1(z, 6, &p, NULL, NULL, 0).token, 3);
    float one = 7.0f;
    CHECK_EQ_INT(sample1(&one, 1, &p, NULL, NULL, 0).token, 0);
}

static void repetition_penalty_divides_positive_and_multiplies_negative_logits(void)
{
    kernels_sample_params p = params_default();
    p.temperature = 0.0f;
    p.repetition_penalty = 1.2f;
    float z[3] = {2.0f, 1.9f, -1.0f};
    int32_t tok[1] = {0}, cnt[1] = {0}; /* prompt-only: repetition still applies */
    CHECK_EQ_INT(sample1(z, 3, &p, tok, cnt, 1).token, 1); /* 2 / 1.2 < 1.9 */
    float y[3] = {-1.0f, -1.1f, -5.0f};
    CHECK_EQ_INT(sample1(y, 3, &p, tok, cnt, 1).token, 1); /* -1 * 1.2 < -1.1 */
    p.repetition_penalty = 1.0f;
    CHECK_EQ_INT(sample1(z, 3, &p, tok, cnt, 1).token, 0);
}

static void presence_and_frequency_subtract_by_output_count(void)
{
    kernels_sample_params p = params_default();
    p.temperature = 0.0f;
    float z[3] = {2.0f, 1.25f, 1.15f};
    int32_t tok[2] = {0, 2}, cnt[2] = {3, 0};
    p.frequency_penalty = 0.1f; /* 2 - 0.3 = 1.7: still first */
    CHECK_EQ_INT(sample1(z, 3, &p, tok, cnt, 2).token, 0);
    p.presence_penalty = 0.5f; /* 2 - (0.5 + 0.3) = 1.2 < 1.25; token 2 has count 0 */
    CHECK_EQ_INT(sample1(z, 3, &p, tok, cnt, 2).token, 1);
    p.presence_penalty = -1.0f; /* negative penalties reward */
    p.frequency_penalty = 0.0f;
    float w[3] = {0.0f, 0.5f, 0.9f};
    int32_t tok1[1] = {0}, cnt1[1] = {1};
    CHECK_EQ_INT(sample1(w, 3, &p, tok1, cnt1, 1).token, 0);
}

static void the_reported_logprob_is_of_the_raw_logits(void)
{
    float z[4];
    four_tokens(z);
    kernels_sample_params p = params_default();
    p.temperature = 0.0f;
    p.repetition_penalty = 100.0f;
    int32_t tok[1] = {0}, cnt[1] = {5};
    kernels_sample_result r = sample1(z, 4, &p, tok, cnt, 1);
    CHECK_EQ_INT(r.token, 1);
    CHECK_MSG(fabsf(r.logprob - logf(0.3f)) < 1e-6f, "logprob %f", r.logprob);
}

static void top_k_top_p_and_min_p_keep_the_documented_sets(void)
{
    float z[4];
    four_tokens(z);
    int hist[4];
    kernels_sample_params p = params_default();
    enum { DRAWS = 4000 };
    p.top_k = 2;
    histogram(z, 4, p, DRAWS, hist);
    CHECK(hist[2] == 0 && hist[3] == 0 && hist[0] > 0 && hist[1] > 0);
    p.top_k = 1;
    histogram(z, 4, p, 200, hist);
    CHECK_EQ_INT(hist[0], 200);
    p.top_k = 0;
    p.top_p = 0.7f; /* 0.5 < 0.7 <= 0.8: tokens 0 and 1 */
    histogram(z, 4, p, DRAWS, hist);
    CHECK(hist[2] == 0 && hist[3] == 0);
    CHECK_MSG(fabs(hist[0] / (double)DRAWS - 0.625) < 0.04, "token 0: %d of %d", hist[0], DRAWS);
    p.top_p = 0.84f; /* needs the third token */
    histogram(z, 4, p, DRAWS, hist);
    CHECK(hist[2] > 0 && hist[3] == 0);
    p.top_p = 0.0f; /* at least one token */
    histogram(z, 4, p, 200, hist);
    CHECK_EQ_INT(hist[0], 200);
    p.top_p = 1.0f;
    p.min_p = 0.25f; /* relative 1, 0.6, 0.3, 0.1: three kept */
    histogram(z, 4, p, DRAWS, hist);
    CHECK(hist[2] > 0 && hist[3] == 0);
    p.min_p = 0.0f;
    p.top_k = 3; /* top_p over the top-k mass: 0.5 / 0.95 < 0.6 < 0.8 / 0.95 */
    p.top_p = 0.6f;
    histogram(z, 4, p, DRAWS, hist);
    CHECK(hist[0] > 0 && hist[1] > 0 && hist[2] == 0 && hist[3] == 0);
}

static void draws_follow_the_tempered_distribution(void)
{
    float z[4];
    four_tokens(z);
    int hist[4];
    enum { DRAWS = 20000 };
    static const double want1[4] = {0.5, 0.3, 0.15, 0.05};
    /* temperature 0.5 squares the probabilities */
    double sq = 0.25 + 0.09 + 0.0225 + 0.0025;
    const double want05[4] = {0.25 / sq, 0.09 / sq, 0.0225 / sq, 0.0025 / sq};
    kernels_sample_params p = params_default();
    for (int t = 0; t < 2; t++) {
        p.temperature = t ? 0.5f : 1.0f;
        histogram(z, 4, p, DRAWS, hist);
        for (int i = 0; i < 4; i++) {
            double f = hist[i] / (double)DRAWS, w = t ? want05[i] : want1[i];
            /* five standard deviations of a binomial frequency */
            CHECK_MSG(fabs(f - w) < 5.0 * sqrt(w * (1 - w) / DRAWS) + 1e-3,
                      "temperature %.1f token %d: %.4f, want %.4f", p.temperature, i, f, w);
        }
    }
}

static void a_stream_samples_the_same_whatever_else_is_in_the_batch(void)
{
    enum { V = 1000, ROWS = 5 };
    static float z[ROWS * V];
    uint64_t seed = 99;
    for (int i = 0; i < ROWS * V; i++)
        z[i] = 3.0f * (float)((seed = seed * 6364136223846793005ull + 1442695040888963407ull) >>
                               40) / (float)(1 << 24);
    kernels_sample_params ps[ROWS];
    for (int r = 0; r < ROWS; r++) {
        ps[r] = params_default();
        ps[r].seed = 1000 + (uint64_t)r;
        ps[r].step = 7;
        ps[r].top_k = 50;
        ps[r].top_p = 0.9f;
    }
    kernels_sample_result batch[ROWS];
    be->sample(be, batch, z, ROWS, V, ps, NULL, NULL, NULL);
    for (int r = 0; r < ROWS; r++) {
        kernels_sample_result alone = sample1(z + (size_t)r * V, V, &ps[r], NULL, NULL, 0);
        CHECK_EQ_INT(alone.token, batch[r].token);
    }
    /* and the draw moves with the step and the seed */
    int differ = 0;
    for (int s = 0; s < 20; s++) {
        kernels_sample_params a = ps[0], b = ps[0];
        a.step = b.step = (uint64_t)s;
        b.seed++;
        differ += sample1(z, V, &a, NULL, NULL, 0).token != sample1(z, V, &b, NULL, NULL, 0).token;
    }
    CHECK_MSG(differ >= 10, "seed changed %d of 20 draws", differ);
}

static void top_logprobs_are_the_largest_raw_in_order_with_ties_by_id(void)
{
    float z[8] = {0.1f, 2.0f, 2.0f, -3.0f, 1.0f, 2.5f, 1.0f, 0.0f};
    kernels_sample_params p = params_default();
    p.temperature = 0.0f;
    p.logprobs = 5;
    double sum = 0;
    for (int i = 0; i < 8; i++)
        sum += exp((double)z[i]);
    kernels_sample_result r = sample1(z, 8, &p, NULL, NULL, 0);
    static const int want[5] = {5, 1, 2, 4, 6};
    for (int i = 0; i < 5; i++) {
        CHECK_EQ_INT(r.top_ids[i], want[i]);
        CHECK(fabs(r.top_logprobs[i] - (z[want[i]] - log(sum))) < 1e-6);
    }
    CHECK_EQ_INT(r.token, 5);
    p.logprobs = 20; /* more than the vocabulary: all of it */
    r = sample1(z, 8, &p, NULL, NULL, 0);
    CHECK_EQ_INT(r.top_ids[7], 3);
}

int main(void)
{
    shoal_diag diag;
    if (cpu_backend_open(2, &be, &diag)) {
        fprintf(stderr, "%s\n", diag.msg);
        return 1;
    }
    TEST_RUN(greedy_takes_the_largest_logit_and_the_lowest_id_of_a_tie);
    TEST_RUN(repetition_penalty_divides_positive_and_multiplies_negative_logits);
    TEST_RUN(presence_and_frequency_subtract_by_output_count);
    TEST_RUN(the_reported_logprob_is_of_the_raw_logits);
    TEST_RUN(top_k_top_p_and_min_p_keep_the_documented_sets);
    TEST_RUN(draws_follow_the_tempered_distribution);
    TEST_RUN(a_stream_samples_the_same_whatever_else_is_in_the_batch);
    TEST_RUN(top_logprobs_are_the_largest_raw_in_order_with_ties_by_id);
    kernels_backend_close(be);
    return TEST_EXIT();
}
