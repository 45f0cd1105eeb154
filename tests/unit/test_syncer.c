/*
 * test_syncer.c — unit tests of the WAL flush thread (syncer.c): after a
 * flush that succeeded, the thread runs the caller's `then` and says the
 * flush succeeded (syncer_flushed) before the loop hears of it; the loop's
 * done callback gets the result and the syncer is idle again; a flush that
 * fails runs nothing after it, never reads as flushed, and reports its
 * errno; stopping with flushes in flight gives each its own result; a
 * second flush requested while one runs starts the moment the first ends,
 * before the loop hears of the first.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "server/syncer.h"

typedef struct {
  struct event_base *base;
  char path[64];
  int file_fd;     /* a file: fdatasync succeeds */
  int pipe_fds[2]; /* a pipe: fdatasync fails with EINVAL */
  int done_calls, done_err;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int then_calls; /* under mu */
  bool gate_open; /* under mu: on_gated_then returns */
  bool gate_held; /* under mu: on_gated_then was entered (the flush before it succeeded) */
} env_t;

static void on_done(void *arg, int err) {
  env_t *e = arg;
  e->done_calls++;
  e->done_err = err;
}

static void on_then(void *arg) {
  env_t *e = arg;
  pthread_mutex_lock(&e->mu);
  e->then_calls++;
  pthread_cond_signal(&e->cv);
  pthread_mutex_unlock(&e->mu);
}

/* A `then` that holds the flush thread until the test opens the gate. */
static void on_gated_then(void *arg) {
  env_t *e = arg;
  pthread_mutex_lock(&e->mu);
  e->gate_held = true;
  pthread_cond_broadcast(&e->cv);
  while (!e->gate_open)
    pthread_cond_wait(&e->cv, &e->mu);
  e->then_calls++;
  pthread_cond_broadcast(&e->cv);
  pthread_mutex_unlock(&e->mu);
}

static void open_gate(env_t *e) {
  pthread_mutex_lock(&e->mu);
  e->gate_open = true;
  pthread_cond_broadcast(&e->cv);
  pthread_mutex_unlock(&e->mu);
}

/* Waits until the flush thread is held in on_gated_then: its flush is done. */
static void wait_gate_held(env_t *e) {
  pthread_mutex_lock(&e->mu);
  while (!e->gate_held)
    pthread_cond_wait(&e->cv, &e->mu);
  pthread_mutex_unlock(&e->mu);
}

static void wait_then_calls(env_t *e, int n) {
  pthread_mutex_lock(&e->mu);
  while (e->then_calls < n)
    pthread_cond_wait(&e->cv, &e->mu);
  pthread_mutex_unlock(&e->mu);
}

static int then_calls(env_t *e) {
  pthread_mutex_lock(&e->mu);
  int n = e->then_calls;
  pthread_mutex_unlock(&e->mu);
  return n;
}

/* Runs the loop until the done callback ran `n` times in all. */
static void wait_done(env_t *e, int n) {
  for (int turns = 0; e->done_calls < n; turns++) {
    assert_true(turns < 100);
    event_base_loop(e->base, EVLOOP_ONCE);
  }
}

/* Stops `s`; the number of flushes it waited for, their results in results[]. */
static unsigned stop(syncer_t *s, int results[2]) {
  results[0] = results[1] = -1;
  return syncer_stop(s, results);
}

static int setup(void **state) {
  env_t *e = calloc(1, sizeof *e);
  e->base = event_base_new();
  snprintf(e->path, sizeof e->path, "/tmp/muster-syncer-XXXXXX");
  e->file_fd = mkstemp(e->path);
  assert_true(e->file_fd >= 0);
  assert_int_equal(write(e->file_fd, "x", 1), 1);
  assert_int_equal(pipe(e->pipe_fds), 0);
  pthread_mutex_init(&e->mu, NULL);
  pthread_cond_init(&e->cv, NULL);
  *state = e;
  return 0;
}

static int teardown(void **state) {
  env_t *e = *state;
  close(e->file_fd);
  unlink(e->path);
  close(e->pipe_fds[0]);
  close(e->pipe_fds[1]);
  event_base_free(e->base);
  pthread_mutex_destroy(&e->mu);
  pthread_cond_destroy(&e->cv);
  free(e);
  return 0;
}

static void test_then_runs_before_the_loop_hears(void **state) {
  env_t *e = *state;
  syncer_t *s = syncer_start(e->base, e->file_fd, on_done, e);
  assert_non_null(s);
  assert_false(syncer_flushed(s));
  for (int round = 1; round <= 3; round++) {
    syncer_request(s, on_then, e);
    assert_true(syncer_busy(s));
    pthread_mutex_lock(&e->mu);
    while (e->then_calls < round)
      pthread_cond_wait(&e->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
    /* The thread is past the flush; the loop has not run yet. */
    assert_true(syncer_flushed(s));
    assert_true(syncer_busy(s));
    assert_int_equal(e->done_calls, round - 1);
    wait_done(e, round);
    assert_int_equal(e->done_err, 0);
    assert_false(syncer_busy(s));
    assert_false(syncer_flushed(s));
  }
  /* Without a `then`: only the done callback. */
  syncer_request(s, NULL, NULL);
  wait_done(e, 4);
  assert_int_equal(e->done_err, 0);
  assert_int_equal(then_calls(e), 3);
  int results[2];
  assert_int_equal(stop(s, results), 0);
}

static void test_a_failed_flush_runs_nothing_after_it(void **state) {
  env_t *e = *state;
  syncer_t *s = syncer_start(e->base, e->pipe_fds[0], on_done, e);
  assert_non_null(s);
  syncer_request(s, on_then, e);
  wait_done(e, 1);
  assert_int_equal(e->done_err, EINVAL);
  assert_int_equal(then_calls(e), 0);
  assert_false(syncer_flushed(s));
  assert_false(syncer_busy(s));
  int results[2];
  assert_int_equal(stop(s, results), 0); /* none in flight */
}

static void test_stop_returns_the_flush_in_flight(void **state) {
  env_t *e = *state;
  syncer_t *s = syncer_start(e->base, e->pipe_fds[0], on_done, e);
  syncer_request(s, on_then, e);
  int results[2];
  assert_int_equal(stop(s, results), 1);
  assert_int_equal(results[0], EINVAL);
  s = syncer_start(e->base, e->file_fd, on_done, e);
  syncer_request(s, on_then, e);
  assert_int_equal(stop(s, results), 1);
  assert_int_equal(results[0], 0);
  assert_int_equal(then_calls(e), 1); /* it ran before the stop returned */
  assert_int_equal(e->done_calls, 0); /* the loop never heard of either */
}

static void test_a_second_flush_starts_without_the_loop(void **state) {
  env_t *e = *state;
  syncer_t *s = syncer_start(e->base, e->file_fd, on_done, e);
  assert_non_null(s);
  syncer_request(s, on_gated_then, e);
  /* The thread flushed the first request and is held in its `then`: the
   * second waits behind it, untaken.  (Waiting only until the first was
   * taken left its flush racing the count below.) */
  wait_gate_held(e);
  syncer_request(s, on_then, e);
  assert_int_equal(syncer_outstanding(s), 2);
  assert_true(syncer_waiting(s));
  assert_int_equal(syncer_flushed(s), 1);  /* the first, which the loop has not heard of */
  assert_int_equal(syncer_taken_us(s), 0); /* the last request is untaken */
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  int64_t opened_us = (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
  open_gate(e);
  /* Both flushes end while the loop does not run: the thread took the
   * second the moment the first ended. */
  wait_then_calls(e, 2);
  assert_false(syncer_waiting(s));
  assert_true(syncer_taken_us(s) >= opened_us); /* when the second began */
  assert_int_equal(syncer_flushed(s), 2);
  assert_int_equal(e->done_calls, 0);
  wait_done(e, 1);
  assert_int_equal(syncer_outstanding(s), 1);
  assert_int_equal(syncer_flushed(s), 1);
  wait_done(e, 2);
  assert_int_equal(e->done_err, 0);
  assert_false(syncer_busy(s));
  int results[2];
  assert_int_equal(stop(s, results), 0);
}

static void test_stop_waits_for_both_flushes(void **state) {
  env_t *e = *state;
  syncer_t *s = syncer_start(e->base, e->file_fd, on_done, e);
  syncer_request(s, on_gated_then, e);
  wait_gate_held(e);
  syncer_request(s, on_then, e);
  open_gate(e);
  int results[2];
  assert_int_equal(stop(s, results), 2);
  assert_int_equal(results[0], 0);
  assert_int_equal(results[1], 0);
  assert_int_equal(then_calls(e), 2); /* both ran before the stop returned */
  assert_int_equal(e->done_calls, 0);
}

/* The first of two flushes succeeds, the second fails (its descriptor made a
 * pipe while the thread was held after the first): the stop tells each its
 * own result, so the first's writes are not reported lost. */
static void test_stop_tells_each_flush_its_result(void **state) {
  env_t *e = *state;
  int fd = dup(e->file_fd);
  syncer_t *s = syncer_start(e->base, fd, on_done, e);
  syncer_request(s, on_gated_then, e);
  wait_gate_held(e); /* the first flush is done: the thread waits in its `then` */
  syncer_request(s, on_then, e);
  assert_int_equal(dup2(e->pipe_fds[0], fd), fd);
  open_gate(e);
  int results[2];
  assert_int_equal(stop(s, results), 2);
  assert_int_equal(results[0], 0);
  assert_int_equal(results[1], EINVAL);
  assert_int_equal(then_calls(e), 1); /* nothing runs after the failed one */
  assert_int_equal(e->done_calls, 0);
  close(fd);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_then_runs_before_the_loop_hears, setup, teardown),
      cmocka_unit_test_setup_teardown(test_a_failed_flush_runs_nothing_after_it, setup, teardown),
      cmocka_unit_test_setup_teardown(test_stop_returns_the_flush_in_flight, setup, teardown),
      cmocka_unit_test_setup_teardown(test_a_second_flush_starts_without_the_loop, setup, teardown),
      cmocka_unit_test_setup_teardown(test_stop_waits_for_both_flushes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_stop_tells_each_flush_its_result, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
