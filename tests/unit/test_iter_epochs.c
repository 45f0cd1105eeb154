/*
 * test_iter_epochs.c — what the head keeps of an iteration's completed
 * epoch (src/server/iter.c, iter_lease.c), read in the store behind its back:
 * the block rows of the last completed epoch stay, each with the token that
 * acknowledged it (the final acknowledgement's marked), and go when the next
 * epoch completes or the iteration is deleted; and a data file of schema
 * version 14, whose iter_final_acks kept only the final acknowledgement,
 * upgrades with that acknowledgement and the current epoch's leases intact.
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
#include <unistd.h>

#include "server/iter.h"
#include "server/log.h"
#include "store_fixture.h"
#include "sql_helpers.h"

/* The schema version before iter_blocks had an epoch (store_schema.c). */
#define VERSION_BEFORE_EPOCH_ROWS 14

/* 4 blocks of 5 samples, one rank, epochs without end. */
#define CONFIG                                                                                     \
  "{\"name\": \"%s\", \"dataset\": {\"num_samples\": 20}, \"block_size\": 5,"                      \
  " \"strategy\": \"dynamic\", \"world_size\": 1, \"epochs\": 0}"

static void create(const char *name) {
  char text[256];
  snprintf(text, sizeof text, CONFIG, name);
  json_t *body = parse(text), *out;
  bool created = false;
  fail_t f = {0};
  if ((out = iter_create(st, body, &created, &f)) == NULL)
    fail_msg("create: %s", fail_message(&f));
  json_decref(out);
  json_decref(body);
}

/* Rank 0 leases `max` blocks; their "block" and "token" go to blocks[] and tokens[]. */
static size_t lease(const char *name, int max, int64_t *blocks, int64_t *tokens) {
  char text[64];
  snprintf(text, sizeof text, "{\"rank\": 0, \"max\": %d}", max);
  json_t *body = parse(text);
  fail_t f = {0};
  json_t *reply = iter_next(st, name, body, &f);
  if (reply == NULL)
    fail_msg("next: %s", fail_message(&f));
  json_t *tree = reply_tree(reply), *list = json_object_get(tree, "blocks");
  size_t n = json_array_size(list);
  for (size_t i = 0; i < n; i++) {
    blocks[i] = jint(json_array_get(list, i), "block");
    tokens[i] = jint(json_array_get(list, i), "token");
  }
  json_decref(tree);
  json_decref(reply);
  json_decref(body);
  return n;
}

/* Rank 0 acknowledges blocks[0, n) in `epoch`; returns the reply (caller
 * frees), or NULL with the error's code in *code. */
static json_t *ack(const char *name, int64_t epoch, const int64_t *blocks, const int64_t *tokens,
                   size_t n, muster_err_t *code) {
  json_t *list = json_array();
  for (size_t i = 0; i < n; i++)
    json_array_append_new(list, json_pack("{s:I, s:I}", "block", (json_int_t)blocks[i], "token",
                                          (json_int_t)tokens[i]));
  json_t *body =
      json_pack("{s:i, s:I, s:o}", "rank", 0, "epoch", (json_int_t)epoch, "blocks", list);
  fail_t f = {0};
  json_t *reply = iter_ack(st, name, body, &f);
  *code = f.code;
  json_decref(body);
  return reply;
}

/* Acknowledges, and checks that the reply says `want` ({"acked", "epoch",
 * ...} as text). */
static void ack_is(const char *name, int64_t epoch, const int64_t *blocks, const int64_t *tokens,
                   size_t n, const char *want) {
  muster_err_t code;
  json_t *reply = ack(name, epoch, blocks, tokens, n, &code), *expected = parse(want);
  if (reply == NULL)
    fail_msg("ack: error %d, expected %s", (int)code, want);
  if (!json_equal(reply, expected)) {
    char *got = json_dumps(reply, JSON_COMPACT | JSON_SORT_KEYS);
    fail_msg("ack: %s, expected %s", got, want);
  }
  json_decref(expected);
  json_decref(reply);
}

/* Rows of iteration `name` in epoch `epoch` (-1: all) with state `state`
 * (-1: any). */
static int64_t rows(const char *name, int64_t epoch, int state) {
  char sql[256];
  snprintf(sql, sizeof sql,
           "SELECT count(*) FROM iter_blocks b JOIN iterations i ON i.id = b.iter"
           " WHERE i.name = '%s' AND (%lld < 0 OR b.epoch = %lld) AND (%d < 0 OR b.state = %d)",
           name, (long long)epoch, (long long)epoch, state, state);
  return query_int(store_db(st), sql);
}

/* An epoch completes (two acks of two blocks each): its rows stay, the
 * second ack's marked final; the epoch before it goes. */
static void test_one_completed_epoch_kept(void **unused) {
  create("e");
  int64_t blocks[4], tokens[4];
  char want[128];
  for (int64_t epoch = 0; epoch < 3; epoch++) {
    assert_int_equal(lease("e", 4, blocks, tokens), 4);
    snprintf(want, sizeof want,
             "{\"acked\": 2, \"epoch\": %lld, \"epoch_complete\": false,"
             " \"finished\": false}",
             (long long)epoch);
    ack_is("e", epoch, blocks, tokens, 2, want);
    snprintf(want, sizeof want,
             "{\"acked\": 2, \"epoch\": %lld, \"epoch_complete\": true,"
             " \"finished\": false}",
             (long long)epoch + 1);
    ack_is("e", epoch, blocks + 2, tokens + 2, 2, want);
    assert_int_equal(rows("e", -1, -1), 4);
    assert_int_equal(rows("e", epoch, 2), 2);
    assert_int_equal(rows("e", epoch, 3), 2);
  }
  fail_t f = {0};
  json_t *reply = iter_delete(st, "e", &f);
  assert_non_null(reply);
  json_decref(reply);
  assert_int_equal(query_int(store_db(st), "SELECT count(*) FROM iter_blocks"), 0);
  assert_int_equal(query_int(store_db(st), "SELECT count(*) FROM iter_lanes"), 0);
}

/* The canonical configuration text of CONFIG, from a store of the newest
 * schema (caller frees). */
static char *config_text(void) {
  assert_int_equal(fixture_open(), 0);
  create("c");
  sqlite3_stmt *s = NULL;
  assert_int_equal(sqlite3_prepare_v2(store_db(st), "SELECT config FROM iterations", -1, &s, NULL),
                   SQLITE_OK);
  assert_int_equal(sqlite3_step(s), SQLITE_ROW);
  char *text = strdup((const char *)sqlite3_column_text(s, 0));
  sqlite3_finalize(s);
  fixture_close();
  return text;
}

/* What a head of schema version 14 left: iteration "u" (id 5) in epoch 1
 * after the ack of blocks 2 and 3 (tokens 7, 8) completed epoch 0, kept in
 * iter_final_acks, with a row of an iteration that is gone (id 6); in epoch
 * 1 block 0 leased under token 9, block 1 done under token 10. */
static void write_version_14(sqlite3 *db, const char *config) {
  sqlite3_stmt *s = NULL;
  assert_int_equal(
      sqlite3_prepare_v2(db,
                         "INSERT INTO iterations(id, name, config, fingerprint, lease_ms,"
                         " rank_timeout_ms, replication, slow_ratio, cluster_sync, epoch,"
                         " done_blocks, finished, created_ms, updated_ms) VALUES(5, 'u', ?1, '',"
                         " 600000, 600000, 1, 0.5, 1, 1, 1, 0, 0, 0)",
                         -1, &s, NULL),
      SQLITE_OK);
  sqlite3_bind_text(s, 1, config, -1, SQLITE_STATIC);
  assert_int_equal(sqlite3_step(s), SQLITE_DONE);
  sqlite3_finalize(s);
  char sql[1024];
  snprintf(sql, sizeof sql,
           "INSERT INTO iter_ranks(iter, rank, state, last_seen_ms, deadline_ms)"
           "  VALUES(5, 0, 1, 0, %lld);"
           "INSERT INTO iter_final_acks(iter, block, token, epoch)"
           "  VALUES(5, 2, 7, 0), (5, 3, 8, 0), (6, 0, 3, 0);"
           "INSERT INTO iter_blocks(iter, block, lane, state, rank, token, deadline_ms)"
           "  VALUES(5, 0, 0, 1, 0, 9, %lld), (5, 1, 0, 2, 0, 10, NULL);"
           "INSERT INTO iter_lanes(iter, lane, next) VALUES(5, 0, 2);"
           "INSERT INTO meta(k, v) VALUES('last_token', 100)"
           "  ON CONFLICT(k) DO UPDATE SET v = excluded.v;",
           (long long)now_ms() + 600000, (long long)now_ms() + 600000);
  exec_sql(db, sql);
}

/* Version 14 upgrades: the final ack of epoch 0 still repeats, the lease and
 * the done block of epoch 1 are still what they were, and iter_final_acks is
 * gone; when epoch 1 completes, epoch 0's rows go. */
static void test_upgrade_from_final_acks(void **unused) {
  char dir[] = "/tmp/muster-test-iter.XXXXXX", path[64];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/muster.db", dir);
  char *config = config_text();
  fail_t f = {0};
  st = store_open(&(store_opts_t){.path = path, .schema_version = VERSION_BEFORE_EPOCH_ROWS}, &f);
  assert_non_null(st);
  assert_int_equal(store_request_begin(st, &f), MUSTER_OK);
  write_version_14(store_db(st), config);
  free(config);
  fixture_close();

  st = store_open(&(store_opts_t){.path = path}, &f);
  assert_non_null(st);
  assert_int_equal(store_request_begin(st, &f), MUSTER_OK);
  sqlite3 *db = store_db(st);
  /* Migrated through the epoch rows (and any migration after them). */
  assert_true(query_int(db, "PRAGMA user_version") >= VERSION_BEFORE_EPOCH_ROWS + 1);
  assert_int_equal(query_int(db, "SELECT count(*) FROM sqlite_master WHERE"
                                 " name = 'iter_final_acks'"),
                   0);
  assert_int_equal(query_int(db, "SELECT count(*) FROM iter_blocks WHERE iter = 6"), 0);
  int64_t blocks[4] = {2, 3, 1, 0}, tokens[4] = {7, 8, 10, 9};
  const char *final = "{\"acked\": 2, \"epoch\": 1, \"epoch_complete\": true,"
                      " \"finished\": false, \"repeated\": 2}";
  ack_is("u", 0, blocks, tokens, 2, final);
  ack_is("u", 1, blocks, tokens, 2, final); /* the current epoch, as when left to default */
  ack_is("u", 1, blocks + 2, tokens + 2, 1,
         "{\"acked\": 1, \"epoch\": 1, \"epoch_complete\": false, \"finished\": false,"
         " \"repeated\": 1}");
  ack_is("u", 1, blocks + 3, tokens + 3, 1,
         "{\"acked\": 1, \"epoch\": 1, \"epoch_complete\": false, \"finished\": false}");
  /* The lane goes on at block 2. */
  assert_int_equal(lease("u", 4, blocks, tokens), 2);
  assert_true(blocks[0] == 2 && blocks[1] == 3 && tokens[0] > 100);
  ack_is("u", 1, blocks, tokens, 2,
         "{\"acked\": 2, \"epoch\": 2, \"epoch_complete\": true, \"finished\": false}");
  assert_int_equal(rows("u", 0, -1), 0);
  assert_int_equal(rows("u", 1, -1), 4);
  fixture_close();
  fixture_remove_store_files(dir, path);
}

int main(void) {
  log_set_level(LOG_WARN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_one_completed_epoch_kept, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test(test_upgrade_from_final_acks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
