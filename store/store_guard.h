/* store_guard.h: a read of a damaged data.mdb turned into an error.
 *
 * LMDB reads its file through a memory map and follows the pointers it
 * finds there: a damaged page (a branch pointing past the file, a length
 * past a page) makes the read fault, SIGBUS past the file's end or SIGSEGV
 * past the map, and the process died (a worker at every restart, shoalctl
 * states verify before it could say what was wrong).
 *
 * A thread that reads or writes the store pushes a guard: the map's address
 * range and a sigsetjmp buffer set in the caller's own frame. The process's
 * SIGBUS, SIGSEGV and SIGFPE handler (installed once, store_guard_install)
 * jumps back to the thread's guard when the fault's address lies in its
 * range, or on a division by zero (LMDB divides by counts it read: garbage
 * may hold a zero); every other fault goes to the handler that was there
 * before (a bug still crashes, and a sanitizer still reports it). The caller then ends its
 * transaction and marks the store damaged (store_env.c).
 *
 *     store_guard g;
 *     store_guard_push(&g, lo, hi, txn);
 *     if (sigsetjmp(g.jb, 1) != 0)
 *         ... the fault: g.addr, g.sig; g is popped already ...
 *     g.armed = 1;
 *     ... reads of the map ...
 *     store_guard_pop(txn);
 *
 * Locals the caller writes after sigsetjmp are not to be read after the
 * jump (C's rule for longjmp); the transaction is set before. */
#ifndef SHOAL_STORE_GUARD_H
#define SHOAL_STORE_GUARD_H

#include <lmdb.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>

enum { STORE_GUARD_CURSORS = 8 };

typedef struct store_guard {
    sigjmp_buf jb;
    uintptr_t lo, hi;             /* the map's addresses [lo, hi); lo 0: none known */
    const void *txn;              /* the transaction it guards */
    volatile sig_atomic_t armed;  /* jb is set: a fault may jump */
    volatile uintptr_t addr;      /* after a jump: the faulting address */
    volatile int sig;             /* and the signal */
    struct store_guard *prev;     /* the thread's guard below it */
    /* cursors open in the transaction (store_guard_cursor_open): closed
     * after a fault, whose jump left their closes behind */
    MDB_cursor *cursors[STORE_GUARD_CURSORS];
    int n_cursors;
} store_guard;

/* Installs the SIGBUS, SIGSEGV and SIGFPE handler, once a process (later
 * calls do nothing). */
void store_guard_install(void);

/* Pushes g on the calling thread's guards (not armed yet). */
void store_guard_push(store_guard *g, uintptr_t lo, uintptr_t hi, const void *txn);

/* Pops the thread's top guard if it guards txn; else does nothing. */
void store_guard_pop(const void *txn);

/* mdb_cursor_open and mdb_cursor_close, the cursor kept on the thread's
 * guard of txn (if any) while open. */
int store_guard_cursor_open(MDB_txn *txn, MDB_dbi dbi, MDB_cursor **cur);
void store_guard_cursor_close(MDB_cursor *cur);

/* After a fault: closes g's cursors (before its transaction ends). */
void store_guard_close_cursors(store_guard *g);

#endif
