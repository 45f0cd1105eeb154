/*
 * ctest_util.h — the scaffolding the C integration tests (ctest_*.c) share:
 * pass/fail counters and the CHECK macros, the final "N passed, M failed"
 * line, small helpers (now_ms, contains, connect_head), and a real head
 * started on a free port with a temporary data dir.
 *
 * Each ctest_*.c is its own program (CMake builds one executable per file),
 * so this header holds definitions, not declarations: everything is static,
 * and the functions are `static inline` so that a program which does not
 * call one of them is not warned about it.  Include it once, from the
 * program's .c file only.
 *
 * The head: ctest_head_start() runs `$MUSTER_BIN head --listen 127.0.0.1:0
 * --data-dir DIR --token TOKEN [extra args]` with DIR made from a mkdtemp
 * template, and waits for the head to write DIR/url, which it reads into
 * head_url.  ctest_head_stop() stops it and removes DIR, unless
 * MUSTER_TEST_KEEP is set (to look at DIR/head.log after a failure).
 * ctest_use_test_url() lets a program run against a head started by hand
 * (MUSTER_TEST_URL, MUSTER_TEST_TOKEN) instead.
 */
#ifndef MUSTER_CTEST_UTIL_H
#define MUSTER_CTEST_UTIL_H

#include "muster.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- counting checks ----------------------------------------------------------------- */

static int passed, failed;

static inline void check(int ok, const char *what, int line) {
  if (ok) {
    passed++;
    return;
  }
  failed++;
  fprintf(stderr, "FAIL line %d: %s\n", line, what);
}

#define CHECK(cond) check((cond) != 0, #cond, __LINE__)

/* Counts whether a call returned `want`; on a mismatch prints both codes and
 * `message` (the server's explanation; NULL prints as empty). */
static inline void check_err(muster_err_t got, muster_err_t want, const char *what, int line,
                             const char *message) {
  if (got == want) {
    passed++;
    return;
  }
  failed++;
  fprintf(stderr, "FAIL line %d: %s: got %s (%s), want %s\n", line, what, muster_err_name(got),
          message ? message : "", muster_err_name(want));
}

/* check_err with the message of `client` (which may be NULL).  A function
 * rather than part of the macro so that the message is read after the call
 * being checked has run: argument evaluation order is unspecified. */
static inline void check_err_client(muster_err_t got, muster_err_t want, const char *what, int line,
                                    const muster_client_t *client) {
  check_err(got, want, what, line, client ? muster_client_message(client) : "");
}

#define CHECK_ERR(c, call, want) check_err_client((call), (want), #call, __LINE__, (c))
#define CHECK_OK(c, call) CHECK_ERR(c, call, MUSTER_OK)

/* Prints the final "N passed, M failed" line; returns the exit status. */
static inline int ctest_report(void) {
  printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}

/* ---- small helpers -------------------------------------------------------------------- */

static inline int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline int contains(const char *haystack, const char *needle) {
  return haystack != NULL && strstr(haystack, needle) != NULL;
}

/* ---- servers that never answer ------------------------------------------------------------ */

/*
 * A loopback listener for the timeout tests, its URL in `url`.  `connects` 1:
 * the kernel completes every connection (backlog 16) and nobody ever reads a
 * request, as with a head stopped by SIGSTOP.  `connects` 0: no connection
 * ever completes: the backlog (0) is filled by one connection made here, and
 * Linux drops the SYNs of any further one while its accept queue is full,
 * as with a host that does not answer.  fds[0] is the listener, fds[1] the
 * filling connection (-1 when none); close both with ctest_listener_close.
 * Returns 0, or -1 when a socket call failed.
 */
static inline int ctest_listener(int connects, int fds[2], char *url, size_t size) {
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof addr;
  fds[1] = -1;
  fds[0] = socket(AF_INET, SOCK_STREAM, 0);
  if (fds[0] < 0 || bind(fds[0], (struct sockaddr *)&addr, sizeof addr) != 0 ||
      listen(fds[0], connects ? 16 : 0) != 0 ||
      getsockname(fds[0], (struct sockaddr *)&addr, &len) != 0)
    return -1;
  snprintf(url, size, "http://127.0.0.1:%d", ntohs(addr.sin_port));
  if (connects)
    return 0;
  /* Wait for the filling connection to complete, so that the queue is full
   * before the call under test connects. */
  fds[1] = socket(AF_INET, SOCK_STREAM, 0);
  return fds[1] >= 0 && connect(fds[1], (struct sockaddr *)&addr, sizeof addr) == 0 ? 0 : -1;
}

static inline void ctest_listener_close(int fds[2]) {
  for (int i = 0; i < 2; i++)
    if (fds[i] >= 0)
      close(fds[i]);
}

/* ---- standalone loaders ------------------------------------------------------------------- */

/* Opens a loader with `opts`; NULL, the reason on stderr, when it fails. */
static inline muster_loader_t *ctest_loader_open(const muster_loader_opts_t *opts) {
  muster_loader_t *l = NULL;
  char *message = NULL;
  if (muster_loader_open(opts, &l, &message) != MUSTER_OK)
    fprintf(stderr, "open: %s\n", message ? message : "?");
  muster_free(message);
  return l;
}

/* Takes what is left of the epoch (at most `max`) into out[]; how many. */
static inline size_t ctest_loader_drain(muster_loader_t *l, uint64_t *out, size_t max) {
  size_t n = 0;
  uint64_t index;
  int has;
  while (n < max && muster_loader_next(l, &index, NULL, &has) == MUSTER_OK && has)
    out[n++] = index;
  return n;
}

/* ---- pools ------------------------------------------------------------------------------- */

static const char *head_token; /* the token clients use: the head's, or $MUSTER_TEST_TOKEN */

/* Sets `opts` up (muster_pool_opts_init) for a pool on `queue` of the head
 * at `url` with head_token, every other option at its default: what the
 * pool tests of ctest_client.c and ctest_pool.c open with before setting
 * the option they are about. */
static inline void ctest_pool_opts(muster_pool_opts_t *opts, const char *url, const char *queue) {
  muster_pool_opts_init(opts);
  opts->url = url;
  opts->token = head_token;
  opts->queue = queue;
}

/* ---- the head process ------------------------------------------------------------------- */

static char head_url[256];     /* the head's base URL, as it wrote it to DATA_DIR/url */
static char data_dir[256];     /* the head's temporary data dir; empty when none was made */
static pid_t head_pid;         /* 0 when this program started no head (or it exited) */

/* A client of head_url with `token`.  Exits the program when the client
 * cannot be made (a bad URL: nothing else could run). */
static inline muster_client_t *connect_head(const char *token) {
  muster_client_t *client = NULL;
  if (muster_client_new(head_url, token, &client) != MUSTER_OK) {
    fprintf(stderr, "cannot create a client for %s\n", head_url);
    exit(1);
  }
  return client;
}

/* When MUSTER_TEST_URL is set, takes it as head_url and MUSTER_TEST_TOKEN
 * (else `token`) as head_token, and returns 1: no head is to be started.
 * Otherwise sets head_token to `token` and returns 0. */
static inline int ctest_use_test_url(const char *token) {
  const char *url = getenv("MUSTER_TEST_URL");
  head_token = token;
  if (url == NULL || url[0] == '\0')
    return 0;
  snprintf(head_url, sizeof head_url, "%s", url);
  if (getenv("MUSTER_TEST_TOKEN") != NULL)
    head_token = getenv("MUSTER_TEST_TOKEN");
  return 1;
}

/* The muster binary: $MUSTER_BIN, else "muster" next to this test.  The
 * returned string is static or the environment's; do not free it. */
static inline const char *muster_bin(const char *argv0) {
  static char path[1024];
  const char *env = getenv("MUSTER_BIN");
  if (env && env[0])
    return env;
  const char *slash = strrchr(argv0, '/');
  snprintf(path, sizeof path, "%.*smuster", slash ? (int)(slash - argv0 + 1) : 0, argv0);
  return path;
}

/* Reads DIR/url into head_url; 0 when the head has written it. */
static inline int ctest_head_read_url(const char *url_path) {
  FILE *f = fopen(url_path, "r");
  if (f == NULL)
    return -1;
  char *line = fgets(head_url, sizeof head_url, f);
  fclose(f);
  if (line == NULL)
    return -1;
  head_url[strcspn(head_url, "\r\n")] = '\0';
  return head_url[0] ? 0 : -1;
}

/* In the forked child: sends output to `log_path` and runs the head.  The
 * argument vector is bin, "head", the listen/data-dir/token options, then
 * `extra` (NULL-terminated; NULL for none). */
static inline void ctest_head_exec(const char *bin, const char *log_path, const char *token,
                                   const char *const *extra) {
  enum { FIXED_ARGS = 8, MAX_EXTRA = 16 };
  const char *args[FIXED_ARGS + MAX_EXTRA + 1] = {bin,          "head",   "--listen", "127.0.0.1:0",
                                                  "--data-dir", data_dir, "--token",  token};
  for (size_t i = 0; extra != NULL && extra[i] != NULL && i < MAX_EXTRA; i++)
    args[FIXED_ARGS + i] = extra[i];
  int log = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
  dup2(log, 1);
  dup2(log, 2);
  execv(bin, (char *const *)args);
  _exit(127);
}

/*
 * Starts `bin` as a head with `token` on a data dir made from `dir_template`
 * (a mkdtemp template, "/tmp/muster-ctest-XXXXXX") and the extra arguments
 * `extra` (NULL-terminated, or NULL), and waits up to 20 s for it to write
 * DIR/url into head_url.  Returns 0 when it is up; -1 after saying why when
 * the dir cannot be made, the head exits or it stays silent.  Call
 * ctest_head_stop() either way.
 */
static inline int ctest_head_start(const char *bin, const char *dir_template, const char *token,
                                   const char *const *extra) {
  snprintf(data_dir, sizeof data_dir, "%s", dir_template);
  if (mkdtemp(data_dir) == NULL)
    return -1;
  char log_path[512], url_path[512];
  snprintf(log_path, sizeof log_path, "%s/head.log", data_dir);
  snprintf(url_path, sizeof url_path, "%s/url", data_dir);
  head_pid = fork();
  if (head_pid == 0)
    ctest_head_exec(bin, log_path, token, extra);
  for (int64_t deadline = now_ms() + 20000; now_ms() < deadline;) {
    if (ctest_head_read_url(url_path) == 0)
      return 0;
    if (waitpid(head_pid, NULL, WNOHANG) == head_pid) {
      fprintf(stderr, "the head exited early; see %s\n", log_path);
      head_pid = 0;
      return -1;
    }
    usleep(20000); /* polling for the url file: the head says nothing else when it is up */
  }
  fprintf(stderr, "the head did not write %s in time\n", url_path);
  return -1;
}

static inline int ctest_rm_entry(const char *path, const struct stat *st, int flag,
                                 struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path);
}

/* Stops the head (SIGTERM, then waits for it) and removes its data dir,
 * unless MUSTER_TEST_KEEP is set.  Does nothing for what was not started. */
static inline void ctest_head_stop(void) {
  if (head_pid > 0) {
    kill(head_pid, SIGTERM);
    waitpid(head_pid, NULL, 0);
  }
  if (data_dir[0] && getenv("MUSTER_TEST_KEEP") == NULL)
    nftw(data_dir, ctest_rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* For a program whose head could not be had: stops what there is, counts
 * that as a failure and prints the final line.  Returns the exit status. */
static inline int ctest_head_failed(void) {
  ctest_head_stop();
  failed++;
  return ctest_report();
}

#endif
