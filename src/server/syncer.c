/*
 * syncer.c — the WAL flush thread.
 *
 * One thread, one request at a time: the loop sets `requested` (and the
 * request's `then`) under the mutex and signals; the thread runs fdatasync,
 * marks a success in `flushed`, runs `then` after a success (the head's
 * replies go out there), and writes the result (an int) into a pipe whose
 * read end is an event on the loop, so the done callback runs on the loop
 * thread and libevent needs no thread support.
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
#include <unistd.h>

struct syncer {
  int fd;                 /* the file to flush (borrowed) */
  int pipe_fds[2];        /* thread -> loop: one int (errno or 0) per flush */
  struct event *done_ev;  /* reads pipe_fds[0] on the loop */
  syncer_done_fn done;
  void *arg;
  bool busy;              /* a flush was requested and its result not yet read */
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool requested, quit;   /* under mu */
  syncer_then_fn then;    /* under mu: runs after the requested flush, if it succeeded */
  void *then_arg;
  atomic_bool flushed;    /* the flush in flight succeeded (before the loop hears of it) */
};

static void *syncer_main(void *arg) {
  syncer_t *s = arg;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (!s->requested && !s->quit)
      pthread_cond_wait(&s->cv, &s->mu);
    if (!s->requested)
      break;
    s->requested = false;
    syncer_then_fn then = s->then;
    void *then_arg = s->then_arg;
    pthread_mutex_unlock(&s->mu);
    int err = fdatasync(s->fd) == 0 ? 0 : errno;
    if (err == 0)
      atomic_store_explicit(&s->flushed, true, memory_order_release);
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
  s->busy = false;
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
  s->busy = true;
  atomic_store_explicit(&s->flushed, false, memory_order_relaxed); /* the mutex orders it */
  pthread_mutex_lock(&s->mu);
  s->requested = true;
  s->then = then;
  s->then_arg = then_arg;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

bool syncer_busy(const syncer_t *s) {
  return s->busy;
}

bool syncer_flushed(syncer_t *s) {
  return s->busy && atomic_load_explicit(&s->flushed, memory_order_acquire);
}

int syncer_stop(syncer_t *s) {
  if (s == NULL)
    return 0;
  pthread_mutex_lock(&s->mu);
  s->quit = true;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->thread, NULL); /* a flush in flight finishes first */
  int err = 0;
  if (s->busy && read(s->pipe_fds[0], &err, sizeof err) != (ssize_t)sizeof err)
    err = EIO; /* the thread always writes its result: this cannot be */
  event_free(s->done_ev);
  close(s->pipe_fds[0]);
  close(s->pipe_fds[1]);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  free(s);
  return err;
}
