/* common_worker_flags.h: the shoal-worker flags that shoal-coordinator
 * takes and passes on to every worker it starts.
 *
 * One table says, for each such flag, its name, whether and what value it
 * takes, the value's range and the lines of --help. shoal-worker parses
 * and documents these flags from it; shoal-coordinator parses and
 * documents the same flags from it, checks them as the worker would (so a
 * bad value is said at once, before any worker starts) and passes on what
 * was given as given. The flags a coordinator sets for each worker itself
 * (--serve, --connect, --worker-index, --model, --device, --cluster) are
 * not here: they are not the user's to pass through.
 *
 * A common_worker_args holds the flags given: which, and each one's value.
 * Text values are borrowed (an argv string, a literal): the caller keeps
 * them alive as long as the args. Any thread, each with its own args. */
#ifndef SHOAL_COMMON_WORKER_FLAGS_H
#define SHOAL_COMMON_WORKER_FLAGS_H

#include "common/common_error.h"

#include <stdbool.h>
#include <stdio.h>

typedef enum common_worker_flag_id {
    COMMON_WORKER_FLAG_LOAD_FORMAT = 0,
    COMMON_WORKER_FLAG_THREADS,
    COMMON_WORKER_FLAG_PAGE_TOKENS,
    COMMON_WORKER_FLAG_MAX_BATCH_TOKENS,
    COMMON_WORKER_FLAG_PARALLEL,
    COMMON_WORKER_FLAG_KV_PAGES,
    COMMON_WORKER_FLAG_KV_DTYPE,
    COMMON_WORKER_FLAG_STATE_CHECKPOINTS,
    COMMON_WORKER_FLAG_CHECKPOINT_INTERVAL,
    COMMON_WORKER_FLAG_MAX_MODEL_LEN,
    COMMON_WORKER_FLAG_HEARTBEAT_MS,
    COMMON_WORKER_FLAG_STEP_TIMEOUT_S,
    COMMON_WORKER_FLAG_LEARN_CONVERSATIONS,
    COMMON_WORKER_FLAG_STATE_DIR,
    COMMON_WORKER_FLAG_SPILL_GIB,
    COMMON_WORKER_FLAG_RESTORE_MODE,
    COMMON_WORKER_FLAG_WARMUP,
    COMMON_WORKER_FLAG_COUNT
} common_worker_flag_id;

typedef enum common_worker_flag_type {
    COMMON_WORKER_TYPE_SWITCH = 0, /* no value */
    COMMON_WORKER_TYPE_INT,        /* an integer in [lo, hi] */
    COMMON_WORKER_TYPE_GIB,        /* a size in GiB in (0, hi] */
    COMMON_WORKER_TYPE_WORD,       /* one of words */
    COMMON_WORKER_TYPE_PATH,       /* any text (a directory) */
} common_worker_flag_type;

enum { COMMON_WORKER_WORDS_MAX = 3 };

typedef struct common_worker_flag {
    const char *flag; /* as written, "--page-tokens": argv and messages use it whole */
    const char *arg;  /* the value's name in --help ("N", "DIR"); NULL for a switch */
    common_worker_flag_type type;
    long long lo, hi; /* INT: the range; GIB: hi is the most GiB */
    /* WORD: the values allowed (NULL past the last); a program that maps
     * them to its own enum does so by their index here */
    const char *words[COMMON_WORKER_WORDS_MAX];
    const char *help; /* --help's lines for it, '\n' between them */
} common_worker_flag;

/* The table, indexed by common_worker_flag_id. */
extern const common_worker_flag common_worker_flags[COMMON_WORKER_FLAG_COUNT];

/* The flags given. Zeroed (= {0}): none given. */
typedef struct common_worker_args {
    bool given[COMMON_WORKER_FLAG_COUNT];
    const char *text[COMMON_WORKER_FLAG_COUNT]; /* PATH and GIB: as given; WORD: the word */
    long long num[COMMON_WORKER_FLAG_COUNT];    /* INT: the value; GIB: bytes; WORD: its index */
} common_worker_args;

/* Checks value (NULL for a switch; else not NULL) against flag id's type
 * and range and records it in a; a flag given twice keeps the last value.
 * SHOAL_ERR_INVALID on a bad value, a left unchanged, with diag naming the
 * flag and what it takes ("--page-tokens '0': expected an integer in [1,
 * 256]", "--warmup 'x': expected auto, on or off"). */
shoal_err common_worker_args_set(common_worker_args *a, common_worker_flag_id id, const char *value,
                                 shoal_diag *diag);

/* Whether flag id was given. */
bool common_worker_args_has(const common_worker_args *a, common_worker_flag_id id);

/* An INT flag's value, a GIB flag's bytes or a WORD flag's index in its
 * words; dflt when it was not given. */
long long common_worker_args_num(const common_worker_args *a, common_worker_flag_id id,
                                 long long dflt);

/* A PATH or GIB flag's text as given (borrowed), or a WORD flag's word
 * (static); NULL when it was not given. */
const char *common_worker_args_text(const common_worker_args *a, common_worker_flag_id id);

/* The checks between flags, the same in both programs: --state-dir,
 * --spill-gib and --restore-mode need --learn-conversations, which needs
 * --state-dir. SHOAL_ERR_INVALID with diag naming the flags. */
shoal_err common_worker_args_check(const common_worker_args *a, shoal_diag *diag);

enum {
    COMMON_WORKER_NUM_BYTES = 24, /* a long long in decimal, its sign and the NUL */
    COMMON_WORKER_ARGV_MAX = 2 * COMMON_WORKER_FLAG_COUNT,
};

/* Writes "--flag" and its value for every flag given into argv, in table
 * order, and returns how many it wrote (at most COMMON_WORKER_ARGV_MAX).
 * Numbers are formatted into num (one slot a flag); the strings in argv
 * are the table's, a's texts or num's, so they live as long as the
 * shortest of those. */
int common_worker_args_argv(const common_worker_args *a,
                            char num[COMMON_WORKER_FLAG_COUNT][COMMON_WORKER_NUM_BYTES],
                            const char *argv[COMMON_WORKER_ARGV_MAX]);

/* Writes each flag's --help lines to f: "  --flag ARG", then its help from
 * `column` on (one space past a longer name), its further lines indented
 * to `column`. */
void common_worker_flags_usage(FILE *f, int column);

struct option;

/* Fills out[0 .. COMMON_WORKER_FLAG_COUNT-1] with getopt_long entries for
 * the table, entry i returning val_base + i, and out[COMMON_WORKER_FLAG_COUNT]
 * with the zero entry that ends getopt_long's array. */
void common_worker_flags_getopt(struct option *out, int val_base);

#endif
