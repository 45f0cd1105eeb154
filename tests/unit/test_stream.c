/*
 * test_stream.c — the standalone rank stream (src/core/stream.c).
 *
 * The stream must yield exactly what the partition defines (cross-checked
 * against an independent computation from the partition API for every
 * strategy, shuffle, tail and world size 1..8), pinned golden values, and
 * resume exactly from a saved position.
 */
#include <malloc.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/dataset.h"
#include "core/partition.h"
#include "core/stream.h"

#define MAX_ITEMS 4096

/* ---- helpers ------------------------------------------------------------------ */

static dataset_t *golden_dataset(void) {
  uint32_t labels[20];
  for (int i = 0; i < 20; i++)
    labels[i] = i % 5 == 0 ? 0 : (i % 3 == 0 ? 1 : 2);
  dataset_t *ds = NULL;
  assert_int_equal(dataset_create(20, &ds), MUSTER_OK);
  assert_int_equal(dataset_set_labels(ds, labels, 20), MUSTER_OK);
  return ds;
}

/* A sharded (one empty shard), labelled dataset of n samples. */
static dataset_t *test_dataset(uint64_t n) {
  uint64_t counts[4] = {n / 2, 0, n / 4, n - n / 2 - n / 4};
  dataset_t *ds = NULL;
  assert_int_equal(dataset_create_shards(4, counts, NULL, &ds), MUSTER_OK);
  uint32_t *labels = calloc(n + 1, sizeof *labels);
  assert_non_null(labels);
  for (uint64_t i = 0; i < n; i++)
    labels[i] = (uint32_t)((i * 2654435761u) % 5 < 3 ? 0 : (i % 3));
  assert_int_equal(dataset_set_labels(ds, labels, n), MUSTER_OK);
  free(labels);
  return ds;
}

/* Uneven ranges in reverse rank order. */
static void test_ranges(uint64_t n, uint32_t world, part_range_t *ranges) {
  uint64_t begin = 0;
  for (uint32_t i = 0; i < world; i++) {
    uint64_t end = (i + 1 == world) ? n : begin + (n - begin) / 3;
    ranges[world - 1 - i] = (part_range_t){begin, end};
    begin = end;
  }
}

static part_plan_t *make_plan(const dataset_t *ds, part_strategy_t strategy, part_shuffle_t shuffle,
                              part_tail_t tail, uint32_t world, const part_range_t *ranges) {
  part_config_t cfg;
  part_config_init(&cfg);
  cfg.strategy = strategy;
  cfg.shuffle = shuffle;
  cfg.tail = tail;
  cfg.world_size = world;
  cfg.seed = 31337;
  cfg.epochs = 4;
  cfg.block_size = 5;
  cfg.shuffle_block_size = 6;
  cfg.num_partitions = 11;
  cfg.hash_seed = 3;
  cfg.ranges = strategy == PART_RANGE ? ranges : NULL;
  part_plan_t *plan = NULL;
  assert_int_equal(part_plan_create(ds, &cfg, &plan), MUSTER_OK);
  return plan;
}

/* The rank's items computed from the partition API, independently of stream.c. */
static size_t expected_items(const part_plan_t *plan, uint64_t epoch, uint32_t rank,
                             uint64_t *out) {
  part_epoch_t *ep = NULL;
  assert_int_equal(part_epoch_create(plan, epoch, &ep), MUSTER_OK);
  uint64_t n = dataset_num_samples(part_plan_dataset(plan));
  uint64_t len = part_rank_len(plan, rank), owned = 0;
  for (uint64_t pos = 0; pos < n; pos++)
    if (part_owner_at(ep, pos) == rank && owned++ < len)
      out[owned - 1] = part_epoch_index(ep, pos);
  for (uint64_t k = part_rank_owned(plan, rank); k < len; k++)
    out[k] = part_epoch_index(ep, part_pad_position(plan, rank, k));
  part_epoch_destroy(ep);
  return (size_t)len;
}

/* Everything the stream yields in its current epoch. */
static size_t drain(stream_t *stream, uint64_t *out) {
  size_t got = 0;
  while (got < MAX_ITEMS && stream_next(stream, &out[got]))
    got++;
  return got;
}

static void check_stream(const part_plan_t *plan, uint32_t rank, uint64_t epoch,
                         const uint64_t *expected, size_t count) {
  stream_t *stream = NULL;
  assert_int_equal(stream_create(plan, rank, &stream), MUSTER_OK);
  assert_int_equal(stream_set_epoch(stream, epoch), MUSTER_OK);
  assert_int_equal(stream_len(stream), count);
  uint64_t items[MAX_ITEMS];
  assert_int_equal(drain(stream, items), count);
  for (size_t i = 0; i < count; i++)
    assert_int_equal(items[i], expected[i]);
  stream_destroy(stream);
}

/* ---- golden values ------------------------------------------------------------ */

/* N = 20, 3 ranks, global shuffle, seed 42, epoch 0 (same as test_partition.c). */
static const uint64_t rr_r1[7] = {2, 16, 3, 10, 13, 7, 17};
static const uint64_t rr_pad_r2[7] = {18, 9, 19, 11, 15, 6, 4};
static const uint64_t contiguous_r2[6] = {15, 5, 7, 6, 12, 17};
static const uint64_t hash_pad_r2[8] = {4, 7, 6, 12, 15, 6, 4, 1};
static const uint64_t range_r0[8] = {18, 16, 14, 19, 13, 15, 12, 17};
static const uint64_t stratified_r0[7] = {1, 9, 0, 13, 15, 7, 17};
static const uint64_t dynamic_r0[8] = {4, 2, 18, 8, 10, 11, 12, 17};
/* Shards {5, 0, 7, 3, 5}, windows of 4, seed 42, contiguous over 2 ranks. */
static const uint64_t shard_e0_r0[10] = {5, 8, 7, 6, 9, 10, 11, 3, 0, 2};
static const uint64_t shard_e1_r1[10] = {0, 4, 16, 17, 15, 18, 19, 14, 12, 13};

static void test_golden_streams(void **state) {
  (void)state;
  dataset_t *ds = golden_dataset();
  part_config_t cfg;
  part_config_init(&cfg);
  cfg.seed = 42;
  cfg.shuffle = PART_SHUFFLE_GLOBAL;
  cfg.world_size = 3;
  const part_range_t ranges[3] = {{12, 20}, {0, 5}, {5, 12}};
  struct {
    part_strategy_t strategy;
    part_tail_t tail;
    uint32_t rank;
    const uint64_t *items;
    size_t count;
  } cases[] = {
      {PART_ROUND_ROBIN, PART_TAIL_KEEP, 1, rr_r1, 7},
      {PART_ROUND_ROBIN, PART_TAIL_PAD, 2, rr_pad_r2, 7},
      {PART_CONTIGUOUS, PART_TAIL_KEEP, 2, contiguous_r2, 6},
      {PART_HASH, PART_TAIL_PAD, 2, hash_pad_r2, 8},
      {PART_RANGE, PART_TAIL_KEEP, 0, range_r0, 8},
      {PART_STRATIFIED, PART_TAIL_KEEP, 0, stratified_r0, 7},
      {PART_DYNAMIC, PART_TAIL_KEEP, 0, dynamic_r0, 8},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    cfg.strategy = cases[i].strategy;
    cfg.tail = cases[i].tail;
    cfg.num_partitions = 8;
    cfg.hash_seed = 7;
    cfg.block_size = 3;
    cfg.ranges = cfg.strategy == PART_RANGE ? ranges : NULL;
    part_plan_t *plan = NULL;
    assert_int_equal(part_plan_create(ds, &cfg, &plan), MUSTER_OK);
    check_stream(plan, cases[i].rank, 0, cases[i].items, cases[i].count);
    part_plan_destroy(plan);
  }
  dataset_destroy(ds);
}

static void test_golden_shard_stream(void **state) {
  (void)state;
  const uint64_t counts[5] = {5, 0, 7, 3, 5};
  dataset_t *ds = NULL;
  assert_int_equal(dataset_create_shards(5, counts, NULL, &ds), MUSTER_OK);
  part_config_t cfg;
  part_config_init(&cfg);
  cfg.seed = 42;
  cfg.shuffle = PART_SHUFFLE_SHARD;
  cfg.shuffle_block_size = 4;
  cfg.strategy = PART_CONTIGUOUS;
  cfg.world_size = 2;
  cfg.epochs = 2;
  part_plan_t *plan = NULL;
  assert_int_equal(part_plan_create(ds, &cfg, &plan), MUSTER_OK);
  check_stream(plan, 0, 0, shard_e0_r0, 10);
  check_stream(plan, 1, 1, shard_e1_r1, 10);
  part_plan_destroy(plan);
  dataset_destroy(ds);
}

/* ---- every configuration: stream == partition, ranks cover the epoch ----------- */

static void check_configuration(const dataset_t *ds, const part_plan_t *plan, uint32_t world) {
  uint64_t n = dataset_num_samples(ds);
  uint32_t *seen = calloc(n + 1, sizeof *seen);
  uint64_t *got = calloc(MAX_ITEMS, sizeof *got), *want = calloc(MAX_ITEMS, sizeof *want);
  assert_true(seen != NULL && got != NULL && want != NULL);
  for (uint32_t r = 0; r < world; r++) {
    stream_t *stream = NULL;
    assert_int_equal(stream_create(plan, r, &stream), MUSTER_OK);
    assert_int_equal(stream_set_epoch(stream, 3), MUSTER_OK);
    size_t count = drain(stream, got);
    assert_int_equal(expected_items(plan, 3, r, want), count);
    assert_memory_equal(got, want, count * sizeof *got);
    assert_int_equal(stream_remaining(stream), 0);
    for (size_t k = 0; k < count; k++)
      seen[got[k]]++;
    stream_destroy(stream);
  }
  if (part_plan_config(plan)->tail == PART_TAIL_KEEP)
    for (uint64_t s = 0; s < n; s++)
      assert_int_equal(seen[s], 1); /* the union of ranks: each sample exactly once */
  free(seen);
  free(got);
  free(want);
}

static void test_all_configurations(void **state) {
  (void)state;
  static const uint64_t sizes[] = {0, 2, 29, 120};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    dataset_t *ds = test_dataset(sizes[i]);
    for (uint32_t world = 1; world <= 8; world++) {
      part_range_t ranges[8];
      test_ranges(sizes[i], world, ranges);
      for (unsigned strategy = 0; strategy < PART_STRATEGY_COUNT; strategy++)
        for (unsigned shuffle = 0; shuffle < PART_SHUFFLE_COUNT; shuffle++)
          for (unsigned tail = 0; tail < PART_TAIL_COUNT; tail++) {
            part_plan_t *plan = make_plan(ds, (part_strategy_t)strategy, (part_shuffle_t)shuffle,
                                          (part_tail_t)tail, world, ranges);
            check_configuration(ds, plan, world);
            part_plan_destroy(plan);
          }
    }
    dataset_destroy(ds);
  }
}

/* ---- epochs -------------------------------------------------------------------- */

static void test_epochs(void **state) {
  (void)state;
  dataset_t *ds = test_dataset(50);
  part_plan_t *plan = make_plan(ds, PART_ROUND_ROBIN, PART_SHUFFLE_GLOBAL, PART_TAIL_KEEP, 2, NULL);
  stream_t *stream = NULL;
  assert_int_equal(stream_create(plan, 1, &stream), MUSTER_OK);
  assert_int_equal(stream_epoch(stream), 0);
  assert_int_equal(stream_rank(stream), 1);
  uint64_t first[MAX_ITEMS], second[MAX_ITEMS], index = 0;
  assert_int_equal(drain(stream, first), 25);
  assert_false(stream_next(stream, &index)); /* stays at the end of the epoch */
  assert_int_equal(stream_next_epoch(stream), MUSTER_OK);
  assert_int_equal(stream_epoch(stream), 1);
  assert_int_equal(drain(stream, second), 25);
  assert_memory_not_equal(first, second, 25 * sizeof first[0]);
  assert_int_equal(stream_next_epoch(stream), MUSTER_OK); /* 2 */
  assert_int_equal(stream_next_epoch(stream), MUSTER_OK); /* 3, the last of 4 */
  assert_int_equal(stream_next_epoch(stream), MUSTER_INVALID);
  assert_int_equal(stream_epoch(stream), 3);
  assert_int_equal(stream_set_epoch(stream, 0), MUSTER_OK); /* same seed, same order */
  assert_int_equal(drain(stream, second), 25);
  assert_memory_equal(first, second, 25 * sizeof first[0]);
  stream_destroy(stream);
  stream_destroy(NULL);
  assert_int_equal(stream_create(plan, 2, &stream), MUSTER_INVALID);
  part_plan_destroy(plan);
  dataset_destroy(ds);
}

static void test_batch_and_counters(void **state) {
  (void)state;
  dataset_t *ds = test_dataset(103);
  part_plan_t *plan = make_plan(ds, PART_HASH, PART_SHUFFLE_SHARD, PART_TAIL_PAD, 4, NULL);
  stream_t *stream = NULL, *single = NULL;
  assert_int_equal(stream_create(plan, 3, &stream), MUSTER_OK);
  assert_int_equal(stream_create(plan, 3, &single), MUSTER_OK);
  uint64_t batch[7], one = 0;
  uint64_t len = stream_len(stream);
  assert_int_equal(len, part_rank_len(plan, 3));
  for (uint64_t done = 0; done < len;) {
    assert_int_equal(stream_block(stream), done / 5);
    size_t got = stream_next_batch(stream, batch, 7);
    assert_int_equal(got, len - done < 7 ? len - done : 7);
    for (size_t i = 0; i < got; i++) {
      assert_true(stream_next(single, &one));
      assert_int_equal(batch[i], one);
    }
    done += got;
    assert_int_equal(stream_emitted(stream), done);
    assert_int_equal(stream_remaining(stream), len - done);
  }
  assert_int_equal(stream_next_batch(stream, batch, 7), 0);
  stream_destroy(stream);
  stream_destroy(single);
  part_plan_destroy(plan);
  dataset_destroy(ds);
}

/* ---- save, restore, seek ---------------------------------------------------------- */

/* For every strategy: stop a stream at several points (also mid-way through a
 * later epoch), save its position, restore it into a fresh stream (through the
 * encoded bytes), and check both continue identically to the end. */
static void check_resume(const part_plan_t *plan, uint32_t rank, uint64_t epoch, uint64_t stop) {
  stream_t *original = NULL, *resumed = NULL;
  assert_int_equal(stream_create(plan, rank, &original), MUSTER_OK);
  assert_int_equal(stream_create(plan, rank, &resumed), MUSTER_OK);
  assert_int_equal(stream_set_epoch(original, epoch), MUSTER_OK);
  uint64_t index = 0;
  for (uint64_t i = 0; i < stop; i++)
    assert_true(stream_next(original, &index));
  stream_pos_t pos, decoded;
  unsigned char bytes[STREAM_POS_BYTES];
  stream_get_pos(original, &pos);
  stream_pos_encode(&pos, bytes);
  assert_int_equal(stream_pos_decode(bytes, &decoded), MUSTER_OK);
  assert_int_equal(decoded.fingerprint, pos.fingerprint);
  assert_int_equal(decoded.rank, pos.rank);
  assert_int_equal(decoded.epoch, pos.epoch);
  assert_int_equal(decoded.emitted, pos.emitted);
  assert_int_equal(decoded.cursor, pos.cursor);
  assert_int_equal(stream_set_pos(resumed, &decoded), MUSTER_OK);
  assert_int_equal(stream_epoch(resumed), epoch);
  uint64_t a[MAX_ITEMS], b[MAX_ITEMS];
  size_t na = drain(original, a), nb = drain(resumed, b);
  assert_int_equal(na, nb);
  assert_memory_equal(a, b, na * sizeof a[0]);
  /* Seeking to the same item gives the same rest too. */
  assert_int_equal(stream_seek(resumed, stop), MUSTER_OK);
  assert_int_equal(drain(resumed, b), na);
  assert_memory_equal(a, b, na * sizeof a[0]);
  stream_destroy(original);
  stream_destroy(resumed);
}

static void test_save_restore(void **state) {
  (void)state;
  dataset_t *ds = test_dataset(97);
  part_range_t ranges[3];
  test_ranges(97, 3, ranges);
  for (unsigned strategy = 0; strategy < PART_STRATEGY_COUNT; strategy++) {
    for (unsigned tail = 0; tail < PART_TAIL_COUNT; tail++) {
      part_plan_t *plan = make_plan(ds, (part_strategy_t)strategy, PART_SHUFFLE_GLOBAL,
                                    (part_tail_t)tail, 3, ranges);
      for (uint32_t rank = 0; rank < 3; rank++) {
        uint64_t len = part_rank_len(plan, rank);
        for (uint64_t stop = 0; stop <= len; stop += (len / 4) + 1)
          check_resume(plan, rank, 2, stop);
        check_resume(plan, rank, 1, len);
      }
      part_plan_destroy(plan);
    }
  }
  dataset_destroy(ds);
}

static void test_restore_refused(void **state) {
  (void)state;
  dataset_t *ds = test_dataset(40);
  part_plan_t *plan = make_plan(ds, PART_HASH, PART_SHUFFLE_GLOBAL, PART_TAIL_KEEP, 2, NULL);
  part_plan_t *other = make_plan(ds, PART_HASH, PART_SHUFFLE_NONE, PART_TAIL_KEEP, 2, NULL);
  stream_t *stream = NULL, *foreign = NULL, *rank1 = NULL;
  assert_int_equal(stream_create(plan, 0, &stream), MUSTER_OK);
  assert_int_equal(stream_create(other, 0, &foreign), MUSTER_OK);
  assert_int_equal(stream_create(plan, 1, &rank1), MUSTER_OK);
  uint64_t index = 0;
  assert_true(stream_next(stream, &index));
  stream_pos_t pos;
  stream_get_pos(stream, &pos);
  assert_int_equal(stream_set_pos(foreign, &pos), MUSTER_INVALID); /* other configuration */
  assert_int_equal(stream_set_pos(rank1, &pos), MUSTER_INVALID);   /* other rank */
  stream_pos_t bad = pos;
  bad.epoch = 4; /* the plan has 4 epochs: 0..3 */
  assert_int_equal(stream_set_pos(stream, &bad), MUSTER_INVALID);
  bad = pos;
  bad.emitted = stream_len(stream) + 1;
  assert_int_equal(stream_set_pos(stream, &bad), MUSTER_INVALID);
  bad = pos;
  bad.cursor = 41;
  assert_int_equal(stream_set_pos(stream, &bad), MUSTER_INVALID);
  assert_int_equal(stream_seek(stream, stream_len(stream) + 1), MUSTER_INVALID);
  unsigned char bytes[STREAM_POS_BYTES];
  stream_pos_encode(&pos, bytes);
  bytes[0] = 2; /* a future encoding */
  assert_int_equal(stream_pos_decode(bytes, &bad), MUSTER_INVALID);
  stream_destroy(stream);
  stream_destroy(foreign);
  stream_destroy(rank1);
  part_plan_destroy(plan);
  part_plan_destroy(other);
  dataset_destroy(ds);
}

/* The encoding is a stable little-endian layout; pin it. */
static void test_pos_encoding(void **state) {
  (void)state;
  stream_pos_t pos = {.fingerprint = UINT64_C(0x0102030405060708),
                      .rank = 3,
                      .epoch = 2,
                      .emitted = 0x105,
                      .cursor = 9};
  unsigned char bytes[STREAM_POS_BYTES];
  static const unsigned char expected[STREAM_POS_BYTES] = {1, 0, 0, 0, 3, 0, 0, 0, 8, 7, 6, 5, 4, 3,
                                                           2, 1, 2, 0, 0, 0, 0, 0, 0, 0, 5, 1, 0, 0,
                                                           0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0};
  stream_pos_encode(&pos, bytes);
  assert_memory_equal(bytes, expected, STREAM_POS_BYTES);
}

/* ---- scale: a global shuffle over 10^9 samples allocates nothing of size N ------ */

static void test_large_dataset(void **state) {
  (void)state;
  struct mallinfo2 before = mallinfo2();
  dataset_t *ds = NULL;
  assert_int_equal(dataset_create(UINT64_C(1000000000), &ds), MUSTER_OK);
  part_plan_t *plan = make_plan(ds, PART_ROUND_ROBIN, PART_SHUFFLE_GLOBAL, PART_TAIL_PAD, 8, NULL);
  stream_t *stream = NULL;
  assert_int_equal(stream_create(plan, 5, &stream), MUSTER_OK);
  struct mallinfo2 after = mallinfo2();
  assert_true(after.uordblks - before.uordblks < 64 * 1024);
  assert_int_equal(stream_len(stream), 125000000);
  assert_int_equal(stream_seek(stream, 124999990), MUSTER_OK); /* O(1) for round robin */
  uint64_t items[16];
  assert_int_equal(stream_next_batch(stream, items, 16), 10);
  for (int i = 0; i < 10; i++)
    assert_true(items[i] < UINT64_C(1000000000));
  stream_destroy(stream);
  part_plan_destroy(plan);
  dataset_destroy(ds);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_golden_streams),     cmocka_unit_test(test_golden_shard_stream),
      cmocka_unit_test(test_all_configurations), cmocka_unit_test(test_epochs),
      cmocka_unit_test(test_batch_and_counters), cmocka_unit_test(test_save_restore),
      cmocka_unit_test(test_restore_refused),    cmocka_unit_test(test_pos_encoding),
      cmocka_unit_test(test_large_dataset),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
