/*
 * store_restore.c — ids after a restore: a head started on a backup's copy
 * of its store never hands out again an id that the head the backup was
 * taken from handed out after it.
 *
 * That head (the lost one) may have gone on for hours after the backup,
 * handing out task ids, worker ids and numbers that clients still hold:
 * a client reading task 1200, a worker heart-beating as worker 40, a
 * worker that saw update 7 of its queue, a reader of a session's results
 * at completion number 300, a DistCompute worker that names its files by
 * job number 55.  The copy knows none of them; counting on from its own
 * highest values would give them again, and each of those clients would
 * read, or be taken for, something else.
 *
 * `muster backup` marks its copy (backup.c writes meta's STORE_BACKUP_MARK
 * into the copy once it is complete; a live store never has it), so a
 * store that opens with the mark is a restore, and the only moment to act
 * is that first opening: it raises each of those counters to the clock's
 * milliseconds times 1024, the fencing tokens' floor (store.c,
 * store_token_clock), above anything the lost head can have handed out as
 * long as no head hands out more than 1024 of one kind a millisecond and the
 * clock does not go back.  That holds for a second restore from the same
 * backup too: the first restored head's ids are below the clock of the
 * second.  The mark goes in the same transaction, so the restored head's
 * own restarts continue where it left off, one by one as ever; a start that
 * lost that commit (a power loss before its flush) only jumps once more.
 *
 * Counters kept in rows are raised where they are; those whose row may come
 * only later (a queue's first update, a pipeline's first job number, a
 * worker, for the lost head may have had them already) start above meta's
 * id floor (STORE_ID_FLOOR_SQL).  Fencing tokens need none of it: every
 * start begins them above the clock.  Nothing else a client keeps is the
 * head's to number: session ids are random, nodes and iterations are named,
 * a blob's levels are numbered by its writers, and a task's index in its
 * session by its client.
 */
#include "store_restore.h"
#include "log.h"
#include "store.h"

#include <stdbool.h>

/* The statements of a restore, in one transaction, ?1 the floor: task ids
 * continue from meta's last_task (store_task_ids), raised; the id floor for
 * counters without a row yet; the counters in rows; the mark cleared. */
static const char restore_sql[] =
    "INSERT INTO meta(k, v) VALUES('last_task', max(?1, coalesce((SELECT max(id) FROM tasks), 0),"
    "  coalesce((SELECT v FROM meta WHERE k = 'last_task'), 0)))"
    "  ON CONFLICT(k) DO UPDATE SET v = excluded.v;"
    "INSERT INTO meta(k, v) VALUES('" STORE_ID_FLOOR_KEY "', ?1)"
    "  ON CONFLICT(k) DO UPDATE SET v = max(v, excluded.v);"
    "UPDATE update_seqs SET last = ?1 WHERE last < ?1;"
    "UPDATE compat_counters SET last = ?1 WHERE last < ?1;"
    "UPDATE sessions SET last_seq = ?1 WHERE last_seq < ?1;"
    "DELETE FROM meta WHERE k = '" STORE_BACKUP_MARK "';";

/* The first column of the one-row query `sql`, or 0 when it has no row (or
 * fails: the caller's next statement says why). */
static int64_t restore_read(sqlite3 *db, const char *sql) {
  sqlite3_stmt *s = NULL;
  int64_t v = 0;
  if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) == SQLITE_OK && sqlite3_step(s) == SQLITE_ROW)
    v = sqlite3_column_int64(s, 0);
  sqlite3_finalize(s);
  return v;
}

/* Runs the statements of `sql` in turn, each with ?1 bound to `floor`. */
static bool restore_run(sqlite3 *db, const char *sql, int64_t floor) {
  while (*sql) {
    sqlite3_stmt *s = NULL;
    const char *rest = NULL;
    if (sqlite3_prepare_v2(db, sql, -1, &s, &rest) != SQLITE_OK)
      return false;
    if (s == NULL) /* only white space was left */
      return true;
    if (sqlite3_bind_parameter_count(s) >= 1)
      sqlite3_bind_int64(s, 1, floor);
    int rc = sqlite3_step(s);
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE)
      return false;
    sql = rest;
  }
  return true;
}

muster_err_t store_restore_ids(sqlite3 *db, int64_t floor, fail_t *f) {
  int64_t taken_ms = restore_read(db, "SELECT v FROM meta WHERE k = '" STORE_BACKUP_MARK "'");
  if (taken_ms == 0)
    return MUSTER_OK;
  if (sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK ||
      !restore_run(db, restore_sql, floor) ||
      sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
    fail_set(f, MUSTER_STORE, "store: raising the ids of a store started on a backup: %s",
             sqlite3_errmsg(db));
    sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    return MUSTER_STORE;
  }
  char taken[32];
  log_format_time(taken_ms, taken);
  int64_t next = restore_read(db, "SELECT v FROM meta WHERE k = 'last_task'") + 1;
  log_msg(LOG_INFO,
          "store: started on a backup (taken %s); task ids continue from %lld so none the lost "
          "head gave is given again, and so do worker ids and the numbers of updates, session "
          "results and jobs",
          taken, (long long)next);
  return MUSTER_OK;
}
