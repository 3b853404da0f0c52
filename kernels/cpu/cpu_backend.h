/* cpu_backend.h: opening the CPU backend (the reference of every op). */
#ifndef SHOAL_KERNELS_CPU_BACKEND_H
#define SHOAL_KERNELS_CPU_BACKEND_H

#include "kernels/kernels_backend.h"

/* Opens a CPU backend with `threads` threads (0 = one per processor). Its
 * matmul takes AVX-512 where the processor has it. */
shoal_err cpu_backend_open(int threads, kernels_backend **out, shoal_diag *diag);

/* cpu_backend_open with the portable matmul on every processor, so that
 * tests compare the two. */
shoal_err cpu_backend_open_portable(int threads, kernels_backend **out, shoal_diag *diag);

/* Threads of its pool. */
int cpu_backend_threads(kernels_backend *be);

#endif
