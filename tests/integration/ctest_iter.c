/*
 * ctest_iter.c — the libmuster loader, standalone and coordinated.
 *
 * Standalone: the indices equal the core stream's, epochs and reset, len,
 * checkpoint and restore, prefetching with a slow load callback (hits and
 * misses counted, the buffer bounded), a zero world or block size refused, a
 * dataset without samples refused.
 * Held blocks: muster_iter_held lists, page by page, what muster_iter_next
 * leased, and leases nothing; bad ranks and names fail as the head says.
 * Coordinated: 4 rank processes consume an epoch through loaders while one
 * of them is killed with SIGKILL holding leased blocks; every sample is then
 * consumed exactly once by the survivors plus what the victim had
 * acknowledged, and the victim's blocks were taken over — by any rank
 * (dynamic) or by its replica (static, replication 2).
 *
 * Starts `$MUSTER_BIN head` on a free port with a temporary data dir.
 * Ends with "N passed, M failed"; exits 1 when M > 0.
 */
#include "ctest_util.h"

#include <errno.h>
#include <poll.h>

#include "core/partition.h"
#include "core/stream.h"

#define TOKEN "ctest-iter-token-0123456789"

/* ---- standalone ---------------------------------------------------------------------- */

static void standalone_config(muster_iter_config_t *cfg, uint64_t n) {
  muster_iter_config_init(cfg);
  cfg->num_samples = n;
  cfg->shuffle = "global";
  cfg->seed = 42;
  cfg->world_size = 3;
  cfg->epochs = 2;
  cfg->block_size = 4;
}

static muster_loader_t *open_standalone(const muster_iter_config_t *cfg, uint32_t rank,
                                        size_t prefetch) {
  muster_loader_opts_t opts;
  muster_loader_opts_init(&opts);
  opts.config = cfg;
  opts.rank = rank;
  opts.prefetch = prefetch;
  return ctest_loader_open(&opts);
}

static void test_standalone_matches_stream(void) {
  muster_iter_config_t cfg;
  standalone_config(&cfg, 10);
  for (size_t prefetch = 0; prefetch <= 3; prefetch += 3) {
    muster_loader_t *l = open_standalone(&cfg, 0, prefetch);
    CHECK(l != NULL);
    if (l == NULL)
      return;
    uint64_t got[16];
    const uint64_t want[] = {4, 7, 8, 0}; /* docs/iterations.md: global + round_robin */
    CHECK(muster_loader_len(l) == 4 && !muster_loader_is_empty(l));
    CHECK(ctest_loader_drain(l, got, 16) == 4 && memcmp(got, want, sizeof want) == 0);
    CHECK(ctest_loader_drain(l, got, 16) == 0); /* stays at the end */
    CHECK(muster_loader_reset(l) == MUSTER_OK);
    CHECK(ctest_loader_drain(l, got, 16) == 4);      /* epoch 1 */
    CHECK(muster_loader_reset(l) == MUSTER_INVALID); /* epochs = 2 */
    muster_loader_close(l);
  }
  muster_loader_close(NULL);
}

static void test_standalone_checkpoint(void) {
  muster_iter_config_t cfg;
  standalone_config(&cfg, 1000);
  cfg.strategy = "hash"; /* a sample strategy: restore scans */
  muster_loader_t *a = open_standalone(&cfg, 1, 5), *b = open_standalone(&cfg, 1, 0),
                  *c = open_standalone(&cfg, 2, 0);
  uint64_t first[400], rest_a[400], rest_b[400], index;
  int has;
  CHECK(ctest_loader_drain(a, first, 100) == 100);
  char *ck = NULL;
  CHECK(muster_loader_get_checkpoint(a, &ck) == MUSTER_OK && ck != NULL);
  size_t na = ctest_loader_drain(a, rest_a, 400);
  CHECK(muster_loader_restore(b, ck) == MUSTER_OK);

  size_t nb = ctest_loader_drain(b, rest_b, 400);
  CHECK(na > 0 && na == nb && memcmp(rest_a, rest_b, na * sizeof *rest_a) == 0);
  CHECK(muster_loader_restore(c, ck) == MUSTER_INVALID); /* another rank */
  CHECK(muster_loader_restore(c, "{}") == MUSTER_INVALID);
  CHECK(muster_loader_next(c, &index, NULL, &has) == MUSTER_OK && has);
  muster_loader_stats_t st;
  muster_loader_stats(a, &st);
  CHECK(st.checkpoints == 1 && st.samples_loaded == 100 + na);
  muster_free(ck);
  muster_loader_close(a);
  muster_loader_close(b);
  muster_loader_close(c);
}

/* A zero world size (or block size) is refused as the head refuses it, not
 * taken as the default: rank 0 of "0 ranks" read the whole dataset. */
static void test_standalone_zero_sizes_refused(void) {
  muster_iter_config_t cfg;
  standalone_config(&cfg, 10);
  cfg.world_size = 0;
  muster_loader_opts_t opts;
  muster_loader_opts_init(&opts);
  opts.config = &cfg;
  muster_loader_t *l = NULL;
  char *message = NULL;
  CHECK(muster_loader_open(&opts, &l, &message) == MUSTER_INVALID && l == NULL);
  CHECK(message != NULL && strstr(message, "world_size: 0") != NULL);
  muster_free(message);
  message = NULL;
  cfg.world_size = 3;
  cfg.block_size = 0;
  CHECK(muster_loader_open(&opts, &l, &message) == MUSTER_INVALID && l == NULL);
  CHECK(message != NULL && strstr(message, "block_size: 0") != NULL);
  muster_free(message);
}

/* A dataset without samples is refused, as the head refuses to create such an
 * iteration (in its words, naming the option): every epoch would end at once
 * with nothing for any rank, the symptom of a wrong count, not a wish. */
static void test_standalone_empty_dataset_refused(void) {
  muster_iter_config_t cfg;
  standalone_config(&cfg, 0);
  muster_loader_opts_t opts;
  muster_loader_opts_init(&opts);
  opts.config = &cfg;
  muster_loader_t *l = NULL;
  char *message = NULL;
  CHECK(muster_loader_open(&opts, &l, &message) == MUSTER_INVALID && l == NULL);
  CHECK(message != NULL && strstr(message, "dataset: it has no samples (num_samples 0") != NULL);
  muster_free(message);
  message = NULL;
  const uint64_t empty_shards[] = {0, 0};
  cfg.num_shards = 2;
  cfg.shard_counts = empty_shards;
  CHECK(muster_loader_open(&opts, &l, &message) == MUSTER_INVALID && l == NULL);
  CHECK(message != NULL && strstr(message, "no samples") != NULL);
  muster_free(message);
  const uint64_t one_sample[] = {0, 1}; /* one sample is enough */
  cfg.shard_counts = one_sample;
  CHECK(muster_loader_open(&opts, &l, NULL) == MUSTER_OK && l != NULL);
  muster_loader_close(l);
}

static int slow_load(void *user, uint64_t index, void **sample) {
  (void)user;
  struct timespec ts = {0, 2000000}; /* the work a real load does: 2 ms */
  nanosleep(&ts, NULL);
  uint64_t *value = malloc(sizeof *value);
  if (value == NULL)
    return -1;
  *value = index * 10;
  *sample = value;
  return 0;
}

static void free_sample(void *user, void *sample) {
  (void)user;
  free(sample);
}

static void test_prefetch_slow_load(void) {
  muster_iter_config_t cfg;
  standalone_config(&cfg, 300);
  muster_loader_opts_t opts;
  muster_loader_opts_init(&opts);
  opts.config = &cfg;
  opts.prefetch = 8;
  opts.load = slow_load;
  opts.free_sample = free_sample;
  muster_loader_t *l = NULL;
  CHECK(muster_loader_open(&opts, &l, NULL) == MUSTER_OK);
  if (l == NULL)
    return;
  muster_loader_stats_t st;
  /* Let the thread fill the buffer (poll, with a deadline). */
  for (int64_t deadline = now_ms() + 10000; now_ms() < deadline; usleep(1000)) {
    muster_loader_stats(l, &st);
    if (st.buffer_peak == 8)
      break;
  }
  CHECK(st.buffer_peak == 8);
  size_t taken = 0, right = 0;
  uint64_t index;
  void *sample;
  int has;
  while (muster_loader_next(l, &index, &sample, &has) == MUSTER_OK && has) {
    right += sample && *(uint64_t *)sample == index * 10;
    free(sample);
    taken++;
  }
  muster_loader_stats(l, &st);
  CHECK(taken == 100 && right == 100);
  CHECK(st.samples_loaded == 100);
  CHECK(st.prefetch_hits >= 8);                        /* the full buffer, taken at once */
  CHECK(st.prefetch_misses >= 10);                     /* then the consumer outran a 2 ms load */
  CHECK(st.prefetch_hits + st.prefetch_misses == 101); /* 100 samples and the end */
  CHECK(st.buffer_peak <= 8);
  CHECK(st.avg_load_time_us >= 1500);
  CHECK(st.utilization > 0 && st.utilization <= 1.0);
  CHECK(muster_loader_reset(l) == MUSTER_OK); /* drops what the thread had loaded */
  CHECK(muster_loader_next(l, &index, &sample, &has) == MUSTER_OK && has);
  free(sample);
  muster_loader_close(l); /* frees the buffered samples (ASan checks) */
}

/* A ring smaller and larger than the producer's runs: the batches the caller
 * takes are the unthreaded loader's sequence, whatever their sizes. */
static void test_prefetch_sequence(void) {
  muster_iter_config_t cfg;
  standalone_config(&cfg, 30000); /* rank 0 of 3: 10 000 samples */
  static uint64_t want[10000], got[10000];
  muster_loader_t *plain = open_standalone(&cfg, 0, 0);
  CHECK(plain && ctest_loader_drain(plain, want, 10000) == 10000);
  muster_loader_close(plain);
  const size_t rings[] = {1, 3, 700, 4096};
  for (size_t r = 0; r < sizeof rings / sizeof *rings; r++) {
    muster_loader_t *l = open_standalone(&cfg, 0, rings[r]);
    CHECK(l != NULL);
    if (l == NULL)
      return;
    size_t n = 0, got_now = 0, ask = 1;
    while (n < 10000 && muster_loader_next_batch(l, got + n, NULL, ask, &got_now) == MUSTER_OK &&
           got_now > 0) {
      n += got_now;
      ask = ask * 3 % 2000 + 1; /* 1, 4, 13, 40, ... mixed sizes */
    }
    CHECK(n == 10000 && memcmp(got, want, sizeof want) == 0);
    CHECK(muster_loader_next_batch(l, got, NULL, 10, &got_now) == MUSTER_OK && got_now == 0);
    muster_loader_stats_t st;
    muster_loader_stats(l, &st);
    CHECK(st.buffer_peak <= rings[r] && st.samples_loaded == 10000);
    muster_loader_close(l);
  }
}

static double process_cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A prefetch thread with a full ring, or at the end of its epoch, sleeps
 * until the caller takes items (it used to poll, taking about a third of a
 * CPU while the caller trained on what it had). */
static void test_prefetch_idle(void) {
  muster_iter_config_t cfg;
  standalone_config(&cfg, 3000);
  muster_loader_t *l = open_standalone(&cfg, 0, 16);
  CHECK(l != NULL);
  if (l == NULL)
    return;
  uint64_t index, got[1000];
  int has;
  CHECK(muster_loader_next(l, &index, NULL, &has) == MUSTER_OK && has);
  muster_loader_stats_t st = {0};
  for (int64_t deadline = now_ms() + 10000; now_ms() < deadline; usleep(1000)) {
    muster_loader_stats(l, &st);
    if (st.buffer_peak == 16)
      break;
  }
  CHECK(st.buffer_peak == 16);
  /* The window to observe: what a polling thread burns in it. */
  double cpu = process_cpu_s();
  usleep(300 * 1000);
  double full = process_cpu_s() - cpu;
  CHECK(full < 0.03);
  if (full >= 0.03)
    fprintf(stderr, "prefetch thread with a full ring used %.3f s of CPU in 0.3 s\n", full);
  CHECK(ctest_loader_drain(l, got, 1000) == 999); /* rank 0 of 3: 1000 samples */
  cpu = process_cpu_s();
  usleep(300 * 1000);
  double ended = process_cpu_s() - cpu;
  CHECK(ended < 0.03);
  if (ended >= 0.03)
    fprintf(stderr, "prefetch thread at the epoch's end used %.3f s of CPU in 0.3 s\n", ended);
  muster_loader_close(l);
}

/* ---- coordinated: rank processes, one of them killed ------------------------------------- */

#define N_SAMPLES 3000
#define BLOCK 20
#define RANKS 4
#define VICTIM_BLOCKS 5

static void coord_config(muster_iter_config_t *cfg, const char *strategy, int replication) {
  muster_iter_config_init(cfg);
  cfg->num_samples = N_SAMPLES;
  cfg->shuffle = "global";
  cfg->seed = 9;
  cfg->strategy = strategy;
  cfg->world_size = RANKS;
  cfg->block_size = BLOCK;
  cfg->lease_ms = 600;
  cfg->rank_timeout_ms = 600;
  cfg->replication = replication;
}

/* A rank process: consumes its epoch and writes what it consumed to FILE.
 * The victim instead stops after VICTIM_BLOCKS acknowledged blocks and one
 * more sample, writes those blocks' samples, tells the parent and waits to
 * be killed. */
static int rank_main(const char *name, const char *strategy, int replication, uint32_t rank,
                     int victim, int notify_fd) {
  muster_iter_config_t cfg;
  coord_config(&cfg, strategy, replication);
  muster_loader_opts_t opts;
  muster_loader_opts_init(&opts);
  opts.config = &cfg;
  opts.rank = rank;
  opts.url = head_url;
  opts.token = TOKEN;
  opts.name = name;
  opts.prefetch = 3 * BLOCK;
  muster_loader_t *l = NULL;
  char *message = NULL;
  if (muster_loader_open(&opts, &l, &message) != MUSTER_OK) {
    fprintf(stderr, "rank %u: open: %s\n", rank, message ? message : "?");
    return 1;
  }
  char path[512];
  snprintf(path, sizeof path, "%s/%s-rank-%u.txt", data_dir, name, rank);
  FILE *out = fopen(path, "w");
  uint64_t index;
  int has;
  size_t n = 0;
  while (muster_loader_next(l, &index, NULL, &has) == MUSTER_OK && has) {
    if (victim && n == VICTIM_BLOCKS * BLOCK) { /* one sample into the next block */
      muster_loader_stats_t st;
      for (int64_t deadline = now_ms() + 10000; now_ms() < deadline; usleep(1000)) {
        muster_loader_stats(l, &st);
        if (st.blocks_acked >= VICTIM_BLOCKS)
          break;
      }
      fclose(out);
      char byte = st.blocks_acked == VICTIM_BLOCKS ? 'k' : 'x';
      if (write(notify_fd, &byte, 1) != 1)
        return 1;
      for (;;)
        pause(); /* holding leases until SIGKILL */
    }
    fprintf(out, "%llu\n", (unsigned long long)index);
    n++;
  }
  muster_loader_close(l); /* sends the last ack */
  fclose(out);
  return 0;
}

/* Counts the indices written by every rank file of `name`. */
static void count_files(const char *name, int *counts) {
  for (uint32_t r = 0; r < RANKS; r++) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s-rank-%u.txt", data_dir, name, r);
    FILE *f = fopen(path, "r");
    unsigned long long v;
    while (f && fscanf(f, "%llu", &v) == 1)
      if (v < N_SAMPLES)
        counts[v]++;
    if (f)
      fclose(f);
  }
}

/* Runs one scenario: 4 loaders, rank `victim` killed mid-epoch. */
static void test_kill_rank(const char *name, const char *strategy, int replication,
                           uint32_t victim) {
  int pipefd[2];
  if (pipe(pipefd) != 0)
    return;
  pid_t pids[RANKS];
  for (uint32_t r = 0; r < RANKS; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      close(pipefd[0]);
      _exit(rank_main(name, strategy, replication, r, r == victim, pipefd[1]));
    }
  }
  close(pipefd[1]);
  struct pollfd pfd = {.fd = pipefd[0], .events = POLLIN};
  char byte = 0;
  CHECK(poll(&pfd, 1, 20000) == 1 && read(pipefd[0], &byte, 1) == 1 && byte == 'k');
  close(pipefd[0]);
  kill(pids[victim], SIGKILL); /* for real: no goodbye, leases held */
  int ok = 1;
  for (uint32_t r = 0; r < RANKS; r++) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    if (r != victim)
      ok &= WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  CHECK(ok);
  int *counts = calloc(N_SAMPLES, sizeof *counts);
  count_files(name, counts);
  int once = 0;
  for (int i = 0; i < N_SAMPLES; i++)
    once += counts[i] == 1;
  CHECK(once == N_SAMPLES); /* every sample acknowledged exactly once */
  if (once != N_SAMPLES)
    fprintf(stderr, "%s: %d of %d samples exactly once\n", name, once, N_SAMPLES);
  free(counts);
  muster_client_t *client = NULL;
  muster_client_new(head_url, TOKEN, &client);
  char *json = NULL;
  CHECK(muster_iter_status(client, name, &json) == MUSTER_OK);
  char want[64];
  snprintf(want, sizeof want, "\"rank\":%u,\"health\":\"failed\"", victim);
  CHECK(json && strstr(json, want) != NULL);
  CHECK(json && strstr(json, "\"finished\":true") != NULL);
  /* The victim's blocks went to others: someone took blocks over. */
  int taken = 0;
  for (const char *p = json; p && (p = strstr(p, "\"taken_over\":")) != NULL; p++)
    taken += atoi(p + 13);
  CHECK(taken > 0);
  if (replication > 1) { /* only the victim's replica may take its lane */
    char replica[64];
    snprintf(replica, sizeof replica, "\"rank\":%u,", (victim + 1) % RANKS);
    const char *row = json ? strstr(json, replica) : NULL;
    const char *t = row ? strstr(row, "\"taken_over\":") : NULL;
    CHECK(t && atoi(t + 13) == taken);
  }
  muster_free(json);
  muster_client_free(client);
}

/* ---- coordinated: the blocks a rank holds ------------------------------------------------ */

/* True when `held` lists blocks[from ...] of `next` in order, under the same
 * tokens and deadlines, with the same indices. */
static int held_matches(const muster_iter_held_t *held, const muster_iter_next_t *next,
                        size_t from) {
  if (from + held->count > next->count)
    return 0;
  for (size_t i = 0; i < held->count; i++) {
    const muster_iter_block_t *h = &held->blocks[i], *n = &next->blocks[from + i];
    if (h->block != n->block || h->token != n->token || h->deadline_ms != n->deadline_ms ||
        h->begin != n->begin || h->end != n->end || h->epoch != next->epoch || h->indices == NULL ||
        memcmp(h->indices, n->indices, (h->end - h->begin) * sizeof *h->indices) != 0)
      return 0;
  }
  return 1;
}

/* muster_iter_held lists what muster_iter_next leased, page by page, and
 * leases nothing: rank 1's next then gets the block after rank 0's.  A rank
 * not below the world size and an unknown iteration fail as the head says. */
static void test_held(void) {
  muster_client_t *c = connect_head(TOKEN);
  muster_iter_config_t cfg;
  coord_config(&cfg, "dynamic", 1);
  cfg.lease_ms = cfg.rank_timeout_ms = 60000;
  CHECK_OK(c, muster_iter_create(c, "held", &cfg, NULL, -1, NULL));
  muster_iter_next_t next = {0}, other = {0};
  muster_iter_held_t held = {0};
  CHECK_OK(c, muster_iter_next(c, "held", 0, 0, 3, MUSTER_ITER_INDICES, &next));
  CHECK(next.count == 3);
  size_t listed = 0;
  for (int64_t cursor = 0, pages = 0; cursor >= 0 && pages < 5; pages++) {
    CHECK_OK(c, muster_iter_held(c, "held", 0, (uint64_t)cursor, 2, MUSTER_ITER_INDICES, &held));
    CHECK(held.total == 3 && !held.finished && held_matches(&held, &next, listed));
    listed += held.count;
    cursor = held.next;
    muster_iter_held_free(&held);
  }
  CHECK(listed == 3);
  CHECK_OK(c, muster_iter_held(c, "held", 1, 0, 0, 0, &held));
  CHECK(held.count == 0 && held.total == 0 && held.next == -1);
  muster_iter_held_free(&held);
  CHECK_OK(c, muster_iter_next(c, "held", 1, 0, 1, 0, &other));
  CHECK(other.count == 1 && other.blocks[0].block == 3);
  CHECK_ERR(c, muster_iter_held(c, "held", RANKS, 0, 0, 0, &held), MUSTER_INVALID);
  CHECK(contains(muster_client_message(c), "query rank: 4 is not below world_size (4)"));
  CHECK_ERR(c, muster_iter_held(c, "no-such", 0, 0, 0, 0, &held), MUSTER_ITERATION_NOT_FOUND);
  CHECK(held.count == 0 && held.blocks == NULL);
  muster_iter_next_free(&next);
  muster_iter_next_free(&other);
  muster_client_free(c);
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  test_standalone_matches_stream();
  test_standalone_checkpoint();
  test_standalone_zero_sizes_refused();
  test_standalone_empty_dataset_refused();
  test_prefetch_slow_load();
  test_prefetch_sequence();
  test_prefetch_idle();
  static const char *const head_args[] = {"--sweep-ms", "20", NULL};
  if (ctest_head_start(muster_bin(argv[0]), "/tmp/muster-ctest-iter-XXXXXX", TOKEN, head_args) !=
      0) {
    ctest_head_stop();
    return 1;
  }
  test_kill_rank("kill-dynamic", "dynamic", 1, 3);
  test_kill_rank("kill-static", "round_robin", 2, 1);
  test_held();
  ctest_head_stop();
  return ctest_report();
}
