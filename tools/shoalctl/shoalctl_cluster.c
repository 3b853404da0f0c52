#include "shoalctl_cluster.h"

#include "shoalctl.h"

#include "common/common_limits.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <pwd.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

volatile int shoalctl_interrupted;

uint64_t shoalctl_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

bool shoalctl_pid_running(int pid)
{
    if (!shm_pid_alive(pid))
        return false;
    char path[32], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return true; /* no /proc: trust kill(0) */
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *close_paren = strrchr(buf, ')'); /* after the command name */
    return !(close_paren && close_paren[1] == ' ' && close_paren[2] == 'Z');
}

static double seconds_since(uint64_t ns)
{
    uint64_t now = shoalctl_now_ns();
    return ns == 0 || ns > now ? 0.0 : (double)(now - ns) / 1e9;
}

void shoalctl_format_bytes(char *buf, size_t n, uint64_t bytes)
{
    if (bytes >= (1ull << 30))
        snprintf(buf, n, "%.2f GiB", (double)bytes / (double)(1ull << 30));
    else if (bytes >= (1ull << 20))
        snprintf(buf, n, "%.1f MiB", (double)bytes / (double)(1ull << 20));
    else if (bytes >= 1024)
        snprintf(buf, n, "%.1f KiB", (double)bytes / 1024.0);
    else
        snprintf(buf, n, "%llu B", (unsigned long long)bytes);
}

void shoalctl_format_span(char *buf, size_t n, double seconds)
{
    long long s = (long long)llround(seconds < 0 ? 0 : seconds);
    if (s < 60)
        snprintf(buf, n, "%lld s", s);
    else if (s < 3600)
        snprintf(buf, n, "%lld min %02lld s", s / 60, s % 60);
    else if (s < 86400)
        snprintf(buf, n, "%lld h %02lld min", s / 3600, s / 60 % 60);
    else
        snprintf(buf, n, "%lld d %lld h", s / 86400, s / 3600 % 24);
}

void shoalctl_format_time(char *buf, size_t n, uint64_t ns)
{
    time_t t = (time_t)(ns / 1000000000ull);
    struct tm tm;
    if (ns == 0 || !localtime_r(&t, &tm) || strftime(buf, n, "%Y-%m-%d %H:%M:%S", &tm) == 0)
        snprintf(buf, n, "-");
}

void shoalctl_exit_text(int code, char *buf, size_t n)
{
    if (code == SHM_EXIT_UNKNOWN)
        snprintf(buf, n, "exit status unknown (not the coordinator's child)");
    else if (code == SHM_EXIT_SILENT)
        snprintf(buf, n, "stopped answering; the coordinator killed it");
    else if (code < 0)
        snprintf(buf, n, "killed by signal %d (%s)", -code, strsignal(-code));
    else
        snprintf(buf, n, "exit status %d", code);
}

bool shoalctl_parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

bool shoalctl_parse_seconds(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi))
        return false;
    *out = v;
    return true;
}

static void on_signal(int sig)
{
    (void)sig;
    shoalctl_interrupted = 1;
}

void shoalctl_watch_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

bool shoalctl_sleep(double seconds)
{
    uint64_t end = shoalctl_now_ns() + (uint64_t)(seconds * 1e9);
    while (!shoalctl_interrupted) {
        uint64_t now = shoalctl_now_ns();
        if (now >= end)
            return true;
        uint64_t left = end - now;
        if (left > 100000000ull)
            left = 100000000ull; /* wake for a signal at least every 100 ms */
        struct timespec ts = {(time_t)(left / 1000000000ull), (long)(left % 1000000000ull)};
        nanosleep(&ts, NULL);
    }
    return false;
}

/* ---- finding the segment ---- */

typedef struct found {
    char names[16][SHM_CLUSTER_NAME_MAX];
    int n;     /* segments listed (at most 16) */
    int total; /* segments there */
} found;

static void list_segments(found *f)
{
    memset(f, 0, sizeof *f);
    DIR *d = opendir("/dev/shm");
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        size_t len = strlen(de->d_name);
        if (strncmp(de->d_name, "shoal.", 6) != 0 || len == 6 || len - 6 >= SHM_CLUSTER_NAME_MAX)
            continue;
        if (f->n < 16)
            snprintf(f->names[f->n++], SHM_CLUSTER_NAME_MAX, "%s", de->d_name + 6);
        f->total++;
    }
    closedir(d);
}

/* One line about segment `name` for a list: whose, and whether it runs. */
static void describe_segment(const char *name, char *buf, size_t n)
{
    shm_segment *s = NULL;
    shoal_diag d = {{0}};
    if (shm_segment_attach(name, true, &s, &d) != SHOAL_OK) {
        snprintf(buf, n, "%s", d.msg);
        return;
    }
    shm_segment_header *h = shm_segment_header_of(s);
    int pid = atomic_load(&h->coordinator_pid);
    if (pid == 0)
        pid = h->creator_pid;
    char when[32];
    shoalctl_format_time(when, sizeof when, h->created_ns);
    snprintf(buf, n, "coordinator pid %d, %s, created %s", pid,
             shoalctl_pid_running(pid) ? "running" : "gone (stale)", when);
    shm_segment_close(s);
}

/* The segment exists but this user cannot open it: whose it is. */
static void say_not_readable(const char *cmd, const char *path)
{
    struct stat st;
    const char *owner = "another user";
    char uid[32];
    if (stat(path, &st) == 0) {
        struct passwd *pw = getpwuid(st.st_uid);
        if (pw)
            owner = pw->pw_name;
        else {
            snprintf(uid, sizeof uid, "uid %u", (unsigned)st.st_uid);
            owner = uid;
        }
    }
    fprintf(stderr,
            "shoalctl %s: %s belongs to %s (mode 0600): run shoalctl as that user, e.g. "
            "sudo -u %s shoalctl %s ...\n",
            cmd, path, owner, owner, cmd);
}

int shoalctl_cluster_open(const char *cmd, const char *name, bool writable, shoalctl_cluster *out)
{
    memset(out, 0, sizeof *out);
    if (!name || !*name)
        name = getenv("SHOAL_CLUSTER");
    found f;
    list_segments(&f);
    if (!name || !*name) {
        if (f.total == 0) {
            fprintf(stderr,
                    "shoalctl %s: no cluster is running: there is no /dev/shm/shoal.* segment "
                    "(start shoal-coordinator, or give --cluster NAME)\n",
                    cmd);
            return SHOALCTL_ERROR;
        }
        if (f.total > 1) {
            fprintf(stderr,
                    "shoalctl %s: %d clusters have segments here; say which with --cluster NAME:\n",
                    cmd, f.total);
            for (int i = 0; i < f.n; i++) {
                char line[SHOAL_DIAG_BYTES];
                describe_segment(f.names[i], line, sizeof line);
                fprintf(stderr, "  %-31s %s\n", f.names[i], line);
            }
            return SHOALCTL_USAGE;
        }
        name = f.names[0];
    }
    snprintf(out->name, sizeof out->name, "%s", name);
    char path[64];
    snprintf(path, sizeof path, "/dev/shm/shoal.%.31s", name);
    shoal_diag d = {{0}};
    shoal_err err = shm_segment_attach(name, !writable, &out->seg, &d);
    if (err == SHOAL_ERR_NOT_FOUND) {
        fprintf(stderr, "shoalctl %s: no cluster '%s' is running: %s does not exist", cmd, name,
                path);
        if (f.total > 0) {
            fprintf(stderr, " (segments here:");
            for (int i = 0; i < f.n; i++)
                fprintf(stderr, " %s", f.names[i]);
            fprintf(stderr, ")");
        }
        fprintf(stderr, "\n");
        return SHOALCTL_ERROR;
    }
    if (err == SHOAL_ERR_IO && access(path, F_OK) == 0 &&
        access(path, writable ? R_OK | W_OK : R_OK) != 0) {
        say_not_readable(cmd, path);
        return SHOALCTL_ERROR;
    }
    if (err) {
        fprintf(stderr, "shoalctl %s: %s\n", cmd, d.msg);
        return SHOALCTL_ERROR;
    }
    out->h = shm_segment_header_of(out->seg);
    out->coordinator_pid = atomic_load(&out->h->coordinator_pid);
    if (out->coordinator_pid == 0)
        out->coordinator_pid = out->h->creator_pid;
    out->running = shoalctl_pid_running(out->coordinator_pid);
    out->last_ns = atomic_load(&out->h->coordinator_heartbeat_ns);
    if (out->last_ns == 0)
        out->last_ns = out->h->created_ns;
    out->quiet_s = seconds_since(out->last_ns);
    return SHOALCTL_OK;
}

void shoalctl_cluster_close(shoalctl_cluster *c)
{
    shm_segment_close(c->seg);
    c->seg = NULL;
    c->h = NULL;
}

bool shoalctl_cluster_say_stale(const char *cmd, const shoalctl_cluster *c, FILE *f)
{
    if (c->running)
        return false;
    char when[32], ago[32];
    shoalctl_format_time(when, sizeof when, c->last_ns);
    shoalctl_format_span(ago, sizeof ago, c->quiet_s);
    fprintf(f,
            "shoalctl %s: cluster '%s' is not running: stale segment left by coordinator pid %d, "
            "gone since %s (%s ago); the next start replaces it. What it last held follows.\n",
            cmd, c->name, c->coordinator_pid, when, ago);
    return true;
}

/* ---- worker rows ---- */

static const char *state_name(uint32_t st)
{
    switch (st) {
    case SHM_WORKER_EMPTY:
        return "empty";
    case SHM_WORKER_STARTING:
        return "starting";
    case SHM_WORKER_READY:
        return "ready";
    case SHM_WORKER_DRAINING:
        return "draining";
    case SHM_WORKER_DEAD:
        return "dead";
    case SHM_WORKER_DRAINED:
        return "drained";
    }
    return "unknown";
}

bool shoalctl_worker_read(const shoalctl_cluster *c, int index, shoalctl_worker *out)
{
    memset(out, 0, sizeof *out);
    shm_worker_row *w = shm_segment_worker(c->seg, index);
    uint32_t st = atomic_load_explicit(&w->state, memory_order_acquire);
    if (st == SHM_WORKER_EMPTY)
        return false;
    out->index = index;
    out->state = (shm_worker_state)st;
    out->state_name = state_name(st);
    out->pid = w->pid;
    out->pid_alive = shoalctl_pid_running(out->pid);
    out->quiet_s = seconds_since(atomic_load(&w->heartbeat_ns));
    int exits = atomic_load(&w->exits);
    uint64_t dead_ns = atomic_load(&w->dead_ns);
    char code[96], when[32], ago[32];
    shoalctl_exit_text(atomic_load(&w->exit_code), code, sizeof code);
    shoalctl_format_time(when, sizeof when, dead_ns);
    shoalctl_format_span(ago, sizeof ago, seconds_since(dead_ns));
    if (exits > 0 && dead_ns)
        snprintf(out->last_exit, sizeof out->last_exit, "%s at %s", code, when);
    bool running = st == SHM_WORKER_READY || st == SHM_WORKER_DRAINING;
    if (running) {
        out->up_s = seconds_since(atomic_load(&w->started_ns));
        char quiet[32];
        shoalctl_format_span(quiet, sizeof quiet, out->quiet_s);
        if (!out->pid_alive) {
            out->gone = true;
            snprintf(out->health, sizeof out->health,
                     "gone: pid %d is not running (not answering for %s)%s", out->pid, quiet,
                     c->running ? "; its coordinator will notice" : "");
        } else if (out->quiet_s * 1000.0 > SHOAL_REPORT_LATE_MS) {
            out->late = true;
            snprintf(out->health, sizeof out->health, "not answering for %s", quiet);
        } else {
            snprintf(out->health, sizeof out->health, "ok");
        }
    } else if (st == SHM_WORKER_DEAD) {
        out->down_s = seconds_since(dead_ns);
        snprintf(out->health, sizeof out->health, "dead since %s (%s ago), %s%s", when, ago, code,
                 !c->running                     ? ""
                 : atomic_load(&w->managed) != 0 ? "; the coordinator restarts it"
                                                 : "; its unit restarts it (systemd)");
    } else if (st == SHM_WORKER_DRAINED) {
        out->down_s = seconds_since(dead_ns);
        snprintf(out->health, sizeof out->health,
                 "drained since %s (%s ago), %s; `shoalctl undrain %d` brings it back", when, ago,
                 code, index);
    } else {
        snprintf(out->health, sizeof out->health, "%s", out->state_name);
    }
    return true;
}
