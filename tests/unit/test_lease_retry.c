/*
 * test_lease_retry.c — a lease request sent again under its key
 * (server/lease_retry.c) against an in-memory store: what it answers, what it
 * records, what the steady state pays for it, and a store of the schema
 * before the record, upgraded.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>
#include <unistd.h>

#include "server/lease_retry.h"
#include "server/log.h"
#include "server/task.h"
#include "store_fixture.h"

/* The schema version before workers.lease_request (store_schema.c). */
#define VERSION_BEFORE_LEASE_REQUESTS 19

static void put_tasks(const char *queue, int n) {
  fail_t f = {0};
  for (int i = 0; i < n; i++) {
    json_t *body = json_pack("{s:[{s:i}]}", "tasks", "payload", i);
    json_t *out = task_put(st, queue, body, 1 << 20, &f);
    assert_non_null(out);
    json_decref(out);
    json_decref(body);
  }
}

/* A worker row, written as any schema has it. */
static int64_t add_worker(void) {
  sqlite3 *db = store_db(st);
  assert_int_equal(sqlite3_exec(db,
                                "INSERT INTO workers(name, nickname, state, last_seen_ms,"
                                " created_ms, timeout_ms) VALUES('w', 'n', 0, 0, 0, 60000)",
                                NULL, NULL, NULL),
                   SQLITE_OK);
  return sqlite3_last_insert_rowid(db);
}

/* A lease request of `worker` under `request` (NULL: none), as the route
 * makes it: checked, then leased.  Returns the leases as a tree. */
static json_t *keyed_lease(const char *queue, int64_t worker, const char *request, int64_t max) {
  queue_t q;
  fail_t f = {0};
  load_queue(queue, &q);
  lease_retry_t r = {.request = request};
  assert_int_equal(lease_retry_check(st, worker, &r, &f), MUSTER_OK);
  size_t count;
  int64_t max_task = 0;
  json_t *raw = lease_acquire_retry(st, &q, worker, max, &r, &count, &max_task, &f);
  assert_non_null(raw);
  json_t *leases = reply_tree(raw);
  json_decref(raw);
  assert_int_equal(json_array_size(leases), count);
  return leases;
}

/* "task:token ..." of `leases` (freed), for comparing two answers. */
static char *held(json_t *leases) {
  char *text = calloc(1, 4096);
  size_t i;
  json_t *l;
  json_array_foreach(leases, i, l) {
    size_t at = strlen(text);
    snprintf(text + at, 4096 - at, "%lld:%lld ", (long long)jint(l, "task"),
             (long long)jint(l, "token"));
  }
  json_decref(leases);
  return text;
}

static void assert_same(char *a, char *b) {
  assert_string_equal(a, b);
  free(a);
  free(b);
}

/* The same key answers the same leases; a new key, no key, another worker
 * lease anew; the record is one write per keyed request that leased, and a
 * request without a key reads and writes none of it. */
static void test_repeat_and_cost(void **unused) {
  make_queue("q", "{\"lease_ms\": 600000}");
  put_tasks("q", 6);
  int64_t w = add_worker(), other = add_worker();
  int records = stmt_runs("SET lease_request"), checks = stmt_runs("SELECT state, lease_request");
  char *first = held(keyed_lease("q", w, "k1", 2));
  assert_int_equal(stmt_runs("SET lease_request") - records, 1);
  assert_int_equal(stmt_runs("SELECT state, lease_request") - checks, 1);
  assert_same(held(keyed_lease("q", w, "k1", 2)), strdup(first));
  assert_int_equal(stmt_runs("SET lease_request") - records, 1); /* a repeat records nothing */
  /* Another worker's same key, no key, a new key: new tasks each. */
  char *theirs = held(keyed_lease("q", other, "k1", 1));
  assert_string_not_equal(theirs, first);
  free(theirs);
  records = stmt_runs("SET lease_request");
  checks = stmt_runs("SELECT state, lease_request");
  char *plain = held(keyed_lease("q", w, NULL, 1));
  assert_int_equal(stmt_runs("SET lease_request"), records);
  assert_int_equal(stmt_runs("SELECT state, lease_request"), checks);
  assert_same(held(keyed_lease("q", w, "k1", 2)), first); /* k1 is still the last key */
  char *second = held(keyed_lease("q", w, "k2", 1));
  assert_string_not_equal(second, plain);
  assert_same(held(keyed_lease("q", w, "k2", 1)), second);
  free(plain);
}

/* A store of the schema before the record opens, upgraded: a lease held
 * across the upgrade stays as it was, and keyed requests work after it. */
static void test_upgrade(void **unused) {
  char dir[] = "/tmp/muster-test-lease-retry.XXXXXX", path[80], wal[96];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/muster.db", dir);
  fail_t f = {0};
  st = store_open(&(store_opts_t){.path = path, .schema_version = VERSION_BEFORE_LEASE_REQUESTS},
                  &f);
  assert_non_null(st);
  assert_int_equal(store_request_begin(st, &f), MUSTER_OK);
  make_queue("q", "{\"lease_ms\": 600000}");
  put_tasks("q", 3);
  int64_t w = add_worker();
  queue_t q;
  load_queue("q", &q);
  json_t *before = lease_acquire(st, &q, w, 1, &f);
  assert_int_equal(json_array_size(before), 1);
  assert_int_equal(fixture_close(), 0);

  st = store_open(&(store_opts_t){.path = path}, &f);
  assert_non_null(st);
  sqlite3_stmt *s;
  assert_int_equal(sqlite3_prepare_v2(store_db(st), "PRAGMA user_version", -1, &s, NULL),
                   SQLITE_OK);
  assert_int_equal(sqlite3_step(s), SQLITE_ROW);
  assert_true(sqlite3_column_int(s, 0) > VERSION_BEFORE_LEASE_REQUESTS);
  sqlite3_finalize(s);
  assert_int_equal(store_request_begin(st, &f), MUSTER_OK);
  /* The two tasks after the one leased before the upgrade, which stays leased. */
  json_t *leases = keyed_lease("q", w, "k1", 5);
  assert_int_equal(json_array_size(leases), 2);
  char *first = held(leases);
  assert_same(held(keyed_lease("q", w, "k1", 5)), strdup(first));
  json_t *task = task_get(st, jint(json_array_get(before, 0), "task"), &f);
  assert_string_equal(json_string_value(json_object_get(task, "state")), "leased");
  json_decref(task);
  json_decref(before);
  free(first);
  assert_int_equal(fixture_close(), 0);
  unlink(path);
  snprintf(wal, sizeof wal, "%s-wal", path);
  unlink(wal);
  rmdir(dir);
}

int main(void) {
  log_set_level(LOG_ERROR);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_repeat_and_cost, fixture_setup, fixture_teardown),
      cmocka_unit_test(test_upgrade),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
