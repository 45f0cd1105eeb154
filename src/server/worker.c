/*
 * worker.c — worker registry.
 *
 * Workers are never deleted: a gone worker keeps its counters so the
 * leaderboard (totals per nickname) stays whole.  Display names are made from
 * the id, so they are unique and stable without another table.
 */
#include "worker.h"
#include "jv.h"
#include "lease.h"
#include "log.h"
#include "metrics.h"
#include "worker_ended.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const name_adjectives[] = {
    "brisk", "calm",  "deft",   "eager", "fond",  "glad", "hardy",  "jolly", "keen",  "lucid",
    "merry", "noble", "plucky", "quick", "rapid", "sly",  "sturdy", "tidy",  "vivid", "witty"};
static const char *const name_animals[] = {
    "otter", "heron", "lynx",  "badger", "falcon", "marten", "ibex",   "koala", "lemur", "newt",
    "orca",  "panda", "quail", "raven",  "stoat",  "tapir",  "walrus", "yak",   "zebra", "gecko"};
#define N_ADJ (sizeof name_adjectives / sizeof name_adjectives[0])
#define N_ANIMAL (sizeof name_animals / sizeof name_animals[0])

static void worker_make_name(int64_t id, char *out, size_t size) {
  uint64_t h = (uint64_t)id * 0x9E3779B97F4A7C15ull;
  snprintf(out, size, "%s-%s-%lld", name_adjectives[(h >> 32) % N_ADJ],
           name_animals[(h >> 16) % N_ANIMAL], (long long)id);
}

/* Validates body["queues"] (array of names) and body["labels"] (object) and
 * returns them encoded (caller frees), NULL for absent. */
static muster_err_t worker_extras(const json_t *body, char **queues, char **labels, fail_t *f) {
  const json_t *q = json_object_get(body, "queues"), *l = json_object_get(body, "labels");
  *queues = *labels = NULL;
  if (q && !json_is_null(q)) {
    if (!json_is_array(q))
      return fail_set(f, MUSTER_INVALID, "queues: expected an array of queue names");
    for (size_t i = 0; i < json_array_size(q); i++) {
      const char *name = json_string_value(json_array_get(q, i));
      if (name == NULL)
        return fail_set(f, MUSTER_INVALID, "queues[%zu]: expected a queue name (a string)", i);
      if (!name_is_valid(name))
        return fail_set(f, MUSTER_INVALID, "queues[%zu]: '%.140s' is invalid: %s", i, name,
                        name_rule_text(name));
    }
    *queues = jv_encode(q);
  }
  if (l && !json_is_null(l)) {
    if (!json_is_object(l))
      return fail_set(f, MUSTER_INVALID, "labels: expected an object");
    *labels = jv_encode(l);
  }
  return MUSTER_OK;
}

/* The active worker that `instance` registered (a registration sent again
 * after its reply was lost): its reply with "repeated": true, else NULL. */
static json_t *worker_registered(store_t *st, const char *instance, fail_t *f) {
  if (instance == NULL)
    return NULL;
  sqlite3_stmt *s = store_stmt(st, "SELECT id, name, nickname, timeout_ms FROM workers"
                                   " WHERE instance = ?1 AND state = 0");
  if (s == NULL) {
    store_fail(st, f, "worker register");
    return NULL;
  }
  store_bind_text(s, 1, instance);
  json_t *out = NULL;
  if (sqlite3_step(s) == SQLITE_ROW)
    out = json_pack("{s:I, s:s, s:s, s:I, s:b}", "id", (json_int_t)sqlite3_column_int64(s, 0),
                    "name", (const char *)sqlite3_column_text(s, 1), "nickname",
                    (const char *)sqlite3_column_text(s, 2), "timeout_ms",
                    (json_int_t)sqlite3_column_int64(s, 3), "repeated", 1);
  store_reset(s);
  return out;
}

/* What a registration gives; queues and labels are encoded JSON or NULL. */
typedef struct {
  const char *nickname, *node, *instance;
  char *queues, *labels;
  int64_t timeout_ms;
} worker_spec_t;

/* Stores a new worker and names it after its id; returns the reply.  The
 * id is the highest so far plus one, as SQLite would choose it, or above
 * the floor of a restore (store_restore.c): the head the backup was taken
 * from may have registered workers that still use their ids.  Workers are
 * never deleted, so the highest is never given twice. */
static json_t *worker_insert(store_t *st, const worker_spec_t *w, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "INSERT INTO workers(id, name, nickname, node, queues, labels,"
                                   " state, last_seen_ms, created_ms, timeout_ms, instance)"
                                   " VALUES((SELECT max(coalesce(max(id), 0), " STORE_ID_FLOOR_SQL
                                   ") + 1 FROM workers), '', ?1, ?2, ?3, ?4, 0, ?5, ?5, ?6, ?7)");
  if (s == NULL) {
    store_fail(st, f, "worker register");
    return NULL;
  }
  store_bind_text(s, 1, w->nickname);
  store_bind_text(s, 2, w->node);
  store_bind_text(s, 3, w->queues);
  store_bind_text(s, 4, w->labels);
  sqlite3_bind_int64(s, 5, now_ms());
  sqlite3_bind_int64(s, 6, w->timeout_ms);
  store_bind_text(s, 7, w->instance);
  if (store_step_done(st, s, f))
    return NULL;
  int64_t id = sqlite3_last_insert_rowid(store_db(st));
  char name[96];
  worker_make_name(id, name, sizeof name);
  s = store_stmt(st, "UPDATE workers SET name = ?2 WHERE id = ?1");
  sqlite3_bind_int64(s, 1, id);
  store_bind_text(s, 2, name);
  if (store_step_done(st, s, f))
    return NULL;
  return json_pack("{s:I, s:s, s:s, s:I}", "id", (json_int_t)id, "name", name, "nickname",
                   w->nickname, "timeout_ms", (json_int_t)w->timeout_ms);
}

json_t *worker_register(store_t *st, const json_t *body, int64_t default_timeout_ms, fail_t *f) {
  static const char *const allowed[] = {"nickname",   "queues",   "node", "labels",
                                        "timeout_ms", "instance", NULL};
  worker_spec_t w = {0};
  if (jv_only(body, "", allowed, f) ||
      jv_str(body, "nickname", "", "anonymous", WORKER_MAX_NICKNAME, &w.nickname, f) ||
      jv_str(body, "node", "", NULL, 256, &w.node, f) ||
      jv_int(body, "timeout_ms", "", default_timeout_ms, 100, 7LL * 24 * 3600 * 1000, &w.timeout_ms,
             f) ||
      jv_name(body, "instance", "", &w.instance, f))
    return NULL;
  json_t *out = worker_registered(st, w.instance, f);
  if (out != NULL || f->code || worker_ended_check(st, w.instance, now_ms(), f) ||
      worker_extras(body, &w.queues, &w.labels, f))
    return out;
  if (w.nickname[0] == '\0')
    w.nickname = "anonymous";
  out = worker_insert(st, &w, f);
  free(w.queues);
  free(w.labels);
  return out;
}

/* Why a worker went, for the message of a call it makes after (the words
 * between "is gone (" and ")", which clients look for): from its gone_reason,
 * or NULL for one that went before the head kept it. */
static const char *worker_gone_phrase(const char *reason) {
  static const char *const phrases[][2] = {
      {"bye", "a goodbye was sent for it"},
      {"timeout", "it timed out: no sign of life reached the head for its timeout"},
      {"crashed", "its node agent reported that its process died"},
      {"node_left", "its node left"},
      {"node_timeout", "its node timed out"},
      {"node_restarted", "its node was registered again by another agent process"},
  };
  for (size_t i = 0; reason && i < sizeof phrases / sizeof phrases[0]; i++)
    if (strcmp(reason, phrases[i][0]) == 0)
      return phrases[i][1];
  return "it said bye or timed out";
}

muster_err_t worker_check_active(store_t *st, int64_t id, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT state, gone_reason FROM workers WHERE id = ?1");
  if (s == NULL)
    return store_fail(st, f, "worker lookup");
  sqlite3_bind_int64(s, 1, id);
  int rc = sqlite3_step(s);
  int state = rc == SQLITE_ROW ? sqlite3_column_int(s, 0) : -1;
  if (state == WORKER_GONE)
    fail_set(f, MUSTER_WORKER_NOT_FOUND, "worker %lld is gone (%s); register again", (long long)id,
             worker_gone_phrase((const char *)sqlite3_column_text(s, 1)));
  store_reset(s);
  if (state == WORKER_ACTIVE)
    return MUSTER_OK;
  if (state == WORKER_GONE)
    return f->code;
  return fail_set(f, MUSTER_WORKER_NOT_FOUND, "worker %lld does not exist", (long long)id);
}

json_t *worker_heartbeat(store_t *st, int64_t id, const json_t *body, fail_t *f) {
  static const char *const allowed[] = {"progress", NULL};
  const char *progress;
  if (jv_only(body, "", allowed, f) ||
      jv_str(body, "progress", "", NULL, WORKER_MAX_PROGRESS, &progress, f) ||
      worker_check_active(st, id, f))
    return NULL;
  sqlite3_stmt *s = store_stmt(st, "UPDATE workers SET last_seen_ms = ?2,"
                                   " progress = coalesce(?3, progress) WHERE id = ?1");
  if (s == NULL) {
    store_fail(st, f, "heartbeat");
    return NULL;
  }
  sqlite3_bind_int64(s, 1, id);
  sqlite3_bind_int64(s, 2, now_ms());
  store_bind_text(s, 3, progress);
  if (store_step_done(st, s, f))
    return NULL;
  return json_pack("{s:I, s:s}", "id", (json_int_t)id, "state", "active");
}

const char *worker_gone_name(worker_gone_t why) {
  static const char *const names[] = {
      [WORKER_GONE_BYE] = "bye",
      [WORKER_GONE_TIMEOUT] = "timeout",
      [WORKER_GONE_CRASHED] = "crashed",
      [WORKER_GONE_NODE_LEFT] = "node_left",
      [WORKER_GONE_NODE_TIMEOUT] = "node_timeout",
      [WORKER_GONE_NODE_RESTARTED] = "node_restarted",
  };
  return names[why];
}

/* Marks worker `id` gone for `why`, now.  A worker that said bye left
 * cleanly, so its last progress ("running task 83") no longer describes it
 * and is cleared, while one that timed out or crashed keeps it (what it was
 * doing when it went silent). */
static muster_err_t worker_mark_gone(store_t *st, int64_t id, worker_gone_t why, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "UPDATE workers SET state = 1, gone_reason = ?3,"
                                   " gone_at_ms = ?4,"
                                   " progress = CASE WHEN ?2 THEN NULL ELSE progress END"
                                   " WHERE id = ?1");
  if (s == NULL)
    return store_fail(st, f, "worker update");
  sqlite3_bind_int64(s, 1, id);
  sqlite3_bind_int(s, 2, why == WORKER_GONE_BYE);
  store_bind_text(s, 3, worker_gone_name(why));
  sqlite3_bind_int64(s, 4, now_ms());
  return store_step_done(st, s, f);
}

json_t *worker_bye(store_t *st, int64_t id, fail_t *f) {
  return worker_leave(st, id, false, f);
}

json_t *worker_leave(store_t *st, int64_t id, bool crashed, fail_t *f) {
  if (worker_check_active(st, id, f) ||
      worker_mark_gone(st, id, crashed ? WORKER_GONE_CRASHED : WORKER_GONE_BYE, f))
    return NULL;
  /* A crash may be the task's doing: the attempt counts, so a task that
   * kills every worker it runs on goes dead after max_attempts. */
  int64_t released =
      crashed ? lease_lapse_worker(st, id, "worker crashed") : lease_end_worker(st, id, false);
  if (released < 0) {
    store_fail(st, f, "releasing leases");
    return NULL;
  }
  return json_pack("{s:I, s:I}", "id", (json_int_t)id, "released", (json_int_t)released);
}

/* The active worker that `instance` registered: its id, 0 when none (at
 * most one is active: a registration sent again finds it), -1 after a store
 * failure in *f.  The partial index workers_by_instance serves it. */
static int64_t worker_of_instance(store_t *st, const char *instance, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT id FROM workers WHERE instance = ?1 AND state = 0");
  if (s == NULL) {
    store_fail(st, f, "worker lookup");
    return -1;
  }
  store_bind_text(s, 1, instance);
  int64_t id = sqlite3_step(s) == SQLITE_ROW ? sqlite3_column_int64(s, 0) : 0;
  store_reset(s);
  return id;
}

json_t *worker_leave_instance(store_t *st, const char *instance, bool crashed, fail_t *f) {
  int64_t id = worker_of_instance(st, instance, f);
  if (id < 0 || worker_ended_record(st, instance, crashed, now_ms(), f))
    return NULL;
  json_t *out = id > 0 ? worker_leave(st, id, crashed, f)
                       : json_pack("{s:n, s:I}", "id", "released", (json_int_t)0);
  if (out != NULL)
    json_object_set_new(out, "instance", json_string(instance));
  return out;
}

muster_err_t worker_count(store_t *st, int64_t id, worker_counter_t which, int64_t n, fail_t *f) {
  static const char *const sql[] = {
      [WORKER_COMPLETED] = "UPDATE workers SET completed = completed + ?2 WHERE id = ?1",
      [WORKER_FAILED] = "UPDATE workers SET failed = failed + ?2 WHERE id = ?1",
      [WORKER_FLAGGED] = "UPDATE workers SET flagged = flagged + ?2 WHERE id = ?1"};
  if (id <= 0 || n == 0)
    return MUSTER_OK;
  sqlite3_stmt *s = store_stmt(st, sql[which]);
  if (s == NULL)
    return store_fail(st, f, "worker counter");
  sqlite3_bind_int64(s, 1, id);
  sqlite3_bind_int64(s, 2, n);
  return store_step_done(st, s, f);
}

/* A worker's columns, then its lease count: no index by worker exists (store.c,
 * migration 8), so one worker's count is a scan of tasks_leased (all leases,
 * the worker in the index), and the list counts every worker's leases in one
 * such scan, grouped, rather than one scan per worker. */
#define WORKER_COLUMNS                                                                             \
  "w.id, w.name, w.nickname, w.node, w.queues, w.labels, w.state, w.progress, w.last_seen_ms,"     \
  " w.created_ms, w.timeout_ms, w.completed, w.failed, w.flagged, w.gone_reason, w.gone_at_ms,"
#define WORKER_LEASES_ONE                                                                          \
  " (SELECT count(*) FROM tasks t INDEXED BY tasks_leased WHERE t.state = 1 AND t.worker = w.id)"
#define WORKER_LEASES_ALL                                                                          \
  " LEFT JOIN (SELECT worker, count(*) AS n FROM tasks INDEXED BY tasks_leased"                    \
  " WHERE state = 1 GROUP BY worker) l ON l.worker = w.id"

static json_t *text_json(sqlite3_stmt *s, int col, bool decode) {
  const unsigned char *t = sqlite3_column_text(s, col);
  if (t == NULL)
    return json_null();
  return decode ? jv_decode((const char *)t) : json_string((const char *)t);
}

/* A time column as JSON: null when NULL. */
static json_t *ms_json(sqlite3_stmt *s, int col) {
  if (sqlite3_column_type(s, col) == SQLITE_NULL)
    return json_null();
  return json_integer((json_int_t)sqlite3_column_int64(s, col));
}

/* The Worker object of a row of WORKER_COLUMNS and its lease count.  An
 * active worker's gone_reason and gone_at_ms are null; a gone one's
 * gone_at_ms is null when it went before the head kept it (its reason is
 * "unknown" then: schema version 24, store_schema.c). */
static json_t *worker_from_row(sqlite3_stmt *s) {
  return json_pack(
      "{s:I, s:s, s:s, s:o, s:o, s:o, s:s, s:o, s:I, s:I, s:I, s:I, s:I, s:I, s:o, s:o, s:I}", "id",
      (json_int_t)sqlite3_column_int64(s, 0), "name", (const char *)sqlite3_column_text(s, 1),
      "nickname", (const char *)sqlite3_column_text(s, 2), "node", text_json(s, 3, false), "queues",
      text_json(s, 4, true), "labels", text_json(s, 5, true), "state",
      sqlite3_column_int(s, 6) == WORKER_ACTIVE ? "active" : "gone", "progress",
      text_json(s, 7, false), "last_seen_ms", (json_int_t)sqlite3_column_int64(s, 8), "created_ms",
      (json_int_t)sqlite3_column_int64(s, 9), "timeout_ms", (json_int_t)sqlite3_column_int64(s, 10),
      "completed", (json_int_t)sqlite3_column_int64(s, 11), "failed",
      (json_int_t)sqlite3_column_int64(s, 12), "flagged", (json_int_t)sqlite3_column_int64(s, 13),
      "gone_reason", text_json(s, 14, false), "gone_at_ms", ms_json(s, 15), "leases",
      (json_int_t)sqlite3_column_int64(s, 16));
}

json_t *worker_get(store_t *st, int64_t id, fail_t *f) {
  sqlite3_stmt *s =
      store_stmt(st, "SELECT " WORKER_COLUMNS WORKER_LEASES_ONE " FROM workers w WHERE w.id = ?1");
  if (s == NULL) {
    store_fail(st, f, "worker lookup");
    return NULL;
  }
  sqlite3_bind_int64(s, 1, id);
  json_t *w = sqlite3_step(s) == SQLITE_ROW ? worker_from_row(s) : NULL;
  store_reset(s);
  if (w == NULL)
    fail_set(f, MUSTER_WORKER_NOT_FOUND, "worker %lld does not exist", (long long)id);
  return w;
}

json_t *worker_list(store_t *st, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT " WORKER_COLUMNS " coalesce(l.n, 0)"
                                   " FROM workers w" WORKER_LEASES_ALL " ORDER BY w.id");
  if (s == NULL) {
    store_fail(st, f, "worker list");
    return NULL;
  }
  json_t *list = json_array();
  while (sqlite3_step(s) == SQLITE_ROW)
    json_array_append_new(list, worker_from_row(s));
  store_reset(s);
  return json_pack("{s:o}", "workers", list);
}

json_t *worker_leaderboard(store_t *st, fail_t *f) {
  /* Workers count when they are active or did something: a gone worker
   * that did nothing may be deleted (compat_bounds.c), and the board must
   * not change then. */
  sqlite3_stmt *s = store_stmt(st, "SELECT nickname, sum(completed), sum(failed), sum(flagged),"
                                   " sum(state = 0 OR completed + failed + flagged > 0)"
                                   " FROM workers GROUP BY nickname"
                                   " HAVING sum(state = 0 OR completed + failed + flagged > 0) > 0"
                                   " ORDER BY sum(completed) DESC, nickname");
  if (s == NULL) {
    store_fail(st, f, "leaderboard");
    return NULL;
  }
  json_t *list = json_array();
  while (sqlite3_step(s) == SQLITE_ROW)
    json_array_append_new(list, json_pack("{s:s, s:I, s:I, s:I, s:I}", "nickname",
                                          (const char *)sqlite3_column_text(s, 0), "completed",
                                          (json_int_t)sqlite3_column_int64(s, 1), "failed",
                                          (json_int_t)sqlite3_column_int64(s, 2), "flagged",
                                          (json_int_t)sqlite3_column_int64(s, 3), "workers",
                                          (json_int_t)sqlite3_column_int64(s, 4)));
  store_reset(s);
  return json_pack("{s:o}", "leaderboard", list);
}

int64_t worker_expire_due(store_t *st, int64_t now) {
  sqlite3_stmt *s =
      store_stmt(st, "SELECT id FROM workers WHERE state = 0 AND" STORE_SILENT_SQL " LIMIT 256");
  if (s == NULL)
    return -1;
  int64_t ids[256];
  size_t n = 0;
  sqlite3_bind_int64(s, 1, now);
  sqlite3_bind_int64(s, 2, store_heard_since_ms(st));
  while (n < 256 && sqlite3_step(s) == SQLITE_ROW)
    ids[n++] = sqlite3_column_int64(s, 0);
  store_reset(s);
  for (size_t i = 0; i < n; i++) {
    fail_t f = {0};
    if (worker_mark_gone(st, ids[i], WORKER_GONE_TIMEOUT, &f) ||
        lease_end_worker(st, ids[i], true) < 0)
      return -1;
    metrics_worker_timeout();
    log_msg(LOG_INFO, "worker %lld timed out; its leases were returned", (long long)ids[i]);
  }
  return (int64_t)n;
}

bool worker_any_due(store_t *st, int64_t now) {
  return store_due(st, "SELECT 1 FROM workers WHERE state = 0 AND" STORE_SILENT_SQL " LIMIT 1",
                   now);
}
