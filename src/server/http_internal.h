/*
 * http_internal.h — what http.c (a request's checks, replies and commit) and
 * http_route.c (its path and query) share.  Not for handlers: they see
 * http.h.
 */
#ifndef MUSTER_SERVER_HTTP_INTERNAL_H
#define MUSTER_SERVER_HTTP_INTERNAL_H

#include <stdbool.h>

#include "http.h"

/* Answers `r` with `code` and a printf-style message (the error envelope). */
void http_fail(http_req_t *r, muster_err_t code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Splits and decodes the query string into r's table; false with a 400 reply
 * set when a parameter is not `key=value` or there are too many. */
bool http_parse_query(http_req_t *r, const char *query);

/* Finds the route for the request and fills its parameters; NULL with a
 * 404 / 405 reply set (a 405 with the Allow header) when there is none. */
const http_route_t *http_route(http_req_t *r, const char *path);

/* Frees the path parameters a match filled. */
void http_clear_params(http_req_t *r);

#endif
