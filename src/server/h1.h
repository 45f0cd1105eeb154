/*
 * h1.h — the head's HTTP/1.1 server: connections, request parsing, body
 * framing and replies in request order.
 *
 * It replaces evhttp in the head (docs/design-notes.md, "The head's own
 * HTTP/1.1 server").  A connection's read event stays armed for its whole
 * life, its input is one contiguous buffer parsed in place, and every
 * complete request found in a read is dispatched at once, so requests
 * pipelined on one connection share the turn's transaction and its group
 * commit (but for those behind a request answered later, h1_hold, which wait
 * for its answer).  Replies may be given in any order (a long-poll answered late, a
 * commit's replies at once); each connection writes them in the order of its
 * requests, as HTTP/1.1 requires, with one writev for as many as are ready.
 *
 * A request belongs to the server.  The dispatch callback "holds" it until it
 * answers it (h1_respond, h1_respond_file) or lets it go (h1_drop), which it
 * must do exactly once, however late.  When the client goes away first, a
 * held request stays valid (h1_gone says so) and answering it only frees it.
 *
 * Bodies are read whole (Content-Length or chunked, up to max_body) before
 * dispatch, except for requests the `streams` callback picks: those are
 * dispatched after their head, and the handler may take the body as it
 * arrives (h1_body_stream); a body nobody takes is read and dropped.  A
 * body that does not come with its head is kept only once the `admit`
 * callback let its request go on.
 *
 * A request must be read in time: its head whole within head_ms of its first
 * byte, its body without a gap of body_ms; otherwise 408 (h1_timeout.c).
 *
 * A reply is given whole (h1_respond, h1_respond_file) or streamed
 * (h1_respond_start, then its body piece by piece): a proxy's reply passed on
 * as it arrives (the node agent's, src/node/forward.c).  h1_stream.c has
 * streamed bodies both ways.
 *
 * Replies wait in memory for their client to read them, and a client that
 * pipelines requests and reads nothing would make the server hold every
 * reply: once a connection's unread replies pass 4 MiB (H1_OUT_HIGH), its
 * further requests are not read until they are below half of that.  The
 * connection stays open: a slow reader gets its replies slower.  A file's
 * bytes (sendfile) do not count, and a streamed body has its own bound.
 *
 * Everything runs on the event-loop thread.
 */
#ifndef MUSTER_SERVER_H1_H
#define MUSTER_SERVER_H1_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct event_base;
typedef struct h1_server h1_server_t;
typedef struct h1_req h1_req_t;
typedef struct h1_lend h1_lend_t;

typedef struct {
  /* A request is complete (or, when `streams` picked it, its head is). */
  void (*dispatch)(h1_req_t *q, void *arg);
  /* True when the body of `q` is to be streamed (h1_body_stream) rather than
   * read whole before dispatch; NULL: never. */
  bool (*streams)(const h1_req_t *q, void *arg);
  /* A request read whole before dispatch whose body is not all in yet (its
   * client may wait for "100 Continue"): true to go on; false when the
   * callee answered it (or will: it holds it), and its body is never kept
   * (dropped as it comes; not sent at all by a client waiting for "100
   * Continue", whose connection closes after the reply).  NULL: every
   * request goes on. */
  bool (*admit)(h1_req_t *q, void *arg);
  void *arg;
  size_t max_head; /* bytes of request line and headers; more: 431 */
  size_t max_body; /* bytes of a body read whole; more: 413 */
  int64_t idle_ms; /* a connection with nothing in flight is closed after this */
  /* Read deadlines (h1_timeout.c), answered 408 when missed; 0: the default.
   * head_ms: a request head must be whole this long after its first byte
   * (trickling does not extend it).  body_ms: a body being read may go this
   * long without a byte (each byte extends it).  Neither runs while the
   * server owes the connection an answer. */
  int64_t head_ms;
  int64_t body_ms;
  /* accept() failed with `err` (out of descriptors, mostly): the server
   * stops accepting for 100 ms, clients waiting in the listen backlog, and
   * tells this (NULL: nobody) each time. */
  void (*accept_failed)(int err, void *arg);
  /* A connection was accepted after accept_failed was told: accepting works
   * again (NULL: nobody is told). */
  void (*accept_resumed)(void *arg);
  /* The Server header of every reply, which tells a client what answers at
   * its URL ("muster-head", "muster-node": muster_client_server); NULL: none.
   * A proxy's reply passed on carries the proxy's, not its origin's. */
  const char *server;
} h1_config_t;

#define H1_HEAD_MS_DEFAULT (30 * 1000)
#define H1_BODY_MS_DEFAULT (60 * 1000)

/* A server on `base`; NULL when out of memory. */
h1_server_t *h1_server_new(struct event_base *base, const h1_config_t *cfg);
/* Listens on host:port (port 0: any free port); returns the bound port, or -1
 * with a message in `err`. */
int h1_server_listen(h1_server_t *s, const char *host, int port, char *err, size_t errlen);
/* Closes every connection and frees every request, held ones included: the
 * caller holds none after this.  Accepts NULL. */
void h1_server_free(h1_server_t *s);
/* Open connections, and requests refused on the wire (malformed, too
 * large, too slow: answered by the server itself) since the start
 * (metrics). */
size_t h1_server_connections(const h1_server_t *s);
uint64_t h1_server_wire_errors(const h1_server_t *s);
/* Connections that sent a request lately (in the last 10-20 ms): how many
 * clients keep the head busy now, for the flush policy (head.c). */
size_t h1_server_active(h1_server_t *s);

/* Defers writing while corked: replies given meanwhile go out together, one
 * write per connection, at the matching h1_uncork. */
void h1_cork(h1_server_t *s);
void h1_uncork(h1_server_t *s);

/* ---- replies held back for a flush (h1_lend.c) ----
 *
 * Replies given between h1_lend_begin and h1_lend_end are built, but their
 * connections are lent: the loop writes nothing to them, and frees none of
 * them, until h1_lend_return.  Meanwhile h1_lend_write, on any thread, may
 * write what was ready on each with one writev: the head's flush thread
 * sends a group's replies the moment their flush ends, without waking the
 * loop first (head.c, "durable replies").  One lend at a time. */

/* Starts lending (corks the server). */
void h1_lend_begin(h1_server_t *s);
/* Ends it: the lend of the connections the replies went to, NULL when none
 * did (their clients were gone).  Gathers what h1_lend_write may write. */
h1_lend_t *h1_lend_end(h1_server_t *s);
/* Writes the lend's gathered replies, one non-blocking writev per
 * connection; safe on another thread, which must not race h1_lend_return. */
void h1_lend_write(h1_lend_t *l);
/* Gives the connections back to the loop: what h1_lend_write wrote is
 * accounted and the rest written as usual.  With `status` non-zero, every
 * reply of the lend (none of which went out: h1_lend_write was not called)
 * is answered anew with `status` and the JSON `body` (copied). */
void h1_lend_return(h1_lend_t *l, int status, const char *body);

/* ---- the request ---- */

const char *h1_method(const h1_req_t *q); /* "GET", "POST", ... as sent */
const char *h1_path(const h1_req_t *q);   /* the target's path, still %-encoded */
const char *h1_query(const h1_req_t *q);  /* the target's query (after '?'), or NULL */
int64_t h1_length(const h1_req_t *q);     /* the announced Content-Length; -1: chunked */
/* The value of header `name` (any case), trimmed; the first one when it is
 * repeated; NULL when absent. */
const char *h1_header(const h1_req_t *q, const char *name);
/* The `i`th header line (0 first) in *name and *value, as h1_header gives
 * them; false past the last. */
bool h1_header_at(const h1_req_t *q, size_t i, const char **name, const char **value);
/* True when `list`, a header value of comma-separated names (Connection,
 * Transfer-Encoding), names `token`: spaces and tabs around each name are
 * ignored, case too.  For any message's headers, requests' and replies'. */
bool h1_list_has(const char *list, const char *token);
/* The client's address (numeric) in `buf`; false when it is not known (the
 * client went away). */
bool h1_peer(const h1_req_t *q, char *buf, size_t len);
/* The body read whole, `*len` bytes, valid during the dispatch only (it may
 * lie in the connection's input buffer: not NUL-terminated); NULL with 0
 * when there is none. */
const char *h1_body(const h1_req_t *q, size_t *len);
/* True when the client closed its connection or it failed: nobody would read
 * a reply. */
bool h1_gone(const h1_req_t *q);

/* Adds a reply header (before h1_respond*). */
void h1_add_header(h1_req_t *q, const char *name, const char *value);
/* Answers with `len` bytes of `body` (owned by the reply from now on, also on
 * failure; NULL for none) as `type`, followed by a newline when `newline`.
 * A HEAD request gets the headers and the length only. */
void h1_respond(h1_req_t *q, int status, const char *type, char *body, size_t len, bool newline);
/* Answers with the first `len` bytes of open file `fd` (owned from now on),
 * sent with sendfile. */
void h1_respond_file(h1_req_t *q, int status, const char *type, int fd, int64_t len);
/* The reply to `q`, `bytes` long, is built but given later (after its
 * transaction commits): counted from now on against the bytes of replies
 * its client has not read, past which (4 MiB) the requests it pipelined
 * behind wait until it reads; h1_respond counts the reply itself in its
 * place.  Without this, the requests of one read would all be handled, and
 * their replies held, before any of them was given. */
void h1_expect_reply(h1_req_t *q, size_t bytes);
/* Lets the request go unanswered: its connection is closed. */
void h1_drop(h1_req_t *q);
/* The connection closes after the reply to `q` (it says `Connection:
 * close`); call it before answering. */
void h1_close_after(h1_req_t *q);
/* `fn(arg)` runs once when the server frees `q`: its reply was written, or
 * nobody will read it (the connection went away) and it was answered or the
 * server freed.  `fn` must not call the server.  One per request. */
void h1_on_free(h1_req_t *q, void (*fn)(void *arg), void *arg);
/* Called from the dispatch of a request that is answered only after other
 * events (a long-poll, an upload): the connection's next request is not
 * handled until this one is answered, as HTTP/1.1 wants pipelined requests
 * to take effect in order. */
void h1_hold(h1_req_t *q);
/* A note of the dispatcher's on the request (NULL until set), kept until it
 * is answered: what a request answered after its dispatch needs to recall
 * then (the route layer's route, for metrics). */
void h1_set_note(h1_req_t *q, const void *note);
const void *h1_note(const h1_req_t *q);

/* ---- streamed bodies ---- */

typedef enum {
  H1_BODY_DONE, /* the whole body went to the sink */
  H1_BODY_BAD,  /* the framing is broken: answer, and the connection closes */
  H1_BODY_GONE, /* the connection went away: the request is orphaned */
} h1_body_end_t;

/* Takes `len` bytes of the body; false: the sink failed, the rest of the body
 * is read and dropped and the sink hears nothing more. */
typedef bool (*h1_body_data_fn)(void *arg, const char *data, size_t len);
typedef void (*h1_body_end_fn)(void *arg, h1_body_end_t how);

/* True when `q` was dispatched before its body, which nobody took yet; its
 * announced length in *length (-1: chunked). */
bool h1_body_pending(const h1_req_t *q, int64_t *length);
/* Streams the body of `q` (only from its dispatch) to the sink; answers "100
 * Continue" when the client waits for it.  `end` runs once, when the body is
 * over (at once for an empty one), unless `data` failed or the sink was
 * detached. */
void h1_body_stream(h1_req_t *q, h1_body_data_fn data, h1_body_end_fn end, void *arg);
/* The sink goes away: the rest of the body is read and dropped. */
void h1_body_detach(h1_req_t *q);
/* As h1_body_stream, but a client waiting for "100 Continue" gets it only
 * from h1_body_continue (a proxy passes on its upstream's answer: its 100, or
 * a refusal and h1_body_refuse).  Until then no body deadline runs. */
void h1_body_relay(h1_req_t *q, h1_body_data_fn data, h1_body_end_fn end, void *arg);
/* Sends the "100 Continue" h1_body_relay held back (nothing when none is). */
void h1_body_continue(h1_req_t *q);
/* Backpressure of a streamed body: stops reading the connection, until
 * h1_body_resume, after the bytes already read (which the sink still gets).
 * No body deadline runs meanwhile.  Only while the sink is attached. */
void h1_body_pause(h1_req_t *q);
void h1_body_resume(h1_req_t *q);
/* The rest of the body is not wanted (it is answered before its end: a
 * refusal): the sink is detached, a held-back "100 Continue" never goes, the
 * connection closes after the reply and what the client still sends is
 * dropped meanwhile (RFC 9110, 10.1.1: the client may stop at the final
 * status, or it sends on into the lingering close). */
void h1_body_refuse(h1_req_t *q);
/* The rest of the body is not wanted, but the connection is (a refusal
 * answered while the body flows, as the head answers one itself): the sink
 * is detached, and what the client still sends of the body is read and
 * dropped, up to `most` bytes, after which the next request is read as
 * usual.  A body with more than `most` bytes left, by its length, or a
 * chunked one that passes them, closes the connection after the reply, as
 * does a client still waiting for a "100 Continue" (h1_body_refuse). */
void h1_body_drop(h1_req_t *q, int64_t most);

/* ---- streamed replies (h1_stream.c) ----
 *
 * h1_respond_start answers with the status line and headers at once; the
 * body follows in pieces (h1_respond_data, h1_respond_data_file), each
 * written as soon as the replies before it on the connection are, and
 * h1_respond_end completes it.  The request stays held until then (the
 * connection's next request waits, h1_hold).  A body that cannot be
 * completed (its source broke off) ends with h1_respond_abort: what was
 * queued is written and the connection closes without ending the body (no
 * last chunk, fewer bytes than the length, a reset for a body that ends with
 * the connection), so no client takes a cut body for a whole one.
 *
 * Backpressure: the server holds what the client has not read.  A producer
 * stops while h1_respond_full says so and goes on when h1_respond_wait's
 * callback comes. */

/* Starts the reply: `length` bytes of body follow (-1: unknown, sent
 * chunked, or to the connection's close for an HTTP/1.0 client).  `type`
 * NULL: no Content-Type (one added with h1_add_header).  A HEAD request, a
 * 1xx, 204 or 304 gets the headers only (Content-Length `length` on a HEAD)
 * and the body pieces are dropped. */
void h1_respond_start(h1_req_t *q, int status, const char *type, int64_t length);
/* Queues `len` bytes (copied) of the body; false when nobody will read them
 * (the client went away), when they pass the length announced or when memory
 * ran out: the body is broken then, and ends as h1_respond_abort. */
bool h1_respond_data(h1_req_t *q, const void *data, size_t len);
/* Queues bytes [off, off + len) of open file `fd` (owned from now on, also on
 * failure), sent with sendfile; as h1_respond_data otherwise. */
bool h1_respond_data_file(h1_req_t *q, int fd, int64_t off, int64_t len);
/* True while more of the body waits for the client than a producer should
 * add to (H1_STREAM_HIGH bytes). */
bool h1_respond_full(const h1_req_t *q);
/* `ready(arg)` runs once, from an event of its own, when the body's bytes
 * waiting for the client fall below a quarter of H1_STREAM_HIGH, or when the
 * client went away (at once when either is already so).  Replaces an
 * earlier one; NULL cancels it; the end of the reply cancels it too. */
void h1_respond_wait(h1_req_t *q, void (*ready)(void *arg), void *arg);
/* The body is complete (a body shorter than its length is cut instead). */
void h1_respond_end(h1_req_t *q);
/* The body cannot be completed: its connection closes after what was queued. */
void h1_respond_abort(h1_req_t *q);

#define H1_STREAM_HIGH (256 * 1024)

#endif
