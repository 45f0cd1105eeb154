/*
 * lease_internal.h — what lease.c, lease_ops.c and lease_complete_batch.c
 * share: a leased task as the store has it, the transitions the files make of
 * it, and the pieces of a completion the batched path shares with the
 * element-by-element one.
 *
 * lease.c grants leases and ends those that lapse without a call (expiry,
 * worker timeout); lease_ops.c applies a worker's operations on leases it
 * holds (complete, fail, extend, release, flag), of which
 * lease_complete_batch.c applies a batch of completions at once.  They move
 * tasks through the functions below, so that a transition is written, counted and reported to
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
 * none; see lease_held_load).  MUSTER_TASK_NOT_FOUND when the queue does not
 * exist: task h->id is in the trash of a deleted queue (queue_reap.h),
 * gone for every client. */
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

/*
 * What lease.c's grants share with lease_retry.c's answers to a lease request
 * sent again: a task as its lease object is written.
 */

/* Where an encoded piece of a lease object lies in a batch's pieces. */
typedef struct {
  size_t at, len; /* len 0: absent (no encoded JSON value is empty) */
} lease_piece_t;

/* A task found for a lease, with what its lease object needs. */
typedef struct {
  int64_t id, attempts, parent, index; /* attempts: before this lease */
  lease_piece_t payload, session, requires;
  bool unreadable; /* the stored payload or requires is neither JSON nor UTF-8 */
} candidate_t;

/* The columns lease_candidate_row reads, in order, from the tasks table. */
#define LEASE_CANDIDATE_COLUMNS                                                                    \
  "id, attempts, payload, coalesce(parent, 0), session, coalesce(idx, -1), requires"

/* Reads the candidate of the row of `s` (LEASE_CANDIDATE_COLUMNS first) into
 * *c, its stored texts appended to `pieces` (they are copied: a column's text
 * lives only until the next step). */
void lease_candidate_row(sqlite3_stmt *s, candidate_t *c, jw_buf_t *pieces);

/* Appends the lease object of candidate `c` (its pieces in `pieces`) under
 * `token` and `deadline` to `out`: "attempt" is c->attempts + 1. */
void lease_write(jw_buf_t *out, const candidate_t *c, const char *pieces, int64_t token,
                 int64_t deadline);

/*
 * What lease_ops.c (the operations on held leases, element by element) and
 * lease_complete_batch.c (a batch of completions with two statements) share.
 */

/* A batch's replies as they are made (lease_ops.c). */
typedef struct lease_apply_out lease_apply_out_t;

/* Writes "leases[i]", the context of element `i` in error messages, into
 * `ctx` (32 bytes). */
void lease_ctx(char ctx[32], size_t i);

/* True when task `h` was completed under `token`, so that a completion under
 * it again is a retry whose reply was lost.  Reliable because tokens come
 * from one counter that never repeats, a task's token changes only when it
 * is leased again, and only a completion makes a task done: the token of a
 * done task is the one that completed it. */
static inline bool lease_completed_by(const lease_held_t *h, int64_t token) {
  return h->state == TASK_DONE && h->token == token;
}

/* Checks that the task `h` is leased under `token`; a refusal reads the
 * end recorded on its row to say what became of that lease. */
muster_err_t lease_check_held(store_t *st, const lease_held_t *h, int64_t token, const char *ctx,
                              fail_t *f);

/* Refuses a result above `max_payload` bytes (`text`: encoded JSON; NULL:
 * none). */
muster_err_t lease_complete_size(const char *text, const char *ctx, size_t max_payload, fail_t *f);

/* What follows a completion's row update (the task `h`, its result `text`,
 * counted already): with a next stage, its result becomes a task there;
 * the session's result (unless the caller records a batch's at once:
 * `session_later`), the worker's tally, the metrics, and the reply
 * {"task", "next_task"} appended to the completions of `out`. */
muster_err_t lease_complete_after(store_t *st, const char *text, const lease_held_t *h,
                                  bool session_later, lease_apply_out_t *out, fail_t *f);

/* Completes the scanned batch `body` with two statements (see
 * lease_complete_batch.c).  Returns 1 when it declines (nothing done: go element by element), 0
 * when done, -1 with *f filled.  A refused element fails the batch after the elements before it
 * were completed, as one by one: a request that keeps its writes after an error (http.c, `keep`)
 * keeps theirs, counted. */
int lease_complete_batch(store_t *st, const jscan_body_t *body, size_t max_payload,
                         counts_run_t *run, queue_t *cache, lease_apply_out_t *out, fail_t *f);

/* lease_complete_batch for a parsed body's "leases" (a body the scanner
 * declined: whitespace, as Python's json.dumps writes it, other escapes):
 * when every element's fields are valid, as lease_apply_one checks them, its
 * task, token and encoded result go to the batch; any field error declines
 * (returns 1, *f untouched) and the element-by-element path gives it. */
int lease_complete_tree(store_t *st, const json_t *leases, size_t max_payload, counts_run_t *run,
                        queue_t *cache, lease_apply_out_t *out, fail_t *f);

/* Appends `v`, or null when it is not `present`, to `out`. */
static inline void lease_add_int_or_null(jw_buf_t *out, bool present, int64_t v) {
  if (present)
    jw_add_int(out, v);
  else
    JW_ADD_LITERAL(out, "null");
}

#endif
