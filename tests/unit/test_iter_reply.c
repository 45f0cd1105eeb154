/*
 * test_iter_reply.c — a coordinated iteration's `next` reply, and the
 * `held` listing of a rank's blocks, read from their text
 * (src/client/iter_reply.c, iter_next_read and iter_held_read).
 *
 * Good replies — the head's compact text, the same spaced out in every way
 * JSON allows, members in another order, escaped names, unknown members —
 * must give what a jansson tree of the same text holds (the oracle below
 * reads it as libmuster's tree path did, with the indices checked).  Bad
 * replies — every prefix of a good one, and each way an index or a block can
 * be wrong — must fail with MUSTER_PROTOCOL, a message naming the place, and
 * nothing left in the result.  Texts are copied into buffers of their exact
 * length (no NUL), so that the sanitizer build catches a read past the end.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/iter_internal.h"

/* What the head writes (src/server/iter_lease.c), with a newline after it. */
static const char head_reply[] =
    "{\"state\":\"blocks\",\"epoch\":3,\"blocks\":[{\"block\":5,\"token\":1042,"
    "\"deadline_ms\":1763769630000,\"rank\":1,\"begin\":32,\"end\":35,\"takeover\":false,"
    "\"indices\":[812,13,7]},{\"block\":6,\"token\":1043,\"deadline_ms\":1763769630001,"
    "\"rank\":null,\"begin\":0,\"end\":0,\"takeover\":true,\"indices\":[]}]}\n";

/* Reads the first `len` bytes of `text` from an exact copy. */
static muster_err_t read_n(const char *text, size_t len, bool want, muster_iter_next_t *out,
                           char *why, size_t why_size) {
  char *copy = malloc(len ? len : 1);
  assert_non_null(copy);
  memcpy(copy, text, len);
  muster_err_t err = iter_next_read(copy, len, want, out, why, why_size);
  free(copy);
  return err;
}

/* Integer member `key` of `obj` as the tree path read it: -1 (or `dflt`)
 * when absent or null. */
static int64_t tree_int(const json_t *obj, const char *key, int64_t dflt) {
  const json_t *v = json_object_get(obj, key);
  if (v == NULL || json_is_null(v))
    return dflt;
  assert_true(json_is_integer(v));
  return json_integer_value(v);
}

/* Checks *out against jansson's tree of the same text. */
static void same_as_tree(const char *text, const muster_iter_next_t *out) {
  json_t *tree = json_loads(text, JSON_ALLOW_NUL, NULL);
  assert_non_null(tree);
  static const char *const states[] = {"blocks", "wait", "epoch_end", "finished"};
  assert_string_equal(json_string_value(json_object_get(tree, "state")), states[out->state]);
  assert_true(out->epoch == (uint64_t)tree_int(tree, "epoch", 0));
  assert_true(out->retry_ms == tree_int(tree, "retry_ms", 50));
  const json_t *blocks = json_object_get(tree, "blocks");
  assert_int_equal(json_array_size(blocks), out->count);
  for (size_t i = 0; i < out->count; i++) {
    const json_t *b = json_array_get(blocks, i);
    const muster_iter_block_t *got = &out->blocks[i];
    assert_true(got->block == (uint64_t)tree_int(b, "block", -1));
    assert_true(got->token == tree_int(b, "token", -1));
    assert_true(got->deadline_ms == tree_int(b, "deadline_ms", -1));
    assert_true(got->plan_rank == tree_int(b, "rank", -1));
    assert_true(got->begin == (uint64_t)tree_int(b, "begin", -1));
    assert_true(got->end == (uint64_t)tree_int(b, "end", -1));
    assert_int_equal(got->takeover, json_is_true(json_object_get(b, "takeover")));
    const json_t *list = json_object_get(b, "indices");
    if (list == NULL) {
      assert_null(got->indices);
      continue;
    }
    assert_non_null(got->indices);
    assert_int_equal(json_array_size(list), got->end - got->begin);
    for (size_t k = 0; k < json_array_size(list); k++) {
      const json_t *v = json_array_get(list, k);
      assert_true(json_is_integer(v) && json_integer_value(v) >= 0);
      assert_true(got->indices[k] == (uint64_t)json_integer_value(v));
    }
  }
  json_decref(tree);
}

/* A good reply: read, and equal to the tree. */
static void good(const char *text, bool want) {
  muster_iter_next_t out;
  char why[256] = "";
  muster_err_t err = read_n(text, strlen(text), want, &out, why, sizeof why);
  if (err != MUSTER_OK)
    fail_msg("%s\n-> %s", text, why);
  same_as_tree(text, &out);
  muster_iter_next_free(&out);
}

/* A bad reply: MUSTER_PROTOCOL, a message holding `part`, nothing kept. */
static void bad(const char *text, bool want, const char *part) {
  muster_iter_next_t out;
  char why[256] = "";
  muster_err_t err = read_n(text, strlen(text), want, &out, why, sizeof why);
  if (err != MUSTER_PROTOCOL || strstr(why, part) == NULL)
    fail_msg("%s\n-> %s (%d), want '%s'", text, why, (int)err, part);
  assert_null(out.blocks);
  assert_int_equal(out.count, 0);
}

static void test_head_reply(void **state) {
  muster_iter_next_t out;
  char why[256];
  assert_int_equal(read_n(head_reply, strlen(head_reply), true, &out, why, sizeof why), MUSTER_OK);
  assert_int_equal(out.state, MUSTER_ITER_BLOCKS);
  assert_true(out.epoch == 3 && out.count == 2);
  const muster_iter_block_t *b = &out.blocks[0];
  assert_true(b->block == 5 && b->token == 1042 && b->deadline_ms == 1763769630000 &&
              b->plan_rank == 1 && b->begin == 32 && b->end == 35 && !b->takeover);
  assert_true(b->indices[0] == 812 && b->indices[1] == 13 && b->indices[2] == 7);
  b = &out.blocks[1];
  assert_true(b->plan_rank == -1 && b->takeover && b->begin == 0 && b->end == 0);
  assert_non_null(b->indices); /* asked for, and empty */
  muster_iter_next_free(&out);
  good(head_reply, true);
  good(head_reply, false);
}

static void test_other_states(void **state) {
  good("{\"state\":\"wait\",\"epoch\":0,\"blocks\":[],\"retry_ms\":120}", true);
  good("{\"state\":\"epoch_end\",\"epoch\":4,\"blocks\":[]}", true);
  good("{\"state\":\"finished\",\"epoch\":9,\"blocks\":[]}", false);
  good("{\"blocks\":[],\"state\":\"wait\"}", true); /* epoch 0, retry_ms 50 */
  good("{\"state\":\"wait\",\"epoch\":null,\"blocks\":[],\"retry_ms\":null}", true);
}

/* `text` with whitespace between its tokens, chosen by `seed`. */
static char *spaced(const char *text, unsigned seed) {
  static const char *const spaces[] = {"", " ", "\n", "\t", "\r\n  ", "  "};
  char *out = malloc(strlen(text) * 11 + 1), *o = out;
  assert_non_null(out);
  bool in_string = false;
  for (const char *p = text; *p; p++) {
    bool between = !in_string && strchr("{}[],:", *p) != NULL;
    seed = seed * 1103515245u + 12345u;
    if (between) {
      o += sprintf(o, "%s", spaces[(seed >> 16) % 6]);
    }
    *o++ = *p;
    if (in_string && *p == '\\')
      *o++ = *++p;
    else if (*p == '"')
      in_string = !in_string;
    if (between) {
      seed = seed * 1103515245u + 12345u;
      o += sprintf(o, "%s", spaces[(seed >> 16) % 6]);
    }
  }
  *o = '\0';
  return out;
}

static void test_whitespace(void **state) {
  for (unsigned seed = 0; seed < 200; seed++) {
    char *text = spaced(head_reply, seed);
    good(text, true);
    free(text);
  }
  /* jansson's own indented form. */
  json_t *tree = json_loads(head_reply, 0, NULL);
  char *indented = json_dumps(tree, JSON_INDENT(4));
  good(indented, true);
  free(indented);
  json_decref(tree);
}

static void test_order_names_and_unknown_members(void **state) {
  /* The indices before "begin" and "end": read once the block is. */
  good("{\"blocks\":[{\"indices\":[4,5],\"begin\":10,\"token\":2,\"end\":12,\"block\":1}],"
       "\"state\":\"blocks\"}",
       true);
  good("{\"state\":\"blocks\",\"blocks\":[{\"block\":1,\"begin\":10,\"indices\":[4, 5],"
       "\"end\":12,\"token\":2}]}",
       true);
  /* Escaped names are the names they spell. */
  good("{\"st\\u0061te\":\"bl\\u006fcks\",\"blocks\":[{\"block\":1,\"token\":2,\"begin\":0,"
       "\"end\":1,\"\\u0069ndices\":[9],\"takeover\":true}]}",
       true);
  /* Members this reader does not know are skipped, whatever they hold. */
  good("{\"state\":\"blocks\",\"note\":{\"a\":[1,2.5,\"x\",null,{\"b\":[]}]},\"blocks\":[{"
       "\"block\":1,\"token\":2,\"begin\":0,\"end\":2,\"future\":[-1,1e9],\"indices\":[0,-0],"
       "\"x\":\"]}\"}]}",
       true);
  /* A name with NUL in it is another name, not "indices". */
  bad("{\"state\":\"blocks\",\"blocks\":[{\"block\":1,\"token\":2,\"begin\":0,\"end\":1,"
      "\"indices\\u0000\":[9]}]}",
      true, "blocks[0]: no \"indices\"");
  /* Not asked for and absent: no array. */
  good("{\"state\":\"blocks\",\"blocks\":[{\"block\":1,\"token\":2,\"begin\":0,\"end\":1}]}",
       false);
}

/* Every prefix of a good reply is refused: a reply cut short anywhere,
 * inside an index too, is never read as a shorter one. */
static void test_every_prefix(void **state) {
  const char *texts[2] = {head_reply, NULL};
  char *other = spaced(head_reply, 7);
  texts[1] = other;
  for (int t = 0; t < 2; t++) {
    size_t full = strrchr(texts[t], '}') - texts[t] + 1;
    for (size_t len = 0; len < full; len++) {
      muster_iter_next_t out;
      char why[256];
      assert_int_equal(read_n(texts[t], len, false, &out, why, sizeof why), MUSTER_PROTOCOL);
      assert_null(out.blocks);
    }
  }
  free(other);
}

/* The head reply with block 0's indices replaced by `list`. */
static char *with_indices(const char *list) {
  static const char prefix[] =
      "{\"state\":\"blocks\",\"epoch\":3,\"blocks\":[{\"block\":5,\"token\":1042,"
      "\"deadline_ms\":1,\"rank\":1,\"begin\":32,\"end\":35,\"takeover\":false,\"indices\":";
  char *text = malloc(sizeof prefix + strlen(list) + 8);
  assert_non_null(text);
  sprintf(text, "%s%s}]}", prefix, list);
  return text;
}

static void bad_indices(const char *list, const char *part) {
  char *text = with_indices(list);
  bad(text, true, part);
  free(text);
}

static void test_bad_indices(void **state) {
  bad_indices("[812,-13,7]", "blocks[0].indices[1]: a negative number");
  bad_indices("[812,13,18446744073709551616]", "blocks[0].indices[2]: above the largest");
  bad_indices("[812,13,18446744073709551615]", "blocks[0].indices[2]: above the largest");
  bad_indices("[281474976710656,1,2]", "blocks[0].indices[0]: above the largest");
  bad_indices("[812,1.5,7]", "blocks[0].indices[1]: not an integer");
  bad_indices("[812,13,1e3]", "blocks[0].indices[2]: not an integer");
  bad_indices("[812,13,7.0]", "blocks[0].indices[2]: not an integer");
  bad_indices("[\"7\",13,7]", "blocks[0].indices[0]: not an integer");
  bad_indices("[812,null,7]", "blocks[0].indices[1]: not an integer");
  bad_indices("[812,13]", "blocks[0].indices: 2 indices for [begin, end) = [32, 35)");
  bad_indices("[812,13,7,8]", "blocks[0].indices: more than 3 indices");
  bad_indices("[]", "blocks[0].indices: 0 indices");
  bad_indices("[812,13,,7]", "blocks[0].indices[2]: not valid JSON");
  bad_indices("[812 13 7]", "blocks[0].indices[1]: not valid JSON");
  bad_indices("[812,13,7", "blocks[0].indices[3]: not valid JSON");
  bad_indices("[812,013,7]", "blocks[0].indices[1]: not valid JSON");
  bad_indices("null", "blocks[0].indices: not an array");
  bad_indices("{}", "blocks[0].indices: not an array");
  bad_indices("\"812,13,7\"", "blocks[0].indices: not an array");
  /* Cut off inside the array (no closing brackets at all). */
  bad("{\"state\":\"blocks\",\"blocks\":[{\"block\":1,\"token\":2,\"begin\":0,\"end\":3,"
      "\"indices\":[1,2,3",
      true, "blocks[0].indices[3]: not valid JSON");
  /* Before "begin" and "end", checked as strictly. */
  bad("{\"state\":\"blocks\",\"blocks\":[{\"indices\":[1,-2],\"block\":1,\"token\":2,"
      "\"begin\":0,\"end\":2}]}",
      true, "blocks[0].indices[1]: a negative number");
  bad("{\"state\":\"blocks\",\"blocks\":[{\"indices\":[1],\"block\":1,\"token\":2,"
      "\"begin\":0,\"end\":2}]}",
      true, "blocks[0].indices: 1 indices");
  /* A [begin, end) larger than the text: refused before any allocation. */
  bad("{\"state\":\"blocks\",\"blocks\":[{\"block\":1,\"token\":2,\"begin\":0,"
      "\"end\":1152921504606846976,\"indices\":[1]}]}",
      true, "more than the reply holds");
}

static void test_bad_blocks_and_replies(void **state) {
  bad("{\"state\":\"blocks\",\"blocks\":[{\"block\":1,\"token\":2,\"begin\":0,\"end\":1}]}", true,
      "blocks[0]: no \"indices\", which were asked for");
  bad("{\"state\":\"blocks\",\"blocks\":[{\"block\":1,\"token\":2,\"begin\":0,\"end\":1,"
      "\"end\":1,\"indices\":[1]}]}",
      true, "blocks[0]: \"end\" twice");
  bad("{\"state\":\"blocks\",\"blocks\":[{\"block\":1,\"token\":2,\"begin\":0,\"end\":1,"
      "\"indices\":[1],\"indices\":[2]}]}",
      true, "blocks[0]: \"indices\" twice");
  bad("{\"state\":\"blocks\",\"blocks\":[{\"block\":1,\"token\":0,\"begin\":0,\"end\":1}]}", false,
      "blocks[0]: needs \"block\" >= 0 and \"token\" > 0");
  bad("{\"state\":\"blocks\",\"blocks\":[{\"token\":3,\"begin\":0,\"end\":1}]}", false,
      "blocks[0]: needs \"block\"");
  bad("{\"state\":\"blocks\",\"blocks\":[{\"block\":1,\"token\":2,\"begin\":5,\"end\":1,"
      "\"indices\":[]}]}",
      true, "blocks[0]: needs 0 <= \"begin\" <= \"end\"");
  bad("{\"state\":\"blocks\",\"blocks\":[{\"block\":1.5,\"token\":2,\"begin\":0,\"end\":0}]}",
      false, "blocks[0].block: not an integer");
  bad("{\"state\":\"blocks\",\"blocks\":[{\"block\":\"1\",\"token\":2,\"begin\":0,\"end\":0}]}",
      false, "blocks[0].block: not an integer");
  bad("{\"state\":\"blocks\",\"blocks\":[{\"block\":1,\"token\":99999999999999999999,"
      "\"begin\":0,\"end\":0}]}",
      false, "blocks[0].token: a number too large");
  bad("{\"state\":\"blocks\",\"blocks\":[5]}", false, "blocks[0]: expected an object");
  bad("{\"state\":\"blocks\",\"blocks\":{}}", false, "blocks: expected an array");
  bad("{\"state\":\"blocks\",\"blocks\":null}", false, "blocks: expected an array");
  bad("{\"state\":\"blocks\"}", false, "no \"blocks\"");
  bad("{\"blocks\":[]}", false, "no \"state\"");
  bad("{\"state\":\"running\",\"blocks\":[]}", false, "state: not one of");
  bad("{\"state\":7,\"blocks\":[]}", false, "state: expected a string");
  bad("{\"state\":\"wait\",\"epoch\":1.5,\"blocks\":[]}", false, "epoch: not an integer");
  bad("{\"state\":\"wait\",\"blocks\":[],\"blocks\":[]}", false, "\"blocks\" twice");
  bad("{\"state\":\"wait\",\"blocks\":[]}x", false, "text after the reply");
  bad("{\"state\":\"wait\",\"blocks\":[]}{}", false, "text after the reply");
  bad("{\"state\":\"wait\",\"blocks\":[],}", false, "reply: expected a string");
  bad("{\"state\":\"wait\" \"blocks\":[]}", false, "reply: expected ',' or '}'");
  bad("{\"state\" \"wait\"}", false, "reply: expected ':'");
  bad("{\"state\":\"wait\",\"note\":[1,],\"blocks\":[]}", false, "reply: not a JSON value");
  bad("[]", false, "reply: expected an object");
  bad("", false, "reply: expected an object");
  bad("{\"state\":\"wa\x01it\",\"blocks\":[]}", false, "state: a broken string");
}

/* A block of 100 000 indices (the head allows 2^20 in one reply) reads
 * whole. */
static void test_large_block(void **state) {
  size_t n = 100000;
  char *text = malloc(n * 16 + 256), *p = text;
  assert_non_null(text);
  p += sprintf(p,
               "{\"state\":\"blocks\",\"epoch\":0,\"blocks\":[{\"block\":0,\"token\":1,"
               "\"deadline_ms\":1,\"rank\":null,\"begin\":0,\"end\":%zu,\"takeover\":false,"
               "\"indices\":[",
               n);
  for (size_t i = 0; i < n; i++)
    p += sprintf(p, "%s%llu", i ? "," : "",
                 (unsigned long long)(i * 2654435761u % 281474976710655u));
  p += sprintf(p, "]}]}");
  muster_iter_next_t out;
  char why[256];
  assert_int_equal(read_n(text, (size_t)(p - text), true, &out, why, sizeof why), MUSTER_OK);
  assert_int_equal(out.count, 1);
  for (size_t i = 0; i < n; i++)
    assert_true(out.blocks[0].indices[i] == i * 2654435761u % 281474976710655u);
  muster_iter_next_free(&out);
  free(text);
}

/* ---- the held listing (iter_held_read) ---- */

/* What the head writes for GET /v1/iterations/{name}/held (iter_held.c). */
static const char held_reply[] =
    "{\"rank\":1,\"epoch\":3,\"finished\":false,\"total\":5,\"blocks\":[{\"block\":5,"
    "\"token\":1042,\"deadline_ms\":1763769630000,\"rank\":1,\"begin\":32,\"end\":35,"
    "\"takeover\":false,\"indices\":[812,13,7]},{\"block\":9,\"token\":1050,"
    "\"deadline_ms\":1763769630001,\"rank\":0,\"begin\":0,\"end\":2,\"takeover\":true,"
    "\"indices\":[4,1]}],\"next\":12}\n";

static muster_err_t held_n(const char *text, size_t len, bool want, muster_iter_held_t *out,
                           char *why, size_t why_size) {
  char *copy = malloc(len ? len : 1);
  assert_non_null(copy);
  memcpy(copy, text, len);
  muster_err_t err = iter_held_read(copy, len, want, out, why, why_size);
  free(copy);
  return err;
}

/* A bad held reply: MUSTER_PROTOCOL, a message holding `part`, nothing kept. */
static void held_bad(const char *text, bool want, const char *part) {
  muster_iter_held_t out;
  char why[256] = "";
  muster_err_t err = held_n(text, strlen(text), want, &out, why, sizeof why);
  if (err != MUSTER_PROTOCOL || strstr(why, part) == NULL)
    fail_msg("%s\n-> %s (%d), want '%s'", text, why, (int)err, part);
  assert_null(out.blocks);
  assert_int_equal(out.count, 0);
}

static void test_held_reply(void **state) {
  muster_iter_held_t out;
  char why[256] = "";
  assert_int_equal(held_n(held_reply, strlen(held_reply), true, &out, why, sizeof why), MUSTER_OK);
  assert_true(out.epoch == 3 && !out.finished && out.total == 5 && out.next == 12);
  assert_int_equal(out.count, 2);
  const muster_iter_block_t *b = &out.blocks[1];
  assert_true(b->epoch == 3 && b->block == 9 && b->token == 1050 && b->plan_rank == 0 &&
              b->begin == 0 && b->end == 2 && b->takeover);
  assert_true(b->indices[0] == 4 && b->indices[1] == 1);
  muster_iter_held_free(&out);
  /* The last page (next null), a finished iteration, spaces, unknown members. */
  static const char *const texts[] = {
      "{\"rank\":0,\"epoch\":0,\"finished\":false,\"total\":0,\"blocks\":[],\"next\":null}",
      "{\"epoch\":2,\"finished\":true,\"blocks\":[]}",
      " { \"blocks\" : [ ] ,\n \"epoch\" : 1 , \"later\": {\"x\": [1, 2.5]} } ",
  };
  for (size_t i = 0; i < 3; i++) {
    assert_int_equal(held_n(texts[i], strlen(texts[i]), true, &out, why, sizeof why), MUSTER_OK);
    assert_true(out.count == 0 && out.next == -1);
    assert_int_equal(out.finished, i == 1);
    muster_iter_held_free(&out);
  }
}

static void test_held_bad(void **state) {
  /* Every prefix of the head's text is refused. */
  size_t full = strrchr(held_reply, '}') - held_reply + 1;
  for (size_t len = 0; len < full; len++) {
    muster_iter_held_t out;
    char why[256];
    assert_int_equal(held_n(held_reply, len, false, &out, why, sizeof why), MUSTER_PROTOCOL);
    assert_null(out.blocks);
  }
  held_bad("{\"epoch\":0}", false, "no \"blocks\"");
  held_bad("{\"blocks\":[]}", false, "no \"epoch\"");
  held_bad("{\"epoch\":0,\"finished\":1,\"blocks\":[]}", false, "finished: expected true or false");
  held_bad("{\"epoch\":-1,\"blocks\":[]}", false, "epoch: expected an integer >= 0");
  held_bad("{\"epoch\":0,\"total\":null,\"blocks\":[]}", false, "total: expected an integer >= 0");
  held_bad("{\"epoch\":0,\"next\":-2,\"blocks\":[]}", false,
           "next: expected an integer >= 0 or null");
  held_bad("{\"epoch\":0,\"next\":\"3\",\"blocks\":[]}", false, "next: not an integer");
  held_bad("{\"epoch\":0,\"epoch\":0,\"blocks\":[]}", false, "\"epoch\" twice");
  held_bad("{\"epoch\":0,\"blocks\":[]}x", false, "text after the reply");
  /* Blocks are checked as a next reply's are. */
  held_bad("{\"epoch\":0,\"blocks\":[{\"block\":1,\"token\":2,\"begin\":0,\"end\":1}]}", true,
           "blocks[0]: no \"indices\", which were asked for");
  held_bad("{\"epoch\":0,\"blocks\":[{\"block\":1,\"token\":2,\"begin\":0,\"end\":2,"
           "\"indices\":[1,-2]}]}",
           true, "blocks[0].indices[1]: a negative number");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_head_reply),
      cmocka_unit_test(test_other_states),
      cmocka_unit_test(test_whitespace),
      cmocka_unit_test(test_order_names_and_unknown_members),
      cmocka_unit_test(test_every_prefix),
      cmocka_unit_test(test_bad_indices),
      cmocka_unit_test(test_bad_blocks_and_replies),
      cmocka_unit_test(test_large_block),
      cmocka_unit_test(test_held_reply),
      cmocka_unit_test(test_held_bad),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
