/*
 * forward.c — any-node access: the agent forwards to the head what it does
 * not serve itself.
 *
 * Every request the port does not hand to the node cache (cache_http.c: GET
 * of shared data and /v1/node/cache) or to the node-local iterations
 * (iter_local.c) is sent to the head as it came: same method (any: the head
 * answers one it does not know 405), path and query, the end-to-end headers
 * (Authorization included: the head alone checks tokens, so auth behaves
 * exactly as on the head) and the body.  The agent's own client carries it
 * (upstream.c; docs/design-notes.md, "The node agent's client to the head").
 *
 * A body goes as it arrives (fwd_forward_stream): the port routes a request
 * by its line and headers, the request's head goes to the head at once and
 * each piece of the body follows as h1 reads it, with the client's framing
 * kept (Content-Length, or chunked), so a body cut short shows on the head as
 * cut.  While the head's socket is backed up (FWD_BODY_HIGH bytes wait),
 * reading the client pauses (h1_body_pause), so an upload holds a few hundred
 * KiB of the agent's memory whatever its size.  `Expect: 100-continue` is
 * relayed: the head's 100 becomes the agent's 100 to the client, and a final
 * answer before it (a refusal: a bad token, a level conflict, a body over the
 * head's limit) goes to the client at once, the body unread, the connection
 * closed after it (h1_body_refuse).  A head that answers early while the body
 * flows (sent without Expect, or after the 100) has its answer passed on at
 * once too, and the rest of the body is read and dropped, up to FWD_DROP_MAX,
 * keeping the connection, as the head does (h1_body_drop).  A client that
 * goes away mid-body cuts the
 * request to the head (its connection closes).  Requests the agent serves
 * itself, or routes only once their body is read (an iteration's creation),
 * come whole (fwd_forward).
 *
 * The head's reply streams back as it arrives: its status, end-to-end
 * headers, then the body piece by piece (h1's streamed reply).  While the
 * client reads more slowly than the head sends, reading from the head pauses
 * (h1_respond_full), so the agent holds at most about H1_STREAM_HIGH bytes of
 * a reply.
 *
 * Hop-by-hop headers (RFC 9110 section 7.6.1), the fixed ones and those a
 * message names in its own Connection header, are dropped both ways and
 * `X-Forwarded-For` / `Via` are added.  When the head cannot be reached, the
 * client gets `503 unavailable` in the usual error envelope; when the head's
 * reply breaks off mid-body, the client's connection is closed rather than the
 * reply ended (h1_respond_abort), so a truncated body never looks complete.
 * A request in flight when the agent stops (fwd_cancel_all) is answered the
 * stop's 503, or its connection closed when its reply had started.
 */
#include "node/agent.h"
#include "node/upstream.h"

#include <event2/buffer.h>
#include <event2/http.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* The request bytes waiting for the head's socket past which reading the
 * client's body pauses, and below which it goes on. */
#define FWD_BODY_HIGH (256 * 1024)
#define FWD_BODY_LOW (64 * 1024)
/* The most of a body the head refused before its end that the agent reads
 * and drops to keep the client's connection (h1_body_drop): what the head's
 * HTTP layer reads of a body with its default --max-body (4 x 8 MiB + 64 KiB,
 * src/server/http.c); a longer body it refuses by its length and closes.  (An
 * upload it refused while it streams, the head reads to the end; the agent
 * does not spend more of its machine's network than this on one.) */
#define FWD_DROP_MAX (4 * (8L << 20) + 64 * 1024)

/* One request in flight. */
typedef struct {
  node_agent_t *agent;
  h1_req_t *q;       /* the client's request, held until its reply ends */
  up_conn_t *conn;   /* NULL once the request to the head ended */
  bool chunked;      /* the body goes on chunked, as the client sent it */
  bool body_streams; /* the client's body is still being passed on (h1's sink) */
  bool started;      /* the reply to the client has started */
} fwd_req_t;

/* Headers that do not cross the agent either way (RFC 9110, 7.6.1), and
 * those it writes itself: the framing (Content-Length, the reply's Date)
 * and, towards the head, Expect (the agent sends its own when it relays). */
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

/* True when one of the client's Connection headers in `q` names `key`: a
 * header a message names there is hop-by-hop for that message alone (RFC
 * 9110, 7.6.1), so the agent drops it too. */
static bool fwd_request_names_hop(const h1_req_t *q, const char *key) {
  const char *name, *value;
  for (size_t i = 0; h1_header_at(q, i, &name, &value); i++)
    if (strcasecmp(name, "Connection") == 0 && h1_list_has(value, key))
      return true;
  return false;
}

/* True when one of the head's Connection headers in `r` names `key`. */
static bool fwd_reply_names_hop(const up_reply_t *r, const char *key) {
  for (size_t i = 0; i < r->nheaders; i++)
    if (strcasecmp(r->headers[i].name, "Connection") == 0 && h1_list_has(r->headers[i].value, key))
      return true;
  return false;
}

/* ---- the head's reply, passed on ---- */

/* The client read most of what waited (or went away): read on from the head. */
static void fwd_on_client_ready(void *arg) {
  fwd_req_t *f = arg;
  if (f->conn)
    up_read(f->conn, true);
}

/* The client's body is not read on: the head failed or the agent stops
 * before its end, and the connection closes after the answer. */
static void fwd_refuse_body(fwd_req_t *f) {
  if (!f->body_streams)
    return;
  f->body_streams = false;
  h1_body_refuse(f->q);
}

/* The head answered before the client's body ended (a refusal: a bad token,
 * a level that conflicts, a body over its limit): the rest of the body is
 * read and dropped, up to FWD_DROP_MAX, and the connection kept, as the head
 * keeps its own; a client still waiting for the head's "100 Continue" is
 * answered without its body, and a longer body cut, the connection closed. */
static void fwd_drop_body(fwd_req_t *f) {
  if (!f->body_streams)
    return;
  f->body_streams = false;
  h1_body_drop(f->q, FWD_DROP_MAX);
}

/* The head said "100 Continue": so does the agent to its client. */
static void fwd_on_continue(void *arg) {
  fwd_req_t *f = arg;
  h1_body_continue(f->q);
}

/* The head's status line and headers arrived: start the client's reply.
 * Its Date and Server are the agent's own (h1 writes them): the client is to
 * see that a node agent answers at its URL (muster_client_server). */
static void fwd_on_reply(void *arg, const up_reply_t *r) {
  fwd_req_t *f = arg;
  fwd_drop_body(f);
  for (size_t i = 0; i < r->nheaders; i++) {
    const char *name = r->headers[i].name;
    if (!fwd_is_hop(name) && !fwd_reply_names_hop(r, name) && strcasecmp(name, "Date") != 0 &&
        strcasecmp(name, "Server") != 0)
      h1_add_header(f->q, name, r->headers[i].value);
  }
  char via[160];
  snprintf(via, sizeof via, "1.1 %s (muster node)", f->agent->name);
  h1_add_header(f->q, "Via", via);
  h1_respond_start(f->q, r->status, NULL, r->length);
  f->started = true;
}

/* A piece of the head's body: pass it on; pause when the client is behind. */
static void fwd_on_body(void *arg, const char *data, size_t len) {
  fwd_req_t *f = arg;
  h1_respond_data(f->q, data, len); /* dropped when the client went away */
  if (h1_respond_full(f->q)) {
    up_read(f->conn, false);
    h1_respond_wait(f->q, fwd_on_client_ready, f);
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

/* The request to the head ended: complete (`error` NULL) or failed. */
static void fwd_on_end(void *arg, const char *error) {
  fwd_req_t *f = arg;
  f->conn = NULL;
  fwd_refuse_body(f);
  if (error == NULL)
    h1_respond_end(f->q);
  else
    fwd_fail_client(f, error);
  free(f);
}

/* Less of the body waits for the head's socket: read the client on. */
static void fwd_on_drained(void *arg) {
  fwd_req_t *f = arg;
  h1_body_resume(f->q);
}

/* The stop's word for a request still in flight: a client whose reply
 * started has its connection closed (fwd_fail_client), one whose reply did
 * not gets the stop's 503. */
static void fwd_on_stop(void *arg) {
  fwd_req_t *f = arg;
  f->conn = NULL;
  fwd_refuse_body(f);
  if (f->started)
    fwd_fail_client(f, "the node agent is stopping");
  else
    port_reply_stopping(f->agent, f->q);
  free(f);
}

static const up_handlers_t fwd_handlers = {.on_continue = fwd_on_continue,
                                           .on_reply = fwd_on_reply,
                                           .on_body = fwd_on_body,
                                           .on_end = fwd_on_end,
                                           .on_drained = fwd_on_drained,
                                           .on_stop = fwd_on_stop};

/* ---- the client's body, passed on as it arrives ---- */

/* A piece of the client's body (an h1_body_data_fn): to the head, in a
 * chunk of its own when the body is chunked; reading the client pauses
 * while too much waits for the head's socket. */
static bool fwd_on_body_data(void *arg, const char *data, size_t len) {
  fwd_req_t *f = arg;
  if (f->chunked) {
    char size[24];
    int n = snprintf(size, sizeof size, "%zx\r\n", len);
    up_send(f->conn, size, (size_t)n);
    up_send(f->conn, data, len);
    up_send(f->conn, "\r\n", 2);
  } else {
    up_send(f->conn, data, len);
  }
  if (up_unsent(f->conn) >= FWD_BODY_HIGH) {
    h1_body_pause(f->q);
    up_notify_drained(f->conn, FWD_BODY_LOW);
  }
  return true;
}

/* The client's body ended (an h1_body_end_fn): whole, the request to the
 * head is too; broken or cut (the client went away), the request to the
 * head is cut (its connection closes) and the client answered 400 or let
 * go. */
static void fwd_on_body_end(void *arg, h1_body_end_t how) {
  fwd_req_t *f = arg;
  f->body_streams = false;
  if (how == H1_BODY_DONE) {
    if (f->chunked)
      up_send(f->conn, "0\r\n\r\n", 5);
    up_sent(f->conn);
    return;
  }
  up_abort(f->conn);
  if (how == H1_BODY_BAD)
    port_reply_error(f->q, 400, "bad_request", "the chunked body is malformed");
  else
    h1_drop(f->q);
  free(f);
}

/* ---- the client's request, passed on ---- */

/* Appends the end-to-end headers of `q` to `out`, then X-Forwarded-For (the
 * client's address after the ones it named) and the head's Host. */
static void fwd_request_headers(node_agent_t *a, h1_req_t *q, struct evbuffer *out) {
  const char *name, *value;
  for (size_t i = 0; h1_header_at(q, i, &name, &value); i++)
    if (!fwd_is_hop(name) && !fwd_request_names_hop(q, name) && strcasecmp(name, "Expect") != 0 &&
        strcasecmp(name, "X-Forwarded-For") != 0)
      evbuffer_add_printf(out, "%s: %s\r\n", name, value);
  char peer[64];
  const char *before = h1_header(q, "X-Forwarded-For");
  evbuffer_add_printf(out, "X-Forwarded-For: %s%s%s\r\n", before ? before : "", before ? ", " : "",
                      h1_peer(q, peer, sizeof peer) ? peer : "unknown");
  char host[sizeof a->head_host + 16];
  fwd_host(a, host, sizeof host);
  evbuffer_add_printf(out, "Host: %s\r\n", host);
}

char *fwd_target(h1_req_t *q) {
  const char *path = h1_path(q), *query = h1_query(q);
  size_t len = strlen(path) + (query ? strlen(query) + 1 : 0) + 1;
  char *target = malloc(len);
  if (target)
    snprintf(target, len, "%s%s%s", path, query ? "?" : "", query ? query : "");
  return target;
}

/* Starts the request to the head for `q`: a connection, and the request's
 * head with `framing` (the body's header line, or "") sent; NULL, with `q`
 * answered, when the agent stops or is out of memory. */
static fwd_req_t *fwd_begin(node_agent_t *a, h1_req_t *q, const char *framing) {
  if (a->port_draining) {
    port_reply_stopping(a, q);
    return NULL;
  }
  fwd_req_t *f = calloc(1, sizeof *f);
  struct evbuffer *head = f ? evbuffer_new() : NULL;
  up_conn_t *conn = head ? up_open(a, &fwd_handlers, f, strcmp(h1_method(q), "HEAD") == 0) : NULL;
  if (conn == NULL) {
    if (head)
      evbuffer_free(head);
    free(f);
    port_reply_error(q, 503, "unavailable", "node agent %s is out of memory", a->name);
    return NULL;
  }
  *f = (fwd_req_t){.agent = a, .q = q, .conn = conn};
  const char *query = h1_query(q);
  evbuffer_add_printf(head, "%s %s%s%s HTTP/1.1\r\n", h1_method(q), h1_path(q), query ? "?" : "",
                      query ? query : "");
  fwd_request_headers(a, q, head);
  evbuffer_add_printf(head, "%s\r\n", framing);
  up_send_buffer(conn, head);
  evbuffer_free(head);
  return f;
}

void fwd_forward(node_agent_t *a, h1_req_t *q) {
  struct evbuffer *body = port_body(q);
  size_t len = body ? evbuffer_get_length(body) : 0;
  char framing[48] = "";
  if (len > 0 || h1_length(q) < 0 || h1_header(q, "Content-Length") != NULL)
    snprintf(framing, sizeof framing, "Content-Length: %zu\r\n", len);
  fwd_req_t *f = fwd_begin(a, q, framing);
  if (f == NULL)
    return;
  if (body)
    up_send_buffer(f->conn, body);
  up_sent(f->conn);
}

void fwd_forward_stream(node_agent_t *a, h1_req_t *q, int64_t length) {
  const char *expect = h1_header(q, "Expect");
  bool relay = expect != NULL && strcasecmp(expect, "100-continue") == 0;
  char framing[96];
  int n = length < 0
              ? snprintf(framing, sizeof framing, "Transfer-Encoding: chunked\r\n")
              : snprintf(framing, sizeof framing, "Content-Length: %lld\r\n", (long long)length);
  if (relay) /* the head's answer to it is the client's (fwd_on_continue, fwd_on_reply) */
    snprintf(framing + n, sizeof framing - (size_t)n, "Expect: 100-continue\r\n");
  fwd_req_t *f = fwd_begin(a, q, framing);
  h1_hold(q);
  if (f == NULL)
    return;
  f->chunked = length < 0;
  f->body_streams = true;
  h1_body_relay(q, fwd_on_body_data, fwd_on_body_end, f);
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

void fwd_cancel_all(node_agent_t *a) {
  up_cancel_all(a);
  fwd_pool_cancel_all(a);
}

void fwd_free(node_agent_t *a) {
  up_free_all(a);
  fwd_pool_free(a);
}
