/*
 * compat_jobs.h — DistCompute job numbers: 1, 2, 3... per pipeline, given
 * when a job is first numbered and kept by the job through every stage, so
 * that a worker can name the job's files by it at any stage.
 *
 * A pipeline is named by its first queue.  The tracker routes (compat.c)
 * and the Python client (POST /v1/distcompute/jobs) number the same jobs
 * alike.  A number lives as long as the job has a task that may ask for it
 * (compat_jobs.c says how that is told and what it costs).
 */
#ifndef MUSTER_SERVER_COMPAT_JOBS_H
#define MUSTER_SERVER_COMPAT_JOBS_H

#include <jansson.h>
#include <stdint.h>

#include "http.h"
#include "store.h"

/* The job number of `task` in the pipeline whose first queue is `first`:
 * the number of the nearest task up its chain of parents that has one, or
 * the pipeline's next number.  The task keeps it (asked again, the same).
 * 0 on a store failure, with *f filled.  Runs in the caller's request. */
int64_t compat_job_number(store_t *st, const char *first, int64_t task, fail_t *f);

/* At start-up, in compat_setup's transaction: numbers kept under the
 * tracker pipeline `name` before numbers were keyed by the first queue
 * (schema 17) go under `first`.  Where `first` has numbers already, the old
 * ones are dropped and numbering goes on above both, so that no two jobs
 * ever share a number. */
muster_err_t compat_jobs_adopt(store_t *st, const char *name, const char *first, fail_t *f);

/* Once any number exists, makes the store carry a numbered task's number
 * to the child it is given and forget the numbers of deleted tasks (two
 * temporary triggers of this connection).  Called at start-up and by every
 * numbering; cheap when already done. */
muster_err_t compat_jobs_watch(store_t *st, fail_t *f);

/* POST /v1/distcompute/jobs {"pipeline": FIRST_QUEUE, "task": ID} ->
 * {"pipeline", "task", "number"}. */
void compat_h_job_number(http_req_t *r);

#endif
