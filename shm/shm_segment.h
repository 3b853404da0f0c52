/* shm_segment.h: the shared segment /shoal.<cluster>.
 *
 * One POSIX shared-memory object per cluster, created by the coordinator
 * with O_CREAT|O_EXCL and mode 0600, fully allocated at creation (so a full
 * /dev/shm fails at start, not with SIGBUS later), and attached by every
 * worker and by shoalctl. It starts with a header (magic, layout version,
 * sizes, creator pid, creation time) that every attacher checks; a segment
 * of another layout is refused with what to do, and one left by a killed
 * cluster (its creator pid is gone) is replaced at the next start.
 *
 * Regions, carved at creation in one pass:
 *   - the worker table: one row per worker slot (pid, device, state,
 *     heartbeat, epoch, pages and counters);
 *   - the page tables: pages_max rows per worker slot, one per KV page of
 *     that worker's arena. They ARE the engine's page state (worker_pages
 *     keeps its refs, states and block hashes here), so what shoalctl
 *     shows is what the engine uses;
 *   - the prefix index: block hash -> (worker, page) for every published
 *     page of every worker, open addressing over the page rows' hashes;
 *   - the lease table: one slot per leased page (lessee pid, worker, page,
 *     the owner's epoch);
 *   - the stream tables: streams_max rows per worker slot.
 * Everything is fixed-layout with ids and offsets, never pointers.
 *
 * Concurrency. The owner of a page row writes its refs, state, owner and
 * last use without the lock (relaxed atomics; readers such as shoalctl
 * tolerate a row caught mid-change). What other processes rely on goes
 * under the segment's robust process-shared mutex: publishing a hash (row
 * flag and index entry), unpublishing it at eviction (refused while the
 * page is leased), and leases. A holder that dies leaves state that the
 * next holder repairs on EOWNERDEAD: lease slots of dead processes are
 * dropped, lease counts are recounted from the slots, and the index is
 * rebuilt from the page rows of live workers. The page rows are the
 * truth; the index and the lease counts are derived from them. */
#ifndef SHOAL_SHM_SEGMENT_H
#define SHOAL_SHM_SEGMENT_H

#include "common/common_error.h"
#include "common/common_hash.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#define SHM_SEGMENT_MAGIC 0x47455348414f4853ull /* "SHOALSEG" little-endian */
#define SHM_SEGMENT_VERSION 5 /* 5: state slots and checkpoints in worker rows */
#define SHM_SEGMENT_WORKERS_MAX 64
#define SHM_CLUSTER_NAME_MAX 32

typedef enum shm_worker_state {
    SHM_WORKER_EMPTY = 0, /* slot never used */
    SHM_WORKER_STARTING,
    SHM_WORKER_READY,
    SHM_WORKER_DRAINING,
    SHM_WORKER_DEAD,
    SHM_WORKER_DRAINED, /* exited after a drain; not restarted until undrain */
} shm_worker_state;

/* One worker's row: written by that worker (load, heartbeat, pages) and by
 * the coordinator (state); read by anyone. */
typedef struct shm_worker_row {
    _Atomic uint32_t state; /* shm_worker_state */
    int32_t pid;
    char device[16];
    _Atomic uint64_t heartbeat_ns; /* CLOCK_REALTIME of its last report */
    _Atomic uint64_t started_ns;
    _Atomic int32_t running;
    _Atomic int32_t waiting;
    _Atomic int32_t pages_total;
    _Atomic int32_t pages_free;
    _Atomic int32_t pages_active;
    _Atomic int32_t pages_cached;
    _Atomic uint64_t generated_tokens;
    _Atomic uint64_t prefix_lookups;
    _Atomic uint64_t prefix_hits;
    _Atomic uint64_t epoch;       /* bumped each time a process takes the slot */
    _Atomic uint64_t page_bytes;  /* bytes of one KV page */
    _Atomic uint64_t import_tokens;  /* prompt tokens copied from other workers */
    _Atomic uint64_t restore_tokens; /* prompt tokens read back from the store */
    _Atomic uint64_t spilled_pages;  /* pages written to the store */
    _Atomic uint32_t drain;          /* set by shoalctl drain, cleared by undrain */
    _Atomic int32_t exit_code;       /* of its last process, when DEAD or DRAINED */
    _Atomic uint64_t dead_ns;        /* when it was found dead */
    _Atomic uint64_t cached_tokens;  /* prompt tokens served by local prefix hits */
    _Atomic uint64_t prompt_tokens;  /* prompt tokens admitted */
    _Atomic int32_t page_tokens;     /* tokens of one KV page */
    _Atomic int32_t exits;           /* processes of this slot that ended (dead or drained) */
    _Atomic uint32_t managed;        /* 1: the coordinator starts and restarts this slot */
    uint32_t pad0;
    _Atomic uint64_t import_ns;      /* time spent importing (lease, copy, publish) */
    /* hybrid models: recurrent-state slots (0 and 0 bytes otherwise) */
    _Atomic int32_t state_slots;      /* the running streams' */
    _Atomic int32_t states_running;   /* of which streams hold now */
    _Atomic uint64_t slot_bytes;      /* bytes of one */
    _Atomic int32_t checkpoints_max;  /* checkpoint slots */
    _Atomic int32_t checkpoints_held; /* of which hold a checkpoint */
    _Atomic uint64_t checkpoint_hits; /* prefix hits that started from one */
    uint8_t pad[8];
} shm_worker_row;
_Static_assert(sizeof(shm_worker_row) == 224, "shm_worker_row layout");

/* exit_code of a worker row: the exit status (0..255), -N when signal N
 * ended it, or one of these. */
enum {
    SHM_EXIT_UNKNOWN = -1000, /* not the coordinator's child: no status to read */
    SHM_EXIT_SILENT = -1001,  /* stopped answering; the coordinator killed it */
};

typedef enum shm_page_state {
    SHM_PAGE_FREE = 0,
    SHM_PAGE_ACTIVE, /* refs > 0 */
    SHM_PAGE_CACHED, /* refs == 0, hash published: reusable, evictable */
} shm_page_state;

enum {
    SHM_PAGE_HASHED = 1u, /* hash holds the published block hash */
    SHM_PAGE_STORED = 2u, /* the block is in the state store */
};

/* One KV page of one worker. */
typedef struct shm_page_row {
    _Atomic uint32_t state; /* shm_page_state */
    _Atomic uint32_t flags; /* SHM_PAGE_* */
    _Atomic int32_t refs;
    _Atomic int32_t leases; /* other processes reading it now */
    _Atomic uint64_t owner; /* the stream that last took it */
    _Atomic uint64_t last_use; /* the owner's use clock */
    common_hash hash;
    _Atomic uint64_t uses; /* prefix hits and imports of this page */
    /* common_hash_u64 of the parent block's hash, set with the hash: a
     * reader (shoalctl) links published pages into chains without the
     * engine's private tables. */
    _Atomic uint64_t parent_key;
    uint8_t pad[16];
} shm_page_row;
_Static_assert(sizeof(shm_page_row) == 96, "shm_page_row layout");

/* One leased page. pid 0: the slot is free. */
typedef struct shm_lease_slot {
    int32_t pid;
    int32_t worker;
    int32_t page;
    uint32_t epoch; /* low bits of the owner's epoch when it was taken */
} shm_lease_slot;
_Static_assert(sizeof(shm_lease_slot) == 16, "shm_lease_slot layout");

typedef enum shm_stream_state {
    SHM_STREAM_NONE = 0,
    SHM_STREAM_WAITING,
    SHM_STREAM_PREFILL,
    SHM_STREAM_DECODE,
} shm_stream_state;

/* One stream of one worker, written by that worker after each step. */
typedef struct shm_stream_row {
    _Atomic uint64_t id; /* the coordinator's stream id */
    _Atomic uint32_t state;
    _Atomic int32_t prompt_tokens;
    _Atomic int32_t tokens; /* prompt + output so far */
    _Atomic int32_t generated;
    _Atomic int32_t pages;
    _Atomic int32_t cached_tokens;
    _Atomic uint64_t started_ns;
} shm_stream_row;
_Static_assert(sizeof(shm_stream_row) == 40, "shm_stream_row layout");

typedef struct shm_segment_sizes {
    int workers;     /* worker slots, 1..SHM_SEGMENT_WORKERS_MAX */
    int pages;       /* page rows per worker */
    int streams;     /* stream rows per worker */
    int leases;      /* lease slots in all */
} shm_segment_sizes;

typedef struct shm_segment_header {
    uint64_t magic;
    uint32_t version;
    uint32_t header_bytes;
    uint64_t total_bytes;
    uint64_t created_ns;
    int32_t creator_pid;
    int32_t workers_max;
    char cluster[SHM_CLUSTER_NAME_MAX];
    int32_t pages_max;   /* page rows per worker */
    int32_t streams_max; /* stream rows per worker */
    int32_t leases_max;
    uint32_t index_slots; /* a power of two, at least 2 x all page rows */
    uint64_t workers_offset; /* shm_worker_row[workers_max] */
    uint64_t pages_offset;   /* shm_page_row[workers_max][pages_max] */
    uint64_t index_offset;   /* uint64_t[index_slots]: 0 or (worker+1) << 32 | page */
    uint64_t leases_offset;  /* shm_lease_slot[leases_max] */
    uint64_t streams_offset; /* shm_stream_row[workers_max][streams_max] */
    pthread_mutex_t lock;    /* robust, process-shared */
    /* a counter the writers bump under the lock; tests kill a holder */
    uint64_t generation;
    uint64_t repairs; /* times a holder died and the next one repaired */
    _Atomic uint64_t leases_taken;
    _Atomic uint64_t leases_reclaimed; /* slots of dead lessees dropped */
    _Atomic int32_t coordinator_pid;   /* the live coordinator (0 while none) */
    _Atomic uint64_t coordinator_heartbeat_ns;
} shm_segment_header;

typedef struct shm_segment shm_segment;

/* The default sizes for `workers` slots: 65,536 pages and 512 streams per
 * worker, 65,536 lease slots. */
void shm_segment_sizes_default(int workers, shm_segment_sizes *out);

/* Bytes a segment of these sizes takes. */
size_t shm_segment_bytes(const shm_segment_sizes *sizes);

/* Creates the segment of cluster `name` (letters, digits, '-', '_'). An
 * existing one whose creator is gone is replaced (and said so); one whose
 * creator lives is refused with SHOAL_ERR_INVALID. */
shoal_err shm_segment_create(const char *name, const shm_segment_sizes *sizes, shm_segment **out,
                             shoal_diag *diag);

/* Removes every /dev/shm/shoal.* segment of this layout whose creator is
 * gone (a cluster killed before it could unlink), saying so in the log;
 * create does it first. Segments of other layouts are left alone. Returns
 * how many went. */
int shm_segment_sweep_stale(void);

/* Attaches to an existing segment, read-write or read-only (shoalctl).
 * SHOAL_ERR_NOT_FOUND when there is none; SHOAL_ERR_FORMAT when it is not
 * shoal's or of another layout version, with what to do. */
shoal_err shm_segment_attach(const char *name, bool read_only, shm_segment **out,
                             shoal_diag *diag);

/* Unmaps (the creator also unlinks the name). NULL allowed. */
void shm_segment_close(shm_segment *s);

shm_segment_header *shm_segment_header_of(shm_segment *s);
const char *shm_segment_name(const shm_segment *s);
shm_worker_row *shm_segment_worker(shm_segment *s, int index);
shm_page_row *shm_segment_pages(shm_segment *s, int worker);
shm_stream_row *shm_segment_streams(shm_segment *s, int worker);
shm_lease_slot *shm_segment_leases(shm_segment *s);

/* Takes the segment lock. If the last holder died holding it, repairs what
 * it guards and marks it consistent: the caller always gets a usable lock. */
void shm_segment_lock(shm_segment *s);
void shm_segment_unlock(shm_segment *s);

/* True for a usable cluster name: 1 to SHM_CLUSTER_NAME_MAX - 1 letters,
 * digits, '-' or '_' (it becomes a file name and a socket name). */
bool shm_cluster_name_ok(const char *name);

/* True when a process with this pid exists. */
bool shm_pid_alive(pid_t pid);

/* ---- workers ---- */

/* A process takes worker slot `index` for `pages` pages of page_bytes
 * (pages <= pages_max): under the lock, the epoch moves on, the slot's page
 * rows are reset to free, its index entries and the leases on its pages go
 * (a lessee of the old process finds the new epoch and lets go), and the
 * row gets pid, device and sizes. What belongs to the slot rather than
 * the process stays: the drain flag, `managed`, `exits` and the last
 * process's exit_code and dead_ns. *epoch gets the new epoch. */
shoal_err shm_worker_register(shm_segment *s, int index, pid_t pid, const char *device, int pages,
                              uint64_t page_bytes, uint64_t *epoch, shoal_diag *diag);

/* The slot's process is gone: its pages leave the index, leases on them
 * and leases it held go, `exits` counts it, and its state becomes `state`
 * (DEAD or DRAINED) with exit_code (see SHM_EXIT_*) and dead_ns now. */
void shm_worker_forget(shm_segment *s, int index, shm_worker_state state, int exit_code);

/* ---- prefix index (the caller holds the lock for insert and remove) ---- */

/* Publishes page `page` of `worker` under `hash`: sets the row's hash and
 * HASHED flag and adds the index entry. */
void shm_index_insert(shm_segment *s, int worker, int page, const common_hash *hash);

/* Unpublishes it. false (nothing changes) while the page is leased. */
bool shm_index_remove(shm_segment *s, int worker, int page);

/* Without the lock (a racing writer can make it miss, never lie): for each
 * worker slot w < workers, lead[w] = how many of hashes[0..n) lead the
 * chain and are published on w. Returns the longest lead of any worker. */
int shm_index_leads(shm_segment *s, const common_hash *hashes, int n, int32_t *lead);

/* ---- leases ---- */

typedef struct shm_lease {
    int worker;  /* the owner */
    uint64_t epoch;
    int count;   /* pages leased */
    int32_t *pages;  /* [count] the owner's pages, in chain order (caller's array) */
    int32_t *slots;  /* [count] lease slots (caller's array) */
} shm_lease;

/* Leases the longest run of hashes[0..n) published on one worker other
 * than `self` (the worker with the longest run wins), at most `max` pages.
 * The caller gives pages and slots arrays of `max`. Sets lease->count (0:
 * nothing found or no free slot). */
void shm_lease_chain(shm_segment *s, int self, const common_hash *hashes, int n, int max,
                     shm_lease *lease);

/* Ends a lease. The owner's lease counts drop only if it still has the
 * epoch the lease was taken under. */
void shm_lease_release(shm_segment *s, const shm_lease *lease);

/* Drops lease slots whose lessee is dead and recounts the page rows'
 * leases. The caller holds the lock. Returns the slots dropped. */
int shm_lease_reclaim_locked(shm_segment *s);

/* ---- tests ---- */

/* In a test build (SHOAL_TESTING): when the environment variable
 * SHOAL_TEST_PAUSE equals `point`, the process stops itself (SIGSTOP)
 * here, so a test can kill it inside a critical section or a lease. A
 * no-op otherwise, and in every other build. */
void shm_test_pause(const char *point);

#endif
