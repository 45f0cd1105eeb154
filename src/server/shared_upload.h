/*
 * shared_upload.h — streaming blob uploads into the data dir.
 *
 * A blob may be gigabytes: it is never held in memory.  The HTTP server
 * dispatches `PUT /v1/shared/...` as soon as its head is in (the route's
 * handler sees no body yet); the handler checks names, level and scope and
 * accepts the upload, and the body then goes into a temp file in
 * DATA_DIR/shared/tmp as it arrives, hashed on the way (xxHash64).  When it is
 * complete the file is fsynced and renamed, and only then is the level
 * committed and the reply sent.  A refused upload's body is read and dropped
 * (or the connection closed after the reply, when the client waits for "100
 * Continue"); an interrupted one leaves nothing.  Memory per upload: one
 * socket read (at most 256 KiB).
 */
#ifndef MUSTER_SERVER_SHARED_UPLOAD_H
#define MUSTER_SERVER_SHARED_UPLOAD_H

#include <stdbool.h>
#include <stdint.h>

#include "http.h"
#include "server.h"
#include "shared.h"

/* True for the requests whose bodies stream (the server's `streams`). */
bool shared_upload_streams(const h1_req_t *req);

/* What a PUT stores once its body is complete. */
typedef struct {
  char scope[NAME_MAX_LEN + 1];
  char name[NAME_MAX_LEN + 1];
  int64_t level;    /* asked for; 0: not given (level 1) */
  int64_t ttl_ms;   /* after clamping; 0 when not given */
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
