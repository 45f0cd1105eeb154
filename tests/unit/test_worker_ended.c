/*
 * test_worker_ended.c — worker instances reported ended
 * (server/worker_ended.c) against an in-memory store: a registration with
 * one makes no worker, for WORKER_ENDED_KEEP_MS and no longer; the bound of
 * WORKER_ENDED_MAX rows, the oldest evicted; the reaper's prune by age; the
 * shorter time MUSTER_TEST_ENDED_KEEP_MS sets; and a store of the schema
 * before the table, upgraded.
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
#include "server/worker.h"
#include "server/worker_ended.h"
#include "sql_helpers.h"
#include "store_fixture.h"

/* The schema version before ended_instances (store_schema.c). */
#define VERSION_BEFORE_ENDED 21

/* Registers with `instance`; the reply (caller decrefs), or NULL with *f set. */
static json_t *register_as(const char *instance, fail_t *f) {
  json_t *body = json_pack("{s:s, s:[s]}", "instance", instance, "queues", "q");
  json_t *out = worker_register(st, body, 60000, f);
  json_decref(body);
  return out;
}

static int64_t workers_active(void) {
  return query_int(store_db(st), "SELECT count(*) FROM workers WHERE state = 0");
}

static int64_t workers_all(void) {
  return query_int(store_db(st), "SELECT count(*) FROM workers");
}

/* Reports `instance` ended as the route does; returns the reply's "id" (0: null). */
static int64_t report(const char *instance, bool crashed) {
  fail_t f = {0};
  json_t *out = worker_leave_instance(st, instance, crashed, &f);
  assert_non_null(out);
  int64_t id = jint(out, "id");
  json_decref(out);
  return id;
}

/* Asserts that a registration with `instance` is refused, saying `words`,
 * and makes no worker. */
static void assert_refused(const char *instance, const char *words) {
  int64_t before = workers_all();
  fail_t f = {0};
  assert_null(register_as(instance, &f));
  assert_int_equal(f.code, MUSTER_INVALID_STATE);
  if (strstr(fail_message(&f), words) == NULL)
    fail_msg("refusal without '%s': %s", words, fail_message(&f));
  assert_int_equal(workers_all(), before);
}

/* Sets the time `instance` was reported ended to `ago_ms` before now. */
static void report_aged(const char *instance, int64_t ago_ms) {
  char sql[200];
  snprintf(sql, sizeof sql, "UPDATE ended_instances SET ended_ms = %lld WHERE instance = '%s'",
           (long long)(now_ms() - ago_ms), instance);
  exec_sql(store_db(st), sql);
}

/* The crash report comes first, the registration after it: no worker. */
static void test_late_registration_makes_no_worker(void **unused) {
  assert_int_equal(report("agent-1-1", true), 0);
  assert_refused("agent-1-1", "instance 'agent-1-1' was reported crashed ");
  assert_refused("agent-1-1", "(DELETE /v1/workers/instance/agent-1-1?crashed=true): no worker "
                              "is registered under an instance reported ended; a live process "
                              "registers with an instance of its own");
  assert_int_equal(workers_active(), 0);
  /* Others register as ever, with an instance or without. */
  fail_t f = {0};
  json_t *out = register_as("agent-1-2", &f);
  assert_non_null(out);
  json_decref(out);
  json_t *body = json_object();
  out = worker_register(st, body, 60000, &f);
  assert_non_null(out);
  json_decref(out);
  json_decref(body);
  assert_int_equal(workers_active(), 2);
}

/* A report that ended an active worker is remembered as well: a copy of
 * its registration sent again, coming later, makes no second worker; so is
 * a goodbye by instance, whose refusal says so. */
static void test_every_report_is_remembered(void **unused) {
  fail_t f = {0};
  json_t *out = register_as("agent-2-1", &f);
  assert_non_null(out);
  int64_t id = jint(out, "id");
  json_decref(out);
  assert_int_equal(report("agent-2-1", true), id);
  assert_int_equal(workers_active(), 0);
  assert_refused("agent-2-1", "was reported crashed");
  /* Sent again, its reply lost: the same. */
  assert_int_equal(report("agent-2-1", true), 0);
  assert_refused("agent-2-1", "was reported crashed");

  out = register_as("agent-3-1", &f);
  assert_non_null(out);
  id = jint(out, "id");
  json_decref(out);
  assert_int_equal(report("agent-3-1", false), id);
  assert_refused("agent-3-1", "instance 'agent-3-1' was reported gone ");
  assert_refused("agent-3-1", "(DELETE /v1/workers/instance/agent-3-1): no worker");
}

/* Remembered for WORKER_ENDED_KEEP_MS: a report older than that no longer
 * refuses, and the reaper's prune deletes it (and only it). */
static void test_kept_for_a_while_then_pruned(void **unused) {
  report("old", true);
  report("young", true);
  report_aged("old", WORKER_ENDED_KEEP_MS + 1);
  report_aged("young", WORKER_ENDED_KEEP_MS - 60000);
  int64_t now = now_ms();
  assert_true(worker_ended_any_due(st, now));
  fail_t f = {0};
  int64_t forgotten = -1;
  assert_int_equal(worker_ended_prune(st, now, &forgotten, &f), MUSTER_OK);
  assert_int_equal(forgotten, 1);
  assert_false(worker_ended_any_due(st, now));
  assert_int_equal(query_int(store_db(st), "SELECT count(*) FROM ended_instances"), 1);
  assert_refused("young", "was reported crashed");
  /* The check reads only younger rows, whether the prune ran or not. */
  report_aged("young", WORKER_ENDED_KEEP_MS);
  json_t *out = register_as("young", &f);
  assert_non_null(out);
  json_decref(out);
  assert_int_equal(workers_active(), 1);
  /* At the check's own time: KEEP_MS after the report it still refuses. */
  report("edge", true);
  assert_int_equal(worker_ended_check(st, "edge", now_ms() + WORKER_ENDED_KEEP_MS - 1000, &f),
                   MUSTER_INVALID_STATE);
  f = (fail_t){0};
  assert_int_equal(worker_ended_check(st, "edge", now_ms() + WORKER_ENDED_KEEP_MS + 1000, &f),
                   MUSTER_OK);
}

/* MUSTER_TEST_ENDED_KEEP_MS makes the time shorter, for the check and the
 * prune alike; a value out of 1 to WORKER_ENDED_KEEP_MS changes nothing. */
static void test_keep_time_for_tests(void **unused) {
  assert_int_equal(worker_ended_keep_ms(), WORKER_ENDED_KEEP_MS);
  setenv("MUSTER_TEST_ENDED_KEEP_MS", "2000", 1);
  worker_ended_init();
  assert_int_equal(worker_ended_keep_ms(), 2000);
  report("short", true);
  report("shorter", true);
  report_aged("short", 1000);
  report_aged("shorter", 2001);
  assert_refused("short", "was reported crashed");
  fail_t f = {0};
  json_t *out = register_as("shorter", &f); /* the check's time, before any prune */
  assert_non_null(out);
  json_decref(out);
  int64_t forgotten = -1;
  assert_int_equal(worker_ended_prune(st, now_ms(), &forgotten, &f), MUSTER_OK);
  assert_int_equal(forgotten, 1);
  assert_refused("short", "was reported crashed");
  const char *bad[] = {"0", "-5", "600001", "12x", " 7"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    setenv("MUSTER_TEST_ENDED_KEEP_MS", bad[i], 1);
    worker_ended_init();
    assert_int_equal(worker_ended_keep_ms(), 2000);
  }
  setenv("MUSTER_TEST_ENDED_KEEP_MS", "600000", 1); /* the largest: the default */
  worker_ended_init();
  unsetenv("MUSTER_TEST_ENDED_KEEP_MS");
  assert_int_equal(worker_ended_keep_ms(), WORKER_ENDED_KEEP_MS);
}

/* At most WORKER_ENDED_MAX rows: a report beyond evicts the oldest; one
 * sent again for an instance remembered already evicts nothing. */
static void test_bound(void **unused) {
  int64_t now = now_ms();
  char sql[300];
  snprintf(sql, sizeof sql,
           "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < %d)"
           " INSERT INTO ended_instances(instance, ended_ms, crashed)"
           " SELECT 'i-' || i, %lld + i, 1 FROM n",
           WORKER_ENDED_MAX, (long long)(now - 100000));
  exec_sql(store_db(st), sql);
  report("i-5", true); /* already remembered: moves to now */
  assert_int_equal(query_int(store_db(st), "SELECT count(*) FROM ended_instances"),
                   WORKER_ENDED_MAX);
  report("newest", true);
  assert_int_equal(query_int(store_db(st), "SELECT count(*) FROM ended_instances"),
                   WORKER_ENDED_MAX);
  assert_int_equal(query_int(store_db(st), "SELECT count(*) FROM ended_instances"
                                           " WHERE instance IN ('i-1', 'i-2')"),
                   1);
  assert_int_equal(query_int(store_db(st), "SELECT count(*) FROM ended_instances"
                                           " WHERE instance IN ('i-5', 'newest')"),
                   2);
  fail_t f = {0};
  json_t *out = register_as("i-1", &f);
  assert_non_null(out); /* evicted: forgotten */
  json_decref(out);
  assert_refused("i-2", "was reported crashed");
}

/* A store of the schema before the table opens, upgraded: a worker active
 * across the upgrade is ended by its instance, which is remembered then. */
static void test_upgrade(void **unused) {
  char dir[] = "/tmp/muster-test-worker-ended.XXXXXX", path[80];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/muster.db", dir);
  fail_t f = {0};
  st = store_open(&(store_opts_t){.path = path, .schema_version = VERSION_BEFORE_ENDED}, &f);
  assert_non_null(st);
  assert_int_equal(store_request_begin(st, &f), MUSTER_OK);
  /* The worker as a head of that schema registered it. */
  exec_sql(store_db(st), "INSERT INTO workers(name, nickname, state, last_seen_ms, created_ms,"
                         " timeout_ms, instance) VALUES('w', 'n', 0, 0, 0, 60000, 'before-1')");
  int64_t id = sqlite3_last_insert_rowid(store_db(st));
  assert_int_equal(fixture_close(), 0);

  st = store_open(&(store_opts_t){.path = path}, &f);
  assert_non_null(st);
  assert_true(query_int(store_db(st), "PRAGMA user_version") > VERSION_BEFORE_ENDED);
  assert_int_equal(store_request_begin(st, &f), MUSTER_OK);
  assert_int_equal(workers_active(), 1);
  assert_int_equal(report("before-1", true), id);
  assert_refused("before-1", "was reported crashed");
  assert_int_equal(workers_active(), 0);
  assert_int_equal(fixture_close(), 0);
  fixture_remove_store_files(dir, path);
}

int main(void) {
  log_set_level(LOG_ERROR);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_late_registration_makes_no_worker, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(test_every_report_is_remembered, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(test_kept_for_a_while_then_pruned, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(test_keep_time_for_tests, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_bound, fixture_setup, fixture_teardown),
      cmocka_unit_test(test_upgrade),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
