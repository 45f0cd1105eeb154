/*
 * node.c — node registry.
 *
 * Nodes are keyed by name, so an agent that restarts on the same machine finds
 * its record again; the record is never deleted (a gone node keeps showing in
 * the list with state "gone").  Workers point at their node by name (the
 * `node` column of workers), and a node's worker count is read live from that
 * table.  Timeouts are checked by the head's sweep with one indexed read.
 */
#include "node.h"
#include "jv.h"
#include "lease.h"
#include "log.h"
#include "worker.h"
#include "core/names.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Validates body["gpus"]: an array of {"index", "mig", "name",
 * "memory_total_mb", "memory_free_mb"} objects, `index` required (`mig`: a MIG
 * instance of GPU `index`). */
static muster_err_t node_check_gpus(const json_t *gpus, fail_t *f) {
  static const char *const allowed[] = {"index",          "mig", "name", "memory_total_mb",
                                        "memory_free_mb", NULL};
  if (!json_is_array(gpus))
    return fail_set(f, MUSTER_INVALID, "gpus: expected an array of GPU objects");
  if (json_array_size(gpus) > NODE_MAX_GPUS)
    return fail_set(f, MUSTER_INVALID, "gpus: %zu elements, at most %d allowed",
                    json_array_size(gpus), NODE_MAX_GPUS);
  for (size_t i = 0; i < json_array_size(gpus); i++) {
    const json_t *gpu = json_array_get(gpus, i);
    char ctx[32];
    snprintf(ctx, sizeof ctx, "gpus[%zu]", i);
    int64_t index, mig, mb;
    const char *name;
    if (!json_is_object(gpu))
      return fail_set(f, MUSTER_INVALID, "%s: expected an object", ctx);
    if (jv_only(gpu, ctx, allowed, f) || jv_int(gpu, "index", ctx, -1, 0, 65535, &index, f) ||
        jv_int(gpu, "mig", ctx, -1, 0, 65535, &mig, f) ||
        jv_str(gpu, "name", ctx, NULL, NODE_MAX_TEXT, &name, f) ||
        jv_int(gpu, "memory_total_mb", ctx, 0, 0, INT32_MAX, &mb, f) ||
        jv_int(gpu, "memory_free_mb", ctx, 0, 0, INT32_MAX, &mb, f))
      return f->code;
    if (index < 0)
      return fail_set(f, MUSTER_INVALID, "%s.index: missing", ctx);
  }
  return MUSTER_OK;
}

typedef struct {
  const char *name, *hostname, *address; /* borrowed from the body */
  const char *instance;                  /* the agent process's id, NULL: none sent */
  const char *previous_instance;         /* the dead agent it replaces (its lock proved it) */
  int64_t cpus, timeout_ms;
  char *gpus, *labels; /* encoded JSON or NULL, owned */
} node_spec_t;

static muster_err_t node_spec_parse(const json_t *body, int64_t default_timeout_ms,
                                    node_spec_t *spec, fail_t *f) {
  static const char *const allowed[] = {
      "name",       "hostname", "address",           "cpus", "gpus", "labels",
      "timeout_ms", "instance", "previous_instance", NULL};
  if (jv_only(body, "", allowed, f) ||
      jv_str(body, "name", "", NULL, NAME_MAX_LEN * 4, &spec->name, f) ||
      jv_str(body, "hostname", "", NULL, NODE_MAX_TEXT, &spec->hostname, f) ||
      jv_str(body, "address", "", NULL, NODE_MAX_TEXT, &spec->address, f) ||
      jv_int(body, "cpus", "", 0, 0, 1 << 20, &spec->cpus, f) ||
      jv_int(body, "timeout_ms", "", default_timeout_ms, 100, 7LL * 24 * 3600 * 1000,
             &spec->timeout_ms, f) ||
      jv_name(body, "instance", "", &spec->instance, f) ||
      jv_name(body, "previous_instance", "", &spec->previous_instance, f))
    return f->code;
  if (spec->previous_instance && spec->instance == NULL)
    return fail_set(f, MUSTER_INVALID,
                    "previous_instance: sent without instance; an agent that replaces another "
                    "names its own instance too");
  if (spec->name == NULL)
    return fail_set(f, MUSTER_INVALID, "name: missing (every node needs a name)");
  if (!name_is_valid(spec->name))
    return fail_set(f, MUSTER_NAME_INVALID, "node name '%.140s' is invalid: %s", spec->name,
                    name_rule_text(spec->name));
  const json_t *gpus = json_object_get(body, "gpus"), *labels = json_object_get(body, "labels");
  if (gpus && !json_is_null(gpus)) {
    if (node_check_gpus(gpus, f))
      return f->code;
    spec->gpus = jv_encode(gpus);
  }
  if (labels && !json_is_null(labels)) {
    if (!json_is_object(labels))
      return fail_set(f, MUSTER_INVALID, "labels: expected an object");
    spec->labels = jv_encode(labels);
  }
  return MUSTER_OK;
}

/* The state of node `name`: NODE_ACTIVE, NODE_GONE, or -1 when unknown. */
static int node_state(store_t *st, const char *name) {
  sqlite3_stmt *s = store_stmt(st, "SELECT state FROM nodes WHERE name = ?1");
  if (s == NULL)
    return -1;
  store_bind_text(s, 1, name);
  int state = sqlite3_step(s) == SQLITE_ROW ? sqlite3_column_int(s, 0) : -1;
  store_reset(s);
  return state;
}

static muster_err_t node_check_active(store_t *st, const char *name, fail_t *f) {
  int state = node_state(st, name);
  if (state == NODE_ACTIVE)
    return MUSTER_OK;
  if (state == NODE_GONE)
    return fail_set(f, MUSTER_NODE_NOT_FOUND,
                    "node '%.140s' is gone (it left or timed out); register it again", name);
  return fail_set(f, MUSTER_NODE_NOT_FOUND, "node '%.140s' does not exist", name);
}

/* Marks the active workers of node `name` gone for `why`; their ids into
 * *ids (the caller frees it, also on failure), how many into *n. */
static muster_err_t node_mark_workers_gone(store_t *st, const char *name, worker_gone_t why,
                                           int64_t **ids, size_t *n, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "UPDATE workers SET state = 1, gone_reason = ?2,"
                                   " gone_at_ms = ?3 WHERE node = ?1 AND state = 0 RETURNING id");
  if (s == NULL)
    return store_fail(st, f, "node workers");
  store_bind_text(s, 1, name);
  store_bind_text(s, 2, worker_gone_name(why));
  sqlite3_bind_int64(s, 3, now_ms());
  size_t cap = 0;
  int rc;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    if (*n == cap) {
      int64_t *grown = realloc(*ids, (cap = cap ? cap * 2 : 16) * sizeof **ids);
      if (grown == NULL)
        break;
      *ids = grown;
    }
    (*ids)[(*n)++] = sqlite3_column_int64(s, 0);
  }
  store_reset(s);
  if (rc == SQLITE_DONE)
    return MUSTER_OK;
  return rc == SQLITE_ROW ? fail_set(f, MUSTER_NOMEM, "out of memory")
                          : store_fail(st, f, "node workers");
}

/* Marks the active workers of node `name` gone for `why` and ends their
 * leases: lapsed when the node timed out (the attempt counts, as for a
 * worker's own timeout), else released.  *workers and *leases (may be NULL)
 * receive the counts. */
static muster_err_t node_end_workers(store_t *st, const char *name, worker_gone_t why,
                                     int64_t *workers, int64_t *leases, fail_t *f) {
  int64_t *ids = NULL, ended = 0;
  size_t n = 0;
  if (node_mark_workers_gone(st, name, why, &ids, &n, f)) {
    free(ids);
    return f->code;
  }
  for (size_t i = 0; i < n; i++) {
    int64_t k = why == WORKER_GONE_NODE_TIMEOUT ? lease_lapse_worker(st, ids[i], "node timed out")
                                                : lease_end_worker(st, ids[i], false);
    if (k < 0) {
      free(ids);
      return store_fail(st, f, "ending the leases of a node's workers");
    }
    ended += k;
  }
  free(ids);
  if (workers)
    *workers = (int64_t)n;
  if (leases)
    *leases = ended;
  return MUSTER_OK;
}

#define NODE_COLUMNS                                                                               \
  "n.name, n.hostname, n.address, n.cpus, n.gpus, n.labels, n.state, n.timeout_ms,"                \
  " n.last_seen_ms, n.created_ms,"                                                                 \
  " (SELECT count(*) FROM workers w WHERE w.node = n.name AND w.state = 0), n.cache"

static json_t *node_text(sqlite3_stmt *s, int col, bool decode, json_t *dflt) {
  const unsigned char *t = sqlite3_column_text(s, col);
  if (t == NULL)
    return dflt;
  json_decref(dflt);
  return decode ? jv_decode((const char *)t) : json_string((const char *)t);
}

static json_t *node_from_row(sqlite3_stmt *s) {
  return json_pack(
      "{s:s, s:o, s:o, s:I, s:o, s:o, s:s, s:I, s:I, s:I, s:I, s:o}", "name",
      (const char *)sqlite3_column_text(s, 0), "hostname", node_text(s, 1, false, json_null()),
      "address", node_text(s, 2, false, json_null()), "cpus",
      (json_int_t)sqlite3_column_int64(s, 3), "gpus", node_text(s, 4, true, json_array()), "labels",
      node_text(s, 5, true, json_object()), "state",
      sqlite3_column_int(s, 6) == NODE_ACTIVE ? "active" : "gone", "timeout_ms",
      (json_int_t)sqlite3_column_int64(s, 7), "last_seen_ms",
      (json_int_t)sqlite3_column_int64(s, 8), "created_ms", (json_int_t)sqlite3_column_int64(s, 9),
      "workers", (json_int_t)sqlite3_column_int64(s, 10), "cache",
      node_text(s, 11, true, json_null()));
}

json_t *node_get(store_t *st, const char *name, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT " NODE_COLUMNS " FROM nodes n WHERE n.name = ?1");
  if (s == NULL) {
    store_fail(st, f, "node lookup");
    return NULL;
  }
  store_bind_text(s, 1, name);
  json_t *node = sqlite3_step(s) == SQLITE_ROW ? node_from_row(s) : NULL;
  store_reset(s);
  if (node == NULL)
    fail_set(f, MUSTER_NODE_NOT_FOUND, "node '%.140s' does not exist", name);
  return node;
}

json_t *node_list(store_t *st, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT " NODE_COLUMNS " FROM nodes n ORDER BY n.name");
  if (s == NULL) {
    store_fail(st, f, "node list");
    return NULL;
  }
  json_t *list = json_array();
  while (sqlite3_step(s) == SQLITE_ROW)
    json_array_append_new(list, node_from_row(s));
  store_reset(s);
  return json_pack("{s:o}", "nodes", list);
}

/* The agent instance that holds a node: another instance's active record. */
typedef struct {
  char instance[NAME_MAX_LEN + 1]; /* "" when no other instance holds it */
  char hostname[NODE_MAX_TEXT + 1];
  int64_t silent_ms;  /* since its last heartbeat or registration, or the last stall */
  int64_t timeout_ms; /* the node's */
} node_holder_t;

static muster_err_t node_read_holder(store_t *st, const node_spec_t *spec, node_holder_t *h,
                                     fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT instance, coalesce(hostname, ''), last_seen_ms,"
                                   " timeout_ms FROM nodes WHERE name = ?1 AND state = 0"
                                   " AND instance IS NOT NULL AND instance != ?2");
  if (s == NULL)
    return store_fail(st, f, "node register");
  store_bind_text(s, 1, spec->name);
  store_bind_text(s, 2, spec->instance);
  int rc = sqlite3_step(s);
  if (rc == SQLITE_ROW) {
    snprintf(h->instance, sizeof h->instance, "%s", (const char *)sqlite3_column_text(s, 0));
    snprintf(h->hostname, sizeof h->hostname, "%s", (const char *)sqlite3_column_text(s, 1));
    /* Silence during a stall (a restart, a loop that did not run, a flush the
     * disk held) is not the agent's: counted from the stall's end, as the
     * sweep counts a node's timeout (store_heard_since_ms). */
    int64_t seen = sqlite3_column_int64(s, 2), since = store_heard_since_ms(st);
    h->silent_ms = now_ms() - (seen > since ? seen : since);
    h->timeout_ms = sqlite3_column_int64(s, 3);
  }
  store_reset(s);
  if (rc != SQLITE_ROW && rc != SQLITE_DONE)
    return store_fail(st, f, "node register");
  return MUSTER_OK;
}

/*
 * Node names are chosen by people (default: the hostname), so two agents can
 * name the same node: several agents on one host, cloned machines.  Without
 * a check the second registration took the record over and ended the first
 * agent's workers, and the two flipped it back and forth.  An agent sends a
 * random id per process ("instance"); a registration from another instance
 * is refused while the node is active and its agent heard from within its
 * timeout.  A restarted agent whose predecessor crashed is accepted at once
 * when it names that predecessor as previous_instance: it took the lock the
 * dead one held on the same machine, which proves it gone (the agent sends
 * only an instance its lock file proves, src/node/lock.c); *took_over says
 * so.  A wrong previous_instance changes nothing.  Otherwise a crashed
 * agent's name is free once it has been silent for the timeout; one that
 * stopped cleanly said goodbye, so the node is gone and its successor is
 * accepted at once.  Registrations without an instance (older agents, plain
 * HTTP) are never refused.  `took_over` has room for NAME_MAX_LEN + 1 bytes.
 */
static muster_err_t node_check_holder(store_t *st, const node_spec_t *spec, char *took_over,
                                      fail_t *f) {
  node_holder_t h = {0};
  if (spec->instance == NULL)
    return MUSTER_OK;
  if (node_read_holder(st, spec, &h, f))
    return f->code;
  if (spec->previous_instance && strcmp(h.instance, spec->previous_instance) == 0) {
    snprintf(took_over, NAME_MAX_LEN + 1, "%s", h.instance);
    return MUSTER_OK;
  }
  if (h.instance[0] == '\0' || h.silent_ms >= h.timeout_ms)
    return MUSTER_OK;
  char host[NODE_MAX_TEXT + 16] = "which gave no hostname";
  if (h.hostname[0] != '\0')
    snprintf(host, sizeof host, "on host '%s'", h.hostname);
  return fail_set(f, MUSTER_INVALID_STATE,
                  "node '%.140s' is held by another running agent (%.220s, heard from "
                  "%lld ms ago); two agents cannot share a node name: give this one its own "
                  "(muster node --name NAME; it defaults to the hostname). If that agent has "
                  "stopped, this registration is accepted once it has been silent for the "
                  "node's timeout (%lld ms)",
                  spec->name, host, (long long)(h.silent_ms > 0 ? h.silent_ms : 0),
                  (long long)h.timeout_ms);
}

/* Whether `spec` comes from the agent process that the node's record names:
 * one the head had timed out (it was paused, or cut off) and that is back.
 * Its workers are its own, running: those of before the timeout ended with
 * the node, and those that registered since serve, maybe under a lease that
 * must not be released (its task would run twice). */
static bool node_same_agent(store_t *st, const node_spec_t *spec) {
  if (spec->instance == NULL)
    return false;
  sqlite3_stmt *s = store_stmt(st, "SELECT 1 FROM nodes WHERE name = ?1 AND instance = ?2");
  if (s == NULL)
    return false;
  store_bind_text(s, 1, spec->name);
  store_bind_text(s, 2, spec->instance);
  bool same = sqlite3_step(s) == SQLITE_ROW;
  store_reset(s);
  return same;
}

/* Writes the record of a new or re-registering node; created_ms stays. */
static muster_err_t node_write(store_t *st, const node_spec_t *spec, fail_t *f) {
  sqlite3_stmt *s = store_stmt(
      st, "INSERT INTO nodes(name, hostname, address, cpus, gpus, labels, state, timeout_ms,"
          " last_seen_ms, created_ms, instance) VALUES(?1, ?2, ?3, ?4, ?5, ?6, 0, ?7, ?8, ?8, ?9)"
          " ON CONFLICT(name) DO UPDATE SET hostname = excluded.hostname,"
          " address = excluded.address, cpus = excluded.cpus, gpus = excluded.gpus,"
          " labels = excluded.labels, state = 0, timeout_ms = excluded.timeout_ms,"
          " last_seen_ms = excluded.last_seen_ms, cache = NULL, instance = excluded.instance");
  if (s == NULL)
    return store_fail(st, f, "node register");
  store_bind_text(s, 1, spec->name);
  store_bind_text(s, 2, spec->hostname);
  store_bind_text(s, 3, spec->address);
  sqlite3_bind_int64(s, 4, spec->cpus);
  store_bind_text(s, 5, spec->gpus);
  store_bind_text(s, 6, spec->labels);
  sqlite3_bind_int64(s, 7, spec->timeout_ms);
  sqlite3_bind_int64(s, 8, now_ms());
  store_bind_text(s, 9, spec->instance);
  return store_step_done(st, s, f);
}

json_t *node_register(store_t *st, const json_t *body, int64_t default_timeout_ms, bool *created,
                      fail_t *f) {
  node_spec_t spec = {0};
  json_t *out = NULL;
  if (node_spec_parse(body, default_timeout_ms, &spec, f) == MUSTER_OK) {
    *created = node_state(st, spec.name) < 0;
    /* A restarted agent's old workers died with it: free their tasks at once.
     * The same agent back after a timeout keeps the workers it runs. */
    bool keep = *created || node_same_agent(st, &spec);
    int64_t workers = 0, released = 0;
    char took_over[NAME_MAX_LEN + 1] = "";
    if (node_check_holder(st, &spec, took_over, f) == MUSTER_OK &&
        (keep || node_end_workers(st, spec.name, WORKER_GONE_NODE_RESTARTED, &workers, &released,
                                  f) == MUSTER_OK) &&
        node_write(st, &spec, f) == MUSTER_OK)
      out = node_get(st, spec.name, f);
    if (out && !*created && keep)
      log_msg(LOG_INFO, "node %s registered again by its agent (instance %s); its workers stay",
              spec.name, spec.instance);
    else if (out && took_over[0])
      log_msg(LOG_INFO,
              "node %s: a restarted agent took over from instance %s (its lock proved %s "
              "gone); %lld workers ended, %lld leases released",
              spec.name, took_over, took_over, (long long)workers, (long long)released);
    else if (out && !*created)
      log_msg(LOG_INFO, "node %s registered again; %lld old workers gone, %lld leases released",
              spec.name, (long long)workers, (long long)released);
  }
  free(spec.gpus);
  free(spec.labels);
  return out;
}

/* The counters a node agent reports for its shared-data cache (docs/api.md). */
static const char *const node_cache_fields[] = {
    "hits",           "misses",          "coalesced",
    "bytes_served",   "evictions",       "upstream_fetches",
    "fetch_failures", "verify_failures", NULL};

/* Checks body["cache"] (absent, or an object of non-negative integer counters)
 * and returns it encoded (caller frees), or NULL when absent. */
static muster_err_t node_cache_arg(const json_t *body, char **cache, fail_t *f) {
  const json_t *c = json_object_get(body, "cache");
  int64_t ignored;
  *cache = NULL;
  if (c == NULL || json_is_null(c))
    return MUSTER_OK;
  if (!json_is_object(c))
    return fail_set(f, MUSTER_INVALID, "cache: expected an object of counters");
  if (jv_only(c, "cache", node_cache_fields, f))
    return f->code;
  for (const char *const *k = node_cache_fields; *k; k++)
    if (jv_int(c, *k, "cache", 0, 0, INT64_MAX, &ignored, f))
      return f->code;
  *cache = jv_encode(c);
  return *cache ? MUSTER_OK : fail_set(f, MUSTER_NOMEM, "out of memory");
}

/* A heartbeat from agent `instance` (NULL: none sent) of a node that another
 * instance registered since (an agent paused past its timeout, whose name a
 * second agent took over meanwhile) is refused: its workers are that one's
 * now, and it must register again (node_check_instance refuses it while the
 * other is alive). */
json_t *node_heartbeat(store_t *st, const char *name, const json_t *body, fail_t *f) {
  static const char *const allowed[] = {"cache", "instance", NULL};
  char *cache = NULL;
  const char *instance = NULL;
  if (jv_only(body, "", allowed, f) ||
      jv_str(body, "instance", "", NULL, NAME_MAX_LEN * 4, &instance, f) ||
      node_cache_arg(body, &cache, f) || node_check_active(st, name, f)) {
    free(cache);
    return NULL;
  }
  sqlite3_stmt *s = store_stmt(st, "UPDATE nodes SET last_seen_ms = ?2,"
                                   " cache = coalesce(?3, cache) WHERE name = ?1"
                                   " AND (?4 IS NULL OR instance IS NULL OR instance = ?4)");
  if (s == NULL) {
    free(cache);
    store_fail(st, f, "node heartbeat");
    return NULL;
  }
  store_bind_text(s, 1, name);
  sqlite3_bind_int64(s, 2, now_ms());
  store_bind_text(s, 3, cache);
  store_bind_text(s, 4, instance);
  free(cache);
  if (store_step_done(st, s, f))
    return NULL;
  if (sqlite3_changes(store_db(st)) == 0) {
    fail_set(f, MUSTER_INVALID_STATE,
             "node '%s' was registered by another agent since this one last reported (two "
             "agents share the name); this agent must register again, and is refused while "
             "the other runs: give it its own name (muster node --name NAME)",
             name);
    return NULL;
  }
  return json_pack("{s:s, s:s}", "name", name, "state", "active");
}

static muster_err_t node_mark_gone(store_t *st, const char *name, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "UPDATE nodes SET state = 1 WHERE name = ?1");
  if (s == NULL)
    return store_fail(st, f, "node update");
  store_bind_text(s, 1, name);
  return store_step_done(st, s, f);
}

json_t *node_leave(store_t *st, const char *name, fail_t *f) {
  int64_t workers = 0, released = 0;
  if (node_check_active(st, name, f) || node_mark_gone(st, name, f) ||
      node_end_workers(st, name, WORKER_GONE_NODE_LEFT, &workers, &released, f))
    return NULL;
  return json_pack("{s:s, s:I, s:I}", "name", name, "workers", (json_int_t)workers, "released",
                   (json_int_t)released);
}

bool node_any_due(store_t *st, int64_t now) {
  return store_due(st, "SELECT 1 FROM nodes WHERE state = 0 AND" STORE_SILENT_SQL " LIMIT 1", now);
}

int64_t node_expire_due(store_t *st, int64_t now) {
  sqlite3_stmt *s =
      store_stmt(st, "SELECT name FROM nodes WHERE state = 0 AND" STORE_SILENT_SQL " LIMIT 64");
  if (s == NULL)
    return -1;
  char names[64][NAME_MAX_LEN + 1];
  size_t n = 0;
  sqlite3_bind_int64(s, 1, now);
  sqlite3_bind_int64(s, 2, store_heard_since_ms(st));
  while (n < 64 && sqlite3_step(s) == SQLITE_ROW)
    snprintf(names[n++], NAME_MAX_LEN + 1, "%s", (const char *)sqlite3_column_text(s, 0));
  store_reset(s);
  for (size_t i = 0; i < n; i++) {
    fail_t f = {0};
    int64_t workers = 0, lapsed = 0;
    if (node_mark_gone(st, names[i], &f) ||
        node_end_workers(st, names[i], WORKER_GONE_NODE_TIMEOUT, &workers, &lapsed, &f))
      return -1;
    log_msg(LOG_INFO, "node %s timed out; %lld workers gone, %lld leases returned", names[i],
            (long long)workers, (long long)lapsed);
  }
  return (int64_t)n;
}
