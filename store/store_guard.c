#include "store/store_guard.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

static _Thread_local store_guard *top;
static struct sigaction before[3]; /* SIGBUS's, SIGSEGV's, SIGFPE's */
static pthread_once_t installed = PTHREAD_ONCE_INIT;

static struct sigaction *before_of(int sig)
{
    return &before[sig == SIGBUS ? 0 : sig == SIGSEGV ? 1 : 2];
}

/* Not ours: the handler that was there, or the default action (the fault
 * happens again on return, and kills). */
static void pass_on(int sig, siginfo_t *info, void *uc)
{
    const struct sigaction *old = before_of(sig);
    if (old->sa_flags & SA_SIGINFO) {
        old->sa_sigaction(sig, info, uc);
        return;
    }
    if (old->sa_handler != SIG_DFL && old->sa_handler != SIG_IGN) {
        old->sa_handler(sig);
        return;
    }
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
}

static void on_fault(int sig, siginfo_t *info, void *uc)
{
    store_guard *g = top;
    uintptr_t a = (uintptr_t)info->si_addr;
    /* a fault in the map; or a division by zero (its address is the
     * instruction's), which only the store's garbage brings in a guarded
     * read */
    bool ours = g && g->armed && g->lo != 0 && (sig == SIGFPE || (a >= g->lo && a < g->hi));
    if (ours) {
        top = g->prev;
        g->addr = a;
        g->sig = sig;
        siglongjmp(g->jb, 1);
    }
    pass_on(sig, info, uc);
}

static void install_once(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, before_of(SIGBUS));
    sigaction(SIGSEGV, &sa, before_of(SIGSEGV));
    sigaction(SIGFPE, &sa, before_of(SIGFPE));
}

void store_guard_install(void)
{
    pthread_once(&installed, install_once);
}

void store_guard_push(store_guard *g, uintptr_t lo, uintptr_t hi, const void *txn)
{
    g->lo = lo;
    g->hi = hi;
    g->txn = txn;
    g->armed = 0;
    g->addr = 0;
    g->sig = 0;
    g->n_cursors = 0;
    g->prev = top;
    top = g;
}

int store_guard_cursor_open(MDB_txn *txn, MDB_dbi dbi, MDB_cursor **cur)
{
    /* A database's first use in a transaction reads its root (a fault
     * there, inside mdb_cursor_open, would leave the cursor it allocated
     * unknown to us): mdb_stat reads it first with a cursor on its stack. */
    MDB_stat st;
    (void)mdb_stat(txn, dbi, &st);
    int rc = mdb_cursor_open(txn, dbi, cur);
    if (rc == 0 && top && top->txn == txn && top->n_cursors < STORE_GUARD_CURSORS)
        top->cursors[top->n_cursors++] = *cur;
    return rc;
}

void store_guard_cursor_close(MDB_cursor *cur)
{
    for (int i = 0; top && i < top->n_cursors; i++)
        if (top->cursors[i] == cur) {
            top->cursors[i] = top->cursors[--top->n_cursors];
            break;
        }
    mdb_cursor_close(cur);
}

void store_guard_close_cursors(store_guard *g)
{
    for (int i = 0; i < g->n_cursors; i++)
        mdb_cursor_close(g->cursors[i]);
    g->n_cursors = 0;
}

void store_guard_pop(const void *txn)
{
    if (top && top->txn == txn)
        top = top->prev;
}
