/*
 * cmd_nodes.c — `muster nodes`, `muster workers` and `muster update`.
 *
 * The listings show what is alive by default (gone nodes and workers pile up
 * over a cluster's life) and everything with --all; --json prints the head's
 * objects unchanged.  `update` posts a broadcast update to a queue's workers.
 */
#include "cli/cli.h"
#include "cli/table.h"
#include "client/jdump.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

const cli_opt_t cmd_nodes_opts[] = {
    {"all", NULL, "also list nodes that are gone"},
    {"json", NULL, "print JSON instead of a table"},
    {NULL, NULL, NULL},
};

const cli_opt_t cmd_workers_opts[] = {
    {"all", NULL, "also list gone workers, with why and when they went"},
    {"queue", "Q", "only workers serving queue Q"},
    {"json", NULL, "print JSON instead of a table"},
    {NULL, NULL, NULL},
};

const cli_opt_t cmd_update_opts[] = {
    {"queue", "Q", "queue whose workers receive the update (required)"},
    {"session", "ID", "delete the update when session ID closes"},
    {"json", NULL, "parse DATA as JSON instead of sending it as a string"},
    {NULL, NULL, NULL},
};

const char cmd_update_details[] =
    "Every worker of the queue receives the update between two tasks, in order,\n"
    "also workers that start later.  Prints the update's sequence number.\n\n"
    "examples:\n"
    "  muster update --queue train --json '{\"lr\": 0.01}'\n";

/* "12s", "3m", "2h" ago for an epoch-ms instant (empty when unknown). */
static const char *nodes_ago(json_t *ms, char *buf, size_t size) {
  struct timeval tv;
  gettimeofday(&tv, NULL);
  int64_t now = (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
  if (!json_is_integer(ms)) {
    snprintf(buf, size, "-");
    return buf;
  }
  int64_t secs = (now - (int64_t)json_integer_value(ms)) / 1000;
  if (secs < 0)
    secs = 0;
  if (secs < 120)
    snprintf(buf, size, "%llds ago", (long long)secs);
  else if (secs < 7200)
    snprintf(buf, size, "%lldm ago", (long long)secs / 60);
  else
    snprintf(buf, size, "%lldh ago", (long long)secs / 3600);
  return buf;
}

/* Integer field `key` of `obj` as text. */
static const char *nodes_int(json_t *obj, const char *key, char *buf, size_t size) {
  json_t *v = json_object_get(obj, key);
  snprintf(buf, size, json_is_integer(v) ? "%lld" : "-", (long long)json_integer_value(v));
  return buf;
}

static const char *nodes_str(json_t *obj, const char *key) {
  const char *s = json_string_value(json_object_get(obj, key));
  return s && s[0] ? s : "-";
}

/* A node's ADDRESS: "127.0.0.1:7371 (local)" for an agent that listens on
 * the loopback only (its default), which answers on its own machine and not
 * from the one running this command, as the bare address would suggest. */
static const char *nodes_address(json_t *node, char *buf, size_t size) {
  const char *address = nodes_str(node, "address");
  bool loopback = strncmp(address, "127.", 4) == 0 || strncmp(address, "[::1]", 5) == 0 ||
                  strncmp(address, "localhost:", 10) == 0;
  if (!loopback)
    return address;
  snprintf(buf, size, "%s (local)", address);
  return buf;
}

/* Non-zero when `obj` is shown: active, or --all. */
static int nodes_shown(json_t *obj, int all) {
  const char *state = json_string_value(json_object_get(obj, "state"));
  return all || (state && strcmp(state, "active") == 0);
}

static void nodes_print(json_t *nodes, int all) {
  static const char *const headers[] = {"NAME", "STATE",   "ADDRESS",  "CPUS",
                                        "GPUS", "WORKERS", "LAST SEEN"};
  static const int right[] = {0, 0, 0, 1, 1, 1, 0};
  cli_table_t table;
  table_init(&table, 7, headers, right);
  size_t i;
  json_t *node;
  json_array_foreach(nodes, i, node) {
    if (!nodes_shown(node, all))
      continue;
    char cpus[24], gpus[24], workers[24], seen[32], address[300];
    snprintf(gpus, sizeof gpus, "%zu", json_array_size(json_object_get(node, "gpus")));
    const char *row[] = {nodes_str(node, "name"),
                         nodes_str(node, "state"),
                         nodes_address(node, address, sizeof address),
                         nodes_int(node, "cpus", cpus, sizeof cpus),
                         gpus,
                         nodes_int(node, "workers", workers, sizeof workers),
                         nodes_ago(json_object_get(node, "last_seen_ms"), seen, sizeof seen)};
    table_add(&table, row);
  }
  table_print(&table, stdout);
  table_free(&table);
}

/* Non-zero when worker `w` names `queue` among its queues (NULL: any). */
static int workers_serves(json_t *w, const char *queue) {
  if (queue == NULL)
    return 1;
  size_t i;
  json_t *q;
  json_array_foreach(json_object_get(w, "queues"), i, q) {
    if (json_is_string(q) && strcmp(json_string_value(q), queue) == 0)
      return 1;
  }
  return 0;
}

/* The worker's queues joined with commas into `buf`. */
static const char *workers_queues(json_t *w, char *buf, size_t size) {
  size_t at = 0, i;
  json_t *q;
  buf[0] = '\0';
  json_array_foreach(json_object_get(w, "queues"), i, q) {
    int n = snprintf(buf + at, size - at, "%s%s", at ? "," : "", json_string_value(q));
    if (n < 0 || (size_t)n >= size - at)
      break;
    at += (size_t)n;
  }
  return at ? buf : "-";
}

/* The STATE cell of worker `w`: "active", or "gone: WHY AGO" ("gone: timed
 * out 3m ago") from its gone_reason and gone_at_ms; "gone" alone for one
 * that went before the head kept why (or a head too old to say). */
static const char *workers_state(json_t *w, char *buf, size_t size) {
  static const char *const reasons[][2] = {
      {"bye", "said bye"},
      {"timeout", "timed out"},
      {"crashed", "crashed"},
      {"node_left", "node left"},
      {"node_timeout", "node timed out"},
      {"node_restarted", "node restarted"},
  };
  const char *state = nodes_str(w, "state");
  const char *reason = json_string_value(json_object_get(w, "gone_reason"));
  if (strcmp(state, "gone") != 0 || reason == NULL)
    return state;
  for (size_t i = 0; i < sizeof reasons / sizeof reasons[0]; i++) {
    if (strcmp(reason, reasons[i][0]) != 0)
      continue;
    char ago[32];
    json_t *at = json_object_get(w, "gone_at_ms");
    snprintf(buf, size, "gone: %s%s%s", reasons[i][1], json_is_integer(at) ? " " : "",
             json_is_integer(at) ? nodes_ago(at, ago, sizeof ago) : "");
    return buf;
  }
  return state;
}

static void workers_print(json_t *workers, int all, const char *queue) {
  static const char *const headers[] = {"ID",   "NAME",   "NODE",   "STATE",   "QUEUES",
                                        "DONE", "FAILED", "LEASES", "PROGRESS"};
  static const int right[] = {1, 0, 0, 0, 0, 1, 1, 1, 0};
  cli_table_t table;
  table_init(&table, 9, headers, right);
  size_t i;
  json_t *w;
  json_array_foreach(workers, i, w) {
    if (!nodes_shown(w, all) || !workers_serves(w, queue))
      continue;
    char id[24], done[24], failed[24], leases[24], queues[256], state[64];
    const char *row[] = {nodes_int(w, "id", id, sizeof id),
                         nodes_str(w, "name"),
                         nodes_str(w, "node"),
                         workers_state(w, state, sizeof state),
                         workers_queues(w, queues, sizeof queues),
                         nodes_int(w, "completed", done, sizeof done),
                         nodes_int(w, "failed", failed, sizeof failed),
                         nodes_int(w, "leases", leases, sizeof leases),
                         nodes_str(w, "progress")};
    table_add(&table, row);
  }
  table_print(&table, stdout);
  table_free(&table);
}

/* Fetches a listing with `fetch` and prints it as a table or as JSON. */
static int nodes_listing(cli_args_t *args, muster_err_t (*fetch)(muster_client_t *, char **),
                         const char *key) {
  muster_client_t *client = NULL;
  int rc = cli_connect(args, &client);
  if (rc != CLI_OK)
    return rc;
  char *json = NULL;
  muster_err_t err = fetch(client, &json);
  json_t *root = err == MUSTER_OK ? json_loads(json, JSON_ALLOW_NUL, NULL) : NULL;
  json_t *list = json_object_get(root, key);
  if (err != MUSTER_OK) {
    rc = cli_error(client, err);
  } else if (cli_flag(args, "json")) {
    cli_print_pretty(json);
  } else if (!json_is_array(list)) {
    fprintf(stderr, "muster: protocol: the %s list could not be read\n", key);
    rc = CLI_FAIL;
  } else if (strcmp(key, "nodes") == 0) {
    nodes_print(list, cli_flag(args, "all"));
  } else {
    workers_print(list, cli_flag(args, "all"), cli_opt(args, "queue"));
  }
  json_decref(root);
  muster_free(json);
  muster_client_free(client);
  return rc;
}

int cmd_nodes(cli_args_t *args) {
  return nodes_listing(args, muster_node_list, "nodes");
}

int cmd_workers(cli_args_t *args) {
  return nodes_listing(args, muster_worker_list, "workers");
}

/* DATA as JSON text (the caller frees it): parsed with --json, else a JSON
 * string.  NULL after saying why DATA is refused. */
static char *update_data(const cli_args_t *args, const char *raw) {
  char why[CLI_JSON_WHY];
  int as_json = cli_flag(args, "json");
  json_t *value = as_json ? cli_json_parse(raw, strlen(raw), why, sizeof why) : json_string(raw);
  if (value == NULL && as_json)
    fprintf(stderr, "muster: invalid_argument: DATA: not valid JSON: %s\n", why);
  else if (value == NULL)
    fprintf(stderr, "muster: invalid_argument: DATA: not valid UTF-8 text\n");
  char *text = value ? jdump(value, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
  json_decref(value);
  return text;
}

int cmd_update(cli_args_t *args) {
  const char *queue = cli_opt(args, "queue");
  if (queue == NULL)
    return cli_usage_error(args->cmd, "'update' needs --queue Q");
  char *data = update_data(args, args->pos[0]);
  if (data == NULL)
    return CLI_FAIL;
  muster_client_t *client = NULL;
  int rc = cli_connect(args, &client);
  int64_t seq = 0;
  muster_err_t err = MUSTER_OK;
  if (rc == CLI_OK)
    err = muster_update_post(client, queue, data, cli_opt(args, "session"), &seq);
  if (rc == CLI_OK && err != MUSTER_OK)
    rc = cli_error(client, err);
  else if (rc == CLI_OK)
    printf("%lld\n", (long long)seq);
  free(data);
  muster_client_free(client);
  return rc;
}
