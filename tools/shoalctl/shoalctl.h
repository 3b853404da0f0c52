/* shoalctl.h: the admin CLI's subcommands, one file each.
 *
 * shoalctl_main.c dispatches `shoalctl NAME ...` to the command of that
 * name with argv[0] = NAME. A command returns the process's exit status:
 * SHOALCTL_OK, SHOALCTL_ERROR (it ran and found or hit a problem, said on
 * stderr naming the file and what to do) or SHOALCTL_USAGE (the command
 * line is wrong; usage on stderr). */
#ifndef SHOAL_TOOLS_SHOALCTL_H
#define SHOAL_TOOLS_SHOALCTL_H

#include <stdio.h>

enum { SHOALCTL_OK = 0, SHOALCTL_ERROR = 1, SHOALCTL_USAGE = 2 };

/* "shoalctl CMD: <message>", a blank line and the command's usage on
 * stderr; returns SHOALCTL_USAGE. */
int shoalctl_usage_error(const char *cmd, void (*usage)(FILE *), const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

typedef struct shoalctl_command {
    const char *name;
    const char *summary; /* one line for `shoalctl --help` */
    int (*run)(int argc, char **argv);
} shoalctl_command;

/* shoalctl_states.c: the LMDB state store. */
int shoalctl_states(int argc, char **argv);

/* The running cluster, from its shared segment (shoalctl_cluster.h):
 * shoalctl_pages.c, shoalctl_workers.c, shoalctl_streams.c and
 * shoalctl_drain.c (drain and undrain). */
int shoalctl_pages(int argc, char **argv);
int shoalctl_workers(int argc, char **argv);
int shoalctl_streams(int argc, char **argv);
int shoalctl_drain(int argc, char **argv);
int shoalctl_undrain(int argc, char **argv);

#endif
