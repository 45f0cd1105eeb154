/*
 * beat.c — the heartbeat thread of pools and workers (beat.h).
 *
 * The thread sleeps on a condition variable rather than in nanosleep so that
 * beat_stop wakes it at once: a pool closed or a worker stopped does not
 * wait out a period of up to minutes.  The clock is CLOCK_MONOTONIC, so a
 * wall clock set back does not hold a heartbeat back.
 */
#include "client/beat.h"

#include <string.h>
#include <time.h>

/* Waits until `period_ms` from now or until told to stop, with `b->mu`
 * held; non-zero when told to stop. */
static int beat_wait(beat_t *b) {
  struct timespec until;
  clock_gettime(CLOCK_MONOTONIC, &until);
  int64_t ns = (int64_t)until.tv_nsec + (b->period_ms % 1000) * 1000000;
  until.tv_sec += (time_t)(b->period_ms / 1000 + ns / 1000000000);
  until.tv_nsec = (long)(ns % 1000000000);
  int timed_out = 0;
  while (!b->stop && !timed_out)
    timed_out = pthread_cond_timedwait(&b->cond, &b->mu, &until) != 0;
  return b->stop;
}

static void *beat_main(void *arg) {
  beat_t *b = arg;
  pthread_mutex_lock(&b->mu);
  while (!beat_wait(b)) {
    pthread_mutex_unlock(&b->mu);
    b->fn(b->arg);
    pthread_mutex_lock(&b->mu);
  }
  pthread_mutex_unlock(&b->mu);
  return NULL;
}

muster_err_t beat_start(beat_t *b, int64_t period_ms, void (*fn)(void *), void *arg) {
  memset(b, 0, sizeof *b);
  b->fn = fn;
  b->arg = arg;
  b->period_ms = period_ms;
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&b->cond, &attr);
  pthread_condattr_destroy(&attr);
  pthread_mutex_init(&b->mu, NULL);
  if (pthread_create(&b->thread, NULL, beat_main, b) != 0) {
    pthread_cond_destroy(&b->cond);
    pthread_mutex_destroy(&b->mu);
    return MUSTER_NOMEM;
  }
  b->running = 1;
  return MUSTER_OK;
}

void beat_stop(beat_t *b) {
  if (!b->running)
    return;
  pthread_mutex_lock(&b->mu);
  b->stop = 1;
  pthread_cond_signal(&b->cond);
  pthread_mutex_unlock(&b->mu);
  pthread_join(b->thread, NULL);
  pthread_cond_destroy(&b->cond);
  pthread_mutex_destroy(&b->mu);
  b->running = 0;
}
