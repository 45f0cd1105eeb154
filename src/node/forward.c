/*
 * forward.c — any-node access: the agent forwards to the head what it does
 * not serve itself.
 *
 * Every request the port does not hand to the node cache (cache_http.c: GET
 * of shared data and /v1/node/cache) or to the node-local iterations
 * (iter_local.c) is sent to the head as it came: same method, path and
 * query, the end-to-end headers (Authorization included: the head alone
 * checks tokens, so auth behaves exactly as on the head) and the body, read
 * whole by the port (port.c).  The head's reply streams back as it arrives:
 * its status, end-to-end headers, then the body chunk by chunk (evhttp's
 * header and chunk callbacks, h1's streamed reply), so a long-poll's reply or
 * a large result is not held back.  While the client reads more slowly than
 * the head sends, reading from the head pauses (h1_respond_full), so the
 * agent holds at most about H1_STREAM_HIGH bytes of a reply.
 *
 * Hop-by-hop headers (RFC 9110 section 7.6.1), the fixed ones and those a
 * message names in its own Connection header, are dropped both ways and
 * `X-Forwarded-For` / `Via` are added.  When the head cannot be reached, the
 * client gets `503 unavailable` in the usual error envelope; when the head's
 * reply breaks off mid-body, the client's connection is closed rather than the
 * reply ended (h1_respond_abort), so a truncated body never looks complete.
 *
 * Connections to the head are evhttp's client connections, kept in a pool and
 * reused (keep-alive); a long-poll occupies its connection, so there are as
 * many as requests in flight.  A request's owner is told when the agent
 * stops with it in flight (fwd_cancel_all), and answers its client.
 */
#include "node/agent.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define FWD_TIMEOUT_S 3600 /* a request may wait this long (long-polls are shorter) */

/* A connection is idle in the agent's pool (`next` alone) or busy (on the
 * doubly linked busy list): its request in flight, or discarded and about to
 * be freed.  The busy list is what lets fwd_cancel_all and fwd_free reach
 * them all. */
struct fwd_conn {
  node_agent_t *agent;
  struct evhttp_connection *evcon;
  struct fwd_conn *next, *prev;
  fwd_cancel_fn cancel; /* its request's owner, told when the agent stops (NULL: none) */
  void *owner;
};

/* One request in flight. */
typedef struct {
  node_agent_t *agent;
  h1_req_t *q; /* the client's request, held until its reply ends */
  fwd_conn_t *conn;
  bool started; /* the reply to the client has started */
  bool paused;  /* reading the head's reply waits for the client to read */
  int error;    /* the evhttp error, when the head's reply failed */
} fwd_req_t;

/* Headers that do not cross the agent either way (RFC 9110, 7.6.1), and
 * those it writes itself: the framing (Content-Length, the reply's Date)
 * and, towards the head, an Expect the agent met already. */
static const char *const fwd_hop_headers[] = {"Connection",
                                              "Keep-Alive",
                                              "Proxy-Connection",
                                              "Proxy-Authenticate",
                                              "Proxy-Authorization",
                                              "TE",
                                              "Trailer",
                                              "Transfer-Encoding",
                                              "Upgrade",
                                              "Host",
                                              "Content-Length",
                                              NULL};

static bool fwd_is_hop(const char *key) {
  for (int i = 0; fwd_hop_headers[i]; i++)
    if (strcasecmp(key, fwd_hop_headers[i]) == 0)
      return true;
  return false;
}

/* True when `list`, a Connection header's value, names `key`: its names are
 * separated by commas, with optional spaces or tabs around each, and compared
 * without regard to case.  A header a message names there is hop-by-hop for
 * that message alone (RFC 9110, 7.6.1), so the agent drops it too. */
static bool fwd_connection_names(const char *list, const char *key) {
  size_t key_len = strlen(key);
  for (const char *p = list; *p != '\0';) {
    p += strspn(p, " \t,");
    size_t len = strcspn(p, ",");
    size_t name_len = len;
    while (name_len > 0 && (p[name_len - 1] == ' ' || p[name_len - 1] == '\t'))
      name_len--;
    if (name_len == key_len && strncasecmp(p, key, key_len) == 0)
      return true;
    p += len;
  }
  return false;
}

/* True when one of the client's Connection headers in `q` names `key`. */
static bool fwd_request_names_hop(const h1_req_t *q, const char *key) {
  const char *name, *value;
  for (size_t i = 0; h1_header_at(q, i, &name, &value); i++)
    if (strcasecmp(name, "Connection") == 0 && fwd_connection_names(value, key))
      return true;
  return false;
}

/* True when one of the head's Connection headers in `from` names `key`. */
static bool fwd_reply_names_hop(const struct evkeyvalq *from, const char *key) {
  for (const struct evkeyval *h = from->tqh_first; h; h = h->next.tqe_next)
    if (strcasecmp(h->key, "Connection") == 0 && fwd_connection_names(h->value, key))
      return true;
  return false;
}

/* The methods evhttp's client sends, which the agent thus passes on. */
static const struct {
  const char *name;
  enum evhttp_cmd_type cmd;
} fwd_methods[] = {
    {"GET", EVHTTP_REQ_GET},     {"POST", EVHTTP_REQ_POST},       {"HEAD", EVHTTP_REQ_HEAD},
    {"PUT", EVHTTP_REQ_PUT},     {"DELETE", EVHTTP_REQ_DELETE},   {"OPTIONS", EVHTTP_REQ_OPTIONS},
    {"TRACE", EVHTTP_REQ_TRACE}, {"CONNECT", EVHTTP_REQ_CONNECT}, {"PATCH", EVHTTP_REQ_PATCH}};

/* The evhttp command of `method`; false for one evhttp cannot send. */
static bool fwd_method(const char *method, enum evhttp_cmd_type *cmd) {
  for (size_t i = 0; i < sizeof fwd_methods / sizeof fwd_methods[0]; i++)
    if (strcmp(method, fwd_methods[i].name) == 0) {
      *cmd = fwd_methods[i].cmd;
      return true;
    }
  return false;
}

bool fwd_method_refused(node_agent_t *a, h1_req_t *q) {
  enum evhttp_cmd_type cmd;
  if (fwd_method(h1_method(q), &cmd))
    return false;
  port_reply_error(q, 501, "bad_request",
                   "%.20s: node agent %s passes on GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS, "
                   "TRACE and CONNECT; no endpoint takes another method",
                   h1_method(q), a->name);
  return true;
}

/* ---- the connection pool ---- */

static void fwd_busy_add(node_agent_t *a, fwd_conn_t *c) {
  c->prev = NULL;
  c->next = a->fwd_busy;
  if (c->next)
    c->next->prev = c;
  a->fwd_busy = c;
}

static void fwd_busy_remove(node_agent_t *a, fwd_conn_t *c) {
  if (c->prev)
    c->prev->next = c->next;
  else
    a->fwd_busy = c->next;
  if (c->next)
    c->next->prev = c->prev;
  c->next = c->prev = NULL;
}

fwd_conn_t *fwd_conn_get(node_agent_t *a) {
  fwd_conn_t *c = a->fwd_pool;
  if (c != NULL) {
    a->fwd_pool = c->next;
  } else if ((c = calloc(1, sizeof *c)) != NULL) {
    c->evcon = evhttp_connection_base_new(a->base, NULL, a->head_host, (ev_uint16_t)a->head_port);
    if (c->evcon == NULL) {
      free(c);
      return NULL;
    }
    evhttp_connection_set_timeout(c->evcon, FWD_TIMEOUT_S);
    /* The head may answer before it read the whole request (a 413 for a body
     * over its limit, a 431) and close: read that answer rather than fail
     * on the write it cut short, so the client gets the head's refusal. */
    evhttp_connection_set_flags(c->evcon, EVHTTP_CON_READ_ON_WRITE_ERROR);
    c->agent = a;
  } else {
    return NULL;
  }
  c->cancel = NULL;
  c->owner = NULL;
  fwd_busy_add(a, c);
  return c;
}

void fwd_conn_set_owner(fwd_conn_t *c, fwd_cancel_fn cancel, void *owner) {
  c->cancel = cancel;
  c->owner = owner;
}

void fwd_conn_put(node_agent_t *a, fwd_conn_t *c) {
  fwd_busy_remove(a, c);
  c->next = a->fwd_pool;
  a->fwd_pool = c;
}

struct evhttp_connection *fwd_conn_evcon(fwd_conn_t *c) {
  return c->evcon;
}

/* The deferred free of a discarded connection, which stays on the busy list
 * until then: should the loop end first, fwd_free frees it (event_base_free
 * drops the pending call without making it). */
static void fwd_conn_free_cb(evutil_socket_t fd, short what, void *arg) {
  fwd_conn_t *c = arg;
  (void)fd;
  (void)what;
  fwd_busy_remove(c->agent, c);
  evhttp_connection_free(c->evcon);
  free(c);
}

void fwd_conn_discard(node_agent_t *a, fwd_conn_t *c) {
  const struct timeval now = {0, 0};
  c->cancel = NULL; /* its request has ended */
  if (event_base_once(a->base, -1, EV_TIMEOUT, fwd_conn_free_cb, c, &now) != 0)
    fwd_conn_put(a, c); /* out of memory: keep it rather than leak it */
}

void fwd_add_host(const node_agent_t *a, struct evkeyvalq *to) {
  char host[sizeof a->head_host + 16];
  bool v6 = strchr(a->head_host, ':') != NULL;
  snprintf(host, sizeof host, "%s%s%s:%d", v6 ? "[" : "", a->head_host, v6 ? "]" : "",
           a->head_port);
  evhttp_add_header(to, "Host", host);
}

/* ---- the head's reply, passed on ---- */

/* Reading the head's reply on `f`'s connection pauses or goes on. */
static void fwd_read_head(fwd_req_t *f, bool on) {
  struct bufferevent *bev = evhttp_connection_get_bufferevent(f->conn->evcon);
  f->paused = !on;
  if (on)
    bufferevent_enable(bev, EV_READ);
  else
    bufferevent_disable(bev, EV_READ);
}

/* The client read most of what waited (or went away): read on from the head. */
static void fwd_on_client_ready(void *arg) {
  fwd_read_head(arg, true);
}

/* The head's status line and headers arrived: start the client's reply. */
static int fwd_on_headers(struct evhttp_request *out, void *arg) {
  fwd_req_t *f = arg;
  struct evkeyvalq *from = evhttp_request_get_input_headers(out);
  for (struct evkeyval *h = from->tqh_first; h; h = h->next.tqe_next)
    if (!fwd_is_hop(h->key) && !fwd_reply_names_hop(from, h->key) &&
        strcasecmp(h->key, "Date") != 0)
      h1_add_header(f->q, h->key, h->value);
  char via[160];
  snprintf(via, sizeof via, "1.1 %s (muster node)", f->agent->name);
  h1_add_header(f->q, "Via", via);
  const char *length = evhttp_find_header(from, "Content-Length");
  char *end = NULL;
  long long n = length ? strtoll(length, &end, 10) : -1;
  if (length && (*end != '\0' || n < 0))
    n = -1; /* the head writes no such length; chunked then */
  h1_respond_start(f->q, evhttp_request_get_response_code(out), NULL, n);
  f->started = true;
  return 0;
}

/* Passes the head's body bytes in `buf` on to the client (dropped when it
 * went away) and takes them out of `buf`. */
static void fwd_pass_on(fwd_req_t *f, struct evbuffer *buf) {
  struct evbuffer_iovec v[8];
  for (;;) {
    int n = evbuffer_peek(buf, -1, NULL, v, 8);
    if (n <= 0)
      return;
    size_t took = 0;
    for (int i = 0; i < n && i < 8; i++) {
      h1_respond_data(f->q, v[i].iov_base, v[i].iov_len);
      took += v[i].iov_len;
    }
    evbuffer_drain(buf, took);
  }
}

/* A piece of the head's body: pass it on; pause when the client is behind. */
static void fwd_on_chunk(struct evhttp_request *out, void *arg) {
  fwd_req_t *f = arg;
  fwd_pass_on(f, evhttp_request_get_input_buffer(out));
  if (h1_respond_full(f->q)) {
    fwd_read_head(f, false);
    h1_respond_wait(f->q, fwd_on_client_ready, f);
  }
}

static void fwd_on_error(enum evhttp_request_error error, void *arg) {
  fwd_req_t *f = arg;
  f->error = (int)error + 1;
}

static const char *fwd_error_text(int error) {
  switch (error - 1) {
  case EVREQ_HTTP_TIMEOUT:
    return "timed out";
  case EVREQ_HTTP_EOF:
    return "connection refused or closed";
  case EVREQ_HTTP_INVALID_HEADER:
    return "invalid reply headers";
  case EVREQ_HTTP_BUFFER_ERROR:
    return "connection error";
  case EVREQ_HTTP_DATA_TOO_LONG:
    return "reply too large";
  case -1: /* evhttp reports no error when the connection could not be made */
    return "could not connect to it";
  default:
    return "request failed";
  }
}

/* The head's reply failed or will never come (`why`): the client gets a 503
 * when its reply has not started, else its connection closed, so that a cut
 * body never looks complete. */
static void fwd_fail_client(fwd_req_t *f, const char *why) {
  node_agent_t *a = f->agent;
  if (f->started) {
    h1_respond_abort(f->q);
    return;
  }
  port_reply_error(f->q, 503, "unavailable", "node agent %s cannot reach the head at %s:%d: %s",
                   a->name, a->head_host, a->head_port, why);
}

/* The stop's word for a request still in flight (fwd_cancel_fn): a client
 * whose reply started has its connection closed (fwd_fail_client), one
 * whose reply did not gets the stop's 503. */
static void fwd_on_stop(void *owner) {
  fwd_req_t *f = owner;
  if (f->started)
    fwd_fail_client(f, "the node agent is stopping");
  else
    port_reply_stopping(f->agent, f->q);
  free(f);
}

/* The head's reply is complete (out != NULL) or failed (out == NULL). */
static void fwd_on_done(struct evhttp_request *out, void *arg) {
  fwd_req_t *f = arg;
  node_agent_t *a = f->agent;
  int status = out != NULL && !f->error ? evhttp_request_get_response_code(out) : 0;
  bool head = strcmp(h1_method(f->q), "HEAD") == 0; /* answered, f->q may be freed */
  if (status != 0 && !f->started)
    fwd_on_headers(out, f);
  if (status != 0) {
    fwd_pass_on(f, evhttp_request_get_input_buffer(out));
    h1_respond_end(f->q);
  } else {
    fwd_fail_client(f, fwd_error_text(f->error));
  }
  /* A HEAD answered with an error may carry a body it should not (the head's
   * JSON error), which would be read as the next reply on this connection. */
  if (head && status != 200)
    fwd_conn_discard(a, f->conn);
  else
    fwd_conn_put(a, f->conn);
  free(f);
}

/* ---- the client's request, passed on ---- */

/* Copies the end-to-end headers of `q` and adds X-Forwarded-For (the
 * client's address after the ones it named) and the head's Host. */
static void fwd_request_headers(node_agent_t *a, h1_req_t *q, struct evkeyvalq *to) {
  const char *name, *value;
  for (size_t i = 0; h1_header_at(q, i, &name, &value); i++)
    if (!fwd_is_hop(name) && !fwd_request_names_hop(q, name) && strcasecmp(name, "Expect") != 0 &&
        strcasecmp(name, "X-Forwarded-For") != 0)
      evhttp_add_header(to, name, value);
  char peer[64];
  const char *before = h1_header(q, "X-Forwarded-For");
  char forwarded[512];
  snprintf(forwarded, sizeof forwarded, "%s%s%s", before ? before : "", before ? ", " : "",
           h1_peer(q, peer, sizeof peer) ? peer : "unknown");
  evhttp_add_header(to, "X-Forwarded-For", forwarded);
  fwd_add_host(a, to);
}

/* Moves the body of `q` (read whole by the port) into `out`'s, with its
 * length: evhttp adds one to POST and PUT only, and a body of any other
 * method, or an explicit empty one, needs it said. */
static void fwd_request_body(h1_req_t *q, struct evhttp_request *out) {
  struct evbuffer *body = port_body(q);
  size_t len = body ? evbuffer_get_length(body) : 0;
  if (len > 0 || h1_length(q) < 0 || h1_header(q, "Content-Length") != NULL) {
    char length[32];
    snprintf(length, sizeof length, "%zu", len);
    evhttp_add_header(evhttp_request_get_output_headers(out), "Content-Length", length);
  }
  if (body)
    evbuffer_add_buffer(evhttp_request_get_output_buffer(out), body);
}

char *fwd_target(h1_req_t *q) {
  const char *path = h1_path(q), *query = h1_query(q);
  size_t len = strlen(path) + (query ? strlen(query) + 1 : 0) + 1;
  char *target = malloc(len);
  if (target)
    snprintf(target, len, "%s%s%s", path, query ? "?" : "", query ? query : "");
  return target;
}

void fwd_forward(node_agent_t *a, h1_req_t *q) {
  enum evhttp_cmd_type cmd;
  if (a->port_draining) {
    port_reply_stopping(a, q);
    return;
  }
  if (!fwd_method(h1_method(q), &cmd)) {
    fwd_method_refused(a, q);
    return;
  }
  fwd_req_t *f = calloc(1, sizeof *f);
  char *target = f ? fwd_target(q) : NULL;
  fwd_conn_t *conn = target ? fwd_conn_get(a) : NULL;
  struct evhttp_request *out = conn ? evhttp_request_new(fwd_on_done, f) : NULL;
  if (out == NULL) {
    if (conn)
      fwd_conn_put(a, conn);
    free(target);
    free(f);
    port_reply_error(q, 503, "unavailable", "node agent %s is out of memory", a->name);
    return;
  }
  *f = (fwd_req_t){.agent = a, .q = q, .conn = conn};
  fwd_conn_set_owner(conn, fwd_on_stop, f);
  evhttp_request_set_header_cb(out, fwd_on_headers);
  evhttp_request_set_chunked_cb(out, fwd_on_chunk);
  evhttp_request_set_error_cb(out, fwd_on_error);
  fwd_request_headers(a, q, evhttp_request_get_output_headers(out));
  fwd_request_body(q, out);
  /* On failure evhttp_make_request has already called fwd_on_done (with NULL),
   * which answered the client and freed `f`. */
  evhttp_make_request(conn->evcon, out, cmd, target);
  free(target);
}

/* ---- life ---- */

int fwd_start(node_agent_t *a, char *err, size_t err_size) {
  struct evhttp_uri *uri = evhttp_uri_parse(a->cfg->head_url);
  const char *scheme = uri ? evhttp_uri_get_scheme(uri) : NULL;
  const char *host = uri ? evhttp_uri_get_host(uri) : NULL;
  int rc = -1;
  if (scheme == NULL || strcasecmp(scheme, "http") != 0 || host == NULL || host[0] == '\0')
    snprintf(err, err_size, "cannot forward to '%s': need http://HOST:PORT", a->cfg->head_url);
  else if (strlen(host) >= sizeof a->head_host)
    snprintf(err, err_size, "the head's host name is too long");
  else {
    snprintf(a->head_host, sizeof a->head_host, "%s", host);
    a->head_port = evhttp_uri_get_port(uri) > 0 ? evhttp_uri_get_port(uri) : 80;
    rc = 0;
  }
  if (uri)
    evhttp_uri_free(uri);
  return rc;
}

/* Frees a list of connections linked by `next` (closing each, and freeing
 * the request in flight on it without calling its callbacks). */
static void fwd_conns_free(fwd_conn_t *c) {
  for (fwd_conn_t *next; c; c = next) {
    next = c->next;
    evhttp_connection_free(c->evcon);
    free(c);
  }
}

void fwd_cancel_all(node_agent_t *a) {
  for (fwd_conn_t *c = a->fwd_busy, *next; c; c = next) {
    next = c->next; /* an owner's answer touches no other connection */
    if (c->cancel == NULL)
      continue;
    fwd_cancel_fn cancel = c->cancel;
    c->cancel = NULL;
    cancel(c->owner);
    fwd_busy_remove(a, c);
    evhttp_connection_free(c->evcon);
    free(c);
  }
}

void fwd_free(node_agent_t *a) {
  fwd_conns_free(a->fwd_busy);
  a->fwd_busy = NULL;
  fwd_conns_free(a->fwd_pool);
  a->fwd_pool = NULL;
}
