/*
 * test_session_seal.c — sealed sessions (server/session.c) against a store:
 * a store of the schema before the `sealed` column, upgraded, opens with
 * its sessions open and unsealed, and they can be sealed then; and the
 * results read says "sealed", with `ended` once a sealed session has every
 * result (what lets the route answer a read at once instead of parking it).
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
#include "server/session.h"
#include "sql_helpers.h"
#include "store_fixture.h"

#include "session_fixture.h"

/* The schema version before sessions.sealed (store_schema.c). */
#define VERSION_BEFORE_SEALED 22

/* Submits body text `body` to session `id`; the failure's code (MUSTER_OK:
 * stored), its message in *f. */
static muster_err_t submit_text(const char *id, const char *body, fail_t *f) {
  json_t *tree = json_loads(body, 0, NULL);
  assert_non_null(tree);
  json_t *out = session_submit(st, id, tree, 1 << 20, f);
  json_decref(out);
  json_decref(tree);
  return f->code;
}

/* Seals session `id`; returns the reply's "already_sealed". */
static bool seal(const char *id) {
  fail_t f = {0};
  json_t *body = json_object();
  json_t *out = session_seal(st, id, body, &f);
  if (out == NULL)
    fail_msg("seal: %s", f.message);
  assert_true(json_is_true(json_object_get(out, "sealed")));
  bool already = json_is_true(json_object_get(out, "already_sealed"));
  json_decref(out);
  json_decref(body);
  return already;
}

/* The "sealed" of session `id`'s object. */
static bool sealed_of(const char *id) {
  fail_t f = {0};
  json_t *s = session_get(st, id, &f);
  assert_non_null(s);
  json_t *v = json_object_get(s, "sealed");
  assert_true(json_is_boolean(v));
  bool sealed = json_is_true(v);
  json_decref(s);
  return sealed;
}

/* A session made by a head of the schema before the column, upgraded. */
static void test_upgrade(void **unused) {
  char dir[] = "/tmp/muster-test-session-seal.XXXXXX", path[80];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/muster.db", dir);
  fail_t f = {0};
  st = store_open(&(store_opts_t){.path = path, .schema_version = VERSION_BEFORE_SEALED}, &f);
  assert_non_null(st);
  assert_int_equal(store_request_begin(st, &f), MUSTER_OK);
  exec_sql(store_db(st), "INSERT INTO queues(name, lease_ms, max_attempts, backoff_ms,"
                         " backoff_max_ms, max_flags, created_ms) VALUES('q', 60000, 3, 0, 0,"
                         " 3, 0)");
  exec_sql(store_db(st), "INSERT INTO sessions(id, queue, state, cleanup_on_exit, timeout_ms,"
                         " created_ms, last_seen_ms) VALUES('s-old', 'q', 0, 0, 60000, 1, 1)");
  assert_int_equal(fixture_close(), 0);

  st = store_open(&(store_opts_t){.path = path}, &f);
  assert_non_null(st);
  assert_true(query_int(store_db(st), "PRAGMA user_version") > VERSION_BEFORE_SEALED);
  assert_int_equal(store_request_begin(st, &f), MUSTER_OK);
  assert_false(sealed_of("s-old"));
  assert_int_equal(submit_text("s-old", "{\"tasks\": [{\"payload\": 1}]}", &f), MUSTER_OK);
  assert_false(seal("s-old"));
  assert_true(sealed_of("s-old"));
  assert_true(seal("s-old")); /* again: no error, and it says so */
  f = (fail_t){0};
  assert_int_equal(submit_text("s-old", "{\"tasks\": [{\"payload\": 2}]}", &f),
                   MUSTER_INVALID_STATE);
  assert_non_null(strstr(f.message, "session s-old was sealed"));
  assert_int_equal(query_int(store_db(st), "SELECT total FROM sessions WHERE id = 's-old'"), 1);
  assert_int_equal(fixture_close(), 0);
  fixture_remove_store_files(dir, path);
}

/* Reads session `id` from cursor 0 in submission order; *rd and the
 * reply's "sealed". */
static bool read_sealed(const char *id, session_read_t *rd) {
  jw_buf_t out = {0};
  fail_t f = {0};
  assert_int_equal(session_results_text(st, id, SESSION_BY_SUBMISSION, 0, 100, true, rd, &out, &f),
                   MUSTER_OK);
  json_t *reply = text_tree(&out);
  json_t *v = json_object_get(reply, "sealed");
  assert_true(json_is_boolean(v));
  bool sealed = json_is_true(v);
  json_decref(reply);
  return sealed;
}

/* A read ends only once the session is sealed and every task has its
 * result: sealed with a task unfinished, or finished and unsealed, it may
 * still get one. */
static void test_results_end(void **unused) {
  make_queue("q", "{}");
  fail_t f = {0};
  char id[SESSION_ID_LEN + 1];
  open_session("q", 60000, id);
  session_read_t rd;
  assert_false(read_sealed(id, &rd));
  assert_false(rd.ended); /* no task, but more may come */
  assert_int_equal(submit_text(id, "{\"tasks\": [{\"payload\": 1}], \"seal\": true}", &f),
                   MUSTER_OK);
  assert_true(read_sealed(id, &rd));
  assert_false(rd.ended); /* sealed, its task unfinished */
  json_t *leases = fixture_lease("q", 1);
  complete_all(leases);
  json_decref(leases);
  assert_true(read_sealed(id, &rd));
  assert_true(rd.ended);
  assert_int_equal(rd.count, 1);
}

static int setup(void **unused) {
  return fixture_open();
}

static int teardown(void **unused) {
  return fixture_close();
}

int main(void) {
  log_set_level(LOG_ERROR);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_upgrade),
      cmocka_unit_test_setup_teardown(test_results_end, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
