/*
 * test_worker_gone.c — a store of the schema before workers kept why and
 * when they went (gone_reason, gone_at_ms: schema version 24) and before
 * the index of failed and dead tasks by time (tasks_ended: version 25),
 * upgraded: a worker gone before says "unknown" and no time, one active
 * across the upgrade gets its reason when it goes, and the newest dead
 * tasks of before are listed by when they died, through the new index.
 * Every way a worker ends is tested against a running head in
 * tests/integration/test_worker_gone.py.
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

#include "server/log.h"
#include "server/task.h"
#include "server/worker.h"
#include "sql_helpers.h"
#include "store_fixture.h"

/* The schema version before workers.gone_reason (store_schema.c). */
#define VERSION_BEFORE_GONE 23

static char dir[64], path[80];

/* The store as a head of VERSION_BEFORE_GONE left it: worker 1 gone,
 * worker 2 active; in queue q, dead tasks 1 and 2, task 1 dead last (it was
 * requeued and died again), and failed task 3. */
static void old_store(void) {
  snprintf(dir, sizeof dir, "/tmp/muster-test-worker-gone.XXXXXX");
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/muster.db", dir);
  fail_t f = {0};
  st = store_open(&(store_opts_t){.path = path, .schema_version = VERSION_BEFORE_GONE}, &f);
  assert_non_null(st);
  assert_int_equal(store_request_begin(st, &f), MUSTER_OK);
  make_queue("q", "{}");
  exec_sql(store_db(st),
           "INSERT INTO workers(id, name, nickname, state, last_seen_ms, created_ms, timeout_ms)"
           " VALUES(1, 'w1', 'n', 1, 5, 1, 60000), (2, 'w2', 'n', 0, 5, 1, 60000);"
           "INSERT INTO tasks(id, queue, state, priority, run_at_ms, payload, error,"
           " created_ms, updated_ms) VALUES"
           " (1, 'q', 4, 0, 0, '1', 'second death', 1, 3000),"
           " (2, 'q', 4, 0, 0, '2', 'died once', 1, 2000),"
           " (3, 'q', 3, 0, 0, '3', 'failed', 1, 2500);");
  assert_int_equal(fixture_close(), 0);
  st = store_open(&(store_opts_t){.path = path}, &f);
  assert_non_null(st);
  assert_true(query_int(store_db(st), "PRAGMA user_version") > VERSION_BEFORE_GONE + 1);
  assert_int_equal(store_request_begin(st, &f), MUSTER_OK);
}

/* Worker `id` as GET /v1/workers/{id} gives it (caller decrefs). */
static json_t *worker(int64_t id) {
  fail_t f = {0};
  json_t *w = worker_get(st, id, &f);
  assert_non_null(w);
  return w;
}

static void test_workers_upgraded(void **unused) {
  (void)unused;
  old_store();
  json_t *gone = worker(1), *active = worker(2);
  assert_string_equal(json_string_value(json_object_get(gone, "gone_reason")), "unknown");
  assert_true(json_is_null(json_object_get(gone, "gone_at_ms")));
  assert_true(json_is_null(json_object_get(active, "gone_reason")));
  assert_true(json_is_null(json_object_get(active, "gone_at_ms")));
  json_decref(gone);
  json_decref(active);

  fail_t f = {0};
  int64_t before = now_ms();
  json_decref(worker_bye(st, 2, &f));
  assert_int_equal(f.code, MUSTER_OK);
  json_t *left = worker(2);
  assert_string_equal(json_string_value(json_object_get(left, "gone_reason")), "bye");
  assert_true(jint(left, "gone_at_ms") >= before && jint(left, "gone_at_ms") <= now_ms());
  json_decref(left);
  assert_int_equal(fixture_close(), 0);
  fixture_remove_store_files(dir, path);
}

/* The ids of the page task_list_recent_text writes for `state`. */
static void assert_recent(int state, const int64_t *want, size_t n) {
  jw_buf_t out = {0};
  fail_t f = {0};
  assert_int_equal(task_list_recent_text(st, "q", state, 20, true, &out, &f), MUSTER_OK);
  json_t *page = text_tree(&out), *tasks = json_object_get(page, "tasks");
  assert_int_equal(json_array_size(tasks), n);
  for (size_t i = 0; i < n; i++)
    assert_int_equal(jint(json_array_get(tasks, i), "id"), want[i]);
  assert_true(json_is_null(json_object_get(page, "next")));
  json_decref(page);
}

static void test_dead_tasks_by_time_upgraded(void **unused) {
  (void)unused;
  old_store();
  assert_recent(TASK_DEAD, (const int64_t[]){1, 2}, 2);
  assert_recent(TASK_FAILED, (const int64_t[]){3}, 1);
  assert_true(stmt_runs("INDEXED BY tasks_ended") > 0);
  assert_int_equal(fixture_close(), 0);
  fixture_remove_store_files(dir, path);
}

int main(void) {
  log_set_level(LOG_ERROR);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_workers_upgraded),
      cmocka_unit_test(test_dead_tasks_by_time_upgraded),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
