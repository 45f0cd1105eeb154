/*
 * shared_upload.h — streaming blob uploads into the data dir.
 *
 * evhttp (libevent 2.1) reads a request's whole body into memory before its
 * callback runs, and 2.1 has no hook to change that per request (2.2's
 * evhttp_set_newreqcb does not exist in 2.1.12).  So the head taps every
 * connection's input buffer (shared_tap_bevcb, installed with
 * evhttp_set_bevcb): the tap sees each socket read before evhttp does, tracks
 * where requests begin and end, and for `PUT /v1/shared/...` hands evhttp the
 * head alone (as a request with an empty body) while it keeps the body.  The
 * route's handler (shared_routes.c) then accepts the upload: the body goes
 * into a temp file in DATA_DIR/shared/tmp as it arrives, hashed on the way
 * (xxHash64), and when it is complete the file is fsynced and renamed, and
 * only then is the level committed and the reply sent.  A refused upload's
 * body is read and dropped (or the connection closed, when the client waits
 * for "100 Continue"); an interrupted one leaves nothing.  Memory per upload:
 * one socket read (at most 256 KiB).
 */
#ifndef MUSTER_SERVER_SHARED_UPLOAD_H
#define MUSTER_SERVER_SHARED_UPLOAD_H

#include <stdbool.h>
#include <stdint.h>

#include "http.h"
#include "server.h"
#include "shared.h"

struct bufferevent;
struct event_base;

/* evhttp_set_bevcb callback (`arg`: the head_t): a socket bufferevent whose
 * input goes through the upload tap. */
struct bufferevent *shared_tap_bevcb(struct event_base *base, void *arg);

/* Called by the route layer after a request's handler ran (or was refused
 * before it): a streamed upload that was not accepted is refused on the wire,
 * its body dropped or, when the client waits for "100 Continue", its
 * connection closed after the reply. */
void shared_tap_dispatched(http_req_t *r);

/* Frees the tap state of connections that closed before sending a byte. */
void shared_tap_sweep(head_t *h);

/* What a PUT stores once its body is complete. */
typedef struct {
  char scope[NAME_MAX_LEN + 1];
  char name[NAME_MAX_LEN + 1];
  int64_t level;    /* asked for; 0: not given (level 1) */
  int64_t ttl_ms;   /* after clamping */
  bool ttl_clamped; /* the asked ttl_ms was above --max-shared-ttl-ms */
} shared_put_t;

/* The body length the PUT being handled announced (-1: chunked, length
 * unknown); false when its body was not streamed (the tap could not parse
 * the request), in which case it cannot be accepted. */
bool shared_upload_pending(http_req_t *r, int64_t *length);

/* Accepts the PUT's body for `put`: parks the request, answers "100
 * Continue" when asked, and streams the body to a temp file; the commit and
 * the reply follow when the body is complete (docs/api.md).  On failure the
 * request is not parked and *f says why (the caller replies with it). */
muster_err_t shared_upload_accept(http_req_t *r, const shared_put_t *put, fail_t *f);

/* Answers every upload in progress with 503 and removes its temp file
 * (shutdown; before the last commit). */
void shared_upload_abort_all(head_t *h);

#endif
