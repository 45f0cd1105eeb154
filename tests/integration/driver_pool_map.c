/*
 * driver_pool_map.c — libmuster's muster_pool_map as a C program calls it, for
 * tests/integration/test_c_pool_restart.py.
 *
 *   driver_pool_map URL TOKEN QUEUE COUNT SESSION_TIMEOUT_MS [partial]
 *
 * Opens a pool on QUEUE whose session has the timeout given, prints
 * "session ID" (flushed, so the test can watch the session), maps the inputs
 * 1..COUNT and prints "result R" for each result in input order ("failed
 * STATE ERROR" for a failed input) and exits 0; when open or map fails it
 * prints "error NAME MESSAGE" and exits 1.
 *
 * With "partial" it maps with muster_pool_map_partial, and when that fails
 * it prints "error NAME MESSAGE" and "kept K unread U" (flushed), waits for a
 * line on stdin (the test brings the head back), maps the U inputs not read
 * again, and prints every result as above, the kept ones and the new.
 */
#include "muster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Prints results[0..count) in input order. */
static void print_results(const muster_result_t *results, size_t count) {
  for (size_t i = 0; i < count; i++) {
    if (results[i].ok)
      printf("result %s\n", results[i].result);
    else
      printf("failed %s %s\n", results[i].state ? results[i].state : "unread",
             results[i].error ? results[i].error : "");
  }
}

/* After a partial map of `inputs` failed with `err`: says so, waits for the
 * test's go-ahead and maps the inputs not read again, moving their results
 * into `results`.  The second map's code. */
static muster_err_t map_again(muster_pool_t *pool, const char **inputs, size_t count,
                              muster_result_t *results, size_t unread, muster_err_t err) {
  printf("error %s %s\nkept %zu unread %zu\n", muster_err_name(err), muster_pool_message(pool),
         count - unread, unread);
  fflush(stdout);
  char line[16];
  if (fgets(line, sizeof line, stdin) == NULL)
    return err;
  const char **again = calloc(unread ? unread : 1, sizeof *again);
  size_t *at = calloc(unread ? unread : 1, sizeof *at), n = 0, left = 0;
  for (size_t i = 0; again && at && i < count; i++)
    if (results[i].state == NULL) {
      at[n] = i;
      again[n++] = inputs[i];
    }
  muster_result_t *more = NULL;
  err = again && at && n == unread ? muster_pool_map_partial(pool, again, n, &more, &left)
                                   : MUSTER_NOMEM;
  for (size_t j = 0; err == MUSTER_OK && j < n; j++) {
    results[at[j]] = more[j];
    results[at[j]].index = (int64_t)at[j];
    memset(&more[j], 0, sizeof more[j]);
  }
  muster_pool_results_free(more, n);
  free(again);
  free(at);
  return err;
}

/* Maps 1..count through `pool` (whole, or `partial`) and prints the results;
 * the map's code. */
static muster_err_t map_and_print(muster_pool_t *pool, size_t count, int partial) {
  char(*text)[24] = calloc(count ? count : 1, sizeof *text);
  const char **inputs = calloc(count ? count : 1, sizeof *inputs);
  muster_result_t *results = NULL;
  muster_err_t err = MUSTER_NOMEM;
  size_t unread = 0;
  for (size_t i = 0; text && inputs && i < count; i++) {
    snprintf(text[i], sizeof text[i], "%zu", i + 1);
    inputs[i] = text[i];
  }
  if (text && inputs && !partial)
    err = muster_pool_map(pool, inputs, count, &results);
  else if (text && inputs)
    err = muster_pool_map_partial(pool, inputs, count, &results, &unread);
  if (err != MUSTER_OK && results != NULL)
    err = map_again(pool, inputs, count, results, unread, err);
  if (err == MUSTER_OK)
    print_results(results, count);
  muster_pool_results_free(results, count);
  free(text);
  free(inputs);
  return err;
}

int main(int argc, char **argv) {
  int partial = argc == 7 && strcmp(argv[6], "partial") == 0;
  if (argc != 6 && !partial) {
    fprintf(stderr, "usage: driver_pool_map URL TOKEN QUEUE COUNT SESSION_TIMEOUT_MS [partial]\n");
    return 2;
  }
  muster_pool_opts_t opts;
  muster_pool_opts_init(&opts);
  opts.url = argv[1];
  opts.token = argv[2];
  opts.queue = argv[3];
  opts.timeout_ms = atoll(argv[5]);
  muster_pool_t *pool = NULL;
  char *message = NULL;
  muster_err_t err = muster_pool_open(&opts, &pool, &message);
  if (err != MUSTER_OK) {
    printf("error %s %s\n", muster_err_name(err), message ? message : "");
    muster_free(message);
    return 1;
  }
  printf("session %s\n", muster_pool_session(pool));
  fflush(stdout);
  err = map_and_print(pool, (size_t)strtoull(argv[4], NULL, 10), partial);
  if (err != MUSTER_OK)
    printf("error %s %s\n", muster_err_name(err), muster_pool_message(pool));
  muster_pool_close(pool);
  return err == MUSTER_OK ? 0 : 1;
}
