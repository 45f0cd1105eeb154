/*
 * routes_pool.h — handlers of the node, session and update endpoints, and the
 * parked long-poll reads of session results.
 *
 * The route table (routes.c) names these handlers; the head (head.c) wakes the
 * parked readers when a task of their session finishes.
 */
#ifndef MUSTER_SERVER_ROUTES_POOL_H
#define MUSTER_SERVER_ROUTES_POOL_H

#include <stdbool.h>

#include "http.h"
#include "server.h"

void route_node_register(http_req_t *r);
void route_node_list(http_req_t *r);
void route_node_get(http_req_t *r);
void route_node_heartbeat(http_req_t *r);
void route_node_leave(http_req_t *r);

void route_session_create(http_req_t *r);
void route_session_list(http_req_t *r);
void route_session_get(http_req_t *r);
void route_session_heartbeat(http_req_t *r);
void route_session_seal(http_req_t *r);
void route_session_submit(http_req_t *r);
void route_session_results(http_req_t *r);
void route_session_close(http_req_t *r);

void route_update_post(http_req_t *r);
void route_update_list(http_req_t *r);

/* Store hook: a task of `session` finished, or the session closed.  Marks its
 * parked readers; results_waiters_serve answers them before the commit. */
void results_waiters_mark(head_t *h, const char *session);
/* Answers the marked readers that have something to read now. */
void results_waiters_serve(head_t *h);
/* Answers every parked reader with what there is (shutdown). */
void results_waiters_release_all(head_t *h);
/* True when a reader of `session` is parked (its client is present).  `h` is
 * the head; the signature fits session_busy_fn. */
bool results_waiters_busy(void *h, const char *session);

#endif
