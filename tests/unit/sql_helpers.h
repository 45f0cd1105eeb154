/*
 * sql_helpers.h — raw SQL for unit tests that look at a database behind the
 * store's back (a migration, a crash copy): run statements, read one integer.
 * Included after cmocka.h and sqlite3.h.
 */
#ifndef MUSTER_TESTS_SQL_HELPERS_H
#define MUSTER_TESTS_SQL_HELPERS_H

#include <stdint.h>

/* Runs `sql` (one or more statements); fails the test on an error. */
static inline void exec_sql(sqlite3 *db, const char *sql) {
  char *err = NULL;
  if (sqlite3_exec(db, sql, NULL, NULL, &err) != SQLITE_OK)
    fail_msg("%s: %s", sql, err ? err : "?");
}

/* The first column of the first row of `sql`, which must return a row. */
static inline int64_t query_int(sqlite3 *db, const char *sql) {
  sqlite3_stmt *s = NULL;
  assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &s, NULL), SQLITE_OK);
  assert_int_equal(sqlite3_step(s), SQLITE_ROW);
  int64_t v = sqlite3_column_int64(s, 0);
  sqlite3_finalize(s);
  return v;
}

#endif
