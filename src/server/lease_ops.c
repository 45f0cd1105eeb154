/*
 * lease_ops.c — what a worker does with a lease it holds: complete, fail,
 * extend, release, flag (lease_apply and the scanned completion), element by
 * element; a batch of completions goes through lease_complete_batch.c's two
 * statements when it can.
 *
 * Every element's row is loaded and its fencing token checked; nothing here
 * trusts a worker's word about which task it holds.  A completion, fail or
 * release sent again under the token whose lease it ended (its reply was
 * lost) is answered as a repeat and changes nothing; the row records how its
 * last lease ended (lease_end_t) for that, and for refusals that say what
 * became of a lease.  Batches run inside the request's savepoint: the first
 * refused element makes the caller roll back all earlier ones.  Granting
 * leases and the lapses without a call are lease.c's; the transitions both
 * use are in lease_internal.h.
 */
#include "lease.h"
#include "counts.h"
#include "jv.h"
#include "jw.h"
#include "lease_internal.h"
#include "log.h"
#include "metrics.h"
#include "session.h"
#include "task.h"
#include "worker.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The contract is in lease_internal.h.  By hand, as it is written for
 * every element of a batch, refused or not. */
void lease_ctx(char ctx[32], size_t i) {
  char digits[24];
  size_t n = 0;
  do {
    digits[n++] = (char)('0' + i % 10);
    i /= 10;
  } while (i);
  memcpy(ctx, "leases[", 7);
  for (size_t k = 0; k < n; k++)
    ctx[7 + k] = digits[n - 1 - k];
  ctx[7 + n] = ']';
  ctx[8 + n] = '\0';
}

/* What the row of a task records of its last lease to end (lease_end_t),
 * read only when a call names a token that does not hold the task. */
typedef struct {
  int64_t token;     /* that lease's token; 0: none recorded */
  lease_end_t kind;  /* how it ended */
  int state;         /* the state that end left the task in */
  int64_t run_at_ms; /* the task's run time now: that end's, while it is the last recorded */
} lease_ended_t;

/* Loads the end recorded on the row of task `id` into *e. */
static muster_err_t lease_ended_load(store_t *st, int64_t id, lease_ended_t *e, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT coalesce(ended_token, 0), coalesce(ended_as, 0),"
                                   " run_at_ms FROM tasks WHERE id = ?1");
  if (s == NULL)
    return store_fail(st, f, "lease end lookup");
  sqlite3_bind_int64(s, 1, id);
  int rc = sqlite3_step(s);
  if (rc == SQLITE_ROW) {
    int64_t as = sqlite3_column_int64(s, 1);
    *e = (lease_ended_t){.token = sqlite3_column_int64(s, 0),
                         .kind = (lease_end_t)(as / LEASE_END_STATES),
                         .state = (int)(as % LEASE_END_STATES),
                         .run_at_ms = sqlite3_column_int64(s, 2)};
  }
  store_reset(s);
  return rc == SQLITE_ROW ? MUSTER_OK : store_fail(st, f, "lease end lookup");
}

/* What ended the lease under a token, for refusals: `kind` as recorded, or
 * LEASE_END_NONE when the row records another lease's end or none (a lease
 * that ended before the record existed, or a re-opened task's). */
static const char *lease_end_said(lease_end_t kind) {
  switch (kind) {
  case LEASE_END_FAILED:
    return "a fail under this token ended it";
  case LEASE_END_RELEASED:
    return "a release under this token ended it";
  case LEASE_END_FLAGGED:
    return "an invalid-data flag under this token ended it";
  case LEASE_END_LAPSED:
    return "it expired, or its worker timed out, crashed or said goodbye";
  case LEASE_END_NONE:
    break;
  }
  return "an earlier call under this token ended it, or it expired or its worker timed out";
}

/* Refuses a call under `token`, which does not hold the task `h` (its
 * recorded end `e`): the message says what became of that lease, as far as
 * the row tells. */
static muster_err_t lease_refuse(const lease_held_t *h, const lease_ended_t *e, int64_t token,
                                 const char *ctx, fail_t *f) {
  long long id = (long long)h->id, tok = (long long)token;
  const char *said = lease_end_said(e->token == token ? e->kind : LEASE_END_NONE);
  if (lease_completed_by(h, token))
    return fail_set(f, MUSTER_LEASE_LOST,
                    "%s: task %lld was already completed under token %lld; that completion "
                    "ended the lease",
                    ctx, id, tok);
  if (h->token == token)
    return fail_set(f, MUSTER_LEASE_LOST,
                    "%s: the lease of task %lld under token %lld already ended (the task is %s "
                    "now): %s",
                    ctx, id, tok, task_state_name(h->state), said);
  if (e->token == token)
    return fail_set(f, MUSTER_LEASE_LOST,
                    "%s: the lease of task %lld under token %lld already ended (%s), and the "
                    "task was leased again since (it is %s now)",
                    ctx, id, tok, said, task_state_name(h->state));
  if (h->state == TASK_LEASED)
    return fail_set(f, MUSTER_LEASE_LOST,
                    "%s: token %lld does not hold task %lld: the task is leased under another "
                    "token (the lease under %lld ended and it was leased again, or that token "
                    "was never this task's)",
                    ctx, tok, id, tok);
  return fail_set(f, MUSTER_LEASE_LOST,
                  "%s: task %lld is not leased (it is %s), and token %lld is not its last lease: "
                  "that lease ended and the work belongs to no one now",
                  ctx, id, task_state_name(h->state), tok);
}

/* The contract is in lease_internal.h. */
muster_err_t lease_check_held(store_t *st, const lease_held_t *h, int64_t token, const char *ctx,
                              fail_t *f) {
  if (h->state == TASK_LEASED && h->token == token)
    return MUSTER_OK;
  lease_ended_t e;
  if (lease_ended_load(st, h->id, &e, f))
    return f->code;
  return lease_refuse(h, &e, token, ctx, f);
}

/* Loads task `id` into *h; a task not found is refused naming the element
 * (`ctx`) before what lease_held_load says of it. */
static muster_err_t lease_load(store_t *st, int64_t id, const char *ctx, lease_held_t *h,
                               queue_t *cache, fail_t *f) {
  muster_err_t err = lease_held_load(st, id, h, cache, f);
  if (err == MUSTER_TASK_NOT_FOUND) {
    char why[sizeof f->message];
    snprintf(why, sizeof why, "%s", fail_message(f));
    fail_set(f, MUSTER_TASK_NOT_FOUND, "%s: %s", ctx, why);
  }
  return err;
}

/* A batch's replies as they are made.  Completions, one per task of every
 * worker's cycle, are written as text {"task", "next_task"} (a tree each
 * showed in profiles of batched cycles); the other operations' replies are
 * a tree. */
struct lease_apply_out {
  json_t *tree;       /* array of the replies to fail, extend, release, flag */
  jw_buf_t completed; /* "[" and the completions' objects, comma-separated */
  int64_t worker;     /* completions of this worker not yet added to its counter */
  int64_t worker_completed;
  size_t repeated; /* releases answered as repeats (lease_repeat) */
};

/* Adds the completions tallied in `out` to their worker's counter: a batch
 * usually comes from one worker, so it is one UPDATE per batch, not per task. */
static muster_err_t apply_count_worker(store_t *st, lease_apply_out_t *out, fail_t *f) {
  muster_err_t err = worker_count(st, out->worker, WORKER_COMPLETED, out->worker_completed, f);
  out->worker_completed = 0;
  return err;
}

/* Tallies one completion of `worker` (0: anonymous) in `out`. */
static muster_err_t apply_tally_worker(store_t *st, lease_apply_out_t *out, int64_t worker,
                                       fail_t *f) {
  if (worker != out->worker && apply_count_worker(st, out, f))
    return f->code;
  out->worker = worker;
  out->worker_completed++;
  return MUSTER_OK;
}

/* The contract is in lease_internal.h. */
muster_err_t lease_complete_size(const char *text, const char *ctx, size_t max_payload, fail_t *f) {
  return jv_payload_fits(text, max_payload, ctx, "result", f);
}

/* Opens the element {"task": id, "next_task": ID or null of a completion in
 * out->completed's list; the caller adds what else it says, and the "}". */
static jw_buf_t *op_completed_item(lease_apply_out_t *out, int64_t id, bool has_next,
                                   int64_t next_id) {
  jw_buf_t *b = &out->completed;
  if (b->len > 1) /* after the "[" */
    JW_ADD_LITERAL(b, ",");
  JW_ADD_LITERAL(b, "{\"task\":");
  jw_add_int(b, id);
  JW_ADD_LITERAL(b, ",\"next_task\":");
  lease_add_int_or_null(b, has_next, next_id);
  return b;
}

/* The contract is in lease_internal.h. */
muster_err_t lease_complete_after(store_t *st, const char *text, const lease_held_t *h,
                                  bool session_later, lease_apply_out_t *out, fail_t *f) {
  int64_t next_id = 0;
  if ((h->queue.next[0] &&
       task_insert(st, h->queue.next, text ? text : "null", h->priority, now_ms(), NULL,
                   h->has_session ? h->session : NULL, h->index, h->id, NULL, &next_id, f)) ||
      (!session_later && lease_finished(st, h, f)) || apply_tally_worker(st, out, h->worker, f))
    return f->code;
  metrics_count(METRIC_TASKS_COMPLETED, h->queue.name, 1);
  jw_buf_t *b = op_completed_item(out, h->id, next_id != 0, next_id);
  JW_ADD_LITERAL(b, "}");
  return b->failed ? fail_set(f, MUSTER_NOMEM, "out of memory") : MUSTER_OK;
}

/* Completes the task with result `text` (encoded JSON; NULL: none),
 * counted in `run`, and appends its reply to out->completed; with a next
 * stage, its result becomes a task there. */
static muster_err_t op_complete(store_t *st, const char *text, const lease_held_t *h,
                                const char *ctx, size_t max_payload, counts_run_t *run,
                                lease_apply_out_t *out, fail_t *f) {
  if (lease_complete_size(text, ctx, max_payload, f))
    return f->code;
  sqlite3_stmt *s = store_stmt(st, "UPDATE tasks SET state = 2, result = ?2, error = NULL,"
                                   " worker = NULL, deadline_ms = NULL, updated_ms = ?3"
                                   " WHERE id = ?1");
  if (s == NULL)
    return store_fail(st, f, "complete");
  sqlite3_bind_int64(s, 1, h->id);
  store_bind_text(s, 2, text);
  sqlite3_bind_int64(s, 3, now_ms());
  if (store_step_done(st, s, f) || counts_run_add(st, run, h->queue.name, h->state, TASK_DONE, f))
    return f->code;
  return lease_complete_after(st, text, h, false, out, f);
}

/* True when result texts `a` and `b` (encoded JSON; NULL: none) are the same
 * value: byte for byte as the scanner and jw_dump write them, or, for an
 * object written with its keys in another order, by value. */
static bool op_results_equal(const char *a, const char *b) {
  if (a == NULL || b == NULL)
    return a == b;
  if (strcmp(a, b) == 0)
    return true;
  json_t *x = json_loads(a, JSON_DECODE_ANY, NULL), *y = json_loads(b, JSON_DECODE_ANY, NULL);
  bool equal = x && y && json_equal(x, y);
  json_decref(x);
  json_decref(y);
  return equal;
}

/*
 * A completion repeated under the token that completed the task (a retry
 * whose reply was lost, the normal case around a restart of the head) is a
 * success with the first reply's shape, marked "repeated": true, and changes
 * nothing: no count, no tally, no second next-stage task, no session result.
 * The first result stays; when the repeat's result differs from it the
 * element says "result_ignored": true.  `next_task` is the next-stage task
 * the completion made, found by its parent: a scan of the next queue, paid
 * only by repeats.
 */
static muster_err_t op_complete_repeat(store_t *st, const char *text, const lease_held_t *h,
                                       lease_apply_out_t *out, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT result, (SELECT max(id) FROM tasks WHERE queue = ?2"
                                   " AND parent = ?1) FROM tasks WHERE id = ?1");
  if (s == NULL)
    return store_fail(st, f, "repeated completion");
  sqlite3_bind_int64(s, 1, h->id);
  sqlite3_bind_text(s, 2, h->queue.next, -1, SQLITE_STATIC);
  if (sqlite3_step(s) != SQLITE_ROW) {
    store_reset(s);
    return store_fail(st, f, "repeated completion");
  }
  bool same = op_results_equal((const char *)sqlite3_column_text(s, 0), text);
  bool has_next = sqlite3_column_type(s, 1) != SQLITE_NULL;
  int64_t next_id = sqlite3_column_int64(s, 1);
  store_reset(s);
  jw_buf_t *b = op_completed_item(out, h->id, has_next, next_id);
  JW_ADD_LITERAL(b, ",\"repeated\":true");
  if (!same)
    JW_ADD_LITERAL(b, ",\"result_ignored\":true");
  JW_ADD_LITERAL(b, "}");
  return b->failed ? fail_set(f, MUSTER_NOMEM, "out of memory") : MUSTER_OK;
}

/* Loads task `id` for a completion under `token`, and answers it at once when
 * it is a repeat (op_complete_repeat).  Returns 1 when it was, 0 when the
 * task is leased under `token` (*h loaded, to be completed), -1 with *f
 * filled otherwise. */
static int lease_check_complete(store_t *st, int64_t id, int64_t token, const char *text,
                                const char *ctx, lease_held_t *h, queue_t *cache,
                                lease_apply_out_t *out, fail_t *f) {
  if (lease_load(st, id, ctx, h, cache, f))
    return -1;
  if (lease_completed_by(h, token))
    return op_complete_repeat(st, text, h, out, f) ? -1 : 1;
  return lease_check_held(st, h, token, ctx, f) ? -1 : 0;
}

/* Reads a fail element's fields: its "error" (NULL: none) and "permanent". */
static muster_err_t op_fail_fields(const json_t *elem, const char *ctx, const char **error,
                                   bool *permanent, fail_t *f) {
  static const char *const allowed[] = {"task", "token", "error", "permanent", NULL};
  if (jv_only(elem, ctx, allowed, f) ||
      jv_str(elem, "error", ctx, NULL, LEASE_MAX_ERROR, error, f) ||
      jv_bool(elem, "permanent", ctx, false, permanent, f))
    return f->code;
  return MUSTER_OK;
}

/* The reply element of a fail of task `id` that left it in `state`: with
 * the time it runs again when it was re-queued. */
static json_t *op_failed_item(int64_t id, int state, int64_t run_at_ms) {
  json_t *out = json_pack("{s:I, s:s}", "task", (json_int_t)id, "state", task_state_name(state));
  if (out && state == TASK_QUEUED)
    json_object_set_new(out, "run_at_ms", json_integer(run_at_ms));
  return out;
}

static json_t *op_fail(store_t *st, const json_t *elem, const lease_held_t *h, const char *ctx,
                       fail_t *f) {
  const char *error;
  bool permanent;
  if (op_fail_fields(elem, ctx, &error, &permanent, f))
    return NULL;
  const char *why = error ? error : permanent ? "failed permanently" : "failed";
  int state = TASK_FAILED;
  int64_t run_at = 0;
  if (permanent) {
    if (lease_move(st, h, TASK_FAILED, now_ms(), why, 0, LEASE_END_FAILED, f) ||
        lease_finished(st, h, f))
      return NULL;
  } else if ((state = lease_lapse(st, h, why, LEASE_END_FAILED, &run_at, f)) < 0) {
    return NULL;
  }
  if (worker_count(st, h->worker, WORKER_FAILED, 1, f))
    return NULL;
  metrics_count(METRIC_TASKS_FAILED, h->queue.name, 1);
  return op_failed_item(h->id, state, run_at);
}

static json_t *op_extend(store_t *st, const json_t *elem, const lease_held_t *h, const char *ctx,
                         fail_t *f) {
  static const char *const allowed[] = {"task", "token", "lease_ms", NULL};
  int64_t lease_ms;
  if (jv_only(elem, ctx, allowed, f) ||
      jv_int(elem, "lease_ms", ctx, h->queue.lease_ms, 1, QUEUE_MAX_LEASE_MS, &lease_ms, f))
    return NULL;
  int64_t deadline = now_ms() + lease_ms;
  sqlite3_stmt *s = store_stmt(st, "UPDATE tasks SET deadline_ms = ?2 WHERE id = ?1");
  if (s == NULL) {
    store_fail(st, f, "extend");
    return NULL;
  }
  sqlite3_bind_int64(s, 1, h->id);
  sqlite3_bind_int64(s, 2, deadline);
  if (store_step_done(st, s, f))
    return NULL;
  return json_pack("{s:I, s:I}", "task", (json_int_t)h->id, "deadline_ms", (json_int_t)deadline);
}

/* Re-opens `parent` at its stage: queued, result cleared, counters reset;
 * *reopened false when it is gone (its queue's retention removed it, or its
 * queue was deleted: a task of the trash is gone too, queue_reap.h). */
static muster_err_t lease_reopen_parent(store_t *st, int64_t parent, bool *reopened, fail_t *f) {
  /* Its state before, for the counts: usually done, but an operator may have
   * moved it since. */
  /* One that a closed session left to the background deletion is gone too
   * (session_close.c): out of the counts already. */
  sqlite3_stmt *s =
      store_sessions_closing(st)
          ? store_stmt(st, "SELECT state, queue FROM tasks WHERE id = ?1"
                           " AND EXISTS (SELECT 1 FROM queues WHERE name = tasks.queue)"
                           " AND NOT " SESSION_CLOSING_TASKS_SQL)
          : store_stmt(st, "SELECT state, queue FROM tasks WHERE id = ?1"
                           " AND EXISTS (SELECT 1 FROM queues WHERE name = tasks.queue)");
  *reopened = false;
  if (s == NULL)
    return store_fail(st, f, "re-open parent");
  sqlite3_bind_int64(s, 1, parent);
  int rc = sqlite3_step(s), from = rc == SQLITE_ROW ? sqlite3_column_int(s, 0) : 0;
  char queue[NAME_MAX_LEN + 1] = "";
  if (rc == SQLITE_ROW)
    snprintf(queue, sizeof queue, "%s", (const char *)sqlite3_column_text(s, 1));
  store_reset(s);
  if (rc == SQLITE_DONE)
    return MUSTER_OK; /* the parent is gone: nothing to re-open */
  if (rc != SQLITE_ROW)
    return store_fail(st, f, "re-open parent");
  /* It starts over: no end of an earlier lease is recorded, so that a fail
   * or release of one retried now is not taken for a repeat of this run. */
  s = store_stmt(st, "UPDATE tasks SET state = 0, result = NULL, attempts = 0,"
                     " flags = 0, run_at_ms = ?2, updated_ms = ?2, worker = NULL,"
                     " deadline_ms = NULL, ended_token = NULL, ended_as = NULL WHERE id = ?1");
  if (s == NULL)
    return store_fail(st, f, "re-open parent");
  sqlite3_bind_int64(s, 1, parent);
  sqlite3_bind_int64(s, 2, now_ms());
  if (store_step_done(st, s, f) || counts_move(st, queue, from, TASK_QUEUED, 1, f))
    return f->code;
  store_notify_ready(st, queue);
  *reopened = true;
  return MUSTER_OK;
}

/* The flag that reached max_flags: the task is cancelled and its parent
 * re-opened a stage back; without a parent, or when the parent is gone (a
 * stage's retention removed it), nothing can redo its input, and the task
 * goes dead as at the first stage.  *state and *reopened (0: none) get
 * what happened. */
static muster_err_t op_flag_last(store_t *st, const lease_held_t *h, const char *why, int *state,
                                 int64_t *reopened, fail_t *f) {
  bool parent_reopened = false;
  if (h->parent && lease_reopen_parent(st, h->parent, &parent_reopened, f))
    return f->code;
  if (parent_reopened) {
    *state = TASK_CANCELLED;
    *reopened = h->parent;
    return lease_move(st, h, TASK_CANCELLED, now_ms(), why, 0, LEASE_END_FLAGGED, f);
  }
  *state = TASK_DEAD;
  if (lease_move(st, h, TASK_DEAD, now_ms(), why, 0, LEASE_END_FLAGGED, f) ||
      lease_finished(st, h, f))
    return f->code;
  metrics_count(METRIC_TASKS_DEAD, h->queue.name, 1);
  return MUSTER_OK;
}

static json_t *op_flag(store_t *st, const json_t *elem, const lease_held_t *h, const char *ctx,
                       fail_t *f) {
  static const char *const allowed[] = {"task", "token", "reason", NULL};
  const char *reason;
  if (jv_only(elem, ctx, allowed, f) ||
      jv_str(elem, "reason", ctx, NULL, LEASE_MAX_ERROR, &reason, f) ||
      worker_count(st, h->worker, WORKER_FLAGGED, 1, f))
    return NULL;
  sqlite3_stmt *s = store_stmt(st, "UPDATE tasks SET flags = flags + 1 WHERE id = ?1");
  sqlite3_bind_int64(s, 1, h->id);
  if (store_step_done(st, s, f))
    return NULL;
  int64_t flags = h->flags + 1, reopened = 0;
  int state = TASK_QUEUED;
  char why[LEASE_MAX_ERROR + 128];
  char count[32] = "once";
  if (flags != 1)
    snprintf(count, sizeof count, "%lld times", (long long)flags);
  snprintf(why, sizeof why, "flagged invalid %s%s%s", count, reason ? ": " : "",
           reason ? reason : "");
  if (flags < h->queue.max_flags) {
    if (lease_give_back(st, h, LEASE_END_FLAGGED, f))
      return NULL;
  } else if (op_flag_last(st, h, why, &state, &reopened, f)) {
    return NULL;
  }
  metrics_count(METRIC_TASKS_FLAGGED, h->queue.name, 1);
  return json_pack("{s:I, s:s, s:o}", "task", (json_int_t)h->id, "state", task_state_name(state),
                   "reopened", reopened ? json_integer(reopened) : json_null());
}

/* The reply to a flag repeated under the token whose lease it ended (`e`):
 * the first reply, from the state that flag left the task in.  A flag that
 * cancelled the task re-opened its parent (op_flag), so "reopened" is that. */
static json_t *op_flag_repeat(const json_t *elem, const lease_held_t *h, const lease_ended_t *e,
                              const char *ctx, fail_t *f) {
  static const char *const allowed[] = {"task", "token", "reason", NULL};
  const char *reason;
  if (jv_only(elem, ctx, allowed, f) ||
      jv_str(elem, "reason", ctx, NULL, LEASE_MAX_ERROR, &reason, f))
    return NULL;
  bool reopened = e->state == TASK_CANCELLED && h->parent;
  return json_pack("{s:I, s:s, s:o, s:b}", "task", (json_int_t)h->id, "state",
                   task_state_name(e->state), "reopened",
                   reopened ? json_integer(h->parent) : json_null(), "repeated", 1);
}

static const char *const op_reply_keys[] = {"completed", "failed", "extended", "released",
                                            "flagged"};

/* The reply to one element of an operation other than complete. */
static json_t *lease_apply_other(store_t *st, lease_op_t op, const json_t *elem,
                                 const lease_held_t *h, const char *ctx, fail_t *f) {
  switch (op) {
  case LEASE_COMPLETE:
    break;
  case LEASE_FAIL:
    return op_fail(st, elem, h, ctx, f);
  case LEASE_EXTEND:
    return op_extend(st, elem, h, ctx, f);
  case LEASE_RELEASE:
    return lease_give_back(st, h, LEASE_END_RELEASED, f) ? NULL : json_integer(h->id);
  case LEASE_FLAG:
    return op_flag(st, elem, h, ctx, f);
  }
  return NULL;
}

/*
 * A fail, release or flag repeated under the token whose lease it ended (a
 * retry whose reply was lost, as around a restart of the head) is a success
 * with the first reply's shape and changes nothing: no attempt, flag, count,
 * tally or metric, no second re-queue, and a lease granted since keeps the
 * task.  The first call's outcome stands, whatever the repeat's "error",
 * "permanent" or "reason" say.  A fail's or flag's element is the first one's
 * (the state its end left the task in, recorded with it) marked "repeated":
 * true; releases are
 * counted in "released" and, as repeats, in "repeated" (lease_apply_reply).
 */
static muster_err_t lease_repeat(lease_op_t op, const json_t *elem, const lease_held_t *h,
                                 const lease_ended_t *e, const char *ctx, lease_apply_out_t *out,
                                 fail_t *f) {
  const char *error;
  bool permanent;
  json_t *one = NULL;
  if (op == LEASE_RELEASE) {
    one = json_integer(h->id);
    out->repeated++;
  } else if (op == LEASE_FLAG) {
    one = op_flag_repeat(elem, h, e, ctx, f);
  } else if (op_fail_fields(elem, ctx, &error, &permanent, f) == MUSTER_OK &&
             (one = op_failed_item(h->id, e->state, e->run_at_ms)) != NULL) {
    json_object_set_new(one, "repeated", json_true());
  }
  if (one == NULL || json_array_append_new(out->tree, one) != 0)
    return f->code ? f->code : fail_set(f, MUSTER_NOMEM, "out of memory");
  return MUSTER_OK;
}

/* A call of `op` under `token`, which does not hold the task `h`: a repeat
 * of the fail, release or flag that ended the lease under it is answered
 * (lease_repeat) while that end is the task's last; anything else is
 * refused, saying what became of that lease.  A completion records no end
 * (the done task keeps its token), so a done task's last end is that. */
static muster_err_t lease_not_held(store_t *st, lease_op_t op, const json_t *elem,
                                   const lease_held_t *h, int64_t token, const char *ctx,
                                   lease_apply_out_t *out, fail_t *f) {
  lease_ended_t e;
  if (lease_ended_load(st, h->id, &e, f))
    return f->code;
  bool last = e.token == token && h->state != TASK_DONE;
  bool repeat = last && ((op == LEASE_FAIL && e.kind == LEASE_END_FAILED) ||
                         (op == LEASE_RELEASE && e.kind == LEASE_END_RELEASED) ||
                         (op == LEASE_FLAG && e.kind == LEASE_END_FLAGGED));
  if (repeat)
    return lease_repeat(op, elem, h, &e, ctx, out, f);
  return lease_refuse(h, &e, token, ctx, f);
}

/* Checks one element's task and token, applies `op` to it and adds its
 * reply to `out`. */
static muster_err_t lease_apply_one(store_t *st, lease_op_t op, const json_t *elem, size_t i,
                                    size_t max_payload, counts_run_t *run, queue_t *cache,
                                    lease_apply_out_t *out, fail_t *f) {
  char ctx[32];
  lease_ctx(ctx, i);
  int64_t task, token;
  if (jv_int(elem, "task", ctx, 0, 1, JV_ID_MAX, &task, f) ||
      jv_int(elem, "token", ctx, 0, 1, JV_ID_MAX, &token, f))
    return f->code;
  if (task == 0 || token == 0)
    return fail_set(f, MUSTER_INVALID,
                    "%s.%s: missing (every element needs \"task\" and \"token\")", ctx,
                    task == 0 ? "task" : "token");
  static const char *const plain[] = {"task", "token", NULL};
  static const char *const with_result[] = {"task", "token", "result", NULL};
  if ((op == LEASE_RELEASE && jv_only(elem, ctx, plain, f)) ||
      (op == LEASE_COMPLETE && jv_only(elem, ctx, with_result, f)))
    return f->code;
  lease_held_t h;
  if (op == LEASE_COMPLETE) {
    const json_t *result = json_object_get(elem, "result");
    char *text = result ? jv_encode(result) : NULL;
    int held = lease_check_complete(st, task, token, text, ctx, &h, cache, out, f);
    muster_err_t err =
        held == 0 ? op_complete(st, text, &h, ctx, max_payload, run, out, f) : f->code;
    free(text);
    return err;
  }
  if (lease_load(st, task, ctx, &h, cache, f))
    return f->code;
  if (h.state != TASK_LEASED || h.token != token)
    return lease_not_held(st, op, elem, &h, token, ctx, out, f);
  json_t *one = lease_apply_other(st, op, elem, &h, ctx, f);
  if (one == NULL || json_array_append_new(out->tree, one) != 0)
    return f->code ? f->code : fail_set(f, MUSTER_NOMEM, "out of memory");
  return MUSTER_OK;
}

/* The reply object of a batch applied into `out`: {"released": n} (with
 * "repeated": m when m of them were repeats), or the replies under the
 * operation's key, the completions as one raw node. */
static json_t *lease_apply_reply(lease_op_t op, lease_apply_out_t *out, fail_t *f) {
  json_t *replies = NULL;
  if (op == LEASE_RELEASE && out->repeated == 0)
    return json_pack("{s:I}", "released", (json_int_t)json_array_size(out->tree));
  if (op == LEASE_RELEASE)
    return json_pack("{s:I, s:I}", "released", (json_int_t)json_array_size(out->tree), "repeated",
                     (json_int_t)out->repeated);
  if (op != LEASE_COMPLETE) {
    replies = json_incref(out->tree);
  } else {
    JW_ADD_LITERAL(&out->completed, "]");
    replies = out->completed.failed ? NULL : jw_raw(out->completed.buf, out->completed.len);
  }
  json_t *reply = replies ? json_pack("{s:o}", op_reply_keys[op], replies) : NULL;
  if (reply == NULL)
    fail_set(f, MUSTER_NOMEM, "out of memory");
  return reply;
}

/* A completion read by the scanner (task, token and result checked). */
static muster_err_t lease_complete_one(store_t *st, const jscan_elem_t *e, size_t i,
                                       size_t max_payload, counts_run_t *run, queue_t *cache,
                                       lease_apply_out_t *out, fail_t *f) {
  char ctx[32];
  lease_held_t h;
  lease_ctx(ctx, i);
  int held = lease_check_complete(st, e->ints[0], e->ints[1], e->text, ctx, &h, cache, out, f);
  if (held != 0)
    return f->code;
  return op_complete(st, e->text, &h, ctx, max_payload, run, out, f);
}

/* Applies `op` to the elements of `leases`, or completes those `scanned`. */
static json_t *lease_apply_batch(store_t *st, lease_op_t op, const json_t *leases,
                                 const jscan_body_t *scanned, size_t max_payload, fail_t *f) {
  size_t n = scanned ? scanned->count : json_array_size(leases);
  lease_apply_out_t out = {.tree = json_array()};
  JW_ADD_LITERAL(&out.completed, "[");
  counts_run_t run = {0}; /* the completions, counted once per batch */
  queue_t cache = {0};    /* the queue of the previous element */
  bool ok = out.tree != NULL;
  size_t i = 0;
  if (ok && (scanned || op == LEASE_COMPLETE)) {
    int batched = scanned ? lease_complete_batch(st, scanned, max_payload, &run, &cache, &out, f)
                          : lease_complete_tree(st, leases, max_payload, &run, &cache, &out, f);
    ok = batched >= 0;
    if (batched == 0)
      i = n; /* all done */
  }
  for (; ok && i < n; i++)
    ok =
        (scanned ? lease_complete_one(st, &scanned->elems[i], i, max_payload, &run, &cache, &out, f)
                 : lease_apply_one(st, op, json_array_get(leases, i), i, max_payload, &run, &cache,
                                   &out, f)) == MUSTER_OK;
  json_t *reply = NULL;
  if (!ok) {
    fail_t ignored = {0};
    counts_run_flush(st, &run, &ignored); /* those before the refusal are counted */
    apply_count_worker(st, &out, &ignored);
    if (out.tree == NULL)
      fail_set(f, MUSTER_NOMEM, "out of memory");
  } else if (counts_run_flush(st, &run, f) == MUSTER_OK &&
             apply_count_worker(st, &out, f) == MUSTER_OK) {
    reply = lease_apply_reply(op, &out, f);
  }
  json_decref(out.tree);
  jw_buf_free(&out.completed);
  return reply;
}

json_t *lease_apply(store_t *st, lease_op_t op, const json_t *body, size_t max_payload, fail_t *f) {
  static const char *const allowed[] = {"leases", NULL};
  json_t *leases;
  if (jv_only(body, "", allowed, f) || jv_batch(body, "leases", LEASE_MAX_BATCH, &leases, f))
    return NULL;
  return lease_apply_batch(st, op, leases, NULL, max_payload, f);
}

json_t *lease_complete_scanned(store_t *st, const jscan_body_t *body, size_t max_payload,
                               fail_t *f) {
  return lease_apply_batch(st, LEASE_COMPLETE, NULL, body, max_payload, f);
}
