/*
 * queue.c — queue settings, listing with counts per state, purge, requeue and
 * deletion.  A queue's `next` names another queue: completing a task there
 * creates a task in `next` (see lease_ops.c), which makes pipelines.  What is
 * removed in the background, in chunks (retention, big deletes and purges),
 * is queue_reap.c's.
 */
#include "queue.h"
#include "counts.h"
#include "queue_reap.h"
#include "jv.h"
#include "leftover.h"
#include "log.h"
#include "session.h"
#include "task.h"
#include "update.h"

#include <stdio.h>
#include <string.h>

void queue_from_columns(sqlite3_stmt *s, int first, queue_t *q) {
  snprintf(q->name, sizeof q->name, "%s", (const char *)sqlite3_column_text(s, first));
  q->lease_ms = sqlite3_column_int64(s, first + 1);
  q->max_attempts = sqlite3_column_int64(s, first + 2);
  q->backoff_ms = sqlite3_column_int64(s, first + 3);
  q->backoff_max_ms = sqlite3_column_int64(s, first + 4);
  const unsigned char *next = sqlite3_column_text(s, first + 5);
  snprintf(q->next, sizeof q->next, "%s", next ? (const char *)next : "");
  q->max_flags = sqlite3_column_int64(s, first + 6);
  q->created_ms = sqlite3_column_int64(s, first + 7);
  q->keep_done_ms = sqlite3_column_type(s, first + 8) == SQLITE_NULL
                        ? QUEUE_KEEP_FOREVER
                        : sqlite3_column_int64(s, first + 8);
  q->reaped = sqlite3_column_int64(s, first + 9);
}

static void queue_from_row(sqlite3_stmt *s, queue_t *q) {
  queue_from_columns(s, 0, q);
}

#define QUEUE_COLUMNS                                                                              \
  "name, lease_ms, max_attempts, backoff_ms, backoff_max_ms, next, max_flags, created_ms,"         \
  " keep_done_ms, reaped"

muster_err_t queue_check_name(const char *name, fail_t *f) {
  if (name_was_valid(name))
    return MUSTER_OK;
  return fail_set(f, MUSTER_NAME_INVALID, "queue name '%.140s' is invalid: %s", name,
                  name_rule_text(name));
}

muster_err_t queue_load(store_t *st, const char *name, queue_t *q, fail_t *f) {
  if (queue_check_name(name, f))
    return f->code;
  sqlite3_stmt *s = store_stmt(st, "SELECT " QUEUE_COLUMNS " FROM queues WHERE name = ?1");
  if (s == NULL)
    return store_fail(st, f, "queue lookup");
  store_bind_text(s, 1, name);
  int rc = sqlite3_step(s);
  if (rc == SQLITE_ROW)
    queue_from_row(s, q);
  store_reset(s);
  if (rc == SQLITE_ROW)
    return MUSTER_OK;
  if (rc != SQLITE_DONE)
    return store_fail(st, f, "queue lookup");
  if (name_is_dots(name)) /* no queue of it, and none may be made */
    return fail_set(f, MUSTER_NAME_INVALID, "queue name '%s' is invalid: %s", name, NAME_DOTS_TEXT);
  return fail_set(f, MUSTER_QUEUE_NOT_FOUND, "queue '%s' does not exist", name);
}

/* Applies keep_done_ms of `body`, when present, to *q: null keeps done tasks
 * for ever, a number of milliseconds (0 up to ten years) keeps each that long
 * after its completion. */
static muster_err_t queue_apply_keep(queue_t *q, const json_t *body, fail_t *f) {
  const json_t *keep = json_object_get(body, "keep_done_ms");
  if (json_is_null(keep)) {
    q->keep_done_ms = QUEUE_KEEP_FOREVER;
    return MUSTER_OK;
  }
  if (keep && !json_is_integer(keep))
    return fail_set(f, MUSTER_INVALID,
                    "keep_done_ms: expected milliseconds (an integer) or null (keep for ever)");
  int64_t dflt = q->keep_done_ms == QUEUE_KEEP_FOREVER ? 0 : q->keep_done_ms;
  if (keep &&
      jv_int(body, "keep_done_ms", "", dflt, 0, QUEUE_MAX_KEEP_DONE_MS, &q->keep_done_ms, f))
    return f->code;
  return MUSTER_OK;
}

/* Applies `next` (NULL: absent; null or "": none) to *q: a queue that
 * exists, other than q itself. */
static muster_err_t queue_apply_next(store_t *st, queue_t *q, const json_t *next, fail_t *f) {
  if (next == NULL)
    return MUSTER_OK;
  if (json_is_null(next) || (json_is_string(next) && json_string_length(next) == 0)) {
    q->next[0] = '\0';
    return MUSTER_OK;
  }
  if (!json_is_string(next))
    return fail_set(f, MUSTER_INVALID, "next: expected a queue name or null");
  const char *name = json_string_value(next);
  if (!name_was_valid(name)) /* "." and "..": an older head's queue is found */
    return fail_set(f, MUSTER_NAME_INVALID, "next: '%.140s' is not a valid queue name", name);
  if (strcmp(name, q->name) == 0)
    return fail_set(f, MUSTER_INVALID, "next: a queue cannot be its own next stage");
  queue_t other;
  if (queue_load(st, name, &other, f) == MUSTER_QUEUE_NOT_FOUND)
    return fail_set(f, MUSTER_QUEUE_NOT_FOUND, "next: queue '%s' does not exist; create it first",
                    name);
  if (f->code == MUSTER_NAME_INVALID) /* "." or "..", no queue of it */
    return fail_set(f, MUSTER_NAME_INVALID, "next: '%s' is not a valid queue name: %s", name,
                    NAME_DOTS_TEXT);
  if (f->code)
    return f->code;
  snprintf(q->next, sizeof q->next, "%s", name);
  return MUSTER_OK;
}

/* Applies the settings present in `body` to *q, checking types and ranges. */
static muster_err_t queue_apply(store_t *st, queue_t *q, const json_t *body, fail_t *f) {
  /* The settings before "next" are integers that null does not fit. */
  static const char *const allowed[] = {
      "lease_ms",  "max_attempts", "backoff_ms",   "backoff_max_ms",
      "max_flags", "next",         "keep_done_ms", NULL};
  if (jv_only(body, "", allowed, f))
    return f->code;
  /* null means "remove" for next and "for ever" for keep_done_ms; a number
   * setting has no such meaning. */
  for (const char *const *key = allowed; strcmp(*key, "next") != 0; key++)
    if (json_is_null(json_object_get(body, *key)))
      return fail_set(f, MUSTER_INVALID, "%s: expected an integer, not null", *key);
  if (jv_int(body, "lease_ms", "", q->lease_ms, 1, QUEUE_MAX_LEASE_MS, &q->lease_ms, f) ||
      jv_int(body, "max_attempts", "", q->max_attempts, 1, 1000000, &q->max_attempts, f) ||
      jv_int(body, "backoff_ms", "", q->backoff_ms, 0, QUEUE_MAX_LEASE_MS, &q->backoff_ms, f) ||
      jv_int(body, "backoff_max_ms", "", q->backoff_max_ms, 0, QUEUE_MAX_LEASE_MS,
             &q->backoff_max_ms, f) ||
      jv_int(body, "max_flags", "", q->max_flags, 1, 1000000, &q->max_flags, f) ||
      queue_apply_keep(q, body, f))
    return f->code;
  if (q->backoff_max_ms < q->backoff_ms)
    return fail_set(f, MUSTER_INVALID, "backoff_max_ms (%lld) is below backoff_ms (%lld)",
                    (long long)q->backoff_max_ms, (long long)q->backoff_ms);
  return queue_apply_next(st, q, json_object_get(body, "next"), f);
}

/* Writes *q: a new row, or the settings of the existing one. */
static muster_err_t queue_write(store_t *st, const queue_t *q, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "INSERT INTO queues(" QUEUE_COLUMNS ")"
                                   " VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 0)"
                                   " ON CONFLICT(name) DO UPDATE SET lease_ms = excluded.lease_ms,"
                                   " max_attempts = excluded.max_attempts,"
                                   " backoff_ms = excluded.backoff_ms,"
                                   " backoff_max_ms = excluded.backoff_max_ms,"
                                   " next = excluded.next, max_flags = excluded.max_flags,"
                                   " keep_done_ms = excluded.keep_done_ms");
  if (s == NULL)
    return store_fail(st, f, "queue write");
  store_bind_text(s, 1, q->name);
  sqlite3_bind_int64(s, 2, q->lease_ms);
  sqlite3_bind_int64(s, 3, q->max_attempts);
  sqlite3_bind_int64(s, 4, q->backoff_ms);
  sqlite3_bind_int64(s, 5, q->backoff_max_ms);
  store_bind_text(s, 6, q->next[0] ? q->next : NULL);
  sqlite3_bind_int64(s, 7, q->max_flags);
  sqlite3_bind_int64(s, 8, q->created_ms);
  if (q->keep_done_ms != QUEUE_KEEP_FOREVER)
    sqlite3_bind_int64(s, 9, q->keep_done_ms); /* unbound: NULL, for ever */
  return store_step_done(st, s, f);
}

muster_err_t queue_put(store_t *st, const char *name, const json_t *body, bool *created,
                       fail_t *f) {
  queue_t q;
  muster_err_t err = queue_load(st, name, &q, f); /* checks the name first */
  if (err && err != MUSTER_QUEUE_NOT_FOUND)
    return err;
  *created = err == MUSTER_QUEUE_NOT_FOUND;
  *f = (fail_t){0};
  if (*created && queue_trash_check(st, name, f)) /* its old tasks are not all gone */
    return f->code;
  if (*created) {
    q = (queue_t){.lease_ms = QUEUE_DEFAULT_LEASE_MS,
                  .max_attempts = QUEUE_DEFAULT_MAX_ATTEMPTS,
                  .backoff_ms = QUEUE_DEFAULT_BACKOFF_MS,
                  .backoff_max_ms = QUEUE_DEFAULT_BACKOFF_MAX_MS,
                  .max_flags = QUEUE_DEFAULT_MAX_FLAGS,
                  .created_ms = now_ms(),
                  .keep_done_ms = QUEUE_KEEP_FOREVER};
    snprintf(q.name, sizeof q.name, "%s", name);
  }
  if (queue_apply(st, &q, body, f))
    return f->code;
  return queue_write(st, &q, f);
}

json_t *queue_to_json(store_t *st, const queue_t *q) {
  int64_t by_state[TASK_STATE_COUNT];
  fail_t ignored = {0};
  if (counts_read(st, q->name, by_state, &ignored))
    return NULL;
  json_t *counts = json_object();
  for (int state = 0; state < TASK_STATE_COUNT; state++)
    json_object_set_new(counts, task_state_name(state), json_integer(by_state[state]));
  json_t *keep =
      q->keep_done_ms == QUEUE_KEEP_FOREVER ? json_null() : json_integer(q->keep_done_ms);
  return json_pack("{s:s, s:I, s:I, s:I, s:I, s:o, s:I, s:o, s:I, s:I, s:o}", "name", q->name,
                   "lease_ms", (json_int_t)q->lease_ms, "max_attempts", (json_int_t)q->max_attempts,
                   "backoff_ms", (json_int_t)q->backoff_ms, "backoff_max_ms",
                   (json_int_t)q->backoff_max_ms, "next",
                   q->next[0] ? json_string(q->next) : json_null(), "max_flags",
                   (json_int_t)q->max_flags, "keep_done_ms", keep, "reaped", (json_int_t)q->reaped,
                   "created_ms", (json_int_t)q->created_ms, "counts", counts);
}

/* The kept counts leave out a closed session's tasks waiting for their
 * deletion (session_close.c), so those looked at are not "seen" either.
 * For a queue without runs of them (leftover.h), where none is met. */
#define QUEUE_READY_CLOSING_SQL                                                                    \
  "SELECT coalesce(sum(NOT w.closing), 0), coalesce(sum(w.run_at_ms <= ?2 AND NOT w.closing), 0)"  \
  " FROM (SELECT run_at_ms, " SESSION_CLOSING_SQL(                                                 \
      "tasks") " AS closing"                                                                       \
               " FROM tasks INDEXED BY tasks_ready"                                                \
               " WHERE queue = ?1 AND state = 0 ORDER BY priority DESC, id LIMIT ?3) AS w"

/* What the ready count has seen so far of a walk past what closed sessions
 * left (leftover.h). */
typedef struct {
  store_t *st;
  const char *queue;
  int64_t now, seen, seen_ready;
} queue_ready_walk_t;

/* A visit of that walk: the queued tasks of `priority` with ids
 * first..last, up to QUEUE_READY_SCAN seen in all. */
static muster_err_t queue_ready_visit(void *arg, int64_t priority, int64_t first, int64_t last,
                                      leftover_then_t *then, fail_t *f) {
  queue_ready_walk_t *w = arg;
  sqlite3_stmt *s = store_stmt(
      w->st, "SELECT count(*), coalesce(sum(run_at_ms <= ?5), 0) FROM (SELECT run_at_ms"
             " FROM tasks INDEXED BY tasks_ready WHERE queue = ?1 AND state = 0"
             " AND priority = ?2 AND id BETWEEN ?3 AND ?4 AND NOT " SESSION_CLOSING_TASKS_SQL
             " ORDER BY id LIMIT ?6)");
  if (s == NULL)
    return store_fail(w->st, f, "ready count");
  store_bind_text(s, 1, w->queue);
  sqlite3_bind_int64(s, 2, priority);
  sqlite3_bind_int64(s, 3, first);
  sqlite3_bind_int64(s, 4, last);
  sqlite3_bind_int64(s, 5, w->now);
  sqlite3_bind_int64(s, 6, QUEUE_READY_SCAN - w->seen);
  int rc = sqlite3_step(s);
  if (rc == SQLITE_ROW) {
    w->seen += sqlite3_column_int64(s, 0);
    w->seen_ready += sqlite3_column_int64(s, 1);
  }
  store_reset(s);
  *then = w->seen >= QUEUE_READY_SCAN ? LEFTOVER_DONE : LEFTOVER_ON;
  return rc == SQLITE_ROW ? MUSTER_OK : store_fail(w->st, f, "ready count");
}

/* The first QUEUE_READY_SCAN queued tasks of `name` in lease order: how
 * many there are (*seen) and how many of them are ready now (*ready). */
static muster_err_t queue_ready_seen(store_t *st, const char *name, int64_t *seen, int64_t *ready,
                                     fail_t *f) {
  queue_ready_walk_t w = {st, name, now_ms(), 0, 0};
  bool walked = false;
  if (leftover_walk(st, name, 0, queue_ready_visit, &w, &walked, f))
    return f->code;
  *seen = w.seen;
  *ready = w.seen_ready;
  if (walked)
    return MUSTER_OK;
  sqlite3_stmt *s = store_sessions_closing(st)
                        ? store_stmt(st, QUEUE_READY_CLOSING_SQL)
                        : store_stmt(st, "SELECT count(*), coalesce(sum(run_at_ms <= ?2), 0) FROM"
                                         " (SELECT run_at_ms FROM tasks INDEXED BY tasks_ready"
                                         " WHERE queue = ?1 AND state = 0"
                                         " ORDER BY priority DESC, id LIMIT ?3)");
  if (s == NULL)
    return store_fail(st, f, "ready count");
  store_bind_text(s, 1, name);
  sqlite3_bind_int64(s, 2, w.now);
  sqlite3_bind_int64(s, 3, QUEUE_READY_SCAN);
  int rc = sqlite3_step(s);
  *seen = rc == SQLITE_ROW ? sqlite3_column_int64(s, 0) : 0;
  *ready = rc == SQLITE_ROW ? sqlite3_column_int64(s, 1) : 0;
  store_reset(s);
  return rc == SQLITE_ROW ? MUSTER_OK : store_fail(st, f, "ready count");
}

/* The count of tasks leasable now is not kept with the others: time alone
 * makes a delayed task leasable, with no write to count it at, and an index
 * of queued tasks by run time would be written by every put and lease.  So
 * it is counted when asked for, and bounded: the first QUEUE_READY_SCAN
 * queued tasks in lease order (tasks_ready; each row read for its run time)
 * are looked at, and those beyond, known from the kept counts, are taken as
 * ready.  Exact up to QUEUE_READY_SCAN queued tasks.  Above, a positive
 * count still means that a lease finds a task now (it reaches a ready one
 * among those looked at first), and when none of them is ready the count
 * is 0, whatever waits behind them: a worker polling the count (the
 * DistCompute loop) then waits, where a count of tasks it cannot take
 * would have made its next lease come back empty (docs/api.md).  What
 * closed sessions left is neither counted nor looked at: the count steps
 * over it as a lease does (leftover.h). */
muster_err_t queue_count_ready(store_t *st, const char *name, int64_t *ready, fail_t *f) {
  int64_t by_state[TASK_STATE_COUNT], seen = 0, seen_ready = 0;
  if (counts_read(st, name, by_state, f) || queue_ready_seen(st, name, &seen, &seen_ready, f))
    return f->code;
  int64_t beyond = by_state[TASK_QUEUED] - seen;
  *ready = seen_ready + (seen_ready > 0 && beyond > 0 ? beyond : 0);
  return MUSTER_OK;
}

json_t *queue_list(store_t *st, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT " QUEUE_COLUMNS " FROM queues ORDER BY name");
  if (s == NULL) {
    store_fail(st, f, "queue list");
    return NULL;
  }
  /* Collect first: queue_to_json runs statements of its own. */
  size_t n = 0, cap = 16;
  queue_t *qs = malloc(cap * sizeof *qs);
  while (qs && sqlite3_step(s) == SQLITE_ROW) {
    if (n == cap) {
      queue_t *grown = realloc(qs, (cap *= 2) * sizeof *qs);
      if (grown == NULL)
        break;
      qs = grown;
    }
    queue_from_row(s, &qs[n++]);
  }
  store_reset(s);
  json_t *list = json_array();
  for (size_t i = 0; qs && i < n; i++)
    json_array_append_new(list, queue_to_json(st, &qs[i]));
  free(qs);
  return json_pack("{s:o}", "queues", list);
}

static muster_err_t queue_count_changes(store_t *st, sqlite3_stmt *s, const char *name,
                                        int64_t *changed, fail_t *f) {
  if (s == NULL)
    return store_fail(st, f, "queue update");
  store_bind_text(s, 1, name);
  if (store_step_done(st, s, f))
    return f->code;
  if (changed)
    *changed = sqlite3_changes64(store_db(st));
  return MUSTER_OK;
}

/* Refuses the deletion of `name` while another queue names it as `next`. */
static muster_err_t queue_check_unused(store_t *st, const char *name, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT name FROM queues WHERE next = ?1 LIMIT 1");
  if (s == NULL)
    return store_fail(st, f, "queue delete");
  store_bind_text(s, 1, name);
  if (sqlite3_step(s) == SQLITE_ROW) {
    fail_set(f, MUSTER_QUEUE_IN_USE,
             "queue '%s' is the next stage of queue '%s'; change or delete that queue first", name,
             (const char *)sqlite3_column_text(s, 0));
    store_reset(s);
    return f->code;
  }
  store_reset(s);
  return MUSTER_OK;
}

/* A queue of QUEUE_CHUNK tasks or fewer goes in this transaction with its
 * tasks, as it always did.  A bigger one would stall the head for as long as
 * its tasks take to delete (1.8 s for a million): only the queue goes now,
 * and its tasks go to the trash (queue_reap.c), deleted by the head's
 * background work a chunk per loop turn. */
muster_err_t queue_delete(store_t *st, const char *name, int64_t *tasks, int64_t *sessions,
                          bool *pending, fail_t *f) {
  queue_t q;
  int64_t by_state[TASK_STATE_COUNT];
  if (queue_load(st, name, &q, f) || queue_check_unused(st, name, f) ||
      counts_read(st, name, by_state, f))
    return f->code;
  *tasks = 0;
  for (int state = 0; state < TASK_STATE_COUNT; state++)
    *tasks += by_state[state];
  /* The tasks a closed session left behind are out of the counts, not yet
   * out of the table: when the queue has some, its deletion goes to the
   * trash too, whose chunks take them with the rest. */
  *pending = *tasks > QUEUE_CHUNK;
  if (!*pending && session_left_in_queue(st, name, pending, f))
    return f->code;
  if (*pending)
    return queue_trash_put(st, name, *tasks, sessions, f);
  store_note_tasks_deleted(st);
  if (queue_count_changes(st, store_stmt(st, "DELETE FROM tasks WHERE queue = ?1"), name, tasks,
                          f) ||
      counts_drop(st, name, f) || session_close_queue(st, name, sessions, f) ||
      update_delete_queue(st, name, f))
    return f->code;
  return queue_count_changes(st, store_stmt(st, "DELETE FROM queues WHERE name = ?1"), name, NULL,
                             f);
}

/* A purge through queue_purge_chunk, every chunk in this transaction. */
muster_err_t queue_purge(store_t *st, const char *name, int64_t *purged, fail_t *f) {
  bool finished = false;
  *purged = 0;
  while (!finished) {
    int64_t n = 0;
    if (queue_purge_chunk(st, name, INT64_MAX, QUEUE_CHUNK, &n, &finished, f))
      return f->code;
    *purged += n;
  }
  return MUSTER_OK;
}

#define QUEUE_REQUEUE_SQL                                                                          \
  "UPDATE tasks INDEXED BY tasks_failed SET state = 0, attempts = 0, flags = 0,"                   \
  " run_at_ms = ?2, updated_ms = ?2, error = NULL WHERE queue = ?1 AND state = ?3 AND state >= 3"

muster_err_t queue_requeue(store_t *st, const char *name, int64_t *requeued, fail_t *f) {
  queue_t q;
  if (queue_load(st, name, &q, f))
    return f->code;
  /* Not the tasks a closed session left to the background deletion: they
   * are out of the counts and gone for clients (session_close.c). */
  sqlite3_stmt *s = store_sessions_closing(st)
                        ? store_stmt(st, QUEUE_REQUEUE_SQL " AND NOT " SESSION_CLOSING_TASKS_SQL)
                        : store_stmt(st, QUEUE_REQUEUE_SQL);
  if (s == NULL)
    return store_fail(st, f, "requeue");
  /* One state at a time, so that the rows each changed are its count. */
  static const int from[] = {TASK_FAILED, TASK_DEAD};
  *requeued = 0;
  for (size_t i = 0; i < sizeof from / sizeof from[0]; i++) {
    int64_t changed = 0;
    sqlite3_bind_int64(s, 2, now_ms());
    sqlite3_bind_int(s, 3, from[i]);
    if (queue_count_changes(st, s, name, &changed, f) ||
        counts_move(st, name, from[i], TASK_QUEUED, changed, f))
      return f->code;
    *requeued += changed;
  }
  if (*requeued > 0)
    store_notify_ready(st, name);
  return MUSTER_OK;
}

int64_t queue_backoff_ms(const queue_t *q, int64_t attempts) {
  int64_t delay = q->backoff_ms;
  for (int64_t i = 1; i < attempts && delay < q->backoff_max_ms; i++)
    delay *= 2;
  return delay < q->backoff_max_ms ? delay : q->backoff_max_ms;
}
