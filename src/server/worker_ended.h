/*
 * worker_ended.h — the worker instances reported ended by
 * DELETE /v1/workers/instance/{instance}, remembered for a while so that a
 * registration of that instance reaching the head after the report makes no
 * worker (worker_ended.c says why).
 */
#ifndef MUSTER_SERVER_WORKER_ENDED_H
#define MUSTER_SERVER_WORKER_ENDED_H

#include <stdbool.h>
#include <stdint.h>

#include "store.h"

/* How long an instance reported ended is remembered: far longer than a
 * registration can be on its way (worker_ended.c).  A test may make it
 * shorter (worker_ended_init). */
#define WORKER_ENDED_KEEP_MS (10LL * 60 * 1000)
/* How many are remembered at most; beyond, the one reported longest ago goes. */
#define WORKER_ENDED_MAX 10000

/* How long instances reported ended are remembered, in ms:
 * WORKER_ENDED_KEEP_MS, or what MUSTER_TEST_ENDED_KEEP_MS set at
 * worker_ended_init.  The check, the prune and the reaper's looks use it. */
int64_t worker_ended_keep_ms(void);

/* Takes MUSTER_TEST_ENDED_KEEP_MS (ms, 1 to WORKER_ENDED_KEEP_MS) as the
 * time instances are remembered, for tests only: a test then sees one
 * forgotten (the reaper's deletion, a registration accepted again) in a
 * second, not ten minutes.  A value out of that range is said and ignored.
 * Called once, before the head serves. */
void worker_ended_init(void);

/* Remembers that `instance` was reported ended at `now`, `crashed` or by a
 * goodbye (a report sent again moves its time to `now`), and forgets the
 * oldest beyond WORKER_ENDED_MAX.  MUSTER_OK or MUSTER_STORE in *f. */
muster_err_t worker_ended_record(store_t *st, const char *instance, bool crashed, int64_t now,
                                 fail_t *f);
/* MUSTER_OK when `instance` (NULL: none sent) may register at `now`;
 * MUSTER_INVALID_STATE, saying when and how it was reported ended, when that
 * was less than worker_ended_keep_ms() before `now`; MUSTER_STORE on a store
 * failure. */
muster_err_t worker_ended_check(store_t *st, const char *instance, int64_t now, fail_t *f);
/* True when some instance was reported ended worker_ended_keep_ms() or more
 * before `now` (for the reaper's check before it opens a transaction). */
bool worker_ended_any_due(store_t *st, int64_t now);
/* Forgets the instances reported ended worker_ended_keep_ms() or more before
 * `now`; how many went into *forgotten.  MUSTER_OK or MUSTER_STORE in *f. */
muster_err_t worker_ended_prune(store_t *st, int64_t now, int64_t *forgotten, fail_t *f);

#endif
