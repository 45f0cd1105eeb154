/*
 * plugin_check.c — `muster node --plugin` and `muster head --plugin` load the
 * plugin once at their start, as each worker will (worker_plugin_open), so
 * that a plugin no worker can load stops them there rather than failing every
 * worker, which the agent would restart for ever.
 *
 * The load runs in a child process: the plugin's constructors (a CUDA
 * runtime, threads of its own) must not run in the agent or the head, nor a
 * crash of them take either along.  It runs under a time limit, so that a
 * constructor that hangs (a driver that never answers) fails the start with
 * a line saying so instead of hanging it: 30 s by default, set in
 * milliseconds by MUSTER_PLUGIN_CHECK_TIMEOUT_MS.  The check ends when the
 * child exits, not when its pipe reaches its end: a constructor may fork a
 * daemon (a driver's helper) that keeps the pipe open long after the load.
 */
#include "cli/worker.h"
#include "core/knob.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PLUGIN_CHECK_DEFAULT_MS 30000
#define PLUGIN_CHECK_MAX_MS 3600000

/* The time limit of the check: MUSTER_PLUGIN_CHECK_TIMEOUT_MS when it is an
 * integer from 1 to PLUGIN_CHECK_MAX_MS, else the default (with a warning
 * for a value that is not one: a typo must not pass silently). */
static int64_t plugin_check_limit_ms(const char *prog) {
  const char *text = getenv("MUSTER_PLUGIN_CHECK_TIMEOUT_MS");
  if (text == NULL)
    return PLUGIN_CHECK_DEFAULT_MS;
  long long ms;
  if (knob_int(text, 1, PLUGIN_CHECK_MAX_MS, &ms))
    return ms;
  fprintf(stderr,
          "%s: MUSTER_PLUGIN_CHECK_TIMEOUT_MS='%.40s' is not a number of milliseconds from 1 "
          "to %d; the plugin check takes the default, %d s\n",
          prog, text, PLUGIN_CHECK_MAX_MS, PLUGIN_CHECK_DEFAULT_MS / 1000);
  return PLUGIN_CHECK_DEFAULT_MS;
}

static int64_t plugin_check_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* In the child: loads the plugin, writes why it cannot be loaded to `fd`,
 * and exits 0 when it can.  It dies with its parent, so a hanging load
 * never outlives the start that waits for it. */
static void plugin_check_child(const char *path, int fd) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  const muster_plugin_t *plugin;
  char line[1400];
  void *lib = worker_plugin_open(path, &plugin, line, sizeof line);
  if (lib == NULL && write(fd, line, strlen(line)) < 0)
    _exit(2);
  _exit(lib ? 0 : 1); /* no dlclose: the process ends */
}

/* The check's child and what it wrote so far. */
typedef struct {
  pid_t pid;
  int pidfd;   /* readable once the child exits; -1 where unsupported (before Linux 5.3) */
  int fd;      /* the pipe's read end; -1 after its end of file */
  char *why;   /* what the child wrote, NUL-terminated */
  size_t size; /* of `why` */
  size_t got;  /* bytes in `why` */
  int status;  /* the child's wait status, once reaped */
} plugin_check_t;

/* Reads what the pipe holds now (it is non-blocking) into c->why, dropping
 * what does not fit; closes it at its end of file. */
static void plugin_check_drain(plugin_check_t *c) {
  char spill[256];
  for (;;) {
    int room = c->got + 1 < c->size;
    ssize_t n = room ? read(c->fd, c->why + c->got, c->size - 1 - c->got)
                     : read(c->fd, spill, sizeof spill);
    if (n > 0) {
      c->got += room ? (size_t)n : 0;
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
      close(c->fd);
      c->fd = -1;
    }
    c->why[c->got] = '\0';
    return;
  }
}

/* Reaps the child if it has exited: 1 then (with c->status), else 0.  A
 * child already reaped elsewhere (ECHILD) counts as exited with status 0. */
static int plugin_check_reaped(plugin_check_t *c) {
  pid_t got;
  while ((got = waitpid(c->pid, &c->status, WNOHANG)) < 0 && errno == EINTR)
    ;
  if (got < 0)
    c->status = 0;
  return got != 0;
}

/*
 * Waits until the child exits or `limit_ms` pass, keeping what it writes in
 * c->why.  Returns 1 once it was reaped, 0 when the time ran out.  The end of
 * the pipe is not waited for: a daemon that the plugin's constructor forked
 * holds a copy of the write end for as long as it lives, and all the child
 * wrote is in the pipe once it has exited.  Without a pidfd the exit is
 * looked for every 10 ms, as run_pump does.
 */
static int plugin_check_wait(plugin_check_t *c, int64_t limit_ms) {
  int64_t deadline = plugin_check_now_ms() + limit_ms;
  for (;;) {
    if (plugin_check_reaped(c)) {
      if (c->fd >= 0)
        plugin_check_drain(c);
      return 1;
    }
    int64_t left = deadline - plugin_check_now_ms();
    if (left <= 0)
      return 0;
    if (c->pidfd < 0 && left > 10)
      left = 10;
    struct pollfd p[2] = {{.fd = c->fd, .events = POLLIN}, {.fd = c->pidfd, .events = POLLIN}};
    if (poll(p, 2, (int)left) > 0 && c->fd >= 0 && p[0].revents != 0)
      plugin_check_drain(c);
  }
}

/* `why` for a child that wrote nothing: 0 when it exited 0, else -1 with
 * `why` saying how the load ended. */
static int plugin_check_status(const char *path, int status, char *why, size_t size) {
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
    return 0;
  if (WIFSIGNALED(status))
    snprintf(why, size, "plugin %s: loading it crashed (signal %d, %s)", path, WTERMSIG(status),
             strsignal(WTERMSIG(status)));
  else
    snprintf(why, size, "plugin %s: loading it failed (exit status %d)", path, WEXITSTATUS(status));
  return -1;
}

int worker_plugin_check(const char *prog, const char *path, char *why, size_t size) {
  int64_t limit_ms = plugin_check_limit_ms(prog);
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    snprintf(why, size, "cannot check plugin %s: %s", path, strerror(errno));
    return -1;
  }
  fflush(NULL); /* nothing buffered is written twice */
  pid_t pid = fork();
  if (pid == 0)
    plugin_check_child(path, fds[1]);
  close(fds[1]);
  if (pid < 0) {
    snprintf(why, size, "cannot check plugin %s: %s", path, strerror(errno));
    close(fds[0]);
    return -1;
  }
  fcntl(fds[0], F_SETFL, O_NONBLOCK);
  why[0] = '\0';
  plugin_check_t c = {.pid = pid, .pidfd = -1, .fd = fds[0], .why = why, .size = size};
#ifdef SYS_pidfd_open
  c.pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
#endif
  int ended = plugin_check_wait(&c, limit_ms);
  if (!ended) { /* it hangs: it is not waited for longer */
    kill(pid, SIGKILL);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
      ;
    snprintf(why, size,
             "plugin %s: loading it did not end within %g s (a constructor or muster_plugin() "
             "that hangs?); MUSTER_PLUGIN_CHECK_TIMEOUT_MS sets the limit in milliseconds",
             path, (double)limit_ms / 1000);
  }
  if (c.fd >= 0)
    close(c.fd);
  if (c.pidfd >= 0)
    close(c.pidfd);
  if (!ended || c.got > 0) /* timed out, or the child said why it cannot load the plugin */
    return -1;
  return plugin_check_status(path, c.status, why, size);
}
