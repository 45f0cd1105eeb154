/*
 * dataset.h — the shape of a dataset, as iterations see it.
 *
 * A dataset is N samples numbered 0..N-1.  They may come in shards (files,
 * tar archives, tables): shard s holds the consecutive samples
 * [dataset_shard_start(s), dataset_shard_start(s) + dataset_shard_count(s)) and
 * may carry a uri.  A dataset made from a plain count has one implicit shard
 * holding every sample, with no uri.  Optionally every sample has a class label
 * (used by the stratified strategy).
 *
 * Nothing here reads data; a dataset_t is only counts, uris and labels.  Memory
 * is O(number of shards) without labels and O(N) with them (the labels, plus
 * each sample's ordinal within its class, precomputed for stratified
 * partitioning).  A dataset_t is immutable after creation and labelling, so it
 * may be shared by any number of threads and plans.
 */
#ifndef MUSTER_CORE_DATASET_H
#define MUSTER_CORE_DATASET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "muster.h"

/* Largest number of samples: 2^48 keeps every index product in 64 bits. */
#define DATASET_MAX_SAMPLES (UINT64_C(1) << 48)
/* Largest number of shards. */
#define DATASET_MAX_SHARDS (UINT64_C(1) << 32)
/* Labels are 0..DATASET_MAX_CLASSES-1. */
#define DATASET_MAX_CLASSES (UINT32_C(1) << 20)

typedef struct dataset dataset_t;

/*
 * Creates a dataset of `num_samples` samples in one implicit shard (no uri).
 * Returns MUSTER_OK and sets *out (the caller owns it: dataset_destroy), or
 * MUSTER_INVALID when num_samples > DATASET_MAX_SAMPLES, or MUSTER_NOMEM.
 */
muster_err_t dataset_create(uint64_t num_samples, dataset_t **out);

/*
 * Creates a dataset of `num_shards` shards, shard s holding counts[s] samples
 * (0 is allowed) and named uris[s].  `uris` may be NULL (no uris) and any
 * uris[s] may be NULL; the strings are copied.  Returns MUSTER_OK and sets *out
 * (caller owns it), MUSTER_INVALID when num_shards is 0 or above
 * DATASET_MAX_SHARDS, counts is NULL, or the total exceeds DATASET_MAX_SAMPLES,
 * or MUSTER_NOMEM.
 */
muster_err_t dataset_create_shards(size_t num_shards, const uint64_t *counts,
                                   const char *const *uris, dataset_t **out);

/*
 * Gives every sample a class label: labels[i] is sample i's class.  The array
 * is copied.  num_labels must equal the number of samples and every label be
 * below DATASET_MAX_CLASSES (else MUSTER_INVALID, and the dataset is left as
 * it was).  A dataset may be labelled once (MUSTER_INVALID the second time).
 * The number of classes is the largest label + 1; classes without samples are
 * allowed.  MUSTER_NOMEM when the copies cannot be allocated.
 */
muster_err_t dataset_set_labels(dataset_t *ds, const uint32_t *labels, uint64_t num_labels);

/* Frees the dataset; accepts NULL. */
void dataset_destroy(dataset_t *ds);

uint64_t dataset_num_samples(const dataset_t *ds);
size_t dataset_num_shards(const dataset_t *ds);
/* Samples in shard `shard` (< dataset_num_shards). */
uint64_t dataset_shard_count(const dataset_t *ds, size_t shard);
/* The first sample of shard `shard`. */
uint64_t dataset_shard_start(const dataset_t *ds, size_t shard);
/* The uri of shard `shard`, or NULL when it has none; owned by the dataset. */
const char *dataset_shard_uri(const dataset_t *ds, size_t shard);
/* The shard holding `sample` (< dataset_num_samples), in O(log shards). */
size_t dataset_shard_of(const dataset_t *ds, uint64_t sample);

bool dataset_has_labels(const dataset_t *ds);
/* Number of classes (largest label + 1); 0 without labels. */
uint32_t dataset_num_classes(const dataset_t *ds);
/* The label of `sample`; precondition: labelled, sample < N. */
uint32_t dataset_label(const dataset_t *ds, uint64_t sample);
/* Samples of class `cls` (< dataset_num_classes). */
uint64_t dataset_class_count(const dataset_t *ds, uint32_t cls);
/* Samples of classes below `cls`: where class `cls` starts if the samples were
 * listed class by class (class-major order). */
uint64_t dataset_class_start(const dataset_t *ds, uint32_t cls);
/* How many samples of the same class come before `sample` in index order. */
uint64_t dataset_class_ordinal(const dataset_t *ds, uint64_t sample);

/*
 * A stable 64-bit fingerprint of the shape: sample and shard counts and the
 * labels (not the uris, which may differ between nodes holding the same data).
 * Equal shapes have equal fingerprints on every platform.
 */
uint64_t dataset_fingerprint(const dataset_t *ds);

#endif
