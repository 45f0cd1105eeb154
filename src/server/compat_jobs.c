/*
 * compat_jobs.c — DistCompute job numbers (compat_jobs.h).
 *
 * A job is a chain of tasks, one per stage, each the `parent` of the next.
 * Tasks point to their parent, never to their children, and no index finds
 * a task's children: one would be written by every completion into a next
 * stage, on the head's hot path.  So a number is kept per numbered task in
 * compat_numbers (task, pipeline) -> number, and a numbered task's child
 * gets its parent's row as it is inserted (a completion into the next
 * stage), so that the number goes down the chain whether or not any stage
 * asks for it: a stage worked by `muster worker` numbers nothing, and its
 * task may be removed before the next stage asks.  A task of a pipeline's
 * first queue starts a job and takes no number of that pipeline from its
 * parent.  A task without a row (its parent was numbered after the task
 * was made, or before the head carried numbers down) takes the number of
 * the nearest task up its chain that has one.  That walk reads a missing
 * parent's row too (ids are never given twice), so a stage's number
 * survives the removal of the task that held it, as long as that task's
 * row stays.
 *
 * Rows go with their tasks, told by a trigger on the deletion of a task
 * (compat_jobs_watch), whatever removed it: a retention, a purge, a queue's
 * or a session's deletion.  When task X goes:
 *   - X's own row goes, unless X was done and its queue has a next stage:
 *     then X's child, made by that completion, may have no row of its own
 *     (made before X was numbered) and still ask for it;
 *   - X's parent's row goes when the parent is gone or done: X was the
 *     child that row waited for, and a done parent is leased again only
 *     when a child of it is flagged, which X no longer can be.
 * So once every task of a job is gone, so are its rows; while it has
 * tasks, it has at most one row per task, plus a removed done task's row
 * until its child goes.  A row is about 20 bytes plus the pipeline's name.
 * Both triggers (the insertion's, the deletion's) are temporary (this
 * connection's) and made only once a number exists, so that a head that
 * numbers nothing pays nothing on its puts, completions and deletions; one
 * that does pays a lookup per task inserted with a parent (a completion
 * into a next stage) and two per deleted task, and the rows' writes.
 *
 * Numbers come from compat_counters, one row per pipeline, which never
 * goes down: a number is never given twice, also after rows went.
 */
#include "compat_jobs.h"
#include "compat.h"
#include "jv.h"
#include "log.h"
#include "queue.h"
#include "task.h"

#include <stdio.h>
#include <string.h>

/* See the file's comment.  The state 2 is TASK_DONE.  Made together, in one
 * statement list: a rollback takes both or neither.  The insertion's test
 * is in its WHEN, which SQLite runs inline, rather than only in its body,
 * a sub-program started per row: where no parent is numbered, that costs
 * an eighth as much (docs/design-notes.md). */
static const char jobs_trigger_sql[] =
    "CREATE TEMP TRIGGER IF NOT EXISTS compat_numbers_inherit AFTER INSERT ON main.tasks"
    " WHEN new.parent IS NOT NULL"
    "   AND EXISTS (SELECT 1 FROM compat_numbers WHERE task = new.parent)"
    " BEGIN"
    "  INSERT OR IGNORE INTO compat_numbers(task, pipeline, number)"
    "   SELECT new.id, pipeline, number FROM compat_numbers"
    "   WHERE task = new.parent AND pipeline != new.queue;"
    " END;"
    "CREATE TEMP TRIGGER IF NOT EXISTS compat_numbers_forget AFTER DELETE ON main.tasks"
    " WHEN EXISTS (SELECT 1 FROM compat_numbers WHERE task = old.id)"
    "   OR EXISTS (SELECT 1 FROM compat_numbers WHERE task = old.parent)"
    " BEGIN"
    "  DELETE FROM compat_numbers WHERE task = old.id AND NOT (old.state = 2 AND"
    "   coalesce((SELECT next FROM queues WHERE name = old.queue),"
    "            (SELECT next FROM queue_trash WHERE name = old.queue)) IS NOT NULL);"
    "  DELETE FROM compat_numbers WHERE task = old.parent"
    "   AND NOT EXISTS (SELECT 1 FROM tasks WHERE id = old.parent AND state != 2);"
    " END";

_Static_assert(TASK_DONE == 2, "jobs_trigger_sql names the done state by its number");

muster_err_t compat_jobs_watch(store_t *st, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT (SELECT count(*) FROM temp.sqlite_master"
                                   " WHERE name IN ('compat_numbers_inherit',"
                                   "                'compat_numbers_forget')),"
                                   " EXISTS (SELECT 1 FROM compat_numbers)");
  if (s == NULL)
    return store_fail(st, f, "job numbers");
  int rc = sqlite3_step(s);
  bool wanted = rc == SQLITE_ROW && sqlite3_column_int(s, 0) < 2 && sqlite3_column_int(s, 1);
  store_reset(s);
  if (rc != SQLITE_ROW)
    return store_fail(st, f, "job numbers");
  /* A rolled-back transaction takes the trigger with it: hence the check
   * each time rather than a flag. */
  if (wanted && sqlite3_exec(store_db(st), jobs_trigger_sql, NULL, NULL, NULL) != SQLITE_OK)
    return store_fail(st, f, "job numbers");
  return MUSTER_OK;
}

/* *number: `task`'s own number under `first`, 0 when it has none. */
static muster_err_t jobs_row(store_t *st, const char *first, int64_t task, int64_t *number,
                             fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT number FROM compat_numbers"
                                   " WHERE task = ?1 AND pipeline = ?2");
  if (s == NULL)
    return store_fail(st, f, "job number");
  sqlite3_bind_int64(s, 1, task);
  store_bind_text(s, 2, first);
  int rc = sqlite3_step(s);
  *number = rc == SQLITE_ROW ? sqlite3_column_int64(s, 0) : 0;
  store_reset(s);
  return rc == SQLITE_ROW || rc == SQLITE_DONE ? MUSTER_OK : store_fail(st, f, "job number");
}

/* *number: the number of the nearest task up `task`'s chain of parents that
 * has one; 0 when none has.  The walk ends at a task of the first queue
 * (the job's first stage: a queue feeding it starts other jobs), at a
 * chain's start, and past a missing task, whose own row it still reads. */
static muster_err_t jobs_inherited(store_t *st, const char *first, int64_t task, int64_t *number,
                                   fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT coalesce(parent, 0), queue = ?2 FROM tasks"
                                   " WHERE id = ?1");
  if (s == NULL)
    return store_fail(st, f, "job number");
  *number = 0;
  for (int hop = 0; hop < COMPAT_MAX_STAGES && *number == 0; hop++) {
    sqlite3_bind_int64(s, 1, task);
    store_bind_text(s, 2, first);
    int rc = sqlite3_step(s);
    int64_t parent = rc == SQLITE_ROW ? sqlite3_column_int64(s, 0) : 0;
    bool at_first = rc == SQLITE_ROW && sqlite3_column_int(s, 1);
    store_reset(s);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
      return store_fail(st, f, "job number");
    if (parent == 0 || at_first)
      break;
    task = parent;
    if (jobs_row(st, first, task, number, f))
      return f->code;
  }
  return MUSTER_OK;
}

/* *number: the pipeline's next number; its first is 1, or above the floor
 * of a restore (store_restore.c), as for update numbers. */
static muster_err_t jobs_next_number(store_t *st, const char *first, int64_t *number, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "INSERT INTO compat_counters(pipeline, last)"
                                   " VALUES(?1, " STORE_ID_FLOOR_SQL " + 1)"
                                   " ON CONFLICT(pipeline) DO UPDATE SET last = last + 1"
                                   " RETURNING last");
  if (s == NULL)
    return store_fail(st, f, "job number");
  store_bind_text(s, 1, first);
  int rc = sqlite3_step(s);
  *number = rc == SQLITE_ROW ? sqlite3_column_int64(s, 0) : 0;
  if (rc == SQLITE_ROW)
    rc = sqlite3_step(s);
  store_reset(s);
  return rc == SQLITE_DONE ? MUSTER_OK : store_fail(st, f, "job number");
}

static muster_err_t jobs_keep(store_t *st, const char *first, int64_t task, int64_t number,
                              fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "INSERT INTO compat_numbers(task, pipeline, number)"
                                   " VALUES(?1, ?2, ?3)");
  if (s == NULL)
    return store_fail(st, f, "job number");
  sqlite3_bind_int64(s, 1, task);
  store_bind_text(s, 2, first);
  sqlite3_bind_int64(s, 3, number);
  return store_step_done(st, s, f);
}

int64_t compat_job_number(store_t *st, const char *first, int64_t task, fail_t *f) {
  int64_t number = 0;
  if (jobs_row(st, first, task, &number, f))
    return 0;
  if (number > 0)
    return number;
  if (jobs_inherited(st, first, task, &number, f) ||
      (number == 0 && jobs_next_number(st, first, &number, f)) ||
      jobs_keep(st, first, task, number, f) || compat_jobs_watch(st, f))
    return 0;
  return number;
}

/* ---- numbers kept before schema 17 ---- */

/* Runs `sql` with ?1 = `a` and ?2 = `b` (NULL where it has no ?2). */
static muster_err_t jobs_exec(store_t *st, const char *sql, const char *a, const char *b,
                              fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, sql);
  if (s == NULL)
    return store_fail(st, f, "job numbers");
  store_bind_text(s, 1, a);
  if (b)
    store_bind_text(s, 2, b);
  return store_step_done(st, s, f);
}

/* *last: the counter of `pipeline`, -1 when it has none. */
static muster_err_t jobs_counter(store_t *st, const char *pipeline, int64_t *last, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT last FROM compat_counters WHERE pipeline = ?1");
  if (s == NULL)
    return store_fail(st, f, "job numbers");
  store_bind_text(s, 1, pipeline);
  int rc = sqlite3_step(s);
  *last = rc == SQLITE_ROW ? sqlite3_column_int64(s, 0) : -1;
  store_reset(s);
  return rc == SQLITE_ROW || rc == SQLITE_DONE ? MUSTER_OK : store_fail(st, f, "job numbers");
}

muster_err_t compat_jobs_adopt(store_t *st, const char *name, const char *first, fail_t *f) {
  char old[NAME_MAX_LEN + 16];
  snprintf(old, sizeof old, "distcompute:%s", name);
  int64_t old_last, last;
  if (jobs_counter(st, old, &old_last, f) || jobs_counter(st, first, &last, f))
    return f->code;
  if (old_last < 0)
    return MUSTER_OK;
  if (last < 0) {
    if (jobs_exec(st, "UPDATE compat_numbers SET pipeline = ?2 WHERE pipeline = ?1", old, first, f))
      return f->code;
    return jobs_exec(st, "UPDATE compat_counters SET pipeline = ?2 WHERE pipeline = ?1", old, first,
                     f);
  }
  /* Both numbered: the old jobs still under way will take new numbers. */
  log_msg(LOG_WARN,
          "distcompute %s: jobs were numbered both by this pipeline's old name and by its "
          "first queue '%s'; numbering goes on after %lld, and jobs under way take new numbers",
          name, first, (long long)(old_last > last ? old_last : last));
  if (jobs_exec(st,
                "UPDATE compat_counters SET last = max(last, (SELECT last FROM"
                " compat_counters WHERE pipeline = ?1)) WHERE pipeline = ?2",
                old, first, f) ||
      jobs_exec(st, "DELETE FROM compat_numbers WHERE pipeline = ?1", old, NULL, f))
    return f->code;
  return jobs_exec(st, "DELETE FROM compat_counters WHERE pipeline = ?1", old, NULL, f);
}

/* ---- POST /v1/distcompute/jobs ---- */

/* MUSTER_OK when `queue` is one of the first COMPAT_MAX_STAGES queues of the
 * chain that starts at `first` (which must exist). */
static muster_err_t jobs_check_stage(store_t *st, const char *first, int64_t task,
                                     const char *queue, fail_t *f) {
  queue_t q;
  char name[NAME_MAX_LEN + 1], stages[COMPAT_MAX_STAGES * (NAME_MAX_LEN + 2) + 1] = "";
  size_t used = 0;
  snprintf(name, sizeof name, "%s", first);
  for (int i = 0; i < COMPAT_MAX_STAGES && name[0]; i++) {
    if (queue_load(st, name, &q, f))
      return f->code;
    if (strcmp(q.name, queue) == 0)
      return MUSTER_OK;
    used += (size_t)snprintf(stages + used, sizeof stages - used, "%s%s", i ? ", " : "", q.name);
    snprintf(name, sizeof name, "%s", q.next);
  }
  return fail_set(f, MUSTER_INVALID,
                  "task %lld is in queue '%s', which is not a stage of pipeline '%s' (its "
                  "stages: %s); name the pipeline by the first queue of the task's chain",
                  (long long)task, queue, first, stages);
}

/* The queue of `task` into queue[]; MUSTER_TASK_NOT_FOUND says why not. */
static muster_err_t jobs_task_queue(store_t *st, int64_t task, char queue[NAME_MAX_LEN + 1],
                                    fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT queue FROM tasks WHERE id = ?1");
  if (s == NULL)
    return store_fail(st, f, "job number");
  sqlite3_bind_int64(s, 1, task);
  int rc = sqlite3_step(s);
  if (rc == SQLITE_ROW)
    snprintf(queue, NAME_MAX_LEN + 1, "%s", (const char *)sqlite3_column_text(s, 0));
  store_reset(s);
  if (rc == SQLITE_ROW)
    return MUSTER_OK;
  if (rc != SQLITE_DONE)
    return store_fail(st, f, "job number");
  json_t *none = task_get(st, task, f); /* fills *f with why it is not there */
  json_decref(none);
  return f->code ? f->code
                 : fail_set(f, MUSTER_TASK_NOT_FOUND, "task %lld does not exist", (long long)task);
}

/* The body's pipeline and task; MUSTER_INVALID says what is wrong. */
static muster_err_t jobs_parse(const json_t *body, const char **first, int64_t *task, fail_t *f) {
  static const char *const allowed[] = {"pipeline", "task", NULL};
  if (jv_only(body, "", allowed, f) || jv_name(body, "pipeline", "", first, f) ||
      jv_int(body, "task", "", 0, 1, JV_ID_MAX, task, f))
    return f->code;
  if (*first == NULL || *task == 0)
    return fail_set(f, MUSTER_INVALID, "%s: required (the pipeline's first queue and a task of it)",
                    *first == NULL ? "pipeline" : "task");
  return MUSTER_OK;
}

void compat_h_job_number(http_req_t *r) {
  fail_t f = {0};
  const char *first = NULL;
  int64_t task = 0, number = 0;
  char queue[NAME_MAX_LEN + 1];
  store_t *st = r->head->st;
  if (jobs_parse(r->body, &first, &task, &f) == MUSTER_OK &&
      jobs_task_queue(st, task, queue, &f) == MUSTER_OK &&
      jobs_check_stage(st, first, task, queue, &f) == MUSTER_OK)
    number = compat_job_number(st, first, task, &f);
  if (number == 0) {
    http_reply_fail(r, &f);
    return;
  }
  http_reply_json(r, 200,
                  json_pack("{s:s, s:I, s:I}", "pipeline", first, "task", (json_int_t)task,
                            "number", (json_int_t)number));
}
