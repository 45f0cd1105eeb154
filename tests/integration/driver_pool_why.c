/*
 * driver_pool_why.c — a C program whose pool iterator runs out of time while
 * its jobs keep failing, and asks muster_pool_iter_failing why, for
 * tests/integration/test_c_pool_why.py.
 *
 *   driver_pool_why URL TOKEN QUEUE COUNT SCOPE NAME LEVEL WAIT_MS
 *
 * Opens a pool on QUEUE whose every task requires shared data SCOPE/NAME at
 * LEVEL, submits the inputs 1..COUNT with muster_pool_imap (ordered), prints
 * "session ID" (flushed) and waits for a line on stdin (the test's go-ahead,
 * once the jobs failed).  Then it waits WAIT_MS for a result, its deadline:
 * when none came it prints "late D of N: TEXT", D the results delivered and
 * TEXT muster_pool_iter_failing's, and exits 0; a result that came prints
 * "result ..." and exits 2; a failed call prints "error NAME MESSAGE" and
 * exits 1.
 */
#include "muster.h"

#include <stdio.h>
#include <stdlib.h>

/* Prints why `err` failed the pool's call; returns 1 (the exit status). */
static int said_error(const muster_pool_t *pool, const char *message, muster_err_t err) {
  printf("error %s %s\n", muster_err_name(err), pool ? muster_pool_message(pool) : message);
  return 1;
}

/* After the go-ahead: waits `wait_ms` for a result of `it` and says why none came. */
static int wait_and_ask(muster_pool_t *pool, muster_pool_iter_t *it, int64_t wait_ms) {
  muster_result_t r;
  int has = 0;
  muster_err_t err = muster_pool_iter_next(it, wait_ms, &r, &has);
  if (err != MUSTER_OK)
    return said_error(pool, NULL, err);
  if (has) {
    printf("result %s %s\n", r.state, r.ok ? r.result : r.error);
    muster_result_clear(&r);
    return 2;
  }
  size_t delivered = 0, total = 0;
  muster_pool_iter_progress(it, &delivered, &total);
  char *text = NULL;
  if ((err = muster_pool_iter_failing(it, &text)) != MUSTER_OK)
    return said_error(pool, NULL, err);
  printf("late %zu of %zu: %s\n", delivered, total, text);
  muster_free(text);
  return 0;
}

/* Submits 1..count and, after the go-ahead, waits and asks; the exit status. */
static int run(muster_pool_t *pool, size_t count, int64_t wait_ms) {
  char(*texts)[24] = calloc(count, sizeof *texts);
  const char **inputs = calloc(count, sizeof *inputs);
  int status = 1;
  muster_pool_iter_t *it = NULL;
  for (size_t i = 0; texts && inputs && i < count; i++) {
    snprintf(texts[i], sizeof texts[i], "%zu", i + 1);
    inputs[i] = texts[i];
  }
  muster_err_t err = texts && inputs ? muster_pool_imap(pool, inputs, count, 1, &it) : MUSTER_NOMEM;
  if (err != MUSTER_OK)
    status = said_error(texts && inputs ? pool : NULL, "out of memory", err);
  if (err == MUSTER_OK) {
    printf("session %s\n", muster_pool_session(pool));
    fflush(stdout);
    char line[16];
    status = fgets(line, sizeof line, stdin) ? wait_and_ask(pool, it, wait_ms) : 3;
  }
  muster_pool_iter_free(it);
  free(inputs);
  free(texts);
  return status;
}

int main(int argc, char **argv) {
  if (argc != 9 || atoll(argv[4]) < 1) {
    fprintf(stderr, "usage: %s URL TOKEN QUEUE COUNT SCOPE NAME LEVEL WAIT_MS\n", argv[0]);
    return 64;
  }
  muster_shared_level_t required = {argv[5], argv[6], atoll(argv[7])};
  muster_pool_opts_t opts;
  muster_pool_opts_init(&opts);
  opts.url = argv[1];
  opts.token = argv[2];
  opts.queue = argv[3];
  opts.required = &required;
  opts.required_count = 1;
  muster_pool_t *pool = NULL;
  char *message = NULL;
  muster_err_t err = muster_pool_open(&opts, &pool, &message);
  int status = err == MUSTER_OK ? run(pool, (size_t)atoll(argv[4]), atoll(argv[8]))
                                : said_error(NULL, message ? message : "", err);
  fflush(stdout);
  muster_free(message);
  muster_pool_close(pool);
  return status;
}
