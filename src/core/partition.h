/*
 * partition.h — which rank reads which sample, in which order, every epoch.
 *
 * Two steps, both pure functions of the configuration (docs/iterations.md
 * works an example of each):
 *
 * 1. The epoch order: a sequence of all N samples, position 0..N-1, given by
 *    the shuffle mode — `none` (sample p at position p), `global` (a keyed
 *    bijection from (seed, epoch), see perm.h) or `shard` (the shard order
 *    shuffled, then samples shuffled within windows of shuffle_block_size
 *    consecutive samples of a shard, so reads stay local).
 *
 * 2. The partition of that order among world_size ranks.  Positional strategies
 *    own positions of the epoch order, so with a shuffle a sample's rank changes
 *    from epoch to epoch: `round_robin` (position p to rank p mod W),
 *    `contiguous` (W consecutive runs, the first N mod W ranks one longer) and
 *    `dynamic` (the order cut into blocks of block_size; a coordinator hands them
 *    to whichever rank asks; its static view deals block b to rank b mod W).
 *    Sample strategies own samples, the same ones every epoch, and visit them in
 *    epoch order: `hash` (partition hash(sample, hash_seed) mod num_partitions,
 *    partition q to rank q mod W), `range` (rank r owns [begin, end) of ranges[r];
 *    the ranges tile [0, N)) and `stratified` (samples listed class by class,
 *    dealt round robin, so each rank holds every class in proportion, within one
 *    sample).
 *
 *    A rank's items per epoch follow its owned samples; then the tail rule:
 *    `keep` (uneven counts, every sample exactly once), `pad` (every rank as many
 *    as the largest; rank r's k-th item for k >= owned is the sample at epoch
 *    position (r + k*W) mod N, which is exactly what PyTorch's DistributedSampler
 *    does for round_robin) or `drop` (every rank as many as the smallest; a rank
 *    drops the end of its list, for round_robin exactly DistributedSampler's
 *    drop_last).
 *
 * A part_plan_t holds a validated configuration for one dataset and what every
 * epoch shares (per-rank counts: O(world_size) memory; the hash strategy counts
 * them with one O(N) pass at creation).  A part_epoch_t holds one epoch's order
 * (O(1), or O(shards) for shard mode).  Both are immutable once created and may
 * be shared between threads.  Outputs are versioned by PART_ALGORITHM_VERSION
 * (which includes PERM_ALGORITHM_VERSION) and pinned by golden-value tests.
 */
#ifndef MUSTER_CORE_PARTITION_H
#define MUSTER_CORE_PARTITION_H

#include <stdbool.h>
#include <stdint.h>

#include "core/dataset.h"
#include "muster.h"

/* Bumped whenever any output of the epoch order or the partition changes. */
#define PART_ALGORITHM_VERSION 1
/* Ranks are 0..world_size-1 with 1 <= world_size <= PART_MAX_WORLD_SIZE. */
#define PART_MAX_WORLD_SIZE 65536u

/* What one coordinated request may carry (the head refuses more; a client
 * sizes its retries by them): blocks per next or ack, indices per next reply. */
#define ITER_MAX_BATCH 1000
#define ITER_MAX_INDICES (1u << 20)

/* Defaults set by part_config_init. */
#define PART_DEFAULT_BLOCK_SIZE 256
#define PART_DEFAULT_SHUFFLE_BLOCK_SIZE 1024

typedef enum { PART_SHUFFLE_NONE, PART_SHUFFLE_GLOBAL, PART_SHUFFLE_SHARD } part_shuffle_t;
#define PART_SHUFFLE_COUNT 3

typedef enum {
  PART_ROUND_ROBIN,
  PART_CONTIGUOUS,
  PART_HASH,
  PART_RANGE,
  PART_STRATIFIED,
  PART_DYNAMIC
} part_strategy_t;
#define PART_STRATEGY_COUNT 6

typedef enum { PART_TAIL_KEEP, PART_TAIL_PAD, PART_TAIL_DROP } part_tail_t;
#define PART_TAIL_COUNT 3

/* Samples [begin, end). */
typedef struct {
  uint64_t begin;
  uint64_t end;
} part_range_t;

typedef struct {
  uint32_t version;            /* algorithm version the outputs follow (PART_ALGORITHM_VERSION) */
  uint64_t seed;               /* shuffle key */
  part_shuffle_t shuffle;      /* default none */
  uint64_t shuffle_block_size; /* shard mode: window of samples shuffled together, >= 1 */
  part_strategy_t strategy;    /* default round_robin */
  uint32_t world_size;         /* ranks, default 1 */
  uint64_t block_size;         /* samples per block (the unit leased and acknowledged), >= 1 */
  uint64_t epochs;             /* epochs to run, default 1; 0: unbounded */
  part_tail_t tail;            /* default keep */
  uint32_t num_partitions;     /* hash: partitions; 0: world_size */
  uint64_t hash_seed;          /* hash: seed of the sample hash */
  const part_range_t *ranges;  /* range: world_size entries, ranges[r] for rank r; borrowed,
                                  copied by part_plan_create; NULL otherwise */
} part_config_t;

/* Sets every field to its default (see the field comments). */
void part_config_init(part_config_t *cfg);

/* Stable names ("global", "round_robin", "pad") for the wire, CLI and docs;
 * "?" for a value out of range.  The parse functions return MUSTER_OK and set
 * *out, or MUSTER_INVALID for an unknown name. */
const char *part_shuffle_name(part_shuffle_t shuffle);
const char *part_strategy_name(part_strategy_t strategy);
const char *part_tail_name(part_tail_t tail);
muster_err_t part_shuffle_parse(const char *name, part_shuffle_t *out);
/* The names each parse function knows, for the message refusing another. */
#define PART_SHUFFLE_NAMES "none, global, shard"
#define PART_STRATEGY_NAMES "round_robin, contiguous, hash, range, stratified, dynamic"
#define PART_TAIL_NAMES "keep, pad, drop"
muster_err_t part_strategy_parse(const char *name, part_strategy_t *out);
muster_err_t part_tail_parse(const char *name, part_tail_t *out);
/* The strategy a refused name likely meant, for the refusal to say: another
 * tool's name of it (tenflowers' RoundRobin, HashBased, RangeBased, Adaptive)
 * or a muster name a slip of the fingers away ("dynamc"); NULL when none. */
const char *part_strategy_meant(const char *name);

/* True for the strategies whose ranks own epoch positions (round_robin,
 * contiguous, dynamic), false for those owning samples (hash, range, stratified). */
bool part_strategy_is_positional(part_strategy_t strategy);

typedef struct part_plan part_plan_t;
typedef struct part_epoch part_epoch_t;

/*
 * Validates `cfg` against the dataset and builds a plan.  `ds` is borrowed and
 * must outlive the plan; `cfg` (and its ranges) is copied.  Returns MUSTER_OK
 * and sets *out (caller owns it: part_plan_destroy), MUSTER_INVALID when a
 * field is out of range (an unknown version or enum, world_size 0 or above
 * PART_MAX_WORLD_SIZE, a zero block or window size, ranges missing or not
 * tiling [0, N), stratified without labels), or MUSTER_NOMEM.  With the hash
 * strategy this takes O(N) time to count each rank's samples.
 */
muster_err_t part_plan_create(const dataset_t *ds, const part_config_t *cfg, part_plan_t **out);
/* Frees the plan; accepts NULL. */
void part_plan_destroy(part_plan_t *plan);

/* The plan's copy of the configuration (its ranges point into the plan;
 * num_partitions is resolved, never 0 for hash). */
const part_config_t *part_plan_config(const part_plan_t *plan);
const dataset_t *part_plan_dataset(const part_plan_t *plan);
/* A stable fingerprint of dataset shape, configuration and algorithm versions:
 * equal fingerprints, equal outputs.  Ranks creating the same configuration
 * can compare it.  The number of epochs is not part of it, so a run can be
 * extended without invalidating saved positions. */
uint64_t part_plan_fingerprint(const part_plan_t *plan);

/* Samples rank `rank` owns per epoch, before the tail rule. */
uint64_t part_rank_owned(const part_plan_t *plan, uint32_t rank);
/* Items rank `rank` yields per epoch after the tail rule (its `len`). */
uint64_t part_rank_len(const part_plan_t *plan, uint32_t rank);
/* Blocks rank `rank` yields per epoch: ceil(part_rank_len / block_size). */
uint64_t part_rank_blocks(const part_plan_t *plan, uint32_t rank);

/* The rank owning epoch position `position` (positional strategies) or the
 * sample `sample` (sample strategies); see part_owner_at for either. */
uint32_t part_position_owner(const part_plan_t *plan, uint64_t position);
uint32_t part_sample_owner(const part_plan_t *plan, uint64_t sample);

/* Positional strategies: the epoch position of rank `rank`'s k-th owned item,
 * k < part_rank_owned.  O(1). */
uint64_t part_rank_position(const part_plan_t *plan, uint32_t rank, uint64_t k);
/* Any strategy, pad tail: the epoch position of rank `rank`'s k-th item for
 * part_rank_owned <= k < part_rank_len, (rank + k * world_size) mod N. */
uint64_t part_pad_position(const part_plan_t *plan, uint32_t rank, uint64_t k);

/* Epoch blocks (the dynamic strategy's unit): ceil(N / block_size) of them,
 * block b covering epoch positions [b * block_size, min(N, (b+1) * block_size)). */
uint64_t part_num_blocks(const part_plan_t *plan);
void part_block_positions(const part_plan_t *plan, uint64_t block, uint64_t *begin, uint64_t *end);

/*
 * Builds the order of epoch `epoch` (0-based).  `plan` is borrowed and must
 * outlive the epoch.  Returns MUSTER_OK and sets *out (caller owns it:
 * part_epoch_destroy), MUSTER_INVALID when the plan has a bounded number of
 * epochs and `epoch` is not below it, or MUSTER_NOMEM (shard mode allocates
 * O(shards)).
 */
muster_err_t part_epoch_create(const part_plan_t *plan, uint64_t epoch, part_epoch_t **out);
/* Frees the epoch; accepts NULL. */
void part_epoch_destroy(part_epoch_t *ep);
uint64_t part_epoch_number(const part_epoch_t *ep);
const part_plan_t *part_epoch_plan(const part_epoch_t *ep);

/* The sample at epoch position `position` (< N).  O(1) for none and global,
 * O(log shards) for shard. */
uint64_t part_epoch_index(const part_epoch_t *ep, uint64_t position);
/* The rank owning epoch position `position` this epoch, whatever the strategy. */
uint32_t part_owner_at(const part_epoch_t *ep, uint64_t position);

#endif
