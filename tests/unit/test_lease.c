/*
 * test_lease.c — unit tests of the head's queue, task and lease logic against
 * an in-memory store: no HTTP, no processes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>
#include <unistd.h>

#include "server/counts.h"
#include "server/jw.h"
#include "server/lease.h"
#include "server/log.h"
#include "server/queue.h"
#include "server/task.h"
#include "server/worker.h"
#include "store_fixture.h"

static int64_t put(const char *queue, const char *task_json) {
  char text[512];
  snprintf(text, sizeof text, "{\"tasks\": [%s]}", task_json);
  json_t *body = json_loads(text, JSON_ALLOW_NUL, NULL);
  fail_t f = {0};
  json_t *out = task_put(st, queue, body, 1 << 20, &f);
  if (out == NULL)
    fail_msg("put %s: %s", task_json, f.message);
  json_t *tree = reply_tree(out); /* "tasks" is a raw node */
  int64_t id = jint(json_array_get(json_object_get(tree, "tasks"), 0), "id");
  json_decref(tree);
  json_decref(out);
  json_decref(body);
  return id;
}

/* Applies a lease op to a one-element batch; returns the error code. */
static muster_err_t apply(lease_op_t op, int64_t task, int64_t token, const char *extra) {
  char text[512];
  snprintf(text, sizeof text, "{\"leases\": [{\"task\": %lld, \"token\": %lld%s}]}",
           (long long)task, (long long)token, extra ? extra : "");
  json_t *body = json_loads(text, 0, NULL);
  fail_t f = {0};
  json_t *out = lease_apply(st, op, body, 1 << 20, &f);
  json_decref(out);
  json_decref(body);
  return out ? MUSTER_OK : f.code;
}

static const char *state_of(int64_t id) {
  fail_t f = {0};
  json_t *task = tree_of(task_get(st, id, &f));
  assert_non_null(task);
  static char state[32];
  snprintf(state, sizeof state, "%s", json_string_value(json_object_get(task, "state")));
  json_decref(task);
  return state;
}

static void test_queue_settings(void **unused) {
  make_queue("q", "{\"lease_ms\": 500}");
  queue_t q;
  fail_t f = {0};
  assert_int_equal(queue_load(st, "q", &q, &f), MUSTER_OK);
  assert_int_equal(q.lease_ms, 500);
  assert_int_equal(q.max_attempts, QUEUE_DEFAULT_MAX_ATTEMPTS);
  bool created = true;
  json_t *bad = json_loads("{\"max_attempts\": 0}", 0, NULL);
  assert_int_equal(queue_put(st, "q", bad, &created, &f), MUSTER_INVALID);
  assert_non_null(strstr(f.message, "max_attempts"));
  json_decref(bad);
  json_t *next = json_loads("{\"next\": \"missing\"}", 0, NULL);
  assert_int_equal(queue_put(st, "q", next, &created, &f), MUSTER_QUEUE_NOT_FOUND);
  json_decref(next);
  assert_int_equal(queue_put(st, "bad name", NULL, &created, &f), MUSTER_NAME_INVALID);
  assert_int_equal(queue_load(st, "q", &q, &f), MUSTER_OK);
  assert_int_equal(q.max_attempts, QUEUE_DEFAULT_MAX_ATTEMPTS); /* unchanged by the refusal */
}

static void test_backoff(void **unused) {
  queue_t q = {.backoff_ms = 100, .backoff_max_ms = 1000};
  assert_int_equal(queue_backoff_ms(&q, 1), 100);
  assert_int_equal(queue_backoff_ms(&q, 2), 200);
  assert_int_equal(queue_backoff_ms(&q, 4), 800);
  assert_int_equal(queue_backoff_ms(&q, 5), 1000);
  assert_int_equal(queue_backoff_ms(&q, 60), 1000);
}

static void test_lease_order_and_keys(void **unused) {
  make_queue("q", "{}");
  int64_t low = put("q", "{\"payload\": 1}");
  int64_t high = put("q", "{\"payload\": 2, \"priority\": 9}");
  int64_t low2 = put("q", "{\"payload\": 3, \"key\": \"k\"}");
  assert_int_equal(put("q", "{\"payload\": 4, \"key\": \"k\"}"), low2); /* idempotent */
  put("q", "{\"payload\": 5, \"delay_ms\": 100000}");                   /* not ready */
  json_t *leases = fixture_lease("q", 10);
  assert_int_equal(json_array_size(leases), 3);
  assert_int_equal(jint(json_array_get(leases, 0), "task"), high);
  assert_int_equal(jint(json_array_get(leases, 1), "task"), low);
  assert_int_equal(jint(json_array_get(leases, 2), "task"), low2);
  /* Fencing tokens strictly increase. */
  assert_true(jint(json_array_get(leases, 1), "token") > jint(json_array_get(leases, 0), "token"));
  json_decref(leases);
}

/* A batch is leased with one statement (lease.c, lease_batch): each task
 * gets its own token, increasing in lease order, its attempt counted once;
 * another task's token of the same batch is refused. */
static void test_batch_tokens(void **unused) {
  make_queue("q", "{}");
  int64_t ids[5];
  for (int i = 0; i < 5; i++)
    ids[i] = put("q", "{\"payload\": 1}");
  json_t *l = fixture_lease("q", 5);
  assert_int_equal(json_array_size(l), 5);
  for (int i = 0; i < 5; i++) {
    json_t *x = json_array_get(l, i);
    assert_int_equal(jint(x, "task"), ids[i]);
    assert_int_equal(jint(x, "attempt"), 1);
    if (i > 0)
      assert_true(jint(x, "token") > jint(json_array_get(l, i - 1), "token"));
    assert_int_equal(jint(x, "deadline_ms"), jint(json_array_get(l, 0), "deadline_ms"));
  }
  int64_t t0 = jint(json_array_get(l, 0), "token"), t1 = jint(json_array_get(l, 1), "token");
  assert_int_equal(apply(LEASE_COMPLETE, ids[0], t1, NULL), MUSTER_LEASE_LOST);
  assert_int_equal(apply(LEASE_COMPLETE, ids[1], t0, NULL), MUSTER_LEASE_LOST);
  for (int i = 0; i < 5; i++) {
    assert_string_equal(state_of(ids[i]), "leased");
    assert_int_equal(apply(LEASE_RELEASE, ids[i], jint(json_array_get(l, i), "token"), NULL),
                     MUSTER_OK);
  }
  json_decref(l);
  /* Released: the attempt given back; the next lease is attempt 1 again. */
  l = fixture_lease("q", 5);
  assert_int_equal(jint(json_array_get(l, 4), "attempt"), 1);
  assert_true(jint(json_array_get(l, 0), "token") > t0 + 4);
  json_decref(l);
}

/* A batch leased in one statement: the task at position i of the reply has
 * token base + i stored, also when the lease order (priority first) is not
 * the order of the ids. */
static void test_batch_tokens_by_priority(void **unused) {
  make_queue("q", "{}");
  static const int priorities[6] = {1, 5, 3, 5, 2, 4};
  static const int order[6] = {1, 3, 5, 2, 4, 0}; /* by priority, then id */
  int64_t ids[6];
  for (int i = 0; i < 6; i++) {
    char task[64];
    snprintf(task, sizeof task, "{\"payload\": %d, \"priority\": %d}", i, priorities[i]);
    ids[i] = put("q", task);
  }
  json_t *l = fixture_lease("q", 6);
  assert_int_equal(json_array_size(l), 6);
  int64_t base = jint(json_array_get(l, 0), "token");
  sqlite3_stmt *s = store_stmt(st, "SELECT token FROM tasks WHERE id = ?1");
  assert_non_null(s);
  for (int i = 0; i < 6; i++) {
    json_t *x = json_array_get(l, i);
    assert_int_equal(jint(x, "task"), ids[order[i]]);
    assert_int_equal(jint(x, "token"), base + i);
    sqlite3_bind_int64(s, 1, ids[order[i]]);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    assert_int_equal(sqlite3_column_int64(s, 0), base + i);
    store_reset(s);
  }
  json_decref(l);
}

/* The token stored for task `id` (0: none). */
static int64_t token_of(int64_t id) {
  sqlite3_stmt *s = store_stmt(st, "SELECT coalesce(token, 0) FROM tasks WHERE id = ?1");
  assert_non_null(s);
  sqlite3_bind_int64(s, 1, id);
  assert_int_equal(sqlite3_step(s), SQLITE_ROW);
  int64_t token = sqlite3_column_int64(s, 0);
  store_reset(s);
  return token;
}

/* Completes the tasks ids[0..n) holding `tokens` in one request, result i. */
static muster_err_t complete_many(const int64_t *ids, const int64_t *tokens, size_t n) {
  char text[1024];
  size_t len = (size_t)snprintf(text, sizeof text, "{\"leases\": [");
  for (size_t i = 0; i < n; i++)
    len += (size_t)snprintf(text + len, sizeof text - len,
                            "%s{\"task\": %lld, \"token\": %lld, \"result\": %zu}", i ? ", " : "",
                            (long long)ids[i], (long long)tokens[i], i);
  snprintf(text + len, sizeof text - len, "]}");
  json_t *body = json_loads(text, 0, NULL);
  fail_t f = {0};
  json_t *out = lease_apply(st, LEASE_COMPLETE, body, 1 << 20, &f);
  json_decref(out);
  json_decref(body);
  return out ? MUSTER_OK : f.code;
}

/* A batch's rows are updated as a range of ids when its ids are consecutive
 * (a queue leased in the order it was filled) and as a list otherwise: either
 * way exactly the batch's rows change, the neighbours in the table do not. */
static void test_batch_rows_range_and_list(void **unused) {
  make_queue("a", "{}");
  make_queue("b", "{}");
  int64_t ids[6], other[4];
  for (int i = 0; i < 6; i++)
    ids[i] = put("a", "{\"payload\": 1}");
  /* a's ids 0..5 are consecutive; then a and b alternate. */
  int64_t mixed[4];
  for (int i = 0; i < 4; i++) {
    mixed[i] = put("a", "{\"payload\": 2}");
    other[i] = put("b", "{\"payload\": 3}");
  }
  /* Range: the first three of a; the next three stay queued, untouched. */
  int by_range = stmt_runs("updated_ms = ?5 WHERE id BETWEEN"),
      by_list = stmt_runs("updated_ms = ?5 WHERE id IN (SELECT value FROM json_each");
  json_t *l = fixture_lease("a", 3);
  assert_int_equal(stmt_runs("updated_ms = ?5 WHERE id BETWEEN"), by_range + 1);
  assert_int_equal(json_array_size(l), 3);
  int64_t tokens[10];
  for (int i = 0; i < 3; i++) {
    assert_int_equal(jint(json_array_get(l, i), "task"), ids[i]);
    tokens[i] = jint(json_array_get(l, i), "token");
    assert_int_equal(token_of(ids[i]), tokens[i]);
  }
  json_decref(l);
  for (int i = 3; i < 6; i++) {
    assert_string_equal(state_of(ids[i]), "queued");
    assert_int_equal(token_of(ids[i]), 0);
  }
  /* List: the rest of a (3, 4, 5 and the four mixed ones) is not one range;
   * b's tasks between them stay queued. */
  l = fixture_lease("a", 7);
  assert_int_equal(json_array_size(l), 7);
  assert_int_equal(stmt_runs("updated_ms = ?5 WHERE id BETWEEN"), by_range + 1);
  assert_int_equal(stmt_runs("updated_ms = ?5 WHERE id IN (SELECT value FROM json_each"),
                   by_list + 1);
  for (int i = 0; i < 7; i++) {
    int64_t want = i < 3 ? ids[3 + i] : mixed[i - 3];
    assert_int_equal(jint(json_array_get(l, i), "task"), want);
    tokens[3 + i] = jint(json_array_get(l, i), "token");
    assert_int_equal(token_of(want), tokens[3 + i]);
  }
  json_decref(l);
  for (int i = 0; i < 4; i++) {
    assert_string_equal(state_of(other[i]), "queued");
    assert_int_equal(token_of(other[i]), 0);
  }
  /* Completions: ids 1, 2, 3 of a as a range (0 and 4 stay leased), then
   * the mixed ones 0 and 2 as a list (1 stays leased). */
  by_range = stmt_runs("updated_ms = ?2 WHERE id BETWEEN");
  by_list = stmt_runs("updated_ms = ?2 WHERE id IN (SELECT value FROM json_each");
  assert_int_equal(complete_many(ids + 1, tokens + 1, 3), MUSTER_OK);
  assert_int_equal(stmt_runs("updated_ms = ?2 WHERE id BETWEEN"), by_range + 1);
  for (int i = 0; i < 6; i++)
    assert_string_equal(state_of(ids[i]), i >= 1 && i <= 3 ? "done" : "leased");
  int64_t pick[2] = {mixed[0], mixed[2]}, pick_tokens[2] = {tokens[6], tokens[8]};
  assert_int_equal(complete_many(pick, pick_tokens, 2), MUSTER_OK);
  assert_int_equal(stmt_runs("updated_ms = ?2 WHERE id IN (SELECT value FROM json_each"),
                   by_list + 1);
  assert_string_equal(state_of(mixed[0]), "done");
  assert_string_equal(state_of(mixed[1]), "leased");
  assert_string_equal(state_of(mixed[2]), "done");
  /* A range whose last id has no row: refused as one by one refuses it. */
  l = fixture_lease("b", 4);
  assert_int_equal(jint(json_array_get(l, 3), "task"), other[3]);
  int64_t past[2] = {other[3], other[3] + 1};
  int64_t past_tokens[2] = {jint(json_array_get(l, 3), "token"), 1};
  json_decref(l);
  assert_int_equal(complete_many(past, past_tokens, 2), MUSTER_TASK_NOT_FOUND);
  fail_t f = {0};
  json_t *task = tree_of(task_get(st, ids[2], &f));
  assert_int_equal(json_integer_value(json_object_get(task, "result")), 1);
  json_decref(task);
  task = tree_of(task_get(st, mixed[2], &f));
  assert_int_equal(json_integer_value(json_object_get(task, "result")), 1);
  json_decref(task);
}

static void test_stale_token_refused(void **unused) {
  make_queue("q", "{}");
  int64_t id = put("q", "{\"payload\": \"x\"}");
  json_t *l = fixture_lease("q", 1);
  int64_t token = jint(json_array_get(l, 0), "token");
  json_decref(l);
  assert_int_equal(apply(LEASE_COMPLETE, id, token + 1, NULL), MUSTER_LEASE_LOST);
  assert_string_equal(state_of(id), "leased");
  assert_int_equal(apply(LEASE_RELEASE, id, token, NULL), MUSTER_OK);
  assert_int_equal(apply(LEASE_COMPLETE, id, token, NULL), MUSTER_LEASE_LOST);
  assert_string_equal(state_of(id), "queued");
  assert_int_equal(apply(LEASE_COMPLETE, 9999, 1, NULL), MUSTER_TASK_NOT_FOUND);
}

/* A refusal names its element, "leases[i]", whatever the number of digits
 * (lease_ops.c writes it by hand); the batch is refused whole. */
static void test_refusal_names_element(void **unused) {
  make_queue("q", "{}");
  for (int i = 0; i < 12; i++)
    put("q", "{\"payload\": 1}");
  json_t *l = fixture_lease("q", 12);
  assert_int_equal(json_array_size(l), 12);
  store_request_end(st, true); /* the leases stay when a batch below is rolled back */
  assert_int_equal(store_request_begin(st, &(fail_t){0}), MUSTER_OK);
  static const size_t stale[] = {0, 7, 11};
  for (size_t k = 0; k < 3; k++) {
    json_t *elems = json_array();
    for (size_t i = 0; i < 12; i++) {
      const json_t *one = json_array_get(l, i);
      json_array_append_new(elems,
                            json_pack("{s:I, s:I}", "task", (json_int_t)jint(one, "task"), "token",
                                      (json_int_t)(jint(one, "token") + (i == stale[k]))));
    }
    json_t *body = json_pack("{s:o}", "leases", elems);
    fail_t f = {0};
    assert_null(lease_apply(st, LEASE_COMPLETE, body, 1 << 20, &f));
    json_decref(body);
    store_request_end(st, false); /* as the route layer does: roll the batch back */
    assert_int_equal(store_request_begin(st, &(fail_t){0}), MUSTER_OK);
    char want[64];
    snprintf(want, sizeof want, "leases[%zu]: token ", stale[k]);
    assert_int_equal(f.code, MUSTER_LEASE_LOST);
    if (strncmp(f.message, want, strlen(want)) != 0)
      fail_msg("message %s, expected it to start with %s", f.message, want);
  }
  json_decref(l);
}

static void test_pipeline_and_flags(void **unused) {
  make_queue("b", "{\"max_flags\": 2}");
  make_queue("a", "{\"next\": \"b\"}");
  int64_t parent = put("a", "{\"payload\": \"in\", \"session\": \"s\", \"index\": 4}");
  json_t *l = fixture_lease("a", 1);
  assert_int_equal(
      apply(LEASE_COMPLETE, parent, jint(json_array_get(l, 0), "token"), ", \"result\": \"out\""),
      MUSTER_OK);
  json_decref(l);
  assert_string_equal(state_of(parent), "done");
  for (int round = 1; round <= 2; round++) {
    l = fixture_lease("b", 1);
    json_t *child = json_array_get(l, 0);
    assert_non_null(child);
    assert_string_equal(json_string_value(json_object_get(child, "payload")), "out");
    assert_int_equal(jint(child, "parent"), parent);
    assert_int_equal(jint(child, "index"), 4);
    assert_string_equal(json_string_value(json_object_get(child, "session")), "s");
    int64_t id = jint(child, "task");
    assert_int_equal(apply(LEASE_FLAG, id, jint(child, "token"), NULL), MUSTER_OK);
    assert_string_equal(state_of(id), round == 1 ? "queued" : "cancelled");
    json_decref(l);
  }
  assert_string_equal(state_of(parent), "queued"); /* rolled back one stage */
}

static void test_fail_retry_dead(void **unused) {
  make_queue("q", "{\"max_attempts\": 2, \"backoff_ms\": 0, \"backoff_max_ms\": 0}");
  int64_t id = put("q", "{\"payload\": 1}");
  for (int attempt = 1; attempt <= 2; attempt++) {
    json_t *l = fixture_lease("q", 1);
    assert_int_equal(json_array_size(l), 1);
    assert_int_equal(jint(json_array_get(l, 0), "attempt"), attempt);
    assert_int_equal(
        apply(LEASE_FAIL, id, jint(json_array_get(l, 0), "token"), ", \"error\": \"boom\""),
        MUSTER_OK);
    json_decref(l);
  }
  assert_string_equal(state_of(id), "dead");
  fail_t f = {0};
  json_t *t = tree_of(task_requeue(st, id, &f));
  assert_non_null(t);
  assert_string_equal(json_string_value(json_object_get(t, "state")), "queued");
  assert_int_equal(jint(t, "attempts"), 0);
  json_decref(t);
}

static void test_expiry_and_worker_timeout(void **unused) {
  make_queue("q", "{\"lease_ms\": 1000, \"backoff_ms\": 0, \"backoff_max_ms\": 0}");
  int64_t id = put("q", "{\"payload\": 1}");
  json_decref(fixture_lease("q", 1));
  assert_int_equal(lease_expire_due(st, now_ms(), 100), 0);
  assert_int_equal(lease_expire_due(st, now_ms() + 2000, 100), 1);
  assert_string_equal(state_of(id), "queued");

  fail_t f = {0};
  json_t *reg = json_loads("{\"nickname\": \"n\", \"timeout_ms\": 1000}", 0, NULL);
  json_t *w = worker_register(st, reg, 60000, &f);
  assert_non_null(w);
  int64_t worker = jint(w, "id");
  queue_t q;
  queue_load(st, "q", &q, &f);
  json_decref(lease_acquire(st, &q, worker, 1, &f));
  assert_string_equal(state_of(id), "leased");
  assert_int_equal(worker_expire_due(st, now_ms() + 5000), 1);
  assert_string_equal(state_of(id), "queued");
  assert_int_equal(worker_check_active(st, worker, &f), MUSTER_WORKER_NOT_FOUND);
  json_decref(w);
  json_decref(reg);
}

/* The leases of `worker`, as worker_get counts them. */
static int64_t worker_leases(int64_t worker) {
  fail_t f = {0};
  json_t *w = worker_get(st, worker, &f);
  assert_non_null(w);
  int64_t n = jint(w, "leases");
  json_decref(w);
  return n;
}

/* The leases of `worker` as worker_list counts them (-1: not listed). */
static int64_t worker_listed_leases(int64_t worker) {
  fail_t f = {0};
  json_t *list = worker_list(st, &f), *w;
  assert_non_null(list);
  size_t i;
  int64_t n = -1;
  json_array_foreach(json_object_get(list, "workers"), i, w) {
    if (jint(w, "id") == worker)
      n = jint(w, "leases");
  }
  json_decref(list);
  return n;
}

/* A worker row as an older head wrote it (worker_register writes the
 * columns of the newest schema, which this store may not have yet). */
static int64_t register_worker(void) {
  sqlite3 *db = store_db(st);
  assert_int_equal(sqlite3_exec(db,
                                "INSERT INTO workers(name, nickname, state, last_seen_ms,"
                                " created_ms, timeout_ms) VALUES('w', 'n', 0, 0, 0, 1000)",
                                NULL, NULL, NULL),
                   SQLITE_OK);
  return sqlite3_last_insert_rowid(db);
}

static void lease_for(const char *queue, int64_t worker, int64_t max) {
  queue_t q;
  fail_t f = {0};
  load_queue(queue, &q);
  json_t *leases = lease_acquire(st, &q, worker, max, &f);
  assert_non_null(leases);
  assert_int_equal(json_array_size(leases), max);
  json_decref(leases);
}

/* Schema version 8 drops tasks_by_worker and puts the worker into
 * tasks_leased: leases granted under version 7 are found by worker (counts,
 * listing, the worker's end) and by deadline after the upgrade, and only the
 * leases of the worker asked for. */
static void test_worker_leases_after_upgrade(void **unused) {
  char dir[] = "/tmp/muster-test-lease.XXXXXX", path[64];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/muster.db", dir);
  fail_t f = {0};
  st = store_open(&(store_opts_t){.path = path, .schema_version = 7}, &f);
  assert_non_null(st);
  assert_int_equal(store_request_begin(st, &f), MUSTER_OK);
  make_queue("q", "{\"lease_ms\": 1000, \"backoff_ms\": 0, \"backoff_max_ms\": 0}");
  int64_t a = register_worker(), b = register_worker();
  int64_t ids[6];
  for (int i = 0; i < 6; i++)
    ids[i] = put("q", "{\"payload\": 1}");
  lease_for("q", a, 2); /* ids[0], ids[1] */
  lease_for("q", b, 3); /* ids[2] .. ids[4] */
  assert_int_equal(fixture_close(), 0);

  st = store_open(&(store_opts_t){.path = path}, &f);
  assert_non_null(st);
  sqlite3 *db = store_db(st);
  sqlite3_stmt *s;
  assert_int_equal(sqlite3_prepare_v2(db,
                                      "SELECT (SELECT count(*) FROM sqlite_master"
                                      " WHERE name = 'tasks_by_worker'), (SELECT sql FROM"
                                      " sqlite_master WHERE name = 'tasks_leased')",
                                      -1, &s, NULL),
                   SQLITE_OK);
  assert_int_equal(sqlite3_step(s), SQLITE_ROW);
  assert_int_equal(sqlite3_column_int(s, 0), 0);
  assert_non_null(strstr((const char *)sqlite3_column_text(s, 1), "(deadline_ms, worker)"));
  sqlite3_finalize(s);
  assert_int_equal(store_request_begin(st, &f), MUSTER_OK);
  assert_int_equal(worker_leases(a), 2);
  assert_int_equal(worker_leases(b), 3);
  assert_int_equal(worker_listed_leases(a), 2);
  assert_int_equal(worker_listed_leases(b), 3);
  /* A new lease after the upgrade is found by its worker too. */
  lease_for("q", a, 1); /* ids[5] */
  assert_int_equal(worker_leases(a), 3);
  /* Worker a ends: its three leases return, b's stay. */
  assert_int_equal(lease_end_worker(st, a, false), 3);
  for (int i = 0; i < 6; i++)
    assert_string_equal(state_of(ids[i]), i >= 2 && i <= 4 ? "leased" : "queued");
  assert_int_equal(worker_leases(a), 0);
  assert_int_equal(worker_listed_leases(a), 0);
  assert_int_equal(worker_listed_leases(b), 3);
  /* b's leases expire by deadline. */
  assert_int_equal(lease_expire_due(st, now_ms() + 2000, 100), 3);
  assert_int_equal(worker_leases(b), 0);
  for (int i = 0; i < 6; i++)
    assert_string_equal(state_of(ids[i]), "queued");
  assert_int_equal(fixture_close(), 0);
  fixture_remove_store_files(dir, path);
}

/* The schema version before tasks.ended_token and ended_as (store_schema.c). */
#define VERSION_BEFORE_ENDS 12

/* The token of the only lease of a one-task lease of `queue`. */
static int64_t lease_token(const char *queue) {
  json_t *l = fixture_lease(queue, 1);
  assert_int_equal(json_array_size(l), 1);
  int64_t token = jint(json_array_get(l, 0), "token");
  json_decref(l);
  return token;
}

static int64_t attempts_of(int64_t id) {
  fail_t f = {0};
  json_t *task = tree_of(task_get(st, id, &f));
  assert_non_null(task);
  int64_t attempts = jint(task, "attempts");
  json_decref(task);
  return attempts;
}

/* A store upgraded to the record of lease ends: a fail from before the
 * upgrade has none, so its retry is refused as before; a lease held across
 * the upgrade and failed after it is answered as a repeat, charged once. */
static void test_fail_repeat_after_upgrade(void **unused) {
  char dir[] = "/tmp/muster-test-lease.XXXXXX", path[64];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/muster.db", dir);
  fail_t f = {0};
  st = store_open(&(store_opts_t){.path = path, .schema_version = VERSION_BEFORE_ENDS}, &f);
  assert_non_null(st);
  assert_int_equal(store_request_begin(st, &f), MUSTER_OK);
  make_queue("q", "{\"backoff_ms\": 60000, \"backoff_max_ms\": 60000}");
  int64_t before = put("q", "{\"payload\": 1}"), across = put("q", "{\"payload\": 2}");
  int64_t before_token = lease_token("q"), across_token = lease_token("q");
  /* Its fail as a head without the record made it (this one's lease_move
   * writes the new columns): queued, the lease cleared, the token kept. */
  char sql[160];
  snprintf(sql, sizeof sql,
           "UPDATE tasks SET state = 0, worker = NULL, deadline_ms = NULL WHERE id = %lld",
           (long long)before);
  assert_int_equal(sqlite3_exec(store_db(st), sql, NULL, NULL, NULL), SQLITE_OK);
  assert_int_equal(fixture_close(), 0);

  st = store_open(&(store_opts_t){.path = path}, &f);
  assert_non_null(st);
  assert_int_equal(store_request_begin(st, &f), MUSTER_OK);
  assert_int_equal(apply(LEASE_FAIL, before, before_token, NULL), MUSTER_LEASE_LOST);
  for (int i = 0; i < 3; i++)
    assert_int_equal(apply(LEASE_FAIL, across, across_token, NULL), MUSTER_OK);
  assert_int_equal(apply(LEASE_RELEASE, across, across_token, NULL), MUSTER_LEASE_LOST);
  assert_string_equal(state_of(across), "queued");
  assert_int_equal(attempts_of(across), 1);
  assert_int_equal(fixture_close(), 0);
  fixture_remove_store_files(dir, path);
}

static void test_batch_too_large(void **unused) {
  make_queue("q", "{}");
  json_t *tasks = json_array();
  for (int i = 0; i <= TASK_MAX_BATCH; i++)
    json_array_append_new(tasks, json_pack("{s:i}", "payload", i));
  json_t *body = json_pack("{s:o}", "tasks", tasks);
  fail_t f = {0};
  assert_null(task_put(st, "q", body, 1 << 20, &f));
  assert_int_equal(f.code, MUSTER_BATCH_TOO_LARGE);
  json_decref(body);
  body = json_loads("{\"tasks\": [{\"payload\": 1}, {\"payload\": 2, \"priority\": \"high\"}]}", 0,
                    NULL);
  assert_null(task_put(st, "q", body, 1 << 20, &f));
  assert_int_equal(f.code, MUSTER_INVALID);
  assert_string_equal(f.message, "tasks[1].priority: expected an integer");
  json_decref(body);
}

/* ---- lease objects written as text ----
 *
 * The lease path writes each lease object as text around the stored payload
 * (lease.c).  Its bytes must be those jw_dump gave for the tree lease_one
 * built before: the keys in this order, each value as jw writes it, the
 * payload as it was put, "requires" only when set.  `in` is the task as put;
 * the token and the deadline are the lease's own. */
static json_t *lease_as_tree(int64_t id, const json_t *in, int64_t parent, const json_t *got) {
  json_t *lease = json_object(), *value;
  json_object_set_new_nocheck(lease, "task", json_integer(id));
  json_object_set_new_nocheck(lease, "token", json_integer(jint(got, "token")));
  json_object_set_new_nocheck(lease, "payload", json_deep_copy(json_object_get(in, "payload")));
  json_object_set_new_nocheck(lease, "attempt", json_integer(1));
  json_object_set_new_nocheck(lease, "deadline_ms", json_integer(jint(got, "deadline_ms")));
  json_object_set_new_nocheck(lease, "parent", parent ? json_integer(parent) : json_null());
  value = json_object_get(in, "session");
  json_object_set_new_nocheck(lease, "session", value ? json_deep_copy(value) : json_null());
  value = json_object_get(in, "index");
  json_object_set_new_nocheck(lease, "index", value ? json_deep_copy(value) : json_null());
  if ((value = json_object_get(in, "requires")) != NULL)
    json_object_set_new_nocheck(lease, "requires", json_deep_copy(value));
  return lease;
}

/* Leases `n` tasks of `queue` as text and checks it against the trees of the
 * tasks `in[i]` (ids `ids[i]`, parents `parents[i]` or NULL: none). */
static void lease_text_is(const char *queue, size_t n, json_t *const *in, const int64_t *ids,
                          const int64_t *parents) {
  queue_t q;
  fail_t f = {0};
  size_t count = 0, len = 0;
  int64_t max_task = -1, highest = 0;
  assert_int_equal(queue_load(st, queue, &q, &f), MUSTER_OK);
  /* Written into a reply's text after what it holds, as lease_reply_text does. */
  jw_buf_t reply = {0};
  JW_ADD_LITERAL(&reply, "{\"leases\":");
  size_t at = reply.len;
  assert_int_equal(lease_acquire_text(st, &q, 0, (int64_t)n + 1, &reply, &count, &max_task, &f),
                   MUSTER_OK);
  JW_ADD_LITERAL(&reply, ",\"updates_last\":0}");
  assert_false(reply.failed);
  assert_int_equal(count, n);
  for (size_t i = 0; i < n; i++)
    highest = ids[i] > highest ? ids[i] : highest;
  assert_int_equal(max_task, highest); /* head_lease_on_disk decides on it */
  len = reply.len - at - strlen(",\"updates_last\":0}");
  char *text = strndup(reply.buf + at, len);
  json_t *got = json_loadb(text, len, JSON_ALLOW_NUL, NULL);
  assert_non_null(got);
  assert_int_equal(json_array_size(got), n);
  json_t *want = json_array();
  for (size_t i = 0; i < n; i++)
    json_array_append_new(
        want, lease_as_tree(ids[i], in[i], parents ? parents[i] : 0, json_array_get(got, i)));
  char *want_text = jw_dump(want, NULL);
  assert_string_equal(text, want_text);
  /* And the reply around it is as the tree with those keys would be dumped. */
  json_t *tree = json_pack("{s:O, s:i}", "leases", got, "updates_last", 0);
  char *tree_text = jw_dump(tree, NULL);
  assert_int_equal(reply.len, strlen(tree_text));
  assert_memory_equal(reply.buf, tree_text, reply.len);
  free(tree_text);
  json_decref(tree);
  free(want_text);
  json_decref(want);
  json_decref(got);
  free(text);
  jw_buf_free(&reply);
}

static void test_lease_text(void **unused) {
  make_queue("q", "{}");
  const char *tasks[] = {
      /* unicode, escapes both as \u and literal, nested containers in key order */
      "{\"payload\": {\"s\": \"caf\\u00e9 \xe2\x82\xac \\ud83d\\ude00\", \"e\": \"q\\\"b\\\\s\\/\\n"
      "\\t\\u0001\\u001f\x7f\", \"n\": {\"z\": [1, 2.5, -0.0, 1e300, 0.1, null, true, false, {}],"
      " \"a\": []}}, \"index\": 3}",
      /* big integers; a session that needs escapes; index 0 */
      "{\"payload\": [9223372036854775807, -9223372036854775808, 9007199254740993],"
      " \"session\": \"s\\\"\\\\\\n\\u00e9\\u0002/\", \"index\": 0}",
      /* requires set, with and without a session */
      "{\"payload\": \"nul \\u0000 inside\", \"requires\": [{\"scope\": \"global\","
      " \"name\": \"model\", \"level\": 2}]}",
      "{\"payload\": {}, \"session\": \"plain\", \"requires\": [{\"scope\": \"g\", \"name\":"
      " \"a\", \"level\": 1}, {\"scope\": \"g\", \"name\": \"b\", \"level\": 9007199254740991}]}",
      "{\"payload\": null}", "{\"payload\": \"\"}",
      "{\"payload\": -1.5e-300, \"requires\": []}", /* an empty list is not stored */
  };
  enum { N = sizeof tasks / sizeof tasks[0] };
  json_t *in[N];
  int64_t ids[N];
  for (size_t i = 0; i < N; i++) {
    ids[i] = put("q", tasks[i]);
    in[i] = json_loads(tasks[i], JSON_ALLOW_NUL, NULL);
    if (json_array_size(json_object_get(in[i], "requires")) == 0)
      json_object_del(in[i], "requires");
  }
  lease_text_is("q", N, in, ids, NULL);
  for (size_t i = 0; i < N; i++)
    json_decref(in[i]);
}

/* A child task of a pipeline: its payload is the parent's result, stored by
 * the completion; parent, session and index come from the parent. */
static void test_lease_text_child(void **unused) {
  make_queue("c", "{}");
  make_queue("p", "{\"next\": \"c\"}");
  int64_t parent = put("p", "{\"payload\": 1, \"session\": \"s-1\", \"index\": 7}");
  json_t *l = fixture_lease("p", 1);
  assert_int_equal(apply(LEASE_COMPLETE, parent, jint(json_array_get(l, 0), "token"),
                         ", \"result\": {\"out\": [\"\\u00e9\", 2.0, {\"k\": null}]}"),
                   MUSTER_OK);
  json_decref(l);
  json_t *in = parse("{\"payload\": {\"out\": [\"\\u00e9\", 2.0, {\"k\": null}]},"
                     " \"session\": \"s-1\", \"index\": 7}");
  fail_t f = {0};
  json_t *listed = tree_of(task_list(st, "c", -1, 0, 10, &f));
  int64_t child = listed ? jint(json_array_get(json_object_get(listed, "tasks"), 0), "id") : 0;
  json_decref(listed);
  assert_true(child > 0);
  lease_text_is("c", 1, &in, &child, &parent);
  json_decref(in);
}

/* Sets a task's stored payload behind the head's back. */
static void corrupt_payload(int64_t id, const char *text) {
  sqlite3_stmt *s = store_stmt(st, "UPDATE tasks SET payload = ?2 WHERE id = ?1");
  fail_t f = {0};
  assert_non_null(s);
  sqlite3_bind_int64(s, 1, id);
  sqlite3_bind_text(s, 2, text, -1, SQLITE_TRANSIENT);
  assert_int_equal(store_step_done(st, s, &f), MUSTER_OK);
}

/* Stored text that is not JSON goes out as the JSON string of it, as it did
 * when stored payloads were parsed; text that is not UTF-8 either fails. */
static void test_lease_text_corrupt(void **unused) {
  make_queue("q", "{}");
  int64_t ids[3] = {put("q", "{\"payload\": 1}"), put("q", "{\"payload\": 2}"),
                    put("q", "{\"payload\": 3}")};
  corrupt_payload(ids[0], "not json {");
  corrupt_payload(ids[1], "{\"a\": 1}\n"); /* JSON, not as jw writes it: spliced as it is */
  corrupt_payload(ids[2], "\"\xc3(");      /* neither JSON nor UTF-8 */
  queue_t q;
  fail_t f = {0};
  size_t count;
  assert_int_equal(queue_load(st, "q", &q, &f), MUSTER_OK);
  jw_buf_t text = {0};
  assert_int_equal(lease_acquire_text(st, &q, 0, 2, &text, &count, NULL, &f), MUSTER_OK);
  char *got = strndup(text.buf, text.len);
  assert_non_null(strstr(got, ",\"payload\":\"not json {\",\"attempt\":1,"));
  assert_non_null(strstr(got, ",\"payload\":{\"a\": 1}\n,\"attempt\":1,"));
  json_t *back = json_loadb(text.buf, text.len, 0, NULL); /* still JSON */
  assert_non_null(back);
  json_decref(back);
  free(got);
  text.len = 0;
  assert_int_equal(lease_acquire_text(st, &q, 0, 1, &text, &count, NULL, &f), MUSTER_STORE);
  jw_buf_free(&text);
  assert_int_equal(f.code, MUSTER_STORE);
  assert_non_null(strstr(f.message, "stored payload is not JSON"));
}

/* A batch of completions replies {"completed": [{"task", "next_task"}, ...]}
 * written as text: the bytes jw_dump gave for the tree, next_task null
 * without a next stage.  The other operations still reply with trees. */
static void test_complete_text(void **unused) {
  make_queue("b", "{}");
  make_queue("a", "{\"next\": \"b\"}");
  make_queue("c", "{}");
  int64_t a1 = put("a", "{\"payload\": 1}"), a2 = put("a", "{\"payload\": 2}");
  int64_t c1 = put("c", "{\"payload\": 3}");
  json_t *la = fixture_lease("a", 2), *lc = fixture_lease("c", 1);
  char text[512];
  snprintf(text, sizeof text,
           "{\"leases\": [{\"task\": %lld, \"token\": %lld, \"result\": {\"r\": 1}},"
           " {\"task\": %lld, \"token\": %lld}, {\"task\": %lld, \"token\": %lld}]}",
           (long long)a1, (long long)jint(json_array_get(la, 0), "token"), (long long)c1,
           (long long)jint(json_array_get(lc, 0), "token"), (long long)a2,
           (long long)jint(json_array_get(la, 1), "token"));
  json_t *body = parse(text);
  fail_t f = {0};
  json_t *out = lease_apply(st, LEASE_COMPLETE, body, 1 << 20, &f);
  assert_non_null(out);
  json_t *next = tree_of(task_list(st, "b", -1, 0, 10, &f));
  json_t *next_tasks = json_object_get(next, "tasks");
  assert_int_equal(json_array_size(next_tasks), 2);
  char want[512];
  snprintf(want, sizeof want,
           "{\"completed\":[{\"task\":%lld,\"next_task\":%lld},{\"task\":%lld,\"next_task\":null},"
           "{\"task\":%lld,\"next_task\":%lld}]}",
           (long long)a1, (long long)jint(json_array_get(next_tasks, 0), "id"), (long long)c1,
           (long long)a2, (long long)jint(json_array_get(next_tasks, 1), "id"));
  char *got = jw_dump(out, NULL);
  assert_string_equal(got, want);
  free(got);
  json_decref(next);
  json_decref(out);
  json_decref(body);
  /* A refused element fails the batch: no reply. */
  body = parse("{\"leases\": [{\"task\": 1, \"token\": 999}]}");
  assert_null(lease_apply(st, LEASE_COMPLETE, body, 1 << 20, &f));
  assert_int_equal(f.code, MUSTER_LEASE_LOST);
  json_decref(body);
  json_decref(la);
  json_decref(lc);
}

/* ---- a scanned batch of completions: one SELECT, one UPDATE ---- */

/* Ends the request: kept, or rolled back as the route layer does after an
 * error; and opens the next. */
static void request_next(bool keep) {
  store_request_end(st, keep);
  assert_int_equal(store_request_begin(st, &(fail_t){0}), MUSTER_OK);
}

/* How many times the batch's lookup (one SELECT for all its elements) ran:
 * a batch that takes the two-statement path runs it once. */
static int batch_lookups(void) {
  return stmt_runs("CROSS JOIN tasks") + stmt_runs("tasks.id BETWEEN");
}

/* Completes with the scanned body `body` (which the scanner must take) and
 * results of at most `max_payload` bytes (the route scans with the same
 * limit, so a larger one takes the tree path there: here it reaches the
 * check); returns the reply's text (caller frees) or NULL with *f filled. */
static char *complete_scanned(const char *body, size_t max_payload, fail_t *f) {
  jscan_body_t scanned;
  assert_true(jscan_body(&lease_complete_shape, body, strlen(body), 1 << 20, &scanned));
  json_t *reply = lease_complete_scanned(st, &scanned, max_payload, f);
  jscan_body_free(&scanned);
  char *text = reply ? jw_dump(reply, NULL) : NULL;
  json_decref(reply);
  return text;
}

/* The stored result of task `id` ("<null>" for NULL) into `out`. */
static const char *result_of(int64_t id, char *out, size_t cap) {
  sqlite3_stmt *s = store_stmt(st, "SELECT result FROM tasks WHERE id = ?1");
  assert_non_null(s);
  sqlite3_bind_int64(s, 1, id);
  assert_int_equal(sqlite3_step(s), SQLITE_ROW);
  const unsigned char *text = sqlite3_column_text(s, 0);
  snprintf(out, cap, "%s", text ? (const char *)text : "<null>");
  store_reset(s);
  return out;
}

static void test_complete_batched(void **unused) {
  make_queue("b", "{}");
  make_queue("a", "{\"next\": \"b\"}");
  make_queue("c", "{}");
  /* Results as the scanner keeps them: escapes SQLite's JSON reading must
   * give back byte for byte, UTF-8 of two to four bytes, int64's ends. */
  static const char *const results[] = {
      "\"x\\\"y\\\\z\"",
      "\"\\u0000 and \\u001F\"",
      "{\"k\":[1,2,{\"q\":\"\xc3\xa9\xf0\x9f\x98\x80\"}]}",
      NULL,
      "-9223372036854775808",
      "\"a/b\\n\"",
      "true",
      "9223372036854775807",
  };
  enum { N = 8 };
  int64_t ids[N], tokens[N];
  for (int i = 0; i < N; i++)
    ids[i] = put(i % 3 == 2 ? "c" : "a", "{\"payload\": 1}");
  json_t *la = fixture_lease("a", N), *lc = fixture_lease("c", N);
  for (int i = 0; i < N; i++) {
    json_t *l = i % 3 == 2 ? lc : la;
    for (size_t k = 0; k < json_array_size(l); k++)
      if (jint(json_array_get(l, k), "task") == ids[i])
        tokens[i] = jint(json_array_get(l, k), "token");
  }
  json_decref(la);
  json_decref(lc);
  request_next(true);
  /* A repeated id: the second sees the first's completion, as one by one,
   * and is answered as a repeat under the completing token. */
  char body[2048], text[256];
  snprintf(body, sizeof body,
           "{\"leases\":[{\"task\":%lld,\"token\":%lld},{\"task\":%lld,\"token\":%lld}]}",
           (long long)ids[0], (long long)tokens[0], (long long)ids[0], (long long)tokens[0]);
  fail_t f = {0};
  int lookups = batch_lookups();
  char *twice = complete_scanned(body, 1 << 20, &f);
  assert_int_equal(batch_lookups(), lookups); /* declined: element by element */
  if (twice == NULL)
    fail_msg("complete twice: %s", f.message);
  json_t *twice_reply = json_loads(twice, 0, NULL);
  json_t *pair = json_object_get(twice_reply, "completed");
  assert_int_equal(json_array_size(pair), 2);
  const json_t *once = json_array_get(pair, 0), *repeat = json_array_get(pair, 1);
  assert_int_equal(jint(once, "task"), ids[0]);
  assert_int_equal(jint(repeat, "task"), ids[0]);
  assert_int_equal(jint(repeat, "next_task"), jint(once, "next_task"));
  assert_null(json_object_get(once, "repeated"));
  assert_true(json_is_true(json_object_get(repeat, "repeated")));
  assert_null(json_object_get(repeat, "result_ignored"));
  json_decref(twice_reply);
  free(twice);
  request_next(false);
  /* An id without a row; a stale token before a result too large: the first
   * refusal in element order wins. */
  snprintf(body, sizeof body,
           "{\"leases\":[{\"task\":%lld,\"token\":%lld},{\"task\":99999,\"token\":1}]}",
           (long long)ids[0], (long long)tokens[0]);
  f = (fail_t){0};
  assert_null(complete_scanned(body, 1 << 20, &f));
  assert_int_equal(f.code, MUSTER_TASK_NOT_FOUND);
  assert_string_equal(f.message, "leases[1]: task 99999 does not exist");
  request_next(false);
  snprintf(body, sizeof body,
           "{\"leases\":[{\"task\":%lld,\"token\":%lld},{\"task\":%lld,\"token\":%lld},"
           "{\"task\":%lld,\"token\":%lld,\"result\":\"0123456789\"}]}",
           (long long)ids[0], (long long)tokens[0], (long long)ids[1], (long long)tokens[1] + 1,
           (long long)ids[3], (long long)tokens[3]);
  f = (fail_t){0};
  assert_null(complete_scanned(body, 8, &f));
  assert_int_equal(f.code, MUSTER_LEASE_LOST);
  snprintf(text, sizeof text, "leases[1]: token %lld does not hold task %lld",
           (long long)tokens[1] + 1, (long long)ids[1]);
  assert_true(strncmp(f.message, text, strlen(text)) == 0);
  /* As one by one: the elements before the refusal were completed (a request
   * that keeps its writes keeps them); here the request rolls them back. */
  assert_string_equal(state_of(ids[0]), "done");
  request_next(false);
  snprintf(body, sizeof body,
           "{\"leases\":[{\"task\":%lld,\"token\":%lld},"
           "{\"task\":%lld,\"token\":%lld,\"result\":\"0123456789\"}]}",
           (long long)ids[0], (long long)tokens[0], (long long)ids[3], (long long)tokens[3]);
  f = (fail_t){0};
  assert_null(complete_scanned(body, 8, &f));
  assert_int_equal(f.code, MUSTER_PAYLOAD_TOO_LARGE);
  assert_string_equal(
      f.message,
      "leases[1].result: 12 bytes as JSON text, at most 8 allowed (a string counts with its "
      "quotes and escapes; the head's --max-payload sets the limit)");
  request_next(false);
  assert_string_equal(state_of(ids[0]), "leased");
  /* The whole batch, its elements not in the order of their ids: every
   * result stored as it came, the next stage's tasks made from them in
   * element order, the reply as one by one wrote it. */
  static const int perm[N] = {3, 0, 7, 1, 6, 2, 5, 4};
  size_t len = (size_t)snprintf(body, sizeof body, "{\"leases\":[");
  for (int k = 0; k < N; k++) {
    int i = perm[k];
    len += (size_t)snprintf(body + len, sizeof body - len, "%s{\"task\":%lld,\"token\":%lld",
                            k ? "," : "", (long long)ids[i], (long long)tokens[i]);
    if (results[i])
      len += (size_t)snprintf(body + len, sizeof body - len, ",\"result\":%s", results[i]);
    len += (size_t)snprintf(body + len, sizeof body - len, "}");
  }
  snprintf(body + len, sizeof body - len, "]}");
  f = (fail_t){0};
  lookups = batch_lookups();
  char *reply = complete_scanned(body, 1 << 20, &f);
  assert_int_equal(batch_lookups(), lookups + 1);
  if (reply == NULL)
    fail_msg("complete: %s", f.message);
  json_t *next = tree_of(task_list(st, "b", -1, 0, 10, &f));
  json_t *next_tasks = json_object_get(next, "tasks");
  char want[1024];
  len = (size_t)snprintf(want, sizeof want, "{\"completed\":[");
  size_t child = 0;
  for (int k = 0; k < N; k++) {
    int i = perm[k];
    char got[256];
    assert_string_equal(result_of(ids[i], got, sizeof got), results[i] ? results[i] : "<null>");
    assert_string_equal(state_of(ids[i]), "done");
    int64_t next_id = 0;
    if (i % 3 != 2) { /* queue a: a task in b, its payload the result */
      const json_t *t = json_array_get(next_tasks, child++);
      next_id = jint(t, "id");
      assert_int_equal(jint(t, "parent"), ids[i]);
      char *payload = jw_dump(json_object_get(t, "payload"), NULL);
      assert_string_equal(payload, results[i] ? results[i] : "null");
      free(payload);
    }
    len += (size_t)snprintf(want + len, sizeof want - len,
                            "%s{\"task\":%lld,\"next_task\":", k ? "," : "", (long long)ids[i]);
    len += (size_t)(next_id ? snprintf(want + len, sizeof want - len, "%lld}", (long long)next_id)
                            : snprintf(want + len, sizeof want - len, "null}"));
  }
  snprintf(want + len, sizeof want - len, "]}");
  assert_int_equal(json_array_size(next_tasks), child);
  assert_string_equal(reply, want);
  free(reply);
  json_decref(next);
  int64_t counts[TASK_STATE_COUNT];
  assert_int_equal(counts_read(st, "a", counts, &f), MUSTER_OK);
  assert_int_equal(counts[TASK_DONE], 6);
  assert_int_equal(counts[TASK_LEASED], 0);
  assert_int_equal(counts_read(st, "c", counts, &f), MUSTER_OK);
  assert_int_equal(counts[TASK_DONE], 2);
  assert_int_equal(counts_read(st, "b", counts, &f), MUSTER_OK);
  assert_int_equal(counts[TASK_QUEUED], 6);
  /* Acknowledgements only (no results: the rows found by id alone). */
  int64_t c1 = put("c", "{\"payload\": 1}"), c2 = put("c", "{\"payload\": 2}");
  json_t *l = fixture_lease("c", 2);
  snprintf(body, sizeof body,
           "{\"leases\":[{\"task\":%lld,\"token\":%lld},{\"task\":%lld,\"token\":%lld}]}",
           (long long)jint(json_array_get(l, 1), "task"),
           (long long)jint(json_array_get(l, 1), "token"),
           (long long)jint(json_array_get(l, 0), "task"),
           (long long)jint(json_array_get(l, 0), "token"));
  json_decref(l);
  reply = complete_scanned(body, 1 << 20, &f);
  snprintf(
      want, sizeof want,
      "{\"completed\":[{\"task\":%lld,\"next_task\":null},{\"task\":%lld,\"next_task\":null}]}",
      (long long)c2, (long long)c1);
  assert_non_null(reply);
  assert_string_equal(reply, want);
  free(reply);
  char got[64];
  assert_string_equal(state_of(c1), "done");
  assert_string_equal(state_of(c2), "done");
  assert_string_equal(result_of(c1, got, sizeof got), "<null>");
  assert_int_equal(counts_read(st, "c", counts, &f), MUSTER_OK);
  assert_int_equal(counts[TASK_DONE], 4);
  assert_int_equal(counts[TASK_LEASED], 0);
}

/* A parsed batch of completions (a body the scanner declines) takes the
 * batch too when its fields are valid; a field error leaves the order of
 * refusals to the element-by-element path. */
static void test_complete_batched_tree(void **unused) {
  make_queue("b", "{}");
  make_queue("a", "{\"next\": \"b\"}");
  int64_t ids[3], tokens[3];
  for (int i = 0; i < 3; i++)
    ids[i] = put("a", "{\"payload\": 1}");
  json_t *l = fixture_lease("a", 3);
  for (int i = 0; i < 3; i++)
    tokens[i] = jint(json_array_get(l, i), "token");
  json_decref(l);
  request_next(true);
  char text[512];
  /* Element 1's task is not an integer, element 0's token is stale: element 0
   * is refused first, as one by one. */
  snprintf(text, sizeof text,
           "{\"leases\": [{\"task\": %lld, \"token\": %lld}, {\"task\": \"x\", \"token\": 1}]}",
           (long long)ids[0], (long long)tokens[0] + 1);
  json_t *body = parse(text);
  fail_t f = {0};
  assert_null(lease_apply(st, LEASE_COMPLETE, body, 1 << 20, &f));
  json_decref(body);
  assert_int_equal(f.code, MUSTER_LEASE_LOST);
  assert_true(strncmp(f.message, "leases[0]: token ", 17) == 0);
  request_next(false);
  /* Valid fields, a stale token last: the batch refuses it before writing. */
  snprintf(text, sizeof text,
           "{\"leases\": [{\"task\": %lld, \"token\": %lld}, {\"task\": %lld, \"token\": %lld}]}",
           (long long)ids[0], (long long)tokens[0], (long long)ids[1], (long long)tokens[1] + 1);
  body = parse(text);
  f = (fail_t){0};
  assert_null(lease_apply(st, LEASE_COMPLETE, body, 1 << 20, &f));
  json_decref(body);
  assert_true(strncmp(f.message, "leases[1]: token ", 17) == 0);
  assert_string_equal(state_of(ids[0]), "done");
  request_next(false);
  /* Out of id order, results written as the tree path writes them. */
  snprintf(
      text, sizeof text,
      "{\"leases\": [{\"task\": %lld, \"token\": %lld, \"result\": {\"b\": [1, \"\\u00e9\"]}},"
      " {\"task\": %lld, \"token\": %lld}, {\"task\": %lld, \"token\": %lld, \"result\": null}]}",
      (long long)ids[2], (long long)tokens[2], (long long)ids[0], (long long)tokens[0],
      (long long)ids[1], (long long)tokens[1]);
  body = parse(text);
  f = (fail_t){0};
  int lookups = batch_lookups();
  json_t *reply = lease_apply(st, LEASE_COMPLETE, body, 1 << 20, &f);
  assert_int_equal(batch_lookups(), lookups + 1);
  json_decref(body);
  if (reply == NULL)
    fail_msg("complete: %s", f.message);
  json_decref(reply);
  char got[64];
  assert_string_equal(result_of(ids[2], got, sizeof got), "{\"b\":[1,\"\xc3\xa9\"]}");
  assert_string_equal(result_of(ids[0], got, sizeof got), "<null>");
  assert_string_equal(result_of(ids[1], got, sizeof got), "null");
  for (int i = 0; i < 3; i++)
    assert_string_equal(state_of(ids[i]), "done");
  json_t *next = tree_of(task_list(st, "b", -1, 0, 10, &f));
  json_t *next_tasks = json_object_get(next, "tasks");
  assert_int_equal(json_array_size(next_tasks), 3);
  assert_int_equal(jint(json_array_get(next_tasks, 0), "parent"), ids[2]);
  assert_int_equal(jint(json_array_get(next_tasks, 1), "parent"), ids[0]);
  json_decref(next);
}

/* ---- put replies written as text ----
 *
 * A put replies {"tasks": [{"id", "created"}, ...]} with the array written as
 * text, one raw node per batch (task.c).  Its bytes must be those json_dumps
 * gave for the tree task_put built before: an object per task, "id" then
 * "created". */
static json_t *put_reply_as_tree(const int64_t *ids, const bool *created, size_t n) {
  json_t *out = json_array();
  for (size_t i = 0; i < n; i++) {
    json_t *entry = json_object();
    json_object_set_new_nocheck(entry, "id", json_integer(ids[i]));
    json_object_set_new_nocheck(entry, "created", json_boolean(created[i]));
    json_array_append_new(out, entry);
  }
  return json_pack("{s:o}", "tasks", out);
}

/* Checks put reply `reply` of `n` tasks, created as `created` says, against
 * the tree form, and gives its ids in `ids`.  Frees `reply`. */
static void put_text_is(json_t *reply, size_t n, const bool *created, int64_t *ids) {
  assert_non_null(reply);
  assert_true(jw_is_raw(json_object_get(reply, "tasks")));
  json_t *tree = reply_tree(reply);
  json_t *tasks = json_object_get(tree, "tasks");
  assert_int_equal(json_array_size(tasks), n);
  for (size_t i = 0; i < n; i++) {
    ids[i] = jint(json_array_get(tasks, i), "id");
    assert_true(ids[i] > 0);
    assert_true(json_is_boolean(json_object_get(json_array_get(tasks, i), "created")));
    assert_int_equal(json_is_true(json_object_get(json_array_get(tasks, i), "created")),
                     created[i]);
  }
  json_t *want = put_reply_as_tree(ids, created, n);
  char *want_text = json_dumps(want, JSON_COMPACT), *got = jw_dump(reply, NULL);
  assert_string_equal(got, want_text);
  free(got);
  free(want_text);
  json_decref(want);
  json_decref(tree);
  json_decref(reply);
}

static json_t *put_body(const char *text) {
  json_t *body = parse(text);
  fail_t f = {0};
  json_t *reply = task_put(st, "q", body, 1 << 20, &f);
  if (reply == NULL)
    fail_msg("put %s: %s", text, f.message);
  json_decref(body);
  return reply;
}

static void test_put_text(void **unused) {
  make_queue("q", "{}");
  int64_t ids[5];
  put_text_is(put_body("{\"tasks\": [{\"payload\": 1, \"key\": \"a\"}, {\"payload\": 2},"
                       " {\"payload\": 3, \"key\": \"b\"}]}"),
              3, (const bool[]){true, true, true}, ids);
  int64_t b = ids[2];
  /* An id past 2^53, and those after it, in the text as in the tree. */
  sqlite3_stmt *s = store_stmt(st, "UPDATE tasks SET id = 9007199254740993 WHERE id = ?1");
  fail_t f = {0};
  assert_non_null(s);
  sqlite3_bind_int64(s, 1, ids[0]);
  assert_int_equal(store_step_done(st, s, &f), MUSTER_OK);
  /* The head hands ids out from its counter: move it past the moved id. */
  store_task_ids(st, 9007199254740993 - store_last_task(st));
  /* Keys seen before, keys new, a key twice in one batch: created mixed. */
  put_text_is(put_body("{\"tasks\": [{\"payload\": 4, \"key\": \"a\"}, {\"payload\": 5},"
                       " {\"payload\": 6, \"key\": \"b\"}, {\"payload\": 7, \"key\": \"c\"},"
                       " {\"payload\": 8, \"key\": \"c\"}]}"),
              5, (const bool[]){false, true, false, true, false}, ids);
  assert_int_equal(ids[0], 9007199254740993);
  assert_int_equal(ids[1], 9007199254740994);
  assert_int_equal(ids[2], b);
  assert_int_equal(ids[4], ids[3]);
  /* Only tasks known already, in absolute bytes. */
  json_t *reply = put_body("{\"tasks\": [{\"payload\": 0, \"key\": \"a\"}]}");
  char *text = jw_dump(reply, NULL);
  assert_string_equal(text, "{\"tasks\":[{\"id\":9007199254740993,\"created\":false}]}");
  free(text);
  put_text_is(reply, 1, (const bool[]){false}, ids);
  /* A body the scanner reads: the same reply from the other entry. */
  const char *body = "{\"tasks\":[{\"payload\":1},{\"payload\":\"x\",\"priority\":5}]}";
  jscan_body_t scanned;
  assert_true(jscan_body(&task_put_shape, body, strlen(body), 1 << 20, &scanned));
  put_text_is(task_put_scanned(st, "q", &scanned, &f), 2, (const bool[]){true, true}, ids);
  assert_int_equal(ids[1], ids[0] + 1);
  jscan_body_free(&scanned);
}

/* A put without keys or requires is inserted in chunks of 64, 32, ... 1 rows
 * (task.c): 103 tasks take five statements.  Every row must hold its own
 * element's fields, under the id the reply gives it, ids in order. */
static void test_put_chunks(void **unused) {
  make_queue("q", "{}");
  enum { N = 103 };
  jw_buf_t body = {0};
  JW_ADD_LITERAL(&body, "{\"tasks\":[");
  for (int i = 0; i < N; i++) {
    char elem[160];
    int len = snprintf(elem, sizeof elem,
                       "%s{\"payload\":{\"n\":%d,\"s\":\"t%d\"},\"priority\":%d,\"delay_ms\":%d,"
                       "\"index\":%d}",
                       i ? "," : "", i, i, i % 7 - 3, i * 1000, i * 2);
    jw_add_text(&body, elem, (size_t)len);
  }
  JW_ADD_LITERAL(&body, "]}");
  jscan_body_t scanned;
  fail_t f = {0};
  assert_true(jscan_body(&task_put_shape, body.buf, body.len, 1 << 20, &scanned));
  int64_t ids[N];
  bool created[N];
  for (int i = 0; i < N; i++)
    created[i] = true;
  put_text_is(task_put_scanned(st, "q", &scanned, &f), N, created, ids);
  jscan_body_free(&scanned);
  jw_buf_free(&body);
  sqlite3_stmt *s = store_stmt(st, "SELECT payload, priority, run_at_ms - created_ms, idx, queue,"
                                   " state, key IS NULL AND session IS NULL AND parent IS NULL,"
                                   " created_ms = updated_ms FROM tasks WHERE id = ?1");
  assert_non_null(s);
  for (int i = 0; i < N; i++) {
    if (i > 0)
      assert_int_equal(ids[i], ids[i - 1] + 1);
    sqlite3_bind_int64(s, 1, ids[i]);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    char want[64];
    snprintf(want, sizeof want, "{\"n\":%d,\"s\":\"t%d\"}", i, i);
    assert_string_equal((const char *)sqlite3_column_text(s, 0), want);
    assert_int_equal(sqlite3_column_int64(s, 1), i % 7 - 3);
    assert_int_equal(sqlite3_column_int64(s, 2), i * 1000);
    assert_int_equal(sqlite3_column_int64(s, 3), i * 2);
    assert_string_equal((const char *)sqlite3_column_text(s, 4), "q");
    assert_int_equal(sqlite3_column_int(s, 5), TASK_QUEUED);
    assert_int_equal(sqlite3_column_int(s, 6), 1);
    assert_int_equal(sqlite3_column_int(s, 7), 1);
    store_reset(s);
  }
  int64_t counts[TASK_STATE_COUNT];
  assert_int_equal(counts_read(st, "q", counts, &f), MUSTER_OK);
  assert_int_equal(counts[TASK_QUEUED], N);
  /* The tree path's sessions go in their rows too; a batch with a key takes
   * the row-by-row path, with the same result. */
  int64_t two[3];
  put_text_is(put_body("{\"tasks\": [{\"payload\": 1, \"session\": \"s1\"}, {\"payload\": 2},"
                       " {\"payload\": 3, \"session\": \"s2\", \"index\": 4}]}"),
              3, (const bool[]){true, true, true}, two);
  s = store_stmt(st, "SELECT group_concat(coalesce(session, '-') || payload || coalesce(idx, '-'),"
                     " ' ') FROM (SELECT * FROM tasks WHERE id >= ?1 ORDER BY id)");
  assert_non_null(s);
  sqlite3_bind_int64(s, 1, two[0]);
  assert_int_equal(sqlite3_step(s), SQLITE_ROW);
  assert_string_equal((const char *)sqlite3_column_text(s, 0), "s11- -2- s234");
  store_reset(s);
  assert_int_equal(counts_read(st, "q", counts, &f), MUSTER_OK);
  assert_int_equal(counts[TASK_QUEUED], N + 3);
}

int main(void) {
  log_set_level(LOG_ERROR);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_backoff),
      cmocka_unit_test_setup_teardown(test_queue_settings, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_lease_order_and_keys, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_batch_tokens, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_batch_tokens_by_priority, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(test_batch_rows_range_and_list, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(test_stale_token_refused, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_refusal_names_element, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_pipeline_and_flags, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_fail_retry_dead, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_expiry_and_worker_timeout, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test(test_worker_leases_after_upgrade),
      cmocka_unit_test(test_fail_repeat_after_upgrade),
      cmocka_unit_test_setup_teardown(test_batch_too_large, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_lease_text, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_lease_text_child, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_lease_text_corrupt, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_complete_text, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_put_text, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_put_chunks, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_complete_batched, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_complete_batched_tree, fixture_setup, fixture_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
