/*
 * store_fixture.h — what the store-backed unit tests share: an in-memory
 * store with the request's transaction open (as a handler sees it), JSON
 * helpers and queue creation.  Included by one test program each, after
 * cmocka.h and the server headers the program needs.
 */
#ifndef MUSTER_TESTS_STORE_FIXTURE_H
#define MUSTER_TESTS_STORE_FIXTURE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server/jw.h"
#include "server/lease.h"
#include "server/queue.h"
#include "server/store.h"
#include "server/update.h"

static store_t *st;

/* The group setup and teardown bodies: a fresh store per test. */
static inline int fixture_open(void) {
  fail_t f = {0};
  st = store_open(&(store_opts_t){.path = ":memory:"}, &f);
  if (st == NULL)
    return -1;
  return store_request_begin(st, &f) == MUSTER_OK ? 0 : -1;
}

static inline int fixture_close(void) {
  fail_t f = {0};
  if (st) {
    store_request_end(st, true);
    store_commit(st, &f);
  }
  store_close(st);
  st = NULL;
  return 0;
}

/* The JSON text a reply writer put in `out`, parsed (new reference); `out`
 * is freed.  Fails the test when the text is not JSON. */
static inline json_t *text_tree(jw_buf_t *out) {
  assert_false(out->failed);
  json_error_t error;
  json_t *tree = json_loadb(out->buf, out->len, JSON_ALLOW_NUL, &error);
  if (tree == NULL)
    fail_msg("not JSON (%s): %.300s", error.text, out->buf);
  jw_buf_free(out);
  return tree;
}

/* The updates a lease of `queue` after `after` carries, as the reply's
 * text (`{"leases":[]` and update_attach_text's fields) parsed (new
 * reference); how many into *count. */
static inline json_t *updates_attached(const char *queue, int64_t after, size_t *count) {
  jw_buf_t text = {0};
  fail_t f = {0};
  JW_ADD_LITERAL(&text, "{\"leases\":[]");
  assert_int_equal(update_attach_text(st, queue, after, &text, count, &f), MUSTER_OK);
  JW_ADD_LITERAL(&text, "}");
  return text_tree(&text);
}

/* Removes a store file `path` of a test that opened one on disk (an upgrade
 * from an older schema, say), its -wal and -shm, and then its directory
 * `dir`. */
static inline void fixture_remove_store_files(const char *dir, const char *path) {
  char side[4096];
  unlink(path);
  snprintf(side, sizeof side, "%s-wal", path);
  unlink(side);
  snprintf(side, sizeof side, "%s-shm", path);
  unlink(side);
  rmdir(dir);
}

/* The same as cmocka group setup and teardown functions. */
static inline int fixture_setup(void **state) {
  (void)state;
  return fixture_open();
}

static inline int fixture_teardown(void **state) {
  (void)state;
  return fixture_close();
}

static inline json_t *parse(const char *text) {
  json_error_t err;
  json_t *v = json_loads(text, 0, &err);
  if (v == NULL)
    fail_msg("bad test JSON: %s: %s", text, err.text);
  return v;
}

/* How many times the store's cached statements whose SQL holds `needle` ran
 * so far: which statement a path took, for tests of fast paths. */
static inline int stmt_runs(const char *needle) {
  int runs = 0;
  for (sqlite3_stmt *s = sqlite3_next_stmt(store_db(st), NULL); s;
       s = sqlite3_next_stmt(store_db(st), s))
    if (strstr(sqlite3_sql(s), needle))
      runs += sqlite3_stmt_status(s, SQLITE_STMTSTATUS_RUN, 0);
  return runs;
}

/* The virtual machine steps that the store's cached statements ran so far:
 * how much a call read, for tests that bound the work of a path. */
static inline int64_t stmt_steps(void) {
  int64_t steps = 0;
  for (sqlite3_stmt *s = sqlite3_next_stmt(store_db(st), NULL); s;
       s = sqlite3_next_stmt(store_db(st), s))
    steps += sqlite3_stmt_status(s, SQLITE_STMTSTATUS_VM_STEP, 0);
  return steps;
}

/* Reply `v` as a client reads it (new reference): jw_dump's text parsed
 * again, so that raw nodes (jw.h: the arrays of put, lease and completion
 * replies) read as the JSON they hold. */
static inline json_t *reply_tree(const json_t *v) {
  size_t len = 0;
  char *text = jw_dump(v, &len);
  if (text == NULL)
    fail_msg("reply could not be written");
  json_t *tree = json_loadb(text, len, JSON_ALLOW_NUL, NULL);
  free(text);
  if (tree == NULL)
    fail_msg("reply is not JSON");
  return tree;
}

/* reply_tree of reply `v`, which it consumes; NULL for NULL (a call that
 * failed).  The task and update readers (task_get, task_list, task_requeue,
 * update_list) write their payloads as raw nodes. */
static inline json_t *tree_of(json_t *v) {
  json_t *tree = v ? reply_tree(v) : NULL;
  json_decref(v);
  return tree;
}

static inline int64_t jint(const json_t *obj, const char *key) {
  return json_integer_value(json_object_get(obj, key));
}

/* The schema version that gave queues their retention columns (store_schema.c).
 * Tests that build a store at an older version, to upgrade it, make and read
 * its queues with the columns it had: queue_put and queue_load name the
 * newer ones. */
#define FIXTURE_VERSION_RETENTION 16

static inline bool fixture_old_queues(void) {
  sqlite3_stmt *s = NULL;
  int version = 0;
  if (sqlite3_prepare_v2(store_db(st), "PRAGMA user_version", -1, &s, NULL) == SQLITE_OK &&
      sqlite3_step(s) == SQLITE_ROW)
    version = sqlite3_column_int(s, 0);
  sqlite3_finalize(s);
  return version < FIXTURE_VERSION_RETENTION;
}

/* An integer setting of `body`, or `dflt`. */
static inline int64_t fixture_setting(const json_t *body, const char *key, int64_t dflt) {
  const json_t *v = json_object_get(body, key);
  return v ? json_integer_value(v) : dflt;
}

/* make_queue in a store older than FIXTURE_VERSION_RETENTION. */
static inline void make_queue_old(const char *name, const json_t *body) {
  sqlite3_stmt *s = NULL;
  assert_int_equal(sqlite3_prepare_v2(store_db(st),
                                      "INSERT INTO queues(name, lease_ms, max_attempts, backoff_ms,"
                                      " backoff_max_ms, next, max_flags, created_ms)"
                                      " VALUES(?1, ?2, ?3, ?4, ?5, NULL, ?6, 1)",
                                      -1, &s, NULL),
                   SQLITE_OK);
  sqlite3_bind_text(s, 1, name, -1, SQLITE_TRANSIENT);
  sqlite3_bind_int64(s, 2, fixture_setting(body, "lease_ms", QUEUE_DEFAULT_LEASE_MS));
  sqlite3_bind_int64(s, 3, fixture_setting(body, "max_attempts", QUEUE_DEFAULT_MAX_ATTEMPTS));
  sqlite3_bind_int64(s, 4, fixture_setting(body, "backoff_ms", QUEUE_DEFAULT_BACKOFF_MS));
  sqlite3_bind_int64(s, 5, fixture_setting(body, "backoff_max_ms", QUEUE_DEFAULT_BACKOFF_MAX_MS));
  sqlite3_bind_int64(s, 6, fixture_setting(body, "max_flags", QUEUE_DEFAULT_MAX_FLAGS));
  assert_int_equal(sqlite3_step(s), SQLITE_DONE);
  sqlite3_finalize(s);
}

static inline void make_queue(const char *name, const char *settings) {
  json_t *body = parse(settings);
  bool created = false;
  fail_t f = {0};
  if (fixture_old_queues())
    make_queue_old(name, body);
  else
    assert_int_equal(queue_put(st, name, body, &created, &f), MUSTER_OK);
  json_decref(body);
}

/* queue_load, also in a store older than FIXTURE_VERSION_RETENTION. */
static inline void load_queue(const char *name, queue_t *q) {
  fail_t f = {0};
  if (!fixture_old_queues()) {
    assert_int_equal(queue_load(st, name, q, &f), MUSTER_OK);
    return;
  }
  sqlite3_stmt *s = NULL;
  assert_int_equal(sqlite3_prepare_v2(store_db(st),
                                      "SELECT name, lease_ms, max_attempts, backoff_ms,"
                                      " backoff_max_ms, next, max_flags, created_ms, NULL, 0"
                                      " FROM queues WHERE name = ?1",
                                      -1, &s, NULL),
                   SQLITE_OK);
  sqlite3_bind_text(s, 1, name, -1, SQLITE_TRANSIENT);
  assert_int_equal(sqlite3_step(s), SQLITE_ROW);
  queue_from_columns(s, 0, q);
  sqlite3_finalize(s);
}

/* Leases up to `max` tasks of `queue` as worker 0; the array (caller decrefs). */
static inline json_t *fixture_lease(const char *queue, int64_t max) {
  queue_t q;
  fail_t f = {0};
  load_queue(queue, &q);
  json_t *leases = lease_acquire(st, &q, 0, max, &f);
  assert_non_null(leases);
  return leases;
}

#endif
