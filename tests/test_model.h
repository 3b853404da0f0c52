/* test_model.h: the parity fixture a model test runs on.
 *
 * SHOAL_FIXTURES/parity/<name>, name being $SHOAL_TEST_MODEL or the test's
 * own default, and that model's vocabulary: CTest runs some engine and
 * cluster tests a second time over a Qwen3-MoE fixture this way. */
#ifndef SHOAL_TESTS_TEST_MODEL_H
#define SHOAL_TESTS_TEST_MODEL_H

#include "model/model_config.h"

#include <stdio.h>
#include <stdlib.h>

static char test_model_path[512];
static int test_model_vocab_size;

static inline const char *test_model_dir(const char *fallback)
{
    if (!test_model_path[0]) {
        const char *name = getenv("SHOAL_TEST_MODEL") ? getenv("SHOAL_TEST_MODEL") : fallback;
        snprintf(test_model_path, sizeof test_model_path, "%s/parity/%s", SHOAL_FIXTURES, name);
    }
    return test_model_path;
}

/* The vocabulary of test_model_dir's model (exits when its config.json
 * does not load: every test of the file needs it). */
static inline int test_model_vocab(const char *fallback)
{
    if (!test_model_vocab_size) {
        model_config cfg;
        shoal_diag diag = {{0}};
        if (model_config_load(test_model_dir(fallback), &cfg, &diag) != SHOAL_OK) {
            fprintf(stderr, "%s\n", diag.msg);
            exit(1);
        }
        test_model_vocab_size = cfg.vocab;
    }
    return test_model_vocab_size;
}

#endif
