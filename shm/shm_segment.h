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
 * Regions after the header are carved at creation in one pass: the worker
 * table now; page tables, the prefix index and the stream table as the
 * cross-worker page sharing of issue #8 grows. Everything in it is
 * fixed-layout with ids and offsets, never pointers. Writers take the
 * segment's robust process-shared mutex; a holder that died leaves state
 * that the next holder repairs (EOWNERDEAD), and hot counters are atomics
 * that readers such as shoalctl read without the lock. */
#ifndef SHOAL_SHM_SEGMENT_H
#define SHOAL_SHM_SEGMENT_H

#include "common/common_error.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#define SHM_SEGMENT_MAGIC 0x47455348414f4853ull /* "SHOALSEG" little-endian */
#define SHM_SEGMENT_VERSION 1
#define SHM_SEGMENT_WORKERS_MAX 64
#define SHM_CLUSTER_NAME_MAX 32

typedef enum shm_worker_state {
    SHM_WORKER_EMPTY = 0, /* slot never used */
    SHM_WORKER_STARTING,
    SHM_WORKER_READY,
    SHM_WORKER_DRAINING,
    SHM_WORKER_DEAD,
} shm_worker_state;

/* One worker's row: written by that worker (load, heartbeat) and by the
 * coordinator (state); read by anyone. */
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
    uint8_t pad[72];
} shm_worker_row;
_Static_assert(sizeof(shm_worker_row) == 160, "shm_worker_row layout");

typedef struct shm_segment_header {
    uint64_t magic;
    uint32_t version;
    uint32_t header_bytes;
    uint64_t total_bytes;
    uint64_t created_ns;
    int32_t creator_pid;
    int32_t workers_max;
    char cluster[SHM_CLUSTER_NAME_MAX];
    uint64_t workers_offset; /* shm_worker_row[workers_max] */
    pthread_mutex_t lock;    /* robust, process-shared */
    /* a counter the writers bump under the lock; tests kill a holder */
    uint64_t generation;
    uint64_t repairs; /* times a holder died and the next one repaired */
} shm_segment_header;

typedef struct shm_segment shm_segment;

/* Creates the segment of cluster `name` (letters, digits, '-', '_'). An
 * existing one whose creator is gone is replaced (and said so); one whose
 * creator lives is refused with SHOAL_ERR_INVALID. */
shoal_err shm_segment_create(const char *name, shm_segment **out, shoal_diag *diag);

/* Attaches to an existing segment, read-write or read-only (shoalctl).
 * SHOAL_ERR_NOT_FOUND when there is none; SHOAL_ERR_FORMAT when it is not
 * shoal's or of another layout version, with what to do. */
shoal_err shm_segment_attach(const char *name, bool read_only, shm_segment **out,
                             shoal_diag *diag);

/* Unmaps (the creator also unlinks the name). NULL allowed. */
void shm_segment_close(shm_segment *s);

shm_segment_header *shm_segment_header_of(shm_segment *s);
shm_worker_row *shm_segment_worker(shm_segment *s, int index);

/* Takes the segment lock. If the last holder died holding it, repairs what
 * it guards (recounts) and marks it consistent: the caller always gets a
 * usable lock. */
void shm_segment_lock(shm_segment *s);
void shm_segment_unlock(shm_segment *s);

/* True when a process with this pid exists. */
bool shm_pid_alive(pid_t pid);

#endif
