/*
 * port.c — the node agent's API port: the head's own HTTP/1.1 server
 * (src/server/h1.h) with the agent's routing behind it.
 *
 * The port behaves on the wire as the head's does, with the head's limits:
 * what h1 refuses itself (a malformed request or header line, a bad length
 * or chunked framing, a request line and headers over 64 KiB, another HTTP
 * version) is answered in the JSON envelope and the connection closes; a
 * request head must arrive within 30 s of its first byte and a body may not
 * pause for 60 s (408); an idle connection is closed after the head's idle
 * time (docs/design-notes.md, "The node agent serves with h1").
 *
 * A request is routed by its line and headers, before its body: the node
 * cache's (cache_http.c) and the node-local iterations' (iter_local.c) have
 * their small bodies read whole into an evbuffer as they arrive (streamed
 * by h1, so that no second copy is made), up to PORT_MAX_BODY, and are
 * served by the agent or, when they turn out not to be its own (an
 * iteration the head keeps), forwarded whole; those whose token is not the
 * agent's are passed on as they come, and the head refuses them before
 * their body (port_dispatch).  Every other request goes to
 * the head (forward.c) at once, its body passed on as it arrives, so that
 * an upload costs the agent a few hundred KiB whatever its size, and the
 * head's answer to `Expect: 100-continue` is the client's.  A request
 * answered later (all but the node-local ones) holds its connection
 * (h1_hold): requests pipelined behind it take effect in order, as on the
 * head.
 *
 * Stop (port_drain): once the agent's workers are gone, every request in
 * flight to the head is cancelled (its client answered), every new one is
 * answered 503 with `Retry-After` and `Connection: close`, and the loop ends
 * once those answers are written, or after PORT_DRAIN_MS.
 */
#include "core/auth.h"
#include "core/knob.h"
#include "core/said.h"
#include "node/agent.h"
#include "node/iter_local.h"
#include "server/jw.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* The most bytes of a request body the agent reads whole: the bodies of the
 * requests it serves itself, small JSON (a forwarded body streams, unbounded
 * by the agent: the head refuses in its words what it refuses).  The head's
 * default --max-body, so that a client the agent refuses holds no more of
 * its memory than the head's clients hold of the head's. */
#define PORT_MAX_BODY (8L << 20)
/* The request line and headers, as on the head (431 past it). */
#define PORT_MAX_HEAD (64 * 1024)
/* A connection with nothing in flight is closed after this long: the head's
 * idle time with its default --max-wait-ms (30 s, plus 120 s). */
#define PORT_IDLE_MS (150 * 1000)
/* Retry-After of the stopping agent's 503 (seconds): an agent restarted by a
 * supervisor is usually listening again within one; sooner is pointless. */
#define PORT_RETRY_AFTER_S "1"
/* The longest a stopping agent waits for its 503s to be written: a 503 fits
 * in the socket's buffer, so only a client that reads nothing holds it. */
#define PORT_DRAIN_MS 2000

/* What the port keeps of a client request (its h1 note), freed with it. */
typedef struct {
  node_agent_t *a;
  h1_req_t *q;
  struct evbuffer *body;      /* the body read so far; NULL: none */
  void (*on_free)(void *arg); /* port_on_free's */
  void *free_arg;
} port_req_t;

/* ---- replies ---- */

void port_reply_json(h1_req_t *q, int status, json_t *body) {
  size_t len = 0;
  char *text = body ? jw_dump(body, &len) : NULL;
  json_decref(body);
  if (status == 401)
    h1_add_header(q, "WWW-Authenticate", "Bearer realm=\"muster\"");
  h1_respond(q, status, "application/json", text, text ? len : 0, text != NULL);
}

void port_reply_error(h1_req_t *q, int status, const char *code, const char *fmt, ...) {
  char message[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(message, sizeof message, fmt, ap);
  va_end(ap);
  /* Said in headers too where the head says it so (core/said.h): a HEAD's
   * reply has no body, and the agent's own refusals (it cannot reach the
   * head) are to read as the head's do. */
  if (said_in_headers(h1_method(q), h1_path(q))) {
    char value[sizeof message];
    said_header_value(message, value, sizeof value);
    h1_add_header(q, SAID_CODE_HEADER, code);
    h1_add_header(q, SAID_MESSAGE_HEADER, value);
  }
  port_reply_json(q, status,
                  json_pack("{s:{s:s, s:s}}", "error", "code", code, "message", message));
}

static void port_drain_check(node_agent_t *a);

/* A stop reply was written, or its client went away (port_on_free). */
static void port_on_stop_reply_freed(void *arg) {
  node_agent_t *a = arg;
  a->port_stop_replies--;
  port_drain_check(a);
}

void port_reply_stopping(node_agent_t *a, h1_req_t *q) {
  h1_add_header(q, "Retry-After", PORT_RETRY_AFTER_S);
  h1_close_after(q); /* one answer per connection: what the clients retry */
  if (a->port_draining == 1) {
    a->port_stop_replies++;
    port_on_free(q, port_on_stop_reply_freed, a);
  }
  port_reply_error(q, 503, "unavailable",
                   "node agent %s is stopping; retry (its restarted agent, or another node)",
                   a->name);
}

/* ---- what the port keeps of a request ---- */

static void port_req_free(void *arg) {
  port_req_t *r = arg;
  if (r->on_free)
    r->on_free(r->free_arg);
  if (r->body)
    evbuffer_free(r->body);
  free(r);
}

/* The port's record of `q`, made on first use. */
static port_req_t *port_req(h1_req_t *q) {
  port_req_t *r = (port_req_t *)h1_note(q);
  if (r != NULL)
    return r;
  r = calloc(1, sizeof *r);
  if (r == NULL) {
    fprintf(stderr, "muster node: out of memory\n");
    abort(); /* the daemon's one allocation policy (STYLE.md 6) */
  }
  r->q = q;
  h1_set_note(q, r);
  h1_on_free(q, port_req_free, r);
  return r;
}

struct evbuffer *port_body(h1_req_t *q) {
  const port_req_t *r = h1_note(q);
  return r ? r->body : NULL;
}

void port_on_free(h1_req_t *q, void (*fn)(void *arg), void *arg) {
  port_req_t *r = port_req(q);
  r->on_free = fn;
  r->free_arg = arg;
}

/* ---- routing ---- */

/* Sends the request, complete, where it goes. */
static void port_route(node_agent_t *a, h1_req_t *q) {
  if (a->port_draining) /* the cache and the iterations stopped too */
    port_reply_stopping(a, q);
  else if (!cache_http_handle(a, q) && !iter_local_handle(a, q))
    fwd_forward(a, q);
  /* Answered later: the connection's next request waits.  (Answered already,
   * `q` is still there: h1 runs this inside a read or a resume, corked, and
   * frees a reply only once it is written, at the uncork.) */
  h1_hold(q);
}

/* A piece of a request body (an h1_body_data_fn): kept, up to PORT_MAX_BODY. */
static bool port_on_body_data(void *arg, const char *data, size_t len) {
  port_req_t *r = arg;
  if (evbuffer_get_length(r->body) + len > (size_t)PORT_MAX_BODY) {
    h1_close_after(r->q);
    port_reply_error(r->q, 413, "body_too_large",
                     "the chunked body is over %ld bytes, the most node agent %s reads of a "
                     "request for its cache or an iteration (send a bigger one to the head)",
                     PORT_MAX_BODY, r->a->name);
    return false;
  }
  if (evbuffer_add(r->body, data, len) != 0) {
    h1_close_after(r->q);
    port_reply_error(r->q, 503, "unavailable", "node agent %s is out of memory", r->a->name);
    return false;
  }
  return true;
}

/* A request body ended (an h1_body_end_fn): the request is routed, or, when
 * its framing broke, refused; a client gone (or too slow: h1 answered 408)
 * leaves an orphan to let go of. */
static void port_on_body_end(void *arg, h1_body_end_t how) {
  port_req_t *r = arg;
  if (how == H1_BODY_DONE)
    port_route(r->a, r->q);
  else if (how == H1_BODY_BAD)
    port_reply_error(r->q, 400, "bad_request", "the chunked body is malformed");
  else
    h1_drop(r->q);
}

/* Starts reading the body of `q` (`length` bytes, -1: chunked). */
static void port_read_body(node_agent_t *a, h1_req_t *q, int64_t length) {
  if (length > PORT_MAX_BODY) {
    h1_close_after(q);
    port_reply_error(q, 413, "body_too_large",
                     "the body is %lld bytes; node agent %s reads at most %ld of a request for "
                     "its cache or an iteration (send a bigger one to the head)",
                     (long long)length, a->name, PORT_MAX_BODY);
    return;
  }
  port_req_t *r = port_req(q);
  r->a = a;
  r->body = evbuffer_new();
  if (r->body == NULL) {
    h1_close_after(q);
    port_reply_error(q, 503, "unavailable", "node agent %s is out of memory", a->name);
    return;
  }
  h1_body_stream(q, port_on_body_data, port_on_body_end, r);
  h1_hold(q);
}

/* True when the agent may serve `q` itself (judged by its line and
 * headers): its body is read whole before it is routed. */
static bool port_serves(node_agent_t *a, h1_req_t *q) {
  return cache_http_serves(a, q) || iter_local_serves(a, q);
}

/* An agent without a token of its own is no judge of one: what it would
 * serve itself then goes to the head, which judges every token.  (Taking
 * any token then, as it once did, served the node-local iterations to
 * anyone who reached the port, no token needed, for as long as the head
 * could not be reached to refuse the agent's registration.) */
bool port_token_is_agents(const node_agent_t *a, const h1_req_t *q) {
  const char *want = a->cfg->token;
  return want != NULL && want[0] != '\0' && auth_bearer_is(h1_header(q, "Authorization"), want);
}

/* h1's dispatch: a request whose head (and, without a body, all) is here.
 * A body the agent would read whole to serve it goes to the head instead,
 * as it comes, when its token is not the agent's: the head refuses it (401,
 * 403) in its own words before its body, where the agent would have held up
 * to PORT_MAX_BODY of it for anyone, token or not, before refusing. */
static void port_dispatch(h1_req_t *q, void *arg) {
  node_agent_t *a = arg;
  int64_t length;
  if (a->port_draining)
    port_reply_stopping(a, q);
  else if (!h1_body_pending(q, &length))
    port_route(a, q);
  else if (port_serves(a, q) && port_token_is_agents(a, q))
    port_read_body(a, q, length);
  else
    fwd_forward_stream(a, q, length);
}

/* Every request with a body streams it (port_read_body, fwd_forward_stream). */
static bool port_streams(const h1_req_t *q, void *arg) {
  (void)arg;
  return h1_length(q) != 0;
}

/* ---- the port's life ---- */

/* accept() failed (h1 pauses accepting 100 ms): said once a minute at most,
 * in the head's words (accept_log.h). */
static void port_on_accept_failed(int err, void *arg) {
  node_agent_t *a = arg;
  char line[400];
  if (accept_log_failed(&a->port_accept_log, err, agent_now_ms(), line, sizeof line))
    agent_log(a, "API port: %s", line);
}

/* A connection was accepted after failures: said once after each failure said. */
static void port_on_accept_resumed(void *arg) {
  node_agent_t *a = arg;
  char line[200];
  if (accept_log_resumed(&a->port_accept_log, line, sizeof line))
    agent_log(a, "API port: %s", line);
}

/* A time limit of the port from the environment (for tests, as the head's):
 * milliseconds from 1 to 3600000; anything else is refused with a warning
 * and `fallback` kept. */
static int64_t port_timeout_env(node_agent_t *a, const char *name, int64_t fallback) {
  const char *text = getenv(name);
  if (text == NULL)
    return fallback;
  long long v;
  if (knob_int(text, 1, 3600000, &v))
    return v;
  agent_log(a, "%s=%s is not 1 to 3600000 ms; the default is kept", name, text);
  return fallback;
}

/* What to do about the listen error `why` (h1_server_listen's words): the
 * two a user meets, a port another process holds (a second agent on one
 * machine left at the default port) and an address not this machine's. */
static const char *port_listen_advice(const char *why) {
  if (strstr(why, "Address already in use"))
    return ": another process (another node agent, a head?) listens there; give this agent "
           "a port of its own with --listen ADDR:PORT, or --listen none for no API port";
  if (strstr(why, "Cannot assign requested address"))
    return ": it is not an address of this machine; give one of its addresses, 127.0.0.1, or "
           "0.0.0.0 for every interface";
  return "";
}

/* Splits "HOST:PORT" / "[V6]:PORT"; 0 or -1. */
static int port_split_listen(const char *listen, char *host, size_t size, int *port) {
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

int port_start(node_agent_t *a, const char *listen, char *err, size_t err_size) {
  char host[256];
  int port = 0;
  if (port_split_listen(listen, host, sizeof host, &port) != 0) {
    snprintf(err, err_size, "--listen '%s': expected HOST:PORT", listen);
    return -1;
  }
  if (fwd_start(a, err, err_size) != 0)
    return -1;
  h1_config_t cfg = {.dispatch = port_dispatch,
                     .streams = port_streams,
                     .arg = a,
                     .max_head = PORT_MAX_HEAD,
                     .max_body = PORT_MAX_BODY, /* bodies stream: port_read_body checks it */
                     .idle_ms = port_timeout_env(a, "MUSTER_HTTP_IDLE_TIMEOUT_MS", PORT_IDLE_MS),
                     .head_ms = port_timeout_env(a, "MUSTER_HTTP_HEAD_TIMEOUT_MS", 0),
                     .body_ms = port_timeout_env(a, "MUSTER_HTTP_BODY_TIMEOUT_MS", 0),
                     .accept_failed = port_on_accept_failed,
                     .accept_resumed = port_on_accept_resumed,
                     .server = "muster-node"};
  a->port = h1_server_new(a->base, &cfg);
  if (a->port == NULL) {
    snprintf(err, err_size, "out of memory");
    return -1;
  }
  char why[200];
  a->listen_port = h1_server_listen(a->port, host, port, why, sizeof why);
  if (a->listen_port < 0) {
    snprintf(err, err_size, "cannot listen on %s: %s%s", listen, why, port_listen_advice(why));
    return -1;
  }
  return a->listen_port;
}

/* Ends the loop once the drain's answers are all written. */
static void port_drain_check(node_agent_t *a) {
  if (a->port_draining == 1 && a->port_stop_replies <= 0) {
    a->port_draining = 2;
    event_base_loopexit(a->base, NULL);
  }
}

static void port_on_drain_timeout(evutil_socket_t fd, short what, void *arg) {
  node_agent_t *a = arg;
  (void)fd;
  (void)what;
  if (a->port_draining == 1) {
    agent_log(a, "%d client%s did not take the stop's answer within %d ms; closing",
              a->port_stop_replies, a->port_stop_replies == 1 ? "" : "s", PORT_DRAIN_MS);
    a->port_stop_replies = 0;
    port_drain_check(a);
  }
}

void port_drain(node_agent_t *a) {
  if (a->port == NULL) {
    event_base_loopexit(a->base, NULL);
    return;
  }
  if (a->port_drain_ev != NULL || a->port_draining == 2)
    return;
  a->port_draining = 1;
  fwd_cancel_all(a);
  struct timeval bound = {PORT_DRAIN_MS / 1000, (PORT_DRAIN_MS % 1000) * 1000};
  a->port_drain_ev = evtimer_new(a->base, port_on_drain_timeout, a);
  if (a->port_drain_ev == NULL || evtimer_add(a->port_drain_ev, &bound) != 0)
    a->port_stop_replies = 0; /* out of memory: no wait, no bound needed */
  port_drain_check(a);
}

void port_stop(node_agent_t *a) {
  /* The owners first, while their clients' requests are held: the server
   * frees every request, held ones too. */
  fwd_cancel_all(a);
  a->port_draining = 2; /* a stop reply freed now ends no loop any more */
  h1_server_free(a->port);
  a->port = NULL;
  if (a->port_drain_ev)
    event_free(a->port_drain_ev);
  a->port_drain_ev = NULL;
  fwd_free(a);
}
