/*
 * queue_reap.h — tasks removed in chunks, by the head's background work
 * (reaper.c), so that no single transaction stalls the head: done tasks past
 * their queue's retention (keep_done_ms), the tasks of a deleted queue, and
 * a purge of many queued tasks.  Each function does one chunk inside the
 * caller's open request (savepoint) and keeps queue_counts exact.
 */
#ifndef MUSTER_SERVER_QUEUE_REAP_H
#define MUSTER_SERVER_QUEUE_REAP_H

#include <stdbool.h>
#include <stdint.h>

#include "core/names.h"
#include "store.h"

/* ---- deleted queues (the trash) ---- */

/* Deletes queue `name`, which holds `tasks` tasks, leaving those tasks in
 * the trash: the sessions streaming from it are closed (*sessions of them),
 * its updates and its leased tasks deleted (a lease is never held on a task
 * of the trash, so no expiry or worker's end ever meets one), and its row
 * in `queues` replaced by one in `queue_trash`.  Its counts stay, exact,
 * until queue_trash_step has deleted the last task.  For queue_delete. */
muster_err_t queue_trash_put(store_t *st, const char *name, int64_t tasks, int64_t *sessions,
                             fail_t *f);
/* Deletes up to `max` tasks of the trashed queue `name` (*deleted of them),
 * moving the counts of those that are in them (not those a closed session
 * left to the background deletion: out of the counts since that close);
 * once none is left (*finished), its counts and its trash row go too. */
muster_err_t queue_trash_step(store_t *st, const char *name, int64_t max, int64_t *deleted,
                              bool *finished, fail_t *f);
/* Copies the name of a queue in the trash to `name` ("" when none). */
muster_err_t queue_trash_first(store_t *st, char name[NAME_MAX_LEN + 1], fail_t *f);
/* MUSTER_INVALID_STATE, saying why, when tasks of a deleted queue `name` are
 * still in the trash (a queue of that name cannot be made yet); else
 * MUSTER_OK (or MUSTER_STORE). */
muster_err_t queue_trash_check(store_t *st, const char *name, fail_t *f);

/* ---- purges ---- */

/* The highest task id now: a purge that goes on in chunks deletes the tasks
 * of its queue queued at or below it, never those put after it began. */
int64_t queue_purge_horizon(store_t *st);
/* Deletes up to `max` queued tasks of queue `name` with ids up to `horizon`
 * (*purged of them; *finished when fewer were left), taking those of a
 * session streaming from the queue out of its total (its readers are woken:
 * a stream then stops at their indexes as at a gap).  MUSTER_QUEUE_NOT_FOUND
 * when the queue does not exist. */
muster_err_t queue_purge_chunk(store_t *st, const char *name, int64_t horizon, int64_t max,
                               int64_t *purged, bool *finished, fail_t *f);

/* ---- retention of done tasks ---- */

/* A queue with a retention (keep_done_ms not null). */
typedef struct {
  char name[NAME_MAX_LEN + 1];
  int64_t keep_done_ms;
} queue_retention_t;

/* The queues with a retention, ordered by name: *list (the caller frees it)
 * and *n.  MUSTER_OK, MUSTER_STORE or MUSTER_NOMEM. */
muster_err_t queue_retention_list(store_t *st, queue_retention_t **list, size_t *n, fail_t *f);

/* One chunk of a pass over queue `name`: examines up to `max` of its tasks
 * by id after *cursor (0: the pass starts) and deletes those that are done,
 * belong to no session and were completed the queue's keep_done_ms or
 * longer before `now`; *reaped gets how many, *cursor the last id examined.
 * *pass_done when the pass reached the queue's end or a task created after
 * that cut-off (ids follow creation, and a task is completed after it was
 * created, so no later task can be due), and at once when the queue is gone
 * or keeps done tasks for ever now.  Counted in the queue's `reaped` and in
 * muster_tasks_reaped_total. */
muster_err_t queue_reap_chunk(store_t *st, const char *name, int64_t now, int64_t max,
                              int64_t *cursor, int64_t *reaped, bool *pass_done, fail_t *f);

#endif
