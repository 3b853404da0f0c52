/* store_env.h: the LMDB environment of one state directory (internal to
 * store/; store_state.h and store_admin.h are the public faces).
 *
 * The directory holds data.mdb and lock.mdb (LMDB's) and open.lock (ours).
 * It is created 0700 and the files 0600; an existing directory that others
 * may read is refused, since states are conversations.
 *
 * Flags: MDB_NOTLS (read transactions may come from any thread and hold a
 * reader slot only while they run) and MDB_NOMETASYNC: each commit syncs the
 * data pages but not the meta page, which the next commit's sync (or the
 * sync at close) carries. A crash of the process loses nothing committed;
 * a power cut or kernel crash may undo the last committed transaction (one
 * writer batch), never more, and never leaves the store inconsistent. Never
 * MDB_NOSYNC, which could lose any number of transactions and corrupt the
 * store on a power cut.
 *
 * open.lock: every handle holds a shared flock on it while open, and
 * compaction takes it exclusively, so a compacted copy is swapped in only
 * when no shoal process has the environment open, and processes that start
 * meanwhile wait (SHOAL_STORE_OPEN_WAIT_MS). flock, not fcntl: LMDB's own
 * fcntl locks on lock.mdb are dropped by any close of that file in the
 * process, and flock locks are not.
 *
 * One handle per directory per process (LMDB's rule; a second open is
 * refused), opened after any fork, used only by the process that opened
 * it. Map size: the map is address space, not disk (the file grows only as
 * pages are written), so it starts well above the bytes a store keeps and
 * grows, up to a maximum, when a transaction finds it full. */
#ifndef SHOAL_STORE_ENV_H
#define SHOAL_STORE_ENV_H

#include "common/common_error.h"
#include "store/store_guard.h"
#include "store/store_index.h"

#include <lmdb.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct store_env store_env;

typedef struct store_env_options {
    const char *dir;
    bool create;            /* create the directory and the environment */
    uint64_t map_bytes;     /* initial map size; 0: the file's size + 64 MiB */
    uint64_t map_bytes_max; /* growth stops here; 0: 4 x map_bytes */
    /* MDB_NORDAHEAD: a fault in the map reads its own page, not the
     * device's readahead window around it (8 MiB on some virtual disks:
     * a cold B-tree page would bring megabytes of records in). For random
     * lookups (the workers); scans (shoalctl states verify) keep it. */
    bool random_reads;
} store_env_options;

/* Opens (or creates) the environment: directory checks, open.lock shared,
 * mdb_env_open, mdb_reader_check (stale reader slots of killed processes),
 * the five databases and the format check. Errors name the directory and
 * say what to do: SHOAL_ERR_NOT_FOUND (no store there and !create),
 * SHOAL_ERR_INVALID (permissions, already open in this process),
 * SHOAL_ERR_FORMAT (not a store of this format), SHOAL_ERR_TIMEOUT (a
 * compaction held it), SHOAL_ERR_IO. */
shoal_err store_env_open(const store_env_options *opt, store_env **out, shoal_diag *diag);

/* Syncs (making the last NOMETASYNC commit durable) and closes. NULL and a
 * handle inherited through fork (left alone) are allowed. */
void store_env_close(store_env *e);

const store_index *store_env_index(const store_env *e);
const char *store_env_dir(const store_env *e);
MDB_env *store_env_mdb(store_env *e);

/* True in the process that opened e. */
bool store_env_owned(const store_env *e);

/* A read transaction, from any thread; end it with store_env_read_end. A
 * map grown by another process is adopted here. g is pushed as the
 * thread's guard of the transaction (store_guard.h); the caller arms it:
 *
 *     if ((err = store_env_read_begin(e, &txn, &g, diag)) != SHOAL_OK)
 *         return err;
 *     if (sigsetjmp(g.jb, 1) != 0)
 *         return store_env_read_fault(e, &g, diag);
 *     g.armed = 1;
 *
 * A store found damaged (a read of its map faulted, in any thread) refuses
 * every later transaction of this handle with SHOAL_ERR_FORMAT. */
shoal_err store_env_read_begin(store_env *e, MDB_txn **txn, store_guard *g, shoal_diag *diag);
void store_env_read_end(store_env *e, MDB_txn *txn);

/* After a fault in g's transaction: ends it, marks the store damaged, and
 * says so (SHOAL_ERR_FORMAT, naming the file and what to do). */
shoal_err store_env_read_fault(store_env *e, store_guard *g, shoal_diag *diag);

/* Reads past the page cache. A value of a read transaction (a pointer
 * into the map, `bytes` long) is read from data.mdb with O_DIRECT into buf
 * (STORE_ENV_DIRECT_ALIGN-aligned, at least store_env_direct_bytes): the
 * aligned span around it in large requests, where faulting the map in
 * would read it in readahead-sized pieces. Returns where in buf the value
 * starts, or -1 (no O_DIRECT on this file system, buf unaligned or short,
 * an I/O error): then copy from the map. Call it inside the transaction
 * that returned the value (LMDB keeps those pages unchanged while it runs;
 * commits are synced, and the kernel writes back any dirty page of the
 * span before a direct read). */
enum { STORE_ENV_DIRECT_ALIGN = 4096 };
static inline size_t store_env_direct_bytes(size_t bytes)
{
    return (bytes + 2 * STORE_ENV_DIRECT_ALIGN - 1) / STORE_ENV_DIRECT_ALIGN *
           STORE_ENV_DIRECT_ALIGN;
}
bool store_env_can_read_direct(const store_env *e);
ssize_t store_env_read_direct(store_env *e, const void *value, size_t bytes, void *buf,
                              size_t buf_bytes);

/* The body of a write: changes through w, returns an LMDB code. */
typedef int (*store_env_write_fn)(void *ctx, store_wtx *w);

typedef struct store_env_write_report {
    int map_full;     /* attempts that found the map full */
    int grows;        /* map growths */
    uint64_t evicted; /* records evicted by the write and for room */
    uint64_t evicted_bytes;
} store_env_write_report;

/* Runs fn in a write transaction and commits. When the map is full (in fn
 * or at commit) the attempt is undone, stale readers are cleared, and the
 * map grows (up to map_bytes_max) or, at the maximum, the oldest ends are
 * evicted (room_bytes, or an eighth of the store if more) in a transaction
 * of their own; then fn runs again, at most SHOAL_STORE_MAP_FULL_RETRIES
 * times in all: SHOAL_ERR_LIMIT after that. Other LMDB errors: SHOAL_ERR_IO
 * (or FORMAT for a corrupt file) with the directory in diag. One thread at
 * a time per handle; rep may be NULL. */
shoal_err store_env_write(store_env *e, store_env_write_fn fn, void *ctx, uint64_t room_bytes,
                          store_env_write_report *rep, shoal_diag *diag);

/* mdb_reader_check: frees reader slots of processes that died in a read
 * transaction (they would pin old pages and grow the file). *cleared may be
 * NULL. */
shoal_err store_env_reader_check(store_env *e, int *cleared, shoal_diag *diag);

/* Map size now, and the file's size. */
uint64_t store_env_map_bytes(store_env *e);

/* Translates an LMDB code to shoal_err and writes "DIR: what: lmdb's words"
 * into diag. */
shoal_err store_env_error(const store_env *e, int rc, const char *what, shoal_diag *diag);

/* The files of a store in dir: data.mdb, lock.mdb, open.lock. */
#define STORE_ENV_DATA_FILE "data.mdb"
#define STORE_ENV_LOCK_FILE "lock.mdb"
#define STORE_ENV_GATE_FILE "open.lock"

/* Compacts the store in dir: copies it with MDB_CP_COMPACT into
 * dir/compact.tmp, syncs the copy, checks that it opens with the same
 * records, and renames it over data.mdb while holding open.lock
 * exclusively. Refused (SHOAL_ERR_INVALID, "in use") while any process has
 * the store open. With `to` set, writes the compacted copy there instead
 * (a new directory) and works while the store is in use. *before and
 * *after get the data file's sizes (may be NULL). The caller must not have
 * the store open. */
shoal_err store_env_compact(const char *dir, const char *to, uint64_t *before, uint64_t *after,
                            shoal_diag *diag);

#endif
