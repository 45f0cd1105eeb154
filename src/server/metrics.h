/*
 * metrics.h — the head's counters and histograms, the per-queue completion
 * ring behind GET /v1/throughput, and the Prometheus text of GET /metrics.
 *
 * Domain code counts events (a task completed, a lease expired) while its
 * request runs; those counts are only provisional until the turn's
 * transaction commits.  The store tells this module when a request's
 * savepoint is kept or rolled back and when the turn commits, so a refused
 * batch or a failed commit never shows up in a counter: metrics describe what
 * is on disk, like replies do.  Everything runs on the event-loop thread;
 * the state is process-wide (one head per process).
 */
#ifndef MUSTER_SERVER_METRICS_H
#define MUSTER_SERVER_METRICS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server.h"

/* Events counted per queue; each becomes muster_<name>_total{queue="..."}. */
typedef enum {
  METRIC_LEASES_GRANTED,  /* a task was leased */
  METRIC_TASKS_COMPLETED, /* a lease was completed */
  METRIC_TASKS_FAILED,    /* a worker failed a lease (retried or not) */
  METRIC_TASKS_RETRIED,   /* a task went back to queued after a failure, expiry or timeout */
  METRIC_TASKS_DEAD,      /* a task went dead (out of attempts or flagged at stage 1) */
  METRIC_LEASES_EXPIRED,  /* a lease passed its deadline */
  METRIC_TASKS_FLAGGED,   /* a worker flagged a task's input as invalid */
  METRIC_TASKS_REAPED,    /* a done task was removed by its queue's retention */
  METRIC_COUNTER_COUNT
} metric_counter_t;

/* Route indices that are not rows of http_routes. */
#define METRICS_ROUTE_NONE (-1) /* the path matched no route */
#define METRICS_ROUTE_SKIP (-2) /* not counted (a late reply with no route noted) */

/* Seconds of history kept per queue by the completion ring. */
#define METRICS_RING_SECONDS 600

/* Counts `n` events of `which` in `queue` for the running request.  `queue`
 * may be NULL for events that belong to no queue. */
void metrics_count(metric_counter_t which, const char *queue, int64_t n);
/* Counts one worker that timed out (muster_worker_timeouts_total). */
void metrics_worker_timeout(void);

/* Store hooks.  The request's provisional counts are kept (ok) or dropped. */
void metrics_request_end(bool ok);
/* The turn's kept counts become final (ok) or are dropped; `duration_us` is
 * how long the commit took and is observed in the commit histogram. */
void metrics_commit(bool ok, int64_t duration_us);
/* A WAL flush (--sync full) ended, on the loop or on the helper thread. */
void metrics_flush(bool on_thread, bool ok, int64_t duration_us);
/* `n` lease replies went out at their commit, with no flush of their own. */
void metrics_unflushed_replies(size_t n);
/* A group commit was put off by one poll of the sockets after a flush. */
void metrics_gathered_commit(void);

/* One HTTP request answered with `status` after `duration_us` (negative: not
 * observed in the latency histogram).  `route` indexes http_routes, or is
 * METRICS_ROUTE_NONE / METRICS_ROUTE_SKIP. */
void metrics_http(int route, int status, int64_t duration_us);

/* Monotonic microseconds, for durations. */
int64_t metrics_now_us(void);

/* {"bucket_ms": 1000, "now_ms", "seconds", "total": [...], "queues": {"q": [...]}}:
 * completions per second over the last `seconds` (1..METRICS_RING_SECONDS),
 * oldest first; the last bucket is the current, partial second.  New
 * reference, NULL on out of memory. */
json_t *metrics_throughput(int64_t seconds);

/* ---- the exposition ---- */

typedef struct metrics_out metrics_out_t;

/* Appends printf-style text to the exposition. */
void metrics_printf(metrics_out_t *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends `value` as a label value, escaped as the text format requires. */
void metrics_label(metrics_out_t *out, const char *value);
/* Appends a family's "# HELP" and "# TYPE" lines; `type` is "gauge", "counter"
 * or "histogram". */
void metrics_help(metrics_out_t *out, const char *name, const char *type, const char *help);

/* A module that owns more state (nodes, iterations, shared blobs) adds its own
 * families here.  It writes "# HELP", "# TYPE" and samples with
 * metrics_printf; it runs inside a read transaction of the store. */
typedef void (*metrics_collector_fn)(head_t *h, metrics_out_t *out);
/* Registers a collector; at most 16.  Returns false when the table is full. */
bool metrics_add_collector(metrics_collector_fn fn);

/* The families of nodes, sessions and iterations (metrics_extra.c), read
 * from the store; metrics_render() calls it before the registered collectors. */
void metrics_extra_collect(head_t *h, metrics_out_t *out);

/* The whole exposition in Prometheus text format 0.0.4.  Returns a string the
 * caller frees and its length in *len, or NULL on a store failure or out of
 * memory. */
char *metrics_render(head_t *h, size_t *len);

#endif
