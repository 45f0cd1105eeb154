/*
 * driver_pool_counts.c — what a libmuster pool counts, for a test that also
 * asks Python's Pool on the same setup (tests/python/test_pool_nodes_count.py).
 *
 *   driver_pool_counts URL TOKEN QUEUE SESSION
 *
 * Attaches a pool to the open session SESSION of queue QUEUE (no heartbeat
 * thread, the session left open), prints one line "workers W nodes N"
 * (muster_pool_workers_count and muster_pool_nodes_count) and exits 0; on a
 * failure it prints "error NAME MESSAGE" and exits 1.
 */
#include "muster.h"

#include <stdio.h>

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: driver_pool_counts URL TOKEN QUEUE SESSION\n");
    return 2;
  }
  muster_pool_opts_t opts;
  muster_pool_opts_init(&opts);
  opts.url = argv[1];
  opts.token = argv[2];
  opts.queue = argv[3];
  opts.session = argv[4];
  opts.create_queue = 0;
  opts.heartbeat_ms = 0;
  opts.keep_session = 1;
  muster_pool_t *pool = NULL;
  char *message = NULL;
  muster_err_t err = muster_pool_open(&opts, &pool, &message);
  if (err != MUSTER_OK) {
    printf("error %s %s\n", muster_err_name(err), message ? message : "");
    muster_free(message);
    return 1;
  }
  size_t workers = 0, nodes = 0;
  err = muster_pool_workers_count(pool, &workers);
  if (err == MUSTER_OK)
    err = muster_pool_nodes_count(pool, &nodes);
  if (err == MUSTER_OK)
    printf("workers %zu nodes %zu\n", workers, nodes);
  else
    printf("error %s %s\n", muster_err_name(err), muster_pool_message(pool));
  muster_pool_close(pool);
  return err == MUSTER_OK ? 0 : 1;
}
