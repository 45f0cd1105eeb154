/*
 * test_perm.c — the keyed bijection of src/core/perm.c.
 *
 * Golden values pin PERM_ALGORITHM_VERSION 1: they were computed once by this
 * implementation and written here as literals.  If one of them fails, the
 * shuffle of every existing iteration would change; that needs a new algorithm
 * version, not a new literal.
 */
#include <malloc.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/perm.h"

/* ---- golden values (version 1) ------------------------------------------ */

static const uint64_t perm10_s42_e0[10] = {4, 6, 1, 7, 9, 2, 8, 5, 3, 0};
static const uint64_t perm10_s42_e1[10] = {4, 3, 0, 9, 8, 5, 2, 7, 6, 1};
static const uint64_t perm10_s43_e0[10] = {1, 6, 9, 8, 4, 5, 0, 7, 3, 2};
static const uint64_t perm1000_s7_e3[16] = {742, 784, 99,  148, 382, 60,  911, 893,
                                            792, 460, 836, 936, 739, 982, 237, 702};
static const uint64_t perm2p40_s1_e2[8] = {715652777505, 441163834241, 1031226529142, 585570165288,
                                           352870669926, 52433609017,  319758824671,  542796526249};
/* Positions 123456789..123456792 of the largest domain, n = 2^64 - 1. */
static const uint64_t perm_max_s9_e9[4] = {
    UINT64_C(18098207184541433963), UINT64_C(3952020134473758945), UINT64_C(17782229481283090937),
    UINT64_C(15550356725365036340)};

static void check_golden(uint64_t n, uint64_t seed, uint64_t epoch, uint64_t first,
                         const uint64_t *expected, size_t count) {
  perm_t perm;
  perm_init(&perm, n, seed, epoch);
  for (size_t i = 0; i < count; i++) {
    assert_int_equal(perm_apply(&perm, first + i), expected[i]);
    assert_int_equal(perm_inverse(&perm, expected[i]), first + i);
  }
}

static void test_golden_values(void **state) {
  (void)state;
  check_golden(10, 42, 0, 0, perm10_s42_e0, 10);
  check_golden(10, 42, 1, 0, perm10_s42_e1, 10);
  check_golden(10, 43, 0, 0, perm10_s43_e0, 10);
  check_golden(1000, 7, 3, 0, perm1000_s7_e3, 16);
  check_golden(UINT64_C(1) << 40, 1, 2, 0, perm2p40_s1_e2, 8);
  check_golden(UINT64_MAX, 9, 9, 123456789, perm_max_s9_e9, 4);
}

static void test_hash_golden(void **state) {
  (void)state;
  assert_int_equal(perm_hash64(0, 0), UINT64_C(14374147212387527897));
  assert_int_equal(perm_hash64(1, 0), UINT64_C(3439722301264460078));
  assert_int_equal(perm_hash64(12345, 42), UINT64_C(3734905879192895420));
}

/* ---- bijection ------------------------------------------------------------ */

/* Applies the perm to every position, checking with a bitmap that each index
 * in [0, n) comes out exactly once. */
static void check_bijection(uint64_t n, uint64_t seed, uint64_t epoch) {
  perm_t perm;
  perm_init(&perm, n, seed, epoch);
  size_t words = (size_t)(n / 64 + 1);
  uint64_t *seen = calloc(words, sizeof *seen);
  assert_non_null(seen);
  for (uint64_t x = 0; x < n; x++) {
    uint64_t y = perm_apply(&perm, x);
    assert_true(y < n);
    uint64_t bit = UINT64_C(1) << (y % 64);
    assert_int_equal(seen[y / 64] & bit, 0); /* index y seen twice */
    seen[y / 64] |= bit;
  }
  for (uint64_t y = 0; y < n; y++)
    assert_true(seen[y / 64] & (UINT64_C(1) << (y % 64)));
  free(seen);
}

static void test_bijection_small_and_awkward(void **state) {
  (void)state;
  static const uint64_t primes[] = {2, 3, 5, 7, 11, 13, 97, 101, 997, 7919, 65521, 1000003};
  for (uint64_t n = 0; n <= 64; n++)
    check_bijection(n, 1, 0);
  for (size_t i = 0; i < sizeof primes / sizeof primes[0]; i++)
    check_bijection(primes[i], 42, 3);
  for (unsigned k = 2; k <= 20; k++) {
    check_bijection((UINT64_C(1) << k) - 1, 7, k);
    check_bijection(UINT64_C(1) << k, 7, k);
    check_bijection((UINT64_C(1) << k) + 1, 7, k);
  }
}

static void test_bijection_ten_million(void **state) {
  (void)state;
  check_bijection(10000000, 20240601, 5);
}

static void test_inverse(void **state) {
  (void)state;
  static const uint64_t sizes[] = {1, 2, 3, 17, 1000, 65537, UINT64_C(1) << 33, UINT64_MAX};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    perm_t perm;
    perm_init(&perm, sizes[i], 99, 1);
    for (uint64_t x = 0; x < 1000 && x < sizes[i]; x++) {
      uint64_t position = (x * UINT64_C(0x9e3779b97f4a7c15)) % sizes[i];
      assert_int_equal(perm_inverse(&perm, perm_apply(&perm, position)), position);
    }
  }
}

/* ---- keys ----------------------------------------------------------------- */

static int same_order(uint64_t n, uint64_t seed_a, uint64_t epoch_a, uint64_t seed_b,
                      uint64_t epoch_b) {
  perm_t a, b;
  perm_init(&a, n, seed_a, epoch_a);
  perm_init(&b, n, seed_b, epoch_b);
  for (uint64_t x = 0; x < n; x++)
    if (perm_apply(&a, x) != perm_apply(&b, x))
      return 0;
  return 1;
}

static void test_keys(void **state) {
  (void)state;
  assert_true(same_order(1000, 5, 2, 5, 2));
  for (uint64_t epoch = 1; epoch < 50; epoch++)
    assert_false(same_order(1000, 5, 0, 5, epoch));
  for (uint64_t seed = 1; seed < 50; seed++)
    assert_false(same_order(1000, 0, 3, seed, 3));
}

/* A shuffle of 100 has one fixed point on average; a weak mixing would show
 * many (or an identity).  Over 200 epochs the mean must stay near 1. */
static void test_mixing(void **state) {
  (void)state;
  uint64_t fixed = 0;
  for (uint64_t epoch = 0; epoch < 200; epoch++) {
    perm_t perm;
    perm_init(&perm, 100, 11, epoch);
    for (uint64_t x = 0; x < 100; x++)
      fixed += perm_apply(&perm, x) == x;
  }
  assert_true(fixed >= 100 && fixed <= 300);
}

/* ---- constant memory -------------------------------------------------------- */

static void test_constant_memory(void **state) {
  (void)state;
  /* A perm is a fixed-size value: nothing in it grows with n. */
  assert_true(sizeof(perm_t) <= 128);
  struct mallinfo2 before = mallinfo2();
  perm_t perm;
  perm_init(&perm, UINT64_C(1) << 47, 3, 4);
  uint64_t sum = 0;
  for (uint64_t x = 0; x < 100000; x++)
    sum += perm_apply(&perm, x * 1000003);
  struct mallinfo2 after = mallinfo2();
  assert_true(sum > 0);
  assert_int_equal(after.uordblks, before.uordblks); /* no heap allocation at all */
  perm_t copy = perm; /* values may be copied: the copy is the same permutation */
  assert_int_equal(perm_apply(&copy, 12345), perm_apply(&perm, 12345));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_golden_values),
      cmocka_unit_test(test_hash_golden),
      cmocka_unit_test(test_bijection_small_and_awkward),
      cmocka_unit_test(test_bijection_ten_million),
      cmocka_unit_test(test_inverse),
      cmocka_unit_test(test_keys),
      cmocka_unit_test(test_mixing),
      cmocka_unit_test(test_constant_memory),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
