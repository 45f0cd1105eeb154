/*
 * cmd_backup.c — `muster backup`: asks the head for an online backup
 * (POST /v1/backup, docs/operations.md) and prints where it is.
 *
 * The head writes the backup on its own machine, under its data dir; the
 * command only starts it and waits for the answer, however long the copy
 * takes (a store of millions of tasks takes seconds, a much bigger one
 * minutes), so the client's request timeout is lifted.  No libmuster call
 * of its own: an admin's command, as `queue requeue` is.
 */
#include "cli/cli.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

const cli_opt_t cmd_backup_opts[] = {
    {"name", "NAME",
     "the backup's directory name under DATA_DIR/backups (default: the UTC time, "
     "20250131T235959Z)"},
    {"json", NULL, "print the head's whole answer (JSON) instead of the path"},
    {NULL, NULL, NULL},
};

const char cmd_backup_details[] =
    "The head copies its state, while it serves, into a new directory\n"
    "DATA_DIR/backups/NAME on its own machine: the store (a consistent copy\n"
    "taken on its connection), the blob files of shared data (hard links, or\n"
    "copies when DATA_DIR/backups is another file system) and the token, all\n"
    "synced to disk before the answer.  Prints the backup's path.  One backup\n"
    "runs at a time; a name that exists is refused.\n\n"
    "Restore: stop the head, move the backup into its data dir's place (mv,\n"
    "or cp -a to keep the backup as it was) and start the head on it\n"
    "(docs/operations.md, \"Restoring\"); a head started on the backup's\n"
    "directory in place writes to it.\n\n"
    "examples:\n"
    "  muster backup\n"
    "  muster backup --name before-upgrade\n";

/* The body of the request: {"name": NAME} or {}; NULL when out of memory. */
static char *backup_body(const char *name) {
  json_t *body = name ? json_pack("{s:s}", "name", name) : json_object();
  char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
  json_decref(body);
  return text;
}

/* Prints the path of the backup `reply` describes (or, `as_json`, all of it,
 * indented as every other command's --json: the reply's own line end is not
 * doubled into a blank line). */
static int backup_print(const char *reply, int as_json) {
  if (as_json) {
    cli_print_pretty(reply);
    return CLI_OK;
  }
  json_t *root = json_loads(reply, 0, NULL);
  const char *path = json_string_value(json_object_get(root, "path"));
  if (path)
    printf("%s\n", path);
  else
    fprintf(stderr, "muster: the head's answer names no path: %s\n", reply);
  json_decref(root);
  return path ? CLI_OK : CLI_FAIL;
}

int cmd_backup(cli_args_t *args) {
  char *body = backup_body(cli_opt(args, "name"));
  if (body == NULL) {
    fprintf(stderr, "muster: out of memory\n");
    return CLI_FAIL;
  }
  muster_client_t *client = NULL;
  int rc = cli_connect(args, &client);
  if (rc == CLI_OK) {
    muster_client_set_timeout(client, 0); /* the copy takes what it takes */
    char *reply = NULL;
    muster_err_t err = muster_request(client, "POST", "/v1/backup", body, &reply);
    rc = err == MUSTER_OK ? backup_print(reply, cli_flag(args, "json")) : cli_error(client, err);
    muster_free(reply);
  }
  muster_client_free(client);
  free(body);
  return rc;
}
