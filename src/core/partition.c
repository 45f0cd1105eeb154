/*
 * partition.c — epoch orders and partition strategies (see partition.h for
 * the definitions, docs/iterations.md for worked examples).
 *
 * Nothing here builds an O(N) array: the epoch order is computed position by
 * position through perm_t, per-rank counts are closed forms (O(world_size)
 * memory), and only the hash strategy pays one O(N) counting pass when a plan
 * is created.  Every key is derived from the configuration through
 * perm_hash64 with fixed salts below; the salts, like the formulas, are part of
 * PART_ALGORITHM_VERSION 1 and must never change.
 */
#include "core/partition.h"

#include <assert.h>
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "core/perm.h"
#include "core/suggest.h"

/* Domain separation for keys derived from the one seed: short tags, read as
 * little-endian ASCII ("\1shard-o", "\2\1window", "\3frprint"). */
#define SALT_SHARD_ORDER UINT64_C(0x6f2d647261687301)
#define SALT_WINDOW UINT64_C(0x776f646e69770102)
#define SALT_FINGERPRINT UINT64_C(0x746e697270726603)

/* A non-empty range of the range strategy and the rank owning it. */
typedef struct {
  uint64_t begin;
  uint64_t end;
  uint32_t rank;
} part_owned_range_t;

struct part_plan {
  const dataset_t *ds;        /* borrowed */
  part_config_t cfg;          /* copy; cfg.ranges points at ranges below */
  part_range_t *ranges;       /* range: world_size entries as given */
  part_owned_range_t *lookup; /* range: the non-empty ranges sorted by begin */
  uint32_t lookup_len;
  uint64_t *owned;    /* world_size entries: samples each rank owns */
  uint64_t owned_min; /* smallest and largest of owned[] */
  uint64_t owned_max;
  uint64_t fingerprint;
};

struct part_epoch {
  const part_plan_t *plan; /* borrowed */
  uint64_t epoch;
  perm_t global;         /* global mode: the bijection of this epoch */
  size_t num_slots;      /* shard mode: shards, in shuffled order ... */
  size_t *slot_shard;    /* ... the shard in each slot */
  uint64_t *slot_starts; /* ... first epoch position of each slot, plus N at the end */
  uint64_t window_seed;  /* shard mode: key of the window permutations */
};

/* ---- names ------------------------------------------------------------- */

static const char *const shuffle_names[PART_SHUFFLE_COUNT] = {"none", "global", "shard"};
static const char *const strategy_names[PART_STRATEGY_COUNT] = {
    "round_robin", "contiguous", "hash", "range", "stratified", "dynamic"};
static const char *const tail_names[PART_TAIL_COUNT] = {"keep", "pad", "drop"};

static const char *name_of(const char *const *names, unsigned count, unsigned value) {
  return value < count ? names[value] : "?";
}

static muster_err_t parse_name(const char *const *names, unsigned count, const char *name,
                               unsigned *out) {
  for (unsigned i = 0; name != NULL && i < count; i++) {
    if (strcmp(names[i], name) == 0) {
      *out = i;
      return MUSTER_OK;
    }
  }
  return MUSTER_INVALID;
}

const char *part_shuffle_name(part_shuffle_t shuffle) {
  return name_of(shuffle_names, PART_SHUFFLE_COUNT, (unsigned)shuffle);
}

const char *part_strategy_name(part_strategy_t strategy) {
  return name_of(strategy_names, PART_STRATEGY_COUNT, (unsigned)strategy);
}

const char *part_tail_name(part_tail_t tail) {
  return name_of(tail_names, PART_TAIL_COUNT, (unsigned)tail);
}

muster_err_t part_shuffle_parse(const char *name, part_shuffle_t *out) {
  unsigned value = 0;
  muster_err_t err = parse_name(shuffle_names, PART_SHUFFLE_COUNT, name, &value);
  if (err == MUSTER_OK)
    *out = (part_shuffle_t)value;
  return err;
}

muster_err_t part_strategy_parse(const char *name, part_strategy_t *out) {
  unsigned value = 0;
  muster_err_t err = parse_name(strategy_names, PART_STRATEGY_COUNT, name, &value);
  if (err == MUSTER_OK)
    *out = (part_strategy_t)value;
  return err;
}

/* Other tools' names of a strategy, written lower case without separators:
 * tenflowers' RoundRobin, HashBased, RangeBased and Adaptive (any rank takes
 * the next block: a coordinated iteration's dynamic). */
static const struct {
  const char *theirs, *ours;
} strategy_aliases[] = {{"roundrobin", "round_robin"},
                        {"hashbased", "hash"},
                        {"rangebased", "range"},
                        {"adaptive", "dynamic"}};

const char *part_strategy_meant(const char *name) {
  char key[32];
  size_t n = 0;
  for (const char *c = name; *c && n + 1 < sizeof key; c++)
    if (isalnum((unsigned char)*c))
      key[n++] = (char)tolower((unsigned char)*c);
  key[n] = '\0';
  for (size_t i = 0; i < sizeof strategy_aliases / sizeof strategy_aliases[0]; i++)
    if (strcmp(key, strategy_aliases[i].theirs) == 0)
      return strategy_aliases[i].ours;
  suggest_t likely;
  suggest_init(&likely, name, strlen(name));
  for (unsigned i = 0; i < PART_STRATEGY_COUNT; i++)
    suggest_offer(&likely, strategy_names[i], strlen(strategy_names[i]));
  size_t len;
  const char *meant = suggest_best(&likely, &len);
  return meant && len == strlen(meant) ? meant : NULL; /* a table name: whole, NUL-ended */
}

muster_err_t part_tail_parse(const char *name, part_tail_t *out) {
  unsigned value = 0;
  muster_err_t err = parse_name(tail_names, PART_TAIL_COUNT, name, &value);
  if (err == MUSTER_OK)
    *out = (part_tail_t)value;
  return err;
}

bool part_strategy_is_positional(part_strategy_t strategy) {
  return strategy == PART_ROUND_ROBIN || strategy == PART_CONTIGUOUS || strategy == PART_DYNAMIC;
}

void part_config_init(part_config_t *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->version = PART_ALGORITHM_VERSION;
  cfg->shuffle = PART_SHUFFLE_NONE;
  cfg->shuffle_block_size = PART_DEFAULT_SHUFFLE_BLOCK_SIZE;
  cfg->strategy = PART_ROUND_ROBIN;
  cfg->world_size = 1;
  cfg->block_size = PART_DEFAULT_BLOCK_SIZE;
  cfg->epochs = 1;
  cfg->tail = PART_TAIL_KEEP;
  cfg->ranges = NULL;
}

/* ---- ownership ----------------------------------------------------------- */

static uint64_t num_samples(const part_plan_t *plan) {
  return dataset_num_samples(plan->ds);
}

/* contiguous: the first N mod W ranks own q+1 positions, the others q. */
static uint32_t contiguous_owner(uint64_t n, uint32_t world, uint64_t position) {
  uint64_t q = n / world, rem = n % world;
  uint64_t boundary = rem * (q + 1);
  if (position < boundary)
    return (uint32_t)(position / (q + 1));
  return (uint32_t)(rem + (position - boundary) / q);
}

static uint64_t contiguous_start(uint64_t n, uint32_t world, uint32_t rank) {
  uint64_t q = n / world, rem = n % world;
  return rank * q + (rank < rem ? rank : rem);
}

uint32_t part_position_owner(const part_plan_t *plan, uint64_t position) {
  const part_config_t *cfg = &plan->cfg;
  assert(position < num_samples(plan));
  switch (cfg->strategy) {
  case PART_CONTIGUOUS:
    return contiguous_owner(num_samples(plan), cfg->world_size, position);
  case PART_DYNAMIC:
    return (uint32_t)((position / cfg->block_size) % cfg->world_size);
  default:
    assert(cfg->strategy == PART_ROUND_ROBIN);
    return (uint32_t)(position % cfg->world_size);
  }
}

static uint32_t range_owner(const part_plan_t *plan, uint64_t sample) {
  uint32_t lo = 0, hi = plan->lookup_len; /* the last range with begin <= sample */
  while (hi - lo > 1) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (plan->lookup[mid].begin <= sample)
      lo = mid;
    else
      hi = mid;
  }
  return plan->lookup[lo].rank;
}

uint32_t part_sample_owner(const part_plan_t *plan, uint64_t sample) {
  const part_config_t *cfg = &plan->cfg;
  assert(sample < num_samples(plan));
  switch (cfg->strategy) {
  case PART_HASH:
    return (uint32_t)((perm_hash64(sample, cfg->hash_seed) % cfg->num_partitions) %
                      cfg->world_size);
  case PART_RANGE:
    return range_owner(plan, sample);
  default: {
    assert(cfg->strategy == PART_STRATIFIED);
    uint32_t cls = dataset_label(plan->ds, sample);
    uint64_t listed = dataset_class_start(plan->ds, cls) + dataset_class_ordinal(plan->ds, sample);
    return (uint32_t)(listed % cfg->world_size);
  }
  }
}

uint64_t part_rank_position(const part_plan_t *plan, uint32_t rank, uint64_t k) {
  const part_config_t *cfg = &plan->cfg;
  assert(rank < cfg->world_size && k < plan->owned[rank]);
  switch (cfg->strategy) {
  case PART_CONTIGUOUS:
    return contiguous_start(num_samples(plan), cfg->world_size, rank) + k;
  case PART_DYNAMIC: {
    uint64_t block = rank + (k / cfg->block_size) * cfg->world_size;
    return block * cfg->block_size + k % cfg->block_size;
  }
  default:
    assert(cfg->strategy == PART_ROUND_ROBIN);
    return rank + k * cfg->world_size;
  }
}

/* (rank + k*W) mod N without overflow: k mod N < 2^48 and W <= 2^16. */
uint64_t part_pad_position(const part_plan_t *plan, uint32_t rank, uint64_t k) {
  uint64_t n = num_samples(plan);
  assert(n > 0 && rank < plan->cfg.world_size);
  return (rank + (k % n) * plan->cfg.world_size) % n;
}

uint64_t part_rank_owned(const part_plan_t *plan, uint32_t rank) {
  assert(rank < plan->cfg.world_size);
  return plan->owned[rank];
}

uint64_t part_rank_len(const part_plan_t *plan, uint32_t rank) {
  switch (plan->cfg.tail) {
  case PART_TAIL_PAD:
    return plan->owned_max;
  case PART_TAIL_DROP:
    return plan->owned_min;
  default:
    return part_rank_owned(plan, rank);
  }
}

uint64_t part_rank_blocks(const part_plan_t *plan, uint32_t rank) {
  uint64_t len = part_rank_len(plan, rank);
  return len / plan->cfg.block_size + (len % plan->cfg.block_size != 0);
}

uint64_t part_num_blocks(const part_plan_t *plan) {
  uint64_t n = num_samples(plan), size = plan->cfg.block_size;
  return n / size + (n % size != 0);
}

void part_block_positions(const part_plan_t *plan, uint64_t block, uint64_t *begin, uint64_t *end) {
  uint64_t n = num_samples(plan), size = plan->cfg.block_size;
  assert(block < part_num_blocks(plan));
  *begin = block * size;
  *end = (n - *begin < size) ? n : *begin + size;
}

/* ---- per-rank counts ------------------------------------------------------ */

/* Owned counts of the closed-form strategies: round_robin and stratified deal
 * positions (or the class-major listing) round robin; contiguous is its runs. */
static uint64_t dealt_count(uint64_t n, uint32_t world, uint32_t rank) {
  return n / world + (rank < n % world);
}

/* dynamic: blocks b with b mod W == rank, the last block possibly short. */
static uint64_t dynamic_count(uint64_t n, uint64_t block_size, uint32_t world, uint32_t rank) {
  uint64_t blocks = n / block_size + (n % block_size != 0);
  uint64_t count = dealt_count(blocks, world, rank) * block_size;
  if (blocks > 0 && (blocks - 1) % world == rank)
    count -= blocks * block_size - n;
  return count;
}

static void count_owned(part_plan_t *plan) {
  const part_config_t *cfg = &plan->cfg;
  uint64_t n = num_samples(plan);
  for (uint32_t r = 0; r < cfg->world_size; r++) {
    if (cfg->strategy == PART_DYNAMIC)
      plan->owned[r] = dynamic_count(n, cfg->block_size, cfg->world_size, r);
    else if (cfg->strategy == PART_RANGE)
      plan->owned[r] = plan->ranges[r].end - plan->ranges[r].begin;
    else if (cfg->strategy != PART_HASH)
      plan->owned[r] = dealt_count(n, cfg->world_size, r);
  }
  if (cfg->strategy == PART_HASH) /* no closed form: one pass over the samples */
    for (uint64_t s = 0; s < n; s++)
      plan->owned[part_sample_owner(plan, s)]++;
  plan->owned_min = plan->owned_max = plan->owned[0];
  for (uint32_t r = 1; r < cfg->world_size; r++) {
    if (plan->owned[r] < plan->owned_min)
      plan->owned_min = plan->owned[r];
    if (plan->owned[r] > plan->owned_max)
      plan->owned_max = plan->owned[r];
  }
}

/* ---- plan ------------------------------------------------------------------ */

static int range_cmp(const void *a, const void *b) {
  const part_owned_range_t *x = a, *y = b;
  return (x->begin > y->begin) - (x->begin < y->begin);
}

/*
 * Copies the ranges and builds the owner lookup: the non-empty ranges sorted
 * by begin, each with its rank.  Empty ranges (begin == end) are allowed
 * anywhere and own nothing.  MUSTER_INVALID unless the non-empty ranges tile
 * [0, N) exactly (no gap, no overlap, nothing beyond N).
 */
static muster_err_t build_ranges(part_plan_t *plan, const part_range_t *ranges) {
  uint32_t world = plan->cfg.world_size;
  plan->ranges = calloc(world, sizeof *plan->ranges);
  plan->lookup = calloc(world, sizeof *plan->lookup);
  if (plan->ranges == NULL || plan->lookup == NULL)
    return MUSTER_NOMEM;
  memcpy(plan->ranges, ranges, world * sizeof *ranges);
  for (uint32_t r = 0; r < world; r++) {
    if (ranges[r].end < ranges[r].begin)
      return MUSTER_INVALID;
    if (ranges[r].end > ranges[r].begin)
      plan->lookup[plan->lookup_len++] =
          (part_owned_range_t){.begin = ranges[r].begin, .end = ranges[r].end, .rank = r};
  }
  qsort(plan->lookup, plan->lookup_len, sizeof *plan->lookup, range_cmp);
  uint64_t covered = 0;
  for (uint32_t i = 0; i < plan->lookup_len; i++) {
    if (plan->lookup[i].begin != covered)
      return MUSTER_INVALID;
    covered = plan->lookup[i].end;
  }
  return covered == num_samples(plan) ? MUSTER_OK : MUSTER_INVALID;
}

static bool config_valid(const dataset_t *ds, const part_config_t *cfg) {
  if (cfg->version != PART_ALGORITHM_VERSION || (unsigned)cfg->shuffle >= PART_SHUFFLE_COUNT ||
      (unsigned)cfg->strategy >= PART_STRATEGY_COUNT || (unsigned)cfg->tail >= PART_TAIL_COUNT)
    return false;
  if (cfg->world_size == 0 || cfg->world_size > PART_MAX_WORLD_SIZE)
    return false;
  if (cfg->block_size == 0 || cfg->block_size > DATASET_MAX_SAMPLES)
    return false;
  if (cfg->shuffle == PART_SHUFFLE_SHARD &&
      (cfg->shuffle_block_size == 0 || cfg->shuffle_block_size > DATASET_MAX_SAMPLES))
    return false;
  if (cfg->strategy == PART_RANGE && cfg->ranges == NULL)
    return false;
  if (cfg->strategy == PART_STRATIFIED && !dataset_has_labels(ds))
    return false;
  return true;
}

/* Fingerprint version 1: every field below, in this order, chained through
 * perm_hash64 starting from SALT_FINGERPRINT, then each rank's range.  The
 * number of epochs is left out on purpose: it changes no epoch's order, and a
 * run extended by more epochs must still accept its saved positions. */
static void compute_fingerprint(part_plan_t *plan) {
  const part_config_t *cfg = &plan->cfg;
  uint64_t fields[] = {PART_ALGORITHM_VERSION,
                       PERM_ALGORITHM_VERSION,
                       dataset_fingerprint(plan->ds),
                       cfg->seed,
                       cfg->shuffle,
                       cfg->shuffle_block_size,
                       cfg->strategy,
                       cfg->world_size,
                       cfg->block_size,
                       cfg->tail,
                       cfg->num_partitions,
                       cfg->hash_seed};
  uint64_t fp = SALT_FINGERPRINT;
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
    fp = perm_hash64(fields[i], fp);
  for (uint32_t r = 0; plan->ranges != NULL && r < cfg->world_size; r++) {
    fp = perm_hash64(plan->ranges[r].begin, fp);
    fp = perm_hash64(plan->ranges[r].end, fp);
  }
  plan->fingerprint = fp;
}

muster_err_t part_plan_create(const dataset_t *ds, const part_config_t *cfg, part_plan_t **out) {
  if (ds == NULL || cfg == NULL || out == NULL || !config_valid(ds, cfg))
    return MUSTER_INVALID;
  part_plan_t *plan = calloc(1, sizeof *plan);
  if (plan == NULL)
    return MUSTER_NOMEM;
  plan->ds = ds;
  plan->cfg = *cfg;
  plan->cfg.ranges = NULL;
  if (cfg->strategy != PART_HASH) {
    plan->cfg.num_partitions = 0;
  } else if (cfg->num_partitions == 0) {
    plan->cfg.num_partitions = cfg->world_size;
  }
  muster_err_t err = MUSTER_OK;
  plan->owned = calloc(cfg->world_size, sizeof *plan->owned);
  if (plan->owned == NULL)
    err = MUSTER_NOMEM;
  if (err == MUSTER_OK && cfg->strategy == PART_RANGE) {
    err = build_ranges(plan, cfg->ranges);
    plan->cfg.ranges = plan->ranges;
  }
  if (err != MUSTER_OK) {
    part_plan_destroy(plan);
    return err;
  }
  count_owned(plan);
  compute_fingerprint(plan);
  *out = plan;
  return MUSTER_OK;
}

void part_plan_destroy(part_plan_t *plan) {
  if (plan == NULL)
    return;
  free(plan->ranges);
  free(plan->lookup);
  free(plan->owned);
  free(plan);
}

const part_config_t *part_plan_config(const part_plan_t *plan) {
  return &plan->cfg;
}

const dataset_t *part_plan_dataset(const part_plan_t *plan) {
  return plan->ds;
}

uint64_t part_plan_fingerprint(const part_plan_t *plan) {
  return plan->fingerprint;
}

/* ---- epoch order --------------------------------------------------------- */

/* Shard mode: lays the shards out in the order perm(shards; seed', epoch)
 * gives, recording where each slot starts in the epoch order. */
static muster_err_t build_slots(part_epoch_t *ep) {
  const dataset_t *ds = ep->plan->ds;
  size_t shards = dataset_num_shards(ds);
  ep->slot_shard = calloc(shards, sizeof *ep->slot_shard);
  ep->slot_starts = calloc(shards + 1, sizeof *ep->slot_starts);
  if (ep->slot_shard == NULL || ep->slot_starts == NULL)
    return MUSTER_NOMEM;
  perm_t order;
  perm_init(&order, shards, perm_hash64(SALT_SHARD_ORDER, ep->plan->cfg.seed), ep->epoch);
  for (size_t j = 0; j < shards; j++) {
    ep->slot_shard[j] = (size_t)perm_apply(&order, j);
    ep->slot_starts[j + 1] = ep->slot_starts[j] + dataset_shard_count(ds, ep->slot_shard[j]);
  }
  ep->num_slots = shards;
  ep->window_seed = perm_hash64(SALT_WINDOW, ep->plan->cfg.seed);
  return MUSTER_OK;
}

muster_err_t part_epoch_create(const part_plan_t *plan, uint64_t epoch, part_epoch_t **out) {
  if (plan == NULL || out == NULL || (plan->cfg.epochs != 0 && epoch >= plan->cfg.epochs))
    return MUSTER_INVALID;
  part_epoch_t *ep = calloc(1, sizeof *ep);
  if (ep == NULL)
    return MUSTER_NOMEM;
  ep->plan = plan;
  ep->epoch = epoch;
  if (plan->cfg.shuffle == PART_SHUFFLE_GLOBAL)
    perm_init(&ep->global, num_samples(plan), plan->cfg.seed, epoch);
  if (plan->cfg.shuffle == PART_SHUFFLE_SHARD && build_slots(ep) != MUSTER_OK) {
    part_epoch_destroy(ep);
    return MUSTER_NOMEM;
  }
  *out = ep;
  return MUSTER_OK;
}

void part_epoch_destroy(part_epoch_t *ep) {
  if (ep == NULL)
    return;
  free(ep->slot_shard);
  free(ep->slot_starts);
  free(ep);
}

uint64_t part_epoch_number(const part_epoch_t *ep) {
  return ep->epoch;
}

const part_plan_t *part_epoch_plan(const part_epoch_t *ep) {
  return ep->plan;
}

/*
 * Shard mode: find the slot holding `position` (the last slot starting at or
 * before it, which skips empty shards), then the window of shuffle_block_size
 * samples within that shard, and permute within the window with a key of
 * (seed, epoch, shard, window).
 */
static uint64_t shard_index(const part_epoch_t *ep, uint64_t position) {
  size_t lo = 0, hi = ep->num_slots;
  while (hi - lo > 1) {
    size_t mid = lo + (hi - lo) / 2;
    if (ep->slot_starts[mid] <= position)
      lo = mid;
    else
      hi = mid;
  }
  size_t shard = ep->slot_shard[lo];
  const dataset_t *ds = ep->plan->ds;
  uint64_t offset = position - ep->slot_starts[lo];
  uint64_t window_size = ep->plan->cfg.shuffle_block_size;
  uint64_t window = offset / window_size, window_start = window * window_size;
  uint64_t left = dataset_shard_count(ds, shard) - window_start;
  perm_t within;
  perm_init(&within, left < window_size ? left : window_size, ep->window_seed,
            perm_hash64(window, perm_hash64(shard, ep->epoch)));
  return dataset_shard_start(ds, shard) + window_start + perm_apply(&within, offset - window_start);
}

uint64_t part_epoch_index(const part_epoch_t *ep, uint64_t position) {
  assert(position < num_samples(ep->plan));
  switch (ep->plan->cfg.shuffle) {
  case PART_SHUFFLE_GLOBAL:
    return perm_apply(&ep->global, position);
  case PART_SHUFFLE_SHARD:
    return shard_index(ep, position);
  default:
    return position;
  }
}

uint32_t part_owner_at(const part_epoch_t *ep, uint64_t position) {
  if (part_strategy_is_positional(ep->plan->cfg.strategy))
    return part_position_owner(ep->plan, position);
  return part_sample_owner(ep->plan, part_epoch_index(ep, position));
}
