/*
 * test_compat_jobs.c — DistCompute job numbers (compat_jobs.c): a job keeps
 * its number through the stages, also when a stage's task was removed
 * before the next stage asked, and the numbers go with the job's tasks,
 * whatever removes them; numbers kept before schema 17 are carried over.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <unistd.h>

#include "server/compat_jobs.h"
#include "server/lease.h"
#include "server/log.h"
#include "server/queue.h"
#include "server/queue_reap.h"
#include "server/task.h"
#include "store_fixture.h"

#define FAR_FUTURE_MS (now_ms() + 3600000)

static int64_t put1(const char *queue) {
  json_t *body = parse("{\"tasks\": [{\"payload\": \"job\"}]}");
  fail_t f = {0};
  json_t *out = task_put(st, queue, body, 1 << 20, &f);
  if (out == NULL)
    fail_msg("put: %s", f.message);
  json_t *tree = reply_tree(out);
  int64_t id = jint(json_array_get(json_object_get(tree, "tasks"), 0), "id");
  json_decref(tree);
  json_decref(out);
  json_decref(body);
  return id;
}

/* Leases the next task of `queue`: its id, and its token into *token. */
static int64_t lease1(const char *queue, int64_t *token) {
  queue_t q;
  fail_t f = {0};
  load_queue(queue, &q);
  json_t *leases = lease_acquire(st, &q, 0, 1, &f);
  assert_int_equal(json_array_size(leases), 1);
  int64_t id = jint(json_array_get(leases, 0), "task");
  *token = jint(json_array_get(leases, 0), "token");
  json_decref(leases);
  return id;
}

static void apply(lease_op_t op, int64_t task, int64_t token) {
  json_t *body =
      json_pack("{s:[{s:I, s:I}]}", "leases", "task", (json_int_t)task, "token", (json_int_t)token);
  fail_t f = {0};
  json_t *out = lease_apply(st, op, body, 1 << 20, &f);
  if (out == NULL)
    fail_msg("lease op: %s", f.message);
  json_decref(out);
  json_decref(body);
}

/* Leases the next task of `queue`, numbers it in pipeline "a" and
 * completes it: its number, and its id into *task (when not NULL). */
static int64_t work(const char *queue, int64_t *task) {
  int64_t token, id = lease1(queue, &token);
  fail_t f = {0};
  int64_t number = compat_job_number(st, "a", id, &f);
  assert_true(number > 0);
  apply(LEASE_COMPLETE, id, token);
  if (task)
    *task = id;
  return number;
}

static int64_t number_of(int64_t task) {
  fail_t f = {0};
  int64_t number = compat_job_number(st, "a", task, &f);
  assert_true(number > 0);
  return number;
}

/* The first column of the one row `sql` gives. */
static int64_t sql_int(const char *sql) {
  sqlite3_stmt *s = NULL;
  assert_int_equal(sqlite3_prepare_v2(store_db(st), sql, -1, &s, NULL), SQLITE_OK);
  assert_int_equal(sqlite3_step(s), SQLITE_ROW);
  int64_t n = sqlite3_column_int64(s, 0);
  sqlite3_finalize(s);
  return n;
}

static int64_t rows(void) {
  return sql_int("SELECT count(*) FROM compat_numbers");
}

/* Runs the retention of `queue` (keep_done_ms 0) over all its done tasks. */
static void reap(const char *queue) {
  int64_t cursor = 0, reaped = 0;
  bool pass_done = false;
  fail_t f = {0};
  while (!pass_done)
    assert_int_equal(
        queue_reap_chunk(st, queue, FAR_FUTURE_MS, QUEUE_CHUNK, &cursor, &reaped, &pass_done, &f),
        MUSTER_OK);
}

static void pipeline(void) {
  make_queue("c", "{\"keep_done_ms\": 0}");
  make_queue("b", "{\"keep_done_ms\": 0, \"next\": \"c\"}");
  make_queue("a", "{\"keep_done_ms\": 0, \"next\": \"b\"}");
}

/* Numbers count from 1 per pipeline and stay with the job through every
 * stage; a task without a chain to the first queue starts a job. */
static void test_numbers_follow_the_job(void **unused) {
  (void)unused;
  pipeline();
  put1("a");
  put1("a");
  assert_int_equal(sql_int("SELECT count(*) FROM temp.sqlite_master"), 0); /* nothing yet */
  int64_t first, second;
  assert_int_equal(work("a", &first), 1);
  assert_int_equal(sql_int("SELECT count(*) FROM temp.sqlite_master"), 2); /* the triggers */
  assert_int_equal(work("a", &second), 2);
  assert_int_equal(work("b", NULL), 1);
  assert_int_equal(work("c", NULL), 1);
  assert_int_equal(work("b", NULL), 2);
  assert_int_equal(number_of(first), 1); /* asked again: the same */
  int64_t loose = put1("b");             /* no parent: a job of its own */
  assert_int_equal(number_of(loose), 3);
  make_queue("feed", "{\"next\": \"a\"}"); /* a queue before the first: its jobs start there */
  put1("feed");
  int64_t token, fed = lease1("feed", &token);
  apply(LEASE_COMPLETE, fed, token);
  assert_int_equal(work("a", NULL), 4);
  fail_t f = {0};
  assert_int_equal(compat_job_number(st, "other", first, &f), 1); /* another pipeline's count */
}

/* The retention removed a job's first two stages before its last was
 * leased: the last stage still gets the job's number, and once the job's
 * last task goes no row of it is left.  The counter stays. */
static void test_numbers_outlive_removed_stages_and_go_with_the_job(void **unused) {
  (void)unused;
  pipeline();
  put1("a");
  assert_int_equal(work("a", NULL), 1);
  assert_int_equal(work("b", NULL), 1);
  reap("a");
  reap("b");
  assert_int_equal(sql_int("SELECT count(*) FROM tasks WHERE queue != 'c'"), 0);
  /* The stage-c task's, carried down, and the done stage-b task's, kept for
   * a child that might have no row of its own. */
  assert_int_equal(rows(), 2);
  assert_int_equal(work("c", NULL), 1);
  reap("c");
  assert_int_equal(sql_int("SELECT count(*) FROM tasks"), 0);
  assert_int_equal(rows(), 0);
  put1("a");
  assert_int_equal(work("a", NULL), 2); /* never given twice */
}

/* Stage b is worked by a worker that never asks for numbers (`muster
 * worker`), and the retention removes the job's tasks of stages a and b
 * before stage c asks: the stage-c task still gets the job's number, which
 * its insertion carried down the chain.  A task of the first queue starts
 * a job, whatever number its parent holds. */
static void test_numbers_cross_a_stage_that_numbers_nothing(void **unused) {
  (void)unused;
  pipeline();
  put1("a");
  put1("a");
  assert_int_equal(work("a", NULL), 1);
  assert_int_equal(work("a", NULL), 2);
  for (int i = 0; i < 2; i++) {
    int64_t token, in_b = lease1("b", &token); /* no number asked */
    apply(LEASE_COMPLETE, in_b, token);
  }
  reap("a");
  reap("b");
  assert_int_equal(sql_int("SELECT count(*) FROM tasks WHERE queue != 'c'"), 0);
  assert_int_equal(work("c", NULL), 1);
  assert_int_equal(work("c", NULL), 2);
  reap("c");
  assert_int_equal(rows(), 0);
  make_queue("feed", "{\"next\": \"a\"}");
  int64_t token, fed = put1("feed");
  assert_int_equal(number_of(fed), 3); /* as if 'feed' were a stage of 'a' */
  assert_int_equal(lease1("feed", &token), fed);
  apply(LEASE_COMPLETE, fed, token);
  assert_int_equal(work("a", NULL), 4);
}

/* A purge, a queue's deletion and its deletion in chunks (the trash) take
 * the numbers of their tasks, and of the parents those were waited for by. */
static void test_deletions_take_the_numbers(void **unused) {
  (void)unused;
  pipeline();
  put1("a");
  put1("a");
  int64_t token, first = lease1("a", &token);
  assert_int_equal(number_of(first), 1);
  apply(LEASE_RELEASE, first, token); /* queued again, numbered */
  fail_t f = {0};
  int64_t purged = 0;
  assert_int_equal(queue_purge(st, "a", &purged, &f), MUSTER_OK);
  assert_int_equal(purged, 2);
  assert_int_equal(rows(), 0);

  put1("a");
  work("a", NULL);
  work("b", NULL);
  assert_int_equal(rows(), 3); /* one per task: a, b and b's child in c */
  int64_t tasks, sessions;
  bool pending;
  assert_int_equal(queue_delete(st, "a", &tasks, &sessions, &pending, &f), MUSTER_OK);
  assert_int_equal(rows(), 3); /* a done task whose child is in b: kept */
  /* b in the trash (more than a chunk of tasks): its done task's child in c
   * still wants the number. */
  for (int i = 0; i < QUEUE_CHUNK; i++)
    put1("b");
  assert_int_equal(queue_delete(st, "b", &tasks, &sessions, &pending, &f), MUSTER_OK);
  assert_true(pending);
  bool finished = false;
  while (!finished)
    assert_int_equal(queue_trash_step(st, "b", QUEUE_CHUNK, &tasks, &finished, &f), MUSTER_OK);
  assert_int_equal(rows(), 2); /* the stage-c task's, and its removed parent's */
  assert_int_equal(work("c", NULL), 2);
  for (int i = 0; i < QUEUE_CHUNK; i++)
    put1("c");
  assert_int_equal(queue_delete(st, "c", &tasks, &sessions, &pending, &f), MUSTER_OK);
  finished = false;
  while (!finished)
    assert_int_equal(queue_trash_step(st, "c", QUEUE_CHUNK, &tasks, &finished, &f), MUSTER_OK);
  assert_int_equal(rows(), 0);
}

/* Numbers kept before schema 17, under the tracker pipeline's name: those
 * of jobs with a task left are carried over, and adopted under the first
 * queue at start-up; numbering goes on after them. */
static void test_numbers_before_schema_17(void **unused) {
  (void)unused;
  char dir[] = "/tmp/muster-test-compat.XXXXXX", path[64];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/muster.db", dir);
  fail_t f = {0};
  st = store_open(&(store_opts_t){.path = path, .schema_version = 17 - 1}, &f);
  assert_non_null(st);
  assert_int_equal(store_request_begin(st, &f), MUSTER_OK);
  make_queue("b", "{}");
  make_queue("a", "{\"next\": \"b\"}");
  int64_t root = put1("a"), token = 0;
  int64_t child = put1("a");
  lease1("a", &token);
  int64_t leased = lease1("a", &token);
  apply(LEASE_COMPLETE, leased, token); /* child of `child` in b */
  char sql[256];
  snprintf(sql, sizeof sql,
           "INSERT INTO compat_jobs(pipeline, root, number) VALUES('laion', %lld, 5),"
           " ('laion', %lld, 6), ('laion', 999999, 7);"
           "DELETE FROM tasks WHERE id = %lld;",
           (long long)root, (long long)child, (long long)child);
  assert_int_equal(sqlite3_exec(store_db(st), sql, NULL, NULL, NULL), SQLITE_OK);
  assert_int_equal(fixture_close(), 0);

  st = store_open(&(store_opts_t){.path = path}, &f);
  assert_non_null(st);
  assert_int_equal(store_request_begin(st, &f), MUSTER_OK);
  assert_int_equal(sql_int("SELECT count(*) FROM compat_numbers"), 2); /* not the task-less one */
  assert_int_equal(compat_jobs_adopt(st, "laion", "a", &f), MUSTER_OK);
  assert_int_equal(number_of(root), 5);
  int64_t in_b = sql_int("SELECT id FROM tasks WHERE queue = 'b'");
  assert_int_equal(number_of(in_b), 6); /* through its removed parent's row */
  assert_int_equal(number_of(put1("a")), 8);
  assert_int_equal(compat_jobs_adopt(st, "laion", "a", &f), MUSTER_OK); /* done already */
  assert_int_equal(fixture_close(), 0);
  fixture_remove_store_files(dir, path);
}

int main(void) {
  log_set_level(LOG_ERROR);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_numbers_follow_the_job, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_numbers_outlive_removed_stages_and_go_with_the_job,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_numbers_cross_a_stage_that_numbers_nothing,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_deletions_take_the_numbers, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test(test_numbers_before_schema_17),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
