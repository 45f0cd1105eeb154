/*
 * forward_pool.c — the evhttp client connections of the agent's own small
 * questions to the head: the node cache's (cache_http.c, cache_expire.c)
 * and the node-local iterations' (iter_local.c).
 *
 * Those requests have no body worth streaming and their replies are read
 * whole, so evhttp's client serves them.  The clients' requests forwarded to
 * the head go through the agent's own client instead (upstream.c), which
 * streams bodies both ways (docs/design-notes.md, "The node agent's client
 * to the head").
 *
 * Connections are kept in a pool and reused (keep-alive); a question
 * occupies its connection until answered.  A question's owner is told when
 * the agent stops with it in flight (fwd_pool_cancel_all), and answers its
 * client.
 */
#include "node/agent.h"

#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FWD_TIMEOUT_S 3600 /* a question may wait this long */

/* A connection is idle in the agent's pool (`next` alone) or busy (on the
 * doubly linked busy list): its request in flight, or discarded and about to
 * be freed.  The busy list is what lets fwd_pool_cancel_all and
 * fwd_pool_free reach them all. */
struct fwd_conn {
  node_agent_t *agent;
  struct evhttp_connection *evcon;
  struct fwd_conn *next, *prev;
  fwd_cancel_fn cancel; /* its request's owner, told when the agent stops (NULL: none) */
  void *owner;
};

static void fwd_busy_add(node_agent_t *a, fwd_conn_t *c) {
  c->prev = NULL;
  c->next = a->fwd_busy;
  if (c->next)
    c->next->prev = c;
  a->fwd_busy = c;
}

static void fwd_busy_remove(node_agent_t *a, fwd_conn_t *c) {
  if (c->prev)
    c->prev->next = c->next;
  else
    a->fwd_busy = c->next;
  if (c->next)
    c->next->prev = c->prev;
  c->next = c->prev = NULL;
}

fwd_conn_t *fwd_conn_get(node_agent_t *a) {
  fwd_conn_t *c = a->fwd_pool;
  if (c != NULL) {
    a->fwd_pool = c->next;
  } else if ((c = calloc(1, sizeof *c)) != NULL) {
    c->evcon = evhttp_connection_base_new(a->base, NULL, a->head_host, (ev_uint16_t)a->head_port);
    if (c->evcon == NULL) {
      free(c);
      return NULL;
    }
    evhttp_connection_set_timeout(c->evcon, FWD_TIMEOUT_S);
    /* The head may answer before it read the whole request (a 413 for a body
     * over its limit, a 431) and close: read that answer rather than fail
     * on the write it cut short, so the client gets the head's refusal. */
    evhttp_connection_set_flags(c->evcon, EVHTTP_CON_READ_ON_WRITE_ERROR);
    c->agent = a;
  } else {
    return NULL;
  }
  c->cancel = NULL;
  c->owner = NULL;
  fwd_busy_add(a, c);
  return c;
}

void fwd_conn_set_owner(fwd_conn_t *c, fwd_cancel_fn cancel, void *owner) {
  c->cancel = cancel;
  c->owner = owner;
}

void fwd_conn_put(node_agent_t *a, fwd_conn_t *c) {
  fwd_busy_remove(a, c);
  c->next = a->fwd_pool;
  a->fwd_pool = c;
}

struct evhttp_connection *fwd_conn_evcon(fwd_conn_t *c) {
  return c->evcon;
}

/* The deferred free of a discarded connection, which stays on the busy list
 * until then: should the loop end first, fwd_free frees it (event_base_free
 * drops the pending call without making it). */
static void fwd_conn_free_cb(evutil_socket_t fd, short what, void *arg) {
  fwd_conn_t *c = arg;
  (void)fd;
  (void)what;
  fwd_busy_remove(c->agent, c);
  evhttp_connection_free(c->evcon);
  free(c);
}

void fwd_conn_discard(node_agent_t *a, fwd_conn_t *c) {
  const struct timeval now = {0, 0};
  c->cancel = NULL; /* its request has ended */
  if (event_base_once(a->base, -1, EV_TIMEOUT, fwd_conn_free_cb, c, &now) != 0)
    fwd_conn_put(a, c); /* out of memory: keep it rather than leak it */
}

void fwd_host(const node_agent_t *a, char *buf, size_t size) {
  bool v6 = strchr(a->head_host, ':') != NULL;
  snprintf(buf, size, "%s%s%s:%d", v6 ? "[" : "", a->head_host, v6 ? "]" : "", a->head_port);
}

void fwd_add_host(const node_agent_t *a, struct evkeyvalq *to) {
  char host[sizeof a->head_host + 16];
  fwd_host(a, host, sizeof host);
  evhttp_add_header(to, "Host", host);
}

/* Frees a list of connections linked by `next` (closing each, and freeing
 * the request in flight on it without calling its callbacks). */
static void fwd_conns_free(fwd_conn_t *c) {
  for (fwd_conn_t *next; c; c = next) {
    next = c->next;
    evhttp_connection_free(c->evcon);
    free(c);
  }
}

void fwd_pool_cancel_all(node_agent_t *a) {
  for (fwd_conn_t *c = a->fwd_busy, *next; c; c = next) {
    next = c->next; /* an owner's answer touches no other connection */
    if (c->cancel == NULL)
      continue;
    fwd_cancel_fn cancel = c->cancel;
    c->cancel = NULL;
    cancel(c->owner);
    fwd_busy_remove(a, c);
    evhttp_connection_free(c->evcon);
    free(c);
  }
}

void fwd_pool_free(node_agent_t *a) {
  fwd_conns_free(a->fwd_busy);
  a->fwd_busy = NULL;
  fwd_conns_free(a->fwd_pool);
  a->fwd_pool = NULL;
}
