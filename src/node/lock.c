/*
 * lock.c — one node agent per machine.
 *
 * The agent holds flock(LOCK_EX) on a well-known file for its whole life.  The
 * kernel drops the lock when the process dies, however it dies, so a stale
 * file never blocks a new agent.  The file's text says who holds it (pid,
 * head, address), so a second agent can name the running one.  The file is
 * opened close-on-exec and the supervisor closes every other descriptor in
 * its children, so a worker process never inherits (and never keeps) the lock.
 */
#include "node/node.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

/* Reads the holder's description into `buf` as one line ("pid 12, ..."). */
static void lock_read_holder(int fd, char *buf, size_t size) {
  char text[1024];
  ssize_t n = pread(fd, text, sizeof text - 1, 0);
  text[n > 0 ? n : 0] = '\0';
  size_t at = 0;
  buf[0] = '\0';
  for (char *line = strtok(text, "\n"); line && at + 2 < size; line = strtok(NULL, "\n"))
    at += (size_t)snprintf(buf + at, size - at, "%s%s", at ? ", " : "", line);
  if (buf[0] == '\0')
    snprintf(buf, size, "pid unknown");
}

int node_lock_take(const char *path, char *err, size_t err_size) {
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0 && errno == EACCES)
    fd = open(path, O_RDONLY | O_CLOEXEC); /* another user's file: enough to test the lock */
  if (fd < 0) {
    snprintf(err, err_size, "cannot open the agent lock %s: %s", path, strerror(errno));
    return -1;
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    char holder[600];
    lock_read_holder(fd, holder, sizeof holder);
    snprintf(err, err_size,
             "another node agent is already running on this machine (%s; lock %s); "
             "stop it first: one agent per machine",
             holder, path);
    close(fd);
    return -1;
  }
  if ((fcntl(fd, F_GETFL) & O_ACCMODE) == O_RDONLY) {
    snprintf(err, err_size, "cannot write the agent lock %s (owned by another user)", path);
    close(fd);
    return -1;
  }
  char pid[32];
  snprintf(pid, sizeof pid, "pid %d\n", (int)getpid());
  node_lock_describe(fd, pid);
  return fd;
}

void node_lock_describe(int fd, const char *info) {
  size_t len = strlen(info);
  if (ftruncate(fd, 0) != 0 || pwrite(fd, info, len, 0) != (ssize_t)len)
    fprintf(stderr, "muster node: cannot write the agent lock file: %s\n", strerror(errno));
}
