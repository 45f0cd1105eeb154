/*
 * iter.h — coordinated iterations on the head: create or join by
 * configuration, lease blocks to ranks, acknowledge them, take over the
 * blocks of failed ranks, checkpoint and resume (also with another world
 * size).  docs/iterations.md defines the semantics, docs/api.md the wire.
 *
 * The domain functions below never see HTTP: they take the request body
 * (already parsed JSON) and return a reply object (new reference) or NULL
 * with *f filled.  They run inside the request's savepoint, so a refused
 * request leaves nothing behind.  The iter_h_* handlers (iter_routes.c) are
 * what routes.c puts in the route table.
 */
#ifndef MUSTER_SERVER_ITER_H
#define MUSTER_SERVER_ITER_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/partition.h"
#include "http.h"
#include "store.h"

#define ITER_DEFAULT_LEASE_MS 30000
#define ITER_DEFAULT_RANK_TIMEOUT_MS 30000
#define ITER_MAX_REPLICATION 64
#define ITER_DEFAULT_SLOW_RATIO 0.5
#define ITER_RETRY_MS 50 /* the delay a `wait` reply suggests */

/* POST /v1/iterations: creates (*created true) or joins the iteration. */
json_t *iter_create(store_t *st, const json_t *body, bool *created, fail_t *f);
json_t *iter_get(store_t *st, const char *name, fail_t *f);
json_t *iter_list(store_t *st, fail_t *f);
json_t *iter_delete(store_t *st, const char *name, fail_t *f);
json_t *iter_checkpoint(store_t *st, const char *name, fail_t *f);
json_t *iter_next(store_t *st, const char *name, const json_t *body, fail_t *f);
json_t *iter_ack(store_t *st, const char *name, const json_t *body, fail_t *f);
json_t *iter_heartbeat(store_t *st, const char *name, const json_t *body, fail_t *f);

/* Names the node whose agent runs this process (src/node/iter_local.c):
 * `cluster_sync: false` is then accepted and status replies carry
 * `"node": NAME`.  The head never calls it: there `false` is refused. */
void iter_set_node(const char *name);

/* True when a block lease or a rank's heartbeat deadline is at or before `now`. */
bool iter_any_due(store_t *st, int64_t now);
/* Returns expired block leases to their lanes and marks silent ranks failed.
 * Returns how many leases and ranks lapsed, -1 on store failure. */
int64_t iter_expire_due(store_t *st, int64_t now);

/* Route handlers. */
void iter_h_create(http_req_t *r);
void iter_h_list(http_req_t *r);
void iter_h_get(http_req_t *r);
void iter_h_delete(http_req_t *r);
void iter_h_checkpoint(http_req_t *r);
void iter_h_next(http_req_t *r);
void iter_h_ack(http_req_t *r);
void iter_h_heartbeat(http_req_t *r);

#endif
