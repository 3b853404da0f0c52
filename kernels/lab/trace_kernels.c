/* libshoal-lab-trace.so: every kernel a process runs on the GPU, with its
 * start and end on the GPU's clock, for a timeline of a decode step (where
 * no profiler is installed). A CUDA injection library: the driver loads it
 * at its start when the environment names it,
 *
 *   CUDA_INJECTION64_PATH=build/gpu/kernels/lab/libshoal-lab-trace.so \
 *   SHOAL_TRACE_OUT=trace.tsv shoal-model-bench --model ... --steps 8
 *
 * and it writes one line a kernel, kernels of graph replays included, when
 * the process exits: start and end in ns, the graph node (0: none), grid
 * and block sizes and the mangled name, tab-separated, in start order per
 * buffer. tools/bench/trace_step.py turns a file into a step's table of
 * kernels and the gaps between them. */
#include <cupti_activity.h>

#include <stdio.h>
#include <stdlib.h>

enum { TRACE_BUFFER_BYTES = 8 << 20 };

static FILE *trace_out;

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    *buffer = aligned_alloc(8, TRACE_BUFFER_BYTES);
    *size = *buffer ? TRACE_BUFFER_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer,
                                      size_t size, size_t valid)
{
    (void)ctx;
    (void)stream;
    (void)size;
    CUpti_Activity *rec = NULL;
    while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL &&
            rec->kind != CUPTI_ACTIVITY_KIND_KERNEL)
            continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
        fprintf(trace_out, "%llu\t%llu\t%llu\t%d,%d,%d\t%d\t%s\n", (unsigned long long)k->start,
                (unsigned long long)k->end, (unsigned long long)k->graphNodeId, k->gridX,
                k->gridY, k->gridZ, k->blockX, k->name ? k->name : "?");
    }
    free(buffer);
}

static void flush_at_exit(void)
{
    cuptiActivityFlushAll(1);
    fflush(trace_out);
}

int InitializeInjection(void);

int InitializeInjection(void)
{
    const char *path = getenv("SHOAL_TRACE_OUT");
    trace_out = path ? fopen(path, "w") : stderr;
    if (!trace_out) {
        perror(path);
        trace_out = stderr;
    }
    fprintf(trace_out, "start_ns\tend_ns\tgraph_node\tgrid\tblock\tkernel\n");
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "libshoal-lab-trace: CUPTI would not trace kernels\n");
        return 0;
    }
    atexit(flush_at_exit);
    return 1;
}
