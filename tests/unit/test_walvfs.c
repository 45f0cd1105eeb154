/*
 * test_walvfs.c — unit tests of the VFS that writes a commit's WAL frames
 * with one call (walvfs.c), through the store as the head opens it: a commit
 * costs one write however many pages it changed; every commit is in the file
 * when it returns (a copy of the files taken then, as a crash would leave
 * them, recovers it), also across a restart of the log; a transaction big
 * enough to spill pages to the WAL, rewrite them and read them back reads
 * what it wrote and commits whole; a write that fails makes the commit fail,
 * and the store goes on; data survives a close and reopen.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "server/store.h"
#include "server/walvfs.h"
#include "sql_helpers.h"

/* The test's data dir, its database and what a crash copy is put in. */
typedef struct {
  char dir[64];
  char db[96];
  char wal[96];
  char copy_dir[96];
  store_t *st;
} env_t;

/* ---- helpers ---- */

static walvfs_stats_t stats_since(const walvfs_stats_t *before) {
  walvfs_stats_t now;
  walvfs_stats(&now);
  return (walvfs_stats_t){now.sqlite_writes - before->sqlite_writes,
                          now.file_writes - before->file_writes, now.passed - before->passed,
                          now.failed - before->failed, now.full - before->full};
}

static void open_store(env_t *e) {
  fail_t f = {0};
  e->st = store_open(&(store_opts_t){.path = e->db}, &f);
  if (e->st == NULL)
    fail_msg("store_open: %s", f.message);
}

/* A table whose every insert changes two pages (the row and its index). */
static int setup(void **state) {
  env_t *e = calloc(1, sizeof *e);
  snprintf(e->dir, sizeof e->dir, "/tmp/muster-test-walvfs.XXXXXX");
  if (mkdtemp(e->dir) == NULL)
    return -1;
  snprintf(e->db, sizeof e->db, "%s/muster.db", e->dir);
  snprintf(e->wal, sizeof e->wal, "%s/muster.db-wal", e->dir);
  snprintf(e->copy_dir, sizeof e->copy_dir, "%s/copy", e->dir);
  open_store(e);
  exec_sql(store_db(e->st), "CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL);"
                            "CREATE INDEX t_v ON t(v);");
  *state = e;
  return 0;
}

static int teardown(void **state) {
  env_t *e = *state;
  store_close(e->st);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", e->dir);
  int rc = system(cmd);
  free(e);
  return rc == 0 ? 0 : -1;
}

/* Inserts row k in one store transaction, as a request of the head does. */
static muster_err_t commit_row(env_t *e, int k) {
  fail_t f = {0};
  assert_int_equal(store_request_begin(e->st, &f), MUSTER_OK);
  sqlite3_stmt *s = store_stmt(e->st, "INSERT INTO t(k, v) VALUES(?1, printf('value %d', ?1))");
  assert_non_null(s);
  sqlite3_bind_int(s, 1, k);
  muster_err_t rc = store_step_done(e->st, s, &f);
  store_request_end(e->st, rc == MUSTER_OK);
  return rc != MUSTER_OK ? rc : store_commit(e->st, &f);
}

static void copy_file(const char *from, const char *to) {
  int in = open(from, O_RDONLY);
  if (in < 0)
    return; /* no WAL right now: nothing to copy */
  int out = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  assert_true(out >= 0);
  char buf[65536];
  ssize_t n;
  while ((n = read(in, buf, sizeof buf)) > 0)
    assert_int_equal(write(out, buf, (size_t)n), n);
  assert_int_equal(n, 0);
  close(in);
  close(out);
}

/* Copies the database and its WAL as they are in the page cache now (what
 * the head's process dying here would leave), opens the copy with SQLite's
 * own VFS, which recovers it from the WAL, checks it and returns `sql`'s
 * value in it. */
static int64_t crash_copy_query(env_t *e, const char *sql) {
  char db[128], wal[128];
  mkdir(e->copy_dir, 0700);
  snprintf(db, sizeof db, "%s/muster.db", e->copy_dir);
  snprintf(wal, sizeof wal, "%s/muster.db-wal", e->copy_dir);
  unlink(wal);
  copy_file(e->db, db);
  copy_file(e->wal, wal);
  sqlite3 *copy = NULL;
  assert_int_equal(sqlite3_open_v2(db, &copy, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
  sqlite3_stmt *s = NULL;
  assert_int_equal(sqlite3_prepare_v2(copy, "PRAGMA integrity_check", -1, &s, NULL), SQLITE_OK);
  assert_int_equal(sqlite3_step(s), SQLITE_ROW);
  assert_string_equal((const char *)sqlite3_column_text(s, 0), "ok");
  sqlite3_finalize(s);
  int64_t v = query_int(copy, sql);
  sqlite3_close(copy);
  char cmd[160];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", e->copy_dir);
  assert_int_equal(system(cmd), 0);
  return v;
}

/* ---- tests ---- */

/* SQLite writes 2 × 2 frame pieces per commit here; the file sees one. */
static void test_one_write_per_commit(void **state) {
  env_t *e = *state;
  enum { COMMITS = 100 };
  walvfs_stats_t before;
  walvfs_stats(&before);
  for (int k = 1; k <= COMMITS; k++)
    assert_int_equal(commit_row(e, k), MUSTER_OK);
  walvfs_stats_t d = stats_since(&before);
  assert_true(d.sqlite_writes >= 4 * COMMITS);
  assert_int_equal(d.file_writes, COMMITS);
  assert_int_equal(d.passed, 0);
  assert_int_equal(d.failed, 0);
}

/* A commit bigger than one write can hold (the unix VFS writes at most
 * 128 KiB at once) is written in a few pieces, and whole. */
static void test_big_commit(void **state) {
  env_t *e = *state;
  sqlite3 *db = store_db(e->st);
  walvfs_stats_t before;
  walvfs_stats(&before);
  fail_t f = {0};
  assert_int_equal(store_request_begin(e->st, &f), MUSTER_OK);
  exec_sql(db, "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 4000)"
               " INSERT INTO t(k, v) SELECT i, printf('%d:%.200c', i, 'a') FROM n");
  store_request_end(e->st, true);
  assert_int_equal(store_commit(e->st, &f), MUSTER_OK);
  assert_int_equal(crash_copy_query(e, "SELECT sum(k) FROM t"), 4000 * 4001 / 2);
  walvfs_stats_t d = stats_since(&before);
  assert_int_equal(d.failed, 0);
  assert_true(d.sqlite_writes > 500);                /* some 1 MiB of frames, */
  assert_true(d.file_writes > 1);                    /* more than one write can take, */
  assert_true(d.file_writes * 40 < d.sqlite_writes); /* in pieces of some 30 frames */
}

/* Each commit is in the file when it returns, as it was before the VFS. */
static void test_commit_in_file_when_it_returns(void **state) {
  env_t *e = *state;
  for (int k = 1; k <= 20; k++) {
    assert_int_equal(commit_row(e, k), MUSTER_OK);
    assert_int_equal(crash_copy_query(e, "SELECT count(*) FROM t"), k);
  }
  /* A checkpoint lets the next commit restart the log at offset 0 (the
   * 32-byte file header), over the frames already there. */
  assert_int_equal(
      sqlite3_wal_checkpoint_v2(store_db(e->st), NULL, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL),
      SQLITE_OK);
  for (int k = 21; k <= 30; k++) {
    assert_int_equal(commit_row(e, k), MUSTER_OK);
    assert_int_equal(crash_copy_query(e, "SELECT count(*) FROM t"), k);
  }
  assert_int_equal(crash_copy_query(e, "SELECT sum(k) FROM t"), 30 * 31 / 2);
}

/* A transaction bigger than the page cache spills pages to the WAL, rewrites
 * some of them in place and reads them back before it commits (the VFS must
 * write what it holds before each read); at the commit SQLite rewrites the
 * frame checksums, the commit frame's last (written at once, not held). */
static void test_spilled_transaction(void **state) {
  env_t *e = *state;
  sqlite3 *db = store_db(e->st);
  exec_sql(db, "PRAGMA cache_size = 8");
  walvfs_stats_t before;
  walvfs_stats(&before);
  fail_t f = {0};
  assert_int_equal(store_request_begin(e->st, &f), MUSTER_OK);
  exec_sql(db, "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3000)"
               " INSERT INTO t(k, v) SELECT i, printf('%d:%.300c', i, 'a') FROM n");
  assert_int_equal(query_int(db, "SELECT sum(length(v)) FROM t"),
                   query_int(db, "SELECT sum(length(k || ':') + 300) FROM t"));
  exec_sql(db, "UPDATE t SET v = v || 'b' WHERE k % 2 = 0");
  assert_int_equal(query_int(db, "SELECT count(*) FROM t WHERE v LIKE '%b'"), 1500);
  assert_int_equal(query_int(db, "SELECT count(*) FROM t INDEXED BY t_v WHERE v > ''"), 3000);
  store_request_end(e->st, true);
  assert_int_equal(store_commit(e->st, &f), MUSTER_OK);
  assert_int_equal(crash_copy_query(e, "SELECT count(*) FROM t WHERE v LIKE '%b'"), 1500);
  assert_int_equal(crash_copy_query(e, "SELECT sum(k) FROM t"), 3000 * 3001 / 2);
  walvfs_stats_t d = stats_since(&before);
  assert_true(d.passed > 0); /* pages overwritten in place, checksums rewritten */
  assert_int_equal(d.failed, 0);
  /* Frames appended are still written two pieces or more at a time. */
  assert_true(d.file_writes - d.passed <= (d.sqlite_writes - d.passed) / 2);
  exec_sql(db, "PRAGMA cache_size = -65536");
}

/* A commit whose frames cannot be written fails (the file may not grow past
 * its size: RLIMIT_FSIZE); the store goes on once they can. */
static void test_failed_write_fails_commit(void **state) {
  env_t *e = *state;
  for (int k = 1; k <= 3; k++)
    assert_int_equal(commit_row(e, k), MUSTER_OK);
  struct stat sb;
  assert_int_equal(stat(e->wal, &sb), 0);
  struct rlimit saved, limited;
  assert_int_equal(getrlimit(RLIMIT_FSIZE, &saved), 0);
  limited = saved;
  limited.rlim_cur = (rlim_t)sb.st_size; /* the commit's frames go from there */
  signal(SIGXFSZ, SIG_IGN);
  walvfs_stats_t before;
  walvfs_stats(&before);
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &limited), 0);
  muster_err_t rc = commit_row(e, 4);
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &saved), 0);
  assert_int_equal(rc, MUSTER_STORE);
  walvfs_stats_t d = stats_since(&before);
  assert_int_equal(d.failed, 1);
  assert_int_equal(query_int(store_db(e->st), "SELECT count(*) FROM t"), 3);
  assert_int_equal(crash_copy_query(e, "SELECT count(*) FROM t"), 3);
  for (int k = 4; k <= 6; k++)
    assert_int_equal(commit_row(e, k), MUSTER_OK);
  assert_int_equal(crash_copy_query(e, "SELECT sum(k) FROM t"), 21);
}

/* Closing checkpoints the WAL into the database; reopening finds it all. */
static void test_close_and_reopen(void **state) {
  env_t *e = *state;
  for (int k = 1; k <= 10; k++)
    assert_int_equal(commit_row(e, k), MUSTER_OK);
  store_close(e->st);
  open_store(e);
  assert_int_equal(query_int(store_db(e->st), "SELECT sum(k) FROM t"), 55);
  assert_int_equal(commit_row(e, 11), MUSTER_OK);
  assert_int_equal(crash_copy_query(e, "SELECT sum(k) FROM t"), 66);
}

int main(void) {
  unsetenv("MUSTER_WAL_COALESCE"); /* these tests are of the VFS itself */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_one_write_per_commit, setup, teardown),
      cmocka_unit_test_setup_teardown(test_big_commit, setup, teardown),
      cmocka_unit_test_setup_teardown(test_commit_in_file_when_it_returns, setup, teardown),
      cmocka_unit_test_setup_teardown(test_spilled_transaction, setup, teardown),
      cmocka_unit_test_setup_teardown(test_failed_write_fails_commit, setup, teardown),
      cmocka_unit_test_setup_teardown(test_close_and_reopen, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
