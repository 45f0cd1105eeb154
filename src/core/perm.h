/*
 * perm.h — a keyed bijection over [0, n): the shuffle behind every iteration.
 *
 * A perm_t is a small value (no allocation, the same size for every n) that
 * maps a position in [0, n) to a distinct index in [0, n), in O(1) time and
 * memory.  It is a balanced Feistel network over the smallest even number of
 * bits 2k with 2^(2k) >= n, made to stay inside [0, n) by cycle walking: an
 * output that falls outside is encrypted again until it lands inside.  Since
 * 2^(2k) < 4n (for n >= 2), fewer than four walks are expected per position.
 *
 * The key is a pair of 64-bit words (seed, epoch): the same key and n give the
 * same permutation on every platform and forever, for the same
 * PERM_ALGORITHM_VERSION.  Different epochs give independent permutations.
 * Golden-value tests (tests/unit/test_perm.c) pin version 1; a change to any
 * output is a new version, never an edit of this one.
 *
 * Version 1, exactly (so that other implementations can reproduce it):
 *   - le64(v) is v as 8 little-endian bytes; H(bytes, s) is XXH3_64bits_withSeed.
 *   - k = max(1, ceil(log2(n)) rounded up to even / 2); mask = 2^k - 1.
 *   - round key i (0 <= i < PERM_ROUNDS): K_i = H(le64(n) le64(epoch) le64(i), seed).
 *   - round function F_i(r) = H(le64(r), K_i) & mask.
 *   - encrypt(x): L = x >> k, R = x & mask; for i in 0..ROUNDS-1:
 *       (L, R) = (R, L ^ F_i(R)); result (L << k) | R.
 *   - perm_apply(x): y = encrypt(x); while y >= n: y = encrypt(y).
 *   - n <= 1: the identity.
 */
#ifndef MUSTER_CORE_PERM_H
#define MUSTER_CORE_PERM_H

#include <stdint.h>

/* Bumped whenever any output of perm_apply changes; see the file comment. */
#define PERM_ALGORITHM_VERSION 1

/* Feistel rounds.  Four make a pseudo-random permutation in theory; six give
 * better mixing for the tiny halves of small domains, at 1.5x the cost. */
#define PERM_ROUNDS 6

typedef struct {
  uint64_t n;                       /* domain size: positions and outputs are in [0, n) */
  uint64_t seed;                    /* first key word, as given */
  uint64_t epoch;                   /* second key word, as given */
  unsigned half_bits;               /* k: bits in each Feistel half, 1..32 */
  uint64_t half_mask;               /* 2^k - 1 */
  uint64_t round_keys[PERM_ROUNDS]; /* K_i, derived from (n, seed, epoch) */
} perm_t;

/*
 * Sets *perm to the bijection over [0, n) keyed by (seed, epoch).  Every n is
 * valid, 0 included (a perm of 0 has no positions to apply).  Allocates
 * nothing; a perm_t needs no destroy and may be copied freely.
 */
void perm_init(perm_t *perm, uint64_t n, uint64_t seed, uint64_t epoch);

/* The index at `position`.  Precondition: position < perm->n.  O(1) expected
 * (fewer than 4 cycle walks on average, each PERM_ROUNDS hashes). */
uint64_t perm_apply(const perm_t *perm, uint64_t position);

/* The position whose index is `index`: perm_inverse(p, perm_apply(p, x)) == x.
 * Precondition: index < perm->n. */
uint64_t perm_inverse(const perm_t *perm, uint64_t index);

/*
 * The one stable 64-bit hash of iterations: XXH3_64bits_withSeed of the 8
 * little-endian bytes of `value`.  Partitioning by hash and key derivation use
 * it, so its output is part of the versioned contract.
 */
uint64_t perm_hash64(uint64_t value, uint64_t seed);

#endif
