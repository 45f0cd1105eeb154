/*
 * http.c — the route layer over the HTTP/1.1 server (h1.h): routing, the
 * checks every request passes before its handler, and replies held back until
 * their transaction commits.
 *
 * Everything runs on the event-loop thread.  A request's life: match a route
 * (404/405), check the bearer token (401), the body size (413), the content
 * type (415) and the JSON (400), open a savepoint in the turn's transaction,
 * run the handler, keep or roll back the savepoint, and queue the reply.  The
 * commit event (head.c) commits the turn and calls http_flush.
 */
#include "accept_log.h"
#include "core/knob.h"
#include "core/auth.h"
#include "core/said.h"
#include "core/utf8.h"
#include "http.h"
#include "http_internal.h"
#include "jw.h"
#include "log.h"
#include "metrics.h"
#include "queue.h"
#include "shared_upload.h"
#include "store.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct reply {
  reply_t *next;
  h1_req_t *req;
  int status;
  char *body;       /* encoded JSON, or raw bytes when `type` is set; owned */
  const char *type; /* NULL: JSON; else the Content-Type of a raw body (static) */
  size_t len;       /* bytes of the body (JSON without its final newline) */
  bool has_file;    /* the body is the first file_len bytes of file `fd` (owned) */
  int fd;
  int64_t file_len;
  int route;        /* for metrics: index in http_routes, METRICS_ROUTE_* otherwise */
  int64_t start_us; /* when the request arrived (metrics_now_us); -1: no latency */
  bool no_flush;    /* goes out after the commit without waiting for a flush */
};

/* An error reply to a HEAD (which has no body) or to a read of shared data
 * also says its code and message in headers (core/said.h), taken from the
 * envelope in `data` as it goes out, so that they are the body's own even
 * when a failed commit replaced the handler's reply. */
static void http_say_in_headers(h1_req_t *req, int status, const char *data, size_t len) {
  if (status < 400 || !said_in_headers(h1_method(req), h1_path(req)))
    return;
  json_t *root = json_loadb(data ? data : "", len, 0, NULL);
  json_t *error = json_object_get(root, "error");
  const char *code = json_string_value(json_object_get(error, "code"));
  const char *message = json_string_value(json_object_get(error, "message"));
  if (code && message) {
    char value[1024];
    said_header_value(code, value, sizeof value);
    h1_add_header(req, SAID_CODE_HEADER, value);
    said_header_value(message, value, sizeof value);
    h1_add_header(req, SAID_MESSAGE_HEADER, value);
  }
  json_decref(root);
}

/* Answers `req` with `len` bytes of `data` (owned) as `type`; JSON (type
 * NULL) gets a final newline. */
static void http_send_body(h1_req_t *req, int status, const char *type, char *data, size_t len) {
  if (type == NULL)
    http_say_in_headers(req, status, data, len);
  if (status == 401)
    h1_add_header(req, "WWW-Authenticate", "Bearer realm=\"muster\"");
  h1_respond(req, status, type ? type : "application/json", data, len, type == NULL);
}

/* Answers 500 without a body of our own: memory ran out. */
static void http_send_error(h1_req_t *req) {
  h1_respond(req, 500, "application/json", NULL, 0, false);
}

static json_t *http_error_body(muster_err_t code, const char *message) {
  return json_pack("{s:{s:s, s:s}}", "error", "code", muster_err_name(code), "message", message);
}

/* Hands reply *r to the server (which owns its body from then on). */
static void http_build_reply(reply_t *r) {
  if (r->has_file)
    h1_respond_file(r->req, r->status, r->type, r->fd, r->file_len);
  else
    http_send_body(r->req, r->status, r->type, r->body, r->len);
  r->req = NULL;
  r->body = NULL;
  r->has_file = false;
}

/* Counts reply *r, sent now or at the end of a lend, and frees it. */
static void http_account_reply(reply_t *r) {
  if (r->route != METRICS_ROUTE_SKIP)
    metrics_http(r->route, r->status, r->start_us < 0 ? -1 : metrics_now_us() - r->start_us);
  free(r);
}

/* Sends reply *r now (and frees it): the commit is done, or none was open. */
static void http_send_reply(reply_t *r) {
  http_build_reply(r);
  http_account_reply(r);
}

/* Queues reply *r (owned) for the commit, or sends it when no transaction is open. */
static void http_enqueue_reply(head_t *h, reply_t *r) {
  if (!store_in_tx(h->st)) {
    http_send_reply(r);
    return;
  }
  /* Held until the commit: counted against its client's unread replies now,
   * so that the requests it pipelined behind wait once they pile up. */
  h1_expect_reply(r->req, r->has_file ? 0 : r->len);
  if (h->pending_tail)
    h->pending_tail->next = r;
  else
    h->pending_head = r;
  h->pending_tail = r;
  if (r->no_flush)
    head_wake_commit(h); /* it may go out now, during a flush (head_commit) */
}

/* Builds a reply; `body` (owned) is encoded JSON, or raw bytes when `type` is set. */
static void http_enqueue_body(head_t *h, h1_req_t *req, int status, const char *type, char *body,
                              size_t len, int route, int64_t start_us, bool no_flush) {
  reply_t *r = calloc(1, sizeof *r);
  if (r == NULL || body == NULL) {
    free(r);
    free(body);
    http_send_error(req);
    return;
  }
  *r = (reply_t){.req = req,
                 .status = status,
                 .body = body,
                 .type = type,
                 .len = len,
                 .route = route,
                 .start_us = start_us,
                 .no_flush = no_flush};
  http_enqueue_reply(h, r);
}

/* The route a late reply to `req` is counted under: the one http_dispatch
 * noted on the request.  Its wait was the caller's choice (a long-poll's
 * wait_ms, an upload's pace), so it stays out of the latency histogram. */
static int http_late_route(h1_req_t *req) {
  const http_route_t *rt = h1_note(req);
  return rt ? (int)(rt - http_routes) : METRICS_ROUTE_SKIP;
}

void http_enqueue(head_t *h, h1_req_t *req, int status, json_t *body) {
  size_t len = 0;
  char *text = jw_dump(body, &len);
  json_decref(body);
  http_enqueue_body(h, req, status, NULL, text, len, http_late_route(req), -1, false);
}

void http_enqueue_text(head_t *h, h1_req_t *req, int status, jw_buf_t *text, bool no_flush) {
  if (text->failed || text->buf == NULL) {
    jw_buf_free(text);
    fail_t f;
    fail_set(&f, MUSTER_NOMEM, "out of memory");
    http_enqueue_fail(h, req, &f);
    return;
  }
  http_enqueue_body(h, req, status, NULL, text->buf, text->len, http_late_route(req), -1, no_flush);
  *text = (jw_buf_t){0};
}

void http_enqueue_fail(head_t *h, h1_req_t *req, const fail_t *f) {
  int status = muster_err_http_status(f->code);
  http_enqueue(h, req, status ? status : 500, http_error_body(f->code, fail_message(f)));
}

reply_list_t http_take_pending(head_t *h) {
  reply_list_t list = {h->pending_head, h->pending_tail};
  h->pending_head = h->pending_tail = NULL;
  return list;
}

bool http_pending_unflushed(const head_t *h) {
  for (const reply_t *r = h->pending_head; r; r = r->next)
    if (r->no_flush)
      return true;
  return false;
}

size_t http_list_length(const reply_list_t *list) {
  size_t n = 0;
  for (const reply_t *r = list->head; r; r = r->next)
    n++;
  return n;
}

size_t http_list_bytes(const reply_list_t *list) {
  size_t n = 0;
  for (const reply_t *r = list->head; r; r = r->next)
    n += r->has_file ? 0 : r->len;
  return n;
}

reply_list_t http_list_take_unflushed(reply_list_t *list) {
  reply_list_t taken = {NULL, NULL}, kept = {NULL, NULL};
  for (reply_t *r = list->head, *next; r; r = next) {
    next = r->next;
    r->next = NULL;
    reply_list_t *into = r->no_flush ? &taken : &kept;
    if (into->tail)
      into->tail->next = r;
    else
      into->head = r;
    into->tail = r;
  }
  *list = kept;
  return taken;
}

void http_list_concat(reply_list_t *into, reply_list_t *more) {
  if (more->head == NULL)
    return;
  if (into->tail)
    into->tail->next = more->head;
  else
    into->head = more->head;
  into->tail = more->tail;
  more->head = more->tail = NULL;
}

void http_flush(head_t *h, const fail_t *commit_failed) {
  reply_list_t list = http_take_pending(h);
  http_flush_list(h, &list, commit_failed);
}

void http_flush_list(head_t *h, reply_list_t *list, const fail_t *commit_failed) {
  reply_t *r = list->head;
  list->head = list->tail = NULL;
  /* Corked: a connection's replies of the group go out in one write. */
  h1_cork(h->http);
  while (r) {
    reply_t *next = r->next;
    if (commit_failed) {
      json_t *error = http_error_body(MUSTER_STORE, fail_message(commit_failed));
      free(r->body);
      r->body = jw_dump(error, &r->len);
      json_decref(error);
      r->status = 500;
      r->type = NULL;
      if (r->has_file)
        close(r->fd);
      r->has_file = false;
      if (r->body == NULL) {
        r->body = strdup("{}");
        r->len = r->body ? 2 : 0;
      }
    }
    http_send_reply(r);
    r = next;
  }
  h1_uncork(h->http);
}

h1_lend_t *http_lend_list(head_t *h, reply_list_t *list) {
  h1_lend_begin(h->http);
  for (reply_t *r = list->head; r; r = r->next)
    http_build_reply(r);
  return h1_lend_end(h->http);
}

void http_lend_finish(reply_list_t *list, h1_lend_t *lend, const fail_t *failed) {
  reply_t *r = list->head;
  list->head = list->tail = NULL;
  if (lend) {
    char *error = NULL;
    if (failed) {
      json_t *body = http_error_body(MUSTER_STORE, fail_message(failed));
      size_t len;
      error = jw_dump(body, &len);
      json_decref(body);
    }
    h1_lend_return(lend, failed ? 500 : 0, error ? error : "{}");
    free(error);
  }
  while (r) {
    reply_t *next = r->next;
    if (failed)
      r->status = 500;
    http_account_reply(r);
    r = next;
  }
}

/* Drops a file reply the handler set before answering otherwise. */
static void http_drop_file(http_req_t *r) {
  if (r->raw_file)
    close(r->raw_fd);
  r->raw_file = false;
}

void http_reply_json(http_req_t *r, int status, json_t *body) {
  free(r->raw); /* the last reply a handler gives wins, JSON or raw */
  r->raw = NULL;
  http_drop_file(r);
  json_decref(r->reply);
  r->status = status;
  r->reply = body ? body : json_object();
}

void http_reply_fail(http_req_t *r, const fail_t *f) {
  int status = muster_err_http_status(f->code);
  http_reply_json(r, status ? status : 500, http_error_body(f->code, fail_message(f)));
}

void http_fail(http_req_t *r, muster_err_t code, const char *fmt, ...) {
  fail_t f = {.code = code};
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(f.message, sizeof f.message, fmt, ap);
  va_end(ap);
  utf8_scrub(f.message); /* a path or a field name quoted may not be UTF-8 */
  http_reply_fail(r, &f);
}

bool http_token_sent(const http_req_t *r) {
  return h1_header(r->req, "Authorization") != NULL;
}

http_role_t http_token_role(const http_req_t *r) {
  const char *auth = h1_header(r->req, "Authorization");
  if (auth == NULL || strncasecmp(auth, "Bearer ", 7) != 0)
    return HTTP_PUBLIC;
  const head_config_t *cfg = &r->head->cfg;
  if (auth_token_equal(auth + 7, cfg->token))
    return HTTP_ADMIN;
  if (cfg->read_token[0] && auth_token_equal(auth + 7, cfg->read_token))
    return HTTP_READ;
  return HTTP_PUBLIC;
}

/* Checks the token against the route's role; false with a 401 or 403 reply set.
 * HTTP_TOKEN routes are read routes for GET and HEAD, admin routes otherwise. */
static bool http_allowed(http_req_t *r, const http_route_t *rt) {
  http_role_t need = rt->role;
  if (need == HTTP_PUBLIC)
    return true;
  if (need == HTTP_TOKEN)
    need = strcmp(rt->method, "GET") == 0 ? HTTP_READ : HTTP_ADMIN;
  http_role_t have = http_token_role(r);
  if (have >= need)
    return true;
  if (have == HTTP_READ)
    http_fail(r, MUSTER_FORBIDDEN,
              "the read-only (dashboard) token may only read; this needs the admin token");
  else
    http_fail(r, MUSTER_UNAUTHORIZED, "%s", auth_refusal(h1_header(r->req, "Authorization")));
  return false;
}

/* Parses the body's text into r->body; false with a 400 reply set when it
 * is not a JSON object. */
static bool http_parse_json(http_req_t *r, const char *text, size_t len) {
  json_error_t err;
  r->body = json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &err);
  if (r->body == NULL) {
    fail_t f;
    /* jansson's words for a number past int64 or a double say nothing of
     * the range; its overflow is of an integer ("too big integer") or of a
     * real ("real number overflow"). */
    bool overflow = json_error_code(&err) == json_error_numeric_overflow;
    const char *range = !overflow                     ? ""
                        : strstr(err.text, "integer") ? "; integers are at most 2^63-1 "
                                                        "(9223372036854775807) here"
                                                      : "; reals are at most about 1.8e308 here";
    fail_set(&f, MUSTER_BAD_JSON, "the body is not valid JSON: %s (line %d, column %d)%s", err.text,
             err.line, err.column, range);
    http_reply_fail(r, &f);
    return false;
  }
  if (!json_is_object(r->body)) {
    http_fail(r, MUSTER_BAD_JSON, "the body must be a JSON object");
    return false;
  }
  return true;
}

const json_t *http_body(http_req_t *r) {
  if (r->body == NULL && !http_parse_json(r, r->body_text, r->body_len))
    return NULL;
  return json_is_object(r->body) ? r->body : NULL;
}

/* On an HTTP_NO_FIELDS route: true when the body has no field, else false
 * with the refusal set, naming the first. */
static bool http_no_fields(http_req_t *r) {
  const char *key = json_object_iter_key(json_object_iter(r->body));
  if (key == NULL)
    return true;
  http_fail(r, MUSTER_INVALID,
            "%.100s: unknown field; this endpoint takes no body (send none, or {})", key);
  return false;
}

/* Checks size and content type of the body and parses it, or on an
 * HTTP_BODY_TEXT route keeps its text; false with a reply set. */
static bool http_parse_body(http_req_t *r, const http_route_t *rt, size_t limit) {
  size_t len;
  const char *text = h1_body(r->req, &len);
  if (len > limit) {
    fail_t f;
    fail_set(&f, MUSTER_BODY_TOO_LARGE, "the body is %zu bytes; this endpoint takes at most %zu",
             len, limit);
    http_reply_fail(r, &f);
    return false;
  }
  if (len == 0) {
    r->body = json_object();
    return true;
  }
  const char *type = h1_header(r->req, "Content-Type");
  if (type && strncasecmp(type, "application/json", 16) != 0) {
    http_fail(r, MUSTER_UNSUPPORTED_MEDIA,
              "Content-Type is '%.100s'; send the body as application/json", type);
    return false;
  }
  if (rt->flags & HTTP_BODY_TEXT) {
    /* A parse error is then answered from inside the handler's savepoint,
     * which rolls back having written nothing: the same reply. */
    r->body_text = text;
    r->body_len = len;
    return true;
  }
  return http_parse_json(r, text, len) && (!(rt->flags & HTTP_NO_FIELDS) || http_no_fields(r));
}

/* Runs the route's handler inside its own savepoint. */
static void http_run(http_req_t *r, const http_route_t *rt) {
  head_t *h = r->head;
  fail_t f = {0};
  if (store_request_begin(h->st, &f)) {
    http_reply_fail(r, &f);
    return;
  }
  rt->handler(r);
  if (!r->parked && r->status == 0)
    http_fail(r, MUSTER_INTERNAL, "the handler gave no reply");
  store_request_end(h->st, r->parked || r->status < 400 || r->keep);
}

void http_reply_raw(http_req_t *r, int status, const char *type, const void *data, size_t len) {
  free(r->raw);
  r->raw = malloc(len ? len : 1);
  if (r->raw == NULL) {
    http_fail(r, MUSTER_NOMEM, "out of memory");
    return;
  }
  memcpy(r->raw, data, len);
  http_drop_file(r);
  json_decref(r->reply);
  r->reply = NULL;
  r->raw_len = len;
  r->raw_type = type;
  r->status = status;
}

void http_reply_text(http_req_t *r, int status, jw_buf_t *text) {
  if (text->failed || text->buf == NULL) {
    jw_buf_free(text);
    http_fail(r, MUSTER_NOMEM, "out of memory");
    return;
  }
  free(r->raw);
  http_drop_file(r);
  json_decref(r->reply);
  r->reply = NULL;
  r->raw = text->buf; /* sent as JSON: raw_type NULL */
  r->raw_len = text->len;
  r->raw_type = NULL;
  r->status = status;
  *text = (jw_buf_t){0};
}

void http_reply_file(http_req_t *r, int status, const char *type, int fd, int64_t len) {
  free(r->raw);
  r->raw = NULL;
  http_drop_file(r);
  json_decref(r->reply);
  r->reply = NULL;
  r->raw_file = true;
  r->raw_fd = fd;
  r->raw_file_len = len;
  r->raw_type = type;
  r->status = status;
}

/* Hands the request's reply to the commit queue: raw when a handler set one. */
static void http_enqueue_req(http_req_t *r, const http_route_t *rt, int64_t start_us) {
  int route = rt ? (int)(rt - http_routes) : METRICS_ROUTE_NONE;
  if (r->raw_file) {
    reply_t *reply = calloc(1, sizeof *reply);
    if (reply == NULL) {
      close(r->raw_fd);
      http_send_error(r->req);
    } else {
      *reply = (reply_t){.req = r->req,
                         .status = r->status,
                         .type = r->raw_type,
                         .has_file = true,
                         .fd = r->raw_fd,
                         .file_len = r->raw_file_len,
                         .route = route,
                         .start_us = start_us};
      http_enqueue_reply(r->head, reply);
    }
    r->raw_file = false;
  } else if (r->raw) {
    /* JSON written whole (http_reply_text) waits as a tree's text would. */
    http_enqueue_body(r->head, r->req, r->status, r->raw_type, r->raw, r->raw_len, route, start_us,
                      r->no_flush && r->status < 400);
    r->raw = NULL;
  } else {
    size_t len = 0;
    char *text = jw_dump(r->reply, &len);
    http_enqueue_body(r->head, r->req, r->status, NULL, text, len, route, start_us,
                      r->no_flush && r->status < 400);
  }
  json_decref(r->reply);
  r->reply = NULL;
}

/* The checks before the body: the query, the head's state, the route, the
 * token and a queue name in the path.  Returns the route, or NULL with the reply set. */
static const http_route_t *http_preflight(http_req_t *r) {
  const char *query = h1_query(r->req);
  const http_route_t *rt = NULL;
  if (query && !http_parse_query(r, query))
    return NULL;
  if (r->head->stopping)
    http_fail(r, MUSTER_UNAVAILABLE, "the head is shutting down");
  else if ((rt = http_route(r, h1_path(r->req))) != NULL && !http_allowed(r, rt))
    rt = NULL;
  fail_t f = {0};
  if (rt && (rt->flags & HTTP_QUEUE_NAME) && queue_check_name(r->params[0], &f)) {
    http_reply_fail(r, &f);
    rt = NULL;
  }
  return rt;
}

/* Frees what a request's handling left in *r. */
static void http_req_clear(http_req_t *r) {
  free(r->raw);
  if (r->raw_file)
    close(r->raw_fd);
  json_decref(r->reply);
  json_decref(r->body);
  http_clear_params(r);
  free(r->query_text);
}

/* h1's admission of a request whose body is not all in yet (its client may
 * wait for "100 Continue"): the checks of the preflight and the announced
 * length against the route's limit, so that a refused request is refused
 * before its body is sent or kept. */
static bool http_admit(h1_req_t *req, void *arg) {
  head_t *h = arg;
  http_req_t r = {.head = h, .req = req};
  int64_t start_us = metrics_now_us();
  const http_route_t *rt = http_preflight(&r);
  size_t limit = rt && rt->body_limit ? rt->body_limit : h->cfg.max_body;
  int64_t length = h1_length(req);
  if (rt && length > 0 && (uint64_t)length > limit) {
    fail_t f;
    fail_set(&f, MUSTER_BODY_TOO_LARGE, "the body is %lld bytes; this endpoint takes at most %zu",
             (long long)length, limit);
    http_reply_fail(&r, &f);
    rt = NULL;
  }
  if (rt == NULL) {
    h->requests++;
    http_enqueue_req(&r, rt, start_us);
  }
  http_req_clear(&r);
  return rt != NULL;
}

static void http_dispatch(h1_req_t *req, void *arg) {
  head_t *h = arg;
  http_req_t r = {.head = h, .req = req};
  h->requests++;
  int64_t start_us = metrics_now_us();
  const http_route_t *rt = http_preflight(&r);
  if (rt && http_parse_body(&r, rt, rt->body_limit ? rt->body_limit : h->cfg.max_body))
    http_run(&r, rt);
  if (!r.parked) {
    http_enqueue_req(&r, rt, start_us);
  } else {
    /* Answered after other events: the connection's next request waits.
     * It is counted when that answer is sent (http_enqueue), with its
     * status: a parked lease may end in an error, an upload in 201. */
    h1_hold(req);
    h1_set_note(req, rt);
  }
  http_req_clear(&r);
}

static bool http_streams(const h1_req_t *req, void *arg) {
  (void)arg;
  return shared_upload_streams(req);
}

/* A read deadline of the HTTP server from the environment (for tests):
 * milliseconds from 1 to 3600000; anything else is refused with a warning
 * and the default (0) stays. */
static int64_t http_timeout_env(const char *name) {
  const char *text = getenv(name);
  if (text == NULL)
    return 0;
  long long v;
  if (knob_int(text, 1, 3600000, &v))
    return v;
  log_msg(LOG_WARN, "%s=%s is not 1 to 3600000 ms; the default is kept", name, text);
  return 0;
}

/* What to do about the listen error `err` (h1_server_listen's words): the
 * two a user meets, a port taken and an address not this machine's. */
static const char *http_listen_advice(const char *err) {
  if (strstr(err, "Address already in use"))
    return ": another process (another head?) listens there; stop it, or give another port "
           "with --listen (port 0 picks a free one)";
  if (strstr(err, "Cannot assign requested address"))
    return ": it is not an address of this machine; give one of its addresses, 127.0.0.1, or "
           "0.0.0.0 for every interface";
  return "";
}

/* What the head said of failed accepts (accept_log.h): one head per
 * process, so one record (the callbacks' argument is the head, which has no
 * field for it). */
static accept_log_t http_accept_log;

/* accept() failed (h1 pauses accepting 100 ms): said once a minute at most. */
static void http_accept_failed(int err, void *arg) {
  (void)arg;
  char line[400];
  if (accept_log_failed(&http_accept_log, err, now_ms(), line, sizeof line))
    log_msg(LOG_ERROR, "%s", line);
}

/* A connection was accepted after failures: said once after each failure said. */
static void http_accept_resumed(void *arg) {
  (void)arg;
  char line[200];
  if (accept_log_resumed(&http_accept_log, line, sizeof line))
    log_msg(LOG_INFO, "%s", line);
}

int http_start(head_t *h) {
  /* Bodies above the route's limit are refused by the route layer with its
   * own message; the server's limit only bounds what is buffered at all. */
  h1_config_t cfg = {.dispatch = http_dispatch,
                     .streams = http_streams,
                     .admit = http_admit,
                     .accept_failed = http_accept_failed,
                     .accept_resumed = http_accept_resumed,
                     .arg = h,
                     .max_head = 64 * 1024,
                     .max_body = h->cfg.max_body * 4 + 65536,
                     .idle_ms = h->cfg.max_wait_ms + 120 * 1000,
                     .head_ms = http_timeout_env("MUSTER_HTTP_HEAD_TIMEOUT_MS"),
                     .body_ms = http_timeout_env("MUSTER_HTTP_BODY_TIMEOUT_MS"),
                     .server = "muster-head"};
  h->http = h1_server_new(h->base, &cfg);
  if (h->http == NULL)
    return -1;
  char err[256];
  int port = h1_server_listen(h->http, h->cfg.listen_host, h->cfg.listen_port, err, sizeof err);
  if (port < 0)
    log_msg(LOG_ERROR, "cannot listen on %s:%d: %s%s", h->cfg.listen_host, h->cfg.listen_port, err,
            http_listen_advice(err));
  return port;
}

void http_stop(head_t *h) {
  h1_server_free(h->http);
  h->http = NULL;
}
