/*
 * compat_bounds.h — the bounds on what anonymous DistCompute clients can
 * make a head keep (compat_bounds.c): a cap on a pipeline's active workers,
 * and the deletion of its workers that went without doing anything.
 */
#ifndef MUSTER_SERVER_COMPAT_BOUNDS_H
#define MUSTER_SERVER_COMPAT_BOUNDS_H

#include <stdbool.h>
#include <stdint.h>

#include "store.h"

/* The default of `muster head --distcompute-max-workers`: active
 * DistCompute workers per pipeline. */
#define COMPAT_DEFAULT_MAX_WORKERS 10000
/* How long after it went an idle DistCompute worker is deleted (an hour);
 * a test may make it shorter (compat_bounds_init). */
#define COMPAT_IDLE_KEEP_MS (60LL * 60 * 1000)

/* Takes MUSTER_TEST_DC_IDLE_KEEP_MS (ms, 1 to COMPAT_IDLE_KEEP_MS), for
 * tests only; a value out of range is said and ignored.  Called once,
 * before the head serves. */
void compat_bounds_init(void);
/* The time idle DistCompute workers are kept after they went, in ms. */
int64_t compat_idle_keep_ms(void);

/* The active workers of pipeline `pipeline` into *count.  MUSTER_OK or
 * MUSTER_STORE in *f. */
muster_err_t compat_active_count(store_t *st, const char *pipeline, int64_t *count, fail_t *f);

/* Where the deletion of idle workers is: the last (gone_at_ms, id) it
 * examined, so that a pass does not read again the gone workers it kept. */
typedef struct {
  int64_t gone_at_ms;
  int64_t id;
} compat_idle_cursor_t;

/* Deletes at most `chunk` DistCompute workers (with their compat_workers
 * rows) that went compat_idle_keep_ms() or more before `now` with nothing
 * completed, failed or flagged, past *cursor, which it moves on; how many
 * were examined into *examined (fewer than `chunk`: the pass is done, and
 * the caller resets the cursor).  Runs inside a request of the store
 * (store_request_begin).  MUSTER_OK or MUSTER_STORE in *f. */
muster_err_t compat_delete_idle(store_t *st, int64_t now, int chunk, compat_idle_cursor_t *cursor,
                                int *examined, int64_t *deleted, fail_t *f);

#endif
