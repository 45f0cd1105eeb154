/*
 * bench_util.h — clocks and latency samples shared by the load generators in bench/.
 *
 * CMake turns every bench/ source file into its own executable, so code shared between
 * benchmarks lives in headers as static inline functions rather than in a .c
 * file of its own.  Nothing here allocates behind the caller's back: a sample
 * set owns its array and bench_samples_free releases it.
 */
#ifndef MUSTER_BENCH_UTIL_H
#define MUSTER_BENCH_UTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Monotonic time in nanoseconds; only differences mean anything. */
static inline int64_t bench_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Sleeps for `ms` milliseconds, resuming after signals. */
static inline void bench_sleep_ms(int64_t ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

/* Sleeps for `ns` nanoseconds, resuming after signals. */
static inline void bench_sleep_ns(int64_t ns) {
  struct timespec ts = {(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

/* A growable array of durations in nanoseconds (one per measured request). */
typedef struct {
  int64_t *ns;  /* the samples; sorted after bench_samples_sort */
  size_t count; /* samples held */
  size_t cap;   /* capacity of ns */
} bench_samples_t;

/* Appends one duration.  Returns 0, or -1 when memory runs out (the set is unchanged). */
static inline int bench_samples_add(bench_samples_t *set, int64_t ns) {
  if (set->count == set->cap) {
    size_t cap = set->cap ? set->cap * 2 : 4096;
    int64_t *grown = realloc(set->ns, cap * sizeof *grown);
    if (!grown)
      return -1;
    set->ns = grown;
    set->cap = cap;
  }
  set->ns[set->count++] = ns;
  return 0;
}

/* Appends every sample of `src` to `dst`.  Returns 0, or -1 when memory runs out. */
static inline int bench_samples_merge(bench_samples_t *dst, const bench_samples_t *src) {
  for (size_t i = 0; i < src->count; i++)
    if (bench_samples_add(dst, src->ns[i]) != 0)
      return -1;
  return 0;
}

static inline int bench_samples_cmp(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

static inline void bench_samples_sort(bench_samples_t *set) {
  if (set->count > 1)
    qsort(set->ns, set->count, sizeof *set->ns, bench_samples_cmp);
}

/*
 * The `fraction` quantile (0.5 for p50, 0.99 for p99) of a set sorted with
 * bench_samples_sort, by the nearest-rank method; 0 for an empty set.
 */
static inline int64_t bench_samples_quantile(const bench_samples_t *set, double fraction) {
  if (set->count == 0)
    return 0;
  double exact = fraction * (double)set->count;
  size_t rank = (size_t)exact;
  if ((double)rank < exact)
    rank++; /* ceil(fraction * count) without libm */
  if (rank < 1)
    rank = 1;
  if (rank > set->count)
    rank = set->count;
  return set->ns[rank - 1];
}

static inline void bench_samples_free(bench_samples_t *set) {
  free(set->ns);
  memset(set, 0, sizeof *set);
}

#endif /* MUSTER_BENCH_UTIL_H */
