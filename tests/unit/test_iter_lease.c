/*
 * test_iter_lease.c — the head's `next` reply (src/server/iter_lease.c),
 * written as text, against an in-memory store: no HTTP, no processes.
 *
 * The reply's blocks and their indices are text (a raw node, jw.h), not a
 * tree of one json_t per index; the wire must not change.  So the text
 * jw_dump writes must be, byte for byte, what jansson writes for the value
 * it reads from it (compact, the same number forms), with the members of
 * each block in the order the tree had; a block's indices must number
 * end - begin, and the indices of an epoch must cover every sample exactly
 * once.  The same text then goes through libmuster's reader
 * (src/client/iter_reply.c), which must find what jansson finds: the two
 * ends of the wire tested on one text.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/iter_internal.h"
#include "server/iter.h"
#include "server/jw.h"
#include "server/log.h"
#include "store_fixture.h"

#define N_SAMPLES 1000

/* The members of a leased block, in the order the tree had them. */
static const char *const tree_order[] = {"block", "token", "deadline_ms", "rank",
                                         "begin", "end",   "takeover",    "indices"};

static void create(const char *name, const char *strategy, int world) {
  char text[512];
  snprintf(text, sizeof text,
           "{\"name\": \"%s\", \"dataset\": {\"num_samples\": %d}, \"shuffle\": \"global\","
           " \"seed\": 7, \"strategy\": \"%s\", \"world_size\": %d, \"block_size\": 7}",
           name, N_SAMPLES, strategy, world);
  json_t *body = parse(text);
  bool created = false;
  fail_t f = {0};
  json_t *out = iter_create(st, body, &created, &f);
  if (out == NULL)
    fail_msg("create: %s", fail_message(&f));
  assert_true(created);
  json_decref(out);
  json_decref(body);
}

/* The text of iter_next's reply for `rank` (caller frees). */
static char *next_text(const char *name, int rank, int max, bool indices, size_t *len) {
  char text[128];
  snprintf(text, sizeof text, "{\"rank\": %d, \"max\": %d, \"indices\": %s}", rank, max,
           indices ? "true" : "false");
  json_t *body = parse(text);
  fail_t f = {0};
  json_t *reply = iter_next(st, name, body, &f);
  if (reply == NULL)
    fail_msg("next: %s", fail_message(&f));
  char *out = jw_dump(reply, len);
  assert_non_null(out);
  json_decref(reply);
  json_decref(body);
  return out;
}

/* Checks one reply text: canonical, the tree's member order, the counts;
 * marks its indices in seen[] (each at most once).  Returns its blocks. */
static size_t check_reply(const char *text, size_t len, bool indices, unsigned char *seen) {
  json_t *tree = json_loadb(text, len, 0, NULL);
  assert_non_null(tree);
  char *again = json_dumps(tree, JSON_COMPACT);
  assert_string_equal(text, again); /* byte for byte what jansson writes */
  free(again);
  json_t *blocks = json_object_get(tree, "blocks");
  size_t n = json_array_size(blocks);
  for (size_t i = 0; i < n; i++) {
    json_t *b = json_array_get(blocks, i);
    assert_int_equal(json_object_size(b), indices ? 8 : 7);
    size_t k = 0;
    for (void *it = json_object_iter(b); it; it = json_object_iter_next(b, it), k++)
      assert_string_equal(json_object_iter_key(it), tree_order[k]);
    if (!indices)
      continue;
    json_t *list = json_object_get(b, "indices");
    json_int_t begin = json_integer_value(json_object_get(b, "begin"));
    json_int_t end = json_integer_value(json_object_get(b, "end"));
    assert_int_equal(json_array_size(list), end - begin);
    for (size_t k2 = 0; k2 < json_array_size(list); k2++) {
      json_int_t index = json_integer_value(json_array_get(list, k2));
      assert_true(index >= 0 && index < N_SAMPLES);
      assert_int_equal(seen[index], 0);
      seen[index] = 1;
    }
  }
  json_decref(tree);
  return n;
}

/* libmuster's reader on the head's text: what jansson reads from it. */
static void client_reads(const char *text, size_t len, bool indices) {
  muster_iter_next_t out;
  char why[256];
  if (iter_next_read(text, len, indices, &out, why, sizeof why) != MUSTER_OK)
    fail_msg("iter_next_read: %s\n%s", why, text);
  json_t *tree = json_loadb(text, len, 0, NULL);
  json_t *blocks = json_object_get(tree, "blocks");
  assert_int_equal(out.count, json_array_size(blocks));
  assert_true(out.epoch == (uint64_t)jint(tree, "epoch"));
  for (size_t i = 0; i < out.count; i++) {
    json_t *b = json_array_get(blocks, i);
    const muster_iter_block_t *got = &out.blocks[i];
    assert_true(got->block == (uint64_t)jint(b, "block") && got->token == jint(b, "token") &&
                got->begin == (uint64_t)jint(b, "begin") && got->end == (uint64_t)jint(b, "end"));
    assert_true(got->plan_rank ==
                (json_is_null(json_object_get(b, "rank")) ? -1 : jint(b, "rank")));
    assert_int_equal(got->takeover, json_is_true(json_object_get(b, "takeover")));
    json_t *list = json_object_get(b, "indices");
    assert_true((list != NULL) == (got->indices != NULL));
    for (size_t k = 0; list && k < json_array_size(list); k++)
      assert_true(got->indices[k] == (uint64_t)json_integer_value(json_array_get(list, k)));
  }
  muster_iter_next_free(&out);
  json_decref(tree);
}

/* Leases a whole epoch with indices, `world` ranks taking turns. */
static void lease_epoch(const char *name, int world) {
  unsigned char *seen = calloc(N_SAMPLES, 1);
  assert_non_null(seen);
  size_t replies = 0, empty = 0;
  while (empty < (size_t)world && replies < 10000) {
    for (int rank = 0; rank < world; rank++, replies++) {
      size_t len;
      char *text = next_text(name, rank, 5, true, &len);
      size_t n = check_reply(text, len, true, seen);
      client_reads(text, len, true);
      empty = n == 0 ? empty + 1 : 0;
      free(text);
    }
  }
  for (int i = 0; i < N_SAMPLES; i++)
    assert_int_equal(seen[i], 1); /* every sample, once */
  free(seen);
}

static void test_dynamic_epoch(void **state) {
  create("dyn", "dynamic", 3);
  lease_epoch("dyn", 3);
}

static void test_static_epoch(void **state) {
  create("rr", "round_robin", 2);
  lease_epoch("rr", 2);
}

static void test_without_indices(void **state) {
  create("plain", "dynamic", 1);
  size_t len;
  char *text = next_text("plain", 0, 3, false, &len);
  assert_int_equal(check_reply(text, len, false, NULL), 3);
  assert_null(strstr(text, "indices"));
  assert_non_null(strstr(text, "\"rank\":null")); /* dynamic: no plan rank */
  client_reads(text, len, false);
  free(text);
}

/* Expired leases come back as takeovers ("takeover":true). */
static void test_takeover(void **state) {
  create("take", "dynamic", 2);
  size_t len;
  char *text = next_text("take", 0, 2, true, &len);
  free(text);
  assert_true(iter_expire_due(st, now_ms() + 24 * 3600 * 1000) >= 2);
  text = next_text("take", 1, 2, true, &len);
  unsigned char *seen = calloc(N_SAMPLES, 1);
  assert_int_equal(check_reply(text, len, true, seen), 2);
  assert_non_null(strstr(text, "\"takeover\":true"));
  client_reads(text, len, true);
  free(seen);
  free(text);
}

int main(void) {
  log_set_level(LOG_ERROR);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_dynamic_epoch, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_static_epoch, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_without_indices, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_takeover, fixture_setup, fixture_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
