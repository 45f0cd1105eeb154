/*
 * test_error.c — the error table (src/core/error.c through include/muster.h).
 *
 * Every code has a unique, stable wire name that round-trips through
 * muster_err_from_name(); server codes carry the HTTP status docs/api.md
 * documents, client-side codes carry 0; every code has a message; lookups of
 * unknown names and out-of-range codes never return NULL.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <ctype.h>
#include <string.h>

#include "muster.h"

/* The contract, written out by hand from docs/api.md ("Errors") and muster.h. */
typedef struct {
  muster_err_t code;
  const char *name;
  int status;
} expected_row_t;

static const expected_row_t expected[] = {
    {MUSTER_OK, "ok", 200},
    {MUSTER_BAD_REQUEST, "bad_request", 400},
    {MUSTER_BAD_JSON, "bad_json", 400},
    {MUSTER_INVALID, "invalid_argument", 400},
    {MUSTER_NAME_INVALID, "name_invalid", 400},
    {MUSTER_UNAUTHORIZED, "unauthorized", 401},
    {MUSTER_FORBIDDEN, "forbidden", 403},
    {MUSTER_NOT_FOUND, "not_found", 404},
    {MUSTER_QUEUE_NOT_FOUND, "queue_not_found", 404},
    {MUSTER_TASK_NOT_FOUND, "task_not_found", 404},
    {MUSTER_WORKER_NOT_FOUND, "worker_not_found", 404},
    {MUSTER_NODE_NOT_FOUND, "node_not_found", 404},
    {MUSTER_SESSION_NOT_FOUND, "session_not_found", 404},
    {MUSTER_ITERATION_NOT_FOUND, "iteration_not_found", 404},
    {MUSTER_SHARED_NOT_FOUND, "shared_not_found", 404},
    {MUSTER_METHOD_NOT_ALLOWED, "method_not_allowed", 405},
    {MUSTER_LEASE_LOST, "lease_lost", 409},
    {MUSTER_INVALID_STATE, "invalid_state", 409},
    {MUSTER_QUEUE_IN_USE, "queue_in_use", 409},
    {MUSTER_VERSION_MISMATCH, "version_mismatch", 409},
    {MUSTER_BODY_TOO_LARGE, "body_too_large", 413},
    {MUSTER_BATCH_TOO_LARGE, "batch_too_large", 413},
    {MUSTER_PAYLOAD_TOO_LARGE, "payload_too_large", 413},
    {MUSTER_UNSUPPORTED_MEDIA, "unsupported_media_type", 415},
    {MUSTER_INTERNAL, "internal", 500},
    {MUSTER_STORE, "store_error", 500},
    {MUSTER_UNAVAILABLE, "unavailable", 503},
    {MUSTER_NETWORK, "network", 0},
    {MUSTER_PROTOCOL, "protocol", 0},
    {MUSTER_NOMEM, "out_of_memory", 0},
    {MUSTER_INDEX_GAP, "index_gap", 0},
    {MUSTER_IO, "io_error", 0},
};

#define N_EXPECTED (sizeof(expected) / sizeof(expected[0]))

static void test_ok_is_zero(void **state) {
  (void)state;
  assert_int_equal(MUSTER_OK, 0);
  assert_string_equal(muster_err_name(MUSTER_OK), "ok");
}

static void test_table_matches_contract(void **state) {
  (void)state;
  /* The hand-written list covers every code: a new code needs a documented row. */
  assert_int_equal(N_EXPECTED, MUSTER_ERR_COUNT);
  for (size_t i = 0; i < N_EXPECTED; i++) {
    const expected_row_t *row = &expected[i];
    assert_string_equal(muster_err_name(row->code), row->name);
    assert_int_equal(muster_err_http_status(row->code), row->status);
  }
}

static void test_names_unique_and_well_formed(void **state) {
  (void)state;
  for (int i = 0; i < MUSTER_ERR_COUNT; i++) {
    const char *a = muster_err_name((muster_err_t)i);
    assert_non_null(a);
    assert_true(strlen(a) > 0);
    for (const char *p = a; *p; p++)
      assert_true(islower((unsigned char)*p) || *p == '_');
    for (int j = i + 1; j < MUSTER_ERR_COUNT; j++)
      assert_string_not_equal(a, muster_err_name((muster_err_t)j));
  }
}

static void test_names_round_trip(void **state) {
  (void)state;
  for (int i = 0; i < MUSTER_ERR_COUNT; i++)
    assert_int_equal(muster_err_from_name(muster_err_name((muster_err_t)i)), i);
}

static void test_unknown_names(void **state) {
  (void)state;
  assert_int_equal(muster_err_from_name(NULL), MUSTER_PROTOCOL);
  assert_int_equal(muster_err_from_name(""), MUSTER_PROTOCOL);
  assert_int_equal(muster_err_from_name("no_such_code"), MUSTER_PROTOCOL);
  assert_int_equal(muster_err_from_name("LEASE_LOST"), MUSTER_PROTOCOL);
  assert_int_equal(muster_err_from_name("lease_lost "), MUSTER_PROTOCOL);
  assert_int_equal(muster_err_from_name("lease_los"), MUSTER_PROTOCOL);
}

static void test_statuses(void **state) {
  (void)state;
  for (int i = 0; i < MUSTER_ERR_COUNT; i++) {
    int status = muster_err_http_status((muster_err_t)i);
    if (status == 0)
      continue; /* client-side code */
    assert_in_range(status, 200, 599);
    if (i != MUSTER_OK)
      assert_in_range(status, 400, 599); /* every server error is 4xx or 5xx */
  }
  /* Client-side codes are never sent by a server. */
  assert_int_equal(muster_err_http_status(MUSTER_NETWORK), 0);
  assert_int_equal(muster_err_http_status(MUSTER_PROTOCOL), 0);
  assert_int_equal(muster_err_http_status(MUSTER_NOMEM), 0);
  /* The caller's mistakes are 4xx, ours 5xx. */
  assert_in_range(muster_err_http_status(MUSTER_INTERNAL), 500, 599);
  assert_in_range(muster_err_http_status(MUSTER_STORE), 500, 599);
}

static void test_messages(void **state) {
  (void)state;
  for (int i = 0; i < MUSTER_ERR_COUNT; i++) {
    const char *m = muster_strerror((muster_err_t)i);
    assert_non_null(m);
    assert_true(strlen(m) > 0);
    /* The message explains; it is not just the wire name again. */
    assert_string_not_equal(m, muster_err_name((muster_err_t)i));
  }
  assert_string_equal(muster_strerror(MUSTER_QUEUE_NOT_FOUND), "no such queue");
}

static void test_out_of_range_codes(void **state) {
  (void)state;
  const muster_err_t bad[] = {MUSTER_ERR_COUNT, (muster_err_t)(MUSTER_ERR_COUNT + 100),
                              (muster_err_t)-1};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    assert_non_null(muster_strerror(bad[i]));
    assert_non_null(muster_err_name(bad[i]));
    /* An unknown code maps to a real row, so a server never sends status 0. */
    assert_in_range(muster_err_http_status(bad[i]), 400, 599);
    assert_int_not_equal(muster_err_from_name(muster_err_name(bad[i])), MUSTER_OK);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ok_is_zero),
      cmocka_unit_test(test_table_matches_contract),
      cmocka_unit_test(test_names_unique_and_well_formed),
      cmocka_unit_test(test_names_round_trip),
      cmocka_unit_test(test_unknown_names),
      cmocka_unit_test(test_statuses),
      cmocka_unit_test(test_messages),
      cmocka_unit_test(test_out_of_range_codes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
