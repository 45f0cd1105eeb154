/*
 * test_store_newer.c — a store file that a newer muster migrated (its
 * schema version above this muster's), opened by this one: the case of a
 * rollback to the previous binary.  It is refused with a message that names
 * both versions and both ways out (run the newer muster, or restore the
 * backup taken before the upgrade), and the file is left as it was.
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

static char dir[64], path[96];

/* A store of this muster with task 7, then raised `ahead` schema versions
 * behind the store's back, as a newer muster's migrations would; returns
 * this muster's own version. */
static int make_newer_store(int ahead) {
  snprintf(dir, sizeof dir, "/tmp/muster-test-newer.XXXXXX");
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/muster.db", dir);
  fail_t f = {0};
  store_t *st = store_open(&(store_opts_t){.path = path}, &f);
  assert_non_null(st);
  int own = (int)query_int(store_db(st), "PRAGMA user_version");
  exec_sql(store_db(st), "INSERT INTO tasks(id, queue, state, priority, run_at_ms, payload,"
                         " created_ms, updated_ms) VALUES(7, 'q', 0, 0, 0, '1', 0, 0);");
  store_close(st);
  sqlite3 *db = NULL;
  assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
  char sql[64];
  snprintf(sql, sizeof sql, "PRAGMA user_version = %d", own + ahead);
  exec_sql(db, sql);
  sqlite3_close(db);
  return own;
}

static void remove_store(void) {
  char side[128];
  static const char *const suffixes[] = {"", "-wal", "-shm", "-journal"};
  for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
    snprintf(side, sizeof side, "%s%s", path, suffixes[i]);
    unlink(side);
  }
  rmdir(dir);
}

static void test_a_newer_store_is_refused_untouched(void **unused) {
  (void)unused;
  int own = make_newer_store(3), newer = own + 3;
  fail_t f = {0};
  store_t *st = store_open(&(store_opts_t){.path = path}, &f);
  assert_null(st);
  assert_int_equal(f.code, MUSTER_STORE);
  char versions[96];
  snprintf(versions, sizeof versions, "schema version %d, newer than this muster's (%d)", newer,
           own);
  assert_non_null(strstr(f.message, versions));
  assert_non_null(strstr(f.message, "Run the newer muster on it"));
  assert_non_null(strstr(f.message, "restore the backup taken before the upgrade"));
  assert_non_null(strstr(f.message, "docs/operations.md"));
  sqlite3 *db = NULL;
  assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
  assert_int_equal(query_int(db, "PRAGMA user_version"), newer);
  assert_int_equal(query_int(db, "SELECT count(*) FROM tasks WHERE id = 7"), 1);
  sqlite3_close(db);
  remove_store();
}

int main(void) {
  log_set_level(LOG_ERROR);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_a_newer_store_is_refused_untouched),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
