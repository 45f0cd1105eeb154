/*
 * test_lease_retry.c — a lease request sent again under its key
 * (server/lease_retry.c) against an in-memory store: what it answers, what it
 * records per stream of keys, what the steady state pays for it, the bound on
 * a worker's records and their end with the worker, and stores of the schema
 * before the records and before their table, upgraded.
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
/* The schema version with the records in those columns of the worker's row,
 * before the table lease_requests. */
#define VERSION_RECORD_PER_WORKER 20

/* The statements of the keyed check (the worker's row and its stream's
 * record) and of the record, told apart by their SQL. */
#define CHECK_SQL "LEFT JOIN lease_requests"
#define RECORD_SQL "INSERT OR REPLACE INTO lease_requests"

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
  jw_buf_t text = {0};
  assert_int_equal(lease_acquire_retry_text(st, &q, worker, max, &r, &text, &count, &max_task, &f),
                   MUSTER_OK);
  json_t *leases = text_tree(&text);
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
 * request without a key reads and writes no record at all. */
static void test_repeat_and_cost(void **unused) {
  make_queue("q", "{\"lease_ms\": 600000}");
  put_tasks("q", 6);
  int64_t w = add_worker(), other = add_worker();
  int records = stmt_runs(RECORD_SQL), checks = stmt_runs(CHECK_SQL);
  char *first = held(keyed_lease("q", w, "k-1", 2));
  assert_int_equal(stmt_runs(RECORD_SQL) - records, 1);
  assert_int_equal(stmt_runs(CHECK_SQL) - checks, 1);
  assert_same(held(keyed_lease("q", w, "k-1", 2)), strdup(first));
  assert_int_equal(stmt_runs(RECORD_SQL) - records, 1); /* a repeat records nothing */
  /* Another worker's same key, no key, a new key: new tasks each. */
  char *theirs = held(keyed_lease("q", other, "k-1", 1));
  assert_string_not_equal(theirs, first);
  free(theirs);
  int touched = stmt_runs("lease_requests");
  char *plain = held(keyed_lease("q", w, NULL, 1));
  assert_int_equal(stmt_runs("lease_requests"), touched);
  assert_same(held(keyed_lease("q", w, "k-1", 2)), first); /* k-1 is still the last key */
  char *second = held(keyed_lease("q", w, "k-2", 1));
  assert_string_not_equal(second, plain);
  assert_same(held(keyed_lease("q", w, "k-2", 1)), second);
  free(plain);
}

/* The stream of a key: what comes before its trailing '-' and digits; the
 * unnamed stream "" for a key that does not end so. */
static const struct {
  const char *key, *stream;
} streams[] = {
    {"host-123-s4-17", "host-123-s4"},
    {"k-1", "k"},
    {"k-007", "k"},
    {"x-1-2", "x-1"},
    {"a--5", "a-"},
    {"--5", "-"},
    {"-5", ""},
    {"k", ""},
    {"123", ""},
    {"a-", ""},
    {"ab5", ""},
    {"a-b", ""},
    {"a.5", ""},
};
#define STREAM_CASES (sizeof streams / sizeof streams[0])

static void test_stream_len(void **unused) {
  for (size_t i = 0; i < STREAM_CASES; i++) {
    size_t len = lease_retry_stream_len(streams[i].key);
    assert_int_equal(len, strlen(streams[i].stream));
    assert_memory_equal(streams[i].key, streams[i].stream, len);
  }
}

/* Two slots of one worker, their keyed leases interleaved: each slot's key is
 * answered with its own leases, and a slot's new key replaces only its own
 * record.  Keys that are not numbered share one record, the unnamed stream's. */
static void test_streams_of_one_worker(void **unused) {
  make_queue("q", "{\"lease_ms\": 600000}");
  put_tasks("q", 8);
  int64_t w = add_worker();
  char *a = held(keyed_lease("q", w, "inst-s1-0", 1));
  char *b = held(keyed_lease("q", w, "inst-s2-0", 2));
  char *c = held(keyed_lease("q", w, "plain", 1));
  assert_string_not_equal(a, b);
  assert_same(held(keyed_lease("q", w, "inst-s1-0", 1)), strdup(a));
  assert_same(held(keyed_lease("q", w, "inst-s2-0", 2)), strdup(b));
  assert_same(held(keyed_lease("q", w, "plain", 1)), strdup(c));
  /* Slot 1's next request replaces slot 1's record, not slot 2's. */
  char *a2 = held(keyed_lease("q", w, "inst-s1-1", 1));
  assert_string_not_equal(a2, a);
  assert_same(held(keyed_lease("q", w, "inst-s2-0", 2)), b);
  assert_same(held(keyed_lease("q", w, "inst-s1-1", 1)), a2);
  char *anew = held(keyed_lease("q", w, "inst-s1-0", 1)); /* no longer its stream's key */
  assert_string_not_equal(anew, a);
  free(anew);
  free(a);
  /* Another key without a number replaces "plain": one unnamed stream. */
  char *other = held(keyed_lease("q", w, "other", 1));
  assert_same(held(keyed_lease("q", w, "other", 1)), other);
  anew = held(keyed_lease("q", w, "plain", 1));
  assert_string_not_equal(anew, c);
  free(anew);
  free(c);
}

/* How many records `worker` has, and whether `stream` is one of them. */
static int64_t records_of(int64_t worker, const char *stream) {
  sqlite3_stmt *s;
  assert_int_equal(sqlite3_prepare_v2(store_db(st),
                                      "SELECT count(*), coalesce(sum(stream = ?2), 0)"
                                      " FROM lease_requests WHERE worker = ?1",
                                      -1, &s, NULL),
                   SQLITE_OK);
  sqlite3_bind_int64(s, 1, worker);
  sqlite3_bind_text(s, 2, stream ? stream : "", -1, SQLITE_TRANSIENT);
  assert_int_equal(sqlite3_step(s), SQLITE_ROW);
  int64_t n = stream ? sqlite3_column_int64(s, 1) : sqlite3_column_int64(s, 0);
  sqlite3_finalize(s);
  return n;
}

/* A worker keeps LEASE_RETRY_MAX_STREAMS records: a new stream beyond them
 * evicts the one written longest ago (not the first made: s0 was written
 * again), and the count runs only when a stream is added. */
static void test_bound(void **unused) {
  make_queue("q", "{\"lease_ms\": 600000}");
  put_tasks("q", LEASE_RETRY_MAX_STREAMS + 3);
  int64_t w = add_worker(), other = add_worker();
  json_decref(keyed_lease("q", other, "theirs-1", 1));
  char key[32];
  for (int i = 0; i < LEASE_RETRY_MAX_STREAMS; i++) {
    snprintf(key, sizeof key, "s%d-1", i);
    json_decref(keyed_lease("q", w, key, 1));
  }
  assert_int_equal(records_of(w, NULL), LEASE_RETRY_MAX_STREAMS);
  int counts = stmt_runs("SELECT count(*) FROM lease_requests");
  json_decref(keyed_lease("q", w, "s0-2", 1));
  assert_int_equal(stmt_runs("SELECT count(*) FROM lease_requests"), counts);
  char *last = held(keyed_lease("q", w, "new-1", 1));
  assert_int_equal(records_of(w, NULL), LEASE_RETRY_MAX_STREAMS);
  assert_int_equal(records_of(w, "s1"), 0);
  assert_int_equal(records_of(w, "s0"), 1);
  assert_int_equal(records_of(w, "s2"), 1);
  assert_int_equal(records_of(other, NULL), 1);
  assert_same(held(keyed_lease("q", w, "new-1", 1)), last);
}

/* The records go when their worker ends (lease_end_worker, as every path
 * that ends a worker runs): its own, not another worker's. */
static void test_forgotten_with_the_worker(void **unused) {
  make_queue("q", "{\"lease_ms\": 600000}");
  put_tasks("q", 4);
  int64_t w = add_worker(), other = add_worker();
  json_decref(keyed_lease("q", w, "a-1", 1));
  json_decref(keyed_lease("q", w, "b-1", 1));
  json_decref(keyed_lease("q", other, "a-1", 1));
  assert_int_equal(records_of(w, NULL), 2);
  assert_int_equal(lease_end_worker(st, w, false), 2);
  assert_int_equal(records_of(w, NULL), 0);
  assert_int_equal(records_of(other, NULL), 1);
}

/* A store of the schema before the record opens, upgraded: a lease held
 * across the upgrade stays as it was, and keyed requests work after it. */
static void test_upgrade(void **unused) {
  char dir[] = "/tmp/muster-test-lease-retry.XXXXXX", path[80];
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
  json_t *task = tree_of(task_get(st, jint(json_array_get(before, 0), "task"), &f));
  assert_string_equal(json_string_value(json_object_get(task, "state")), "leased");
  json_decref(task);
  json_decref(before);
  free(first);
  assert_int_equal(fixture_close(), 0);
  fixture_remove_store_files(dir, path);
}

/* Runs `sql` with `worker` as ?1 and `text` as ?2 on the open store. */
static void exec_bound(const char *sql, int64_t worker, const char *text) {
  sqlite3_stmt *s;
  assert_int_equal(sqlite3_prepare_v2(store_db(st), sql, -1, &s, NULL), SQLITE_OK);
  sqlite3_bind_int64(s, 1, worker);
  sqlite3_bind_text(s, 2, text, -1, SQLITE_TRANSIENT);
  assert_int_equal(sqlite3_step(s), SQLITE_DONE);
  sqlite3_finalize(s);
}

/* The stream the store holds for `worker`'s one record (caller frees), or
 * NULL when it has none. */
static char *stored_stream(int64_t worker) {
  sqlite3_stmt *s;
  assert_int_equal(sqlite3_prepare_v2(store_db(st),
                                      "SELECT stream FROM lease_requests WHERE worker = ?1", -1, &s,
                                      NULL),
                   SQLITE_OK);
  sqlite3_bind_int64(s, 1, worker);
  char *stream =
      sqlite3_step(s) == SQLITE_ROW ? strdup((const char *)sqlite3_column_text(s, 0)) : NULL;
  sqlite3_finalize(s);
  return stream;
}

/* The workers of a store of VERSION_RECORD_PER_WORKER, as that version wrote
 * them: `leasing` with a keyed lease of two tasks (its leases in *before,
 * "task:token ..."), `gone` with a key, and one per case of `streams`. */
typedef struct {
  int64_t leasing, gone, keyed[STREAM_CASES];
  char *before;
} old_records_t;

static void make_old_records(const char *path, old_records_t *old) {
  fail_t f = {0};
  st = store_open(&(store_opts_t){.path = path, .schema_version = VERSION_RECORD_PER_WORKER}, &f);
  assert_non_null(st);
  assert_int_equal(store_request_begin(st, &f), MUSTER_OK);
  make_queue("q", "{\"lease_ms\": 600000}");
  put_tasks("q", 3);
  old->leasing = add_worker();
  old->gone = add_worker();
  queue_t q;
  load_queue("q", &q);
  old->before = held(lease_acquire(st, &q, old->leasing, 2, &f));
  exec_bound("UPDATE workers SET lease_request = ?2, lease_first_token ="
             " (SELECT min(token) FROM tasks), lease_last_token = (SELECT max(token) FROM tasks)"
             " WHERE id = ?1",
             old->leasing, "host-1-s2-7");
  exec_bound("UPDATE workers SET state = 1, lease_request = ?2 WHERE id = ?1", old->gone, "g-1");
  for (size_t i = 0; i < STREAM_CASES; i++) {
    old->keyed[i] = add_worker();
    exec_bound("UPDATE workers SET lease_request = ?2, lease_first_token = 1,"
               " lease_last_token = 1 WHERE id = ?1",
               old->keyed[i], streams[i].key);
  }
  assert_int_equal(fixture_close(), 0);
}

/* A store with the records in the worker's row opens upgraded: an active
 * worker's record moves to its stream (the stream computed in SQL as
 * lease_retry_stream_len does in C) and answers its retry, a gone worker's
 * goes, and so do the columns. */
static void test_upgrade_moves_records(void **unused) {
  char dir[] = "/tmp/muster-test-lease-retry.XXXXXX", path[80];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/muster.db", dir);
  old_records_t old;
  make_old_records(path, &old);
  fail_t f = {0};
  st = store_open(&(store_opts_t){.path = path}, &f);
  assert_non_null(st);
  assert_int_equal(store_request_begin(st, &f), MUSTER_OK);
  sqlite3_stmt *s = NULL;
  assert_int_not_equal(
      sqlite3_prepare_v2(store_db(st), "SELECT lease_request FROM workers", -1, &s, NULL),
      SQLITE_OK);
  for (size_t i = 0; i < STREAM_CASES; i++) {
    char *stream = stored_stream(old.keyed[i]);
    assert_non_null(stream);
    assert_string_equal(stream, streams[i].stream);
    free(stream);
  }
  assert_null(stored_stream(old.gone));
  char *stream = stored_stream(old.leasing);
  assert_string_equal(stream, "host-1-s2");
  free(stream);
  assert_same(held(keyed_lease("q", old.leasing, "host-1-s2-7", 5)), old.before);
  assert_int_equal(fixture_close(), 0);
  fixture_remove_store_files(dir, path);
}

int main(void) {
  log_set_level(LOG_ERROR);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_repeat_and_cost, fixture_setup, fixture_teardown),
      cmocka_unit_test(test_stream_len),
      cmocka_unit_test_setup_teardown(test_streams_of_one_worker, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_bound, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_forgotten_with_the_worker, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test(test_upgrade),
      cmocka_unit_test(test_upgrade_moves_records),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
