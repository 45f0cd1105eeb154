/*
 * test_jdump.c — libmuster's tree writer (src/client/jdump.c) against
 * jansson's json_dumps.
 *
 * jdump must write json_dumps' bytes for every tree in every form the
 * callers use (JSON_COMPACT, JSON_INDENT(n), the spaced one-line form),
 * reals apart: those are written shortest (src/core/jreal.h), and checked
 * against their text.  Random trees mix every kind of value, with reals
 * whose "%.17g" is their shortest text too, so that both writers agree.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/jdump.h"

static const size_t forms[] = {JSON_COMPACT,   JSON_INDENT(2),  0,
                               JSON_INDENT(4), JSON_INDENT(31), JSON_INDENT(1) | JSON_COMPACT};

/* jdump of `v` in every form must be json_dumps' text; consumes `v`. */
static void same_as_jansson(json_t *v) {
  for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
    char *want = json_dumps(v, forms[i] | JSON_ENCODE_ANY);
    char *got = jdump(v, forms[i]);
    assert_non_null(want);
    assert_non_null(got);
    assert_string_equal(got, want);
    free(want);
    free(got);
  }
  json_decref(v);
}

/* jdump of `v` (consumed) with `flags` must be `want`. */
static void dumps_as(json_t *v, size_t flags, const char *want) {
  char *got = jdump(v, flags);
  assert_non_null(got);
  assert_string_equal(got, want);
  free(got);
  json_decref(v);
}

static void test_scalars(void **state) {
  (void)state;
  same_as_jansson(json_null());
  same_as_jansson(json_true());
  same_as_jansson(json_false());
  const json_int_t ints[] = {0, 1, -1, 42, INT64_MAX, INT64_MIN, (1LL << 53) - 1};
  for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
    same_as_jansson(json_integer(ints[i]));
  same_as_jansson(json_string(""));
  same_as_jansson(json_string("quote \" backslash \\ slash / del \x7f"));
  same_as_jansson(json_string("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"));
  for (int c = 1; c < 0x20; c++) {
    char text[4] = {'a', (char)c, 'z', '\0'};
    same_as_jansson(json_string(text));
  }
  same_as_jansson(json_stringn("nul\0inside", 10));
  const double reals[] = {0.0, -0.0, 1.0, -1.5, 100.0, 123456789.0, 1e21, 0.5};
  for (size_t i = 0; i < sizeof reals / sizeof reals[0]; i++)
    same_as_jansson(json_real(reals[i]));
  assert_null(jdump(NULL, JSON_COMPACT));
}

/* Reals as the user wrote them, where json_dumps writes "%.17g". */
static void test_reals_shortest(void **state) {
  (void)state;
  dumps_as(json_real(0.1), JSON_COMPACT, "0.1");
  dumps_as(json_real(1e300), JSON_COMPACT, "1e300");
  dumps_as(json_real(2.5e-7), JSON_COMPACT, "2.5e-7");
  dumps_as(json_real(5e-324), JSON_COMPACT, "5e-324");
  dumps_as(json_real(1.0 / 3), JSON_COMPACT, "0.3333333333333333");
  json_t *v = json_loads("{\"x\":0.1,\"y\":1e300,\"z\":[0.3,2.5e-7]}", 0, NULL);
  dumps_as(json_incref(v), JSON_COMPACT, "{\"x\":0.1,\"y\":1e300,\"z\":[0.3,2.5e-7]}");
  dumps_as(json_incref(v), 0, "{\"x\": 0.1, \"y\": 1e300, \"z\": [0.3, 2.5e-7]}");
  dumps_as(v, JSON_INDENT(2),
           "{\n  \"x\": 0.1,\n  \"y\": 1e300,\n  \"z\": [\n    0.3,\n    2.5e-7\n  ]\n}");
}

static void test_containers(void **state) {
  (void)state;
  same_as_jansson(json_object());
  same_as_jansson(json_array());
  same_as_jansson(json_pack("{s:[], s:{}, s:[[]], s:{s:{}}}", "a", "b", "c", "d", "e"));
  same_as_jansson(json_pack("{s:I, s:s, s:[i, f, n, b], s:{s:{}}, s:[]}", "task", (json_int_t)7,
                            "payload", "x", "list", 1, 2.5, 1, "nested", "deep", "empty"));
  /* Keys in insertion order, as jansson iterates them; odd keys escaped. */
  json_t *o = json_object();
  const char *keys[] = {"zeta", "alpha", "m", "a\"b", "\xc3\xa9t\xc3\xa9", "tab\tkey", ""};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
    json_object_set_new(o, keys[i], json_integer((json_int_t)i));
  json_object_setn_new(o, "nul\0key", 7, json_true());
  same_as_jansson(o);
  json_t *deep = json_integer(1);
  for (int i = 0; i < 100; i++)
    deep = json_pack("{s:o, s:[o, s]}", "d", deep, "a", json_real(0.25), "s");
  same_as_jansson(deep);
}

/* What jansson refuses to write, jdump refuses too. */
static void test_refused(void **state) {
  (void)state;
  json_t *bad = json_pack("[s, o]", "ok", json_stringn_nocheck("\xff", 1));
  assert_null(json_dumps(bad, JSON_COMPACT));
  assert_null(jdump(bad, JSON_COMPACT));
  json_decref(bad);
}

static unsigned rng = 88172645u;

static unsigned next_random(void) {
  rng ^= rng << 13;
  rng ^= rng >> 17;
  rng ^= rng << 5;
  return rng;
}

/* A random tree of at most `depth` more levels. */
static json_t *random_tree(int depth) {
  static const char *const strings[] = {
      "", "a", "key", "q\"", "\\", "\n\t", "\x01", "/", "caf\xc3\xa9", "\xf0\x9f\x98\x80", "\x7f"};
  static const double reals[] = {0.5, -2.0, 1e21, 0.0, -0.0, 1.25, 1e22};
  unsigned kind = depth == 0 ? next_random() % 6 : next_random() % 8;
  switch (kind) {
  case 0:
    return json_integer((json_int_t)(int32_t)next_random());
  case 1:
    return json_string(strings[next_random() % (sizeof strings / sizeof strings[0])]);
  case 2:
    return json_real(reals[next_random() % (sizeof reals / sizeof reals[0])]);
  case 3:
    return next_random() % 2 ? json_true() : json_false();
  case 4:
    return json_null();
  case 5:
    return json_stringn("a\0b", 3);
  case 6: {
    json_t *a = json_array();
    for (unsigned n = next_random() % 5; n > 0; n--)
      json_array_append_new(a, random_tree(depth - 1));
    return a;
  }
  default: {
    json_t *o = json_object();
    for (unsigned n = next_random() % 5; n > 0; n--)
      json_object_set_new(o, strings[next_random() % (sizeof strings / sizeof strings[0])],
                          random_tree(depth - 1));
    return o;
  }
  }
}

static void test_random_trees(void **state) {
  (void)state;
  for (int round = 0; round < 3000; round++)
    same_as_jansson(random_tree(5));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_scalars),      cmocka_unit_test(test_reals_shortest),
      cmocka_unit_test(test_containers),   cmocka_unit_test(test_refused),
      cmocka_unit_test(test_random_trees),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
