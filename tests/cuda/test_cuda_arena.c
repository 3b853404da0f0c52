/* test_cuda_arena: KV arenas shared between processes on GPUs (issue #8).
 *
 * A child process (this binary run again with --export) creates an arena on
 * one GPU, writes a pattern into page 3 and serves it (shm/shm_arena.h);
 * this process fetches it, maps it on its own GPU (the same one, and with
 * two GPUs another one: a peer mapping), reads page 3 in place, copies it
 * into an arena of its own with the backend's copy op, and compares bytes
 * after download; the mapping must still read right after the child is
 * killed with SIGKILL. Then, for information only, the copy bandwidth
 * through the imported mapping beside cudaMemcpyPeer of the same bytes.
 *
 * The child is exec'd, not just forked: CUDA does not survive a fork of a
 * process that has initialised it. SHOAL_TEST_ON_CPU=1 runs it all on the
 * CPU backend (no bandwidth), a dry run of the test code where no GPU is. */
#include "shm/shm_arena.h"
#include "tests/cuda/cuda_test.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

/* A Qwen3-8B page of 16 bf16 tokens (36 layers x K,V x 8 heads x 128):
 * not a multiple of the 2 MiB mapping granularity. */
#define PAGE_BYTES (36u * 2 * 8 * 16 * 128 * 2)
#define PAGES 8
/* The arena holds the pages and the bandwidth copy's 256 MiB. */
#define BW_BYTES (256ull << 20)
#define ARENA_BYTES (BW_BYTES + (size_t)PAGES * PAGE_BYTES)
#define BW_REPS 20

static unsigned char pattern(size_t i, unsigned seed)
{
    return (unsigned char)(((i + seed) * 2654435761u) >> 13);
}

static size_t mismatches(const unsigned char *buf, size_t n, unsigned seed)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += buf[i] != pattern(i, seed);
    return bad;
}

static size_t nonzero(const unsigned char *buf, size_t n)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += buf[i] != 0;
    return bad;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* --export DEVICE CLUSTER INDEX SEED READY_FD: the exporting worker. Writes
 * one byte to READY_FD once it serves, then waits to be killed. */
static int exporter_main(char **argv)
{
    const char *device = argv[2], *cluster = argv[3];
    int index = atoi(argv[4]), ready = atoi(argv[6]);
    unsigned seed = (unsigned)strtoul(argv[5], NULL, 10);
    kernels_backend *be = open_backend(device, SHOAL_DTYPE_INVALID);
    void *arena;
    int fd;
    size_t mapped;
    if (be->arena_create(be, ARENA_BYTES, &arena, &fd, &mapped) != SHOAL_OK)
        return 2;
    unsigned char *page = xmalloc(PAGE_BYTES);
    for (size_t i = 0; i < PAGE_BYTES; i++)
        page[i] = pattern(i, seed);
    if (be->upload(be, (unsigned char *)arena + 3 * (size_t)PAGE_BYTES, page, PAGE_BYTES) ||
        be->sync(be))
        return 3;
    shm_arena_info info = {.epoch = 1,
                           .arena_bytes = mapped,
                           .page_bytes = PAGE_BYTES,
                           .page_count = PAGES,
                           .device = strcmp(device, "cpu") == 0 ? -1 : atoi(device)};
    snprintf(info.backend, sizeof info.backend, "%s", be->name);
    shm_arena_exporter *e = NULL;
    shoal_diag diag = {{0}};
    if (shm_arena_export_start(cluster, index, fd, &info, &e, &diag) != SHOAL_OK) {
        fprintf(stderr, "exporter: %s\n", diag.msg);
        return 4;
    }
    if (write(ready, "r", 1) != 1)
        return 5;
    for (;;)
        pause();
}

static kernels_backend *backends[2];

static kernels_backend *backend_on(const char *device)
{
    int i = test_dry ? 0 : atoi(device);
    if (!backends[i])
        backends[i] = open_backend(device, SHOAL_DTYPE_INVALID);
    return backends[i];
}

/* Seconds of one copy of BW_BYTES by cudaMemcpyPeer between plain
 * allocations on the two GPUs (peer access on where it exists). The
 * current device is the caller's again after: this thread drives a
 * backend, whose ops run on the current device. */
static double memcpy_peer_seconds(int src_dev, int dst_dev)
{
    void *src = NULL, *dst = NULL;
    double s = -1.0;
    int caller = 0;
    cudaGetDevice(&caller);
    if (cudaSetDevice(src_dev) != cudaSuccess || cudaMalloc(&src, BW_BYTES) != cudaSuccess ||
        cudaSetDevice(dst_dev) != cudaSuccess || cudaMalloc(&dst, BW_BYTES) != cudaSuccess)
        goto out;
    if (src_dev != dst_dev) {
        int can = 0;
        cudaDeviceCanAccessPeer(&can, dst_dev, src_dev);
        if (can && cudaDeviceEnablePeerAccess(src_dev, 0) != cudaSuccess)
            cudaGetLastError(); /* already enabled */
    }
    cudaMemcpyPeer(dst, dst_dev, src, src_dev, BW_BYTES); /* warm */
    cudaDeviceSynchronize();
    double t0 = now_s();
    for (int r = 0; r < BW_REPS; r++)
        cudaMemcpyPeerAsync(dst, dst_dev, src, src_dev, BW_BYTES, 0);
    if (cudaDeviceSynchronize() == cudaSuccess)
        s = (now_s() - t0) / BW_REPS;
out:
    cudaGetLastError();
    cudaFree(dst);
    cudaSetDevice(src_dev);
    cudaFree(src);
    cudaSetDevice(caller);
    return s;
}

static void share_a_page(const char *exp_dev, const char *imp_dev, const char *cluster,
                         int index)
{
    printf("  arena on %s, mapped and copied on %s\n", exp_dev, imp_dev);
    fflush(stdout);
    unsigned seed = (unsigned)rnd_below(1u << 30);
    int ready[2];
    CHECK(pipe(ready) == 0);
    char a_index[16], a_seed[16], a_fd[16];
    snprintf(a_index, sizeof a_index, "%d", index);
    snprintf(a_seed, sizeof a_seed, "%u", seed);
    snprintf(a_fd, sizeof a_fd, "%d", ready[1]);
    pid_t pid = fork();
    if (pid == 0) {
        close(ready[0]);
        char *args[] = {"test_cuda_arena", "--export", (char *)exp_dev, (char *)cluster,
                        a_index,           a_seed,     a_fd,            NULL};
        execv("/proc/self/exe", args);
        _exit(127);
    }
    close(ready[1]);
    char x;
    bool serving = read(ready[0], &x, 1) == 1;
    close(ready[0]);
    CHECK_MSG(serving, "the exporting child died before serving");
    kernels_backend *be = backend_on(imp_dev);
    shm_arena_info info;
    int fd = -1;
    void *peer = NULL, *own = NULL;
    int own_fd = -1;
    size_t own_bytes = 0;
    unsigned char *page = xmalloc(PAGE_BYTES);
    shoal_diag diag = {{0}};
    if (!serving)
        goto out_kill;
    CHECK_MSG(shm_arena_fetch(cluster, index, 10000, &info, &fd, &diag) == SHOAL_OK, "%s",
              diag.msg);
    if (fd < 0)
        goto out_kill;
    CHECK_EQ_INT(info.device, test_dry ? -1 : atoi(exp_dev));
    CHECK(strcmp(info.backend, be->name) == 0);
    CHECK(info.arena_bytes >= ARENA_BYTES);
    /* more than the arena holds is refused, and leaves the backend usable
     * (not under compute-sanitizer, which reports the driver's refusal) */
    if (!test_sanitize) {
        void *too_far = NULL;
        CHECK(be->arena_import(be, fd, info.arena_bytes + (2u << 20), &too_far) ==
              SHOAL_ERR_INVALID);
        CHECK(too_far == NULL);
        /* and so is an fd that names no arena at all */
        int p[2];
        void *none = NULL;
        CHECK(pipe(p) == 0);
        CHECK(be->arena_import(be, p[0], 2u << 20, &none) == SHOAL_ERR_INVALID);
        CHECK(none == NULL);
        close(p[0]);
        close(p[1]);
    }
    CHECK(be->arena_import(be, fd, info.arena_bytes, &peer) == SHOAL_OK);
    close(fd);
    if (!peer)
        goto out_kill;
    CHECK(be->arena_create(be, ARENA_BYTES, &own, &own_fd, &own_bytes) == SHOAL_OK);
    if (!own)
        goto out_kill;
    /* read in place */
    CHECK(be->download(be, page, (unsigned char *)peer + 3 * (size_t)PAGE_BYTES, PAGE_BYTES) ==
          SHOAL_OK);
    CHECK_EQ_INT(mismatches(page, PAGE_BYTES, seed), 0);
    /* copied: their page 3 to our page 5 */
    CHECK(be->copy(be, (unsigned char *)own + 5 * (size_t)PAGE_BYTES,
                   (unsigned char *)peer + 3 * (size_t)PAGE_BYTES, PAGE_BYTES) == SHOAL_OK);
    CHECK(be->download(be, page, (unsigned char *)own + 5 * (size_t)PAGE_BYTES, PAGE_BYTES) ==
          SHOAL_OK);
    CHECK_EQ_INT(mismatches(page, PAGE_BYTES, seed), 0);
    CHECK(be->download(be, page, (unsigned char *)own + 4 * (size_t)PAGE_BYTES, PAGE_BYTES) ==
          SHOAL_OK);
    CHECK_EQ_INT(nonzero(page, PAGE_BYTES), 0);

    if (!test_dry && !test_sanitize) {
        /* print only: speeds depend on the machine and what else runs */
        be->copy(be, own, peer, BW_BYTES); /* warm */
        be->sync(be);
        double t0 = now_s();
        for (int r = 0; r < BW_REPS; r++)
            be->copy(be, own, peer, BW_BYTES);
        CHECK(be->sync(be) == SHOAL_OK);
        double mapped_s = (now_s() - t0) / BW_REPS;
        double peer_s = memcpy_peer_seconds(atoi(exp_dev), atoi(imp_dev));
        printf("  bandwidth GPU %s -> GPU %s, 256 MiB: copy through the imported arena %.1f GB/s, "
               "cudaMemcpyPeer %.1f GB/s\n",
               exp_dev, imp_dev, (double)BW_BYTES / mapped_s / 1e9,
               peer_s > 0 ? (double)BW_BYTES / peer_s / 1e9 : 0.0);
        fflush(stdout);
    }

out_kill:
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK_MSG(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "exporter status 0x%x",
              status);
    if (peer) {
        /* its worker is gone; the pages are not */
        CHECK(be->download(be, page, (unsigned char *)peer + 3 * (size_t)PAGE_BYTES,
                           PAGE_BYTES) == SHOAL_OK);
        CHECK_EQ_INT(mismatches(page, PAGE_BYTES, seed), 0);
        be->arena_unmap(be, peer, info.arena_bytes);
    }
    if (own) {
        be->arena_unmap(be, own, own_bytes);
        close(own_fd);
    }
    free(page);
}

static char cluster[32];

static void a_page_of_an_arena_on_the_same_gpu(void)
{
    share_a_page(test_gpu, test_gpu, cluster, 0);
}

static void a_page_of_an_arena_on_another_gpu(void)
{
    if (test_dry || cuda_backend_device_count() < 2) {
        printf("  (skipped: one GPU)\n");
        return;
    }
    share_a_page("0", "1", cluster, 1);
}

int main(int argc, char **argv)
{
    if (argc == 7 && strcmp(argv[1], "--export") == 0)
        return exporter_main(argv);
    cuda_test_start("test_cuda_arena", argc, argv);
    snprintf(cluster, sizeof cluster, "cuda-arena-%d", (int)getpid());
    TEST_RUN(a_page_of_an_arena_on_the_same_gpu);
    TEST_RUN(a_page_of_an_arena_on_another_gpu);
    for (int i = 0; i < 2; i++)
        kernels_backend_close(backends[i]);
    return TEST_EXIT();
}
