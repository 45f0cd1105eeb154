/*
 * lease_retry.h — a lease request sent again after its reply was lost.
 *
 * A lease request (plain, long-poll or the combined complete-and-lease call)
 * may carry a key the worker chose, `request`, which it sends unchanged when
 * it sends the same request again.  The head records with the leases a keyed
 * request commits the worker's last such key and the fencing tokens the
 * request drew, on the worker's row and in the request's transaction; a
 * request whose key is that one gets those leases again (those the worker
 * still holds) instead of new ones.  Without it a worker whose reply was lost
 * (the head restarted between its commit and its reply, a connection broke)
 * held tasks it did not know of until their deadline passed
 * (docs/api.md, "Retrying a lease").
 */
#ifndef MUSTER_SERVER_LEASE_RETRY_H
#define MUSTER_SERVER_LEASE_RETRY_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "queue.h"
#include "store.h"

/* A lease request's key and what the head recorded under it. */
typedef struct {
  const char *request;             /* the request's key; NULL: none (borrowed) */
  bool repeat;                     /* it is the worker's last recorded key */
  int64_t first_token, last_token; /* when `repeat`: the tokens that request drew */
} lease_retry_t;

/* Reads the optional key "request" of the lease request object `obj` (`ctx`
 * names it in messages: "" for a plain lease's body, "lease" for the combined
 * call's object) into r->request (borrowed from `obj`; NULL when absent).  A
 * key is a name (1 to 128 characters of [A-Za-z0-9._-]) and needs `worker`
 * (above 0): the head keeps it with the worker.  MUSTER_INVALID otherwise. */
muster_err_t lease_retry_parse(const json_t *obj, const char *ctx, int64_t worker, lease_retry_t *r,
                               fail_t *f);

/* worker_check_active for `worker` (above 0), which also reads whether
 * r->request is the key of the worker's last recorded lease request: then
 * r->repeat is set, with its tokens.  One query, as the check alone: the
 * worker's row is read anyway.  The check's errors. */
muster_err_t lease_retry_check(store_t *st, int64_t worker, lease_retry_t *r, fail_t *f);

/* lease_acquire_raw for a request checked by lease_retry_check (`r`; NULL or
 * without a key: a plain lease).  A repeat is answered with the leases its
 * first request made that `worker` still holds in queue `q`, in the order
 * they were granted, under the same tokens, their deadlines moved to a full
 * lease from now (*count of them; none counted as granted again); when it
 * holds none of them any more, and for a request with a new key, it leases as
 * lease_acquire_raw does and records the key with the tokens drawn, when it
 * leased something.  The reply's form, *count, *max_task and failures are
 * lease_acquire_raw's. */
json_t *lease_acquire_retry(store_t *st, const queue_t *q, int64_t worker, int64_t max,
                            const lease_retry_t *r, size_t *count, int64_t *max_task, fail_t *f);

#endif
