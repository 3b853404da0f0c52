/* The attention slicer, recorded: kernels_attention_slices() with a recorder
 * in place of the CUDA launches. Runs without a GPU. Proves that a round of
 * any length is covered by launches of at most the scratch's rows, every
 * row merged exactly once, each launch's query, output and row tables
 * shifted to its first row and the page table never shifted; and that each
 * planted slicing fault is caught. */
#include "kernels/kernels_attention_slices.h"
#include "tests/test.h"

#include <stdbool.h>
#include <stdint.h>

enum { ROWS_MAX = 4096, SLICES_MAX = 64, Q_ROW_BYTES = 96, OUT_ROW_BYTES = 80 };

static unsigned char q_buf[ROWS_MAX * Q_ROW_BYTES];
static unsigned char out_buf[ROWS_MAX * OUT_ROW_BYTES];
static int32_t row_stream[ROWS_MAX], positions[ROWS_MAX], page_table[ROWS_MAX];

typedef struct recording {
    int count;
    kernels_attn_slice slice[SLICES_MAX];
} recording;

static void record(void *ctx, const kernels_attn_slice *s)
{
    recording *rec = ctx;
    if (rec->count < SLICES_MAX)
        rec->slice[rec->count] = *s;
    rec->count++;
}

static kernels_attn_round round_of(int rows, int slice_rows, kernels_attn_fault fault)
{
    kernels_attn_round r = {
        .rows = rows,
        .slice_rows = slice_rows,
        .q = q_buf,
        .q_row_bytes = Q_ROW_BYTES,
        .out = out_buf,
        .out_row_bytes = OUT_ROW_BYTES,
        .row_stream = row_stream,
        .positions = positions,
        .page_table = page_table,
        .page_table_stride = 7,
        .fault = fault,
    };
    return r;
}

/* Everything a recording must satisfy; prints what is wrong unless quiet.
 * Returns true when the launches are right. */
static bool launches_right(const kernels_attn_round *r, const recording *rec, bool quiet)
{
    bool ok = true;
    int want = (r->rows + r->slice_rows - 1) / r->slice_rows;
#define EXPECT(cond, ...)                                                                        \
    do {                                                                                         \
        if (!(cond)) {                                                                           \
            if (!quiet) {                                                                        \
                fprintf(stderr, "  rows %d, slice %d: ", r->rows, r->slice_rows);                \
                fprintf(stderr, __VA_ARGS__);                                                    \
                fputc('\n', stderr);                                                             \
            }                                                                                    \
            ok = false;                                                                          \
        }                                                                                        \
    } while (0)
    EXPECT(rec->count == want, "%d launches, want one per started slice (%d)", rec->count, want);
    static unsigned char merged[ROWS_MAX];
    memset(merged, 0, sizeof merged);
    int next = 0;
    for (int i = 0; i < rec->count && i < SLICES_MAX; i++) {
        const kernels_attn_slice *s = &rec->slice[i];
        EXPECT(s->rows >= 1 && s->rows <= r->slice_rows, "launch %d covers %d rows", i, s->rows);
        EXPECT(s->row0 == next, "launch %d starts at row %d, want %d", i, s->row0, next);
        EXPECT((const unsigned char *)s->q == q_buf + (size_t)s->row0 * Q_ROW_BYTES,
               "launch %d: query not at its first row", i);
        EXPECT((unsigned char *)s->out == out_buf + (size_t)s->row0 * OUT_ROW_BYTES,
               "launch %d: output not at its first row", i);
        EXPECT(s->row_stream == row_stream + s->row0, "launch %d: row_stream not at row %d", i,
               s->row0);
        EXPECT(s->positions == positions + s->row0, "launch %d: positions not at row %d", i,
               s->row0);
        EXPECT(s->page_table == page_table, "launch %d: page table moved", i);
        for (int j = 0; j < s->rows && s->row0 + j < ROWS_MAX && s->row0 + j >= 0; j++)
            merged[s->row0 + j]++;
        next = s->row0 + s->rows;
    }
    for (int row = 0; row < r->rows; row++)
        EXPECT(merged[row] == 1, "row %d merged %d times", row, merged[row]);
#undef EXPECT
    return ok;
}

static void a_257_row_round_is_three_pairs_of_128_128_and_1(void)
{
    kernels_attn_round r = round_of(257, KERNELS_ATTN_SLICE_ROWS, KERNELS_ATTN_FAULT_NONE);
    recording rec = {0};
    int n = kernels_attention_slices(&r, record, &rec);
    CHECK_EQ_INT(n, 3);
    CHECK_EQ_INT(rec.count, 3);
    CHECK_EQ_INT(KERNELS_ATTN_SLICE_ROWS, 128);
    int rows[3] = {128, 128, 1}, at[3] = {0, 128, 256};
    for (int i = 0; i < 3 && i < rec.count; i++) {
        CHECK_EQ_INT(rec.slice[i].rows, rows[i]);
        CHECK_EQ_INT(rec.slice[i].row0, at[i]);
    }
    CHECK(launches_right(&r, &rec, false));
}

static void every_length_takes_one_pair_per_started_slice_and_merges_each_row_once(void)
{
    static const int lengths[] = {1, 127, 128, 129, 255, 256, 257, 1000, 4095, 4096};
    static const int slices[] = {KERNELS_ATTN_SLICE_ROWS, 1, 7, 4096};
    for (size_t s = 0; s < sizeof slices / sizeof slices[0]; s++) {
        for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; i++) {
            if ((lengths[i] + slices[s] - 1) / slices[s] > SLICES_MAX)
                continue;
            kernels_attn_round r = round_of(lengths[i], slices[s], KERNELS_ATTN_FAULT_NONE);
            recording rec = {0};
            int n = kernels_attention_slices(&r, record, &rec);
            CHECK_EQ_INT(n, rec.count);
            CHECK(launches_right(&r, &rec, false));
        }
    }
}

static void an_empty_round_launches_nothing(void)
{
    kernels_attn_round r = round_of(0, KERNELS_ATTN_SLICE_ROWS, KERNELS_ATTN_FAULT_NONE);
    recording rec = {0};
    CHECK_EQ_INT(kernels_attention_slices(&r, record, &rec), 0);
    CHECK_EQ_INT(rec.count, 0);
}

/* The checker above must be able to fail: each planted fault turns it red
 * wherever a round has more than one slice, and only there. */
static void each_planted_fault_turns_the_check_red(void)
{
    static const kernels_attn_fault faults[] = {
        KERNELS_ATTN_FAULT_ROW_TABLES_AT_ROW_0,
        KERNELS_ATTN_FAULT_POSITIONS_AT_ROW_0,
        KERNELS_ATTN_FAULT_ROW_STREAM_AT_ROW_0,
        KERNELS_ATTN_FAULT_PAGE_TABLE_SHIFTED,
    };
    for (size_t f = 0; f < sizeof faults / sizeof faults[0]; f++) {
        kernels_attn_round r = round_of(257, KERNELS_ATTN_SLICE_ROWS, faults[f]);
        recording rec = {0};
        kernels_attention_slices(&r, record, &rec);
        CHECK_MSG(!launches_right(&r, &rec, true), "fault %d went unnoticed", (int)faults[f]);
        /* one slice starts at row 0: nothing to shift, nothing to see */
        kernels_attn_round one = round_of(128, KERNELS_ATTN_SLICE_ROWS, faults[f]);
        recording rec1 = {0};
        kernels_attention_slices(&one, record, &rec1);
        CHECK(launches_right(&one, &rec1, false));
    }
}

int main(void)
{
    TEST_RUN(a_257_row_round_is_three_pairs_of_128_128_and_1);
    TEST_RUN(every_length_takes_one_pair_per_started_slice_and_merges_each_row_once);
    TEST_RUN(an_empty_round_launches_nothing);
    TEST_RUN(each_planted_fault_turns_the_check_red);
    return TEST_EXIT();
}
