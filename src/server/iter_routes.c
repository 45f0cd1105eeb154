/*
 * iter_routes.c — the HTTP handlers of /v1/iterations: parse the path,
 * call one domain function of iter.c, iter_lease.c or iter_held.c, format
 * the reply.
 */
#include "iter.h"

#include <stdio.h>
#include <string.h>

#define ST(r) ((r)->head->st)

/* Appended to the head's "iteration not found": an iteration created with
 * cluster_sync false lives on the node agent it was created through, and the
 * head never hears of it.  Its client may ask the head or another node's agent
 * (which forwards here), for instance while that agent is down, and would
 * otherwise read that the iteration does not exist at all. */
#define ITER_NOT_ON_HEAD                                                                           \
  " (not on the head; one created with cluster_sync false is answered only by the node agent "     \
  "that holds it: send its requests to that agent)"

static void reply(http_req_t *r, int status, json_t *value, fail_t *f) {
  if (value) {
    http_reply_json(r, status, value);
    return;
  }
  size_t len = strlen(f->message);
  if (f->code == MUSTER_ITERATION_NOT_FOUND && len > 0)
    snprintf(f->message + len, sizeof f->message - len, "%s", ITER_NOT_ON_HEAD);
  http_reply_fail(r, f);
}

void iter_h_create(http_req_t *r) {
  fail_t f = {0};
  bool created = false;
  json_t *out = iter_create(ST(r), r->body, &created, &f);
  reply(r, created ? 201 : 200, out, &f);
}

void iter_h_list(http_req_t *r) {
  fail_t f = {0};
  reply(r, 200, iter_list(ST(r), &f), &f);
}

void iter_h_get(http_req_t *r) {
  fail_t f = {0};
  reply(r, 200, iter_get(ST(r), r->params[0], &f), &f);
}

void iter_h_delete(http_req_t *r) {
  fail_t f = {0};
  reply(r, 200, iter_delete(ST(r), r->params[0], &f), &f);
}

void iter_h_checkpoint(http_req_t *r) {
  fail_t f = {0};
  reply(r, 200, iter_checkpoint(ST(r), r->params[0], &f), &f);
}

void iter_h_next(http_req_t *r) {
  fail_t f = {0};
  reply(r, 200, iter_next(ST(r), r->params[0], r->body, &f), &f);
}

void iter_h_ack(http_req_t *r) {
  fail_t f = {0};
  reply(r, 200, iter_ack(ST(r), r->params[0], r->body, &f), &f);
}

void iter_h_heartbeat(http_req_t *r) {
  fail_t f = {0};
  reply(r, 200, iter_heartbeat(ST(r), r->params[0], r->body, &f), &f);
}

/* http_query as an iter_query_fn. */
static const char *query_of(void *ctx, const char *key) {
  return http_query(ctx, key);
}

void iter_h_held(http_req_t *r) {
  fail_t f = {0};
  iter_held_query_t q;
  json_t *out =
      iter_held_query(query_of, r, &q, &f) ? NULL : iter_held(ST(r), r->params[0], &q, &f);
  reply(r, 200, out, &f);
}
