/*
 * ctest_shared.c — libmuster's shared-data calls against a real head:
 * set, update, refused levels, get to a buffer and to a file descriptor,
 * uploads from a file descriptor (sized and chunked), progress, list, delete,
 * negative numbers refused, a level's facts without its bytes (stat), tasks
 * put requiring levels, and the connect timeout of a transfer.
 *
 * Starts `$MUSTER_BIN head --listen 127.0.0.1:0 --server-only
 * --shared-keep-levels 2` with a temporary data dir, like ctest_client.c
 * (the scaffolding is in ctest_util.h); MUSTER_TEST_URL and
 * MUSTER_TEST_TOKEN point it at a head you started instead.  Ends with
 * "N passed, M failed"; exits 1 when M > 0.
 */
#include "ctest_util.h"

#define TOKEN "ctest-token-0123456789"

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
  CHECK(strcmp(muster_client_message(c), "shared data not found: 'missing' in scope 'ctest' "
                                         "('missing' was never set, or was deleted)") == 0);
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
  char want[256];
  snprintf(want, sizeof want,
           "shared data not found for session %s: 'params' (session '%s' was closed: by its "
           "client; its shared data went with it)",
           id, id);
  CHECK(strcmp(muster_client_message(c), want) == 0);
  /* A HEAD says it too (core/said.h), though its reply has no body. */
  CHECK_ERR(c, muster_shared_stat(c, id, "params", 0, NULL), MUSTER_SHARED_NOT_FOUND);
  CHECK(strcmp(muster_client_message(c), want) == 0);
  muster_free(id);
}

/* Negative numbers other than the documented sentinels (ttl -1, level 0,
 * len -1) are refused before anything is sent; they used to be taken as the
 * sentinel (a ttl of -5 as the head's maximum, a level of -1 as the newest). */
static void test_refused_negatives(muster_client_t *c) {
  CHECK_ERR(c, muster_shared_set(c, "ctest", "neg", "x", 1, -5, NULL), MUSTER_INVALID);
  CHECK(strcmp(muster_client_message(c),
               "ttl_ms: -5, expected a time in milliseconds, or -1 for the head's maximum") == 0);
  CHECK_ERR(c, muster_shared_update(c, "ctest", "neg", -3, "x", 1, -1, NULL), MUSTER_INVALID);
  CHECK(contains(muster_client_message(c), "level: -3, expected the level to create"));
  void *data = NULL;
  size_t len = 0;
  CHECK_ERR(c, muster_shared_get(c, "ctest", "neg", 0, &data, &len, NULL), MUSTER_SHARED_NOT_FOUND);
  CHECK_OK(c, muster_shared_set(c, "ctest", "neg", "x", 1, -1, NULL));
  CHECK_ERR(c, muster_shared_get(c, "ctest", "neg", -1, &data, &len, NULL), MUSTER_INVALID);
  CHECK(strcmp(muster_client_message(c), "level: -1, expected 1 or more, or 0 for the newest") ==
        0);
  CHECK(data == NULL);
  int null = open("/dev/null", O_RDWR); /* what a wrongly taken call would read or write */
  muster_shared_opts_t opts;
  muster_shared_opts_init(&opts);
  opts.level = -2;
  CHECK_ERR(c, muster_shared_get_fd(c, "ctest", "neg", null, &opts, NULL), MUSTER_INVALID);
  CHECK(contains(muster_client_message(c), "level: -2, expected"));
  CHECK_ERR(c, muster_shared_put_fd(c, "ctest", "neg", null, 1, &opts, NULL), MUSTER_INVALID);
  CHECK(contains(muster_client_message(c), "level: -2, expected the level to create"));
  muster_shared_opts_init(&opts);
  opts.ttl_ms = -2;
  CHECK_ERR(c, muster_shared_put_fd(c, "ctest", "neg", null, 1, &opts, NULL), MUSTER_INVALID);
  CHECK(contains(muster_client_message(c), "ttl_ms: -2, expected"));
  opts.ttl_ms = -1;
  opts.level = 2;
  CHECK_ERR(c, muster_shared_put_fd(c, "ctest", "neg", null, -7, &opts, NULL), MUSTER_INVALID);
  CHECK(strcmp(muster_client_message(c),
               "len: -7, expected 0 or more bytes, or -1 to read to the end of the file") == 0);
  close(null);
  int64_t levels = 0;
  CHECK_OK(c, muster_shared_delete(c, "ctest", "neg", &levels));
  CHECK(levels == 1);
}

/* muster_shared_stat: a level's number, size and checksum without its bytes
 * (a HEAD), and a missing level said in the head's words, which come in the
 * reply's headers (core/said.h) since a HEAD's reply has no body. */
static void test_stat(muster_client_t *c) {
  muster_shared_info_t set, got;
  CHECK_OK(c, muster_shared_set(c, "ctest", "stat", "one", 3, -1, NULL));
  CHECK_OK(c, muster_shared_update(c, "ctest", "stat", 2, "two!", 4, -1, &set));
  CHECK_OK(c, muster_shared_stat(c, "ctest", "stat", 0, &got));
  CHECK(got.level == 2 && got.size == 4 && strcmp(got.checksum, set.checksum) == 0);
  CHECK(got.expires_ms == set.expires_ms && got.ttl_ms == 0);
  CHECK_OK(c, muster_shared_stat(c, "ctest", "stat", 1, &got));
  CHECK(got.level == 1 && got.size == 3);
  CHECK_ERR(c, muster_shared_stat(c, "ctest", "stat", 7, &got), MUSTER_SHARED_NOT_FOUND);
  CHECK(strcmp(muster_client_message(c),
               "shared data not found: 'stat' in scope 'ctest' (level 7 of 'stat' was never "
               "made; the newest is 2)") == 0);
  CHECK_ERR(c, muster_shared_stat(c, "ctest", "nothing", 0, NULL), MUSTER_SHARED_NOT_FOUND);
  CHECK(strcmp(muster_client_message(c), "shared data not found: 'nothing' in scope 'ctest' "
                                         "('nothing' was never set, or was deleted)") == 0);
  CHECK_ERR(c, muster_shared_stat(c, "ctest", "stat", -1, NULL), MUSTER_INVALID);
  muster_client_t *stranger = NULL;
  CHECK_OK(stranger, muster_client_new(head_url, "not-the-token", &stranger));
  CHECK_ERR(stranger, muster_shared_stat(stranger, "ctest", "stat", 0, NULL), MUSTER_UNAUTHORIZED);
  CHECK(contains(muster_client_message(stranger), "token"));
  CHECK(!contains(muster_client_message(stranger), "answered HTTP 401"));
  muster_client_free(stranger);
}

/* A local file that fails (a full disk: /dev/full; a descriptor open for
 * writing only, read from) is MUSTER_IO, not a bad argument: a worker's task
 * error then says what went wrong where it went wrong. */
static void test_local_io(muster_client_t *c) {
  CHECK_OK(c, muster_shared_set(c, "ctest", "io", "bytes", 5, -1, NULL));
  int full = open("/dev/full", O_WRONLY | O_CLOEXEC);
  CHECK(full >= 0);
  CHECK_ERR(c, muster_shared_get_fd(c, "ctest", "io", full, NULL, NULL), MUSTER_IO);
  CHECK(strcmp(muster_client_message(c), "cannot write the blob: No space left on device") == 0);
  CHECK(strcmp(muster_err_name(MUSTER_IO), "io_error") == 0);
  int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
  CHECK(null >= 0);
  CHECK_ERR(c, muster_shared_put_fd(c, "ctest", "io-up", null, 5, NULL, NULL), MUSTER_IO);
  CHECK(strcmp(muster_client_message(c), "cannot read the blob: Bad file descriptor") == 0);
  close(full);
  close(null);
}

/* Non-zero when task `id` (muster_task_get) holds `want` in its JSON. */
static int requires_is(muster_client_t *c, int64_t id, const char *want) {
  char *json = NULL;
  int same = muster_task_get(c, id, &json) == MUSTER_OK && contains(json, want);
  muster_free(json);
  return same;
}

/* muster_put_requiring and (below) muster_session_put_requiring: every task
 * of the call carries the levels; bad levels are refused before anything is
 * sent. */
static void test_put_requiring(muster_client_t *c) {
  CHECK_OK(c, muster_queue_put(c, "ctest-rq", NULL, NULL));
  muster_task_spec_t specs[2];
  muster_task_spec_init(&specs[0]);
  muster_task_spec_init(&specs[1]);
  specs[0].payload = "1";
  specs[1].payload = "2";
  muster_shared_level_t levels[MUSTER_MAX_REQUIRES + 1] = {{"ctest", "stat", 2},
                                                           {"s-0123456789abcdef", "table", 1}};
  int64_t ids[2];
  const char *want = "\"requires\":[{\"scope\":\"ctest\",\"name\":\"stat\",\"level\":2},"
                     "{\"scope\":\"s-0123456789abcdef\",\"name\":\"table\",\"level\":1}]";
  CHECK_OK(c, muster_put_requiring(c, "ctest-rq", specs, 2, levels, 2, ids));
  CHECK(requires_is(c, ids[0], want) && requires_is(c, ids[1], want));
  CHECK_OK(c, muster_put_requiring(c, "ctest-rq", specs, 1, NULL, 0, ids));
  CHECK(!requires_is(c, ids[0], "requires"));

  levels[1].level = 0;
  CHECK_ERR(c, muster_put_requiring(c, "ctest-rq", specs, 2, levels, 2, NULL), MUSTER_INVALID);
  CHECK(strcmp(muster_client_message(c), "requires[1].level: 0, expected 1 or more") == 0);
  levels[1].level = 1;
  levels[1].name = NULL;
  CHECK_ERR(c, muster_put_requiring(c, "ctest-rq", specs, 2, levels, 2, NULL), MUSTER_INVALID);
  CHECK(contains(muster_client_message(c), "requires[1]: scope, name and level are all required"));
  levels[1].name = "a b";
  CHECK_ERR(c, muster_put_requiring(c, "ctest-rq", specs, 2, levels, 2, NULL), MUSTER_NAME_INVALID);
  CHECK(contains(muster_client_message(c), "requires[1].name 'a b': use 1 to 128 characters"));
  /* Two levels of one blob went to the head, which stored them: a worker then
   * had two files for MUSTER_SHARED_STAT.  The CLI and Python refuse it too. */
  levels[1] = (muster_shared_level_t){"ctest", "stat", 1};
  CHECK_ERR(c, muster_put_requiring(c, "ctest-rq", specs, 2, levels, 2, NULL), MUSTER_INVALID);
  CHECK(strcmp(muster_client_message(c), "requires[1]: ctest/stat is required already "
                                         "(requires[0]): a task requires one level of each "
                                         "blob") == 0);
  levels[1].scope = "s-0123456789abcdef"; /* the same name in another scope is another blob */
  CHECK_OK(c, muster_put_requiring(c, "ctest-rq", specs, 1, levels, 2, ids));
  static char names[MUSTER_MAX_REQUIRES + 1][8];
  for (size_t i = 0; i <= MUSTER_MAX_REQUIRES; i++) {
    snprintf(names[i], sizeof names[i], "w%zu", i);
    levels[i] = (muster_shared_level_t){"ctest", names[i], 1};
  }
  CHECK_ERR(c, muster_put_requiring(c, "ctest-rq", specs, 2, levels, MUSTER_MAX_REQUIRES + 1, NULL),
            MUSTER_INVALID);
  CHECK(strcmp(muster_client_message(c), "requires: 17 levels, at most 16 allowed") == 0);
  CHECK_ERR(c, muster_put_requiring(c, "ctest-rq", specs, 2, NULL, 1, NULL), MUSTER_INVALID);
  char *json = NULL;
  CHECK_OK(c, muster_queue_get(c, "ctest-rq", &json));
  CHECK(json && contains(json, "\"queued\":4")); /* the refused puts stored nothing */
  muster_free(json);
}

static void test_session_put_requiring(muster_client_t *c) {
  muster_session_opts_t sopts;
  muster_session_opts_init(&sopts);
  sopts.queue = "ctest-rq";
  char *sid = NULL;
  CHECK_OK(c, muster_session_create(c, &sopts, &sid, NULL));
  muster_task_spec_t specs[2];
  muster_task_spec_init(&specs[0]);
  muster_task_spec_init(&specs[1]);
  specs[0].payload = "1";
  specs[1].payload = "2";
  muster_shared_level_t levels[] = {{sid, "table", 3}};
  int64_t ids[2], indexes[2];
  CHECK_OK(c, muster_session_put_requiring(c, sid, specs, 2, levels, 1, ids, indexes));
  char session_want[128];
  snprintf(session_want, sizeof session_want,
           "\"requires\":[{\"scope\":\"%s\",\"name\":\"table\",\"level\":3}]", sid);
  CHECK(indexes[0] == 0 && indexes[1] == 1);
  CHECK(requires_is(c, ids[0], session_want) && requires_is(c, ids[1], session_want));
  levels[0].level = -4;
  CHECK_ERR(c, muster_session_put_requiring(c, sid, specs, 2, levels, 1, ids, indexes),
            MUSTER_INVALID);
  CHECK(strcmp(muster_client_message(c), "requires[0].level: -4, expected 1 or more") == 0);
  CHECK_OK(c, muster_session_close(c, sid, NULL));
  muster_free(sid);
}

/* A transfer to a host that never completes the connection fails within the
 * handle's timeout, in the words of the JSON calls (libcurl's own connect
 * timeout, 300 s, used to hold it).  The bound is loose: only a wait far
 * beyond the timeout fails the check. */
static void test_connect_timeout(void) {
  int fds[2];
  char url[64];
  if (ctest_listener(0, fds, url, sizeof url) != 0) {
    CHECK(!"a loopback listener");
    return;
  }
  muster_client_t *c = NULL;
  CHECK_OK(c, muster_client_new(url, TOKEN, &c));
  muster_client_set_timeout(c, 500);
  char want[128];
  snprintf(want, sizeof want, "could not connect to 127.0.0.1 port %s: timed out",
           strrchr(url, ':') + 1);
  void *data = NULL;
  size_t len = 0;
  int64_t start = now_ms();
  CHECK_ERR(c, muster_shared_get(c, "ctest", "w", 0, &data, &len, NULL), MUSTER_NETWORK);
  CHECK(now_ms() - start < 500 + 10000);
  CHECK(contains(muster_client_message(c), want));
  start = now_ms();
  CHECK_ERR(c, muster_shared_set(c, "ctest", "w", "x", 1, -1, NULL), MUSTER_NETWORK);
  CHECK(now_ms() - start < 500 + 10000);
  CHECK(contains(muster_client_message(c), want));
  muster_client_free(c);
  ctest_listener_close(fds);
}

int main(int argc, char **argv) {
  static const char *const head_args[] = {"--server-only", "--shared-keep-levels", "2", NULL};
  if (!ctest_use_test_url(TOKEN) &&
      ctest_head_start(muster_bin(argv[0]), "/tmp/muster-ctest-shared-XXXXXX", TOKEN, head_args) !=
          0)
    return ctest_head_failed();
  muster_client_t *c = NULL;
  if (muster_client_new(head_url, head_token, &c) != MUSTER_OK)
    return ctest_head_failed();
  test_set_update_get(c);
  test_fd_transfers(c);
  test_list_delete_and_session(c);
  test_refused_negatives(c);
  test_stat(c);
  test_local_io(c);
  test_put_requiring(c);
  test_session_put_requiring(c);
  test_connect_timeout();
  muster_client_free(c);
  ctest_head_stop();
  return ctest_report();
}
