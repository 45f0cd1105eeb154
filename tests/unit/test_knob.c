/*
 * test_knob.c — unit tests of the reading of an integer setting from the
 * environment (core/knob.c): whole decimal integers in the range are read,
 * and everything a typo makes of one is refused with the value untouched.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>

#include "core/knob.h"

static void test_integers_in_the_range(void **state) {
  (void)state;
  long long v = -1;
  assert_true(knob_int("7", 1, 10, &v));
  assert_int_equal(v, 7);
  assert_true(knob_int("1", 1, 10, &v)); /* both ends are in */
  assert_int_equal(v, 1);
  assert_true(knob_int("10", 1, 10, &v));
  assert_int_equal(v, 10);
  assert_true(knob_int("0", 0, 5, &v));
  assert_int_equal(v, 0);
  assert_true(knob_int("007", 1, 10, &v)); /* decimal, not octal */
  assert_int_equal(v, 7);
  assert_true(knob_int("9223372036854775807", 0, LLONG_MAX, &v));
  assert_int_equal(v, LLONG_MAX);
}

static void test_out_of_the_range(void **state) {
  (void)state;
  long long v = 42;
  assert_false(knob_int("0", 1, 10, &v));
  assert_false(knob_int("11", 1, 10, &v));
  assert_false(knob_int("9223372036854775808", 0, LLONG_MAX, &v)); /* one too large */
  assert_false(knob_int("99999999999999999999999", 0, LLONG_MAX, &v));
  assert_int_equal(v, 42);
}

static void test_what_a_typo_makes_is_refused(void **state) {
  (void)state;
  const char *typos[] = {"",     " 7",  "7 ",  "+7",    "-7",  "7ms",
                         "0x10", "1e3", "7.0", "seven", "\t7", "7\n"};
  long long v = 42;
  for (size_t i = 0; i < sizeof typos / sizeof typos[0]; i++) {
    if (knob_int(typos[i], 0, 100, &v))
      fail_msg("'%s' was read as %lld", typos[i], v);
  }
  assert_false(knob_int(NULL, 0, 100, &v));
  assert_int_equal(v, 42);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_integers_in_the_range),
      cmocka_unit_test(test_out_of_the_range),
      cmocka_unit_test(test_what_a_typo_makes_is_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
