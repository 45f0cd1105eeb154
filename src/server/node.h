/*
 * node.h — machines running a node agent: registration by name, heartbeats,
 * leaving, and the timeout that takes a silent node's workers down with it.
 *
 * A node owns the workers that registered with its name in their `node`
 * field.  When the node leaves (or re-registers after a restart) its workers
 * are gone and their leases are released uncounted; when it times out, the
 * leases lapse and the attempt counts, so a task that kills every machine it
 * runs on ends dead instead of looping.
 */
#ifndef MUSTER_SERVER_NODE_H
#define MUSTER_SERVER_NODE_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "store.h"

#define NODE_DEFAULT_TIMEOUT_MS 15000
#define NODE_MAX_TEXT 256 /* hostname and address, bytes */
#define NODE_MAX_GPUS 256

typedef enum { NODE_ACTIVE = 0, NODE_GONE = 1 } node_state_t;

/* Registers the node of body {"name", "hostname", "address", "cpus", "gpus",
 * "labels", "timeout_ms", "instance", "previous_instance"}, or takes an
 * existing record of that name over: its old workers become gone and their
 * leases are released (not counted).  Refused (MUSTER_INVALID_STATE) while
 * another live instance holds the name, unless it is `previous_instance`.
 * Returns the Node object (new reference) with *created telling which, or NULL
 * with *f filled (MUSTER_NAME_INVALID, MUSTER_INVALID, MUSTER_STORE). */
json_t *node_register(store_t *st, const json_t *body, int64_t default_timeout_ms, bool *created,
                      fail_t *f);
/* Records a heartbeat of an active node; returns {"name", "state"} or NULL with
 * MUSTER_NODE_NOT_FOUND (unknown or gone) or MUSTER_INVALID (a non-empty body). */
json_t *node_heartbeat(store_t *st, const char *name, const json_t *body, fail_t *f);
/* The node leaves: it and its workers become gone, their leases are released
 * uncounted.  Returns {"name", "workers", "released"} or NULL with *f filled. */
json_t *node_leave(store_t *st, const char *name, fail_t *f);
/* The Node object (new reference), or NULL with MUSTER_NODE_NOT_FOUND. */
json_t *node_get(store_t *st, const char *name, fail_t *f);
/* {"nodes": [...]} ordered by name (new reference). */
json_t *node_list(store_t *st, fail_t *f);
/* True when some active node is silent past its timeout at `now`. */
bool node_any_due(store_t *st, int64_t now);
/* Marks nodes silent past their timeout, and their workers, gone; their leases
 * lapse as on a timeout.  Returns how many nodes went, -1 on store failure. */
int64_t node_expire_due(store_t *st, int64_t now);

#endif
