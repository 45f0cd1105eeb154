/*
 * session_close.c — closing sessions: by their client, by the expiry of a
 * silent one, and with their queue.  Unfinished tasks are cancelled, then
 * the session's tasks, results, updates and shared data deleted; the
 * session's row stays, closed, with the reason (session.c).
 */
#include "session.h"
#include "counts.h"
#include "log.h"
#include "session_internal.h"
#include "shared.h"
#include "task.h"
#include "update.h"

#include <assert.h>
#include <stdio.h>
#include <string.h>

/* Runs `sql` with ?1 bound to `id`; *changed (may be NULL) gets the rows changed. */
static muster_err_t session_exec(store_t *st, const char *sql, const char *id, int64_t *changed,
                                 fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, sql);
  if (s == NULL)
    return store_fail(st, f, "session close");
  store_bind_text(s, 1, id);
  if (store_step_done(st, s, f))
    return f->code;
  if (changed)
    *changed = sqlite3_changes64(store_db(st));
  return MUSTER_OK;
}

/* Takes the session's tasks (in its queue and, through pipelines, in later
 * stages) but those in queue `leave` (NULL: none) off the counts;
 * *unfinished gets how many were queued or leased, *all how many there are.
 * Run before they are deleted. */
static muster_err_t session_uncount(store_t *st, const char *id, const char *leave,
                                    int64_t *unfinished, int64_t *all, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT queue, state, count(*) FROM tasks WHERE session = ?1"
                                   " AND queue IS NOT ?2 GROUP BY queue, state");
  if (s == NULL)
    return store_fail(st, f, "session close");
  store_bind_text(s, 1, id);
  store_bind_text(s, 2, leave);
  *unfinished = *all = 0;
  int rc;
  /* Writing queue_counts between the rows is safe: this reads tasks only. */
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    int state = sqlite3_column_int(s, 1);
    int64_t n = sqlite3_column_int64(s, 2);
    if (counts_move(st, (const char *)sqlite3_column_text(s, 0), state, COUNTS_NONE, n, f)) {
      store_reset(s);
      return f->code;
    }
    *all += n;
    if (state == TASK_QUEUED || state == TASK_LEASED)
      *unfinished += n;
  }
  store_reset(s);
  return rc == SQLITE_DONE ? MUSTER_OK : store_fail(st, f, "session close");
}

/* Deletes the tasks of session `id` but those in queue `leave` (NULL: none);
 * *deleted gets how many. */
static muster_err_t session_delete_tasks(store_t *st, const char *id, const char *leave,
                                         int64_t *deleted, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "DELETE FROM tasks WHERE session = ?1 AND queue IS NOT ?2");
  if (s == NULL)
    return store_fail(st, f, "session close");
  store_bind_text(s, 1, id);
  store_bind_text(s, 2, leave);
  store_note_tasks_deleted(st);
  if (store_step_done(st, s, f))
    return f->code;
  *deleted = sqlite3_changes64(store_db(st));
  return MUSTER_OK;
}

/* session_close, leaving the session's tasks in queue `leave` (NULL: none)
 * to the caller, which deletes that queue's tasks itself. */
static json_t *session_close_leaving(store_t *st, const char *id, const char *why,
                                     const char *leave, fail_t *f) {
  session_t ss;
  int64_t cancelled = 0, deleted = 0;
  if (session_load(st, id, &ss, NULL, f))
    return NULL;
  if (ss.state != SESSION_OPEN) {
    fail_set(f, MUSTER_SESSION_NOT_FOUND, "session '%s' was closed already (%s)", id,
             ss.closed_why[0] ? ss.closed_why : "by its client");
    return NULL;
  }
  /* Unfinished tasks are cancelled (the reply says how many) and every
   * task of the session goes. */
  int64_t counted;
  if (session_uncount(st, id, leave, &cancelled, &counted, f) ||
      session_delete_tasks(st, id, leave, &deleted, f) ||
      session_exec(st, "DELETE FROM session_results WHERE session = ?1", id, NULL, f) ||
      update_delete_session(st, id, f) || shared_delete_scope(st, id, NULL, f))
    return NULL;
  assert(counted == deleted);
  sqlite3_stmt *s = store_stmt(st, "UPDATE sessions SET state = 1, closed_why = ?2,"
                                   " last_seen_ms = ?3 WHERE id = ?1");
  if (s == NULL) {
    store_fail(st, f, "session close");
    return NULL;
  }
  store_bind_text(s, 1, id);
  store_bind_text(s, 2, why);
  sqlite3_bind_int64(s, 3, now_ms());
  if (store_step_done(st, s, f))
    return NULL;
  store_notify_session(st, id); /* its waiting readers learn that it is gone */
  return json_pack("{s:s, s:I, s:I}", "id", id, "cancelled", (json_int_t)cancelled, "deleted",
                   (json_int_t)deleted);
}

json_t *session_close(store_t *st, const char *id, const char *why, fail_t *f) {
  return session_close_leaving(st, id, why, NULL, f);
}

bool session_any_due(store_t *st, int64_t now) {
  sqlite3_stmt *s = store_stmt(st, "SELECT 1 FROM sessions WHERE state = 0 AND cleanup_on_exit = 1"
                                   " AND last_seen_ms + timeout_ms <= ?1"
                                   " AND ?2 + timeout_ms <= ?1 LIMIT 1");
  if (s == NULL)
    return true;
  sqlite3_bind_int64(s, 1, now);
  sqlite3_bind_int64(s, 2, store_opened_ms(st));
  bool due = sqlite3_step(s) == SQLITE_ROW;
  store_reset(s);
  return due;
}

int64_t session_expire_due(store_t *st, int64_t now, session_busy_fn busy, void *arg) {
  sqlite3_stmt *s = store_stmt(st, "SELECT id, timeout_ms FROM sessions WHERE state = 0"
                                   " AND cleanup_on_exit = 1 AND last_seen_ms + timeout_ms <= ?1"
                                   " AND ?2 + timeout_ms <= ?1 LIMIT 64");
  if (s == NULL)
    return -1;
  char ids[64][SESSION_ID_LEN + 1];
  int64_t timeouts[64];
  size_t n = 0;
  sqlite3_bind_int64(s, 1, now);
  sqlite3_bind_int64(s, 2, store_opened_ms(st));
  while (n < 64 && sqlite3_step(s) == SQLITE_ROW) {
    snprintf(ids[n], sizeof ids[n], "%s", (const char *)sqlite3_column_text(s, 0));
    timeouts[n++] = sqlite3_column_int64(s, 1);
  }
  store_reset(s);
  int64_t closed = 0;
  for (size_t i = 0; i < n; i++) {
    if (busy && busy(arg, ids[i]))
      continue; /* a long-poll of its client is parked: the client is there */
    char why[128];
    snprintf(why, sizeof why, "its client did not call for %lld ms", (long long)timeouts[i]);
    fail_t f = {0};
    json_t *out = session_close(st, ids[i], why, &f);
    if (out == NULL)
      return -1;
    log_msg(LOG_INFO, "session %s closed: %s; %lld unfinished tasks cancelled", ids[i], why,
            (long long)json_integer_value(json_object_get(out, "cancelled")));
    json_decref(out);
    closed++;
  }
  return closed;
}

muster_err_t session_close_queue(store_t *st, const char *queue, int64_t *closed, fail_t *f) {
  char why[NAME_MAX_LEN + 64];
  snprintf(why, sizeof why, "its queue '%s' was deleted", queue);
  *closed = 0;
  for (;;) { /* a batch of ids at a time: closing changes what the query reads */
    sqlite3_stmt *s = store_stmt(st, "SELECT id FROM sessions WHERE state = 0 AND queue = ?1"
                                     " LIMIT 64");
    if (s == NULL)
      return store_fail(st, f, "session close");
    store_bind_text(s, 1, queue);
    char ids[64][SESSION_ID_LEN + 1];
    size_t n = 0;
    while (n < 64 && sqlite3_step(s) == SQLITE_ROW)
      snprintf(ids[n++], sizeof ids[0], "%s", (const char *)sqlite3_column_text(s, 0));
    store_reset(s);
    for (size_t i = 0; i < n; i++) {
      /* The tasks in `queue` are its deletion's (queue.c): in chunks when
       * they are many, not in this transaction. */
      json_t *out = session_close_leaving(st, ids[i], why, queue, f);
      if (out == NULL)
        return f->code;
      json_decref(out);
    }
    *closed += (int64_t)n;
    if (n < 64)
      return MUSTER_OK;
  }
}
