/*
 * compat.h — the DistCompute tracker API, so that the unmodified DistCompute
 * Python client works against a muster pipeline.
 *
 * A head started with `--distcompute NAME=Q1,Q2,...` serves the tracker's
 * protocol under /compat/distcompute/NAME: stage letters a..e are the
 * pipeline's first to fifth queue, a DistCompute worker is a muster worker
 * (so the leaderboard and the dashboard show it), and its job is a muster
 * lease that lives as long as the worker heart-beats.  The client sends no
 * bearer token, so these routes need none: the pipeline is exposed only when
 * the operator names it, and a worker's random token is its credential.
 * docs/dashboard.md and docs/api.md describe the mapping.
 */
#ifndef MUSTER_SERVER_COMPAT_H
#define MUSTER_SERVER_COMPAT_H

#include <jansson.h>
#include <stdbool.h>

#include "http.h"
#include "store.h"

#define COMPAT_MAX_PIPELINES 16
#define COMPAT_MAX_STAGES 5

/* Registers a pipeline from "NAME=Q1,Q2[,Q3...]" (1 to 5 queues).  Returns
 * false after printing why to stderr.  Called while parsing options. */
bool compat_add_pipeline(const char *spec);

/* Creates the pipelines' missing queues chained by `next`, and sets `next`
 * where a queue has none.  Fails (MUSTER_INVALID) when a queue's `next`
 * names another queue than the pipeline's following stage.  Also prepares
 * job numbers (compat_jobs.h), with pipelines or without.  Runs once at
 * start-up, before the event loop; the pipelines' queues in one
 * transaction of their own. */
muster_err_t compat_setup(store_t *st, fail_t *f);

/* True when a pipeline called `name` was registered. */
bool compat_pipeline_exists(const char *name);

/* {"pipelines": [{"name", "project", "prefix", "stages": [{"stage", "queue"}]}]} */
json_t *compat_pipelines_json(void);

/* Route handlers; path parameter 0 is the pipeline's name. */
void compat_h_new(http_req_t *r);
void compat_h_new_job(http_req_t *r);
void compat_h_job_count(http_req_t *r);
void compat_h_update_progress(http_req_t *r);
void compat_h_complete_job(http_req_t *r);
void compat_h_flag_invalid(http_req_t *r);
void compat_h_bye(http_req_t *r);
void compat_h_validate_worker(http_req_t *r);
void compat_h_pipelines(http_req_t *r);
/* GET or POST /api/{}: the tracker's endpoints asked at the head's root; a
 * 404 that gives the URL a DistCompute client needs. */
void compat_h_root_api(http_req_t *r);

#endif
