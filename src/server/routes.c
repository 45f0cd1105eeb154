/*
 * routes.c — the route table and the handlers.
 *
 * Each handler parses and validates what the route layer did not (path ids,
 * query, body fields), calls one domain function, and formats the reply.
 * Domain code (queue.c, task.c, lease.c, worker.c) never sees HTTP.
 */
#include "backup.h"
#include "compat.h"
#include "compat_jobs.h"
#include "core/names.h"
#include "dashboard.h"
#include "http.h"
#include "iter.h"
#include "jv.h"
#include "lease.h"
#include "lease_retry.h"
#include "log.h"
#include "queue.h"
#include "queue_reap.h"
#include "reaper.h"
#include "routes_pool.h"
#include "shared_routes.h"
#include "store_schema.h"
#include "task.h"
#include "update.h"
#include "waiter.h"
#include "worker.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ST(r) ((r)->head->st)

/* Replies with `value` (stolen) and `status`, or with *f's error when NULL. */
static void reply_or_fail(http_req_t *r, int status, json_t *value, const fail_t *f) {
  if (value)
    http_reply_json(r, status, value);
  else
    http_reply_fail(r, f);
}

/* Replies with the JSON text `text` holds (taken) and `status` when `err`
 * is MUSTER_OK, else with *f's error (the text freed). */
static void reply_text_or_fail(http_req_t *r, int status, muster_err_t err, jw_buf_t *text,
                               const fail_t *f) {
  if (err == MUSTER_OK) {
    http_reply_text(r, status, text);
    return;
  }
  jw_buf_free(text);
  http_reply_fail(r, f);
}

/* The schema is the data dir's (every migration this binary has): with the
 * version, what an operator checks after an upgrade (operations.md). */
static void h_health(http_req_t *r) {
  http_reply_json(r, 200,
                  json_pack("{s:s, s:s, s:i, s:I, s:I}", "status", "ok", "version", MUSTER_VERSION,
                            "schema", store_migration_count, "uptime_ms",
                            (json_int_t)(now_ms() - r->head->started_ms), "max_wait_ms",
                            (json_int_t)r->head->cfg.max_wait_ms));
}

/* ---- queues ---- */

static void h_queue_list(http_req_t *r) {
  fail_t f = {0};
  reply_or_fail(r, 200, queue_list(ST(r), &f), &f);
}

static void h_queue_put(http_req_t *r) {
  fail_t f = {0};
  bool created = false;
  queue_t q;
  if (queue_put(ST(r), r->params[0], r->body, &created, &f) ||
      queue_load(ST(r), r->params[0], &q, &f)) {
    http_reply_fail(r, &f);
    return;
  }
  http_reply_json(r, created ? 201 : 200, queue_to_json(ST(r), &q));
}

/* `?ready=true` adds counts.ready, the queued tasks leasable now; opt-in,
 * as it reads up to QUEUE_READY_SCAN tasks (queue_count_ready). */
static void h_queue_get(http_req_t *r) {
  fail_t f = {0};
  queue_t q;
  int64_t ready = 0;
  const char *with_ready = http_query(r, "ready");
  bool count_ready = with_ready && strcmp(with_ready, "true") == 0;
  if (with_ready && !count_ready && strcmp(with_ready, "false") != 0) {
    fail_set(&f, MUSTER_INVALID, "query ready: '%.40s' is not true or false", with_ready);
    http_reply_fail(r, &f);
    return;
  }
  if (queue_load(ST(r), r->params[0], &q, &f) ||
      (count_ready && queue_count_ready(ST(r), q.name, &ready, &f))) {
    http_reply_fail(r, &f);
    return;
  }
  json_t *out = queue_to_json(ST(r), &q);
  if (out && count_ready)
    json_object_set_new(json_object_get(out, "counts"), "ready", json_integer(ready));
  if (out == NULL)
    store_fail(ST(r), &f, "queue counts");
  reply_or_fail(r, 200, out, &f);
}

/* A big queue's tasks go in the background: the reply waits for them. */
static void h_queue_delete(http_req_t *r) {
  fail_t f = {0};
  int64_t tasks = 0, sessions = 0;
  bool pending = false;
  if (queue_delete(ST(r), r->params[0], &tasks, &sessions, &pending, &f))
    http_reply_fail(r, &f);
  else if (pending)
    reaper_park_delete(r, r->params[0], tasks, sessions);
  else
    http_reply_json(r, 200,
                    json_pack("{s:s, s:I, s:I}", "deleted", r->params[0], "tasks",
                              (json_int_t)tasks, "sessions_closed", (json_int_t)sessions));
  if (store_sessions_closing(ST(r))) /* a closed session left tasks in other queues */
    reaper_wake(r->head);
}

/* The first chunk now; more go on in the background, and the reply waits. */
static void h_queue_purge(http_req_t *r) {
  fail_t f = {0};
  int64_t n = 0, horizon = queue_purge_horizon(ST(r));
  bool finished = false;
  if (queue_purge_chunk(ST(r), r->params[0], horizon, QUEUE_CHUNK, &n, &finished, &f))
    http_reply_fail(r, &f);
  else if (!finished)
    reaper_park_purge(r, r->params[0], horizon, n);
  else
    http_reply_json(r, 200, json_pack("{s:I}", "purged", (json_int_t)n));
}

static void h_queue_requeue(http_req_t *r) {
  fail_t f = {0};
  int64_t n = 0;
  if (queue_requeue(ST(r), r->params[0], &n, &f))
    http_reply_fail(r, &f);
  else
    http_reply_json(r, 200, json_pack("{s:I}", "requeued", (json_int_t)n));
}

/* ---- tasks ---- */

/* A put's body is read from its text when it has the common shape (jscan.h),
 * parsed into a tree otherwise; first, so that a bad body is refused before
 * the queue is looked up, as when the route layer parsed it. */
static void h_tasks_put(http_req_t *r) {
  fail_t f = {0};
  queue_t q;
  size_t max_payload = r->head->cfg.max_payload;
  jscan_body_t scanned;
  bool fast = jscan_body(&task_put_shape, r->body_text, r->body_len, max_payload, &scanned);
  if (!fast && http_body(r) == NULL)
    return;
  if (queue_load(ST(r), r->params[0], &q, &f))
    http_reply_fail(r, &f);
  else if (fast)
    reply_or_fail(r, 201, task_put_scanned(ST(r), q.name, &scanned, &f), &f);
  else
    reply_or_fail(r, 201, task_put(ST(r), q.name, r->body, max_payload, &f), &f);
  jscan_body_free(&scanned);
}

/* Parses an optional integer query parameter in [min, max]. */
static bool query_int(http_req_t *r, const char *key, int64_t dflt, int64_t min, int64_t max,
                      int64_t *out, fail_t *f) {
  return query_int_read(http_query(r, key), key, dflt, min, max, out, f) == MUSTER_OK;
}

/* Reads the query's `order` into *recent: `id` (the default) pages by id,
 * `recent` gives the newest failed or dead tasks, by when they got there, in
 * one page (task_list_recent_text), so it takes state failed or dead and no
 * `after`. */
static muster_err_t query_order(http_req_t *r, int state, bool *recent, fail_t *f) {
  const char *order = http_query(r, "order");
  *recent = order && strcmp(order, "recent") == 0;
  if (order && !*recent && strcmp(order, "id") != 0)
    return fail_set(f, MUSTER_INVALID, "query order: '%.40s' is not id or recent", order);
  if (*recent && state != TASK_FAILED && state != TASK_DEAD)
    return fail_set(f, MUSTER_INVALID,
                    "query order: recent lists failed or dead tasks; add state=failed or "
                    "state=dead");
  if (*recent && http_query(r, "after"))
    return fail_set(f, MUSTER_INVALID,
                    "query after: order=recent gives one page, the newest tasks; after pages "
                    "by id (order=id)");
  return MUSTER_OK;
}

static void h_tasks_list(http_req_t *r) {
  fail_t f = {0};
  queue_t q;
  int64_t after, limit;
  bool recent;
  const char *state_name = http_query(r, "state");
  const char *brief = http_query(r, "brief");
  int state = state_name ? task_state_parse(state_name) : -1;
  if (state_name && state < 0)
    fail_set(&f, MUSTER_INVALID,
             "query state: '%.40s' is not one of queued, leased, done, failed, dead, cancelled",
             state_name);
  else if (brief && strcmp(brief, "true") != 0 && strcmp(brief, "false") != 0)
    fail_set(&f, MUSTER_INVALID, "query brief: '%.40s' is not true or false", brief);
  else if (query_order(r, state, &recent, &f) == MUSTER_OK &&
           query_int(r, "after", 0, 0, INT64_MAX, &after, &f) &&
           query_int(r, "limit", 100, 1, TASK_MAX_BATCH, &limit, &f) &&
           !queue_load(ST(r), r->params[0], &q, &f)) {
    bool leave_out = brief && strcmp(brief, "true") == 0;
    jw_buf_t page = {0};
    muster_err_t err =
        recent ? task_list_recent_text(ST(r), q.name, state, limit, leave_out, &page, &f)
               : task_list_text(ST(r), q.name, state, after, limit, leave_out, &page, &f);
    reply_text_or_fail(r, 200, err, &page, &f);
    return;
  }
  http_reply_fail(r, &f);
}

/* The task id of the path, or 0 with a 400 reply set. */
static int64_t path_id(http_req_t *r, const char *what) {
  int64_t id = http_param_id(r->params[0]);
  if (id == 0) {
    fail_t f;
    fail_set(&f, MUSTER_BAD_REQUEST, "'%.40s' is not a %s id (a positive integer)", r->params[0],
             what);
    http_reply_fail(r, &f);
  }
  return id;
}

static void h_task_get(http_req_t *r) {
  fail_t f = {0};
  int64_t id = path_id(r, "task");
  if (id)
    reply_or_fail(r, 200, task_get(ST(r), id, &f), &f);
}

static void h_task_requeue(http_req_t *r) {
  fail_t f = {0};
  int64_t id = path_id(r, "task");
  if (id)
    reply_or_fail(r, 200, task_requeue(ST(r), id, &f), &f);
}

/* ---- leases ---- */

/* A lease request's body, read and checked. */
typedef struct {
  int64_t worker, max, wait_ms, updates_after;
  lease_retry_t retry; /* its key ("request") and what the head recorded under it */
} lease_args_t;

/* Reads a lease request's body and loads its queue; false with the reply
 * sent.  max is 1 to LEASE_MAX_BATCH; above, it is a batch too large (413). */
static bool lease_args(http_req_t *r, lease_args_t *a, queue_t *q) {
  static const char *const allowed[] = {"worker",        "max",     "wait_ms",
                                        "updates_after", "request", NULL};
  fail_t f = {0};
  char range[64];
  if (jv_only(r->body, "", allowed, &f) ||
      jv_int(r->body, "worker", "", 0, 1, JV_ID_MAX, &a->worker, &f) ||
      jv_int(r->body, "max", "", 1, INT64_MIN, INT64_MAX, &a->max, &f) ||
      (a->max < 1 &&
       fail_set(&f, MUSTER_INVALID, "max: %lld is out of range; it must be %s", (long long)a->max,
                fail_range(range, sizeof range, a->max, 1, LEASE_MAX_BATCH))) ||
      jv_int(r->body, "wait_ms", "", 0, 0, INT64_MAX, &a->wait_ms, &f) ||
      jv_int(r->body, "updates_after", "", -1, 0, INT64_MAX, &a->updates_after, &f) ||
      lease_retry_parse(r->body, "", a->worker, &a->retry, &f) ||
      queue_load(ST(r), r->params[0], q, &f) ||
      (a->worker && lease_retry_check(ST(r), a->worker, &a->retry, &f))) {
    http_reply_fail(r, &f);
    return false;
  }
  if (a->max > LEASE_MAX_BATCH) {
    fail_set(&f, MUSTER_BATCH_TOO_LARGE, "max: %lld is out of range; it must be %s",
             (long long)a->max, fail_range(range, sizeof range, a->max, 1, LEASE_MAX_BATCH));
    http_reply_fail(r, &f);
    return false;
  }
  return true;
}

static void h_lease(http_req_t *r) {
  lease_args_t a;
  queue_t q;
  if (!lease_args(r, &a, &q))
    return;
  fail_t f = {0};
  lease_reply_counts_t n;
  jw_buf_t text = {0};
  JW_ADD_LITERAL(&text, "{");
  muster_err_t err =
      lease_reply_text(ST(r), &q, a.worker, a.max, &a.retry, a.updates_after, &text, &n, &f);
  JW_ADD_LITERAL(&text, "}");
  bool ok = err == MUSTER_OK;
  if (ok && n.leased == 0 && n.updates == 0 && a.wait_ms > 0 && !r->head->stopping) {
    jw_buf_free(&text);
    int64_t cap = r->head->cfg.max_wait_ms;
    waiter_park(r, q.name, a.worker, a.max, a.updates_after, a.retry.request,
                a.wait_ms < cap ? a.wait_ms : cap);
    return;
  }
  /* Leases of tasks already on disk need their commit, not a flush of their own;
   * updates are data, which may not be on disk yet (head_lease_on_disk). */
  r->no_flush = ok && n.leased > 0 && n.updates == 0 && head_lease_on_disk(r->head, n.max_task);
  reply_text_or_fail(r, 200, err, &text, &f);
}

static void h_lease_op(http_req_t *r, lease_op_t op) {
  fail_t f = {0};
  reply_or_fail(r, 200, lease_apply(ST(r), op, r->body, r->head->cfg.max_payload, &f), &f);
}

/* The combined call's "lease" object, parsed: what to lease after the
 * completions, and from which update on to deliver broadcast updates. */
typedef struct {
  queue_t q;             /* the queue to lease from (loaded: it exists) */
  int64_t worker;        /* 0: anonymous */
  int64_t max;           /* 1 to LEASE_MAX_BATCH */
  int64_t updates_after; /* -1: no updates wanted */
  lease_retry_t retry;   /* its key ("request") and what the head recorded under it */
} next_lease_t;

/* Validates the "lease" object `next` into *out: the fields of a plain lease
 * that make sense without a wait, the queue loaded and the worker active.
 * Returns MUSTER_OK or the error with *f filled (nothing changed). */
static muster_err_t next_lease_parse(http_req_t *r, const json_t *next, next_lease_t *out,
                                     fail_t *f) {
  static const char *const allowed[] = {"queue", "max", "worker", "updates_after", "request", NULL};
  const char *name = NULL;
  if (!json_is_object(next))
    return fail_set(
        f, MUSTER_INVALID,
        "lease: expected an object {\"queue\", \"max\", \"worker\", \"updates_after\"}");
  /* Parking would hold the completions' acknowledgement back for the whole
   * wait, and a parked reply has no "completed": refuse rather than ignore. */
  if (json_object_get(next, "wait_ms") != NULL)
    return fail_set(f, MUSTER_INVALID,
                    "lease.wait_ms: the combined call never waits; when it leases nothing, "
                    "long-poll with POST /v1/queues/{queue}/lease");
  if (jv_only(next, "lease", allowed, f) ||
      jv_str(next, "queue", "lease", NULL, NAME_MAX_LEN, &name, f) ||
      jv_int(next, "max", "lease", 1, 1, LEASE_MAX_BATCH, &out->max, f) ||
      jv_int(next, "worker", "lease", 0, 1, JV_ID_MAX, &out->worker, f) ||
      jv_int(next, "updates_after", "lease", -1, 0, INT64_MAX, &out->updates_after, f) ||
      lease_retry_parse(next, "lease", out->worker, &out->retry, f))
    return f->code;
  if (name == NULL)
    return fail_set(f, MUSTER_INVALID, "lease.queue: missing");
  if (queue_load(ST(r), name, &out->q, f) ||
      (out->worker && lease_retry_check(ST(r), out->worker, &out->retry, f)))
    return f->code;
  return MUSTER_OK;
}

/* Replies to a combined call with `done`, the completions' reply (lease_apply's
 * {"completed": [...]}, consumed; NULL: they failed, *f set), and the leases
 * (and, when asked for, "updates" and "updates_last") of `next` after it, as
 * a plain lease would give them: all written as the reply's text. */
static void complete_and_lease(http_req_t *r, json_t *done, const next_lease_t *next, fail_t *f) {
  jw_buf_t text = {0};
  muster_err_t err = f->code;
  if (done) {
    lease_reply_counts_t n;
    JW_ADD_LITERAL(&text, "{\"completed\":");
    jw_add_value(&text, json_object_get(done, "completed"));
    JW_ADD_LITERAL(&text, ",");
    err = lease_reply_text(ST(r), &next->q, next->worker, next->max, &next->retry,
                           next->updates_after, &text, &n, f);
    JW_ADD_LITERAL(&text, "}");
    json_decref(done);
  }
  reply_text_or_fail(r, 200, err, &text, f);
}

/*
 * Complete, and with a "lease" object in the body, lease the next tasks in the
 * same request and transaction: {"leases": [...], "lease": {"queue": "q",
 * "max": 1, "worker": 3, "updates_after": 7}} replies {"completed": [...],
 * "leases": [...], "updates": [...], "updates_last": 9} (the update fields
 * only with updates_after).  A worker's steady state is then one round trip
 * (and one commit) per task.  It never waits: an empty "leases" means nothing
 * was ready.  Any failure, whether of a completion, of the lease or of the
 * updates, rolls back the whole request.
 */
static void h_complete_tree(http_req_t *r) {
  const json_t *next = json_object_get(r->body, "lease");
  if (next == NULL) {
    h_lease_op(r, LEASE_COMPLETE);
    return;
  }
  fail_t f = {0};
  next_lease_t lease;
  if (next_lease_parse(r, next, &lease, &f)) {
    http_reply_fail(r, &f);
    return;
  }
  /* lease_apply accepts only "leases": hand it the body without "lease". */
  json_t *body = json_copy(r->body), *done = NULL;
  if (body == NULL || json_object_del(body, "lease") != 0)
    fail_set(&f, MUSTER_NOMEM, "out of memory");
  else
    done = lease_apply(ST(r), LEASE_COMPLETE, body, r->head->cfg.max_payload, &f);
  json_decref(body);
  complete_and_lease(r, done, &lease, &f);
}

/* h_complete_tree for a body the scanner read: the "lease" object, kept as
 * canonical text, is parsed alone (it is small) and checked first. */
static void h_complete_scanned(http_req_t *r, const jscan_body_t *scanned) {
  fail_t f = {0};
  next_lease_t lease = {0};
  json_t *next = NULL, *done = NULL;
  if (scanned->extra) {
    next = json_loadb(scanned->extra, scanned->extra_len,
                      JSON_DECODE_ANY | JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, NULL);
    if (next == NULL)
      fail_set(&f, MUSTER_NOMEM, "out of memory"); /* the text is valid JSON */
  }
  if (f.code == MUSTER_OK && (next == NULL || !next_lease_parse(r, next, &lease, &f)))
    done = lease_complete_scanned(ST(r), scanned, r->head->cfg.max_payload, &f);
  if (next && f.code == MUSTER_OK)
    complete_and_lease(r, done, &lease, &f);
  else
    reply_or_fail(r, 200, done, &f);
  json_decref(next);
}

/* The body is read from its text when it has the common shape (jscan.h),
 * parsed into a tree otherwise. */
static void h_complete(http_req_t *r) {
  jscan_body_t scanned;
  if (jscan_body(&lease_complete_shape, r->body_text, r->body_len, r->head->cfg.max_payload,
                 &scanned)) {
    h_complete_scanned(r, &scanned);
    jscan_body_free(&scanned);
  } else if (http_body(r)) {
    h_complete_tree(r);
  }
}

static void h_fail(http_req_t *r) {
  h_lease_op(r, LEASE_FAIL);
}
static void h_extend(http_req_t *r) {
  h_lease_op(r, LEASE_EXTEND);
}
static void h_release(http_req_t *r) {
  h_lease_op(r, LEASE_RELEASE);
}
static void h_flag(http_req_t *r) {
  h_lease_op(r, LEASE_FLAG);
}

/* ---- workers ---- */

static void h_worker_register(http_req_t *r) {
  fail_t f = {0};
  json_t *out = worker_register(ST(r), r->body, r->head->cfg.worker_timeout_ms, &f);
  reply_or_fail(r, json_object_get(out, "repeated") ? 200 : 201, out, &f);
}

static void h_worker_list(http_req_t *r) {
  fail_t f = {0};
  reply_or_fail(r, 200, worker_list(ST(r), &f), &f);
}

static void h_worker_get(http_req_t *r) {
  fail_t f = {0};
  int64_t id = path_id(r, "worker");
  if (id)
    reply_or_fail(r, 200, worker_get(ST(r), id, &f), &f);
}

static void h_worker_heartbeat(http_req_t *r) {
  fail_t f = {0};
  int64_t id = path_id(r, "worker");
  if (id)
    reply_or_fail(r, 200, worker_heartbeat(ST(r), id, r->body, &f), &f);
}

/* Reads the query's `crashed` (true, false, absent: false) into *crashed. */
static muster_err_t query_crashed(http_req_t *r, bool *crashed, fail_t *f) {
  const char *text = http_query(r, "crashed");
  *crashed = text && strcmp(text, "true") == 0;
  if (text && !*crashed && strcmp(text, "false") != 0)
    return fail_set(f, MUSTER_INVALID, "query crashed: '%.40s' is not true or false", text);
  return MUSTER_OK;
}

static void h_worker_bye(http_req_t *r) {
  fail_t f = {0};
  bool crashed;
  if (query_crashed(r, &crashed, &f)) {
    http_reply_fail(r, &f);
    return;
  }
  int64_t id = path_id(r, "worker");
  if (id)
    reply_or_fail(r, 200, worker_leave(ST(r), id, crashed, &f), &f);
}

/* DELETE /v1/workers/instance/{instance}: the goodbye, or with crashed=true
 * the crash report, of the worker that a registration with that instance
 * made, for a node agent whose worker process died before it told the agent
 * its id.  None active is no error (the process may have died before it
 * registered).  Either way the instance is remembered, and its registration
 * coming later is refused (worker_ended.c). */
static void h_worker_bye_instance(http_req_t *r) {
  fail_t f = {0};
  bool crashed;
  const char *instance = r->params[0];
  if (!name_is_valid(instance))
    fail_set(&f, MUSTER_INVALID, "instance '%.140s' is invalid: %s", instance ? instance : "",
             name_rule_text(instance));
  if (f.code || query_crashed(r, &crashed, &f)) {
    http_reply_fail(r, &f);
    return;
  }
  reply_or_fail(r, 200, worker_leave_instance(ST(r), instance, crashed, &f), &f);
}

static void h_leaderboard(http_req_t *r) {
  fail_t f = {0};
  reply_or_fail(r, 200, worker_leaderboard(ST(r), &f), &f);
}

const http_route_t http_routes[] = {
    {"GET", "/v1/health", h_health, false, 0, 0},
    {"GET", "/v1/queues", h_queue_list, true, 0, 0},
    {"PUT", "/v1/queues/{}", h_queue_put, true, 0, HTTP_QUEUE_NAME},
    {"GET", "/v1/queues/{}", h_queue_get, true, 0, HTTP_QUEUE_NAME},
    {"DELETE", "/v1/queues/{}", h_queue_delete, true, 0, HTTP_QUEUE_NAME | HTTP_NO_FIELDS},
    {"POST", "/v1/queues/{}/purge", h_queue_purge, true, 0, HTTP_QUEUE_NAME | HTTP_NO_FIELDS},
    {"POST", "/v1/queues/{}/requeue", h_queue_requeue, true, 0, HTTP_QUEUE_NAME | HTTP_NO_FIELDS},
    {"POST", "/v1/queues/{}/tasks", h_tasks_put, true, 0, HTTP_BODY_TEXT | HTTP_QUEUE_NAME},
    {"GET", "/v1/queues/{}/tasks", h_tasks_list, true, 0, HTTP_QUEUE_NAME},
    {"POST", "/v1/queues/{}/lease", h_lease, true, 0, HTTP_QUEUE_NAME},
    {"GET", "/v1/tasks/{}", h_task_get, true, 0, 0},
    {"POST", "/v1/tasks/{}/requeue", h_task_requeue, true, 0, HTTP_NO_FIELDS},
    {"POST", "/v1/leases/complete", h_complete, true, 0, HTTP_BODY_TEXT},
    {"POST", "/v1/leases/fail", h_fail, true, 0, 0},
    {"POST", "/v1/leases/extend", h_extend, true, 0, 0},
    {"POST", "/v1/leases/release", h_release, true, 0, 0},
    {"POST", "/v1/leases/flag", h_flag, true, 0, 0},
    {"POST", "/v1/workers", h_worker_register, true, 0, 0},
    {"GET", "/v1/workers", h_worker_list, true, 0, 0},
    {"GET", "/v1/workers/{}", h_worker_get, true, 0, 0},
    {"POST", "/v1/workers/{}/heartbeat", h_worker_heartbeat, true, 0, 0},
    {"DELETE", "/v1/workers/{}", h_worker_bye, true, 0, HTTP_NO_FIELDS},
    {"DELETE", "/v1/workers/instance/{}", h_worker_bye_instance, true, 0, HTTP_NO_FIELDS},
    {"GET", "/v1/leaderboard", h_leaderboard, true, 0, 0},
    {"POST", "/v1/iterations", iter_h_create, true, 0, 0},
    {"GET", "/v1/iterations", iter_h_list, true, 0, 0},
    {"GET", "/v1/iterations/{}", iter_h_get, true, 0, 0},
    {"DELETE", "/v1/iterations/{}", iter_h_delete, true, 0, HTTP_NO_FIELDS},
    {"GET", "/v1/iterations/{}/checkpoint", iter_h_checkpoint, true, 0, 0},
    {"POST", "/v1/iterations/{}/next", iter_h_next, true, 0, 0},
    {"POST", "/v1/iterations/{}/ack", iter_h_ack, true, 0, 0},
    {"POST", "/v1/iterations/{}/heartbeat", iter_h_heartbeat, true, 0, 0},
    {"GET", "/v1/iterations/{}/held", iter_h_held, true, 0, 0},
    /* Dashboard, metrics and DistCompute compatibility (dashboard.c, compat.c). */
    {"GET", "/", dashboard_h_index, HTTP_PUBLIC, 0, 0},
    {"GET", "/dashboard/{}", dashboard_h_asset, HTTP_PUBLIC, 0, 0},
    {"GET", "/metrics", dashboard_h_metrics, HTTP_PUBLIC, 0, 0}, /* checks the token itself */
    {"GET", "/v1/throughput", dashboard_h_throughput, HTTP_READ, 0, 0},
    {"GET", "/v1/distcompute", compat_h_pipelines, HTTP_READ, 0, 0},
    {"POST", "/v1/distcompute/jobs", compat_h_job_number, true, 0, 0},
    {"GET", "/compat/distcompute/{}", dashboard_h_compat_page, HTTP_PUBLIC, 0, 0},
    {"GET", "/compat/distcompute/{}/{}", dashboard_h_compat_page, HTTP_PUBLIC, 0, 0},
    {"GET", "/compat/distcompute/{}/worker/{}/{}", dashboard_h_compat_worker, HTTP_PUBLIC, 0, 0},
    {"GET", "/compat/distcompute/{}/api/new", compat_h_new, HTTP_PUBLIC, 0, 0},
    {"POST", "/compat/distcompute/{}/api/newJob", compat_h_new_job, HTTP_PUBLIC, 0, 0},
    {"GET", "/compat/distcompute/{}/api/jobCount", compat_h_job_count, HTTP_PUBLIC, 0, 0},
    {"POST", "/compat/distcompute/{}/api/updateProgress", compat_h_update_progress, HTTP_PUBLIC, 0,
     0},
    {"POST", "/compat/distcompute/{}/api/completeJob", compat_h_complete_job, HTTP_PUBLIC, 0, 0},
    {"POST", "/compat/distcompute/{}/api/flagInvalidData", compat_h_flag_invalid, HTTP_PUBLIC, 0,
     0},
    {"POST", "/compat/distcompute/{}/api/bye", compat_h_bye, HTTP_PUBLIC, 0, 0},
    {"POST", "/compat/distcompute/{}/api/validateWorker", compat_h_validate_worker, HTTP_PUBLIC, 0,
     0},
    {"GET", "/api/{}", compat_h_root_api, HTTP_PUBLIC, 0, 0},
    {"POST", "/api/{}", compat_h_root_api, HTTP_PUBLIC, 0, 0},
    {"POST", "/v1/nodes", route_node_register, true, 0, 0},
    {"GET", "/v1/nodes", route_node_list, true, 0, 0},
    {"GET", "/v1/nodes/{}", route_node_get, true, 0, 0},
    {"DELETE", "/v1/nodes/{}", route_node_leave, true, 0, HTTP_NO_FIELDS},
    {"POST", "/v1/nodes/{}/heartbeat", route_node_heartbeat, true, 0, 0},
    {"POST", "/v1/sessions", route_session_create, true, 0, 0},
    {"GET", "/v1/sessions", route_session_list, true, 0, 0},
    {"GET", "/v1/sessions/{}", route_session_get, true, 0, 0},
    {"DELETE", "/v1/sessions/{}", route_session_close, true, 0, HTTP_NO_FIELDS},
    {"POST", "/v1/sessions/{}/heartbeat", route_session_heartbeat, true, 0, 0},
    {"POST", "/v1/sessions/{}/seal", route_session_seal, true, 0, HTTP_NO_FIELDS},
    {"POST", "/v1/sessions/{}/tasks", route_session_submit, true, 0, HTTP_BODY_TEXT},
    {"GET", "/v1/sessions/{}/results", route_session_results, true, 0, 0},
    {"POST", "/v1/queues/{}/updates", route_update_post, true, 0, HTTP_QUEUE_NAME},
    {"GET", "/v1/queues/{}/updates", route_update_list, true, 0, HTTP_QUEUE_NAME},
    /* Shared data (shared_routes.c); a PUT's body is streamed, not buffered. */
    {"PUT", "/v1/shared/{}/{}", shared_h_put, true, 0, 0},
    {"GET", "/v1/shared/{}/{}", shared_h_get, true, 0, 0},
    {"DELETE", "/v1/shared/{}/{}", shared_h_delete, true, 0, HTTP_NO_FIELDS},
    {"GET", "/v1/shared/{}", shared_h_list, true, 0, 0},
    {"POST", "/v1/backup", backup_h_create, HTTP_ADMIN, 0, 0},
    {NULL, NULL, NULL, false, 0, 0},
};
