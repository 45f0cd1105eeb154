/*
 * iter_internal.h — what libmuster's iteration files (iter.c, iter_reply.c,
 * loader.c, loader_plan.c) share.
 */
#ifndef MUSTER_CLIENT_ITER_INTERNAL_H
#define MUSTER_CLIENT_ITER_INTERNAL_H

#include "muster.h"

#include <jansson.h>
#include <stdbool.h>

#include "core/dataset.h"
#include "core/partition.h"

/* The end of muster_iter_config_t's first version, the fields it was first
 * published with (all it has so far). */
#define ITER_CONFIG_FIRST_END OPTS_END(muster_iter_config_t, cluster_sync)

/* The configuration as the create request's JSON object (new reference). */
json_t *iter_config_json(const muster_iter_config_t *cfg);

/* Builds the dataset and plan of `cfg` locally (the standalone loader, and
 * the coordinated loader's len).  On failure writes why into msg (size n). */
muster_err_t iter_config_plan(const muster_iter_config_t *cfg, dataset_t **ds, part_plan_t **plan,
                              char *msg, size_t n);

/* Reads the `len` bytes of `text`, a `next` reply (docs/api.md), into *out
 * (emptied first; free it with muster_iter_next_free) without a jansson
 * tree (iter_reply.c).  With `want_indices` every block must carry its
 * "indices".  MUSTER_OK; MUSTER_PROTOCOL when the text is not such a reply
 * (a broken, negative, non-integer or miscounted index among others), or
 * MUSTER_NOMEM, with *out empty and why (`why_size` bytes) saying what and
 * where. */
muster_err_t iter_next_read(const char *text, size_t len, bool want_indices,
                            muster_iter_next_t *out, char *why, size_t why_size);

/* Reads a `held` reply (docs/api.md, "GET /v1/iterations/{name}/held")
 * into *out as iter_next_read reads a `next` reply, the same checks on its
 * blocks; each block's `epoch` is the reply's.  Free *out with
 * muster_iter_held_free. */
muster_err_t iter_held_read(const char *text, size_t len, bool want_indices,
                            muster_iter_held_t *out, char *why, size_t why_size);

#endif
