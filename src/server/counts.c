/*
 * counts.c — tasks per (queue, state), maintained by the writers.
 *
 * One row per (queue, state) that ever had a task, WITHOUT ROWID so that a
 * change is one b-tree seek on a table small enough to stay in the page
 * cache.  Rows that fall to 0 are kept (they come back soon in a live queue);
 * a deleted queue's rows go with it (counts_drop).
 *
 * Inside the turn's transaction a move is not written at once: it goes to a
 * log of the transaction's count changes, and the commit writes their sums,
 * one upsert per (queue, state) that changed, whatever the number of requests
 * in the group (unbatched, each request moved a task or two: one statement
 * each was 13 % of the head's instructions).  The log follows the requests'
 * savepoints (a rolled-back request takes its changes out of it), a queue's
 * deletion is a mark in it, and counts_read adds what it holds to the rows.
 */
#include "counts.h"

#include <assert.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COUNTS_DROPPED (-2) /* a log entry: the queue's rows were deleted here */

typedef struct {
  char queue[NAME_MAX_LEN + 1];
  int state; /* a task state, or COUNTS_DROPPED */
  int64_t n; /* tasks added to (or taken from) the state */
} counts_change_t;

struct counts_log {
  counts_change_t *changes; /* in the order they were made */
  size_t n, cap;
  size_t mark; /* changes made before the running request */
};

/* Writes `n` tasks more (or fewer) in `state` of `queue` now. */
static muster_err_t counts_upsert(store_t *st, const char *queue, int state, int64_t n, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "INSERT INTO queue_counts(queue, state, n) VALUES(?1, ?2, ?3)"
                                   " ON CONFLICT(queue, state) DO UPDATE SET n = n + excluded.n");
  if (s == NULL)
    return store_fail(st, f, "task counts");
  /* The queue name outlives the step: no copy needed. */
  sqlite3_bind_text(s, 1, queue, -1, SQLITE_STATIC);
  sqlite3_bind_int(s, 2, state);
  sqlite3_bind_int64(s, 3, n);
  return store_step_done(st, s, f);
}

/* Appends a change to the log (merged into the last one when it is the same
 * queue and state); false when out of memory. */
static bool counts_log_add(store_t *st, const char *queue, int state, int64_t n) {
  struct counts_log **slot = store_counts_log(st), *log = *slot;
  if (log == NULL && (log = *slot = calloc(1, sizeof *log)) == NULL)
    return false;
  if (state != COUNTS_DROPPED && log->n > log->mark) {
    counts_change_t *last = &log->changes[log->n - 1];
    if (last->state == state && strcmp(last->queue, queue) == 0) {
      last->n += n;
      return true;
    }
  }
  if (log->n == log->cap) {
    size_t cap = log->cap ? log->cap * 2 : 32;
    counts_change_t *grown = realloc(log->changes, cap * sizeof *grown);
    if (grown == NULL)
      return false;
    log->changes = grown;
    log->cap = cap;
  }
  counts_change_t *c = &log->changes[log->n++];
  snprintf(c->queue, sizeof c->queue, "%s", queue);
  c->state = state;
  c->n = n;
  return true;
}

void counts_log_mark(store_t *st) {
  struct counts_log *log = *store_counts_log(st);
  if (log)
    log->mark = log->n;
}

void counts_log_undo(store_t *st) {
  struct counts_log *log = *store_counts_log(st);
  if (log)
    log->n = log->mark;
}

void counts_log_forget(store_t *st) {
  struct counts_log *log = *store_counts_log(st);
  if (log)
    log->n = log->mark = 0;
}

void counts_log_free(store_t *st) {
  struct counts_log **slot = store_counts_log(st);
  if (*slot)
    free((*slot)->changes);
  free(*slot);
  *slot = NULL;
}

/* The slot of (queue, state) in an open-addressed table of mask + 1 slots
 * that hold indexes into `c` plus one (0: empty): its own, or the empty one
 * where it goes. */
static size_t counts_slot(const uint32_t *slots, size_t mask, const counts_change_t *c,
                          const char *queue, int state) {
  uint64_t h = 14695981039346656037ULL ^ (uint64_t)(state + 3); /* FNV-1a */
  for (const char *p = queue; *p; p++)
    h = (h ^ (unsigned char)*p) * 1099511628211ULL;
  size_t i = (size_t)h & mask;
  while (slots[i] != 0 &&
         (c[slots[i] - 1].state != state || strcmp(c[slots[i] - 1].queue, queue) != 0))
    i = (i + 1) & mask;
  return i;
}

muster_err_t counts_log_write(store_t *st, fail_t *f) {
  struct counts_log *log = *store_counts_log(st);
  if (log == NULL || log->n == 0)
    return MUSTER_OK;
  /* Sum per (queue, state) in place, in the log's own array, through a hash
   * table of the first entry of each (a batch completing into a next stage
   * alternates two queues: thousands of entries).  A deletion of a queue
   * zeroes its entries so far (the rows it deleted held those changes); the
   * later changes then gather into the same entries. */
  size_t size = 16;
  while (size < 2 * log->n)
    size *= 2;
  uint32_t *slots = calloc(size, sizeof *slots);
  counts_change_t *c = log->changes;
  muster_err_t err = MUSTER_OK;
  if (slots == NULL)
    err = fail_set(f, MUSTER_NOMEM, "out of memory (task counts)");
  for (size_t i = 0; slots && i < log->n; i++) {
    if (c[i].state == COUNTS_DROPPED) {
      for (int state = 0; state < TASK_STATE_COUNT; state++) {
        size_t k = counts_slot(slots, size - 1, c, c[i].queue, state);
        if (slots[k] != 0)
          c[slots[k] - 1].n = 0;
      }
      continue;
    }
    size_t k = counts_slot(slots, size - 1, c, c[i].queue, c[i].state);
    if (slots[k] == 0) {
      slots[k] = (uint32_t)i + 1;
    } else {
      c[slots[k] - 1].n += c[i].n;
      c[i].n = 0;
    }
  }
  free(slots);
  for (size_t i = 0; i < log->n && err == MUSTER_OK; i++)
    if (c[i].state != COUNTS_DROPPED && c[i].n != 0)
      err = counts_upsert(st, c[i].queue, c[i].state, c[i].n, f);
  log->n = log->mark = 0;
  return err;
}

muster_err_t counts_move(store_t *st, const char *queue, int from, int to, int64_t n, fail_t *f) {
  if (n == 0 || from == to)
    return MUSTER_OK;
  assert(from == COUNTS_NONE || (from >= 0 && from < TASK_STATE_COUNT));
  assert(to == COUNTS_NONE || (to >= 0 && to < TASK_STATE_COUNT));
  if (!store_in_tx(st)) {
    /* Outside a transaction (start-up work): written at once. */
    if (from != COUNTS_NONE && counts_upsert(st, queue, from, -n, f))
      return f->code;
    return to == COUNTS_NONE ? MUSTER_OK : counts_upsert(st, queue, to, n, f);
  }
  if ((from != COUNTS_NONE && !counts_log_add(st, queue, from, -n)) ||
      (to != COUNTS_NONE && !counts_log_add(st, queue, to, n)))
    return fail_set(f, MUSTER_NOMEM, "out of memory (task counts)");
  return MUSTER_OK;
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
  if (store_step_done(st, s, f))
    return f->code;
  if (store_in_tx(st) && !counts_log_add(st, queue, COUNTS_DROPPED, 0))
    return fail_set(f, MUSTER_NOMEM, "out of memory (task counts)");
  return MUSTER_OK;
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
  if (rc != SQLITE_DONE)
    return store_fail(st, f, "task counts");
  /* And what the open transaction changed and has not written yet (after a
   * deletion of the queue, the rows read above are already gone). */
  const struct counts_log *log = *store_counts_log(st);
  for (size_t i = 0; log && i < log->n; i++) {
    const counts_change_t *c = &log->changes[i];
    if (strcmp(c->queue, queue) != 0)
      continue;
    if (c->state == COUNTS_DROPPED)
      for (int state = 0; state < TASK_STATE_COUNT; state++)
        by_state[state] = 0;
    else if (c->state >= 0 && c->state < TASK_STATE_COUNT)
      by_state[c->state] += c->n;
  }
  return MUSTER_OK;
}
