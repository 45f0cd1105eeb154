/*
 * worker.h — registered consumers: heartbeats, progress, goodbyes, timeouts,
 * per-worker counters and the per-nickname leaderboard.
 */
#ifndef MUSTER_SERVER_WORKER_H
#define MUSTER_SERVER_WORKER_H

#include <jansson.h>
#include <stdint.h>

#include "store.h"

#define WORKER_DEFAULT_TIMEOUT_MS 60000
#define WORKER_MAX_NICKNAME 64
#define WORKER_MAX_PROGRESS 1024

typedef enum { WORKER_ACTIVE = 0, WORKER_GONE = 1 } worker_state_t;
/* Why a worker is gone: every way one ends, kept with it (column
 * gone_reason, as worker_gone_name's text) and shown as its "gone_reason"
 * (docs/api.md, "GET /v1/workers"). */
typedef enum {
  WORKER_GONE_BYE,            /* it said goodbye: DELETE by id or instance, DistCompute bye */
  WORKER_GONE_TIMEOUT,        /* it was silent past its timeout_ms */
  WORKER_GONE_CRASHED,        /* its process died, reported with ?crashed=true */
  WORKER_GONE_NODE_LEFT,      /* its node said goodbye (DELETE /v1/nodes/{name}) */
  WORKER_GONE_NODE_TIMEOUT,   /* its node was silent past the node's timeout */
  WORKER_GONE_NODE_RESTARTED, /* its node was registered by another agent process */
} worker_gone_t;
typedef enum { WORKER_COMPLETED, WORKER_FAILED, WORKER_FLAGGED } worker_counter_t;

/* Registers a worker from body {"nickname", "queues", "node", "labels",
 * "timeout_ms", "instance"}; returns {"id", "name", "nickname", "timeout_ms"}
 * (and "repeated": true when `instance` found its active worker).  An
 * `instance` reported ended by worker_leave_instance not long ago is refused,
 * MUSTER_INVALID_STATE (worker_ended.h): it makes no worker. */
json_t *worker_register(store_t *st, const json_t *body, int64_t default_timeout_ms, fail_t *f);
/* Records a heartbeat (and progress); MUSTER_WORKER_NOT_FOUND when unknown or gone. */
json_t *worker_heartbeat(store_t *st, int64_t id, const json_t *body, fail_t *f);
/* Marks the worker gone and releases its leases; returns {"id", "released"}. */
json_t *worker_bye(store_t *st, int64_t id, fail_t *f);
/* Like worker_bye; when `crashed` (the worker process died), its leases lapse
 * as on a timeout instead: the attempt counts.  Returns {"id", "released"}. */
json_t *worker_leave(store_t *st, int64_t id, bool crashed, fail_t *f);
/*
 * worker_leave for the active worker that a registration with `instance`
 * made (a node agent whose worker process died before it told the agent its
 * id names it so).  Returns {"id", "released", "instance"}; "id" is null and
 * "released" 0 when no active worker has that instance: it never registered
 * (it died first, or its registration is still on its way), or it is gone
 * already.  Either way the instance is remembered (worker_ended_record), so
 * that a registration with it coming later makes no worker.  NULL only on a
 * store failure.
 */
json_t *worker_leave_instance(store_t *st, const char *instance, bool crashed, fail_t *f);
json_t *worker_get(store_t *st, int64_t id, fail_t *f);
json_t *worker_list(store_t *st, fail_t *f);
json_t *worker_leaderboard(store_t *st, fail_t *f);
/* The stored and shown name of `why`: "bye", "timeout", "crashed",
 * "node_left", "node_timeout", "node_restarted". */
const char *worker_gone_name(worker_gone_t why);
/* MUSTER_OK when `id` is a registered, active worker. */
muster_err_t worker_check_active(store_t *st, int64_t id, fail_t *f);
/* Adds `n` to a counter of worker `id`; a no-op for id 0 (anonymous) or n 0. */
muster_err_t worker_count(store_t *st, int64_t id, worker_counter_t which, int64_t n, fail_t *f);
/* True when some active worker is silent past its timeout at `now`. */
bool worker_any_due(store_t *st, int64_t now);
/* Marks workers silent past their timeout as gone and lapses their leases.
 * Returns how many went, -1 on store failure. */
int64_t worker_expire_due(store_t *st, int64_t now);

#endif
