/*
 * routes_pool.c — handlers for /v1/nodes, /v1/sessions and
 * /v1/queues/{queue}/updates, and the long-poll of session results.
 *
 * Handlers parse the path and query, call one domain function (node.c,
 * session.c, update.c) and format the reply, as in routes.c.  A results read
 * that finds nothing and may wait is parked here: a task of the session that
 * finishes (store_notify_session) marks its readers, and before the turn
 * commits results_waiters_serve reads again for them, so the wake-up shares
 * the completion's commit.  A reader parked at a gap of the submission
 * order (session_results.c) is answered, empty, once the stream stalls
 * there.  Readers are few (one per client stream): a list.
 */
#include "routes_pool.h"
#include "log.h"
#include "node.h"
#include "reaper.h"
#include "session.h"
#include "update.h"

#include <event2/event.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ST(r) ((r)->head->st)

struct results_waiter {
  results_waiter_t *next, *prev;
  head_t *head;
  h1_req_t *req;
  struct event *timer;
  char session[SESSION_ID_LEN + 1];
  session_order_t order;
  int64_t cursor, max;
  bool due; /* a task of the session finished since the last read */
};

static void reply_or_fail(http_req_t *r, int status, json_t *value, const fail_t *f) {
  if (value)
    http_reply_json(r, status, value);
  else
    http_reply_fail(r, f);
}

/* Parses an optional integer query parameter in [min, max]. */
static muster_err_t query_int(http_req_t *r, const char *key, int64_t dflt, int64_t min,
                              int64_t max, int64_t *out, fail_t *f) {
  return query_int_read(http_query(r, key), key, dflt, min, max, out, f);
}

/* ---- nodes ---- */

void route_node_register(http_req_t *r) {
  fail_t f = {0};
  bool created = false;
  json_t *node = node_register(ST(r), r->body, r->head->cfg.node_timeout_ms, &created, &f);
  reply_or_fail(r, created ? 201 : 200, node, &f);
}

void route_node_list(http_req_t *r) {
  fail_t f = {0};
  reply_or_fail(r, 200, node_list(ST(r), &f), &f);
}

void route_node_get(http_req_t *r) {
  fail_t f = {0};
  reply_or_fail(r, 200, node_get(ST(r), r->params[0], &f), &f);
}

void route_node_heartbeat(http_req_t *r) {
  fail_t f = {0};
  reply_or_fail(r, 200, node_heartbeat(ST(r), r->params[0], r->body, &f), &f);
}

void route_node_leave(http_req_t *r) {
  fail_t f = {0};
  reply_or_fail(r, 200, node_leave(ST(r), r->params[0], &f), &f);
}

/* ---- sessions ---- */

void route_session_create(http_req_t *r) {
  fail_t f = {0};
  reply_or_fail(r, 201, session_create(ST(r), r->body, r->head->cfg.max_payload, &f), &f);
}

void route_session_list(http_req_t *r) {
  fail_t f = {0};
  reply_or_fail(r, 200, session_list(ST(r), &f), &f);
}

void route_session_get(http_req_t *r) {
  fail_t f = {0};
  reply_or_fail(r, 200, session_get(ST(r), r->params[0], &f), &f);
}

void route_session_heartbeat(http_req_t *r) {
  fail_t f = {0};
  reply_or_fail(r, 200, session_heartbeat(ST(r), r->params[0], r->body, &f), &f);
}

/* Read from the body's text when it has the common shape (jscan.h), as a
 * put's body is; any other body is parsed into a tree. */
void route_session_submit(http_req_t *r) {
  fail_t f = {0};
  size_t max_payload = r->head->cfg.max_payload;
  jscan_body_t scanned;
  json_t *out = NULL;
  bool parsed = true;
  if (jscan_body(&session_submit_shape, r->body_text, r->body_len, max_payload, &scanned))
    out = session_submit_scanned(ST(r), r->params[0], &scanned, &f);
  else if ((parsed = http_body(r) != NULL))
    out = session_submit(ST(r), r->params[0], r->body, max_payload, &f);
  if (parsed) /* a repeat stored nothing: 200 */
    reply_or_fail(r, json_is_true(json_object_get(out, "repeated")) ? 200 : 201, out, &f);
  jscan_body_free(&scanned);
}

void route_session_seal(http_req_t *r) {
  fail_t f = {0};
  reply_or_fail(r, 200, session_seal(ST(r), r->params[0], r->body, &f), &f);
}

void route_session_close(http_req_t *r) {
  fail_t f = {0};
  reply_or_fail(r, 200, session_close(ST(r), r->params[0], "by its client", &f), &f);
  if (store_sessions_closing(ST(r))) /* it left tasks to the background deletion */
    reaper_wake(r->head);
}

static void results_waiter_park(http_req_t *r, session_order_t order, int64_t cursor, int64_t max,
                                int64_t wait_ms);

void route_session_results(http_req_t *r) {
  fail_t f = {0};
  const char *order_name = http_query(r, "order");
  session_order_t order = SESSION_BY_SUBMISSION;
  int64_t cursor, max, wait_ms;
  if (order_name && strcmp(order_name, "completion") == 0)
    order = SESSION_BY_COMPLETION;
  else if (order_name && strcmp(order_name, "submission") != 0)
    fail_set(&f, MUSTER_INVALID, "query order: '%.40s' is not submission or completion",
             order_name);
  if (f.code || query_int(r, "cursor", 0, 0, INT64_MAX - 1, &cursor, &f) ||
      query_int(r, "max", 100, 1, SESSION_MAX_RESULTS, &max, &f) ||
      query_int(r, "wait_ms", 0, 0, INT64_MAX, &wait_ms, &f)) {
    http_reply_fail(r, &f);
    return;
  }
  /* A read at a gap waits as any other, also when the stream is stalled:
   * another producer may yet fill the gap, and answering at once would turn
   * the loop of a reader that does not look at "gap" into a busy one.  A
   * parked read is answered when the stream stalls (results_waiter_try).
   * A sealed session with every result has nothing more to give: its read
   * is answered at once, as its reader stops on "sealed". */
  bool may_wait = wait_ms > 0 && !r->head->stopping;
  session_read_t rd;
  jw_buf_t page = {0};
  muster_err_t err =
      session_results_text(ST(r), r->params[0], order, cursor, max, may_wait, &rd, &page, &f);
  if (err == MUSTER_OK && rd.count == 0 && may_wait && !rd.ended) {
    int64_t cap = r->head->cfg.max_wait_ms;
    results_waiter_park(r, order, cursor, max, wait_ms < cap ? wait_ms : cap);
  } else if (err == MUSTER_OK) {
    http_reply_text(r, 200, &page);
  } else {
    http_reply_fail(r, &f);
  }
  jw_buf_free(&page); /* taken by the reply, or what an empty read or a failure left */
}

/* ---- updates ---- */

void route_update_post(http_req_t *r) {
  fail_t f = {0};
  reply_or_fail(r, 201, update_post(ST(r), r->params[0], r->body, r->head->cfg.max_payload, &f),
                &f);
}

void route_update_list(http_req_t *r) {
  fail_t f = {0};
  int64_t after, max;
  jw_buf_t page = {0};
  if (query_int(r, "after", 0, 0, INT64_MAX, &after, &f) ||
      query_int(r, "max", 100, 1, UPDATE_MAX_BATCH, &max, &f))
    http_reply_fail(r, &f);
  else if (update_list_text(ST(r), r->params[0], after, max, &page, &f) == MUSTER_OK)
    http_reply_text(r, 200, &page);
  else
    http_reply_fail(r, &f);
  jw_buf_free(&page); /* taken by the reply, or what a failure left */
}

/* ---- parked results reads ---- */

static void results_waiter_unlink(head_t *h, results_waiter_t *w) {
  if (w->prev)
    w->prev->next = w->next;
  else
    h->results_waiters = w->next;
  if (w->next)
    w->next->prev = w->prev;
  event_free(w->timer);
  free(w);
}

/* Reads for a parked reader in a savepoint of its own.  Answers it (and
 * frees it) when there is something to read, when the stream is stalled at
 * a gap (the last task without a result finished: the reader learns now
 * that none comes at its cursor), when it ended (sealed, every task with its
 * result: a seal or the last result came), when the read failed (the
 * session closed), or when `always`; returns whether it answered. */
static bool results_waiter_try(head_t *h, results_waiter_t *w, bool always) {
  fail_t f = {0};
  session_read_t rd = {0};
  jw_buf_t page = {0};
  muster_err_t err = store_request_begin(h->st, &f);
  if (err == MUSTER_OK) {
    err = session_results_text(h->st, w->session, w->order, w->cursor, w->max, !always, &rd, &page,
                               &f);
    store_request_end(h->st, err == MUSTER_OK);
  }
  if (err == MUSTER_OK && rd.count == 0 && !rd.stalled && !rd.ended && !always) {
    jw_buf_free(&page);
    return false;
  }
  if (err == MUSTER_OK)
    http_enqueue_text(h, w->req, 200, &page, false);
  else
    http_enqueue_fail(h, w->req, &f);
  jw_buf_free(&page); /* taken by the reply, or what a failure left */
  results_waiter_unlink(h, w);
  return true;
}

static void results_waiter_timeout(evutil_socket_t fd, short what, void *arg) {
  results_waiter_t *w = arg;
  results_waiter_try(w->head, w, true);
}

static void results_waiter_park(http_req_t *r, session_order_t order, int64_t cursor, int64_t max,
                                int64_t wait_ms) {
  head_t *h = r->head;
  results_waiter_t *w = calloc(1, sizeof *w);
  if (w == NULL || (w->timer = evtimer_new(h->base, results_waiter_timeout, w)) == NULL) {
    free(w);
    fail_t f;
    fail_set(&f, MUSTER_NOMEM, "out of memory");
    http_reply_fail(r, &f);
    return;
  }
  w->head = h;
  w->req = r->req;
  w->order = order;
  w->cursor = cursor;
  w->max = max;
  snprintf(w->session, sizeof w->session, "%s", r->params[0]);
  struct timeval tv = {.tv_sec = wait_ms / 1000, .tv_usec = (wait_ms % 1000) * 1000};
  evtimer_add(w->timer, &tv);
  w->next = h->results_waiters;
  if (w->next)
    w->next->prev = w;
  h->results_waiters = w;
  r->parked = true;
}

void results_waiters_mark(head_t *h, const char *session) {
  for (results_waiter_t *w = h->results_waiters; w; w = w->next)
    if (strcmp(w->session, session) == 0)
      w->due = true;
}

void results_waiters_serve(head_t *h) {
  results_waiter_t *w = h->results_waiters;
  while (w) {
    results_waiter_t *next = w->next;
    if (w->due) {
      w->due = false;
      results_waiter_try(h, w, false);
    }
    w = next;
  }
}

void results_waiters_release_all(head_t *h) {
  while (h->results_waiters)
    results_waiter_try(h, h->results_waiters, true);
}

bool results_waiters_busy(void *arg, const char *session) {
  head_t *h = arg;
  for (results_waiter_t *w = h->results_waiters; w; w = w->next)
    if (strcmp(w->session, session) == 0)
      return true;
  return false;
}
