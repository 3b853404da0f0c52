/* arena.cu: the CUDA backend's shared arenas (kernels_backend.h, "Arenas"),
 * the twin of kernels/cpu/arena.c.
 *
 * An arena is one VMM allocation (cuMemCreate) that can be exported as a
 * POSIX file descriptor, mapped at an address range we reserve and made
 * readable and writable by the backend's GPU. Another process imports the
 * fd (cuMemImportFromShareableHandle), maps it in its own address space and
 * gives its own GPU access: when that GPU is another one, its ops reach the
 * memory peer to peer (NVLink on the H200 machines). The allocation lives
 * as long as any mapping of it in any process, or an fd naming it, does. */
#include "cuda_ops.h"

#include <cuda.h>
#include <cudaTypedefs.h>

extern "C" {
#include "common/common_log.h"
}

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* The driver functions, looked up through the runtime rather than linked:
 * a link against libcuda would keep every binary of a CUDA build (every
 * test among them) from starting on a machine without the NVIDIA driver,
 * where today they run or skip (CI builds CUDA and has no GPU). */
static struct {
    PFN_cuGetErrorString_v6000 GetErrorString;
    PFN_cuGetErrorName_v6000 GetErrorName;
    PFN_cuDeviceGet_v2000 DeviceGet;
    PFN_cuDeviceGetAttribute_v2000 DeviceGetAttribute;
    PFN_cuMemGetAllocationGranularity_v10020 MemGetAllocationGranularity;
    PFN_cuMemGetAllocationPropertiesFromHandle_v10020 MemGetAllocationPropertiesFromHandle;
    PFN_cuMemCreate_v10020 MemCreate;
    PFN_cuMemRelease_v10020 MemRelease;
    PFN_cuMemExportToShareableHandle_v10020 MemExportToShareableHandle;
    PFN_cuMemImportFromShareableHandle_v10020 MemImportFromShareableHandle;
    PFN_cuMemAddressReserve_v10020 MemAddressReserve;
    PFN_cuMemAddressFree_v10020 MemAddressFree;
    PFN_cuMemMap_v10020 MemMap;
    PFN_cuMemUnmap_v10020 MemUnmap;
    PFN_cuMemSetAccess_v10020 MemSetAccess;
} drv;
static const char *drv_missing; /* the first function the driver lacks */
static char drv_why[128];
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;

static void drv_load(void)
{
    /* The ABI each pointer type above is of: the newest version of every
     * one of them at CUDA 12.0. */
    const unsigned version = 12000;
    struct {
        const char *name;
        void **fn;
    } want[] = {
        {"cuGetErrorString", (void **)&drv.GetErrorString},
        {"cuGetErrorName", (void **)&drv.GetErrorName},
        {"cuDeviceGet", (void **)&drv.DeviceGet},
        {"cuDeviceGetAttribute", (void **)&drv.DeviceGetAttribute},
        {"cuMemGetAllocationGranularity", (void **)&drv.MemGetAllocationGranularity},
        {"cuMemGetAllocationPropertiesFromHandle",
         (void **)&drv.MemGetAllocationPropertiesFromHandle},
        {"cuMemCreate", (void **)&drv.MemCreate},
        {"cuMemRelease", (void **)&drv.MemRelease},
        {"cuMemExportToShareableHandle", (void **)&drv.MemExportToShareableHandle},
        {"cuMemImportFromShareableHandle", (void **)&drv.MemImportFromShareableHandle},
        {"cuMemAddressReserve", (void **)&drv.MemAddressReserve},
        {"cuMemAddressFree", (void **)&drv.MemAddressFree},
        {"cuMemMap", (void **)&drv.MemMap},
        {"cuMemUnmap", (void **)&drv.MemUnmap},
        {"cuMemSetAccess", (void **)&drv.MemSetAccess},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
        cudaError_t e = cudaGetDriverEntryPointByVersion(want[i].name, want[i].fn, version,
                                                         cudaEnableDefault, &found);
        if (e != cudaSuccess || found != cudaDriverEntryPointSuccess || !*want[i].fn) {
            cudaGetLastError();
            drv_missing = want[i].name;
            snprintf(drv_why, sizeof drv_why, "%s",
                     e != cudaSuccess ? cudaGetErrorString(e)
                     : found == cudaDriverEntryPointVersionNotSufficent
                         ? "the driver is older than CUDA 12.0"
                         : "not found");
            return;
        }
    }
}

/* The driver table, or an error (logged) when the driver lacks a part. */
static shoal_err drv_ready(const char *what)
{
    pthread_once(&drv_once, drv_load);
    if (!drv_missing)
        return SHOAL_OK;
    LOG_ERROR("cuda arena: %s: the NVIDIA driver does not provide %s (%s); update the driver to "
              "one of CUDA 12 or later",
              what, drv_missing, drv_why);
    return SHOAL_ERR_UNSUPPORTED;
}

/* Logs a failed driver call with what to do, and returns its shoal_err:
 * the VMM calls' errors are not sticky, so they leave the backend usable. */
static shoal_err drv_fail(const char *what, CUresult r, const char *advice)
{
    const char *name = "?", *text = "?";
    drv.GetErrorName(r, &name);
    drv.GetErrorString(r, &text);
    LOG_ERROR("cuda arena: %s: %s (%s)%s%s", what, text, name, advice ? "; " : "",
              advice ? advice : "");
    switch (r) {
    case CUDA_ERROR_OUT_OF_MEMORY: return SHOAL_ERR_NOMEM;
    case CUDA_ERROR_NOT_SUPPORTED: return SHOAL_ERR_UNSUPPORTED;
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_HANDLE: return SHOAL_ERR_INVALID;
    default: return SHOAL_ERR_DEVICE;
    }
}

/* The driver calls work on the current device's context: make it ours for
 * the call and give the caller's back after. */
static bool enter_device(kernels_backend *be, int *prev)
{
    cudaError_t e = cudaGetDevice(prev);
    if (e == cudaSuccess)
        e = cudaSetDevice(cuda_of(be)->device);
    if (e != cudaSuccess) {
        cudaGetLastError();
        LOG_ERROR("cuda arena: cannot select GPU %d: %s", cuda_of(be)->device,
                  cudaGetErrorString(e));
        return false;
    }
    return true;
}

static void leave_device(int prev)
{
    cudaSetDevice(prev);
}

static CUmemAccessDesc access_of(CUdevice dev)
{
    CUmemAccessDesc d;
    memset(&d, 0, sizeof d);
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = dev;
    d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return d;
}

shoal_err cuda_arena_create(kernels_backend *be, size_t bytes, void **ptr, int *fd,
                                       size_t *mapped_bytes)
{
    cuda_state *st = cuda_of(be);
    shoal_err err;
    *ptr = NULL;
    *fd = -1;
    *mapped_bytes = 0;
    if (st->err)
        return st->err;
    if (bytes == 0) {
        LOG_ERROR("cuda arena: 0 bytes asked; an arena holds at least one byte");
        return SHOAL_ERR_INVALID;
    }
    if ((err = drv_ready("create")))
        return err;
    int prev;
    if (!enter_device(be, &prev))
        return SHOAL_ERR_DEVICE;
    CUresult r;
    CUdevice dev;
    int vmm = 0, posix_fd = 0;
    size_t gran = 0, rounded = 0;
    CUmemGenericAllocationHandle handle = 0;
    CUdeviceptr va = 0;
    int f = -1;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    if ((r = drv.DeviceGet(&dev, st->device)) != CUDA_SUCCESS ||
        (r = drv.DeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                    dev)) != CUDA_SUCCESS ||
        (r = drv.DeviceGetAttribute(
             &posix_fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev)) !=
            CUDA_SUCCESS) {
        err = drv_fail("reading the GPU's attributes", r, NULL);
        goto out;
    }
    if (!vmm || !posix_fd) {
        LOG_ERROR("cuda arena: GPU %d cannot share memory with other processes (virtual memory "
                  "management %s, file-descriptor handles %s); workers cannot read each other's "
                  "pages here: update the driver, or run on a GPU and setup (no vGPU) that "
                  "offers both",
                  st->device, vmm ? "yes" : "no", posix_fd ? "yes" : "no");
        err = SHOAL_ERR_UNSUPPORTED;
        goto out;
    }
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    if ((r = drv.MemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)) !=
        CUDA_SUCCESS) {
        err = drv_fail("cuMemGetAllocationGranularity", r, NULL);
        goto out;
    }
    if (bytes > SIZE_MAX - gran) {
        LOG_ERROR("cuda arena: %zu bytes asked: more than any GPU holds", bytes);
        err = SHOAL_ERR_INVALID;
        goto out;
    }
    rounded = (bytes + gran - 1) / gran * gran;
    if ((r = drv.MemCreate(&handle, rounded, &prop, 0)) != CUDA_SUCCESS) {
        char what[96];
        snprintf(what, sizeof what, "cuMemCreate of %zu bytes (%.1f MiB) on GPU %d", rounded,
                 (double)rounded / 1048576.0, st->device);
        err = drv_fail(what, r,
                       r == CUDA_ERROR_OUT_OF_MEMORY
                           ? "lower --kv-pages or --kv-memory-fraction"
                           : NULL);
        goto out;
    }
    if ((r = drv.MemExportToShareableHandle(&f, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                            0)) != CUDA_SUCCESS) {
        f = -1;
        err = drv_fail("cuMemExportToShareableHandle", r, NULL);
        goto out_release;
    }
    /* The fd is the caller's, close-on-exec as every fd shoal makes. */
    fcntl(f, F_SETFD, FD_CLOEXEC);
    if ((r = drv.MemAddressReserve(&va, rounded, gran, 0, 0)) != CUDA_SUCCESS) {
        err = drv_fail("cuMemAddressReserve", r, NULL);
        goto out_close_fd;
    }
    if ((r = drv.MemMap(va, rounded, 0, handle, 0)) != CUDA_SUCCESS) {
        err = drv_fail("cuMemMap", r, NULL);
        goto out_free_va;
    }
    {
        CUmemAccessDesc access = access_of(dev);
        if ((r = drv.MemSetAccess(va, rounded, &access, 1)) != CUDA_SUCCESS) {
            err = drv_fail("cuMemSetAccess", r, NULL);
            goto out_unmap;
        }
    }
    /* The mapping holds the allocation from here; the handle can go. */
    drv.MemRelease(handle);
    handle = 0;
    /* Zero-filled, as the contract says, before anything can use it. An
     * error here is the runtime's and poisons the backend as any op's. */
    {
        cudaError_t e = cudaMemsetAsync((void *)va, 0, rounded, st->stream);
        if (e == cudaSuccess)
            e = cudaStreamSynchronize(st->stream);
        if (e != cudaSuccess) {
            cuda_fail(be, "arena: zero-fill", e);
            err = st->err;
            goto out_unmap;
        }
    }
    *ptr = (void *)va;
    *fd = f;
    *mapped_bytes = rounded;
    leave_device(prev);
    return SHOAL_OK;
out_unmap:
    drv.MemUnmap(va, rounded);
out_free_va:
    drv.MemAddressFree(va, rounded);
out_close_fd:
    close(f);
out_release:
    if (handle)
        drv.MemRelease(handle);
out:
    leave_device(prev);
    return err;
}

shoal_err cuda_arena_import(kernels_backend *be, int fd, size_t bytes, void **ptr)
{
    cuda_state *st = cuda_of(be);
    shoal_err err;
    *ptr = NULL;
    if (st->err)
        return st->err;
    if ((err = drv_ready("import")))
        return err;
    int prev;
    if (!enter_device(be, &prev))
        return SHOAL_ERR_DEVICE;
    CUresult r;
    CUdevice dev;
    size_t gran = 0;
    CUmemGenericAllocationHandle handle = 0;
    CUdeviceptr va = 0;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    if ((r = drv.DeviceGet(&dev, st->device)) != CUDA_SUCCESS) {
        err = drv_fail("cuDeviceGet", r, NULL);
        goto out;
    }
    /* The fd is not consumed: the handle we get is our own reference. */
    if ((r = drv.MemImportFromShareableHandle(&handle, (void *)(uintptr_t)fd,
                                              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) !=
        CUDA_SUCCESS) {
        handle = 0;
        char what[96];
        snprintf(what, sizeof what, "importing fd %d on GPU %d", fd, st->device);
        err = drv_fail(what, r,
                       "the fd names no exported CUDA allocation (is the peer a worker of this "
                       "build on a GPU of this host?)");
        if (err == SHOAL_ERR_DEVICE)
            err = SHOAL_ERR_INVALID;
        goto out;
    }
    /* Map with the granularity of the allocation itself: it may sit on
     * another GPU than ours. */
    if ((r = drv.MemGetAllocationPropertiesFromHandle(&prop, handle)) != CUDA_SUCCESS ||
        (r = drv.MemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)) !=
            CUDA_SUCCESS) {
        err = drv_fail("reading the imported allocation's properties", r, NULL);
        goto out_release;
    }
    if (bytes == 0 || bytes % gran != 0) {
        LOG_ERROR("cuda arena import: %zu bytes asked of fd %d, not a multiple of the arena's "
                  "granularity (%zu): pass the arena_bytes its exporter announced",
                  bytes, fd, gran);
        err = SHOAL_ERR_INVALID;
        goto out_release;
    }
    if ((r = drv.MemAddressReserve(&va, bytes, gran, 0, 0)) != CUDA_SUCCESS) {
        err = drv_fail("cuMemAddressReserve", r, NULL);
        goto out_release;
    }
    if ((r = drv.MemMap(va, bytes, 0, handle, 0)) != CUDA_SUCCESS) {
        char what[96];
        snprintf(what, sizeof what, "mapping %zu bytes of fd %d", bytes, fd);
        err = drv_fail(what, r, "is the peer's arena smaller than it announced?");
        /* the driver answers a size past the allocation with NOT_SUPPORTED */
        if (err != SHOAL_ERR_NOMEM)
            err = SHOAL_ERR_INVALID;
        goto out_free_va;
    }
    {
        /* Access for our GPU; where the memory sits on another one this is
         * a peer mapping, which needs peer access between the two. */
        CUmemAccessDesc access = access_of(dev);
        if ((r = drv.MemSetAccess(va, bytes, &access, 1)) != CUDA_SUCCESS) {
            char what[128];
            snprintf(what, sizeof what,
                     "giving GPU %d access to an arena on GPU %d (as this process counts them)",
                     st->device, prop.location.id);
            err = drv_fail(what, r,
                           "the two GPUs have no peer access to each other (see nvidia-smi topo "
                           "-p2p r): pages between them must go through the host");
            goto out_unmap;
        }
    }
    /* The mapping keeps the memory alive, also after its creator is gone. */
    drv.MemRelease(handle);
    *ptr = (void *)va;
    leave_device(prev);
    return SHOAL_OK;
out_unmap:
    drv.MemUnmap(va, bytes);
out_free_va:
    drv.MemAddressFree(va, bytes);
out_release:
    drv.MemRelease(handle);
out:
    leave_device(prev);
    return err;
}

void cuda_arena_unmap(kernels_backend *be, void *ptr, size_t bytes)
{
    if (!ptr)
        return;
    cuda_state *st = cuda_of(be);
    /* drv was loaded by the create or import that made ptr */
    int prev;
    if (!enter_device(be, &prev))
        return;
    /* Ops queued before may still read or write the range. */
    cudaError_t e = cudaStreamSynchronize(st->stream);
    if (e != cudaSuccess && !st->err)
        cuda_fail(be, "arena unmap: synchronize", e);
    CUresult r;
    if ((r = drv.MemUnmap((CUdeviceptr)ptr, bytes)) != CUDA_SUCCESS)
        drv_fail("cuMemUnmap", r, "the range was not an arena of this size");
    else if ((r = drv.MemAddressFree((CUdeviceptr)ptr, bytes)) != CUDA_SUCCESS)
        drv_fail("cuMemAddressFree", r, NULL);
    leave_device(prev);
}
