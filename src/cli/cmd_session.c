/*
 * cmd_session.c — `muster session create|ls|show|put|seal|results|close`
 * (docs/pools.md, docs/api.md "Sessions").
 *
 * These expose a session step by step, for scripts and for looking into what
 * a pool is doing: create one, put inputs into it, read its results stream
 * from a cursor (printing the cursor to resume from on stderr), close it.
 * `muster map` does all of it in one command.
 *
 * `session results` is in cmd_session_results.c.
 */
#include "cli/cli.h"
#include "cli/table.h"
#include "client/jdump.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define SESSION_PUT_BATCH 1000

const cli_opt_t cmd_session_create_opts[] = {
    {"queue", "Q", "queue the session's tasks go to (required; must exist)"},
    {"init-data", "JSON", "init_data handed to the workers"},
    {"timeout-ms", "MS", "close the session when its client is silent this long (default 60000)"},
    {"no-cleanup", NULL, "keep the session until it is closed, however long the client is silent"},
    {"json", NULL, "print the session object instead of its id"},
    {NULL, NULL, NULL},
};

const cli_opt_t cmd_session_put_opts[] = {
    {"json", NULL, "parse each input line as JSON instead of sending it as a string"},
    {"requires", "[SCOPE/]NAME@N", CLI_REQUIRES_SESSION_HELP},
    {"seal", NULL,
     "seal the session once these tasks are put: it takes no more (an empty stdin only seals)"},
    {NULL, NULL, NULL},
};

const char cmd_session_put_details[] =
    "Each input line is one task's payload (a JSON string, or with --json the\n"
    "line's JSON value), at the session's next index.  Prints each task's index\n"
    "and id, separated by a tab.\n\n"
    "With --seal the session is sealed once every input is put (not when a batch\n"
    "failed): it takes no more tasks, and `muster session results ID --follow\n"
    "--until-sealed` ends once these have their results.  With --seal an empty\n"
    "stdin puts nothing and only seals, as `muster session seal ID` does.\n\n"
    "With --requires every task requires that level of shared data; NAME@N\n"
    "without SCOPE/ is a blob of this session (ID/NAME@N), as a Python Pool's\n"
    "requires=[(name, level)] is one of its session.  Without @N the head is\n"
    "asked for the newest level before anything is put.\n\n"
    "examples:\n"
    "  muster shared put s-5f2c9a1e7b3d4c60 table table.bin\n"
    "  seq 10 | muster session put s-5f2c9a1e7b3d4c60 --requires table@1\n"
    "  seq 10 | muster session put s-5f2c9a1e7b3d4c60 --requires models/weights@2\n"
    "  seq 10 | muster session put s-5f2c9a1e7b3d4c60 --seal\n";

const char cmd_session_seal_details[] =
    "Says that no more tasks will be put into the session: a later put is refused\n"
    "(invalid_state), and a reader of its results knows when it has them all:\n"
    "`muster session results ID --follow --until-sealed` ends once the session is\n"
    "sealed and every task has its result.  Sealing is durable and cannot be\n"
    "undone; sealing a sealed session again is no error.  `muster session put ID\n"
    "--seal` seals after its tasks.\n\n"
    "examples:\n"
    "  seq 10 | muster session put s-5f2c9a1e7b3d4c60\n"
    "  seq 11 20 | muster session put s-5f2c9a1e7b3d4c60\n"
    "  muster session seal s-5f2c9a1e7b3d4c60\n";

int cli_session_error(const muster_client_t *client, muster_err_t err) {
  int rc = cli_error(client, err);
  if (err == MUSTER_SESSION_NOT_FOUND)
    fprintf(stderr, "muster: see `muster session ls` for the open sessions\n");
  return rc;
}

/* ---- create, show, close -------------------------------------------------------- */

static int session_create(cli_args_t *args, muster_client_t *client) {
  muster_session_opts_t opts;
  muster_session_opts_init(&opts);
  opts.queue = cli_opt(args, "queue");
  opts.init_data = cli_opt(args, "init-data");
  if (cli_flag(args, "no-cleanup"))
    opts.cleanup_on_exit = 0;
  int rc = cli_opt_int(args, "timeout-ms", -1, 1, &opts.timeout_ms);
  if (rc != CLI_OK)
    return rc;
  char *id = NULL, *json = NULL;
  muster_err_t err = muster_session_create(client, &opts, &id, &json);
  if (err != MUSTER_OK)
    return cli_error(client, err);
  if (cli_flag(args, "json"))
    cli_print_pretty(json);
  else
    printf("%s\n", id);
  muster_free(id);
  muster_free(json);
  return CLI_OK;
}

int cmd_session_create(cli_args_t *args) {
  if (cli_opt(args, "queue") == NULL)
    return cli_usage_error(args->cmd, "'session create' needs --queue Q");
  return cli_with_client(args, session_create);
}

static int session_show(cli_args_t *args, muster_client_t *client) {
  char *json = NULL;
  muster_err_t err = muster_session_get(client, args->pos[0], &json);
  if (err != MUSTER_OK)
    return cli_session_error(client, err);
  cli_print_pretty(json);
  muster_free(json);
  return CLI_OK;
}

int cmd_session_show(cli_args_t *args) {
  return cli_with_client(args, session_show);
}

static int session_close(cli_args_t *args, muster_client_t *client) {
  int64_t cancelled = 0;
  muster_err_t err = muster_session_close(client, args->pos[0], &cancelled);
  if (err != MUSTER_OK)
    return cli_session_error(client, err);
  printf("closed session %s; %lld unfinished tasks cancelled\n", args->pos[0],
         (long long)cancelled);
  return CLI_OK;
}

int cmd_session_close(cli_args_t *args) {
  return cli_with_client(args, session_close);
}

/* Seals session `id` and says so on `out`; returns CLI_OK or the error's
 * status. */
static int session_seal_id(muster_client_t *client, const char *id, FILE *out) {
  int already = 0;
  muster_err_t err = muster_session_seal(client, id, &already);
  if (err != MUSTER_OK)
    return cli_session_error(client, err);
  fprintf(out, "%ssession %s %s; it takes no more tasks\n", out == stderr ? "muster: " : "", id,
          already ? "was sealed already" : "sealed");
  return CLI_OK;
}

static int session_seal(cli_args_t *args, muster_client_t *client) {
  return session_seal_id(client, args->pos[0], stdout);
}

int cmd_session_seal(cli_args_t *args) {
  return cli_with_client(args, session_seal);
}

/* ---- ls ------------------------------------------------------------------------------ */

/* counts.`key` of a session as text. */
static const char *session_count(json_t *s, const char *key, char *buf, size_t size) {
  json_t *v = json_object_get(json_object_get(s, "counts"), key);
  snprintf(buf, size, "%lld", (long long)json_integer_value(v));
  return buf;
}

static void session_print_table(json_t *sessions) {
  static const char *const headers[] = {"ID",      "QUEUE",   "TOTAL",   "DONE",  "FAILED",
                                        "PENDING", "UPDATES", "CLEANUP", "SEALED"};
  static const int right[] = {0, 0, 1, 1, 1, 1, 1, 0, 0};
  cli_table_t table;
  table_init(&table, 9, headers, right);
  size_t i;
  json_t *s;
  json_array_foreach(sessions, i, s) {
    char total[24], done[24], failed[24], pending[24], updates[24];
    snprintf(updates, sizeof updates, "%lld",
             (long long)json_integer_value(json_object_get(s, "updates")));
    const char *row[] = {json_string_value(json_object_get(s, "id")),
                         json_string_value(json_object_get(s, "queue")),
                         session_count(s, "total", total, sizeof total),
                         session_count(s, "done", done, sizeof done),
                         session_count(s, "failed", failed, sizeof failed),
                         session_count(s, "pending", pending, sizeof pending),
                         updates,
                         json_is_false(json_object_get(s, "cleanup_on_exit")) ? "no" : "yes",
                         json_is_true(json_object_get(s, "sealed")) ? "yes" : "no"};
    table_add(&table, row);
  }
  table_print(&table, stdout);
  table_free(&table);
}

static int session_ls(cli_args_t *args, muster_client_t *client) {
  char *json = NULL;
  muster_err_t err = muster_session_list(client, &json);
  if (err != MUSTER_OK)
    return cli_error(client, err);
  json_t *root = json_loads(json, JSON_ALLOW_NUL, NULL);
  json_t *list = json_object_get(root, "sessions");
  int rc = CLI_OK;
  if (cli_flag(args, "json")) {
    cli_print_pretty(json);
  } else if (json_is_array(list)) {
    session_print_table(list);
  } else {
    fprintf(stderr, "muster: protocol: the session list could not be read\n");
    rc = CLI_FAIL;
  }
  json_decref(root);
  muster_free(json);
  return rc;
}

int cmd_session_ls(cli_args_t *args) {
  return cli_with_client(args, session_ls);
}

/* ---- put -------------------------------------------------------------------------------- */

/* After a network error on the batch of inputs [at, at + n) of `total` of
 * session `id`: says what became of it and where to resume (cmd_task.c's
 * put says the same for a queue). */
static void session_say_lost_batch(const muster_client_t *client, const char *id, size_t at,
                                   size_t n, size_t total) {
  if (cli_request_unsent(client)) {
    cli_say_batch_unsent("input", "indexes", at, n, total);
    return;
  }
  char check[600];
  snprintf(check, sizeof check, "counted in the session's total ('muster session show %.256s')",
           id);
  cli_say_batch_unanswered("input", "indexes", check, at, n, total);
}

/* Sends the inputs in batches at the session's next indexes, each task
 * requiring `req`; prints "INDEX\tTASK". */
static int session_put_all(const cli_args_t *args, muster_client_t *client, const cli_inputs_t *in,
                           const cli_requires_t *req) {
  muster_task_spec_t *specs = calloc(SESSION_PUT_BATCH, sizeof *specs);
  int64_t *ids = calloc(SESSION_PUT_BATCH, sizeof *ids);
  int64_t *indexes = calloc(SESSION_PUT_BATCH, sizeof *indexes);
  int rc = specs && ids && indexes ? CLI_OK : CLI_FAIL;
  for (size_t at = 0; rc == CLI_OK && at < in->count; at += SESSION_PUT_BATCH) {
    size_t n = in->count - at < SESSION_PUT_BATCH ? in->count - at : SESSION_PUT_BATCH;
    for (size_t i = 0; i < n; i++) {
      muster_task_spec_init(&specs[i]);
      specs[i].payload = in->texts[at + i];
    }
    muster_err_t err = muster_session_put_requiring(client, args->pos[0], specs, n, req->levels,
                                                    req->count, ids, indexes);
    if (err != MUSTER_OK) {
      rc = cli_session_error(client, err);
      if (err == MUSTER_NETWORK)
        session_say_lost_batch(client, args->pos[0], at, n, in->count);
      break;
    }
    for (size_t i = 0; i < n; i++)
      printf("%lld\t%lld\n", (long long)indexes[i], (long long)ids[i]);
    fflush(stdout);
  }
  free(specs);
  free(ids);
  free(indexes);
  return rc;
}

/* No input was read: says so and fails, since exiting 0 with nothing said
 * would read as work submitted (`muster put` says the same), and says too
 * when the session is unknown or closed, as a put of inputs would have.
 * Returns CLI_FAIL. */
static int session_put_none(const cli_args_t *args, muster_client_t *client) {
  char *json = NULL;
  muster_err_t err = muster_session_get(client, args->pos[0], &json);
  muster_free(json);
  if (err != MUSTER_OK) {
    cli_session_error(client, err);
    fprintf(stderr, "muster: no inputs were read from standard input either; nothing was put\n");
    return CLI_FAIL;
  }
  fprintf(stderr,
          "muster: invalid_argument: no inputs were read from standard input; nothing was put "
          "into session %s\n",
          args->pos[0]);
  return CLI_FAIL;
}

/* With --seal: CLI_OK when the head can seal session `id`, which its
 * session object says by having "sealed" at all.  A head older than sealing
 * would take every input and then refuse the seal, and the user, told that
 * the command failed, would put them all again; so it is asked first, and
 * nothing is put. */
static int session_check_sealable(muster_client_t *client, const char *id) {
  char *json = NULL;
  muster_err_t err = muster_session_get(client, id, &json);
  if (err != MUSTER_OK)
    return cli_session_error(client, err);
  json_t *root = json_loads(json, JSON_ALLOW_NUL, NULL);
  bool sealable = json_object_get(root, "sealed") != NULL;
  json_decref(root);
  muster_free(json);
  if (sealable)
    return CLI_OK;
  fprintf(stderr,
          "muster: the head cannot seal sessions (session %s has no \"sealed\": the head is "
          "older than this muster): nothing was put. Upgrade the head, or put without --seal "
          "(docs/operations.md, \"Versions side by side\")\n",
          id);
  return CLI_FAIL;
}

/* With --seal the session is sealed once every input is in (an empty
 * stdin only seals), and not after a failed batch: the inputs after it
 * are still to be put. */
static int session_put(cli_args_t *args, muster_client_t *client, cli_requires_t *req) {
  cli_inputs_t in;
  int seal = cli_flag(args, "seal");
  int rc = cli_read_inputs(stdin, cli_flag(args, "json"), &in);
  if (rc == CLI_OK && seal && in.count > 0)
    rc = session_check_sealable(client, args->pos[0]);
  if (rc == CLI_OK && in.count == 0 && !seal)
    rc = session_put_none(args, client);
  else if (rc == CLI_OK && in.count > 0 && (rc = cli_requires_resolve(client, req)) == CLI_OK)
    rc = session_put_all(args, client, &in, req);
  if (rc == CLI_OK && seal)
    rc = session_seal_id(client, args->pos[0], stderr);
  cli_inputs_free(&in);
  return rc;
}

/* --requires is checked before anything is read or sent. */
int cmd_session_put(cli_args_t *args) {
  cli_requires_t req;
  muster_client_t *client = NULL;
  int rc = cli_requires_parse(args, args->pos[0], &req);
  if (rc == CLI_OK && (rc = cli_connect(args, &client)) == CLI_OK)
    rc = session_put(args, client, &req);
  muster_client_free(client);
  return rc;
}
