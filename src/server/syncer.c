/*
 * syncer.c — the WAL flush thread.
 *
 * One thread, one flush at a time: the loop sets `requested` (and the
 * request's `then`) under the mutex and signals; the thread takes it, runs
 * fdatasync, counts a success in `succeeded`, runs `then` after a success
 * (the head's replies go out there), and writes the result (an int) into a
 * pipe whose read end is an event on the loop, so the done callback runs on
 * the loop thread and libevent needs no thread support.  A request made
 * while a flush runs waits in `requested` and is taken the moment that flush
 * ends, without the loop (syncer.h, "a second flush").  After a failure
 * every later request is answered with the same error, unflushed: what it
 * covers was written after pages the kernel may have dropped.  For tests, a
 * flush can be held while a file exists (syncer_hold_while).
 */
#include "syncer.h"
#include "log.h"

#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct syncer {
  int fd;                /* the file to flush (borrowed) */
  int pipe_fds[2];       /* thread -> loop: one int (errno or 0) per flush */
  struct event *done_ev; /* reads pipe_fds[0] on the loop */
  syncer_done_fn done;
  void *arg;
  unsigned outstanding; /* flushes requested whose result the loop has not read (0-2) */
  unsigned long heard;  /* results the loop has read */
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool requested, quit; /* under mu: a request the thread has not taken yet */
  int64_t taken_us;     /* under mu: when the thread took the last request taken */
  syncer_then_fn then;  /* under mu: runs after the requested flush, if it succeeded */
  void *then_arg;
  atomic_ulong succeeded; /* flushes that succeeded (before the loop hears of them) */
  char *hold_path;        /* tests only: flushes wait while it exists (syncer_hold_while) */
};

/* CLOCK_MONOTONIC in microseconds, the clock of metrics_now_us. */
static int64_t syncer_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* For tests only: holds the flush about to begin while s->hold_path exists,
 * as a disk that stalls would (checked every 10 ms), or until the syncer
 * stops: a head stopped during a hold is not kept waiting for the file. */
static void syncer_hold(syncer_t *s) {
  for (bool said = false;; said = true) {
    pthread_mutex_lock(&s->mu);
    bool quit = s->quit;
    pthread_mutex_unlock(&s->mu);
    if (quit || access(s->hold_path, F_OK) != 0)
      return;
    if (!said)
      log_msg(LOG_WARN, "a flush of the write-ahead log waits while %s exists (for tests only)",
              s->hold_path);
    struct timespec step = {0, 10 * 1000000L};
    nanosleep(&step, NULL);
  }
}

static void *syncer_main(void *arg) {
  syncer_t *s = arg;
  int err = 0; /* the first failure answers every later request */
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (!s->requested && !s->quit)
      pthread_cond_wait(&s->cv, &s->mu);
    if (!s->requested)
      break;
    s->requested = false;
    s->taken_us = syncer_now_us();
    syncer_then_fn then = s->then;
    void *then_arg = s->then_arg;
    pthread_mutex_unlock(&s->mu);
    if (s->hold_path != NULL)
      syncer_hold(s);
    if (err == 0)
      err = fdatasync(s->fd) == 0 ? 0 : errno;
    if (err == 0)
      atomic_fetch_add_explicit(&s->succeeded, 1, memory_order_release);
    if (err == 0 && then != NULL)
      then(then_arg);
    ssize_t n;
    do
      n = write(s->pipe_fds[1], &err, sizeof err);
    while (n < 0 && errno == EINTR);
    pthread_mutex_lock(&s->mu);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

static void syncer_on_done(evutil_socket_t fd, short what, void *arg) {
  syncer_t *s = arg;
  int err = 0;
  if (read(fd, &err, sizeof err) != (ssize_t)sizeof err)
    return; /* spurious wake-up: the int arrives whole or not at all */
  s->outstanding--;
  s->heard++;
  s->done(s->arg, err);
}

syncer_t *syncer_start(struct event_base *base, int fd, syncer_done_fn done, void *arg) {
  syncer_t *s = calloc(1, sizeof *s);
  if (s == NULL)
    return NULL;
  *s = (syncer_t){.fd = fd, .done = done, .arg = arg, .pipe_fds = {-1, -1}};
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  if (pipe2(s->pipe_fds, O_CLOEXEC) != 0 ||
      (s->done_ev = event_new(base, s->pipe_fds[0], EV_READ | EV_PERSIST, syncer_on_done, s)) ==
          NULL ||
      event_add(s->done_ev, NULL) != 0 || pthread_create(&s->thread, NULL, syncer_main, s) != 0) {
    log_msg(LOG_ERROR, "cannot start the WAL sync thread: %s", strerror(errno));
    if (s->done_ev)
      event_free(s->done_ev);
    for (int i = 0; i < 2; i++)
      if (s->pipe_fds[i] >= 0)
        close(s->pipe_fds[i]);
    free(s);
    return NULL;
  }
  return s;
}

void syncer_request(syncer_t *s, syncer_then_fn then, void *then_arg) {
  if (s->outstanding >= 2)
    abort(); /* the caller checks syncer_outstanding */
  s->outstanding++;
  pthread_mutex_lock(&s->mu);
  if (s->requested)
    abort(); /* one waits already: the caller checks syncer_waiting */
  s->requested = true;
  s->then = then;
  s->then_arg = then_arg;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

bool syncer_busy(const syncer_t *s) {
  return s->outstanding > 0;
}

unsigned syncer_outstanding(const syncer_t *s) {
  return s->outstanding;
}

bool syncer_waiting(syncer_t *s) {
  pthread_mutex_lock(&s->mu);
  bool waiting = s->requested;
  pthread_mutex_unlock(&s->mu);
  return waiting;
}

int64_t syncer_taken_us(syncer_t *s) {
  pthread_mutex_lock(&s->mu);
  int64_t taken = s->requested ? 0 : s->taken_us;
  pthread_mutex_unlock(&s->mu);
  return taken;
}

void syncer_hold_while(syncer_t *s, const char *path) {
  char *copy = strdup(path);
  if (copy == NULL)
    return; /* nothing is held: the test's hold never shows */
  pthread_mutex_lock(&s->mu);
  free(s->hold_path);
  s->hold_path = copy;
  pthread_mutex_unlock(&s->mu);
}

unsigned syncer_flushed(syncer_t *s) {
  unsigned long done = atomic_load_explicit(&s->succeeded, memory_order_acquire) - s->heard;
  /* After a failure the results heard outnumber the successes. */
  return done > s->outstanding ? 0 : (unsigned)done;
}

unsigned syncer_stop(syncer_t *s, int results[2]) {
  results[0] = results[1] = 0;
  if (s == NULL)
    return 0;
  pthread_mutex_lock(&s->mu);
  s->quit = true;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->thread, NULL); /* a flush in flight finishes first */
  unsigned count = s->outstanding;
  for (unsigned i = 0; i < count; i++) { /* the thread wrote them in order */
    if (read(s->pipe_fds[0], &results[i], sizeof results[i]) != (ssize_t)sizeof results[i])
      results[i] = EIO; /* the thread always writes its result: this cannot be */
  }
  event_free(s->done_ev);
  close(s->pipe_fds[0]);
  close(s->pipe_fds[1]);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  free(s->hold_path);
  free(s);
  return count;
}
