/*
 * iter_internal.h — what libmuster's iteration files (iter.c, loader.c,
 * loader_plan.c) share.
 */
#ifndef MUSTER_CLIENT_ITER_INTERNAL_H
#define MUSTER_CLIENT_ITER_INTERNAL_H

#include "muster.h"

#include <jansson.h>

#include "core/dataset.h"
#include "core/partition.h"

/* The configuration as the create request's JSON object (new reference). */
json_t *iter_config_json(const muster_iter_config_t *cfg);

/* Builds the dataset and plan of `cfg` locally (the standalone loader, and
 * the coordinated loader's len).  On failure writes why into msg (size n). */
muster_err_t iter_config_plan(const muster_iter_config_t *cfg, dataset_t **ds, part_plan_t **plan,
                              char *msg, size_t n);

#endif
