/*
 * lease_retry.c — answering a lease request sent again after its reply was
 * lost (lease_retry.h).
 *
 * The records are rows of lease_requests (store_schema.c), one per worker and
 * stream: the stream's last key whose request leased something and the first
 * and last fencing tokens that request drew.  Tokens come from one counter and
 * a request draws its own without another request between, so the worker's
 * leases with a token in that range are exactly that request's; no column is
 * added to the task's row and no index is written on the task's path.  A
 * keyed request reads its stream's row in the query that reads the worker's
 * row for its check anyway (one more primary-key lookup), and writes it once
 * when it leases; a request without a key reads and writes no record.  A
 * request that leases nothing records nothing: sent again, it leases anew,
 * which is what it would have done.
 *
 * Why streams, not one row per key: a slot retries only its latest key, so
 * its stream's row is all its retry needs, the table holds one row per slot
 * whatever the number of requests, and a new key of a stream replaces its
 * row in place (one write, nothing to look for or delete).  Keys that are
 * not numbered share the worker's unnamed stream, one row as before: a
 * client whose keys are unique strings (random ids) would otherwise add a
 * row per request, fill the bound and make each lease count and evict.  Only
 * a new stream, once per slot, counts the worker's rows against
 * LEASE_RETRY_MAX_STREAMS.  (The records were three columns of the worker's
 * row before schema version 21: one record per worker, so that of the slots
 * leasing under one worker id only the last one to lease had its retry
 * answered.)
 *
 * A lease's reply is written here too (lease_reply_text): its leases, new or
 * answered again, and the updates it carries, as text into the reply's own
 * buffer, shared by a lease, a parked lease and the combined call.
 */
#include "lease_retry.h"
#include "jv.h"
#include "jw.h"
#include "lease.h"
#include "lease_internal.h"
#include "log.h"
#include "update.h"
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

size_t lease_retry_stream_len(const char *key) {
  size_t len = strlen(key), at = len;
  while (at > 0 && key[at - 1] >= '0' && key[at - 1] <= '9')
    at--;
  /* at: where the trailing digits start, if any; the stream ends at the '-'
   * before them. */
  return at < len && at > 0 && key[at - 1] == '-' ? at - 1 : 0;
}

muster_err_t lease_retry_check(store_t *st, int64_t worker, lease_retry_t *r, fail_t *f) {
  if (r == NULL || r->request == NULL)
    return worker_check_active(st, worker, f);
  sqlite3_stmt *s = store_stmt(
      st, "SELECT w.state, r.worker IS NOT NULL, r.request = ?3, r.first_token, r.last_token"
          " FROM workers AS w LEFT JOIN lease_requests AS r ON r.worker = w.id AND r.stream = ?2"
          " WHERE w.id = ?1");
  if (s == NULL)
    return store_fail(st, f, "worker lookup");
  r->stream_len = lease_retry_stream_len(r->request);
  sqlite3_bind_int64(s, 1, worker);
  sqlite3_bind_text(s, 2, r->request, (int)r->stream_len, SQLITE_TRANSIENT);
  store_bind_text(s, 3, r->request);
  bool active = false;
  if (sqlite3_step(s) == SQLITE_ROW) {
    active = sqlite3_column_int(s, 0) == WORKER_ACTIVE;
    r->recorded = sqlite3_column_int(s, 1) == 1;
    r->repeat = sqlite3_column_int(s, 2) == 1; /* NULL (no record) reads as 0 */
    r->first_token = sqlite3_column_int64(s, 3);
    r->last_token = sqlite3_column_int64(s, 4);
  }
  store_reset(s);
  /* Not active: the plain check says why (gone, or unknown) in its words. */
  return active ? MUSTER_OK : worker_check_active(st, worker, f);
}

/* Deletes the records of `worker` beyond the newest LEASE_RETRY_MAX_STREAMS,
 * the oldest by their last token (the order they were written in).  Run when
 * a stream is added: the count reads the worker's rows in the primary key,
 * the eviction sorts them, which only a worker past the bound pays. */
static muster_err_t lease_retry_bound(store_t *st, int64_t worker, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT count(*) FROM lease_requests WHERE worker = ?1");
  if (s == NULL)
    return store_fail(st, f, "lease request records");
  sqlite3_bind_int64(s, 1, worker);
  int64_t rows = sqlite3_step(s) == SQLITE_ROW ? sqlite3_column_int64(s, 0) : -1;
  store_reset(s);
  if (rows < 0)
    return store_fail(st, f, "lease request records");
  if (rows <= LEASE_RETRY_MAX_STREAMS)
    return MUSTER_OK;
  s = store_stmt(st, "DELETE FROM lease_requests WHERE worker = ?1 AND stream IN"
                     " (SELECT stream FROM lease_requests WHERE worker = ?1"
                     " ORDER BY last_token LIMIT ?2)");
  if (s == NULL)
    return store_fail(st, f, "lease request records");
  sqlite3_bind_int64(s, 1, worker);
  sqlite3_bind_int64(s, 2, rows - LEASE_RETRY_MAX_STREAMS);
  log_msg(LOG_DEBUG, "lease: worker %lld has keys of more than %d streams: the oldest goes",
          (long long)worker, LEASE_RETRY_MAX_STREAMS);
  return store_step_done(st, s, f);
}

/* Records `r`'s key as its stream's for `worker`, with the tokens after
 * `before` up to the last one drawn: the leases the request just made. */
static muster_err_t lease_retry_record(store_t *st, int64_t worker, const lease_retry_t *r,
                                       int64_t before, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "INSERT OR REPLACE INTO lease_requests(worker, stream,"
                                   " request, first_token, last_token) VALUES(?1, ?2, ?3, ?4, ?5)");
  if (s == NULL)
    return store_fail(st, f, "lease request record");
  sqlite3_bind_int64(s, 1, worker);
  sqlite3_bind_text(s, 2, r->request, (int)r->stream_len, SQLITE_TRANSIENT);
  store_bind_text(s, 3, r->request);
  sqlite3_bind_int64(s, 4, before + 1);
  sqlite3_bind_int64(s, 5, store_last_token(st));
  if (store_step_done(st, s, f))
    return f->code;
  return r->recorded ? MUSTER_OK : lease_retry_bound(st, worker, f);
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

/* Appends the answer to a repeat to `out`: the array of the leases of its
 * first request still held, *count of them; nothing, and *count 0, when
 * none is.  MUSTER_OK, or the failure with *f filled (*count 0). */
static muster_err_t lease_retry_answer(store_t *st, const queue_t *q, int64_t worker,
                                       const lease_retry_t *r, jw_buf_t *out, size_t *count,
                                       int64_t *max_task, fail_t *f) {
  size_t at = out->len;
  *count = 0;
  JW_ADD_LITERAL(out, "[");
  if (lease_retry_extend(st, q, worker, r, f) ||
      lease_retry_write(st, q, worker, r, out, count, max_task, f)) {
    *count = 0;
    return f->code;
  }
  if (*count == 0) {
    out->len = at; /* a lease anew follows */
    return MUSTER_OK;
  }
  JW_ADD_LITERAL(out, "]");
  if (out->failed) {
    *count = 0;
    return fail_set(f, MUSTER_NOMEM, "out of memory");
  }
  log_msg(LOG_INFO,
          "lease: worker %lld sent lease request %s again: answered with the %zu lease(s) it "
          "made",
          (long long)worker, r->request, *count);
  return MUSTER_OK;
}

muster_err_t lease_acquire_retry_text(store_t *st, const queue_t *q, int64_t worker, int64_t max,
                                      const lease_retry_t *r, jw_buf_t *out, size_t *count,
                                      int64_t *max_task, fail_t *f) {
  bool keyed = r && r->request && worker > 0;
  if (keyed && r->repeat) {
    int64_t highest = 0;
    muster_err_t err = lease_retry_answer(st, q, worker, r, out, count, &highest, f);
    if (max_task)
      *max_task = highest;
    if (err || *count > 0)
      return err;
  }
  int64_t before = store_last_token(st);
  if (lease_acquire_text(st, q, worker, max, out, count, max_task, f))
    return f->code;
  if (keyed && *count > 0 && lease_retry_record(st, worker, r, before, f)) {
    *count = 0;
    return f->code;
  }
  return MUSTER_OK;
}

muster_err_t lease_reply_text(store_t *st, const queue_t *q, int64_t worker, int64_t max,
                              const lease_retry_t *r, int64_t updates_after, jw_buf_t *out,
                              lease_reply_counts_t *n, fail_t *f) {
  *n = (lease_reply_counts_t){0};
  JW_ADD_LITERAL(out, "\"leases\":");
  if (lease_acquire_retry_text(st, q, worker, max, r, out, &n->leased, &n->max_task, f))
    return f->code;
  if (updates_after >= 0)
    return update_attach_text(st, q->name, updates_after, out, &n->updates, f);
  return MUSTER_OK;
}

muster_err_t lease_retry_forget(store_t *st, int64_t worker, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "DELETE FROM lease_requests WHERE worker = ?1");
  if (s == NULL)
    return store_fail(st, f, "lease request records");
  sqlite3_bind_int64(s, 1, worker);
  return store_step_done(st, s, f);
}
