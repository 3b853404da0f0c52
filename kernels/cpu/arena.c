/* arena.c: the CPU backend's shared arenas (kernels_backend.h, "Arenas").
 *
 * An arena is a memfd mapped MAP_SHARED: the fd, passed to another process
 * over SCM_RIGHTS, maps the same pages there. This is the CPU twin of the
 * CUDA backend's VMM arenas (kernels/cuda/arena.cu), so the whole export,
 * import and copy path runs in CI. */
#include "cpu_ops.h"

#include "common/common_log.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static size_t host_page_bytes(void)
{
    long page = sysconf(_SC_PAGESIZE);
    return page > 0 ? (size_t)page : 4096;
}

shoal_err cpu_arena_create(kernels_backend *be, size_t bytes, void **ptr, int *fd,
                           size_t *mapped_bytes)
{
    shoal_err err;
    *ptr = NULL;
    *fd = -1;
    *mapped_bytes = 0;
    size_t page = host_page_bytes();
    if (bytes == 0 || bytes > SIZE_MAX - page) {
        LOG_ERROR("cpu arena: %zu bytes asked; an arena holds at least one byte", bytes);
        return SHOAL_ERR_INVALID;
    }
    size_t rounded = (bytes + page - 1) / page * page;
    int f = memfd_create("shoal-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (f < 0) {
        err = errno == EMFILE || errno == ENFILE ? SHOAL_ERR_LIMIT : SHOAL_ERR_IO;
        LOG_ERROR("cpu arena: memfd_create: %s (raise the open-files limit if it is reached)",
                  strerror(errno));
        return err;
    }
    /* Reserve every page now, as the alloc of the CPU backend touches its
     * memory: a short memory fails here and not as SIGBUS in a later op.
     * posix_fallocate sets the size too. */
    int rc = posix_fallocate(f, 0, (off_t)rounded);
    if (rc != 0) {
        err = rc == ENOSPC || rc == ENOMEM ? SHOAL_ERR_NOMEM : SHOAL_ERR_IO;
        LOG_ERROR("cpu arena: cannot reserve %zu bytes (%.1f MiB): %s; lower --kv-pages or "
                  "--kv-memory-fraction",
                  rounded, (double)rounded / 1048576.0, strerror(rc));
        goto out_close_fd;
    }
    /* An importer holds the same fd: sealed, it cannot shrink the file
     * under our mapping (which would turn our reads into SIGBUS). */
    if (fcntl(f, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        err = SHOAL_ERR_IO;
        LOG_ERROR("cpu arena: cannot seal the memfd: %s", strerror(errno));
        goto out_close_fd;
    }
    /* Populated now, as alloc's memset does: the first pass over a page
     * then takes no fault. */
    void *p = mmap(NULL, rounded, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, f, 0);
    if (p == MAP_FAILED) {
        err = errno == ENOMEM ? SHOAL_ERR_NOMEM : SHOAL_ERR_IO;
        LOG_ERROR("cpu arena: cannot map %zu bytes: %s", rounded, strerror(errno));
        goto out_close_fd;
    }
    /* posix_fallocate left it zero-filled, as the contract says. */
    *ptr = p;
    *fd = f;
    *mapped_bytes = rounded;
    return SHOAL_OK;
out_close_fd:
    close(f);
    return err;
}

shoal_err cpu_arena_import(kernels_backend *be, int fd, size_t bytes, void **ptr)
{
    *ptr = NULL;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        LOG_ERROR("cpu arena import: fd %d: %s", fd, strerror(errno));
        return SHOAL_ERR_INVALID;
    }
    /* Mapping past the end of the file would map pages whose reads fault
     * with SIGBUS: the file must hold every byte asked for. */
    if (bytes == 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size < (uint64_t)bytes) {
        LOG_ERROR("cpu arena import: fd %d holds %lld bytes, %zu asked: not the arena the peer "
                  "announced (is the peer a worker of this build?)",
                  fd, (long long)st.st_size, bytes);
        return SHOAL_ERR_INVALID;
    }
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        shoal_err err = errno == ENOMEM ? SHOAL_ERR_NOMEM : SHOAL_ERR_IO;
        LOG_ERROR("cpu arena import: cannot map %zu bytes of fd %d: %s", bytes, fd,
                  strerror(errno));
        return err;
    }
    *ptr = p;
    return SHOAL_OK;
}

void cpu_arena_unmap(kernels_backend *be, void *ptr, size_t bytes)
{
    if (ptr)
        munmap(ptr, bytes);
}
