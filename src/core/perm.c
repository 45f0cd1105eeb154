/*
 * perm.c — the keyed Feistel bijection with cycle walking (see perm.h for the
 * exact definition of version 1, which this file implements).
 *
 * Everything here is arithmetic on a perm_t the caller owns: no allocation, no
 * globals, safe to call from any number of threads on a shared const perm_t.
 * Bytes fed to the hash are built explicitly in little-endian order so that
 * outputs do not depend on the host's byte order.
 */
#include "core/perm.h"

#include <assert.h>
#include <stddef.h>

/* Inline xxHash: the same function as libxxhash (XXH3's output is frozen since
 * 0.8.0), but the compiler sees the 8-byte fast path, which matters when a
 * loader computes 10^9 positions. */
#define XXH_INLINE_ALL
#include <xxhash.h>

static void put_le64(unsigned char *out, uint64_t value) {
  for (int i = 0; i < 8; i++)
    out[i] = (unsigned char)(value >> (8 * i));
}

uint64_t perm_hash64(uint64_t value, uint64_t seed) {
  unsigned char bytes[8];
  put_le64(bytes, value);
  return XXH3_64bits_withSeed(bytes, sizeof bytes, seed);
}

/* Bits needed for the values 0..n-1, i.e. ceil(log2(n)) for n >= 1. */
static unsigned bits_for(uint64_t n) {
  unsigned bits = 0;
  if (n > 1)
    for (uint64_t rest = n - 1; rest != 0; rest >>= 1)
      bits++;
  return bits;
}

void perm_init(perm_t *perm, uint64_t n, uint64_t seed, uint64_t epoch) {
  assert(perm != NULL);
  unsigned bits = bits_for(n);
  unsigned half = (bits + 1) / 2;
  if (half < 1)
    half = 1;
  perm->n = n;
  perm->seed = seed;
  perm->epoch = epoch;
  perm->half_bits = half;
  perm->half_mask = (UINT64_C(1) << half) - 1; /* half <= 32 */
  for (unsigned i = 0; i < PERM_ROUNDS; i++) {
    unsigned char key_input[24];
    put_le64(key_input, n);
    put_le64(key_input + 8, epoch);
    put_le64(key_input + 16, i);
    perm->round_keys[i] = XXH3_64bits_withSeed(key_input, sizeof key_input, seed);
  }
}

static uint64_t round_fn(const perm_t *perm, unsigned round, uint64_t half) {
  return perm_hash64(half, perm->round_keys[round]) & perm->half_mask;
}

/* One pass of the Feistel network over [0, 2^(2k)). */
static uint64_t encrypt(const perm_t *perm, uint64_t x) {
  uint64_t left = x >> perm->half_bits;
  uint64_t right = x & perm->half_mask;
  for (unsigned i = 0; i < PERM_ROUNDS; i++) {
    uint64_t next_right = left ^ round_fn(perm, i, right);
    left = right;
    right = next_right;
  }
  return (left << perm->half_bits) | right;
}

/* The inverse of encrypt: the rounds undone in reverse order. */
static uint64_t decrypt(const perm_t *perm, uint64_t y) {
  uint64_t left = y >> perm->half_bits;
  uint64_t right = y & perm->half_mask;
  for (unsigned i = PERM_ROUNDS; i-- > 0;) {
    uint64_t prev_left = right ^ round_fn(perm, i, left);
    right = left;
    left = prev_left;
  }
  return (left << perm->half_bits) | right;
}

/*
 * Cycle walking: encrypt is a permutation of [0, 2^(2k)), so following its
 * cycle from a point inside [0, n) must come back inside [0, n); the first
 * point inside is the image.  Restricted this way it stays a bijection.
 */
uint64_t perm_apply(const perm_t *perm, uint64_t position) {
  assert(position < perm->n);
  if (perm->n <= 1)
    return position;
  uint64_t y = encrypt(perm, position);
  while (y >= perm->n)
    y = encrypt(perm, y);
  return y;
}

uint64_t perm_inverse(const perm_t *perm, uint64_t index) {
  assert(index < perm->n);
  if (perm->n <= 1)
    return index;
  uint64_t x = decrypt(perm, index);
  while (x >= perm->n)
    x = decrypt(perm, x);
  return x;
}
