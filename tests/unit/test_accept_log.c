/*
 * test_accept_log.c — what a server says of failed accepts
 * (src/server/accept_log.c): a failure once a minute at most, counting the
 * pauses unsaid, and the recovery once after each failure said.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <string.h>

#include "server/accept_log.h"

static void test_a_failure_once_a_minute(void **state) {
  (void)state;
  accept_log_t log = {0};
  char line[400] = "";
  assert_true(accept_log_failed(&log, EMFILE, 1000, line, sizeof line));
  assert_non_null(strstr(line, "cannot accept connections: Too many open files (every "
                               "descriptor is in use"));
  assert_non_null(strstr(line, "ulimit -n"));
  assert_non_null(strstr(line, "(said once a minute at most)"));
  for (int64_t t = 1100; t < 1000 + ACCEPT_LOG_SAY_MS; t += 100)
    assert_false(accept_log_failed(&log, EMFILE, t, line, sizeof line));
  assert_true(accept_log_failed(&log, ENFILE, 1000 + ACCEPT_LOG_SAY_MS, line, sizeof line));
  assert_non_null(strstr(line, "(600 pauses since this was last said)"));
}

static void test_other_errors_name_no_descriptors(void **state) {
  (void)state;
  accept_log_t log = {0};
  char line[400];
  assert_true(accept_log_failed(&log, ENOBUFS, 5, line, sizeof line));
  assert_null(strstr(line, "descriptor"));
}

static void test_recovery_said_once_after_each_failure_said(void **state) {
  (void)state;
  accept_log_t log = {0};
  char line[200] = "";
  assert_false(accept_log_resumed(&log, line, sizeof line)); /* nothing failed */
  char failed[400];
  assert_true(accept_log_failed(&log, EMFILE, 1000, failed, sizeof failed));
  assert_false(accept_log_failed(&log, EMFILE, 1100, failed, sizeof failed));
  assert_false(accept_log_failed(&log, EMFILE, 1200, failed, sizeof failed));
  assert_true(accept_log_resumed(&log, line, sizeof line));
  assert_string_equal(
      line, "accepting connections again (2 pauses of 100 ms since the last failure said)");
  assert_false(accept_log_resumed(&log, line, sizeof line));
  /* Failing again within the minute is not said, and neither is its end. */
  assert_false(accept_log_failed(&log, EMFILE, 2000, failed, sizeof failed));
  assert_false(accept_log_resumed(&log, line, sizeof line));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_a_failure_once_a_minute),
      cmocka_unit_test(test_other_errors_name_no_descriptors),
      cmocka_unit_test(test_recovery_said_once_after_each_failure_said),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
