/*
 * waiter.h — long-poll leases parked until a task is ready or time runs out.
 */
#ifndef MUSTER_SERVER_WAITER_H
#define MUSTER_SERVER_WAITER_H

#include <stdint.h>

#include "http.h"
#include "server.h"

/* Parks request `r` (which found nothing to lease, and no update after
 * `updates_after` when that is >= 0) for up to `wait_ms`; `request` is its
 * key (lease_retry.h; NULL: none), copied, recorded with what it leases. */
void waiter_park(http_req_t *r, const char *queue, int64_t worker, int64_t max,
                 int64_t updates_after, const char *request, int64_t wait_ms);
/* Store hook: tasks may be ready in `queue`.  Cheap when nobody waits there. */
void waiter_mark_ready(head_t *h, const char *queue);
/* Marks every queue with waiters, so delayed tasks that came due are found. */
void waiter_mark_all(head_t *h);
/* Leases to waiters of the marked queues, inside the open transaction. */
void waiter_serve(head_t *h);
/* The number of parked long-poll leases. */
size_t waiter_count(const head_t *h);
/* Answers every waiter with an empty lease list (shutdown). */
void waiter_release_all(head_t *h);

#endif
