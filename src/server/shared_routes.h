/*
 * shared_routes.h — the handlers of /v1/shared (docs/api.md "Shared data").
 */
#ifndef MUSTER_SERVER_SHARED_ROUTES_H
#define MUSTER_SERVER_SHARED_ROUTES_H

#include "http.h"

/* PUT /v1/shared/{scope}/{name}?level=N&ttl_ms=T: a streamed upload. */
void shared_h_put(http_req_t *r);
/* GET and HEAD /v1/shared/{scope}/{name}?level=N: the bytes, from the file. */
void shared_h_get(http_req_t *r);
/* GET /v1/shared/{scope}: the scope's blobs. */
void shared_h_list(http_req_t *r);
/* DELETE /v1/shared/{scope}/{name}: every level. */
void shared_h_delete(http_req_t *r);

#endif
