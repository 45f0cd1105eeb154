/*
 * task.c — storing and reading tasks.
 *
 * Payloads and results are stored as compact JSON text, and go back out as
 * that text, spliced into the replies (task_text.c).  A put is validated
 * whole before the first insert, so a bad element refuses the batch without
 * touching the store; the route layer's savepoint covers store failures in
 * the middle.
 */
#include "task.h"
#include "task_internal.h"
#include "counts.h"
#include "jv.h"
#include "jw.h"
#include "leftover.h"
#include "log.h"
#include "reply_budget.h"
#include "session.h"
#include "shared.h"
#include "core/names.h"

#include <assert.h>
#include <stdbool.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const state_names[TASK_STATE_COUNT] = {"queued", "leased", "done",
                                                          "failed", "dead",   "cancelled"};

const char *task_state_name(int state) {
  return state >= 0 && state < TASK_STATE_COUNT ? state_names[state] : "unknown";
}

int task_state_parse(const char *name) {
  for (int i = 0; i < TASK_STATE_COUNT; i++)
    if (strcmp(state_names[i], name) == 0)
      return i;
  return -1;
}

muster_err_t task_insert(store_t *st, const char *queue, const char *payload, int64_t priority,
                         int64_t run_at_ms, const char *key, const char *session, int64_t index,
                         int64_t parent, counts_run_t *run, int64_t *id, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "INSERT INTO tasks(id, queue, state, priority, run_at_ms,"
                                   " payload, key, session, idx, parent, created_ms, updated_ms)"
                                   " VALUES(?10, ?1, 0, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9)");
  if (s == NULL)
    return store_fail(st, f, "task insert");
  store_bind_text(s, 1, queue);
  sqlite3_bind_int64(s, 2, priority);
  sqlite3_bind_int64(s, 3, run_at_ms);
  store_bind_text(s, 4, payload);
  store_bind_text(s, 5, key);
  store_bind_text(s, 6, session);
  if (index >= 0)
    sqlite3_bind_int64(s, 7, index);
  if (parent > 0)
    sqlite3_bind_int64(s, 8, parent);
  sqlite3_bind_int64(s, 9, now_ms());
  int64_t new_id = store_task_ids(st, 1);
  sqlite3_bind_int64(s, 10, new_id);
  if (store_step_done(st, s, f))
    return f->code;
  *id = new_id;
  if (run ? counts_run_add(st, run, queue, COUNTS_NONE, TASK_QUEUED, f)
          : counts_move(st, queue, COUNTS_NONE, TASK_QUEUED, 1, f))
    return f->code;
  store_notify_ready(st, queue);
  return MUSTER_OK;
}

/* The id of the task with idempotency `key` in `queue`, or 0. */
static int64_t task_find_key(store_t *st, const char *queue, const char *key) {
  sqlite3_stmt *s = store_stmt(st, "SELECT id FROM tasks WHERE queue = ?1 AND key = ?2");
  if (s == NULL)
    return 0;
  store_bind_text(s, 1, queue);
  store_bind_text(s, 2, key);
  int64_t id = sqlite3_step(s) == SQLITE_ROW ? sqlite3_column_int64(s, 0) : 0;
  store_reset(s);
  return id;
}

typedef struct {
  const char *payload; /* encoded JSON: `encoded` or a scanned body's text */
  char *encoded;       /* the payload written from a tree, owned */
  char *requires;      /* encoded JSON of "requires" or NULL, owned */
  int64_t priority, delay_ms, index;
  const char *key, *session; /* borrowed from the request body */
} task_spec_t;

static muster_err_t task_spec_parse(const json_t *elem, size_t i, size_t max_payload,
                                    task_spec_t *spec, fail_t *f) {
  static const char *const allowed[] = {"payload", "priority", "delay_ms", "key",
                                        "session", "index",    "requires", NULL};
  char ctx[32];
  snprintf(ctx, sizeof ctx, "tasks[%zu]", i);
  if (jv_only(elem, ctx, allowed, f) ||
      jv_int(elem, "priority", ctx, 0, INT32_MIN, INT32_MAX, &spec->priority, f) ||
      jv_int(elem, "delay_ms", ctx, 0, 0, TASK_MAX_DELAY_MS, &spec->delay_ms, f) ||
      jv_int(elem, "index", ctx, -1, 0, INT64_MAX, &spec->index, f) ||
      jv_str(elem, "key", ctx, NULL, TASK_MAX_KEY, &spec->key, f) ||
      jv_str(elem, "session", ctx, NULL, TASK_MAX_SESSION, &spec->session, f) ||
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

/* Appends the reply element of one put task, {"id":N,"created":B}, as jw_dump
 * wrote the object task_put built before (keys in that order), after a
 * comma unless it is the first. */
static void task_put_write(jw_buf_t *out, bool first, int64_t id, bool created) {
  if (!first)
    JW_ADD_LITERAL(out, ",");
  JW_ADD_LITERAL(out, "{\"id\":");
  jw_add_int(out, id);
  if (created)
    JW_ADD_LITERAL(out, ",\"created\":true}");
  else
    JW_ADD_LITERAL(out, ",\"created\":false}");
}

/* The reply {"tasks": RAW} (new reference), RAW a raw node of the array's
 * text `tasks_text`; NULL with MUSTER_NOMEM when memory ran out, now or while
 * the text was written. */
static json_t *task_put_reply(const jw_buf_t *tasks_text, fail_t *f) {
  json_t *reply = jw_object_raw("tasks", tasks_text);
  if (reply == NULL)
    fail_set(f, MUSTER_NOMEM, "out of memory");
  return reply;
}

/*
 * A batch of tasks without idempotency keys or required shared data (every
 * scanned put) is inserted with multi-row INSERTs of TASK_CHUNK_MAX, 32, …,
 * 2 and 1 rows: one statement per chunk instead of one per task.  The work
 * of a statement as such (opening cursors on the table and on each of its
 * indexes, evaluating the partial indexes' conditions once per row anyway,
 * starting and halting) was about a quarter of an insert; the b-tree work per
 * row stays.  The rows of one statement get consecutive ids from
 * store_task_ids, the first bound once and the others written as "?3 + i".
 */
#define TASK_CHUNK_LOG 6
#define TASK_CHUNK_MAX (1 << TASK_CHUNK_LOG)
#define TASK_CHUNK_PARAMS 5 /* per row: priority, run_at_ms, payload, session, idx */
#define TASK_CHUNK_FIRST 4  /* the first row's first parameter */

/* The multi-row INSERT of 2^k rows (k <= TASK_CHUNK_LOG): ?1 the queue, ?2
 * the time, ?3 the first id, then TASK_CHUNK_PARAMS parameters per row.  Written once per
 * process; the address is the statement cache's key (store_stmt).  NULL when
 * memory ran out. */
static const char *task_chunk_sql(int k) {
  static char *sql[TASK_CHUNK_LOG + 1];
  if (sql[k])
    return sql[k];
  jw_buf_t b = {0};
  JW_ADD_LITERAL(&b, "INSERT INTO tasks(id, queue, state, priority, run_at_ms, payload, session,"
                     " idx, created_ms, updated_ms) VALUES");
  for (int row = 0; row < (1 << k); row++) {
    char values[112];
    int p = TASK_CHUNK_FIRST + row * TASK_CHUNK_PARAMS;
    int len = snprintf(values, sizeof values, "%s(?3 + %d, ?1, 0, ?%d, ?%d, ?%d, ?%d, ?%d, ?2, ?2)",
                       row ? "," : "", row, p, p + 1, p + 2, p + 3, p + 4);
    jw_add_text(&b, values, (size_t)len);
  }
  if (!jw_reserve(&b, 1)) {
    jw_buf_free(&b);
    return NULL;
  }
  b.buf[b.len] = '\0';
  return sql[k] = b.buf; /* kept for the life of the process */
}

/* Inserts the `rows` (a power of two up to TASK_CHUNK_MAX) tasks of `specs`
 * with one statement at time `now`; *first gets the first one's id. */
static muster_err_t task_insert_chunk(store_t *st, const char *queue, const task_spec_t *specs,
                                      int k, int64_t now, int64_t *first, fail_t *f) {
  const char *sql = task_chunk_sql(k);
  sqlite3_stmt *s = sql ? store_stmt(st, sql) : NULL;
  if (s == NULL)
    return sql ? store_fail(st, f, "task insert") : fail_set(f, MUSTER_NOMEM, "out of memory");
  int rows = 1 << k;
  /* Every text outlives the step (store_step_done resets the statement). */
  sqlite3_bind_text(s, 1, queue, -1, SQLITE_STATIC);
  sqlite3_bind_int64(s, 2, now);
  *first = store_task_ids(st, rows);
  sqlite3_bind_int64(s, 3, *first);
  for (int i = 0; i < rows; i++) {
    const task_spec_t *spec = &specs[i];
    int p = TASK_CHUNK_FIRST + i * TASK_CHUNK_PARAMS;
    sqlite3_bind_int64(s, p, spec->priority);
    sqlite3_bind_int64(s, p + 1, now + spec->delay_ms);
    sqlite3_bind_text(s, p + 2, spec->payload, -1, SQLITE_STATIC);
    if (spec->session)
      sqlite3_bind_text(s, p + 3, spec->session, -1, SQLITE_STATIC);
    if (spec->index >= 0)
      sqlite3_bind_int64(s, p + 4, spec->index);
  }
  if (store_step_done(st, s, f))
    return f->code;
  if (sqlite3_changes64(store_db(st)) != rows)
    return fail_set(f, MUSTER_STORE, "store: task insert: %lld of %d rows inserted",
                    (long long)sqlite3_changes64(store_db(st)), rows);
  return MUSTER_OK;
}

/* Inserts `n` specs without keys and requires in chunks (above), counted and
 * announced once: each id goes to `out` as a put's reply element, to `ids`,
 * or both (either may be NULL). */
static muster_err_t task_insert_chunks(store_t *st, const char *queue, const task_spec_t *specs,
                                       size_t n, int64_t now, jw_buf_t *out, int64_t *ids,
                                       fail_t *f) {
  size_t done = 0;
  for (int k = TASK_CHUNK_LOG; k >= 0; k--) {
    while (n - done >= ((size_t)1 << k)) {
      int64_t first = 0;
      if (task_insert_chunk(st, queue, specs + done, k, now, &first, f)) {
        fail_t ignored = {0};
        counts_move(st, queue, COUNTS_NONE, TASK_QUEUED, (int64_t)done, &ignored);
        return f->code;
      }
      for (int i = 0; i < (1 << k); i++, done++) {
        if (out)
          task_put_write(out, done == 0, first + i, true);
        if (ids)
          ids[done] = first + i;
      }
    }
  }
  if (counts_move(st, queue, COUNTS_NONE, TASK_QUEUED, (int64_t)n, f))
    return f->code;
  store_notify_ready(st, queue);
  return MUSTER_OK;
}

muster_err_t task_insert_rows(store_t *st, const char *queue, const char *session,
                              const task_row_t *rows, size_t n, int64_t *ids, fail_t *f) {
  task_spec_t *specs = calloc(n ? n : 1, sizeof *specs);
  if (specs == NULL)
    return fail_set(f, MUSTER_NOMEM, "out of memory");
  for (size_t i = 0; i < n; i++)
    specs[i] = (task_spec_t){.payload = rows[i].payload,
                             .priority = rows[i].priority,
                             .index = rows[i].index,
                             .session = session};
  muster_err_t err = task_insert_chunks(st, queue, specs, n, now_ms(), NULL, ids, f);
  free(specs);
  return err;
}

/* Stores `n` validated specs and returns the reply {"tasks": RAW} (new
 * reference), RAW the array of {"id", "created"} as one raw node (jw.h): one
 * growing buffer per batch, where a tree cost an object, an integer and a
 * boolean per task.  NULL with *f filled; the tasks inserted before a failure
 * are counted, and the caller's savepoint takes them back. */
static json_t *task_put_specs(store_t *st, const char *queue, task_spec_t *specs, size_t n,
                              fail_t *f) {
  jw_buf_t out = {0};
  int64_t now = now_ms();
  counts_run_t run = {0};
  jw_reserve(&out, 2 + n * 32); /* most of a batch's text at once */
  JW_ADD_LITERAL(&out, "[");
  bool plain = true; /* no keys, no requires: the chunked path */
  for (size_t i = 0; i < n; i++)
  plain &= specs[i].key == NULL && specs[i].requires == NULL;
  if (plain) {
    if (task_insert_chunks(st, queue, specs, n, now, &out, NULL, f)) {
      jw_buf_free(&out);
      return NULL;
    }
    n = 0; /* written */
  }
  for (size_t i = 0; i < n; i++) {
    int64_t id = specs[i].key ? task_find_key(st, queue, specs[i].key) : 0;
    bool created = id == 0;
    if ((created &&
         task_insert(st, queue, specs[i].payload, specs[i].priority, now + specs[i].delay_ms,
                     specs[i].key, specs[i].session, specs[i].index, 0, &run, &id, f)) ||
        (created && shared_requires_set(st, id, specs[i].requires, f))) {
      fail_t ignored = {0};
      counts_run_flush(st, &run, &ignored);
      jw_buf_free(&out);
      return NULL;
    }
    task_put_write(&out, i == 0, id, created);
  }
  JW_ADD_LITERAL(&out, "]");
  json_t *reply = counts_run_flush(st, &run, f) == MUSTER_OK ? task_put_reply(&out, f) : NULL;
  jw_buf_free(&out);
  return reply;
}

json_t *task_put(store_t *st, const char *queue, const json_t *body, size_t max_payload,
                 fail_t *f) {
  static const char *const allowed[] = {"tasks", NULL};
  json_t *tasks;
  if (jv_only(body, "", allowed, f) || jv_batch(body, "tasks", TASK_MAX_BATCH, &tasks, f))
    return NULL;
  size_t n = json_array_size(tasks);
  task_spec_t *specs = calloc(n, sizeof *specs);
  if (specs == NULL) {
    fail_set(f, MUSTER_NOMEM, "out of memory");
    return NULL;
  }
  json_t *out = NULL;
  size_t i = 0;
  for (; i < n; i++)
    if (task_spec_parse(json_array_get(tasks, i), i, max_payload, &specs[i], f))
      break;
  if (i == n)
    out = task_put_specs(st, queue, specs, n, f);
  for (size_t j = 0; j < n; j++) {
    free(specs[j].encoded);
    free(specs[j].requires);
  }
  free(specs);
  return out;
}

/* The put body the scanner takes (jscan.h): the fields and limits of
 * task_spec_parse, without key, session and requires (those bodies take
 * the tree path). */
const jscan_shape_t task_put_shape = {
    .array = "tasks",
    .max_elems = TASK_MAX_BATCH,
    .text = "payload",
    .text_required = true,
    .ints = {{"priority", INT32_MIN, INT32_MAX, 0, false},
             {"delay_ms", 0, TASK_MAX_DELAY_MS, 0, false},
             {"index", 0, INT64_MAX, -1, false},
             {NULL, 0, 0, 0, false}},
};

json_t *task_put_scanned(store_t *st, const char *queue, const jscan_body_t *body, fail_t *f) {
  task_spec_t *specs = calloc(body->count, sizeof *specs);
  if (specs == NULL) {
    fail_set(f, MUSTER_NOMEM, "out of memory");
    return NULL;
  }
  for (size_t i = 0; i < body->count; i++) {
    const jscan_elem_t *e = &body->elems[i];
    specs[i] = (task_spec_t){
        .payload = e->text, .priority = e->ints[0], .delay_ms = e->ints[1], .index = e->ints[2]};
  }
  json_t *out = task_put_specs(st, queue, specs, body->count, f);
  free(specs);
  return out;
}

#define TASK_NOT_FOUND_CLOSING_SQL                                                                 \
  "SELECT CASE WHEN " SESSION_CLOSING_TASKS_SQL " THEN NULL ELSE queue END, 1"                     \
  " FROM tasks WHERE id = ?1 UNION ALL SELECT NULL, ?1 <= ?2 LIMIT 1"

/* Fills *f with why task `id` is not found: it waits in the trash of a
 * deleted queue (queue_reap.h), or its id was handed out (ids are given
 * in turn, so every id up to the highest handed out was) and the task
 * removed since, or it never existed.  The highest handed out is the
 * store's (store_last_task), not the highest id still in the table: when
 * the newest tasks are the ones removed (a purge, a session close), the
 * table's highest is below theirs. */
muster_err_t task_not_found(store_t *st, int64_t id, fail_t *f) {
  /* A task a closed session left to the background deletion is removed
   * already for clients (session_close.c): no queue to name. */
  sqlite3_stmt *s = store_sessions_closing(st)
                        ? store_stmt(st, TASK_NOT_FOUND_CLOSING_SQL)
                        : store_stmt(st, "SELECT queue, 1 FROM tasks WHERE id = ?1 UNION ALL"
                                         " SELECT NULL, ?1 <= ?2 LIMIT 1");
  if (s == NULL)
    return store_fail(st, f, "task lookup");
  sqlite3_bind_int64(s, 1, id);
  sqlite3_bind_int64(s, 2, store_last_task(st));
  int rc = sqlite3_step(s);
  const unsigned char *queue = rc == SQLITE_ROW ? sqlite3_column_text(s, 0) : NULL;
  bool removed = rc == SQLITE_ROW && sqlite3_column_int(s, 1);
  if (queue)
    fail_set(f, MUSTER_TASK_NOT_FOUND, "task %lld was in queue '%s', which was deleted",
             (long long)id, (const char *)queue);
  else if (removed)
    fail_set(f, MUSTER_TASK_NOT_FOUND,
             "task %lld does not exist any more: it was removed by its queue's retention of "
             "done tasks (keep_done_ms), a purge, or the deletion of its queue or session",
             (long long)id);
  else
    fail_set(f, MUSTER_TASK_NOT_FOUND, "task %lld does not exist", (long long)id);
  store_reset(s);
  return f->code;
}

/* The row of task `id` as clients see it (TASK_COLUMNS), the statement
 * stepped onto it (the caller resets it), or NULL with *f filled: not found
 * (task_not_found), or the store failed. */
static sqlite3_stmt *task_row(store_t *st, int64_t id, fail_t *f) {
  /* A task of a deleted queue may wait in the trash, one of a closed session
   * in session_trash: gone for clients. */
  sqlite3_stmt *s =
      !store_sessions_closing(st)
          ? store_stmt(st, "SELECT " TASK_COLUMNS " FROM tasks WHERE id = ?1"
                           " AND EXISTS (SELECT 1 FROM queues WHERE name = tasks.queue)")
          : store_stmt(st, "SELECT " TASK_COLUMNS " FROM tasks WHERE id = ?1"
                           " AND EXISTS (SELECT 1 FROM queues WHERE name = tasks.queue)"
                           " AND NOT " SESSION_CLOSING_TASKS_SQL);
  if (s == NULL) {
    store_fail(st, f, "task lookup");
    return NULL;
  }
  sqlite3_bind_int64(s, 1, id);
  int rc = sqlite3_step(s);
  if (rc == SQLITE_ROW)
    return s;
  store_reset(s);
  if (rc == SQLITE_DONE)
    task_not_found(st, id, f);
  else
    store_fail(st, f, "task lookup");
  return NULL;
}

json_t *task_get(store_t *st, int64_t id, fail_t *f) {
  sqlite3_stmt *s = task_row(st, id, f);
  if (s == NULL)
    return NULL;
  jw_buf_t text = {0};
  task_write(&text, s, false);
  store_reset(s);
  json_t *task = text.failed ? NULL : jw_raw(text.buf, text.len);
  jw_buf_free(&text);
  if (task == NULL)
    fail_set(f, MUSTER_NOMEM, "out of memory");
  return task;
}

/* The listing statement for tasks of `queue` in `state` (-1: all), by
 * ascending id from ?2, ?3 rows, the state in ?4 where the text names it.
 * No index covers (queue, state, id) any more (store_schema.c, migration 7: it was
 * rewritten at every state change), so each state reads through the index
 * that keeps a page cheap:
 *   all, done   tasks_by_queue from `after` on; done tasks are the bulk of a
 *               queue that lives long, so the page fills at once;
 *   leased      tasks_leased, all leases of all queues, sorted: few (one
 *               per worker and batch), and the dashboard asks every refresh;
 *   queued      tasks_by_queue when most of the queue is queued, else
 *               tasks_ready a priority at a time (task_list_by_priority);
 *               past TASK_LIST_PRIORITIES distinct priorities, the queue's
 *               part of tasks_ready sorted (at most the other half); while
 *               the queue holds a closed session's tasks, a walk of
 *               tasks_ready past them (task_list_walked);
 *   failed, dead, cancelled   tasks_failed (written only on those states).
 * INDEXED BY says which: without statistics the planner takes tasks_by_queue
 * for any `queue = ?`, which for a rare state scans the whole queue. */
/* The distinct priorities of the queued tasks of queue ?1, highest first,
 * as table p(v) (a last row NULL), `limit` a LIMIT clause or "": one seek
 * into tasks_ready each (max() of a range of the index). */
#define TASK_PRIORITIES_SQL(limit)                                                                 \
  "WITH RECURSIVE p(v) AS (SELECT max(priority) FROM tasks INDEXED BY tasks_ready"                 \
  " WHERE queue = ?1 AND state = 0 UNION ALL SELECT (SELECT max(priority) FROM tasks"              \
  " INDEXED BY tasks_ready WHERE queue = ?1 AND state = 0 AND priority < p.v) FROM p"              \
  " WHERE p.v IS NOT NULL" limit ")"
/* The listing statements: all, leased, failed or later, queued through
 * tasks_ready sorted, queued or done through tasks_by_queue, queued through
 * tasks_ready a priority at a time (task_list_by_priority); each with a last
 * column that says whether a closed session left the row to the background
 * deletion (0 while store_sessions_closing is false: none can be).  The last
 * one sorts the ids alone, in a subquery that the join reads in order as a
 * co-routine (as lease.c's window: an ORDER BY outside would sort the page's
 * rows, payloads and all, again). */
#define TASK_LIST_SQL(closing)                                                                     \
  {                                                                                                \
    "SELECT " TASK_COLUMNS ", " closing " FROM tasks INDEXED BY tasks_by_queue"                    \
    " WHERE queue = ?1 AND id > ?2 ORDER BY id LIMIT ?3",                                          \
        "SELECT " TASK_COLUMNS ", " closing " FROM tasks INDEXED BY tasks_leased"                  \
        " WHERE state = 1 AND queue = ?1 AND id > ?2 ORDER BY id LIMIT ?3",                        \
        "SELECT " TASK_COLUMNS ", " closing " FROM tasks INDEXED BY tasks_failed"                  \
        " WHERE queue = ?1 AND id > ?2 AND state = ?4 AND state >= 3 ORDER BY id LIMIT ?3",        \
        "SELECT " TASK_COLUMNS ", " closing " FROM tasks INDEXED BY tasks_ready"                   \
        " WHERE queue = ?1 AND state = 0 AND id > ?2 ORDER BY id LIMIT ?3",                        \
        "SELECT " TASK_COLUMNS ", " closing " FROM tasks INDEXED BY tasks_by_queue"                \
        " WHERE queue = ?1 AND id > ?2 AND state = ?4 ORDER BY id LIMIT ?3",                       \
        TASK_PRIORITIES_SQL("") " SELECT " TASK_COLUMNS ", " closing " FROM (SELECT t.id AS wid"   \
                                " FROM p CROSS JOIN tasks AS t INDEXED BY tasks_ready"             \
                                " WHERE t.queue = ?1 AND t.state = 0 AND t.priority = p.v"         \
                                " AND t.id > ?2 ORDER BY t.id LIMIT ?3) AS w"                      \
                                " CROSS JOIN tasks ON tasks.id = w.wid"                            \
  }
static const char *const task_list_sql[2][6] = {TASK_LIST_SQL("0"),
                                                TASK_LIST_SQL(SESSION_CLOSING_TASKS_SQL)};
#define TASK_LIST_CLOSING_COLUMN 19
/* The most tasks left by closed sessions that a page of all tasks (or of
 * another state than queued) reads past (each an index seek into
 * session_trash): a few milliseconds. */
#define TASK_LIST_SKIP 10000
/* The most distinct priorities among a queue's queued tasks that a listing
 * of them reads one by one. */
#define TASK_LIST_PRIORITIES 16

/* Whether the queued tasks of `queue` have at most TASK_LIST_PRIORITIES
 * distinct priorities (false when that could not be read).  Then a page of
 * them in id order reads tasks_ready a priority at a time, each priority's
 * part by id from `after`, and SQLite stops reading a part once the page's
 * sorter is full and the ids it meets are beyond it: a page reads about
 * (page + tasks skipped) index entries a priority and the page's rows,
 * whatever the queue holds.  tasks_ready sorted whole reads every queued
 * task, and tasks_by_queue every task of the queue before the first queued
 * one: done tasks, the bulk of a long-lived queue. */
static bool task_list_by_priority(store_t *st, const char *queue) {
  sqlite3_stmt *s = store_stmt(st, TASK_PRIORITIES_SQL(" LIMIT ?2") " SELECT count(v) FROM p");
  if (s == NULL)
    return false;
  store_bind_text(s, 1, queue);
  sqlite3_bind_int(s, 2, TASK_LIST_PRIORITIES + 1);
  bool few = sqlite3_step(s) == SQLITE_ROW && sqlite3_column_int(s, 0) <= TASK_LIST_PRIORITIES;
  store_reset(s);
  return few;
}

static sqlite3_stmt *task_list_stmt(store_t *st, const char *queue, int state) {
  const char *const *sql = task_list_sql[store_sessions_closing(st)];
  if (state < 0)
    return store_stmt(st, sql[0]);
  if (state == TASK_LEASED)
    return store_stmt(st, sql[1]);
  if (state >= TASK_FAILED)
    return store_stmt(st, sql[2]);
  if (state != TASK_QUEUED)
    return store_stmt(st, sql[4]);
  /* When most of the queue is queued, tasks_by_queue fills a page at once.
   * Past TASK_LIST_PRIORITIES, tasks_ready sorted whole reads at most the
   * other half of the queue.  (A queue holding what closed sessions left is
   * listed by task_list_walked: the counts leave that out, and both indexes
   * hold it.) */
  int64_t by_state[TASK_STATE_COUNT], total = 0;
  fail_t ignored = {0};
  bool dense = false;
  if (counts_read(st, queue, by_state, &ignored) == MUSTER_OK) {
    for (int i = 0; i < TASK_STATE_COUNT; i++)
      total += by_state[i];
    dense = by_state[TASK_QUEUED] * 2 > total;
  }
  if (dense)
    return store_stmt(st, sql[4]);
  return store_stmt(st, task_list_by_priority(st, queue) ? sql[5] : sql[3]);
}

/* A page of the queued tasks of a queue walked past what closed sessions
 * left (leftover.h): the `cap` lowest ids above `after` met so far, as a
 * max-heap (ids[0] the highest of them). */
typedef struct {
  store_t *st;
  const char *queue;
  int64_t *ids;
  size_t n, cap;
} task_page_t;

/* Keeps `id` among the page's lowest ids: in while there is room, else in
 * place of the highest when below it. */
static void task_page_offer(task_page_t *p, int64_t id) {
  size_t at;
  if (p->n < p->cap) {
    for (at = p->n++; at > 0 && p->ids[(at - 1) / 2] < id; at = (at - 1) / 2)
      p->ids[at] = p->ids[(at - 1) / 2];
    p->ids[at] = id;
    return;
  }
  if (id >= p->ids[0])
    return;
  for (at = 0;;) { /* the new id sifts down from the top */
    size_t child = 2 * at + 1;
    if (child >= p->n)
      break;
    if (child + 1 < p->n && p->ids[child + 1] > p->ids[child])
      child++;
    if (p->ids[child] <= id)
      break;
    p->ids[at] = p->ids[child];
    at = child;
  }
  p->ids[at] = id;
}

/* A visit of the walk: the queued ids of `priority` from first to last
 * (index entries, and each row's session: none a closed session left),
 * those below the page's highest once it is full; the rest of the priority
 * is not wanted once they pass it. */
static muster_err_t task_page_visit(void *arg, int64_t priority, int64_t first, int64_t last,
                                    leftover_then_t *then, fail_t *f) {
  task_page_t *p = arg;
  int64_t below = p->n == p->cap ? p->ids[0] : INT64_MAX; /* ids from here on stay out */
  *then = LEFTOVER_NEXT_PRIORITY;
  if (first >= below)
    return MUSTER_OK;
  sqlite3_stmt *s = store_stmt(p->st, "SELECT id FROM tasks INDEXED BY tasks_ready"
                                      " WHERE queue = ?1 AND state = 0 AND priority = ?2"
                                      " AND id BETWEEN ?3 AND ?4 AND NOT " SESSION_CLOSING_TASKS_SQL
                                      " ORDER BY id LIMIT ?5");
  if (s == NULL)
    return store_fail(p->st, f, "task list");
  store_bind_text(s, 1, p->queue);
  sqlite3_bind_int64(s, 2, priority);
  sqlite3_bind_int64(s, 3, first);
  sqlite3_bind_int64(s, 4, last < below ? last : below - 1);
  sqlite3_bind_int64(s, 5, (int64_t)p->cap);
  int rc;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW)
    task_page_offer(p, sqlite3_column_int64(s, 0));
  store_reset(s);
  if (last < below && (p->n < p->cap || last < p->ids[0]))
    *then = LEFTOVER_ON; /* ids beyond the next run may still enter */
  return rc == SQLITE_DONE ? MUSTER_OK : store_fail(p->st, f, "task list");
}

static int task_id_cmp(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* Writes the page of p->ids sorted into `out`, read row by row, up to the
 * reply's budget of payload bytes (reply_budget.h): {"tasks", "next"}. */
static muster_err_t task_page_rows(task_page_t *p, int64_t limit, bool brief, jw_buf_t *out,
                                   fail_t *f) {
  qsort(p->ids, p->n, sizeof *p->ids, task_id_cmp);
  sqlite3_stmt *s = store_stmt(p->st, "SELECT " TASK_COLUMNS " FROM tasks WHERE id = ?1");
  if (s == NULL)
    return store_fail(p->st, f, "task list");
  task_page_text_t page;
  task_page_start(&page, out);
  size_t n = p->n < (size_t)limit ? p->n : (size_t)limit, i;
  for (i = 0; i < n; i++) {
    sqlite3_bind_int64(s, 1, p->ids[i]);
    bool fits = sqlite3_step(s) != SQLITE_ROW || task_page_add(&page, s, brief, false);
    store_reset(s);
    if (!fits)
      break; /* i > 0: the first task always fits */
  }
  bool more = i < n || p->n > (size_t)limit;
  return task_page_end(&page, more, more ? p->ids[i - 1] : 0, f);
}

/* Writes the page of queued tasks of `queue` above `after` into `out` when
 * the queue holds runs of what closed sessions left: a walk past them
 * (leftover.h), an index seek per run and per priority, plus up to a page
 * of ids per stretch between them (fewer once the page is full), then the
 * page's rows.  Every page is full, whatever was left before it, at any
 * number of priorities.  Writes nothing, *walked false, when the queue
 * holds none. */
static muster_err_t task_list_walked(store_t *st, const char *queue, int64_t after, int64_t limit,
                                     bool brief, jw_buf_t *out, bool *walked, fail_t *f) {
  task_page_t p = {st, queue, calloc((size_t)limit + 1, sizeof(int64_t)), 0, (size_t)limit + 1};
  if (p.ids == NULL)
    return fail_set(f, MUSTER_NOMEM, "out of memory");
  if (leftover_walk(st, queue, after, task_page_visit, &p, walked, f) == MUSTER_OK && *walked)
    task_page_rows(&p, limit, brief, out, f);
  free(p.ids);
  return f->code;
}

/* Writes the page the bound listing statement `s` reads (reset after) into
 * `out`: {"tasks", "next"}.  It ends after `limit` tasks, after
 * TASK_LIST_SKIP rows that a closed session left, or before a task whose
 * payload and result would take the page's past the budget of one reply
 * (reply_budget.h), with a `next` after the last row read before; with
 * `paged` false (an order that has one page) `next` is null. */
static muster_err_t task_page_read(sqlite3_stmt *s, int64_t limit, bool brief, bool paged,
                                   jw_buf_t *out, fail_t *f) {
  task_page_text_t page;
  task_page_start(&page, out);
  int64_t last = 0, skipped = 0;
  bool more = false;
  while (sqlite3_step(s) == SQLITE_ROW) {
    bool left = sqlite3_column_int(s, TASK_LIST_CLOSING_COLUMN);
    if ((int64_t)page.count == limit || skipped == TASK_LIST_SKIP ||
        !task_page_add(&page, s, brief, left)) {
      more = true;
      break;
    }
    last = sqlite3_column_int64(s, 0);
    skipped += left;
  }
  store_reset(s);
  return task_page_end(&page, paged && more, last, f);
}

muster_err_t task_list_text(store_t *st, const char *queue, int state, int64_t after, int64_t limit,
                            bool brief, jw_buf_t *out, fail_t *f) {
  if (state == TASK_QUEUED && store_sessions_closing(st)) {
    bool walked = false;
    if (task_list_walked(st, queue, after, limit, brief, out, &walked, f) || walked)
      return f->code;
  }
  sqlite3_stmt *s = task_list_stmt(st, queue, state);
  if (s == NULL)
    return store_fail(st, f, "task list");
  /* A closed session's tasks waiting for their deletion are skipped, at
   * most TASK_LIST_SKIP of them a page: a page that skipped that many ends
   * there, short or empty, with a `next` past them. */
  store_bind_text(s, 1, queue);
  sqlite3_bind_int64(s, 2, after);
  /* One more: is there a next page?  No task can be skipped (nor its
   * closing column be set) while no session is closing. */
  sqlite3_bind_int64(s, 3, limit + 1 + (store_sessions_closing(st) ? TASK_LIST_SKIP : 0));
  if (sqlite3_bind_parameter_count(s) >= 4)
    sqlite3_bind_int(s, 4, state);
  return task_page_read(s, limit, brief, true, out, f);
}

/* The failed or dead tasks (state ?3) of queue ?1, the one that got there
 * last first, ?2 rows: the index tasks_ended (schema version 25) read
 * backwards from its end.  Ties of updated_ms go by id, the index's last
 * column, so the order is one and no sorter runs. */
#define TASK_RECENT_SQL(closing)                                                                   \
  "SELECT " TASK_COLUMNS ", " closing " FROM tasks INDEXED BY tasks_ended"                         \
  " WHERE queue = ?1 AND state = ?3 AND state IN (3, 4) ORDER BY updated_ms DESC, id DESC LIMIT "  \
  "?2"
static const char *const task_recent_sql[2] = {TASK_RECENT_SQL("0"),
                                               TASK_RECENT_SQL(SESSION_CLOSING_TASKS_SQL)};

muster_err_t task_list_recent_text(store_t *st, const char *queue, int state, int64_t limit,
                                   bool brief, jw_buf_t *out, fail_t *f) {
  assert(state == TASK_FAILED || state == TASK_DEAD);
  bool closing = store_sessions_closing(st);
  sqlite3_stmt *s = store_stmt(st, task_recent_sql[closing]);
  if (s == NULL)
    return store_fail(st, f, "task list");
  store_bind_text(s, 1, queue);
  sqlite3_bind_int64(s, 2, limit + 1 + (closing ? TASK_LIST_SKIP : 0));
  sqlite3_bind_int(s, 3, state);
  return task_page_read(s, limit, brief, false, out, f);
}

json_t *task_list_as(store_t *st, const char *queue, int state, int64_t after, int64_t limit,
                     bool brief, fail_t *f) {
  jw_buf_t text = {0};
  json_t *page = NULL;
  if (task_list_text(st, queue, state, after, limit, brief, &text, f) == MUSTER_OK &&
      (page = jw_raw(text.buf, text.len)) == NULL)
    fail_set(f, MUSTER_NOMEM, "out of memory");
  jw_buf_free(&text);
  return page;
}

json_t *task_list(store_t *st, const char *queue, int state, int64_t after, int64_t limit,
                  fail_t *f) {
  return task_list_as(st, queue, state, after, limit, false, f);
}

json_t *task_requeue(store_t *st, int64_t id, fail_t *f) {
  sqlite3_stmt *s = task_row(st, id, f);
  if (s == NULL)
    return NULL;
  int from = sqlite3_column_int(s, 2);
  char queue[NAME_MAX_LEN + 1];
  snprintf(queue, sizeof queue, "%s", (const char *)sqlite3_column_text(s, 1));
  store_reset(s);
  if (from != TASK_DEAD && from != TASK_FAILED) {
    fail_set(f, MUSTER_INVALID_STATE, "task %lld is %s; only dead or failed tasks can be requeued",
             (long long)id, task_state_name(from));
    return NULL;
  }
  s = store_stmt(st, "UPDATE tasks SET state = 0, attempts = 0, flags = 0,"
                     " error = NULL, run_at_ms = ?2, updated_ms = ?2 WHERE id = ?1");
  if (s == NULL) {
    store_fail(st, f, "requeue");
    return NULL;
  }
  sqlite3_bind_int64(s, 1, id);
  sqlite3_bind_int64(s, 2, now_ms());
  if (store_step_done(st, s, f) || counts_move(st, queue, from, TASK_QUEUED, 1, f))
    return NULL;
  store_notify_ready(st, queue);
  return task_get(st, id, f);
}
