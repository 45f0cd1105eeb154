/*
 * queue.h — named work queues and their settings.
 */
#ifndef MUSTER_SERVER_QUEUE_H
#define MUSTER_SERVER_QUEUE_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/names.h"
#include "store.h"

#define QUEUE_DEFAULT_LEASE_MS 60000
#define QUEUE_DEFAULT_MAX_ATTEMPTS 5
#define QUEUE_DEFAULT_BACKOFF_MS 1000
#define QUEUE_DEFAULT_BACKOFF_MAX_MS 60000
#define QUEUE_DEFAULT_MAX_FLAGS 5
#define QUEUE_MAX_LEASE_MS (7LL * 24 * 3600 * 1000)
#define QUEUE_KEEP_FOREVER (-1)                            /* keep_done_ms of "no retention" */
#define QUEUE_MAX_KEEP_DONE_MS (3650LL * 24 * 3600 * 1000) /* ten years */
/* Tasks removed per chunk of background work (queue_reap.c): a queue with
 * more than this many tasks is deleted in chunks, a purge of more goes on
 * in chunks, and the retention deletes at most this many per chunk. */
#define QUEUE_CHUNK 1000
/* Queued tasks a count of the ready ones reads at most (queue_count_ready):
 * 0.2 to 0.4 ms of the head's time, asked by every DistCompute worker
 * before each job. */
#define QUEUE_READY_SCAN 1000

typedef struct {
  char name[NAME_MAX_LEN + 1];
  int64_t lease_ms;            /* lease length unless extended */
  int64_t max_attempts;        /* leases a task may get; >= 1 */
  int64_t backoff_ms;          /* first retry delay, doubled per attempt */
  int64_t backoff_max_ms;      /* cap of the retry delay */
  int64_t max_flags;           /* invalid-data flags before roll-back; >= 1 */
  char next[NAME_MAX_LEN + 1]; /* next stage, "" for none */
  int64_t created_ms;
  int64_t keep_done_ms; /* done tasks go this long after completion; QUEUE_KEEP_FOREVER */
  int64_t reaped;       /* done tasks the retention removed so far */
} queue_t;

/* Fills *q from ten columns of a row, starting at column `first`, in this
 * order: name, lease_ms, max_attempts, backoff_ms, backoff_max_ms, next,
 * max_flags, created_ms, keep_done_ms, reaped (for a query that joins the
 * queues table). */
void queue_from_columns(sqlite3_stmt *s, int first, queue_t *q);

/* MUSTER_OK when `name` is a name a queue may have: one of the rule, or "."
 * or "..", which an older head let a queue have (name_was_valid: such a
 * queue is still found under its name; none is made any more, queue_load);
 * MUSTER_NAME_INVALID with *f saying the rule otherwise.  Every use of a
 * queue name checks it first, so a name that could never be created is
 * refused as such, not as absent. */
muster_err_t queue_check_name(const char *name, fail_t *f);
/* Loads queue `name` into *q.  MUSTER_NAME_INVALID when no queue could have
 * that name (queue_check_name) or it is "." or ".." and no older head made
 * one of it; MUSTER_QUEUE_NOT_FOUND when absent. */
muster_err_t queue_load(store_t *st, const char *name, queue_t *q, fail_t *f);
/* Creates the queue or changes the settings present in `body`; *created says
 * which.  Validation failures change nothing. */
muster_err_t queue_put(store_t *st, const char *name, const json_t *body, bool *created, fail_t *f);
/* The queue object with counts per state (new reference), NULL on store failure. */
json_t *queue_to_json(store_t *st, const queue_t *q);
/* Sets *ready to the number of queued tasks of queue `name` that a lease
 * would take now: those whose run time (a put's delay, a retry's backoff)
 * has come.  Reads at most QUEUE_READY_SCAN tasks: exact up to that many
 * queued; above, positive only when a lease finds a task now (queue.c
 * says how).  Queue reads give it only when asked for.  Returns MUSTER_OK
 * or MUSTER_STORE. */
muster_err_t queue_count_ready(store_t *st, const char *name, int64_t *ready, fail_t *f);
/* {"queues": [...]} ordered by name (new reference). */
json_t *queue_list(store_t *st, fail_t *f);
/* Deletes the queue and its tasks, closing the sessions that stream from
 * it; *tasks and *sessions get how many went.  A queue of more than
 * QUEUE_CHUNK tasks goes at once for every client, but its tasks stay, in
 * the trash, for queue_trash_step to delete in chunks (*pending true); a
 * queue of that name cannot be created again until they are gone. */
muster_err_t queue_delete(store_t *st, const char *name, int64_t *tasks, int64_t *sessions,
                          bool *pending, fail_t *f);
/* Deletes the queued tasks of the queue, all in this transaction (tests and
 * tools; the route purges in chunks: queue_purge_chunk). */
muster_err_t queue_purge(store_t *st, const char *name, int64_t *purged, fail_t *f);
/* Puts dead and failed tasks back to queued, attempts and flags reset. */
muster_err_t queue_requeue(store_t *st, const char *name, int64_t *requeued, fail_t *f);
/* The retry delay after `attempts` leases: backoff doubled per attempt, capped. */
int64_t queue_backoff_ms(const queue_t *q, int64_t attempts);

#endif
