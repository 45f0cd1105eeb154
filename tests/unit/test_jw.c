/*
 * test_jw.c — the head's JSON writer (src/server/jw.c) against jansson.
 *
 * jw_dump must give exactly the text json_dumps(v, JSON_COMPACT |
 * JSON_ENCODE_ANY) gives, reals apart: stored payloads written by either
 * must compare equal, and clients must read the same replies.  Every value
 * here is written both ways and compared byte for byte, and read back.
 * Reals are written shortest (src/core/jreal.h) where jansson writes
 * "%.17g": they are checked against their text instead.
 *
 * Raw nodes (pre-encoded text in a tree) must come out verbatim wherever they
 * stand, and nothing a client sends may pass for one; jw_valid, which guards
 * the text the lease path splices, must agree with jansson's parser.
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
  assert_true(jw_valid(got, len)); /* what jw writes, jw_valid accepts */
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
  const json_int_t ints[] = {
      0, 1, -1, 9, 10, 42, -42, 1000000, (1LL << 53) - 1, INT64_MAX, INT64_MIN, INT64_MIN + 1};
  for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
    same_as_jansson(json_integer(ints[i]));
  /* Reals whose "%.17g" is their shortest text too. */
  const double reals[] = {0.0, -0.0, 1.0, -1.5, 123456789.0, 1e21, DBL_MAX, 100.0, 0.5};
  for (size_t i = 0; i < sizeof reals / sizeof reals[0]; i++)
    same_as_jansson(json_real(reals[i]));
}

/* jw_dump of real `v` must be `want`, which reads back as `v`. */
static void real_as(double v, const char *want) {
  json_t *real = json_real(v);
  char *got = jw_dump(real, NULL);
  assert_non_null(got);
  assert_string_equal(got, want);
  assert_true(strtod(got, NULL) == v);
  assert_true(jw_valid(got, strlen(got)));
  free(got);
  json_decref(real);
}

/* Reals as the user wrote them, not as "%.17g" writes them. */
static void test_reals_shortest(void **state) {
  (void)state;
  real_as(0.1, "0.1"); /* jansson: 0.10000000000000001 */
  real_as(0.3, "0.3");
  real_as(1e300, "1e300");
  real_as(-1e-300, "-1e-300");
  real_as(2.5e-7, "2.5e-7");
  real_as(5e-324, "5e-324");
  real_as(0.1 + 0.2, "0.30000000000000004");
  real_as(1e15, "1e15");
  real_as(3.141592653589793, "3.141592653589793"); /* 16 digits; jansson writes 17 */
  json_t *v = json_pack("{s:f, s:[f, f, i]}", "x", 0.1, "z", 0.3, 2.5e-7, 7);
  char *got = jw_dump(v, NULL);
  assert_string_equal(got, "{\"x\":0.1,\"z\":[0.3,2.5e-7,7]}");
  free(got);
  json_decref(v);
}

/* jw_add_int writes two digits at a time: every length, both signs, the
 * boundaries between lengths, as printf writes them. */
static void int_as_printf(long long v) {
  jw_buf_t b = {0};
  jw_add_int(&b, v);
  char want[32];
  int len = snprintf(want, sizeof want, "%lld", v);
  assert_int_equal(b.len, (size_t)len);
  assert_memory_equal(b.buf, want, (size_t)len);
  jw_buf_free(&b);
}

static void test_ints_every_length(void **state) {
  (void)state;
  unsigned long long scale = 1;
  for (int digits = 1; digits <= 18; digits++, scale *= 10) {
    const unsigned long long values[] = {scale - 1, scale, scale + 1, scale * 5 + 7,
                                         scale * 10 - 1};
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
      int_as_printf((long long)values[i]);
      int_as_printf(-(long long)values[i]);
    }
  }
  for (long long v = -1000; v <= 1000; v++)
    int_as_printf(v);
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

/* jw_dump of `v` (consumed) must be `want`. */
static void dumps_as(json_t *v, const char *want) {
  char *got = jw_dump(v, NULL);
  assert_non_null(got);
  assert_string_equal(got, want);
  free(got);
  json_decref(v);
}

static void test_raw_nodes(void **state) {
  (void)state;
  const char *text = "{\"k\":[1,\"two\",{\"3\":null}],\"s\":\"caf\xc3\xa9 \\\"q\\\" \\u0001\"}";
  json_t *raw = jw_raw(text, strlen(text));
  assert_true(jw_is_raw(raw));
  size_t len = 0;
  assert_string_equal(jw_raw_text(raw, &len), text);
  assert_int_equal(len, strlen(text));
  dumps_as(json_incref(raw), text);
  /* Verbatim inside objects and arrays, and next to ordinary values. */
  char want[512];
  snprintf(want, sizeof want, "{\"a\":%s,\"b\":[%s,1,[%s]],\"c\":\"x\"}", text, text, text);
  dumps_as(json_pack("{s:O, s:[O, i, [O]], s:s}", "a", raw, "b", raw, 1, raw, "c", "x"), want);
  /* Text that is not compact stays as it is: the node is trusted. */
  dumps_as(jw_raw("[ 1 , 2 ]", 9), "[ 1 , 2 ]");
  dumps_as(jw_raw("[]", 2), "[]");
  /* A raw node's text can hold more raw text, built with the jw_add_ calls. */
  jw_buf_t b = {0};
  JW_ADD_LITERAL(&b, "[");
  jw_add_value(&b, raw);
  JW_ADD_LITERAL(&b, ",");
  jw_add_int(&b, INT64_MIN);
  JW_ADD_LITERAL(&b, ",");
  jw_add_string(&b, "a\"\\\n\x1f\xc3\xa9", 7);
  JW_ADD_LITERAL(&b, "]");
  assert_false(b.failed);
  snprintf(want, sizeof want, "[%s,-9223372036854775808,\"a\\\"\\\\\\n\\u001F\xc3\xa9\"]", text);
  dumps_as(jw_raw(b.buf, b.len), want);
  jw_buf_free(&b);
  jw_buf_free(&b); /* a zeroed buffer is accepted */
  json_decref(raw);
}

/* Nothing parsed or built by jansson is a raw node, however it looks. */
static void test_raw_not_forgeable(void **state) {
  (void)state;
  const char *lookalikes[] = {"[null,\"x\"]", "[\"...\",\"x\"]", "[null,\"{\\\"a\\\":1}\"]",
                              "{\"raw\":[null,\"x\"]}"};
  for (size_t i = 0; i < sizeof lookalikes / sizeof lookalikes[0]; i++) {
    json_t *v = json_loads(lookalikes[i], 0, NULL);
    assert_non_null(v);
    assert_false(jw_is_raw(v));
    assert_null(jw_raw_text(v, NULL));
    dumps_as(v, lookalikes[i]); /* written as the array it is */
  }
  json_t *built = json_pack("[n, s]", "x");
  assert_false(jw_is_raw(built));
  same_as_jansson(built);
  assert_false(jw_is_raw(NULL));
  assert_false(jw_is_raw(json_null()));
}

/* jw_add_string escapes as jw_dump (and json_dumps) do. */
static void test_add_string(void **state) {
  (void)state;
  const char *strings[] = {"", "plain", "q\"b\\s/", "\b\f\n\r\t\x01\x1f\x7f",
                           "caf\xc3\xa9 \xf0\x9f\x98\x80"};
  for (size_t i = 0; i < sizeof strings / sizeof strings[0]; i++) {
    json_t *v = json_string(strings[i]);
    char *want = json_dumps(v, JSON_ENCODE_ANY);
    jw_buf_t b = {0};
    jw_add_string(&b, strings[i], strlen(strings[i]));
    assert_int_equal(b.len, strlen(want));
    assert_memory_equal(b.buf ? b.buf : "", want, b.len);
    jw_buf_free(&b);
    free(want);
    json_decref(v);
  }
}

/* jw_valid says yes exactly where json_loads(JSON_DECODE_ANY |
 * JSON_ALLOW_NUL) reads the text, but for the numbers it checks by form only. */
static void valid_as_jansson(const char *text, size_t len) {
  json_t *v = json_loadb(text, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
  if (jw_valid(text, len) != (v != NULL))
    fail_msg("jw_valid says %d, jansson %d: '%.*s'", jw_valid(text, len), v != NULL, (int)len,
             text);
  json_decref(v);
}

static void test_valid(void **state) {
  (void)state;
  const char *texts[] = {
      /* valid */
      "0",
      "-0",
      "1",
      "-12",
      "1.5",
      "-0.25e+10",
      "1E5",
      "2e-3",
      "true",
      "false",
      "null",
      "\"\"",
      "\"a\\\"\\\\\\/\\b\\f\\n\\r\\tz\"",
      "\"\\u00e9\\uD83D\\uDE00\"",
      "\"\\u0000\"",
      "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf\"",
      "[]",
      "{}",
      " [ 1 , 2 ] ",
      "\t{\"a\" : {\"b\":[[],{}]}}\r\n",
      "{\"a\":1,\"a\":2}",
      "[1,\"x\",null,true,{\"k\":[0.5]}]",
      /* not JSON */
      "",
      " ",
      "[",
      "]",
      "{",
      "[1,]",
      "[,1]",
      "{\"a\"}",
      "{\"a\":}",
      "{\"a\":1,}",
      "{1:2}",
      "{'a':1}",
      "[1 2]",
      "1 2",
      "01",
      "-",
      "1.",
      ".5",
      "1e",
      "1e+",
      "+1",
      "0x10",
      "NaN",
      "Infinity",
      "tru",
      "nul",
      "truex",
      "\"abc",
      "\"\\x\"",
      "\"\\u12\"",
      "\"\\u12G4\"",
      "\"\\uD83D\"",
      "\"\\uDE00\"",
      "\"\\uD83D\\u0041\"",
      "\"tab\there\"",
      "\"nl\nhere\"",
      "\"\xc3\"",
      "\"\xc3\x28\"",
      "\"\x80\"",
      "\"\xc0\xaf\"",
      "\"\xe0\x80\xaf\"",
      "\"\xed\xa0\x80\"",
      "\"\xf4\x90\x80\x80\"",
      "\"\xf5\x80\x80\x80\"",
      "\xc3\xa9",
      "[1]]",
      "{\"a\":1}}",
      "[}",
      "{]",
      "// c\n1",
      "[1]x",
  };
  for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
    valid_as_jansson(texts[i], strlen(texts[i]));
  /* A NUL byte in the text is not JSON, wherever it is (jansson stops
   * reading at one after a value; the lease path then reads the text as
   * jv_decode does, up to the NUL). */
  valid_as_jansson("\"a\0b\"", 5);
  assert_false(jw_valid("1\0", 2));
  /* Nesting: as deep as jansson reads (it counts the innermost scalar too). */
  static char deep[2 * 2050 + 2];
  for (int n = 2046; n <= 2050; n++) {
    memset(deep, '[', (size_t)n);
    memset(deep + n, ']', (size_t)n);
    valid_as_jansson(deep, 2 * (size_t)n);
    deep[n] = '1';
    memset(deep + n + 1, ']', (size_t)n);
    valid_as_jansson(deep, 2 * (size_t)n + 1);
  }
  /* The documented difference: integers beyond 64 bits and reals beyond a
   * double are JSON, which jansson refuses to hold. */
  assert_true(jw_valid("12345678901234567890", 20));
  assert_true(jw_valid("1e400", 5));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_scalars),
      cmocka_unit_test(test_reals_shortest),
      cmocka_unit_test(test_ints_every_length),
      cmocka_unit_test(test_strings),
      cmocka_unit_test(test_containers),
      cmocka_unit_test(test_parsed_text),
      cmocka_unit_test(test_null_value),
      cmocka_unit_test(test_raw_nodes),
      cmocka_unit_test(test_raw_not_forgeable),
      cmocka_unit_test(test_add_string),
      cmocka_unit_test(test_valid),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
