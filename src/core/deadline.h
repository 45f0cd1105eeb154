/*
 * deadline.h — a CLOCK_MONOTONIC deadline `ms` from now, for
 * pthread_cond_timedwait on a condition variable whose clock is
 * CLOCK_MONOTONIC (the worker's heartbeat thread, the node agent's
 * background thread).
 */
#ifndef MUSTER_CORE_DEADLINE_H
#define MUSTER_CORE_DEADLINE_H

#include <stdint.h>
#include <time.h>

static inline struct timespec deadline_in_ms(int64_t ms) {
  struct timespec at;
  clock_gettime(CLOCK_MONOTONIC, &at);
  at.tv_sec += (time_t)(ms / 1000);
  at.tv_nsec += (long)(ms % 1000) * 1000000L;
  if (at.tv_nsec >= 1000000000L) {
    at.tv_sec++;
    at.tv_nsec -= 1000000000L;
  }
  return at;
}

#endif
