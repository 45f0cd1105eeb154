/*
 * test_jcanon.c — the shared canonical-text scanner (src/core/jcanon.c) on
 * its own: what each option changes, and where its limits fall.
 *
 * The head's strict scan (no options) and the client's (JCANON_FOLLOW |
 * JCANON_SPACE) are held to jansson by test_jscan.c and test_client_text.c;
 * here each case is run under all four combinations of the options, so that
 * whitespace, a value that is not canonical, the depth and the keys each do
 * what jcanon.h says under every one of them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/jcanon.h"

enum { STOPS, CANONICAL, SPACED, FOLLOWED }; /* what a scan found */

/* Scans all of `text` under `flags`: STOPS when no value covers it all,
 * else what the value is. */
static int scan(const char *text, unsigned flags) {
  jcanon_scan_t s;
  size_t len = strlen(text);
  jcanon_init(&s, text, text + len, flags);
  if (!jcanon_value(&s) || s.p != s.end)
    return STOPS;
  if (!s.canonical)
    return FOLLOWED;
  return s.spaced ? SPACED : CANONICAL;
}

/* The four option sets, checked against what each should find. */
static void expect(const char *text, int strict, int spaced, int follow, int both) {
  assert_int_equal(scan(text, 0), strict);
  assert_int_equal(scan(text, JCANON_SPACE), spaced);
  assert_int_equal(scan(text, JCANON_FOLLOW), follow);
  assert_int_equal(scan(text, JCANON_FOLLOW | JCANON_SPACE), both);
}

static void test_canonical(void **state) {
  (void)state;
  static const char *texts[] = {
      "0",
      "-1",
      "9223372036854775807",
      "-9223372036854775808",
      "true",
      "false",
      "null",
      "\"\"",
      "\"a\\\"\\\\\\b\\f\\n\\r\\t\\u0000\\u001F\x7f\"",
      "\"\xc3\xa9\xf0\x9f\x98\x80\"",
      "[]",
      "{}",
      "[1,[2,{\"a\":{}}]]",
      "{\"a\":1,\"b\":{\"a\":2}}",
      "{\"a\":{\"b\":1},\"b\":2}",
      /* Reals in their shortest round-trip text (core/jreal.h). */
      "1.5",
      "0.1",
      "-0.0",
      "1.0",
      "1e300",
      "2.5e-7",
      "[0.3,{\"x\":1e15}]",
  };
  for (size_t i = 0; i < sizeof texts / sizeof *texts; i++)
    expect(texts[i], CANONICAL, CANONICAL, CANONICAL, CANONICAL);
}

/* Valid JSON that our writers would write otherwise: the strict scans stop,
 * the following ones say so. */
static void test_not_canonical(void **state) {
  (void)state;
  static const char *texts[] = {
      "1e3",                 /* 1000.0 */
      "1.50",                /* 1.5 */
      "1E300",               /* 1e300 */
      "1e+300",              /* 1e300 */
      "0.10000000000000001", /* jansson's text of 0.1 */
      "1e400",               /* beyond a double: jansson refuses it */
      "[1,0.25e1]",          /* 2.5 */
      "-0",
      "9223372036854775808",
      "\"\\/\"",
      "\"\\u001f\"",
      "\"\\u0041\"",
      "\"\\u007F\"",
      "\"\\u000A\"",
      "\"\\uD83D\\uDE00\"",
      "{\"\\u0000\":1}",
      "{\"a\":1,\"a\":2}",
  };
  for (size_t i = 0; i < sizeof texts / sizeof *texts; i++)
    expect(texts[i], STOPS, STOPS, FOLLOWED, FOLLOWED);
}

/* Whitespace between tokens: canonical and spaced with JCANON_SPACE, not
 * canonical without it; around the value it is never read. */
static void test_space(void **state) {
  (void)state;
  static const char *texts[] = {
      "[ ]",
      "{ }",
      "[1 ,2]",
      "[1, 2]",
      "[ 1]",
      "[1 ]",
      "{\"a\" :1}",
      "{\"a\": 1}",
      "{\"a\":1 }",
      "{ \"a\":1}",
      "{\"a\":1, \"b\":2}",
      "{\"a\":1 ,\"b\":2}",
      "[\n\t\r1]",
  };
  for (size_t i = 0; i < sizeof texts / sizeof *texts; i++)
    expect(texts[i], STOPS, SPACED, FOLLOWED, SPACED);
  expect(" 1", STOPS, STOPS, STOPS, STOPS);
  expect("[1] ", STOPS, STOPS, STOPS, STOPS);
  expect("\" a \"", CANONICAL, CANONICAL, CANONICAL, CANONICAL);
  expect("[1 2]", STOPS, STOPS, STOPS, STOPS);
  expect("[\x01]", STOPS, STOPS, STOPS, STOPS);
}

/* Broken text stops every scan. */
static void test_syntax(void **state) {
  (void)state;
  static const char *texts[] = {
      "",
      "[",
      "{\"a\"}",
      "{\"a\":}",
      "[1,]",
      "{,}",
      "\"\\x\"",
      "\"\x01\"",
      "\"\xc0\x80\"",
      "\"\\uDE00\"",
      "\"\\uD83D\"",
      "01",
      "-",
      "1.",
      "1e",
      "tru",
      "{1:2}",
      "[1}",
      "\"\xed\xa0\x80\"",
  };
  for (size_t i = 0; i < sizeof texts / sizeof *texts; i++)
    expect(texts[i], STOPS, STOPS, STOPS, STOPS);
}

/* JCANON_MAX_DEPTH containers scan; one more stops every scan. */
static void test_depth(void **state) {
  (void)state;
  char text[2 * (JCANON_MAX_DEPTH + 1) + 1];
  for (int depth = JCANON_MAX_DEPTH; depth <= JCANON_MAX_DEPTH + 1; depth++) {
    memset(text, '[', (size_t)depth);
    memset(text + depth, ']', (size_t)depth);
    text[2 * depth] = '\0';
    int want = depth <= JCANON_MAX_DEPTH ? CANONICAL : STOPS;
    expect(text, want, want, want, want);
  }
}

/* JCANON_MAX_KEYS keys open at once are compared; one more is not
 * canonical (the strict scans stop, the following ones go on). */
static void test_keys(void **state) {
  (void)state;
  char *text = malloc(16 * (JCANON_MAX_KEYS + 2));
  assert_non_null(text);
  for (int inner = 0; inner <= 1; inner++) {
    /* JCANON_MAX_KEYS - 1 keys outside ("in" the last), `inner` + 1 inside. */
    size_t len = 0;
    text[len++] = '{';
    for (int i = 0; i < JCANON_MAX_KEYS - 2; i++)
      len += (size_t)sprintf(text + len, "\"k%d\":1,", i);
    len += (size_t)sprintf(text + len, "\"in\":{\"a\":1%s}}", inner ? ",\"b\":2" : "");
    (void)len;
    int strict = inner ? STOPS : CANONICAL, follow = inner ? FOLLOWED : CANONICAL;
    expect(text, strict, strict, follow, follow);
  }
  free(text);
}

static void test_pieces(void **state) {
  (void)state;
  const unsigned char *p = (const unsigned char *)"-42,", *end = p + 4;
  int64_t v = 0;
  assert_true(jcanon_int(&p, end, &v));
  assert_int_equal(v, -42);
  assert_int_equal(*p, ',');
  p = (const unsigned char *)"1.5";
  assert_false(jcanon_int(&p, p + 3, &v));
  assert_true(jcanon_number(&p, p + 3));
  bool canonical = true;
  p = (const unsigned char *)"\"\\/\"x";
  assert_true(jcanon_string(&p, p + 5, false, &canonical));
  assert_false(canonical);
  assert_int_equal(*p, 'x');
  const unsigned char *u = (const unsigned char *)"\xe2\x82\xac";
  assert_int_equal(jcanon_utf8_length(u, u + 3), 3);
  assert_int_equal(jcanon_utf8_length(u, u + 2), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_canonical), cmocka_unit_test(test_not_canonical),
      cmocka_unit_test(test_space),     cmocka_unit_test(test_syntax),
      cmocka_unit_test(test_depth),     cmocka_unit_test(test_keys),
      cmocka_unit_test(test_pieces),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
