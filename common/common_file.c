#include "common_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static shoal_err errno_to_err(int e)
{
    return e == ENOENT ? SHOAL_ERR_NOT_FOUND : e == ENOMEM ? SHOAL_ERR_NOMEM : SHOAL_ERR_IO;
}

shoal_err common_file_read(const char *path, size_t max_bytes, char **out, size_t *out_bytes,
                           shoal_diag *diag)
{
    shoal_err err;
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return shoal_diag_set(diag, errno_to_err(errno), "%s: cannot open: %s", path,
                              strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        err = shoal_diag_set(diag, SHOAL_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
        goto out_close;
    }
    if (!S_ISREG(st.st_mode)) {
        err = shoal_diag_set(diag, SHOAL_ERR_FORMAT, "%s: not a regular file", path);
        goto out_close;
    }
    if ((size_t)st.st_size > max_bytes) {
        err = shoal_diag_set(diag, SHOAL_ERR_LIMIT, "%s: %lld bytes, over the limit of %zu",
                             path, (long long)st.st_size, max_bytes);
        goto out_close;
    }
    size_t bytes = (size_t)st.st_size;
    char *buf = malloc(bytes + 1);
    if (!buf) {
        err = shoal_diag_set(diag, SHOAL_ERR_NOMEM, "%s: no memory for %zu bytes", path, bytes);
        goto out_close;
    }
    size_t got = 0;
    while (got < bytes) {
        ssize_t n = read(fd, buf + got, bytes - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            err = shoal_diag_set(diag, SHOAL_ERR_IO, "%s: short read", path);
            free(buf);
            goto out_close;
        }
        got += (size_t)n;
    }
    buf[bytes] = '\0';
    *out = buf;
    if (out_bytes)
        *out_bytes = bytes;
    err = SHOAL_OK;
out_close:
    close(fd);
    return err;
}

shoal_err common_map_open(const char *path, common_map *map, shoal_diag *diag)
{
    shoal_err err = SHOAL_OK;
    memset(map, 0, sizeof *map);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return shoal_diag_set(diag, errno_to_err(errno), "%s: cannot open: %s", path,
                              strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        err = shoal_diag_set(diag, SHOAL_ERR_IO, "%s: not a readable regular file", path);
        goto out_close;
    }
    map->bytes = (size_t)st.st_size;
    if (map->bytes > 0) {
        void *p = mmap(NULL, map->bytes, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            err = shoal_diag_set(diag, SHOAL_ERR_IO, "%s: cannot map: %s", path, strerror(errno));
            map->bytes = 0;
            goto out_close;
        }
        map->data = p;
    }
out_close:
    close(fd);
    return err;
}

void common_map_close(common_map *map)
{
    if (map->data)
        munmap((void *)map->data, map->bytes);
    map->data = NULL;
    map->bytes = 0;
}

_Bool common_file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

shoal_err common_dir_check(const char *dir, const char *what, shoal_diag *diag)
{
    struct stat st;
    if (stat(dir, &st) != 0)
        return shoal_diag_set(diag, errno == ENOENT ? SHOAL_ERR_NOT_FOUND : SHOAL_ERR_IO,
                              "%s %s: %s", what, dir,
                              errno == ENOENT ? "no such directory" : strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return shoal_diag_set(diag, SHOAL_ERR_NOT_FOUND, "%s %s: not a directory", what, dir);
    return SHOAL_OK;
}

shoal_err common_path_join(char *buf, size_t bytes, const char *dir, const char *name)
{
    int n = snprintf(buf, bytes, "%s/%s", dir, name);
    return n < 0 || (size_t)n >= bytes ? SHOAL_ERR_LIMIT : SHOAL_OK;
}
