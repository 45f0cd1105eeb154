/*
 * test_names.c — the name rule (src/core/names.c): characters, length, and
 * "." and ".." refused, which URLs collapse, though an older head's queue or
 * iteration may still have them (name_was_valid).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <string.h>

#include "core/names.h"

static void test_names_of_the_rule(void **state) {
  (void)state;
  static const char *const good[] = {"a", "Q-1", "x.y", "...", ".a", "a.", "..a", "_", "-"};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    assert_true(name_is_valid(good[i]));
    assert_true(name_was_valid(good[i]));
    assert_false(name_is_dots(good[i]));
  }
  char longest[NAME_MAX_LEN + 2];
  memset(longest, 'n', NAME_MAX_LEN);
  longest[NAME_MAX_LEN] = '\0';
  assert_true(name_is_valid(longest));
  longest[NAME_MAX_LEN] = 'n';
  longest[NAME_MAX_LEN + 1] = '\0';
  assert_false(name_is_valid(longest));
}

static void test_dots_are_no_names(void **state) {
  (void)state;
  static const char *const dots[] = {".", ".."};
  for (size_t i = 0; i < 2; i++) {
    assert_false(name_is_valid(dots[i]));
    assert_true(name_is_dots(dots[i]));
    assert_true(name_was_valid(dots[i])); /* an older head's queue may have one */
    assert_string_equal(name_rule_text(dots[i]), "'.' and '..' are no names: URLs collapse them");
  }
}

static void test_other_bad_names(void **state) {
  (void)state;
  static const char *const bad[] = {"", "a b", "a/b", "%2e", "k\xc3\xa9", "a\n"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_false(name_is_valid(bad[i]));
    assert_false(name_was_valid(bad[i]));
    assert_false(name_is_dots(bad[i]));
    assert_string_equal(name_rule_text(bad[i]), NAME_RULE_TEXT);
  }
  assert_false(name_is_valid(NULL));
  assert_false(name_was_valid(NULL));
  assert_false(name_is_dots(NULL));
  assert_non_null(strstr(NAME_RULE_TEXT, "other than '.' and '..'"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_names_of_the_rule),
      cmocka_unit_test(test_dots_are_no_names),
      cmocka_unit_test(test_other_bad_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
