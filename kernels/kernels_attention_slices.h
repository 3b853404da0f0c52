/* kernels_attention_slices.h: cutting a round of attention rows into
 * launches that fit the partial scratch.
 *
 * Paged attention runs as split-K partials plus a merge (flash-decoding):
 * each row's context is cut into segments, each segment's softmax partial
 * (max, sum, weighted V) goes to scratch, and a merge combines them. The
 * scratch holds a fixed number of rows (KERNELS_ATTN_SLICE_ROWS), so a round
 * of more rows (a prompt chunk of 4,096 rows, a decode round of many
 * streams) goes in slices: each slice is one partial + merge pair on
 * pointers shifted to its first row. The query, the output and the per-row
 * tables (row_stream, positions) shift; the page table does not, since it is
 * indexed by stream, not by row.
 *
 * This file is the only place that does the cutting. A backend passes a
 * launch function; tests pass a recorder and check every launch. */
#ifndef SHOAL_KERNELS_ATTENTION_SLICES_H
#define SHOAL_KERNELS_ATTENTION_SLICES_H

#include <stddef.h>
#include <stdint.h>

/* Rows of partial scratch, and so the most rows one launch covers. 128 rows
 * keep a decode round of up to 128 streams, and a prompt chunk's rows 128 at
 * a time, in one launch each; the scratch stays a few MiB. */
#define KERNELS_ATTN_SLICE_ROWS 128

/* Planted faults, for tests that must see red. Never set outside tests. */
typedef enum kernels_attn_fault {
    KERNELS_ATTN_FAULT_NONE = 0,
    KERNELS_ATTN_FAULT_ROW_TABLES_AT_ROW_0, /* row_stream and positions not shifted */
    KERNELS_ATTN_FAULT_POSITIONS_AT_ROW_0,  /* positions alone not shifted */
    KERNELS_ATTN_FAULT_ROW_STREAM_AT_ROW_0, /* row_stream alone not shifted */
    KERNELS_ATTN_FAULT_PAGE_TABLE_SHIFTED,  /* the page table shifted like a row table */
    KERNELS_ATTN_FAULT_STALE_Q, /* CUDA's persistent prompt kernel: a block's first item's Q kept */
} kernels_attn_fault;

/* A whole round, as the attention op receives it. */
typedef struct kernels_attn_round {
    int rows;
    int slice_rows; /* the scratch's rows: at most this many per launch */
    const void *q;
    size_t q_row_bytes;
    void *out;
    size_t out_row_bytes;
    const int32_t *row_stream; /* [rows] */
    const int32_t *positions;  /* [rows] */
    const int32_t *page_table; /* [streams][stride], by stream */
    int page_table_stride;
    kernels_attn_fault fault;
} kernels_attn_round;

/* One partial + merge pair: rows [row0, row0 + rows) of the round, every
 * pointer already at row0 except page_table. */
typedef struct kernels_attn_slice {
    int row0;
    int rows;
    const void *q;
    void *out;
    const int32_t *row_stream;
    const int32_t *positions;
    const int32_t *page_table;
} kernels_attn_slice;

typedef void (*kernels_attn_launch_fn)(void *ctx, const kernels_attn_slice *slice);

/* Calls launch once per slice, in row order: ceil(rows / slice_rows)
 * slices, each full but the last. Returns the number of slices. Any thread;
 * no allocation. */
int kernels_attention_slices(const kernels_attn_round *round, kernels_attn_launch_fn launch,
                             void *ctx);

#endif
