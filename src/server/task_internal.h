/*
 * task_internal.h — what task.c and task_text.c share: the columns a task
 * is read with, its object written as JSON text from such a row, and pages
 * of such objects.
 */
#ifndef MUSTER_SERVER_TASK_INTERNAL_H
#define MUSTER_SERVER_TASK_INTERNAL_H

#include <stdbool.h>

#include "fail.h"
#include "jw.h"
#include "store.h"

/* The columns of a task row, in the order task_write reads them. */
#define TASK_COLUMNS                                                                               \
  "id, queue, state, priority, run_at_ms, payload, result, error, attempts, flags, key,"           \
  " session, idx, parent, created_ms, updated_ms, worker, deadline_ms, requires"

/* Appends the Task object (docs/api.md) of the row `s` is on (TASK_COLUMNS
 * first) to `out`, its stored payload, result and requires spliced as they
 * stand.  `brief` leaves out the payload and the result keys. */
void task_write(jw_buf_t *out, sqlite3_stmt *s, bool brief);

/* A page of tasks being written into `out`, the reply {"tasks": [...],
 * "next": id|null} of a listing: its tasks so far, and the bytes of their
 * stored payloads, which the budget of one reply bounds (reply_budget.h). */
typedef struct {
  jw_buf_t *out;
  size_t count, bytes;
} task_page_text_t;

/* Starts a page in `out` (empty). */
void task_page_start(task_page_text_t *page, jw_buf_t *out);
/* Adds the task of row `s` to the page when its payloads fit the page's
 * budget; false, nothing added, when they do not.  A row a closed session
 * `left` adds nothing, and fits while the page is within its budget. */
bool task_page_add(task_page_text_t *page, sqlite3_stmt *s, bool brief, bool left);
/* Ends the page, its "next" `next` when `more` and null otherwise; fails
 * with MUSTER_NOMEM when memory ran out while it was written. */
muster_err_t task_page_end(task_page_text_t *page, bool more, int64_t next, fail_t *f);

#endif
