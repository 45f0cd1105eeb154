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

#include "server/lease.h"
#include "server/log.h"
#include "server/queue.h"
#include "server/task.h"
#include "server/worker.h"
#include "store_fixture.h"


static int64_t put(const char *queue, const char *task_json) {
  char text[512];
  snprintf(text, sizeof text, "{\"tasks\": [%s]}", task_json);
  json_t *body = json_loads(text, 0, NULL);
  fail_t f = {0};
  json_t *out = task_put(st, queue, body, 1 << 20, &f);
  assert_non_null(out);
  int64_t id = json_integer_value(json_object_get(json_array_get(json_object_get(out, "tasks"), 0), "id"));
  json_decref(out);
  json_decref(body);
  return id;
}

/* Leases up to max tasks; returns the array (caller decrefs). */
static json_t *lease(const char *queue, int64_t max) {
  queue_t q;
  fail_t f = {0};
  assert_int_equal(queue_load(st, queue, &q, &f), MUSTER_OK);
  json_t *leases = lease_acquire(st, &q, 0, max, &f);
  assert_non_null(leases);
  return leases;
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
  json_t *task = task_get(st, id, &f);
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
  put("q", "{\"payload\": 5, \"delay_ms\": 100000}");                  /* not ready */
  json_t *leases = lease("q", 10);
  assert_int_equal(json_array_size(leases), 3);
  assert_int_equal(jint(json_array_get(leases, 0), "task"), high);
  assert_int_equal(jint(json_array_get(leases, 1), "task"), low);
  assert_int_equal(jint(json_array_get(leases, 2), "task"), low2);
  /* Fencing tokens strictly increase. */
  assert_true(jint(json_array_get(leases, 1), "token") > jint(json_array_get(leases, 0), "token"));
  json_decref(leases);
}

static void test_stale_token_refused(void **unused) {
  make_queue("q", "{}");
  int64_t id = put("q", "{\"payload\": \"x\"}");
  json_t *l = lease("q", 1);
  int64_t token = jint(json_array_get(l, 0), "token");
  json_decref(l);
  assert_int_equal(apply(LEASE_COMPLETE, id, token + 1, NULL), MUSTER_LEASE_LOST);
  assert_string_equal(state_of(id), "leased");
  assert_int_equal(apply(LEASE_RELEASE, id, token, NULL), MUSTER_OK);
  assert_int_equal(apply(LEASE_COMPLETE, id, token, NULL), MUSTER_LEASE_LOST);
  assert_string_equal(state_of(id), "queued");
  assert_int_equal(apply(LEASE_COMPLETE, 9999, 1, NULL), MUSTER_TASK_NOT_FOUND);
}

static void test_pipeline_and_flags(void **unused) {
  make_queue("b", "{\"max_flags\": 2}");
  make_queue("a", "{\"next\": \"b\"}");
  int64_t parent = put("a", "{\"payload\": \"in\", \"session\": \"s\", \"index\": 4}");
  json_t *l = lease("a", 1);
  assert_int_equal(apply(LEASE_COMPLETE, parent, jint(json_array_get(l, 0), "token"),
                         ", \"result\": \"out\""), MUSTER_OK);
  json_decref(l);
  assert_string_equal(state_of(parent), "done");
  for (int round = 1; round <= 2; round++) {
    l = lease("b", 1);
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
    json_t *l = lease("q", 1);
    assert_int_equal(json_array_size(l), 1);
    assert_int_equal(jint(json_array_get(l, 0), "attempt"), attempt);
    assert_int_equal(apply(LEASE_FAIL, id, jint(json_array_get(l, 0), "token"),
                           ", \"error\": \"boom\""), MUSTER_OK);
    json_decref(l);
  }
  assert_string_equal(state_of(id), "dead");
  fail_t f = {0};
  json_t *t = task_requeue(st, id, &f);
  assert_non_null(t);
  assert_string_equal(json_string_value(json_object_get(t, "state")), "queued");
  assert_int_equal(jint(t, "attempts"), 0);
  json_decref(t);
}

static void test_expiry_and_worker_timeout(void **unused) {
  make_queue("q", "{\"lease_ms\": 1000, \"backoff_ms\": 0, \"backoff_max_ms\": 0}");
  int64_t id = put("q", "{\"payload\": 1}");
  json_decref(lease("q", 1));
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

int main(void) {
  log_set_level(LOG_ERROR);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_backoff),
      cmocka_unit_test_setup_teardown(test_queue_settings, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_lease_order_and_keys, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_stale_token_refused, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_pipeline_and_flags, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_fail_retry_dead, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_expiry_and_worker_timeout, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_batch_too_large, fixture_setup, fixture_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
