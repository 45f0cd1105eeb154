/*
 * lease_retry.h — a lease request sent again after its reply was lost.
 *
 * A lease request (plain, long-poll or the combined complete-and-lease call)
 * may carry a key the worker chose, `request`, which it sends unchanged when
 * it sends the same request again.  The head records with the leases a keyed
 * request commits the key and the fencing tokens the request drew, in the
 * request's transaction, one record per stream of the worker's keys (below);
 * a request whose key is its stream's recorded one gets those leases again
 * (those the worker still holds) instead of new ones.  Without it a worker
 * whose reply was lost (the head restarted between its commit and its reply,
 * a connection broke) held tasks it did not know of until their deadline
 * passed (docs/api.md, "Retrying a lease").
 *
 * A key's stream is the key without its trailing "-DIGITS" ("host-12-s4-17":
 * "host-12-s4"); keys that do not end so share the worker's unnamed stream.
 * Each thread or slot that leases for one worker numbers its keys in a
 * stream of its own (`muster worker --concurrency N` sends INSTANCE-sSLOT-N)
 * and retries only its latest key, so one record per stream covers every
 * slot's retry, where one record per worker covered only the last slot's.
 * A worker keeps at most LEASE_RETRY_MAX_STREAMS records.
 */
#ifndef MUSTER_SERVER_LEASE_RETRY_H
#define MUSTER_SERVER_LEASE_RETRY_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "jw.h"
#include "queue.h"
#include "store.h"

/* The most streams a worker has a record for: a new stream beyond them
 * evicts the one recorded longest ago, so that a client inventing keys cannot
 * grow the table without bound.  Above the 1024 slots of `muster worker`. */
#define LEASE_RETRY_MAX_STREAMS 4096

/* A lease request's key and what the head recorded under it. */
typedef struct {
  const char *request;             /* the request's key; NULL: none (borrowed) */
  size_t stream_len;               /* its stream's name: its first stream_len characters */
  bool recorded;                   /* its stream has a record (set by the check) */
  bool repeat;                     /* it is its stream's recorded key */
  int64_t first_token, last_token; /* when `repeat`: the tokens that request drew */
} lease_retry_t;

/* The length of the name of the stream of key `key` (a valid key): what
 * comes before a trailing '-' and digits; 0, the worker's unnamed stream,
 * for a key that does not end so.  The migration that made the table
 * computes the same in SQL. */
size_t lease_retry_stream_len(const char *key);

/* Reads the optional key "request" of the lease request object `obj` (`ctx`
 * names it in messages: "" for a plain lease's body, "lease" for the combined
 * call's object) into r->request (borrowed from `obj`; NULL when absent).  A
 * key is a name (1 to 128 characters of [A-Za-z0-9._-], not "." or "..") and needs `worker`
 * (above 0): the head keeps it with the worker.  MUSTER_INVALID otherwise. */
muster_err_t lease_retry_parse(const json_t *obj, const char *ctx, int64_t worker, lease_retry_t *r,
                               fail_t *f);

/* worker_check_active for `worker` (above 0), which also reads the record of
 * r->request's stream: r->recorded when there is one, and r->repeat, with its
 * tokens, when its key is r->request.  One query: the worker's row, read for
 * its state, and the stream's row by its primary key.  Without a key, the
 * plain check alone (the records are not read).  The check's errors. */
muster_err_t lease_retry_check(store_t *st, int64_t worker, lease_retry_t *r, fail_t *f);

/* lease_acquire_text for a request checked by lease_retry_check (`r`; NULL
 * or without a key: a plain lease).  A repeat is answered with the leases its
 * first request made that `worker` still holds in queue `q`, in the order
 * they were granted, under the same tokens, their deadlines moved to a full
 * lease from now (*count of them; none counted as granted again); when it
 * holds none of them any more, and for a request with a new key, it leases as
 * lease_acquire_text does and records the key with the tokens drawn, when it
 * leased something, in place of its stream's record (a new stream beyond
 * LEASE_RETRY_MAX_STREAMS evicts the oldest).  The array appended to `out`,
 * *count, *max_task and failures are lease_acquire_text's. */
muster_err_t lease_acquire_retry_text(store_t *st, const queue_t *q, int64_t worker, int64_t max,
                                      const lease_retry_t *r, jw_buf_t *out, size_t *count,
                                      int64_t *max_task, fail_t *f);
/* What a lease reply holds. */
typedef struct {
  size_t leased;    /* leases */
  size_t updates;   /* updates */
  int64_t max_task; /* the highest task id leased; 0: none */
} lease_reply_counts_t;

/* Appends the fields a lease gives a reply to `out`, after its "{" or
 * another field's comma: `"leases":[...]` (lease_acquire_retry_text), and
 * with `updates_after` 0 or more `,"updates":[...],"updates_last":N`
 * (update_attach_text), the bytes jw_dump wrote for the reply built as a
 * tree with those keys in that order.  A lease, a parked lease and the
 * combined complete-and-lease write their replies with it, whole, for the
 * reply to take as it is (http_reply_text): the payloads are copied once.
 * MUSTER_OK, or the failure with *f filled and `out` holding part of the
 * text; *n counts what was written. */
muster_err_t lease_reply_text(store_t *st, const queue_t *q, int64_t worker, int64_t max,
                              const lease_retry_t *r, int64_t updates_after, jw_buf_t *out,
                              lease_reply_counts_t *n, fail_t *f);

/* Deletes the records of `worker`, which has ended (lease_end_worker): no
 * request of it is answered any more.  MUSTER_OK or the store's error. */
muster_err_t lease_retry_forget(store_t *st, int64_t worker, fail_t *f);

#endif
