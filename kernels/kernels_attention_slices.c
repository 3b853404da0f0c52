#include "kernels_attention_slices.h"

#include "common/common_assert.h"

int kernels_attention_slices(const kernels_attn_round *round, kernels_attn_launch_fn launch,
                             void *ctx)
{
    SHOAL_ASSERT(round->slice_rows > 0 && round->rows >= 0);
    kernels_attn_fault fault = round->fault;
    int slices = 0;
    for (int row0 = 0; row0 < round->rows; row0 += round->slice_rows) {
        int rows = round->rows - row0 < round->slice_rows ? round->rows - row0 : round->slice_rows;
        /* the row tables move with the rows; a planted fault holds them */
        int stream_at = fault == KERNELS_ATTN_FAULT_ROW_TABLES_AT_ROW_0 ||
                                fault == KERNELS_ATTN_FAULT_ROW_STREAM_AT_ROW_0
                            ? 0
                            : row0;
        int pos_at = fault == KERNELS_ATTN_FAULT_ROW_TABLES_AT_ROW_0 ||
                             fault == KERNELS_ATTN_FAULT_POSITIONS_AT_ROW_0
                         ? 0
                         : row0;
        kernels_attn_slice s = {
            .row0 = row0,
            .rows = rows,
            .q = (const unsigned char *)round->q + (size_t)row0 * round->q_row_bytes,
            .out = (unsigned char *)round->out + (size_t)row0 * round->out_row_bytes,
            .row_stream = round->row_stream + stream_at,
            .positions = round->positions + pos_at,
            /* indexed by stream, so it never moves */
            .page_table = fault == KERNELS_ATTN_FAULT_PAGE_TABLE_SHIFTED
                              ? round->page_table + row0
                              : round->page_table,
        };
        launch(ctx, &s);
        slices++;
    }
    return slices;
}
