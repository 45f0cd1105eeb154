/*
 * lease_internal.h — what lease.c and lease_ops.c share: a leased task as the
 * store has it, and the transitions both files make of it.
 *
 * lease.c grants leases and ends those that lapse without a call (expiry,
 * worker timeout); lease_ops.c applies a worker's operations on leases it
 * holds (complete, fail, extend, release, flag).  Both move tasks through the
 * functions below, so that a transition is written, counted and reported to
 * sessions in one place.  Everything here runs inside the request's (or the
 * sweeper's) transaction.
 */
#ifndef MUSTER_SERVER_LEASE_INTERNAL_H
#define MUSTER_SERVER_LEASE_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "jw.h"
#include "lease.h"
#include "queue.h"
#include "store.h"
#include "task.h"

/* A leased task as the store has it. */
typedef struct {
  int64_t id, token, attempts, flags, parent, index, worker, priority;
  int state;
  queue_t queue;
  char session[TASK_MAX_SESSION + 1]; /* "" for none */
  bool has_session;
} lease_held_t;

/* The columns of a held task as lease_held_row reads them (qualified: a
 * query may join tasks with a table of the same column names). */
#define LEASE_HELD_COLUMNS                                                                         \
  "tasks.state, coalesce(tasks.token, 0), tasks.attempts, tasks.flags,"                            \
  " coalesce(tasks.parent, 0), coalesce(tasks.idx, -1), coalesce(tasks.worker, 0),"                \
  " tasks.priority, tasks.queue, tasks.session"

/* Fills *h, all but its queue, from the LEASE_HELD_COLUMNS of the row of
 * `s` that start at column `first`, for task `id`; the queue's name goes to
 * `queue`. */
void lease_held_row(sqlite3_stmt *s, int first, int64_t id, lease_held_t *h,
                    char queue[NAME_MAX_LEN + 1]);

/* Fills h->queue with the settings of queue `queue` through `cache` (NULL:
 * none; see lease_held_load).  MUSTER_QUEUE_NOT_FOUND when it does not
 * exist. */
muster_err_t lease_held_queue(store_t *st, const char *queue, lease_held_t *h, queue_t *cache,
                              fail_t *f);

/* Loads task `id` and its queue's settings.  `cache` (NULL: none) holds the
 * queue of a batch's previous element: the elements of a batch mostly share
 * their queue, and within one request its settings cannot change, so the
 * queue is read once per batch instead of once per task.
 * MUSTER_TASK_NOT_FOUND when the task does not exist, MUSTER_QUEUE_NOT_FOUND
 * when its queue does not. */
muster_err_t lease_held_load(store_t *st, int64_t id, lease_held_t *h, queue_t *cache, fail_t *f);

/*
 * How a lease ended, recorded on its task's row (tasks.ended_token: the
 * lease's token; tasks.ended_as: the kind times LEASE_END_STATES plus the
 * state the end left the task in) by lease_move, the one writer of every end
 * but a completion (a done task keeps the token that completed it).  The
 * record outlives the next lease, so a fail or release retried under its
 * token after a lost reply is answered as a repeat (lease_ops.c), and a
 * refusal can say what ended the lease.  Stored as integers: the values are
 * part of the schema.
 */
typedef enum {
  LEASE_END_NONE = 0,     /* no lease ended (a used-up task found queued): nothing recorded */
  LEASE_END_LAPSED = 1,   /* expiry; the worker's timeout, crash or goodbye; its node's */
  LEASE_END_FAILED = 2,   /* the holder's fail */
  LEASE_END_RELEASED = 3, /* the holder's release */
  LEASE_END_FLAGGED = 4,  /* the holder's invalid-data flag */
} lease_end_t;

#define LEASE_END_STATES 8 /* tasks.ended_as = kind * 8 + state */
_Static_assert(TASK_STATE_COUNT <= LEASE_END_STATES, "tasks.ended_as holds a state below 8");

/* Moves the task `h` (in state h->state) to `state` with the given run time,
 * error and attempts delta, clearing its lease, records the end as `end`
 * (LEASE_END_NONE: the record stays as it was) and counts the move.  The
 * workhorse of every transition. */
muster_err_t lease_move(store_t *st, const lease_held_t *h, int state, int64_t run_at_ms,
                        const char *error, int64_t attempts_delta, lease_end_t end, fail_t *f);

/* A task reached a final state (done, failed, dead): a task of a session
 * gives the session its result. */
muster_err_t lease_finished(store_t *st, const lease_held_t *h, fail_t *f);

/* A lease that ended without success (failure, expiry, timeout), recorded as
 * `end`: retry after backoff, or dead when the attempts are used up.
 * Returns the new state, or -1 with *f filled.  On a retry *run_at_out (may
 * be NULL) gets its time. */
int lease_lapse(store_t *st, const lease_held_t *h, const char *error, lease_end_t end,
                int64_t *run_at_out, fail_t *f);

/* Back to queued at once, the end recorded as `end`; the attempt the lease
 * took is given back. */
muster_err_t lease_give_back(store_t *st, const lease_held_t *h, lease_end_t end, fail_t *f);

/* Appends `v`, or null when it is not `present`, to `out`. */
static inline void lease_add_int_or_null(jw_buf_t *out, bool present, int64_t v) {
  if (present)
    jw_add_int(out, v);
  else
    JW_ADD_LITERAL(out, "null");
}

#endif
