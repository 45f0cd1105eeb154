/*
 * ctest_shared.c — libmuster's shared-data calls against a real head:
 * set, update, refused levels, get to a buffer and to a file descriptor,
 * uploads from a file descriptor (sized and chunked), progress, list, delete.
 *
 * Starts `$MUSTER_BIN head --server-only --listen 127.0.0.1:0` with a
 * temporary data dir, like ctest_client.c; MUSTER_TEST_URL and
 * MUSTER_TEST_TOKEN point it at a head you started instead.  Ends with
 * "N passed, M failed"; exits 1 when M > 0.
 */
#include "muster.h"

#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TOKEN "ctest-token-0123456789"

static int passed, failed;
static char head_url[256], data_dir[256];
static const char *head_token = TOKEN;
static pid_t head_pid;

static void check(int ok, const char *what, int line) {
  if (ok) {
    passed++;
    return;
  }
  failed++;
  fprintf(stderr, "FAIL line %d: %s\n", line, what);
}

#define CHECK(cond) check((cond) != 0, #cond, __LINE__)

static void check_err(muster_err_t got, muster_err_t want, const char *what, int line,
                      const muster_client_t *client) {
  if (got == want) {
    passed++;
    return;
  }
  failed++;
  fprintf(stderr, "FAIL line %d: %s: got %s (%s), want %s\n", line, what, muster_err_name(got),
          client ? muster_client_message(client) : "", muster_err_name(want));
}

#define CHECK_ERR(c, call, want) check_err((call), (want), #call, __LINE__, (c))
#define CHECK_OK(c, call) CHECK_ERR(c, call, MUSTER_OK)

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  return remove(path);
}

static const char *muster_bin(const char *argv0) {
  static char path[1024];
  const char *env = getenv("MUSTER_BIN");
  if (env && env[0])
    return env;
  const char *slash = strrchr(argv0, '/');
  snprintf(path, sizeof path, "%.*smuster", slash ? (int)(slash - argv0 + 1) : 0, argv0);
  return path;
}

/* Starts the head and waits until it has written DATA_DIR/url. */
static int head_start(const char *bin) {
  snprintf(data_dir, sizeof data_dir, "/tmp/muster-ctest-shared-XXXXXX");
  if (mkdtemp(data_dir) == NULL)
    return -1;
  char log_path[512], url_path[512];
  snprintf(log_path, sizeof log_path, "%s/head.log", data_dir);
  snprintf(url_path, sizeof url_path, "%s/url", data_dir);
  head_pid = fork();
  if (head_pid == 0) {
    int log = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(log, 1);
    dup2(log, 2);
    execl(bin, bin, "head", "--server-only", "--listen", "127.0.0.1:0", "--data-dir", data_dir,
          "--token", TOKEN, "--shared-keep-levels", "2", (char *)NULL);
    _exit(127);
  }
  for (int64_t deadline = now_ms() + 20000; now_ms() < deadline;) {
    FILE *f = fopen(url_path, "r");
    if (f != NULL) {
      char *line = fgets(head_url, sizeof head_url, f);
      fclose(f);
      if (line != NULL) {
        head_url[strcspn(head_url, "\r\n")] = '\0';
        if (head_url[0])
          return 0;
      }
    }
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

static void head_stop(void) {
  if (head_pid > 0) {
    kill(head_pid, SIGTERM);
    waitpid(head_pid, NULL, 0);
  }
  if (data_dir[0])
    nftw(data_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* ---- the checks ------------------------------------------------------------------- */

static void test_set_update_get(muster_client_t *c) {
  muster_shared_info_t info;
  CHECK_OK(c, muster_shared_set(c, "ctest", "weights", "one", 3, -1, &info));
  CHECK(info.level == 1 && info.size == 3 && strlen(info.checksum) == 16);
  CHECK(info.ttl_ms == 600000 && !info.ttl_clamped && info.expires_ms > 0);
  CHECK_ERR(c, muster_shared_set(c, "ctest", "weights", "x", 1, -1, NULL), MUSTER_VERSION_MISMATCH);
  CHECK(strcmp(muster_client_message(c),
               "shared data 'weights' exists at level 1; update it with level=2") == 0);
  CHECK_ERR(c, muster_shared_update(c, "ctest", "weights", 3, "three", 5, -1, NULL),
            MUSTER_VERSION_MISMATCH);
  CHECK(strcmp(muster_client_message(c), "update level mismatch: expected 2, got 3") == 0);
  CHECK_OK(c, muster_shared_update(c, "ctest", "weights", 2, "two!", 4, 99999999, &info));
  CHECK(info.level == 2 && info.ttl_clamped && info.ttl_ms == 600000);

  void *data = NULL;
  size_t len = 0;
  muster_shared_info_t got;
  CHECK_OK(c, muster_shared_get(c, "ctest", "weights", 0, &data, &len, &got));
  CHECK(len == 4 && memcmp(data, "two!", 4) == 0 && got.level == 2);
  CHECK(strcmp(got.checksum, info.checksum) == 0 && got.expires_ms == info.expires_ms);
  muster_free(data);
  CHECK_OK(c, muster_shared_get(c, "ctest", "weights", 1, &data, &len, &got));
  CHECK(len == 3 && memcmp(data, "one", 3) == 0 && got.level == 1);
  muster_free(data);
  data = (void *)1;
  CHECK_ERR(c, muster_shared_get(c, "ctest", "missing", 0, &data, &len, NULL),
            MUSTER_SHARED_NOT_FOUND);
  CHECK(data == NULL);
  CHECK(strcmp(muster_client_message(c), "shared data not found: 'missing' in scope 'ctest'") == 0);
  CHECK_ERR(c, muster_shared_get(c, "ctest", "weights", 9, &data, &len, NULL),
            MUSTER_SHARED_NOT_FOUND);
  CHECK_ERR(c, muster_shared_set(c, "bad scope", "w", "x", 1, -1, NULL), MUSTER_NAME_INVALID);
  CHECK_ERR(c, muster_shared_set(c, "s-0123456789abcdef", "w", "x", 1, -1, NULL),
            MUSTER_SESSION_NOT_FOUND);
  CHECK_OK(c, muster_shared_set(c, "ctest", "empty", "", 0, 1000, &info));
  CHECK_OK(c, muster_shared_get(c, "ctest", "empty", 0, &data, &len, NULL));
  CHECK(len == 0 && data != NULL);
  muster_free(data);
}

typedef struct {
  int calls;
  int64_t last, total;
} progress_t;

static void on_progress(void *user, int64_t done, int64_t total) {
  progress_t *p = user;
  p->calls++;
  p->last = done;
  p->total = total;
}

/* Writes `size` bytes of a pattern to a temp file; returns an fd at offset 0. */
static int pattern_file(char *path, size_t size) {
  snprintf(path, 256, "/tmp/muster-ctest-blob-XXXXXX");
  int fd = mkstemp(path);
  char buf[65536];
  for (size_t i = 0; i < sizeof buf; i++)
    buf[i] = (char)(i * 7 + 3);
  for (size_t done = 0; done < size;) {
    size_t n = size - done < sizeof buf ? size - done : sizeof buf;
    if (write(fd, buf, n) != (ssize_t)n)
      break;
    done += n;
  }
  lseek(fd, 0, SEEK_SET);
  return fd;
}

static int files_equal(int a, int b) {
  char x[65536], y[65536];
  lseek(a, 0, SEEK_SET);
  lseek(b, 0, SEEK_SET);
  for (;;) {
    ssize_t n = read(a, x, sizeof x), m = read(b, y, sizeof y);
    if (n != m || (n > 0 && memcmp(x, y, (size_t)n) != 0))
      return 0;
    if (n <= 0)
      return 1;
  }
}

static void test_fd_transfers(muster_client_t *c) {
  char src_path[256], dst_path[] = "/tmp/muster-ctest-out-XXXXXX";
  size_t size = (size_t)20 << 20;
  int src = pattern_file(src_path, size);
  muster_shared_opts_t opts;
  muster_shared_opts_init(&opts);
  progress_t up = {0}, down = {0};
  opts.progress = on_progress;
  opts.user = &up;
  muster_shared_info_t info;
  CHECK_OK(c, muster_shared_put_fd(c, "ctest", "big", src, (int64_t)size, &opts, &info));
  CHECK(info.level == 1 && info.size == (int64_t)size);
  CHECK(up.calls > 0 && up.last == (int64_t)size && up.total == (int64_t)size);

  /* Until end of file, chunked: level 2 from a pipe-like unknown length. */
  lseek(src, 0, SEEK_SET);
  opts.level = 2;
  opts.user = NULL;
  opts.progress = NULL;
  CHECK_OK(c, muster_shared_put_fd(c, "ctest", "big", src, -1, &opts, &info));
  CHECK(info.level == 2 && info.size == (int64_t)size);

  int dst = mkstemp(dst_path);
  muster_shared_opts_init(&opts);
  opts.progress = on_progress;
  opts.user = &down;
  muster_shared_info_t got;
  CHECK_OK(c, muster_shared_get_fd(c, "ctest", "big", dst, &opts, &got));
  CHECK(got.level == 2 && got.size == (int64_t)size && strcmp(got.checksum, info.checksum) == 0);
  CHECK(down.calls > 0 && down.last == (int64_t)size);
  CHECK(files_equal(src, dst));
  CHECK_ERR(c, muster_shared_get_fd(c, "ctest", "nothing", dst, NULL, NULL),
            MUSTER_SHARED_NOT_FOUND);
  close(src);
  close(dst);
  unlink(src_path);
  unlink(dst_path);
}

static void test_list_delete_and_session(muster_client_t *c) {
  char *json = NULL;
  CHECK_OK(c, muster_shared_list(c, "ctest", &json));
  CHECK(json && strstr(json, "\"name\":\"big\"") && strstr(json, "\"levels\":[1,2]"));
  muster_free(json);
  int64_t levels = 0;
  CHECK_OK(c, muster_shared_delete(c, "ctest", "weights", &levels));
  CHECK(levels == 2);
  CHECK_ERR(c, muster_shared_delete(c, "ctest", "weights", NULL), MUSTER_SHARED_NOT_FOUND);

  CHECK_OK(c, muster_queue_put(c, "ctest-q", NULL, NULL));
  muster_session_opts_t sopts;
  muster_session_opts_init(&sopts);
  sopts.queue = "ctest-q";
  char *id = NULL;
  CHECK_OK(c, muster_session_create(c, &sopts, &id, NULL));
  CHECK_OK(c, muster_shared_set(c, id, "params", "p", 1, -1, NULL));
  CHECK_OK(c, muster_session_close(c, id, NULL));
  void *data = NULL;
  size_t len;
  CHECK_ERR(c, muster_shared_get(c, id, "params", 0, &data, &len, NULL), MUSTER_SHARED_NOT_FOUND);
  char want[128];
  snprintf(want, sizeof want, "shared data not found for session %s", id);
  CHECK(strcmp(muster_client_message(c), want) == 0);
  muster_free(id);
}

int main(int argc, char **argv) {
  const char *url = getenv("MUSTER_TEST_URL");
  if (url && url[0]) {
    snprintf(head_url, sizeof head_url, "%s", url);
    head_token = getenv("MUSTER_TEST_TOKEN") ? getenv("MUSTER_TEST_TOKEN") : TOKEN;
  } else if (head_start(muster_bin(argv[0])) != 0) {
    head_stop();
    printf("0 passed, 1 failed\n");
    return 1;
  }
  muster_client_t *c = NULL;
  if (muster_client_new(head_url, head_token, &c) != MUSTER_OK) {
    head_stop();
    printf("0 passed, 1 failed\n");
    return 1;
  }
  test_set_update_get(c);
  test_fd_transfers(c);
  test_list_delete_and_session(c);
  muster_client_free(c);
  head_stop();
  printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
