/*
 * test_queue_ready.c — the count of a queue's ready tasks (queue_count_ready,
 * `?ready=true`, the DistCompute jobCount): what a lease would take now, and
 * bounded in what it reads, however many tasks wait.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>

#include "server/lease.h"
#include "server/log.h"
#include "server/queue.h"
#include "server/task.h"
#include "store_fixture.h"

#define DELAYED_MS 3600000 /* a delay no test outlives */

/* Puts `n` tasks of `priority` into "q", each delayed `delay_ms`. */
static void put_many(int64_t n, int64_t priority, int64_t delay_ms) {
  while (n > 0) {
    int64_t batch = n < TASK_MAX_BATCH ? n : TASK_MAX_BATCH;
    json_t *tasks = json_array();
    for (int64_t i = 0; i < batch; i++)
      json_array_append_new(tasks,
                            json_pack("{s:I, s:I, s:I}", "payload", (json_int_t)i, "priority",
                                      (json_int_t)priority, "delay_ms", (json_int_t)delay_ms));
    json_t *body = json_pack("{s:o}", "tasks", tasks);
    fail_t f = {0};
    json_t *out = task_put(st, "q", body, 1 << 20, &f);
    if (out == NULL)
      fail_msg("put: %s", f.message);
    json_decref(out);
    json_decref(body);
    n -= batch;
  }
}

static int64_t ready_count(void) {
  fail_t f = {0};
  int64_t ready = -1;
  assert_int_equal(queue_count_ready(st, "q", &ready, &f), MUSTER_OK);
  return ready;
}

/* Virtual-machine steps the cached statements that read the ready index
 * took since the last call: what a count read, in rows. */
static int64_t ready_scan_steps(void) {
  int64_t steps = 0;
  for (sqlite3_stmt *s = sqlite3_next_stmt(store_db(st), NULL); s;
       s = sqlite3_next_stmt(store_db(st), s))
    if (strstr(sqlite3_sql(s), "FROM tasks INDEXED BY tasks_ready"))
      steps += sqlite3_stmt_status(s, SQLITE_STMTSTATUS_VM_STEP, 1);
  return steps;
}

static int64_t lease_all(void) {
  queue_t q;
  fail_t f = {0};
  load_queue("q", &q);
  json_t *leases = lease_acquire(st, &q, 0, LEASE_MAX_BATCH, &f);
  assert_non_null(leases);
  int64_t n = (int64_t)json_array_size(leases);
  json_decref(leases);
  return n;
}

/* Below the scan the count is exact: the tasks a lease takes. */
static void check_exact_below_the_scan(void) {
  make_queue("q", "{}");
  assert_int_equal(ready_count(), 0);
  put_many(3, 5, DELAYED_MS); /* first in lease order, and waiting */
  put_many(7, 0, 0);
  assert_int_equal(ready_count(), 7);
  assert_int_equal(lease_all(), 7);
  assert_int_equal(ready_count(), 0);
}

/* However many tasks wait at the head of the queue, a count reads at most
 * QUEUE_READY_SCAN of them.  The tasks beyond are counted as ready when one
 * of those read is (a lease then finds it), and not at all when none is. */
static void test_ready_count_reads_at_most_the_scan(void **unused) {
  (void)unused;
  check_exact_below_the_scan();
  put_many(QUEUE_READY_SCAN - 3, 0, 0);
  ready_scan_steps();
  assert_int_equal(ready_count(), QUEUE_READY_SCAN - 3);
  int64_t per_scan = ready_scan_steps(); /* QUEUE_READY_SCAN tasks read */
  put_many(20 * QUEUE_READY_SCAN, 0, DELAYED_MS);
  /* 997 ready, then 3 + 20000 waiting: the 20000 beyond count as ready. */
  assert_int_equal(ready_count(), QUEUE_READY_SCAN - 3 + 20 * QUEUE_READY_SCAN);
  assert_int_equal(lease_all(), QUEUE_READY_SCAN - 3);
  assert_int_equal(ready_count(), 0); /* the first read wait: the count promises nothing */
  int64_t steps = ready_scan_steps();
  print_message("ready count: %lld steps reading %d queued tasks, %lld for two counts of %d\n",
                (long long)per_scan, QUEUE_READY_SCAN, (long long)steps, 20 * QUEUE_READY_SCAN + 3);
  assert_true(steps < 4 * per_scan); /* in full, 20 times as many rows each */
}

int main(void) {
  log_set_level(LOG_ERROR);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_ready_count_reads_at_most_the_scan, fixture_setup,
                                      fixture_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
