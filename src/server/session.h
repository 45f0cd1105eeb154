/*
 * session.h — a client's scope over one queue: tasks submitted with indexes,
 * results read back as a resumable stream, cleanup when the client goes.
 *
 * A result is recorded once per index, the first time a task of the session
 * (in the session's queue) reaches done, failed or dead.  Fencing tokens make
 * a task complete at most once, and the results table is unique per index, so
 * every index appears in the stream exactly once even when its task ran twice.
 */
#ifndef MUSTER_SERVER_SESSION_H
#define MUSTER_SERVER_SESSION_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "jscan.h"
#include "jw.h"
#include "store.h"

#define SESSION_DEFAULT_TIMEOUT_MS 60000
#define SESSION_ID_LEN 18 /* "s-" and 16 hex digits */
#define SESSION_MAX_RESULTS 1000

typedef enum { SESSION_OPEN = 0, SESSION_CLOSED = 1 } session_state_t;
typedef enum { SESSION_BY_SUBMISSION, SESSION_BY_COMPLETION } session_order_t;

/* Creates a session from body {"queue", "cleanup_on_exit", "timeout_ms",
 * "init_data"}; `init_data` is limited to `max_payload` bytes encoded.
 * Returns the Session object (new reference) or NULL with *f filled
 * (MUSTER_QUEUE_NOT_FOUND, MUSTER_INVALID, MUSTER_PAYLOAD_TOO_LARGE). */
json_t *session_create(store_t *st, const json_t *body, size_t max_payload, fail_t *f);
/* The Session object of an open session (not counted as a heartbeat: anyone
 * may look); NULL with MUSTER_SESSION_NOT_FOUND when unknown or closed.  Its
 * "init_data" is a raw node (jw.h) of the stored text, as in session_list. */
json_t *session_get(store_t *st, const char *id, fail_t *f);
/* {"sessions": [...]}: the open sessions by creation (new reference). */
json_t *session_list(store_t *st, fail_t *f);
/* Records a heartbeat; returns {"id", "state"} or NULL with *f filled. */
json_t *session_heartbeat(store_t *st, const char *id, const json_t *body, fail_t *f);
/* Checks that session `id` is open and counts the call as a heartbeat.  When
 * `queue` is not NULL it receives the session's queue (NAME_MAX_LEN + 1 bytes). */
muster_err_t session_touch(store_t *st, const char *id, char *queue, fail_t *f);

/* Why session `id` holds no shared data, for a read that found a blob of it
 * missing: "session 's-...' was closed: by its client; its shared data went
 * with it" (or "its client did not call for N ms; ..."), "session 's-...'
 * does not exist", or "" while it is open (or when the store could not
 * tell).  Not a heartbeat. */
void session_gone_why(store_t *st, const char *id, char *out, size_t size);

/* Seals open session `id` (body {}: no fields): it takes no more tasks, and
 * a results reader that has every result knows that none will follow.
 * Durable, idempotent; counts as a heartbeat; wakes the session's parked
 * readers.  Returns the Session object with "already_sealed" (whether it
 * was sealed before) or NULL with *f filled (MUSTER_SESSION_NOT_FOUND,
 * MUSTER_INVALID). */
json_t *session_seal(store_t *st, const char *id, const json_t *body, fail_t *f);

/* Submits the tasks of body {"tasks": [{"payload", "index", "priority"}],
 * "seal"}: automatic indexes from next_index, explicit ones unique in the
 * session (MUSTER_INVALID_STATE when in use).  Returns {"tasks": [{"id",
 * "index"}]} or NULL with *f filled; the caller rolls back on failure.  A
 * batch whose explicit indexes all hold the same payloads already (a retry
 * after a lost reply) changes nothing and answers with theirs, plus
 * "repeated": true.  "seal": true seals the session with the batch (the
 * reply says "sealed": true); a sealed session refuses every batch but such
 * a repeat with MUSTER_INVALID_STATE. */
json_t *session_submit(store_t *st, const char *id, const json_t *body, size_t max_payload,
                       fail_t *f);
/* The submit body the scanner takes (jscan.h): payload, priority and index,
 * without requires (those bodies take the tree path), and "seal" as its
 * extra slice; and session_submit of such a scanned body. */
extern const jscan_shape_t session_submit_shape;
json_t *session_submit_scanned(store_t *st, const char *id, const jscan_body_t *body, fail_t *f);

/* A task that reached a final state (done, failed, dead), for
 * session_record_finished: its id, its index in its session (-1: none), its
 * session (NULL: none), its queue and its state. */
typedef struct {
  int64_t task, index;
  const char *session, *queue;
  int state;
} session_finished_t;

/* session_record_result for the `n` tasks of `finished`, in order: the tasks
 * of one session that follow each other take one read and one write of the
 * session row between them (and one notification), each its own result row.
 * A task of no session, of a closed one or of another queue than its
 * session's records nothing. */
muster_err_t session_record_finished(store_t *st, const session_finished_t *finished, size_t n,
                                     fail_t *f);

/* What a results read found besides its reply. */
typedef struct {
  size_t count; /* results in the reply */
  bool stalled; /* the reply stops at a gap and every task of the session has its
                 * result: nothing comes at the cursor until a task is submitted there */
  bool cut;     /* it stopped before a result that would have passed the budget of
                 * one reply (reply_budget.h): that one is next at the cursor */
  bool ended;   /* the session is sealed and every task has its result: no result
                 * comes that is not there already, so an empty read need not wait */
} session_read_t;

/* Reads results after `cursor` in `order`, at most `max`, fewer when their
 * results and errors would pass the budget of one reply (one always goes),
 * and writes the reply {"results": [...], "cursor", "total", "done", "gap",
 * "sealed"}
 * as JSON text into `out` (empty; the caller frees it, also on failure),
 * whole, for the reply to take as it is (http_reply_text): the stored
 * results are copied once, into `out`.  Returns MUSTER_OK and *rd, or the
 * failure with *f filled.  Counts as a heartbeat.  "gap" is {"first",
 * "last"} when a read in submission order stops at indexes below next_index
 * that no task has (a gap), else null.  `empty_waits`: the caller does not
 * send an empty reply unless it is stalled (it waits for results instead),
 * so an empty read looks for a gap only when every task has its result; the
 * "gap" of an empty reply that is not stalled is then null whatever the
 * indexes hold. */
muster_err_t session_results_text(store_t *st, const char *id, session_order_t order,
                                  int64_t cursor, int64_t max, bool empty_waits, session_read_t *rd,
                                  jw_buf_t *out, fail_t *f);
/* Closes the session: unfinished tasks are cancelled, then its tasks, results
 * and updates deleted.  `why` says who closed it (kept for error messages).
 * Returns {"id", "cancelled", "deleted"} or NULL with *f filled.
 * At most QUEUE_CHUNK (queue.h) tasks are deleted here: a session with more
 * goes to session_trash (below), its leased tasks deleted now and the
 * others left to session_trash_step, taken out of their queues' counts now
 * (the reply counts them too) and made into the runs that leases step over
 * (leftover.h). */
json_t *session_close(store_t *st, const char *id, const char *why, fail_t *f);

/* Closes every open session streaming from queue `queue` (session_close), as
 * its queue is deleted: their readers are answered session_not_found, which
 * names why, instead of waiting for tasks that are gone.  *closed gets their
 * number.  QUEUE_CHUNK tasks at most are deleted in all; the others
 * wait in session_trash (those in `queue` itself may go with the queue's
 * deletion first, queue_reap.c). */
muster_err_t session_close_queue(store_t *st, const char *queue, int64_t *closed, fail_t *f);

/* SQL: true when the task row named `t` (its `id` and `session`) is one that
 * a closed session left to the background deletion (session_trash): no
 * lease, count, listing or read by id sees such a task.  Only where
 * store_sessions_closing says rows may be there: a store migrated only so
 * far (tests) has no session_trash. */
#define SESSION_CLOSING_SQL(t)                                                                     \
  "(" t ".session IS NOT NULL AND EXISTS (SELECT 1 FROM session_trash AS c"                        \
  " WHERE c.session = " t ".session AND " t ".id <= c.horizon))"
/* SESSION_CLOSING_SQL of the table's own row, and of a subquery's row named w. */
#define SESSION_CLOSING_TASKS_SQL SESSION_CLOSING_SQL("tasks")
#define SESSION_CLOSING_W_SQL SESSION_CLOSING_SQL("w")

/* *any: queue `name` holds tasks that a closed session left to the
 * background deletion (out of its counts already).  One seek per session in
 * session_trash; false at once when store_sessions_closing is. */
muster_err_t session_left_in_queue(store_t *st, const char *name, bool *any, fail_t *f);

/* Copies the id of a session in session_trash to `id` ("" when none).  When
 * none is there and no transaction is open, store_sessions_closing is
 * cleared (store.h says why only then). */
muster_err_t session_trash_first(store_t *st, char id[SESSION_ID_LEN + 1], fail_t *f);
/* One chunk of the deletion of what closed session `id` left: up to `max`
 * of its tasks (*deleted of them; out of the counts since the close), or once none is left
 * up to the rest of `max` of its results; once neither is left (*finished)
 * its session_trash row goes too, and its runs (leftover.h).  No lease is
 * woken: leases step over those tasks from the close on, so their deletion
 * makes none reachable.  *finished at once when `id` is not in the trash. */
muster_err_t session_trash_step(store_t *st, const char *id, int64_t max, int64_t *deleted,
                                bool *finished, fail_t *f);

/* Records the result of task `task` in its session's stream if it belongs to
 * an open session and its index has no result yet; wakes the session's
 * results waiters (store_notify_session).  Call after the task reached a final
 * state (done, failed, dead). */
muster_err_t session_record_result(store_t *st, int64_t task, fail_t *f);

/* Tells whether session `id` has a call in progress (a parked long-poll), so
 * its client is not silent; used by the expiry below. */
typedef bool (*session_busy_fn)(void *arg, const char *id);
/* How long a closed session's row is kept, so that a late call of its
 * client is told it was closed and why; after that the session is unknown. */
#define SESSION_KEEP_CLOSED_MS (24 * 3600 * 1000LL)
/* True when some open cleanup_on_exit session is silent past its timeout, or
 * a closed session's row is past SESSION_KEEP_CLOSED_MS. */
bool session_any_due(store_t *st, int64_t now);
/* Closes cleanup_on_exit sessions silent past their timeout at `now`, except
 * those `busy` (may be NULL) reports, and forgets up to a chunk of sessions
 * closed SESSION_KEEP_CLOSED_MS before `now`.  Returns how many it closed,
 * -1 on store failure. */
int64_t session_expire_due(store_t *st, int64_t now, session_busy_fn busy, void *arg);

#endif
