/* shoalctl_cluster.h: what the cluster commands (pages, workers, streams,
 * drain) share: finding the cluster's segment, attaching to it, and saying
 * in words what a worker row shows.
 *
 * Readers attach read-only and never take the segment's lock: rows are
 * read with relaxed atomic loads while the engine writes them, so a row
 * can be caught mid-change (the totals of one pass over the page rows
 * always add up, since each row has one state). Only drain and undrain
 * attach read-write, to store one flag. */
#ifndef SHOAL_TOOLS_SHOALCTL_CLUSTER_H
#define SHOAL_TOOLS_SHOALCTL_CLUSTER_H

#include "shm/shm_segment.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct shoalctl_cluster {
    char name[SHM_CLUSTER_NAME_MAX];
    shm_segment *seg;
    shm_segment_header *h;
    int coordinator_pid;
    bool running;     /* the coordinator lives */
    uint64_t last_ns; /* its last supervision round (wall clock), or creation */
    double quiet_s;   /* seconds since last_ns */
} shoalctl_cluster;

/* Finds the cluster: `name` (from --cluster), else $SHOAL_CLUSTER, else the
 * one /dev/shm/shoal.* segment there is. Attaches (read-only unless
 * writable). When it cannot, says why on stderr, prefixed "shoalctl CMD: ",
 * and returns SHOALCTL_ERROR (no such cluster, not readable, another
 * layout) or SHOALCTL_USAGE (several segments and no name: they are
 * listed). SHOALCTL_OK otherwise, also for a stale segment (running is
 * false; see shoalctl_cluster_say_stale). */
int shoalctl_cluster_open(const char *cmd, const char *name, bool writable, shoalctl_cluster *out);

/* Unmaps. Safe on a cluster that failed to open or was closed. */
void shoalctl_cluster_close(shoalctl_cluster *c);

/* When the coordinator is gone, writes "stale segment left by coordinator
 * pid N, gone since ..." to f and returns true. */
bool shoalctl_cluster_say_stale(const char *cmd, const shoalctl_cluster *c, FILE *f);

/* A worker row in words. */
typedef struct shoalctl_worker {
    int index;
    shm_worker_state state;
    const char *state_name; /* "ready", "draining", "drained", "dead", ... */
    int pid;
    bool pid_alive;
    bool late;           /* ready or draining, but no report for SHOAL_REPORT_LATE_MS */
    bool gone;           /* ready or draining, but its pid is not running */
    double quiet_s;      /* since its last report */
    double up_s;         /* since it registered (0 when not running) */
    double down_s;       /* since it exited (DEAD or DRAINED) */
    char health[384];    /* "ok", or what is wrong and since when */
    char last_exit[160]; /* its last process's end, "" if none */
} shoalctl_worker;

/* Reads row `index`; false for an empty slot (never used). */
bool shoalctl_worker_read(const shoalctl_cluster *c, int index, shoalctl_worker *out);

/* "exit status 0", "killed by signal 9 (Killed)", ... */
void shoalctl_exit_text(int code, char *buf, size_t n);

/* "512 B", "72.0 KiB", "1.25 GiB". */
void shoalctl_format_bytes(char *buf, size_t n, uint64_t bytes);

/* "4 s", "3 min 10 s", "2 h 03 min", "5 d 2 h". */
void shoalctl_format_span(char *buf, size_t n, double seconds);

/* Local "YYYY-MM-DD HH:MM:SS" of a CLOCK_REALTIME nanosecond stamp. */
void shoalctl_format_time(char *buf, size_t n, uint64_t ns);

/* CLOCK_REALTIME now, nanoseconds. */
uint64_t shoalctl_now_ns(void);

/* shm_pid_alive, but a zombie (dead, not yet reaped by its parent) counts
 * as gone: a killed coordinator or worker is one until it is reaped. */
bool shoalctl_pid_running(int pid);

/* Parses a worker index or a number of seconds; false if it is not one. */
bool shoalctl_parse_int(const char *s, long lo, long hi, long *out);
bool shoalctl_parse_seconds(const char *s, double lo, double hi, double *out);

/* Set by SIGINT/SIGTERM once shoalctl_watch_signals ran: --watch loops
 * end cleanly. */
extern volatile int shoalctl_interrupted;
void shoalctl_watch_signals(void);

/* Sleeps up to `seconds`, returning early (false) when interrupted. */
bool shoalctl_sleep(double seconds);

#endif
