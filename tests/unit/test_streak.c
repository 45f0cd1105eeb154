/*
 * test_streak.c — the reasons of a failure streak said once each
 * (src/core/streak.c): repeats and changing numbers are quiet, the limit
 * is said on its last reason, and the end of a streak forgets them all.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>

#include "core/streak.h"

static void test_each_reason_once(void **state) {
  (void)state;
  streak_t s = {0};
  assert_int_equal(streak_note(&s, "heartbeat network refused"), STREAK_NEW);
  assert_int_equal(streak_note(&s, "heartbeat network refused"), STREAK_SEEN);
  assert_int_equal(streak_note(&s, "heartbeat unavailable starting"), STREAK_NEW);
  assert_int_equal(streak_note(&s, "heartbeat network refused"), STREAK_SEEN);
  assert_int_equal(streak_note(&s, "register network refused"), STREAK_NEW);
}

static void test_numbers_make_no_new_reason(void **state) {
  (void)state;
  streak_t s = {0};
  assert_int_equal(streak_note(&s, "timed out after 2001 ms"), STREAK_NEW);
  assert_int_equal(streak_note(&s, "timed out after 2003 ms"), STREAK_SEEN);
  assert_int_equal(streak_note(&s, "timed out after 99 ms"), STREAK_SEEN);
  assert_int_equal(streak_note(&s, "timed out after ms"), STREAK_NEW);
}

static void test_limit_then_quiet(void **state) {
  (void)state;
  streak_t s = {0};
  char reason[32];
  for (int i = 0; i < STREAK_REASONS; i++) {
    snprintf(reason, sizeof reason, "reason %c", 'a' + i);
    assert_int_equal(streak_note(&s, reason), i + 1 < STREAK_REASONS ? STREAK_NEW : STREAK_LAST);
  }
  assert_int_equal(streak_note(&s, "one more"), STREAK_SEEN);
  assert_int_equal(streak_note(&s, "reason a"), STREAK_SEEN);
}

static void test_end_forgets(void **state) {
  (void)state;
  streak_t s = {0};
  assert_int_equal(streak_note(&s, "refused"), STREAK_NEW);
  streak_end(&s);
  assert_int_equal(streak_note(&s, "refused"), STREAK_NEW);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_each_reason_once),
      cmocka_unit_test(test_numbers_make_no_new_reason),
      cmocka_unit_test(test_limit_then_quiet),
      cmocka_unit_test(test_end_forgets),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
