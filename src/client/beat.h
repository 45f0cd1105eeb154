/*
 * beat.h — a thread that calls one function every period until it is
 * stopped: the heartbeat of a pool's session (pool.c) and of a worker
 * (muster_worker_beat_t, worker_beat.c).  The function runs on that thread,
 * so it must use a client handle of its own (handles are not thread-safe).
 */
#ifndef MUSTER_CLIENT_BEAT_H
#define MUSTER_CLIENT_BEAT_H

#include "muster.h"

#include <pthread.h>
#include <stdint.h>

typedef struct {
  void (*fn)(void *arg); /* called every period_ms, on the thread */
  void *arg;
  int64_t period_ms;
  pthread_t thread;
  pthread_mutex_t mu;  /* guards stop */
  pthread_cond_t cond; /* signalled by beat_stop, on CLOCK_MONOTONIC */
  int stop;            /* set by beat_stop */
  int running;         /* the thread was started and not yet joined */
} beat_t;

/* Starts calling fn(arg) every `period_ms` (> 0), the first call one period
 * from now.  MUSTER_OK, or MUSTER_NOMEM when the thread cannot start (then
 * nothing is left to stop). */
muster_err_t beat_start(beat_t *b, int64_t period_ms, void (*fn)(void *), void *arg);

/* Stops the thread and waits for a call in progress to return; does nothing
 * for a beat that was never started (zeroed) or is already stopped. */
void beat_stop(beat_t *b);

#endif
