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
 * milliseconds by MUSTER_PLUGIN_CHECK_TIMEOUT_MS.
 */
#include "cli/worker.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
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
  char *end;
  errno = 0;
  long long ms = strtoll(text, &end, 10);
  if (end != text && *end == '\0' && errno == 0 && ms >= 1 && ms <= PLUGIN_CHECK_MAX_MS)
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

/* Reads what the child writes to `fd` into `why` until it closes its end or
 * `limit_ms` pass; returns the bytes read, or -1 when the time ran out. */
static long plugin_check_read(int fd, int64_t limit_ms, char *why, size_t size) {
  int64_t deadline = plugin_check_now_ms() + limit_ms;
  size_t got = 0;
  for (;;) {
    int64_t left = deadline - plugin_check_now_ms();
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int ready = left > 0 ? poll(&p, 1, (int)left) : 0;
    if (ready == 0)
      return -1;
    if (ready < 0 && errno == EINTR)
      continue;
    ssize_t n = ready < 0 || got + 1 >= size ? 0 : read(fd, why + got, size - 1 - got);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    got += (size_t)n;
  }
  why[got] = '\0';
  return (long)got;
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
  long got = pid > 0 ? plugin_check_read(fds[0], limit_ms, why, size) : 0;
  close(fds[0]);
  if (pid < 0) {
    snprintf(why, size, "cannot check plugin %s: %s", path, strerror(errno));
    return -1;
  }
  if (got < 0)
    kill(pid, SIGKILL); /* it hangs: it is not waited for longer */
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
    ;
  if (got < 0)
    snprintf(why, size,
             "plugin %s: loading it did not end within %g s (a constructor or muster_plugin() "
             "that hangs?); MUSTER_PLUGIN_CHECK_TIMEOUT_MS sets the limit in milliseconds",
             path, (double)limit_ms / 1000);
  if (got != 0) /* timed out, or the child said why it cannot load the plugin */
    return -1;
  return plugin_check_status(path, status, why, size);
}
