/*
 * worker.c — a muster worker written in C against libmuster: it squares
 * numbers.  docs/client.md, "Writing a worker in C", walks through it.
 *
 *   cc -o worker worker.c $(pkg-config --cflags --libs muster)
 *   MUSTER_URL=http://127.0.0.1:7370 MUSTER_TOKEN=... ./worker QUEUE
 *
 * A task's payload is {"n": 7}, with "work_ms": 500 to make the work take
 * that long; its result is {"square": 49}.  A payload without an integer "n"
 * can never succeed, so its task fails permanently (no retry).  SIGTERM or
 * SIGINT: the worker finishes the task it runs, says goodbye (the head
 * releases anything it still holds at once) and exits 0.
 */
#define _POSIX_C_SOURCE 200809L /* sigaction, nanosleep */

#include <muster.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LEASE_WAIT_MS 2000 /* a long-poll: also how long an idle worker takes to see SIGTERM */
#define ACK_TRIES 30       /* an acknowledgement is sent again, once a second, this often */

static volatile sig_atomic_t stopping; /* set by SIGTERM and SIGINT */

static void on_signal(int sig) {
  (void)sig;
  stopping = 1;
}

static void sleep_ms(long long ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* Reads integer field `key` of a flat JSON object; 0 when it has none. */
static int read_field(const char *payload, const char *key, long long *out) {
  char pattern[32];
  snprintf(pattern, sizeof pattern, "\"%s\":", key);
  const char *at = payload[0] == '{' ? strstr(payload, pattern) : NULL;
  if (at == NULL)
    return 0;
  char *end;
  *out = strtoll(at + strlen(pattern), &end, 10);
  return end != at + strlen(pattern);
}

/* Runs one task: 1 with its result in `result`, or 0 with why it can never
 * succeed in `error`. */
static int run_task(const char *payload, char *result, size_t rsize, char *error, size_t esize) {
  long long n = 0, work_ms = 0;
  if (!read_field(payload, "n", &n)) {
    snprintf(error, esize, "payload %.200s: expected {\"n\": INTEGER}", payload);
    return 0;
  }
  if (read_field(payload, "work_ms", &work_ms) && work_ms > 0)
    sleep_ms(work_ms); /* the heartbeat thread keeps the worker alive meanwhile */
  snprintf(result, rsize, "{\"square\": %lld}", n * n);
  return 1;
}

/* True for the failures of a head that is down or restarting: send again. */
static int transient(muster_err_t err) {
  return err == MUSTER_NETWORK || err == MUSTER_UNAVAILABLE;
}

/* Completes (`ok`) or fails `ack`, sent again while the head does not answer:
 * a repeat of an acknowledgement that landed is answered MUSTER_OK. */
static muster_err_t acknowledge(muster_client_t *client, const muster_ack_t *ack, int ok) {
  muster_err_t err = MUSTER_NETWORK;
  for (int try = 0; try < ACK_TRIES && transient(err); try++) {
    if (try > 0)
      sleep_ms(1000);
    err = ok ? muster_complete(client, ack, 1) : muster_fail(client, ack, 1);
  }
  return err;
}

/*
 * Runs the task of `*lease` and acknowledges it.  A success is completed
 * together with the lease of the next task in one request (unless stopping),
 * which replaces *lease and *count; the caller frees what is left.  MUSTER_OK,
 * or the error the worker cannot go on from.
 */
static muster_err_t finish(muster_client_t *client, muster_worker_beat_t *beat, const char *queue,
                           int64_t worker, muster_lease_t **lease, size_t *count) {
  char result[64], error[256], progress[64];
  snprintf(progress, sizeof progress, "task %lld", (long long)(*lease)->task);
  muster_worker_beat_progress(beat, progress); /* shown on the dashboard */
  muster_ack_t ack;
  muster_ack_init(&ack, (*lease)->task, (*lease)->token);
  int ok = run_task((*lease)->payload, result, sizeof result, error, sizeof error);
  ack.result = result;
  ack.error = error;
  ack.permanent = 1; /* read only by a fail: this payload will never do */
  muster_lease_t *next = NULL;
  size_t got = 0;
  muster_err_t err = MUSTER_NETWORK;
  if (ok && !stopping)
    err = muster_complete_lease(client, &ack, 1, queue, worker, 1, -1, &next, &got, NULL);
  if (transient(err))
    err = acknowledge(client, &ack, ok); /* the next lease comes from the loop */
  if (err == MUSTER_LEASE_LOST)          /* it expired, or the task was taken over */
    err = MUSTER_OK;
  muster_leases_free(*lease, *count);
  *lease = next;
  *count = got;
  return err;
}

/* Leases and runs tasks until SIGTERM; 0, or 1 after an error it cannot go
 * on from (say the worker was declared gone). */
static int work(muster_client_t *client, muster_worker_beat_t *beat, const char *queue,
                int64_t worker) {
  muster_lease_t *leases = NULL;
  size_t count = 0;
  muster_err_t err = MUSTER_OK;
  while (!stopping && (err == MUSTER_OK || transient(err))) {
    if (transient(err))
      sleep_ms(1000);
    if (count == 0) {
      muster_leases_free(leases, count); /* an array of none is freed as well */
      leases = NULL;
      err = muster_lease(client, queue, worker, 1, LEASE_WAIT_MS, &leases, &count);
    } else
      err = finish(client, beat, queue, worker, &leases, &count);
  }
  if (err != MUSTER_OK && !transient(err))
    fprintf(stderr, "worker: %s: %s\n", muster_err_name(err), muster_client_message(client));
  muster_leases_free(leases, count); /* a lease still held is released by the goodbye */
  return err == MUSTER_OK || transient(err) ? 0 : 1;
}

/* Registers a worker serving `queue`; its id, or 0 with the reason said. */
static int64_t register_worker(muster_client_t *client, const char *queue) {
  const char *queues[] = {queue, NULL};
  muster_worker_opts_t opts;
  muster_worker_opts_init(&opts);
  opts.queues = queues;
  opts.nickname = "c-example";
  muster_worker_reg_t reg;
  muster_worker_reg_init(&reg);
  if (muster_worker_register_full(client, &opts, &reg) != MUSTER_OK) {
    fprintf(stderr, "worker: register: %s\n", muster_client_message(client));
    return 0;
  }
  printf("worker %lld (%s) serves %s; heartbeat timeout %lld ms\n", (long long)reg.id, reg.name,
         queue, (long long)reg.timeout_ms);
  fflush(stdout);
  muster_worker_reg_clear(&reg);
  return reg.id;
}

int main(int argc, char **argv) {
  const char *url = getenv("MUSTER_URL"), *token = getenv("MUSTER_TOKEN");
  if (argc != 2 || url == NULL) {
    fprintf(stderr, "usage: MUSTER_URL=URL MUSTER_TOKEN=TOKEN %s QUEUE\n", argv[0]);
    return 2;
  }
  struct sigaction sa = {.sa_handler = on_signal};
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  muster_client_t *client = NULL;
  char *why = NULL;
  if (muster_client_open(url, token, &client, &why) != MUSTER_OK) {
    fprintf(stderr, "worker: %s\n", why);
    muster_free(why);
    return 2;
  }
  int64_t id = register_worker(client, argv[1]);
  muster_worker_beat_t *beat = NULL;
  if (id > 0 && muster_worker_beat_start(client, id, -1, &beat) != MUSTER_OK)
    fprintf(stderr, "worker: heartbeat: %s\n", muster_client_message(client));
  int rc = beat != NULL ? work(client, beat, argv[1], id) : 1;
  muster_worker_beat_stop(beat); /* before the goodbye: a beat after it would be refused */
  if (id > 0 && muster_worker_bye(client, id) == MUSTER_OK)
    printf("worker %lld: goodbye\n", (long long)id);
  muster_client_free(client);
  return rc;
}
