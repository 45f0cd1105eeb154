/*
 * bench_cycle.c — load generator for the full task cycle: put → lease → complete.
 *
 * Each client connection is one thread with its own connection, repeating
 * rounds of `--batch` tasks: one request puts them, lease requests take that
 * many back (timed: these are the lease latencies), one request completes
 * them.  With --batch 1 every request carries one task; with --batch 64 each
 * carries 64.  The run lasts --duration seconds after --warmup seconds (only
 * rounds that finish inside the measured window count), or until --tasks
 * tasks went through.  It prints one machine-readable line,
 *
 *   result system=muster conns=4 batch=64 tasks=... seconds=... tasks_per_s=...
 *          lease_requests=... lease_p50_us=... lease_p99_us=... lease_p999_us=...
 *
 * which bench/run turns into the comparison table.
 *
 * The systems ("backends") share that driver and differ only in how a round
 * is done:
 *   muster      libmuster against a head started by bench/run (--url, --token)
 *   muster-next the same, completing each round's tasks and leasing the next
 *               round's in one request (complete with "lease"): two round
 *               trips per round instead of three
 *   beanstalkd  its text protocol (put, reserve-with-timeout, delete); a batch
 *               pipelines its 64 puts, then 64 reserves, then 64 deletes, so a
 *               round is three round trips as with muster (--addr)
 *   pingpong    reference: one byte echoed over loopback TCP per "task"; the
 *               floor of any request/response protocol on this machine
 *   fsync       reference: one 4 KiB write + fdatasync per "task" in --dir,
 *               overwriting a preallocated file; the floor of a durable write
 *   fsync-append  the same, appending (the file grows with every write)
 *   redis       the reliable-queue pattern: LPUSH, BLMOVE to a processing
 *               list, LREM; pipelined per step like beanstalkd (--addr)
 * A new peer is one more bench_backend_t in the table at the end of the backends.
 *
 * Other modes: --rate offers rounds open loop at a fixed total rate (lease
 * latency under a steady load, not at saturation); --fill N only puts N tasks
 * and leaves them; --first-lease NS connects, retrying while the server
 * starts, and times one lease from NS (when the server was launched).
 *
 * The load generator assumes that a round's lease always finds its tasks:
 * every connection leases at most what it put in the same round, so the queue
 * holds at least what this connection still needs (tasks are visible once
 * their put is acknowledged).  A lease that finds nothing after waiting is
 * retried a few times, then reported as an error.
 */
#include "muster.h"

#include <jansson.h>

#include "beanstalk.h"
#include "bench_util.h"
#include "redis.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BENCH_ERR_LEN 512
#define BENCH_MAX_CONNS 256
#define BENCH_MAX_BATCH 1000 /* the server's batch limit */
#define LEASE_WAIT_MS 1000   /* long-poll of one lease request; only hit when something is off */
#define LEASE_EMPTY_RETRIES 5
#define FSYNC_BLOCK_BYTES 4096
#define FSYNC_RING_BLOCKS 4096        /* 16 MiB preallocated for the overwrite reference */
#define BEANSTALK_RESERVE_TIMEOUT_S 5 /* reserve-with-timeout; only hit when something is off */

typedef struct {
  const char *system;   /* backend name */
  const char *url;      /* muster: head URL */
  const char *token;    /* muster: bearer token */
  char host[64];        /* beanstalkd: IPv4 address */
  int port;             /* beanstalkd: TCP port */
  const char *dir;      /* fsync: directory to write in */
  char queue[160];      /* muster queue / beanstalkd tube of this run */
  int conns;            /* client connections, one thread each */
  size_t batch;         /* tasks per request */
  double duration_s;    /* measured window (duration mode) */
  double warmup_s;      /* unmeasured lead-in (duration mode) */
  int64_t tasks;        /* > 0: fixed task count instead of a duration */
  size_t payload_bytes; /* characters in each task's payload string */
  int keep;             /* non-zero: leave the queue behind (muster) */
  double rate;          /* > 0: open loop, rounds offered at this many tasks/s in all */
  int64_t fill;         /* > 0: only put this many tasks and leave them (--fill) */
  double first_lease_s; /* > 0: wait up to this long for the server, lease one task */
} bench_config_t;

typedef struct {
  const char *name;
  /* Once, before any connection opens: checks the server, creates the queue.
   * May set *shared to state every connection sees.  Returns 0 or -1 (err set). */
  int (*setup)(bench_config_t *cfg, void **shared, char *err);
  /* Opens connection number `index`; NULL with err set on failure. */
  void *(*open)(const bench_config_t *cfg, void *shared, int index, char *err);
  /* One round of `n` tasks (n ≤ cfg->batch).  Appends the duration of each
   * timed request to lat_ns[*lat_count] (room for cfg->batch + LEASE_EMPTY_RETRIES + 1).
   * Returns 0 or -1 (err set). */
  int (*round)(void *conn, const bench_config_t *cfg, size_t n, int64_t *lat_ns, size_t *lat_count,
               char *err);
  void (*close)(void *conn);
  /* Puts `n` tasks and nothing else (--fill); NULL when the system has no queue. */
  int (*put)(void *conn, const bench_config_t *cfg, size_t n, char *err);
  /* Takes (leases, reserves) one task and does not complete it (--first-lease). */
  int (*take)(void *conn, const bench_config_t *cfg, char *err);
  /* Once, after every connection closed; removes what setup created. */
  void (*teardown)(const bench_config_t *cfg, void *shared);
} bench_backend_t;

__attribute__((format(printf, 2, 3))) static int bench_fail(char *err, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, BENCH_ERR_LEN, fmt, ap);
  va_end(ap);
  return -1;
}

/* A JSON string of `chars` 'x' characters with its quotes; NULL when out of memory. */
static char *bench_payload(size_t chars) {
  char *text = malloc(chars + 3);
  if (!text)
    return NULL;
  text[0] = '"';
  memset(text + 1, 'x', chars);
  text[chars + 1] = '"';
  text[chars + 2] = '\0';
  return text;
}

/* ---- muster ----------------------------------------------------------- */

typedef struct {
  muster_client_t *client;
  char *payload;             /* JSON text shared by every spec */
  muster_task_spec_t *specs; /* cfg->batch identical specs */
  muster_ack_t *acks;        /* cfg->batch acks, filled from the leases */
} cycle_muster_conn_t;

static int cycle_muster_fail(char *err, muster_client_t *client, const char *what,
                             muster_err_t rc) {
  return bench_fail(err, "%s: %s (%s: %s)", what, muster_err_name(rc),
                    client ? muster_client_message(client) : "", muster_strerror(rc));
}

static int cycle_muster_setup(bench_config_t *cfg, void **shared, char *err) {
  muster_client_t *client = NULL;
  muster_err_t rc = muster_client_new(cfg->url, cfg->token, &client);
  if (rc != MUSTER_OK)
    return cycle_muster_fail(err, client, "client", rc);
  rc = muster_health(client);
  if (rc == MUSTER_OK)
    rc = muster_queue_put(client, cfg->queue, NULL, NULL);
  if (rc != MUSTER_OK)
    cycle_muster_fail(err, client, "create queue", rc);
  muster_client_free(client);
  *shared = NULL;
  return rc == MUSTER_OK ? 0 : -1;
}

static void cycle_muster_teardown(const bench_config_t *cfg, void *shared) {
  muster_client_t *client = NULL;
  if (cfg->keep || muster_client_new(cfg->url, cfg->token, &client) != MUSTER_OK)
    return;
  muster_client_set_timeout(client, 300000); /* deleting a big queue is one long transaction */
  muster_err_t rc = muster_queue_delete(client, cfg->queue);
  if (rc != MUSTER_OK)
    fprintf(stderr, "bench_cycle: delete queue %s: %s\n", cfg->queue,
            muster_client_message(client));
  muster_client_free(client);
}

static void cycle_muster_close(void *conn_ptr) {
  cycle_muster_conn_t *conn = conn_ptr;
  if (!conn)
    return;
  muster_client_free(conn->client);
  free(conn->payload);
  free(conn->specs);
  free(conn->acks);
  free(conn);
}

static void *cycle_muster_open(const bench_config_t *cfg, void *shared, int index, char *err) {
  cycle_muster_conn_t *conn = calloc(1, sizeof *conn);
  if (!conn || !(conn->payload = bench_payload(cfg->payload_bytes)) ||
      !(conn->specs = calloc(cfg->batch, sizeof *conn->specs)) ||
      !(conn->acks = calloc(cfg->batch, sizeof *conn->acks))) {
    cycle_muster_close(conn);
    bench_fail(err, "out of memory");
    return NULL;
  }
  for (size_t i = 0; i < cfg->batch; i++) {
    muster_task_spec_init(&conn->specs[i]);
    conn->specs[i].payload = conn->payload;
  }
  muster_err_t rc = muster_client_new(cfg->url, cfg->token, &conn->client);
  if (rc == MUSTER_OK)
    rc = muster_health(conn->client); /* opens the keep-alive connection outside the window */
  if (rc != MUSTER_OK) {
    cycle_muster_fail(err, conn->client, "connect", rc);
    cycle_muster_close(conn);
    return NULL;
  }
  muster_client_set_timeout(conn->client, 60000);
  return conn;
}

static int cycle_muster_round(void *conn_ptr, const bench_config_t *cfg, size_t n, int64_t *lat_ns,
                              size_t *lat_count, char *err) {
  cycle_muster_conn_t *conn = conn_ptr;
  muster_err_t rc = muster_put(conn->client, cfg->queue, conn->specs, n, NULL);
  if (rc != MUSTER_OK)
    return cycle_muster_fail(err, conn->client, "put", rc);
  size_t leased = 0, empty = 0;
  while (leased < n) {
    muster_lease_t *leases = NULL;
    size_t count = 0;
    int64_t start_ns = bench_now_ns();
    rc = muster_lease(conn->client, cfg->queue, 0, n - leased, LEASE_WAIT_MS, &leases, &count);
    lat_ns[(*lat_count)++] = bench_now_ns() - start_ns;
    if (rc != MUSTER_OK)
      return cycle_muster_fail(err, conn->client, "lease", rc);
    for (size_t i = 0; i < count && leased < n; i++, leased++)
      muster_ack_init(&conn->acks[leased], leases[i].task, leases[i].token);
    muster_leases_free(leases, count);
    if (count == 0 && ++empty > LEASE_EMPTY_RETRIES)
      return bench_fail(err, "lease: the queue stayed empty with %zu of %zu tasks to go",
                        n - leased, n);
  }
  rc = muster_complete(conn->client, conn->acks, n);
  if (rc != MUSTER_OK)
    return cycle_muster_fail(err, conn->client, "complete", rc);
  return 0;
}

static int cycle_muster_put(void *conn_ptr, const bench_config_t *cfg, size_t n, char *err) {
  cycle_muster_conn_t *conn = conn_ptr;
  muster_err_t rc = muster_put(conn->client, cfg->queue, conn->specs, n, NULL);
  return rc == MUSTER_OK ? 0 : cycle_muster_fail(err, conn->client, "put", rc);
}

static int cycle_muster_take(void *conn_ptr, const bench_config_t *cfg, char *err) {
  cycle_muster_conn_t *conn = conn_ptr;
  muster_lease_t *leases = NULL;
  size_t count = 0;
  muster_err_t rc = muster_lease(conn->client, cfg->queue, 0, 1, LEASE_WAIT_MS, &leases, &count);
  muster_leases_free(leases, count);
  if (rc != MUSTER_OK)
    return cycle_muster_fail(err, conn->client, "lease", rc);
  return count == 1 ? 0 : bench_fail(err, "lease: the queue is empty");
}

/*
 * muster-next: the worker's steady state with the combined call.  A round puts
 * N tasks, then completes the previous round's N and leases N in one request
 * (muster_complete_lease: POST /v1/leases/complete with a "lease" object), so a task
 * costs two requests and two commits instead of three.  The first round
 * leases with a plain lease request; the last round's leases are left to the
 * queue's deletion.  Lease latency: the combined request.
 */
typedef struct {
  cycle_muster_conn_t base;
  size_t pending; /* acks of the previous round, not yet completed */
} cycle_next_conn_t;

static void cycle_next_close(void *conn_ptr) {
  cycle_next_conn_t *conn = conn_ptr;
  if (!conn)
    return;
  muster_client_free(conn->base.client);
  free(conn->base.payload);
  free(conn->base.specs);
  free(conn->base.acks);
  free(conn);
}

static void *cycle_next_open(const bench_config_t *cfg, void *shared, int index, char *err) {
  cycle_muster_conn_t *base = cycle_muster_open(cfg, shared, index, err);
  cycle_next_conn_t *conn = base ? calloc(1, sizeof *conn) : NULL;
  if (!conn) {
    if (base)
      bench_fail(err, "out of memory");
    cycle_muster_close(base);
    return NULL;
  }
  conn->base = *base;
  free(base); /* its members now belong to conn->base */
  return conn;
}

/* Completes the pending acks and leases up to `want` in one request
 * (muster_complete_lease); the leases' task and token go to acks[*leased...]. */
static int cycle_next_combined(cycle_next_conn_t *conn, const bench_config_t *cfg, size_t want,
                               size_t *leased, char *err) {
  muster_lease_t *leases = NULL;
  size_t count = 0;
  muster_err_t rc = muster_complete_lease(conn->base.client, conn->base.acks, conn->pending,
                                          cfg->queue, 0, want, -1, &leases, &count, NULL);
  if (rc != MUSTER_OK)
    return cycle_muster_fail(err, conn->base.client, "complete + lease", rc);
  conn->pending = 0;
  for (size_t i = 0; i < count && *leased < want; i++, (*leased)++)
    muster_ack_init(&conn->base.acks[*leased], leases[i].task, leases[i].token);
  muster_leases_free(leases, count);
  return 0;
}

static int cycle_next_round(void *conn_ptr, const bench_config_t *cfg, size_t n, int64_t *lat_ns,
                            size_t *lat_count, char *err) {
  cycle_next_conn_t *conn = conn_ptr;
  muster_err_t rc = muster_put(conn->base.client, cfg->queue, conn->base.specs, n, NULL);
  if (rc != MUSTER_OK)
    return cycle_muster_fail(err, conn->base.client, "put", rc);
  size_t leased = 0, empty = 0;
  if (conn->pending > 0) {
    int64_t start_ns = bench_now_ns();
    if (cycle_next_combined(conn, cfg, n, &leased, err) != 0)
      return -1;
    lat_ns[(*lat_count)++] = bench_now_ns() - start_ns;
  }
  while (leased < n) { /* the first round, or a concurrent connection took some */
    muster_lease_t *leases = NULL;
    size_t count = 0;
    int64_t start_ns = bench_now_ns();
    rc = muster_lease(conn->base.client, cfg->queue, 0, n - leased, LEASE_WAIT_MS, &leases, &count);
    lat_ns[(*lat_count)++] = bench_now_ns() - start_ns;
    if (rc != MUSTER_OK)
      return cycle_muster_fail(err, conn->base.client, "lease", rc);
    for (size_t i = 0; i < count && leased < n; i++, leased++)
      muster_ack_init(&conn->base.acks[leased], leases[i].task, leases[i].token);
    muster_leases_free(leases, count);
    if (count == 0 && ++empty > LEASE_EMPTY_RETRIES)
      return bench_fail(err, "lease: the queue stayed empty with %zu of %zu tasks to go",
                        n - leased, n);
  }
  conn->pending = n; /* completed with the next round's lease */
  return 0;
}

/* ---- beanstalkd ------------------------------------------------------- */

typedef struct {
  beanstalk_conn_t bs;
  char *body; /* job body: the same bytes as muster's payload */
  size_t body_len;
  uint64_t *ids; /* cfg->batch reserved job ids */
} cycle_beanstalkd_conn_t;

static int cycle_beanstalkd_setup(bench_config_t *cfg, void **shared, char *err) {
  beanstalk_conn_t probe;
  *shared = NULL;
  if (beanstalk_connect(&probe, cfg->host, cfg->port) != 0)
    return bench_fail(err, "%s", probe.error);
  beanstalk_close(&probe);
  return 0;
}

static void cycle_beanstalkd_close(void *conn_ptr) {
  cycle_beanstalkd_conn_t *conn = conn_ptr;
  if (!conn)
    return;
  beanstalk_close(&conn->bs);
  free(conn->body);
  free(conn->ids);
  free(conn);
}

static void *cycle_beanstalkd_open(const bench_config_t *cfg, void *shared, int index, char *err) {
  cycle_beanstalkd_conn_t *conn = calloc(1, sizeof *conn);
  if (!conn) {
    bench_fail(err, "out of memory");
    return NULL;
  }
  conn->bs.fd = -1;
  conn->body = bench_payload(cfg->payload_bytes);
  conn->ids = calloc(cfg->batch, sizeof *conn->ids);
  if (!conn->body || !conn->ids) {
    cycle_beanstalkd_close(conn);
    bench_fail(err, "out of memory");
    return NULL;
  }
  conn->body_len = strlen(conn->body);
  if (beanstalk_connect(&conn->bs, cfg->host, cfg->port) != 0 ||
      beanstalk_use_tube(&conn->bs, cfg->queue) != 0) {
    bench_fail(err, "beanstalkd: %s", conn->bs.error);
    cycle_beanstalkd_close(conn);
    return NULL;
  }
  return conn;
}

static int cycle_beanstalkd_round(void *conn_ptr, const bench_config_t *cfg, size_t n,
                                  int64_t *lat_ns, size_t *lat_count, char *err) {
  cycle_beanstalkd_conn_t *conn = conn_ptr;
  beanstalk_conn_t *bs = &conn->bs;
  for (size_t i = 0; i < n; i++)
    if (beanstalk_queue_put(bs, 0, 0, 60, conn->body, conn->body_len) != 0)
      goto fail;
  if (beanstalk_flush(bs) != 0)
    goto fail;
  for (size_t i = 0; i < n; i++)
    if (beanstalk_read_inserted(bs, &conn->ids[i]) != 0)
      goto fail;

  int64_t start_ns = bench_now_ns();
  for (size_t i = 0; i < n; i++)
    if (beanstalk_queue_cmd(bs, "reserve-with-timeout %d", BEANSTALK_RESERVE_TIMEOUT_S) != 0)
      goto fail;
  if (beanstalk_flush(bs) != 0)
    goto fail;
  for (size_t i = 0; i < n; i++)
    if (beanstalk_read_reserved(bs, &conn->ids[i]) != 0)
      goto fail;
  lat_ns[(*lat_count)++] = bench_now_ns() - start_ns;

  for (size_t i = 0; i < n; i++)
    if (beanstalk_queue_cmd(bs, "delete %" PRIu64, conn->ids[i]) != 0)
      goto fail;
  if (beanstalk_flush(bs) != 0)
    goto fail;
  for (size_t i = 0; i < n; i++)
    if (beanstalk_expect(bs, BEANSTALK_DELETED) != 0)
      goto fail;
  return 0;
fail:
  return bench_fail(err, "beanstalkd: %s", bs->error);
}

static int cycle_beanstalkd_put(void *conn_ptr, const bench_config_t *cfg, size_t n, char *err) {
  cycle_beanstalkd_conn_t *conn = conn_ptr;
  uint64_t id;
  for (size_t i = 0; i < n; i++)
    if (beanstalk_queue_put(&conn->bs, 0, 0, 60, conn->body, conn->body_len) != 0)
      return bench_fail(err, "beanstalkd: %s", conn->bs.error);
  if (beanstalk_flush(&conn->bs) != 0)
    return bench_fail(err, "beanstalkd: %s", conn->bs.error);
  for (size_t i = 0; i < n; i++)
    if (beanstalk_read_inserted(&conn->bs, &id) != 0)
      return bench_fail(err, "beanstalkd: %s", conn->bs.error);
  return 0;
}

static int cycle_beanstalkd_take(void *conn_ptr, const bench_config_t *cfg, char *err) {
  cycle_beanstalkd_conn_t *conn = conn_ptr;
  uint64_t id;
  if (beanstalk_queue_cmd(&conn->bs, "reserve-with-timeout %d", BEANSTALK_RESERVE_TIMEOUT_S) != 0 ||
      beanstalk_flush(&conn->bs) != 0 || beanstalk_read_reserved(&conn->bs, &id) != 0)
    return bench_fail(err, "beanstalkd: %s", conn->bs.error);
  return 0;
}

/* ---- redis: the reliable-queue pattern -------------------------------- */

/*
 * LPUSH to the queue list; BLMOVE queue → processing list (RIGHT LEFT), which
 * hands the task over and keeps it until done; LREM from the processing list
 * when done.  Each connection has its own processing list (the usual pattern:
 * one per worker, so that a recovery process knows whose tasks to requeue).
 * Every task's value is unique (payload, connection, sequence number) so that
 * LREM removes exactly that task.  A batch pipelines its N commands per step,
 * as for beanstalkd.  Durability is the server's setting (bench/run starts one
 * with `appendonly yes, appendfsync always` and one without persistence).
 */
typedef struct {
  redis_conn_t rc;
  char processing[200]; /* this connection's processing list */
  char *values;         /* cfg->batch slots of value_cap bytes: the round's taken values */
  size_t *value_lens;
  size_t value_cap;
  uint64_t seq; /* tasks put so far */
  int index;
} cycle_redis_conn_t;

static int cycle_redis_setup(bench_config_t *cfg, void **shared, char *err) {
  redis_conn_t probe;
  *shared = NULL;
  if (redis_connect(&probe, cfg->host, cfg->port) != 0)
    return bench_fail(err, "%s", probe.error);
  const char *del[] = {"DEL", cfg->queue};
  int rc = cfg->first_lease_s > 0 || cfg->keep ? 0 : redis_call(&probe, ':', 2, del);
  if (rc != 0)
    bench_fail(err, "%s", probe.error);
  redis_close(&probe);
  return rc;
}

static void cycle_redis_close(void *conn_ptr) {
  cycle_redis_conn_t *conn = conn_ptr;
  if (!conn)
    return;
  redis_close(&conn->rc);
  free(conn->values);
  free(conn->value_lens);
  free(conn);
}

static void *cycle_redis_open(const bench_config_t *cfg, void *shared, int index, char *err) {
  cycle_redis_conn_t *conn = calloc(1, sizeof *conn);
  if (!conn) {
    bench_fail(err, "out of memory");
    return NULL;
  }
  conn->rc.fd = -1;
  conn->index = index;
  conn->value_cap = cfg->payload_bytes + 64;
  conn->values = malloc(cfg->batch * conn->value_cap);
  conn->value_lens = calloc(cfg->batch, sizeof *conn->value_lens);
  snprintf(conn->processing, sizeof conn->processing, "%s:processing:%d", cfg->queue, index);
  if (!conn->values || !conn->value_lens) {
    cycle_redis_close(conn);
    bench_fail(err, "out of memory");
    return NULL;
  }
  if (redis_connect(&conn->rc, cfg->host, cfg->port) != 0) {
    bench_fail(err, "redis: %s", conn->rc.error);
    cycle_redis_close(conn);
    return NULL;
  }
  return conn;
}

/* Queues `n` LPUSH of fresh unique values. */
static int cycle_redis_queue_puts(cycle_redis_conn_t *conn, const bench_config_t *cfg, size_t n) {
  char value[256 + 64];
  size_t bytes = cfg->payload_bytes < 256 ? cfg->payload_bytes : 256;
  memset(value, 'x', bytes);
  for (size_t i = 0; i < n; i++) {
    int len =
        snprintf(value + bytes, sizeof value - bytes, ":%d:%" PRIu64, conn->index, conn->seq++);
    const char *argv[] = {"LPUSH", cfg->queue, value};
    const size_t lens[] = {5, strlen(cfg->queue), bytes + (size_t)len};
    if (redis_queue(&conn->rc, 3, argv, lens) != 0)
      return -1;
  }
  return 0;
}

static int cycle_redis_put(void *conn_ptr, const bench_config_t *cfg, size_t n, char *err) {
  cycle_redis_conn_t *conn = conn_ptr;
  if (cycle_redis_queue_puts(conn, cfg, n) != 0 || redis_flush(&conn->rc) != 0)
    return bench_fail(err, "redis: %s", conn->rc.error);
  for (size_t i = 0; i < n; i++)
    if (redis_expect(&conn->rc, ':', NULL) != 0)
      return bench_fail(err, "redis: %s", conn->rc.error);
  return 0;
}

/* Queues and sends `n` BLMOVE, reads the values into conn->values. */
static int cycle_redis_take_n(cycle_redis_conn_t *conn, const bench_config_t *cfg, size_t n) {
  const char *argv[] = {"BLMOVE", cfg->queue, conn->processing, "RIGHT", "LEFT", "5"};
  for (size_t i = 0; i < n; i++)
    if (redis_queue(&conn->rc, 6, argv, NULL) != 0)
      return -1;
  if (redis_flush(&conn->rc) != 0)
    return -1;
  for (size_t i = 0; i < n; i++) {
    redis_reply_t reply;
    if (redis_expect(&conn->rc, '$', &reply) != 0)
      return -1;
    if (reply.str == NULL)
      return beanstalk_fail(&conn->rc, "BLMOVE timed out: the queue stayed empty");
    size_t len = reply.len < conn->value_cap ? reply.len : conn->value_cap;
    memcpy(conn->values + i * conn->value_cap, reply.str, len);
    conn->value_lens[i] = len;
  }
  return 0;
}

static int cycle_redis_take(void *conn_ptr, const bench_config_t *cfg, char *err) {
  cycle_redis_conn_t *conn = conn_ptr;
  return cycle_redis_take_n(conn, cfg, 1) == 0 ? 0 : bench_fail(err, "redis: %s", conn->rc.error);
}

static int cycle_redis_round(void *conn_ptr, const bench_config_t *cfg, size_t n, int64_t *lat_ns,
                             size_t *lat_count, char *err) {
  cycle_redis_conn_t *conn = conn_ptr;
  if (cycle_redis_put(conn, cfg, n, err) != 0)
    return -1;
  int64_t start_ns = bench_now_ns();
  if (cycle_redis_take_n(conn, cfg, n) != 0)
    return bench_fail(err, "redis: %s", conn->rc.error);
  lat_ns[(*lat_count)++] = bench_now_ns() - start_ns;
  for (size_t i = 0; i < n; i++) {
    const char *argv[] = {"LREM", conn->processing, "1", conn->values + i * conn->value_cap};
    const size_t lens[] = {4, strlen(conn->processing), 1, conn->value_lens[i]};
    if (redis_queue(&conn->rc, 4, argv, lens) != 0)
      return bench_fail(err, "redis: %s", conn->rc.error);
  }
  if (redis_flush(&conn->rc) != 0)
    return bench_fail(err, "redis: %s", conn->rc.error);
  for (size_t i = 0; i < n; i++) {
    redis_reply_t reply;
    if (redis_expect(&conn->rc, ':', &reply) != 0)
      return bench_fail(err, "redis: %s", conn->rc.error);
    if (reply.integer != 1)
      return bench_fail(err, "redis: LREM removed %lld values, not 1", (long long)reply.integer);
  }
  return 0;
}

/* ---- pingpong: loopback TCP round trip (reference) --------------------- */

typedef struct {
  int listen_fd;
  int port;
  pthread_t acceptor;
} cycle_pingpong_server_t;

/* Echoes every byte back until the peer closes; owns the socket. */
static void *cycle_pingpong_echo(void *arg) {
  int fd = (int)(intptr_t)arg;
  char buf[4096];
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0 || send(fd, buf, (size_t)n, MSG_NOSIGNAL) != n)
      break;
  }
  close(fd);
  return NULL;
}

static void *cycle_pingpong_accept(void *arg) {
  cycle_pingpong_server_t *server = arg;
  for (;;) {
    int fd = accept(server->listen_fd, NULL, NULL);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED)
        continue;
      return NULL; /* the listener was shut down: teardown */
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    pthread_t echo;
    if (pthread_create(&echo, NULL, cycle_pingpong_echo, (void *)(intptr_t)fd) != 0)
      close(fd);
    else
      pthread_detach(echo);
  }
}

/* Binds 127.0.0.1:0 and returns the listening socket (port in *port), or -1. */
static int loopback_listen(int *port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof addr;
  if (fd < 0 || bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(fd, 64) != 0 ||
      getsockname(fd, (struct sockaddr *)&addr, &len) != 0) {
    if (fd >= 0)
      close(fd);
    return -1;
  }
  *port = ntohs(addr.sin_port);
  return fd;
}

static int cycle_pingpong_setup(bench_config_t *cfg, void **shared, char *err) {
  cycle_pingpong_server_t *server = calloc(1, sizeof *server);
  if (!server)
    return bench_fail(err, "out of memory");
  server->listen_fd = loopback_listen(&server->port);
  if (server->listen_fd < 0) {
    free(server);
    return bench_fail(err, "listen: %s", strerror(errno));
  }
  if (pthread_create(&server->acceptor, NULL, cycle_pingpong_accept, server) != 0) {
    close(server->listen_fd);
    free(server);
    return bench_fail(err, "pthread_create failed");
  }
  snprintf(cfg->host, sizeof cfg->host, "127.0.0.1");
  cfg->port = server->port;
  *shared = server;
  return 0;
}

static void cycle_pingpong_teardown(const bench_config_t *cfg, void *shared) {
  cycle_pingpong_server_t *server = shared;
  shutdown(server->listen_fd, SHUT_RDWR);
  pthread_join(server->acceptor, NULL);
  close(server->listen_fd);
  free(server);
}

static void *cycle_pingpong_open(const bench_config_t *cfg, void *shared, int index, char *err) {
  beanstalk_conn_t *conn = calloc(1, sizeof *conn); /* only its socket is used */
  if (!conn) {
    bench_fail(err, "out of memory");
    return NULL;
  }
  if (beanstalk_connect(conn, cfg->host, cfg->port) != 0) {
    bench_fail(err, "%s", conn->error);
    free(conn);
    return NULL;
  }
  return conn;
}

static void cycle_pingpong_close(void *conn_ptr) {
  if (conn_ptr)
    beanstalk_close(conn_ptr);
  free(conn_ptr);
}

static int cycle_pingpong_round(void *conn_ptr, const bench_config_t *cfg, size_t n,
                                int64_t *lat_ns, size_t *lat_count, char *err) {
  beanstalk_conn_t *conn = conn_ptr;
  for (size_t i = 0; i < n; i++) {
    char byte = 'p';
    int64_t start_ns = bench_now_ns();
    if (send(conn->fd, &byte, 1, MSG_NOSIGNAL) != 1 || recv(conn->fd, &byte, 1, MSG_WAITALL) != 1)
      return bench_fail(err, "pingpong: %s", strerror(errno));
    if (*lat_count < cfg->batch)
      lat_ns[(*lat_count)++] = bench_now_ns() - start_ns;
  }
  return 0;
}

/* ---- fsync: durable writes on a disk (reference) ----------------------- */

/*
 * Two floors: "fsync" overwrites 4 KiB blocks in turn in a preallocated file
 * (the file's size never changes, so fdatasync flushes data only, as when
 * SQLite reuses its WAL), "fsync-append" appends (every fdatasync also commits
 * the new size to the file system's journal, as when a WAL or binlog grows).
 */
typedef struct {
  int fd;
  int append;      /* non-zero: append; zero: overwrite blocks of the preallocated file */
  uint64_t writes; /* blocks written so far */
  char path[4096];
  char block[FSYNC_BLOCK_BYTES];
} cycle_fsync_conn_t;

static int cycle_fsync_setup(bench_config_t *cfg, void **shared, char *err) {
  *shared = NULL;
  if (!cfg->dir)
    return bench_fail(err, "--system %s needs --dir", cfg->system);
  return 0;
}

static void cycle_fsync_close(void *conn_ptr) {
  cycle_fsync_conn_t *conn = conn_ptr;
  if (!conn)
    return;
  if (conn->fd >= 0)
    close(conn->fd);
  unlink(conn->path);
  free(conn);
}

static void *cycle_fsync_open(const bench_config_t *cfg, void *shared, int index, char *err) {
  cycle_fsync_conn_t *conn = calloc(1, sizeof *conn);
  if (!conn) {
    bench_fail(err, "out of memory");
    return NULL;
  }
  conn->append = strcmp(cfg->system, "fsync-append") == 0;
  memset(conn->block, 'f', sizeof conn->block);
  snprintf(conn->path, sizeof conn->path, "%s/fsync-%d-%d.dat", cfg->dir, (int)getpid(), index);
  conn->fd = open(conn->path, O_WRONLY | O_CREAT | O_TRUNC | (conn->append ? O_APPEND : 0), 0600);
  if (conn->fd < 0) {
    bench_fail(err, "open %s: %s", conn->path, strerror(errno));
    cycle_fsync_close(conn);
    return NULL;
  }
  for (int i = 0; !conn->append && i < FSYNC_RING_BLOCKS; i++)
    if (write(conn->fd, conn->block, sizeof conn->block) != (ssize_t)sizeof conn->block) {
      bench_fail(err, "preallocate %s: %s", conn->path, strerror(errno));
      cycle_fsync_close(conn);
      return NULL;
    }
  if (fsync(conn->fd) != 0) {
    bench_fail(err, "fsync %s: %s", conn->path, strerror(errno));
    cycle_fsync_close(conn);
    return NULL;
  }
  return conn;
}

static int cycle_fsync_round(void *conn_ptr, const bench_config_t *cfg, size_t n, int64_t *lat_ns,
                             size_t *lat_count, char *err) {
  cycle_fsync_conn_t *conn = conn_ptr;
  for (size_t i = 0; i < n; i++, conn->writes++) {
    off_t offset = (off_t)(conn->writes % FSYNC_RING_BLOCKS) * FSYNC_BLOCK_BYTES;
    int64_t start_ns = bench_now_ns();
    ssize_t written = conn->append ? write(conn->fd, conn->block, sizeof conn->block)
                                   : pwrite(conn->fd, conn->block, sizeof conn->block, offset);
    if (written != (ssize_t)sizeof conn->block || fdatasync(conn->fd) != 0)
      return bench_fail(err, "%s: %s", cfg->system, strerror(errno));
    if (*lat_count < cfg->batch)
      lat_ns[(*lat_count)++] = bench_now_ns() - start_ns;
  }
  return 0;
}

static void nothing_teardown(const bench_config_t *cfg, void *shared) {}

static const bench_backend_t bench_backends[] = {
    {"muster", cycle_muster_setup, cycle_muster_open, cycle_muster_round, cycle_muster_close,
     cycle_muster_put, cycle_muster_take, cycle_muster_teardown},
    {"muster-next", cycle_muster_setup, cycle_next_open, cycle_next_round, cycle_next_close, NULL,
     NULL, cycle_muster_teardown},
    {"beanstalkd", cycle_beanstalkd_setup, cycle_beanstalkd_open, cycle_beanstalkd_round,
     cycle_beanstalkd_close, cycle_beanstalkd_put, cycle_beanstalkd_take, nothing_teardown},
    {"redis", cycle_redis_setup, cycle_redis_open, cycle_redis_round, cycle_redis_close,
     cycle_redis_put, cycle_redis_take, nothing_teardown},
    {"pingpong", cycle_pingpong_setup, cycle_pingpong_open, cycle_pingpong_round,
     cycle_pingpong_close, NULL, NULL, cycle_pingpong_teardown},
    {"fsync", cycle_fsync_setup, cycle_fsync_open, cycle_fsync_round, cycle_fsync_close, NULL, NULL,
     nothing_teardown},
    {"fsync-append", cycle_fsync_setup, cycle_fsync_open, cycle_fsync_round, cycle_fsync_close,
     NULL, NULL, nothing_teardown},
};

/* ---- driver ------------------------------------------------------------ */

enum { PHASE_WARMUP, PHASE_MEASURE, PHASE_STOP };

static atomic_int bench_phase = PHASE_WARMUP;
static atomic_int bench_failed = 0;
static atomic_llong bench_tasks_left = 0; /* fixed-count mode: tasks not yet claimed */

typedef struct {
  const bench_config_t *cfg;
  const bench_backend_t *backend;
  void *shared;
  int index;
  pthread_barrier_t *start;
  bench_samples_t lease_ns; /* measured lease request durations */
  int64_t tasks;            /* tasks whose round finished in the measured window */
  int failed;
  char err[BENCH_ERR_LEN];
} bench_worker_t;

/* How many tasks the next round does: the batch, or in fixed-count mode what is left. */
static size_t bench_claim(const bench_config_t *cfg) {
  if (cfg->tasks <= 0)
    return atomic_load(&bench_phase) == PHASE_STOP ? 0 : cfg->batch;
  long long left = atomic_fetch_sub(&bench_tasks_left, (long long)cfg->batch);
  if (left <= 0)
    return 0;
  return left < (long long)cfg->batch ? (size_t)left : cfg->batch;
}

static void *bench_worker_main(void *arg) {
  bench_worker_t *worker = arg;
  const bench_config_t *cfg = worker->cfg;
  void *conn = worker->backend->open(cfg, worker->shared, worker->index, worker->err);
  pthread_barrier_wait(worker->start); /* every thread reaches it, failed or not */
  int64_t *round_ns = malloc((cfg->batch + LEASE_EMPTY_RETRIES + 1) * sizeof *round_ns);
  if (!conn || !round_ns) {
    if (conn)
      snprintf(worker->err, sizeof worker->err, "out of memory");
    goto fail;
  }
  /* Open loop (--rate): each connection starts a round every interval_ns,
   * connections staggered; a round that starts late starts at once (the
   * backlog is worked off, not dropped). */
  int64_t interval_ns =
      cfg->rate > 0 ? (int64_t)(1e9 * (double)cfg->conns * (double)cfg->batch / cfg->rate) : 0;
  int64_t next_ns = bench_now_ns() + interval_ns * worker->index / cfg->conns;
  size_t n;
  while (!atomic_load(&bench_failed) && (n = bench_claim(cfg)) > 0) {
    size_t round_count = 0;
    if (interval_ns > 0) {
      int64_t wait_ns = next_ns - bench_now_ns();
      if (wait_ns > 0)
        bench_sleep_ns(wait_ns);
      next_ns += interval_ns;
    }
    if (cfg->fill > 0) {
      if (worker->backend->put(conn, cfg, n, worker->err) != 0)
        goto fail;
    } else if (worker->backend->round(conn, cfg, n, round_ns, &round_count, worker->err) != 0) {
      goto fail;
    }
    if (atomic_load(&bench_phase) != PHASE_MEASURE)
      continue;
    worker->tasks += (int64_t)n;
    for (size_t i = 0; i < round_count; i++)
      if (bench_samples_add(&worker->lease_ns, round_ns[i]) != 0) {
        snprintf(worker->err, sizeof worker->err, "out of memory");
        goto fail;
      }
  }
  free(round_ns);
  worker->backend->close(conn);
  return NULL;
fail:
  worker->failed = 1;
  atomic_store(&bench_failed, 1);
  free(round_ns);
  if (conn)
    worker->backend->close(conn);
  return NULL;
}

/* Sleeps up to `seconds`, waking early when a worker failed. */
static void bench_wait(double seconds) {
  int64_t until = bench_now_ns() + (int64_t)(seconds * 1e9);
  while (!atomic_load(&bench_failed) && bench_now_ns() < until)
    bench_sleep_ms(20);
}

/*
 * Runs the workers and prints the result line.  Returns 0, or 1 when setup or
 * any connection failed (the reasons go to stderr).
 */
static int bench_run(bench_config_t *cfg, const bench_backend_t *backend) {
  char err[BENCH_ERR_LEN] = "";
  void *shared = NULL;
  if (backend->setup(cfg, &shared, err) != 0) {
    fprintf(stderr, "bench_cycle: %s: %s\n", backend->name, err);
    return 1;
  }
  bench_worker_t *workers = calloc((size_t)cfg->conns, sizeof *workers);
  pthread_t *threads = calloc((size_t)cfg->conns, sizeof *threads);
  pthread_barrier_t start;
  if (!workers || !threads) {
    fprintf(stderr, "bench_cycle: out of memory\n");
    exit(1);
  }
  pthread_barrier_init(&start, NULL, (unsigned)cfg->conns + 1);
  atomic_store(&bench_tasks_left, cfg->tasks);
  atomic_store(&bench_phase, cfg->tasks > 0 ? PHASE_MEASURE : PHASE_WARMUP);
  for (int i = 0; i < cfg->conns; i++) {
    workers[i] = (bench_worker_t){
        .cfg = cfg, .backend = backend, .shared = shared, .index = i, .start = &start};
    if (pthread_create(&threads[i], NULL, bench_worker_main, &workers[i]) != 0) {
      fprintf(stderr, "bench_cycle: pthread_create failed\n");
      exit(1);
    }
  }
  pthread_barrier_wait(&start);
  int64_t start_ns = bench_now_ns(), end_ns = 0;
  if (cfg->tasks <= 0) {
    bench_wait(cfg->warmup_s);
    atomic_store(&bench_phase, PHASE_MEASURE);
    start_ns = bench_now_ns();
    bench_wait(cfg->duration_s);
    end_ns = bench_now_ns();
    atomic_store(&bench_phase, PHASE_STOP);
  }
  for (int i = 0; i < cfg->conns; i++)
    pthread_join(threads[i], NULL);
  if (cfg->tasks > 0)
    end_ns = bench_now_ns();
  pthread_barrier_destroy(&start);

  int status = 0;
  int64_t tasks = 0;
  bench_samples_t lease_ns = {0};
  for (int i = 0; i < cfg->conns; i++) {
    if (workers[i].failed) {
      fprintf(stderr, "bench_cycle: %s connection %d: %s\n", backend->name, i, workers[i].err);
      status = 1;
    }
    tasks += workers[i].tasks;
    if (bench_samples_merge(&lease_ns, &workers[i].lease_ns) != 0)
      status = 1;
    bench_samples_free(&workers[i].lease_ns);
  }
  backend->teardown(cfg, shared);
  if (status == 0) {
    double seconds = (double)(end_ns - start_ns) / 1e9;
    bench_samples_sort(&lease_ns);
    printf("result system=%s conns=%d batch=%zu tasks=%" PRId64 " seconds=%.3f tasks_per_s=%.1f "
           "lease_requests=%zu lease_p50_us=%.1f lease_p99_us=%.1f lease_p999_us=%.1f\n",
           backend->name, cfg->conns, cfg->batch, tasks, seconds, (double)tasks / seconds,
           lease_ns.count, (double)bench_samples_quantile(&lease_ns, 0.50) / 1e3,
           (double)bench_samples_quantile(&lease_ns, 0.99) / 1e3,
           (double)bench_samples_quantile(&lease_ns, 0.999) / 1e3);
    fflush(stdout);
  }
  bench_samples_free(&lease_ns);
  free(workers);
  free(threads);
  return status;
}

/* Wall-clock time in nanoseconds (CLOCK_REALTIME, as `date +%s%N` prints it). */
static int64_t bench_wall_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/*
 * --first-lease: connects (retrying while the server starts or loads) and
 * takes one task; prints the time from `started_ns` (wall clock, when the
 * server was launched) to the lease.  Returns 0, or 1 after 120 s.
 */
static int bench_first_lease(bench_config_t *cfg, const bench_backend_t *backend,
                             int64_t started_ns) {
  char err[BENCH_ERR_LEN] = "";
  int64_t give_up_ns = bench_now_ns() + (int64_t)120 * 1000000000;
  while (bench_now_ns() < give_up_ns) {
    void *conn = backend->open(cfg, NULL, 0, err);
    int ok = conn && backend->take(conn, cfg, err) == 0;
    int64_t leased_ns = bench_wall_ns();
    if (conn)
      backend->close(conn);
    if (ok) {
      printf("result system=%s first_lease_ms=%.1f\n", backend->name,
             (double)(leased_ns - started_ns) / 1e6);
      return 0;
    }
    bench_sleep_ns(5 * 1000000);
  }
  fprintf(stderr, "bench_cycle: %s: no lease within 120 s: %s\n", backend->name, err);
  return 1;
}

/* ---- command line ------------------------------------------------------ */

static void bench_usage(FILE *out) {
  fprintf(out,
          "usage: bench_cycle --system muster --url URL --token TOKEN [options]\n"
          "       bench_cycle --system beanstalkd|redis --addr HOST:PORT [options]\n"
          "       bench_cycle --system pingpong [options]\n"
          "       bench_cycle --system fsync|fsync-append --dir DIR [options]\n"
          "       bench_cycle --free-port\n"
          "\n"
          "Runs the full task cycle (put, lease, complete) from --conns connections and\n"
          "prints one 'result key=value ...' line: tasks/s and lease latency quantiles.\n"
          "\n"
          "  --conns N           client connections, one thread each (default 1)\n"
          "  --batch N           tasks per request, 1 to %d (default 1)\n"
          "  --duration SEC      measured seconds (default 5)\n"
          "  --warmup SEC        unmeasured seconds before that (default 1)\n"
          "  --tasks N           run exactly N tasks instead, all measured\n"
          "  --payload-bytes N   characters in each payload (default 32)\n"
          "  --queue NAME        queue (muster) or tube (beanstalkd); default per run\n"
          "  --keep              leave the muster queue and its tasks behind\n"
          "  --rate TASKS_PER_S  open loop: offer rounds at this rate in all (lease latency\n"
          "                      under a steady load) instead of as fast as possible\n"
          "  --fill N            only put N tasks (--batch per request) and leave them\n"
          "  --first-lease NS    NS: when the server was launched (date +%%s%%N); connect,\n"
          "                      retrying while it starts, lease one task, print the delay\n"
          "  --free-port         print a free loopback TCP port and exit\n",
          BENCH_MAX_BATCH);
}

static int parse_addr(bench_config_t *cfg, const char *addr) {
  const char *colon = strrchr(addr, ':');
  if (!colon || (size_t)(colon - addr) >= sizeof cfg->host)
    return -1;
  memcpy(cfg->host, addr, (size_t)(colon - addr));
  cfg->host[colon - addr] = '\0';
  cfg->port = atoi(colon + 1);
  return cfg->port > 0 && cfg->port < 65536 ? 0 : -1;
}

static int print_free_port(void) {
  int port = 0;
  int fd = loopback_listen(&port);
  if (fd < 0) {
    fprintf(stderr, "bench_cycle: listen: %s\n", strerror(errno));
    return 1;
  }
  close(fd);
  printf("%d\n", port);
  return 0;
}

int main(int argc, char **argv) {
  bench_config_t cfg = {.system = "muster",
                        .conns = 1,
                        .batch = 1,
                        .duration_s = 5,
                        .warmup_s = 1,
                        .payload_bytes = 32};
  enum { OPT_KEEP = 256, OPT_FREE_PORT, OPT_RATE, OPT_FILL, OPT_FIRST };
  int64_t first_lease_since = 0;
  static const struct option options[] = {{"system", required_argument, NULL, 's'},
                                          {"url", required_argument, NULL, 'u'},
                                          {"token", required_argument, NULL, 't'},
                                          {"addr", required_argument, NULL, 'a'},
                                          {"dir", required_argument, NULL, 'D'},
                                          {"queue", required_argument, NULL, 'q'},
                                          {"conns", required_argument, NULL, 'c'},
                                          {"batch", required_argument, NULL, 'b'},
                                          {"duration", required_argument, NULL, 'd'},
                                          {"warmup", required_argument, NULL, 'w'},
                                          {"tasks", required_argument, NULL, 'n'},
                                          {"payload-bytes", required_argument, NULL, 'p'},
                                          {"keep", no_argument, NULL, OPT_KEEP},
                                          {"free-port", no_argument, NULL, OPT_FREE_PORT},
                                          {"rate", required_argument, NULL, OPT_RATE},
                                          {"fill", required_argument, NULL, OPT_FILL},
                                          {"first-lease", required_argument, NULL, OPT_FIRST},
                                          {"help", no_argument, NULL, 'h'},
                                          {NULL, 0, NULL, 0}};
  int opt;
  while ((opt = getopt_long(argc, argv, "h", options, NULL)) != -1) {
    switch (opt) {
    case 's':
      cfg.system = optarg;
      break;
    case 'u':
      cfg.url = optarg;
      break;
    case 't':
      cfg.token = optarg;
      break;
    case 'a':
      if (parse_addr(&cfg, optarg) != 0) {
        fprintf(stderr, "bench_cycle: --addr wants IPV4:PORT, got %s\n", optarg);
        return 2;
      }
      break;
    case 'D':
      cfg.dir = optarg;
      break;
    case 'q':
      snprintf(cfg.queue, sizeof cfg.queue, "%s", optarg);
      break;
    case 'c':
      cfg.conns = atoi(optarg);
      break;
    case 'b':
      cfg.batch = (size_t)strtoul(optarg, NULL, 10);
      break;
    case 'd':
      cfg.duration_s = atof(optarg);
      break;
    case 'w':
      cfg.warmup_s = atof(optarg);
      break;
    case 'n':
      cfg.tasks = strtoll(optarg, NULL, 10);
      break;
    case 'p':
      cfg.payload_bytes = (size_t)strtoul(optarg, NULL, 10);
      break;
    case OPT_KEEP:
      cfg.keep = 1;
      break;
    case OPT_FREE_PORT:
      return print_free_port();
    case OPT_RATE:
      cfg.rate = atof(optarg);
      break;
    case OPT_FILL:
      cfg.fill = strtoll(optarg, NULL, 10);
      break;
    case OPT_FIRST:
      first_lease_since = strtoll(optarg, NULL, 10);
      cfg.first_lease_s = 120;
      break;
    case 'h':
      bench_usage(stdout);
      return 0;
    default:
      bench_usage(stderr);
      return 2;
    }
  }
  if (optind != argc || cfg.conns < 1 || cfg.conns > BENCH_MAX_CONNS || cfg.batch < 1 ||
      cfg.batch > BENCH_MAX_BATCH || cfg.duration_s <= 0 || cfg.warmup_s < 0 ||
      cfg.payload_bytes > (1 << 20)) {
    bench_usage(stderr);
    return 2;
  }
  const bench_backend_t *backend = NULL;
  for (size_t i = 0; i < sizeof bench_backends / sizeof bench_backends[0]; i++)
    if (strcmp(bench_backends[i].name, cfg.system) == 0)
      backend = &bench_backends[i];
  if (!backend) {
    fprintf(stderr, "bench_cycle: unknown --system %s\n", cfg.system);
    return 2;
  }
  if (strncmp(cfg.system, "muster", 6) == 0 && (!cfg.url || !cfg.token)) {
    fprintf(stderr, "bench_cycle: --system muster needs --url and --token\n");
    return 2;
  }
  if ((strcmp(cfg.system, "beanstalkd") == 0 || strcmp(cfg.system, "redis") == 0) &&
      cfg.port == 0) {
    fprintf(stderr, "bench_cycle: --system %s needs --addr\n", cfg.system);
    return 2;
  }
  if ((cfg.fill > 0 || first_lease_since > 0) && (!backend->put || !backend->take)) {
    fprintf(stderr, "bench_cycle: --system %s has no queue to fill or lease\n", cfg.system);
    return 2;
  }
  if (!cfg.queue[0])
    snprintf(cfg.queue, sizeof cfg.queue, "bench-cycle-%d-c%d-b%zu", (int)getpid(), cfg.conns,
             cfg.batch);
  if (first_lease_since > 0) {
    if (!cfg.queue[0]) {
      fprintf(stderr, "bench_cycle: --first-lease needs --queue\n");
      return 2;
    }
    return bench_first_lease(&cfg, backend, first_lease_since);
  }
  if (cfg.fill > 0) {
    cfg.tasks = cfg.fill; /* a fixed count, all measured */
    cfg.keep = 1;
  }
  return bench_run(&cfg, backend);
}
