/*
 * iter_config.c — an iteration's configuration: JSON in, a validated dataset
 * shape and partition config out, plus the canonical JSON form that is stored
 * and compared when ranks join.
 *
 * The canonical form names every field with its value (defaults made
 * explicit), so two ranks that wrote the same configuration differently
 * ("epochs" omitted or 1) compare equal.  Messages name the field at fault;
 * the core's part_plan_create is the final judge and only says "invalid".
 */
#include "iter_internal.h"
#include "jv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const iter_config_keys[] = {
    "version",        "dataset",    "seed",       "shuffle", "shuffle_block_size",
    "strategy",       "world_size", "block_size", "epochs",  "tail",
    "num_partitions", "hash_seed",  "ranges",     NULL};

#define ITER_MAX_URI 4096
#define U48 ((int64_t)DATASET_MAX_SAMPLES)

void iter_spec_free(iter_spec_t *spec) {
  if (spec == NULL)
    return;
  dataset_destroy(spec->ds);
  free(spec->ranges);
  json_decref(spec->canon);
  memset(spec, 0, sizeof *spec);
}

char *iter_canon_text(const json_t *canon) {
  return json_dumps(canon, JSON_COMPACT | JSON_SORT_KEYS);
}

/* dataset.shards: [{"count": c, "uri": "..."}], copied into the dataset. */
static muster_err_t parse_shards(const json_t *shards, json_t *canon, dataset_t **ds, fail_t *f) {
  size_t n = json_array_size(shards);
  if (!json_is_array(shards) || n == 0)
    return fail_set(f, MUSTER_INVALID, "dataset.shards: expected a non-empty array");
  uint64_t *counts = calloc(n, sizeof *counts);
  const char **uris = calloc(n, sizeof *uris);
  json_t *list = json_array();
  json_object_set_new(canon, "shards", list);
  muster_err_t err = counts && uris ? MUSTER_OK : fail_set(f, MUSTER_NOMEM, "out of memory");
  uint64_t total = 0;
  static const char *const allowed[] = {"count", "uri", NULL};
  for (size_t i = 0; i < n && err == MUSTER_OK; i++) {
    char ctx[48];
    snprintf(ctx, sizeof ctx, "dataset.shards[%zu]", i);
    const json_t *shard = json_array_get(shards, i);
    int64_t count;
    if (!json_is_object(shard)) {
      err = fail_set(f, MUSTER_INVALID, "%s: expected an object {\"count\", \"uri\"}", ctx);
    } else if (!(err = jv_only(shard, ctx, allowed, f)) &&
               !(err = jv_int(shard, "count", ctx, -1, 0, U48, &count, f)) &&
               !(err = jv_str(shard, "uri", ctx, NULL, ITER_MAX_URI, &uris[i], f))) {
      if (count < 0)
        err = fail_set(f, MUSTER_INVALID, "%s.count: missing", ctx);
      else if ((total += (uint64_t)count) > DATASET_MAX_SAMPLES)
        err = fail_set(f, MUSTER_INVALID, "dataset.shards: more than 2^48 samples in all");
      counts[i] = (uint64_t)count;
      json_t *c = json_pack("{s:I}", "count", (json_int_t)count);
      if (uris[i])
        json_object_set_new(c, "uri", json_string(uris[i]));
      json_array_append_new(list, c);
    }
  }
  if (err == MUSTER_OK && dataset_create_shards(n, counts, uris, ds) != MUSTER_OK)
    err = fail_set(f, MUSTER_NOMEM, "out of memory");
  free(counts);
  free(uris);
  return err;
}

/* dataset.labels: one integer class per sample. */
static muster_err_t parse_labels(const json_t *labels, dataset_t *ds, json_t *canon, fail_t *f) {
  uint64_t n = dataset_num_samples(ds);
  if (!json_is_array(labels) || json_array_size(labels) != n)
    return fail_set(f, MUSTER_INVALID,
                    "dataset.labels: expected an array of %llu class labels (one per sample)",
                    (unsigned long long)n);
  uint32_t *values = malloc((n ? n : 1) * sizeof *values);
  if (values == NULL)
    return fail_set(f, MUSTER_NOMEM, "out of memory");
  for (uint64_t i = 0; i < n; i++) {
    const json_t *v = json_array_get(labels, i);
    json_int_t x = json_is_integer(v) ? json_integer_value(v) : -1;
    if (x < 0 || x >= (json_int_t)DATASET_MAX_CLASSES) {
      free(values);
      return fail_set(f, MUSTER_INVALID, "dataset.labels[%llu]: expected an integer in [0, %u)",
                      (unsigned long long)i, DATASET_MAX_CLASSES);
    }
    values[i] = (uint32_t)x;
  }
  muster_err_t err = dataset_set_labels(ds, values, n);
  free(values);
  if (err != MUSTER_OK)
    return fail_set(f, err, "dataset.labels: could not be set");
  json_object_set(canon, "labels", (json_t *)labels);
  return MUSTER_OK;
}

static muster_err_t parse_dataset(const json_t *obj, iter_spec_t *spec, fail_t *f) {
  static const char *const allowed[] = {"num_samples", "shards", "labels", NULL};
  const json_t *d = json_object_get(obj, "dataset");
  if (d == NULL || !json_is_object(d))
    return fail_set(f, MUSTER_INVALID,
                    "dataset: expected an object {\"num_samples\": N} or {\"shards\": [...]}");
  if (jv_only(d, "dataset", allowed, f))
    return f->code;
  json_t *canon = json_object();
  json_object_set_new(spec->canon, "dataset", canon);
  const json_t *shards = json_object_get(d, "shards");
  int64_t n;
  if (jv_int(d, "num_samples", "dataset", -1, 0, U48, &n, f))
    return f->code;
  if ((n >= 0) == (shards != NULL))
    return fail_set(f, MUSTER_INVALID, "dataset: give exactly one of num_samples and shards");
  if (n >= 0) {
    json_object_set_new(canon, "num_samples", json_integer(n));
    if (dataset_create((uint64_t)n, &spec->ds) != MUSTER_OK)
      return fail_set(f, MUSTER_NOMEM, "out of memory");
  } else if (parse_shards(shards, canon, &spec->ds, f)) {
    return f->code;
  }
  const json_t *labels = json_object_get(d, "labels");
  if (labels && !json_is_null(labels) && parse_labels(labels, spec->ds, canon, f))
    return f->code;
  return MUSTER_OK;
}

static muster_err_t parse_shuffle(const char *name, unsigned *out) {
  part_shuffle_t v;
  muster_err_t err = part_shuffle_parse(name, &v);
  *out = (unsigned)v;
  return err;
}

static muster_err_t parse_strategy(const char *name, unsigned *out) {
  part_strategy_t v;
  muster_err_t err = part_strategy_parse(name, &v);
  *out = (unsigned)v;
  return err;
}

static muster_err_t parse_tail(const char *name, unsigned *out) {
  part_tail_t v;
  muster_err_t err = part_tail_parse(name, &v);
  *out = (unsigned)v;
  return err;
}

/* An enum field given true or false ("shuffle": true, as other loaders write
 * it): refused with the value to write. */
static muster_err_t refuse_boolean(const char *key, bool value, const char *names, fail_t *f) {
  const char *hint = "";
  if (strcmp(key, "shuffle") == 0)
    hint = value ? " (write \"global\": a seed alone does not shuffle)" : " (write \"none\")";
  return fail_set(f, MUSTER_INVALID, "%s: expected one of %s, not %s%s", key, names,
                  value ? "true" : "false", hint);
}

/* An enum field by name: `names` is the error's list of valid values. */
static muster_err_t parse_enum(const json_t *obj, const char *key, const char *dflt,
                               muster_err_t (*parse)(const char *, unsigned *), unsigned *out,
                               const char *names, json_t *canon, fail_t *f) {
  const char *text;
  const json_t *given = json_object_get(obj, key);
  if (json_is_boolean(given))
    return refuse_boolean(key, json_is_true(given), names, f);
  if (jv_str(obj, key, "", dflt, 64, &text, f))
    return f->code;
  if (parse(text, out) == MUSTER_OK) {
    json_object_set_new(canon, key, json_string(text));
    return MUSTER_OK;
  }
  const char *meant = parse == parse_strategy ? part_strategy_meant(text) : NULL;
  char guess[48] = "";
  if (meant)
    snprintf(guess, sizeof guess, " (did you mean '%s'?)", meant);
  return fail_set(f, MUSTER_INVALID, "%s: '%s' is not one of %s%s", key, text, names, guess);
}

/* ranges: world_size pairs [begin, end) that tile [0, N). */
static muster_err_t parse_ranges(const json_t *obj, iter_spec_t *spec, fail_t *f) {
  const json_t *list = json_object_get(obj, "ranges");
  part_config_t *cfg = &spec->cfg;
  if (cfg->strategy != PART_RANGE) {
    if (list && !json_is_null(list))
      return fail_set(f, MUSTER_INVALID, "ranges: only the range strategy takes ranges");
    return MUSTER_OK;
  }
  if (!json_is_array(list) || json_array_size(list) != cfg->world_size)
    return fail_set(f, MUSTER_INVALID,
                    "ranges: the range strategy needs world_size (%u) pairs [begin, end)",
                    cfg->world_size);
  spec->ranges = calloc(cfg->world_size, sizeof *spec->ranges);
  if (spec->ranges == NULL)
    return fail_set(f, MUSTER_NOMEM, "out of memory");
  for (uint32_t r = 0; r < cfg->world_size; r++) {
    const json_t *pair = json_array_get(list, r);
    const json_t *b = json_array_get(pair, 0), *e = json_array_get(pair, 1);
    if (json_array_size(pair) != 2 || !json_is_integer(b) || !json_is_integer(e) ||
        json_integer_value(b) < 0 || json_integer_value(e) < json_integer_value(b))
      return fail_set(f, MUSTER_INVALID, "ranges[%u]: expected [begin, end) with 0 <= begin <= end",
                      r);
    spec->ranges[r] =
        (part_range_t){(uint64_t)json_integer_value(b), (uint64_t)json_integer_value(e)};
  }
  cfg->ranges = spec->ranges;
  json_object_set(spec->canon, "ranges", (json_t *)list);
  return MUSTER_OK;
}

/* The integer fields, with their ranges. */
static muster_err_t parse_numbers(const json_t *obj, part_config_t *cfg, json_t *canon, fail_t *f) {
  int64_t version, seed, sbs, world, block, epochs, parts, hseed;
  if (jv_int(obj, "version", "", PART_ALGORITHM_VERSION, 1, PART_ALGORITHM_VERSION, &version, f) ||
      jv_int(obj, "seed", "", 0, 0, INT64_MAX, &seed, f) ||
      jv_int(obj, "shuffle_block_size", "", PART_DEFAULT_SHUFFLE_BLOCK_SIZE, 1, U48, &sbs, f) ||
      jv_int(obj, "world_size", "", 1, 1, PART_MAX_WORLD_SIZE, &world, f) ||
      jv_int(obj, "block_size", "", PART_DEFAULT_BLOCK_SIZE, 1, U48, &block, f) ||
      jv_int(obj, "epochs", "", 1, 0, INT64_MAX, &epochs, f) ||
      jv_int(obj, "num_partitions", "", 0, 0, UINT32_MAX, &parts, f) ||
      jv_int(obj, "hash_seed", "", 0, 0, INT64_MAX, &hseed, f))
    return f->code;
  cfg->version = (uint32_t)version;
  cfg->seed = (uint64_t)seed;
  cfg->shuffle_block_size = (uint64_t)sbs;
  cfg->world_size = (uint32_t)world;
  cfg->block_size = (uint64_t)block;
  cfg->epochs = (uint64_t)epochs;
  cfg->num_partitions = (uint32_t)parts;
  cfg->hash_seed = (uint64_t)hseed;
  json_object_set_new(canon, "version", json_integer(version));
  json_object_set_new(canon, "seed", json_integer(seed));
  json_object_set_new(canon, "shuffle_block_size", json_integer(sbs));
  json_object_set_new(canon, "world_size", json_integer(world));
  json_object_set_new(canon, "block_size", json_integer(block));
  json_object_set_new(canon, "epochs", json_integer(epochs));
  json_object_set_new(canon, "num_partitions", json_integer(parts));
  json_object_set_new(canon, "hash_seed", json_integer(hseed));
  return MUSTER_OK;
}

muster_err_t iter_spec_parse(const json_t *obj, iter_spec_t *spec, fail_t *f) {
  memset(spec, 0, sizeof *spec);
  spec->canon = json_object();
  part_config_t *cfg = &spec->cfg;
  part_config_init(cfg);
  unsigned shuffle = 0, strategy = 0, tail = 0;
  if (parse_numbers(obj, cfg, spec->canon, f) || parse_dataset(obj, spec, f) ||
      parse_enum(obj, "shuffle", "none", parse_shuffle, &shuffle, PART_SHUFFLE_NAMES, spec->canon,
                 f) ||
      parse_enum(obj, "strategy", "round_robin", parse_strategy, &strategy, PART_STRATEGY_NAMES,
                 spec->canon, f) ||
      parse_enum(obj, "tail", "keep", parse_tail, &tail, PART_TAIL_NAMES, spec->canon, f))
    goto fail;
  cfg->shuffle = (part_shuffle_t)shuffle;
  cfg->strategy = (part_strategy_t)strategy;
  cfg->tail = (part_tail_t)tail;
  if (parse_ranges(obj, spec, f))
    goto fail;
  if (cfg->strategy == PART_STRATIFIED && !dataset_has_labels(spec->ds)) {
    fail_set(f, MUSTER_INVALID, "strategy: stratified needs dataset.labels");
    goto fail;
  }
  if (cfg->strategy == PART_DYNAMIC && cfg->tail != PART_TAIL_KEEP) {
    fail_set(f, MUSTER_INVALID,
             "tail: a coordinated dynamic iteration hands out every sample "
             "exactly once; pad and drop apply to static strategies");
    goto fail;
  }
  return MUSTER_OK;
fail:
  iter_spec_free(spec);
  return f->code;
}
