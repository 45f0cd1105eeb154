/*
 * metrics.c — counters, histograms, the completion ring and the Prometheus
 * exposition.
 *
 * Counts arrive from domain code as provisional events in `pending`; the
 * store's hooks keep a request's events when its savepoint is released, drop
 * them when it is rolled back, and apply the turn's kept events when the
 * transaction commits.  Applied events land in one stats record per queue
 * (found through a small open-addressing index), which also holds a ring of
 * completions per second for the last METRICS_RING_SECONDS.  At most
 * METRICS_MAX_QUEUES queues are tracked by name; events of further queues
 * fold into one record named "~other", a name no queue can have.
 *
 * Gauges (tasks by queue and state, workers) are read from the store at
 * scrape time, so they are exact and need no bookkeeping here.
 */
#include "metrics.h"
#include "counts.h"
#include "http.h"
#include "log.h"
#include "task.h"
#include "waiter.h"
#include "walvfs.h"
#include "core/names.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define METRICS_MAX_QUEUES 1024
#define METRICS_INDEX_SLOTS 2048 /* power of two, twice the queues */
#define METRICS_MAX_ROUTES 256
#define METRICS_MAX_COLLECTORS 16
#define METRICS_OTHER_QUEUE "~other"

static const char *const counter_names[METRIC_COUNTER_COUNT] = {
    [METRIC_LEASES_GRANTED] = "leases_granted", [METRIC_TASKS_COMPLETED] = "tasks_completed",
    [METRIC_TASKS_FAILED] = "tasks_failed",     [METRIC_TASKS_RETRIED] = "tasks_retried",
    [METRIC_TASKS_DEAD] = "tasks_dead",         [METRIC_LEASES_EXPIRED] = "leases_expired",
    [METRIC_TASKS_FLAGGED] = "tasks_flagged",   [METRIC_TASKS_REAPED] = "tasks_reaped",
};

static const char *const counter_help[METRIC_COUNTER_COUNT] = {
    [METRIC_LEASES_GRANTED] = "Tasks leased to workers.",
    [METRIC_TASKS_COMPLETED] = "Leases completed.",
    [METRIC_TASKS_FAILED] = "Leases failed by their worker (retried or not).",
    [METRIC_TASKS_RETRIED] =
        "Tasks put back to queued after a failure, an expiry or a worker timeout.",
    [METRIC_TASKS_DEAD] =
        "Tasks that went dead: out of attempts, or flagged too often at the first stage.",
    [METRIC_LEASES_EXPIRED] = "Leases that passed their deadline.",
    [METRIC_TASKS_FLAGGED] = "Invalid-data flags raised by workers.",
    [METRIC_TASKS_REAPED] =
        "Done tasks removed by their queue's retention (keep_done_ms) after their completion.",
};

/* Seconds; the last bucket before +Inf. */
static const double latency_bounds[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                        0.1,    0.25,  0.5,    1,     2.5,  5,     10};
#define N_LATENCY (sizeof latency_bounds / sizeof latency_bounds[0])
static const double commit_bounds[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                       0.025,  0.05,    0.1,    0.25,  0.5,    1};
#define N_COMMIT (sizeof commit_bounds / sizeof commit_bounds[0])
static const double batch_bounds[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
#define N_BATCH (sizeof batch_bounds / sizeof batch_bounds[0])
/* Status codes counted one by one; anything else counts as "other". */
static const int tracked_statuses[] = {200, 201, 304, 400, 401, 403, 404,
                                       405, 409, 413, 415, 500, 503};
#define N_STATUS (sizeof tracked_statuses / sizeof tracked_statuses[0])

typedef struct {
  uint64_t buckets[16]; /* cumulative counts are computed at render time */
  uint64_t count;
  double sum; /* seconds, or requests for the batch histogram */
} histogram_t;

typedef struct {
  char name[NAME_MAX_LEN + 1];
  uint64_t counters[METRIC_COUNTER_COUNT];
  int64_t ring_second;                 /* the second that ring[ring_second % N] holds */
  uint32_t ring[METRICS_RING_SECONDS]; /* completions per second */
} queue_stats_t;

typedef struct {
  int which; /* a metric_counter_t, or METRIC_COUNTER_COUNT for a worker timeout */
  int64_t n;
  char queue[NAME_MAX_LEN + 1];
} pending_t;

typedef struct {
  uint64_t statuses[N_STATUS + 1]; /* the last one: other statuses */
  histogram_t latency;
} route_stats_t;

static struct {
  queue_stats_t *queues[METRICS_MAX_QUEUES + 1]; /* + the "~other" record */
  size_t nqueues;
  int16_t index[METRICS_INDEX_SLOTS]; /* queue record + 1; 0: empty */
  pending_t *pending;
  size_t npending, pending_cap;
  size_t request_start;   /* the running request's first event in `pending` */
  uint64_t turn_requests; /* requests ended since the last commit */
  uint64_t worker_timeouts;
  uint64_t commit_failures;
  histogram_t commit_latency, commit_batch;
  histogram_t flush_latency[2]; /* WAL flushes: [0] on the loop, [1] on the thread */
  uint64_t flush_failures;
  uint64_t unflushed_replies; /* lease replies sent at their commit, before a flush */
  uint64_t gathered_commits;  /* commits put off by one poll after a flush (head.c) */
  route_stats_t routes[METRICS_MAX_ROUTES + 1]; /* the last one: unmatched paths */
  metrics_collector_fn collectors[METRICS_MAX_COLLECTORS];
  size_t ncollectors;
} m;

struct metrics_out {
  char *text;
  size_t len, cap;
  bool failed; /* out of memory */
};

int64_t metrics_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void histogram_observe(histogram_t *hist, const double *bounds, size_t nbounds,
                              double value) {
  size_t i = 0;
  while (i < nbounds && value > bounds[i])
    i++;
  hist->buckets[i]++; /* i == nbounds: only +Inf */
  hist->count++;
  hist->sum += value;
}

/* ---- queue records ---- */

static uint32_t metrics_hash(const char *name) {
  uint32_t hash = 2166136261u;
  for (const unsigned char *p = (const unsigned char *)name; *p; p++)
    hash = (hash ^ *p) * 16777619u;
  return hash;
}

/* The record of `name`, created when new; NULL only when out of memory. */
static queue_stats_t *metrics_queue(const char *name) {
  if (m.nqueues >= METRICS_MAX_QUEUES)
    name = METRICS_OTHER_QUEUE;
  uint32_t slot = metrics_hash(name) & (METRICS_INDEX_SLOTS - 1);
  for (; m.index[slot]; slot = (slot + 1) & (METRICS_INDEX_SLOTS - 1))
    if (strcmp(m.queues[m.index[slot] - 1]->name, name) == 0)
      return m.queues[m.index[slot] - 1];
  if (m.nqueues > METRICS_MAX_QUEUES)
    return NULL; /* cannot happen: "~other" is found above once it exists */
  queue_stats_t *q = calloc(1, sizeof *q);
  if (q == NULL)
    return NULL;
  snprintf(q->name, sizeof q->name, "%s", name);
  m.queues[m.nqueues++] = q;
  m.index[slot] = (int16_t)m.nqueues;
  return q;
}

/* Moves the ring of *q forward to `second`, clearing the seconds skipped. */
static void ring_advance(queue_stats_t *q, int64_t second) {
  if (second <= q->ring_second)
    return;
  int64_t gap = second - q->ring_second;
  if (gap >= METRICS_RING_SECONDS || q->ring_second == 0) {
    memset(q->ring, 0, sizeof q->ring);
  } else {
    for (int64_t s = q->ring_second + 1; s <= second; s++)
      q->ring[s % METRICS_RING_SECONDS] = 0;
  }
  q->ring_second = second;
}

/* ---- provisional events ---- */

static void metrics_push(int which, const char *queue, int64_t n) {
  if (queue == NULL)
    queue = "";
  /* A batch counts each of its tasks (a completion, a lease): an event of
   * the running request for the same counter and queue takes the count, so
   * that a batch keeps one event, not one per task.  Only the running
   * request's: a refused request drops its events (metrics_request_end). */
  if (m.npending > m.request_start) {
    pending_t *last = &m.pending[m.npending - 1];
    if (last->which == which && strcmp(last->queue, queue) == 0) {
      last->n += n;
      return;
    }
  }
  if (m.npending == m.pending_cap) {
    size_t cap = m.pending_cap ? m.pending_cap * 2 : 64;
    pending_t *grown = realloc(m.pending, cap * sizeof *grown);
    if (grown == NULL)
      return; /* a lost count is better than a crash */
    m.pending = grown;
    m.pending_cap = cap;
  }
  pending_t *p = &m.pending[m.npending++];
  p->which = which;
  p->n = n;
  size_t len = strnlen(queue, sizeof p->queue - 1);
  memcpy(p->queue, queue, len);
  p->queue[len] = '\0';
}

void metrics_count(metric_counter_t which, const char *queue, int64_t n) {
  if (n > 0 && which >= 0 && which < METRIC_COUNTER_COUNT)
    metrics_push(which, queue, n);
}

void metrics_worker_timeout(void) {
  metrics_push(METRIC_COUNTER_COUNT, NULL, 1);
}

void metrics_request_end(bool ok) {
  if (!ok)
    m.npending = m.request_start;
  m.request_start = m.npending;
  m.turn_requests++;
}

/* Applies the turn's kept events. */
static void metrics_apply(void) {
  int64_t second = now_ms() / 1000;
  for (size_t i = 0; i < m.npending; i++) {
    const pending_t *p = &m.pending[i];
    if (p->which == METRIC_COUNTER_COUNT) {
      m.worker_timeouts += (uint64_t)p->n;
      continue;
    }
    queue_stats_t *q = metrics_queue(p->queue);
    if (q == NULL)
      continue;
    q->counters[p->which] += (uint64_t)p->n;
    if (p->which == METRIC_TASKS_COMPLETED) {
      ring_advance(q, second);
      q->ring[second % METRICS_RING_SECONDS] += (uint32_t)p->n;
    }
  }
}

void metrics_commit(bool ok, int64_t duration_us) {
  if (ok)
    metrics_apply();
  else
    m.commit_failures++;
  m.npending = m.request_start = 0;
  histogram_observe(&m.commit_latency, commit_bounds, N_COMMIT, (double)duration_us / 1e6);
  histogram_observe(&m.commit_batch, batch_bounds, N_BATCH, (double)m.turn_requests);
  m.turn_requests = 0;
}

void metrics_flush(bool on_thread, bool ok, int64_t duration_us) {
  if (!ok)
    m.flush_failures++;
  histogram_observe(&m.flush_latency[on_thread], commit_bounds, N_COMMIT,
                    (double)duration_us / 1e6);
}

void metrics_unflushed_replies(size_t n) {
  m.unflushed_replies += n;
}

void metrics_gathered_commit(void) {
  m.gathered_commits++;
}

void metrics_http(int route, int status, int64_t duration_us) {
  if (route == METRICS_ROUTE_SKIP)
    return;
  route_stats_t *rs =
      &m.routes[route >= 0 && route < METRICS_MAX_ROUTES ? route : METRICS_MAX_ROUTES];
  size_t i = 0;
  while (i < N_STATUS && tracked_statuses[i] != status)
    i++;
  rs->statuses[i]++;
  if (duration_us >= 0)
    histogram_observe(&rs->latency, latency_bounds, N_LATENCY, (double)duration_us / 1e6);
}

bool metrics_add_collector(metrics_collector_fn fn) {
  if (m.ncollectors == METRICS_MAX_COLLECTORS)
    return false;
  m.collectors[m.ncollectors++] = fn;
  return true;
}

/* ---- throughput ---- */

json_t *metrics_throughput(int64_t seconds) {
  if (seconds < 1 || seconds > METRICS_RING_SECONDS)
    seconds = METRICS_RING_SECONDS;
  int64_t now = now_ms(), second = now / 1000;
  json_t *queues = json_object(), *total = json_array();
  int64_t *sums = calloc((size_t)seconds, sizeof *sums);
  if (queues == NULL || total == NULL || sums == NULL) {
    json_decref(queues);
    json_decref(total);
    free(sums);
    return NULL;
  }
  for (size_t i = 0; i < m.nqueues; i++) {
    queue_stats_t *q = m.queues[i];
    ring_advance(q, second);
    json_t *series = json_array();
    for (int64_t k = 0; k < seconds; k++) {
      int64_t s = second - seconds + 1 + k;
      uint32_t n =
          q->ring_second
              ? q->ring[((s % METRICS_RING_SECONDS) + METRICS_RING_SECONDS) % METRICS_RING_SECONDS]
              : 0;
      sums[k] += n;
      json_array_append_new(series, json_integer(n));
    }
    json_object_set_new(queues, q->name, series);
  }
  for (int64_t k = 0; k < seconds; k++)
    json_array_append_new(total, json_integer(sums[k]));
  free(sums);
  return json_pack("{s:i, s:I, s:I, s:o, s:o}", "bucket_ms", 1000, "now_ms", (json_int_t)now,
                   "seconds", (json_int_t)seconds, "total", total, "queues", queues);
}

/* ---- the exposition ---- */

void metrics_printf(metrics_out_t *out, const char *fmt, ...) {
  if (out->failed)
    return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out->text + out->len, out->cap - out->len, fmt, ap);
    va_end(ap);
    if (n < 0) {
      out->failed = true;
      return;
    }
    if ((size_t)n < out->cap - out->len) {
      out->len += (size_t)n;
      return;
    }
    size_t cap = (out->cap + (size_t)n) * 2;
    char *grown = realloc(out->text, cap);
    if (grown == NULL) {
      out->failed = true;
      return;
    }
    out->text = grown;
    out->cap = cap;
  }
}

void metrics_label(metrics_out_t *out, const char *value) {
  for (const char *p = value; *p; p++) {
    if (*p == '\\' || *p == '"')
      metrics_printf(out, "\\%c", *p);
    else if (*p == '\n')
      metrics_printf(out, "\\n");
    else
      metrics_printf(out, "%c", *p);
  }
}

void metrics_help(metrics_out_t *out, const char *name, const char *type, const char *help) {
  metrics_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* Writes the _bucket, _sum and _count lines of a histogram; `labels` is
 * either "" or a list like `method="GET",route="/v1/queues"` with no braces. */
static void metrics_histogram(metrics_out_t *out, const char *name, const char *labels,
                              const histogram_t *hist, const double *bounds, size_t nbounds) {
  uint64_t cumulative = 0;
  const char *sep = labels[0] ? "," : "";
  for (size_t i = 0; i < nbounds; i++) {
    cumulative += hist->buckets[i];
    metrics_printf(out, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels, sep, bounds[i],
                   (unsigned long long)cumulative);
  }
  metrics_printf(out, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, sep,
                 (unsigned long long)hist->count);
  const char *open = labels[0] ? "{" : "", *close = labels[0] ? "}" : "";
  metrics_printf(out, "%s_sum%s%s%s %.9g\n%s_count%s%s%s %llu\n", name, open, labels, close,
                 hist->sum, name, open, labels, close, (unsigned long long)hist->count);
}

/* Gauges read from the store: tasks by queue and state, queues. */
static bool metrics_render_tasks(head_t *h, metrics_out_t *out) {
  sqlite3_stmt *names = store_stmt(h->st, "SELECT name FROM queues ORDER BY name");
  if (names == NULL)
    return false;
  metrics_help(out, "muster_tasks", "gauge", "Tasks by queue and state, now.");
  int64_t nqueues = 0;
  while (sqlite3_step(names) == SQLITE_ROW) {
    const char *queue = (const char *)sqlite3_column_text(names, 0);
    int64_t by_state[TASK_STATE_COUNT];
    fail_t f = {0};
    if (counts_read(h->st, queue, by_state, &f)) {
      store_reset(names);
      return false;
    }
    for (int state = 0; state < TASK_STATE_COUNT; state++) {
      metrics_printf(out, "muster_tasks{queue=\"");
      metrics_label(out, queue);
      metrics_printf(out, "\",state=\"%s\"} %lld\n", task_state_name(state),
                     (long long)by_state[state]);
    }
    nqueues++;
  }
  store_reset(names);
  metrics_help(out, "muster_queues", "gauge", "Queues, now.");
  metrics_printf(out, "muster_queues %lld\n", (long long)nqueues);
  return true;
}

static bool metrics_render_workers(head_t *h, metrics_out_t *out) {
  sqlite3_stmt *s = store_stmt(h->st, "SELECT state, count(*) FROM workers GROUP BY state");
  if (s == NULL)
    return false;
  int64_t active = 0, gone = 0;
  while (sqlite3_step(s) == SQLITE_ROW)
    *(sqlite3_column_int(s, 0) == 0 ? &active : &gone) += sqlite3_column_int64(s, 1);
  store_reset(s);
  metrics_help(out, "muster_workers", "gauge",
               "Registered workers by state (gone: left, timed out or crashed; GET /v1/workers "
               "says why each went), now.");
  metrics_printf(out,
                 "muster_workers{state=\"active\"} %lld\nmuster_workers{state=\"gone\"} %lld\n",
                 (long long)active, (long long)gone);
  metrics_help(out, "muster_worker_timeouts_total", "counter",
               "Workers that went silent past their heartbeat timeout.");
  metrics_printf(out, "muster_worker_timeouts_total %llu\n", (unsigned long long)m.worker_timeouts);
  return true;
}

static void metrics_render_counters(metrics_out_t *out) {
  for (int c = 0; c < METRIC_COUNTER_COUNT; c++) {
    char name[64];
    snprintf(name, sizeof name, "muster_%s_total", counter_names[c]);
    metrics_help(out, name, "counter", counter_help[c]);
    for (size_t i = 0; i < m.nqueues; i++) {
      metrics_printf(out, "%s{queue=\"", name);
      metrics_label(out, m.queues[i]->name);
      metrics_printf(out, "\"} %llu\n", (unsigned long long)m.queues[i]->counters[c]);
    }
  }
}

/* The route's labels, `method="GET",route="/v1/queues"`, into `buf`. */
static void route_labels(int route, char *buf, size_t size) {
  if (route == METRICS_MAX_ROUTES)
    snprintf(buf, size, "method=\"any\",route=\"unmatched\"");
  else
    snprintf(buf, size, "method=\"%s\",route=\"%s\"", http_routes[route].method,
             http_routes[route].pattern);
}

static void metrics_render_http(metrics_out_t *out) {
  int nroutes = 0;
  while (nroutes < METRICS_MAX_ROUTES && http_routes[nroutes].method)
    nroutes++;
  char labels[256];
  metrics_help(out, "muster_http_requests_total", "counter",
               "HTTP requests by route and status code.");
  for (int r = 0; r <= METRICS_MAX_ROUTES; r++) {
    if (r == nroutes)
      r = METRICS_MAX_ROUTES;
    route_labels(r, labels, sizeof labels);
    for (size_t i = 0; i <= N_STATUS; i++) {
      if (m.routes[r].statuses[i] == 0)
        continue;
      char code[16];
      snprintf(code, sizeof code, i < N_STATUS ? "%d" : "other",
               i < N_STATUS ? tracked_statuses[i] : 0);
      metrics_printf(out, "muster_http_requests_total{%s,code=\"%s\"} %llu\n", labels, code,
                     (unsigned long long)m.routes[r].statuses[i]);
    }
  }
  metrics_help(out, "muster_http_request_duration_seconds", "histogram",
               "Time from a request's arrival to its reply, which waits for the commit "
               "(long-polls that waited are not observed).");
  for (int r = 0; r <= METRICS_MAX_ROUTES; r++) {
    if (r == nroutes)
      r = METRICS_MAX_ROUTES;
    if (m.routes[r].latency.count == 0)
      continue;
    route_labels(r, labels, sizeof labels);
    metrics_histogram(out, "muster_http_request_duration_seconds", labels, &m.routes[r].latency,
                      latency_bounds, N_LATENCY);
  }
}

/* The group commit's histograms: how long a commit and its WAL flush took,
 * and how many requests shared it. */
static void metrics_render_commits(metrics_out_t *out) {
  metrics_help(out, "muster_store_commit_duration_seconds", "histogram",
               "Time one group commit (one transaction per event-loop turn) took.");
  metrics_histogram(out, "muster_store_commit_duration_seconds", "", &m.commit_latency,
                    commit_bounds, N_COMMIT);
  metrics_help(out, "muster_store_commit_requests", "histogram",
               "Requests that shared one group commit.");
  metrics_histogram(out, "muster_store_commit_requests", "", &m.commit_batch, batch_bounds,
                    N_BATCH);
  metrics_help(out, "muster_store_flush_duration_seconds", "histogram",
               "Time a WAL flush took (--sync full), on the event loop or on the helper thread "
               "(from the hand-off to the replies).");
  metrics_histogram(out, "muster_store_flush_duration_seconds", "on=\"loop\"", &m.flush_latency[0],
                    commit_bounds, N_COMMIT);
  metrics_histogram(out, "muster_store_flush_duration_seconds", "on=\"thread\"",
                    &m.flush_latency[1], commit_bounds, N_COMMIT);
}

/* The store's events counted in `m`: failed flushes, unflushed replies, gathered and failed
 * commits. */
static void metrics_render_store_counters(metrics_out_t *out) {
  metrics_help(out, "muster_store_flush_failures_total", "counter",
               "WAL flushes that failed (the head stops after one).");
  metrics_printf(out, "muster_store_flush_failures_total %llu\n",
                 (unsigned long long)m.flush_failures);
  metrics_help(out, "muster_store_unflushed_replies_total", "counter",
               "Lease replies sent at their commit without waiting for a WAL flush (--sync full: "
               "the leased tasks were already on disk; off with --sync-leases).");
  metrics_printf(out, "muster_store_unflushed_replies_total %llu\n",
                 (unsigned long long)m.unflushed_replies);
  metrics_help(out, "muster_store_gathered_commits_total", "counter",
               "Group commits put off by one poll of the sockets after a flush, to take in "
               "the requests that arrived during it (--sync full, many active clients).");
  metrics_printf(out, "muster_store_gathered_commits_total %llu\n",
                 (unsigned long long)m.gathered_commits);
  metrics_help(out, "muster_store_commit_failures_total", "counter",
               "Group commits that failed and were rolled back.");
  metrics_printf(out, "muster_store_commit_failures_total %llu\n",
                 (unsigned long long)m.commit_failures);
}

/* The WAL writes that walvfs counts, as SQLite made them and as they reached the file. */
static void metrics_render_wal(metrics_out_t *out) {
  walvfs_stats_t wal;
  walvfs_stats(&wal);
  metrics_help(out, "muster_store_wal_writes_total", "counter",
               "Writes to the WAL: by=\"sqlite\" as SQLite made them (two per page), "
               "by=\"file\" as they reached the file (about one per commit).");
  metrics_printf(out, "muster_store_wal_writes_total{by=\"sqlite\"} %llu\n",
                 (unsigned long long)wal.sqlite_writes);
  metrics_printf(out, "muster_store_wal_writes_total{by=\"file\"} %llu\n",
                 (unsigned long long)wal.file_writes);
  metrics_help(out, "muster_store_wal_write_failures_total", "counter",
               "Writes of held WAL frames that failed (the transaction that wrote them failed).");
  metrics_printf(out, "muster_store_wal_write_failures_total %llu\n",
                 (unsigned long long)wal.failed);
  metrics_help(out, "muster_store_disk_full_total", "counter",
               "Writes to the store's files that failed because the disk was full.");
  metrics_printf(out, "muster_store_disk_full_total %llu\n", (unsigned long long)wal.full);
}

/* The store's families: group commits, their events, then the WAL's writes. */
static void metrics_render_store(metrics_out_t *out) {
  metrics_render_commits(out);
  metrics_render_store_counters(out);
  metrics_render_wal(out);
}

char *metrics_render(head_t *h, size_t *len) {
  metrics_out_t out = {0};
  metrics_help(&out, "muster_build_info", "gauge", "The running muster's version; always 1.");
  metrics_printf(&out, "muster_build_info{version=\"%s\"} 1\n", MUSTER_VERSION);
  metrics_help(&out, "muster_start_time_seconds", "gauge",
               "When the head started, seconds since the Unix epoch.");
  metrics_printf(&out, "muster_start_time_seconds %.3f\n", (double)h->started_ms / 1000.0);
  metrics_help(&out, "muster_lease_waiters", "gauge",
               "Lease requests parked in a long-poll (wait_ms), waiting for a task.");
  metrics_printf(&out, "muster_lease_waiters %zu\n", waiter_count(h));
  metrics_help(&out, "muster_http_connections", "gauge", "Open client connections.");
  metrics_printf(&out, "muster_http_connections %zu\n", h1_server_connections(h->http));
  metrics_help(&out, "muster_http_wire_errors_total", "counter",
               "Requests refused by the HTTP server before routing (malformed request line or "
               "headers, bad framing, a head or body over the limits), answered and closed.");
  metrics_printf(&out, "muster_http_wire_errors_total %llu\n",
                 (unsigned long long)h1_server_wire_errors(h->http));
  bool ok = metrics_render_tasks(h, &out) && metrics_render_workers(h, &out);
  metrics_render_counters(&out);
  metrics_render_http(&out);
  metrics_render_store(&out);
  metrics_extra_collect(h, &out);
  for (size_t i = 0; i < m.ncollectors; i++)
    m.collectors[i](h, &out);
  if (!ok || out.failed) {
    free(out.text);
    return NULL;
  }
  *len = out.len;
  return out.text;
}
