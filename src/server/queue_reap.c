/*
 * queue_reap.c — tasks removed in chunks: done tasks past their queue's
 * retention, the tasks of a deleted queue (the trash), a big purge.
 *
 * The head runs one chunk per turn of its loop at most (reaper.c), inside
 * the turn's transaction like any request, so that the other requests of the
 * turn wait for one chunk (a few milliseconds), never for the whole job: a
 * queue of a million tasks took 1.8 s to delete in one transaction, during
 * which the head answered nobody.  Every chunk moves the counts of what it
 * deleted (counts.h), so queue_counts stays exact between chunks; tasks that
 * a closed session left to the background deletion, out of the counts since
 * that close (session_close.c), are deleted without being counted again.
 *
 * No index serves the retention: it walks a queue's tasks in id order
 * through tasks_by_queue, which every task has anyway, and stops at the
 * first task created after the cut-off (ids follow creation, and no task
 * is completed before it was created).  A pass therefore reads the tasks
 * created before the cut-off that are still there: those due, plus those
 * kept (not done, in an open session, or completed after the cut-off).  An
 * index of done tasks by completion time would have found the due ones
 * alone, but every completion of every queue would have written it
 * (docs/design-notes.md, "Retention of done tasks").
 */
#include "queue_reap.h"
#include "counts.h"
#include "log.h"
#include "metrics.h"
#include "queue.h"
#include "session.h"
#include "task.h"
#include "update.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the trash ---- */

/* Deletes the leased tasks of queue `name`.  Leases are few (a batch per
 * worker), found through tasks_leased, which reads no row to find them. */
static muster_err_t queue_trash_leased(store_t *st, const char *name, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "DELETE FROM tasks WHERE id IN (SELECT id FROM tasks"
                                   " INDEXED BY tasks_leased WHERE state = 1 AND queue = ?1)");
  if (s == NULL)
    return store_fail(st, f, "queue delete");
  store_bind_text(s, 1, name);
  store_note_tasks_deleted(st);
  if (store_step_done(st, s, f))
    return f->code;
  return counts_move(st, name, TASK_LEASED, COUNTS_NONE, sqlite3_changes64(store_db(st)), f);
}

/* Runs `sql`, which takes the queue name as ?1 and its task count as ?2. */
static muster_err_t queue_trash_exec(store_t *st, const char *sql, const char *name, int64_t tasks,
                                     fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, sql);
  if (s == NULL)
    return store_fail(st, f, "queue delete");
  store_bind_text(s, 1, name);
  sqlite3_bind_int64(s, 2, tasks);
  return store_step_done(st, s, f);
}

/* The trash row keeps the queue's `next`: compat_jobs.c reads it to tell
 * whether a deleted done task's job number is still wanted downstream. */
muster_err_t queue_trash_put(store_t *st, const char *name, int64_t tasks, int64_t *sessions,
                             fail_t *f) {
  if (session_close_queue(st, name, sessions, f) || queue_trash_leased(st, name, f) ||
      update_delete_queue(st, name, f))
    return f->code;
  sqlite3_stmt *s = store_stmt(st, "INSERT INTO queue_trash(name, tasks, deleted_ms, next)"
                                   " SELECT name, ?2, ?3, next FROM queues WHERE name = ?1");
  if (s == NULL)
    return store_fail(st, f, "queue delete");
  store_bind_text(s, 1, name);
  sqlite3_bind_int64(s, 2, tasks);
  sqlite3_bind_int64(s, 3, now_ms());
  if (store_step_done(st, s, f))
    return f->code;
  return queue_trash_exec(st, "DELETE FROM queues WHERE name = ?1", name, tasks, f);
}

/* The trash row of `name` is gone with the last of its tasks. */
static muster_err_t queue_trash_done(store_t *st, const char *name, fail_t *f) {
  if (counts_drop(st, name, f))
    return f->code;
  return queue_trash_exec(st, "DELETE FROM queue_trash WHERE name = ?1", name, 0, f);
}

/* The statement of queue_trash_step: a chunk of the trashed queue's tasks
 * deleted, each returned with its state and whether a closed session left
 * it to the background deletion (SESSION_CLOSING_SQL: one seek into
 * session_trash for a task of a session).  Those are out of the counts since
 * that close (session_close.c), so the chunk must not take them out again. */
static sqlite3_stmt *queue_trash_stmt(store_t *st) {
  return store_sessions_closing(st)
             ? store_stmt(st, "DELETE FROM tasks WHERE id IN (SELECT id FROM tasks"
                              " INDEXED BY tasks_by_queue WHERE queue = ?1 ORDER BY id"
                              " LIMIT ?2) RETURNING state, " SESSION_CLOSING_TASKS_SQL)
             : store_stmt(st, "DELETE FROM tasks WHERE id IN (SELECT id FROM tasks"
                              " INDEXED BY tasks_by_queue WHERE queue = ?1 ORDER BY id"
                              " LIMIT ?2) RETURNING state, 0");
}

muster_err_t queue_trash_step(store_t *st, const char *name, int64_t max, int64_t *deleted,
                              bool *finished, fail_t *f) {
  sqlite3_stmt *s = queue_trash_stmt(st);
  if (s == NULL)
    return store_fail(st, f, "queue delete");
  store_bind_text(s, 1, name);
  sqlite3_bind_int64(s, 2, max);
  store_note_tasks_deleted(st);
  int64_t by_state[TASK_STATE_COUNT] = {0};
  int rc;
  *deleted = 0;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    int state = sqlite3_column_int(s, 0);
    if (state >= 0 && state < TASK_STATE_COUNT && !sqlite3_column_int(s, 1))
      by_state[state]++;
    (*deleted)++;
  }
  store_reset(s);
  if (rc != SQLITE_DONE)
    return store_fail(st, f, "queue delete");
  for (int state = 0; state < TASK_STATE_COUNT; state++)
    if (counts_move(st, name, state, COUNTS_NONE, by_state[state], f))
      return f->code;
  *finished = *deleted < max;
  return *finished ? queue_trash_done(st, name, f) : MUSTER_OK;
}

muster_err_t queue_trash_first(store_t *st, char name[NAME_MAX_LEN + 1], fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT name FROM queue_trash LIMIT 1");
  if (s == NULL)
    return store_fail(st, f, "queue trash");
  int rc = sqlite3_step(s);
  name[0] = '\0';
  if (rc == SQLITE_ROW)
    snprintf(name, NAME_MAX_LEN + 1, "%s", (const char *)sqlite3_column_text(s, 0));
  store_reset(s);
  return rc == SQLITE_ROW || rc == SQLITE_DONE ? MUSTER_OK : store_fail(st, f, "queue trash");
}

muster_err_t queue_trash_check(store_t *st, const char *name, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT tasks FROM queue_trash WHERE name = ?1");
  if (s == NULL)
    return store_fail(st, f, "queue trash");
  store_bind_text(s, 1, name);
  int rc = sqlite3_step(s);
  int64_t tasks = rc == SQLITE_ROW ? sqlite3_column_int64(s, 0) : 0;
  store_reset(s);
  if (rc == SQLITE_ROW)
    return fail_set(f, MUSTER_INVALID_STATE,
                    "queue '%s' is still being deleted (it had %lld tasks, removed in the "
                    "background); create it again once the deletion has finished",
                    name, (long long)tasks);
  return rc == SQLITE_DONE ? MUSTER_OK : store_fail(st, f, "queue trash");
}

/* ---- purges ---- */

int64_t queue_purge_horizon(store_t *st) {
  return store_last_task(st);
}

/* A chunk's purged tasks of one session: how many. */
typedef struct {
  char session[TASK_MAX_SESSION + 1];
  int64_t n;
} purge_tally_t;

/* Adds a purged task of `session` to the chunk's tallies (*n of them). */
static void purge_tally_add(purge_tally_t *tally, size_t *n, const char *session) {
  for (size_t i = 0; i < *n; i++)
    if (strcmp(tally[i].session, session) == 0) {
      tally[i].n++;
      return;
    }
  snprintf(tally[*n].session, sizeof tally[*n].session, "%s", session);
  tally[(*n)++].n = 1;
}

/* Takes the purged tasks out of the totals of their sessions, those that
 * stream from queue `name`, and wakes their readers: a stream whose every
 * other task has its result then reads as stalled at the purged indexes (an
 * `index_gap`) instead of waiting for results that will never come. */
static muster_err_t purge_sessions(store_t *st, const char *name, const purge_tally_t *tally,
                                   size_t n, fail_t *f) {
  sqlite3_stmt *u = store_stmt(st, "UPDATE sessions SET total = total - ?2 WHERE id = ?1"
                                   " AND queue = ?3");
  if (u == NULL)
    return store_fail(st, f, "purge");
  for (size_t i = 0; i < n; i++) {
    store_bind_text(u, 1, tally[i].session);
    sqlite3_bind_int64(u, 2, tally[i].n);
    store_bind_text(u, 3, name);
    if (store_step_done(st, u, f))
      return f->code;
    if (sqlite3_changes64(store_db(st)) > 0)
      store_notify_session(st, tally[i].session);
  }
  return MUSTER_OK;
}

/* The ids of up to `max` queued tasks of `name` up to `horizon` into
 * ids[] (*n of them), with the tallies of their sessions.  Through the
 * queue's queued tasks only (tasks_ready), not all of its tasks.  Tasks that
 * a closed session left to the background deletion go too, but they are
 * out of the counts and gone for clients already (session_close.c): only
 * the others are tallied and counted in *counted. */
static muster_err_t purge_collect(store_t *st, const char *name, int64_t horizon, int64_t max,
                                  int64_t *ids, size_t *n, size_t *counted, purge_tally_t *tally,
                                  size_t *ntally, fail_t *f) {
  sqlite3_stmt *s = store_sessions_closing(st)
                        ? store_stmt(st, "SELECT id, session, " SESSION_CLOSING_TASKS_SQL
                                         " FROM tasks INDEXED BY tasks_ready"
                                         " WHERE queue = ?1 AND state = 0 AND id <= ?2 LIMIT ?3")
                        : store_stmt(st, "SELECT id, session, 0 FROM tasks INDEXED BY tasks_ready"
                                         " WHERE queue = ?1 AND state = 0 AND id <= ?2 LIMIT ?3");
  if (s == NULL)
    return store_fail(st, f, "purge");
  store_bind_text(s, 1, name);
  sqlite3_bind_int64(s, 2, horizon);
  sqlite3_bind_int64(s, 3, max);
  int rc;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    ids[(*n)++] = sqlite3_column_int64(s, 0);
    if (sqlite3_column_int(s, 2))
      continue; /* a closed session's, left behind */
    (*counted)++;
    if (sqlite3_column_type(s, 1) != SQLITE_NULL)
      purge_tally_add(tally, ntally, (const char *)sqlite3_column_text(s, 1));
  }
  store_reset(s);
  return rc == SQLITE_DONE ? MUSTER_OK : store_fail(st, f, "purge");
}

/* Deletes the tasks ids[0..n). */
static muster_err_t queue_delete_ids(store_t *st, const int64_t *ids, size_t n, const char *what,
                                     fail_t *f) {
  sqlite3_stmt *d = store_stmt(st, "DELETE FROM tasks WHERE id = ?1");
  if (d == NULL)
    return store_fail(st, f, what);
  store_note_tasks_deleted(st);
  for (size_t i = 0; i < n; i++) {
    sqlite3_bind_int64(d, 1, ids[i]);
    if (store_step_done(st, d, f))
      return f->code;
  }
  return MUSTER_OK;
}

muster_err_t queue_purge_chunk(store_t *st, const char *name, int64_t horizon, int64_t max,
                               int64_t *purged, bool *finished, fail_t *f) {
  queue_t q;
  *purged = 0;
  if (queue_load(st, name, &q, f))
    return f->code;
  int64_t *ids = malloc((size_t)max * sizeof *ids);
  purge_tally_t *tally = malloc((size_t)max * sizeof *tally);
  size_t n = 0, counted = 0, ntally = 0;
  muster_err_t err = MUSTER_OK;
  if (ids == NULL || tally == NULL)
    err = fail_set(f, MUSTER_NOMEM, "out of memory");
  if (!err)
    err = purge_collect(st, name, horizon, max, ids, &n, &counted, tally, &ntally, f);
  if (!err)
    err = purge_sessions(st, name, tally, ntally, f);
  if (!err)
    err = queue_delete_ids(st, ids, n, "purge", f);
  if (!err)
    err = counts_move(st, name, TASK_QUEUED, COUNTS_NONE, (int64_t)counted, f);
  if (!err) {
    *purged = (int64_t)counted;
    *finished = (int64_t)n < max;
  }
  free(ids);
  free(tally);
  return err;
}

/* ---- retention ---- */

muster_err_t queue_retention_list(store_t *st, queue_retention_t **list, size_t *n, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT name, keep_done_ms FROM queues"
                                   " WHERE keep_done_ms IS NOT NULL ORDER BY name");
  *list = NULL;
  *n = 0;
  if (s == NULL)
    return store_fail(st, f, "retention");
  size_t cap = 0;
  int rc;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    if (*n == cap) {
      cap = cap ? cap * 2 : 8;
      queue_retention_t *grown = realloc(*list, cap * sizeof *grown);
      if (grown == NULL) {
        store_reset(s);
        return fail_set(f, MUSTER_NOMEM, "out of memory");
      }
      *list = grown;
    }
    queue_retention_t *r = &(*list)[(*n)++];
    snprintf(r->name, sizeof r->name, "%s", (const char *)sqlite3_column_text(s, 0));
    r->keep_done_ms = sqlite3_column_int64(s, 1);
  }
  store_reset(s);
  return rc == SQLITE_DONE ? MUSTER_OK : store_fail(st, f, "retention");
}

/* Reads up to `max` tasks of `name` after *cursor and puts the ids of the due
 * ones into ids[] (*n); see queue_reap_chunk.  Reading the times reads past
 * the payload: the columns come after it. */
static muster_err_t reap_collect(store_t *st, const char *name, int64_t cutoff, int64_t max,
                                 int64_t *cursor, int64_t *ids, size_t *n, bool *pass_done,
                                 fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT id, state, session IS NULL, updated_ms, created_ms"
                                   " FROM tasks INDEXED BY tasks_by_queue WHERE queue = ?1"
                                   " AND id > ?2 ORDER BY id LIMIT ?3");
  if (s == NULL)
    return store_fail(st, f, "retention");
  store_bind_text(s, 1, name);
  sqlite3_bind_int64(s, 2, *cursor);
  sqlite3_bind_int64(s, 3, max);
  int rc;
  int64_t examined = 0;
  *pass_done = false;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    if (sqlite3_column_int64(s, 4) > cutoff) {
      *pass_done = true; /* created after the cut-off: so is every later task */
      break;
    }
    *cursor = sqlite3_column_int64(s, 0);
    examined++;
    if (sqlite3_column_int(s, 1) == TASK_DONE && sqlite3_column_int(s, 2) &&
        sqlite3_column_int64(s, 3) <= cutoff)
      ids[(*n)++] = *cursor;
  }
  store_reset(s);
  if (rc != SQLITE_ROW && rc != SQLITE_DONE)
    return store_fail(st, f, "retention");
  if (examined < max)
    *pass_done = true;
  return MUSTER_OK;
}

/* Adds `n` to the queue's count of reaped tasks. */
static muster_err_t reap_count(store_t *st, const char *name, int64_t n, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "UPDATE queues SET reaped = reaped + ?2 WHERE name = ?1");
  if (s == NULL)
    return store_fail(st, f, "retention");
  store_bind_text(s, 1, name);
  sqlite3_bind_int64(s, 2, n);
  if (store_step_done(st, s, f) || counts_move(st, name, TASK_DONE, COUNTS_NONE, n, f))
    return f->code;
  metrics_count(METRIC_TASKS_REAPED, name, n);
  return MUSTER_OK;
}

muster_err_t queue_reap_chunk(store_t *st, const char *name, int64_t now, int64_t max,
                              int64_t *cursor, int64_t *reaped, bool *pass_done, fail_t *f) {
  /* The setting as it is now: the caller's list of queues may be older. */
  queue_t q;
  *reaped = 0;
  muster_err_t err = queue_load(st, name, &q, f);
  if (err || q.keep_done_ms == QUEUE_KEEP_FOREVER) {
    *pass_done = true; /* deleted, or kept for ever from now on: nothing to do */
    return err == MUSTER_QUEUE_NOT_FOUND ? MUSTER_OK : err;
  }
  int64_t *ids = malloc((size_t)max * sizeof *ids);
  size_t n = 0;
  if (ids == NULL)
    return fail_set(f, MUSTER_NOMEM, "out of memory");
  err = reap_collect(st, name, now - q.keep_done_ms, max, cursor, ids, &n, pass_done, f);
  if (!err)
    err = queue_delete_ids(st, ids, n, "retention", f);
  if (!err && n > 0)
    err = reap_count(st, name, (int64_t)n, f);
  if (!err)
    *reaped = (int64_t)n;
  free(ids);
  return err;
}
