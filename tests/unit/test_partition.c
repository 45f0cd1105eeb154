/*
 * test_partition.c — dataset shapes, epoch orders and partition strategies
 * (src/core/dataset.c, src/core/partition.c).
 *
 * Golden values pin PART_ALGORITHM_VERSION 1: computed once by this
 * implementation and written here as literals.  A failing golden value means
 * existing iterations would change order; that needs a new algorithm version.
 * The structural tests check, for every strategy, shuffle mode, tail rule and
 * world sizes 1..8, that the ranks together cover each sample exactly once
 * (or exactly the documented padding / dropping).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/dataset.h"
#include "core/partition.h"
#include "core/perm.h"

/* ---- helpers ----------------------------------------------------------------- */

#define MAX_ITEMS 4096

/* The labels of the golden dataset: 4 of class 0, 5 of class 1, 11 of class 2. */
static void golden_labels(uint32_t labels[20]) {
  for (int i = 0; i < 20; i++)
    labels[i] = i % 5 == 0 ? 0 : (i % 3 == 0 ? 1 : 2);
}

static dataset_t *labelled_dataset(uint64_t n, const uint32_t *labels) {
  dataset_t *ds = NULL;
  assert_int_equal(dataset_create(n, &ds), MUSTER_OK);
  assert_int_equal(dataset_set_labels(ds, labels, n), MUSTER_OK);
  return ds;
}

/*
 * Rank `rank`'s items of an epoch computed from the partition API alone: scan
 * the epoch positions for those the rank owns (checking part_rank_position for
 * positional strategies), then apply the tail rule.  Returns the item count.
 */
static size_t rank_items(const part_plan_t *plan, const part_epoch_t *ep, uint32_t rank,
                         uint64_t *out) {
  const part_config_t *cfg = part_plan_config(plan);
  uint64_t n = dataset_num_samples(part_plan_dataset(plan));
  uint64_t len = part_rank_len(plan, rank), owned = 0;
  assert_true(len <= MAX_ITEMS);
  for (uint64_t pos = 0; pos < n; pos++) {
    if (part_owner_at(ep, pos) != rank)
      continue;
    if (part_strategy_is_positional(cfg->strategy))
      assert_int_equal(part_rank_position(plan, rank, owned), pos);
    if (owned < len)
      out[owned] = part_epoch_index(ep, pos);
    owned++;
  }
  assert_int_equal(owned, part_rank_owned(plan, rank));
  for (uint64_t k = owned; k < len; k++)
    out[k] = part_epoch_index(ep, part_pad_position(plan, rank, k));
  return (size_t)len;
}

static void check_rank(const part_plan_t *plan, uint64_t epoch, uint32_t rank,
                       const uint64_t *expected, size_t count) {
  part_epoch_t *ep = NULL;
  assert_int_equal(part_epoch_create(plan, epoch, &ep), MUSTER_OK);
  uint64_t items[MAX_ITEMS];
  size_t got = rank_items(plan, ep, rank, items);
  assert_int_equal(got, count);
  for (size_t i = 0; i < count; i++)
    assert_int_equal(items[i], expected[i]);
  part_epoch_destroy(ep);
}

static void check_order(const dataset_t *ds, const part_config_t *cfg, uint64_t epoch,
                        const uint64_t *expected) {
  part_plan_t *plan = NULL;
  part_epoch_t *ep = NULL;
  assert_int_equal(part_plan_create(ds, cfg, &plan), MUSTER_OK);
  assert_int_equal(part_epoch_create(plan, epoch, &ep), MUSTER_OK);
  for (uint64_t pos = 0; pos < dataset_num_samples(ds); pos++)
    assert_int_equal(part_epoch_index(ep, pos), expected[pos]);
  part_epoch_destroy(ep);
  part_plan_destroy(plan);
}

/* ---- dataset ------------------------------------------------------------------ */

static void test_dataset_plain(void **state) {
  (void)state;
  dataset_t *ds = NULL;
  assert_int_equal(dataset_create(10, &ds), MUSTER_OK);
  assert_int_equal(dataset_num_samples(ds), 10);
  assert_int_equal(dataset_num_shards(ds), 1);
  assert_int_equal(dataset_shard_count(ds, 0), 10);
  assert_null(dataset_shard_uri(ds, 0));
  assert_int_equal(dataset_shard_of(ds, 9), 0);
  assert_false(dataset_has_labels(ds));
  assert_int_equal(dataset_num_classes(ds), 0);
  dataset_destroy(ds);
  dataset_destroy(NULL);
  assert_int_equal(dataset_create(DATASET_MAX_SAMPLES + 1, &ds), MUSTER_INVALID);
  assert_int_equal(dataset_create(0, &ds), MUSTER_OK);
  assert_int_equal(dataset_num_samples(ds), 0);
  dataset_destroy(ds);
}

static void test_dataset_shards(void **state) {
  (void)state;
  const uint64_t counts[5] = {5, 0, 7, 3, 5};
  const char *uris[5] = {"s3://a/0.tar", "s3://a/1.tar", NULL, "s3://a/3.tar", "s3://a/4.tar"};
  dataset_t *ds = NULL;
  assert_int_equal(dataset_create_shards(5, counts, uris, &ds), MUSTER_OK);
  assert_int_equal(dataset_num_samples(ds), 20);
  assert_int_equal(dataset_num_shards(ds), 5);
  assert_int_equal(dataset_shard_start(ds, 2), 5);
  assert_int_equal(dataset_shard_start(ds, 4), 15);
  assert_string_equal(dataset_shard_uri(ds, 3), "s3://a/3.tar");
  assert_null(dataset_shard_uri(ds, 2));
  static const size_t shard_of[20] = {0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 4, 4, 4, 4, 4};
  for (uint64_t s = 0; s < 20; s++)
    assert_int_equal(dataset_shard_of(ds, s), shard_of[s]);
  dataset_destroy(ds);
  assert_int_equal(dataset_create_shards(0, counts, NULL, &ds), MUSTER_INVALID);
  assert_int_equal(dataset_create_shards(1, NULL, NULL, &ds), MUSTER_INVALID);
  const uint64_t huge[2] = {DATASET_MAX_SAMPLES, 1};
  assert_int_equal(dataset_create_shards(2, huge, NULL, &ds), MUSTER_INVALID);
}

static void test_dataset_labels(void **state) {
  (void)state;
  const uint32_t labels[8] = {2, 0, 2, 2, 0, 4, 2, 0};
  dataset_t *ds = NULL;
  assert_int_equal(dataset_create(8, &ds), MUSTER_OK);
  uint64_t plain_fp = dataset_fingerprint(ds);
  assert_int_equal(dataset_set_labels(ds, labels, 7), MUSTER_INVALID);
  const uint32_t bad[8] = {0, 0, 0, 0, 0, 0, 0, DATASET_MAX_CLASSES};
  assert_int_equal(dataset_set_labels(ds, bad, 8), MUSTER_INVALID);
  assert_false(dataset_has_labels(ds));
  assert_int_equal(dataset_set_labels(ds, labels, 8), MUSTER_OK);
  assert_int_equal(dataset_set_labels(ds, labels, 8), MUSTER_INVALID); /* once only */
  assert_int_not_equal(dataset_fingerprint(ds), plain_fp);
  assert_int_equal(dataset_num_classes(ds), 5);
  static const uint64_t class_counts[5] = {3, 0, 4, 0, 1};
  static const uint64_t class_starts[5] = {0, 3, 3, 7, 7};
  for (uint32_t c = 0; c < 5; c++) {
    assert_int_equal(dataset_class_count(ds, c), class_counts[c]);
    assert_int_equal(dataset_class_start(ds, c), class_starts[c]);
  }
  static const uint64_t ordinals[8] = {0, 0, 1, 2, 1, 0, 3, 2};
  for (uint64_t s = 0; s < 8; s++) {
    assert_int_equal(dataset_label(ds, s), labels[s]);
    assert_int_equal(dataset_class_ordinal(ds, s), ordinals[s]);
  }
  dataset_destroy(ds);
}

static void test_dataset_fingerprint(void **state) {
  (void)state;
  const uint64_t a[3] = {4, 3, 3}, b[3] = {4, 3, 3}, c[3] = {3, 4, 3};
  const char *uris[3] = {"x", "y", "z"};
  dataset_t *da = NULL, *db = NULL, *dc = NULL, *dp = NULL;
  assert_int_equal(dataset_create_shards(3, a, NULL, &da), MUSTER_OK);
  assert_int_equal(dataset_create_shards(3, b, uris, &db), MUSTER_OK);
  assert_int_equal(dataset_create_shards(3, c, NULL, &dc), MUSTER_OK);
  assert_int_equal(dataset_create(10, &dp), MUSTER_OK);
  assert_int_equal(dataset_fingerprint(da), dataset_fingerprint(db)); /* uris don't count */
  assert_int_not_equal(dataset_fingerprint(da), dataset_fingerprint(dc));
  assert_int_not_equal(dataset_fingerprint(da), dataset_fingerprint(dp));
  assert_int_equal(dataset_fingerprint(dp), UINT64_C(0xcd9022313b548c37));
  dataset_destroy(da);
  dataset_destroy(db);
  dataset_destroy(dc);
  dataset_destroy(dp);
}

/* ---- names and configuration --------------------------------------------------- */

static void test_names(void **state) {
  (void)state;
  for (unsigned i = 0; i < PART_STRATEGY_COUNT; i++) {
    part_strategy_t parsed;
    assert_int_equal(part_strategy_parse(part_strategy_name((part_strategy_t)i), &parsed),
                     MUSTER_OK);
    assert_int_equal(parsed, i);
  }
  part_shuffle_t shuffle;
  assert_int_equal(part_shuffle_parse("shard", &shuffle), MUSTER_OK);
  assert_int_equal(shuffle, PART_SHUFFLE_SHARD);
  part_tail_t tail;
  assert_int_equal(part_tail_parse("drop", &tail), MUSTER_OK);
  assert_int_equal(tail, PART_TAIL_DROP);
  assert_int_equal(part_tail_parse("drop_last", &tail), MUSTER_INVALID);
  assert_int_equal(part_strategy_parse(NULL, NULL), MUSTER_INVALID);
  assert_string_equal(part_strategy_name(PART_ROUND_ROBIN), "round_robin");
  assert_string_equal(part_shuffle_name(PART_SHUFFLE_GLOBAL), "global");
  assert_string_equal(part_tail_name(PART_TAIL_PAD), "pad");
  assert_string_equal(part_strategy_name((part_strategy_t)99), "?");
}

static muster_err_t try_plan(const dataset_t *ds, const part_config_t *cfg) {
  part_plan_t *plan = NULL;
  muster_err_t err = part_plan_create(ds, cfg, &plan);
  part_plan_destroy(plan);
  return err;
}

static void test_config_validation(void **state) {
  (void)state;
  dataset_t *ds = NULL;
  assert_int_equal(dataset_create(10, &ds), MUSTER_OK);
  part_config_t cfg;
  part_config_init(&cfg);
  assert_int_equal(try_plan(ds, &cfg), MUSTER_OK);
  cfg.version = 2;
  assert_int_equal(try_plan(ds, &cfg), MUSTER_INVALID);
  part_config_init(&cfg);
  cfg.world_size = 0;
  assert_int_equal(try_plan(ds, &cfg), MUSTER_INVALID);
  cfg.world_size = PART_MAX_WORLD_SIZE + 1;
  assert_int_equal(try_plan(ds, &cfg), MUSTER_INVALID);
  part_config_init(&cfg);
  cfg.block_size = 0;
  assert_int_equal(try_plan(ds, &cfg), MUSTER_INVALID);
  part_config_init(&cfg);
  cfg.shuffle = PART_SHUFFLE_SHARD;
  cfg.shuffle_block_size = 0;
  assert_int_equal(try_plan(ds, &cfg), MUSTER_INVALID);
  part_config_init(&cfg);
  cfg.strategy = PART_STRATIFIED; /* no labels */
  assert_int_equal(try_plan(ds, &cfg), MUSTER_INVALID);
  cfg.strategy = (part_strategy_t)PART_STRATEGY_COUNT;
  assert_int_equal(try_plan(ds, &cfg), MUSTER_INVALID);
  part_config_init(&cfg);
  cfg.strategy = PART_RANGE;
  cfg.world_size = 2;
  assert_int_equal(try_plan(ds, &cfg), MUSTER_INVALID); /* no ranges */
  const part_range_t gap[2] = {{0, 4}, {5, 10}}, overlap[2] = {{0, 6}, {5, 10}};
  const part_range_t short_of_n[2] = {{0, 4}, {4, 9}}, reversed[2] = {{4, 0}, {0, 10}};
  const part_range_t tiled[2] = {{6, 10}, {0, 6}}, empty[3] = {{0, 10}, {77, 77}, {3, 3}};
  cfg.ranges = gap;
  assert_int_equal(try_plan(ds, &cfg), MUSTER_INVALID);
  cfg.ranges = overlap;
  assert_int_equal(try_plan(ds, &cfg), MUSTER_INVALID);
  cfg.ranges = short_of_n;
  assert_int_equal(try_plan(ds, &cfg), MUSTER_INVALID);
  cfg.ranges = reversed;
  assert_int_equal(try_plan(ds, &cfg), MUSTER_INVALID);
  cfg.ranges = tiled;
  assert_int_equal(try_plan(ds, &cfg), MUSTER_OK);
  cfg.world_size = 3;
  cfg.ranges = empty; /* empty ranges own nothing, wherever they are */
  assert_int_equal(try_plan(ds, &cfg), MUSTER_OK);
  part_plan_destroy(NULL);
  part_epoch_destroy(NULL);
  dataset_destroy(ds);
}

static void test_epoch_bounds(void **state) {
  (void)state;
  dataset_t *ds = NULL;
  assert_int_equal(dataset_create(10, &ds), MUSTER_OK);
  part_config_t cfg;
  part_config_init(&cfg);
  cfg.epochs = 2;
  part_plan_t *plan = NULL;
  part_epoch_t *ep = NULL;
  assert_int_equal(part_plan_create(ds, &cfg, &plan), MUSTER_OK);
  assert_int_equal(part_epoch_create(plan, 2, &ep), MUSTER_INVALID);
  assert_int_equal(part_epoch_create(plan, 1, &ep), MUSTER_OK);
  assert_int_equal(part_epoch_number(ep), 1);
  assert_ptr_equal(part_epoch_plan(ep), plan);
  part_epoch_destroy(ep);
  part_plan_destroy(plan);
  dataset_destroy(ds);
}

/* ---- golden epoch orders ------------------------------------------------------- */

static const uint64_t order_none[20] = {0,  1,  2,  3,  4,  5,  6,  7,  8,  9,
                                        10, 11, 12, 13, 14, 15, 16, 17, 18, 19};
static const uint64_t order_global_e0[20] = {4,  2,  18, 1,  16, 9, 14, 3, 19, 8,
                                             10, 11, 0,  13, 15, 5, 7,  6, 12, 17};
static const uint64_t order_global_e1[20] = {8,  5, 2, 14, 0,  4,  6,  3,  16, 19,
                                             13, 1, 9, 17, 15, 10, 12, 18, 11, 7};
/* Shards {5, 0, 7, 3, 5} samples, windows of 4. */
static const uint64_t order_shard_e0[20] = {5, 8, 7,  6,  9,  10, 11, 3,  0,  2,
                                            1, 4, 12, 14, 13, 16, 17, 15, 18, 19};
static const uint64_t order_shard_e1[20] = {8, 6, 5,  7,  9,  11, 10, 1,  3,  2,
                                            0, 4, 16, 17, 15, 18, 19, 14, 12, 13};

static void test_golden_orders(void **state) {
  (void)state;
  dataset_t *plain = NULL, *sharded = NULL;
  const uint64_t counts[5] = {5, 0, 7, 3, 5};
  assert_int_equal(dataset_create(20, &plain), MUSTER_OK);
  assert_int_equal(dataset_create_shards(5, counts, NULL, &sharded), MUSTER_OK);
  part_config_t cfg;
  part_config_init(&cfg);
  cfg.seed = 42;
  cfg.epochs = 0;
  check_order(plain, &cfg, 7, order_none);
  cfg.shuffle = PART_SHUFFLE_GLOBAL;
  check_order(plain, &cfg, 0, order_global_e0);
  check_order(plain, &cfg, 1, order_global_e1);
  cfg.shuffle = PART_SHUFFLE_SHARD;
  cfg.shuffle_block_size = 4;
  check_order(sharded, &cfg, 0, order_shard_e0);
  check_order(sharded, &cfg, 1, order_shard_e1);
  dataset_destroy(plain);
  dataset_destroy(sharded);
}

/* Shard mode keeps every window of 4 samples of a shard together. */
static void test_shard_locality(void **state) {
  (void)state;
  const uint64_t counts[6] = {100, 37, 0, 64, 1, 250};
  dataset_t *ds = NULL;
  assert_int_equal(dataset_create_shards(6, counts, NULL, &ds), MUSTER_OK);
  part_config_t cfg;
  part_config_init(&cfg);
  cfg.shuffle = PART_SHUFFLE_SHARD;
  cfg.shuffle_block_size = 16;
  cfg.seed = 5;
  cfg.epochs = 0;
  part_plan_t *plan = NULL;
  part_epoch_t *ep = NULL;
  assert_int_equal(part_plan_create(ds, &cfg, &plan), MUSTER_OK);
  assert_int_equal(part_epoch_create(plan, 3, &ep), MUSTER_OK);
  uint64_t pos = 0;
  while (pos < dataset_num_samples(ds)) {
    size_t shard = dataset_shard_of(ds, part_epoch_index(ep, pos));
    uint64_t count = dataset_shard_count(ds, shard), start = dataset_shard_start(ds, shard);
    for (uint64_t off = 0; off < count; off++, pos++) { /* the whole shard, in windows */
      uint64_t sample = part_epoch_index(ep, pos);
      assert_int_equal(dataset_shard_of(ds, sample), shard);
      assert_int_equal((sample - start) / 16, off / 16);
    }
  }
  part_epoch_destroy(ep);
  part_plan_destroy(plan);
  dataset_destroy(ds);
}

/* ---- golden strategies (N = 20, 3 ranks, global shuffle, seed 42, epoch 0) ------ */

static const uint64_t rr_r0[7] = {4, 1, 14, 8, 0, 5, 12};
static const uint64_t rr_r1[7] = {2, 16, 3, 10, 13, 7, 17};
static const uint64_t rr_r2[6] = {18, 9, 19, 11, 15, 6};
static const uint64_t rr_pad_r2[7] = {18, 9, 19, 11, 15, 6, 4};
static const uint64_t contiguous_r0[7] = {4, 2, 18, 1, 16, 9, 14};
static const uint64_t contiguous_r1[7] = {3, 19, 8, 10, 11, 0, 13};
static const uint64_t contiguous_r2[6] = {15, 5, 7, 6, 12, 17};
static const uint64_t hash_r0[8] = {18, 9, 3, 19, 8, 13, 5, 17};
static const uint64_t hash_r1[8] = {2, 1, 16, 14, 10, 11, 0, 15};
static const uint64_t hash_r2[4] = {4, 7, 6, 12};
static const uint64_t hash_pad_r2[8] = {4, 7, 6, 12, 15, 6, 4, 1};
static const uint64_t range_r0[8] = {18, 16, 14, 19, 13, 15, 12, 17};
static const uint64_t range_r1[5] = {4, 2, 1, 3, 0};
static const uint64_t range_r2[7] = {9, 8, 10, 11, 5, 7, 6};
static const uint64_t stratified_r0[7] = {1, 9, 0, 13, 15, 7, 17};
static const uint64_t stratified_r1[7] = {2, 14, 3, 19, 8, 5, 12};
static const uint64_t stratified_r2[6] = {4, 18, 16, 10, 11, 6};
static const uint64_t dynamic_r0[8] = {4, 2, 18, 8, 10, 11, 12, 17};
static const uint64_t dynamic_r1[6] = {1, 16, 9, 0, 13, 15};
static const uint64_t dynamic_r2[6] = {14, 3, 19, 5, 7, 6};

typedef struct {
  const uint64_t *items;
  size_t count;
} expected_t;

#define EXPECT(array)                                                                              \
  { array, sizeof array / sizeof array[0] }

static void check_strategy(const dataset_t *ds, const part_config_t *cfg,
                           const expected_t expected[3]) {
  part_plan_t *plan = NULL;
  assert_int_equal(part_plan_create(ds, cfg, &plan), MUSTER_OK);
  for (uint32_t r = 0; r < 3; r++)
    check_rank(plan, 0, r, expected[r].items, expected[r].count);
  part_plan_destroy(plan);
}

static void test_golden_strategies(void **state) {
  (void)state;
  uint32_t labels[20];
  golden_labels(labels);
  dataset_t *ds = labelled_dataset(20, labels);
  part_config_t cfg;
  part_config_init(&cfg);
  cfg.seed = 42;
  cfg.shuffle = PART_SHUFFLE_GLOBAL;
  cfg.world_size = 3;
  check_strategy(ds, &cfg, (expected_t[3]){EXPECT(rr_r0), EXPECT(rr_r1), EXPECT(rr_r2)});
  cfg.tail = PART_TAIL_PAD;
  check_strategy(ds, &cfg, (expected_t[3]){EXPECT(rr_r0), EXPECT(rr_r1), EXPECT(rr_pad_r2)});
  cfg.tail = PART_TAIL_DROP; /* every rank stops at 6 */
  check_strategy(ds, &cfg, (expected_t[3]){{rr_r0, 6}, {rr_r1, 6}, EXPECT(rr_r2)});
  cfg.tail = PART_TAIL_KEEP;
  cfg.strategy = PART_CONTIGUOUS;
  check_strategy(
      ds, &cfg,
      (expected_t[3]){EXPECT(contiguous_r0), EXPECT(contiguous_r1), EXPECT(contiguous_r2)});
  cfg.strategy = PART_HASH;
  cfg.num_partitions = 8;
  cfg.hash_seed = 7;
  check_strategy(ds, &cfg, (expected_t[3]){EXPECT(hash_r0), EXPECT(hash_r1), EXPECT(hash_r2)});
  cfg.tail = PART_TAIL_PAD;
  check_strategy(ds, &cfg, (expected_t[3]){EXPECT(hash_r0), EXPECT(hash_r1), EXPECT(hash_pad_r2)});
  cfg.tail = PART_TAIL_KEEP;
  const part_range_t ranges[3] = {{12, 20}, {0, 5}, {5, 12}};
  cfg.strategy = PART_RANGE;
  cfg.ranges = ranges;
  check_strategy(ds, &cfg, (expected_t[3]){EXPECT(range_r0), EXPECT(range_r1), EXPECT(range_r2)});
  cfg.ranges = NULL;
  cfg.strategy = PART_STRATIFIED;
  check_strategy(
      ds, &cfg,
      (expected_t[3]){EXPECT(stratified_r0), EXPECT(stratified_r1), EXPECT(stratified_r2)});
  cfg.strategy = PART_DYNAMIC;
  cfg.block_size = 3;
  check_strategy(ds, &cfg,
                 (expected_t[3]){EXPECT(dynamic_r0), EXPECT(dynamic_r1), EXPECT(dynamic_r2)});
  dataset_destroy(ds);
}

/* The worked examples of docs/iterations.md (N = 10, 3 ranks), so the
 * document cannot drift from the code. */
static const uint64_t doc_rr[3][4] = {{0, 3, 6, 9}, {1, 4, 7}, {2, 5, 8}};
static const uint64_t doc_contiguous[3][4] = {{0, 1, 2, 3}, {4, 5, 6}, {7, 8, 9}};
static const uint64_t doc_hash[3][5] = {{0, 2, 4, 7, 8}, {1, 3, 6}, {5, 9}};
static const uint64_t doc_range[3][5] = {{0, 1}, {2, 3, 4, 5, 6}, {7, 8, 9}};
static const uint64_t doc_stratified[3][4] = {{0, 1, 5, 7}, {2, 4, 6}, {3, 8, 9}};
static const uint64_t doc_dynamic[3][4] = {{0, 1, 6, 7}, {2, 3, 8, 9}, {4, 5}};
static const uint64_t doc_pad[3][4] = {{0, 3, 6, 9}, {1, 4, 7, 0}, {2, 5, 8, 1}};
static const uint64_t doc_drop[3][3] = {{0, 3, 6}, {1, 4, 7}, {2, 5, 8}};
static const uint64_t doc_rr_global[3][4] = {{4, 7, 8, 0}, {6, 9, 5}, {1, 2, 3}};
static const uint64_t doc_strat_global[3][4] = {{1, 7, 5, 0}, {4, 6, 2}, {9, 8, 3}};
static const uint64_t doc_shard_order[10] = {5, 4, 6, 0, 1, 2, 3, 7, 8, 9};

#define DOC(rows, a, b, c) ((expected_t[3]){{rows[0], a}, {rows[1], b}, {rows[2], c}})

static void test_doc_examples(void **state) {
  (void)state;
  const uint32_t labels[10] = {0, 1, 0, 0, 1, 0, 0, 2, 0, 1};
  const uint64_t shard_counts[3] = {4, 3, 3};
  dataset_t *ds = labelled_dataset(10, labels), *sharded = NULL;
  assert_int_equal(dataset_create_shards(3, shard_counts, NULL, &sharded), MUSTER_OK);
  part_config_t cfg;
  part_config_init(&cfg);
  cfg.world_size = 3;
  check_strategy(ds, &cfg, DOC(doc_rr, 4, 3, 3));
  cfg.tail = PART_TAIL_PAD;
  check_strategy(ds, &cfg, DOC(doc_pad, 4, 4, 4));
  cfg.tail = PART_TAIL_DROP;
  check_strategy(ds, &cfg, DOC(doc_drop, 3, 3, 3));
  cfg.tail = PART_TAIL_KEEP;
  cfg.strategy = PART_CONTIGUOUS;
  check_strategy(ds, &cfg, DOC(doc_contiguous, 4, 3, 3));
  cfg.strategy = PART_HASH;
  cfg.num_partitions = 4;
  cfg.hash_seed = 1;
  check_strategy(ds, &cfg, DOC(doc_hash, 5, 3, 2));
  const part_range_t ranges[3] = {{0, 2}, {2, 7}, {7, 10}};
  cfg.strategy = PART_RANGE;
  cfg.ranges = ranges;
  check_strategy(ds, &cfg, DOC(doc_range, 2, 5, 3));
  cfg.ranges = NULL;
  cfg.strategy = PART_STRATIFIED;
  check_strategy(ds, &cfg, DOC(doc_stratified, 4, 3, 3));
  cfg.strategy = PART_DYNAMIC;
  cfg.block_size = 2;
  check_strategy(ds, &cfg, DOC(doc_dynamic, 4, 4, 2));
  part_config_init(&cfg);
  cfg.world_size = 3;
  cfg.seed = 42;
  cfg.shuffle = PART_SHUFFLE_GLOBAL;
  check_strategy(ds, &cfg, DOC(doc_rr_global, 4, 3, 3));
  cfg.strategy = PART_STRATIFIED;
  check_strategy(ds, &cfg, DOC(doc_strat_global, 4, 3, 3));
  cfg.shuffle = PART_SHUFFLE_SHARD;
  cfg.shuffle_block_size = 2;
  cfg.strategy = PART_CONTIGUOUS;
  check_order(sharded, &cfg, 0, doc_shard_order);
  dataset_destroy(ds);
  dataset_destroy(sharded);
}

/* The fingerprint is part of the contract too: positions saved with it must
 * stay restorable. */
static void test_golden_fingerprint(void **state) {
  (void)state;
  uint32_t labels[20];
  golden_labels(labels);
  dataset_t *ds = labelled_dataset(20, labels);
  part_config_t cfg;
  part_config_init(&cfg);
  cfg.seed = 42;
  cfg.shuffle = PART_SHUFFLE_GLOBAL;
  cfg.world_size = 3;
  part_plan_t *a = NULL, *b = NULL;
  assert_int_equal(part_plan_create(ds, &cfg, &a), MUSTER_OK);
  assert_int_equal(part_plan_fingerprint(a), UINT64_C(0xdaf7edcde0d9e669));
  cfg.epochs = 90; /* more epochs: the same outputs, the same fingerprint */
  assert_int_equal(part_plan_create(ds, &cfg, &b), MUSTER_OK);
  assert_int_equal(part_plan_fingerprint(a), part_plan_fingerprint(b));
  part_plan_destroy(b);
  cfg.seed = 43;
  assert_int_equal(part_plan_create(ds, &cfg, &b), MUSTER_OK);
  assert_int_not_equal(part_plan_fingerprint(a), part_plan_fingerprint(b));
  part_plan_destroy(a);
  part_plan_destroy(b);
  dataset_destroy(ds);
}

/* ---- coverage of every strategy, shuffle, tail and world size 1..8 -------------- */

/* Sample counts of the coverage datasets; 3 is below most world sizes. */
static const uint64_t coverage_sizes[] = {0, 1, 3, 37, 100};

static dataset_t *coverage_dataset(uint64_t n) {
  uint64_t counts[4] = {n / 3, 0, n - n / 3 - n / 4, n / 4}; /* one empty shard */
  dataset_t *ds = NULL;
  assert_int_equal(dataset_create_shards(4, counts, NULL, &ds), MUSTER_OK);
  uint32_t *labels = calloc(n + 1, sizeof *labels);
  assert_non_null(labels);
  for (uint64_t i = 0; i < n; i++) /* imbalanced: class 0 common, class 3 rare */
    labels[i] = (uint32_t)(i % 7 < 4 ? 0 : i % 7 < 6 ? (i % 2) + 1 : 3);
  assert_int_equal(dataset_set_labels(ds, labels, n), MUSTER_OK);
  free(labels);
  return ds;
}

/* Uneven ranges, assigned to ranks in reverse order, rank 0 often empty. */
static void coverage_ranges(uint64_t n, uint32_t world, part_range_t *ranges) {
  uint64_t begin = 0;
  for (uint32_t i = 0; i < world; i++) {
    uint64_t end = (i + 1 == world) ? n : begin + (n - begin) * (i + 1) / (2 * world);
    ranges[world - 1 - i] = (part_range_t){begin, end};
    begin = end;
  }
}

/* Checks one configuration: counts how often each sample is yielded, over all
 * ranks, and compares with the tail rule. */
static void check_coverage(const dataset_t *ds, const part_config_t *cfg, uint64_t epoch) {
  uint64_t n = dataset_num_samples(ds);
  part_plan_t *plan = NULL;
  part_epoch_t *ep = NULL;
  assert_int_equal(part_plan_create(ds, cfg, &plan), MUSTER_OK);
  assert_int_equal(part_epoch_create(plan, epoch, &ep), MUSTER_OK);
  uint32_t *seen = calloc(n + 1, sizeof *seen);
  uint64_t *items = calloc(MAX_ITEMS, sizeof *items);
  assert_true(seen != NULL && items != NULL);
  uint64_t total = 0, owned_min = UINT64_MAX, owned_max = 0;
  for (uint32_t r = 0; r < cfg->world_size; r++) {
    size_t len = rank_items(plan, ep, r, items);
    uint64_t owned = part_rank_owned(plan, r);
    owned_min = owned < owned_min ? owned : owned_min;
    owned_max = owned > owned_max ? owned : owned_max;
    for (size_t k = 0; k < len; k++)
      seen[items[k]]++;
    total += len;
    assert_int_equal(part_rank_blocks(plan, r), (len + cfg->block_size - 1) / cfg->block_size);
  }
  uint64_t expected_len = cfg->tail == PART_TAIL_PAD    ? owned_max
                          : cfg->tail == PART_TAIL_DROP ? owned_min
                                                        : 0;
  if (cfg->tail != PART_TAIL_KEEP)
    assert_int_equal(total, expected_len * cfg->world_size);
  else
    assert_int_equal(total, n);
  for (uint64_t s = 0; s < n; s++) {
    if (cfg->tail == PART_TAIL_KEEP)
      assert_int_equal(seen[s], 1);
    else if (cfg->tail == PART_TAIL_PAD)
      assert_true(seen[s] >= 1);
    else
      assert_true(seen[s] <= 1);
  }
  free(seen);
  free(items);
  part_epoch_destroy(ep);
  part_plan_destroy(plan);
}

static void test_coverage_all(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof coverage_sizes / sizeof coverage_sizes[0]; i++) {
    uint64_t n = coverage_sizes[i];
    dataset_t *ds = coverage_dataset(n);
    for (uint32_t world = 1; world <= 8; world++) {
      part_range_t ranges[8];
      coverage_ranges(n, world, ranges);
      for (unsigned strategy = 0; strategy < PART_STRATEGY_COUNT; strategy++) {
        for (unsigned shuffle = 0; shuffle < PART_SHUFFLE_COUNT; shuffle++) {
          for (unsigned tail = 0; tail < PART_TAIL_COUNT; tail++) {
            part_config_t cfg;
            part_config_init(&cfg);
            cfg.strategy = (part_strategy_t)strategy;
            cfg.shuffle = (part_shuffle_t)shuffle;
            cfg.tail = (part_tail_t)tail;
            cfg.world_size = world;
            cfg.seed = 1000 + n;
            cfg.epochs = 0;
            cfg.block_size = 4;
            cfg.shuffle_block_size = 8;
            cfg.num_partitions = 13;
            cfg.ranges = strategy == PART_RANGE ? ranges : NULL;
            check_coverage(ds, &cfg, 2);
          }
        }
      }
    }
    dataset_destroy(ds);
  }
}

/* Round robin with pad and drop has DistributedSampler's structure: rank r's
 * k-th item is the sample at position (r + k*W) mod N, for k < ceil(N/W) (pad)
 * or floor(N/W) (drop). */
static void test_distributed_sampler_structure(void **state) {
  (void)state;
  dataset_t *ds = NULL;
  assert_int_equal(dataset_create(23, &ds), MUSTER_OK);
  for (unsigned tail = PART_TAIL_PAD; tail <= PART_TAIL_DROP; tail++) {
    part_config_t cfg;
    part_config_init(&cfg);
    cfg.shuffle = PART_SHUFFLE_GLOBAL;
    cfg.seed = 9;
    cfg.world_size = 5;
    cfg.tail = (part_tail_t)tail;
    part_plan_t *plan = NULL;
    part_epoch_t *ep = NULL;
    assert_int_equal(part_plan_create(ds, &cfg, &plan), MUSTER_OK);
    assert_int_equal(part_epoch_create(plan, 0, &ep), MUSTER_OK);
    uint64_t expected_len = tail == PART_TAIL_PAD ? 5 : 4;
    for (uint32_t r = 0; r < 5; r++) {
      uint64_t items[MAX_ITEMS];
      assert_int_equal(rank_items(plan, ep, r, items), expected_len);
      for (uint64_t k = 0; k < expected_len; k++)
        assert_int_equal(items[k], part_epoch_index(ep, (r + k * 5) % 23));
    }
    part_epoch_destroy(ep);
    part_plan_destroy(plan);
  }
  dataset_destroy(ds);
}

/* ---- stratified ----------------------------------------------------------------- */

static void test_stratified_proportions(void **state) {
  (void)state;
  dataset_t *ds = coverage_dataset(1000);
  uint32_t classes = dataset_num_classes(ds);
  for (uint32_t world = 1; world <= 8; world++) {
    part_config_t cfg;
    part_config_init(&cfg);
    cfg.strategy = PART_STRATIFIED;
    cfg.shuffle = PART_SHUFFLE_GLOBAL;
    cfg.world_size = world;
    part_plan_t *plan = NULL;
    assert_int_equal(part_plan_create(ds, &cfg, &plan), MUSTER_OK);
    uint64_t per[8][4] = {{0}};
    for (uint64_t s = 0; s < 1000; s++)
      per[part_sample_owner(plan, s)][dataset_label(ds, s)]++;
    for (uint32_t r = 0; r < world; r++) {
      for (uint32_t c = 0; c < classes; c++) {
        uint64_t n_c = dataset_class_count(ds, c);
        /* within one sample of the exact share n_c / W */
        assert_true(per[r][c] * world + world > n_c && per[r][c] * world < n_c + world);
      }
    }
    part_plan_destroy(plan);
  }
  dataset_destroy(ds);
}

/* ---- epochs and seeds --------------------------------------------------------------- */

static int same_rank_items(const part_plan_t *a, uint64_t epoch_a, const part_plan_t *b,
                           uint64_t epoch_b, uint32_t rank, int as_set) {
  part_epoch_t *ea = NULL, *eb = NULL;
  assert_int_equal(part_epoch_create(a, epoch_a, &ea), MUSTER_OK);
  assert_int_equal(part_epoch_create(b, epoch_b, &eb), MUSTER_OK);
  uint64_t *x = calloc(MAX_ITEMS, sizeof *x), *y = calloc(MAX_ITEMS, sizeof *y);
  assert_true(x != NULL && y != NULL);
  size_t nx = rank_items(a, ea, rank, x), ny = rank_items(b, eb, rank, y);
  int same = nx == ny;
  if (same && as_set) { /* compare membership: the items are distinct */
    uint64_t sum_x = 0, sum_y = 0, xor_x = 0, xor_y = 0;
    for (size_t i = 0; i < nx; i++)
      sum_x += x[i] * x[i], sum_y += y[i] * y[i], xor_x ^= x[i], xor_y ^= y[i];
    same = sum_x == sum_y && xor_x == xor_y;
  } else if (same) {
    same = memcmp(x, y, nx * sizeof *x) == 0;
  }
  free(x);
  free(y);
  part_epoch_destroy(ea);
  part_epoch_destroy(eb);
  return same;
}

static void test_epochs_and_seeds(void **state) {
  (void)state;
  dataset_t *ds = coverage_dataset(500);
  for (unsigned strategy = 0; strategy < PART_STRATEGY_COUNT; strategy++) {
    part_range_t ranges[4];
    coverage_ranges(500, 4, ranges);
    part_config_t cfg;
    part_config_init(&cfg);
    cfg.strategy = (part_strategy_t)strategy;
    cfg.shuffle = PART_SHUFFLE_GLOBAL;
    cfg.world_size = 4;
    cfg.epochs = 0;
    cfg.seed = 77;
    cfg.ranges = strategy == PART_RANGE ? ranges : NULL;
    part_plan_t *plan = NULL, *again = NULL, *other = NULL;
    assert_int_equal(part_plan_create(ds, &cfg, &plan), MUSTER_OK);
    assert_int_equal(part_plan_create(ds, &cfg, &again), MUSTER_OK);
    cfg.seed = 78;
    assert_int_equal(part_plan_create(ds, &cfg, &other), MUSTER_OK);
    uint32_t rank = strategy == PART_RANGE ? 3 : 1;            /* a rank owning samples */
    assert_true(same_rank_items(plan, 5, again, 5, rank, 0));  /* same seed, same order */
    assert_false(same_rank_items(plan, 5, plan, 6, rank, 0));  /* epochs differ */
    assert_false(same_rank_items(plan, 5, other, 5, rank, 0)); /* seeds differ */
    /* Sample strategies keep each rank's samples across epochs. */
    if (!part_strategy_is_positional(cfg.strategy))
      assert_true(same_rank_items(plan, 5, plan, 6, rank, 1));
    part_plan_destroy(plan);
    part_plan_destroy(again);
    part_plan_destroy(other);
  }
  dataset_destroy(ds);
}

/* ---- blocks and owners ------------------------------------------------------------- */

static void test_blocks(void **state) {
  (void)state;
  dataset_t *ds = NULL;
  assert_int_equal(dataset_create(10, &ds), MUSTER_OK);
  part_config_t cfg;
  part_config_init(&cfg);
  cfg.strategy = PART_DYNAMIC;
  cfg.world_size = 3;
  cfg.block_size = 4;
  part_plan_t *plan = NULL;
  assert_int_equal(part_plan_create(ds, &cfg, &plan), MUSTER_OK);
  assert_int_equal(part_num_blocks(plan), 3);
  uint64_t begin = 0, end = 0;
  part_block_positions(plan, 2, &begin, &end);
  assert_int_equal(begin, 8);
  assert_int_equal(end, 10);
  part_block_positions(plan, 0, &begin, &end);
  assert_int_equal(end, 4);
  assert_int_equal(part_rank_owned(plan, 0), 4);
  assert_int_equal(part_rank_owned(plan, 2), 2);
  assert_int_equal(part_rank_blocks(plan, 1), 1);
  assert_int_equal(part_position_owner(plan, 9), 2);
  part_plan_destroy(plan);
  dataset_destroy(ds);
}

static void test_hash_owner(void **state) {
  (void)state;
  dataset_t *ds = NULL;
  assert_int_equal(dataset_create(1000, &ds), MUSTER_OK);
  part_config_t cfg;
  part_config_init(&cfg);
  cfg.strategy = PART_HASH;
  cfg.world_size = 3;
  cfg.hash_seed = 5;
  part_plan_t *plan = NULL;
  assert_int_equal(part_plan_create(ds, &cfg, &plan), MUSTER_OK);
  assert_int_equal(part_plan_config(plan)->num_partitions, 3); /* 0 means world_size */
  for (uint64_t s = 0; s < 1000; s++)
    assert_int_equal(part_sample_owner(plan, s), (perm_hash64(s, 5) % 3) % 3);
  part_plan_destroy(plan);
  dataset_destroy(ds);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dataset_plain),
      cmocka_unit_test(test_dataset_shards),
      cmocka_unit_test(test_dataset_labels),
      cmocka_unit_test(test_dataset_fingerprint),
      cmocka_unit_test(test_names),
      cmocka_unit_test(test_config_validation),
      cmocka_unit_test(test_epoch_bounds),
      cmocka_unit_test(test_golden_orders),
      cmocka_unit_test(test_shard_locality),
      cmocka_unit_test(test_golden_strategies),
      cmocka_unit_test(test_doc_examples),
      cmocka_unit_test(test_golden_fingerprint),
      cmocka_unit_test(test_coverage_all),
      cmocka_unit_test(test_distributed_sampler_structure),
      cmocka_unit_test(test_stratified_proportions),
      cmocka_unit_test(test_epochs_and_seeds),
      cmocka_unit_test(test_blocks),
      cmocka_unit_test(test_hash_owner),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
