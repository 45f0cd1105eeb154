/*
 * bench_shared.c — shared-data read throughput: bytes/s of one level read from
 * a node cache (hits, and the cold miss that fetches it), from the head, and,
 * as the physical reference, `cat` of the cached file into a pipe.
 *
 * usage: bench_shared [--muster PATH] [--mib N] [--readers R] [--repeat K]
 * Starts `PATH head --server-only` and `PATH node` (its cache in the same
 * temporary directory) on free loopback ports, uploads N MiB levels (default
 * 256) to the head, and measures each row K times (default 3), printing the
 * median as a Markdown table row; removes everything at the end.  The cold row
 * uploads a new blob per round, so each round is a real miss.  Readers are
 * threads with their own libcurl handle that count and discard the body, so
 * the rows measure the servers and the kernel, not a client's processing; R
 * (default 4) is the concurrent row's reader count.
 */
#include <curl/curl.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"

#define TOKEN "bench-shared-token-0123456789"
#define AUTH "Authorization: Bearer " TOKEN
#define MIB (1024L * 1024L)

static char dir[256], head_url[256], node_url[256];
static pid_t head_pid, node_pid;
static long blob_mib = 256;
static int readers = 4, repeat = 3;

/* ---- processes ------------------------------------------------------------- */

static pid_t spawn(const char *log, char *const argv[]) {
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    execv(argv[0], argv);
    _exit(127);
  }
  return pid;
}

/* Waits for `path` to hold a line starting with `prefix` (the rest into out); 0 or -1. */
static int wait_line(const char *path, const char *prefix, char *out, size_t size) {
  for (int i = 0; i < 1000; i++, bench_sleep_ms(20)) {
    FILE *f = fopen(path, "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
      line[strcspn(line, "\n")] = '\0';
      if (strncmp(line, prefix, strlen(prefix)) == 0 && line[strlen(prefix)]) {
        snprintf(out, size, "%s", line + strlen(prefix));
        fclose(f);
        return 0;
      }
    }
    if (f)
      fclose(f);
  }
  return -1;
}

static int start(const char *bin) {
  char path[600], lock[600], cache[600], log[600];
  snprintf(path, sizeof path, "%s/head.log", dir);
  char *head_argv[] = {(char *)bin,  "head", "--server-only", "--listen", "127.0.0.1:0",
                       "--data-dir", dir,    "--token",       TOKEN,      NULL};
  head_pid = spawn(path, head_argv);
  snprintf(path, sizeof path, "%s/url", dir);
  if (wait_line(path, "", head_url, sizeof head_url) != 0)
    return -1;
  snprintf(lock, sizeof lock, "%s/node.lock", dir);
  snprintf(cache, sizeof cache, "%s/cache", dir);
  snprintf(log, sizeof log, "%s/node.log", dir);
  char *node_argv[] = {(char *)bin,   "node",   "--join",      head_url,   "--token",
                       TOKEN,         "--name", "bench",       "--listen", "127.0.0.1:0",
                       "--lock-file", lock,     "--cache-dir", cache,      NULL};
  node_pid = spawn(log, node_argv);
  return wait_line(lock, "listen ", node_url, sizeof node_url);
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  return remove(path);
}

/* ---- HTTP ---------------------------------------------------------------------- */

static size_t count_body(char *data, size_t size, size_t n, void *arg) {
  *(long *)arg += (long)(size * n);
  return size * n;
}

typedef struct {
  long remaining; /* upload: bytes left to send */
  uint64_t state; /* upload: the pattern's generator */
} upload_t;

static size_t upload_read(char *buf, size_t size, size_t n, void *arg) {
  upload_t *u = arg;
  size_t len = size * n < (size_t)u->remaining ? size * n : (size_t)u->remaining;
  for (size_t i = 0; i + 8 <= len; i += 8) { /* xorshift: incompressible, cheap */
    u->state ^= u->state << 13;
    u->state ^= u->state >> 7;
    u->state ^= u->state << 17;
    memcpy(buf + i, &u->state, 8);
  }
  u->remaining -= (long)len;
  return len;
}

/* Uploads blob_mib MiB of incompressible bytes as level 1 of bench/`name`; 0 or -1. */
static int upload(const char *name) {
  CURL *c = curl_easy_init();
  char url[400];
  snprintf(url, sizeof url, "%s/v1/shared/bench/%s", head_url, name);
  upload_t u = {blob_mib * MIB, 88172645463325252ULL};
  struct curl_slist *h = curl_slist_append(NULL, AUTH);
  h = curl_slist_append(h, "Content-Type: application/octet-stream");
  h = curl_slist_append(h, "Expect:");
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
  curl_easy_setopt(c, CURLOPT_READFUNCTION, upload_read);
  curl_easy_setopt(c, CURLOPT_READDATA, &u);
  curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, (curl_off_t)u.remaining);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
  long status = 0, ignored = 0;
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, count_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &ignored);
  CURLcode rc = curl_easy_perform(c);
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  curl_slist_free_all(h);
  curl_easy_cleanup(c);
  return rc == CURLE_OK && status == 201 ? 0 : -1;
}

typedef struct {
  const char *base, *name;
  long bytes;
  pthread_barrier_t *go;
} reader_t;

static void *reader_main(void *arg) {
  reader_t *r = arg;
  CURL *c = curl_easy_init();
  char url[400];
  snprintf(url, sizeof url, "%s/v1/shared/bench/%s?level=1", r->base, r->name);
  struct curl_slist *h = curl_slist_append(NULL, AUTH);
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, count_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &r->bytes);
  curl_easy_setopt(c, CURLOPT_BUFFERSIZE, 512L * 1024);
  pthread_barrier_wait(r->go);
  curl_easy_perform(c);
  curl_slist_free_all(h);
  curl_easy_cleanup(c);
  return NULL;
}

/* Reads the level from `base` with n concurrent readers; aggregate bytes/s, or -1. */
static double read_once(const char *base, const char *name, int n) {
  pthread_t threads[64];
  reader_t rs[64];
  pthread_barrier_t go;
  pthread_barrier_init(&go, NULL, (unsigned)n + 1);
  for (int i = 0; i < n; i++) {
    rs[i] = (reader_t){.base = base, .name = name, .go = &go};
    pthread_create(&threads[i], NULL, reader_main, &rs[i]);
  }
  pthread_barrier_wait(&go);
  int64_t t0 = bench_now_ns();
  long total = 0, bad = 0;
  for (int i = 0; i < n; i++) {
    pthread_join(threads[i], NULL);
    total += rs[i].bytes;
    bad += rs[i].bytes != blob_mib * MIB;
  }
  double s = (double)(bench_now_ns() - t0) / 1e9;
  pthread_barrier_destroy(&go);
  return bad ? -1 : (double)total / s;
}

/* `cat FILE` into a pipe we drain: the same bytes, page cache to a reader. */
static double cat_once(const char *file) {
  int fds[2];
  if (pipe(fds) != 0)
    return -1;
  int64_t t0 = bench_now_ns();
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    execlp("cat", "cat", file, (char *)NULL);
    _exit(127);
  }
  close(fds[1]);
  static char buf[1 << 20];
  long total = 0;
  ssize_t got;
  while ((got = read(fds[0], buf, sizeof buf)) > 0)
    total += got;
  close(fds[0]);
  waitpid(pid, NULL, 0);
  return total == blob_mib * MIB ? (double)total / ((double)(bench_now_ns() - t0) / 1e9) : -1;
}

/* `cat FILE > NEW`: the same bytes from the page cache into a new file, what a
 * cold read must do at least (the cache writes the level before serving it). */
static double cat_to_file_once(const char *file) {
  char copy[800];
  snprintf(copy, sizeof copy, "%s/copy.bin", dir);
  int out = open(copy, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0)
    return -1;
  int64_t t0 = bench_now_ns();
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out, 1);
    execlp("cat", "cat", file, (char *)NULL);
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  double s = (double)(bench_now_ns() - t0) / 1e9;
  struct stat st;
  int ok = fstat(out, &st) == 0 && st.st_size == blob_mib * MIB && WIFEXITED(status) &&
           WEXITSTATUS(status) == 0;
  close(out);
  unlink(copy);
  return ok ? (double)(blob_mib * MIB) / s : -1;
}

/* ---- measurements -------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void row(const char *what, double rates[], int k) {
  qsort(rates, (size_t)k, sizeof *rates, cmp_double);
  double median = rates[k / 2];
  if (rates[0] < 0)
    printf("| %s | failed | |\n", what);
  else
    printf("| %s | %.0f MiB/s | %.2f GB/s |\n", what, median / MIB, median / 1e9);
  fflush(stdout);
}

static size_t keep_body(char *data, size_t size, size_t n, void *arg) {
  char *buf = arg;
  size_t len = strlen(buf), add = size * n;
  if (len + add < 2048) {
    memcpy(buf + len, data, add);
    buf[len + add] = '\0';
  }
  return add;
}

/* The path of the node cache's file of bench/`name` (from GET /v1/node/cache/...); 0 or -1. */
static int cached_path(const char *name, char *out, size_t size) {
  char url[400], body[2048] = "";
  snprintf(url, sizeof url, "%s/v1/node/cache/bench/%s?level=1", node_url, name);
  CURL *c = curl_easy_init();
  struct curl_slist *h = curl_slist_append(NULL, AUTH);
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, keep_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, (void *)body);
  CURLcode rc = curl_easy_perform(c);
  curl_slist_free_all(h);
  curl_easy_cleanup(c);
  const char *at = strstr(body, "\"path\":\"");
  if (rc != CURLE_OK || at == NULL)
    return -1;
  at += 8;
  snprintf(out, size, "%.*s", (int)strcspn(at, "\""), at);
  return 0;
}

int main(int argc, char **argv) {
  char bin[1024];
  const char *slash = strrchr(argv[0], '/');
  snprintf(bin, sizeof bin, "%.*smuster", slash ? (int)(slash - argv[0] + 1) : 0, argv[0]);
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--muster") == 0)
      snprintf(bin, sizeof bin, "%s", argv[i + 1]);
    else if (strcmp(argv[i], "--mib") == 0)
      blob_mib = atol(argv[i + 1]);
    else if (strcmp(argv[i], "--readers") == 0)
      readers = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--repeat") == 0)
      repeat = atoi(argv[i + 1]);
  }
  if (blob_mib < 1 || readers < 1 || readers > 64 || repeat < 1 || repeat > 15) {
    fprintf(stderr, "bench_shared: --mib >= 1, --readers 1..64, --repeat 1..15\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  curl_global_init(CURL_GLOBAL_DEFAULT);
  snprintf(dir, sizeof dir, "%s/muster-bench-shared-XXXXXX",
           getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  int rc = 1;
  if (mkdtemp(dir) == NULL || start(bin) != 0) {
    fprintf(stderr, "bench_shared: could not start the head and node or upload (logs in %s)\n",
            dir);
    goto out;
  }
  char file[700], label[200], name[32];
  double rates[15];
  printf("| %ld MiB level, %s | bytes/s (median of %d) | |\n| --- | ---: | ---: |\n", blob_mib,
         "muster head --server-only and muster node on loopback", repeat);
  /* Cold: a level the cache has never seen, each round (fetch from the head + serve). */
  for (int k = 0; k < repeat; k++) {
    snprintf(name, sizeof name, "cold-%d", k);
    rates[k] = upload(name) == 0 ? read_once(node_url, name, 1) : -1;
  }
  row("node cache, cold: served while fetched from the head, 1 reader", rates, repeat);
  for (int k = 0; k < repeat; k++)
    rates[k] = read_once(node_url, "cold-0", 1);
  row("node cache hit (sendfile), 1 reader", rates, repeat);
  for (int k = 0; k < repeat; k++)
    rates[k] = read_once(node_url, "cold-0", readers);
  snprintf(label, sizeof label, "node cache hit, %d concurrent readers (sum)", readers);
  row(label, rates, repeat);
  for (int k = 0; k < repeat; k++)
    rates[k] = read_once(head_url, "cold-0", 1);
  row("head (sendfile), 1 reader", rates, repeat);
  for (int k = 0; k < repeat; k++)
    rates[k] = read_once(head_url, "cold-0", readers);
  snprintf(label, sizeof label, "head, %d concurrent readers (sum)", readers);
  row(label, rates, repeat);
  if (cached_path("cold-0", file, sizeof file) != 0) {
    fprintf(stderr, "bench_shared: cannot find the cached file\n");
    goto out;
  }
  for (int k = 0; k < repeat; k++)
    rates[k] = cat_once(file);
  row("reference: `cat` of the cached file into a pipe, 1 reader", rates, repeat);
  for (int k = 0; k < repeat; k++)
    rates[k] = cat_to_file_once(file);
  row("reference: `cat` of the cached file into a new file (what a cold read writes)", rates,
      repeat);
  rc = 0;
out:
  if (node_pid > 0) {
    kill(node_pid, SIGTERM);
    waitpid(node_pid, NULL, 0);
  }
  if (head_pid > 0) {
    kill(head_pid, SIGTERM);
    waitpid(head_pid, NULL, 0);
  }
  if (dir[0])
    nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  curl_global_cleanup();
  return rc;
}
