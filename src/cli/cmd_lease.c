/*
 * cmd_lease.c — `muster lease`, `complete`, `fail`, `extend`, `release` and
 * `flag`: the lease cycle one call at a time, for shell scripts.
 *
 * `lease` prints one JSON object per line so a script can read leases with
 * `while read`, and pass task and token back to the acknowledgement commands.
 */
#include "cli/cli.h"
#include "client/jdump.h"
#include "core/limits.h"
#include "core/names.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* The library's request timeout (muster_client_set_timeout's default), to
 * which a long-poll adds its wait. */
#define LEASE_REPLY_MS 60000L
/* Room for a queue name percent-encoded. */
#define LEASE_PATH_MAX 1024

/* The body of POST /v1/queues/Q/lease: {"max":N[,"worker":W][,"wait_ms":MS]}. */
static char *lease_body(int64_t max, int64_t worker, int64_t wait_ms) {
  json_t *obj = json_object();
  json_object_set_new(obj, "max", json_integer((json_int_t)max));
  if (worker > 0)
    json_object_set_new(obj, "worker", json_integer((json_int_t)worker));
  if (wait_ms > 0)
    json_object_set_new(obj, "wait_ms", json_integer((json_int_t)wait_ms));
  char *body = jdump(obj, JSON_COMPACT);
  json_decref(obj);
  return body;
}

/* Prints each lease of the head's reply as a single JSON line, as the head
 * wrote it (its keys in the head's order, "requires" included when the task
 * requires shared data: muster_lease_t has no place for it). */
static int lease_print_reply(const char *queue, const char *reply) {
  json_t *obj = json_loads(reply, JSON_ALLOW_NUL, NULL);
  json_t *leases = json_object_get(obj, "leases");
  if (!json_is_array(leases)) {
    json_decref(obj);
    fprintf(stderr,
            "muster: protocol_error: the reply to the lease of queue '%s' holds no "
            "\"leases\" list\n",
            queue);
    return CLI_FAIL;
  }
  size_t i;
  json_t *lease;
  json_array_foreach(leases, i, lease) {
    char *line = jdump(lease, JSON_COMPACT);
    if (line)
      puts(line);
    free(line);
  }
  json_decref(obj);
  return CLI_OK;
}

int cmd_lease(cli_args_t *args) {
  const char *queue = cli_opt(args, "queue");
  if (queue == NULL)
    return cli_usage_error(args->cmd, "'lease' needs --queue Q");
  int64_t max, wait_ms, worker;
  int rc = cli_opt_int_range(args, "max", 1, 1, TASK_MAX_BATCH, &max);
  if (rc == CLI_OK)
    rc = cli_opt_int(args, "wait-ms", 0, 0, &wait_ms);
  if (rc == CLI_OK)
    rc = cli_opt_int(args, "worker", 0, 1, &worker);
  char escaped[LEASE_PATH_MAX], path[LEASE_PATH_MAX + 32];
  if (rc == CLI_OK && cli_escape(queue, escaped, sizeof escaped) != 0)
    rc = cli_usage_error(args->cmd, "--queue: a queue name is at most %d bytes", NAME_MAX_LEN);
  muster_client_t *client = NULL;
  if (rc != CLI_OK || (rc = cli_connect(args, &client)) != CLI_OK)
    return rc;
  snprintf(path, sizeof path, "/v1/queues/%s/lease", escaped);
  char *body = lease_body(max, worker, wait_ms), *reply = NULL;
  muster_client_set_timeout(client, LEASE_REPLY_MS + (long)wait_ms);
  muster_err_t err = body ? muster_request(client, "POST", path, body, &reply) : MUSTER_NOMEM;
  rc = err == MUSTER_OK ? lease_print_reply(queue, reply) : cli_error(client, err);
  muster_free(reply);
  free(body);
  muster_client_free(client);
  return rc;
}

/* Reads TASK and TOKEN (the first two positional arguments) into *ack.  The
 * table asks for one argument only, so that `complete abc` says first that
 * 'abc' is no task id, and then that TOKEN is missing.  `complete 7 --token
 * 42` reads 42 as the head's bearer token (the client option), so a missing
 * TOKEN beside a --token says which token is which. */
static int ack_read(const cli_args_t *args, muster_ack_t *ack) {
  int64_t task, token;
  int rc = cli_parse_int(args->cmd, args->pos[0], "TASK", 1, &task);
  if (rc == CLI_OK && args->npos < 2)
    return cli_usage_error(args->cmd, "'%s' needs %s: TOKEN (the lease's token) is missing%s",
                           args->cmd->name, args->cmd->synopsis,
                           cli_opt(args, "token") ? " (--token is the head's bearer token, not "
                                                    "the lease's: give the lease's after TASK)"
                                                  : "");
  if (rc == CLI_OK)
    rc = cli_parse_int(args->cmd, args->pos[1], "TOKEN", 1, &token);
  if (rc == CLI_OK)
    muster_ack_init(ack, task, token);
  return rc;
}

typedef muster_err_t (*ack_call_fn)(muster_client_t *, const muster_ack_t *, size_t);

/* Connects and sends the one acknowledgement `ack` with `call`. */
static int ack_send(const cli_args_t *args, const muster_ack_t *ack, ack_call_fn call) {
  muster_client_t *client = NULL;
  int rc = cli_connect(args, &client);
  if (rc != CLI_OK)
    return rc;
  muster_err_t err = call(client, ack, 1);
  if (err != MUSTER_OK)
    rc = cli_error_of_one(client, err, "leases[0]");
  muster_client_free(client);
  return rc;
}

/* Sends the completion `ack` and, when the head answers it as a repeat (the
 * task was completed under this token before: a success that changes
 * nothing), says so on stderr, since the RESULT given now was not stored
 * unless it was the first one (docs/cli.md). */
static int complete_send(const cli_args_t *args, const muster_ack_t *ack) {
  muster_client_t *client = NULL;
  int rc = cli_connect(args, &client);
  if (rc != CLI_OK)
    return rc;
  int repeated = 0;
  muster_err_t err = muster_complete_repeats(client, ack, 1, &repeated);
  long long task = (long long)ack->task, token = (long long)ack->token;
  if (err != MUSTER_OK)
    rc = cli_error_of_one(client, err, "leases[0]");
  else if (repeated & MUSTER_ACK_RESULT_IGNORED)
    fprintf(stderr,
            "muster: task %lld was already completed under token %lld: its first result is kept,"
            " and this one, which differs, was not stored\n",
            task, token);
  else if (repeated & MUSTER_ACK_REPEATED)
    fprintf(stderr,
            "muster: task %lld was already completed under token %lld, with this same result;"
            " nothing changed\n",
            task, token);
  muster_client_free(client);
  return rc;
}

/* What `fail`, `release` and `flag` say of an ack the head answered as a
 * repeat: the state it was already in, and what stands (docs/cli.md). */
static const struct {
  const char *state, *outcome;
} end_repeat_texts[] = {
    [MUSTER_END_FAIL] = {"failed", ": the first fail stands (its error, and whether it was "
                                   "permanent), and this one changed nothing"},
    [MUSTER_END_RELEASE] = {"released", "; nothing changed"},
    [MUSTER_END_FLAG] = {"flagged", ": the first flag counts, with its reason, and this one "
                                    "changed nothing"},
};

/* Ends the lease `ack` names as `how` says and, when the head answers it as
 * a repeat (the same call under the same token ended that lease before: a
 * success that changes nothing), says so on stderr, since what this call
 * gave (an error, --permanent, a reason) was not applied. */
static int end_send(const cli_args_t *args, const muster_ack_t *ack, muster_end_t how) {
  muster_client_t *client = NULL;
  int rc = cli_connect(args, &client);
  if (rc != CLI_OK)
    return rc;
  size_t repeats = 0;
  muster_err_t err = muster_end_leases(client, how, ack, 1, &repeats);
  if (err != MUSTER_OK)
    rc = cli_error_of_one(client, err, "leases[0]");
  else if (repeats > 0)
    fprintf(stderr, "muster: task %lld was already %s under token %lld%s\n", (long long)ack->task,
            end_repeat_texts[how].state, (long long)ack->token, end_repeat_texts[how].outcome);
  muster_client_free(client);
  return rc;
}

int cmd_complete(cli_args_t *args) {
  muster_ack_t ack;
  int rc = ack_read(args, &ack);
  if (rc != CLI_OK)
    return rc;
  char *result = NULL;
  if (args->npos > 2) {
    const char *raw = args->pos[2];
    int as_json = cli_flag(args, "json");
    char why[CLI_JSON_WHY];
    json_t *value = as_json ? cli_json_parse(raw, strlen(raw), why, sizeof why) : json_string(raw);
    if (value == NULL && as_json) {
      fprintf(stderr, "muster: invalid_argument: RESULT: not valid JSON: %s\n", why);
      return CLI_FAIL;
    }
    if (value == NULL) {
      fprintf(stderr, "muster: invalid_argument: RESULT: not valid UTF-8 text\n");
      return CLI_FAIL;
    }
    result = jdump(value, JSON_COMPACT | JSON_ENCODE_ANY);
    json_decref(value);
  }
  ack.result = result;
  rc = complete_send(args, &ack);
  free(result);
  return rc;
}

int cmd_fail(cli_args_t *args) {
  muster_ack_t ack;
  int rc = ack_read(args, &ack);
  if (rc != CLI_OK)
    return rc;
  ack.error = cli_opt(args, "error");
  ack.permanent = cli_flag(args, "permanent");
  return end_send(args, &ack, MUSTER_END_FAIL);
}

int cmd_extend(cli_args_t *args) {
  muster_ack_t ack;
  int rc = ack_read(args, &ack);
  if (rc == CLI_OK)
    rc = cli_opt_int(args, "lease-ms", -1, 1, &ack.lease_ms);
  return rc == CLI_OK ? ack_send(args, &ack, muster_extend) : rc;
}

int cmd_release(cli_args_t *args) {
  muster_ack_t ack;
  int rc = ack_read(args, &ack);
  return rc == CLI_OK ? end_send(args, &ack, MUSTER_END_RELEASE) : rc;
}

int cmd_flag(cli_args_t *args) {
  muster_ack_t ack;
  int rc = ack_read(args, &ack);
  if (rc != CLI_OK)
    return rc;
  ack.error = cli_opt(args, "reason"); /* libmuster sends a flag's reason from `error` */
  return end_send(args, &ack, MUSTER_END_FLAG);
}
