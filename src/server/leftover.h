/*
 * leftover.h — the tasks that big closed sessions leave to the background
 * deletion (session_close.c), as stretches of each queue's task ids, and the
 * walk of a queue's ready tasks in lease order past them.
 *
 * A stretch (a "run") of queue Q left by session S is an interval lo..hi of
 * task ids in which every task of Q is one that S left: S's, with an id up
 * to its horizon.  Those tasks never change again (no lease, completion or
 * requeue reaches them) until their chunk deletes them, no task of Q can
 * take an id inside (ids are never handed out twice, and no task moves to
 * another queue), so a run stays true for as long as S is in session_trash,
 * whatever else happens in Q.  A lease, the ready count and a queued
 * listing then step over a run with one index seek, however many tasks it
 * holds, instead of reading them one by one.
 *
 * Runs live in memory, attached to the store, and are built from the rows
 * the close reads anyway (session_count_left), or from tasks_by_session at
 * start-up (after a restart) and whenever a walk finds a session in the
 * trash without them.  A close that is rolled back leaves runs for a
 * session that is not in the trash: every walk checks the sessions of the
 * runs it uses there first and forgets those that are not.
 */
#ifndef MUSTER_SERVER_LEFTOVER_H
#define MUSTER_SERVER_LEFTOVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store.h"

/* The runs of every closed session the store knows, attached to it. */
typedef struct leftover_set leftover_set_t;
/* Frees the store's runs (store_close); accepts a store without any. */
void leftover_free(store_t *st);

/* The runs of one session as its tasks are read: leftover_build_queue and
 * leftover_build_id for each task it leaves (in any order, best grouped by
 * queue and ascending ids), then leftover_build_commit. */
typedef struct leftover_build leftover_build_t;
/* A new builder, or NULL when out of memory.  Free with leftover_build_free
 * unless committed. */
leftover_build_t *leftover_build_new(void);
void leftover_build_free(leftover_build_t *b);
/* Makes `queue` the queue of the next ids (a string compare per queue the
 * builder has, the current one first); then adds task `id` of it (a
 * compare and an add, usually).  False when out of memory (the builder is
 * then unusable: free it). */
bool leftover_build_queue(leftover_build_t *b, const char *queue);
bool leftover_build_id(leftover_build_t *b, int64_t id);
/* Makes the runs of session `session` from what `b` holds (and frees b),
 * replacing any it had.  Two runs of a queue with ids between them become
 * one when no task of the queue has an id between them: one seek into
 * tasks_by_queue each, a bounded number of them, and only with
 * `seek_gaps`: an emptiness seen inside a transaction that deleted tasks
 * before (and may be rolled back) could hold no longer (leftover_load says
 * when).  MUSTER_NOMEM or MUSTER_STORE with *f filled. */
muster_err_t leftover_build_commit(store_t *st, leftover_build_t *b, const char *session,
                                   bool seek_gaps, fail_t *f);

/* Forgets the runs of session `session` (the last of its tasks went), and
 * has the next walk check the trash again, in case that is rolled back. */
void leftover_forget(store_t *st, const char *session);

/* Builds the runs of every session in session_trash that has none, from
 * tasks_by_session (an index read of each task it left).  Called at
 * start-up, outside any transaction, where the gaps between runs may be
 * sought; a walk calls it inside its request when a session has none. */
muster_err_t leftover_load(store_t *st, fail_t *f);

/* How many runs queue `queue` holds now, unchecked (tests). */
size_t leftover_run_count(store_t *st, const char *queue);

/* What a visit tells the walk to do next. */
typedef enum {
  LEFTOVER_ON,            /* go on to the next stretch */
  LEFTOVER_NEXT_PRIORITY, /* go on at the next priority: nothing more of this one is wanted */
  LEFTOVER_DONE,          /* end the walk */
} leftover_then_t;

/* What a walk calls for each stretch of the ready index of a queue that
 * holds no run: the tasks of priority `priority` with ids first..last.
 * It reads them (those still queued, in id order) and says in *then what
 * the walk does next.  MUSTER_OK or the error, with *f filled, that ends
 * the walk. */
typedef muster_err_t (*leftover_visit_fn)(void *arg, int64_t priority, int64_t first, int64_t last,
                                          leftover_then_t *then, fail_t *f);
/* Walks the ready index of queue `queue` (tasks_ready: priority descending,
 * then id) past its runs, from the tasks with ids above `from` at each
 * priority, calling `visit` for each stretch between runs in that order,
 * until it says done or the index ends; *walked says that it did.  It
 * does not when the queue holds no run (nor while store_sessions_closing
 * is false): the caller's one statement in lease order is cheaper then.
 * Costs an index seek per run met and per priority, plus what the visits
 * read. */
muster_err_t leftover_walk(store_t *st, const char *queue, int64_t from, leftover_visit_fn visit,
                           void *arg, bool *walked, fail_t *f);

#endif
