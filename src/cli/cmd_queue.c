/*
 * cmd_queue.c — `muster queue create|ls|show|purge|rm|requeue` and
 * `muster status`.
 *
 * Listings print tables for people and JSON (--json) for scripts; the JSON is
 * the server's objects unchanged.
 */
#include "cli/cli.h"
#include "cli/table.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* The longest --keep-done-ms the head takes: ten years (its
 * QUEUE_MAX_KEEP_DONE_MS), checked here too so that a typo exits 2 at once. */
#define QUEUE_MAX_KEEP_DONE_MS (3650LL * 24 * 3600 * 1000)

/* --keep-done-ms MS into *out; '' keeps done tasks for ever again, as
 * --next '' removes the next stage. */
static int queue_read_keep(const cli_args_t *args, int64_t *out) {
  const char *text = cli_opt(args, "keep-done-ms");
  if (text != NULL && text[0] == '\0') {
    *out = MUSTER_KEEP_DONE_FOREVER;
    return CLI_OK;
  }
  return cli_opt_int_range(args, "keep-done-ms", -1, 0, QUEUE_MAX_KEEP_DONE_MS, out);
}

/* Reads the queue options of `queue create` into *opts. */
static int queue_read_opts(const cli_args_t *args, muster_queue_opts_t *opts) {
  muster_queue_opts_init(opts);
  int rc = cli_opt_int(args, "lease-ms", -1, 1, &opts->lease_ms);
  if (rc == CLI_OK)
    rc = cli_opt_int(args, "max-attempts", -1, 1, &opts->max_attempts);
  if (rc == CLI_OK)
    rc = cli_opt_int(args, "backoff-ms", -1, 0, &opts->backoff_ms);
  if (rc == CLI_OK)
    rc = cli_opt_int(args, "backoff-max-ms", -1, 0, &opts->backoff_max_ms);
  if (rc == CLI_OK)
    rc = cli_opt_int(args, "max-flags", -1, 1, &opts->max_flags);
  if (rc == CLI_OK)
    rc = queue_read_keep(args, &opts->keep_done_ms);
  opts->next = cli_opt(args, "next");
  return rc;
}

int cmd_queue_create(cli_args_t *args) {
  muster_queue_opts_t opts;
  int rc = queue_read_opts(args, &opts);
  muster_client_t *client = NULL;
  if (rc != CLI_OK || (rc = cli_connect(args, &client)) != CLI_OK)
    return rc;
  char *json = NULL;
  muster_err_t err = muster_queue_put(client, args->pos[0], &opts, &json);
  if (err == MUSTER_OK)
    cli_print_pretty(json);
  else
    rc = cli_error(client, err);
  muster_free(json);
  muster_client_free(client);
  return rc;
}

/* The count of `state` in a queue object, as text in `buf`. */
static const char *queue_count(json_t *queue, const char *state, char *buf, size_t size) {
  json_t *n = json_object_get(json_object_get(queue, "counts"), state);
  snprintf(buf, size, "%lld", (long long)json_integer_value(n));
  return buf;
}

const char *const cli_task_states[CLI_TASK_STATES] = {"queued", "leased", "done",
                                                      "failed", "dead",   "cancelled"};

/* Prints {"queues": [...]} as a table. */
static void queue_print_table(json_t *queues) {
  static const char *const headers[] = {"NAME",   "QUEUED", "LEASED",    "DONE",
                                        "FAILED", "DEAD",   "CANCELLED", "NEXT"};
  static const int right[] = {0, 1, 1, 1, 1, 1, 1, 0};
  cli_table_t table;
  table_init(&table, 8, headers, right);
  size_t i;
  json_t *queue;
  json_array_foreach(queues, i, queue) {
    char counts[CLI_TASK_STATES][24];
    const char *row[8];
    row[0] = json_string_value(json_object_get(queue, "name"));
    for (int s = 0; s < CLI_TASK_STATES; s++)
      row[1 + s] = queue_count(queue, cli_task_states[s], counts[s], sizeof counts[s]);
    row[7] = json_string_value(json_object_get(queue, "next"));
    if (row[7] == NULL)
      row[7] = "-";
    table_add(&table, row);
  }
  table_print(&table, stdout);
  table_free(&table);
}

/* The array "queues" of queue list `json` (GET /v1/queues), parsed into
 * *root (the caller's reference); NULL after saying it could not be read. */
static json_t *queue_list_parse(const char *json, json_t **root) {
  *root = json_loads(json, JSON_ALLOW_NUL, NULL);
  json_t *queues = json_object_get(*root, "queues");
  if (json_is_array(queues))
    return queues;
  fprintf(stderr, "muster: protocol: the queue list could not be read\n");
  return NULL;
}

/* Fetches the queue list and prints it as a table or, with `as_json`, as JSON. */
static int queue_list(muster_client_t *client, int as_json) {
  char *json = NULL;
  muster_err_t err = muster_queue_list(client, &json);
  if (err != MUSTER_OK)
    return cli_error(client, err);
  json_t *root = NULL;
  json_t *queues = as_json ? NULL : queue_list_parse(json, &root);
  if (as_json)
    cli_print_pretty(json);
  else if (queues)
    queue_print_table(queues);
  int rc = as_json || queues ? CLI_OK : CLI_FAIL;
  json_decref(root);
  muster_free(json);
  return rc;
}

int cmd_queue_ls(cli_args_t *args) {
  muster_client_t *client = NULL;
  int rc = cli_connect(args, &client);
  if (rc == CLI_OK)
    rc = queue_list(client, cli_flag(args, "json"));
  muster_client_free(client);
  return rc;
}

int cmd_queue_show(cli_args_t *args) {
  muster_client_t *client = NULL;
  int rc = cli_connect(args, &client);
  if (rc != CLI_OK)
    return rc;
  char *json = NULL;
  muster_err_t err = muster_queue_get(client, args->pos[0], &json);
  if (err == MUSTER_OK)
    cli_print_pretty(json);
  else
    rc = cli_error(client, err);
  muster_free(json);
  muster_client_free(client);
  return rc;
}

int cmd_queue_purge(cli_args_t *args) {
  muster_client_t *client = NULL;
  int rc = cli_connect(args, &client);
  if (rc != CLI_OK)
    return rc;
  int64_t purged = 0;
  muster_err_t err = muster_queue_purge(client, args->pos[0], &purged);
  if (err == MUSTER_OK)
    printf("purged %lld queued task%s from %s\n", (long long)purged, purged == 1 ? "" : "s",
           args->pos[0]);
  else
    rc = cli_error(client, err);
  muster_client_free(client);
  return rc;
}

int cmd_queue_rm(cli_args_t *args) {
  muster_client_t *client = NULL;
  int rc = cli_connect(args, &client);
  if (rc != CLI_OK)
    return rc;
  muster_err_t err = muster_queue_delete(client, args->pos[0]);
  if (err == MUSTER_OK) {
    printf("deleted queue %s\n", args->pos[0]);
  } else if (err == MUSTER_QUEUE_NOT_FOUND) {
    /* Not the advice to create it (cli_error's), only where the queues are
     * listed, as `queue show` and `queue purge` say beside it: a mistyped
     * name is the likely cause. */
    fprintf(stderr, "muster: %s: %s\n", muster_err_name(err), muster_client_message(client));
    fprintf(stderr, "muster: see `muster queue ls` for the queues there are\n");
    rc = CLI_FAIL;
  } else {
    rc = cli_error(client, err);
  }
  muster_client_free(client);
  return rc;
}

/* POST /v1/queues/NAME/requeue (no libmuster call of its own) and returns
 * the count through *count. */
static muster_err_t queue_requeue_all(muster_client_t *client, const char *name, int64_t *count) {
  char escaped[512], path[600];
  if (cli_escape(name, escaped, sizeof escaped) != 0)
    return muster_queue_get(client, name, NULL); /* let the library report the bad name */
  snprintf(path, sizeof path, "/v1/queues/%s/requeue", escaped);
  char *reply = NULL;
  muster_err_t err = muster_request(client, "POST", path, NULL, &reply);
  json_t *root = reply ? json_loads(reply, JSON_ALLOW_NUL, NULL) : NULL;
  *count = (int64_t)json_integer_value(json_object_get(root, "requeued"));
  json_decref(root);
  muster_free(reply);
  return err;
}

int cli_requeue_queue(muster_client_t *client, const char *name) {
  int64_t count = 0;
  muster_err_t err = queue_requeue_all(client, name, &count);
  if (err != MUSTER_OK)
    return cli_error(client, err);
  printf("requeued %lld task%s of %s\n", (long long)count, count == 1 ? "" : "s", name);
  return CLI_OK;
}

int cmd_queue_requeue(cli_args_t *args) {
  muster_client_t *client = NULL;
  int rc = cli_connect(args, &client);
  if (rc == CLI_OK)
    rc = cli_requeue_queue(client, args->pos[0]);
  muster_client_free(client);
  return rc;
}

/* Counts the active workers of GET /v1/workers into *active. */
static muster_err_t status_active_workers(muster_client_t *client, long *active) {
  char *reply = NULL;
  muster_err_t err = muster_request(client, "GET", "/v1/workers", NULL, &reply);
  if (err != MUSTER_OK)
    return err;
  json_t *root = json_loads(reply, JSON_ALLOW_NUL, NULL);
  json_t *worker;
  size_t i;
  *active = 0;
  json_array_foreach(json_object_get(root, "workers"), i, worker) {
    const char *state = json_string_value(json_object_get(worker, "state"));
    *active += state && strcmp(state, "active") == 0;
  }
  json_decref(root);
  muster_free(reply);
  return MUSTER_OK;
}

/* Prints the health line of `muster status` from GET /v1/health's `reply`. */
static void status_print_health(const cli_args_t *args, const char *reply) {
  json_t *health = json_loads(reply, JSON_ALLOW_NUL, NULL);
  const char *state = json_string_value(json_object_get(health, "status"));
  const char *version = json_string_value(json_object_get(health, "version"));
  long long uptime_ms = (long long)json_integer_value(json_object_get(health, "uptime_ms"));
  json_t *schema = json_object_get(health, "schema"); /* an older head says none */
  char schema_text[32] = "";
  if (json_is_integer(schema))
    snprintf(schema_text, sizeof schema_text, " (schema %lld)",
             (long long)json_integer_value(schema));
  printf("head:    %s  %s  version %s%s  up %llds\n", cli_url(args), state ? state : "?",
         version ? version : "?", schema_text, uptime_ms / 1000);
  json_decref(health);
}

/*
 * Everything `muster status` prints is fetched before any of it is printed:
 * GET /v1/health needs no token and the other two do, so a wrong token
 * printed a health line that reads as success before failing.  Now a failure
 * prints its error alone.
 */
int cmd_status(cli_args_t *args) {
  muster_client_t *client = NULL;
  int rc = cli_connect(args, &client);
  if (rc != CLI_OK)
    return rc;
  char *health = NULL, *list = NULL;
  long active = 0;
  muster_err_t err = muster_request(client, "GET", "/v1/health", NULL, &health);
  if (err == MUSTER_OK)
    err = status_active_workers(client, &active);
  if (err == MUSTER_OK)
    err = muster_queue_list(client, &list);
  json_t *root = NULL;
  json_t *queues = err == MUSTER_OK ? queue_list_parse(list, &root) : NULL;
  if (err != MUSTER_OK) {
    rc = cli_error(client, err);
  } else if (queues == NULL) {
    rc = CLI_FAIL;
  } else {
    status_print_health(args, health);
    printf("workers: %ld active\n\n", active);
    queue_print_table(queues);
  }
  json_decref(root);
  muster_free(health);
  muster_free(list);
  muster_client_free(client);
  return rc;
}
