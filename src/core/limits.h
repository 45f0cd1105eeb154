/*
 * limits.h — the head's per-request limits on tasks (docs/api.md), which the
 * client library and the CLI check too, so that a caller hears of a request
 * too large in its own words before it is sent.  The iteration limits are in
 * partition.h.
 */
#ifndef MUSTER_CORE_LIMITS_H
#define MUSTER_CORE_LIMITS_H

/* Tasks one request may put, lease, complete or submit to a session. */
#define TASK_MAX_BATCH 1000

#endif
