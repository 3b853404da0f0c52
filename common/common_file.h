/* common_file.h: reading small files whole and mapping large ones. */
#ifndef SHOAL_COMMON_FILE_H
#define SHOAL_COMMON_FILE_H

#include "common_error.h"

#include <stddef.h>

/* Reads the file at path into a NUL-terminated heap buffer (*out, owned by
 * the caller, free()). Refuses files over max_bytes with SHOAL_ERR_LIMIT.
 * Missing file: SHOAL_ERR_NOT_FOUND. diag names the path. */
shoal_err common_file_read(const char *path, size_t max_bytes, char **out, size_t *out_bytes,
                           shoal_diag *diag);

/* A read-only mapping of a whole file. */
typedef struct common_map {
    const unsigned char *data; /* NULL for an empty file */
    size_t bytes;
} common_map;

/* Maps path read-only. Release with common_map_close. */
shoal_err common_map_open(const char *path, common_map *map, shoal_diag *diag);

/* Unmaps; idempotent, and a zeroed map is allowed. */
void common_map_close(common_map *map);

/* True if path names an existing regular file. */
_Bool common_file_exists(const char *path);

/* SHOAL_OK if dir names a directory; else SHOAL_ERR_NOT_FOUND (with diag
 * "WHAT DIR: no such directory" or "...: not a directory") or SHOAL_ERR_IO
 * (another error, named). what names the flag or role, e.g. "--model". */
shoal_err common_dir_check(const char *dir, const char *what, shoal_diag *diag);

/* Joins dir and name into buf (bytes long). SHOAL_ERR_LIMIT if it does not fit. */
shoal_err common_path_join(char *buf, size_t bytes, const char *dir, const char *name);

#endif
