/*
 * test_counts.c — unit tests of the task counts per queue and state
 * (counts.c): every kind of transition, driven through the domain functions
 * against an in-memory store (the removals in chunks of queue_reap.c too),
 * followed by a recount of the tasks themselves;
 * a savepoint rolled back takes its counts with it; listing by state reads
 * the same tasks through each of its indexes; and a store at the schema
 * version before the counts (6) upgrades with its tasks counted.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server/counts.h"
#include "server/lease.h"
#include "server/log.h"
#include "server/node.h"
#include "server/queue.h"
#include "server/queue_reap.h"
#include "server/session.h"
#include "server/task.h"
#include "server/worker.h"
#include "sql_helpers.h"
#include "store_fixture.h"

/* The schema version before queue_counts: the migration test starts there. */
#define VERSION_BEFORE_COUNTS 6

/* ---- the check ---- */

/* Fails unless what counts_read gives (the rows and the open transaction's
 * changes not written yet) agrees with a recount of the tasks, for every
 * queue that has tasks or rows. */
static void check_read(const char *step) {
  static const char *const queues = "SELECT queue FROM tasks UNION SELECT queue FROM queue_counts";
  static const char *const recount = "SELECT count(*) FROM tasks WHERE queue = ?1 AND state = ?2";
  sqlite3_stmt *q = NULL, *c = NULL;
  assert_int_equal(sqlite3_prepare_v2(store_db(st), queues, -1, &q, NULL), SQLITE_OK);
  assert_int_equal(sqlite3_prepare_v2(store_db(st), recount, -1, &c, NULL), SQLITE_OK);
  while (sqlite3_step(q) == SQLITE_ROW) {
    const char *queue = (const char *)sqlite3_column_text(q, 0);
    int64_t by_state[TASK_STATE_COUNT];
    fail_t f = {0};
    assert_int_equal(counts_read(st, queue, by_state, &f), MUSTER_OK);
    for (int state = 0; state < TASK_STATE_COUNT; state++) {
      sqlite3_bind_text(c, 1, queue, -1, SQLITE_TRANSIENT);
      sqlite3_bind_int(c, 2, state);
      assert_int_equal(sqlite3_step(c), SQLITE_ROW);
      int64_t there = sqlite3_column_int64(c, 0);
      sqlite3_reset(c);
      if (by_state[state] != there)
        fail_msg("after %s, before the commit: queue %s, state %s: read %lld, there are %lld", step,
                 queue, task_state_name(state), (long long)by_state[state], (long long)there);
    }
  }
  sqlite3_finalize(c);
  sqlite3_finalize(q);
}

/* Fails unless queue_counts agrees with a recount of the tasks: every row
 * holds its (queue, state)'s number of tasks, and every (queue, state) with
 * tasks has a row.  Inside a transaction the count changes wait for its
 * commit (counts.c), so this first checks what readers see, then commits the
 * transaction and checks the rows alone.  `step` names what just happened,
 * for the message. */
static void check_recount(const char *step) {
  check_read(step);
  fail_t f = {0};
  store_request_end(st, true);
  assert_int_equal(store_commit(st, &f), MUSTER_OK);
  assert_int_equal(store_request_begin(st, &f), MUSTER_OK);
  static const char *const sql =
      "SELECT c.queue, c.state, c.n,"
      " (SELECT count(*) FROM tasks t WHERE t.queue = c.queue AND t.state = c.state)"
      " FROM queue_counts c"
      " UNION ALL SELECT t.queue, t.state, 0, count(*) FROM tasks t WHERE NOT EXISTS"
      " (SELECT 1 FROM queue_counts c WHERE c.queue = t.queue AND c.state = t.state)"
      " GROUP BY t.queue, t.state";
  sqlite3_stmt *s = NULL;
  assert_int_equal(sqlite3_prepare_v2(store_db(st), sql, -1, &s, NULL), SQLITE_OK);
  while (sqlite3_step(s) == SQLITE_ROW)
    if (sqlite3_column_int64(s, 2) != sqlite3_column_int64(s, 3))
      fail_msg("after %s: queue %s, state %s: counted %lld, there are %lld", step,
               (const char *)sqlite3_column_text(s, 0), task_state_name(sqlite3_column_int(s, 1)),
               (long long)sqlite3_column_int64(s, 2), (long long)sqlite3_column_int64(s, 3));
  sqlite3_finalize(s);
}

/* Checks the recount, then that the queue object (what GET /v1/queues/Q
 * shows) reads `want` ("queued leased done failed dead cancelled"). */
static void expect(const char *step, const char *queue, const char *want) {
  check_recount(step);
  queue_t q;
  fail_t f = {0};
  assert_int_equal(queue_load(st, queue, &q, &f), MUSTER_OK);
  json_t *obj = queue_to_json(st, &q);
  assert_non_null(obj);
  const json_t *counts = json_object_get(obj, "counts");
  char got[128] = "";
  for (int state = 0; state < TASK_STATE_COUNT; state++)
    snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", state ? " " : "",
             (long long)jint(counts, task_state_name(state)));
  json_decref(obj);
  if (strcmp(got, want) != 0)
    fail_msg("after %s: queue %s counts %s, expected %s", step, queue, got, want);
}

/* ---- driving the domain functions ---- */

/* Puts the tasks of the JSON array `tasks`; returns the first id. */
static int64_t put(const char *queue, const char *tasks) {
  char text[1024];
  snprintf(text, sizeof text, "{\"tasks\": %s}", tasks);
  json_t *body = parse(text);
  fail_t f = {0};
  json_t *out = task_put(st, queue, body, 1 << 20, &f);
  assert_non_null(out);
  json_t *tree = reply_tree(out); /* "tasks" is a raw node */
  int64_t id = jint(json_array_get(json_object_get(tree, "tasks"), 0), "id");
  json_decref(tree);
  json_decref(out);
  json_decref(body);
  return id;
}

/* Leases up to `max` tasks for `worker` (0: none); the caller decrefs. */
static json_t *lease(const char *queue, int64_t worker, int64_t max) {
  queue_t q;
  fail_t f = {0};
  assert_int_equal(queue_load(st, queue, &q, &f), MUSTER_OK);
  json_t *leases = lease_acquire(st, &q, worker, max, &f);
  assert_non_null(leases);
  return leases;
}

/* Applies `op` to lease `i` of `leases` with `extra` fields; the error code. */
static muster_err_t apply(lease_op_t op, const json_t *leases, size_t i, const char *extra) {
  const json_t *l = json_array_get(leases, i);
  char text[512];
  snprintf(text, sizeof text, "{\"leases\": [{\"task\": %lld, \"token\": %lld%s}]}",
           (long long)jint(l, "task"), (long long)jint(l, "token"), extra ? extra : "");
  json_t *body = parse(text);
  fail_t f = {0};
  json_t *out = lease_apply(st, op, body, 1 << 20, &f);
  json_decref(out);
  json_decref(body);
  return out ? MUSTER_OK : f.code;
}

static int64_t register_worker(const char *text) {
  json_t *body = parse(text);
  fail_t f = {0};
  json_t *w = worker_register(st, body, 60000, &f);
  assert_non_null(w);
  int64_t id = jint(w, "id");
  json_decref(w);
  json_decref(body);
  return id;
}

/* Puts `n` tasks into `queue`, 1000 a request. */
static void put_many(const char *queue, int n) {
  for (int first = 0; first < n; first += 1000) {
    json_t *tasks = json_array();
    for (int i = first; i < n && i < first + 1000; i++)
      json_array_append_new(tasks, json_pack("{s:i}", "payload", i));
    json_t *body = json_pack("{s:o}", "tasks", tasks);
    fail_t f = {0};
    json_t *out = task_put(st, queue, body, 1 << 20, &f);
    assert_non_null(out);
    json_decref(out);
    json_decref(body);
  }
}

/* Leases `n` tasks of `queue` (at most 1000) and completes them. */
static void complete_some(const char *queue, size_t n) {
  json_t *l = lease(queue, 0, (int64_t)n);
  assert_int_equal(json_array_size(l), n);
  for (size_t i = 0; i < n; i++)
    assert_int_equal(apply(LEASE_COMPLETE, l, i, NULL), MUSTER_OK);
  json_decref(l);
}

/* ---- transitions ---- */

static void test_put_lease_complete_fail(void **unused) {
  make_queue("q", "{\"max_attempts\": 2, \"backoff_ms\": 0, \"backoff_max_ms\": 0}");
  expect("create", "q", "0 0 0 0 0 0");
  put("q", "[{\"payload\": 1}]");
  expect("put one", "q", "1 0 0 0 0 0");
  put("q", "[{\"payload\": 2}, {\"payload\": 3}, {\"payload\": 4, \"key\": \"k\"},"
           " {\"payload\": 5}, {\"payload\": 6}]");
  expect("put batch", "q", "6 0 0 0 0 0");
  put("q", "[{\"payload\": 7, \"key\": \"k\"}]");
  expect("put of an existing key", "q", "6 0 0 0 0 0");

  json_t *l = lease("q", 0, 5);
  assert_int_equal(json_array_size(l), 5);
  expect("lease batch", "q", "1 5 0 0 0 0");
  assert_int_equal(apply(LEASE_EXTEND, l, 0, ", \"lease_ms\": 5000"), MUSTER_OK);
  expect("extend", "q", "1 5 0 0 0 0");
  assert_int_equal(apply(LEASE_COMPLETE, l, 0, ", \"result\": 1"), MUSTER_OK);
  expect("complete", "q", "1 4 1 0 0 0");
  assert_int_equal(apply(LEASE_COMPLETE, l, 0, NULL), MUSTER_OK); /* a repeat */
  expect("complete repeated", "q", "1 4 1 0 0 0");
  assert_int_equal(apply(LEASE_EXTEND, l, 0, NULL), MUSTER_LEASE_LOST);
  expect("extend refused", "q", "1 4 1 0 0 0");
  assert_int_equal(apply(LEASE_FAIL, l, 1, ", \"permanent\": true"), MUSTER_OK);
  expect("fail permanently", "q", "1 3 1 1 0 0");
  assert_int_equal(apply(LEASE_FAIL, l, 2, ", \"error\": \"again\""), MUSTER_OK);
  expect("fail with a retry", "q", "2 2 1 1 0 0");
  assert_int_equal(apply(LEASE_RELEASE, l, 3, NULL), MUSTER_OK);
  expect("release", "q", "3 1 1 1 0 0");
  json_decref(l);

  /* The task failed once above is leased again and fails out of attempts. */
  l = lease("q", 0, 3);
  assert_int_equal(json_array_size(l), 3);
  expect("lease again", "q", "0 4 1 1 0 0");
  for (size_t i = 0; i < 3; i++)
    assert_int_equal(apply(LEASE_FAIL, l, i, NULL), MUSTER_OK);
  expect("fails, one out of attempts", "q", "2 1 1 1 1 0");
  json_decref(l);

  /* Lowering max_attempts makes leasing send the used-up tasks to dead. */
  make_queue("q", "{\"max_attempts\": 1}");
  l = lease("q", 0, 10);
  assert_int_equal(json_array_size(l), 0);
  json_decref(l);
  expect("lease finds only tasks out of attempts", "q", "0 1 1 1 3 0");
}

static void test_requeue_purge_delete(void **unused) {
  make_queue("q", "{\"max_attempts\": 1, \"backoff_ms\": 0, \"backoff_max_ms\": 0}");
  int64_t first = put("q", "[{\"payload\": 1}, {\"payload\": 2}, {\"payload\": 3},"
                           " {\"payload\": 4}, {\"payload\": 5}, {\"payload\": 6}]");
  json_t *l = lease("q", 0, 4);
  assert_int_equal(apply(LEASE_FAIL, l, 0, NULL), MUSTER_OK);
  assert_int_equal(apply(LEASE_FAIL, l, 1, NULL), MUSTER_OK);
  assert_int_equal(apply(LEASE_FAIL, l, 2, ", \"permanent\": true"), MUSTER_OK);
  expect("setup", "q", "2 1 0 1 2 0");

  fail_t f = {0};
  json_t *t = tree_of(task_requeue(st, jint(json_array_get(l, 0), "task"), &f));
  assert_non_null(t);
  json_decref(t);
  expect("requeue a dead task", "q", "3 1 0 1 1 0");
  assert_null(tree_of(task_requeue(st, first + 5, &f)));
  expect("requeue of a queued task refused", "q", "3 1 0 1 1 0");
  t = tree_of(task_requeue(st, jint(json_array_get(l, 2), "task"), &f));
  assert_non_null(t);
  json_decref(t);
  expect("requeue a failed task", "q", "4 1 0 0 1 0");

  json_t *again = lease("q", 0, 1);
  assert_int_equal(apply(LEASE_FAIL, again, 0, ", \"permanent\": true"), MUSTER_OK);
  json_decref(again);
  expect("fail one more", "q", "3 1 0 1 1 0");
  int64_t n = 0, sessions = 0;
  bool pending = false;
  assert_int_equal(queue_requeue(st, "q", &n, &f), MUSTER_OK);
  assert_int_equal(n, 2);
  expect("requeue the queue's failed and dead", "q", "5 1 0 0 0 0");

  assert_int_equal(queue_purge(st, "q", &n, &f), MUSTER_OK);
  assert_int_equal(n, 5);
  expect("purge", "q", "0 1 0 0 0 0");
  assert_int_equal(apply(LEASE_COMPLETE, l, 3, NULL), MUSTER_OK);
  expect("complete after the purge", "q", "0 0 1 0 0 0");
  json_decref(l);

  put("q", "[{\"payload\": 7}, {\"payload\": 8}]");
  make_queue("other", "{}");
  put("other", "[{\"payload\": 9}]");
  assert_int_equal(queue_delete(st, "q", &n, &sessions, &pending, &f), MUSTER_OK);
  assert_int_equal(n, 3);
  check_recount("queue delete");
  int64_t by_state[TASK_STATE_COUNT];
  assert_int_equal(counts_read(st, "q", by_state, &f), MUSTER_OK);
  for (int state = 0; state < TASK_STATE_COUNT; state++)
    assert_int_equal(by_state[state], 0);
  expect("another queue's delete", "other", "1 0 0 0 0 0");
  make_queue("q", "{}");
  expect("the queue made again", "q", "0 0 0 0 0 0");
}

static void test_lapses(void **unused) {
  make_queue("q", "{\"lease_ms\": 1000, \"max_attempts\": 9, \"backoff_ms\": 0,"
                  " \"backoff_max_ms\": 0}");
  put("q", "[{\"payload\": 1}, {\"payload\": 2}, {\"payload\": 3}, {\"payload\": 4},"
           " {\"payload\": 5}]");
  json_t *l = lease("q", 0, 2);
  json_decref(l);
  assert_int_equal(lease_expire_due(st, now_ms() + 2000, 100), 2);
  expect("lease expiry", "q", "5 0 0 0 0 0");

  int64_t timing_out = register_worker("{\"timeout_ms\": 1000}");
  json_decref(lease("q", timing_out, 2));
  expect("leases of a worker", "q", "3 2 0 0 0 0");
  assert_int_equal(worker_expire_due(st, now_ms() + 5000), 1);
  expect("worker timeout", "q", "5 0 0 0 0 0");

  fail_t f = {0};
  int64_t leaving = register_worker("{}");
  json_decref(lease("q", leaving, 2));
  json_t *out = worker_bye(st, leaving, &f);
  assert_non_null(out);
  json_decref(out);
  expect("worker bye", "q", "5 0 0 0 0 0");

  int64_t crashing = register_worker("{}");
  json_decref(lease("q", crashing, 3));
  out = worker_leave(st, crashing, true, &f);
  assert_non_null(out);
  json_decref(out);
  expect("worker crashed", "q", "5 0 0 0 0 0");

  bool created = false;
  json_t *body = parse("{\"name\": \"n1\", \"timeout_ms\": 1000}");
  out = node_register(st, body, 15000, &created, &f);
  assert_non_null(out);
  json_decref(out);
  json_decref(body);
  int64_t on_node = register_worker("{\"node\": \"n1\"}");
  json_decref(lease("q", on_node, 4));
  expect("leases on a node", "q", "1 4 0 0 0 0");
  assert_int_equal(node_expire_due(st, now_ms() + 60000), 1);
  expect("node timeout", "q", "5 0 0 0 0 0");
}

static void test_flags_and_pipelines(void **unused) {
  make_queue("b", "{\"max_flags\": 2}");
  make_queue("a", "{\"next\": \"b\", \"max_flags\": 1}");
  int64_t parent = put("a", "[{\"payload\": \"in\"}, {\"payload\": \"lone\"}]");
  json_t *l = lease("a", 0, 1);
  assert_int_equal(jint(json_array_get(l, 0), "task"), parent);
  assert_int_equal(apply(LEASE_COMPLETE, l, 0, ", \"result\": \"out\""), MUSTER_OK);
  json_decref(l);
  expect("complete into the next stage", "a", "1 0 1 0 0 0");
  expect("the next stage's task", "b", "1 0 0 0 0 0");

  l = lease("b", 0, 1);
  assert_int_equal(apply(LEASE_FLAG, l, 0, ", \"reason\": \"bad\""), MUSTER_OK);
  json_decref(l);
  expect("flag below max_flags", "b", "1 0 0 0 0 0");
  l = lease("b", 0, 1);
  assert_int_equal(apply(LEASE_FLAG, l, 0, NULL), MUSTER_OK);
  json_decref(l);
  expect("flag at max_flags: cancelled", "b", "0 0 0 0 0 1");
  expect("its parent re-opened", "a", "2 0 0 0 0 0");

  l = lease("a", 0, 2);
  const json_t *lone = json_array_get(l, 0);
  size_t lone_at = jint(lone, "task") == parent ? 1 : 0;
  assert_int_equal(apply(LEASE_FLAG, l, lone_at, NULL), MUSTER_OK);
  expect("flag at max_flags without a parent: dead", "a", "0 1 0 0 1 0");
  json_decref(l);
}

static void test_sessions(void **unused) {
  make_queue("b", "{}");
  make_queue("a", "{\"next\": \"b\", \"backoff_ms\": 0, \"backoff_max_ms\": 0}");
  fail_t f = {0};
  json_t *body = parse("{\"queue\": \"a\", \"timeout_ms\": 1000}");
  json_t *s = session_create(st, body, 1 << 20, &f);
  json_decref(body);
  assert_non_null(s);
  char id[SESSION_ID_LEN + 1];
  snprintf(id, sizeof id, "%s", json_string_value(json_object_get(s, "id")));
  json_decref(s);

  body = parse("{\"tasks\": [{\"payload\": 0}, {\"payload\": 1}, {\"payload\": 2},"
               " {\"payload\": 3}, {\"payload\": 4, \"index\": 9}]}");
  json_t *out = session_submit(st, id, body, 1 << 20, &f);
  json_decref(body);
  assert_non_null(out);
  json_decref(out);
  put("a", "[{\"payload\": \"not in the session\"}]");
  expect("session submit", "a", "6 0 0 0 0 0");

  json_t *l = lease("a", 0, 4);
  assert_int_equal(apply(LEASE_COMPLETE, l, 0, ", \"result\": 0"), MUSTER_OK);
  assert_int_equal(apply(LEASE_FAIL, l, 1, ", \"permanent\": true"), MUSTER_OK);
  json_decref(l);
  expect("session tasks done and failed", "a", "2 2 1 1 0 0");
  expect("a session task in the next stage", "b", "1 0 0 0 0 0");

  out = session_close(st, id, "by its client", &f);
  assert_non_null(out);
  /* Cancelled: index 9 (queued) and two leased in a, the next stage's task in b. */
  assert_int_equal(jint(out, "cancelled"), 4);
  assert_int_equal(jint(out, "deleted"), 6);
  json_decref(out);
  expect("session close", "a", "1 0 0 0 0 0");
  expect("session close, next stage", "b", "0 0 0 0 0 0");

  body = parse("{\"queue\": \"a\", \"timeout_ms\": 100}");
  s = session_create(st, body, 1 << 20, &f);
  json_decref(body);
  assert_non_null(s);
  snprintf(id, sizeof id, "%s", json_string_value(json_object_get(s, "id")));
  json_decref(s);
  body = parse("{\"tasks\": [{\"payload\": 0}, {\"payload\": 1}]}");
  json_decref(session_submit(st, id, body, 1 << 20, &f));
  json_decref(body);
  json_decref(lease("a", 0, 2)); /* the task outside the session and index 0 */
  expect("a second session", "a", "1 2 0 0 0 0");
  assert_int_equal(session_expire_due(st, now_ms() + 60000, NULL, NULL), 1);
  expect("session expiry", "a", "0 1 0 0 0 0");
}

/* The removals in chunks (queue_reap.c), the counts checked after each: a big
 * queue's deletion leaves its tasks in the trash, each chunk takes its tasks
 * out of the counts and the last drops them; a purge in chunks up to its
 * horizon; a pass of retention over done tasks. */
static void test_chunked_removals(void **unused) {
  fail_t f = {0};
  int64_t n = 0, sessions = 0, total = 0;
  bool pending = false, finished = false;
  make_queue("t", "{}");
  put_many("t", 2500);
  complete_some("t", 300);
  json_decref(lease("t", 0, 400));
  expect("setup", "t", "1800 400 300 0 0 0");
  assert_int_equal(queue_delete(st, "t", &n, &sessions, &pending, &f), MUSTER_OK);
  assert_true(pending);
  assert_int_equal(n, 2500);
  check_recount("the queue to the trash, its leased tasks deleted");
  assert_int_equal(queue_trash_check(st, "t", &f), MUSTER_INVALID_STATE);
  for (int chunk = 0; !finished; chunk++) {
    assert_true(chunk < 3);
    assert_int_equal(queue_trash_step(st, "t", QUEUE_CHUNK, &n, &finished, &f), MUSTER_OK);
    check_recount("a chunk of the trash");
  }
  assert_int_equal(query_int(store_db(st), "SELECT count(*) FROM queue_counts WHERE queue = 't'"),
                   0);
  assert_int_equal(queue_trash_check(st, "t", &f), MUSTER_OK);

  make_queue("p", "{}");
  put_many("p", 2500);
  json_decref(lease("p", 0, 10));
  int64_t horizon = queue_purge_horizon(st);
  put_many("p", 5); /* after the purge began: they stay */
  for (finished = false; !finished; total += n) {
    assert_int_equal(queue_purge_chunk(st, "p", horizon, QUEUE_CHUNK, &n, &finished, &f),
                     MUSTER_OK);
    check_recount("a chunk of a purge");
  }
  assert_int_equal(total, 2490);
  expect("a purge in chunks", "p", "5 10 0 0 0 0");

  make_queue("r", "{\"keep_done_ms\": 0}");
  put_many("r", 1500);
  complete_some("r", 1000);
  complete_some("r", 200);
  int64_t cursor = 0;
  total = 0;
  for (bool pass_done = false; !pass_done; total += n) {
    assert_int_equal(
        queue_reap_chunk(st, "r", now_ms() + 1, QUEUE_CHUNK, &cursor, &n, &pass_done, &f),
        MUSTER_OK);
    check_recount("a chunk of retention");
  }
  assert_int_equal(total, 1200);
  expect("a pass of retention", "r", "300 0 0 0 0 0");
  queue_t q;
  assert_int_equal(queue_load(st, "r", &q, &f), MUSTER_OK);
  assert_int_equal(q.reaped, 1200);
}

/* Count changes wait for the commit (counts.c): a queue deleted and made
 * again in one transaction keeps only what came after its deletion, also when
 * the request that deleted it is rolled back in between. */
static void test_changes_wait_for_the_commit(void **unused) {
  fail_t f = {0};
  int64_t n = 0, sessions = 0;
  bool pending = false;
  make_queue("d", "{}");
  put("d", "[{\"payload\": 1}, {\"payload\": 2}]");
  expect("two puts", "d", "2 0 0 0 0 0"); /* committed */
  put("d", "[{\"payload\": 3}]");
  json_t *l = lease("d", 0, 1);
  json_decref(l);
  check_read("a put and a lease, not committed");
  assert_int_equal(queue_delete(st, "d", &n, &sessions, &pending, &f), MUSTER_OK);
  assert_int_equal(n, 3);
  make_queue("d", "{}");
  put("d", "[{\"payload\": 4}]");
  check_read("delete, make again and put, not committed");
  /* A request that deletes the queue again, rolled back: the marks go too. */
  store_request_end(st, true);
  assert_int_equal(store_request_begin(st, &f), MUSTER_OK);
  assert_int_equal(queue_delete(st, "d", &n, &sessions, &pending, &f), MUSTER_OK);
  store_request_end(st, false);
  assert_int_equal(store_request_begin(st, &f), MUSTER_OK);
  expect("the deletion rolled back", "d", "1 0 0 0 0 0");
}

/* Many queues' changes in one transaction, one queue deleted among them: the
 * commit sums them per (queue, state) through its hash table (collisions
 * included) and writes each sum once. */
static void test_many_queues_in_one_commit(void **unused) {
  fail_t f = {0};
  int64_t n = 0, sessions = 0;
  bool pending = false;
  char name[32];
  for (int i = 0; i < 40; i++) {
    snprintf(name, sizeof name, "m%d", i);
    make_queue(name, "{}");
    put(name, "[{\"payload\": 1}, {\"payload\": 2}, {\"payload\": 3}]");
    json_decref(lease(name, 0, 1));
  }
  assert_int_equal(queue_delete(st, "m7", &n, &sessions, &pending, &f), MUSTER_OK);
  make_queue("m7", "{}");
  put("m7", "[{\"payload\": 1}]");
  for (int i = 0; i < 40; i += 3) {
    snprintf(name, sizeof name, "m%d", i);
    json_decref(lease(name, 0, 1));
  }
  expect("forty queues in one commit", "m7", "1 0 0 0 0 0");
  expect("forty queues in one commit", "m0", "1 2 0 0 0 0");
  expect("forty queues in one commit", "m1", "2 1 0 0 0 0");
}

/* A request that fails half-way is rolled back to its savepoint: its counts
 * with it. */
static void test_rollback(void **unused) {
  make_queue("q", "{}");
  put("q", "[{\"payload\": 1}, {\"payload\": 2}]");
  json_t *l = lease("q", 0, 2);
  store_request_end(st, true);
  fail_t f = {0};
  assert_int_equal(store_request_begin(st, &f), MUSTER_OK);
  char text[256];
  snprintf(text, sizeof text,
           "{\"leases\": [{\"task\": %lld, \"token\": %lld}, {\"task\": %lld, \"token\": 1}]}",
           (long long)jint(json_array_get(l, 0), "task"),
           (long long)jint(json_array_get(l, 0), "token"),
           (long long)jint(json_array_get(l, 1), "task"));
  json_t *body = parse(text);
  assert_null(lease_apply(st, LEASE_COMPLETE, body, 1 << 20, &f));
  assert_int_equal(f.code, MUSTER_LEASE_LOST);
  json_decref(body);
  store_request_end(st, false);
  assert_int_equal(store_request_begin(st, &f), MUSTER_OK);
  expect("a batch refused half-way", "q", "0 2 0 0 0 0");
  json_decref(l);
}

/* A put rolled back (its request failed) gave out ids that are skipped: a
 * client never saw them, and no later task gets them either; the ids of one
 * put are consecutive, single and chunked inserts alike. */
static void test_rolled_back_ids_skipped(void **unused) {
  make_queue("q", "{}");
  int64_t first = put("q", "[{\"payload\": 1}]");
  fail_t f = {0};
  store_request_end(st, true);
  assert_int_equal(store_request_begin(st, &f), MUSTER_OK);
  assert_int_equal(put("q", "[{\"payload\": 2}, {\"payload\": 3}, {\"payload\": 4}]"), first + 1);
  store_request_end(st, false);
  assert_int_equal(store_request_begin(st, &f), MUSTER_OK);
  assert_int_equal(put("q", "[{\"payload\": 5, \"key\": \"k\"}]"), first + 4);
  assert_int_equal(store_last_task(st), first + 4);
  expect("a put rolled back", "q", "2 0 0 0 0 0");
}

/* Completes the leases of `l` at `order` (indexes) in one batch; the error code. */
static muster_err_t complete_batch(const json_t *l, const size_t *order, size_t n) {
  char text[1024] = "{\"leases\": [";
  for (size_t i = 0; i < n; i++) {
    const json_t *one = json_array_get(l, order[i]);
    snprintf(text + strlen(text), sizeof text - strlen(text), "%s{\"task\": %lld, \"token\": %lld}",
             i ? ", " : "", (long long)jint(one, "task"), (long long)jint(one, "token"));
  }
  snprintf(text + strlen(text), sizeof text - strlen(text), "]}");
  json_t *body = parse(text);
  fail_t f = {0};
  json_t *out = lease_apply(st, LEASE_COMPLETE, body, 1 << 20, &f);
  json_decref(body);
  json_decref(out);
  return out ? MUSTER_OK : f.code;
}

/* Batches are counted once per run of equal moves: a batch that mixes
 * queues writes a run each time the queue changes. */
static void test_mixed_batches(void **unused) {
  make_queue("a", "{}");
  make_queue("b", "{}");
  put("a", "[{\"payload\": 1}, {\"payload\": 2}, {\"payload\": 3}]");
  put("b", "[{\"payload\": 1}, {\"payload\": 2}]");
  json_t *la = lease("a", 0, 3), *lb = lease("b", 0, 2);
  json_t *l = json_array();
  json_array_extend(l, la);
  json_array_extend(l, lb);
  size_t order[] = {0, 3, 1, 2, 4};
  assert_int_equal(complete_batch(l, order, 5), MUSTER_OK);
  expect("a batch of two queues", "a", "0 0 3 0 0 0");
  expect("a batch of two queues", "b", "0 0 2 0 0 0");
  json_decref(l);
  json_decref(la);
  json_decref(lb);
}

/* A request that keeps its writes after an error (http.c, `keep`) keeps
 * the counts of what it changed before the error. */
static void test_kept_after_refusal(void **unused) {
  make_queue("q", "{}");
  put("q", "[{\"payload\": 1}, {\"payload\": 2}, {\"payload\": 3}]");
  json_t *l = lease("q", 0, 3);
  assert_int_equal(complete_batch(l, (size_t[]){0}, 1), MUSTER_OK);
  assert_int_equal(apply(LEASE_RELEASE, l, 1, NULL), MUSTER_OK);
  assert_int_equal(complete_batch(l, (size_t[]){2, 1}, 2), MUSTER_LEASE_LOST);
  expect("a batch refused after its first element", "q", "1 0 2 0 0 0");
  json_decref(l);

  fail_t f = {0};
  json_t *body = parse("{\"queue\": \"q\"}");
  json_t *s = session_create(st, body, 1 << 20, &f);
  json_decref(body);
  assert_non_null(s);
  body = parse("{\"tasks\": [{\"payload\": 0}, {\"payload\": 1}, {\"payload\": 2, \"index\": 0}]}");
  assert_null(session_submit(st, json_string_value(json_object_get(s, "id")), body, 1 << 20, &f));
  assert_int_equal(f.code, MUSTER_INVALID_STATE);
  json_decref(body);
  json_decref(s);
  expect("a submit refused at its third task", "q", "3 0 2 0 0 0");
}

/* ---- listing by state ---- */

/* The ids of `queue` in `state` (-1: all), `page` at a time, as "1,2,3". */
static void list_ids(const char *queue, int state, int64_t page, char *out, size_t size) {
  out[0] = '\0';
  int64_t after = 0;
  for (;;) {
    fail_t f = {0};
    json_t *r = tree_of(task_list(st, queue, state, after, page, &f));
    assert_non_null(r);
    const json_t *tasks = json_object_get(r, "tasks");
    for (size_t i = 0; i < json_array_size(tasks); i++) {
      const json_t *t = json_array_get(tasks, i);
      if (state >= 0)
        assert_string_equal(json_string_value(json_object_get(t, "state")), task_state_name(state));
      snprintf(out + strlen(out), size - strlen(out), "%s%lld", out[0] ? "," : "",
               (long long)jint(t, "id"));
    }
    const json_t *next = json_object_get(r, "next");
    after = json_is_null(next) ? 0 : json_integer_value(next);
    json_decref(r);
    if (after == 0)
      return;
  }
}

/* The ids of `queue` in `state`, from the listing of all its tasks. */
static void filter_ids(const char *queue, int state, char *out, size_t size) {
  out[0] = '\0';
  fail_t f = {0};
  json_t *r = tree_of(task_list(st, queue, -1, 0, 1000, &f));
  assert_non_null(r);
  const json_t *tasks = json_object_get(r, "tasks");
  for (size_t i = 0; i < json_array_size(tasks); i++) {
    const json_t *t = json_array_get(tasks, i);
    if (strcmp(json_string_value(json_object_get(t, "state")), task_state_name(state)) == 0)
      snprintf(out + strlen(out), size - strlen(out), "%s%lld", out[0] ? "," : "",
               (long long)jint(t, "id"));
  }
  json_decref(r);
}

static void check_listings(const char *step) {
  char listed[4096], filtered[4096];
  for (int state = 0; state < TASK_STATE_COUNT; state++) {
    for (int64_t page = 1; page <= 7; page += 3) {
      list_ids("q", state, page, listed, sizeof listed);
      filter_ids("q", state, filtered, sizeof filtered);
      if (strcmp(listed, filtered) != 0)
        fail_msg("%s: %s tasks by %lld: listed [%s], there are [%s]", step, task_state_name(state),
                 (long long)page, listed, filtered);
    }
  }
}

static void test_listing_by_state(void **unused) {
  make_queue("q", "{\"max_attempts\": 1, \"max_flags\": 1}");
  make_queue("other", "{}");
  put("q", "[{\"payload\": 0}, {\"payload\": 1}, {\"payload\": 2}, {\"payload\": 3},"
           " {\"payload\": 4}, {\"payload\": 5}, {\"payload\": 6, \"priority\": 5},"
           " {\"payload\": 7}, {\"payload\": 8}, {\"payload\": 9}]");
  put("other", "[{\"payload\": 0}, {\"payload\": 1}]");
  json_decref(lease("other", 0, 1));
  check_listings("all queued"); /* queued the bulk of the queue: by tasks_by_queue */
  json_t *l = lease("q", 0, 8);
  assert_int_equal(apply(LEASE_COMPLETE, l, 0, NULL), MUSTER_OK);
  assert_int_equal(apply(LEASE_COMPLETE, l, 1, NULL), MUSTER_OK);
  assert_int_equal(apply(LEASE_COMPLETE, l, 2, NULL), MUSTER_OK);
  assert_int_equal(apply(LEASE_FAIL, l, 3, ", \"permanent\": true"), MUSTER_OK);
  assert_int_equal(apply(LEASE_FAIL, l, 4, NULL), MUSTER_OK);
  assert_int_equal(apply(LEASE_FLAG, l, 5, NULL), MUSTER_OK);
  json_decref(l);
  expect("a mix", "q", "2 2 3 1 2 0");
  check_listings("a mix"); /* queued a minority: by tasks_ready */
}

/* ---- the migration ---- */

static void test_migration(void **unused) {
  char dir[] = "/tmp/muster-test-counts.XXXXXX", path[64];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/muster.db", dir);
  fail_t f = {0};
  st = store_open(&(store_opts_t){.path = path, .schema_version = VERSION_BEFORE_COUNTS}, &f);
  assert_non_null(st);
  sqlite3 *db = store_db(st);
  assert_int_equal(query_int(db, "PRAGMA user_version"), VERSION_BEFORE_COUNTS);
  assert_int_equal(query_int(db, "SELECT count(*) FROM sqlite_master WHERE name = 'queue_counts'"),
                   0);
  /* Tasks as the head before the counts left them: two queues, all states. */
  exec_sql(db, "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 60)"
               " INSERT INTO tasks(queue, state, priority, run_at_ms, payload, created_ms,"
               " updated_ms) SELECT CASE WHEN i % 3 = 0 THEN 'b' ELSE 'a' END, i % 6, 0, 0,"
               " 'null', 0, 0 FROM n");
  exec_sql(db, "INSERT INTO tasks(queue, state, priority, run_at_ms, payload, created_ms,"
               " updated_ms) VALUES('c', 4, 0, 0, 'null', 0, 0)");
  store_close(st);

  st = store_open(&(store_opts_t){.path = path}, &f);
  assert_non_null(st);
  db = store_db(st);
  assert_true(query_int(db, "PRAGMA user_version") > VERSION_BEFORE_COUNTS);
  assert_int_equal(
      query_int(db, "SELECT count(*) FROM sqlite_master WHERE name = 'tasks_by_state'"), 0);
  assert_int_equal(
      query_int(db, "SELECT count(*) FROM sqlite_master WHERE name = 'tasks_by_queue'"), 1);
  assert_int_equal(query_int(db, "SELECT count(*) FROM queue_counts"), 7);
  assert_int_equal(store_request_begin(st, &f), MUSTER_OK);
  check_recount("the migration");
  int64_t by_state[TASK_STATE_COUNT];
  assert_int_equal(counts_read(st, "a", by_state, &f), MUSTER_OK);
  /* i % 3 != 0 for i in 1..60: states 1, 2, 4, 5 ten times each, 0 and 3 never. */
  int64_t want_a[TASK_STATE_COUNT] = {0, 10, 10, 0, 10, 10};
  for (int state = 0; state < TASK_STATE_COUNT; state++)
    assert_int_equal(by_state[state], want_a[state]);
  assert_int_equal(counts_read(st, "c", by_state, &f), MUSTER_OK);
  assert_int_equal(by_state[TASK_DEAD], 1);
  /* And the counts go on from there. */
  make_queue("a", "{}");
  put("a", "[{\"payload\": 1}]");
  expect("a put after the migration", "a", "1 10 10 0 10 10");
  fixture_close();
  fixture_remove_store_files(dir, path);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_put_lease_complete_fail, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(test_requeue_purge_delete, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_lapses, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_flags_and_pipelines, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_sessions, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_rollback, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_rolled_back_ids_skipped, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(test_chunked_removals, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_changes_wait_for_the_commit, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(test_many_queues_in_one_commit, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(test_mixed_batches, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_kept_after_refusal, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_listing_by_state, fixture_setup, fixture_teardown),
      cmocka_unit_test(test_migration),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
