/*
 * upstream.h — the node agent's own HTTP/1.1 client to the head
 * (upstream.c), which the forwarder (forward.c) sends the clients' requests
 * with.
 *
 * One request at a time per connection, on the agent's event loop.  The
 * owner writes the request (its head, then its body as it arrives: the
 * client does not wait for the whole request to be in the agent) and hears
 * the reply in pieces: an interim "100 Continue", the final status and
 * headers, the body piece by piece, its end.  Both ways have backpressure:
 * up_unsent says how much of the request waits for the head's socket (and
 * up_notify_drained when it fell), up_read pauses reading the reply.
 * Connections are kept alive in a pool and reused (docs/design-notes.md,
 * "The node agent's client to the head").
 */
#ifndef MUSTER_NODE_UPSTREAM_H
#define MUSTER_NODE_UPSTREAM_H

#include "node/agent.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct evbuffer;
typedef struct up_conn up_conn_t;

typedef struct {
  const char *name, *value;
} up_header_t;

/* The head's final status line and headers (valid during on_reply only). */
typedef struct {
  int status;
  const up_header_t *headers;
  size_t nheaders;
  int64_t length; /* the body's announced length; -1: chunked, or to the close */
  bool no_body;   /* a HEAD's reply, a 204 or a 304 */
} up_reply_t;

/* The owner's callbacks, each with its `arg`.  After on_end or on_stop the
 * connection is no more the owner's. */
typedef struct {
  /* The head answered "100 Continue" (only to a request that asked). */
  void (*on_continue)(void *arg);
  /* The final status and headers; the body follows. */
  void (*on_reply)(void *arg, const up_reply_t *reply);
  /* `len` bytes of the reply's body (its framing taken off). */
  void (*on_body)(void *arg, const char *data, size_t len);
  /* The reply is complete (`error` NULL) or failed (`error` says why, in a
   * few words: "could not connect to it", "timed out", ...). */
  void (*on_end)(void *arg, const char *error);
  /* Less than up_notify_drained's `below` of the request waits now. */
  void (*on_drained)(void *arg);
  /* The agent stops with the request in flight (up_cancel_all): answer the
   * client; the connection is closed after this returns. */
  void (*on_stop)(void *arg);
} up_handlers_t;

/* A connection for one request, from the pool or new (its connect begins);
 * `head` when the request is a HEAD (its reply has no body).  NULL when out
 * of memory.  A connect that fails is told through on_end, later. */
up_conn_t *up_open(node_agent_t *a, const up_handlers_t *h, void *arg, bool head);
/* Queues request bytes: copied (up_send) or moved out of `buf`. */
void up_send(up_conn_t *c, const void *data, size_t len);
void up_send_buffer(up_conn_t *c, struct evbuffer *buf);
/* The request is whole: after its reply the connection may be reused. */
void up_sent(up_conn_t *c);
/* Bytes of the request not written to the head's socket yet. */
size_t up_unsent(const up_conn_t *c);
/* on_drained once, when fewer than `below` bytes are unsent. */
void up_notify_drained(up_conn_t *c, size_t below);
/* Pauses (false) or resumes (true) reading the reply. */
void up_read(up_conn_t *c, bool on);
/* Ends the request without more callbacks: the connection closes, so the
 * head sees a body that was cut as cut (its length or last chunk never
 * comes). */
void up_abort(up_conn_t *c);
/* The agent stops: each request in flight hears on_stop, and its
 * connection closes. */
void up_cancel_all(node_agent_t *a);
/* Closes every connection, after the loop ended. */
void up_free_all(node_agent_t *a);

#endif
