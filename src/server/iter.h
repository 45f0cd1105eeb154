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

/* A query parameter's decoded text by name, NULL when absent: how the
 * head's route and the node agent hand their query to iter_held_query. */
typedef const char *(*iter_query_fn)(void *ctx, const char *key);

/* The query of GET /v1/iterations/{name}/held, parsed. */
typedef struct {
  int64_t rank;   /* required */
  int64_t cursor; /* the lowest block number to list (default 0) */
  int64_t max;    /* blocks in one reply, 1 to ITER_MAX_BATCH; 0: not given */
  bool indices;   /* list each block's sample indices */
} iter_held_query_t;

/* Parses the query (`get`, `ctx`) into *q; MUSTER_INVALID naming the
 * parameter (`query rank: missing; ...`) otherwise.  The rank's upper bound
 * is the iteration's world size, which iter_held checks. */
muster_err_t iter_held_query(iter_query_fn get, void *ctx, iter_held_query_t *q, fail_t *f);
/* GET /v1/iterations/{name}/held (iter_held.c): the blocks rank q->rank
 * holds in the current epoch, lowest first, from q->cursor; changes
 * nothing. */
json_t *iter_held(store_t *st, const char *name, const iter_held_query_t *q, fail_t *f);

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
void iter_h_held(http_req_t *r);

#endif
