/*
 * run.c — one child process per task, driven by poll(2).
 *
 * The child is a guard (run_guard.c) that runs the command and kills it, with
 * its process group, when the worker dies, even by `kill -9`.  The worker is
 * multi-threaded, so the guard calls only async-signal-safe functions; every
 * pipe is close-on-exec and the guard closes what it does not need, so one
 * slot's child never holds another slot's stdin open.  The guard leads the
 * command's own process group, so a terminal's Ctrl-C reaches only the worker
 * (which then lets running commands finish), and so a kill reaches the
 * command's own children too.  The command's signal mask and dispositions
 * are reset to defaults.
 *
 * run_pump() waits on the pipes and on a pidfd (Linux 5.3+) that becomes
 * readable when the child exits.  Once the child is reaped, whatever it wrote
 * is already in the pipes, so they are drained without waiting for EOF: a
 * background grandchild that inherited them cannot stall the task.
 */
#include "cli/run.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long run_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

static void run_close(int *fd) {
  if (*fd >= 0)
    close(*fd);
  *fd = -1;
}

/* Non-zero when `path` is a regular file this process may execute. */
static int run_executable(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

/* Says why `path` (a name with a '/') cannot be exec'd. */
static void run_explain_path(const char *path, char *err, size_t err_size) {
  struct stat st;
  if (stat(path, &st) != 0)
    snprintf(err, err_size, "cannot run '%s': %s", path, strerror(errno));
  else if (!S_ISREG(st.st_mode))
    snprintf(err, err_size, "cannot run '%s': not a regular file", path);
  else
    snprintf(err, err_size, "cannot run '%s': no execute permission (chmod +x it?)", path);
}

int run_resolve(const char *file, char *err, size_t err_size) {
  if (file == NULL || file[0] == '\0') {
    snprintf(err, err_size, "the command is empty");
    return -1;
  }
  if (strchr(file, '/') != NULL) {
    if (run_executable(file))
      return 0;
    run_explain_path(file, err, err_size);
    return -1;
  }
  char fallback[512] = "/bin:/usr/bin";
  const char *path = getenv("PATH");
  if (path == NULL && confstr(_CS_PATH, fallback, sizeof fallback) > sizeof fallback)
    snprintf(fallback, sizeof fallback, "/bin:/usr/bin");
  if (path == NULL)
    path = fallback;
  for (const char *dir = path;; dir++) {
    size_t len = strcspn(dir, ":");
    char candidate[4096];
    /* An empty entry means the current directory, as it does for execvp. */
    int n = snprintf(candidate, sizeof candidate, "%.*s%s%s", (int)len, dir, len ? "/" : "", file);
    if (n > 0 && (size_t)n < sizeof candidate && run_executable(candidate))
      return 0;
    dir += len;
    if (*dir == '\0')
      break;
  }
  snprintf(err, err_size,
           "cannot run '%s': no executable of that name in PATH (%.300s); give its full path "
           "or fix PATH",
           file, path);
  return -1;
}

int run_start(run_proc_t *proc, char *const argv[], char *const envp[], const char *input,
              size_t input_len, char *err, size_t err_size) {
  memset(proc, 0, sizeof *proc);
  proc->pidfd = proc->in_fd = proc->out_fd = proc->err_fd = -1;
  proc->input = input;
  proc->input_len = input_len;
  pthread_mutex_init(&proc->lock, NULL);
  int fds[3][2] = {{-1, -1}, {-1, -1}, {-1, -1}};
  for (int i = 0; i < 3; i++)
    if (pipe2(fds[i], O_CLOEXEC) != 0) {
      snprintf(err, err_size, "cannot create a pipe: %s", strerror(errno));
      goto fail;
    }
  const int child_stdio[3] = {fds[0][0], fds[1][1], fds[2][1]};
  int rc = run_guard_start(&proc->pid, argv, envp, child_stdio);
  if (rc != 0) {
    snprintf(err, err_size, "cannot run '%s': %s", argv[0], strerror(rc));
    goto fail;
  }
  close(fds[0][0]);
  close(fds[1][1]);
  close(fds[2][1]);
  proc->in_fd = fds[0][1];
  proc->out_fd = fds[1][0];
  proc->err_fd = fds[2][0];
  for (int i = 0; i < 3; i++)
    fcntl(i == 0 ? proc->in_fd : i == 1 ? proc->out_fd : proc->err_fd, F_SETFL, O_NONBLOCK);
#ifdef SYS_pidfd_open
  proc->pidfd = (int)syscall(SYS_pidfd_open, proc->pid, 0);
#endif
  return 0;
fail:
  for (int i = 0; i < 3; i++) {
    run_close(&fds[i][0]);
    run_close(&fds[i][1]);
  }
  pthread_mutex_destroy(&proc->lock);
  return -1;
}

/* Keeps stdout (up to RUN_OUT_MAX) in proc->out. */
static void run_keep_out(run_proc_t *proc, const char *data, size_t n) {
  if (proc->out_len + n > RUN_OUT_MAX) {
    proc->out_overflow = 1;
    return;
  }
  if (proc->out_len + n + 1 > proc->out_cap) {
    size_t cap = proc->out_cap ? proc->out_cap : 4096;
    while (cap < proc->out_len + n + 1)
      cap *= 2;
    char *grown = realloc(proc->out, cap);
    if (grown == NULL) {
      proc->out_overflow = 1;
      return;
    }
    proc->out = grown;
    proc->out_cap = cap;
  }
  memcpy(proc->out + proc->out_len, data, n);
  proc->out_len += n;
  proc->out[proc->out_len] = '\0';
}

/* Keeps the latest stderr bytes in proc->tail. */
static void run_keep_tail(run_proc_t *proc, const char *data, size_t n) {
  if (n >= RUN_TAIL_MAX) {
    memcpy(proc->tail, data + n - RUN_TAIL_MAX, RUN_TAIL_MAX);
    proc->tail_len = RUN_TAIL_MAX;
    return;
  }
  if (proc->tail_len + n > sizeof proc->tail) {
    size_t keep = RUN_TAIL_MAX - n;
    memmove(proc->tail, proc->tail + proc->tail_len - keep, keep);
    proc->tail_len = keep;
  }
  memcpy(proc->tail + proc->tail_len, data, n);
  proc->tail_len += n;
}

/* Reads what `*fd` has now; closes it at EOF or on an error. */
static void run_read(run_proc_t *proc, int *fd, int is_out) {
  char buf[16384];
  for (;;) {
    ssize_t n = read(*fd, buf, sizeof buf);
    if (n > 0) {
      if (is_out)
        run_keep_out(proc, buf, (size_t)n);
      else
        run_keep_tail(proc, buf, (size_t)n);
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
      run_close(fd);
    return;
  }
}

/* Writes as much input as the pipe takes; closes stdin when done or refused. */
static void run_write(run_proc_t *proc) {
  while (proc->input_off < proc->input_len) {
    ssize_t n =
        write(proc->in_fd, proc->input + proc->input_off, proc->input_len - proc->input_off);
    if (n > 0) {
      proc->input_off += (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return;
    break; /* EPIPE: the command does not read its input; that is its business */
  }
  run_close(&proc->in_fd);
}

/* Reaps the child if it has exited; then drains and closes its pipes. */
static void run_reap(run_proc_t *proc) {
  int status = 0;
  pthread_mutex_lock(&proc->lock);
  pid_t got = waitpid(proc->pid, &status, WNOHANG);
  if (got == proc->pid || (got < 0 && errno == ECHILD)) {
    proc->exited = 1;
    proc->status = got == proc->pid ? status : 0;
  }
  pthread_mutex_unlock(&proc->lock);
  if (!proc->exited)
    return;
  run_close(&proc->in_fd);
  run_close(&proc->pidfd);
  if (proc->out_fd >= 0)
    run_read(proc, &proc->out_fd, 1);
  if (proc->err_fd >= 0)
    run_read(proc, &proc->err_fd, 0);
  run_close(&proc->out_fd);
  run_close(&proc->err_fd);
}

int run_pump(run_proc_t *proc, long timeout_ms) {
  long deadline = run_now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
  for (;;) {
    if (!proc->exited)
      run_reap(proc);
    if (proc->exited)
      return 1;
    struct pollfd fds[4];
    int nfds = 0;
    if (proc->in_fd >= 0)
      fds[nfds++] = (struct pollfd){.fd = proc->in_fd, .events = POLLOUT};
    if (proc->out_fd >= 0)
      fds[nfds++] = (struct pollfd){.fd = proc->out_fd, .events = POLLIN};
    if (proc->err_fd >= 0)
      fds[nfds++] = (struct pollfd){.fd = proc->err_fd, .events = POLLIN};
    if (proc->pidfd >= 0)
      fds[nfds++] = (struct pollfd){.fd = proc->pidfd, .events = POLLIN};
    long wait = deadline - run_now_ms();
    if (wait <= 0)
      return 0;
    if (proc->pidfd < 0 && wait > 10)
      wait = 10; /* no pidfd: look for the child's exit every 10 ms */
    if (poll(fds, (nfds_t)nfds, (int)wait) < 0 && errno != EINTR)
      return 0;
    if (proc->in_fd >= 0)
      run_write(proc);
    if (proc->out_fd >= 0)
      run_read(proc, &proc->out_fd, 1);
    if (proc->err_fd >= 0)
      run_read(proc, &proc->err_fd, 0);
  }
}

void run_signal(run_proc_t *proc, int sig) {
  pthread_mutex_lock(&proc->lock);
  if (!proc->exited && proc->pid > 0)
    killpg(proc->pid, sig);
  pthread_mutex_unlock(&proc->lock);
}

/* Copies `len` bytes of `text` into `buf` as valid UTF-8 (bad bytes become '?'). */
static void run_copy_utf8(const char *text, size_t len, char *buf, size_t size) {
  size_t out = 0;
  const unsigned char *s = (const unsigned char *)text;
  for (size_t i = 0; i < len && out + 1 < size;) {
    size_t need = s[i] < 0x80             ? 1
                  : (s[i] & 0xE0) == 0xC0 ? 2
                  : (s[i] & 0xF0) == 0xE0 ? 3
                  : (s[i] & 0xF8) == 0xF0 ? 4
                                          : 0;
    int ok = need > 0 && i + need <= len && out + need < size;
    for (size_t k = 1; ok && k < need; k++)
      ok = (s[i + k] & 0xC0) == 0x80;
    if (!ok) {
      buf[out++] = '?';
      i++;
      continue;
    }
    memcpy(buf + out, s + i, need);
    out += need;
    i += need;
  }
  buf[out] = '\0';
}

void run_error_text(const run_proc_t *proc, char *buf, size_t size) {
  size_t start = proc->tail_len > RUN_TAIL_MAX ? proc->tail_len - RUN_TAIL_MAX : 0;
  while (start < proc->tail_len && ((unsigned char)proc->tail[start] & 0xC0) == 0x80)
    start++; /* do not begin in the middle of a character */
  size_t len = proc->tail_len - start;
  while (len > 0 && (proc->tail[start + len - 1] == '\n' || proc->tail[start + len - 1] == '\r'))
    len--;
  if (len > 0)
    run_copy_utf8(proc->tail + start, len, buf, size);
  else
    run_status_text(proc, buf, size);
}

void run_status_text(const run_proc_t *proc, char *buf, size_t size) {
  if (WIFSIGNALED(proc->status))
    snprintf(buf, size, "killed by signal %d", WTERMSIG(proc->status));
  else
    snprintf(buf, size, "exit status %d", WEXITSTATUS(proc->status));
}

void run_finish(run_proc_t *proc) {
  run_close(&proc->in_fd);
  run_close(&proc->out_fd);
  run_close(&proc->err_fd);
  run_close(&proc->pidfd);
  if (!proc->exited && proc->pid > 0) {
    killpg(proc->pid, SIGKILL);
    waitpid(proc->pid, NULL, 0);
  }
  free(proc->out);
  proc->out = NULL;
  pthread_mutex_destroy(&proc->lock);
}
