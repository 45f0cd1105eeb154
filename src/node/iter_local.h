/*
 * iter_local.h — node-local iterations (`cluster_sync: false`) on the node
 * agent's port: the agent keeps their state in its own SQLite store and
 * answers their requests itself (iter_local.c; docs/node.md).
 */
#ifndef MUSTER_NODE_ITER_LOCAL_H
#define MUSTER_NODE_ITER_LOCAL_H

#include "node/agent.h"

/* Sets up local iterations (a->iters): the state dir, the store when it
 * already exists there, the sweep timer.  0, or -1 after logging. */
int iter_local_start(node_agent_t *a);
/* Serves `in` when it is a local iteration's (or a create that resolves to
 * `cluster_sync: false`): returns 1 when it took the request, 0 when it is
 * to be forwarded to the head. */
int iter_local_handle(node_agent_t *a, h1_req_t *in);
/* True when `in`, by its method and path, may be a local iteration's (the
 * port reads such a body whole before iter_local_handle). */
bool iter_local_serves(const node_agent_t *a, h1_req_t *in);
/* Stops the sweep and closes the store; accepts an agent without them. */
void iter_local_stop(node_agent_t *a);

#endif /* MUSTER_NODE_ITER_LOCAL_H */
