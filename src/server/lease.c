/*
 * lease.c — lease, complete, fail, extend, release, flag, and the lapses
 * (expiry, worker timeout) that return tasks without a call.
 *
 * Every transition of a leased task goes through lease_check, which loads the
 * row and verifies the fencing token; nothing here trusts a worker's word
 * about which task it holds.  Batches run inside the request's savepoint: the
 * first refused element makes the caller roll back all earlier ones.
 */
#include "lease.h"
#include "counts.h"
#include "jv.h"
#include "jw.h"
#include "log.h"
#include "session.h"
#include "metrics.h"
#include "task.h"
#include "worker.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A leased task as the store has it. */
typedef struct {
  int64_t id, token, attempts, flags, parent, index, worker, priority;
  int state;
  queue_t queue;
  char session[TASK_MAX_SESSION + 1]; /* "" for none */
  bool has_session;
} held_t;

/* Loads task `id` and its queue's settings.  `cache` (NULL: none) holds the
 * queue of a batch's previous element: the elements of a batch mostly share
 * their queue, and within one request its settings cannot change, so the
 * queue is read once per batch instead of once per task.
 * MUSTER_TASK_NOT_FOUND when the task does not exist, MUSTER_QUEUE_NOT_FOUND
 * when its queue does not. */
static muster_err_t held_load(store_t *st, int64_t id, held_t *h, queue_t *cache, fail_t *f) {
  sqlite3_stmt *s = store_stmt(
      st, "SELECT state, coalesce(token, 0), attempts, flags, coalesce(parent, 0),"
          " coalesce(idx, -1), coalesce(worker, 0), priority, queue, session"
          " FROM tasks WHERE id = ?1");
  if (s == NULL)
    return store_fail(st, f, "lease lookup");
  sqlite3_bind_int64(s, 1, id);
  int rc = sqlite3_step(s);
  char queue[NAME_MAX_LEN + 1] = "";
  if (rc == SQLITE_ROW) {
    h->id = id;
    h->state = sqlite3_column_int(s, 0);
    h->token = sqlite3_column_int64(s, 1);
    h->attempts = sqlite3_column_int64(s, 2);
    h->flags = sqlite3_column_int64(s, 3);
    h->parent = sqlite3_column_int64(s, 4);
    h->index = sqlite3_column_int64(s, 5);
    h->worker = sqlite3_column_int64(s, 6);
    h->priority = sqlite3_column_int64(s, 7);
    snprintf(queue, sizeof queue, "%s", (const char *)sqlite3_column_text(s, 8));
    const unsigned char *session = sqlite3_column_text(s, 9);
    h->has_session = session != NULL;
    snprintf(h->session, sizeof h->session, "%s", session ? (const char *)session : "");
  }
  store_reset(s);
  if (rc == SQLITE_DONE)
    return fail_set(f, MUSTER_TASK_NOT_FOUND, "task %lld does not exist", (long long)id);
  if (rc != SQLITE_ROW)
    return store_fail(st, f, "lease lookup");
  if (cache && cache->name[0] && strcmp(cache->name, queue) == 0) {
    h->queue = *cache;
    return MUSTER_OK;
  }
  if (queue_load(st, queue, &h->queue, f))
    return f->code;
  if (cache)
    *cache = h->queue;
  return MUSTER_OK;
}

/* Loads task `id` and checks that it is leased under `token`. */
static muster_err_t lease_check(store_t *st, int64_t id, int64_t token, const char *ctx, held_t *h,
                                queue_t *cache, fail_t *f) {
  if (held_load(st, id, h, cache, f)) {
    if (f->code == MUSTER_TASK_NOT_FOUND)
      fail_set(f, MUSTER_TASK_NOT_FOUND, "%s: task %lld does not exist", ctx, (long long)id);
    return f->code;
  }
  if (h->state != TASK_LEASED)
    return fail_set(f, MUSTER_LEASE_LOST,
                    "%s: task %lld is not leased (it is %s); its lease ended and the work "
                    "belongs to no one now",
                    ctx, (long long)id, task_state_name(h->state));
  if (h->token != token)
    return fail_set(f, MUSTER_LEASE_LOST,
                    "%s: token %lld is stale for task %lld; the task was leased again",
                    ctx, (long long)token, (long long)id);
  return MUSTER_OK;
}

/* Moves the task `h` (in state h->state) to `state` with the given run time,
 * error and attempts delta, clearing its lease, and counts the move.  The
 * workhorse of every transition. */
static muster_err_t task_move(store_t *st, const held_t *h, int state, int64_t run_at_ms,
                              const char *error, int64_t attempts_delta, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "UPDATE tasks SET state = ?2, run_at_ms = ?3,"
                                   " error = coalesce(?4, error), attempts = attempts + ?5,"
                                   " worker = NULL, deadline_ms = NULL, updated_ms = ?6"
                                   " WHERE id = ?1");
  if (s == NULL)
    return store_fail(st, f, "task update");
  sqlite3_bind_int64(s, 1, h->id);
  sqlite3_bind_int(s, 2, state);
  sqlite3_bind_int64(s, 3, run_at_ms);
  store_bind_text(s, 4, error);
  sqlite3_bind_int64(s, 5, attempts_delta);
  sqlite3_bind_int64(s, 6, now_ms());
  if (store_step_done(st, s, f))
    return f->code;
  return counts_move(st, h->queue.name, h->state, state, 1, f);
}

/* A task reached a final state (done, failed, dead): a task of a session
 * gives the session its result. */
static muster_err_t lease_finished(store_t *st, const held_t *h, fail_t *f) {
  return h->has_session ? session_record_result(st, h->id, f) : MUSTER_OK;
}

/* A lease that ended without success (failure, expiry, timeout): retry after
 * backoff, or dead when the attempts are used up.  Returns the new state. */
static int lease_lapse(store_t *st, const held_t *h, const char *error, int64_t *run_at_out,
                       fail_t *f) {
  int64_t now = now_ms();
  if (h->attempts >= h->queue.max_attempts) {
    metrics_count(METRIC_TASKS_DEAD, h->queue.name, 1);
    return task_move(st, h, TASK_DEAD, now, error, 0, f) || lease_finished(st, h, f) ? -1
                                                                                     : TASK_DEAD;
  }
  int64_t run_at = now + queue_backoff_ms(&h->queue, h->attempts);
  if (run_at_out)
    *run_at_out = run_at;
  if (task_move(st, h, TASK_QUEUED, run_at, error, 0, f))
    return -1;
  metrics_count(METRIC_TASKS_RETRIED, h->queue.name, 1);
  store_notify_ready(st, h->queue.name);
  return TASK_QUEUED;
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
 * `out` the array of lease objects that becomes one raw node (jw.h).
 */

/* Where an encoded piece of a lease object lies in the batch's pieces. */
typedef struct {
  size_t at, len; /* len 0: absent (no encoded JSON value is empty) */
} lease_piece_t;

/* A ready task found for a lease, with what its lease object needs. */
typedef struct {
  int64_t id, attempts, parent, index;
  lease_piece_t payload, session, requires;
  bool unreadable; /* the stored payload or requires is neither JSON nor UTF-8 */
} candidate_t;

/* Appends stored JSON text `text` (`bytes` long; NULL reads as null, as
 * jv_decode reads it) to `pieces` as it goes out in a reply.  Returns false
 * when the text is not JSON and not UTF-8 either, which the tree form
 * refused too. */
static bool lease_piece_stored(jw_buf_t *pieces, const unsigned char *text, int bytes,
                               lease_piece_t *piece) {
  piece->at = pieces->len;
  if (text == NULL) {
    JW_ADD_LITERAL(pieces, "null");
  } else if (jw_valid((const char *)text, (size_t)bytes)) {
    jw_add_text(pieces, (const char *)text, (size_t)bytes);
  } else {
    json_t *decoded = jv_decode((const char *)text); /* a string of the text, or NULL */
    if (decoded == NULL)
      return false;
    jw_add_value(pieces, decoded);
    json_decref(decoded);
  }
  piece->len = pieces->len - piece->at;
  return true;
}

/* Appends session name `name` (NULL: none) to `pieces` as a JSON string.  A
 * name that is not UTF-8 (never one a request gave) goes out as null, as
 * json_string's refusal made it in the tree form. */
static void lease_piece_session(jw_buf_t *pieces, const unsigned char *name,
                                lease_piece_t *piece) {
  *piece = (lease_piece_t){.at = pieces->len};
  if (name == NULL)
    return;
  jw_add_string(pieces, (const char *)name, strlen((const char *)name));
  if (!pieces->failed && !jw_valid(pieces->buf + piece->at, pieces->len - piece->at))
    pieces->len = piece->at;
  piece->len = pieces->len - piece->at;
}

/* Collects up to `max` ready tasks of the queue in lease order, with the
 * columns of their lease objects (stored texts appended to `pieces`): one
 * pass over the ready index, so that leasing each is a plain UPDATE.  (An
 * UPDATE … RETURNING runs as a trigger with a statement journal and an
 * ephemeral table: the most expensive statement on the hot path when it did
 * this.)  Returns the count, or -1. */
static int64_t lease_candidates(store_t *st, const char *queue, int64_t max, candidate_t *out,
                                jw_buf_t *pieces, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT id, attempts, payload, coalesce(parent, 0), session,"
                                   " coalesce(idx, -1), requires FROM tasks"
                                   " WHERE queue = ?1 AND state = 0 AND run_at_ms <= ?2"
                                   " ORDER BY priority DESC, id LIMIT ?3");
  if (s == NULL) {
    store_fail(st, f, "lease candidates");
    return -1;
  }
  store_bind_text(s, 1, queue);
  sqlite3_bind_int64(s, 2, now_ms());
  sqlite3_bind_int64(s, 3, max);
  int64_t n = 0;
  int rc;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    candidate_t *c = &out[n++];
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

static void lease_add_int_if(jw_buf_t *out, bool present, int64_t v) {
  if (present)
    jw_add_int(out, v);
  else
    JW_ADD_LITERAL(out, "null");
}

/* Appends the lease object of candidate `c` to `out`. */
static void lease_write(jw_buf_t *out, const candidate_t *c, const char *pieces, int64_t token,
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
  lease_add_int_if(out, c->parent != 0, c->parent);
  JW_ADD_LITERAL(out, ",\"session\":");
  lease_add_piece(out, pieces, c->session);
  JW_ADD_LITERAL(out, ",\"index\":");
  lease_add_int_if(out, c->index >= 0, c->index);
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
  sqlite3_stmt *s = store_stmt(
      st, "UPDATE tasks SET state = 1, attempts = ?6, token = ?2, worker = ?3,"
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

/* Leases up to `max` - *granted candidates in rounds (see lease_acquire_raw),
 * appending lease objects to `out`; *granted counts them, also on failure. */
static bool lease_rounds(store_t *st, const queue_t *q, int64_t worker, int64_t max,
                         candidate_t *cands, jw_buf_t *out, int64_t *granted, fail_t *f) {
  jw_buf_t pieces = {0};
  bool ok = true;
  for (bool more = true; ok && more && *granted < max;) {
    pieces.len = 0; /* the previous round's are written out */
    int64_t n = lease_candidates(st, q->name, max - *granted, cands, &pieces, f);
    ok = n >= 0;
    more = false;
    if (ok && *granted == 0)
      jw_reserve(out, pieces.len + (size_t)n * 160); /* most of a batch's text at once */
    for (int64_t i = 0; ok && i < n; i++) {
      const candidate_t *c = &cands[i];
      if (c->attempts >= q->max_attempts) {
        held_t h;
        ok = held_load(st, c->id, &h, NULL, f) == MUSTER_OK &&
             lease_lapse(st, &h, "out of attempts", NULL, f) >= 0;
        more = true;
      } else {
        ok = lease_one(st, q, c, pieces.buf, worker, *granted == 0, out, f) == MUSTER_OK;
        *granted += ok;
      }
    }
  }
  jw_buf_free(&pieces);
  return ok;
}

json_t *lease_acquire_raw(store_t *st, const queue_t *q, int64_t worker, int64_t max,
                          size_t *count, fail_t *f) {
  *count = 0;
  candidate_t *cands = calloc((size_t)max, sizeof *cands);
  if (cands == NULL) {
    fail_set(f, MUSTER_NOMEM, "out of memory");
    return NULL;
  }
  /* Tasks out of attempts (possible after max_attempts was lowered) go dead
   * and the search repeats, so a caller still gets up to `max` leases.  The
   * candidates were read in this transaction, so they are still queued. */
  jw_buf_t out = {0};
  int64_t granted = 0;
  JW_ADD_LITERAL(&out, "[");
  bool ok = lease_rounds(st, q, worker, max, cands, &out, &granted, f);
  JW_ADD_LITERAL(&out, "]");
  free(cands);
  /* One count for the batch: lease_one moves queued tasks only.  After a
   * failure the leases granted before it are counted too: a request that
   * keeps its writes after an error (see http.c, `keep`) keeps them. */
  if (ok) {
    ok = counts_move(st, q->name, TASK_QUEUED, TASK_LEASED, granted, f) == MUSTER_OK;
  } else {
    fail_t ignored = {0};
    counts_move(st, q->name, TASK_QUEUED, TASK_LEASED, granted, &ignored);
  }
  json_t *leases = ok && !out.failed ? jw_raw(out.buf, out.len) : NULL;
  if (ok && leases == NULL)
    fail_set(f, MUSTER_NOMEM, "out of memory");
  jw_buf_free(&out);
  if (leases)
    *count = (size_t)granted;
  return leases;
}

json_t *lease_acquire(store_t *st, const queue_t *q, int64_t worker, int64_t max, fail_t *f) {
  size_t count, len;
  json_t *raw = lease_acquire_raw(st, q, worker, max, &count, f);
  if (raw == NULL)
    return NULL;
  const char *text = jw_raw_text(raw, &len);
  json_error_t error;
  json_t *leases = json_loadb(text, len, JSON_ALLOW_NUL, &error);
  json_decref(raw);
  if (leases == NULL)
    fail_set(f, MUSTER_STORE, "lease: the leases could not be read back: %s", error.text);
  return leases;
}

/* A batch's replies as they are made.  Completions, one per task of every
 * worker's cycle, are written as text {"task", "next_task"} (a tree each
 * showed in profiles of batched cycles); the other operations' replies are
 * a tree. */
typedef struct {
  json_t *tree;       /* array of the replies to fail, extend, release, flag */
  jw_buf_t completed; /* "[" and the completions' objects, comma-separated */
} apply_out_t;

/* Completes the task with result `text` (encoded JSON; NULL: none),
 * counted in `run`, and appends its reply to out->completed; with a next
 * stage, its result becomes a task there. */
static muster_err_t op_complete(store_t *st, const char *text, const held_t *h, const char *ctx,
                                size_t max_payload, counts_run_t *run, apply_out_t *out,
                                fail_t *f) {
  if (text && strlen(text) > max_payload)
    return fail_set(f, MUSTER_PAYLOAD_TOO_LARGE, "%s.result: %zu bytes, at most %zu allowed",
                    ctx, strlen(text), max_payload);
  sqlite3_stmt *s = store_stmt(st, "UPDATE tasks SET state = 2, result = ?2, error = NULL,"
                                   " worker = NULL, deadline_ms = NULL, updated_ms = ?3"
                                   " WHERE id = ?1");
  int64_t next_id = 0;
  if (s == NULL) {
    store_fail(st, f, "complete");
  } else {
    sqlite3_bind_int64(s, 1, h->id);
    store_bind_text(s, 2, text);
    sqlite3_bind_int64(s, 3, now_ms());
    if (!store_step_done(st, s, f) &&
        !counts_run_add(st, run, h->queue.name, h->state, TASK_DONE, f) && h->queue.next[0])
      task_insert(st, h->queue.next, text ? text : "null", h->priority, now_ms(), NULL,
                  h->has_session ? h->session : NULL, h->index, h->id, NULL, &next_id, f);
  }
  if (f->code || lease_finished(st, h, f) || worker_count(st, h->worker, WORKER_COMPLETED, f))
    return f->code;
  metrics_count(METRIC_TASKS_COMPLETED, h->queue.name, 1);
  jw_buf_t *b = &out->completed;
  if (b->len > 1) /* after the "[" */
    JW_ADD_LITERAL(b, ",");
  JW_ADD_LITERAL(b, "{\"task\":");
  jw_add_int(b, h->id);
  JW_ADD_LITERAL(b, ",\"next_task\":");
  lease_add_int_if(b, next_id != 0, next_id);
  JW_ADD_LITERAL(b, "}");
  return b->failed ? fail_set(f, MUSTER_NOMEM, "out of memory") : MUSTER_OK;
}

static json_t *op_fail(store_t *st, const json_t *elem, const held_t *h, const char *ctx,
                       fail_t *f) {
  static const char *const allowed[] = {"task", "token", "error", "permanent", NULL};
  const char *error;
  bool permanent;
  if (jv_only(elem, ctx, allowed, f) ||
      jv_str(elem, "error", ctx, NULL, LEASE_MAX_ERROR, &error, f) ||
      jv_bool(elem, "permanent", ctx, false, &permanent, f))
    return NULL;
  int state = TASK_FAILED;
  int64_t run_at = 0;
  if (permanent) {
    if (task_move(st, h, TASK_FAILED, now_ms(), error ? error : "failed permanently", 0, f) ||
        lease_finished(st, h, f))
      return NULL;
  } else if ((state = lease_lapse(st, h, error ? error : "failed", &run_at, f)) < 0) {
    return NULL;
  }
  if (worker_count(st, h->worker, WORKER_FAILED, f))
    return NULL;
  metrics_count(METRIC_TASKS_FAILED, h->queue.name, 1);
  json_t *out = json_pack("{s:I, s:s}", "task", (json_int_t)h->id, "state", task_state_name(state));
  if (state == TASK_QUEUED)
    json_object_set_new(out, "run_at_ms", json_integer(run_at));
  return out;
}

static json_t *op_extend(store_t *st, const json_t *elem, const held_t *h, const char *ctx,
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

/* Back to queued at once; the attempt the lease took is given back. */
static muster_err_t lease_give_back(store_t *st, const held_t *h, fail_t *f) {
  if (task_move(st, h, TASK_QUEUED, now_ms(), NULL, -1, f))
    return f->code;
  store_notify_ready(st, h->queue.name);
  return MUSTER_OK;
}

/* Re-opens `parent` at its stage: queued, result cleared, counters reset. */
static muster_err_t lease_reopen_parent(store_t *st, int64_t parent, fail_t *f) {
  /* Its state before, for the counts: usually done, but an operator may have
   * moved it since. */
  sqlite3_stmt *s = store_stmt(st, "SELECT state, queue FROM tasks WHERE id = ?1");
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
  s = store_stmt(st, "UPDATE tasks SET state = 0, result = NULL, attempts = 0,"
                     " flags = 0, run_at_ms = ?2, updated_ms = ?2, worker = NULL,"
                     " deadline_ms = NULL WHERE id = ?1");
  if (s == NULL)
    return store_fail(st, f, "re-open parent");
  sqlite3_bind_int64(s, 1, parent);
  sqlite3_bind_int64(s, 2, now_ms());
  if (store_step_done(st, s, f) || counts_move(st, queue, from, TASK_QUEUED, 1, f))
    return f->code;
  store_notify_ready(st, queue);
  return MUSTER_OK;
}

static json_t *op_flag(store_t *st, const json_t *elem, const held_t *h, const char *ctx,
                       fail_t *f) {
  static const char *const allowed[] = {"task", "token", "reason", NULL};
  const char *reason;
  if (jv_only(elem, ctx, allowed, f) ||
      jv_str(elem, "reason", ctx, NULL, LEASE_MAX_ERROR, &reason, f) ||
      worker_count(st, h->worker, WORKER_FLAGGED, f))
    return NULL;
  sqlite3_stmt *s = store_stmt(st, "UPDATE tasks SET flags = flags + 1 WHERE id = ?1");
  sqlite3_bind_int64(s, 1, h->id);
  if (store_step_done(st, s, f))
    return NULL;
  int64_t flags = h->flags + 1, reopened = 0;
  int state = TASK_QUEUED;
  char why[LEASE_MAX_ERROR + 128];
  snprintf(why, sizeof why, "flagged invalid %lld times%s%s", (long long)flags,
           reason ? ": " : "", reason ? reason : "");
  if (flags < h->queue.max_flags) {
    if (lease_give_back(st, h, f))
      return NULL;
  } else if (h->parent) {
    state = TASK_CANCELLED;
    reopened = h->parent;
    if (task_move(st, h, TASK_CANCELLED, now_ms(), why, 0, f) ||
        lease_reopen_parent(st, h->parent, f))
      return NULL;
  } else {
    state = TASK_DEAD;
    if (task_move(st, h, TASK_DEAD, now_ms(), why, 0, f) || lease_finished(st, h, f))
      return NULL;
    metrics_count(METRIC_TASKS_DEAD, h->queue.name, 1);
  }
  metrics_count(METRIC_TASKS_FLAGGED, h->queue.name, 1);
  return json_pack("{s:I, s:s, s:o}", "task", (json_int_t)h->id, "state", task_state_name(state),
                   "reopened", reopened ? json_integer(reopened) : json_null());
}

static const char *const op_reply_keys[] = {"completed", "failed", "extended", "released",
                                            "flagged"};

/* The reply to one element of an operation other than complete. */
static json_t *lease_apply_other(store_t *st, lease_op_t op, const json_t *elem, const held_t *h,
                                 const char *ctx, fail_t *f) {
  switch (op) {
  case LEASE_COMPLETE: break;
  case LEASE_FAIL: return op_fail(st, elem, h, ctx, f);
  case LEASE_EXTEND: return op_extend(st, elem, h, ctx, f);
  case LEASE_RELEASE: return lease_give_back(st, h, f) ? NULL : json_integer(h->id);
  case LEASE_FLAG: return op_flag(st, elem, h, ctx, f);
  }
  return NULL;
}

/* Checks one element's task and token, applies `op` to it and adds its
 * reply to `out`. */
static muster_err_t lease_apply_one(store_t *st, lease_op_t op, const json_t *elem, size_t i,
                                    size_t max_payload, counts_run_t *run, queue_t *cache,
                                    apply_out_t *out, fail_t *f) {
  char ctx[32];
  snprintf(ctx, sizeof ctx, "leases[%zu]", i);
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
  held_t h;
  if (lease_check(st, task, token, ctx, &h, cache, f))
    return f->code;
  if (op == LEASE_COMPLETE) {
    const json_t *result = json_object_get(elem, "result");
    char *text = result ? jv_encode(result) : NULL;
    muster_err_t err = op_complete(st, text, &h, ctx, max_payload, run, out, f);
    free(text);
    return err;
  }
  json_t *one = lease_apply_other(st, op, elem, &h, ctx, f);
  if (one == NULL || json_array_append_new(out->tree, one) != 0)
    return f->code ? f->code : fail_set(f, MUSTER_NOMEM, "out of memory");
  return MUSTER_OK;
}

/* The reply object of a batch applied into `out`: {"released": n}, or the
 * replies under the operation's key, the completions as one raw node. */
static json_t *lease_apply_reply(lease_op_t op, apply_out_t *out, fail_t *f) {
  json_t *replies = NULL;
  if (op == LEASE_RELEASE)
    return json_pack("{s:I}", "released", (json_int_t)json_array_size(out->tree));
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
                                       apply_out_t *out, fail_t *f) {
  char ctx[32];
  held_t h;
  snprintf(ctx, sizeof ctx, "leases[%zu]", i);
  if (lease_check(st, e->ints[0], e->ints[1], ctx, &h, cache, f))
    return f->code;
  return op_complete(st, e->text, &h, ctx, max_payload, run, out, f);
}

const jscan_shape_t lease_complete_shape = {
    .array = "leases",
    .max_elems = LEASE_MAX_BATCH,
    .text = "result",
    .ints = {{"task", 1, JV_ID_MAX, 0, true}, {"token", 1, JV_ID_MAX, 0, true}, {NULL, 0, 0, 0, 0}},
    .extra = "lease",
};

/* Applies `op` to the elements of `leases`, or completes those `scanned`. */
static json_t *lease_apply_batch(store_t *st, lease_op_t op, const json_t *leases,
                                 const jscan_body_t *scanned, size_t max_payload, fail_t *f) {
  size_t n = scanned ? scanned->count : json_array_size(leases);
  apply_out_t out = {.tree = json_array()};
  JW_ADD_LITERAL(&out.completed, "[");
  counts_run_t run = {0}; /* the completions, counted once per batch */
  queue_t cache = {0};    /* the queue of the previous element */
  bool ok = out.tree != NULL;
  for (size_t i = 0; ok && i < n; i++)
    ok = (scanned ? lease_complete_one(st, &scanned->elems[i], i, max_payload, &run, &cache, &out,
                                       f)
                  : lease_apply_one(st, op, json_array_get(leases, i), i, max_payload, &run,
                                    &cache, &out, f)) == MUSTER_OK;
  json_t *reply = NULL;
  if (!ok) {
    fail_t ignored = {0};
    counts_run_flush(st, &run, &ignored); /* those before the refusal are counted */
    if (out.tree == NULL)
      fail_set(f, MUSTER_NOMEM, "out of memory");
  } else if (counts_run_flush(st, &run, f) == MUSTER_OK) {
    reply = lease_apply_reply(op, &out, f);
  }
  json_decref(out.tree);
  jw_buf_free(&out.completed);
  return reply;
}

json_t *lease_apply(store_t *st, lease_op_t op, const json_t *body, size_t max_payload,
                    fail_t *f) {
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

/* Ids of tasks matching a one-parameter query, up to `limit`; caller frees. */
static int64_t *lease_collect(store_t *st, sqlite3_stmt *s, int64_t arg, int64_t limit,
                              size_t *n) {
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
    held_t h;
    fail_t f = {0};
    if (held_load(st, ids[i], &h, NULL, &f) || lease_lapse(st, &h, "lease expired", NULL, &f) < 0) {
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
 * counts) or, when `reason` is NULL, released. */
static int64_t lease_end_worker_why(store_t *st, int64_t worker, const char *reason) {
  size_t n;
  int64_t *ids = lease_collect(
      st, store_stmt(st, "SELECT id FROM tasks WHERE state = 1 AND worker = ?1 LIMIT ?2"), worker,
      100000, &n);
  int64_t done = 0;
  for (size_t i = 0; i < n; i++) {
    held_t h;
    fail_t f = {0};
    bool failed = held_load(st, ids[i], &h, NULL, &f) ||
                  (reason ? lease_lapse(st, &h, reason, NULL, &f) < 0
                          : lease_give_back(st, &h, &f) != MUSTER_OK);
    if (failed) {
      done = -1;
      break;
    }
    done++;
  }
  free(ids);
  return done;
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
  sqlite3_stmt *s =
      store_stmt(st, "SELECT 1 FROM tasks WHERE state = 1 AND deadline_ms <= ?1 LIMIT 1");
  if (s == NULL)
    return true;
  sqlite3_bind_int64(s, 1, now);
  bool due = sqlite3_step(s) == SQLITE_ROW;
  store_reset(s);
  return due;
}
