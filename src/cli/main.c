/*
 * main.c — the `muster` binary: one table of commands, dispatched centrally.
 *
 * Every command and subcommand is a row below (name, synopsis, options,
 * positional counts, run function).  main() finds the row, parses the options
 * against it (args.c) and only then calls the command, so `--help`, unknown
 * options and missing arguments are handled the same way everywhere.  `muster
 * head` is the exception: the head daemon parses its own options (head.c).
 */
#include "cli/cli.h"
#include "core/suggest.h"
#include "server/head.h"
#include "server/store_schema.h"

#include <stdlib.h>
#include <string.h>

/* ---- option tables ---------------------------------------------------------- */

static const cli_opt_t queue_create_opts[] = {
    {"lease-ms", "MS", "how long a lease lasts unless extended (default 60000)"},
    {"max-attempts", "N", "leases a task may get before it goes dead (default 5)"},
    {"backoff-ms", "MS", "delay before the first retry, doubled per attempt (default 1000)"},
    {"backoff-max-ms", "MS", "cap on the retry delay (default 60000)"},
    {"next", "Q", "next pipeline stage: each result becomes a task of Q ('' removes it)"},
    {"max-flags", "N", "invalid-data flags before the task rolls back a stage (default 5)"},
    {"keep-done-ms", "MS",
     "remove each done task MS after its completion ('': keep them for ever, the default)"},
    {NULL, NULL, NULL},
};

static const cli_opt_t json_opts[] = {
    {"json", NULL, "print JSON instead of a table"},
    {NULL, NULL, NULL},
};

static const cli_opt_t put_opts[] = {
    {"queue", "Q", "queue to put the tasks into (required)"},
    {"priority", "P", "integer priority; higher is leased first (default 0)"},
    {"delay-ms", "MS", "do not lease before now + MS (default 0)"},
    {"key", "K", "idempotency key (one payload only): a repeated key stores nothing"},
    {"key-prefix", "P",
     "key payload N (the Nth given) as P followed by N, so that the same command run "
     "again stores none of them twice"},
    {"json", NULL, "parse each payload as JSON instead of sending it as a string"},
    {"file", "FILE", "read the payloads from FILE ('-': stdin) instead of arguments"},
    {"requires", "SCOPE/NAME@N", CLI_REQUIRES_HELP},
    {NULL, NULL, NULL},
};

static const cli_opt_t lease_opts[] = {
    {"queue", "Q", "queue to lease from (required)"},
    {"max", "N", "lease up to N tasks (default 1, at most 1000)"},
    {"wait-ms", "MS", "wait up to MS for a task to arrive (default 0)"},
    {"worker", "ID", "registered worker id to lease for"},
    {NULL, NULL, NULL},
};

static const cli_opt_t complete_opts[] = {
    {"json", NULL, "parse RESULT as JSON instead of storing it as a string"},
    {NULL, NULL, NULL},
};

static const cli_opt_t fail_opts[] = {
    {"error", "MSG", "the error text stored with the task"},
    {"permanent", NULL, "fail the task for good: no retry"},
    {NULL, NULL, NULL},
};

static const cli_opt_t extend_opts[] = {
    {"lease-ms", "MS", "new lease length from now (default: the queue's)"},
    {NULL, NULL, NULL},
};

static const cli_opt_t flag_opts[] = {
    {"reason", "TEXT", "why the input is invalid"},
    {NULL, NULL, NULL},
};

static const cli_opt_t tasks_ls_opts[] = {
    {"queue", "Q", "queue to list (required)"},
    {"state", "S", "only tasks in state S: queued, leased, done, failed, dead, cancelled"},
    {"limit", "N",
     "list at most N tasks (default 100; 0: all of them; any N is fetched in pages of 1000)"},
    {"after", "ID", "only tasks with an id above ID (default 0)"},
    {"json", NULL, "print one task object per line instead of a table"},
    {NULL, NULL, NULL},
};

static const cli_opt_t tasks_dead_opts[] = {
    {"queue", "Q", "queue to list (required)"},
    {"json", NULL, "print one task object per line instead of a table"},
    {NULL, NULL, NULL},
};

static const cli_opt_t tasks_requeue_opts[] = {
    {"queue", "Q", "requeue every dead and failed task of queue Q"},
    {NULL, NULL, NULL},
};

static const cli_opt_t worker_opts[] = {
    {"queue", "Q", "queue to work on (required)"},
    {"concurrency", "N", "run up to N tasks at once (default 1)"},
    {"nickname", "NAME", "name on the leaderboard"},
    {"max-tasks", "N", "exit after N tasks (default 0: run until SIGINT/SIGTERM)"},
    {"json-result", NULL, "parse the command's stdout as JSON instead of storing a string"},
    {"timeout-ms", "MS", "heartbeat timeout of the worker (default: the head's)"},
    {"node", "ID", "node this worker runs on"},
    {"plugin", "PATH", "load a worker plugin (.so, docs/node.md) instead of running a command"},
    {"init-data", "JSON", "data for the plugin's init, as JSON text (default null)"},
    {"cache-url", "URL",
     "read shared data tasks require from this node cache (default: MUSTER_CACHE_URL, "
     "set by the node agent; else --url)"},
    {"permanent-exit", "N",
     "CMD exiting N (1 to 125) fails its task for good, not retried; CMD sees "
     "MUSTER_PERMANENT_EXIT=N (default: none, every failure is retried)"},
    {NULL, NULL, NULL},
};

/* ---- help texts --------------------------------------------------------------- */

static const char put_details[] =
    "Each PAYLOAD is stored as a JSON string unless --json is given.  Without\n"
    "PAYLOAD arguments, one payload is read per stdin line (empty lines are\n"
    "skipped) and sent in batches of up to 1000.  With --json every payload is\n"
    "checked before anything is sent.  Prints the task ids, one per line.\n\n"
    "With --file FILE, payloads come from FILE: one per non-empty line, or with\n"
    "--json a JSON array (one task per element) or JSON lines.  `--json FILE`,\n"
    "where FILE is not itself JSON, reads FILE the same way (the DistCompute\n"
    "tracker's `--json jobs.json`).\n\n"
    "With --requires SCOPE/NAME@N every task requires level N of that shared\n"
    "data: the worker that runs it has the level as a local file first\n"
    "(MUSTER_SHARED_<NAME>).  Without @N the head is asked for the newest level\n"
    "before anything is put, and every task requires that one.\n\n"
    "With --key-prefix P, payload N (1, 2, ... in input order) has the\n"
    "idempotency key PN: a put cut off by a lost head can be run again, whole,\n"
    "with the same input and P, and stores only what the first run did not\n"
    "(the ids of the rest are printed again).\n\n"
    "examples:\n"
    "  muster put --queue resize a.jpg b.jpg\n"
    "  ls *.jpg | muster put --queue resize\n"
    "  muster put --queue resize --json '{\"url\": \"a.jpg\", \"width\": 640}'\n"
    "  muster put --queue scrape --file jobs.txt\n"
    "  muster put --queue scrape --json jobs.json\n"
    "  muster put --queue scrape --key-prefix crawl-2026-11-25- --file urls.txt\n"
    "  muster put --queue score --requires models/weights@2 a.jpg b.jpg\n";

static const char lease_details[] =
    "Prints one JSON object per lease and line: {\"task\", \"token\", \"payload\",\n"
    "\"attempt\", \"deadline_ms\", \"parent\", \"session\", \"index\"}; nothing when no task\n"
    "was ready.  Finish each lease with `muster complete` or `muster fail`.\n\n"
    "example:\n"
    "  muster lease --queue resize --wait-ms 5000\n";

static const char worker_details[] =
    "Registers a worker and runs CMD (no shell) for each leased task, with the\n"
    "payload on stdin (a string payload as its raw text, any other payload as\n"
    "JSON).  Exit status 0: the task completes with stdout as its result (one\n"
    "trailing newline removed).  Non-zero exit or death by a signal: the task\n"
    "fails with the last 2 KiB of stderr as its error (retried per the queue's\n"
    "settings); one line on stderr says how CMD ended and whether the task will\n"
    "be retried or is dead.  With --permanent-exit N, CMD exiting N fails the\n"
    "task for good at once (state failed, not retried; for a payload CMD knows\n"
    "it can never take), its error saying so above the stderr tail.  The lease\n"
    "is extended while CMD runs, and the worker heart-beats with its progress.\n"
    "CMD sees MUSTER_TASK_ID, MUSTER_ATTEMPT, MUSTER_QUEUE, MUSTER_WORKER_ID,\n"
    "MUSTER_WORKER_PID (the worker process) and, with --permanent-exit N,\n"
    "MUSTER_PERMANENT_EXIT=N in its environment.  A task that requires shared\n"
    "data gets each level as a local file first: MUSTER_SHARED_<NAME> is its\n"
    "path and MUSTER_REQUIRES lists them all as JSON (docs/shared-data.md).  CMD\n"
    "is looked up once at start (as execvp would): one that cannot run is\n"
    "refused with exit status 2 before anything is leased; one that cannot start\n"
    "later releases its task (no attempt counted) and stops the worker with exit\n"
    "status 1.\n\n"
    "SIGINT or SIGTERM: take no new tasks, let running ones finish, say goodbye\n"
    "and exit 0.  A second signal terminates the running commands and releases\n"
    "their tasks.\n\n"
    "examples:\n"
    "  muster worker --queue resize --concurrency 4 -- convert - -resize 50% -\n"
    "  muster worker --queue upper --max-tasks 10 -- tr a-z A-Z\n";

/* The acknowledgements' help: where TASK and TOKEN come from, which the
 * synopsis alone does not say, and an example of the command itself. */
#define ACK_DETAILS                                                                                \
  "TASK and TOKEN are the \"task\" and \"token\" of a lease, as `muster lease`\n"                  \
  "prints them; a stale token (the lease expired or went to another worker)\n"                     \
  "fails with lease_lost.\n\n"                                                                     \
  "example:\n"                                                                                     \
  "  muster lease --queue resize    # {\"task\":7,\"token\":1042,...}\n"
static const char complete_details[] = ACK_DETAILS "  muster complete 7 1042 a-small.jpg\n";
static const char fail_details[] =
    ACK_DETAILS "  muster fail 7 1042 --error 'cannot decode a.jpg'\n";
static const char extend_details[] = ACK_DETAILS "  muster extend 7 1042 --lease-ms 300000\n";
static const char release_details[] = ACK_DETAILS "  muster release 7 1042\n";
static const char flag_details[] = ACK_DETAILS "  muster flag 7 1042 --reason 'truncated image'\n";

static const char tasks_requeue_details[] =
    "Give either ID (one dead or failed task) or --queue Q (all of them), not both.\n";

static int cmd_head(cli_args_t *args);
static int cmd_version(cli_args_t *args);
static int cmd_help(cli_args_t *args);

/* ---- the command table ------------------------------------------------------------ */

/* `muster iter ...` (cmd_iter.c). */
extern const cli_opt_t iter_create_opts[], iter_stream_opts[], iter_next_opts[], iter_ack_opts[],
    iter_restore_opts[], iter_status_opts[], iter_held_opts[];
extern const char iter_held_details[];
int cmd_iter_create(cli_args_t *args);
int cmd_iter_next(cli_args_t *args);
int cmd_iter_held(cli_args_t *args);
int cmd_iter_ack(cli_args_t *args);
int cmd_iter_status(cli_args_t *args);
int cmd_iter_checkpoint(cli_args_t *args);
int cmd_iter_restore(cli_args_t *args);
int cmd_iter_rm(cli_args_t *args);
int cmd_iter_ls(cli_args_t *args); /* cmd_iter_ls.c */
int cmd_iter_stream(cli_args_t *args);

static const char iter_details[] =
    "Iterations hand out a dataset's sample indices to ranks, epoch by epoch\n"
    "(docs/iterations.md).  `create` makes (or joins) a coordinated one on the\n"
    "head; `next` leases blocks (one JSON line each, with its indices), `held`\n"
    "lists those a rank holds without leasing any, and `ack` marks them done\n"
    "(BLOCK:TOKEN ...); `stream` computes a rank's indices here, with no head.\n\n"
    "examples:\n"
    "  muster iter create train --num-samples 1000000 --shuffle global --seed 7 \\\n"
    "      --strategy dynamic --world-size 8 --block-size 512 --epochs 3\n"
    "  muster iter next train --rank 0 --max 2\n"
    "  muster iter held train --rank 0\n"
    "  muster iter ack train --rank 0 17:4242\n"
    "  muster iter ls\n"
    "  muster iter checkpoint train > ckpt.json\n"
    "  muster iter restore train2 ckpt.json --world-size 6\n"
    "  muster iter stream --num-samples 10 --shuffle global --seed 42 --world-size 3 --rank 0\n";

/* `muster shared ...` (cmd_shared.c). */
extern const cli_opt_t cmd_shared_put_opts[], cmd_shared_get_opts[], cmd_shared_ls_opts[];
extern const char cmd_shared_details[];
int cmd_shared_put(cli_args_t *args);
int cmd_shared_get(cli_args_t *args);
int cmd_shared_rm(cli_args_t *args);
int cmd_shared_ls(cli_args_t *args);

static const cli_cmd_t commands[] = {
    {"head", "[options]", "Run the head daemon (see `muster head --help`).", NULL, NULL, 0, 0, -1,
     cmd_head},
    {"queue create", "NAME [options]", "Create a queue, or change the settings given.", NULL,
     queue_create_opts, 1, 1, 1, cmd_queue_create},
    {"queue ls", "[options]", "List queues with their task counts per state.", NULL, json_opts, 1,
     0, 0, cmd_queue_ls},
    {"queue show", "NAME", "Show a queue's settings and counts as JSON.", NULL, NULL, 1, 1, 1,
     cmd_queue_show},
    {"queue purge", "NAME", "Delete a queue's queued tasks (leased and finished ones stay).", NULL,
     NULL, 1, 1, 1, cmd_queue_purge},
    {"queue rm", "NAME", "Delete a queue and all its tasks.", NULL, NULL, 1, 1, 1, cmd_queue_rm},
    {"queue requeue", "NAME", "Put every dead and failed task of a queue back to queued.", NULL,
     NULL, 1, 1, 1, cmd_queue_requeue},
    {"queue wait", "NAME [options]",
     "Wait until a queue (and with --pipeline its next stages) has no task left.",
     cmd_queue_wait_details, cmd_queue_wait_opts, 1, 1, 1, cmd_queue_wait},
    {"put", "--queue Q [options] [PAYLOAD...]", "Put tasks into a queue.", put_details, put_opts, 1,
     0, -1, cmd_put},
    {"lease", "--queue Q [options]", "Lease tasks (for scripts).", lease_details, lease_opts, 1, 0,
     0, cmd_lease},
    {"complete", "TASK TOKEN [RESULT]", "Complete a leased task with an optional result.",
     complete_details, complete_opts, 1, 1, 3, cmd_complete},
    {"fail", "TASK TOKEN [options]", "Fail a leased task (retried unless --permanent).",
     fail_details, fail_opts, 1, 1, 2, cmd_fail},
    {"extend", "TASK TOKEN [options]", "Extend a lease.", extend_details, extend_opts, 1, 1, 2,
     cmd_extend},
    {"release", "TASK TOKEN", "Give a leased task back at once; the attempt does not count.",
     release_details, NULL, 1, 1, 2, cmd_release},
    {"flag", "TASK TOKEN [options]", "Flag a leased task's input as invalid.", flag_details,
     flag_opts, 1, 1, 2, cmd_flag},
    {"tasks ls", "--queue Q [options]", "List a queue's tasks.", NULL, tasks_ls_opts, 1, 0, 0,
     cmd_tasks_ls},
    {"tasks show", "ID", "Show one task as JSON.", NULL, NULL, 1, 1, 1, cmd_tasks_show},
    {"tasks dead", "--queue Q [options]", "List a queue's dead and failed tasks.", NULL,
     tasks_dead_opts, 1, 0, 0, cmd_tasks_dead},
    {"tasks requeue", "ID | --queue Q", "Put dead or failed tasks back to queued.",
     tasks_requeue_details, tasks_requeue_opts, 1, 0, 1, cmd_tasks_requeue},
    {"worker", "--queue Q [options] (-- CMD [ARGS...] | --plugin PATH)",
     "Run CMD or a plugin for each task of a queue.", worker_details, worker_opts, 1, 0, -1,
     cmd_worker},
    {"node", "[--join URL] [options] [-- CMD [ARGS...] | --plugin PATH]",
     "Run the node agent: register this machine, run and supervise its workers.", cli_node_details,
     cli_node_opts, 1, 0, -1, cmd_node},
    {"map", "--queue Q [options] < INPUTS", "Run each input line through a queue's workers.",
     cmd_map_details, cmd_map_opts, 1, 0, 0, cmd_map},
    {"nodes", "[options]", "List the nodes (machines running a node agent).", NULL, cmd_nodes_opts,
     1, 0, 0, cmd_nodes},
    {"workers", "[options]", "List the workers with their node, queues and counters.", NULL,
     cmd_workers_opts, 1, 0, 0, cmd_workers},
    {"update", "--queue Q [options] DATA", "Broadcast an update to every worker of a queue.",
     cmd_update_details, cmd_update_opts, 1, 1, 1, cmd_update},
    {"session create", "--queue Q [options]", "Create a session and print its id.", NULL,
     cmd_session_create_opts, 1, 0, 0, cmd_session_create},
    {"session ls", "[options]", "List the open sessions with their counts.", NULL, json_opts, 1, 0,
     0, cmd_session_ls},
    {"session show", "ID", "Show a session as JSON.", NULL, NULL, 1, 1, 1, cmd_session_show},
    {"session put", "ID [options] < INPUTS", "Submit one task per input line to a session.",
     cmd_session_put_details, cmd_session_put_opts, 1, 1, 1, cmd_session_put},
    {"session seal", "ID", "Seal a session: it takes no more tasks, and its readers see the end.",
     cmd_session_seal_details, NULL, 1, 1, 1, cmd_session_seal},
    {"session results", "ID [options]", "Print a session's results from a cursor.",
     cmd_session_results_details, cmd_session_results_opts, 1, 1, 1, cmd_session_results},
    {"session close", "ID", "Close a session: cancel its unfinished tasks, delete its data.", NULL,
     NULL, 1, 1, 1, cmd_session_close},
    {"status", "", "Show the head's health, queues and active workers.", NULL, NULL, 1, 0, 0,
     cmd_status},
    {"iter create", "NAME [options]", "Create (or join) a coordinated iteration.", iter_details,
     iter_create_opts, 1, 1, 1, cmd_iter_create},
    {"iter next", "NAME --rank R [options]", "Lease the next blocks of an iteration for a rank.",
     NULL, iter_next_opts, 1, 1, 1, cmd_iter_next},
    {"iter held", "NAME --rank R [options]", "List the blocks a rank holds, leasing none.",
     iter_held_details, iter_held_opts, 1, 1, 1, cmd_iter_held},
    {"iter ack", "NAME --rank R BLOCK:TOKEN...", "Mark leased blocks done.", NULL, iter_ack_opts, 1,
     2, -1, cmd_iter_ack},
    {"iter status", "NAME [options]", "Show an iteration's progress and per-rank health.", NULL,
     iter_status_opts, 1, 1, 1, cmd_iter_status},
    {"iter checkpoint", "NAME", "Print an iteration's checkpoint (JSON, one line).", NULL, NULL, 1,
     1, 1, cmd_iter_checkpoint},
    {"iter restore", "NAME FILE [options]", "Create an iteration from a checkpoint ('-': stdin).",
     NULL, iter_restore_opts, 1, 2, 2, cmd_iter_restore},
    {"iter ls", "[options]", "List iterations: where each lives, its epoch and blocks done.", NULL,
     json_opts, 1, 0, 0, cmd_iter_ls},
    {"iter rm", "NAME", "Delete an iteration.", NULL, NULL, 1, 1, 1, cmd_iter_rm},
    {"iter stream", "[options]", "Print a rank's indices, computed here (no head).", iter_details,
     iter_stream_opts, 0, 0, 0, cmd_iter_stream},
    {"shared put", "SCOPE NAME [FILE] [options]", "Upload shared data (FILE or stdin).",
     cmd_shared_details, cmd_shared_put_opts, 1, 2, 3, cmd_shared_put},
    {"shared get", "SCOPE NAME [FILE] [options]", "Download shared data (to FILE or stdout).",
     cmd_shared_details, cmd_shared_get_opts, 1, 2, 3, cmd_shared_get},
    {"shared rm", "SCOPE NAME", "Delete every level of shared data.", NULL, NULL, 1, 2, 2,
     cmd_shared_rm},
    {"shared ls", "SCOPE [options]", "List the shared data of a scope.", NULL, cmd_shared_ls_opts,
     1, 1, 1, cmd_shared_ls},
    {"backup", "[--name NAME] [options]",
     "Make an online backup of the head's state; print its path.", cmd_backup_details,
     cmd_backup_opts, 1, 0, 0, cmd_backup},
    {"completion", "SHELL", "Print a shell completion script (bash or zsh).",
     cli_completion_details, NULL, 0, 1, 1, cmd_completion},
    {"version", "", "Print the version.", NULL, NULL, 0, 0, 0, cmd_version},
    {"help", "[COMMAND [SUBCOMMAND]]", "Show help for muster or for a command.", NULL, NULL, 0, 0,
     2, cmd_help},
};

#define N_COMMANDS (sizeof commands / sizeof commands[0])

const cli_cmd_t *cli_commands(size_t *count) {
  *count = N_COMMANDS;
  return commands;
}

/* Non-zero when `word` names a group of subcommands ("queue", "tasks"). */
static int is_group(const char *word) {
  size_t len = strlen(word);
  for (size_t i = 0; i < N_COMMANDS; i++)
    if (strncmp(commands[i].name, word, len) == 0 && commands[i].name[len] == ' ')
      return 1;
  return 0;
}

/* The row named `group` + " " + `sub` (sub may be NULL for a plain command). */
static const cli_cmd_t *find_command(const char *group, const char *sub) {
  char name[64];
  snprintf(name, sizeof name, "%s%s%s", group, sub ? " " : "", sub ? sub : "");
  for (size_t i = 0; i < N_COMMANDS; i++)
    if (strcmp(commands[i].name, name) == 0)
      return &commands[i];
  return NULL;
}

/* The column of command names in the command lists: the longest, "session
 * results", and a space more. */
#define COMMAND_WIDTH 16

static void usage_all(FILE *out) {
  fprintf(out, "usage: muster COMMAND [options]\n\n"
               "muster coordinates distributed work: durable task queues, leases and\n"
               "pipelines served by a head over HTTP.\n\ncommands:\n");
  for (size_t i = 0; i < N_COMMANDS; i++)
    cli_print_item(out, commands[i].name, commands[i].summary, COMMAND_WIDTH);
  fprintf(out, "\nRun 'muster help COMMAND [SUBCOMMAND]' or 'muster COMMAND [SUBCOMMAND] --help'\n"
               "for the options of a command.\n");
}

static void usage_group(const char *group, FILE *out) {
  size_t len = strlen(group);
  fprintf(out, "usage: muster %s SUBCOMMAND [options]\n\nsubcommands:\n", group);
  for (size_t i = 0; i < N_COMMANDS; i++)
    if (strncmp(commands[i].name, group, len) == 0 && commands[i].name[len] == ' ')
      cli_print_item(out, commands[i].name, commands[i].summary, COMMAND_WIDTH);
  fprintf(out, "\nRun 'muster %s SUBCOMMAND --help' for its options.\n", group);
}

/* The command `word` likely meant ("queues": "queue", "statuss": "status"),
 * or NULL; its length in *len.  A group is offered by its first word. */
static const char *likely_command(const char *word, size_t *len) {
  suggest_t likely;
  suggest_init(&likely, word, strlen(word));
  for (size_t i = 0; i < N_COMMANDS; i++)
    suggest_offer(&likely, commands[i].name, strcspn(commands[i].name, " "));
  return suggest_best(&likely, len);
}

/* Words other tools use for a subcommand that muster names otherwise. */
static const char *const subcommand_synonyms[][2] = {
    {"list", "ls"},   {"delete", "rm"},     {"remove", "rm"},  {"del", "rm"},
    {"info", "show"}, {"describe", "show"}, {"new", "create"}, {"add", "create"},
};

/* The subcommand of `group` that `sub` likely meant ("list": "ls", "purg":
 * "purge"), or NULL; its length in *len. */
static const char *likely_subcommand(const char *group, const char *sub, size_t *len) {
  for (size_t i = 0; i < sizeof subcommand_synonyms / sizeof subcommand_synonyms[0]; i++)
    if (strcmp(sub, subcommand_synonyms[i][0]) == 0 &&
        find_command(group, subcommand_synonyms[i][1]) != NULL) {
      *len = strlen(subcommand_synonyms[i][1]);
      return subcommand_synonyms[i][1];
    }
  size_t group_len = strlen(group);
  suggest_t likely;
  suggest_init(&likely, sub, strlen(sub));
  for (size_t i = 0; i < N_COMMANDS; i++)
    if (strncmp(commands[i].name, group, group_len) == 0 && commands[i].name[group_len] == ' ')
      suggest_offer(&likely, commands[i].name + group_len + 1,
                    strlen(commands[i].name + group_len + 1));
  return suggest_best(&likely, len);
}

/* What `muster WORD` and `muster help WORD` say of a word that names no
 * command, with the command it likely meant; returns CLI_USAGE. */
static int unknown_command(const char *word) {
  size_t len;
  const char *meant = likely_command(word, &len);
  if (meant)
    fprintf(stderr, "muster: unknown command '%s' (did you mean '%.*s'?)\n", word, (int)len, meant);
  else
    fprintf(stderr, "muster: unknown command '%s'\n", word);
  fprintf(stderr, "Try 'muster --help' for the list of commands.\n");
  return CLI_USAGE;
}

/* What `muster GROUP SUB` and `muster help GROUP SUB` say of a subcommand that
 * `group` lacks, with the one it likely meant; returns CLI_USAGE. */
static int unknown_subcommand(const char *group, const char *sub) {
  size_t len;
  const char *meant = likely_subcommand(group, sub, &len);
  if (meant)
    fprintf(stderr, "muster: unknown subcommand '%s %s' (did you mean '%s %.*s'?)\n", group, sub,
            group, (int)len, meant);
  else
    fprintf(stderr, "muster: unknown subcommand '%s %s'\n", group, sub);
  fprintf(stderr, "Try 'muster %s --help' for the list of subcommands.\n", group);
  return CLI_USAGE;
}

static int cmd_head(cli_args_t *args) {
  return CLI_USAGE; /* never called: main() hands `head` to head_main directly */
}

/* The version, and the schema this binary migrates a data dir to: a head of
 * it says the same in GET /v1/health (operations.md, "Upgrading"). */
static int cmd_version(cli_args_t *args) {
  printf("muster %s (data dir schema %d)\n", MUSTER_VERSION, store_migration_count);
  return CLI_OK;
}

static int cmd_help(cli_args_t *args) {
  if (args->npos == 0) {
    usage_all(stdout);
    return CLI_OK;
  }
  const char *sub = args->npos > 1 ? args->pos[1] : NULL;
  const cli_cmd_t *cmd = find_command(args->pos[0], sub);
  if (cmd != NULL && strcmp(cmd->name, "head") == 0) {
    head_usage();
    cli_head_agent_usage(stdout);
    return CLI_OK;
  }
  if (cmd != NULL) {
    cli_usage(cmd, stdout);
    return CLI_OK;
  }
  if (sub == NULL && is_group(args->pos[0])) {
    usage_group(args->pos[0], stdout);
    return CLI_OK;
  }
  if (is_group(args->pos[0]))
    return unknown_subcommand(args->pos[0], sub);
  if (sub == NULL || find_command(args->pos[0], NULL) == NULL)
    return unknown_command(args->pos[0]);
  fprintf(stderr, "muster: '%s' has no subcommand '%s'\n", args->pos[0], sub);
  fprintf(stderr, "Try 'muster help %s' for its usage.\n", args->pos[0]);
  return CLI_USAGE;
}

/* Runs the group `argv[1]`'s subcommand argv[2]. */
static int run_group(int argc, char **argv, const cli_cmd_t **cmd, int *skip) {
  const char *group = argv[1];
  if (argc < 3) {
    fprintf(stderr, "muster: '%s' needs a subcommand\n", group);
    usage_group(group, stderr);
    return CLI_USAGE;
  }
  if (strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0) {
    usage_group(group, stdout);
    return -1;
  }
  if ((*cmd = find_command(group, argv[2])) == NULL)
    return unknown_subcommand(group, argv[2]);
  *skip = 3;
  return CLI_OK;
}

/* Non-zero when `word` is a client option (--url, --token, --data-dir, alone
 * or with "=VALUE"); *with_value is set when its value is the next word. */
static int is_client_opt(const char *word, int *with_value) {
  static const char *const names[] = {"--url", "--token", "--data-dir", NULL};
  for (int i = 0; names[i]; i++) {
    size_t len = strlen(names[i]);
    if (strncmp(word, names[i], len) == 0 && (word[len] == '\0' || word[len] == '=')) {
      *with_value = word[len] == '\0';
      return 1;
    }
  }
  return 0;
}

/*
 * `muster --token X queue ls`: moves the client options that come before the
 * command to just after its words, where cli_parse reads them (cli.md: options
 * may come anywhere before `--`).  Fills `out` (argc + 1 slots) and returns
 * the number of its words, or 0 after printing that no command follows.
 */
static int hoist_client_opts(int argc, char **argv, char **out) {
  int at = 1, with_value;
  while (at < argc && is_client_opt(argv[at], &with_value))
    at += with_value && at + 1 < argc ? 2 : 1;
  if (at == argc) {
    fprintf(stderr, "muster: the options are not followed by a command\n"
                    "Try 'muster --help' for the list of commands.\n");
    return 0;
  }
  int words = 1 + (is_group(argv[at]) && at + 1 < argc), n = 0;
  out[n++] = argv[0];
  for (int i = 0; i < words; i++)
    out[n++] = argv[at + i];
  for (int i = 1; i < at; i++)
    out[n++] = argv[i];
  for (int i = at + words; i < argc; i++)
    out[n++] = argv[i];
  out[n] = NULL;
  return n;
}

/* What `muster --queue q put` says: an option before the command that is no
 * client option.  It is not an unknown command; it is misplaced (or unknown),
 * and the user needs to hear where options go.  Returns CLI_USAGE. */
static int option_before_command(const char *word) {
  fprintf(stderr,
          "muster: option '%s' comes before the command: only --url, --token and --data-dir "
          "may (`muster --token T queue ls`), and --help or --version alone; give the others "
          "after the command\n"
          "Try 'muster --help' for the list of commands, and 'muster COMMAND --help' for "
          "their options.\n",
          word);
  return CLI_USAGE;
}

/* The row of the command that argv[1] (and argv[2] for a group) names, and in
 * *skip how many words argv[0] and the command take; CLI_OK, -1 after a
 * group's help was printed, or CLI_USAGE after saying what is unknown. */
static int resolve_command(int argc, char **argv, const cli_cmd_t **cmd, int *skip) {
  const char *word = argv[1];
  if (word[0] == '-' && word[1] != '\0')
    return option_before_command(word);
  if (is_group(word))
    return run_group(argc, argv, cmd, skip);
  if ((*cmd = find_command(word, NULL)) == NULL)
    return unknown_command(word);
  return CLI_OK;
}

/* Parses the words of `cmd` (argv[skip] on) and runs it; returns the exit
 * status. */
static int run_command(const cli_cmd_t *cmd, int argc, char **argv, int skip) {
  char **pos = calloc((size_t)argc + 1, sizeof *pos);
  if (pos == NULL) {
    fprintf(stderr, "muster: out of memory\n");
    return CLI_FAIL;
  }
  cli_args_t args;
  int rc = cli_parse(cmd, argc - skip, argv + skip, pos, &args);
  if (rc == CLI_OK && strcmp(cmd->name, "worker") == 0)
    rc = cli_await_head_start(&args, "muster worker"); /* a worker waits for its head */
  if (rc == CLI_OK && cmd->client && !(cli_opt(&args, "join") && cli_opt(&args, "join")[0]))
    rc = cli_check_url(&args); /* `node --join URL` uses its URL instead */
  if (rc == CLI_OK)
    rc = cmd->run(&args);
  else if (rc < 0)
    rc = CLI_OK;
  free(pos);
  return rc;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage_all(stderr);
    return CLI_USAGE;
  }
  static char **hoisted; /* lives until exit, as argv does */
  int with_value;
  if (is_client_opt(argv[1], &with_value)) {
    hoisted = calloc((size_t)argc + 1, sizeof *hoisted);
    if (hoisted == NULL || hoist_client_opts(argc, argv, hoisted) == 0)
      return CLI_USAGE;
    argv = hoisted;
  }
  const char *word = argv[1];
  if (strcmp(word, "--help") == 0 || strcmp(word, "-h") == 0)
    return cmd_help(&(cli_args_t){0});
  if (strcmp(word, "--version") == 0)
    return cmd_version(NULL);
  if (strcmp(word, "head") == 0)
    return cmd_head_main(argc - 1, argv + 1);
  const cli_cmd_t *cmd = NULL;
  int skip = 2;
  int rc = resolve_command(argc, argv, &cmd, &skip);
  if (rc != CLI_OK)
    return rc < 0 ? CLI_OK : rc;
  return run_command(cmd, argc, argv, skip);
}
