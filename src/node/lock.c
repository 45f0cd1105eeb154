/*
 * lock.c — one node agent per machine, and what the last one left behind.
 *
 * The agent holds flock(LOCK_EX) on a well-known file for its whole life.  The
 * kernel drops the lock when the process dies, however it dies, so a stale
 * file never blocks a new agent.  The file's text says who holds it (pid,
 * head, address), so a second agent can name the running one.  The file is
 * opened close-on-exec and the supervisor closes every other descriptor in
 * its children, so a worker process never inherits (and never keeps) the lock.
 *
 * The text also carries the holder's `instance` (the id it registers with),
 * and node_lock_describe() adds where it was written: the kernel's boot id and
 * the file's device and inode.  Whoever takes the lock next knows the writer is
 * dead; when boot id and inode match, the writer ran on this machine's kernel
 * against this very file (not a copy, not a file shared with another machine
 * whose locks this kernel does not see), so its instance names a dead agent
 * (node_lock_previous), which the head may hand the node over from at once.
 */
#include "node/node.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define LOCK_TEXT_MAX 2048

/* Reads the file's text (at most LOCK_TEXT_MAX - 1 bytes) into `text`. */
static void lock_read_text(int fd, char *text) {
  ssize_t n = pread(fd, text, LOCK_TEXT_MAX - 1, 0);
  text[n > 0 ? n : 0] = '\0';
}

/* True for the lines that are for the next agent, not for people. */
static int lock_line_is_private(const char *line) {
  static const char *const keys[] = {"instance ", "previous_instance ", "boot ", "inode ", NULL};
  for (const char *const *k = keys; *k; k++)
    if (strncmp(line, *k, strlen(*k)) == 0)
      return 1;
  return 0;
}

/* Reads the holder's description into `buf` as one line ("pid 12, ..."). */
static void lock_read_holder(int fd, char *buf, size_t size) {
  char text[LOCK_TEXT_MAX];
  lock_read_text(fd, text);
  size_t at = 0;
  buf[0] = '\0';
  for (char *line = strtok(text, "\n"); line && at + 2 < size; line = strtok(NULL, "\n"))
    if (!lock_line_is_private(line))
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
    snprintf(err, err_size, "another node agent is already running on this machine (%s; lock %s)",
             holder, path);
    close(fd);
    return NODE_LOCK_BUSY;
  }
  if ((fcntl(fd, F_GETFL) & O_ACCMODE) == O_RDONLY) {
    snprintf(err, err_size, "cannot write the agent lock %s (owned by another user)", path);
    close(fd);
    return -1;
  }
  return fd;
}

/* The lines node_lock_describe() appends, "boot ID\ninode DEV:INO\n": the
 * running kernel's boot id and the file's device and inode; "" when the boot
 * id cannot be read (then no successor trusts the file's instance). */
static void lock_origin(int fd, char *buf, size_t size) {
  char boot[64] = "";
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
  if (f && fgets(boot, sizeof boot, f))
    boot[strcspn(boot, "\n")] = '\0';
  if (f)
    fclose(f);
  struct stat st;
  buf[0] = '\0';
  if (boot[0] && fstat(fd, &st) == 0)
    snprintf(buf, size, "boot %s\ninode %llu:%llu\n", boot, (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino);
}

/* The value of line "KEY value" in `text` (copied into `buf`), or "". */
static void lock_value(const char *text, const char *key, char *buf, size_t size) {
  size_t key_len = strlen(key);
  buf[0] = '\0';
  for (const char *line = text; *line;) {
    size_t len = strcspn(line, "\n");
    if (len > key_len && strncmp(line, key, key_len) == 0 && line[key_len] == ' ') {
      snprintf(buf, size, "%.*s", (int)(len - key_len - 1), line + key_len + 1);
      return;
    }
    line += len + (line[len] == '\n');
  }
}

void node_lock_previous(int fd, char *instance, size_t size) {
  char text[LOCK_TEXT_MAX], origin[256], boot[64], inode[64], here[256];
  lock_read_text(fd, text);
  lock_origin(fd, origin, sizeof origin);
  lock_value(text, "boot", boot, sizeof boot);
  lock_value(text, "inode", inode, sizeof inode);
  snprintf(here, sizeof here, "boot %s\ninode %s\n", boot, inode);
  instance[0] = '\0';
  if (origin[0] == '\0' || strcmp(origin, here) != 0)
    return; /* written elsewhere, or by an agent that wrote no origin */
  /* A holder that never got registered names the instance it inherited. */
  lock_value(text, "previous_instance", instance, size);
  if (instance[0] == '\0')
    lock_value(text, "instance", instance, size);
  size_t len = strlen(instance);
  if (len > 128 || strspn(instance, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                    "0123456789._-") != len)
    instance[0] = '\0'; /* not written by an agent */
}

void node_lock_describe(int fd, const char *info) {
  char text[LOCK_TEXT_MAX];
  size_t len = (size_t)snprintf(text, sizeof text, "%s", info);
  if (len < sizeof text)
    lock_origin(fd, text + len, sizeof text - len);
  len = strlen(text);
  /* Written over the old text, then cut to length: someone reading the file
   * meanwhile (a person, a script waiting for "listen") never finds it empty,
   * and pid and instance lead both texts unchanged. */
  if (pwrite(fd, text, len, 0) != (ssize_t)len || ftruncate(fd, (off_t)len) != 0)
    fprintf(stderr, "muster node: cannot write the agent lock file: %s\n", strerror(errno));
}

/* ---- a directory's lock (the cache dir's, the state dir's) ---------------- */

int node_dir_lock_take(const char *path, char *held_by, size_t size) {
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    return -1;
  if (flock(fd, LOCK_EX | LOCK_NB) == 0)
    return fd;
  int failure = errno;
  ssize_t n = pread(fd, held_by, size - 1, 0);
  held_by[n > 0 ? n : 0] = '\0';
  held_by[strcspn(held_by, "\n")] = '\0';
  if (held_by[0] == '\0')
    snprintf(held_by, size, "unknown");
  close(fd);
  if (failure != EWOULDBLOCK) {
    errno = failure;
    return -1;
  }
  return NODE_LOCK_BUSY;
}

bool node_dir_lock_note(int fd, const char *node) {
  char line[200];
  int len = snprintf(line, sizeof line, "pid %d, node %s\n", (int)getpid(), node);
  return ftruncate(fd, 0) == 0 && pwrite(fd, line, (size_t)len, 0) == len;
}
