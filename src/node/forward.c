/*
 * forward.c — any-node access: the agent's HTTP port forwards to the head.
 *
 * Every request the agent does not serve itself (all but the node cache's,
 * cache_http.c: GET of shared data and /v1/node/cache, and the node-local
 * iterations', iter_local.c) is sent
 * to the head as it came: same method, path and query, the end-to-end headers
 * (Authorization included: the head alone checks tokens, so auth behaves
 * exactly as on the head) and the body.  The head's reply streams back as it
 * arrives: its status, reason, end-to-end headers, then the body chunk by chunk
 * (evhttp's header and chunk callbacks), so a long-poll's reply or a large
 * result is not held back.  Request bodies are read whole by evhttp before
 * forwarding (evhttp cannot stream them); the head enforces its own limits.
 *
 * Hop-by-hop headers (RFC 9110 section 7.6.1) are dropped both ways and
 * `X-Forwarded-For` / `Via` are added.  When the head cannot be reached, the
 * client gets `503 unavailable` in the usual error envelope; when the head's
 * reply breaks off mid-body, the client's connection is closed rather than the
 * reply ended, so a truncated body never looks complete.
 *
 * Stop (fwd_drain): once the agent's workers are gone, the loop runs on a
 * little while every request in flight to the head is cancelled and every
 * client, waiting or new, is answered `503 unavailable` with `Retry-After` and
 * `Connection: close`; the loop ends when those answers are written (their
 * connections closed), or after FWD_DRAIN_MS.  A client thus gets an answer
 * it knows to retry (libmuster and the Python client treat 503 as transient)
 * rather than a connection closed under its request.
 *
 * Connections to the head are kept in a pool and reused (keep-alive); a
 * long-poll occupies its connection, so there are as many as requests in flight.
 */
#include "node/agent.h"
#include "node/iter_local.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/http.h>
#include <event2/http_struct.h> /* the request's version: libevent 2.1 has no getter */
#include <event2/keyvalq_struct.h>
#include <event2/listener.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define FWD_TIMEOUT_S 3600         /* a request may wait this long (long-polls are shorter) */
#define FWD_MAX_BODY (1024L << 20) /* the head's own limit is far lower */
/* Retry-After of the stopping agent's 503 (seconds): an agent restarted by a
 * supervisor is usually listening again within one; sooner is pointless. */
#define FWD_RETRY_AFTER_S "1"
/* The longest a stopping agent waits for its 503s to be written: a 503 fits
 * in the socket's buffer, so only a client that reads nothing holds it. */
#define FWD_DRAIN_MS 2000
/* The most bytes of a client's request line and headers the agent reads:
 * evhttp's default is no limit, and it held in memory whatever a client sent
 * before the end of its headers.  Sixteen times the head's own limit (64 KiB,
 * answered 431 in the envelope), so that the head refuses in its words what
 * it would refuse; past this evhttp answers 400 with its own page. */
#define FWD_MAX_HEADERS (1L << 20)
/* Out of descriptors, the agent stops accepting for this long at a time. */
#define FWD_ACCEPT_PAUSE_MS 100
/* ... and says so at most this often. */
#define FWD_ACCEPT_SAY_MS 60000

/* A connection is idle in the agent's pool (`next` alone) or busy (on the
 * doubly linked busy list): its request in flight, or discarded and about to
 * be freed.  The busy list is what lets fwd_stop free them all. */
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
  struct evhttp_request *in; /* the client's request */
  fwd_conn_t *conn;
  int started; /* the reply to the client has started */
  int error;   /* the evhttp error, when the head's reply failed */
} fwd_req_t;

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

/* Non-zero for a header that must not cross the agent (`keep_length`: a
 * reply's Content-Length stays, so the client gets the body unchunked). */
static int fwd_is_hop(const char *key, int keep_length) {
  if (keep_length && strcasecmp(key, "Content-Length") == 0)
    return 0;
  for (int i = 0; fwd_hop_headers[i]; i++)
    if (strcasecmp(key, fwd_hop_headers[i]) == 0)
      return 1;
  return 0;
}

static void fwd_copy_headers(struct evkeyvalq *from, struct evkeyvalq *to, int keep_length) {
  for (struct evkeyval *h = from->tqh_first; h; h = h->next.tqe_next)
    if (!fwd_is_hop(h->key, keep_length))
      evhttp_add_header(to, h->key, h->value);
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
 * until then: should the loop end first, fwd_stop frees it (event_base_free
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

/* ---- replies ---- */

/* Once a reply is queued on `client` (NULL: the client left), evhttp is not
 * to read its connection until the reply is written (evhttp_send_done reads
 * again, for the next request).  See fwd_send_reply in agent.h. */
static void fwd_hold_input(struct evhttp_connection *client) {
  if (client)
    bufferevent_disable(evhttp_connection_get_bufferevent(client), EV_READ);
}

/* evhttp_send_reply and the two below queue their bytes and write them from
 * the loop, so `client` is still there when they return.  A reply to a HEAD
 * goes without its body, which evhttp would write after headers that say no
 * length: the client would read it as the start of the next reply. */
void fwd_send_reply(struct evhttp_request *in, int status, const char *reason,
                    struct evbuffer *body) {
  struct evhttp_connection *client = evhttp_request_get_connection(in);
  if (body && evhttp_request_get_command(in) == EVHTTP_REQ_HEAD) {
    char length[24];
    snprintf(length, sizeof length, "%zu", evbuffer_get_length(body));
    evhttp_add_header(evhttp_request_get_output_headers(in), "Content-Length", length);
    body = NULL;
  }
  evhttp_send_reply(in, status, reason, body);
  fwd_hold_input(client);
}

void fwd_send_reply_start(struct evhttp_request *in, int status, const char *reason) {
  struct evhttp_connection *client = evhttp_request_get_connection(in);
  evhttp_send_reply_start(in, status, reason);
  fwd_hold_input(client);
}

void fwd_send_reply_chunk(struct evhttp_request *in, struct evbuffer *body) {
  struct evhttp_connection *client = evhttp_request_get_connection(in);
  evhttp_send_reply_chunk(in, body);
  fwd_hold_input(client);
}

/* Answers the client with an error envelope (used before anything was sent). */
static void fwd_send_error(struct evhttp_request *in, int status, const char *code,
                           const char *message) {
  struct evbuffer *body = evbuffer_new();
  struct evkeyvalq *out = evhttp_request_get_output_headers(in);
  evhttp_add_header(out, "Content-Type", "application/json");
  if (body)
    evbuffer_add_printf(body, "{\"error\": {\"code\": \"%s\", \"message\": \"%s\"}}", code,
                        message);
  fwd_send_reply(in, status, NULL, body); /* NULL: the status's own reason */
  if (body)
    evbuffer_free(body);
}

static void fwd_drain_check(node_agent_t *a);

/* A client connection that got a stop reply closed: evhttp closes it once
 * the reply is written (Connection: close), or when the client went away. */
static void fwd_on_stop_reply_closed(struct evhttp_connection *client, void *arg) {
  node_agent_t *a = arg;
  (void)client;
  a->fwd_stop_replies--;
  fwd_drain_check(a);
}

void fwd_reply_stopping(node_agent_t *a, struct evhttp_request *in) {
  struct evhttp_connection *client = evhttp_request_get_connection(in);
  struct evkeyvalq *h = evhttp_request_get_output_headers(in);
  evhttp_add_header(h, "Retry-After", FWD_RETRY_AFTER_S);
  /* One answer per connection: a closed one also tells the drain it was written. */
  evhttp_add_header(h, "Connection", "close");
  if (client && a->fwd_draining == 1) {
    evhttp_connection_set_closecb(client, fwd_on_stop_reply_closed, a);
    a->fwd_stop_replies++;
  }
  char message[300];
  snprintf(message, sizeof message,
           "node agent %s is stopping; retry (its restarted agent, or another node)", a->name);
  fwd_send_error(in, 503, "unavailable", message);
}

/* The head's status line and headers arrived: start the client's reply. */
static int fwd_on_headers(struct evhttp_request *out, void *arg) {
  fwd_req_t *f = arg;
  struct evkeyvalq *to = evhttp_request_get_output_headers(f->in);
  fwd_copy_headers(evhttp_request_get_input_headers(out), to, 1);
  char via[160];
  snprintf(via, sizeof via, "1.1 %s (muster node)", f->agent->name);
  evhttp_add_header(to, "Via", via);
  const char *reason = evhttp_request_get_response_code_line(out);
  fwd_send_reply_start(f->in, evhttp_request_get_response_code(out), reason ? reason : "");
  f->started = 1;
  return 0;
}

/* A piece of the head's body: pass it on. */
static void fwd_on_chunk(struct evhttp_request *out, void *arg) {
  fwd_req_t *f = arg;
  fwd_send_reply_chunk(f->in, evhttp_request_get_input_buffer(out));
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
    struct evhttp_connection *client = evhttp_request_get_connection(f->in);
    if (client)
      evhttp_connection_free(client);
    else
      evhttp_send_reply_end(f->in); /* the client left already: this frees the request */
    return;
  }
  char message[512];
  snprintf(message, sizeof message, "node agent %s cannot reach the head at %s:%d: %s", a->name,
           a->head_host, a->head_port, why);
  fwd_send_error(f->in, 503, "unavailable", message);
}

/* The stop's word for a request still in flight (fwd_cancel_fn): a client
 * whose reply started has its connection closed (fwd_fail_client), one
 * whose reply did not gets the stop's 503. */
static void fwd_on_stop(void *owner) {
  fwd_req_t *f = owner;
  if (f->started)
    fwd_fail_client(f, "the node agent is stopping");
  else
    fwd_reply_stopping(f->agent, f->in);
  free(f);
}

/* The head's reply is complete (out != NULL) or failed (out == NULL). */
static void fwd_on_done(struct evhttp_request *out, void *arg) {
  fwd_req_t *f = arg;
  node_agent_t *a = f->agent;
  int ok = out != NULL && evhttp_request_get_response_code(out) != 0 && !f->error;
  if (ok && !f->started)
    fwd_on_headers(out, f);
  if (ok) {
    struct evbuffer *rest = evhttp_request_get_input_buffer(out);
    if (evbuffer_get_length(rest) > 0)
      fwd_send_reply_chunk(f->in, rest);
    evhttp_send_reply_end(f->in);
  } else {
    fwd_fail_client(f, fwd_error_text(f->error));
  }
  /* A HEAD answered with an error may carry a body it should not (the head's
   * JSON error), which would be read as the next reply on this connection. */
  if (evhttp_request_get_command(f->in) == EVHTTP_REQ_HEAD &&
      (!ok || evhttp_request_get_response_code(out) != 200))
    fwd_conn_discard(a, f->conn);
  else
    fwd_conn_put(a, f->conn);
  free(f);
}

/* Adds X-Forwarded-For with the client's address. */
static void fwd_add_forwarded(struct evhttp_request *in, struct evkeyvalq *to) {
  struct evhttp_connection *client = evhttp_request_get_connection(in);
  char *peer = NULL;
  ev_uint16_t port = 0;
  if (client)
    evhttp_connection_get_peer(client, &peer, &port);
  const char *before = evhttp_find_header(evhttp_request_get_input_headers(in), "X-Forwarded-For");
  char value[512];
  snprintf(value, sizeof value, "%s%s%s", before ? before : "", before ? ", " : "",
           peer ? peer : "unknown");
  evhttp_remove_header(to, "X-Forwarded-For");
  evhttp_add_header(to, "X-Forwarded-For", value);
}

/* True for the HTTP versions the head speaks, 1.1 and 1.0: evhttp takes
 * others it can parse (HTTP/0.9, HTTP/1.2) and would answer them in their
 * own version, a status line no HTTP/1.x client reads. */
static bool fwd_version_ok(const struct evhttp_request *in) {
  return in->major == 1 && (in->minor == 0 || in->minor == 1);
}

/* Answers a request of another version 505 in the envelope, as the head
 * does, on an HTTP/1.1 status line, and closes the connection. */
static void fwd_refuse_version(struct evhttp_request *in) {
  char message[160];
  snprintf(message, sizeof message, "HTTP/%d.%d: this server speaks HTTP/1.1 and HTTP/1.0",
           in->major, in->minor);
  in->major = 1;
  in->minor = 1;
  evhttp_add_header(evhttp_request_get_output_headers(in), "Connection", "close");
  fwd_send_error(in, 505, "bad_request", message);
}

static void fwd_on_request(struct evhttp_request *in, void *arg) {
  node_agent_t *a = arg;
  if (!fwd_version_ok(in)) {
    fwd_refuse_version(in);
    return;
  }
  if (a->fwd_draining) { /* the cache and the iterations stopped too */
    fwd_reply_stopping(a, in);
    return;
  }
  /* shared data and /v1/node/cache: the node cache's; cluster_sync false
   * iterations: the agent's own (iter_local.c) */
  if (!cache_http_handle(a, in) && !iter_local_handle(a, in))
    fwd_forward(a, in);
}

void fwd_add_host(const node_agent_t *a, struct evkeyvalq *to) {
  char host[sizeof a->head_host + 16];
  bool v6 = strchr(a->head_host, ':') != NULL;
  snprintf(host, sizeof host, "%s%s%s:%d", v6 ? "[" : "", a->head_host, v6 ? "]" : "",
           a->head_port);
  evhttp_add_header(to, "Host", host);
}

void fwd_forward(node_agent_t *a, struct evhttp_request *in) {
  if (a->fwd_draining) {
    fwd_reply_stopping(a, in);
    return;
  }
  fwd_req_t *f = calloc(1, sizeof *f);
  fwd_conn_t *conn = f ? fwd_conn_get(a) : NULL;
  struct evhttp_request *out = conn ? evhttp_request_new(fwd_on_done, f) : NULL;
  if (out == NULL) {
    if (conn)
      fwd_conn_put(a, conn);
    free(f);
    fwd_send_error(in, 503, "unavailable", "the node agent is out of memory");
    return;
  }
  f->agent = a;
  f->in = in;
  f->conn = conn;
  fwd_conn_set_owner(conn, fwd_on_stop, f);
  evhttp_request_set_header_cb(out, fwd_on_headers);
  evhttp_request_set_chunked_cb(out, fwd_on_chunk);
  evhttp_request_set_error_cb(out, fwd_on_error);
  struct evkeyvalq *to = evhttp_request_get_output_headers(out);
  fwd_copy_headers(evhttp_request_get_input_headers(in), to, 0);
  fwd_add_forwarded(in, to);
  fwd_add_host(a, to);
  struct evbuffer *body = evhttp_request_get_input_buffer(in);
  size_t body_len = evbuffer_get_length(body);
  /* evhttp adds a Content-Length to POST and PUT only; a body of any other
   * method, or an explicit empty one, needs it said. */
  if (body_len > 0 ||
      evhttp_find_header(evhttp_request_get_input_headers(in), "Content-Length") != NULL) {
    char length[32];
    snprintf(length, sizeof length, "%zu", body_len);
    evhttp_add_header(to, "Content-Length", length);
  }
  evbuffer_add_buffer(evhttp_request_get_output_buffer(out), body);
  /* On failure evhttp_make_request has already called fwd_on_done (with NULL),
   * which answered the client and freed `f`. */
  evhttp_make_request(conn->evcon, out, evhttp_request_get_command(in), evhttp_request_get_uri(in));
}

/* Parses the head URL into host and port; 0 or -1. */
static int fwd_parse_head(node_agent_t *a, char *err, size_t err_size) {
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

/* Splits "HOST:PORT" / "[V6]:PORT"; 0 or -1. */
static int fwd_split_listen(const char *listen, char *host, size_t size, int *port) {
  const char *colon = strrchr(listen, ':');
  if (colon == NULL)
    return -1;
  char *end;
  long p = strtol(colon + 1, &end, 10);
  if (colon[1] == '\0' || *end != '\0' || p < 0 || p > 65535)
    return -1;
  const char *start = listen;
  size_t len = (size_t)(colon - listen);
  if (len >= 2 && start[0] == '[' && start[len - 1] == ']') {
    start++;
    len -= 2;
  }
  if (len == 0 || len >= size)
    return -1;
  memcpy(host, start, len);
  host[len] = '\0';
  *port = (int)p;
  return 0;
}

/* The API port cannot accept a connection, mostly for want of descriptors
 * (clients holding many connections open, or a low `ulimit -n`).  libevent's
 * own handling logs a line and tries again at once for as long as that
 * lasts: the loop spins and the log grows by megabytes a second.  The port
 * pauses instead, FWD_ACCEPT_PAUSE_MS at a time (clients wait in the listen
 * backlog meanwhile), and says so once a minute at most. */
static node_agent_t *fwd_accepting; /* the agent whose port fwd_on_accept_error serves */

static void fwd_on_accept_error(struct evconnlistener *listener, void *arg) {
  /* `arg` is the listener's own, which evhttp made its struct evhttp; a
   * process runs one agent with one port, so that agent is the one. */
  node_agent_t *a = fwd_accepting;
  (void)arg;
  int err = EVUTIL_SOCKET_ERROR();
  struct timeval pause = {0, FWD_ACCEPT_PAUSE_MS * 1000};
  evconnlistener_disable(listener);
  evtimer_add(a->fwd_accept_ev, &pause);
  a->fwd_accept_pauses++;
  int64_t now = agent_now_ms();
  if (a->fwd_accept_said_ms != 0 && now - a->fwd_accept_said_ms < FWD_ACCEPT_SAY_MS)
    return;
  bool fds = err == EMFILE || err == ENFILE;
  char since[80] = "said once a minute at most";
  if (a->fwd_accept_said_ms != 0)
    snprintf(since, sizeof since, "%d pauses since this was last said", a->fwd_accept_pauses);
  agent_log(a, "API port: cannot accept connections: %s%s; trying again every %d ms (%s)",
            evutil_socket_error_to_string(err),
            fds ? " (every descriptor is in use: clients hold connections open, or the "
                  "limit, ulimit -n, is low)"
                : "",
            FWD_ACCEPT_PAUSE_MS, since);
  a->fwd_accept_said_ms = now;
  a->fwd_accept_pauses = 0;
}

static void fwd_on_accept_again(evutil_socket_t fd, short what, void *arg) {
  node_agent_t *a = arg;
  (void)fd;
  (void)what;
  if (a->fwd_listener)
    evconnlistener_enable(a->fwd_listener);
}

/* Binds the API port on `host` and `port` (0: any free one) and sets
 * a->listen_port; 0 or -1. */
static int fwd_listen(node_agent_t *a, const char *host, int port) {
  struct evhttp_bound_socket *sock =
      evhttp_bind_socket_with_handle(a->http, host, (ev_uint16_t)port);
  a->fwd_accept_ev = evtimer_new(a->base, fwd_on_accept_again, a);
  if (sock == NULL || a->fwd_accept_ev == NULL)
    return -1;
  a->fwd_listener = evhttp_bound_socket_get_listener(sock);
  fwd_accepting = a;
  evconnlistener_set_error_cb(a->fwd_listener, fwd_on_accept_error);
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  if (getsockname(evhttp_bound_socket_get_fd(sock), (struct sockaddr *)&ss, &len) == 0)
    port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                          : ((struct sockaddr_in *)&ss)->sin_port);
  a->listen_port = port;
  return 0;
}

int fwd_start(node_agent_t *a, const char *listen, char *err, size_t err_size) {
  char host[256];
  int port = 0;
  if (fwd_split_listen(listen, host, sizeof host, &port) != 0) {
    snprintf(err, err_size, "--listen '%s': expected HOST:PORT", listen);
    return -1;
  }
  if (fwd_parse_head(a, err, err_size) != 0)
    return -1;
  a->http = evhttp_new(a->base);
  if (a->http == NULL) {
    snprintf(err, err_size, "out of memory");
    return -1;
  }
  evhttp_set_max_headers_size(a->http, FWD_MAX_HEADERS);
  evhttp_set_max_body_size(a->http, FWD_MAX_BODY);
  evhttp_set_timeout(a->http, FWD_TIMEOUT_S);
  /* Every method evhttp knows but CONNECT (whose target is no path) goes
   * on to the head, which answers those it does not take 405 in the
   * envelope; evhttp's own refusal is an HTML page. */
  evhttp_set_allowed_methods(a->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_PUT |
                                          EVHTTP_REQ_DELETE | EVHTTP_REQ_HEAD | EVHTTP_REQ_PATCH |
                                          EVHTTP_REQ_OPTIONS | EVHTTP_REQ_TRACE);
  evhttp_set_gencb(a->http, fwd_on_request, a);
  if (fwd_listen(a, host, port) != 0) {
    snprintf(err, err_size, "cannot listen on %s (in use, or not an address of this machine)",
             listen);
    return -1;
  }
  return a->listen_port;
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

/* Tells the owner of every request in flight to the head that the agent
 * stops (they answer their clients) and frees its connection with the
 * request, whose callbacks are thus never called.  Discarded connections,
 * whose deferred free is pending, are left to it (or to fwd_stop). */
static void fwd_cancel_owned(node_agent_t *a) {
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

/* Ends the loop once the drain's answers are all written. */
static void fwd_drain_check(node_agent_t *a) {
  if (a->fwd_draining == 1 && a->fwd_stop_replies <= 0) {
    a->fwd_draining = 2;
    event_base_loopexit(a->base, NULL);
  }
}

static void fwd_on_drain_timeout(evutil_socket_t fd, short what, void *arg) {
  node_agent_t *a = arg;
  (void)fd;
  (void)what;
  if (a->fwd_draining == 1) {
    agent_log(a, "%d client%s did not take the stop's answer within %d ms; closing",
              a->fwd_stop_replies, a->fwd_stop_replies == 1 ? "" : "s", FWD_DRAIN_MS);
    a->fwd_stop_replies = 0;
    fwd_drain_check(a);
  }
}

void fwd_drain(node_agent_t *a) {
  if (a->http == NULL) {
    event_base_loopexit(a->base, NULL);
    return;
  }
  if (a->fwd_drain_ev != NULL || a->fwd_draining == 2)
    return;
  a->fwd_draining = 1;
  fwd_cancel_owned(a);
  struct timeval bound = {FWD_DRAIN_MS / 1000, (FWD_DRAIN_MS % 1000) * 1000};
  a->fwd_drain_ev = evtimer_new(a->base, fwd_on_drain_timeout, a);
  if (a->fwd_drain_ev == NULL || evtimer_add(a->fwd_drain_ev, &bound) != 0)
    a->fwd_stop_replies = 0; /* out of memory: no wait, no bound needed */
  fwd_drain_check(a);
}

void fwd_stop(node_agent_t *a) {
  /* The owners first, while their clients' requests exist: evhttp_free
   * frees those (except a client's that left, which a reply frees). */
  fwd_cancel_owned(a);
  a->fwd_draining = 2; /* a closed connection's callback ends no loop any more */
  if (a->http)
    evhttp_free(a->http); /* with its listener */
  a->http = NULL;
  a->fwd_listener = NULL;
  fwd_accepting = NULL;
  if (a->fwd_accept_ev)
    event_free(a->fwd_accept_ev);
  a->fwd_accept_ev = NULL;
  if (a->fwd_drain_ev)
    event_free(a->fwd_drain_ev);
  a->fwd_drain_ev = NULL;
  fwd_conns_free(a->fwd_busy);
  a->fwd_busy = NULL;
  fwd_conns_free(a->fwd_pool);
  a->fwd_pool = NULL;
}
