/*
 * test_option_twice.c — unit tests of the words said of an option given
 * twice (core/option_twice.c), which the `muster` commands and `muster
 * head` print after their prefix: nothing for a first value or the same
 * value again, both values otherwise, and no value of a secret option.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>

#include "core/option_twice.h"

static void test_nothing_to_say(void **state) {
  (void)state;
  assert_null(option_twice_text("queue", NULL, "a", false));
  assert_null(option_twice_text("queue", "a", "a", false));
  assert_null(option_twice_text("token", "same-secret", "same-secret", true));
}

static void test_two_values(void **state) {
  (void)state;
  char *said = option_twice_text("listen", "127.0.0.1:0", "0.0.0.0:7370", false);
  assert_string_equal(said, "option '--listen' was given twice, '127.0.0.1:0' and then "
                            "'0.0.0.0:7370': using '0.0.0.0:7370' (it takes one value)");
  free(said);
  said = option_twice_text("queue", "", "b", false); /* an empty value is a value */
  assert_string_equal(said, "option '--queue' was given twice, '' and then 'b': using 'b' (it "
                            "takes one value)");
  free(said);
}

static void test_a_secret_is_not_written(void **state) {
  (void)state;
  char *said = option_twice_text("token", "first-secret", "second-secret", true);
  assert_string_equal(said, "option '--token' was given twice, with two different values: "
                            "using the last (it takes one value)");
  free(said);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_nothing_to_say),
      cmocka_unit_test(test_two_values),
      cmocka_unit_test(test_a_secret_is_not_written),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
