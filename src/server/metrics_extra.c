/*
 * metrics_extra.c — the families of nodes, sessions, iterations and shared
 * data in GET /metrics (docs/dashboard.md, "Metrics").
 *
 * Everything here is read from the store at scrape time, through the same
 * functions the JSON API uses (node_list, iter_get) where there is one, so
 * /metrics and the API agree.  The counters of iterations (samples and
 * blocks acknowledged, leases expired, blocks taken over) are the per-rank
 * counters the store keeps: they count since the iteration was created and
 * survive a restart of the head.  Shared data is counted from its tables
 * (shared_blobs, shared_levels) when the store has them; a head built before
 * shared data writes none of its families.  metrics_render() calls
 * metrics_extra_collect() after its own families.
 */
#include "iter.h"
#include "log.h"
#include "metrics.h"
#include "node.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Rank health names of docs/api.md, "Iterations". */
static const char *const rank_healths[] = {"unknown", "active", "slow", "idle", "failed"};
#define N_HEALTH (sizeof rank_healths / sizeof rank_healths[0])

/* Writes `name{label="value"` with the braces left open: the caller adds
 * more labels or "}", then the value. */
static void open_sample(metrics_out_t *out, const char *name, const char *label,
                        const char *value) {
  metrics_printf(out, "%s{%s=\"", name, label);
  metrics_label(out, value ? value : "");
  metrics_printf(out, "\"");
}

static int64_t jint(const json_t *obj, const char *key) {
  return (int64_t)json_integer_value(json_object_get(obj, key));
}

static const char *jstr(const json_t *obj, const char *key) {
  const char *s = json_string_value(json_object_get(obj, key));
  return s ? s : "";
}

/* ---- nodes ---- */

/* The shared-data cache counters each node agent reports with its heartbeats
 * (since the agent started; a restarted agent starts them again at zero). */
static void collect_node_caches(json_t *nodes, metrics_out_t *out) {
  static const struct {
    const char *field, *metric, *help;
  } counters[] = {
      {"hits", "muster_node_cache_hits_total", "Shared-data reads a node served from its cache."},
      {"misses", "muster_node_cache_misses_total",
       "Shared-data reads a node had to fetch from the head first."},
      {"bytes_served", "muster_node_cache_served_bytes_total",
       "Bytes a node's cache sent to readers."},
      {"evictions", "muster_node_cache_evictions_total",
       "Levels a node's cache evicted to stay under its size limit."},
      {"upstream_fetches", "muster_node_cache_upstream_fetches_total",
       "Fetches a node's cache made from the head."},
  };
  for (size_t k = 0; k < sizeof counters / sizeof counters[0]; k++) {
    metrics_help(out, counters[k].metric, "counter", counters[k].help);
    size_t i;
    json_t *node;
    json_array_foreach(nodes, i, node) {
      json_t *cache = json_object_get(node, "cache");
      if (!json_is_object(cache))
        continue;
      open_sample(out, counters[k].metric, "node", jstr(node, "name"));
      metrics_printf(out, "} %lld\n", (long long)jint(cache, counters[k].field));
    }
  }
}

typedef enum { NODE_UP, NODE_WORKERS, NODE_CPUS, NODE_GPUS } node_gauge_t;

/* muster_nodes: how many nodes are active and how many gone. */
static void collect_node_states(json_t *nodes, metrics_out_t *out) {
  size_t i;
  json_t *node;
  int64_t active = 0, gone = 0;
  json_array_foreach(nodes, i, node) {
    *(strcmp(jstr(node, "state"), "active") == 0 ? &active : &gone) += 1;
  }
  metrics_help(out, "muster_nodes", "gauge",
               "Registered nodes by state (gone: left or timed out), now.");
  metrics_printf(out, "muster_nodes{state=\"active\"} %lld\nmuster_nodes{state=\"gone\"} %lld\n",
                 (long long)active, (long long)gone);
}

/* One gauge per node and node_gauge_t: up, workers, CPUs and GPUs. */
static void collect_node_gauges(json_t *nodes, metrics_out_t *out) {
  static const struct {
    const char *metric, *help;
  } gauges[] = {
      [NODE_UP] = {"muster_node_up", "1 while the node is active, 0 once it is gone."},
      [NODE_WORKERS] = {"muster_node_workers", "Active workers of each node, now."},
      [NODE_CPUS] = {"muster_node_cpus", "CPUs each node reported."},
      [NODE_GPUS] = {"muster_node_gpus", "GPUs each node reported."},
  };
  for (int k = NODE_UP; k <= NODE_GPUS; k++) {
    metrics_help(out, gauges[k].metric, "gauge", gauges[k].help);
    size_t i;
    json_t *node;
    json_array_foreach(nodes, i, node) {
      int64_t v = k == NODE_UP        ? strcmp(jstr(node, "state"), "active") == 0
                  : k == NODE_WORKERS ? jint(node, "workers")
                  : k == NODE_CPUS    ? jint(node, "cpus")
                                      : (int64_t)json_array_size(json_object_get(node, "gpus"));
      open_sample(out, gauges[k].metric, "node", jstr(node, "name"));
      metrics_printf(out, "} %lld\n", (long long)v);
    }
  }
}

/* The total and free memory of every GPU of every node, labelled by both. */
static void collect_node_gpu_memory(json_t *nodes, metrics_out_t *out) {
  static const struct {
    const char *metric, *field, *help;
  } memories[] = {
      {"muster_node_gpu_memory_bytes", "memory_total_mb",
       "Memory of each GPU, as its node reported it when it registered."},
      {"muster_node_gpu_memory_free_bytes", "memory_free_mb",
       "Free memory of each GPU, as its node reported it when it registered."},
  };
  for (size_t k = 0; k < sizeof memories / sizeof memories[0]; k++) {
    metrics_help(out, memories[k].metric, "gauge", memories[k].help);
    size_t i;
    json_t *node;
    json_array_foreach(nodes, i, node) {
      size_t g;
      json_t *gpu;
      json_array_foreach(json_object_get(node, "gpus"), g, gpu) {
        open_sample(out, memories[k].metric, "node", jstr(node, "name"));
        metrics_printf(out, ",gpu=\"%lld\"} %lld\n", (long long)jint(gpu, "index"),
                       (long long)jint(gpu, memories[k].field) * 1024 * 1024);
      }
    }
  }
}

/* The node families, from node_list: what GET /v1/nodes answers. */
static void collect_nodes(head_t *h, metrics_out_t *out) {
  fail_t f = {0};
  json_t *reply = node_list(h->st, &f);
  if (reply == NULL)
    return;
  json_t *nodes = json_object_get(reply, "nodes");
  collect_node_states(nodes, out);
  collect_node_gauges(nodes, out);
  collect_node_gpu_memory(nodes, out);
  collect_node_caches(nodes, out);
  json_decref(reply);
}

/* ---- sessions ---- */

/* The open sessions of one queue, summed up. */
typedef struct {
  char *queue; /* owned */
  int64_t open, total, done, failed;
} session_row_t;

/* The open sessions by queue into *rows (the caller frees each queue and the
 * array; rows read before an allocation failed are kept); false when the
 * statement cannot be prepared. */
static bool load_sessions(head_t *h, session_row_t **rows, size_t *n) {
  sqlite3_stmt *s =
      store_stmt(h->st, "SELECT queue, count(*), sum(total), sum(done), sum(failed)"
                        " FROM sessions WHERE state = 0 GROUP BY queue ORDER BY queue");
  if (s == NULL)
    return false;
  size_t cap = 0;
  while (sqlite3_step(s) == SQLITE_ROW) {
    if (*n == cap) {
      session_row_t *grown = realloc(*rows, (cap = cap ? cap * 2 : 8) * sizeof **rows);
      if (grown == NULL)
        break;
      *rows = grown;
    }
    const char *queue = (const char *)sqlite3_column_text(s, 0);
    session_row_t *r = &(*rows)[*n];
    *r = (session_row_t){strdup(queue ? queue : ""), sqlite3_column_int64(s, 1),
                         sqlite3_column_int64(s, 2), sqlite3_column_int64(s, 3),
                         sqlite3_column_int64(s, 4)};
    if (r->queue == NULL)
      break;
    (*n)++;
  }
  store_reset(s);
  return true;
}

/* muster_sessions and muster_session_tasks: the open sessions by queue. */
static void collect_sessions(head_t *h, metrics_out_t *out) {
  session_row_t *rows = NULL;
  size_t n = 0;
  if (!load_sessions(h, &rows, &n))
    return;
  metrics_help(out, "muster_sessions", "gauge", "Open sessions by queue, now.");
  for (size_t i = 0; i < n; i++) {
    open_sample(out, "muster_sessions", "queue", rows[i].queue);
    metrics_printf(out, "} %lld\n", (long long)rows[i].open);
  }
  metrics_help(out, "muster_session_tasks", "gauge",
               "Tasks submitted through the open sessions of each queue, by outcome "
               "(pending: no result yet), now.");
  for (size_t i = 0; i < n; i++) {
    int64_t by[3] = {rows[i].done, rows[i].failed, rows[i].total - rows[i].done - rows[i].failed};
    static const char *const outcomes[3] = {"done", "failed", "pending"};
    for (int k = 0; k < 3; k++) {
      open_sample(out, "muster_session_tasks", "queue", rows[i].queue);
      metrics_printf(out, ",state=\"%s\"} %lld\n", outcomes[k], (long long)by[k]);
    }
  }
  for (size_t i = 0; i < n; i++)
    free(rows[i].queue);
  free(rows);
}

/* ---- iterations ---- */

typedef struct {
  const char *name;
  int64_t epoch, finished, total, done, leased, pending;
  int64_t health[N_HEALTH];
  int64_t samples, acked, expired, taken;
} iter_info_t;

/* Fills *x, zeroed, from the status of one iteration: its blocks, and its
 * ranks' health and counters summed up. */
static void iter_info_read(iter_info_t *x, const json_t *it) {
  json_t *blocks = json_object_get(it, "blocks");
  x->epoch = jint(it, "epoch");
  x->finished = json_is_true(json_object_get(it, "finished"));
  x->total = jint(blocks, "total");
  x->done = jint(blocks, "done");
  x->leased = jint(blocks, "leased");
  x->pending = jint(blocks, "pending");
  size_t r;
  json_t *rank;
  json_array_foreach(json_object_get(it, "ranks"), r, rank) {
    for (size_t k = 0; k < N_HEALTH; k++)
      if (strcmp(jstr(rank, "health"), rank_healths[k]) == 0)
        x->health[k]++;
    x->samples += jint(rank, "samples");
    x->acked += jint(rank, "blocks");
    x->expired += jint(rank, "expired");
    x->taken += jint(rank, "taken_over");
  }
}

/* The status of every iteration, through iter_get (the JSON of
 * GET /v1/iterations/{name}); names point into *names. */
static iter_info_t *load_iterations(head_t *h, json_t **names, size_t *n) {
  *n = 0;
  *names = json_array();
  sqlite3_stmt *s = store_stmt(h->st, "SELECT name FROM iterations ORDER BY name");
  if (s == NULL || *names == NULL)
    return NULL;
  while (sqlite3_step(s) == SQLITE_ROW)
    json_array_append_new(*names, json_string((const char *)sqlite3_column_text(s, 0)));
  store_reset(s);
  iter_info_t *info = calloc(json_array_size(*names) + 1, sizeof *info);
  if (info == NULL)
    return NULL;
  size_t i;
  json_t *name;
  json_array_foreach(*names, i, name) {
    fail_t f = {0};
    json_t *it = iter_get(h->st, json_string_value(name), &f);
    if (it == NULL)
      continue;
    iter_info_t *x = &info[(*n)++];
    x->name = json_string_value(name);
    iter_info_read(x, it);
    json_decref(it);
  }
  return info;
}

/* The families with one sample per iteration: each an iter_info_t field. */
static void collect_iteration_values(const iter_info_t *info, size_t n, metrics_out_t *out) {
  static const struct {
    const char *metric, *type, *help;
    size_t offset;
  } plain[] = {
      {"muster_iteration_epoch", "gauge", "The epoch an iteration is in (0 is the first).",
       offsetof(iter_info_t, epoch)},
      {"muster_iteration_finished", "gauge", "1 once an iteration has finished every epoch.",
       offsetof(iter_info_t, finished)},
      {"muster_iteration_epoch_blocks", "gauge",
       "Blocks in the current epoch of an iteration (0 once finished).",
       offsetof(iter_info_t, total)},
      {"muster_iteration_samples_total", "counter",
       "Samples of acknowledged blocks, over every epoch and rank.",
       offsetof(iter_info_t, samples)},
      {"muster_iteration_blocks_acked_total", "counter",
       "Blocks acknowledged, over every epoch and rank.", offsetof(iter_info_t, acked)},
      {"muster_iteration_leases_expired_total", "counter",
       "Block leases that passed their deadline (each fails its rank).",
       offsetof(iter_info_t, expired)},
      {"muster_iteration_blocks_taken_over_total", "counter",
       "Blocks a rank leased from another, failed rank's share.", offsetof(iter_info_t, taken)},
  };
  for (size_t k = 0; k < sizeof plain / sizeof plain[0]; k++) {
    metrics_help(out, plain[k].metric, plain[k].type, plain[k].help);
    for (size_t i = 0; i < n; i++) {
      open_sample(out, plain[k].metric, "iteration", info[i].name);
      metrics_printf(out, "} %lld\n",
                     (long long)*(const int64_t *)((const char *)&info[i] + plain[k].offset));
    }
  }
}

/* The families with one sample per iteration and state: its blocks by state
 * and its ranks by health. */
static void collect_iteration_states(const iter_info_t *info, size_t n, metrics_out_t *out) {
  metrics_help(out, "muster_iteration_blocks", "gauge",
               "Blocks of the current epoch by state (pending: returned by a failed rank and "
               "not leased again), now.");
  for (size_t i = 0; i < n; i++) {
    int64_t by[3] = {info[i].done, info[i].leased, info[i].pending};
    static const char *const states[3] = {"done", "leased", "pending"};
    for (int k = 0; k < 3; k++) {
      open_sample(out, "muster_iteration_blocks", "iteration", info[i].name);
      metrics_printf(out, ",state=\"%s\"} %lld\n", states[k], (long long)by[k]);
    }
  }
  metrics_help(out, "muster_iteration_ranks", "gauge", "Ranks of an iteration by health, now.");
  for (size_t i = 0; i < n; i++)
    for (size_t k = 0; k < N_HEALTH; k++) {
      open_sample(out, "muster_iteration_ranks", "iteration", info[i].name);
      metrics_printf(out, ",health=\"%s\"} %lld\n", rank_healths[k], (long long)info[i].health[k]);
    }
}

/* The iteration families, from iter_get: what GET /v1/iterations/{name} answers. */
static void collect_iterations(head_t *h, metrics_out_t *out) {
  json_t *names;
  size_t n;
  iter_info_t *info = load_iterations(h, &names, &n);
  if (info == NULL) {
    json_decref(names);
    return;
  }
  metrics_help(out, "muster_iterations", "gauge", "Iterations on the head, now.");
  metrics_printf(out, "muster_iterations %zu\n", n);
  collect_iteration_values(info, n, out);
  collect_iteration_states(info, n, out);
  free(info);
  json_decref(names);
}

/* ---- shared data ---- */

/* Session scopes are many and short-lived: they are summed up under this
 * label value, which no scope can have ('*' is not a name character). */
#define SESSION_SCOPES "s-*"

static bool store_has_table(head_t *h, const char *table) {
  sqlite3_stmt *s =
      store_stmt(h->st, "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1");
  if (s == NULL)
    return false;
  store_bind_text(s, 1, table);
  bool found = sqlite3_step(s) == SQLITE_ROW;
  store_reset(s);
  return found;
}

/* The unexpired shared data of one scope, or of every session scope. */
typedef struct {
  char scope[NAME_MAX_LEN + 1];
  int64_t v[3]; /* blobs, levels, bytes */
} shared_row_t;

/* Sums up the unexpired blobs by scope into *rows (the caller frees it; rows
 * read before an allocation failed are kept), those of session scopes into
 * *sessions; false when the statement cannot be prepared. */
static bool load_shared(head_t *h, shared_row_t **rows, size_t *n, shared_row_t *sessions) {
  /* Unexpired blobs only (an expired one answers 404 until the sweep deletes it). */
  sqlite3_stmt *s = store_stmt(
      h->st, "SELECT b.scope, count(DISTINCT b.name), count(l.level), coalesce(sum(l.size), 0)"
             " FROM shared_blobs b LEFT JOIN shared_levels l ON l.scope = b.scope"
             " AND l.name = b.name WHERE b.expires_ms > ?1 GROUP BY b.scope ORDER BY b.scope");
  if (s == NULL)
    return false;
  size_t cap = 0;
  sqlite3_bind_int64(s, 1, now_ms());
  while (sqlite3_step(s) == SQLITE_ROW) {
    const char *scope = (const char *)sqlite3_column_text(s, 0);
    shared_row_t *r = sessions;
    if (scope == NULL || strncmp(scope, "s-", 2) != 0) {
      if (*n == cap) {
        shared_row_t *grown = realloc(*rows, (cap = cap ? cap * 2 : 8) * sizeof **rows);
        if (grown == NULL)
          break;
        *rows = grown;
      }
      r = &(*rows)[(*n)++];
      *r = (shared_row_t){{0}, {0, 0, 0}};
      snprintf(r->scope, sizeof r->scope, "%s", scope ? scope : "");
    }
    for (int k = 0; k < 3; k++)
      r->v[k] += sqlite3_column_int64(s, k + 1);
  }
  store_reset(s);
  return true;
}

/* The shared data families by scope, the session scopes last as one. */
static void collect_shared(head_t *h, metrics_out_t *out) {
  if (!store_has_table(h, "shared_blobs") || !store_has_table(h, "shared_levels"))
    return;
  shared_row_t *rows = NULL, sessions = {SESSION_SCOPES, {0, 0, 0}};
  size_t n = 0;
  if (!load_shared(h, &rows, &n, &sessions))
    return;
  static const struct {
    const char *metric, *help;
  } families[3] = {
      {"muster_shared_blobs",
       "Shared data blobs (unexpired) by scope; every session scope counts under scope=\"s-*\"."},
      {"muster_shared_levels", "Levels of shared data kept on the head, by scope."},
      {"muster_shared_bytes", "Bytes of every kept level of shared data, by scope."},
  };
  for (int k = 0; k < 3; k++) {
    metrics_help(out, families[k].metric, "gauge", families[k].help);
    for (size_t i = 0; i <= n; i++) {
      const shared_row_t *r = i < n ? &rows[i] : &sessions;
      open_sample(out, families[k].metric, "scope", r->scope);
      metrics_printf(out, "} %lld\n", (long long)r->v[k]);
    }
  }
  free(rows);
}

void metrics_extra_collect(head_t *h, metrics_out_t *out) {
  collect_nodes(h, out);
  collect_sessions(h, out);
  collect_iterations(h, out);
  collect_shared(h, out);
}
