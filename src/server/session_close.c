/*
 * session_close.c — closing sessions (by their client, by the expiry of a
 * silent one, with their queue) and the background deletion of what a big
 * one leaves behind.
 *
 * A close used to delete every task of its session in its own transaction:
 * a session of a million tasks held the head's loop for seconds, as a
 * queue's deletion did (queue_reap.c).  Now a close deletes QUEUE_CHUNK
 * tasks at most.  When that was all of them nothing else differs, and the
 * reply counts what went.  Otherwise the close records the session in
 * session_trash in the same transaction, so the reply, sent after its
 * commit, is durable (a restart finds the row and goes on), deletes its
 * leased tasks (few, found through tasks_leased: so that no completion,
 * expiry or worker's end ever meets one, nor makes it a next stage), and
 * takes the tasks it leaves behind out of their queues' counts (a read of
 * them by tasks_by_session, a fraction of the time that deleting them
 * takes: session_count_left), which also makes the reply's numbers exact,
 * and the reaper deletes the rest a chunk per loop turn without moving
 * counts again, then the session's results.  Until their chunk, the tasks
 * left behind are skipped by leases, ready counts, task listings and reads
 * by id (SESSION_CLOSING_SQL), and the writers that take a queue's tasks in
 * bulk (a purge, a requeue, the chunks of a deleted queue's trash) leave them
 * be or out of their counts: for clients they are gone at the reply.
 *
 * Chunks go in the order of tasks_by_session, by queue and then index, which
 * for a pool is its queue's lease order: the tasks ahead of other clients'
 * go first.  A chunk takes only tasks up to the session's horizon, the
 * highest task id at the close, so a task put later naming the session (a
 * plain put may name any session) is not the close's to delete, as before.
 */
#include "session.h"
#include "counts.h"
#include "leftover.h"
#include "log.h"
#include "queue.h"
#include "session_internal.h"
#include "shared.h"
#include "task.h"
#include "update.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The tasks of one queue that a statement deleted, by state. */
typedef struct {
  char queue[NAME_MAX_LEN + 1];
  int64_t by_state[TASK_STATE_COUNT];
} gone_queue_t;

/* What a close or a chunk deleted. */
typedef struct {
  int64_t deleted, unfinished; /* tasks deleted; of them queued or leased */
  gone_queue_t *queues;        /* of the last statement, until their counts move */
  size_t nqueues, cap;
} session_gone_t;

/* The entry of `queue` in *gone, made if needed; NULL when out of memory.
 * It stays valid until the next entry is made. */
static gone_queue_t *gone_queue(session_gone_t *gone, const char *queue) {
  for (size_t i = gone->nqueues; i > 0; i--) /* the last one first: most are */
    if (strcmp(gone->queues[i - 1].queue, queue) == 0)
      return &gone->queues[i - 1];
  if (gone->nqueues == gone->cap) {
    size_t cap = gone->cap ? gone->cap * 2 : 4;
    gone_queue_t *grown = realloc(gone->queues, cap * sizeof *grown);
    if (grown == NULL)
      return NULL;
    gone->queues = grown;
    gone->cap = cap;
  }
  gone_queue_t *q = &gone->queues[gone->nqueues++];
  *q = (gone_queue_t){0};
  snprintf(q->queue, sizeof q->queue, "%s", queue);
  return q;
}

/* Counts a task in `state` of queue entry `q` of *gone. */
static void gone_count(session_gone_t *gone, gone_queue_t *q, int state) {
  gone->deleted++;
  if (state == TASK_QUEUED || state == TASK_LEASED)
    gone->unfinished++;
  if (state >= 0 && state < TASK_STATE_COUNT)
    q->by_state[state]++;
}

/* Adds a deleted task of `queue` in `state` to *gone; false when out of memory. */
static bool gone_add(session_gone_t *gone, const char *queue, int state) {
  gone_queue_t *q = gone_queue(gone, queue);
  if (q)
    gone_count(gone, q, state);
  return q != NULL;
}

/* Moves the counts of the queues *gone holds (unless `counted`: they were
 * taken out at the close) and forgets them (its totals stay).  No lease is
 * woken: a deletion makes no task ready, and a lease steps over what a
 * closed session left however much it is (leftover.h). */
static muster_err_t gone_flush(store_t *st, session_gone_t *gone, bool counted, fail_t *f) {
  muster_err_t err = MUSTER_OK;
  for (size_t i = 0; i < gone->nqueues && !err; i++) {
    const gone_queue_t *q = &gone->queues[i];
    for (int state = 0; state < TASK_STATE_COUNT && !err && !counted; state++)
      err = counts_move(st, q->queue, state, COUNTS_NONE, q->by_state[state], f);
  }
  gone->nqueues = 0;
  return err;
}

/* Runs statement `s`, bound, whose rows are each a task's queue and state
 * (a DELETE's, or a count's at the close); adds them to *gone and moves
 * their counts unless `counted` (gone_flush). */
static muster_err_t gone_rows(store_t *st, sqlite3_stmt *s, session_gone_t *gone, bool counted,
                              fail_t *f) {
  bool ok = true;
  int rc;
  while (ok && (rc = sqlite3_step(s)) == SQLITE_ROW)
    ok = gone_add(gone, (const char *)sqlite3_column_text(s, 0), sqlite3_column_int(s, 1));
  store_reset(s);
  if (!ok)
    return fail_set(f, MUSTER_NOMEM, "out of memory");
  if (rc != SQLITE_DONE)
    return store_fail(st, f, "session close");
  return gone_flush(st, gone, counted, f);
}

/* Deletes up to `max` tasks of session `id` with ids up to `horizon`, in the
 * order of tasks_by_session, into *gone; `counted`: their counts were moved
 * at the close (session_count_left). */
static muster_err_t session_delete_chunk(store_t *st, const char *id, int64_t horizon, int64_t max,
                                         bool counted, session_gone_t *gone, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "DELETE FROM tasks WHERE id IN (SELECT id FROM tasks"
                                   " INDEXED BY tasks_by_session WHERE session = ?1"
                                   " AND id <= ?2 LIMIT ?3) RETURNING queue, state");
  if (s == NULL)
    return store_fail(st, f, "session close");
  store_bind_text(s, 1, id);
  sqlite3_bind_int64(s, 2, horizon);
  sqlite3_bind_int64(s, 3, max);
  store_note_tasks_deleted(st);
  return gone_rows(st, s, gone, counted, f);
}

/* Deletes the leased tasks of session `id` into *gone.  Leases are few (a
 * batch per worker): tasks_leased finds them without reading the session's
 * other tasks. */
static muster_err_t session_delete_leased(store_t *st, const char *id, session_gone_t *gone,
                                          fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "DELETE FROM tasks WHERE id IN (SELECT id FROM tasks"
                                   " INDEXED BY tasks_leased WHERE state = 1 AND session = ?1)"
                                   " RETURNING queue, state");
  if (s == NULL)
    return store_fail(st, f, "session close");
  store_bind_text(s, 1, id);
  store_note_tasks_deleted(st);
  return gone_rows(st, s, gone, false, f);
}

/* Takes the tasks that the close of session `id` leaves behind (ids up to
 * `horizon`) out of their queues' counts now, into *gone: for clients they
 * are gone at the reply, counts included, and session_trash_step deletes
 * them without moving counts again.  One read of the session's part of
 * tasks_by_session and of each row's state: 38 ms for 300 000 tasks, where
 * deleting them took 1.18 s.  The same rows make the runs by which leases
 * step over them (leftover.h). */
static muster_err_t session_count_left(store_t *st, const char *id, int64_t horizon,
                                       session_gone_t *gone, fail_t *f) {
  /* The horizon is checked here, not in SQL: the id is read once then
   * (a second read of it from the index entry cost 15 % more). */
  sqlite3_stmt *s = store_stmt(st, "SELECT queue, state, id FROM tasks"
                                   " INDEXED BY tasks_by_session WHERE session = ?1");
  leftover_build_t *runs = leftover_build_new();
  if (s == NULL || runs == NULL) {
    leftover_build_free(runs);
    return s ? fail_set(f, MUSTER_NOMEM, "out of memory") : store_fail(st, f, "session close");
  }
  store_bind_text(s, 1, id);
  bool ok = true;
  int rc;
  gone_queue_t *q = NULL; /* of the last row: rows come by queue */
  while (ok && (rc = sqlite3_step(s)) == SQLITE_ROW) {
    int64_t task = sqlite3_column_int64(s, 2);
    if (task > horizon)
      continue; /* put after the close (a plain put may name the session) */
    const char *queue = (const char *)sqlite3_column_text(s, 0);
    if (q == NULL || strcmp(q->queue, queue) != 0)
      ok = (q = gone_queue(gone, queue)) != NULL && leftover_build_queue(runs, queue);
    if (ok) {
      gone_count(gone, q, sqlite3_column_int(s, 1));
      ok = leftover_build_id(runs, task);
    }
  }
  store_reset(s);
  if (!ok || rc != SQLITE_DONE) {
    leftover_build_free(runs);
    return !ok ? fail_set(f, MUSTER_NOMEM, "out of memory") : store_fail(st, f, "session close");
  }
  /* The gaps between runs may be sought: were this close rolled back, its
   * runs would go with its session_trash row (leftover_walk checks). */
  if (leftover_build_commit(st, runs, id, true, f))
    return f->code;
  return gone_flush(st, gone, false, f);
}

/* *left: session `id` still has a task with an id up to `horizon`. */
static muster_err_t session_tasks_left(store_t *st, const char *id, int64_t horizon, bool *left,
                                       fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT 1 FROM tasks INDEXED BY tasks_by_session"
                                   " WHERE session = ?1 AND id <= ?2 LIMIT 1");
  if (s == NULL)
    return store_fail(st, f, "session close");
  store_bind_text(s, 1, id);
  sqlite3_bind_int64(s, 2, horizon);
  int rc = sqlite3_step(s);
  store_reset(s);
  *left = rc == SQLITE_ROW;
  return rc == SQLITE_ROW || rc == SQLITE_DONE ? MUSTER_OK : store_fail(st, f, "session close");
}

/* Deletes up to `max` results of session `id`, oldest first; *deleted gets
 * how many. */
static muster_err_t session_delete_results(store_t *st, const char *id, int64_t max,
                                           int64_t *deleted, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "DELETE FROM session_results WHERE session = ?1 AND seq IN"
                                   " (SELECT seq FROM session_results WHERE session = ?1"
                                   " ORDER BY seq LIMIT ?2)");
  if (s == NULL)
    return store_fail(st, f, "session close");
  store_bind_text(s, 1, id);
  sqlite3_bind_int64(s, 2, max);
  if (store_step_done(st, s, f))
    return f->code;
  *deleted = sqlite3_changes64(store_db(st));
  return MUSTER_OK;
}

/* Records closed session `id` in session_trash: its tasks up to `horizon`
 * are left to session_trash_step, `deleted` of them went already. */
static muster_err_t session_trash_put(store_t *st, const char *id, int64_t horizon, int64_t deleted,
                                      fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "INSERT INTO session_trash(session, horizon, closed_ms,"
                                   " deleted) VALUES(?1, ?2, ?3, ?4)");
  if (s == NULL)
    return store_fail(st, f, "session close");
  store_bind_text(s, 1, id);
  sqlite3_bind_int64(s, 2, horizon);
  sqlite3_bind_int64(s, 3, now_ms());
  sqlite3_bind_int64(s, 4, deleted);
  store_set_sessions_closing(st, true); /* before the row: never false with one there */
  return store_step_done(st, s, f);
}

/* Marks session `id` closed (the row stays, to say why a late call is
 * refused) and drops its init_data, which no one can read any more and
 * which may be megabytes. */
static muster_err_t session_mark_closed(store_t *st, const char *id, const char *why, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "UPDATE sessions SET state = 1, closed_why = ?2,"
                                   " last_seen_ms = ?3 WHERE id = ?1");
  if (s == NULL)
    return store_fail(st, f, "session close");
  store_bind_text(s, 1, id);
  store_bind_text(s, 2, why);
  sqlite3_bind_int64(s, 3, now_ms());
  if (store_step_done(st, s, f))
    return f->code;
  s = store_stmt(st, "DELETE FROM session_data WHERE session = ?1");
  if (s == NULL)
    return store_fail(st, f, "session close");
  store_bind_text(s, 1, id);
  return store_step_done(st, s, f);
}

/* Deletes the tasks of open session *ss: up to *budget of them now (*budget
 * lowered by those), and when more are left its leased ones, leaving the
 * rest to the trash (*trashed); else its results.  *gone counts what went. */
static muster_err_t session_close_tasks(store_t *st, const session_t *ss, int64_t *budget,
                                        session_gone_t *gone, bool *trashed, fail_t *f) {
  int64_t horizon = store_last_task(st);
  *trashed = false;
  if (session_delete_chunk(st, ss->id, horizon, *budget, false, gone, f))
    return f->code;
  if (gone->deleted >= *budget && session_tasks_left(st, ss->id, horizon, trashed, f))
    return f->code;
  *budget -= gone->deleted;
  if (*trashed) {
    if (session_delete_leased(st, ss->id, gone, f) ||
        session_trash_put(st, ss->id, horizon, gone->deleted, f))
      return f->code;
    return session_count_left(st, ss->id, horizon, gone, f);
  }
  int64_t results = 0; /* no more than its tasks, which all went */
  return session_delete_results(st, ss->id, INT64_MAX, &results, f);
}

/* session_close deleting at most *budget tasks in this transaction (*budget
 * is lowered by those): a queue's deletion and the expiry share one budget
 * among the sessions they close. */
static json_t *session_close_within(store_t *st, const char *id, const char *why, int64_t *budget,
                                    fail_t *f) {
  session_t ss;
  if (session_load(st, id, &ss, NULL, f))
    return NULL;
  if (ss.state != SESSION_OPEN) {
    fail_set(f, MUSTER_SESSION_NOT_FOUND, "session '%s' was closed already (%s)", id,
             ss.closed_why[0] ? ss.closed_why : "by its client");
    return NULL;
  }
  session_gone_t gone = {0};
  bool trashed = false;
  muster_err_t err = session_close_tasks(st, &ss, budget, &gone, &trashed, f);
  free(gone.queues);
  if (err || update_delete_session(st, id, f) || shared_delete_scope(st, id, NULL, f) ||
      session_mark_closed(st, id, why, f))
    return NULL;
  store_notify_session(st, id); /* its waiting readers learn that it is gone */
  return json_pack("{s:s, s:I, s:I}", "id", id, "cancelled", (json_int_t)gone.unfinished, "deleted",
                   (json_int_t)gone.deleted);
}

json_t *session_close(store_t *st, const char *id, const char *why, fail_t *f) {
  int64_t budget = QUEUE_CHUNK;
  return session_close_within(st, id, why, &budget, f);
}

bool session_any_due(store_t *st, int64_t now) {
  return store_due(st,
                   "SELECT 1 FROM sessions WHERE state = 0 AND cleanup_on_exit = 1"
                   " AND" STORE_SILENT_SQL " LIMIT 1",
                   now) ||
         store_due(st, "SELECT 1 FROM sessions WHERE state = 1 AND last_seen_ms <= ?1 LIMIT 1",
                   now - SESSION_KEEP_CLOSED_MS);
}

/* Deletes up to a chunk of the rows of sessions closed SESSION_KEEP_CLOSED_MS
 * before `now` (last_seen_ms is the close's time), except those whose tasks
 * the reaper is still deleting.  0, or -1 on store failure. */
static int session_forget_closed(store_t *st, int64_t now) {
  sqlite3_stmt *s = store_stmt(st, "DELETE FROM sessions WHERE rowid IN (SELECT rowid"
                                   " FROM sessions WHERE state = 1 AND last_seen_ms <= ?1"
                                   " AND id NOT IN (SELECT session FROM session_trash)"
                                   " LIMIT ?2)");
  if (s == NULL)
    return -1;
  sqlite3_bind_int64(s, 1, now - SESSION_KEEP_CLOSED_MS);
  sqlite3_bind_int64(s, 2, QUEUE_CHUNK);
  int rc = sqlite3_step(s);
  store_reset(s);
  return rc == SQLITE_DONE ? 0 : -1;
}

int64_t session_expire_due(store_t *st, int64_t now, session_busy_fn busy, void *arg) {
  sqlite3_stmt *s = store_stmt(st, "SELECT id, timeout_ms FROM sessions WHERE state = 0"
                                   " AND cleanup_on_exit = 1 AND" STORE_SILENT_SQL " LIMIT 64");
  if (s == NULL)
    return -1;
  char ids[64][SESSION_ID_LEN + 1];
  int64_t timeouts[64], budget = QUEUE_CHUNK, closed = 0;
  size_t n = 0;
  sqlite3_bind_int64(s, 1, now);
  sqlite3_bind_int64(s, 2, store_heard_since_ms(st));
  while (n < 64 && sqlite3_step(s) == SQLITE_ROW) {
    snprintf(ids[n], sizeof ids[n], "%s", (const char *)sqlite3_column_text(s, 0));
    timeouts[n++] = sqlite3_column_int64(s, 1);
  }
  store_reset(s);
  for (size_t i = 0; i < n; i++) {
    if (busy && busy(arg, ids[i]))
      continue; /* a long-poll of its client is parked: the client is there */
    char why[128];
    snprintf(why, sizeof why, "its client did not call for %lld ms", (long long)timeouts[i]);
    fail_t f = {0};
    json_t *out = session_close_within(st, ids[i], why, &budget, &f);
    if (out == NULL)
      return -1;
    log_msg(LOG_INFO, "session %s closed: %s; %lld unfinished tasks cancelled", ids[i], why,
            (long long)json_integer_value(json_object_get(out, "cancelled")));
    json_decref(out);
    closed++;
  }
  return session_forget_closed(st, now) == 0 ? closed : -1;
}

muster_err_t session_close_queue(store_t *st, const char *queue, int64_t *closed, fail_t *f) {
  char why[NAME_MAX_LEN + 64];
  snprintf(why, sizeof why, "its queue '%s' was deleted", queue);
  int64_t budget = QUEUE_CHUNK;
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
      json_t *out = session_close_within(st, ids[i], why, &budget, f);
      if (out == NULL)
        return f->code;
      json_decref(out);
    }
    *closed += (int64_t)n;
    if (n < 64)
      return MUSTER_OK;
  }
}

/* ---- the background deletion ---- */

muster_err_t session_left_in_queue(store_t *st, const char *name, bool *any, fail_t *f) {
  *any = false;
  if (!store_sessions_closing(st))
    return MUSTER_OK;
  sqlite3_stmt *s = store_stmt(st, "SELECT 1 FROM session_trash AS c WHERE EXISTS (SELECT 1"
                                   " FROM tasks INDEXED BY tasks_by_session WHERE session ="
                                   " c.session AND queue = ?1 AND id <= c.horizon) LIMIT 1");
  if (s == NULL)
    return store_fail(st, f, "session trash");
  store_bind_text(s, 1, name);
  int rc = sqlite3_step(s);
  store_reset(s);
  *any = rc == SQLITE_ROW;
  return rc == SQLITE_ROW || rc == SQLITE_DONE ? MUSTER_OK : store_fail(st, f, "session trash");
}

muster_err_t session_trash_first(store_t *st, char id[SESSION_ID_LEN + 1], fail_t *f) {
  id[0] = '\0';
  if (!store_sessions_closing(st))
    return MUSTER_OK;
  sqlite3_stmt *s = store_stmt(st, "SELECT session FROM session_trash LIMIT 1");
  if (s == NULL)
    return store_fail(st, f, "session trash");
  int rc = sqlite3_step(s);
  if (rc == SQLITE_ROW)
    snprintf(id, SESSION_ID_LEN + 1, "%s", (const char *)sqlite3_column_text(s, 0));
  store_reset(s);
  /* Outside a transaction this is the committed state: nothing can bring a
   * row back but a close, which sets the flag again. */
  if (rc == SQLITE_DONE && !store_in_tx(st))
    store_set_sessions_closing(st, false);
  return rc == SQLITE_ROW || rc == SQLITE_DONE ? MUSTER_OK : store_fail(st, f, "session trash");
}

/* *horizon of session `id` in the trash; *found false when it is not there. */
static muster_err_t session_trash_load(store_t *st, const char *id, int64_t *horizon, bool *found,
                                       fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT horizon FROM session_trash WHERE session = ?1");
  if (s == NULL)
    return store_fail(st, f, "session trash");
  store_bind_text(s, 1, id);
  int rc = sqlite3_step(s);
  *found = rc == SQLITE_ROW;
  *horizon = *found ? sqlite3_column_int64(s, 0) : 0;
  store_reset(s);
  return rc == SQLITE_ROW || rc == SQLITE_DONE ? MUSTER_OK : store_fail(st, f, "session trash");
}

/* Adds `n` to the tasks deleted of session `id` in the trash. */
static muster_err_t session_trash_count(store_t *st, const char *id, int64_t n, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "UPDATE session_trash SET deleted = deleted + ?2"
                                   " WHERE session = ?1");
  if (s == NULL)
    return store_fail(st, f, "session trash");
  store_bind_text(s, 1, id);
  sqlite3_bind_int64(s, 2, n);
  return store_step_done(st, s, f);
}

/* The last of session `id`'s tasks and results went: its row goes too. */
static muster_err_t session_trash_done(store_t *st, const char *id, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "DELETE FROM session_trash WHERE session = ?1"
                                   " RETURNING deleted");
  if (s == NULL)
    return store_fail(st, f, "session trash");
  store_bind_text(s, 1, id);
  int rc = sqlite3_step(s);
  int64_t deleted = rc == SQLITE_ROW ? sqlite3_column_int64(s, 0) : 0;
  while (rc == SQLITE_ROW)
    rc = sqlite3_step(s);
  store_reset(s);
  if (rc != SQLITE_DONE)
    return store_fail(st, f, "session trash");
  log_msg(LOG_INFO, "session %s: the last of its %lld tasks were deleted", id, (long long)deleted);
  leftover_forget(st, id);
  return MUSTER_OK;
}

muster_err_t session_trash_step(store_t *st, const char *id, int64_t max, int64_t *deleted,
                                bool *finished, fail_t *f) {
  int64_t horizon = 0, results = 0;
  bool found = false;
  *deleted = 0;
  *finished = false;
  if (session_trash_load(st, id, &horizon, &found, f))
    return f->code;
  if (!found) {
    *finished = true;
    return MUSTER_OK;
  }
  session_gone_t gone = {0};
  muster_err_t err = session_delete_chunk(st, id, horizon, max, true, &gone, f);
  free(gone.queues);
  *deleted = gone.deleted;
  if (err || (gone.deleted > 0 && session_trash_count(st, id, gone.deleted, f)))
    return f->code;
  if (gone.deleted >= max) /* maybe more: the next chunk tells */
    return MUSTER_OK;
  if (session_delete_results(st, id, max - gone.deleted, &results, f))
    return f->code;
  if (results >= max - gone.deleted)
    return MUSTER_OK;
  *finished = true;
  return session_trash_done(st, id, f);
}
