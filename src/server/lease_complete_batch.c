/*
 * lease_complete_batch.c — a batch of completions applied with two
 * statements instead of two per task (lease_complete_batch), for a body the
 * scanner read or, when its fields are valid, a parsed one
 * (lease_complete_tree); and the scanned completion body's shape.
 *
 * Only an optimisation of lease_ops.c's element-by-element path, which it
 * must match exactly: the same rows, counts, replies and refusals.  Whenever
 * it cannot (a repeated id, a missing row, a repeated completion), it
 * declines and that path runs instead.
 */
#include "lease.h"
#include "counts.h"
#include "jv.h"
#include "jw.h"
#include "lease_internal.h"
#include "log.h"
#include "session.h"
#include "task.h"

#include <stdlib.h>
#include <string.h>

/*
 * A scanned batch of completions is applied with two statements, not two per
 * task: one SELECT finds every element's row (json_each over the ids, each
 * joined to its row by id), one UPDATE completes them all (the rows found by
 * id, each result through the store's map: muster_map_text, store.h).  The
 * elements are checked in order before anything is written, each as
 * lease_check_held and op_complete check it, so a refusal names the element
 * and gives the message it gave.  That order is the one-by-one order's only
 * when no element can change another's row: the batch is declined (the
 * caller goes element by element) when an id repeats, and when an id has no
 * row (it could be the next-stage task of an earlier element, made as that
 * one completes).
 */

static int id_cmp(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* True when the `n` ids of `body`'s elements are all different; `sorted`
 * has room for n. */
static bool lease_ids_distinct(const jscan_body_t *body, int64_t *sorted) {
  size_t n = body->count;
  bool ascending = true; /* the usual batch: then distinct without a sort */
  for (size_t i = 0; i < n; i++) {
    sorted[i] = body->elems[i].ints[0];
    ascending &= i == 0 || sorted[i] > sorted[i - 1];
  }
  if (ascending)
    return true;
  qsort(sorted, n, sizeof *sorted, id_cmp);
  for (size_t i = 1; i < n; i++)
    if (sorted[i] == sorted[i - 1])
      return false;
  return true;
}

/* The lowest and highest task ids of the first `n` elements of `body`
 * (distinct: lease_ids_distinct); true when they are consecutive, so that
 * `id BETWEEN lo AND hi` names exactly their rows. */
static bool lease_body_range(const jscan_body_t *body, size_t n, int64_t *lo, int64_t *hi) {
  *lo = INT64_MAX;
  *hi = INT64_MIN;
  for (size_t i = 0; i < n; i++) {
    int64_t id = body->elems[i].ints[0];
    *lo = id < *lo ? id : *lo;
    *hi = id > *hi ? id : *hi;
  }
  return *hi - *lo == (int64_t)n - 1;
}

/* Appends the task ids of the first `n` elements of `body` to `ids` as a JSON
 * array, for `id IN (SELECT value FROM json_each(?))`. */
static void lease_body_ids(const jscan_body_t *body, size_t n, jw_buf_t *ids) {
  JW_ADD_LITERAL(ids, "[");
  for (size_t i = 0; i < n; i++) {
    if (i > 0)
      JW_ADD_LITERAL(ids, ",");
    jw_add_int(ids, body->elems[i].ints[0]);
  }
  JW_ADD_LITERAL(ids, "]");
}

/* Steps lease_held_batch's SELECT, loading each row into the held[] slot of
 * its element (by its offset from lo in `pos`, or json_each's key without
 * `pos`) and counting them in *found; returns the last step's code. */
static int lease_held_rows(sqlite3_stmt *s, const jscan_body_t *body, const size_t *pos, int64_t lo,
                           lease_held_t *held, char (*queues)[NAME_MAX_LEN + 1], size_t *found) {
  int rc;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    int64_t key = sqlite3_column_int64(s, 0);
    int64_t i = pos ? (int64_t)pos[key - lo] : key;
    if (i < 0 || (size_t)i >= body->count)
      break; /* cannot happen: the range's ids, json_each's keys */
    lease_held_row(s, 1, body->elems[i].ints[0], &held[i], queues[i]);
    (*found)++;
  }
  return rc;
}

/* Loads the rows of the elements of `body` (distinct ids) into held[i],
 * their queues' names into queues[i], with one SELECT: over the range of
 * ids when they are consecutive (as lease_complete_rows updates them), else
 * over the list.  Returns 1 when each element has its row, 0 when some has
 * none, -1 with *f filled on a store failure. */
static int lease_held_batch(store_t *st, const jscan_body_t *body, lease_held_t *held,
                            char (*queues)[NAME_MAX_LEN + 1], fail_t *f) {
  size_t n = body->count;
  int64_t lo, hi;
  /* For a range: the element of each id, by its offset from lo. */
  size_t *pos = lease_body_range(body, n, &lo, &hi) ? malloc(n * sizeof *pos) : NULL;
  sqlite3_stmt *s =
      pos ? store_stmt(st, "SELECT tasks.id, " LEASE_HELD_COLUMNS " FROM tasks"
                           " WHERE tasks.id BETWEEN ?1 AND ?2")
          : store_stmt(st, "SELECT j.key, " LEASE_HELD_COLUMNS " FROM json_each(?1) AS j"
                           " CROSS JOIN tasks ON tasks.id = j.value");
  jw_buf_t ids = {0};
  if (pos) {
    for (size_t i = 0; i < n; i++)
      pos[body->elems[i].ints[0] - lo] = i;
  } else {
    lease_body_ids(body, n, &ids);
  }
  if (s == NULL || ids.failed) {
    jw_buf_free(&ids);
    free(pos);
    return s ? (fail_set(f, MUSTER_NOMEM, "out of memory"), -1)
             : (store_fail(st, f, "lease lookup"), -1);
  }
  if (pos) {
    sqlite3_bind_int64(s, 1, lo);
    sqlite3_bind_int64(s, 2, hi);
  } else {
    sqlite3_bind_text(s, 1, ids.buf, (int)ids.len, SQLITE_STATIC);
  }
  size_t found = 0;
  int rc = lease_held_rows(s, body, pos, lo, held, queues, &found);
  store_reset(s);
  jw_buf_free(&ids);
  free(pos);
  if (rc != SQLITE_DONE && rc != SQLITE_ROW)
    return store_fail(st, f, "lease lookup"), -1;
  return rc == SQLITE_DONE && found == n; /* ids are distinct: one row each */
}

/* Checks element `i` (loaded into *h, its queue named `queue`) as
 * lease_complete_one would, filling h->queue. */
static muster_err_t lease_complete_check(store_t *st, const jscan_elem_t *e, size_t i,
                                         const char *queue, lease_held_t *h, queue_t *cache,
                                         size_t max_payload, fail_t *f) {
  char ctx[32];
  lease_ctx(ctx, i);
  if (lease_held_queue(st, queue, h, cache, f) || lease_check_held(st, h, e->ints[1], ctx, f) ||
      lease_complete_size(e->text, ctx, max_payload, f))
    return f->code;
  return MUSTER_OK;
}

/* The UPDATE that completes a batch: over the range lo..hi (?1, ?3) or the
 * JSON list of ids (?1); results through the store's map (muster_map_text:
 * id to result), or none for acknowledgements without results, the common
 * case. */
static sqlite3_stmt *lease_complete_stmt(store_t *st, bool range, bool any_result) {
  if (range)
    return any_result ? store_stmt(st, "UPDATE tasks SET state = 2, result = muster_map_text(id),"
                                       " error = NULL, worker = NULL, deadline_ms = NULL,"
                                       " updated_ms = ?2 WHERE id BETWEEN ?1 AND ?3")
                      : store_stmt(st, "UPDATE tasks SET state = 2, result = NULL, error = NULL,"
                                       " worker = NULL, deadline_ms = NULL, updated_ms = ?2"
                                       " WHERE id BETWEEN ?1 AND ?3");
  return any_result
             ? store_stmt(st, "UPDATE tasks SET state = 2, result = muster_map_text(id),"
                              " error = NULL, worker = NULL, deadline_ms = NULL,"
                              " updated_ms = ?2 WHERE id IN (SELECT value FROM json_each(?1))")
             : store_stmt(st, "UPDATE tasks SET state = 2, result = NULL, error = NULL,"
                              " worker = NULL, deadline_ms = NULL, updated_ms = ?2"
                              " WHERE id IN (SELECT value FROM json_each(?1))");
}

/* The results of the first `n` elements of `body` by task id, sorted for
 * muster_map_text, or NULL when out of memory. */
static store_pair_t *lease_body_results(const jscan_body_t *body, size_t n) {
  store_pair_t *results = malloc(n * sizeof *results);
  for (size_t i = 0; results && i < n; i++) {
    const jscan_elem_t *e = &body->elems[i];
    results[i] = (store_pair_t){.key = e->ints[0], .text = e->text, .text_len = e->text_len};
  }
  if (results)
    store_pairs_sort(results, n);
  return results;
}

/* Completes the rows of the first `n` elements of `body`, all found leased
 * under their tokens, with one UPDATE. */
static muster_err_t lease_complete_rows(store_t *st, const jscan_body_t *body, size_t n,
                                        fail_t *f) {
  bool any_result = false;
  for (size_t i = 0; i < n; i++)
    any_result |= body->elems[i].text != NULL;
  /* Consecutive ids are the range itself, read in one pass, as lease_batch
   * reads a batch's leases. */
  int64_t lo, hi;
  bool range = lease_body_range(body, n, &lo, &hi);
  sqlite3_stmt *s = lease_complete_stmt(st, range, any_result);
  if (s == NULL)
    return store_fail(st, f, "complete");
  jw_buf_t ids = {0};
  store_pair_t *results = any_result ? lease_body_results(body, n) : NULL;
  if (!range)
    lease_body_ids(body, n, &ids);
  muster_err_t err = MUSTER_OK;
  if (ids.failed || (any_result && results == NULL)) {
    err = fail_set(f, MUSTER_NOMEM, "out of memory");
  } else {
    if (results)
      store_map_set(st, results, n);
    if (range) {
      sqlite3_bind_int64(s, 1, lo);
      sqlite3_bind_int64(s, 3, hi);
    } else {
      sqlite3_bind_text(s, 1, ids.buf, (int)ids.len, SQLITE_STATIC);
    }
    sqlite3_bind_int64(s, 2, now_ms());
    err = store_step_done(st, s, f);
    store_map_set(st, NULL, 0);
    if (!err && sqlite3_changes64(store_db(st)) != (int64_t)n)
      err = fail_set(f, MUSTER_STORE, "store: complete: %lld of %zu tasks updated",
                     (long long)sqlite3_changes64(store_db(st)), n);
  }
  jw_buf_free(&ids);
  free(results);
  return err;
}

/* Records the session results of the `n` tasks of `held` just completed, in
 * order, with session_record_finished: one read and one write of each
 * session for the batch instead of per task. */
static muster_err_t lease_record_done(store_t *st, const lease_held_t *held, size_t n, fail_t *f) {
  session_finished_t *done = malloc(n * sizeof *done);
  if (done == NULL)
    return fail_set(f, MUSTER_NOMEM, "out of memory");
  for (size_t i = 0; i < n; i++)
    done[i] = (session_finished_t){.task = held[i].id,
                                   .index = held[i].index,
                                   .session = held[i].has_session ? held[i].session : NULL,
                                   .queue = held[i].queue.name,
                                   .state = TASK_DONE};
  session_record_finished(st, done, n, f);
  free(done);
  return f->code;
}

/* Completes the first `n` elements of `body` (held[i] their rows, checked):
 * the rows, their counts in `run`, then each one's next stage, session,
 * worker tally and reply, in element order. */
static muster_err_t lease_complete_first(store_t *st, const jscan_body_t *body, size_t n,
                                         const lease_held_t *held, counts_run_t *run,
                                         lease_apply_out_t *out, fail_t *f) {
  if (n == 0)
    return MUSTER_OK;
  if (lease_complete_rows(st, body, n, f))
    return f->code;
  for (size_t i = 0; i < n; i++)
    if (counts_run_add(st, run, held[i].queue.name, held[i].state, TASK_DONE, f))
      return f->code;
  size_t in_session = 0;
  for (size_t i = 0; i < n; i++) {
    if (lease_complete_after(st, body->elems[i].text, &held[i], true, out, f))
      return f->code;
    in_session += held[i].has_session;
  }
  return in_session ? lease_record_done(st, held, n, f) : MUSTER_OK;
}

/* The contract is in lease_internal.h. */
int lease_complete_batch(store_t *st, const jscan_body_t *body, size_t max_payload,
                         counts_run_t *run, queue_t *cache, lease_apply_out_t *out, fail_t *f) {
  size_t n = body->count;
  if (n < 2)
    return 1; /* one SELECT and one UPDATE by id cost less than json_each */
  lease_held_t *held = malloc(n * sizeof *held);
  char(*queues)[NAME_MAX_LEN + 1] = malloc(n * sizeof *queues);
  int64_t *sorted = malloc(n * sizeof *sorted);
  int result = 1, found = 0;
  if (held == NULL || queues == NULL || sorted == NULL) {
    fail_set(f, MUSTER_NOMEM, "out of memory");
    result = -1;
  } else if (lease_ids_distinct(body, sorted) &&
             (found = lease_held_batch(st, body, held, queues, f)) != 0) {
    fail_t refused = {0};
    size_t passed = 0;
    bool repeat = false;
    while (found > 0 && passed < n &&
           !(repeat = lease_completed_by(&held[passed], body->elems[passed].ints[1])) &&
           !lease_complete_check(st, &body->elems[passed], passed, queues[passed], &held[passed],
                                 cache, max_payload, &refused))
      passed++;
    if (repeat)
      result = 1; /* a retry: nothing is written yet, and one by one answers repeats */
    else if (found < 0 || lease_complete_first(st, body, passed, held, run, out, f))
      result = -1;
    else if (passed < n)
      result = (*f = refused, -1);
    else
      result = 0;
  }
  free(held);
  free(queues);
  free(sorted);
  return result;
}

/* The contract is in lease_internal.h. */
int lease_complete_tree(store_t *st, const json_t *leases, size_t max_payload, counts_run_t *run,
                        queue_t *cache, lease_apply_out_t *out, fail_t *f) {
  static const char *const with_result[] = {"task", "token", "result", NULL};
  size_t n = json_array_size(leases);
  if (n < 2)
    return 1;
  jscan_body_t body = {.elems = calloc(n, sizeof *body.elems), .count = n};
  int result = body.elems ? 0 : 1;
  for (size_t i = 0; result == 0 && i < n; i++) {
    const json_t *elem = json_array_get(leases, i);
    jscan_elem_t *e = &body.elems[i];
    fail_t ignored = {0};
    const json_t *value = json_object_get(elem, "result");
    if (!json_is_object(elem) || jv_int(elem, "task", "", 0, 1, JV_ID_MAX, &e->ints[0], &ignored) ||
        jv_int(elem, "token", "", 0, 1, JV_ID_MAX, &e->ints[1], &ignored) || e->ints[0] == 0 ||
        e->ints[1] == 0 || jv_only(elem, "", with_result, &ignored) ||
        (value && (e->text = jv_encode(value)) == NULL))
      result = 1;
    else
      e->text_len = e->text ? strlen(e->text) : 0;
  }
  if (result == 0)
    result = lease_complete_batch(st, &body, max_payload, run, cache, out, f);
  for (size_t i = 0; body.elems && i < n; i++)
    free((char *)body.elems[i].text);
  free(body.elems);
  return result;
}

const jscan_shape_t lease_complete_shape = {
    .array = "leases",
    .max_elems = LEASE_MAX_BATCH,
    .text = "result",
    .ints = {{"task", 1, JV_ID_MAX, 0, true}, {"token", 1, JV_ID_MAX, 0, true}, {NULL, 0, 0, 0, 0}},
    .extra = "lease",
};
