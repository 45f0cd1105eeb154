/*
 * loader_plan.c — an iteration configuration (muster_iter_config_t) turned
 * into the core's dataset and partition plan, on the client: the
 * standalone loader computes its stream from it with no head at all.
 */
#include "client/iter_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Says in msg that `value` of field `key` is none of `names`, as the head says
 * it: with the strategy it likely meant (part_strategy_meant) for a strategy. */
static muster_err_t part_bad_name(const char *key, const char *value, const char *names, char *msg,
                                  size_t n) {
  const char *meant = strcmp(key, "strategy") == 0 ? part_strategy_meant(value) : NULL;
  char guess[48] = "";
  if (meant)
    snprintf(guess, sizeof guess, " (did you mean '%s'?)", meant);
  snprintf(msg, n, "%s: '%s' is not one of %s%s", key, value, names, guess);
  return MUSTER_INVALID;
}

/* What a strategy needs and only it takes, said in the head's words (the
 * core's plan, the final judge, only says "invalid"). */
static muster_err_t part_inputs_check(const muster_iter_config_t *in, part_strategy_t strategy,
                                      char *msg, size_t n) {
  if (strategy == PART_RANGE && in->ranges == NULL)
    snprintf(msg, n,
             "ranges: the range strategy needs world_size (%u) pairs [begin, end) "
             "(muster_iter_config_t.ranges)",
             in->world_size);
  else if (strategy != PART_RANGE && in->ranges != NULL)
    snprintf(msg, n, "ranges: only the range strategy takes ranges");
  else if (strategy == PART_STRATIFIED && in->labels == NULL)
    snprintf(msg, n,
             "strategy: stratified needs a class label per sample "
             "(muster_iter_config_t.labels)");
  else
    return MUSTER_OK;
  return MUSTER_INVALID;
}

/* The sizes the core's plan takes, said in the head's words when one is out
 * of range.  muster_iter_config_init sets them; a 0 is a caller's mistake (an
 * unset world size read from the environment, say), which the head refuses
 * too: taken as the default, every "rank" would read the whole dataset. */
static muster_err_t part_numbers_check(const muster_iter_config_t *in, char *msg, size_t n) {
  const char *field = NULL;
  uint64_t value = 0, most = DATASET_MAX_SAMPLES;
  if (in->world_size == 0 || in->world_size > PART_MAX_WORLD_SIZE)
    field = "world_size", value = in->world_size, most = PART_MAX_WORLD_SIZE;
  else if (in->block_size == 0 || in->block_size > DATASET_MAX_SAMPLES)
    field = "block_size", value = in->block_size;
  else if (in->shuffle_block_size == 0 || in->shuffle_block_size > DATASET_MAX_SAMPLES)
    field = "shuffle_block_size", value = in->shuffle_block_size;
  if (field == NULL)
    return MUSTER_OK;
  snprintf(msg, n, "%s: %llu is out of range; it must be from 1 to %llu%s", field,
           (unsigned long long)value, (unsigned long long)most,
           value == 0 ? " (muster_iter_config_init sets the defaults)" : "");
  return MUSTER_INVALID;
}

/* Fills *cfg from the public configuration; the enum names are checked. */
static muster_err_t part_from(const muster_iter_config_t *in, part_config_t *cfg,
                              part_range_t **ranges, char *msg, size_t n) {
  part_config_init(cfg);
  if (in->shuffle && part_shuffle_parse(in->shuffle, &cfg->shuffle) != MUSTER_OK)
    return part_bad_name("shuffle", in->shuffle, PART_SHUFFLE_NAMES, msg, n);
  if (in->strategy && part_strategy_parse(in->strategy, &cfg->strategy) != MUSTER_OK)
    return part_bad_name("strategy", in->strategy, PART_STRATEGY_NAMES, msg, n);
  if (in->tail && part_tail_parse(in->tail, &cfg->tail) != MUSTER_OK)
    return part_bad_name("tail", in->tail, PART_TAIL_NAMES, msg, n);
  if (part_numbers_check(in, msg, n) != MUSTER_OK ||
      part_inputs_check(in, cfg->strategy, msg, n) != MUSTER_OK)
    return MUSTER_INVALID;
  cfg->seed = in->seed;
  cfg->shuffle_block_size = in->shuffle_block_size;
  cfg->world_size = in->world_size;
  cfg->block_size = in->block_size;
  cfg->epochs = in->epochs;
  cfg->num_partitions = in->num_partitions;
  cfg->hash_seed = in->hash_seed;
  *ranges = NULL;
  if (in->ranges) {
    if ((*ranges = calloc(cfg->world_size, sizeof **ranges)) == NULL)
      return MUSTER_NOMEM;
    for (uint32_t r = 0; r < cfg->world_size; r++)
      (*ranges)[r] = (part_range_t){in->ranges[2 * r], in->ranges[2 * r + 1]};
    cfg->ranges = *ranges;
  }
  return MUSTER_OK;
}

/* What the core's dataset takes, said in the head's words where it refuses
 * (the core only says "invalid"): at most 2^48 samples in all and 2^32
 * shards, each sample's label below 2^20. */
static muster_err_t dataset_inputs_check(const muster_iter_config_t *in, char *msg, size_t n) {
  if (in->num_shards == 0 && in->num_samples > DATASET_MAX_SAMPLES)
    snprintf(msg, n, "dataset.num_samples: %llu is out of range; it must be from 0 to %llu",
             (unsigned long long)in->num_samples, (unsigned long long)DATASET_MAX_SAMPLES);
  else if (in->num_shards > 0 && in->shard_counts == NULL)
    snprintf(msg, n, "dataset.shards: num_shards is %zu, and shard_counts is NULL", in->num_shards);
  else if ((uint64_t)in->num_shards > DATASET_MAX_SHARDS)
    snprintf(msg, n, "dataset.shards: %zu shards, more than 2^32", in->num_shards);
  else
    return MUSTER_OK;
  return MUSTER_INVALID;
}

/* The samples of shards `counts` and their labels, checked as the head checks
 * them (after dataset_inputs_check). */
static muster_err_t dataset_counts_check(const muster_iter_config_t *in, char *msg, size_t n) {
  uint64_t total = in->num_shards > 0 ? 0 : in->num_samples;
  for (size_t s = 0; s < in->num_shards; total += in->shard_counts[s++])
    if (in->shard_counts[s] > DATASET_MAX_SAMPLES - total) {
      snprintf(msg, n, "dataset.shards: more than 2^48 samples in all");
      return MUSTER_INVALID;
    }
  for (uint64_t i = 0; in->labels != NULL && i < total; i++)
    if (in->labels[i] >= DATASET_MAX_CLASSES) {
      snprintf(msg, n, "dataset.labels[%llu]: expected an integer in [0, %u)",
               (unsigned long long)i, DATASET_MAX_CLASSES);
      return MUSTER_INVALID;
    }
  return MUSTER_OK;
}

/* Says in msg why the core refused a plan whose fields part_from took: for
 * the range strategy, the ranges (the head's words); else in general. */
static void plan_refusal(const muster_iter_config_t *in, part_strategy_t strategy, char *msg,
                         size_t n) {
  for (uint32_t r = 0; strategy == PART_RANGE && r < in->world_size; r++)
    if (in->ranges[2 * r + 1] < in->ranges[2 * r]) {
      snprintf(msg, n, "ranges[%u]: expected [begin, end) with 0 <= begin <= end", r);
      return;
    }
  snprintf(msg, n, "%s",
           strategy == PART_RANGE
               ? "ranges: the non-empty ranges must tile [0, N) exactly (no gap, no overlap)"
               : "the configuration is invalid (see docs/iterations.md, Configuration)");
}

muster_err_t iter_config_plan(const muster_iter_config_t *in, dataset_t **ds, part_plan_t **plan,
                              char *msg, size_t n) {
  *ds = NULL;
  *plan = NULL;
  muster_err_t err = dataset_inputs_check(in, msg, n);
  if (err == MUSTER_OK && (err = dataset_counts_check(in, msg, n)) == MUSTER_OK) {
    err = in->num_shards > 0
              ? dataset_create_shards(in->num_shards, in->shard_counts, in->shard_uris, ds)
              : dataset_create(in->num_samples, ds);
    if (err == MUSTER_OK && in->labels)
      err = dataset_set_labels(*ds, in->labels, dataset_num_samples(*ds));
    if (err != MUSTER_OK)
      snprintf(msg, n, "%s", err == MUSTER_NOMEM ? "out of memory" : "dataset: invalid shape");
  }
  if (err != MUSTER_OK) {
    dataset_destroy(*ds);
    *ds = NULL;
    return err;
  }
  part_config_t cfg;
  part_range_t *ranges = NULL;
  if ((err = part_from(in, &cfg, &ranges, msg, n)) == MUSTER_OK &&
      (err = part_plan_create(*ds, &cfg, plan)) != MUSTER_OK) {
    if (err == MUSTER_NOMEM)
      snprintf(msg, n, "out of memory");
    else
      plan_refusal(in, cfg.strategy, msg, n);
  }
  free(ranges);
  if (err != MUSTER_OK) {
    dataset_destroy(*ds);
    *ds = NULL;
  }
  return err;
}
