/*
 * driver_loader.c — one coordinated rank of a libmuster loader, driven by a
 * test (tests/integration/test_loader_restart.py) through its standard input
 * and output.
 *
 *   driver_loader URL TOKEN NAME N BLOCK PREFETCH PER_REQUEST HEAD_WAIT_MS PAUSE_AFTER
 *
 * Opens a loader on iteration NAME (N samples, global shuffle, dynamic
 * strategy, world size 1, blocks of BLOCK, one epoch, leases of 10 minutes)
 * and prints each index
 * it takes, one per line.  After PAUSE_AFTER indices (0: never) it prints
 * "paused" and reads commands, one per line, until "go": "checkpoint" takes
 * the loader's checkpoint and prints "checkpoint ok JSON" or "checkpoint
 * ERROR MESSAGE".  A watcher thread prints "retrying" once, when the loader
 * first sends a request again because the head did not answer (its
 * head_retries statistic), so that the test acts on that, not after a
 * guessed delay.  At the end it prints "end ERROR acked=N retries=N MESSAGE"
 * (blocks acknowledged before the close, which sends the last acks), closes
 * the loader when a line "close" or the end of its input comes, prints
 * "closed" and exits 0 when ERROR is "ok".
 *
 * Every line goes out with one write(2), so the two threads' lines never mix.
 */
#include "muster.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static muster_loader_t *loader;
static atomic_bool done;

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void say(const char *fmt, ...) {
  char line[8192];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line - 1, fmt, ap);
  va_end(ap);
  if (n < 0)
    return;
  if ((size_t)n > sizeof line - 2)
    n = (int)(sizeof line - 2);
  line[n++] = '\n';
  if (write(STDOUT_FILENO, line, (size_t)n) != n)
    exit(2);
}

/* Watches the loader's statistics for its first retry (every 2 ms: a test
 * driver; the loader itself never polls). */
static void *watch(void *arg) {
  (void)arg;
  struct timespec pause = {0, 2 * 1000 * 1000};
  while (!atomic_load(&done)) {
    muster_loader_stats_t st;
    muster_loader_stats(loader, &st);
    if (st.head_retries > 0) {
      say("retrying");
      return NULL;
    }
    nanosleep(&pause, NULL);
  }
  return NULL;
}

/* Reads commands until "go" (or the end of input). */
static void commands(void) {
  say("paused");
  char line[256];
  while (fgets(line, sizeof line, stdin) != NULL && strncmp(line, "go", 2) != 0) {
    if (strncmp(line, "checkpoint", 10) != 0) {
      say("unknown command");
      continue;
    }
    char *text = NULL;
    muster_err_t err = muster_loader_get_checkpoint(loader, &text);
    if (err == MUSTER_OK)
      say("checkpoint ok %s", text);
    else
      say("checkpoint %s %s", muster_err_name(err), muster_loader_message(loader));
    muster_free(text);
  }
}

/* Opens the loader from the command line; its message on failure. */
static muster_err_t open_loader(char **argv, muster_iter_config_t *cfg, char **message) {
  muster_iter_config_init(cfg);
  cfg->num_samples = strtoull(argv[4], NULL, 10);
  cfg->block_size = strtoull(argv[5], NULL, 10);
  cfg->shuffle = "global";
  cfg->seed = 3;
  cfg->strategy = "dynamic";
  cfg->lease_ms = 600000; /* a block leased and never heard of stays leased: no expiry hides it */
  muster_loader_opts_t opts;
  muster_loader_opts_init(&opts);
  opts.config = cfg;
  opts.url = argv[1];
  opts.token = argv[2];
  opts.name = argv[3];
  opts.prefetch = strtoull(argv[6], NULL, 10);
  opts.blocks_per_request = strtoull(argv[7], NULL, 10);
  opts.head_wait_ms = strtoll(argv[8], NULL, 10);
  return muster_loader_open(&opts, &loader, message);
}

int main(int argc, char **argv) {
  if (argc != 10) {
    fprintf(stderr, "usage: driver_loader URL TOKEN NAME N BLOCK PREFETCH PER_REQUEST "
                    "HEAD_WAIT_MS PAUSE_AFTER\n");
    return 2;
  }
  unsigned long long pause_after = strtoull(argv[9], NULL, 10);
  muster_iter_config_t cfg;
  char *message = NULL;
  muster_err_t err = open_loader(argv, &cfg, &message);
  if (err != MUSTER_OK) {
    say("end %s acked=0 retries=0 %s", muster_err_name(err), message ? message : "");
    muster_free(message);
    return 1;
  }
  pthread_t watcher;
  pthread_create(&watcher, NULL, watch, NULL);
  uint64_t index;
  int has;
  unsigned long long taken = 0;
  while ((err = muster_loader_next(loader, &index, NULL, &has)) == MUSTER_OK && has) {
    say("%llu", (unsigned long long)index);
    if (++taken == pause_after)
      commands();
  }
  atomic_store(&done, true);
  pthread_join(watcher, NULL);
  muster_loader_stats_t st;
  muster_loader_stats(loader, &st); /* before close: its last acks are not counted */
  say("end %s acked=%llu retries=%llu %s", muster_err_name(err),
      (unsigned long long)st.blocks_acked, (unsigned long long)st.head_retries,
      muster_loader_message(loader));
  char line[64]; /* the test may restart a head first: close on a line or the end of input */
  if (fgets(line, sizeof line, stdin) == NULL || strncmp(line, "close", 5) == 0)
    muster_loader_close(loader); /* the last acks */
  say("closed");
  return err == MUSTER_OK ? 0 : 1;
}
