/*
 * test_leftover.c — the runs of what big closed sessions leave to the
 * background deletion (leftover.c): leases and the ready count step over
 * them whatever their number, in a queue shared with other clients' tasks
 * put among the session's; their work does not grow with the tasks left;
 * a close rolled back leaves no run behind; a store opened again builds
 * them from its trash.  Against a store: no HTTP, no processes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server/leftover.h"
#include "server/lease.h"
#include "server/log.h"
#include "server/queue.h"
#include "server/session.h"
#include "server/task.h"
#include "sql_helpers.h"
#include "store_fixture.h"
#include "session_fixture.h"

static void close_session(const char *id) {
  fail_t f = {0};
  json_t *r = session_close(st, id, "by its client", &f);
  if (r == NULL)
    fail_msg("close: %s", f.message);
  json_decref(r);
}

#define IDS_MAX 4096

/* The queued tasks of `queue` that a lease may take, in lease order, from
 * the table itself: all but those a closed session left (into ids[], their
 * number returned). */
static size_t leasable(const char *queue, int64_t *ids) {
  char sql[400];
  snprintf(sql, sizeof sql,
           "SELECT id FROM tasks AS t WHERE queue = '%s' AND state = 0 AND NOT EXISTS"
           " (SELECT 1 FROM session_trash AS c WHERE c.session = t.session AND t.id <= c.horizon)"
           " ORDER BY priority DESC, id",
           queue);
  sqlite3_stmt *s = NULL;
  assert_int_equal(sqlite3_prepare_v2(store_db(st), sql, -1, &s, NULL), SQLITE_OK);
  size_t n = 0;
  while (sqlite3_step(s) == SQLITE_ROW) {
    assert_true(n < IDS_MAX);
    ids[n++] = sqlite3_column_int64(s, 0);
  }
  sqlite3_finalize(s);
  return n;
}

/* Leases up to `max` tasks of `queue` and checks they are want[0..n), in
 * that order. */
static void assert_leases(const char *queue, int64_t max, const int64_t *want, size_t n) {
  json_t *leases = fixture_lease(queue, max);
  if (json_array_size(leases) != n)
    fail_msg("leased %zu tasks of %s, %zu leasable", json_array_size(leases), queue, n);
  for (size_t i = 0; i < n; i++)
    assert_int_equal(jint(json_array_get(leases, i), "task"), want[i]);
  json_decref(leases);
}

static int64_t ready_count(const char *queue) {
  int64_t ready = -1;
  fail_t f = {0};
  assert_int_equal(queue_count_ready(st, queue, &ready, &f), MUSTER_OK);
  return ready;
}

/* A queue shared by session a (closed), session b (open) and plain puts,
 * their batches put in turns, at two priorities; a few of them done.  Every
 * task but a's is leased, in lease order, by one lease, and counted ready
 * before: a's 3000 and more left behind are stepped over, a run per batch
 * of a's that others' tasks of the queue interrupt. */
static void test_lease_steps_over_a_shared_queue(void **unused) {
  (void)unused;
  make_queue("q", "{}");
  char a[SESSION_ID_LEN + 1], b[SESSION_ID_LEN + 1];
  open_session("q", 60000, a);
  open_session("q", 60000, b);
  for (int round = 0; round < 30; round++) {
    submit(a, 100, round % 3 == 0 ? 3 : 0);
    submit(b, 7, round % 2 == 0 ? 3 : 0);
    put_one("q", round % 5 == 0 ? 3 : 0);
  }
  json_t *leases = fixture_lease("q", 40); /* a's and b's of priority 3, completed */
  complete_all(leases);
  json_decref(leases);
  close_session(a);
  assert_true(leftover_run_count(st, "q") > 1);
  assert_true(leftover_run_count(st, "q") <= 30);
  int64_t want[IDS_MAX];
  size_t n = leasable("q", want);
  assert_true(n > 100 && n < QUEUE_READY_SCAN);
  assert_int_equal(ready_count("q"), (int64_t)n);
  assert_leases("q", TASK_MAX_BATCH, want, n);
  assert_int_equal(ready_count("q"), 0);
  assert_leases("q", 10, NULL, 0);
}

/* The work of leasing the one task put behind a closed session's tasks in
 * queue `name`, `left` of them left (put in batches between which another
 * queue's tasks took ids): one run, merged over the other queue's ids. */
static int64_t lease_behind_work(const char *name, int64_t left) {
  make_queue(name, "{}");
  char id[SESSION_ID_LEN + 1];
  open_session(name, 60000, id);
  for (int64_t done = 0; done < QUEUE_CHUNK + left; done += TASK_MAX_BATCH) {
    submit(id, TASK_MAX_BATCH, 0);
    put_one("other", 0);
  }
  close_session(id);
  assert_int_equal(leftover_run_count(st, name), 1);
  int64_t behind = put_one(name, 0), before = stmt_steps();
  assert_int_equal(ready_count(name), 1);
  assert_leases(name, 1, &behind, 1);
  return stmt_steps() - before;
}

/* The work of a lease behind a closed session's tasks does not grow with
 * their number. */
static void test_work_does_not_grow_with_what_is_left(void **unused) {
  (void)unused;
  make_queue("other", "{}");
  int64_t few = lease_behind_work("few", 2 * QUEUE_CHUNK);
  int64_t many = lease_behind_work("many", 20 * QUEUE_CHUNK);
  if (many > few + 50)
    fail_msg("a lease behind 20000 tasks left took %lld steps, behind 2000 %lld", (long long)many,
             (long long)few);
}

/* A close rolled back (its request failed) leaves the session open and its
 * tasks leasable, although its runs were made: the next walk finds the
 * session out of the trash and forgets them. */
static void test_close_rolled_back(void **unused) {
  (void)unused;
  make_queue("q", "{}");
  char a[SESSION_ID_LEN + 1];
  open_session("q", 60000, a);
  submit_many(a, 3 * QUEUE_CHUNK);
  put_one("q", 0);
  fail_t f = {0};
  store_request_end(st, true);
  assert_int_equal(store_request_begin(st, &f), MUSTER_OK);
  close_session(a);
  assert_int_equal(leftover_run_count(st, "q"), 1);
  store_request_end(st, false);
  assert_int_equal(store_request_begin(st, &f), MUSTER_OK);
  json_t *got = session_get(st, a, &f);
  assert_non_null(got);
  json_decref(got);
  int64_t want[IDS_MAX];
  size_t n = leasable("q", want);
  assert_int_equal(n, 3 * QUEUE_CHUNK + 1);
  assert_int_equal(ready_count("q"), (int64_t)n);
  for (size_t at = 0; at < n; at += TASK_MAX_BATCH) /* all of a's, then the one behind */
    assert_leases("q", TASK_MAX_BATCH, want + at,
                  n - at < TASK_MAX_BATCH ? n - at : TASK_MAX_BATCH);
  assert_int_equal(leftover_run_count(st, "q"), 0);
}

/* The same, then closed again: its leased tasks go, the others are left
 * and stepped over. */
static void test_closed_again_after_a_roll_back(void **unused) {
  (void)unused;
  make_queue("q", "{}");
  char a[SESSION_ID_LEN + 1];
  open_session("q", 60000, a);
  submit_many(a, 3 * QUEUE_CHUNK);
  int64_t behind = put_one("q", 0);
  fail_t f = {0};
  store_request_end(st, true);
  assert_int_equal(store_request_begin(st, &f), MUSTER_OK);
  close_session(a);
  store_request_end(st, false);
  assert_int_equal(store_request_begin(st, &f), MUSTER_OK);
  json_t *leases = fixture_lease("q", 5);
  assert_int_equal(json_array_size(leases), 5);
  json_decref(leases);
  close_session(a);
  assert_int_equal(leftover_run_count(st, "q"), 1);
  assert_int_equal(ready_count("q"), 1);
  assert_leases("q", 5, &behind, 1);
}

/* A store opened again holds no runs until a walk (in its request, so
 * without seeking gaps: a run per batch that another queue's put
 * interrupted) or leftover_load (outside a transaction, as the head does at
 * start: one run) builds them. */
static void test_runs_built_after_a_restart(void **unused) {
  (void)unused;
  char dir[] = "/tmp/muster-test-leftover.XXXXXX", path[80];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/muster.db", dir);
  fail_t f = {0};
  st = store_open(&(store_opts_t){.path = path}, &f);
  assert_non_null(st);
  assert_int_equal(store_request_begin(st, &f), MUSTER_OK);
  make_queue("q", "{}");
  make_queue("other", "{}");
  char a[SESSION_ID_LEN + 1];
  open_session("q", 60000, a);
  for (int i = 0; i < 4; i++) {
    submit(a, TASK_MAX_BATCH, 0);
    put_one("other", 0);
  }
  close_session(a);
  int64_t behind = put_one("q", 0);
  for (int pass = 0; pass < 2; pass++) {
    fixture_close();
    st = store_open(&(store_opts_t){.path = path}, &f);
    assert_non_null(st);
    assert_int_equal(leftover_run_count(st, "q"), 0);
    if (pass == 1)
      assert_int_equal(leftover_load(st, &f), MUSTER_OK);
    assert_int_equal(store_request_begin(st, &f), MUSTER_OK);
    assert_int_equal(ready_count("q"), 1);
    assert_int_equal(leftover_run_count(st, "q"), pass == 0 ? 3 : 1);
    store_request_end(st, true);
    assert_int_equal(store_request_begin(st, &f), MUSTER_OK);
  }
  assert_leases("q", 5, &behind, 1);
  fixture_close();
  fixture_remove_store_files(dir, path);
}

/* Runs go with the session's last chunk; a purge that deletes what was left
 * meanwhile leaves the others leasable. */
static void test_runs_go_with_the_last_chunk(void **unused) {
  (void)unused;
  make_queue("q", "{}");
  char a[SESSION_ID_LEN + 1];
  open_session("q", 60000, a);
  submit_many(a, 2 * QUEUE_CHUNK);
  close_session(a);
  int64_t purged = 0, behind = put_one("q", 0);
  fail_t f = {0};
  assert_int_equal(queue_purge(st, "q", &purged, &f), MUSTER_OK);
  assert_int_equal(purged, 1); /* the plain one; a's went uncounted */
  behind = put_one("q", 0);
  assert_int_equal(ready_count("q"), 1);
  assert_int_equal(leftover_run_count(st, "q"), 1);
  for (bool finished = false; !finished;) {
    int64_t deleted = 0;
    assert_int_equal(session_trash_step(st, a, QUEUE_CHUNK, &deleted, &finished, &f), MUSTER_OK);
  }
  assert_int_equal(leftover_run_count(st, "q"), 0);
  assert_leases("q", 5, &behind, 1);
}

int main(void) {
  log_set_level(LOG_ERROR);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_lease_steps_over_a_shared_queue, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(test_work_does_not_grow_with_what_is_left, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(test_close_rolled_back, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_closed_again_after_a_roll_back, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test(test_runs_built_after_a_restart),
      cmocka_unit_test_setup_teardown(test_runs_go_with_the_last_chunk, fixture_setup,
                                      fixture_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
