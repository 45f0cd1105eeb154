/*
 * task.h — tasks: batch put with idempotency keys, lookup, listing, requeue.
 */
#ifndef MUSTER_SERVER_TASK_H
#define MUSTER_SERVER_TASK_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "core/limits.h"
#include "jscan.h"
#include "jw.h"
#include "store.h"

typedef struct counts_run counts_run_t; /* counts.h */

/* Stored as integers; the order is part of the schema. */
typedef enum {
  TASK_QUEUED = 0,
  TASK_LEASED = 1,
  TASK_DONE = 2,
  TASK_FAILED = 3,
  TASK_DEAD = 4,
  TASK_CANCELLED = 5,
  TASK_STATE_COUNT
} task_state_t;

#define TASK_MAX_KEY 256
#define TASK_MAX_SESSION 128
#define TASK_MAX_DELAY_MS (366LL * 24 * 3600 * 1000)

const char *task_state_name(int state);
/* The state named `name`, or -1. */
int task_state_parse(const char *name);

/* Puts the tasks of body {"tasks": [...]} into `queue` atomically.  Returns
 * {"tasks": [{"id", "created"}]} (new reference) or NULL with *f filled; on
 * failure nothing was stored.  Payloads above `max_payload` bytes are refused.
 * The "tasks" array is a raw node (jw.h): the reply goes out through jw_dump,
 * and a caller that reads the ids reads them from that text. */
json_t *task_put(store_t *st, const char *queue, const json_t *body, size_t max_payload, fail_t *f);
/* The body task_put reads, as the scanner takes it (jscan.h). */
extern const jscan_shape_t task_put_shape;
/* task_put for a body jscan_body read with task_put_shape and the same
 * `max_payload`: the same reply, the same rows. */
json_t *task_put_scanned(store_t *st, const char *queue, const jscan_body_t *body, fail_t *f);
/* The task object (new reference) as one raw node (jw.h): its text, written
 * around the stored payload and result, goes out through jw_dump.  NULL with
 * MUSTER_TASK_NOT_FOUND (or a store or memory failure). */
json_t *task_get(store_t *st, int64_t id, fail_t *f);
/* Records MUSTER_TASK_NOT_FOUND for task `id`, which is not there, with why
 * when the head can tell: its queue was deleted, or it existed and was
 * removed (docs/api.md, GET /v1/tasks/{id}).  Returns the code. */
muster_err_t task_not_found(store_t *st, int64_t id, fail_t *f);
/* {"tasks": [...], "next": id|null}: tasks of `queue` with id > after, in
 * `state` unless it is -1, at most `limit`, as one raw node (jw.h), as
 * task_get's object. */
json_t *task_list(store_t *st, const char *queue, int state, int64_t after, int64_t limit,
                  fail_t *f);
/* task_list(), where `brief` leaves out each task's payload and result.
 * The page is one raw node (jw.h): task_list_text's text. */
json_t *task_list_as(store_t *st, const char *queue, int state, int64_t after, int64_t limit,
                     bool brief, fail_t *f);
/* Writes the page task_list_as returns into `out` (empty; the caller frees
 * it, also on failure) as the text of the reply, each task's stored payload
 * and result spliced as they stand: a listing route sends it as it is
 * (http_reply_text).  MUSTER_OK, or the failure with *f filled. */
muster_err_t task_list_text(store_t *st, const char *queue, int state, int64_t after, int64_t limit,
                            bool brief, jw_buf_t *out, fail_t *f);
/* Writes the newest `limit` failed or dead tasks of `queue` (`state` is
 * TASK_FAILED or TASK_DEAD), the one that got there last first, into `out`
 * as task_list_text does, with "next" null: the page is all there is of
 * this order (docs/api.md, order=recent).  It may hold fewer when the reply's
 * budget of bytes ends it, or past TASK_LIST_SKIP tasks a closed session
 * left.  MUSTER_OK, or the failure with *f filled. */
muster_err_t task_list_recent_text(store_t *st, const char *queue, int state, int64_t limit,
                                   bool brief, jw_buf_t *out, fail_t *f);
/* Puts a dead or failed task back to queued; returns the task object, as
 * task_get does. */
json_t *task_requeue(store_t *st, int64_t id, fail_t *f);

/* A new task of a session's batch (task_insert_rows): its payload as
 * encoded JSON, its priority and its index in the session (-1: none). */
typedef struct {
  const char *payload;
  int64_t priority, index;
} task_row_t;

/* Inserts the `n` tasks of `rows` into `queue` under `session`, queued now,
 * with multi-row INSERTs (consecutive ids per statement); ids[i] gets the
 * id of rows[i].  Counts them and announces the queue once.  On failure
 * some may be inserted: the caller's savepoint takes them back. */
muster_err_t task_insert_rows(store_t *st, const char *queue, const char *session,
                              const task_row_t *rows, size_t n, int64_t *ids, fail_t *f);

/* Inserts one task; the primitive that put, sessions and pipelines share.
 * `payload` is encoded JSON text.  *id receives the new id.  The new task is
 * counted in `run` (a batch's, which the caller flushes) or, when `run` is
 * NULL, at once. */
muster_err_t task_insert(store_t *st, const char *queue, const char *payload, int64_t priority,
                         int64_t run_at_ms, const char *key, const char *session, int64_t index,
                         int64_t parent, counts_run_t *run, int64_t *id, fail_t *f);

#endif
