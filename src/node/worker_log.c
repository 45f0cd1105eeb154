/*
 * worker_log.c — the output of the agent's workers, one tagged line at a time.
 *
 * A worker process's stdout and stderr (the runner's own lines, and whatever
 * a plugin prints) go into one pipe per process; the agent reads it on its
 * loop and writes each line to its own stderr behind a tag naming the
 * worker: "worker 2 (gpu 1, pid 4242): muster worker: task 7 failed: ...".
 * Several workers writing to one terminal or journal could otherwise not be
 * told apart, and lines written at the same moment could be cut into each
 * other; each tagged line is one write of the agent's.
 *
 * A pipe outlives its process when something the worker started still holds
 * it (a command's guard finishing its kill, a daemon a plugin forked): it is
 * read, with the tag of the process it came from, until its end of file,
 * while the worker's next process writes into a pipe of its own.  A line
 * longer than WLOG_LINE_MAX is written in pieces, each tagged; a last line
 * without a newline is written when the pipe ends.  Everything runs on the
 * agent's event-loop thread.
 */
#include "node/agent.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WLOG_LINE_MAX 4096 /* bytes of a line written at once; a longer one is split */
/* Bytes read per wake-up: a worker that writes without a pause cannot keep
 * the loop from everything else. */
#define WLOG_BYTES_PER_TURN (64 << 10)
/* Bytes read at once from the pipe of a worker that ended, so that its last
 * lines come before the line about its end: all a pipe can hold when its
 * writer is unprivileged (fs.pipe-max-size, 1 MiB by default; the default
 * pipe holds 64 KiB), so a dead worker's is read to its end; the bound is for
 * a process the worker left behind that keeps writing into it. */
#define WLOG_BYTES_AT_END (1 << 20)

struct wlog {
  node_agent_t *agent;
  node_worker_t *worker; /* the worker whose current process writes into it; NULL after */
  int fd;                /* the pipe's read end (non-blocking) */
  struct event *ev;
  char tag[96]; /* "worker 2 (gpu 1, pid 4242)" */
  size_t len;   /* bytes of an unfinished line in buf */
  struct wlog *next;
  char buf[WLOG_LINE_MAX];
};

/* Writes `n` bytes of `line` (no newline) behind the tag, in one call. */
static void wlog_emit(const wlog_t *l, const char *line, size_t n) {
  fprintf(stderr, "%s: %.*s\n", l->tag, (int)n, line);
}

/* Writes the complete lines in l->buf, and the rest when it fills the buffer
 * (a line too long) or `all` (the pipe ended); keeps an unfinished line. */
static void wlog_lines(wlog_t *l, int all) {
  size_t at = 0;
  for (;;) {
    char *nl = memchr(l->buf + at, '\n', l->len - at);
    if (nl == NULL)
      break;
    wlog_emit(l, l->buf + at, (size_t)(nl - (l->buf + at)));
    at = (size_t)(nl - l->buf) + 1;
  }
  if (at < l->len && (all || (at == 0 && l->len == sizeof l->buf))) {
    wlog_emit(l, l->buf + at, l->len - at);
    at = l->len;
  }
  memmove(l->buf, l->buf + at, l->len - at);
  l->len -= at;
}

/* Unlinks `l` from the agent's list and frees it, its pipe closed. */
static void wlog_free(wlog_t *l) {
  for (wlog_t **at = &l->agent->wlogs; *at; at = &(*at)->next)
    if (*at == l) {
      *at = l->next;
      break;
    }
  if (l->worker)
    l->worker->log = NULL;
  if (l->ev)
    event_free(l->ev);
  close(l->fd);
  free(l);
}

/* Reads what the pipe holds now, at most `most` bytes (the event comes again
 * for the rest); at its end (or an error) writes the last line and frees
 * `l`.  Returns 0 while the pipe is open, -1 once freed. */
static int wlog_read(wlog_t *l, size_t most) {
  for (size_t got = 0; got < most;) {
    ssize_t n = read(l->fd, l->buf + l->len, sizeof l->buf - l->len);
    if (n > 0) {
      got += (size_t)n;
      l->len += (size_t)n;
      wlog_lines(l, 0);
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return 0;
    wlog_lines(l, 1);
    wlog_free(l);
    return -1;
  }
  return 0;
}

static void wlog_on_read(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  wlog_read(arg, WLOG_BYTES_PER_TURN);
}

int wlog_open(node_worker_t *w, int *write_fd) {
  node_agent_t *a = w->agent;
  int fds[2];
  wlog_t *l = calloc(1, sizeof *l);
  if (l == NULL || pipe2(fds, O_CLOEXEC) != 0) {
    free(l);
    return -1;
  }
  *l = (wlog_t){.agent = a, .worker = w, .fd = fds[0]};
  if (fcntl(fds[0], F_SETFL, O_NONBLOCK) != 0 ||
      (l->ev = event_new(a->base, fds[0], EV_READ | EV_PERSIST, wlog_on_read, l)) == NULL ||
      event_add(l->ev, NULL) != 0) {
    if (l->ev)
      event_free(l->ev);
    close(fds[0]);
    close(fds[1]);
    free(l);
    return -1;
  }
  l->next = a->wlogs;
  a->wlogs = l;
  w->log = l;
  *write_fd = fds[1];
  return 0;
}

void wlog_started(node_worker_t *w) {
  wlog_t *l = w->log;
  if (l == NULL)
    return;
  char gpu[32] = "";
  if (w->gpu != NULL) {
    char label[24];
    snprintf(gpu, sizeof gpu, "gpu %s, ", gpu_label(w->gpu, label));
  }
  snprintf(l->tag, sizeof l->tag, "worker %d (%spid %d)", w->slot + 1, gpu, (int)w->pid);
}

void wlog_ended(node_worker_t *w) {
  wlog_t *l = w->log;
  if (l == NULL || wlog_read(l, WLOG_BYTES_AT_END) != 0)
    return;         /* freed at its end of file: nothing else held it */
  l->worker = NULL; /* read on until whatever still holds it lets go */
  w->log = NULL;
}

void wlog_free_all(node_agent_t *a) {
  while (a->wlogs != NULL) {
    wlog_t *l = a->wlogs;
    if (wlog_read(l, WLOG_BYTES_AT_END) ==
        0) { /* still held open: what came is written, the rest is lost */
      wlog_lines(l, 1);
      wlog_free(l);
    }
  }
}
