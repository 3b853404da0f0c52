/* store_test_util.h: helpers of the state store tests: temporary stores
 * under /tmp, deterministic pages and hashes, raw LMDB edits that plant
 * faults, helper processes that hold LMDB transactions, running shoalctl. */
#ifndef SHOAL_TESTS_STORE_UTIL_H
#define SHOAL_TESTS_STORE_UTIL_H

#include "store/store_state.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* A fresh directory /tmp/shoal-store-<what>-XXXXXX (0700) in buf. */
void tu_tempdir(char *buf, size_t bytes, const char *what);

/* Removes dir and everything in it. */
void tu_rmtree(const char *dir);

/* A bf16 layout of these dimensions (page_bytes filled in). */
store_page_layout tu_layout(int layers, int kv_heads, int head_dim, int page_tokens);

/* Deterministic hashes and pages: the same (seed, i) gives the same bytes. */
common_hash tu_hash(uint64_t seed, uint64_t i);
void tu_page(void *page, size_t bytes, uint64_t seed, uint64_t i);

/* Options with fingerprint tu_hash(fp_seed, 0). */
store_state_options tu_options(const char *dir, uint64_t spill_bytes, uint64_t fp_seed,
                               store_page_layout layout);

/* Raw edits of a closed store (LMDB directly): flips one bit of the record
 * (fingerprint, hash) at byte offset `at` of its value; or rewrites its
 * header's fingerprint to other and re-seals the checksum, so only the
 * fingerprint is wrong. false if the record is missing. */
bool tu_flip_record_byte(const char *dir, const common_hash *fp, const common_hash *hash,
                         size_t at);
bool tu_reseal_with_fingerprint(const char *dir, const common_hash *fp, const common_hash *hash,
                                const common_hash *other);

/* Writes the record (fp, from) again under key (fp, to), its header's
 * block hash rewritten to `to` and re-sealed: a valid record in the wrong
 * place, that only what it says of itself (its parent, its part) can give
 * away. false if the record is missing. */
bool tu_reseal_copy(const char *dir, const common_hash *fp, const common_hash *from,
                    const common_hash *to);

/* Starts this test binary again as `self --hold-reader|--hold-writer DIR`:
 * a process that opens the environment with LMDB directly, begins a read
 * (or write) transaction, and then waits until its stdin closes or it is
 * killed. Returns when the transaction is open. *stdin_fd: close it to let
 * the helper end its transaction and exit. */
pid_t tu_spawn_holder(const char *self, const char *mode, const char *dir, int *stdin_fd);

/* The helper's side: call first in main; returns only when argv is not a
 * helper command line. */
void tu_holder_main(int argc, char **argv);

/* Runs shoalctl with args (NULL-terminated); returns its exit status and
 * puts its stdout and stderr, joined, into out (NUL-terminated). */
int tu_shoalctl(char *out, size_t out_bytes, const char *const *args);

/* Monotonic ms. */
double tu_now_ms(void);

#endif
