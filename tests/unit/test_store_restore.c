/*
 * test_store_restore.c — unit tests of ids after a restore (store_restore.c):
 * a store file carrying the backup mark, opened, raises every id counter to
 * the clock's milliseconds times 1024 once and loses the mark; one without
 * the mark never jumps; a counter already above the floor is kept (ids never
 * go down); a restore that fails changes nothing, the mark included.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server/log.h"
#include "server/store.h"
#include "sql_helpers.h"

#define CLOCK_SCALE 1024 /* store.c's STORE_TOKEN_CLOCK_SCALE */

typedef struct {
  char dir[64];
  char path[96];
} tmp_store_t;

static int setup(void **state) {
  tmp_store_t *t = calloc(1, sizeof *t);
  if (t == NULL)
    return -1;
  snprintf(t->dir, sizeof t->dir, "/tmp/muster-test-restore.XXXXXX");
  if (mkdtemp(t->dir) == NULL) {
    free(t);
    return -1;
  }
  snprintf(t->path, sizeof t->path, "%s/muster.db", t->dir);
  *state = t;
  return 0;
}

static int teardown(void **state) {
  tmp_store_t *t = *state;
  char side[128];
  static const char *const suffixes[] = {"", "-wal", "-shm", "-journal"};
  for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
    snprintf(side, sizeof side, "%s%s", t->path, suffixes[i]);
    unlink(side);
  }
  rmdir(t->dir);
  free(t);
  return 0;
}

static store_t *open_store(const tmp_store_t *t, int schema_version) {
  fail_t f = {0};
  store_t *st = store_open(&(store_opts_t){.path = t->path, .schema_version = schema_version}, &f);
  if (st == NULL)
    fail_msg("store_open: %s", fail_message(&f));
  return st;
}

/* A store with tasks up to id 12, worker 3, update 5 of queue q, session
 * s-1's result 7 and job 9 of pipeline p, marked as a backup (as backup.c
 * marks its copy) when `mark`. */
static void make_store(const tmp_store_t *t, bool mark) {
  store_t *st = open_store(t, 0);
  exec_sql(store_db(st),
           "INSERT INTO tasks(id, queue, state, priority, run_at_ms, payload, created_ms,"
           " updated_ms) VALUES(12, 'q', 0, 0, 0, '1', 0, 0);"
           "INSERT INTO workers(id, name, nickname, state, last_seen_ms, created_ms, timeout_ms)"
           " VALUES(3, 'w', 'w', 0, 0, 0, 1000);"
           "INSERT INTO update_seqs(queue, last) VALUES('q', 5);"
           "INSERT INTO sessions(id, queue, state, cleanup_on_exit, timeout_ms, created_ms,"
           " last_seen_ms, last_seq) VALUES('s-1', 'q', 0, 0, 1000, 0, 0, 7);"
           "INSERT INTO compat_counters(pipeline, last) VALUES('p', 9);");
  if (mark)
    exec_sql(store_db(st), "INSERT INTO meta(k, v) VALUES('" STORE_BACKUP_MARK "', 1000)");
  store_close(st);
}

static int64_t meta(store_t *st, const char *key) {
  char sql[128];
  snprintf(sql, sizeof sql, "SELECT coalesce((SELECT v FROM meta WHERE k = '%s'), -1)", key);
  return query_int(store_db(st), sql);
}

/* Every counter of `st` is at `floor` (the other values as make_store left
 * them when floor is 0), and the mark is gone. */
static void check_counters(store_t *st, int64_t floor) {
  assert_int_equal(store_last_task(st), floor ? floor : 12);
  assert_int_equal(query_int(store_db(st), "SELECT last FROM update_seqs WHERE queue = 'q'"),
                   floor ? floor : 5);
  assert_int_equal(query_int(store_db(st), "SELECT last_seq FROM sessions WHERE id = 's-1'"),
                   floor ? floor : 7);
  assert_int_equal(query_int(store_db(st), "SELECT last FROM compat_counters WHERE pipeline = 'p'"),
                   floor ? floor : 9);
  assert_int_equal(meta(st, STORE_ID_FLOOR_KEY), floor ? floor : -1);
  assert_int_equal(meta(st, STORE_BACKUP_MARK), -1);
}

static void test_a_marked_store_jumps_once(void **state) {
  tmp_store_t *t = *state;
  make_store(t, true);
  int64_t before = now_ms() * CLOCK_SCALE;
  store_t *st = open_store(t, 0);
  int64_t after = now_ms() * CLOCK_SCALE, floor = store_last_task(st);
  assert_true(floor >= before && floor <= after);
  assert_true(floor < (1LL << 53));
  check_counters(st, floor);
  assert_int_equal(store_task_ids(st, 2), floor + 1);
  store_close(st);
  /* Opened again: the mark is gone, nothing jumps (the ids just taken were
   * never inserted: the next start takes them again, as after any restart). */
  st = open_store(t, 0);
  check_counters(st, floor);
  store_close(st);
}

static void test_an_unmarked_store_never_jumps(void **state) {
  tmp_store_t *t = *state;
  make_store(t, false);
  store_t *st = open_store(t, 0);
  check_counters(st, 0);
  store_close(st);
}

/* A counter above the floor (a clock set back since, or a head that handed
 * out more than CLOCK_SCALE ids a millisecond) is kept: ids never go down. */
static void test_counters_above_the_floor_are_kept(void **state) {
  tmp_store_t *t = *state;
  make_store(t, true);
  store_t *st = open_store(t, 0);
  int64_t high = 1LL << 52;
  store_close(st);
  sqlite3 *db = NULL;
  assert_int_equal(sqlite3_open(t->path, &db), SQLITE_OK);
  char sql[256];
  snprintf(sql, sizeof sql,
           "INSERT INTO meta(k, v) VALUES('" STORE_BACKUP_MARK "', 1000);"
           "UPDATE meta SET v = %lld WHERE k = 'last_task';"
           "UPDATE update_seqs SET last = %lld;",
           (long long)high, (long long)high + 5);
  exec_sql(db, sql);
  sqlite3_close(db);
  st = open_store(t, 0);
  assert_int_equal(store_last_task(st), high);
  assert_int_equal(query_int(store_db(st), "SELECT last FROM update_seqs"), high + 5);
  assert_true(query_int(store_db(st), "SELECT last_seq FROM sessions") < high);
  store_close(st);
}

/* A marked store whose restore cannot run (a store migrated only as far as
 * the first schema version, which has no update_seqs) is refused, saying
 * why, and keeps its mark and its counters: the next start tries again. */
static void test_a_failed_restore_changes_nothing(void **state) {
  tmp_store_t *t = *state;
  store_t *st = open_store(t, 1);
  exec_sql(store_db(st), "INSERT INTO tasks(id, queue, state, priority, run_at_ms, payload,"
                         " created_ms, updated_ms) VALUES(4, 'q', 0, 0, 0, '1', 0, 0);"
                         "INSERT INTO meta(k, v) VALUES('" STORE_BACKUP_MARK "', 1000)");
  store_close(st);
  fail_t f = {0};
  st = store_open(&(store_opts_t){.path = t->path, .schema_version = 1}, &f);
  assert_null(st);
  assert_int_equal(f.code, MUSTER_STORE);
  assert_non_null(strstr(f.message, "raising the ids of a store started on a backup"));
  assert_non_null(strstr(f.message, "update_seqs"));
  sqlite3 *db = NULL;
  assert_int_equal(sqlite3_open(t->path, &db), SQLITE_OK);
  assert_int_equal(query_int(db, "SELECT count(*) FROM meta WHERE k = 'last_task'"), 0);
  assert_int_equal(query_int(db, "SELECT v FROM meta WHERE k = '" STORE_BACKUP_MARK "'"), 1000);
  sqlite3_close(db);
}

int main(void) {
  log_set_level(LOG_WARN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_a_marked_store_jumps_once, setup, teardown),
      cmocka_unit_test_setup_teardown(test_an_unmarked_store_never_jumps, setup, teardown),
      cmocka_unit_test_setup_teardown(test_counters_above_the_floor_are_kept, setup, teardown),
      cmocka_unit_test_setup_teardown(test_a_failed_restore_changes_nothing, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
