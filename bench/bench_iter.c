/*
 * bench_iter.c — iteration throughput: the standalone loader's indices per
 * second (a global shuffle over N = 10^9 samples, which must not allocate
 * O(N): the peak RSS is printed next to it), and a coordinated iteration's
 * blocks per second with 8 ranks leasing and acknowledging against a real
 * head.
 *
 * usage: bench_iter [--muster PATH] [--seconds S] [--ranks R] [--block B]
 *                   [--per-request K] [--sync full|normal] [--indices 0|1]
 *                   [--standalone 0|1]
 * Starts `PATH head` (default: `muster` next to this program) on a free
 * loopback port with a temporary data dir, and removes it at the end.
 * Prints one Markdown table row per measurement on stdout.
 *
 * `--indices 1` has the ranks ask for each block's sample indices, as the
 * coordinated loader does (their sum is printed, so that none goes unread):
 * the head writes them into the reply and libmuster reads them back, which
 * with large blocks is most of the work; `--ranks 1 --block 4096
 * --per-request 4 --indices 1 --standalone 0` is the one-rank loader's case
 * of docs/performance.md (eighth round, item 39) without the loader around
 * it.  `--standalone 0` leaves out the two standalone rows.
 */
#include "muster.h"

#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"

#define TOKEN "bench-iter-token-0123456789"

static double seconds = 3.0;
static int ranks = 8, per_request = 4, with_indices = 0, standalone = 1;
static uint64_t block = 256;
static const char *sync_mode = "full";
static char url[256], dir[256];
static pid_t head;

static long peak_rss_mib(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024;
}

/* Standalone: indices per second of one rank of 8, global shuffle, N = 10^9. */
static void bench_standalone(size_t prefetch) {
  muster_iter_config_t cfg;
  muster_iter_config_init(&cfg);
  cfg.num_samples = 1000000000ULL;
  cfg.shuffle = "global";
  cfg.seed = 1;
  cfg.world_size = 8;
  muster_loader_opts_t opts;
  muster_loader_opts_init(&opts);
  opts.config = &cfg;
  opts.prefetch = prefetch;
  muster_loader_t *l = NULL;
  if (muster_loader_open(&opts, &l, NULL) != MUSTER_OK) {
    fprintf(stderr, "bench_iter: cannot open the loader\n");
    return;
  }
  uint64_t batch[1024], count = 0, sum = 0;
  size_t got;
  int64_t start = bench_now_ns(), end = start + (int64_t)(seconds * 1e9);
  while (bench_now_ns() < end) {
    muster_loader_next_batch(l, batch, NULL, 1024, &got);
    for (size_t i = 0; i < got; i++)
      sum += batch[i];
    count += got;
  }
  double elapsed = (double)(bench_now_ns() - start) / 1e9;
  printf("| standalone loader, global shuffle, N = 10^9, rank 0 of 8%s | %.2f M indices/s | "
         "peak RSS %ld MiB (checksum %llu) |\n",
         prefetch ? ", prefetch thread" : "", (double)count / elapsed / 1e6, peak_rss_mib(),
         (unsigned long long)(sum % 1000));
  muster_loader_close(l);
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  return remove(path);
}

static int head_start(const char *bin) {
  snprintf(dir, sizeof dir, "%s/muster-bench-iter-XXXXXX",
           getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (mkdtemp(dir) == NULL)
    return -1;
  char log[512], url_path[512];
  snprintf(log, sizeof log, "%s/head.log", dir);
  snprintf(url_path, sizeof url_path, "%s/url", dir);
  if ((head = fork()) == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    execl(bin, bin, "head", "--listen", "127.0.0.1:0", "--data-dir", dir, "--token", TOKEN,
          "--sync", sync_mode, (char *)NULL);
    _exit(127);
  }
  for (int i = 0; i < 1000; i++, bench_sleep_ms(20)) {
    FILE *f = fopen(url_path, "r");
    if (f && fgets(url, sizeof url, f) && (url[strcspn(url, "\n")] = '\0', url[0])) {
      fclose(f);
      return 0;
    }
    if (f)
      fclose(f);
  }
  return -1;
}

typedef struct {
  uint32_t rank;
  uint64_t blocks, samples;
  uint64_t checksum; /* the sum of the indices read (--indices 1) */
  int64_t stop_ns;
} rank_t;

/* One rank: lease `per_request` blocks, acknowledge them, again. */
static void *rank_main(void *arg) {
  rank_t *r = arg;
  muster_client_t *c = NULL;
  if (muster_client_new(url, TOKEN, &c) != MUSTER_OK)
    return NULL;
  uint64_t blocks[64];
  int64_t tokens[64];
  uint64_t epoch = 0;
  while (bench_now_ns() < r->stop_ns) {
    muster_iter_next_t next;
    if (muster_iter_next(c, "bench", r->rank, epoch, (size_t)per_request, with_indices, &next) !=
        MUSTER_OK) {
      fprintf(stderr, "bench_iter: next: %s\n", muster_client_message(c));
      break;
    }
    if (next.state == MUSTER_ITER_EPOCH_END) {
      epoch++;
    } else if (next.count > 0) {
      for (size_t i = 0; i < next.count; i++) {
        blocks[i] = next.blocks[i].block;
        tokens[i] = next.blocks[i].token;
        r->samples += next.blocks[i].end - next.blocks[i].begin;
        for (uint64_t k = 0; with_indices && k < next.blocks[i].end - next.blocks[i].begin; k++)
          r->checksum += next.blocks[i].indices[k];
      }
      if (muster_iter_ack(c, "bench", r->rank, epoch, blocks, tokens, next.count) == MUSTER_OK)
        r->blocks += next.count;
    }
    muster_iter_next_free(&next);
  }
  muster_client_free(c);
  return NULL;
}

static void bench_coordinated(void) {
  muster_client_t *c = NULL;
  muster_client_new(url, TOKEN, &c);
  muster_iter_config_t cfg;
  muster_iter_config_init(&cfg);
  cfg.num_samples = 1000000000ULL;
  cfg.shuffle = "global";
  cfg.strategy = "dynamic";
  cfg.world_size = (uint32_t)ranks;
  cfg.block_size = block;
  cfg.epochs = 0;
  if (muster_iter_create(c, "bench", &cfg, NULL, -1, NULL) != MUSTER_OK) {
    fprintf(stderr, "bench_iter: create: %s\n", muster_client_message(c));
    muster_client_free(c);
    return;
  }
  pthread_t threads[256];
  rank_t rs[256];
  int64_t start = bench_now_ns();
  for (int i = 0; i < ranks; i++) {
    rs[i] = (rank_t){.rank = (uint32_t)i, .stop_ns = start + (int64_t)(seconds * 1e9)};
    pthread_create(&threads[i], NULL, rank_main, &rs[i]);
  }
  uint64_t blocks = 0, samples = 0, checksum = 0;
  for (int i = 0; i < ranks; i++) {
    pthread_join(threads[i], NULL);
    blocks += rs[i].blocks;
    samples += rs[i].samples;
    checksum += rs[i].checksum;
  }
  double elapsed = (double)(bench_now_ns() - start) / 1e9;
  char indices[64] = "";
  if (with_indices)
    snprintf(indices, sizeof indices, " (indices read, checksum %llu)",
             (unsigned long long)(checksum % 1000));
  printf("| coordinated dynamic, %d ranks, %d blocks of %llu per request%s, --sync %s | %.0f "
         "blocks/s | %.2f M samples/s%s |\n",
         ranks, per_request, (unsigned long long)block, with_indices ? " with indices" : "",
         sync_mode, (double)blocks / elapsed, (double)samples / elapsed / 1e6, indices);
  muster_client_free(c);
}

int main(int argc, char **argv) {
  char bin[1024];
  const char *slash = strrchr(argv[0], '/');
  snprintf(bin, sizeof bin, "%.*smuster", slash ? (int)(slash - argv[0] + 1) : 0, argv[0]);
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--muster") == 0)
      snprintf(bin, sizeof bin, "%s", argv[i + 1]);
    else if (strcmp(argv[i], "--seconds") == 0)
      seconds = atof(argv[i + 1]);
    else if (strcmp(argv[i], "--ranks") == 0)
      ranks = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--block") == 0)
      block = strtoull(argv[i + 1], NULL, 10);
    else if (strcmp(argv[i], "--per-request") == 0)
      per_request = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--sync") == 0)
      sync_mode = argv[i + 1];
    else if (strcmp(argv[i], "--indices") == 0)
      with_indices = atoi(argv[i + 1]) != 0;
    else if (strcmp(argv[i], "--standalone") == 0)
      standalone = atoi(argv[i + 1]) != 0;
  }
  if (ranks < 1 || ranks > 256 || per_request < 1 || per_request > 64 || seconds <= 0) {
    fprintf(stderr, "bench_iter: ranks 1..256, per-request 1..64, seconds > 0\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  printf("| measurement | rate | notes |\n| --- | --- | --- |\n");
  if (standalone) {
    bench_standalone(0);
    bench_standalone(4096);
  }
  int rc = 0;
  if (head_start(bin) == 0) {
    bench_coordinated();
  } else {
    fprintf(stderr, "bench_iter: the head (%s) did not start\n", bin);
    rc = 1;
  }
  if (head > 0) {
    kill(head, SIGTERM);
    waitpid(head, NULL, 0);
  }
  if (dir[0])
    nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  return rc;
}
