/*
 * test_jreal.c — the text of a JSON real (src/core/jreal.c): the shortest
 * that reads back as the same double, in jansson's form.
 *
 * Known values are checked against their text (what a user wrote, which
 * must come back unchanged), random doubles against the two promises: the
 * text reads back as the double, and "%g" with one digit fewer would not
 * (below 15 digits that holds by DBL_DIG, which the test checks too).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <float.h>
#include <locale.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/jreal.h"

/* jreal_format of `v` must be `want`, read back as `v` (sign of zero
 * included), and be canonical. */
static void formats_as(double v, const char *want) {
  char text[JREAL_MAX];
  size_t n = jreal_format(v, text);
  if (n != strlen(want) || strcmp(text, want) != 0)
    fail_msg("%.17g: got '%s', want '%s'", v, text, want);
  double back = strtod(text, NULL);
  assert_true(back == v);
  assert_int_equal(signbit(back) != 0, signbit(v) != 0);
  assert_true(jreal_canonical(text, n));
}

static void test_known_values(void **state) {
  (void)state;
  formats_as(0.1, "0.1");
  formats_as(0.3, "0.3");
  formats_as(-1.5, "-1.5");
  formats_as(1e300, "1e300");
  formats_as(2.5e-7, "2.5e-7");
  formats_as(1e-5, "1e-5");
  formats_as(0.0001, "0.0001");
  formats_as(1.0, "1.0");
  formats_as(100.0, "100.0");
  formats_as(0.0, "0.0");
  formats_as(-0.0, "-0.0");
  formats_as(123456789.0, "123456789.0");
  formats_as(1e15, "1e15"); /* "%.15g" switches to an exponent there */
  formats_as(1e21, "1e21");
  formats_as(123456789012345680000.0, "1.2345678901234568e20"); /* needs 17 digits */
  formats_as(1.0 / 3, "0.3333333333333333");                    /* 16 digits */
  formats_as(2.0 / 3, "0.6666666666666666");                    /* 16 digits */
  formats_as(0.1 + 0.2, "0.30000000000000004");                 /* 17 digits */
  formats_as(DBL_MAX, "1.7976931348623157e308");
  formats_as(1.7976931348623157e308, "1.7976931348623157e308");
  formats_as(DBL_MIN, "2.2250738585072014e-308");
  /* Subnormals: fewer digits than DBL_DIG suffice, and are found. */
  formats_as(5e-324, "5e-324");
  formats_as(-5e-324, "-5e-324");
  formats_as(1e-310, "1e-310");
  formats_as(2.225073858507201e-308, "2.225073858507201e-308"); /* the largest */
}

static void test_not_finite(void **state) {
  (void)state;
  char text[JREAL_MAX] = "x";
  assert_int_equal(jreal_format(NAN, text), 0);
  assert_string_equal(text, "");
  assert_int_equal(jreal_format(INFINITY, text), 0);
  assert_int_equal(jreal_format(-INFINITY, text), 0);
}

/* The significant digits of `text` (a jreal_format text): the mantissa's
 * digits without leading zeros, and without trailing ones unless it is all
 * zeros. */
static int significant_digits(const char *text) {
  const char *p = text + (text[0] == '-');
  int first = -1, last = -1, at = 0;
  for (; *p && *p != 'e'; p++) {
    if (*p == '.')
      continue;
    if (*p != '0') {
      if (first < 0)
        first = at;
      last = at;
    }
    at++;
  }
  return first < 0 ? 1 : last - first + 1;
}

/* True when "%.{digits}g" of `v` reads back as `v`. */
static bool reads_back(double v, int digits) {
  char text[512]; /* "%.*g" of a double is never longer; the compiler wants it sure */
  snprintf(text, sizeof text, "%.*g", digits, v);
  return strtod(text, NULL) == v;
}

/* A random double over all finite bit patterns. */
static double random_double(void) {
  for (;;) {
    uint64_t bits = 0;
    for (int i = 0; i < 4; i++)
      bits = bits << 16 | (uint64_t)(rand() & 0xFFFF);
    double v;
    memcpy(&v, &bits, sizeof v);
    if (isfinite(v))
      return v;
  }
}

/* Checks the two promises for `v`. */
static void round_trips_shortest(double v) {
  char text[JREAL_MAX];
  size_t n = jreal_format(v, text);
  assert_true(n > 0 && n < JREAL_MAX);
  assert_true(strtod(text, NULL) == v);
  assert_true(strchr(text, '.') || strchr(text, 'e')); /* reads back as a real */
  assert_null(strchr(text, '+'));
  assert_null(strstr(text, "e0"));
  assert_null(strstr(text, "e-0"));
  assert_true(jreal_canonical(text, n));
  int digits = significant_digits(text);
  assert_true(digits <= DBL_DECIMAL_DIG);
  if (digits > 1)
    assert_false(reads_back(v, digits - 1));
}

static void test_random_doubles(void **state) {
  (void)state;
  srand(20240611);
  for (int i = 0; i < 200000; i++)
    round_trips_shortest(random_double());
  /* Short decimals, as people write them, come back as written. */
  for (int whole = 0; whole < 100; whole++) {
    for (int frac = 0; frac < 1000; frac++) {
      char want[32], text[JREAL_MAX];
      if (frac == 0)
        snprintf(want, sizeof want, "%d.0", whole);
      else if (frac % 10 != 0) /* "1.250" would be written "1.25" */
        snprintf(want, sizeof want, "%d.%03d", whole, frac);
      else
        continue;
      double v = strtod(want, NULL);
      jreal_format(v, text);
      assert_string_equal(text, want);
      round_trips_shortest(v);
    }
  }
}

/* Texts kept as they stand, and texts that are not what jreal_format
 * writes for their value. */
static void test_canonical(void **state) {
  (void)state;
  const char *yes[] = {"0.1",
                       "1e300",
                       "2.5e-7",
                       "-0.0",
                       "0.0",
                       "1.0",
                       "5e-324",
                       "1.7976931348623157e308",
                       "0.30000000000000004"};
  for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++)
    if (!jreal_canonical(yes[i], strlen(yes[i])))
      fail_msg("'%s' is not canonical", yes[i]);
  const char *no[] = {"",
                      "1",
                      "-0",
                      "0",
                      "0.10",
                      "1.",
                      ".1",
                      "1e+300",
                      "1E300",
                      "1e0300",
                      "+0.1",
                      "1e3",
                      "0.10000000000000001",
                      "4.94065645841247e-324",
                      "1e400",
                      "-1e400",
                      "1e-400",
                      "nan",
                      "inf",
                      "0x1p3",
                      " 0.1",
                      "0.1 ",
                      "1000000000000000.0",
                      "0.1000000000000000000000000000001"};
  for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
    if (jreal_canonical(no[i], strlen(no[i])))
      fail_msg("'%s' is canonical", no[i]);
  /* Only the bytes given count: what follows them is not read. */
  assert_true(jreal_canonical("0.1]", 3));
  assert_true(jreal_canonical("0.15", 3));
  assert_false(jreal_canonical("0.15", 2));
}

/* A locale whose decimal point is ',' changes nothing (where the system has
 * one: the test is skipped otherwise). */
static void test_comma_locale(void **state) {
  (void)state;
  const char *names[] = {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8", "fr_FR.utf8", "de_DE"};
  const char *set = NULL;
  for (size_t i = 0; i < sizeof names / sizeof names[0] && set == NULL; i++)
    set = setlocale(LC_NUMERIC, names[i]);
  if (set == NULL || localeconv()->decimal_point[0] != ',') {
    setlocale(LC_NUMERIC, "C");
    skip();
  }
  const struct {
    double v;
    const char *text;
  } cases[] = {{0.1, "0.1"}, {2.5e-7, "2.5e-7"}, {1.0, "1.0"}, {1.0 / 3, "0.3333333333333333"}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char text[JREAL_MAX];
    jreal_format(cases[i].v, text);
    assert_string_equal(text, cases[i].text);
    assert_true(jreal_canonical(text, strlen(text)));
  }
  assert_false(jreal_canonical("0,1", 3));
  setlocale(LC_NUMERIC, "C");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_known_values),   cmocka_unit_test(test_not_finite),
      cmocka_unit_test(test_random_doubles), cmocka_unit_test(test_canonical),
      cmocka_unit_test(test_comma_locale),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
