/* bench_text_encode: encode throughput of coordinator_tokenizer, one thread.
 *
 *   bench_text_encode <tokenizer.json> <text file> [chunk_bytes] [repeats]
 *
 * Cuts the text into chunks that end at the first newline at or after
 * chunk_bytes (default 65536: prompts, not one 8 MB string), encodes them
 * all, best of `repeats` passes (default 5), and prints MB/s (10^6 bytes),
 * the token count and an FNV-1a hash of all ids in order, which
 * tests/text/bench_hf_tokenizers.py prints too: equal hashes mean the same
 * tokens as HF tokenizers over the whole text. */
#include "common/common_file.h"
#include "coordinator/coordinator_tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s <tokenizer.json> <text file> [chunk_bytes] [repeats]\n",
                argv[0]);
        return 2;
    }
    size_t chunk = argc > 3 ? (size_t)strtoull(argv[3], NULL, 10) : 65536;
    int repeats = argc > 4 ? atoi(argv[4]) : 5;
    shoal_diag diag = {{0}};
    coordinator_tokenizer *tok = NULL;
    coordinator_tokenizer_work *work = NULL;
    char *text;
    size_t bytes;
    double t0 = now_s();
    if (coordinator_tokenizer_open(argv[1], &tok, &diag) != SHOAL_OK ||
        coordinator_tokenizer_work_open(tok, &work, &diag) != SHOAL_OK ||
        common_file_read(argv[2], 1u << 30, &text, &bytes, &diag) != SHOAL_OK) {
        fprintf(stderr, "%s\n", diag.msg);
        return 1;
    }
    double load_s = now_s() - t0;
    size_t cap = chunk * 2 + bytes / 4 + 1024;
    int32_t *ids = malloc(cap * sizeof *ids);
    double best = 1e30;
    size_t tokens = 0, chunks = 0;
    uint64_t hash = 0;
    for (int r = 0; r < repeats; r++) {
        tokens = chunks = 0;
        hash = 0xcbf29ce484222325ull;
        double start = now_s();
        for (size_t at = 0; at < bytes;) {
            size_t end = at + chunk < bytes ? at + chunk : bytes;
            while (end < bytes && text[end - 1] != '\n')
                end++;
            size_t n = 0;
            if (coordinator_tokenizer_encode(tok, work, text + at, end - at, 0, ids, cap, &n,
                                             &diag) != SHOAL_OK) {
                fprintf(stderr, "chunk at %zu: %s\n", at, diag.msg);
                return 1;
            }
            for (size_t i = 0; i < n; i++)
                hash = (hash ^ (uint32_t)ids[i]) * 0x100000001b3ull;
            tokens += n;
            chunks++;
            at = end;
        }
        double s = now_s() - start;
        if (s < best)
            best = s;
    }
    printf("shoal: %zu bytes in %zu chunks, %zu tokens, load %.2f s, best of %d: %.3f s, "
           "%.1f MB/s, %.2f M tokens/s, ids fnv %016llx\n",
           bytes, chunks, tokens, load_s, repeats, best, (double)bytes / best / 1e6,
           (double)tokens / best / 1e6, (unsigned long long)hash);
    free(ids);
    free(text);
    coordinator_tokenizer_work_close(work);
    coordinator_tokenizer_close(tok);
    return 0;
}
