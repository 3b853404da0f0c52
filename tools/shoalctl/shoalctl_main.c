/* shoalctl: the admin CLI of a shoal cluster. Each subcommand lives in its
 * own file (shoalctl_<name>.c) and is listed in `commands` below. */
#include "shoalctl.h"

#include "common/common_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const shoalctl_command commands[] = {
    {"pages", "KV pages of every worker: free, active, cached, leased, prefixes; --watch",
     shoalctl_pages},
    {"workers", "pid, device, state, uptime, streams and tokens/s of every worker",
     shoalctl_workers},
    {"streams", "every stream the workers hold: state, tokens so far, pages held",
     shoalctl_streams},
    {"drain", "stop placing streams on worker N, let it finish and exit", shoalctl_drain},
    {"undrain", "bring a drained worker back", shoalctl_undrain},
    {"states", "conversation states in the LMDB store: list, show, rm, verify, stats, compact",
     shoalctl_states},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: shoalctl COMMAND [ARGS...]   (shoalctl COMMAND --help for more)\n\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\nThe cluster commands read /dev/shm/shoal.NAME: --cluster NAME (default\n"
               "$SHOAL_CLUSTER, else the one cluster running).\n"
               "exit status: 0 ok, 1 error (or problems found), 2 usage\n");
}

int main(int argc, char **argv)
{
    common_log_init("shoalctl", COMMON_LOG_WARN);
    if (argc < 2) {
        usage(stderr);
        return SHOALCTL_USAGE;
    }
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        usage(stdout);
        return SHOALCTL_OK;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "shoalctl: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return SHOALCTL_USAGE;
}

int shoalctl_usage_error(const char *cmd, void (*usage_of)(FILE *), const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "shoalctl %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n\n");
    va_end(ap);
    usage_of(stderr);
    return SHOALCTL_USAGE;
}
