/*
 * driver_pool_map.c — libmuster's muster_pool_map as a C program calls it, for
 * tests/integration/test_c_pool_restart.py.
 *
 *   driver_pool_map URL TOKEN QUEUE COUNT SESSION_TIMEOUT_MS
 *
 * Opens a pool on QUEUE whose session has the timeout given, prints
 * "session ID" (flushed, so the test can watch the session), maps the inputs
 * 1..COUNT and prints "result R" for each result in input order ("failed
 * STATE ERROR" for a failed input) and exits 0; when open or map fails it
 * prints "error NAME MESSAGE" and exits 1.
 */
#include "muster.h"

#include <stdio.h>
#include <stdlib.h>

/* Maps 1..count through `pool` and prints the results; the map's code. */
static muster_err_t map_and_print(muster_pool_t *pool, size_t count) {
  char(*text)[24] = calloc(count ? count : 1, sizeof *text);
  const char **inputs = calloc(count ? count : 1, sizeof *inputs);
  if (text == NULL || inputs == NULL) {
    free(text);
    free(inputs);
    return MUSTER_NOMEM;
  }
  for (size_t i = 0; i < count; i++) {
    snprintf(text[i], sizeof text[i], "%zu", i + 1);
    inputs[i] = text[i];
  }
  muster_result_t *results = NULL;
  muster_err_t err = muster_pool_map(pool, inputs, count, &results);
  for (size_t i = 0; err == MUSTER_OK && i < count; i++) {
    if (results[i].ok)
      printf("result %s\n", results[i].result);
    else
      printf("failed %s %s\n", results[i].state, results[i].error ? results[i].error : "");
  }
  muster_pool_results_free(results, count);
  free(text);
  free(inputs);
  return err;
}

int main(int argc, char **argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: driver_pool_map URL TOKEN QUEUE COUNT SESSION_TIMEOUT_MS\n");
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
  err = map_and_print(pool, (size_t)strtoull(argv[4], NULL, 10));
  if (err != MUSTER_OK)
    printf("error %s %s\n", muster_err_name(err), muster_pool_message(pool));
  muster_pool_close(pool);
  return err == MUSTER_OK ? 0 : 1;
}
