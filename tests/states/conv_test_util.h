/* conv_test_util.h: the conversation the state tests run through a real
 * cluster, and its reference answers: each prompt alone in a fresh
 * in-process engine on the same model, which a restored turn must equal
 * token for token. */
#ifndef SHOAL_TESTS_CONV_TEST_UTIL_H
#define SHOAL_TESTS_CONV_TEST_UTIL_H

#include "coordinator/coordinator_cluster.h"
#include "store/store_record.h"
#include "tests/stream_test_util.h"
#include "worker/worker_model.h"

#include <stdbool.h>
#include <stdint.h>

enum {
    CU_PT = 16,       /* tokens of a page */
    CU_KV_PAGES = 24, /* the cluster's pool: a filler prompt takes all of it */
    CU_GEN = 20,      /* output tokens of a turn */
    CU_LEN_MAX = 400,
    CU_TURNS = 3,
};

/* The reference model and what the store knows it by. */
extern worker_model *cu_model;
extern common_hash cu_fingerprint;
extern store_page_layout cu_layout;
extern size_t cu_state_bytes; /* hybrids' state slot; 0 otherwise */

/* conv[t] is turn t's prompt: the last prompt, its answer, a new message
 * (100, 30 and 25 tokens); answer[t] the reference's; filler[f] unrelated
 * prompts that take the whole pool. */
extern int32_t cu_conv[CU_TURNS][CU_LEN_MAX];
extern int cu_conv_len[CU_TURNS];
extern int32_t cu_answer[CU_TURNS][CU_GEN];
extern int32_t cu_filler[4][CU_KV_PAGES * CU_PT];

/* Opens the model of dir (exits when it cannot) and makes the
 * conversation from seed. */
void cu_open(const char *dir, uint64_t seed);
void cu_close(void);

/* The chain hashes of the first n blocks of tokens, as the engine makes them. */
void cu_chain(const int32_t *tokens, int n, common_hash *out);

/* Runs one greedy stream (ignore_eos) to its end; false on a timeout or an
 * error (said on stderr). */
bool cu_run(coordinator_cluster *c, const int32_t *prompt, int len, int max_tokens, ts_stream *r);

/* Options of a one-worker CPU cluster on model with the state store in
 * state_dir (spill limit 0.25 GiB), a pool of CU_KV_PAGES pages, 4 streams,
 * chunks of 256 tokens and generous timeouts (CI shares two cores). */
void cu_cluster_options(coordinator_cluster_options *o, const char *model, const char *worker_path,
                        const char *runtime_dir, const char *state_dir);

/* Turn t's prompt through c: whether it answered cu_answer[t] (false on
 * an error too); *cached gets the prompt tokens that came from the
 * caches (-1 on an error). */
bool cu_turn(coordinator_cluster *c, int t, int *cached);

/* Runs filler prompt f, which takes every page of the pool: what was
 * cached is evicted (and spilled). */
bool cu_evict_all(coordinator_cluster *c, int f);

/* Worker 0's load now, and after the report of its last step came. */
shm_load cu_load(coordinator_cluster *c);
shm_load cu_settled_load(coordinator_cluster *c);

#endif
