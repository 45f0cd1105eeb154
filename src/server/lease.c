/*
 * lease.c — granting leases, and the lapses (expiry, worker timeout, a
 * worker's goodbye) that return leased tasks without a call; with the
 * transitions that lease_ops.c (complete, fail, extend, release, flag) shares
 * (lease_internal.h).
 *
 * A lease is granted to a task found queued in the request's transaction, so
 * it is still queued when its row is updated; the lease objects of a batch
 * are written as JSON text around the stored payloads (below).  Nothing here
 * trusts a worker's word about which task it holds: the operations on a held
 * lease check the fencing token first (lease_ops.c).
 */
#include "lease.h"
#include "counts.h"
#include "jv.h"
#include "jw.h"
#include "lease_internal.h"
#include "lease_retry.h"
#include "leftover.h"
#include "log.h"
#include "session.h"
#include "metrics.h"
#include "reply_budget.h"
#include "task.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Copies the text of column `col` of `s` (NULL reads as "") into `out`
 * (`cap` bytes with the NUL), cut as snprintf would cut it: a copy by its
 * length, once per task of a batch, where snprintf's format parsing showed. */
static void lease_copy_column(sqlite3_stmt *s, int col, char *out, size_t cap) {
  const unsigned char *text = sqlite3_column_text(s, col);
  size_t len = text ? (size_t)sqlite3_column_bytes(s, col) : 0;
  if (len >= cap)
    len = cap - 1;
  if (len)
    memcpy(out, text, len);
  out[len] = '\0';
}

/* The contract is in lease_internal.h. */
void lease_held_row(sqlite3_stmt *s, int first, int64_t id, lease_held_t *h,
                    char queue[NAME_MAX_LEN + 1]) {
  h->id = id;
  h->state = sqlite3_column_int(s, first);
  h->token = sqlite3_column_int64(s, first + 1);
  h->attempts = sqlite3_column_int64(s, first + 2);
  h->flags = sqlite3_column_int64(s, first + 3);
  h->parent = sqlite3_column_int64(s, first + 4);
  h->index = sqlite3_column_int64(s, first + 5);
  h->worker = sqlite3_column_int64(s, first + 6);
  h->priority = sqlite3_column_int64(s, first + 7);
  lease_copy_column(s, first + 8, queue, NAME_MAX_LEN + 1);
  h->has_session = sqlite3_column_type(s, first + 9) != SQLITE_NULL;
  lease_copy_column(s, first + 9, h->session, sizeof h->session);
}

/* The contract is in lease_internal.h. */
muster_err_t lease_held_queue(store_t *st, const char *queue, lease_held_t *h, queue_t *cache,
                              fail_t *f) {
  if (cache && cache->name[0] && strcmp(cache->name, queue) == 0) {
    h->queue = *cache;
    return MUSTER_OK;
  }
  if (queue_load(st, queue, &h->queue, f))
    return f->code != MUSTER_QUEUE_NOT_FOUND
               ? f->code
               : fail_set(f, MUSTER_TASK_NOT_FOUND,
                          "task %lld was in queue '%s', which was deleted", (long long)h->id,
                          queue);
  if (cache)
    *cache = h->queue;
  return MUSTER_OK;
}

/* The contract is in lease_internal.h. */
muster_err_t lease_held_load(store_t *st, int64_t id, lease_held_t *h, queue_t *cache, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT " LEASE_HELD_COLUMNS " FROM tasks WHERE id = ?1");
  if (s == NULL)
    return store_fail(st, f, "lease lookup");
  sqlite3_bind_int64(s, 1, id);
  int rc = sqlite3_step(s);
  char queue[NAME_MAX_LEN + 1] = "";
  if (rc == SQLITE_ROW)
    lease_held_row(s, 0, id, h, queue);
  store_reset(s);
  if (rc == SQLITE_DONE) /* says whether it existed: the worker held a lease of it */
    return task_not_found(st, id, f);
  if (rc != SQLITE_ROW)
    return store_fail(st, f, "lease lookup");
  return lease_held_queue(st, queue, h, cache, f);
}

/* The contract is in lease_internal.h. */
muster_err_t lease_move(store_t *st, const lease_held_t *h, int state, int64_t run_at_ms,
                        const char *error, int64_t attempts_delta, lease_end_t end, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "UPDATE tasks SET state = ?2, run_at_ms = ?3,"
                                   " error = coalesce(?4, error), attempts = attempts + ?5,"
                                   " worker = NULL, deadline_ms = NULL, updated_ms = ?6,"
                                   " ended_token = coalesce(?7, ended_token),"
                                   " ended_as = coalesce(?8, ended_as) WHERE id = ?1");
  if (s == NULL)
    return store_fail(st, f, "task update");
  sqlite3_bind_int64(s, 1, h->id);
  sqlite3_bind_int(s, 2, state);
  sqlite3_bind_int64(s, 3, run_at_ms);
  store_bind_text(s, 4, error);
  sqlite3_bind_int64(s, 5, attempts_delta);
  sqlite3_bind_int64(s, 6, now_ms());
  if (end != LEASE_END_NONE) { /* unbound: NULL, the record kept */
    sqlite3_bind_int64(s, 7, h->token);
    sqlite3_bind_int(s, 8, (int)end * LEASE_END_STATES + state);
  }
  if (store_step_done(st, s, f))
    return f->code;
  return counts_move(st, h->queue.name, h->state, state, 1, f);
}

/* The contract is in lease_internal.h. */
muster_err_t lease_finished(store_t *st, const lease_held_t *h, fail_t *f) {
  return h->has_session ? session_record_result(st, h->id, f) : MUSTER_OK;
}

/* The contract is in lease_internal.h. */
int lease_lapse(store_t *st, const lease_held_t *h, const char *error, lease_end_t end,
                int64_t *run_at_out, fail_t *f) {
  int64_t now = now_ms();
  if (h->attempts >= h->queue.max_attempts) {
    metrics_count(METRIC_TASKS_DEAD, h->queue.name, 1);
    if (lease_move(st, h, TASK_DEAD, now, error, 0, end, f) || lease_finished(st, h, f))
      return -1;
    return TASK_DEAD;
  }
  int64_t run_at = now + queue_backoff_ms(&h->queue, h->attempts);
  if (run_at_out)
    *run_at_out = run_at;
  if (lease_move(st, h, TASK_QUEUED, run_at, error, 0, end, f))
    return -1;
  metrics_count(METRIC_TASKS_RETRIED, h->queue.name, 1);
  store_notify_ready(st, h->queue.name);
  return TASK_QUEUED;
}

/* The contract is in lease_internal.h. */
muster_err_t lease_give_back(store_t *st, const lease_held_t *h, lease_end_t end, fail_t *f) {
  if (lease_move(st, h, TASK_QUEUED, now_ms(), NULL, -1, end, f))
    return f->code;
  store_notify_ready(st, h->queue.name);
  return MUSTER_OK;
}

/*
 * Lease objects are written as JSON text, not built as jansson trees.  A
 * stored payload (and `requires`) is JSON text that jw_dump wrote at put
 * from a value jansson had parsed and the head had validated, so it is
 * spliced into the reply as it is: no json_loads of the payload, no object
 * of nine keys, no walk of that tree at send time.  The bytes are those the
 * tree form gave (jw_dump of the parsed payload is the stored text again),
 * key for key: task, token, payload, attempt, deadline_ms, parent, session,
 * index, and requires only when set (tests/unit/test_lease.c compares the
 * two).  Stored text is still checked (jw_valid: one pass, no allocation),
 * so a row changed behind the head's back cannot make a reply invalid: text
 * that is not JSON goes out as jv_decode reads it, a JSON string, as it did
 * with trees, and text that is not even UTF-8 fails the lease as before.
 *
 * A batch costs two growing buffers, not allocations per task: `pieces`
 * holds each candidate's stored texts, encoded, between the candidate scan
 * and the UPDATEs (a column's text lives only until the next step), and
 * `out` the array of lease objects, written into the reply's own text
 * (lease_acquire_text; lease_reply_text in lease_retry.c writes the rest).
 */

/* Appends stored JSON text `text` (`bytes` long; NULL reads as null, as
 * jv_decode reads it) to `pieces` as it goes out in a reply.  Returns false
 * when the text is not JSON and not UTF-8 either, which the tree form
 * refused too. */
static bool lease_piece_stored(jw_buf_t *pieces, const unsigned char *text, int bytes,
                               lease_piece_t *piece) {
  piece->at = pieces->len;
  bool readable = jv_add_stored(pieces, (const char *)text, (size_t)bytes);
  piece->len = pieces->len - piece->at;
  return readable;
}

/* Appends session name `name` (NULL: none) to `pieces` as a JSON string.  A
 * name that is not UTF-8 (never one a request gave) goes out as null, as
 * json_string's refusal made it in the tree form. */
static void lease_piece_session(jw_buf_t *pieces, const unsigned char *name, lease_piece_t *piece) {
  *piece = (lease_piece_t){.at = pieces->len};
  if (name == NULL)
    return;
  jw_add_string(pieces, (const char *)name, strlen((const char *)name));
  if (!pieces->failed && !jw_valid(pieces->buf + piece->at, pieces->len - piece->at))
    pieces->len = piece->at;
  piece->len = pieces->len - piece->at;
}

/* The statement of lease_candidates, bound, for a queue the walk of
 * leftover.h does not take: while closed sessions' tasks wait for their
 * deletion (session_close.c) it skips those, and reads at most
 * QUEUE_READY_SCAN of them besides the `max` it wants.  That bound is
 * never reached: a queue holding such tasks holds their runs, and the walk
 * takes it (lease_candidates).  The window keeps the ready index's order,
 * its subquery read in order as a co-routine by the join (an ORDER BY
 * outside would sort the window, payloads and all; test_session_close.c
 * checks the order). */
static sqlite3_stmt *lease_candidates_stmt(store_t *st, const char *queue, int64_t max) {
  bool closing = store_sessions_closing(st);
  sqlite3_stmt *s =
      !closing ? store_stmt(st, "SELECT id, attempts, payload, coalesce(parent, 0), session,"
                                " coalesce(idx, -1), requires FROM tasks"
                                " WHERE queue = ?1 AND state = 0 AND run_at_ms <= ?2"
                                " ORDER BY priority DESC, id LIMIT ?3")
               : store_stmt(st, "SELECT t.id, t.attempts, t.payload, coalesce(t.parent, 0),"
                                " t.session, coalesce(t.idx, -1), t.requires FROM"
                                " (SELECT id, session FROM tasks INDEXED BY tasks_ready"
                                " WHERE queue = ?1 AND state = 0 AND run_at_ms <= ?2"
                                " ORDER BY priority DESC, id LIMIT ?3 + ?4) AS w"
                                " CROSS JOIN tasks AS t ON t.id = w.id"
                                " WHERE NOT " SESSION_CLOSING_W_SQL " LIMIT ?3");
  if (s == NULL)
    return NULL;
  store_bind_text(s, 1, queue);
  sqlite3_bind_int64(s, 2, now_ms());
  sqlite3_bind_int64(s, 3, max);
  if (closing)
    sqlite3_bind_int64(s, 4, QUEUE_READY_SCAN);
  return s;
}

/* The contract is in lease_internal.h. */
void lease_candidate_row(sqlite3_stmt *s, candidate_t *c, jw_buf_t *pieces) {
  *c = (candidate_t){
      .id = sqlite3_column_int64(s, 0),
      .attempts = sqlite3_column_int64(s, 1),
      .parent = sqlite3_column_int64(s, 3),
      .index = sqlite3_column_int64(s, 5),
  };
  /* The text before its length: sqlite3_column_bytes after _text. */
  const unsigned char *payload = sqlite3_column_text(s, 2);
  c->unreadable = !lease_piece_stored(pieces, payload, sqlite3_column_bytes(s, 2), &c->payload);
  lease_piece_session(pieces, sqlite3_column_text(s, 4), &c->session);
  if (sqlite3_column_type(s, 6) != SQLITE_NULL) {
    const unsigned char *requires = sqlite3_column_text(s, 6);
    if (!lease_piece_stored(pieces, requires, sqlite3_column_bytes(s, 6), &c->requires))
      c->unreadable = true;
  }
}

/* What a lease request's reply holds so far, against its budget of payload
 * bytes (reply_budget.h): the leasable candidates found, and the bytes of
 * their stored payloads and `requires`. */
typedef struct {
  int64_t items;
  size_t bytes;
} lease_use_t;

/* Reads the candidate of the row of `s` into *c, unless the reply has no
 * room for its payload: false then (the batch ends before it).  A candidate
 * out of attempts (`max_attempts`) goes dead, not into the reply
 * (lease_rounds): nothing of its texts is kept or counted. */
static bool lease_take_row(sqlite3_stmt *s, int64_t max_attempts, lease_use_t *use, candidate_t *c,
                           jw_buf_t *pieces) {
  int64_t attempts = sqlite3_column_int64(s, 1);
  if (attempts >= max_attempts) {
    *c = (candidate_t){.id = sqlite3_column_int64(s, 0), .attempts = attempts};
    return true;
  }
  size_t bytes = (size_t)sqlite3_column_bytes(s, 2) + (size_t)sqlite3_column_bytes(s, 6);
  if (!reply_budget_fits((size_t)use->items, use->bytes, bytes))
    return false;
  lease_candidate_row(s, c, pieces);
  use->items++;
  use->bytes += bytes;
  return true;
}

/* The candidates of a walk past what closed sessions left (leftover.h). */
typedef struct {
  store_t *st;
  const queue_t *q;
  int64_t max, n, now;
  candidate_t *out;
  jw_buf_t *pieces;
  lease_use_t *use;
  bool full; /* the reply's budget is spent */
} lease_walk_t;

/* A visit of the walk: the ready tasks of `priority` with ids first..last,
 * in id order, up to those still wanted.  Those tasks lie between runs, so
 * none is a closed session's but by a fault of the runs, which the filter
 * still keeps from being leased (at the cost of reading past them). */
static muster_err_t lease_visit(void *arg, int64_t priority, int64_t first, int64_t last,
                                leftover_then_t *then, fail_t *f) {
  lease_walk_t *w = arg;
  sqlite3_stmt *s = store_stmt(
      w->st, "SELECT id, attempts, payload, coalesce(parent, 0), session, coalesce(idx, -1),"
             " requires FROM tasks INDEXED BY tasks_ready WHERE queue = ?1 AND state = 0"
             " AND priority = ?2 AND id BETWEEN ?3 AND ?4 AND run_at_ms <= ?5"
             " AND NOT " SESSION_CLOSING_TASKS_SQL " ORDER BY id LIMIT ?6");
  if (s == NULL)
    return store_fail(w->st, f, "lease candidates");
  store_bind_text(s, 1, w->q->name);
  sqlite3_bind_int64(s, 2, priority);
  sqlite3_bind_int64(s, 3, first);
  sqlite3_bind_int64(s, 4, last);
  sqlite3_bind_int64(s, 5, w->now);
  sqlite3_bind_int64(s, 6, w->max - w->n);
  int rc = SQLITE_DONE;
  while (!w->full && (rc = sqlite3_step(s)) == SQLITE_ROW) {
    if (lease_take_row(s, w->q->max_attempts, w->use, &w->out[w->n], w->pieces))
      w->n++;
    else
      w->full = true;
  }
  store_reset(s);
  *then = w->n == w->max || w->full ? LEFTOVER_DONE : LEFTOVER_ON;
  return rc == SQLITE_DONE || w->full ? MUSTER_OK : store_fail(w->st, f, "lease candidates");
}

/* Collects up to `max` ready tasks of queue `q` in lease order, with the
 * columns of their lease objects (stored texts appended to `pieces`): one
 * pass over the ready index, so that leasing them is a plain UPDATE by id
 * (lease_batch).  (An UPDATE … RETURNING runs as a trigger with a statement
 * journal and an ephemeral table: the most expensive statement on the hot
 * path when it did this.)  A queue holding tasks that closed sessions left
 * is walked past their runs instead (leftover.h), whatever their number.
 * Fewer when the reply's budget (`use`) is spent before.  Returns the count,
 * or -1. */
static int64_t lease_candidates(store_t *st, const queue_t *q, int64_t max, candidate_t *out,
                                jw_buf_t *pieces, lease_use_t *use, fail_t *f) {
  int64_t n = 0;
  bool walked = false;
  if (store_sessions_closing(st)) {
    lease_walk_t w = {st, q, max, 0, now_ms(), out, pieces, use, false};
    if (leftover_walk(st, q->name, 0, lease_visit, &w, &walked, f))
      return -1;
    n = w.n;
  }
  sqlite3_stmt *s = walked ? NULL : lease_candidates_stmt(st, q->name, max);
  if (!walked && s == NULL) {
    store_fail(st, f, "lease candidates");
    return -1;
  }
  int rc = SQLITE_DONE;
  while (s && (rc = sqlite3_step(s)) == SQLITE_ROW) {
    if (!lease_take_row(s, q->max_attempts, use, &out[n], pieces)) {
      rc = SQLITE_DONE; /* the reply is full: the rest stays queued */
      break;
    }
    n++;
  }
  if (s)
    store_reset(s);
  if (rc != SQLITE_DONE) {
    store_fail(st, f, "lease candidates");
    return -1;
  }
  if (pieces->failed) {
    fail_set(f, MUSTER_NOMEM, "out of memory");
    return -1;
  }
  return n;
}

static void lease_add_piece(jw_buf_t *out, const char *pieces, lease_piece_t piece) {
  if (piece.len)
    jw_add_text(out, pieces + piece.at, piece.len);
  else
    JW_ADD_LITERAL(out, "null");
}

/* The contract is in lease_internal.h. */
void lease_write(jw_buf_t *out, const candidate_t *c, const char *pieces, int64_t token,
                 int64_t deadline) {
  JW_ADD_LITERAL(out, "{\"task\":");
  jw_add_int(out, c->id);
  JW_ADD_LITERAL(out, ",\"token\":");
  jw_add_int(out, token);
  JW_ADD_LITERAL(out, ",\"payload\":");
  lease_add_piece(out, pieces, c->payload);
  JW_ADD_LITERAL(out, ",\"attempt\":");
  jw_add_int(out, c->attempts + 1);
  JW_ADD_LITERAL(out, ",\"deadline_ms\":");
  jw_add_int(out, deadline);
  JW_ADD_LITERAL(out, ",\"parent\":");
  lease_add_int_or_null(out, c->parent != 0, c->parent);
  JW_ADD_LITERAL(out, ",\"session\":");
  lease_add_piece(out, pieces, c->session);
  JW_ADD_LITERAL(out, ",\"index\":");
  lease_add_int_or_null(out, c->index >= 0, c->index);
  /* Shared data the task requires (docs/api.md "Shared data"); only when set. */
  if (c->requires.len) {
    JW_ADD_LITERAL(out, ",\"requires\":");
    lease_add_piece(out, pieces, c->requires);
  }
  JW_ADD_LITERAL(out, "}");
}

/* Leases candidate `c` (found queued in this transaction) and appends its
 * lease object to `out`, after a comma unless it is the first. */
static muster_err_t lease_one(store_t *st, const queue_t *q, const candidate_t *c,
                              const char *pieces, int64_t worker, bool first, jw_buf_t *out,
                              fail_t *f) {
  sqlite3_stmt *s =
      store_stmt(st, "UPDATE tasks SET state = 1, attempts = ?6, token = ?2, worker = ?3,"
                     " deadline_ms = ?4, updated_ms = ?5 WHERE id = ?1");
  if (s == NULL)
    return store_fail(st, f, "lease");
  int64_t now = now_ms(), token = store_next_token(st), deadline = now + q->lease_ms;
  sqlite3_bind_int64(s, 1, c->id);
  sqlite3_bind_int64(s, 2, token);
  if (worker > 0)
    sqlite3_bind_int64(s, 3, worker);
  sqlite3_bind_int64(s, 4, deadline);
  sqlite3_bind_int64(s, 5, now);
  sqlite3_bind_int64(s, 6, c->attempts + 1);
  if (store_step_done(st, s, f) != MUSTER_OK)
    return f->code;
  if (c->unreadable)
    return fail_set(f, MUSTER_STORE, "store: task %lld: its stored payload is not JSON",
                    (long long)c->id);
  if (!first)
    JW_ADD_LITERAL(out, ",");
  lease_write(out, c, pieces, token, deadline);
  if (out->failed)
    return fail_set(f, MUSTER_NOMEM, "out of memory");
  metrics_count(METRIC_LEASES_GRANTED, q->name, 1);
  return MUSTER_OK;
}

/* The ids of the n leasable candidates as lease_batch's UPDATE takes them:
 * true with *lo..*hi when they are consecutive (the usual case: tasks are
 * leased in id order), else false with the JSON list `ids` for json_each. */
static bool lease_batch_ids(const candidate_t *cands, const int64_t *leasable, int64_t n,
                            int64_t *lo, int64_t *hi, jw_buf_t *ids) {
  *lo = INT64_MAX;
  *hi = INT64_MIN;
  for (int64_t i = 0; i < n; i++) {
    int64_t id = cands[leasable[i]].id;
    *lo = id < *lo ? id : *lo;
    *hi = id > *hi ? id : *hi;
  }
  if (*hi - *lo == n - 1)
    return true;
  JW_ADD_LITERAL(ids, "[");
  for (int64_t i = 0; i < n; i++) {
    if (i > 0)
      JW_ADD_LITERAL(ids, ",");
    jw_add_int(ids, cands[leasable[i]].id);
  }
  JW_ADD_LITERAL(ids, "]");
  return false;
}

/* Appends the batch's lease objects to `out` (after a comma unless `first`). */
static void lease_batch_write(jw_buf_t *out, const candidate_t *cands, const int64_t *leasable,
                              int64_t n, const char *pieces, int64_t base, int64_t deadline,
                              bool first) {
  for (int64_t i = 0; i < n; i++) {
    if (!first || i > 0)
      JW_ADD_LITERAL(out, ",");
    lease_write(out, &cands[leasable[i]], pieces, base + i, deadline);
  }
}

/* Draws n fencing tokens, *base to *base + n - 1, one per leasable candidate in
 * order, and lends them to the store's map (task id -> token) that the UPDATE
 * reads through muster_map(id); the caller frees the pairs after clearing the
 * map.  NULL when out of memory (the tokens drawn are then never used). */
static store_pair_t *lease_batch_tokens(store_t *st, const candidate_t *cands,
                                        const int64_t *leasable, int64_t n, int64_t *base) {
  store_pair_t *tokens = malloc((size_t)n * sizeof *tokens);
  *base = store_next_token(st);
  for (int64_t i = 1; i < n; i++)
    store_next_token(st);
  if (tokens == NULL)
    return NULL;
  for (int64_t i = 0; i < n; i++)
    tokens[i] = (store_pair_t){.key = cands[leasable[i]].id, .value = *base + i};
  store_pairs_sort(tokens, (size_t)n);
  store_map_set(st, tokens, (size_t)n);
  return tokens;
}

/* Binds what every task of a leased batch gets: its worker (unbound: NULL,
 * an anonymous lease), deadline and update time. */
static void lease_batch_bind_rest(sqlite3_stmt *s, int64_t worker, int64_t deadline, int64_t now) {
  if (worker > 0)
    sqlite3_bind_int64(s, 3, worker);
  sqlite3_bind_int64(s, 4, deadline);
  sqlite3_bind_int64(s, 5, now);
}

/* Leases the `n` candidates at `leasable` (indexes into `cands`, all found
 * queued in this transaction, none unreadable) with one UPDATE, and appends
 * their lease objects to `out`.  One statement for the batch instead of one
 * per task: the per-statement work (cursors on the table and every index,
 * the statement's start and halt) was about a third of a lease's UPDATE.
 * When the ids are consecutive (n distinct ids from lo to lo + n - 1: a
 * queue leased in the order it was filled) the rows are the range itself,
 * read in one pass; otherwise the ids go in as a JSON array, the rows found
 * by id alone (`IN`: a join with json_each costs more per row).  The task at
 * position i of the batch gets token base + i, the tokens lease_one would
 * have handed out one by one, through the store's map (muster_map: id to
 * token). */
static muster_err_t lease_batch(store_t *st, const queue_t *q, const candidate_t *cands,
                                const int64_t *leasable, int64_t n, const char *pieces,
                                int64_t worker, bool first, jw_buf_t *out, fail_t *f) {
  int64_t lo, hi, base;
  jw_buf_t ids = {0};
  bool range = lease_batch_ids(cands, leasable, n, &lo, &hi, &ids);
  sqlite3_stmt *s =
      range ? store_stmt(st, "UPDATE tasks SET state = 1, attempts = attempts + 1,"
                             " token = muster_map(id), worker = ?3, deadline_ms = ?4,"
                             " updated_ms = ?5 WHERE id BETWEEN ?1 AND ?2")
            : store_stmt(st, "UPDATE tasks SET state = 1, attempts = attempts + 1,"
                             " token = muster_map(id), worker = ?3, deadline_ms = ?4,"
                             " updated_ms = ?5 WHERE id IN (SELECT value FROM json_each(?1))");
  store_pair_t *tokens =
      s && !ids.failed ? lease_batch_tokens(st, cands, leasable, n, &base) : NULL;
  if (tokens == NULL) {
    jw_buf_free(&ids);
    return s == NULL ? store_fail(st, f, "lease") : fail_set(f, MUSTER_NOMEM, "out of memory");
  }
  int64_t now = now_ms(), deadline = now + q->lease_ms;
  if (range) {
    sqlite3_bind_int64(s, 1, lo);
    sqlite3_bind_int64(s, 2, hi);
  } else {
    sqlite3_bind_text(s, 1, ids.buf, (int)ids.len, SQLITE_STATIC);
  }
  lease_batch_bind_rest(s, worker, deadline, now);
  muster_err_t err = store_step_done(st, s, f);
  store_map_set(st, NULL, 0);
  jw_buf_free(&ids);
  free(tokens);
  if (err)
    return err;
  if (sqlite3_changes64(store_db(st)) != n)
    return fail_set(f, MUSTER_STORE, "store: lease: %lld of %lld tasks updated",
                    (long long)sqlite3_changes64(store_db(st)), (long long)n);
  lease_batch_write(out, cands, leasable, n, pieces, base, deadline, first);
  if (out->failed)
    return fail_set(f, MUSTER_NOMEM, "out of memory");
  metrics_count(METRIC_LEASES_GRANTED, q->name, n);
  return MUSTER_OK;
}

/* Leases the candidates of one round at `leasable`: with one statement, or
 * one by one when there is only one (a plain UPDATE by id costs less than
 * json_each for one id) or when one of them cannot be read (the stored text
 * is not JSON), so that the refusal comes where it came.  *granted counts
 * them, also on failure. */
static bool lease_round(store_t *st, const queue_t *q, int64_t worker, const candidate_t *cands,
                        const int64_t *leasable, int64_t n, const char *pieces, jw_buf_t *out,
                        int64_t *granted, fail_t *f) {
  bool unreadable = false;
  for (int64_t i = 0; i < n; i++)
    unreadable |= cands[leasable[i]].unreadable;
  if (!unreadable && n > 1) {
    if (lease_batch(st, q, cands, leasable, n, pieces, worker, *granted == 0, out, f))
      return false;
    *granted += n;
    return true;
  }
  bool ok = true;
  for (int64_t i = 0; ok && i < n; i++) {
    ok = lease_one(st, q, &cands[leasable[i]], pieces, worker, *granted == 0, out, f) == MUSTER_OK;
    *granted += ok;
  }
  return ok;
}

/* Leases up to `max` - *granted candidates in rounds (see lease_acquire_text),
 * fewer when their payloads pass the reply's budget (reply_budget.h),
 * appending lease objects to `out`; *granted counts them, also on failure.
 * `leasable` has room for `max` indexes; *max_task gets the highest id of a
 * task it leased (or tried to: the request fails then). */
static bool lease_rounds(store_t *st, const queue_t *q, int64_t worker, int64_t max,
                         candidate_t *cands, int64_t *leasable, jw_buf_t *out, int64_t *granted,
                         int64_t *max_task, fail_t *f) {
  jw_buf_t pieces = {0};
  lease_use_t use = {0};
  bool ok = true;
  for (bool more = true; ok && more && *granted < max;) {
    pieces.len = 0; /* the previous round's are written out */
    int64_t n = lease_candidates(st, q, max - *granted, cands, &pieces, &use, f), nleasable = 0;
    ok = n >= 0;
    more = false;
    if (ok && *granted == 0)
      jw_reserve(out, pieces.len + (size_t)n * 160); /* most of a batch's text at once */
    for (int64_t i = 0; ok && i < n; i++) {
      const candidate_t *c = &cands[i];
      if (c->attempts >= q->max_attempts) {
        lease_held_t h;
        ok = lease_held_load(st, c->id, &h, NULL, f) == MUSTER_OK &&
             lease_lapse(st, &h, "out of attempts", LEASE_END_NONE, NULL, f) >= 0;
        more = true;
      } else {
        leasable[nleasable++] = i;
        if (c->id > *max_task)
          *max_task = c->id;
      }
    }
    ok = ok && lease_round(st, q, worker, cands, leasable, nleasable, pieces.buf, out, granted, f);
  }
  jw_buf_free(&pieces);
  return ok;
}

muster_err_t lease_acquire_text(store_t *st, const queue_t *q, int64_t worker, int64_t max,
                                jw_buf_t *out, size_t *count, int64_t *max_task, fail_t *f) {
  *count = 0;
  int64_t highest = 0;
  candidate_t *cands = calloc((size_t)max, sizeof *cands);
  int64_t *leasable = calloc((size_t)max, sizeof *leasable);
  if (cands == NULL || leasable == NULL) {
    free(cands);
    free(leasable);
    return fail_set(f, MUSTER_NOMEM, "out of memory");
  }
  /* Tasks out of attempts (possible after max_attempts was lowered) go dead
   * and the search repeats, so a caller still gets up to `max` leases.  The
   * candidates were read in this transaction, so they are still queued. */
  int64_t granted = 0;
  JW_ADD_LITERAL(out, "[");
  bool ok = lease_rounds(st, q, worker, max, cands, leasable, out, &granted, &highest, f);
  JW_ADD_LITERAL(out, "]");
  free(cands);
  free(leasable);
  /* One count for the batch: lease_one moves queued tasks only.  After a
   * failure the leases granted before it are counted too: a request that
   * keeps its writes after an error (see http.c, `keep`) keeps them. */
  if (ok) {
    ok = counts_move(st, q->name, TASK_QUEUED, TASK_LEASED, granted, f) == MUSTER_OK;
  } else {
    fail_t ignored = {0};
    counts_move(st, q->name, TASK_QUEUED, TASK_LEASED, granted, &ignored);
  }
  if (max_task)
    *max_task = highest;
  if (!ok)
    return f->code;
  if (out->failed)
    return fail_set(f, MUSTER_NOMEM, "out of memory");
  *count = (size_t)granted;
  return MUSTER_OK;
}

json_t *lease_acquire(store_t *st, const queue_t *q, int64_t worker, int64_t max, fail_t *f) {
  size_t count;
  jw_buf_t text = {0};
  json_t *leases = NULL;
  json_error_t error;
  if (lease_acquire_text(st, q, worker, max, &text, &count, NULL, f) == MUSTER_OK &&
      (leases = json_loadb(text.buf, text.len, JSON_ALLOW_NUL, &error)) == NULL)
    fail_set(f, MUSTER_STORE, "lease: the leases could not be read back: %s", error.text);
  jw_buf_free(&text);
  return leases;
}

/* Ids of tasks matching a one-parameter query, up to `limit`; caller frees. */
static int64_t *lease_collect(store_t *st, sqlite3_stmt *s, int64_t arg, int64_t limit, size_t *n) {
  *n = 0;
  if (s == NULL)
    return NULL;
  int64_t *ids = malloc((size_t)limit * sizeof *ids);
  sqlite3_bind_int64(s, 1, arg);
  sqlite3_bind_int64(s, 2, limit);
  while (ids && (int64_t)*n < limit && sqlite3_step(s) == SQLITE_ROW)
    ids[(*n)++] = sqlite3_column_int64(s, 0);
  store_reset(s);
  return ids;
}

int64_t lease_expire_due(store_t *st, int64_t now, int64_t limit) {
  size_t n;
  int64_t *ids = lease_collect(
      st, store_stmt(st, "SELECT id FROM tasks WHERE state = 1 AND deadline_ms <= ?1 LIMIT ?2"),
      now, limit, &n);
  int64_t done = 0;
  for (size_t i = 0; i < n; i++) {
    lease_held_t h;
    fail_t f = {0};
    if (lease_held_load(st, ids[i], &h, NULL, &f) ||
        lease_lapse(st, &h, "lease expired", LEASE_END_LAPSED, NULL, &f) < 0) {
      done = -1;
      break;
    }
    metrics_count(METRIC_LEASES_EXPIRED, h.queue.name, 1);
    done++;
  }
  free(ids);
  return done;
}

/* Ends every lease of `worker`: lapsed with `reason` as the error (the attempt
 * counts) or, when `reason` is NULL, released.  The worker's leases are found
 * by a scan of tasks_leased, all leases of all workers (store_schema.c, migration 8:
 * no index by worker is written in every task's cycle for this rare call);
 * the index carries the worker, so the scan reads no row.  Every path that
 * ends a worker comes here, so its lease request records go here too. */
static int64_t lease_end_worker_why(store_t *st, int64_t worker, const char *reason) {
  size_t n;
  int64_t *ids = lease_collect(st,
                               store_stmt(st, "SELECT id FROM tasks INDEXED BY tasks_leased"
                                              " WHERE state = 1 AND worker = ?1 LIMIT ?2"),
                               worker, 100000, &n);
  int64_t done = 0;
  for (size_t i = 0; i < n; i++) {
    lease_held_t h;
    fail_t f = {0};
    bool failed = lease_held_load(st, ids[i], &h, NULL, &f) ||
                  (reason ? lease_lapse(st, &h, reason, LEASE_END_LAPSED, NULL, &f) < 0
                          : lease_give_back(st, &h, LEASE_END_LAPSED, &f) != MUSTER_OK);
    if (failed) {
      done = -1;
      break;
    }
    done++;
  }
  free(ids);
  fail_t f = {0};
  return done < 0 || lease_retry_forget(st, worker, &f) ? -1 : done;
}

int64_t lease_end_worker(store_t *st, int64_t worker, bool counted) {
  return lease_end_worker_why(st, worker, counted ? "worker timed out" : NULL);
}

int64_t lease_lapse_worker(store_t *st, int64_t worker, const char *reason) {
  return lease_end_worker_why(st, worker, reason);
}

int64_t lease_next_deadline(store_t *st) {
  sqlite3_stmt *s = store_stmt(st, "SELECT min(deadline_ms) FROM tasks WHERE state = 1");
  if (s == NULL)
    return INT64_MAX;
  int64_t next = INT64_MAX;
  if (sqlite3_step(s) == SQLITE_ROW && sqlite3_column_type(s, 0) != SQLITE_NULL)
    next = sqlite3_column_int64(s, 0);
  store_reset(s);
  return next;
}

bool lease_any_due(store_t *st, int64_t now) {
  return store_due(st, "SELECT 1 FROM tasks WHERE state = 1 AND deadline_ms <= ?1 LIMIT 1", now);
}
