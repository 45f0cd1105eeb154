/*
 * test_jints.c — JSON integers and arrays of them read from text
 * (src/core/jints.c), on good and bad input.
 *
 * Every text is copied into a buffer of exactly its length, without a NUL,
 * so that the sanitizer build catches a read past `end`.  Good arrays are
 * also parsed by jansson, and the values must agree; bad ones must give the
 * stated error at the stated element, and never a value.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/jints.h"

/* `text` in a buffer of its exact length (no NUL); the caller frees it. */
static char *exact(const char *text, size_t *len) {
  *len = strlen(text);
  char *copy = malloc(*len ? *len : 1);
  assert_non_null(copy);
  memcpy(copy, text, *len);
  return copy;
}

/* Reads `text` as an array of `count` integers at most `max`; returns the
 * error, *at the element, the values in out[]. */
static jints_err_t read_array(const char *text, uint64_t max, uint64_t *out, size_t count,
                              size_t *at, size_t *used) {
  size_t len;
  char *buf = exact(text, &len);
  const char *p = buf;
  jints_err_t err = jints_array_u64(&p, buf + len, max, out, count, at);
  *used = (size_t)(p - buf);
  free(buf);
  return err;
}

/* A good array: its values equal `want` and what jansson reads. */
static void good(const char *text, const uint64_t *want, size_t count) {
  uint64_t out[16] = {0};
  size_t at = 99, used;
  assert_true(count <= 16);
  jints_err_t err = read_array(text, UINT64_MAX, out, count, &at, &used);
  if (err != JINTS_OK)
    fail_msg("%s: %s at %zu", text, jints_strerror(err), at);
  assert_int_equal(at, count);
  assert_int_equal(used, strrchr(text, ']') - text + 1); /* past the ']', nothing more */
  for (size_t i = 0; i < count; i++)
    assert_true(out[i] == want[i]);
  json_t *tree = json_loads(text, JSON_DECODE_ANY, NULL);
  if (tree) { /* jansson refuses integers above INT64_MAX */
    assert_int_equal(json_array_size(tree), count);
    for (size_t i = 0; i < count; i++)
      assert_true((uint64_t)json_integer_value(json_array_get(tree, i)) == want[i]);
    json_decref(tree);
  }
}

static void test_good_arrays(void **state) {
  good("[]", NULL, 0);
  good("[ ]", NULL, 0);
  good("[0]", (uint64_t[]){0}, 1);
  good("[7]", (uint64_t[]){7}, 1);
  good("[1,2,3]", (uint64_t[]){1, 2, 3}, 3);
  good("[812,13,0,281474976710655]", (uint64_t[]){812, 13, 0, 281474976710655u}, 4);
  /* Every place JSON allows whitespace, every kind of it. */
  good("[ 1 ,\n2\t,\r3 ]", (uint64_t[]){1, 2, 3}, 3);
  good("[\n  10,\n  20\n]", (uint64_t[]){10, 20}, 2);
  good("[-0]", (uint64_t[]){0}, 1);                                       /* -0 is the integer 0 */
  good("[9999999999999999999]", (uint64_t[]){9999999999999999999u}, 1);   /* 19 digits */
  good("[10000000000000000000]", (uint64_t[]){10000000000000000000u}, 1); /* 20 digits */
  good("[18446744073709551615]", (uint64_t[]){UINT64_MAX}, 1);            /* 2^64 - 1 */
  good("[9223372036854775807,9223372036854775808]",
       (uint64_t[]){INT64_MAX, (uint64_t)INT64_MAX + 1}, 2);
}

/* The reader stops at the ']' and leaves what follows. */
static void test_stops_after_array(void **state) {
  uint64_t out[2];
  size_t at, used;
  assert_int_equal(read_array("[4,5]},{", UINT64_MAX, out, 2, &at, &used), JINTS_OK);
  assert_int_equal(used, 5);
  assert_true(out[0] == 4 && out[1] == 5);
}

/* A bad array: error `want` at element `want_at`. */
static void bad(const char *text, uint64_t max, size_t count, jints_err_t want, size_t want_at) {
  uint64_t out[16];
  size_t at = 99, used;
  assert_true(count <= 16);
  jints_err_t err = read_array(text, max, out, count, &at, &used);
  if (err != want || at != want_at)
    fail_msg("%s: got '%s' at %zu, want '%s' at %zu", text, jints_strerror(err), at,
             jints_strerror(want), want_at);
  assert_true(used <= strlen(text));
}

static void test_broken_arrays(void **state) {
  bad("", UINT64_MAX, 0, JINTS_SYNTAX, 0);
  bad("[", UINT64_MAX, 0, JINTS_SYNTAX, 0);
  bad("[1,2", UINT64_MAX, 2, JINTS_SYNTAX, 2); /* cut off */
  bad("[1,2,", UINT64_MAX, 2, JINTS_SYNTAX, 2);
  bad("[1,2,]", UINT64_MAX, 2, JINTS_SYNTAX, 2);
  bad("[1,2,]", UINT64_MAX, 3, JINTS_SYNTAX, 2);
  bad("[,1]", UINT64_MAX, 1, JINTS_SYNTAX, 0);
  bad("[1 2]", UINT64_MAX, 2, JINTS_SYNTAX, 1);
  bad("[1;2]", UINT64_MAX, 2, JINTS_SYNTAX, 1);
  bad("[12", UINT64_MAX, 1, JINTS_SYNTAX, 1);
  bad("[01]", UINT64_MAX, 1, JINTS_SYNTAX, 0); /* a leading zero is not JSON */
  bad("[+1]", UINT64_MAX, 1, JINTS_SYNTAX, 0);
  bad("[-]", UINT64_MAX, 1, JINTS_SYNTAX, 0);
  bad("[1.]", UINT64_MAX, 1, JINTS_SYNTAX, 0);
  bad("[.5]", UINT64_MAX, 1, JINTS_SYNTAX, 0);
  bad("[1e]", UINT64_MAX, 1, JINTS_SYNTAX, 0);
  bad("[0x10]", UINT64_MAX, 1, JINTS_SYNTAX, 1); /* 0, then a stray byte */
  bad("[x]", UINT64_MAX, 1, JINTS_SYNTAX, 0);
  bad("x", UINT64_MAX, 0, JINTS_SYNTAX, 0);
  bad(" [1]", UINT64_MAX, 1, JINTS_SYNTAX, 0); /* the caller skips whitespace before */
}

static void test_values_refused(void **state) {
  bad("[1,-1]", UINT64_MAX, 2, JINTS_NEGATIVE, 1);
  bad("[-18446744073709551616]", UINT64_MAX, 1, JINTS_NEGATIVE, 0);
  bad("[18446744073709551616]", UINT64_MAX, 1, JINTS_TOO_LARGE, 0); /* 2^64 */
  bad("[99999999999999999999999]", UINT64_MAX, 1, JINTS_TOO_LARGE, 0);
  bad("[100000000000000000000]", UINT64_MAX, 1, JINTS_TOO_LARGE, 0);
  bad("[4,5]", 4, 2, JINTS_TOO_LARGE, 1); /* above the caller's maximum */
  bad("[281474976710656]", 281474976710655u, 1, JINTS_TOO_LARGE, 0);
  bad("[1.5]", UINT64_MAX, 1, JINTS_NOT_INT, 0);
  bad("[1.0]", UINT64_MAX, 1, JINTS_NOT_INT, 0);
  bad("[1e3]", UINT64_MAX, 1, JINTS_NOT_INT, 0);
  bad("[1E3]", UINT64_MAX, 1, JINTS_NOT_INT, 0);
  bad("[2,1e-3]", UINT64_MAX, 2, JINTS_NOT_INT, 1);
  bad("[-1.5]", UINT64_MAX, 1, JINTS_NOT_INT, 0);
  bad("[12345678901234567890.5]", UINT64_MAX, 1, JINTS_NOT_INT, 0);
  bad("[\"7\"]", UINT64_MAX, 1, JINTS_NOT_INT, 0);
  bad("[null]", UINT64_MAX, 1, JINTS_NOT_INT, 0);
  bad("[true]", UINT64_MAX, 1, JINTS_NOT_INT, 0);
  bad("[false]", UINT64_MAX, 1, JINTS_NOT_INT, 0);
  bad("[[1]]", UINT64_MAX, 1, JINTS_NOT_INT, 0);
  bad("[{}]", UINT64_MAX, 1, JINTS_NOT_INT, 0);
  bad("5", UINT64_MAX, 1, JINTS_NOT_ARRAY, 0);
  bad("null", UINT64_MAX, 1, JINTS_NOT_ARRAY, 0);
  bad("{}", UINT64_MAX, 1, JINTS_NOT_ARRAY, 0);
  bad("\"[1]\"", UINT64_MAX, 1, JINTS_NOT_ARRAY, 0);
}

static void test_counts(void **state) {
  bad("[1,2]", UINT64_MAX, 3, JINTS_COUNT, 2); /* fewer: how many there were */
  bad("[]", UINT64_MAX, 1, JINTS_COUNT, 0);
  bad("[1,2]", UINT64_MAX, 1, JINTS_COUNT, 2); /* more: count + 1 */
  bad("[1]", UINT64_MAX, 0, JINTS_COUNT, 1);
  /* One too many is refused before it is written: out[] holds `count`. */
  uint64_t out[3] = {0, 0, 77};
  size_t at, used;
  assert_int_equal(read_array("[1,2,3]", UINT64_MAX, out, 2, &at, &used), JINTS_COUNT);
  assert_true(out[2] == 77);
}

/* Reads one integer of `text` both ways. */
static void one(const char *text, jints_err_t want_u, uint64_t u, jints_err_t want_i, int64_t i) {
  size_t len;
  char *buf = exact(text, &len);
  const char *p = buf;
  uint64_t got_u = 12345;
  int64_t got_i = 12345;
  assert_int_equal(jints_u64(&p, buf + len, UINT64_MAX, &got_u), want_u);
  assert_true(p == (want_u == JINTS_OK ? buf + len : buf));
  assert_true(got_u == (want_u == JINTS_OK ? u : 12345));
  p = buf;
  assert_int_equal(jints_i64(&p, buf + len, &got_i), want_i);
  assert_true(p == (want_i == JINTS_OK ? buf + len : buf));
  assert_true(got_i == (want_i == JINTS_OK ? i : 12345));
  free(buf);
}

static void test_single_integers(void **state) {
  one("0", JINTS_OK, 0, JINTS_OK, 0);
  one("-0", JINTS_OK, 0, JINTS_OK, 0);
  one("42", JINTS_OK, 42, JINTS_OK, 42);
  one("-42", JINTS_NEGATIVE, 0, JINTS_OK, -42);
  one("9223372036854775807", JINTS_OK, INT64_MAX, JINTS_OK, INT64_MAX);
  one("-9223372036854775808", JINTS_NEGATIVE, 0, JINTS_OK, INT64_MIN);
  one("9223372036854775808", JINTS_OK, (uint64_t)INT64_MAX + 1, JINTS_TOO_LARGE, 0);
  one("-9223372036854775809", JINTS_NEGATIVE, 0, JINTS_TOO_LARGE, 0);
  one("18446744073709551615", JINTS_OK, UINT64_MAX, JINTS_TOO_LARGE, 0);
  one("18446744073709551616", JINTS_TOO_LARGE, 0, JINTS_TOO_LARGE, 0);
  one("1.5", JINTS_NOT_INT, 0, JINTS_NOT_INT, 0);
  one("1e3", JINTS_NOT_INT, 0, JINTS_NOT_INT, 0);
  one("null", JINTS_NOT_INT, 0, JINTS_NOT_INT, 0);
  one("\"7\"", JINTS_NOT_INT, 0, JINTS_NOT_INT, 0);
  one("", JINTS_SYNTAX, 0, JINTS_SYNTAX, 0);
  one("-", JINTS_SYNTAX, 0, JINTS_SYNTAX, 0);
  one("00", JINTS_SYNTAX, 0, JINTS_SYNTAX, 0);
  for (int e = JINTS_OK; e <= JINTS_COUNT; e++)
    assert_non_null(jints_strerror((jints_err_t)e));
}

/* Random arrays, compact and spaced, against snprintf's digits: the fast
 * path's 19 digits and the slow path's 20 both meet every length. */
static void test_random_arrays(void **state) {
  static const char *const spaces[] = {"", " ", "\n", "\t ", "\r\n  "};
  uint64_t want[512], got[512];
  char *text = malloc(512 * 40 + 16);
  assert_non_null(text);
  uint64_t x = 88172645463325252u; /* xorshift64 */
  for (int round = 0; round < 200; round++) {
    size_t count = (size_t)(round * 7 % 512), len = 0;
    text[len++] = '[';
    for (size_t i = 0; i < count; i++) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      want[i] = x >> (x % 64); /* every magnitude */
      const char *sp = round % 2 ? spaces[(x >> 3) % 5] : "";
      len += (size_t)sprintf(text + len, "%s%s%llu%s", i ? "," : "", sp,
                             (unsigned long long)want[i], sp);
    }
    text[len++] = ']';
    const char *p = text;
    size_t at;
    assert_int_equal(jints_array_u64(&p, text + len, UINT64_MAX, got, count, &at), JINTS_OK);
    assert_true(p == text + len);
    for (size_t i = 0; i < count; i++)
      assert_true(got[i] == want[i]);
  }
  free(text);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_good_arrays),   cmocka_unit_test(test_stops_after_array),
      cmocka_unit_test(test_broken_arrays), cmocka_unit_test(test_values_refused),
      cmocka_unit_test(test_counts),        cmocka_unit_test(test_single_integers),
      cmocka_unit_test(test_random_arrays),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
