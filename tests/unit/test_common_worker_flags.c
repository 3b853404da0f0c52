/* The table of the worker flags that shoal-coordinator passes on
 * (common_worker_flags.h): each integer flag takes its range's edges and
 * refuses one past them, a word flag only its words, --spill-gib sizes in
 * (0, 65536] GiB, the learning flags only together, and what is given
 * comes back through common_worker_args_argv and getopt_long as it went
 * in. The ranges below are the worker's limits (common_limits.h), written
 * here again on purpose: a bound changed in the table turns this red. */
#include "common/common_limits.h"
#include "common/common_worker_flags.h"
#include "tests/test.h"

#include <getopt.h>
#include <stdio.h>

/* The ranges each integer flag must take, from the worker's limits. */
static const struct {
    common_worker_flag_id id;
    long long lo, hi;
} int_ranges[] = {
    {COMMON_WORKER_FLAG_THREADS, 0, SHOAL_CPU_THREADS_MAX},
    {COMMON_WORKER_FLAG_PAGE_TOKENS, SHOAL_PAGE_TOKENS_MIN, SHOAL_PAGE_TOKENS_MAX},
    {COMMON_WORKER_FLAG_MAX_BATCH_TOKENS, 1, SHOAL_BATCH_ROWS_MAX},
    {COMMON_WORKER_FLAG_PARALLEL, 1, SHOAL_BATCH_STREAMS_MAX},
    {COMMON_WORKER_FLAG_KV_PAGES, 1, 1 << 24},
    {COMMON_WORKER_FLAG_STATE_CHECKPOINTS, 0, SHOAL_STATE_SLOTS_MAX},
    {COMMON_WORKER_FLAG_CHECKPOINT_INTERVAL, 0, SHOAL_CONTEXT_TOKENS_MAX},
    {COMMON_WORKER_FLAG_MAX_MODEL_LEN, 2, SHOAL_CONTEXT_TOKENS_MAX},
    {COMMON_WORKER_FLAG_HEARTBEAT_MS, 10, 60000},
    {COMMON_WORKER_FLAG_STEP_TIMEOUT_S, 0, 86400},
};
enum { INT_RANGES = sizeof int_ranges / sizeof int_ranges[0] };

static common_worker_flag_id find_flag(const char *flag)
{
    for (int i = 0; i < COMMON_WORKER_FLAG_COUNT; i++)
        if (strcmp(common_worker_flags[i].flag, flag) == 0)
            return (common_worker_flag_id)i;
    return COMMON_WORKER_FLAG_COUNT;
}

/* Sets value and expects it refused with exactly `want`, a unchanged. */
static void expect_refused(common_worker_flag_id id, const char *value, const char *want)
{
    common_worker_args a = {0};
    shoal_diag diag = {{0}};
    CHECK_EQ_INT(common_worker_args_set(&a, id, value, &diag), SHOAL_ERR_INVALID);
    CHECK_MSG(strcmp(diag.msg, want) == 0, "'%s' is not '%s'", diag.msg, want);
    CHECK(!common_worker_args_has(&a, id));
}

static void expect_num(common_worker_flag_id id, const char *value, long long want)
{
    common_worker_args a = {0};
    shoal_diag diag = {{0}};
    CHECK_MSG(common_worker_args_set(&a, id, value, &diag) == SHOAL_OK, "%s '%s': %s",
              common_worker_flags[id].flag, value, diag.msg);
    CHECK(common_worker_args_has(&a, id));
    CHECK_EQ_INT(common_worker_args_num(&a, id, -7), want);
}

static void the_table_is_whole_and_each_flag_named_once(void)
{
    int ints = 0;
    for (int i = 0; i < COMMON_WORKER_FLAG_COUNT; i++) {
        const common_worker_flag *f = &common_worker_flags[i];
        CHECK_MSG(f->flag && strncmp(f->flag, "--", 2) == 0 && f->flag[2], "entry %d", i);
        if (!f->flag)
            continue;
        CHECK_MSG((int)find_flag(f->flag) == i, "%s is in the table twice", f->flag);
        CHECK_MSG(f->help && f->help[0], "%s has no help", f->flag);
        CHECK_MSG((f->arg == NULL) == (f->type == COMMON_WORKER_TYPE_SWITCH), "%s", f->flag);
        ints += f->type == COMMON_WORKER_TYPE_INT;
    }
    CHECK_EQ_INT(ints, INT_RANGES); /* every integer flag has its range below */
}

static void an_integer_flag_takes_its_edges_and_refuses_one_past_them(void)
{
    char value[32], want[160];
    for (int k = 0; k < INT_RANGES; k++) {
        common_worker_flag_id id = int_ranges[k].id;
        long long lo = int_ranges[k].lo, hi = int_ranges[k].hi;
        const char *flag = common_worker_flags[id].flag;
        CHECK_EQ_INT(common_worker_flags[id].type, COMMON_WORKER_TYPE_INT);
        snprintf(value, sizeof value, "%lld", lo);
        expect_num(id, value, lo);
        snprintf(value, sizeof value, "%lld", hi);
        expect_num(id, value, hi);
        const char *bad[] = {"lo-1", "hi+1", "x", "", "5x"};
        for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
            if (strcmp(bad[b], "lo-1") == 0)
                snprintf(value, sizeof value, "%lld", lo - 1);
            else if (strcmp(bad[b], "hi+1") == 0)
                snprintf(value, sizeof value, "%lld", hi + 1);
            else
                snprintf(value, sizeof value, "%s", bad[b]);
            snprintf(want, sizeof want, "%s '%s': expected an integer in [%lld, %lld]", flag, value,
                     lo, hi);
            expect_refused(id, value, want);
        }
    }
    /* the message the worker's users have always seen */
    expect_refused(COMMON_WORKER_FLAG_PAGE_TOKENS, "0",
                   "--page-tokens '0': expected an integer in [1, 256]");
}

/* shoal-worker maps each word flag's value to its own enum by the word's
 * index, so the words keep this order. */
static void a_word_flag_takes_its_words_in_their_order_and_no_other(void)
{
    static const struct {
        common_worker_flag_id id;
        const char *words[COMMON_WORKER_WORDS_MAX + 1];
        const char *expected; /* the refusal's end */
    } words[] = {
        {COMMON_WORKER_FLAG_LOAD_FORMAT, {"auto", "dummy"}, "auto or dummy"},
        {COMMON_WORKER_FLAG_KV_DTYPE, {"bf16", "fp8", "f32"}, "bf16, fp8 or f32"},
        {COMMON_WORKER_FLAG_RESTORE_MODE, {"overlap", "read"}, "overlap or read"},
        {COMMON_WORKER_FLAG_WARMUP, {"auto", "on", "off"}, "auto, on or off"},
    };
    int word_flags = 0;
    for (int i = 0; i < COMMON_WORKER_FLAG_COUNT; i++)
        word_flags += common_worker_flags[i].type == COMMON_WORKER_TYPE_WORD;
    CHECK_EQ_INT(word_flags, sizeof words / sizeof words[0]);
    for (size_t k = 0; k < sizeof words / sizeof words[0]; k++) {
        common_worker_flag_id id = words[k].id;
        CHECK_EQ_INT(common_worker_flags[id].type, COMMON_WORKER_TYPE_WORD);
        int n = 0;
        for (; words[k].words[n]; n++) {
            char value[16]; /* not the table's own string: the word comes back static */
            snprintf(value, sizeof value, "%s", words[k].words[n]);
            common_worker_args a = {0};
            CHECK(common_worker_args_set(&a, id, value, NULL) == SHOAL_OK);
            CHECK_EQ_INT(common_worker_args_num(&a, id, -1), n);
            CHECK(common_worker_args_text(&a, id) == common_worker_flags[id].words[n]);
        }
        CHECK_MSG(n == COMMON_WORKER_WORDS_MAX || !common_worker_flags[id].words[n],
                  "%s has more words than %d", common_worker_flags[id].flag, n);
        const char *bad[] = {"x", "", "AUTO", "bf16 "};
        for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
            char want[128];
            snprintf(want, sizeof want, "%s '%s': expected %s", common_worker_flags[id].flag,
                     bad[b], words[k].expected);
            expect_refused(id, bad[b], want);
        }
    }
}

static void spill_gib_takes_sizes_above_zero_up_to_its_most(void)
{
    const common_worker_flag_id id = COMMON_WORKER_FLAG_SPILL_GIB;
    char want[128];
    const char *bad[] = {"0", "-1", "65536.01", "65537", "abc", "", "1GiB"};
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        snprintf(want, sizeof want, "--spill-gib '%s': expected a number of GiB in (0, 65536]",
                 bad[b]);
        expect_refused(id, bad[b], want);
    }
    CHECK_EQ_INT(SHOAL_STORE_SPILL_BYTES_MAX >> 30, 65536);
    expect_num(id, "65536", 65536ll << 30);
    expect_num(id, "1", 1ll << 30);
    /* a fraction: bytes for the coordinator's check, the text as given
     * for the worker's argv */
    common_worker_args a = {0};
    char value[] = "0.5";
    CHECK(common_worker_args_set(&a, id, value, NULL) == SHOAL_OK);
    CHECK_EQ_INT(common_worker_args_num(&a, id, 0), 512ll << 20);
    CHECK(common_worker_args_text(&a, id) == value);
}

static void a_flag_not_given_reads_as_its_default(void)
{
    common_worker_args a = {0};
    CHECK(!common_worker_args_has(&a, COMMON_WORKER_FLAG_PARALLEL));
    CHECK_EQ_INT(common_worker_args_num(&a, COMMON_WORKER_FLAG_PARALLEL, 64), 64);
    CHECK(common_worker_args_text(&a, COMMON_WORKER_FLAG_STATE_DIR) == NULL);
    /* a flag given twice keeps its last value, as getopt's callers did */
    CHECK(common_worker_args_set(&a, COMMON_WORKER_FLAG_PARALLEL, "8", NULL) == SHOAL_OK);
    CHECK(common_worker_args_set(&a, COMMON_WORKER_FLAG_PARALLEL, "9", NULL) == SHOAL_OK);
    CHECK(common_worker_args_set(&a, COMMON_WORKER_FLAG_PARALLEL, "0", NULL) != SHOAL_OK);
    CHECK_EQ_INT(common_worker_args_num(&a, COMMON_WORKER_FLAG_PARALLEL, 64), 9);
}

/* Sets each "--flag" (then its value, unless a switch) of args into a. */
static void set_all(common_worker_args *a, const char *const *args)
{
    for (int i = 0; args[i]; i++) {
        common_worker_flag_id id = find_flag(args[i]);
        CHECK_MSG(id != COMMON_WORKER_FLAG_COUNT, "%s", args[i]);
        if (id == COMMON_WORKER_FLAG_COUNT)
            return;
        bool sw = common_worker_flags[id].type == COMMON_WORKER_TYPE_SWITCH;
        CHECK(common_worker_args_set(a, id, sw ? NULL : args[i + 1], NULL) == SHOAL_OK);
        i += !sw;
    }
}

static shoal_err check_of(const char *const *args, shoal_diag *diag)
{
    common_worker_args a = {0};
    set_all(&a, args);
    return common_worker_args_check(&a, diag);
}

static void the_learning_flags_go_only_together(void)
{
    shoal_diag diag = {{0}};
    static const struct {
        const char *args[6];
        const char *refusal; /* NULL: taken */
    } cases[] = {
        {{NULL}, NULL},
        {{"--state-dir", "/s", NULL}, "--state-dir needs --learn-conversations"},
        {{"--spill-gib", "2", NULL}, "--spill-gib needs --learn-conversations"},
        {{"--restore-mode", "read", NULL}, "--restore-mode needs --learn-conversations"},
        {{"--learn-conversations", NULL},
         "--learn-conversations needs --state-dir DIR (where the states are kept)"},
        {{"--learn-conversations", "--spill-gib", "2", NULL},
         "--learn-conversations needs --state-dir DIR (where the states are kept)"},
        {{"--learn-conversations", "--state-dir", "/s", NULL}, NULL},
        {{"--learn-conversations", "--state-dir", "/s", "--restore-mode", "read", NULL}, NULL},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        shoal_diag_clear(&diag);
        shoal_err err = check_of(cases[k].args, &diag);
        if (!cases[k].refusal) {
            CHECK_MSG(err == SHOAL_OK, "case %zu: %s", k, diag.msg);
        } else {
            CHECK_EQ_INT(err, SHOAL_ERR_INVALID);
            CHECK_MSG(strcmp(diag.msg, cases[k].refusal) == 0, "case %zu: '%s'", k, diag.msg);
        }
    }
}

static void what_is_given_comes_back_through_argv_and_getopt(void)
{
    /* out of table order, a switch, a range's edges, a fraction, words, a path */
    static const char *const given[] = {
        "--warmup", "off",
        "--page-tokens", "32",
        "--learn-conversations",
        "--spill-gib", "0.5",
        "--checkpoint-interval", "0",
        "--state-dir", "/var/s",
        "--kv-dtype", "fp8",
        "--threads", "256",
        NULL,
    };
    common_worker_args a = {0};
    set_all(&a, given);
    char num[COMMON_WORKER_FLAG_COUNT][COMMON_WORKER_NUM_BYTES];
    const char *argv[1 + COMMON_WORKER_ARGV_MAX + 1] = {"shoal-worker"};
    int n = common_worker_args_argv(&a, num, argv + 1);
    CHECK_EQ_INT(n, 15);
    argv[1 + n] = NULL;
    /* in table order, numbers formatted back */
    static const char *const want[] = {
        "--threads", "256",
        "--page-tokens", "32",
        "--kv-dtype", "fp8",
        "--checkpoint-interval", "0",
        "--learn-conversations",
        "--state-dir", "/var/s",
        "--spill-gib", "0.5",
        "--warmup", "off",
    };
    for (int i = 0; i < n && i < 15; i++)
        CHECK_MSG(strcmp(argv[1 + i], want[i]) == 0, "argv[%d] '%s', not '%s'", i, argv[1 + i],
                  want[i]);
    /* and parsed the way both programs parse */
    struct option opts[COMMON_WORKER_FLAG_COUNT + 1];
    common_worker_flags_getopt(opts, 100);
    CHECK(opts[COMMON_WORKER_FLAG_COUNT].name == NULL);
    common_worker_args b = {0};
    optind = 0; /* glibc: start over */
    int c;
    while ((c = getopt_long(1 + n, (char **)argv, "", opts, NULL)) != -1) {
        CHECK_MSG(c >= 100 && c < 100 + COMMON_WORKER_FLAG_COUNT, "getopt_long gave %d", c);
        if (c < 100 || c >= 100 + COMMON_WORKER_FLAG_COUNT)
            break;
        CHECK(common_worker_args_set(&b, c - 100, optarg, NULL) == SHOAL_OK);
    }
    CHECK_EQ_INT(optind, 1 + n);
    for (int i = 0; i < COMMON_WORKER_FLAG_COUNT; i++) {
        CHECK_MSG(a.given[i] == b.given[i], "%s", common_worker_flags[i].flag);
        CHECK_MSG(a.num[i] == b.num[i], "%s: %lld, then %lld", common_worker_flags[i].flag,
                  a.num[i], b.num[i]);
        CHECK_MSG((a.text[i] == NULL) == (b.text[i] == NULL) &&
                      (!a.text[i] || strcmp(a.text[i], b.text[i]) == 0),
                  "%s", common_worker_flags[i].flag);
    }
    common_worker_args none = {0};
    CHECK_EQ_INT(common_worker_args_argv(&none, num, argv), 0);
}

/* --help names every flag, each at a line's start, in 80 columns. */
static void the_usage_lists_every_flag_in_80_columns(void)
{
    char *text = NULL;
    size_t bytes = 0;
    FILE *f = open_memstream(&text, &bytes);
    CHECK(f != NULL);
    if (!f)
        return;
    common_worker_flags_usage(f, 26);
    fclose(f);
    int lines = 0;
    for (const char *p = text; *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        CHECK_MSG(len <= 80, "%zu columns: %.*s", len, (int)len, p);
        lines++;
        p += len + (nl != NULL);
    }
    for (int i = 0; i < COMMON_WORKER_FLAG_COUNT; i++) {
        char head[64];
        snprintf(head, sizeof head, "\n  %s ", common_worker_flags[i].flag);
        CHECK_MSG(i == 0 ? strncmp(text, head + 1, strlen(head + 1)) == 0
                         : strstr(text, head) != NULL,
                  "%s is not listed", common_worker_flags[i].flag);
        for (const char *h = common_worker_flags[i].help; h; h = strchr(h + 1, '\n'))
            lines--;
    }
    CHECK_EQ_INT(lines, 0); /* one line a help line, none lost or added */
    /* a help line starts at column 26, past a name that ends before it */
    CHECK(strstr(text, "\n  --parallel N            engine: streams") != NULL);
    CHECK(strstr(text, "\n  --checkpoint-interval N hybrid models") != NULL);
    free(text);
}

int main(void)
{
    TEST_RUN(the_table_is_whole_and_each_flag_named_once);
    TEST_RUN(an_integer_flag_takes_its_edges_and_refuses_one_past_them);
    TEST_RUN(a_word_flag_takes_its_words_in_their_order_and_no_other);
    TEST_RUN(spill_gib_takes_sizes_above_zero_up_to_its_most);
    TEST_RUN(a_flag_not_given_reads_as_its_default);
    TEST_RUN(the_learning_flags_go_only_together);
    TEST_RUN(what_is_given_comes_back_through_argv_and_getopt);
    TEST_RUN(the_usage_lists_every_flag_in_80_columns);
    return TEST_EXIT();
}
