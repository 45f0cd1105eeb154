/*
 * dataset.c — dataset shapes: shard boundaries, uris and class labels.
 *
 * Shards are kept as a prefix-sum array (shard_starts, one entry more than
 * shards) so that the shard of a sample is a binary search.  Labels come with
 * two derived tables computed once: class_starts (prefix sums of class sizes)
 * and each sample's ordinal within its class; together they place every
 * sample in the class-major listing that stratified partitioning deals from.
 */
#include "core/dataset.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

struct dataset {
  uint64_t num_samples;
  size_t num_shards;
  uint64_t *shard_starts;   /* num_shards + 1 entries; the last is num_samples */
  char **shard_uris;        /* num_shards entries (each may be NULL), or NULL */
  uint32_t *labels;         /* num_samples entries, or NULL when unlabelled */
  uint64_t *class_ordinals; /* per sample: same-class samples before it */
  uint64_t *class_starts;   /* num_classes + 1 entries; the last is num_samples */
  uint32_t num_classes;
  uint64_t fingerprint;
};

/* Values hashed per chunk when fingerprinting arrays. */
#define FP_CHUNK 256

static void put_le64(unsigned char *out, uint64_t value) {
  for (int i = 0; i < 8; i++)
    out[i] = (unsigned char)(value >> (8 * i));
}

/*
 * Fingerprint version 1: H(le64(N) le64(shards) le64(labelled), 0), then each
 * run of up to FP_CHUNK shard counts (le64 each) and then of labels (le64 each)
 * hashed with the previous value as seed.
 */
static uint64_t fp_chain_u64(uint64_t fp, uint64_t count,
                             uint64_t (*get)(const dataset_t *, uint64_t), const dataset_t *ds) {
  unsigned char buf[FP_CHUNK * 8];
  for (uint64_t done = 0; done < count;) {
    size_t used = 0;
    for (; used < FP_CHUNK && done < count; used++, done++)
      put_le64(buf + used * 8, get(ds, done));
    fp = XXH3_64bits_withSeed(buf, used * 8, fp);
  }
  return fp;
}

static uint64_t fp_shard_count(const dataset_t *ds, uint64_t shard) {
  return ds->shard_starts[shard + 1] - ds->shard_starts[shard];
}

static uint64_t fp_label(const dataset_t *ds, uint64_t sample) {
  return ds->labels[sample];
}

static void compute_fingerprint(dataset_t *ds) {
  unsigned char head[24];
  put_le64(head, ds->num_samples);
  put_le64(head + 8, ds->num_shards);
  put_le64(head + 16, ds->labels != NULL);
  uint64_t fp = XXH3_64bits_withSeed(head, sizeof head, 0);
  fp = fp_chain_u64(fp, ds->num_shards, fp_shard_count, ds);
  if (ds->labels != NULL)
    fp = fp_chain_u64(fp, ds->num_samples, fp_label, ds);
  ds->fingerprint = fp;
}

static muster_err_t dataset_alloc(size_t num_shards, dataset_t **out) {
  dataset_t *ds = calloc(1, sizeof *ds);
  if (ds == NULL)
    return MUSTER_NOMEM;
  ds->num_shards = num_shards;
  ds->shard_starts = calloc(num_shards + 1, sizeof *ds->shard_starts);
  if (ds->shard_starts == NULL) {
    free(ds);
    return MUSTER_NOMEM;
  }
  *out = ds;
  return MUSTER_OK;
}

muster_err_t dataset_create(uint64_t num_samples, dataset_t **out) {
  if (out == NULL || num_samples > DATASET_MAX_SAMPLES)
    return MUSTER_INVALID;
  muster_err_t err = dataset_alloc(1, out);
  if (err != MUSTER_OK)
    return err;
  (*out)->num_samples = num_samples;
  (*out)->shard_starts[1] = num_samples;
  compute_fingerprint(*out);
  return MUSTER_OK;
}

/* Copies uris[] into ds->shard_uris; MUSTER_NOMEM on failure (ds keeps what
 * it has, for dataset_destroy). */
static muster_err_t copy_uris(dataset_t *ds, const char *const *uris) {
  ds->shard_uris = calloc(ds->num_shards, sizeof *ds->shard_uris);
  if (ds->shard_uris == NULL)
    return MUSTER_NOMEM;
  for (size_t s = 0; s < ds->num_shards; s++) {
    if (uris[s] == NULL)
      continue;
    ds->shard_uris[s] = strdup(uris[s]);
    if (ds->shard_uris[s] == NULL)
      return MUSTER_NOMEM;
  }
  return MUSTER_OK;
}

muster_err_t dataset_create_shards(size_t num_shards, const uint64_t *counts,
                                   const char *const *uris, dataset_t **out) {
  if (out == NULL || counts == NULL || num_shards == 0 || (uint64_t)num_shards > DATASET_MAX_SHARDS)
    return MUSTER_INVALID;
  uint64_t total = 0;
  for (size_t s = 0; s < num_shards; s++) {
    if (counts[s] > DATASET_MAX_SAMPLES - total)
      return MUSTER_INVALID;
    total += counts[s];
  }
  dataset_t *ds = NULL;
  muster_err_t err = dataset_alloc(num_shards, &ds);
  if (err != MUSTER_OK)
    return err;
  ds->num_samples = total;
  for (size_t s = 0; s < num_shards; s++)
    ds->shard_starts[s + 1] = ds->shard_starts[s] + counts[s];
  if (uris != NULL && (err = copy_uris(ds, uris)) != MUSTER_OK) {
    dataset_destroy(ds);
    return err;
  }
  compute_fingerprint(ds);
  *out = ds;
  return MUSTER_OK;
}

/* Fills class_starts and class_ordinals from labels (already copied). */
static void index_classes(dataset_t *ds, uint64_t *class_counts) {
  for (uint64_t i = 0; i < ds->num_samples; i++)
    ds->class_ordinals[i] = class_counts[ds->labels[i]]++;
  ds->class_starts[0] = 0;
  for (uint32_t c = 0; c < ds->num_classes; c++)
    ds->class_starts[c + 1] = ds->class_starts[c] + class_counts[c];
}

muster_err_t dataset_set_labels(dataset_t *ds, const uint32_t *labels, uint64_t num_labels) {
  if (ds == NULL || ds->labels != NULL || num_labels != ds->num_samples ||
      (labels == NULL && num_labels > 0))
    return MUSTER_INVALID;
  uint32_t max_label = 0;
  for (uint64_t i = 0; i < num_labels; i++) {
    if (labels[i] >= DATASET_MAX_CLASSES)
      return MUSTER_INVALID;
    if (labels[i] > max_label)
      max_label = labels[i];
  }
  uint32_t num_classes = num_labels == 0 ? 0 : max_label + 1;
  size_t n = (size_t)num_labels;
  uint32_t *copy = malloc((n ? n : 1) * sizeof *copy);
  uint64_t *ordinals = malloc((n ? n : 1) * sizeof *ordinals);
  uint64_t *starts = calloc((size_t)num_classes + 1, sizeof *starts);
  uint64_t *counts = calloc((size_t)num_classes + 1, sizeof *counts);
  if (copy == NULL || ordinals == NULL || starts == NULL || counts == NULL) {
    free(copy), free(ordinals), free(starts), free(counts);
    return MUSTER_NOMEM;
  }
  if (n > 0)
    memcpy(copy, labels, n * sizeof *copy);
  ds->labels = copy;
  ds->class_ordinals = ordinals;
  ds->class_starts = starts;
  ds->num_classes = num_classes;
  index_classes(ds, counts);
  free(counts);
  compute_fingerprint(ds);
  return MUSTER_OK;
}

void dataset_destroy(dataset_t *ds) {
  if (ds == NULL)
    return;
  if (ds->shard_uris != NULL)
    for (size_t s = 0; s < ds->num_shards; s++)
      free(ds->shard_uris[s]);
  free(ds->shard_uris);
  free(ds->shard_starts);
  free(ds->labels);
  free(ds->class_ordinals);
  free(ds->class_starts);
  free(ds);
}

uint64_t dataset_num_samples(const dataset_t *ds) {
  return ds->num_samples;
}

size_t dataset_num_shards(const dataset_t *ds) {
  return ds->num_shards;
}

uint64_t dataset_shard_count(const dataset_t *ds, size_t shard) {
  assert(shard < ds->num_shards);
  return ds->shard_starts[shard + 1] - ds->shard_starts[shard];
}

uint64_t dataset_shard_start(const dataset_t *ds, size_t shard) {
  assert(shard < ds->num_shards);
  return ds->shard_starts[shard];
}

const char *dataset_shard_uri(const dataset_t *ds, size_t shard) {
  assert(shard < ds->num_shards);
  return ds->shard_uris == NULL ? NULL : ds->shard_uris[shard];
}

/* The last shard starting at or before `sample`; empty shards start where the
 * next one does, so the last such shard is the non-empty one holding it. */
size_t dataset_shard_of(const dataset_t *ds, uint64_t sample) {
  assert(sample < ds->num_samples);
  size_t lo = 0, hi = ds->num_shards; /* answer in [lo, hi) */
  while (hi - lo > 1) {
    size_t mid = lo + (hi - lo) / 2;
    if (ds->shard_starts[mid] <= sample)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

bool dataset_has_labels(const dataset_t *ds) {
  return ds->labels != NULL;
}

uint32_t dataset_num_classes(const dataset_t *ds) {
  return ds->num_classes;
}

uint32_t dataset_label(const dataset_t *ds, uint64_t sample) {
  assert(ds->labels != NULL && sample < ds->num_samples);
  return ds->labels[sample];
}

uint64_t dataset_class_count(const dataset_t *ds, uint32_t cls) {
  assert(cls < ds->num_classes);
  return ds->class_starts[cls + 1] - ds->class_starts[cls];
}

uint64_t dataset_class_start(const dataset_t *ds, uint32_t cls) {
  assert(cls < ds->num_classes);
  return ds->class_starts[cls];
}

uint64_t dataset_class_ordinal(const dataset_t *ds, uint64_t sample) {
  assert(ds->labels != NULL && sample < ds->num_samples);
  return ds->class_ordinals[sample];
}

uint64_t dataset_fingerprint(const dataset_t *ds) {
  return ds->fingerprint;
}
