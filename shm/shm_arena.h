/* shm_arena.h: handing a worker's KV page arena to the other processes of
 * its cluster (issue #8; DESIGN.md "KV pages").
 *
 * A worker allocates its arena once (kernels_backend.h, arena_create: a
 * memfd on the CPU, a VMM allocation exported as a POSIX fd on a GPU) and
 * serves the fd, with a description of the arena, on the Unix socket
 * "\0shoal.<cluster>.arena.<index>" in the abstract namespace: no file on
 * disk, and the name goes away with the process, so a killed worker leaves
 * nothing to clean up. Each connection gets one shm_arena_info and the fd
 * (SCM_RIGHTS); another worker maps it with arena_import. Both ends check
 * with SO_PEERCRED that the other runs as the same user (abstract names
 * have no file permissions: anyone may bind or connect). */
#ifndef SHOAL_SHM_ARENA_H
#define SHOAL_SHM_ARENA_H

#include "common/common_error.h"

#include <stddef.h>
#include <stdint.h>

#define SHM_ARENA_MAGIC 0x414e455241414853ull /* "SHAARENA" little-endian */
#define SHM_ARENA_VERSION 1

/* What an exporter sends with its fd: fixed layout, little-endian (every
 * process of a cluster runs on one host), checked on receipt. */
typedef struct shm_arena_info {
    uint64_t magic;   /* SHM_ARENA_MAGIC */
    uint32_t version; /* SHM_ARENA_VERSION */
    int32_t pid;      /* the exporting process */
    uint64_t epoch;   /* the exporter's start (a restarted worker's differs) */
    uint64_t arena_bytes; /* the size to map: arena_create's mapped_bytes */
    uint64_t page_bytes;
    int32_t page_count;   /* pages at offsets 0, page_bytes, ... inside arena_bytes */
    int32_t device;       /* the GPU index of the exporter, -1 for the CPU */
    char backend[16];     /* the backend's name ("cpu", "cuda"), NUL-terminated */
} shm_arena_info;
_Static_assert(sizeof(shm_arena_info) == 64, "shm_arena_info layout");
_Static_assert(offsetof(shm_arena_info, arena_bytes) == 24, "shm_arena_info layout");
_Static_assert(offsetof(shm_arena_info, backend) == 48, "shm_arena_info layout");

typedef struct shm_arena_exporter shm_arena_exporter;

/* Starts serving `fd` and *info (copied; magic, version and pid are filled
 * here) as worker `worker_index` (0 to SHM_SEGMENT_WORKERS_MAX - 1) of
 * `cluster` (letters, digits, '-', '_'), from a thread of its own. fd stays
 * the caller's and must stay open until shm_arena_export_stop. Errors:
 * SHOAL_ERR_INVALID for a bad name, index or info, or when another process
 * already serves that index (diag names it); SHOAL_ERR_IO or
 * SHOAL_ERR_NOMEM for the system's refusals. Call from one thread. */
shoal_err shm_arena_export_start(const char *cluster, int worker_index, int fd,
                                 const shm_arena_info *info, shm_arena_exporter **out,
                                 shoal_diag *diag);

/* Stops the thread and closes the socket (not the arena fd); fetches after
 * it return SHOAL_ERR_NOT_FOUND. Mappings already made elsewhere stay.
 * NULL allowed. */
void shm_arena_export_stop(shm_arena_exporter *e);

/* Fetches the arena of worker `worker_index` of `cluster`: on SHOAL_OK
 * *info is checked (magic, version, sizes that fit each other, a backend
 * name) and *fd (close-on-exec) is the caller's to close, after or before
 * arena_import as it likes. Waits at most timeout_ms (connect and
 * receive). Errors, with diag naming the cluster and the index:
 * SHOAL_ERR_NOT_FOUND at once when nobody serves that index (no worker
 * there, or it died); SHOAL_ERR_TIMEOUT when the exporter does not answer
 * in time; SHOAL_ERR_FORMAT for a message that is short, carries no fd or
 * fails the checks; SHOAL_ERR_INVALID for a bad name or index, or a server
 * run by another user. Any thread may call. */
shoal_err shm_arena_fetch(const char *cluster, int worker_index, int timeout_ms,
                          shm_arena_info *info, int *fd, shoal_diag *diag);

/* Checks a received info; diag says what is wrong. SHOAL_ERR_FORMAT. */
shoal_err shm_arena_info_check(const shm_arena_info *info, shoal_diag *diag);

#endif
