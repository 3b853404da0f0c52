#include "store_test_util.h"

#include "common/common_rng.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <lmdb.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

void tu_tempdir(char *buf, size_t bytes, const char *what)
{
    snprintf(buf, bytes, "/tmp/shoal-store-%s-XXXXXX", what);
    if (!mkdtemp(buf)) {
        perror("mkdtemp");
        abort();
    }
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

void tu_rmtree(const char *dir)
{
    nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

store_page_layout tu_layout(int layers, int kv_heads, int head_dim, int page_tokens)
{
    store_page_layout l = {
        .page_tokens = page_tokens,
        .layers = layers,
        .kv_heads = kv_heads,
        .head_dim = head_dim,
        .dtype = SHOAL_DTYPE_BF16,
    };
    l.page_bytes =
        (size_t)2 * (size_t)layers * (size_t)kv_heads * (size_t)page_tokens * (size_t)head_dim * 2;
    return l;
}

common_hash tu_hash(uint64_t seed, uint64_t i)
{
    uint8_t b[16];
    for (int k = 0; k < 8; k++) {
        b[k] = (uint8_t)(seed >> (8 * k));
        b[8 + k] = (uint8_t)(i >> (8 * k));
    }
    common_hash h;
    common_hash_bytes(b, sizeof b, &h);
    return h;
}

void tu_page(void *page, size_t bytes, uint64_t seed, uint64_t i)
{
    uint64_t st = seed * 0x9e3779b97f4a7c15ull ^ (i + 1);
    uint8_t *p = page;
    size_t k = 0;
    for (; k + 8 <= bytes; k += 8) {
        uint64_t r = common_rng_next(&st);
        memcpy(p + k, &r, 8);
    }
    for (; k < bytes; k++)
        p[k] = (uint8_t)common_rng_next(&st);
}

store_state_options tu_options(const char *dir, uint64_t spill_bytes, uint64_t fp_seed,
                               store_page_layout layout)
{
    store_state_options o = {
        .dir = dir,
        .spill_bytes = spill_bytes,
        .fingerprint = tu_hash(fp_seed, 0),
        .layout = layout,
    };
    return o;
}

/* ---- raw LMDB edits ---- */

typedef bool (*edit_fn)(uint8_t *value, size_t bytes, void *ctx);

/* Reads the record (fp, from), lets fn edit a copy and writes that under
 * (fp, to); false when the record is missing or fn refuses. */
static bool raw_edit_to(const char *dir, const common_hash *fp, const common_hash *from,
                        const common_hash *to, edit_fn fn, void *ctx)
{
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    bool done = false;
    if (mdb_env_create(&env) != 0)
        return false;
    mdb_env_set_maxdbs(env, 8);
    mdb_env_set_mapsize(env, (size_t)1 << 34);
    if (mdb_env_open(env, dir, 0, 0600) != 0)
        goto out_env;
    if (mdb_txn_begin(env, NULL, 0, &txn) != 0)
        goto out_env;
    if (mdb_dbi_open(txn, "records", 0, &dbi) != 0)
        goto out_txn;
    uint8_t key[STORE_KEY_BYTES];
    store_record_key(key, fp, from);
    MDB_val k = {sizeof key, key}, v;
    if (mdb_get(txn, dbi, &k, &v) != 0)
        goto out_txn;
    uint8_t *copy = malloc(v.mv_size);
    if (!copy)
        goto out_txn;
    memcpy(copy, v.mv_data, v.mv_size);
    MDB_val nv = {v.mv_size, copy};
    uint8_t to_key[STORE_KEY_BYTES];
    store_record_key(to_key, fp, to);
    MDB_val tk = {sizeof to_key, to_key};
    if (fn(copy, v.mv_size, ctx) && mdb_put(txn, dbi, &tk, &nv, 0) == 0)
        done = mdb_txn_commit(txn) == 0;
    else
        mdb_txn_abort(txn);
    free(copy);
    mdb_env_close(env);
    return done;
out_txn:
    mdb_txn_abort(txn);
out_env:
    mdb_env_close(env);
    return false;
}

static bool raw_edit(const char *dir, const common_hash *fp, const common_hash *hash, edit_fn fn,
                     void *ctx)
{
    return raw_edit_to(dir, fp, hash, hash, fn, ctx);
}

static bool flip(uint8_t *value, size_t bytes, void *ctx)
{
    size_t at = *(const size_t *)ctx;
    if (at >= bytes)
        return false;
    value[at] ^= 0x10;
    return true;
}

bool tu_flip_record_byte(const char *dir, const common_hash *fp, const common_hash *hash, size_t at)
{
    return raw_edit(dir, fp, hash, flip, &at);
}

/* Rewrites a header's fingerprint and block hash and re-seals it. */
typedef struct reseal_as {
    const common_hash *fp, *hash;
} reseal_as;

static bool reseal(uint8_t *value, size_t bytes, void *ctx)
{
    const reseal_as *as = ctx;
    store_record_info info;
    if (store_record_decode(value, bytes, &info, NULL) != SHOAL_OK)
        return false;
    store_record_encode(value, as->fp, as->hash, &info.parent,
                        &info.layout, info.tokens,
                        info.kind == STORE_RECORD_STATE_PART ? &info.part : NULL,
                        value + STORE_RECORD_HEADER_BYTES);
    return true;
}

bool tu_reseal_with_fingerprint(const char *dir, const common_hash *fp, const common_hash *hash,
                                const common_hash *other)
{
    reseal_as as = {other, hash};
    return raw_edit(dir, fp, hash, reseal, &as);
}

bool tu_reseal_copy(const char *dir, const common_hash *fp, const common_hash *from,
                    const common_hash *to)
{
    reseal_as as = {fp, to};
    return raw_edit_to(dir, fp, from, to, reseal, &as);
}

/* ---- holders ---- */

pid_t tu_spawn_holder(const char *self, const char *mode, const char *dir, int *stdin_fd)
{
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0)
        return -1;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    char *argv[] = {(char *)self, (char *)mode, (char *)dir, NULL};
    pid_t pid;
    int rc = posix_spawn(&pid, self, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(in[0]);
    close(out[1]);
    if (rc != 0) {
        close(in[1]);
        close(out[0]);
        return -1;
    }
    char c = 0;
    ssize_t n;
    do
        n = read(out[0], &c, 1);
    while (n < 0 && errno == EINTR);
    close(out[0]);
    if (n != 1 || c != 'R') {
        close(in[1]);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return -1;
    }
    *stdin_fd = in[1];
    return pid;
}

void tu_holder_main(int argc, char **argv)
{
    if (argc != 3 ||
        (strcmp(argv[1], "--hold-reader") != 0 && strcmp(argv[1], "--hold-writer") != 0))
        return;
    bool writer = strcmp(argv[1], "--hold-writer") == 0;
    MDB_env *env;
    MDB_txn *txn;
    if (mdb_env_create(&env) != 0 || mdb_env_set_maxdbs(env, 8) != 0 ||
        mdb_env_set_mapsize(env, (size_t)1 << 34) != 0 ||
        mdb_env_open(env, argv[2], MDB_NOTLS, 0600) != 0 ||
        mdb_txn_begin(env, NULL, writer ? 0 : MDB_RDONLY, &txn) != 0)
        _exit(3);
    if (write(1, "R", 1) != 1)
        _exit(4);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0)
        ;
    mdb_txn_abort(txn);
    mdb_env_close(env);
    _exit(0);
}

/* ---- shoalctl ---- */

int tu_shoalctl(char *out, size_t out_bytes, const char *const *args)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0)
        return -1;
    char *argv[32];
    int n = 0;
    argv[n++] = (char *)SHOALCTL_BIN;
    for (int i = 0; args[i] && n < 31; i++)
        argv[n++] = (char *)args[i];
    argv[n] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, p[1], 1);
    posix_spawn_file_actions_adddup2(&fa, p[1], 2);
    pid_t pid;
    int rc = posix_spawn(&pid, SHOALCTL_BIN, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(p[1]);
    if (rc != 0) {
        close(p[0]);
        return -1;
    }
    size_t used = 0;
    for (;;) {
        char tmp[4096];
        ssize_t got = read(p[0], tmp, sizeof tmp);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        size_t take = (size_t)got;
        if (used + take + 1 > out_bytes)
            take = out_bytes - used - 1;
        memcpy(out + used, tmp, take);
        used += take;
    }
    out[used] = '\0';
    close(p[0]);
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

double tu_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}
