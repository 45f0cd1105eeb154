/*
 * leftover.c — the runs of task ids that big closed sessions left in their
 * queues, and the walk of a queue's ready index past them (leftover.h says
 * what a run is and why it stays true).
 *
 * The workload: a pool's session of up to millions of queued tasks, closed
 * in a queue that other clients share, its tasks deleted in the background
 * at a chunk per loop turn (seconds per million).  Its ids are mostly
 * consecutive: a session's batch takes consecutive ids, and a run breaks
 * only where another task of the same queue took an id between two of the
 * session's (another client's batch put meanwhile; a gap in which no task
 * of the queue is left is sought and closed).  So a close makes one run per
 * stretch of its own tasks, a handful for a pool alone, one per batch at
 * worst for a pool that shares its queue with a busy one, and a walk steps
 * over each with one seek.  Runs are never split or shrunk: the chunks that
 * delete their tasks leave them true (emptier), and they go with the
 * session's last chunk (leftover_forget).
 *
 * Nothing here is written to the store: runs are rebuilt from
 * tasks_by_session when the head starts (leftover_load), so a restart in
 * the middle of a deletion steps over the same tasks.
 *
 * All of it runs on the head's loop thread, as the store does.
 */
#include "leftover.h"
#include "core/names.h"
#include "session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Seeks for an empty gap between two runs a commit may spend: this many,
 * plus one per LEFTOVER_GAP_ROWS tasks read (bounding the close's work
 * when the session's ids are scattered among others'). */
#define LEFTOVER_GAP_SEEKS 1024
#define LEFTOVER_GAP_ROWS 8

/* Task ids lo..hi. */
typedef struct {
  int64_t lo, hi;
} leftover_span_t;

/* A run: every task of its queue with an id in lo..hi is one that session
 * `session` (an index into the set's sessions) left. */
typedef struct {
  int64_t lo, hi;
  uint32_t session;
} leftover_run_t;

typedef struct {
  char name[NAME_MAX_LEN + 1];
  leftover_run_t *runs; /* by lo, disjoint */
  size_t n, cap;
  uint32_t *sessions; /* the sessions with runs here, to check against the trash */
  size_t nsessions, scap;
} leftover_queue_t;

struct leftover_set {
  leftover_queue_t *queues;
  size_t nqueues, qcap;
  char (*sessions)[SESSION_ID_LEN + 1]; /* "" for a slot free again */
  size_t nsessions, scap;
  bool loaded; /* every session of the trash had its runs when last looked at */
};

typedef struct {
  char name[NAME_MAX_LEN + 1];
  leftover_span_t *spans; /* in the order added, consecutive ids merged */
  size_t n, cap;
} leftover_build_queue_t;

struct leftover_build {
  leftover_build_queue_t *queues;
  size_t n, cap;
  size_t current; /* the queue of leftover_build_id */
  int64_t rows;   /* tasks added */
};

/* Makes room for `need` elements of `size` bytes in *items (capacity *cap);
 * false when out of memory (*items is kept). */
static bool leftover_grow(void *items, size_t *cap, size_t need, size_t size) {
  if (need <= *cap)
    return true;
  size_t cap2 = *cap ? *cap : 8;
  while (cap2 < need)
    cap2 *= 2;
  void *grown = realloc(*(void **)items, cap2 * size);
  if (grown == NULL)
    return false;
  *(void **)items = grown;
  *cap = cap2;
  return true;
}

static leftover_set_t *leftover_set(store_t *st, bool create) {
  leftover_set_t **slot = store_leftovers(st);
  if (*slot == NULL && create)
    *slot = calloc(1, sizeof **slot);
  return *slot;
}

void leftover_free(store_t *st) {
  leftover_set_t *set = leftover_set(st, false);
  if (set == NULL)
    return;
  for (size_t i = 0; i < set->nqueues; i++) {
    free(set->queues[i].runs);
    free(set->queues[i].sessions);
  }
  free(set->queues);
  free(set->sessions);
  free(set);
  *store_leftovers(st) = NULL;
}

/* ---- building ---- */

leftover_build_t *leftover_build_new(void) {
  return calloc(1, sizeof(leftover_build_t));
}

void leftover_build_free(leftover_build_t *b) {
  if (b == NULL)
    return;
  for (size_t i = 0; i < b->n; i++)
    free(b->queues[i].spans);
  free(b->queues);
  free(b);
}

bool leftover_build_queue(leftover_build_t *b, const char *queue) {
  for (size_t i = b->n; i > 0; i--) /* the last one first: rows come by queue */
    if (strcmp(b->queues[i - 1].name, queue) == 0) {
      b->current = i - 1;
      return true;
    }
  if (!leftover_grow(&b->queues, &b->cap, b->n + 1, sizeof *b->queues))
    return false;
  b->current = b->n++;
  b->queues[b->current] = (leftover_build_queue_t){0};
  snprintf(b->queues[b->current].name, sizeof b->queues[0].name, "%s", queue);
  return true;
}

bool leftover_build_id(leftover_build_t *b, int64_t id) {
  leftover_build_queue_t *q = &b->queues[b->current];
  b->rows++;
  if (q->n > 0 && q->spans[q->n - 1].hi == id - 1) {
    q->spans[q->n - 1].hi = id;
    return true;
  }
  if (!leftover_grow(&q->spans, &q->cap, q->n + 1, sizeof *q->spans))
    return false;
  q->spans[q->n++] = (leftover_span_t){id, id};
  return true;
}

static int leftover_span_cmp(const void *a, const void *b) {
  int64_t x = ((const leftover_span_t *)a)->lo, y = ((const leftover_span_t *)b)->lo;
  return (x > y) - (x < y);
}

/* *empty: no task of queue `queue` has an id between lo and hi (both
 * excluded).  An index seek into tasks_by_queue; no row is read. */
static muster_err_t leftover_gap_empty(store_t *st, const char *queue, int64_t lo, int64_t hi,
                                       bool *empty, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT 1 FROM tasks INDEXED BY tasks_by_queue"
                                   " WHERE queue = ?1 AND id > ?2 AND id < ?3 LIMIT 1");
  if (s == NULL)
    return store_fail(st, f, "leftover runs");
  store_bind_text(s, 1, queue);
  sqlite3_bind_int64(s, 2, lo);
  sqlite3_bind_int64(s, 3, hi);
  int rc = sqlite3_step(s);
  store_reset(s);
  *empty = rc == SQLITE_DONE;
  return rc == SQLITE_ROW || rc == SQLITE_DONE ? MUSTER_OK : store_fail(st, f, "leftover runs");
}

/* Sorts the spans of `q` and merges the neighbours that touch, or whose gap
 * holds no task of the queue while *seeks lasts (each seek lowers it; 0:
 * none may be made). */
static muster_err_t leftover_merge(store_t *st, leftover_build_queue_t *q, int64_t *seeks,
                                   fail_t *f) {
  bool sorted = true;
  for (size_t i = 1; i < q->n && sorted; i++)
    sorted = q->spans[i - 1].lo < q->spans[i].lo;
  if (!sorted)
    qsort(q->spans, q->n, sizeof *q->spans, leftover_span_cmp);
  size_t kept = 0;
  for (size_t i = 0; i < q->n; i++) {
    leftover_span_t *last = kept > 0 ? &q->spans[kept - 1] : NULL;
    bool join = last && q->spans[i].lo == last->hi + 1;
    if (last && !join && *seeks > 0) {
      (*seeks)--;
      if (leftover_gap_empty(st, q->name, last->hi, q->spans[i].lo, &join, f))
        return f->code;
    }
    if (join)
      last->hi = q->spans[i].hi;
    else
      q->spans[kept++] = q->spans[i];
  }
  q->n = kept;
  return MUSTER_OK;
}

/* The index of session `id` among the set's, made when `add`; -1 when it
 * is not there (or out of memory). */
static int64_t leftover_session_index(leftover_set_t *set, const char *id, bool add) {
  int64_t free_slot = -1;
  for (size_t i = 0; i < set->nsessions; i++) {
    if (strcmp(set->sessions[i], id) == 0)
      return (int64_t)i;
    if (set->sessions[i][0] == '\0' && free_slot < 0)
      free_slot = (int64_t)i;
  }
  if (!add)
    return -1;
  if (free_slot < 0) {
    if (!leftover_grow(&set->sessions, &set->scap, set->nsessions + 1, sizeof *set->sessions))
      return -1;
    free_slot = (int64_t)set->nsessions++;
  }
  snprintf(set->sessions[free_slot], sizeof set->sessions[0], "%s", id);
  return free_slot;
}

static leftover_queue_t *leftover_queue(leftover_set_t *set, const char *name, bool add) {
  for (size_t i = 0; i < set->nqueues; i++)
    if (strcmp(set->queues[i].name, name) == 0)
      return &set->queues[i];
  if (!add || !leftover_grow(&set->queues, &set->qcap, set->nqueues + 1, sizeof *set->queues))
    return NULL;
  leftover_queue_t *q = &set->queues[set->nqueues++];
  *q = (leftover_queue_t){0};
  snprintf(q->name, sizeof q->name, "%s", name);
  return q;
}

static int leftover_run_cmp(const void *a, const void *b) {
  int64_t x = ((const leftover_run_t *)a)->lo, y = ((const leftover_run_t *)b)->lo;
  return (x > y) - (x < y);
}

/* Adds the n spans as runs of session index `session` to queue `q`, kept
 * in order of lo; false when out of memory. */
static bool leftover_queue_add(leftover_queue_t *q, const leftover_span_t *spans, size_t n,
                               uint32_t session) {
  if (n == 0)
    return true;
  bool known = false;
  for (size_t i = 0; i < q->nsessions && !known; i++)
    known = q->sessions[i] == session;
  if (!known && !leftover_grow(&q->sessions, &q->scap, q->nsessions + 1, sizeof *q->sessions))
    return false;
  if (!known)
    q->sessions[q->nsessions++] = session;
  if (!leftover_grow(&q->runs, &q->cap, q->n + n, sizeof *q->runs))
    return false;
  bool in_order = q->n == 0 || q->runs[q->n - 1].lo < spans[0].lo;
  for (size_t i = 0; i < n; i++)
    q->runs[q->n++] = (leftover_run_t){spans[i].lo, spans[i].hi, session};
  if (!in_order) /* another session's runs lie beyond these */
    qsort(q->runs, q->n, sizeof *q->runs, leftover_run_cmp);
  return true;
}

/* Forgets the runs of session index `session` in every queue. */
static void leftover_forget_index(leftover_set_t *set, uint32_t session) {
  for (size_t i = 0; i < set->nqueues; i++) {
    leftover_queue_t *q = &set->queues[i];
    size_t kept = 0;
    for (size_t r = 0; r < q->n; r++)
      if (q->runs[r].session != session)
        q->runs[kept++] = q->runs[r];
    q->n = kept;
    kept = 0;
    for (size_t s = 0; s < q->nsessions; s++)
      if (q->sessions[s] != session)
        q->sessions[kept++] = q->sessions[s];
    q->nsessions = kept;
  }
  set->sessions[session][0] = '\0';
}

void leftover_forget(store_t *st, const char *session) {
  leftover_set_t *set = leftover_set(st, false);
  if (set == NULL)
    return;
  int64_t i = leftover_session_index(set, session, false);
  if (i >= 0)
    leftover_forget_index(set, (uint32_t)i);
  set->loaded = false; /* should the deletion of its trash row be rolled back */
}

muster_err_t leftover_build_commit(store_t *st, leftover_build_t *b, const char *session,
                                   bool seek_gaps, fail_t *f) {
  leftover_set_t *set = leftover_set(st, true);
  int64_t index = set ? leftover_session_index(set, session, true) : -1;
  muster_err_t err =
      index < 0 ? fail_set(f, MUSTER_NOMEM, "out of memory (leftover runs)") : MUSTER_OK;
  if (!err)
    leftover_forget_index(set, (uint32_t)index); /* runs of a close rolled back */
  if (!err)
    snprintf(set->sessions[index], sizeof set->sessions[0], "%s", session);
  int64_t seeks = seek_gaps ? LEFTOVER_GAP_SEEKS + b->rows / LEFTOVER_GAP_ROWS : 0;
  for (size_t i = 0; i < b->n && !err; i++) {
    leftover_build_queue_t *bq = &b->queues[i];
    if (leftover_merge(st, bq, &seeks, f))
      err = f->code;
    leftover_queue_t *q = err ? NULL : leftover_queue(set, bq->name, true);
    if (!err && (q == NULL || !leftover_queue_add(q, bq->spans, bq->n, (uint32_t)index)))
      err = fail_set(f, MUSTER_NOMEM, "out of memory (leftover runs)");
  }
  if (err && index >= 0) { /* none rather than some: the next walk builds them again */
    leftover_forget_index(set, (uint32_t)index);
    set->loaded = false;
  }
  leftover_build_free(b);
  return err;
}

/* ---- loading and checking against the trash ---- */

/* Builds the runs of session `id` (in the trash with `horizon`) from
 * tasks_by_session: its queue and id, read from the index alone. */
static muster_err_t leftover_build_session(store_t *st, const char *id, int64_t horizon,
                                           fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT queue, id FROM tasks INDEXED BY tasks_by_session"
                                   " WHERE session = ?1 AND id <= ?2");
  leftover_build_t *b = leftover_build_new();
  if (s == NULL || b == NULL) {
    leftover_build_free(b);
    return s == NULL ? store_fail(st, f, "leftover runs")
                     : fail_set(f, MUSTER_NOMEM, "out of memory (leftover runs)");
  }
  store_bind_text(s, 1, id);
  sqlite3_bind_int64(s, 2, horizon);
  bool ok = true;
  int rc;
  while (ok && (rc = sqlite3_step(s)) == SQLITE_ROW)
    ok = leftover_build_queue(b, (const char *)sqlite3_column_text(s, 0)) &&
         leftover_build_id(b, sqlite3_column_int64(s, 1));
  store_reset(s);
  if (!ok || rc != SQLITE_DONE) {
    leftover_build_free(b);
    return !ok ? fail_set(f, MUSTER_NOMEM, "out of memory (leftover runs)")
               : store_fail(st, f, "leftover runs");
  }
  /* Inside a transaction an earlier request of the turn may have deleted a
   * task between two runs, which a failed commit would bring back. */
  return leftover_build_commit(st, b, id, !store_in_tx(st), f);
}

/* The sessions of the trash after `after` (by id) and their horizons, up
 * to `cap` of them, into ids/horizons; *n gets how many. */
static muster_err_t leftover_trash(store_t *st, const char *after, char (*ids)[SESSION_ID_LEN + 1],
                                   int64_t *horizons, size_t cap, size_t *n, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT session, horizon FROM session_trash"
                                   " WHERE session > ?1 ORDER BY session LIMIT ?2");
  if (s == NULL)
    return store_fail(st, f, "leftover runs");
  store_bind_text(s, 1, after);
  sqlite3_bind_int64(s, 2, (int64_t)cap);
  int rc;
  *n = 0;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW && *n < cap) {
    snprintf(ids[*n], sizeof ids[0], "%s", (const char *)sqlite3_column_text(s, 0));
    horizons[(*n)++] = sqlite3_column_int64(s, 1);
  }
  store_reset(s);
  return rc == SQLITE_DONE ? MUSTER_OK : store_fail(st, f, "leftover runs");
}

muster_err_t leftover_load(store_t *st, fail_t *f) {
  enum { BATCH = 64 }; /* read at once, then built: the building runs statements of its own */
  char ids[BATCH][SESSION_ID_LEN + 1], after[SESSION_ID_LEN + 1] = "";
  int64_t horizons[BATCH];
  leftover_set_t *set = leftover_set(st, true);
  if (set == NULL)
    return fail_set(f, MUSTER_NOMEM, "out of memory (leftover runs)");
  if (!store_sessions_closing(st))
    return MUSTER_OK;
  for (size_t n = BATCH; n == BATCH;) {
    if (leftover_trash(st, after, ids, horizons, BATCH, &n, f))
      return f->code;
    for (size_t i = 0; i < n; i++)
      if (leftover_session_index(set, ids[i], false) < 0 &&
          leftover_build_session(st, ids[i], horizons[i], f))
        return f->code;
    if (n > 0)
      snprintf(after, sizeof after, "%s", ids[n - 1]);
  }
  set->loaded = true;
  return MUSTER_OK;
}

/* *there: session `id` is in session_trash (in this transaction's view). */
static muster_err_t leftover_in_trash(store_t *st, const char *id, bool *there, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT 1 FROM session_trash WHERE session = ?1");
  if (s == NULL)
    return store_fail(st, f, "leftover runs");
  store_bind_text(s, 1, id);
  int rc = sqlite3_step(s);
  store_reset(s);
  *there = rc == SQLITE_ROW;
  return rc == SQLITE_ROW || rc == SQLITE_DONE ? MUSTER_OK : store_fail(st, f, "leftover runs");
}

/* The runs of queue `name` (NULL: none), every one of a session that is in
 * the trash: the others, of a close rolled back, are forgotten first. */
static muster_err_t leftover_checked_queue(store_t *st, const char *name, leftover_queue_t **out,
                                           fail_t *f) {
  *out = NULL;
  leftover_set_t *set = leftover_set(st, true);
  if (set == NULL)
    return fail_set(f, MUSTER_NOMEM, "out of memory (leftover runs)");
  if (!set->loaded && leftover_load(st, f))
    return f->code;
  leftover_queue_t *q = leftover_queue(set, name, false);
  for (size_t i = 0; q && i < q->nsessions;) {
    bool there = false;
    uint32_t session = q->sessions[i];
    if (leftover_in_trash(st, set->sessions[session], &there, f))
      return f->code;
    if (there)
      i++;
    else
      leftover_forget_index(set, session); /* takes it out of q->sessions */
  }
  *out = q && q->n > 0 ? q : NULL;
  return MUSTER_OK;
}

size_t leftover_run_count(store_t *st, const char *queue) {
  leftover_set_t *set = leftover_set(st, false);
  leftover_queue_t *q = set ? leftover_queue(set, queue, false) : NULL;
  return q ? q->n : 0;
}

/* ---- the walk ---- */

/* The first entry of the ready index of `queue` after (priority, after) in
 * lease order, into *priority and *id; *found false at the index's end.
 * Index entries alone: no row is read. */
static muster_err_t leftover_next(store_t *st, const char *queue, int64_t *priority, int64_t after,
                                  int64_t *id, bool *found, fail_t *f) {
  sqlite3_stmt *s = store_stmt(
      st, "SELECT priority, id FROM (SELECT priority, id FROM tasks INDEXED BY tasks_ready"
          " WHERE queue = ?1 AND state = 0 AND priority = ?2 AND id > ?3 ORDER BY id LIMIT 1)"
          " UNION ALL SELECT priority, id FROM (SELECT priority, id FROM tasks"
          " INDEXED BY tasks_ready WHERE queue = ?1 AND state = 0 AND priority < ?2"
          " ORDER BY priority DESC, id LIMIT 1) LIMIT 1");
  if (s == NULL)
    return store_fail(st, f, "leftover walk");
  store_bind_text(s, 1, queue);
  sqlite3_bind_int64(s, 2, *priority);
  sqlite3_bind_int64(s, 3, after);
  int rc = sqlite3_step(s);
  *found = rc == SQLITE_ROW;
  if (*found) {
    *priority = sqlite3_column_int64(s, 0);
    *id = sqlite3_column_int64(s, 1);
  }
  store_reset(s);
  return rc == SQLITE_ROW || rc == SQLITE_DONE ? MUSTER_OK : store_fail(st, f, "leftover walk");
}

/* The index of the first run of `q` whose lo is above `id`. */
static size_t leftover_runs_above(const leftover_queue_t *q, int64_t id) {
  size_t lo = 0, hi = q->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (q->runs[mid].lo <= id)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

muster_err_t leftover_walk(store_t *st, const char *queue, int64_t from, leftover_visit_fn visit,
                           void *arg, bool *walked, fail_t *f) {
  leftover_queue_t *q = NULL;
  *walked = false;
  if (!store_sessions_closing(st))
    return MUSTER_OK;
  if (leftover_checked_queue(st, queue, &q, f))
    return f->code;
  if (q == NULL)
    return MUSTER_OK;
  *walked = true;
  int64_t priority = INT64_MAX, after = from;
  for (;;) {
    int64_t id = 0;
    bool found = false;
    if (leftover_next(st, queue, &priority, after, &id, &found, f))
      return f->code;
    if (!found)
      return MUSTER_OK;
    if (id <= from) { /* the first of a lower priority: on from `from` there */
      after = from;
      continue;
    }
    size_t above = leftover_runs_above(q, id);
    if (above > 0 && q->runs[above - 1].hi >= id) { /* in a run: past it */
      after = q->runs[above - 1].hi;
      continue;
    }
    bool run_next = above < q->n;
    leftover_then_t then = LEFTOVER_ON;
    if (visit(arg, priority, id, run_next ? q->runs[above].lo - 1 : INT64_MAX, &then, f))
      return f->code;
    if (then == LEFTOVER_DONE)
      return MUSTER_OK;
    /* INT64_MAX: on at the next priority */
    after = run_next && then == LEFTOVER_ON ? q->runs[above].hi : INT64_MAX;
  }
}
