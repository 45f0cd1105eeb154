/*
 * pool_why.c — muster_pool_iter_failing: why an iterator's results are late
 * while its head answers.  A job that fails on every attempt (a shared level
 * it requires that was never uploaded, say) gives no result until its
 * attempts are spent, so a caller whose own deadline passes could only say
 * that the results were not all in.
 *
 * The C twin of python/muster/pool_why.py (the note of a Pool call's
 * TimeoutError): the same query (one brief page of the queue's tasks from the
 * iterator's first task id), the same choice of tasks and the same words, so
 * that docs quote one sentence for both.  One page keeps the cost of asking
 * fixed whatever the size of the call; a call of more than JOBS_PAGE inputs is
 * judged by its first ones.
 */
#include "client/pool_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WHY_JOBS_PAGE 100  /* tasks read (one page, brief) to find the call's failing jobs */
#define WHY_ERRORS_SHOWN 3 /* distinct errors named, the newest first */
#define WHY_PATH_MAX 512   /* the page's path: a queue name is at most 128 characters */

/* One task of the page that failed and waits to be tried again. */
typedef struct {
  int64_t position;   /* its input's position in the iterator */
  int64_t attempts;   /* attempts used so far */
  int64_t updated_ms; /* when it last changed (its last fail): the newest first */
  int64_t id;         /* ties of updated_ms: the higher id first */
  const char *error;  /* its last error (the page's string) */
} why_task_t;

/* Non-zero when `state` is one a task waits in to be tried again. */
static int why_unfinished(const char *state) {
  return state != NULL && (strcmp(state, "queued") == 0 || strcmp(state, "leased") == 0);
}

/* Fills *out from task object `t` when it is one of `it`'s inputs (by its
 * session and index), unfinished, with an error; returns 1 then, else 0. */
static int why_take(const muster_pool_iter_t *it, const json_t *t, why_task_t *out) {
  const char *session = json_string_value(json_object_get(t, "session"));
  const char *error = json_string_value(json_object_get(t, "error"));
  json_t *index = json_object_get(t, "index");
  if (session == NULL || strcmp(session, it->pool->session) != 0 || error == NULL ||
      error[0] == '\0' || !why_unfinished(json_string_value(json_object_get(t, "state"))) ||
      !json_is_integer(index))
    return 0;
  int64_t position = (int64_t)json_integer_value(index) - it->first;
  if (position < 0 || (uint64_t)position >= it->total)
    return 0;
  *out = (why_task_t){.position = position, .error = error};
  client_get_int(t, "attempts", 0, &out->attempts);
  client_get_int(t, "updated_ms", 0, &out->updated_ms);
  client_get_int(t, "id", 0, &out->id);
  return 1;
}

/* qsort order: the newest fail first (updated_ms, then id, descending). */
static int why_newest_first(const void *a, const void *b) {
  const why_task_t *x = a, *y = b;
  if (x->updated_ms != y->updated_ms)
    return x->updated_ms < y->updated_ms ? 1 : -1;
  return x->id < y->id ? 1 : x->id > y->id ? -1 : 0;
}

/* Appends printf-style text to `b`; false when memory ran out. */
__attribute__((format(printf, 2, 3))) static bool why_add(client_buf_t *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0 || !client_buf_reserve(b, (size_t)n))
    return false;
  va_start(ap, fmt);
  vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
  return true;
}

/* Whether one of shown[0..count) has the error `error`. */
static int why_said(const why_task_t *shown[], size_t count, const char *error) {
  for (size_t i = 0; i < count; i++)
    if (strcmp(shown[i]->error, error) == 0)
      return 1;
  return 0;
}

/* The sentence for failing[0..count) (count > 0, newest first) into `b`, in
 * pool_why.py's words; false when memory ran out. */
static bool why_sentence(client_buf_t *b, const why_task_t *failing, size_t count) {
  const why_task_t *shown[WHY_ERRORS_SHOWN];
  size_t nshown = 0;
  for (size_t i = 0; i < count && nshown < WHY_ERRORS_SHOWN; i++)
    if (!why_said(shown, nshown, failing[i].error))
      shown[nshown++] = &failing[i];
  bool ok = why_add(b,
                    "%zu of this call's unfinished jobs failed at least once and wait to be tried "
                    "again, the newest first: ",
                    count);
  for (size_t i = 0; ok && i < nshown; i++)
    ok = why_add(b, "%sjob %lld (attempt %lld): %s", i ? "; " : "", (long long)shown[i]->position,
                 (long long)shown[i]->attempts, shown[i]->error);
  size_t others = 0; /* jobs whose error is none of those named */
  for (size_t i = 0; i < count; i++)
    others += !why_said(shown, nshown, failing[i].error);
  if (ok && count > nshown && others == 0)
    ok = why_add(b, " (and %zu more with these errors)", count - nshown);
  else if (ok && count > nshown)
    ok = why_add(b, " (and %zu more: %zu with these errors, %zu with others)", count - nshown,
                 count - nshown - others, others);
  return ok;
}

/* The text for the task list `tasks` of a page into `b` ("" when none of
 * `it`'s tasks failed); false when memory ran out. */
static bool why_text(const muster_pool_iter_t *it, const json_t *tasks, client_buf_t *b) {
  size_t n = json_array_size(tasks), count = 0;
  why_task_t *failing = calloc(n ? n : 1, sizeof *failing);
  if (failing == NULL)
    return false;
  for (size_t i = 0; i < n; i++)
    count += (size_t)why_take(it, json_array_get(tasks, i), &failing[count]);
  qsort(failing, count, sizeof *failing, why_newest_first);
  bool ok = client_buf_append(b, "", 0) && (count == 0 || why_sentence(b, failing, count));
  free(failing);
  return ok;
}

/* Reads the page of the pool's queue from `it`'s first task into *reply. */
static muster_err_t why_read_page(muster_pool_iter_t *it, json_t **reply) {
  muster_pool_t *pool = it->pool;
  char path[WHY_PATH_MAX];
  muster_err_t err = client_path(pool->client, path, sizeof path, "/v1/queues/%s/tasks?after=%lld",
                                 pool->queue, (long long)(it->first_id - 1));
  if (err == MUSTER_OK) {
    size_t at = strlen(path);
    snprintf(path + at, sizeof path - at, "&limit=%d&brief=true", WHY_JOBS_PAGE);
    err = client_call(pool->client, "GET", path, NULL, 0, reply);
  }
  return pool_from_client(pool, err);
}

muster_err_t muster_pool_iter_failing(muster_pool_iter_t *it, char **text) {
  if (text)
    *text = NULL;
  if (it == NULL)
    return MUSTER_INVALID;
  it->pool->message[0] = '\0';
  if (text == NULL)
    return pool_fail(it->pool, MUSTER_INVALID, "text: a place for the text is required");
  json_t *reply = NULL;
  muster_err_t err = it->first_id > 0 ? why_read_page(it, &reply) : MUSTER_OK;
  client_buf_t b = {0};
  if (err == MUSTER_OK && reply != NULL && !json_is_array(json_object_get(reply, "tasks")))
    err = pool_fail(it->pool, MUSTER_PROTOCOL, "the reply has no 'tasks' list");
  else if (err == MUSTER_OK && !why_text(it, json_object_get(reply, "tasks"), &b))
    err = pool_fail(it->pool, MUSTER_NOMEM, "out of memory");
  json_decref(reply);
  if (err != MUSTER_OK) {
    free(b.data);
    return err;
  }
  *text = b.data;
  return MUSTER_OK;
}
