/*
 * http.c — evhttp glue: routing, the checks every request passes before its
 * handler, and replies held back until their transaction commits.
 *
 * Everything runs on the event-loop thread.  A request's life: match a route
 * (404/405), check the bearer token (401), the body size (413), the content
 * type (415) and the JSON (400), open a savepoint in the turn's transaction,
 * run the handler, keep or roll back the savepoint, and queue the reply.  The
 * commit event (head.c) commits the turn and calls http_flush.
 */
#include "http.h"
#include "jw.h"
#include "log.h"
#include "metrics.h"
#include "shared_upload.h"
#include "store.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/listener.h>
#include <event2/util.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <unistd.h>

struct reply {
  reply_t *next;
  struct evhttp_request *req;
  int status;
  char *body;       /* encoded JSON, or raw bytes when `type` is set; owned */
  const char *type; /* NULL: JSON; else the Content-Type of a raw body (static) */
  size_t len;       /* bytes of a raw body */
  bool has_file;    /* the body is the first file_len bytes of file `fd` (owned) */
  int fd;
  int64_t file_len;
  int route;        /* for metrics: index in http_routes, METRICS_ROUTE_* otherwise */
  int64_t start_us; /* when the request arrived (metrics_now_us) */
  bool no_flush;    /* goes out after the commit without waiting for a flush */
};

#define HTTP_MAX_SEGMENTS 8

static const char *http_reason(int status) {
  switch (status) {
  case 200: return "OK";
  case 201: return "Created";
  case 400: return "Bad Request";
  case 401: return "Unauthorized";
  case 403: return "Forbidden";
  case 404: return "Not Found";
  case 405: return "Method Not Allowed";
  case 409: return "Conflict";
  case 413: return "Payload Too Large";
  case 415: return "Unsupported Media Type";
  case 503: return "Service Unavailable";
  default: return status >= 500 ? "Internal Server Error" : "OK";
  }
}

/* Sends `len` bytes of `data` as `type`; JSON (type NULL) gets a final newline. */
static void http_send_body(struct evhttp_request *req, int status, const char *type,
                           const char *data, size_t len) {
  struct evbuffer *buf = evbuffer_new();
  if (buf == NULL) {
    evhttp_send_error(req, 500, NULL);
    return;
  }
  struct evkeyvalq *out = evhttp_request_get_output_headers(req);
  if (evhttp_request_get_command(req) == EVHTTP_REQ_HEAD) {
    /* evhttp would send a HEAD reply's body without a length, which breaks
     * the connection for the next request: send the length alone. */
    char length[32];
    snprintf(length, sizeof length, "%zu", len + (type == NULL));
    evhttp_add_header(out, "Content-Length", length);
  } else {
    evbuffer_add(buf, data, len);
    if (type == NULL)
      evbuffer_add(buf, "\n", 1);
  }
  evhttp_add_header(out, "Content-Type", type ? type : "application/json");
  if (status == 401)
    evhttp_add_header(out, "WWW-Authenticate", "Bearer realm=\"muster\"");
  evhttp_send_reply(req, status, http_reason(status), buf);
  evbuffer_free(buf);
}

static void http_send_text(struct evhttp_request *req, int status, const char *text) {
  http_send_body(req, status, NULL, text, strlen(text));
}

static json_t *http_error_body(muster_err_t code, const char *message) {
  return json_pack("{s:{s:s, s:s}}", "error", "code", muster_err_name(code), "message", message);
}

void http_send_parked(head_t *h, struct evhttp_request *req, int status, json_t *body) {
  (void)h;
  char *text = jw_dump(body, NULL);
  json_decref(body);
  http_send_text(req, status, text ? text : "{}");
  free(text);
}

/* Sends `len` bytes of file `fd` (consumed) as `type`.  The evbuffer is
 * marked as draining to a socket so that libevent keeps the file as a
 * sendfile segment instead of mapping or reading it into memory. */
static void http_send_file(struct evhttp_request *req, int status, const char *type, int fd,
                           int64_t len) {
  struct evkeyvalq *out = evhttp_request_get_output_headers(req);
  struct evbuffer *buf = evbuffer_new();
  if (buf == NULL) {
    close(fd);
    evhttp_send_error(req, 500, NULL);
    return;
  }
  evhttp_add_header(out, "Content-Type", type);
  if (evhttp_request_get_command(req) == EVHTTP_REQ_HEAD) {
    char length[32];
    snprintf(length, sizeof length, "%lld", (long long)len);
    evhttp_add_header(out, "Content-Length", length);
    close(fd);
  } else if (len == 0) {
    close(fd);
  } else {
    evbuffer_set_flags(buf, EVBUFFER_FLAG_DRAINS_TO_FD);
    if (evbuffer_add_file(buf, fd, 0, len) != 0) {
      evbuffer_free(buf);
      evhttp_send_error(req, 500, NULL);
      return;
    }
  }
  evhttp_send_reply(req, status, http_reason(status), buf);
  evbuffer_free(buf);
}

/* Sends reply *r now (and frees it): the commit is done, or none was open. */
static void http_send_reply(reply_t *r) {
  if (r->has_file)
    http_send_file(r->req, r->status, r->type, r->fd, r->file_len);
  else if (r->type)
    http_send_body(r->req, r->status, r->type, r->body, r->len);
  else
    http_send_text(r->req, r->status, r->body);
  if (r->route != METRICS_ROUTE_SKIP)
    metrics_http(r->route, r->status, metrics_now_us() - r->start_us);
  free(r->body);
  free(r);
}

/* Queues reply *r (owned) for the commit, or sends it when no transaction is open. */
static void http_enqueue_reply(head_t *h, reply_t *r) {
  if (!store_in_tx(h->st)) {
    http_send_reply(r);
    return;
  }
  if (h->pending_tail)
    h->pending_tail->next = r;
  else
    h->pending_head = r;
  h->pending_tail = r;
}

/* Builds a reply; `body` (owned) is encoded JSON, or raw bytes when `type` is set. */
static void http_enqueue_body(head_t *h, struct evhttp_request *req, int status, const char *type,
                              char *body, size_t len, int route, int64_t start_us,
                              bool no_flush) {
  reply_t *r = calloc(1, sizeof *r);
  if (r == NULL || body == NULL) {
    free(r);
    free(body);
    evhttp_send_error(req, 500, NULL);
    return;
  }
  *r = (reply_t){.req = req, .status = status, .body = body, .type = type, .len = len,
                 .route = route, .start_us = start_us, .no_flush = no_flush};
  http_enqueue_reply(h, r);
}

/* Queues JSON `body` (stolen) as a reply outside the route layer. */
static void http_enqueue_json(head_t *h, struct evhttp_request *req, int status, json_t *body,
                              bool no_flush) {
  char *text = jw_dump(body, NULL);
  json_decref(body);
  http_enqueue_body(h, req, status, NULL, text, 0, METRICS_ROUTE_SKIP, 0, no_flush);
}

void http_enqueue(head_t *h, struct evhttp_request *req, int status, json_t *body) {
  http_enqueue_json(h, req, status, body, false);
}

void http_enqueue_unflushed(head_t *h, struct evhttp_request *req, int status, json_t *body) {
  http_enqueue_json(h, req, status, body, true);
}

void http_enqueue_fail(head_t *h, struct evhttp_request *req, const fail_t *f) {
  int status = muster_err_http_status(f->code);
  http_enqueue(h, req, status ? status : 500, http_error_body(f->code, fail_message(f)));
}

reply_list_t http_take_pending(head_t *h) {
  reply_list_t list = {h->pending_head, h->pending_tail};
  h->pending_head = h->pending_tail = NULL;
  return list;
}

size_t http_list_length(const reply_list_t *list) {
  size_t n = 0;
  for (const reply_t *r = list->head; r; r = r->next)
    n++;
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
  while (r) {
    reply_t *next = r->next;
    if (commit_failed) {
      json_t *error = http_error_body(MUSTER_STORE, fail_message(commit_failed));
      free(r->body);
      r->body = jw_dump(error, NULL);
      json_decref(error);
      r->status = 500;
      r->type = NULL;
      if (r->has_file)
        close(r->fd);
      r->has_file = false;
      if (r->body == NULL)
        r->body = strdup("{}");
    }
    http_send_reply(r);
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

static void http_fail(http_req_t *r, muster_err_t code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void http_fail(http_req_t *r, muster_err_t code, const char *fmt, ...) {
  fail_t f = {.code = code};
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(f.message, sizeof f.message, fmt, ap);
  va_end(ap);
  http_reply_fail(r, &f);
}

int64_t http_param_id(const char *text) {
  if (text == NULL || *text < '1' || *text > '9')
    return 0;
  char *end;
  long long v = strtoll(text, &end, 10);
  return *end == '\0' && v > 0 && v < (1LL << 53) ? v : 0;
}

const char *http_query(http_req_t *r, const char *key) {
  return evhttp_find_header(&r->query, key);
}

static const char *http_method_name(enum evhttp_cmd_type cmd) {
  switch (cmd) {
  case EVHTTP_REQ_GET: return "GET";
  case EVHTTP_REQ_POST: return "POST";
  case EVHTTP_REQ_PUT: return "PUT";
  case EVHTTP_REQ_DELETE: return "DELETE";
  case EVHTTP_REQ_HEAD: return "HEAD";
  case EVHTTP_REQ_PATCH: return "PATCH";
  case EVHTTP_REQ_OPTIONS: return "OPTIONS";
  default: return "this method";
  }
}

/* Splits `path` in place into segments; returns their count or -1.  A
 * trailing slash makes an empty last segment ("/v1/queues/" names the queue
 * ""), so it is refused as a bad name rather than routed elsewhere. */
static int http_split(char *path, char **segs) {
  int n = 0;
  size_t len = strlen(path);
  bool trailing = len > 1 && path[len - 1] == '/';
  for (char *save = NULL, *tok = strtok_r(path, "/", &save); tok; tok = strtok_r(NULL, "/", &save)) {
    if (n == HTTP_MAX_SEGMENTS)
      return -1;
    segs[n++] = tok;
  }
  if (trailing) {
    if (n == HTTP_MAX_SEGMENTS)
      return -1;
    segs[n++] = path + len; /* the NUL at the end: an empty string */
  }
  return n;
}

/* The pattern's next segment from *p (patterns have no empty segments):
 * its start, with its length in *len; NULL at the end. */
static const char *http_pattern_seg(const char **p, size_t *len) {
  while (**p == '/')
    (*p)++;
  if (**p == '\0')
    return NULL;
  const char *seg = *p;
  *len = strcspn(seg, "/");
  *p += *len;
  return seg;
}

static bool http_is_param(const char *seg, size_t len) {
  return len == 2 && seg[0] == '{' && seg[1] == '}';
}

/* True when the route's pattern matches `segs`; fills r->params.  It runs for
 * every route tried on every request, so it walks the pattern in place. */
static bool http_match(const char *pattern, char **segs, int nsegs, http_req_t *r) {
  const char *p = pattern, *seg;
  size_t len;
  int n = 0;
  while ((seg = http_pattern_seg(&p, &len)) != NULL) {
    if (n == nsegs)
      return false;
    if (!http_is_param(seg, len) && (strncmp(seg, segs[n], len) != 0 || segs[n][len] != '\0'))
      return false;
    n++;
  }
  if (n != nsegs)
    return false;
  p = pattern;
  for (int i = 0, np = 0; (seg = http_pattern_seg(&p, &len)) != NULL; i++) {
    if (!http_is_param(seg, len) || np == HTTP_MAX_PARAMS)
      continue;
    size_t dlen = 0;
    char *decoded = evhttp_uridecode(segs[i], 0, &dlen);
    if (decoded && strlen(decoded) != dlen) {
      /* An encoded NUL would cut the name short: keep the raw segment, which
       * no name rule accepts, so the handler refuses it. */
      free(decoded);
      decoded = strdup(segs[i]);
    }
    r->params[np++] = decoded;
  }
  return true;
}

static void http_clear_params(http_req_t *r) {
  for (int i = 0; i < HTTP_MAX_PARAMS; i++) {
    free(r->params[i]);
    r->params[i] = NULL;
  }
}

/* Finds the route for the request; sets a 404/405 reply when there is none. */
static const http_route_t *http_route(http_req_t *r, const char *path) {
  char copy[2048], *segs[HTTP_MAX_SEGMENTS];
  size_t len = strlen(path);
  if (len >= sizeof copy) {
    http_fail(r, MUSTER_NOT_FOUND, "no endpoint at this path");
    return NULL;
  }
  memcpy(copy, path, len + 1);
  int n = http_split(copy, segs);
  const char *method = http_method_name(evhttp_request_get_command(r->req));
  bool path_known = false;
  for (const http_route_t *rt = http_routes; n >= 0 && rt->method; rt++) {
    if (!http_match(rt->pattern, segs, n, r))
      continue;
    if (strcmp(rt->method, method) == 0 ||
        (strcmp(rt->method, "GET") == 0 && strcmp(method, "HEAD") == 0))
      return rt;
    path_known = true;
    http_clear_params(r);
  }
  if (path_known)
    http_fail(r, MUSTER_METHOD_NOT_ALLOWED, "%s is not allowed on this endpoint", method);
  else
    http_fail(r, MUSTER_NOT_FOUND, "no endpoint at %.200s; see docs/api.md", path);
  return NULL;
}

/* Constant-time comparison of a bearer token, so timing reveals nothing. */
static bool http_token_equal(const char *given, const char *want) {
  size_t glen = strlen(given), wlen = strlen(want);
  unsigned char diff = glen != wlen;
  for (size_t i = 0; i < wlen; i++)
    diff |= (unsigned char)(want[i] ^ (i < glen ? given[i] : 0));
  return diff == 0;
}

http_role_t http_token_role(const http_req_t *r) {
  const char *auth =
      evhttp_find_header(evhttp_request_get_input_headers(r->req), "Authorization");
  if (auth == NULL || strncasecmp(auth, "Bearer ", 7) != 0)
    return HTTP_PUBLIC;
  const head_config_t *cfg = &r->head->cfg;
  if (http_token_equal(auth + 7, cfg->token))
    return HTTP_ADMIN;
  if (cfg->read_token[0] && http_token_equal(auth + 7, cfg->read_token))
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
    http_fail(r, MUSTER_UNAUTHORIZED,
              "send 'Authorization: Bearer TOKEN'; the admin token is in the head's data dir "
              "(file 'token')");
  return false;
}

/* Parses the body's text into r->body; false with a 400 reply set when it
 * is not a JSON object. */
static bool http_parse_json(http_req_t *r, const char *text, size_t len) {
  json_error_t err;
  r->body = json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &err);
  if (r->body == NULL) {
    fail_t f;
    fail_set(&f, MUSTER_BAD_JSON, "the body is not valid JSON: %s (line %d, column %d)", err.text,
             err.line, err.column);
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

/* Checks size and content type of the body and parses it, or on an
 * HTTP_BODY_TEXT route keeps its text; false with a reply set. */
static bool http_parse_body(http_req_t *r, const http_route_t *rt, size_t limit) {
  struct evbuffer *in = evhttp_request_get_input_buffer(r->req);
  size_t len = evbuffer_get_length(in);
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
  const char *type = evhttp_find_header(evhttp_request_get_input_headers(r->req), "Content-Type");
  if (type && strncasecmp(type, "application/json", 16) != 0) {
    http_fail(r, MUSTER_UNSUPPORTED_MEDIA,
              "Content-Type is '%.100s'; send the body as application/json", type);
    return false;
  }
  const char *text = (const char *)evbuffer_pullup(in, -1);
  if (rt->flags & HTTP_BODY_TEXT) {
    /* A parse error is then answered from inside the handler's savepoint,
     * which rolls back having written nothing: the same reply. */
    r->body_text = text;
    r->body_len = len;
    return true;
  }
  return http_parse_json(r, text, len);
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
      evhttp_send_error(r->req, 500, NULL);
    } else {
      *reply = (reply_t){.req = r->req, .status = r->status, .type = r->raw_type,
                         .has_file = true, .fd = r->raw_fd, .file_len = r->raw_file_len,
                         .route = route, .start_us = start_us};
      http_enqueue_reply(r->head, reply);
    }
    r->raw_file = false;
  } else if (r->raw) {
    http_enqueue_body(r->head, r->req, r->status, r->raw_type, r->raw, r->raw_len, route,
                      start_us, false);
    r->raw = NULL;
  } else {
    char *text = jw_dump(r->reply, NULL);
    http_enqueue_body(r->head, r->req, r->status, NULL, text, 0, route, start_us,
                      r->no_flush && r->status < 400);
  }
  json_decref(r->reply);
  r->reply = NULL;
}

static void http_dispatch(struct evhttp_request *req, void *arg) {
  head_t *h = arg;
  http_req_t r = {.head = h, .req = req};
  TAILQ_INIT(&r.query);
  h->requests++;
  int64_t start_us = metrics_now_us();
  const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
  const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
  const char *query = uri ? evhttp_uri_get_query(uri) : NULL;
  const http_route_t *rt = NULL;
  if (path == NULL || (query && evhttp_parse_query_str(query, &r.query) != 0))
    http_fail(&r, MUSTER_BAD_REQUEST, "the request line could not be parsed");
  else if (h->stopping)
    http_fail(&r, MUSTER_UNAVAILABLE, "the head is shutting down");
  else if ((rt = http_route(&r, path)) == NULL)
    ;
  else if (!http_allowed(&r, rt))
    ;
  else if (http_parse_body(&r, rt, rt->body_limit ? rt->body_limit : h->cfg.max_body))
    http_run(&r, rt);
  shared_tap_dispatched(&r); /* a streamed upload that was not accepted */
  if (!r.parked) {
    http_enqueue_req(&r, rt, start_us);
  } else {
    json_decref(r.reply);
    /* A parked long-poll is counted now; its wait is the caller's choice,
     * so it stays out of the latency histogram. */
    metrics_http(rt ? (int)(rt - http_routes) : METRICS_ROUTE_NONE, 200, -1);
  }
  free(r.raw);
  json_decref(r.body);
  http_clear_params(&r);
  evhttp_clear_headers(&r.query);
}

int http_start(head_t *h) {
  h->http = evhttp_new(h->base);
  if (h->http == NULL)
    return -1;
  /* evhttp refuses bodies above its own limit with a bare 413; ours is the
   * route's limit, checked with a JSON error, so evhttp's is set well above. */
  evhttp_set_max_body_size(h->http, (ev_ssize_t)(h->cfg.max_body * 4 + 65536));
  evhttp_set_max_headers_size(h->http, 64 * 1024);
  evhttp_set_timeout(h->http, (int)(h->cfg.max_wait_ms / 1000) + 120);
  evhttp_set_allowed_methods(h->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_PUT |
                                          EVHTTP_REQ_DELETE | EVHTTP_REQ_HEAD |
                                          EVHTTP_REQ_PATCH | EVHTTP_REQ_OPTIONS);
  evhttp_set_gencb(h->http, http_dispatch, h);
  /* Every connection's input passes the upload tap (shared_upload.c), so
   * that blob uploads stream to disk instead of being buffered whole. */
  evhttp_set_bevcb(h->http, shared_tap_bevcb, h);
  struct evhttp_bound_socket *sock =
      evhttp_bind_socket_with_handle(h->http, h->cfg.listen_host, (ev_uint16_t)h->cfg.listen_port);
  if (sock == NULL) {
    log_msg(LOG_ERROR, "cannot listen on %s:%d: %s", h->cfg.listen_host, h->cfg.listen_port,
            evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
    return -1;
  }
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  if (getsockname(evhttp_bound_socket_get_fd(sock), (struct sockaddr *)&ss, &len) != 0)
    return -1;
  return ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                        : ((struct sockaddr_in *)&ss)->sin_port);
}

void http_stop(head_t *h) {
  if (h->http)
    evhttp_free(h->http);
  h->http = NULL;
}
