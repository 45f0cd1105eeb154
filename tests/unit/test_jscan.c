/*
 * test_jscan.c — the body scanner (src/server/jscan.c) against the tree path.
 *
 * The scanner may decline any body, but what it accepts must be exactly what
 * the tree path would store: every kept text equal to jw_dump of the value
 * jansson parses (JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL) from the whole
 * body, every integer field the value (or default) the handler's jv_int
 * reads, and never a body the tree path refuses.  Each case below also says
 * whether the scanner must take it (the common shapes) or decline it (every
 * trigger of the fallback), so a scanner that declines everything, or
 * accepts what it must not, fails here.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/jscan.h"
#include "server/jw.h"
#include "server/lease.h"
#include "server/task.h"

#define MAX_TEXT 1024

enum { DECLINE, TAKE };

/* Checks a body the scanner took against the tree of the same text. */
static void same_as_tree(const jscan_shape_t *shape, const char *text, size_t len,
                         const jscan_body_t *b) {
  json_t *tree = json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, NULL);
  assert_non_null(tree); /* never a body the tree path refuses */
  assert_true(json_is_object(tree));
  json_t *elems = json_object_get(tree, shape->array);
  assert_true(json_is_array(elems));
  assert_int_equal(json_array_size(elems), b->count);
  assert_true(b->count >= 1 && b->count <= shape->max_elems);
  assert_int_equal(json_object_size(tree), 1 + (b->extra != NULL));
  for (size_t i = 0; i < b->count; i++) {
    json_t *elem = json_array_get(elems, i);
    const jscan_elem_t *e = &b->elems[i];
    assert_true(json_is_object(elem));
    size_t known = 0;
    json_t *value = json_object_get(elem, shape->text);
    if (value == NULL) {
      assert_false(shape->text_required);
      assert_null(e->text);
    } else {
      known++;
      size_t want_len;
      char *want = jw_dump(value, &want_len);
      assert_non_null(e->text);
      assert_string_equal(e->text, want); /* the stored bytes */
      assert_int_equal(e->text_len, want_len);
      assert_true(want_len <= MAX_TEXT);
      free(want);
    }
    for (int k = 0; shape->ints[k].name; k++) {
      json_t *v = json_object_get(elem, shape->ints[k].name);
      known += v != NULL;
      if (v == NULL || json_is_null(v)) {
        assert_false(shape->ints[k].required);
        assert_int_equal(e->ints[k], shape->ints[k].dflt);
      } else {
        assert_true(json_is_integer(v));
        assert_int_equal(e->ints[k], json_integer_value(v));
        assert_true(e->ints[k] >= shape->ints[k].min && e->ints[k] <= shape->ints[k].max);
      }
    }
    assert_int_equal(json_object_size(elem), known); /* no field the scanner skipped */
  }
  if (b->extra) {
    json_t *extra = json_object_get(tree, shape->extra);
    char *want = jw_dump(extra, NULL);
    assert_int_equal(strlen(want), b->extra_len);
    assert_memory_equal(want, b->extra, b->extra_len);
    free(want);
  }
  json_decref(tree);
}

/* Scans `text`; fails unless the scanner's choice is `expect` and what it
 * took is the tree path's. */
static void check_len(const jscan_shape_t *shape, const char *text, size_t len, int expect) {
  jscan_body_t b;
  bool took = jscan_body(shape, text, len, MAX_TEXT, &b);
  if (took != (expect == TAKE))
    fail_msg("%s: %.*s", took ? "took" : "declined", (int)len, text ? text : "");
  if (took)
    same_as_tree(shape, text, len, &b);
  jscan_body_free(&b);
}

static void check(const jscan_shape_t *shape, const char *text, int expect) {
  check_len(shape, text, strlen(text), expect);
}

static void test_put_common(void **state) {
  (void)state;
  const jscan_shape_t *s = &task_put_shape;
  check(s, "{\"tasks\":[{\"payload\":\"xxxxxxxx\"}]}", TAKE);
  check(s, "{\"tasks\":[{\"payload\":1},{\"payload\":null},{\"payload\":true},{\"payload\":[]}]}",
        TAKE);
  check(s, "{\"tasks\":[{\"payload\":{\"a\":[1,-2,\"x\",{\"b\":{}}],\"c\":false}}]}", TAKE);
  check(s, "{\"tasks\":[{\"priority\":5,\"payload\":\"p\",\"delay_ms\":100,\"index\":3}]}", TAKE);
  check(s,
        "{\"tasks\":[{\"payload\":0,\"priority\":-2147483648},{\"payload\":0,"
        "\"priority\":2147483647,\"delay_ms\":31622400000,\"index\":9223372036854775807}]}",
        TAKE);
  check(s, "{\"tasks\":[{\"payload\":1,\"priority\":null,\"index\":null}]}", TAKE);
  /* Escapes jw writes, UTF-8 as it is, a NUL in a string (not in a key). */
  check(s, "{\"tasks\":[{\"payload\":\"q\\\" b\\\\ \\b\\f\\n\\r\\t \\u0000\\u001F\\u0001\"}]}",
        TAKE);
  check(s, "{\"tasks\":[{\"payload\":\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \x7f /\"}]}",
        TAKE);
  check(s, "{\"tasks\":[{\"payload\":{\"k\\n\":1,\"k\\t\":2,\"\":3}}]}", TAKE);
  check(s, "{\"tasks\":[{\"payload\":[-9223372036854775808,9223372036854775807,0,-1,10]}]}", TAKE);
  /* Keys equal in another object are not duplicates. */
  check(s, "{\"tasks\":[{\"payload\":{\"a\":{\"a\":1},\"b\":{\"a\":2}}}]}", TAKE);
  /* Reals in the text jw writes for them, kept as sent. */
  check(s, "{\"tasks\":[{\"payload\":{\"x\":0.1,\"y\":1e300,\"z\":[0.3,2.5e-7,-0.0,1.0]}}]}", TAKE);
}

static void test_put_declined(void **state) {
  (void)state;
  const jscan_shape_t *s = &task_put_shape;
  const char *const bodies[] = {
      /* whitespace anywhere */
      "{\"tasks\": [{\"payload\":1}]}",
      "{\"tasks\":[{\"payload\": 1}]}",
      "{\"tasks\":[{\"payload\":[1, 2]}]}",
      "{\"tasks\":[{\"payload\":{\"a\" :1}}]}",
      " {\"tasks\":[{\"payload\":1}]}",
      "{\"tasks\":[{\"payload\":1}]}\n",
      /* escapes jw does not write, reals not in their shortest text, integers
       * jansson refuses or rewrites */
      "{\"tasks\":[{\"payload\":\"\\u00e9\"}]}",
      "{\"tasks\":[{\"payload\":\"\\/\"}]}",
      "{\"tasks\":[{\"payload\":\"\\u001f\"}]}",
      "{\"tasks\":[{\"payload\":\"\\u000A\"}]}",
      "{\"tasks\":[{\"payload\":\"\\u0041\"}]}",
      "{\"tasks\":[{\"payload\":\"\\ud83d\\ude00\"}]}",
      "{\"tasks\":[{\"payload\":1.50}]}",
      "{\"tasks\":[{\"payload\":1.}]}",
      "{\"tasks\":[{\"payload\":1e3}]}",
      "{\"tasks\":[{\"payload\":1E3}]}",
      "{\"tasks\":[{\"payload\":0.10000000000000001}]}",
      "{\"tasks\":[{\"payload\":1e+300}]}",
      "{\"tasks\":[{\"payload\":-0}]}",
      "{\"tasks\":[{\"payload\":01}]}",
      "{\"tasks\":[{\"payload\":+1}]}",
      "{\"tasks\":[{\"payload\":9223372036854775808}]}",
      "{\"tasks\":[{\"payload\":-9223372036854775809}]}",
      "{\"tasks\":[{\"payload\":99999999999999999999999}]}",
      /* duplicate keys, at every level */
      "{\"tasks\":[{\"payload\":{\"a\":1,\"a\":2}}]}",
      "{\"tasks\":[{\"payload\":{\"a\":1,\"b\":{},\"a\":{}}}]}",
      "{\"tasks\":[{\"payload\":1,\"payload\":2}]}",
      "{\"tasks\":[{\"payload\":1,\"priority\":1,\"priority\":2}]}",
      "{\"tasks\":[{\"payload\":1}],\"tasks\":[{\"payload\":1}]}",
      "{\"tasks\":[{\"payload\":{\"a\\n\":1,\"a\\n\":2}}]}",
      /* a NUL in a key, invalid strings */
      "{\"tasks\":[{\"payload\":{\"a\\u0000\":1}}]}",
      "{\"tasks\":[{\"payload\":\"\x01\"}]}",
      "{\"tasks\":[{\"payload\":\"\xc3\"}]}",
      "{\"tasks\":[{\"payload\":\"\xed\xa0\x80\"}]}",
      "{\"tasks\":[{\"payload\":\"\xc0\xaf\"}]}",
      "{\"tasks\":[{\"payload\":\"\\x\"}]}",
      "{\"tasks\":[{\"payload\":\"abc}]}",
      /* fields the fast path leaves to the tree, unknown or missing ones, wrong types */
      "{\"tasks\":[{\"payload\":1,\"key\":\"k\"}]}",
      "{\"tasks\":[{\"payload\":1,\"session\":\"s\"}]}",
      "{\"tasks\":[{\"payload\":1,\"requires\":[]}]}",
      "{\"tasks\":[{\"payload\":1,\"x\":1}]}",
      "{\"tasks\":[{\"priority\":1}]}",
      "{\"tasks\":[{}]}",
      "{\"tasks\":[]}",
      "{}",
      "{\"tasks\":{}}",
      "{\"tasks\":[1]}",
      "{\"tasks\":[{\"payload\":1}],\"x\":1}",
      "{\"tasks\":[{\"payload\":1,\"priority\":\"1\"}]}",
      "{\"tasks\":[{\"payload\":1,\"priority\":1.0}]}",
      "{\"tasks\":[{\"payload\":1,\"priority\":2147483648}]}",
      "{\"tasks\":[{\"payload\":1,\"delay_ms\":-1}]}",
      "{\"tasks\":[{\"payload\":1,\"delay_ms\":31622400001}]}",
      "{\"tasks\":[{\"payload\":1,\"index\":-1}]}",
      "{\"tas\\u006bs\":[{\"payload\":1}]}",
      "{\"lease\":{},\"tasks\":[{\"payload\":1}]}",
      /* not an object, cut short, trailing bytes */
      "[{\"payload\":1}]",
      "",
      "{\"tasks\":[{\"payload\":1}]",
      "{\"tasks\":[{\"payload\":1}]}x",
      "{\"tasks\":[{\"payload\":tru}]}",
      "{\"tasks\":[{\"payload\":[1,]}]}",
      "{\"tasks\":[{\"payload\":{\"a\":1,}}]}",
      "{\"tasks\":[{\"payload\":[1}]}",
  };
  for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++)
    check(s, bodies[i], DECLINE);
  check_len(s, NULL, 0, DECLINE);
  static const char raw_nul[] = "{\"tasks\":[{\"payload\":\"a\0b\"}]}";
  check_len(s, raw_nul, sizeof raw_nul - 1, DECLINE);
}

/* Limits: the batch size, the payload size and the nesting the scanner proves. */
static void test_put_limits(void **state) {
  (void)state;
  const jscan_shape_t *s = &task_put_shape;
  char *body = malloc(32 * (TASK_MAX_BATCH + 2));
  assert_non_null(body);
  for (size_t n = TASK_MAX_BATCH; n <= TASK_MAX_BATCH + 1; n++) {
    size_t at = (size_t)sprintf(body, "{\"tasks\":[");
    for (size_t i = 0; i < n; i++)
      at += (size_t)sprintf(body + at, "%s{\"payload\":%zu}", i ? "," : "", i);
    sprintf(body + at, "]}");
    check(s, body, n <= TASK_MAX_BATCH ? TAKE : DECLINE);
  }
  /* A payload of exactly MAX_TEXT bytes, and one more. */
  for (size_t len = MAX_TEXT; len <= MAX_TEXT + 1; len++) {
    size_t at = (size_t)sprintf(body, "{\"tasks\":[{\"payload\":\"");
    memset(body + at, 'x', len - 2);
    sprintf(body + at + len - 2, "\"}]}");
    check(s, body, len <= MAX_TEXT ? TAKE : DECLINE);
  }
  /* Nesting: 64 containers are proven, 65 left to the tree. */
  for (int depth = 64; depth <= 65; depth++) {
    size_t at = (size_t)sprintf(body, "{\"tasks\":[{\"payload\":");
    for (int i = 0; i < depth; i++)
      body[at++] = '[';
    for (int i = 0; i < depth; i++)
      body[at++] = ']';
    sprintf(body + at, "}]}");
    check(s, body, depth <= 64 ? TAKE : DECLINE);
  }
  free(body);
}

static void test_complete(void **state) {
  (void)state;
  const jscan_shape_t *s = &lease_complete_shape;
  check(s, "{\"leases\":[{\"task\":1,\"token\":2}]}", TAKE);
  check(s,
        "{\"leases\":[{\"task\":1,\"token\":2,\"result\":{\"ok\":true}},"
        "{\"result\":null,\"token\":9007199254740991,\"task\":3}]}",
        TAKE);
  check(s,
        "{\"leases\":[{\"task\":1,\"token\":2,\"result\":\"r\"}],"
        "\"lease\":{\"queue\":\"q\",\"max\":64,\"worker\":3,\"updates_after\":0}}",
        TAKE);
  check(s, "{\"lease\":{\"queue\":\"q\",\"max\":1},\"leases\":[{\"task\":1,\"token\":2}]}", TAKE);
  check(s, "{\"leases\":[{\"task\":1,\"token\":2}],\"lease\":null}", TAKE);
  /* Reals in jw's text: a result kept as sent; a "lease" kept for its
   * handler, which refuses a real "max" as the tree path does. */
  check(s, "{\"leases\":[{\"task\":1,\"token\":2,\"result\":{\"score\":0.1,\"e\":2.5e-7}}]}", TAKE);
  check(s, "{\"leases\":[{\"task\":1,\"token\":2}],\"lease\":{\"max\":1.5}}", TAKE);
  const char *const bodies[] = {
      "{\"leases\":[{\"task\":1}]}",
      "{\"leases\":[{\"token\":1}]}",
      "{\"leases\":[{\"task\":null,\"token\":1}]}",
      "{\"leases\":[{\"task\":0,\"token\":1}]}",
      "{\"leases\":[{\"task\":1,\"token\":9007199254740992}]}",
      "{\"leases\":[{\"task\":1,\"token\":2,\"error\":\"e\"}]}",
      "{\"leases\":[{\"task\":1,\"token\":2,\"result\":1.50}]}",
      "{\"leases\":[{\"task\":1,\"token\":2,\"result\":{\"a\":1,\"a\":1}}]}",
      "{\"leases\":[{\"task\":1,\"token\":2,\"result\":[ ]}]}",
      "{\"leases\":[{\"task\":1,\"token\":2}],\"lease\":{\"queue\":\"q\",\"queue\":\"r\"}}",
      "{\"leases\":[{\"task\":1,\"token\":2}],\"lease\":{\"max\":1.50}}",
      "{\"leases\":[{\"task\":1,\"token\":2}],\"lease\":{}, \"lease\":{}}",
      "{\"leases\":[{\"task\":1,\"token\":2}],\"lease\":{},\"lease\":{}}",
      "{\"leases\":[{\"task\":1,\"token\":2}],\"extra\":1}",
      "{\"lease\":{}}",
      "{\"leases\":[{\"task\":1,\"token\":2,\"task\":1}]}",
  };
  for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++)
    check(s, bodies[i], DECLINE);
}

/* What jw writes the scanner proves canonical; what it proves canonical,
 * jw writes back unchanged. */
static void canonical_both_ways(json_t *v) {
  size_t len;
  char *text = jw_dump(v, &len);
  assert_non_null(text);
  assert_true(jscan_canonical(text, len));
  json_decref(v);
  free(text);
}

static void test_canonical(void **state) {
  (void)state;
  canonical_both_ways(json_pack("{s:[i, s, b, n, {s:{}}], s:s}", "a", 1, "x\n\"\\\x01\x1f", 1, "b",
                                "c", "caf\xc3\xa9"));
  canonical_both_ways(json_stringn("nul\0inside", 10));
  canonical_both_ways(json_integer(INT64_MIN));
  for (int c = 1; c < 0x20; c++) {
    char text[4] = {'a', (char)c, 'z', '\0'};
    canonical_both_ways(json_string(text));
  }
  const double reals[] = {0.1, 1e300, 2.5e-7, -0.0, 5e-324, 1.7976931348623157e308, 100.0};
  for (size_t i = 0; i < sizeof reals / sizeof reals[0]; i++)
    canonical_both_ways(json_real(reals[i]));
  assert_true(jscan_canonical("1.5", 3));
  assert_false(jscan_canonical("1.50", 4));
  assert_false(jscan_canonical("\"\\u00e9\"", 8));
  assert_false(jscan_canonical(NULL, 0));
}

/* Random bytes changed in canonical bodies: whatever the scanner still takes
 * must be the tree path's. */
static void test_mutations(void **state) {
  (void)state;
  const char *const seeds[] = {
      "{\"tasks\":[{\"payload\":{\"a\":[1,\"b\\n\",null],\"c\":{\"d\":-5}},\"priority\":3}]}",
      "{\"leases\":[{\"task\":1,\"token\":2,\"result\":{\"x\":\"caf\xc3\xa9\"}}],"
      "\"lease\":{\"queue\":\"q\",\"max\":2}}",
  };
  const jscan_shape_t *shapes[] = {&task_put_shape, &lease_complete_shape};
  const char alphabet[] = "{}[]:,\"\\ 0129-.eanultrsfxu\x01\x80\xc3\xa9";
  unsigned seed = 12345;
  char buf[256];
  for (int round = 0; round < 20000; round++) {
    int which = round % 2;
    size_t len = strlen(seeds[which]);
    memcpy(buf, seeds[which], len);
    for (int k = 0; k < 1 + round % 3; k++) {
      seed = seed * 1103515245 + 12345;
      size_t at = (seed >> 8) % len;
      seed = seed * 1103515245 + 12345;
      buf[at] = alphabet[(seed >> 8) % (sizeof alphabet - 1)];
    }
    jscan_body_t b;
    if (jscan_body(shapes[which], buf, len, MAX_TEXT, &b))
      same_as_tree(shapes[which], buf, len, &b);
    jscan_body_free(&b);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_put_common), cmocka_unit_test(test_put_declined),
      cmocka_unit_test(test_put_limits), cmocka_unit_test(test_complete),
      cmocka_unit_test(test_canonical),  cmocka_unit_test(test_mutations),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
