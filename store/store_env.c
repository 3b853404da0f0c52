#include "store_env.h"

#include "common/common_assert.h"
#include "common/common_file.h"
#include "common/common_limits.h"
#include "common/common_log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum {
    GATE_POLL_MS = 20,
    MAP_ALIGN_BYTES = 1 << 20, /* a multiple of every page size */
};

#define MAP_SLACK_BYTES (64ull << 20)

/* write_once's code for a fault in its transaction (not one of LMDB's) */
#define STORE_ENV_FAULTED (-31000)

struct store_env {
    MDB_env *env;
    store_index ix;
    int gate_fd;
    int direct_fd;      /* data.mdb opened O_DIRECT for reads; -1 where refused */
    ino_t data_ino;      /* data.mdb's, to find its map in /proc/self/maps */
    /* A read of the map faulted (store_guard.h): no transaction begins
     * again; where, in the map, and the signal */
    atomic_bool damaged;
    atomic_bool write_faulted; /* in a write transaction: LMDB left as it is */
    _Atomic uint64_t fault_at;
    atomic_int fault_sig;
    uintptr_t map_base; /* where LMDB mapped data.mdb (under resize); 0 unknown */
    pid_t pid;
    bool registered;
    dev_t dev;
    ino_t ino;
    /* Growing the map needs no transaction active in this process: every
     * transaction holds this shared, a growth holds it exclusive. */
    pthread_rwlock_t resize;
    bool resize_init;
    uint64_t map_bytes; /* under resize */
    uint64_t map_bytes_max;
    char dir[SHOAL_PATH_BYTES_MAX];
};

/* ---- the map's address ---- */

/* LMDB keeps the address of its map to itself (mdb_env_info's me_mapaddr
 * is only MDB_FIXEDMAP's request), and a direct read needs a value's offset
 * in the file, and a guard the map's range: the map of data.mdb is found in
 * /proc/self/maps, by inode and file offset 0, after every mapping (open,
 * and each map size change, under the resize lock). 0 when not found:
 * reads then copy from the map, and a fault in it is not caught. */
static void find_map_base(store_env *e)
{
    e->map_base = 0;
    if (e->data_ino == 0)
        return;
    FILE *f = fopen("/proc/self/maps", "re");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi, ino;
        unsigned long long off;
        if (sscanf(line, "%lx-%lx %*s %llx %*s %lu", &lo, &hi, &off, &ino) == 4 && off == 0 &&
            ino == (unsigned long)e->data_ino && hi - lo >= e->map_bytes) {
            e->map_base = lo;
            break;
        }
    }
    fclose(f);
}

/* ---- one handle per directory per process ---- */

static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    bool used;
    dev_t dev;
    ino_t ino;
} registry[SHOAL_STORE_OPEN_MAX];

static shoal_err registry_add(store_env *e, shoal_diag *diag)
{
    shoal_err err = SHOAL_OK;
    int free_slot = -1;
    pthread_mutex_lock(&registry_mu);
    for (int i = 0; i < SHOAL_STORE_OPEN_MAX; i++) {
        if (!registry[i].used) {
            if (free_slot < 0)
                free_slot = i;
        } else if (registry[i].dev == e->dev && registry[i].ino == e->ino) {
            err = shoal_diag_set(diag, SHOAL_ERR_INVALID,
                                 "%s: the state store is already open in this process (LMDB "
                                 "allows one handle per directory per process)",
                                 e->dir);
            goto out;
        }
    }
    if (free_slot < 0) {
        err = shoal_diag_set(diag, SHOAL_ERR_LIMIT,
                             "%s: %d state stores are open in this process "
                             "(SHOAL_STORE_OPEN_MAX)",
                             e->dir, SHOAL_STORE_OPEN_MAX);
        goto out;
    }
    registry[free_slot].used = true;
    registry[free_slot].dev = e->dev;
    registry[free_slot].ino = e->ino;
    e->registered = true;
out:
    pthread_mutex_unlock(&registry_mu);
    return err;
}

static void registry_remove(store_env *e)
{
    if (!e->registered)
        return;
    pthread_mutex_lock(&registry_mu);
    for (int i = 0; i < SHOAL_STORE_OPEN_MAX; i++)
        if (registry[i].used && registry[i].dev == e->dev && registry[i].ino == e->ino)
            registry[i].used = false;
    pthread_mutex_unlock(&registry_mu);
    e->registered = false;
}

/* ---- errors ---- */

/* What a fault's signal says of where the read went. */
static const char *fault_words(int sig)
{
    return sig == SIGBUS ? "past the file's end"
           : sig == SIGFPE ? "a division by zero"
                           : "an address outside the map";
}

/* Pushes g as the thread's guard of txn over e's map (store_guard.h). */
static void guard_push(const store_env *e, store_guard *g, const MDB_txn *txn)
{
    store_guard_push(g, e->map_base, e->map_base + e->map_bytes, txn);
}

/* A fault in a guarded transaction (store_guard.h): recorded once, said
 * once in the log; the handle begins no transaction after. */
static void mark_damaged(store_env *e, const store_guard *g)
{
    uint64_t none = 0;
    uint64_t at = g->lo && g->addr >= g->lo ? (uint64_t)(g->addr - g->lo) + 1 : 1;
    if (atomic_compare_exchange_strong(&e->fault_at, &none, at))
        atomic_store(&e->fault_sig, (int)g->sig);
    if (!atomic_exchange(&e->damaged, true))
        LOG_ERROR("%s/%s: a read of the store faulted at byte %llu of its map (%s): the file "
                  "is damaged; this process reads it no more (learned states are off). Stop "
                  "the workers and move %s aside: a new store starts empty",
                  e->dir, STORE_ENV_DATA_FILE, (unsigned long long)(at - 1), fault_words(g->sig),
                  e->dir);
}

static shoal_err damaged_error(const store_env *e, shoal_diag *diag)
{
    uint64_t at = atomic_load(&e->fault_at);
    return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                          "%s/%s is damaged: a read of it faulted at byte %llu of its map (%s); "
                          "stop the workers and move %s aside (a new store starts empty)",
                          e->dir, STORE_ENV_DATA_FILE, (unsigned long long)(at ? at - 1 : 0),
                          fault_words(atomic_load(&e->fault_sig)), e->dir);
}

shoal_err store_env_error(const store_env *e, int rc, const char *what, shoal_diag *diag)
{
    shoal_err err;
    switch (rc) {
    case 0:
        return SHOAL_OK;
    case STORE_ENV_FAULTED:
        return damaged_error(e, diag);
    case MDB_NOTFOUND:
        err = SHOAL_ERR_NOT_FOUND;
        break;
    case MDB_MAP_FULL:
    case MDB_READERS_FULL:
    case MDB_TXN_FULL:
    case MDB_DBS_FULL:
        err = SHOAL_ERR_LIMIT;
        break;
    case MDB_CORRUPTED:
    case MDB_PAGE_NOTFOUND:
    case MDB_INVALID:
    case MDB_VERSION_MISMATCH:
    case MDB_INCOMPATIBLE:
        err = SHOAL_ERR_FORMAT;
        break;
    case ENOMEM:
        err = SHOAL_ERR_NOMEM;
        break;
    default:
        err = SHOAL_ERR_IO;
        break;
    }
    /* what to do next, where the error says it */
    const char *hint = err == SHOAL_ERR_FORMAT && rc != MDB_VERSION_MISMATCH
                           ? " (the store is damaged: shoalctl states verify names what; "
                             "shoalctl states rm --all, or moving the directory aside, starts "
                             "an empty one)"
                       : rc == ENOSPC || rc == EIO || rc == EDQUOT
                           ? " (check the free space and health of its file system)"
                           : "";
    return shoal_diag_set(diag, err, "%s: %s: %s%s", e ? e->dir : "state store", what,
                          mdb_strerror(rc), hint);
}

/* ---- small file helpers ---- */

static uint64_t round_map(uint64_t bytes)
{
    return (bytes + MAP_ALIGN_BYTES - 1) / MAP_ALIGN_BYTES * MAP_ALIGN_BYTES;
}

static uint64_t file_bytes(const char *dir, const char *name)
{
    char path[SHOAL_PATH_BYTES_MAX];
    struct stat st;
    if (common_path_join(path, sizeof path, dir, name) != SHOAL_OK || stat(path, &st) != 0)
        return 0;
    return (uint64_t)st.st_size;
}

static void sync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Checks (and with create makes) the directory; fills dev and ino. */
static shoal_err check_dir(store_env *e, bool create, shoal_diag *diag)
{
    if (create && mkdir(e->dir, 0700) != 0 && errno != EEXIST)
        return shoal_diag_set(diag, SHOAL_ERR_IO,
                              "%s: cannot create the state directory: %s (create its parent, "
                              "or pick another --state-dir)",
                              e->dir, strerror(errno));
    struct stat st;
    if (stat(e->dir, &st) != 0)
        return shoal_diag_set(diag, errno == ENOENT ? SHOAL_ERR_NOT_FOUND : SHOAL_ERR_IO,
                              "%s: no state directory here (%s): check --state-dir", e->dir,
                              strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return shoal_diag_set(diag, SHOAL_ERR_INVALID, "%s: not a directory: check --state-dir",
                              e->dir);
    if (st.st_mode & 077)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "%s: the state directory is open to other users (mode %03o); "
                              "states are conversations: run chmod 700 %s",
                              e->dir, (unsigned)(st.st_mode & 0777), e->dir);
    e->dev = st.st_dev;
    e->ino = st.st_ino;
    if (!create && file_bytes(e->dir, STORE_ENV_DATA_FILE) == 0) {
        char path[SHOAL_PATH_BYTES_MAX];
        if (common_path_join(path, sizeof path, e->dir, STORE_ENV_DATA_FILE) != SHOAL_OK ||
            !common_file_exists(path))
            return shoal_diag_set(diag, SHOAL_ERR_NOT_FOUND,
                                  "%s: no state store here (no %s): check --state-dir, or "
                                  "start a worker with --learn-conversations --state-dir %s",
                                  e->dir, STORE_ENV_DATA_FILE, e->dir);
    }
    return SHOAL_OK;
}

/* Takes open.lock shared (or exclusive), waiting for a compaction. */
static shoal_err gate_take(const char *dir, int how, int wait_ms, int *fd_out, shoal_diag *diag)
{
    char path[SHOAL_PATH_BYTES_MAX];
    if (common_path_join(path, sizeof path, dir, STORE_ENV_GATE_FILE) != SHOAL_OK)
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT, "%s: path too long", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return shoal_diag_set(diag, SHOAL_ERR_IO, "%s: cannot open: %s (check its owner)", path,
                              strerror(errno));
    for (int waited = 0;; waited += GATE_POLL_MS) {
        if (flock(fd, how | LOCK_NB) == 0)
            break;
        if (errno != EWOULDBLOCK && errno != EINTR) {
            int saved = errno;
            close(fd);
            return shoal_diag_set(diag, SHOAL_ERR_IO, "%s: flock: %s", path, strerror(saved));
        }
        if (waited >= wait_ms) {
            close(fd);
            return shoal_diag_set(
                diag, how == LOCK_EX ? SHOAL_ERR_INVALID : SHOAL_ERR_TIMEOUT,
                how == LOCK_EX
                    ? "%s: the state store is in use by a running process (a worker or "
                      "shoalctl); stop it first"
                    : "%s: a compaction (shoalctl states compact) holds the state store; "
                      "wait for it to finish and start again",
                dir);
        }
        if (waited == 1000 && how == LOCK_SH) /* once: a start that waits says why */
            LOG_WARN("%s: waiting up to %d s for the holder of %s (a compaction, shoalctl "
                     "states compact) to finish",
                     dir, wait_ms / 1000, STORE_ENV_GATE_FILE);
        sleep_ms(GATE_POLL_MS);
    }
    *fd_out = fd;
    return SHOAL_OK;
}

/* ---- open and close ---- */

/* The databases of an existing store, in a guarded read transaction
 * (committed: the handles stay). MDB_NOTFOUND where one is missing, with
 * *entries the main database's (0: a new environment);
 * STORE_ENV_FAULTED where a read faulted. */
static int open_databases(store_env *e, uint32_t *format, size_t *entries)
{
    MDB_txn *txn;
    int rc = mdb_txn_begin(e->env, NULL, MDB_RDONLY, &txn);
    if (rc != 0)
        return rc;
    store_guard g;
    guard_push(e, &g, txn);
    if (sigsetjmp(g.jb, 1) != 0) {
        mdb_txn_abort(txn);
        mark_damaged(e, &g);
        return STORE_ENV_FAULTED;
    }
    g.armed = 1;
    rc = store_index_open(txn, false, &e->ix, format);
    MDB_dbi main_db;
    MDB_stat st;
    if (rc == MDB_NOTFOUND && mdb_dbi_open(txn, NULL, 0, &main_db) == 0 &&
        mdb_stat(txn, main_db, &st) == 0)
        *entries = st.ms_entries;
    store_guard_pop(txn);
    if (rc == 0)
        rc = mdb_txn_commit(txn);
    else
        mdb_txn_abort(txn);
    return rc;
}

static shoal_err env_open(const store_env_options *opt, bool take_gate, store_env **out,
                          shoal_diag *diag)
{
    *out = NULL;
    if (!opt->dir || !opt->dir[0])
        return shoal_diag_set(diag, SHOAL_ERR_INVALID, "no state directory given");
    if (strlen(opt->dir) + 16 >= SHOAL_PATH_BYTES_MAX)
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT,
                              "state directory path of %zu bytes passes "
                              "SHOAL_PATH_BYTES_MAX",
                              strlen(opt->dir));
    store_guard_install();
    store_env *e = calloc(1, sizeof *e);
    if (!e)
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM, "out of memory");
    e->gate_fd = -1;
    e->direct_fd = -1;
    e->pid = getpid();
    snprintf(e->dir, sizeof e->dir, "%s", opt->dir);
    shoal_err err;
    int rc;

    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    /* a growth must not starve behind a stream of reads */
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    rc = pthread_rwlock_init(&e->resize, &attr);
    pthread_rwlockattr_destroy(&attr);
    if (rc != 0) {
        err = shoal_diag_set(diag, SHOAL_ERR_NOMEM, "pthread_rwlock_init: %s", strerror(rc));
        goto fail;
    }
    e->resize_init = true;

    if ((err = check_dir(e, opt->create, diag)) != SHOAL_OK)
        goto fail;
    if ((err = registry_add(e, diag)) != SHOAL_OK)
        goto fail;
    if (take_gate &&
        (err = gate_take(e->dir, LOCK_SH, SHOAL_STORE_OPEN_WAIT_MS, &e->gate_fd, diag)) != SHOAL_OK)
        goto fail;

    e->map_bytes =
        opt->map_bytes ? opt->map_bytes : file_bytes(e->dir, STORE_ENV_DATA_FILE) + MAP_SLACK_BYTES;
    e->map_bytes = round_map(e->map_bytes);
    e->map_bytes_max = opt->map_bytes_max ? round_map(opt->map_bytes_max) : 4 * e->map_bytes;
    if (e->map_bytes_max < e->map_bytes)
        e->map_bytes_max = e->map_bytes;

    if ((rc = mdb_env_create(&e->env)) != 0) {
        err = store_env_error(e, rc, "mdb_env_create", diag);
        goto fail;
    }
    if ((rc = mdb_env_set_maxdbs(e->env, 8)) != 0 ||
        (rc = mdb_env_set_mapsize(e->env, (size_t)e->map_bytes)) != 0) {
        err = store_env_error(e, rc, "setting up the environment", diag);
        goto fail;
    }
    rc = mdb_env_open(e->env, e->dir,
                      MDB_NOTLS | MDB_NOMETASYNC | (opt->random_reads ? MDB_NORDAHEAD : 0), 0600);
    if (rc != 0) {
        err = store_env_error(e, rc, "opening the LMDB environment", diag);
        if (rc == EACCES)
            err = shoal_diag_set(diag, SHOAL_ERR_IO,
                                 "%s: %s or %s is not writable by this "
                                 "user: run as the store's owner",
                                 e->dir, STORE_ENV_DATA_FILE, STORE_ENV_LOCK_FILE);
        goto fail;
    }
    /* LMDB opens data.mdb without O_CLOEXEC: a program this process
     * execs (a worker the coordinator starts) must not inherit it. */
    int data_fd;
    if (mdb_env_get_fd(e->env, &data_fd) == 0)
        (void)fcntl(data_fd, F_SETFD, fcntl(data_fd, F_GETFD) | FD_CLOEXEC);
    /* A second descriptor for reads past the page cache (see
     * store_env_read_direct); a file system without O_DIRECT (tmpfs)
     * refuses it, and reads then copy from the map. */
    char data_path[SHOAL_PATH_BYTES_MAX];
    struct stat data_st;
    if (common_path_join(data_path, sizeof data_path, e->dir, STORE_ENV_DATA_FILE) == SHOAL_OK)
        e->direct_fd = open(data_path, O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (mdb_env_get_fd(e->env, &data_fd) == 0 && fstat(data_fd, &data_st) == 0)
        e->data_ino = data_st.st_ino;
    MDB_envinfo info;
    MDB_stat mst;
    bool have_info = mdb_env_info(e->env, &info) == 0;
    if (have_info && mdb_env_stat(e->env, &mst) == 0) {
        /* every page the last commit uses lies in the file: a file cut
         * short (a copy that stopped, a disk that filled) would fault
         * (SIGBUS) at the first read of a missing page */
        uint64_t need = ((uint64_t)info.me_last_pgno + 1) * mst.ms_psize;
        uint64_t have = file_bytes(e->dir, STORE_ENV_DATA_FILE);
        if (have < need) {
            err = shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                                 "%s/%s is %llu bytes, but the store's pages reach %llu: the "
                                 "file was cut short (a copy that stopped, a full disk); move "
                                 "the directory aside and a new store starts empty",
                                 e->dir, STORE_ENV_DATA_FILE, (unsigned long long)have,
                                 (unsigned long long)need);
            goto fail;
        }
    }
    if (have_info && info.me_mapsize > e->map_bytes)
        e->map_bytes = info.me_mapsize; /* another process grew it */
    find_map_base(e);

    int dead = 0;
    if ((rc = mdb_reader_check(e->env, &dead)) != 0) {
        err = store_env_error(e, rc, "mdb_reader_check", diag);
        goto fail;
    }
    if (dead > 0)
        LOG_INFO("%s: cleared %d reader slot(s) of dead processes", e->dir, dead);

    /* The databases, read first in a guarded read transaction (a damaged
     * file faults there, and a read transaction ends cleanly after a
     * fault: a write one may not), then created where the environment is
     * new (its main database empty). */
    uint32_t format = 0;
    size_t entries = 0;
    if ((rc = open_databases(e, &format, &entries)) == STORE_ENV_FAULTED) {
        err = damaged_error(e, diag);
        goto fail;
    }
    if (rc == MDB_NOTFOUND && opt->create && entries == 0) {
        MDB_txn *txn;
        if ((rc = mdb_txn_begin(e->env, NULL, 0, &txn)) != 0) {
            err = store_env_error(e, rc, "beginning a transaction", diag);
            goto fail;
        }
        rc = store_index_open(txn, true, &e->ix, &format);
        if (rc == 0)
            rc = mdb_txn_commit(txn); /* keeps the database handles */
        else
            mdb_txn_abort(txn);
    }
    if (rc == MDB_NOTFOUND) {
        err = shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                             "%s: an LMDB environment, but not a shoal state store (a "
                             "database is missing): check --state-dir",
                             e->dir);
        goto fail;
    }
    if (rc == MDB_INCOMPATIBLE) {
        err = shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                             "%s: state store format %u, this build reads %d: move the "
                             "directory away (or remove it) and let the workers start afresh",
                             e->dir, format, STORE_FORMAT_VERSION);
        goto fail;
    }
    if (rc != 0) {
        err = store_env_error(e, rc, "opening the databases", diag);
        goto fail;
    }
    *out = e;
    return SHOAL_OK;
fail:
    store_env_close(e);
    return err;
}

shoal_err store_env_open(const store_env_options *opt, store_env **out, shoal_diag *diag)
{
    return env_open(opt, true, out, diag);
}

void store_env_close(store_env *e)
{
    if (!e)
        return;
    if (!store_env_owned(e))
        return; /* a forked child: the parent's LMDB state is not ours to touch */
    if (e->env && !atomic_load(&e->write_faulted)) {
        if (!atomic_load(&e->damaged))
            (void)mdb_env_sync(e->env, 1); /* the last NOMETASYNC commit's meta page */
        mdb_env_close(e->env);
    } /* a fault in a write: LMDB's state is half-changed (write_once); left */
    if (e->gate_fd >= 0)
        close(e->gate_fd);
    if (e->direct_fd >= 0)
        close(e->direct_fd);
    registry_remove(e);
    if (e->resize_init)
        pthread_rwlock_destroy(&e->resize);
    free(e);
}

const store_index *store_env_index(const store_env *e)
{
    return &e->ix;
}

const char *store_env_dir(const store_env *e)
{
    return e->dir;
}

MDB_env *store_env_mdb(store_env *e)
{
    return e->env;
}

bool store_env_owned(const store_env *e)
{
    return e->pid == getpid();
}

uint64_t store_env_map_bytes(store_env *e)
{
    pthread_rwlock_rdlock(&e->resize);
    uint64_t m = e->map_bytes;
    pthread_rwlock_unlock(&e->resize);
    return m;
}

/* ---- transactions ---- */

/* Adopts the map size another process set (MDB_MAP_RESIZED). */
static int adopt_map(store_env *e)
{
    pthread_rwlock_wrlock(&e->resize);
    int rc = mdb_env_set_mapsize(e->env, 0);
    MDB_envinfo info;
    if (rc == 0 && mdb_env_info(e->env, &info) == 0)
        e->map_bytes = info.me_mapsize;
    find_map_base(e);
    pthread_rwlock_unlock(&e->resize);
    return rc;
}

static int grow_map(store_env *e, bool *grown)
{
    *grown = false;
    pthread_rwlock_wrlock(&e->resize);
    int rc = 0;
    if (e->map_bytes < e->map_bytes_max) {
        uint64_t want = e->map_bytes * 2 < e->map_bytes_max ? e->map_bytes * 2 : e->map_bytes_max;
        rc = mdb_env_set_mapsize(e->env, (size_t)want);
        if (rc == 0) {
            LOG_INFO("%s: map grown from %llu to %llu MiB", e->dir,
                     (unsigned long long)(e->map_bytes >> 20), (unsigned long long)(want >> 20));
            e->map_bytes = want;
            *grown = true;
            find_map_base(e);
        }
    }
    pthread_rwlock_unlock(&e->resize);
    return rc;
}

shoal_err store_env_read_begin(store_env *e, MDB_txn **txn, store_guard *g, shoal_diag *diag)
{
    if (atomic_load(&e->damaged))
        return damaged_error(e, diag);
    int rc = 0;
    for (int attempt = 0; attempt < 3; attempt++) {
        pthread_rwlock_rdlock(&e->resize);
        rc = mdb_txn_begin(e->env, NULL, MDB_RDONLY, txn);
        if (rc == 0) { /* the lock is held until read_end */
            guard_push(e, g, *txn);
            return SHOAL_OK;
        }
        pthread_rwlock_unlock(&e->resize);
        if (rc != MDB_MAP_RESIZED || (rc = adopt_map(e)) != 0)
            break;
    }
    return store_env_error(e, rc, "beginning a read transaction", diag);
}

void store_env_read_end(store_env *e, MDB_txn *txn)
{
    store_guard_pop(txn);
    mdb_txn_abort(txn);
    pthread_rwlock_unlock(&e->resize);
}

shoal_err store_env_read_fault(store_env *e, store_guard *g, shoal_diag *diag)
{
    store_guard_close_cursors(g);
    mdb_txn_abort((MDB_txn *)g->txn); /* a read transaction: gives its slot back */
    pthread_rwlock_unlock(&e->resize);
    mark_damaged(e, g);
    return damaged_error(e, diag);
}

bool store_env_can_read_direct(const store_env *e)
{
    return e->direct_fd >= 0;
}

ssize_t store_env_read_direct(store_env *e, const void *value, size_t bytes, void *buf,
                              size_t buf_bytes)
{
    uintptr_t v = (uintptr_t)value;
    if (e->direct_fd < 0 || e->map_base == 0 || v < e->map_base ||
        v - e->map_base + bytes > e->map_bytes ||
        ((uintptr_t)buf & (STORE_ENV_DIRECT_ALIGN - 1)) != 0)
        return -1;
    uint64_t at = v - e->map_base;
    uint64_t from = at / STORE_ENV_DIRECT_ALIGN * STORE_ENV_DIRECT_ALIGN;
    uint64_t to = (at + bytes + STORE_ENV_DIRECT_ALIGN - 1) / STORE_ENV_DIRECT_ALIGN *
                  STORE_ENV_DIRECT_ALIGN;
    if (to - from > buf_bytes)
        return -1;
    for (uint64_t done = 0; done < to - from;) {
        ssize_t k = pread(e->direct_fd, (uint8_t *)buf + done, (size_t)(to - from - done),
                          (off_t)(from + done));
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1; /* an error, or the file ends short of a value LMDB
                          maps: the caller copies from the map instead */
        done += (uint64_t)k;
    }
    return (ssize_t)(at - from);
}

/* One attempt: begin, fn, totals, commit. */
static int write_once(store_env *e, store_env_write_fn fn, void *ctx, int map_full_before,
                      store_env_write_report *rep)
{
    if (atomic_load(&e->damaged))
        return STORE_ENV_FAULTED;
    pthread_rwlock_rdlock(&e->resize);
    MDB_txn *txn;
    int rc = mdb_txn_begin(e->env, NULL, 0, &txn);
    if (rc != 0) {
        pthread_rwlock_unlock(&e->resize);
        return rc;
    }
    store_guard g;
    guard_push(e, &g, txn);
    if (sigsetjmp(g.jb, 1) != 0) {
        /* Not aborted: LMDB's write state is half-changed, and an abort
         * frees what it holds (heap corruption, seen). The transaction
         * and LMDB's write lock stay with this process until it exits
         * (other processes' writes wait: their writers queue and drop);
         * the handle begins nothing more, and close leaves LMDB alone. */
        pthread_rwlock_unlock(&e->resize);
        atomic_store(&e->write_faulted, true);
        mark_damaged(e, &g);
        return STORE_ENV_FAULTED;
    }
    g.armed = 1;
    store_wtx w;
    rc = store_wtx_begin(&w, txn, &e->ix);
    if (rc == 0) {
        rc = fn(ctx, &w);
        w.totals[STORE_TOTAL_MAP_FULL] += (uint64_t)map_full_before;
        if (rc == 0)
            rc = store_wtx_end(&w);
        else
            store_wtx_discard(&w);
    }
    if (rc == 0)
        rc = mdb_txn_commit(txn);
    else
        mdb_txn_abort(txn);
    store_guard_pop(txn);
    pthread_rwlock_unlock(&e->resize);
    if (rc == 0) {
        rep->evicted += w.evicted;
        rep->evicted_bytes += w.evicted_bytes;
    }
    return rc;
}

typedef struct room_ctx {
    uint64_t room_bytes;
} room_ctx;

static int make_room(void *ctx, store_wtx *w)
{
    const room_ctx *r = ctx;
    uint64_t bytes = w->totals[STORE_TOTAL_BYTES];
    uint64_t free_bytes = r->room_bytes > bytes / 8 ? r->room_bytes : bytes / 8;
    return store_wtx_evict(w, bytes > free_bytes ? bytes - free_bytes : 0);
}

shoal_err store_env_write(store_env *e, store_env_write_fn fn, void *ctx, uint64_t room_bytes,
                          store_env_write_report *rep, shoal_diag *diag)
{
    store_env_write_report r = {0};
    int rc = 0;
    for (int attempt = 0; attempt < SHOAL_STORE_MAP_FULL_RETRIES; attempt++) {
        rc = write_once(e, fn, ctx, r.map_full, &r);
        if (rc == 0)
            break;
        if (rc == MDB_MAP_RESIZED) {
            if ((rc = adopt_map(e)) != 0)
                break;
            continue;
        }
        if (rc != MDB_MAP_FULL)
            break;
        r.map_full++;
        /* dead readers pin old pages: free them first */
        int dead = 0;
        (void)mdb_reader_check(e->env, &dead);
        bool grown;
        if ((rc = grow_map(e, &grown)) != 0)
            break;
        if (grown) {
            r.grows++;
            continue;
        }
        /* At the maximum: evict in a transaction of its own. Pages it
         * frees are reused once a later commit has passed, which the
         * next attempts are. Its own MAP_FULL just uses up an attempt. */
        room_ctx room = {room_bytes};
        rc = write_once(e, make_room, &room, 0, &r);
        if (rc != 0 && rc != MDB_MAP_FULL)
            break;
        rc = MDB_MAP_FULL;
    }
    if (rep)
        *rep = r;
    if (rc == MDB_MAP_FULL)
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT,
                              "%s: the LMDB map (%llu MiB) stayed full after %d attempts of "
                              "growing and evicting: give the store more room or compact it",
                              e->dir, (unsigned long long)(store_env_map_bytes(e) >> 20),
                              SHOAL_STORE_MAP_FULL_RETRIES);
    return store_env_error(e, rc, "writing", diag);
}

shoal_err store_env_reader_check(store_env *e, int *cleared, shoal_diag *diag)
{
    int dead = 0;
    int rc = mdb_reader_check(e->env, &dead);
    if (cleared)
        *cleared = dead;
    if (rc == 0 && dead > 0)
        LOG_INFO("%s: cleared %d reader slot(s) of dead processes", e->dir, dead);
    return store_env_error(e, rc, "mdb_reader_check", diag);
}

/* ---- compaction ---- */

static uint64_t record_count(store_env *e)
{
    MDB_txn *txn;
    MDB_stat st;
    store_guard g;
    if (store_env_read_begin(e, &txn, &g, NULL) != SHOAL_OK)
        return UINT64_MAX;
    if (sigsetjmp(g.jb, 1) != 0) {
        store_env_read_fault(e, &g, NULL);
        return UINT64_MAX;
    }
    g.armed = 1;
    uint64_t n = mdb_stat(txn, store_env_index(e)->records, &st) == 0 ? st.ms_entries : UINT64_MAX;
    store_env_read_end(e, txn);
    return n;
}

/* Is lock.mdb locked by a process that is not shoal (mdb_stat, ...)? LMDB
 * holds a shared fcntl lock on its first byte in every process that has
 * the environment open. We have no LMDB handle on it here, so closing our
 * probe descriptor drops nothing of ours. */
static bool lmdb_in_use(const char *dir)
{
    char path[SHOAL_PATH_BYTES_MAX];
    if (common_path_join(path, sizeof path, dir, STORE_ENV_LOCK_FILE) != SHOAL_OK)
        return true;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return false;
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
    bool busy = fcntl(fd, F_SETLK, &fl) != 0;
    close(fd);
    return busy;
}

static shoal_err fsync_file(const char *dir, const char *name, shoal_diag *diag)
{
    char path[SHOAL_PATH_BYTES_MAX];
    if (common_path_join(path, sizeof path, dir, name) != SHOAL_OK)
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT, "%s: path too long", dir);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0 || fchmod(fd, 0600) != 0 || fsync(fd) != 0) {
        int saved = errno;
        if (fd >= 0)
            close(fd);
        return shoal_diag_set(diag, SHOAL_ERR_IO, "%s: cannot sync the compacted copy: %s", path,
                              strerror(saved));
    }
    close(fd);
    return SHOAL_OK;
}

static void remove_tmp(const char *tmp)
{
    char path[SHOAL_PATH_BYTES_MAX];
    if (common_path_join(path, sizeof path, tmp, STORE_ENV_DATA_FILE) == SHOAL_OK)
        unlink(path);
    if (common_path_join(path, sizeof path, tmp, STORE_ENV_LOCK_FILE) == SHOAL_OK)
        unlink(path);
    rmdir(tmp);
}

shoal_err store_env_compact(const char *dir, const char *to, uint64_t *before, uint64_t *after,
                            shoal_diag *diag)
{
    int gate = -1;
    store_env *e = NULL, *copy = NULL;
    char tmp[SHOAL_PATH_BYTES_MAX];
    bool made_tmp = false;
    shoal_err err;
    const bool swap = to == NULL;

    if (swap) {
        if ((err = gate_take(dir, LOCK_EX, 0, &gate, diag)) != SHOAL_OK) {
            if (err == SHOAL_ERR_INVALID)
                shoal_diag_set(diag, err,
                               "%s: the state store is in use by a running process (a worker "
                               "or shoalctl): stop the workers first, or write a compacted "
                               "copy with --to NEWDIR",
                               dir);
            goto out;
        }
        if (lmdb_in_use(dir)) {
            err = shoal_diag_set(diag, SHOAL_ERR_INVALID,
                                 "%s: %s is open in another program (mdb_stat?): close it "
                                 "first",
                                 dir, STORE_ENV_LOCK_FILE);
            goto out;
        }
    }
    store_env_options o = {.dir = dir};
    if ((err = env_open(&o, !swap, &e, diag)) != SHOAL_OK)
        goto out;
    if (before)
        *before = file_bytes(dir, STORE_ENV_DATA_FILE);
    if (swap) {
        if ((err = common_path_join(tmp, sizeof tmp, dir, "compact.tmp")) != SHOAL_OK) {
            shoal_diag_set(diag, err, "%s: path too long", dir);
            goto out;
        }
        remove_tmp(tmp); /* left by a compaction that died */
    } else {
        snprintf(tmp, sizeof tmp, "%s", to);
    }
    if (mkdir(tmp, 0700) != 0) {
        err = shoal_diag_set(diag, SHOAL_ERR_IO, "%s: cannot create: %s%s", tmp, strerror(errno),
                             errno == EEXIST ? " (pick a new directory)" : "");
        goto out;
    }
    made_tmp = true;
    uint64_t records = record_count(e);
    int rc = mdb_env_copy2(e->env, tmp, MDB_CP_COMPACT);
    if (rc != 0) {
        err = store_env_error(e, rc, "copying with compaction", diag);
        goto out;
    }
    if ((err = fsync_file(tmp, STORE_ENV_DATA_FILE, diag)) != SHOAL_OK)
        goto out;
    sync_dir(tmp);
    store_env_close(e);
    e = NULL;

    /* The copy must open as a store and hold what the original held (when
     * nothing could write meanwhile). */
    o.dir = tmp;
    if ((err = env_open(&o, false, &copy, diag)) != SHOAL_OK)
        goto out;
    uint64_t copied = record_count(copy);
    store_env_close(copy);
    copy = NULL;
    if (swap && copied != records) {
        err = shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                             "%s: the compacted copy holds %llu records, the store %llu: the "
                             "store is left as it was",
                             dir, (unsigned long long)copied, (unsigned long long)records);
        goto out;
    }
    if (swap) {
        char from[SHOAL_PATH_BYTES_MAX], dest[SHOAL_PATH_BYTES_MAX];
        if (common_path_join(from, sizeof from, tmp, STORE_ENV_DATA_FILE) != SHOAL_OK ||
            common_path_join(dest, sizeof dest, dir, STORE_ENV_DATA_FILE) != SHOAL_OK) {
            err = shoal_diag_set(diag, SHOAL_ERR_LIMIT, "%s: path too long", dir);
            goto out;
        }
        /* rename is atomic: a crash leaves the old file or the new one,
         * both whole. The next process to open re-initialises lock.mdb from
         * the new file, since it finds no other user. */
        if (rename(from, dest) != 0) {
            err = shoal_diag_set(diag, SHOAL_ERR_IO,
                                 "%s: cannot replace with the compacted "
                                 "copy: %s (the store is left as it was)",
                                 dest, strerror(errno));
            goto out;
        }
        sync_dir(dir);
    }
    if (after)
        *after = file_bytes(swap ? dir : to, STORE_ENV_DATA_FILE);
    err = SHOAL_OK;
out:
    store_env_close(copy);
    store_env_close(e);
    if (made_tmp && (swap || err != SHOAL_OK))
        remove_tmp(tmp);
    if (gate >= 0)
        close(gate);
    return err;
}
