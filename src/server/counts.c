/*
 * counts.c — tasks per (queue, state), maintained by the writers.
 *
 * One row per (queue, state) that ever had a task, WITHOUT ROWID so that a
 * change is one b-tree seek on a table small enough to stay in the page
 * cache.  Rows that fall to 0 are kept (they come back soon in a live queue);
 * a deleted queue's rows go with it (counts_drop).  Changes are upserts:
 * a move is one statement that touches both rows, so a state change costs one
 * statement step whatever the batch size (the callers add up their batches).
 */
#include "counts.h"

#include <assert.h>
#include <stdio.h>
#include <string.h>

muster_err_t counts_move(store_t *st, const char *queue, int from, int to, int64_t n, fail_t *f) {
  if (n == 0 || from == to)
    return MUSTER_OK;
  assert(from == COUNTS_NONE || (from >= 0 && from < TASK_STATE_COUNT));
  assert(to == COUNTS_NONE || (to >= 0 && to < TASK_STATE_COUNT));
  sqlite3_stmt *s;
  if (from == COUNTS_NONE || to == COUNTS_NONE) {
    s = store_stmt(st, "INSERT INTO queue_counts(queue, state, n) VALUES(?1, ?2, ?3)"
                       " ON CONFLICT(queue, state) DO UPDATE SET n = n + excluded.n");
    if (s == NULL)
      return store_fail(st, f, "task counts");
    sqlite3_bind_int(s, 2, from == COUNTS_NONE ? to : from);
    sqlite3_bind_int64(s, 3, from == COUNTS_NONE ? n : -n);
  } else {
    s = store_stmt(st, "INSERT INTO queue_counts(queue, state, n) VALUES(?1, ?2, -?4), (?1, ?3, ?4)"
                       " ON CONFLICT(queue, state) DO UPDATE SET n = n + excluded.n");
    if (s == NULL)
      return store_fail(st, f, "task counts");
    sqlite3_bind_int(s, 2, from);
    sqlite3_bind_int(s, 3, to);
    sqlite3_bind_int64(s, 4, n);
  }
  /* The queue name outlives the step: no copy needed. */
  sqlite3_bind_text(s, 1, queue, -1, SQLITE_STATIC);
  return store_step_done(st, s, f);
}

muster_err_t counts_run_flush(store_t *st, counts_run_t *run, fail_t *f) {
  int64_t n = run->n;
  run->n = 0;
  return counts_move(st, run->queue, run->from, run->to, n, f);
}

muster_err_t counts_run_add(store_t *st, counts_run_t *run, const char *queue, int from, int to,
                            fail_t *f) {
  if (run->n > 0 && (run->from != from || run->to != to || strcmp(run->queue, queue) != 0) &&
      counts_run_flush(st, run, f))
    return f->code;
  if (run->n == 0) {
    snprintf(run->queue, sizeof run->queue, "%s", queue);
    run->from = from;
    run->to = to;
  }
  run->n++;
  return MUSTER_OK;
}

muster_err_t counts_drop(store_t *st, const char *queue, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "DELETE FROM queue_counts WHERE queue = ?1");
  if (s == NULL)
    return store_fail(st, f, "task counts");
  store_bind_text(s, 1, queue);
  return store_step_done(st, s, f);
}

muster_err_t counts_read(store_t *st, const char *queue, int64_t *by_state, fail_t *f) {
  for (int state = 0; state < TASK_STATE_COUNT; state++)
    by_state[state] = 0;
  sqlite3_stmt *s = store_stmt(st, "SELECT state, n FROM queue_counts WHERE queue = ?1");
  if (s == NULL)
    return store_fail(st, f, "task counts");
  store_bind_text(s, 1, queue);
  int rc;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    int state = sqlite3_column_int(s, 0);
    if (state >= 0 && state < TASK_STATE_COUNT)
      by_state[state] = sqlite3_column_int64(s, 1);
  }
  store_reset(s);
  return rc == SQLITE_DONE ? MUSTER_OK : store_fail(st, f, "task counts");
}
