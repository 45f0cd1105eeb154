/*
 * session.c — sessions and their indexed tasks: create, read, heartbeat,
 * seal and submit.  The results stream is session_results.c's, closing and
 * expiry session_close.c's.
 *
 * A sealed session (its producer said that no task will follow) refuses
 * puts, so that a reader of its results can tell the end of the stream from
 * a pause between two puts (session_read_t.ended).
 *
 * The session row keeps its counters (next_index, last_seq, total, done,
 * failed) so that reading a session or a page of results never counts rows.
 *
 * A closed session keeps its row (state closed, with the reason) so that a
 * late call can be told why its session is gone; its tasks, results and
 * updates are deleted (session_close.c).
 */
#include "session.h"
#include "counts.h"
#include "jv.h"
#include "jw.h"
#include "log.h"
#include "queue.h"
#include "session_internal.h"
#include "shared.h"
#include "task.h"
#include "update.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#define SESSION_COLUMNS                                                                            \
  "id, queue, state, cleanup_on_exit, timeout_ms, created_ms, last_seen_ms, next_index,"           \
  " last_seq, total, done, failed, coalesce(closed_why, ''),"                                      \
  " (SELECT init_data FROM session_data WHERE session = sessions.id), sealed"

static void session_from_row(sqlite3_stmt *s, session_t *ss) {
  snprintf(ss->id, sizeof ss->id, "%s", (const char *)sqlite3_column_text(s, 0));
  snprintf(ss->queue, sizeof ss->queue, "%s", (const char *)sqlite3_column_text(s, 1));
  ss->state = sqlite3_column_int(s, 2);
  ss->cleanup_on_exit = sqlite3_column_int(s, 3) != 0;
  ss->timeout_ms = sqlite3_column_int64(s, 4);
  ss->created_ms = sqlite3_column_int64(s, 5);
  ss->last_seen_ms = sqlite3_column_int64(s, 6);
  ss->next_index = sqlite3_column_int64(s, 7);
  ss->last_seq = sqlite3_column_int64(s, 8);
  ss->total = sqlite3_column_int64(s, 9);
  ss->done = sqlite3_column_int64(s, 10);
  ss->failed = sqlite3_column_int64(s, 11);
  snprintf(ss->closed_why, sizeof ss->closed_why, "%s", (const char *)sqlite3_column_text(s, 12));
  ss->sealed = sqlite3_column_int(s, 14) != 0; /* 13 is init_data: session_init_data */
}

static json_t *session_to_json(store_t *st, const session_t *ss, json_t *init_data) {
  return json_pack(
      "{s:s, s:s, s:s, s:b, s:I, s:o, s:I, s:I, s:{s:I, s:I, s:I, s:I}, s:I, s:I, s:b}", "id",
      ss->id, "queue", ss->queue, "state", ss->state == SESSION_OPEN ? "open" : "closed",
      "cleanup_on_exit", ss->cleanup_on_exit, "timeout_ms", (json_int_t)ss->timeout_ms, "init_data",
      init_data, "created_ms", (json_int_t)ss->created_ms, "last_seen_ms",
      (json_int_t)ss->last_seen_ms, "counts", "total", (json_int_t)ss->total, "done",
      (json_int_t)ss->done, "failed", (json_int_t)ss->failed, "pending",
      (json_int_t)(ss->total - ss->done - ss->failed), "next_index", (json_int_t)ss->next_index,
      "updates", (json_int_t)update_last(st, ss->queue), "sealed", ss->sealed);
}

/* The init_data of a row of SESSION_COLUMNS for a reply: a raw node of its
 * stored text (jv_stored), which is never decoded; NULL when memory ran out. */
static json_t *session_init_data(sqlite3_stmt *s) {
  const char *text = (const char *)sqlite3_column_text(s, 13); /* before its length */
  return jv_stored(text, text ? (size_t)sqlite3_column_bytes(s, 13) : 0);
}

/* The contract is in session_internal.h. */
muster_err_t session_load(store_t *st, const char *id, session_t *ss, json_t **init_data,
                          fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT " SESSION_COLUMNS " FROM sessions WHERE id = ?1");
  if (s == NULL)
    return store_fail(st, f, "session lookup");
  store_bind_text(s, 1, id);
  int rc = sqlite3_step(s);
  if (rc == SQLITE_ROW) {
    session_from_row(s, ss);
    if (init_data)
      *init_data = session_init_data(s);
  }
  store_reset(s);
  if (rc == SQLITE_ROW)
    return MUSTER_OK;
  if (rc != SQLITE_DONE)
    return store_fail(st, f, "session lookup");
  return fail_set(f, MUSTER_SESSION_NOT_FOUND, "session '%.140s' does not exist", id);
}

muster_err_t session_load_open(store_t *st, const char *id, session_t *ss, json_t **init_data,
                               bool touch, fail_t *f) {
  if (init_data)
    *init_data = NULL;
  if (session_load(st, id, ss, init_data, f))
    return f->code;
  if (ss->state != SESSION_OPEN) {
    if (init_data) {
      json_decref(*init_data);
      *init_data = NULL;
    }
    return fail_set(f, MUSTER_SESSION_NOT_FOUND, "session '%s' was closed (%s)", id,
                    ss->closed_why[0] ? ss->closed_why : "by its client");
  }
  if (!touch)
    return MUSTER_OK;
  sqlite3_stmt *s = store_stmt(st, "UPDATE sessions SET last_seen_ms = ?2 WHERE id = ?1");
  if (s == NULL)
    return store_fail(st, f, "session heartbeat");
  ss->last_seen_ms = now_ms();
  store_bind_text(s, 1, id);
  sqlite3_bind_int64(s, 2, ss->last_seen_ms);
  return store_step_done(st, s, f);
}

muster_err_t session_touch(store_t *st, const char *id, char *queue, fail_t *f) {
  session_t ss;
  if (session_load_open(st, id, &ss, NULL, true, f))
    return f->code;
  if (queue)
    snprintf(queue, NAME_MAX_LEN + 1, "%s", ss.queue);
  return MUSTER_OK;
}

void session_gone_why(store_t *st, const char *id, char *out, size_t size) {
  session_t ss;
  fail_t f = {0};
  out[0] = '\0';
  if (session_load(st, id, &ss, NULL, &f) == MUSTER_OK && ss.state != SESSION_OPEN)
    snprintf(out, size, "session '%s' was closed: %s; its shared data went with it", id,
             ss.closed_why[0] ? ss.closed_why : "by its client");
  else if (f.code == MUSTER_SESSION_NOT_FOUND)
    snprintf(out, size, "%s", f.message);
}

json_t *session_get(store_t *st, const char *id, fail_t *f) {
  session_t ss;
  json_t *init_data = NULL;
  /* A read by an observer (the dashboard, a status command) is not the
   * client calling: it does not keep the session alive. */
  if (session_load_open(st, id, &ss, &init_data, false, f)) {
    json_decref(init_data);
    return NULL;
  }
  return session_to_json(st, &ss, init_data);
}

json_t *session_list(store_t *st, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT " SESSION_COLUMNS " FROM sessions WHERE state = 0"
                                   " ORDER BY created_ms, id");
  if (s == NULL) {
    store_fail(st, f, "session list");
    return NULL;
  }
  json_t *list = json_array();
  while (sqlite3_step(s) == SQLITE_ROW) {
    session_t ss;
    session_from_row(s, &ss);
    json_t *init_data = session_init_data(s);
    json_array_append_new(list, session_to_json(st, &ss, init_data));
  }
  store_reset(s);
  return json_pack("{s:o}", "sessions", list);
}

json_t *session_heartbeat(store_t *st, const char *id, const json_t *body, fail_t *f) {
  static const char *const allowed[] = {NULL};
  if (jv_only(body, "", allowed, f) || session_touch(st, id, NULL, f))
    return NULL;
  return json_pack("{s:s, s:s}", "id", id, "state", "open");
}

/* Marks session `id` sealed, in the request's transaction, and wakes its
 * parked readers: one that has every result is answered now
 * (session_read_t.ended) instead of at the end of its wait. */
static muster_err_t session_mark_sealed(store_t *st, const char *id, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "UPDATE sessions SET sealed = 1 WHERE id = ?1");
  if (s == NULL)
    return store_fail(st, f, "session seal");
  store_bind_text(s, 1, id);
  if (store_step_done(st, s, f) == MUSTER_OK)
    store_notify_session(st, id);
  return f->code;
}

json_t *session_seal(store_t *st, const char *id, const json_t *body, fail_t *f) {
  static const char *const allowed[] = {NULL};
  session_t ss;
  json_t *init_data = NULL;
  if (jv_only(body, "", allowed, f) || session_load_open(st, id, &ss, &init_data, true, f) ||
      (!ss.sealed && session_mark_sealed(st, id, f))) {
    json_decref(init_data);
    return NULL;
  }
  bool already = ss.sealed;
  ss.sealed = true;
  json_t *out = session_to_json(st, &ss, init_data);
  if (out != NULL)
    json_object_set_new(out, "already_sealed", json_boolean(already));
  return out;
}

/* A fresh session id: "s-" and 16 hex digits from the kernel's random source. */
static bool session_make_id(char *out, size_t size) {
  uint64_t raw;
  if (getrandom(&raw, sizeof raw, 0) != (ssize_t)sizeof raw)
    return false;
  snprintf(out, size, "s-%016" PRIx64, raw);
  return true;
}

/* Stores the init_data of new session `id` in its own table (not in the
 * session's row, which every heartbeat and result writes). */
static muster_err_t session_insert_data(store_t *st, const char *id, const char *init_data,
                                        fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "INSERT INTO session_data(session, init_data) VALUES(?1, ?2)");
  if (s == NULL)
    return store_fail(st, f, "session create");
  store_bind_text(s, 1, id);
  store_bind_text(s, 2, init_data);
  return store_step_done(st, s, f);
}

static muster_err_t session_insert(store_t *st, const char *queue, bool cleanup, int64_t timeout_ms,
                                   const char *init_data, char *id, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "INSERT INTO sessions(id, queue, state, cleanup_on_exit,"
                                   " timeout_ms, created_ms, last_seen_ms)"
                                   " VALUES(?1, ?2, 0, ?3, ?4, ?5, ?5)");
  if (s == NULL)
    return store_fail(st, f, "session create");
  /* 64 random bits make a collision unlikely; the primary key catches one. */
  for (int attempt = 0; attempt < 4; attempt++) {
    if (!session_make_id(id, SESSION_ID_LEN + 1))
      return fail_set(f, MUSTER_INTERNAL, "no random session id could be made");
    store_bind_text(s, 1, id);
    store_bind_text(s, 2, queue);
    sqlite3_bind_int(s, 3, cleanup);
    sqlite3_bind_int64(s, 4, timeout_ms);
    sqlite3_bind_int64(s, 5, now_ms());
    int rc = sqlite3_step(s);
    store_reset(s);
    if (rc == SQLITE_DONE)
      return init_data ? session_insert_data(st, id, init_data, f) : MUSTER_OK;
    if (rc != SQLITE_CONSTRAINT_PRIMARYKEY)
      return store_fail(st, f, "session create");
  }
  return fail_set(f, MUSTER_INTERNAL, "no unused session id was found");
}

json_t *session_create(store_t *st, const json_t *body, size_t max_payload, fail_t *f) {
  static const char *const allowed[] = {"queue", "cleanup_on_exit", "timeout_ms", "init_data",
                                        NULL};
  const char *queue;
  bool cleanup;
  int64_t timeout_ms;
  queue_t q;
  if (jv_only(body, "", allowed, f) ||
      jv_str(body, "queue", "", NULL, 4 * NAME_MAX_LEN, &queue, f) ||
      jv_bool(body, "cleanup_on_exit", "", true, &cleanup, f) ||
      jv_int(body, "timeout_ms", "", SESSION_DEFAULT_TIMEOUT_MS, 100, 7LL * 24 * 3600 * 1000,
             &timeout_ms, f))
    return NULL;
  if (queue == NULL) {
    fail_set(f, MUSTER_INVALID, "queue: missing (the queue the session's tasks go to)");
    return NULL;
  }
  if (queue_load(st, queue, &q, f))
    return NULL;
  const json_t *init = json_object_get(body, "init_data");
  char *init_text = init && !json_is_null(init) ? jv_encode(init) : NULL;
  char id[SESSION_ID_LEN + 1];
  json_t *out = NULL;
  if (jv_payload_fits(init_text, max_payload, "", "init_data", f) == MUSTER_OK &&
      session_insert(st, q.name, cleanup, timeout_ms, init_text, id, f) == MUSTER_OK)
    out = session_get(st, id, f);
  free(init_text);
  return out;
}

/* ---- submitting tasks ---- */

typedef struct {
  const char *payload;     /* encoded JSON: `encoded` or a scanned body's text */
  char *encoded;           /* the payload written from a tree, owned */
  char *requires;          /* encoded JSON of "requires" or NULL, owned */
  int64_t priority, index; /* index -1: the next automatic one */
} submit_spec_t;

static muster_err_t submit_parse(const json_t *elem, size_t i, size_t max_payload,
                                 submit_spec_t *spec, fail_t *f) {
  static const char *const allowed[] = {"payload", "index", "priority", "requires", NULL};
  char ctx[32];
  snprintf(ctx, sizeof ctx, "tasks[%zu]", i);
  if (jv_only(elem, ctx, allowed, f) ||
      jv_int(elem, "priority", ctx, 0, INT32_MIN, INT32_MAX, &spec->priority, f) ||
      jv_int(elem, "index", ctx, -1, 0, JV_ID_MAX, &spec->index, f) ||
      shared_requires_parse(elem, ctx, &spec->requires, f))
    return f->code;
  const json_t *payload = json_object_get(elem, "payload");
  if (payload == NULL)
    return fail_set(f, MUSTER_INVALID, "%s.payload: missing", ctx);
  spec->payload = spec->encoded = jv_encode(payload);
  if (spec->payload == NULL)
    return fail_set(f, MUSTER_NOMEM, "%s.payload: out of memory", ctx);
  return jv_payload_fits(spec->payload, max_payload, ctx, "payload", f);
}

/* True when `index` is taken by a task of the session in its queue. */
static bool submit_index_used(store_t *st, const session_t *ss, int64_t index) {
  sqlite3_stmt *s = store_stmt(st, "SELECT 1 FROM tasks WHERE session = ?1 AND queue = ?2"
                                   " AND idx = ?3 LIMIT 1");
  if (s == NULL)
    return true;
  store_bind_text(s, 1, ss->id);
  store_bind_text(s, 2, ss->queue);
  sqlite3_bind_int64(s, 3, index);
  bool used = sqlite3_step(s) == SQLITE_ROW;
  store_reset(s);
  return used;
}

/* True when an index from `low` to `high` is taken in the session. */
static bool submit_range_used(store_t *st, const session_t *ss, int64_t low, int64_t high) {
  sqlite3_stmt *s = store_stmt(st, "SELECT 1 FROM tasks WHERE session = ?1 AND queue = ?2"
                                   " AND idx BETWEEN ?3 AND ?4 LIMIT 1");
  if (s == NULL)
    return true;
  store_bind_text(s, 1, ss->id);
  store_bind_text(s, 2, ss->queue);
  sqlite3_bind_int64(s, 3, low);
  sqlite3_bind_int64(s, 4, high);
  bool used = sqlite3_step(s) == SQLITE_ROW;
  store_reset(s);
  return used;
}

/* The indexes of the batch's tasks, in order, into idx[]: an explicit one as
 * given, the others from next_index on, which moves past every index given,
 * so that automatic indexes never collide with explicit ones.  Returns the
 * next_index after the batch; *increasing tells whether they strictly
 * increase (then no two of the batch are the same). */
static int64_t submit_indexes(const session_t *ss, const submit_spec_t *specs, size_t n,
                              int64_t *idx, bool *increasing) {
  int64_t next = ss->next_index;
  *increasing = true;
  for (size_t i = 0; i < n; i++) {
    idx[i] = specs[i].index >= 0 ? specs[i].index : next;
    if (idx[i] >= next)
      next = idx[i] + 1;
    if (i > 0 && idx[i] <= idx[i - 1])
      *increasing = false;
  }
  return next;
}

/* The first task of a strictly increasing batch whose explicit index is in
 * use in the session; n when none is.  When the explicit indexes are one
 * consecutive run (a pool's batches are), one range query answers for all. */
static size_t submit_first_used(store_t *st, const session_t *ss, const submit_spec_t *specs,
                                const int64_t *idx, size_t n) {
  size_t given = 0, first = n, last = n;
  for (size_t i = 0; i < n; i++)
    if (specs[i].index >= 0) {
      given++;
      if (first == n)
        first = i;
      last = i;
    }
  if (given == 0 || (idx[last] - idx[first] == (int64_t)given - 1 &&
                     !submit_range_used(st, ss, idx[first], idx[last])))
    return n;
  for (size_t i = 0; i < n; i++)
    if (specs[i].index >= 0 && submit_index_used(st, ss, idx[i]))
      return i;
  return n;
}

/* Inserts the tasks one by one (a task that requires shared data, or
 * indexes that do not strictly increase: each checked against the rows
 * before it); ids[i] gets each id. */
static muster_err_t submit_rows_one_by_one(store_t *st, const session_t *ss,
                                           const submit_spec_t *specs, const int64_t *idx, size_t n,
                                           int64_t *ids, size_t *used, fail_t *f) {
  int64_t now = now_ms();
  counts_run_t run = {0};
  for (size_t i = 0; i < n; i++) {
    if (specs[i].index >= 0 && submit_index_used(st, ss, idx[i])) {
      *used = i;
      fail_set(f, MUSTER_INVALID_STATE, "tasks[%zu].index: %lld is already in use in session %s", i,
               (long long)idx[i], ss->id);
      break;
    }
    if (task_insert(st, ss->queue, specs[i].payload, specs[i].priority, now, NULL, ss->id, idx[i],
                    0, &run, &ids[i], f) ||
        shared_requires_set(st, ids[i], specs[i].requires, f))
      break;
  }
  fail_t ignored = {0};
  counts_run_flush(st, &run, f->code ? &ignored : f); /* what was inserted is counted */
  return f->code;
}

/* Inserts the batch's tasks with multi-row INSERTs when none requires
 * shared data and their indexes strictly increase (every automatic batch,
 * and a pool's); ids[i] gets each id.  An index in use fails the batch with
 * invalid_state, *used then the task that has it (n: another failure). */
static muster_err_t submit_rows(store_t *st, const session_t *ss, const submit_spec_t *specs,
                                const int64_t *idx, bool increasing, size_t n, int64_t *ids,
                                size_t *used, fail_t *f) {
  bool plain = increasing;
  *used = n;
  for (size_t i = 0; plain && i < n; i++)
  plain = specs[i].requires == NULL;
  if (!plain)
    return submit_rows_one_by_one(st, ss, specs, idx, n, ids, used, f);
  *used = submit_first_used(st, ss, specs, idx, n);
  if (*used < n)
    return fail_set(f, MUSTER_INVALID_STATE,
                    "tasks[%zu].index: %lld is already in use in session %s", *used,
                    (long long)idx[*used], ss->id);
  task_row_t *rows = malloc(n * sizeof *rows);
  if (rows == NULL)
    return fail_set(f, MUSTER_NOMEM, "out of memory");
  for (size_t i = 0; i < n; i++)
    rows[i] = (task_row_t){specs[i].payload, specs[i].priority, idx[i]};
  task_insert_rows(st, ss->queue, ss->id, rows, n, ids, f);
  free(rows);
  return f->code;
}

/* The reply {"tasks": [{"id", "index"}, ...]} (new reference), its array one
 * raw node (jw.h); NULL with MUSTER_NOMEM. */
static json_t *submit_reply(const int64_t *ids, const int64_t *idx, size_t n, fail_t *f) {
  jw_buf_t out = {0};
  jw_reserve(&out, 2 + n * 32);
  JW_ADD_LITERAL(&out, "[");
  for (size_t i = 0; i < n; i++) {
    if (i > 0)
      JW_ADD_LITERAL(&out, ",");
    JW_ADD_LITERAL(&out, "{\"id\":");
    jw_add_int(&out, ids[i]);
    JW_ADD_LITERAL(&out, ",\"index\":");
    jw_add_int(&out, idx[i]);
    JW_ADD_LITERAL(&out, "}");
  }
  JW_ADD_LITERAL(&out, "]");
  json_t *reply = jw_object_raw("tasks", &out);
  jw_buf_free(&out);
  if (reply == NULL)
    fail_set(f, MUSTER_NOMEM, "out of memory");
  return reply;
}

/* True when a task's stored "requires" (column text, NULL: none) is `sent`,
 * a submitted task's: shared_requires_parse wrote both with the keys of each
 * entry in one order, so the same levels give the same text however a client
 * ordered the keys (the order of the entries counts). */
static bool submit_same_requires(const unsigned char *stored, const char *sent) {
  if (stored == NULL || sent == NULL)
    return stored == NULL && sent == NULL;
  return strcmp((const char *)stored, sent) == 0;
}

/*
 * A batch sent again after its reply was lost (the head committed it, then
 * the connection or the head went down): every index explicit and in use by
 * a task of the session with the same payload, priority and requires (the
 * shared data it requires, or none).  ids[i] gets those tasks' ids.  Checked
 * only once the batch failed on its first task's index, so nothing of it was
 * inserted.
 */
static bool submit_is_repeat(store_t *st, const session_t *ss, const submit_spec_t *specs, size_t n,
                             int64_t *ids) {
  sqlite3_stmt *s = store_stmt(st, "SELECT id, payload, priority, requires FROM tasks"
                                   " WHERE session = ?1 AND queue = ?2 AND idx = ?3");
  bool same = s != NULL;
  for (size_t i = 0; same && i < n; i++) {
    same = specs[i].index >= 0;
    if (!same)
      break;
    store_bind_text(s, 1, ss->id);
    store_bind_text(s, 2, ss->queue);
    sqlite3_bind_int64(s, 3, specs[i].index);
    same = sqlite3_step(s) == SQLITE_ROW &&
           strcmp((const char *)sqlite3_column_text(s, 1), specs[i].payload) == 0 &&
           sqlite3_column_int64(s, 2) == specs[i].priority &&
           submit_same_requires(sqlite3_column_text(s, 3), specs[i].requires);
    ids[i] = same ? sqlite3_column_int64(s, 0) : 0;
    store_reset(s);
  }
  return same;
}

/* Loads open session `id` into *ss for a submit, and checks its queue. */
static muster_err_t submit_open(store_t *st, const char *id, session_t *ss, fail_t *f) {
  queue_t q;
  if (session_load_open(st, id, ss, NULL, true, f) == MUSTER_OK)
    queue_load(st, ss->queue, &q, f);
  return f->code;
}

/* Stores the `n` parsed tasks in session *ss: their indexes, their rows, the
 * session's counters; returns the reply. */
static json_t *submit_specs(store_t *st, session_t *ss, const submit_spec_t *specs, size_t n,
                            fail_t *f) {
  int64_t *idx = malloc(2 * n * sizeof *idx), *ids = idx + n;
  if (idx == NULL) {
    fail_set(f, MUSTER_NOMEM, "out of memory");
    return NULL;
  }
  bool increasing;
  int64_t next = submit_indexes(ss, specs, n, idx, &increasing);
  json_t *out = NULL;
  sqlite3_stmt *s = NULL;
  size_t used;
  if (submit_rows(st, ss, specs, idx, increasing, n, ids, &used, f) == MUSTER_OK &&
      (s = store_stmt(st, "UPDATE sessions SET next_index = ?2, total = total + ?3"
                          " WHERE id = ?1")) == NULL)
    store_fail(st, f, "session submit");
  if (f->code == MUSTER_INVALID_STATE && used == 0 && submit_is_repeat(st, ss, specs, n, ids)) {
    *f = (fail_t){0}; /* stored by the first sending: answered, nothing changes */
    if ((out = submit_reply(ids, idx, n, f)) != NULL)
      json_object_set_new(out, "repeated", json_true());
  }
  if (s != NULL) {
    store_bind_text(s, 1, ss->id);
    sqlite3_bind_int64(s, 2, next);
    sqlite3_bind_int64(s, 3, (int64_t)n);
    if (store_step_done(st, s, f) == MUSTER_OK)
      out = submit_reply(ids, idx, n, f);
  }
  free(idx);
  return out;
}

/* A batch for sealed session *ss: refused, unless it is a repeat of one
 * stored before the seal (its reply was lost, and it may have been the
 * batch that sealed), answered as any repeat. */
static json_t *submit_sealed(store_t *st, const session_t *ss, const submit_spec_t *specs, size_t n,
                             fail_t *f) {
  int64_t *idx = malloc(2 * n * sizeof *idx), *ids = idx + n;
  json_t *out = NULL;
  if (idx == NULL) {
    fail_set(f, MUSTER_NOMEM, "out of memory");
  } else if (submit_is_repeat(st, ss, specs, n, ids)) {
    for (size_t i = 0; i < n; i++)
      idx[i] = specs[i].index;
    if ((out = submit_reply(ids, idx, n, f)) != NULL)
      json_object_set_new(out, "repeated", json_true());
  } else {
    fail_set(f, MUSTER_INVALID_STATE,
             "session %s was sealed (its producer said that no more tasks would come): it "
             "takes no more; put these tasks into a new session",
             ss->id);
  }
  free(idx);
  return out;
}

/* Stores a parsed batch in session *ss (submit_specs, or submit_sealed when
 * it is sealed); with `seal`, seals it in the same transaction, and the
 * reply says "sealed": true. */
static json_t *submit_batch(store_t *st, session_t *ss, const submit_spec_t *specs, size_t n,
                            bool seal, fail_t *f) {
  json_t *out = ss->sealed ? submit_sealed(st, ss, specs, n, f) : submit_specs(st, ss, specs, n, f);
  if (out != NULL && seal && !ss->sealed && session_mark_sealed(st, ss->id, f)) {
    json_decref(out);
    return NULL;
  }
  if (out != NULL && seal)
    json_object_set_new(out, "sealed", json_true());
  return out;
}

json_t *session_submit(store_t *st, const char *id, const json_t *body, size_t max_payload,
                       fail_t *f) {
  static const char *const allowed[] = {"tasks", "seal", NULL};
  json_t *tasks;
  session_t ss;
  bool seal;
  if (jv_only(body, "", allowed, f) || jv_bool(body, "seal", "", false, &seal, f) ||
      jv_batch(body, "tasks", TASK_MAX_BATCH, &tasks, f) || submit_open(st, id, &ss, f))
    return NULL;
  size_t n = json_array_size(tasks), i = 0;
  submit_spec_t *specs = calloc(n, sizeof *specs);
  if (specs == NULL) {
    fail_set(f, MUSTER_NOMEM, "out of memory");
    return NULL;
  }
  json_t *out = NULL;
  while (i < n && submit_parse(json_array_get(tasks, i), i, max_payload, &specs[i], f) == MUSTER_OK)
    i++;
  if (i == n)
    out = submit_batch(st, &ss, specs, n, seal, f);
  for (size_t j = 0; j < n; j++) {
    free(specs[j].encoded);
    free(specs[j].requires);
  }
  free(specs);
  return out;
}

const jscan_shape_t session_submit_shape = {
    .array = "tasks",
    .max_elems = TASK_MAX_BATCH,
    .text = "payload",
    .text_required = true,
    .ints = {{"priority", INT32_MIN, INT32_MAX, 0, false},
             {"index", 0, JV_ID_MAX, -1, false},
             {NULL, 0, 0, 0, false}},
    .extra = "seal",
};

/* The "seal" of a scanned body, its extra slice (canonical text): true,
 * false, or absent or null (false); anything else fails as jv_bool does
 * in the tree path, with its message. */
static muster_err_t submit_scanned_seal(const jscan_body_t *body, bool *seal, fail_t *f) {
  const char *text = body->extra;
  size_t len = body->extra_len;
  *seal = text && len == 4 && memcmp(text, "true", 4) == 0;
  if (text == NULL || *seal || (len == 5 && memcmp(text, "false", 5) == 0) ||
      (len == 4 && memcmp(text, "null", 4) == 0))
    return MUSTER_OK;
  return fail_set(f, MUSTER_INVALID, "seal: expected true or false");
}

json_t *session_submit_scanned(store_t *st, const char *id, const jscan_body_t *body, fail_t *f) {
  session_t ss;
  bool seal;
  if (submit_scanned_seal(body, &seal, f) || submit_open(st, id, &ss, f))
    return NULL;
  submit_spec_t *specs = calloc(body->count, sizeof *specs);
  if (specs == NULL) {
    fail_set(f, MUSTER_NOMEM, "out of memory");
    return NULL;
  }
  for (size_t i = 0; i < body->count; i++) {
    const jscan_elem_t *e = &body->elems[i];
    specs[i] = (submit_spec_t){.payload = e->text, .priority = e->ints[0], .index = e->ints[1]};
  }
  json_t *out = submit_batch(st, &ss, specs, body->count, seal, f);
  free(specs);
  return out;
}
