/*
 * counts.h — the number of tasks per queue and state, kept in `queue_counts`
 * in the same transaction as every change to the tasks themselves (written
 * at its commit, counts.c).
 *
 * Readers (a queue's "counts", /metrics) read six rows instead of counting
 * tasks, and no index over (queue, state) has to be rewritten at every state
 * change.  The price is a contract on writers: every statement that inserts,
 * deletes or changes the state (or queue) of tasks calls counts_move with
 * exactly the rows it changed, in the same savepoint.  tests/unit/test_counts.c
 * recounts the tasks after every kind of transition.
 */
#ifndef MUSTER_SERVER_COUNTS_H
#define MUSTER_SERVER_COUNTS_H

#include <stdint.h>

#include "core/names.h"
#include "store.h"
#include "task.h"

/* The `from` of a task that did not exist before, the `to` of one that went. */
#define COUNTS_NONE (-1)

/* Records that `n` tasks of `queue` went from state `from` to state `to`
 * (either may be COUNTS_NONE: an insert or a delete).  Nothing to do when
 * n is 0 or from equals to.  In a transaction the move goes to its log and
 * is written at the commit (counts.c).  Returns MUSTER_OK, MUSTER_STORE or
 * MUSTER_NOMEM. */
muster_err_t counts_move(store_t *st, const char *queue, int from, int to, int64_t n, fail_t *f);
/* A run of equal moves added up before one write, for the batch paths (a
 * put, a session's submit, a batch of completions or leases), whose elements
 * mostly share their queue and states: one move per batch instead of one
 * per task.  Start it zeroed ({0}). */
typedef struct counts_run {
  char queue[NAME_MAX_LEN + 1];
  int from, to;
  int64_t n; /* moves added and not written yet */
} counts_run_t;

/* Adds one move of a task of `queue` from `from` to `to` to the run; when
 * the run holds moves of another queue or states, moves those first
 * (counts_move).  Returns what counts_move returns. */
muster_err_t counts_run_add(store_t *st, counts_run_t *run, const char *queue, int from, int to,
                            fail_t *f);
/* Moves what the run holds and empties it.  Call it on every way out of the
 * batch, failures included: what was changed is counted, whether or not the
 * request's savepoint is then rolled back. */
muster_err_t counts_run_flush(store_t *st, counts_run_t *run, fail_t *f);

/* The log of the open transaction's count changes, for store.c: a request
 * begins (its changes come after the mark), a request was rolled back (its
 * changes are dropped), the transaction commits (the sums are written, in it;
 * MUSTER_OK or MUSTER_STORE), it was rolled back (all dropped), the store
 * closes. */
void counts_log_mark(store_t *st);
void counts_log_undo(store_t *st);
muster_err_t counts_log_write(store_t *st, fail_t *f);
void counts_log_forget(store_t *st);
void counts_log_free(store_t *st);

/* Forgets the counts of `queue` (after its tasks were deleted with it). */
muster_err_t counts_drop(store_t *st, const char *queue, fail_t *f);
/* Fills by_state[TASK_STATE_COUNT] with the counts of `queue`; states
 * without a row (or an unknown queue) read 0.  Returns MUSTER_OK or
 * MUSTER_STORE. */
muster_err_t counts_read(store_t *st, const char *queue, int64_t *by_state, fail_t *f);

#endif
