/*
 * session_results.c — a session's results stream: recording a result when a
 * task of the session finishes, and reading the stream in submission or in
 * completion order.
 *
 * Results live in `session_results`, one row per index (unique), numbered by
 * `seq` in the order they finished: the submission stream reads it by index,
 * the completion stream by seq, both through the table's indexes.  A result
 * row points at its task; the result and error are read from the task, which
 * exists as long as the session is open.
 *
 * Explicit indexes may leave a gap: indexes below next_index that no task
 * has (yet: another producer may fill it).  The submission stream stops at a
 * gap as it stops at an unfinished task, and says so (the reply's "gap"), so
 * that a reader whose stream can no longer move learns why.  Telling a gap
 * from an unfinished task takes one lookup in the tasks' session index, made
 * only when a read stops below next_index and its reply is sent: never per
 * result.
 *
 * A read's reply is written whole as JSON text (session_results_text), the
 * stored results spliced in as they stand, and the reply takes that buffer
 * as it is: a page of 1000 results of 10 kB is copied once on its way out,
 * not into a raw node and out of it again (docs/design-notes.md, "Stored
 * JSON text spliced into replies").
 */
#include "session.h"
#include "jv.h"
#include "jw.h"
#include "reply_budget.h"
#include "session_internal.h"
#include "task.h"

#include <stdio.h>
#include <string.h>

/* ---- reading ---- */

/* Appends the result object of row `s` (RESULT_COLUMNS) to `out`, after a
 * comma unless it is the first: {"index", "task", "state", "result",
 * "error", "seq"}, the bytes jw_dump writes for that object built as a tree
 * (test_session checks), written as text around the stored result. */
static void result_write(jw_buf_t *out, sqlite3_stmt *s, bool first) {
  int state = sqlite3_column_int(s, 2);
  bool done = state == TASK_DONE;
  if (!first)
    JW_ADD_LITERAL(out, ",");
  JW_ADD_LITERAL(out, "{\"index\":");
  jw_add_int(out, sqlite3_column_int64(s, 0));
  JW_ADD_LITERAL(out, ",\"task\":");
  jw_add_int(out, sqlite3_column_int64(s, 1));
  JW_ADD_LITERAL(out, ",\"state\":");
  const char *name = task_state_name(state);
  jw_add_string(out, name, strlen(name));
  JW_ADD_LITERAL(out, ",\"result\":");
  const char *result = done ? (const char *)sqlite3_column_text(s, 3) : NULL;
  if (result) /* the text before its length: sqlite3_column_bytes after _text */
    jv_add_stored(out, result, (size_t)sqlite3_column_bytes(s, 3));
  else
    JW_ADD_LITERAL(out, "null");
  JW_ADD_LITERAL(out, ",\"error\":");
  const char *error = (const char *)sqlite3_column_text(s, 4);
  if (!done && error)
    jw_add_string(out, error, (size_t)sqlite3_column_bytes(s, 4));
  else
    JW_ADD_LITERAL(out, "null");
  JW_ADD_LITERAL(out, ",\"seq\":");
  jw_add_int(out, sqlite3_column_int64(s, 5));
  JW_ADD_LITERAL(out, "}");
}

#define RESULT_COLUMNS "r.idx, r.task, r.state, t.result, t.error, r.seq"

/* Appends the results from `cursor` on to `list` (the elements of a JSON
 * array), rd->count of them, up to the budget of one reply (reply_budget.h;
 * rd->cut when it stopped there); returns the next cursor, -1 on store
 * failure. */
static int64_t results_read(store_t *st, const session_t *ss, session_order_t order, int64_t cursor,
                            int64_t max, jw_buf_t *list, session_read_t *rd) {
  sqlite3_stmt *s =
      order == SESSION_BY_SUBMISSION
          ? store_stmt(st, "SELECT " RESULT_COLUMNS " FROM session_results r"
                           " LEFT JOIN tasks t ON t.id = r.task"
                           " WHERE r.session = ?1 AND r.idx >= ?2 ORDER BY r.idx LIMIT ?3")
          : store_stmt(st, "SELECT " RESULT_COLUMNS " FROM session_results r"
                           " LEFT JOIN tasks t ON t.id = r.task"
                           " WHERE r.session = ?1 AND r.seq > ?2 ORDER BY r.seq LIMIT ?3");
  if (s == NULL)
    return -1;
  store_bind_text(s, 1, ss->id);
  sqlite3_bind_int64(s, 2, cursor);
  sqlite3_bind_int64(s, 3, max);
  int rc;
  size_t bytes = 0;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    /* The stream stops at the first index without a result. */
    if (order == SESSION_BY_SUBMISSION && sqlite3_column_int64(s, 0) != cursor)
      break;
    size_t size = (size_t)sqlite3_column_bytes(s, 3) + (size_t)sqlite3_column_bytes(s, 4);
    if (!reply_budget_fits(rd->count, bytes, size)) {
      rd->cut = true;
      break;
    }
    bytes += size;
    cursor = order == SESSION_BY_SUBMISSION ? cursor + 1 : sqlite3_column_int64(s, 5);
    result_write(list, s, rd->count++ == 0);
  }
  store_reset(s);
  return rc == SQLITE_ROW || rc == SQLITE_DONE ? cursor : -1;
}

/* The gap at `cursor`, an index below next_index without a result: *last
 * gets the last index of the run from `cursor` that no task of the session
 * has (up to the next index a task has, or next_index when none above has
 * one), -1 when `cursor` has a task (not finished yet).  One seek in
 * tasks_by_session.  Returns false on store failure. */
static bool results_gap(store_t *st, const session_t *ss, int64_t cursor, int64_t *last) {
  sqlite3_stmt *s = store_stmt(st, "SELECT idx FROM tasks WHERE session = ?1 AND queue = ?2"
                                   " AND idx >= ?3 ORDER BY idx LIMIT 1");
  if (s == NULL)
    return false;
  store_bind_text(s, 1, ss->id);
  store_bind_text(s, 2, ss->queue);
  sqlite3_bind_int64(s, 3, cursor);
  int rc = sqlite3_step(s);
  int64_t next_task = rc == SQLITE_ROW ? sqlite3_column_int64(s, 0) : ss->next_index;
  store_reset(s);
  *last = next_task > cursor ? next_task - 1 : -1;
  return rc == SQLITE_ROW || rc == SQLITE_DONE;
}

/* Why a read of `rd->count` results that ends at `next` stopped: *gap_last
 * (-1: none) and rd->stalled.  Only a submission read with fewer than `max`
 * results below next_index, and not cut by the budget (it stopped at a
 * result then), stopped at an index that may have no task; an
 * empty one whose caller waits (`empty_waits`) is looked at only when every
 * task has its result, as only then can it be stalled.  False on store
 * failure. */
static bool results_stop(store_t *st, const session_t *ss, session_order_t order, int64_t next,
                         int64_t max, bool empty_waits, session_read_t *rd, int64_t *gap_last) {
  bool complete = ss->done + ss->failed >= ss->total;
  *gap_last = -1;
  if (order != SESSION_BY_SUBMISSION || (int64_t)rd->count >= max || rd->cut ||
      next >= ss->next_index || (rd->count == 0 && empty_waits && !complete))
    return true;
  if (!results_gap(st, ss, next, gap_last))
    return false;
  rd->stalled = *gap_last >= 0 && complete;
  return true;
}

/* What a read found besides its results: the reply's other fields. */
typedef struct {
  int64_t cursor;   /* where the next read starts */
  int64_t gap_last; /* the last index of the gap at `cursor`; -1: no gap */
  int64_t total, done;
  bool sealed; /* the session takes no more tasks */
} results_page_t;

/* Reads the results of open session `id` (session_results' arguments) into
 * `list` as a JSON array, and *page.  MUSTER_OK, or the failure with *f
 * filled and `list` holding whatever was written (the caller frees it). */
static muster_err_t results_page(store_t *st, const char *id, session_order_t order, int64_t cursor,
                                 int64_t max, bool empty_waits, session_read_t *rd, jw_buf_t *list,
                                 results_page_t *page, fail_t *f) {
  session_t ss;
  *rd = (session_read_t){0};
  if (session_load_open(st, id, &ss, NULL, true, f))
    return f->code;
  JW_ADD_LITERAL(list, "[");
  int64_t next = results_read(st, &ss, order, cursor, max, list, rd), gap_last = -1;
  JW_ADD_LITERAL(list, "]");
  if (next < 0 || !results_stop(st, &ss, order, next, max, empty_waits, rd, &gap_last))
    return store_fail(st, f, "session results");
  *page = (results_page_t){.cursor = next,
                           .gap_last = gap_last,
                           .total = ss.total,
                           .done = ss.done + ss.failed,
                           .sealed = ss.sealed};
  rd->ended = ss.sealed && page->done >= ss.total;
  return list->failed ? fail_set(f, MUSTER_NOMEM, "out of memory") : MUSTER_OK;
}

/* The reply's fields after "results", written after its array: "cursor",
 * "total", "done", "gap" (an object or null) and "sealed", and the closing
 * brace. */
static void results_write_tail(jw_buf_t *out, const results_page_t *page) {
  JW_ADD_LITERAL(out, ",\"cursor\":");
  jw_add_int(out, page->cursor);
  JW_ADD_LITERAL(out, ",\"total\":");
  jw_add_int(out, page->total);
  JW_ADD_LITERAL(out, ",\"done\":");
  jw_add_int(out, page->done);
  if (page->gap_last < 0) {
    JW_ADD_LITERAL(out, ",\"gap\":null");
  } else {
    JW_ADD_LITERAL(out, ",\"gap\":{\"first\":");
    jw_add_int(out, page->cursor);
    JW_ADD_LITERAL(out, ",\"last\":");
    jw_add_int(out, page->gap_last);
    JW_ADD_LITERAL(out, "}");
  }
  if (page->sealed)
    JW_ADD_LITERAL(out, ",\"sealed\":true}");
  else
    JW_ADD_LITERAL(out, ",\"sealed\":false}");
}

muster_err_t session_results_text(store_t *st, const char *id, session_order_t order,
                                  int64_t cursor, int64_t max, bool empty_waits, session_read_t *rd,
                                  jw_buf_t *out, fail_t *f) {
  results_page_t page = {0}; /* set on success; GCC -O2 cannot tell */
  JW_ADD_LITERAL(out, "{\"results\":");
  if (results_page(st, id, order, cursor, max, empty_waits, rd, out, &page, f))
    return f->code;
  results_write_tail(out, &page);
  return out->failed ? fail_set(f, MUSTER_NOMEM, "out of memory") : MUSTER_OK;
}

/* ---- recording ---- */

/* The last result number of session `session` when it is open and of
 * `queue` (*open false otherwise). */
static muster_err_t record_last_seq(store_t *st, const char *session, const char *queue, bool *open,
                                    int64_t *seq, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT last_seq FROM sessions"
                                   " WHERE id = ?1 AND queue = ?2 AND state = 0");
  if (s == NULL)
    return store_fail(st, f, "session result");
  store_bind_text(s, 1, session);
  store_bind_text(s, 2, queue);
  *open = sqlite3_step(s) == SQLITE_ROW;
  *seq = *open ? sqlite3_column_int64(s, 0) : 0;
  store_reset(s);
  return MUSTER_OK;
}

/* Moves the session's last result number to `seq`, counting `done` more
 * done and `failed` more failed, and wakes its readers. */
static muster_err_t record_counts(store_t *st, const char *session, int64_t seq, int64_t done,
                                  int64_t failed, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "UPDATE sessions SET last_seq = ?2, done = done + ?3,"
                                   " failed = failed + ?4 WHERE id = ?1");
  if (s == NULL)
    return store_fail(st, f, "session result");
  store_bind_text(s, 1, session);
  sqlite3_bind_int64(s, 2, seq);
  sqlite3_bind_int64(s, 3, done);
  sqlite3_bind_int64(s, 4, failed);
  if (store_step_done(st, s, f))
    return f->code;
  store_notify_session(st, session);
  return MUSTER_OK;
}

/* Adds the results of the `n` finished tasks of session `session` (queue
 * `queue`) to its stream, in order, when it is open and of that queue. */
static muster_err_t record_run(store_t *st, const char *session, const char *queue,
                               const session_finished_t *finished, size_t n, fail_t *f) {
  bool open = false;
  int64_t seq = 0, first, done = 0;
  if (record_last_seq(st, session, queue, &open, &seq, f))
    return f->code;
  if (!open)
    return MUSTER_OK;
  first = seq;
  for (size_t i = 0; i < n; i++) {
    sqlite3_stmt *s =
        store_stmt(st, "INSERT OR IGNORE INTO session_results(session, seq, idx, task, state)"
                       " VALUES(?1, ?2, ?3, ?4, ?5)");
    if (s == NULL)
      return store_fail(st, f, "session result");
    store_bind_text(s, 1, session);
    sqlite3_bind_int64(s, 2, seq + 1);
    sqlite3_bind_int64(s, 3, finished[i].index);
    sqlite3_bind_int64(s, 4, finished[i].task);
    sqlite3_bind_int(s, 5, finished[i].state);
    if (store_step_done(st, s, f))
      return f->code;
    if (sqlite3_changes(store_db(st)) == 0)
      continue; /* the index has its result already: results are final */
    seq++;
    done += finished[i].state == TASK_DONE;
  }
  if (seq == first)
    return MUSTER_OK;
  return record_counts(st, session, seq, done, seq - first - done, f);
}

muster_err_t session_record_finished(store_t *st, const session_finished_t *finished, size_t n,
                                     fail_t *f) {
  for (size_t i = 0, j; i < n; i = j) {
    const session_finished_t *a = &finished[i];
    j = i + 1;
    if (a->session == NULL || a->index < 0)
      continue; /* not a task of a session */
    while (j < n && finished[j].session && finished[j].index >= 0 &&
           strcmp(finished[j].session, a->session) == 0 && strcmp(finished[j].queue, a->queue) == 0)
      j++;
    if (record_run(st, a->session, a->queue, a, j - i, f))
      return f->code;
  }
  return MUSTER_OK;
}

muster_err_t session_record_result(store_t *st, int64_t task, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT session, coalesce(idx, -1), state, queue"
                                   " FROM tasks WHERE id = ?1 AND session IS NOT NULL");
  if (s == NULL)
    return store_fail(st, f, "session result");
  sqlite3_bind_int64(s, 1, task);
  char session[SESSION_ID_LEN + 1] = "", queue[NAME_MAX_LEN + 1] = "";
  session_finished_t one = {.task = task, .index = -1};
  if (sqlite3_step(s) == SQLITE_ROW) {
    snprintf(session, sizeof session, "%s", (const char *)sqlite3_column_text(s, 0));
    one.index = sqlite3_column_int64(s, 1);
    one.state = sqlite3_column_int(s, 2);
    snprintf(queue, sizeof queue, "%s", (const char *)sqlite3_column_text(s, 3));
  }
  store_reset(s);
  if (session[0] == '\0')
    return MUSTER_OK; /* not a task of a session */
  one.session = session;
  one.queue = queue;
  return session_record_finished(st, &one, 1, f);
}
