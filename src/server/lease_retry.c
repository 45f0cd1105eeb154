/*
 * lease_retry.c — answering a lease request sent again after its reply was
 * lost (lease_retry.h).
 *
 * The record is three columns of the worker's row (store_schema.c): the key
 * of its last keyed lease request that leased something and the first and
 * last fencing tokens that request drew.  Tokens come from one counter and a
 * request draws its own without another request between, so the worker's
 * leases with a token in that range are exactly that request's; no column is
 * added to the task's row and no index is written on the task's path.  A
 * keyed request costs the worker's row one write when it leases; its check is
 * the read of that row that the worker's check makes anyway.  A request that
 * leases nothing records nothing: sent again, it leases anew, which is what
 * it would have done.
 */
#include "lease_retry.h"
#include "jv.h"
#include "jw.h"
#include "lease.h"
#include "lease_internal.h"
#include "log.h"
#include "worker.h"

#include <stdlib.h>
#include <string.h>

muster_err_t lease_retry_parse(const json_t *obj, const char *ctx, int64_t worker, lease_retry_t *r,
                               fail_t *f) {
  *r = (lease_retry_t){0};
  if (jv_name(obj, "request", ctx, &r->request, f))
    return f->code;
  if (r->request && worker <= 0)
    return fail_set(f, MUSTER_INVALID,
                    "%s%srequest: needs \"worker\": the head keeps a request's key with the "
                    "worker that sent it",
                    ctx, ctx[0] ? "." : "");
  return MUSTER_OK;
}

muster_err_t lease_retry_check(store_t *st, int64_t worker, lease_retry_t *r, fail_t *f) {
  if (r == NULL || r->request == NULL)
    return worker_check_active(st, worker, f);
  sqlite3_stmt *s = store_stmt(st, "SELECT state, lease_request = ?2, lease_first_token,"
                                   " lease_last_token FROM workers WHERE id = ?1");
  if (s == NULL)
    return store_fail(st, f, "worker lookup");
  sqlite3_bind_int64(s, 1, worker);
  store_bind_text(s, 2, r->request);
  bool active = false;
  if (sqlite3_step(s) == SQLITE_ROW) {
    active = sqlite3_column_int(s, 0) == WORKER_ACTIVE;
    r->repeat = sqlite3_column_int(s, 1) == 1; /* NULL (no key recorded) reads as 0 */
    r->first_token = sqlite3_column_int64(s, 2);
    r->last_token = sqlite3_column_int64(s, 3);
  }
  store_reset(s);
  /* Not active: the plain check says why (gone, or unknown) in its words. */
  return active ? MUSTER_OK : worker_check_active(st, worker, f);
}

/* Records `r`'s key for `worker` with the tokens after `before` up to the
 * last one drawn: the leases the request just made. */
static muster_err_t lease_retry_record(store_t *st, int64_t worker, const lease_retry_t *r,
                                       int64_t before, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "UPDATE workers SET lease_request = ?2,"
                                   " lease_first_token = ?3, lease_last_token = ?4 WHERE id = ?1");
  if (s == NULL)
    return store_fail(st, f, "lease request record");
  sqlite3_bind_int64(s, 1, worker);
  store_bind_text(s, 2, r->request);
  sqlite3_bind_int64(s, 3, before + 1);
  sqlite3_bind_int64(s, 4, store_last_token(st));
  return store_step_done(st, s, f);
}

/* Gives the leases of the recorded request that `worker` still holds in
 * queue `q` a full lease from now (never a shorter one). */
static muster_err_t lease_retry_extend(store_t *st, const queue_t *q, int64_t worker,
                                       const lease_retry_t *r, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "UPDATE tasks INDEXED BY tasks_leased"
                                   " SET deadline_ms = max(deadline_ms, ?5), updated_ms = ?6"
                                   " WHERE state = 1 AND worker = ?1 AND token BETWEEN ?2 AND ?3"
                                   " AND queue = ?4");
  if (s == NULL)
    return store_fail(st, f, "lease again");
  int64_t now = now_ms();
  sqlite3_bind_int64(s, 1, worker);
  sqlite3_bind_int64(s, 2, r->first_token);
  sqlite3_bind_int64(s, 3, r->last_token);
  store_bind_text(s, 4, q->name);
  sqlite3_bind_int64(s, 5, now + q->lease_ms);
  sqlite3_bind_int64(s, 6, now);
  return store_step_done(st, s, f);
}

/* Appends the lease objects of the recorded request's leases that `worker`
 * still holds in queue `q` to `out` (after its "["), in token order, and
 * counts them in *count, the highest task id in *max_task.  The stored
 * attempts count this lease already: the candidate's are one less. */
static muster_err_t lease_retry_write(store_t *st, const queue_t *q, int64_t worker,
                                      const lease_retry_t *r, jw_buf_t *out, size_t *count,
                                      int64_t *max_task, fail_t *f) {
  sqlite3_stmt *s = store_stmt(
      st, "SELECT id, attempts - 1, payload, coalesce(parent, 0), session, coalesce(idx, -1),"
          " requires, token, deadline_ms FROM tasks INDEXED BY tasks_leased WHERE state = 1"
          " AND worker = ?1 AND token BETWEEN ?2 AND ?3 AND queue = ?4 ORDER BY token");
  if (s == NULL)
    return store_fail(st, f, "lease again");
  sqlite3_bind_int64(s, 1, worker);
  sqlite3_bind_int64(s, 2, r->first_token);
  sqlite3_bind_int64(s, 3, r->last_token);
  store_bind_text(s, 4, q->name);
  jw_buf_t pieces = {0};
  int rc;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    candidate_t c;
    pieces.len = 0;
    lease_candidate_row(s, &c, &pieces);
    if (*count > 0)
      JW_ADD_LITERAL(out, ",");
    lease_write(out, &c, pieces.buf, sqlite3_column_int64(s, 7), sqlite3_column_int64(s, 8));
    *max_task = c.id > *max_task ? c.id : *max_task;
    (*count)++;
  }
  store_reset(s);
  bool nomem = pieces.failed || out->failed;
  jw_buf_free(&pieces);
  if (rc != SQLITE_DONE)
    return store_fail(st, f, "lease again");
  return nomem ? fail_set(f, MUSTER_NOMEM, "out of memory") : MUSTER_OK;
}

/* The answer to a repeat: the leases of its first request still held, as a
 * raw node, or NULL with *count 0 when none is (or on failure: *f set). */
static json_t *lease_retry_answer(store_t *st, const queue_t *q, int64_t worker,
                                  const lease_retry_t *r, size_t *count, int64_t *max_task,
                                  fail_t *f) {
  jw_buf_t out = {0};
  JW_ADD_LITERAL(&out, "[");
  json_t *leases = NULL;
  *count = 0;
  if (lease_retry_extend(st, q, worker, r, f) == MUSTER_OK &&
      lease_retry_write(st, q, worker, r, &out, count, max_task, f) == MUSTER_OK && *count > 0) {
    JW_ADD_LITERAL(&out, "]");
    leases = out.failed ? NULL : jw_raw(out.buf, out.len);
    if (leases == NULL)
      fail_set(f, MUSTER_NOMEM, "out of memory");
  }
  jw_buf_free(&out);
  if (leases)
    log_msg(LOG_INFO,
            "lease: worker %lld sent lease request %s again: answered with the %zu "
            "lease(s) it made",
            (long long)worker, r->request, *count);
  else
    *count = 0;
  return leases;
}

json_t *lease_acquire_retry(store_t *st, const queue_t *q, int64_t worker, int64_t max,
                            const lease_retry_t *r, size_t *count, int64_t *max_task, fail_t *f) {
  bool keyed = r && r->request && worker > 0;
  if (keyed && r->repeat) {
    int64_t highest = 0;
    json_t *again = lease_retry_answer(st, q, worker, r, count, &highest, f);
    if (max_task)
      *max_task = highest;
    if (again || f->code)
      return again;
  }
  int64_t before = store_last_token(st);
  json_t *leases = lease_acquire_raw(st, q, worker, max, count, max_task, f);
  if (leases && keyed && *count > 0 && lease_retry_record(st, worker, r, before, f)) {
    json_decref(leases);
    *count = 0;
    return NULL;
  }
  return leases;
}
