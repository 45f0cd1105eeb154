/*
 * lease.h — handing tasks to workers and taking them back.
 *
 * A lease is (task, fencing token, deadline).  Tokens come from one strictly
 * increasing counter, so a worker that lost its lease can never act on the
 * task again: every call names the token and a mismatch is MUSTER_LEASE_LOST.
 */
#ifndef MUSTER_SERVER_LEASE_H
#define MUSTER_SERVER_LEASE_H

#include <jansson.h>
#include <stdint.h>

#include "core/limits.h"
#include "jscan.h"
#include "jw.h"
#include "queue.h"
#include "store.h"

#define LEASE_MAX_BATCH TASK_MAX_BATCH /* leases per request (core/limits.h) */
#define LEASE_MAX_ERROR 65536

/* Leases up to `max` ready tasks of queue `q` to `worker` (0: anonymous):
 * fewer when their payloads would pass the budget of one reply
 * (reply_budget.h), the others left queued, but at least one when any is
 * ready.
 * Appends the JSON array of lease objects (possibly empty) to `out`, the
 * text of the reply, with the number of leases in *count and the highest
 * task id leased in *max_task (when not NULL; 0 for none).  MUSTER_OK, or
 * the failure with *f filled and `out` holding part of the text.  Tasks
 * found out of attempts are moved to dead. */
muster_err_t lease_acquire_text(store_t *st, const queue_t *q, int64_t worker, int64_t max,
                                jw_buf_t *out, size_t *count, int64_t *max_task, fail_t *f);
/* The same, as a tree: a JSON array of lease objects {"task", "token",
 * "payload", ...} (new reference), or NULL with *f filled, for callers that
 * read the leases (the compatibility API, tests); it is the text read back. */
json_t *lease_acquire(store_t *st, const queue_t *q, int64_t worker, int64_t max, fail_t *f);

typedef enum { LEASE_COMPLETE, LEASE_FAIL, LEASE_EXTEND, LEASE_RELEASE, LEASE_FLAG } lease_op_t;

/* Applies `op` to every element of body {"leases": [...]}.  Returns the reply
 * object (new reference) or NULL with *f filled; on failure the caller rolls
 * the savepoint back, so a batch is all-or-nothing.  `max_payload` bounds
 * results.  The "completed" array of a completion's reply is a raw node
 * (jw.h): the reply goes out through jw_dump and is not read as a tree. */
json_t *lease_apply(store_t *st, lease_op_t op, const json_t *body, size_t max_payload, fail_t *f);

/* The completion body as the scanner takes it (jscan.h): "leases" with
 * task, token and result, and the combined call's "lease" kept as text. */
extern const jscan_shape_t lease_complete_shape;
/* lease_apply(LEASE_COMPLETE) for the "leases" of a body jscan_body read
 * with lease_complete_shape: the same reply, the same rows and errors. */
json_t *lease_complete_scanned(store_t *st, const jscan_body_t *body, size_t max_payload,
                               fail_t *f);

/* Returns expired leases (deadline <= now) to their queues, at most `limit`;
 * the count is returned, -1 on store failure. */
int64_t lease_expire_due(store_t *st, int64_t now, int64_t limit);

/* Ends every lease of `worker`: released (attempt not counted) when `counted`
 * is false (a goodbye), lapsed like an expiry when true (a timeout), and
 * deletes its lease request records (lease_retry_forget): the worker ended.
 * Returns how many leases, -1 on store failure. */
int64_t lease_end_worker(store_t *st, int64_t worker, bool counted);

/* Ends every lease of `worker` like an expiry (the attempt counts, backoff
 * applies, dead when the attempts are used up) with `reason` as the tasks'
 * error ("worker crashed", "node timed out"), and deletes its lease request
 * records, as lease_end_worker.  Returns how many leases, -1 on store
 * failure. */
int64_t lease_lapse_worker(store_t *st, int64_t worker, const char *reason);

/* True when some lease's deadline is at or before `now`. */
bool lease_any_due(store_t *st, int64_t now);

/* The earliest lease deadline, or INT64_MAX when nothing is leased. */
int64_t lease_next_deadline(store_t *st);

#endif
