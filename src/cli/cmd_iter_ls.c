/*
 * cmd_iter_ls.c — `muster iter ls`: the iterations there are, one line each.
 *
 * GET /v1/iterations lists the head's iterations; asked through a node agent
 * (--url of its port) the list has that agent's node-local ones merged in,
 * so the WHERE column says which is which.  --json prints the reply as it is.
 */
#include "cli/cli.h"
#include "cli/table.h"

#include <jansson.h>
#include <stdio.h>

/* "1/3" for epoch 1 of a bounded iteration, "1" of an unbounded one (epochs 0). */
static const char *iter_ls_epoch(const json_t *it, char *buf, size_t size) {
  json_int_t epoch = json_integer_value(json_object_get(it, "epoch"));
  json_int_t epochs = json_integer_value(json_object_get(json_object_get(it, "config"), "epochs"));
  if (epochs > 0)
    snprintf(buf, size, "%lld/%lld", (long long)epoch, (long long)epochs);
  else
    snprintf(buf, size, "%lld", (long long)epoch);
  return buf;
}

/* Adds iteration `it`'s row to `table`. */
static void iter_ls_row(cli_table_t *table, const json_t *it) {
  const json_t *config = json_object_get(it, "config"), *blocks = json_object_get(it, "blocks");
  const char *node = json_string_value(json_object_get(it, "node"));
  char where[160] = "head", world[24], epoch[48], done[48], leased[24];
  if (node != NULL)
    snprintf(where, sizeof where, "node %s", node);
  snprintf(world, sizeof world, "%lld",
           (long long)json_integer_value(json_object_get(config, "world_size")));
  snprintf(done, sizeof done, "%lld/%lld",
           (long long)json_integer_value(json_object_get(blocks, "done")),
           (long long)json_integer_value(json_object_get(blocks, "total")));
  snprintf(leased, sizeof leased, "%lld",
           (long long)json_integer_value(json_object_get(blocks, "leased")));
  const char *row[] = {json_string_value(json_object_get(it, "name")),
                       where,
                       json_string_value(json_object_get(config, "strategy")),
                       world,
                       iter_ls_epoch(it, epoch, sizeof epoch),
                       done,
                       leased,
                       json_is_true(json_object_get(it, "finished")) ? "finished" : "running"};
  table_add(table, row);
}

/* Prints the table of the list `json` (GET /v1/iterations); CLI_FAIL after
 * saying the reply could not be read. */
static int iter_ls_print(const char *json) {
  static const char *const headers[] = {"NAME",  "WHERE", "STRATEGY", "WORLD",
                                        "EPOCH", "DONE",  "LEASED",   "STATE"};
  static const int right[] = {0, 0, 0, 1, 1, 1, 1, 0};
  json_t *root = json_loads(json, JSON_ALLOW_NUL, NULL);
  json_t *list = json_object_get(root, "iterations");
  if (!json_is_array(list)) {
    fprintf(stderr, "muster: protocol: the iteration list could not be read\n");
    json_decref(root);
    return CLI_FAIL;
  }
  cli_table_t table;
  table_init(&table, 8, headers, right);
  size_t i;
  json_t *it;
  json_array_foreach(list, i, it) iter_ls_row(&table, it);
  table_print(&table, stdout);
  table_free(&table);
  json_decref(root);
  return CLI_OK;
}

int cmd_iter_ls(cli_args_t *args) {
  muster_client_t *client = NULL;
  int rc = cli_connect(args, &client);
  if (rc != CLI_OK)
    return rc;
  char *json = NULL;
  muster_err_t err = muster_request(client, "GET", "/v1/iterations", NULL, &json);
  if (err != MUSTER_OK)
    rc = cli_error(client, err);
  else if (cli_flag(args, "json"))
    cli_print_pretty(json);
  else
    rc = iter_ls_print(json);
  muster_free(json);
  muster_client_free(client);
  return rc;
}
